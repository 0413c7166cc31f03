// kiln's HTTP server: the OpenAI API (/v1/chat/completions, /v1/completions, /v1/responses, /v1/models), the
// Anthropic Messages API (/v1/messages), /health and /metrics, on top of a Scheduler.
//
// cpp-httplib does the HTTP; each connection has a thread, which for a generation waits on the
// scheduler's stream and forwards it as JSON or server-sent events. A client that disconnects
// cancels its generation, which frees its batch slot at the next step.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "server/service.h"

namespace kiln::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                           // 0: any free port
  std::string api_key;                       // empty: no authentication
  size_t max_body_bytes = size_t(32) << 20;  // room for a few base64 images
  // A request's headers must arrive within this, its body at kMinBodyBytesPerSecond after a
  // start of this, and its input may pause no longer than this (or it gets 408).
  int read_timeout_s = 10;
  int http_threads = 0;  // 0: enough for every batch slot, a queue and spare
  // Requests that wait for a batch slot before new ones get 503 (0: what the HTTP threads allow
  // beside the running ones, keeping 16 for /health, /metrics and quick answers).
  int64_t max_waiting = 0;
};

class Server {
 public:
  static Result<std::unique_ptr<Server>> create(ServedModel model, const ServerOptions& options);
  ~Server();

  // Binds the listening socket; returns the port (the chosen one when options.port is 0).
  Result<int> bind();
  // Serves until stop(); returns when the listener has closed.
  Status listen();
  // Stops accepting connections and ends listen() (callable from any thread); responses being
  // streamed are cut off.
  void stop();
  // The same once every streamed response has been written (after the scheduler has stopped
  // taking requests and finished the ones in flight).
  void stop_after_streams();

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::server
