// The HTTP endpoints: request bodies in, JSON or server-sent events out. Each protocol's
// handlers live in their own file and share the Service and these helpers.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "server/service.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace kiln::server {

// Sends one chunk of a streamed response; false once the client has gone.
using Send = std::function<bool(const std::string&)>;
// Produces a streamed response a piece at a time: called until it returns false (the stream is
// complete, or `send` failed and the producer gave up).
using EventSource = std::function<bool(const Send& send)>;

void respond_json(httplib::Response& res, int status, const nlohmann::json& body);
// A streamed response (server-sent events), counted open on `service` until httplib releases it.
void respond_events(httplib::Response& res, Service& service, EventSource source);

// Whether the client that sent a request has gone, for responses written only at the end (a
// non-streamed generation is cancelled then). httplib does not hand handlers the socket, so it
// is found once by the peer's address and port among the process's sockets.
class ClientConnection {
 public:
  explicit ClientConnection(const httplib::Request& req);
  // True once the peer has closed or reset the connection (or the socket is no longer its).
  bool closed() const;

 private:
  std::string peer_addr_;
  int peer_port_ = -1;
  int fd_ = -1;  // -1: not found; then closed() is always false
};

// The request body as a JSON object, or an ApiError for malformed JSON or any other JSON value.
std::variant<nlohmann::json, ApiError> parse_body(const httplib::Request& req);

// Sampling fields shared by the OpenAI endpoints (temperature, top_p, top_k, min_p, penalties, seed).
SamplingParams read_sampling(RequestFields& fields, const SamplingParams& defaults);

// OpenAI's error object.
nlohmann::json openai_error(const ApiError& error);
// Anthropic's error object.
nlohmann::json anthropic_error(const ApiError& error);

// A short random id (for response, tool call and message ids).
std::string random_id(const char* prefix);

void handle_chat_completions(Service& service, const httplib::Request& req, httplib::Response& res);
void handle_completions(Service& service, const httplib::Request& req, httplib::Response& res);
void handle_messages(Service& service, const httplib::Request& req, httplib::Response& res);

}  // namespace kiln::server
