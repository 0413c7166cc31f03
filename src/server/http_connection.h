// The connection under kiln's HTTP server. cpp-httplib parses each request, routes it and writes
// the response; the loop that serves one connection's requests is kiln's, because Debian 12's
// httplib (0.11) gets it wrong where none of its settings reach:
//  - it reads each request through a fresh stream, so bytes read past one request are lost and a
//    pipelined request goes unanswered;
//  - it writes nothing to a client that has half-closed, so a complete request followed by
//    shutdown(SHUT_WR) got no answer (later httplib versions write to it);
//  - it closes a connection with input unread, which resets it, and the client may lose the
//    answer it was sent.
// HttpServer keeps httplib's request handling (process_request) and replaces that loop.
//
// Each request has a deadline here too. httplib's read timeout bounds one read, so a client
// sending a byte every few seconds held a thread for as long as it liked; a request whose input
// runs past its deadline gets 408 and its connection is closed.
//
// httplib 0.11 names a status it does not know "Internal Server Error"; the status line of a
// response passes through here, where kiln's own statuses (499) get their names.
//
// A request's framing (RFC 9112 §6) is checked here too, before httplib reads its body: httplib
// 0.11 reads a body without Content-Length until the client closes, waits for all of an oversize
// body before refusing it, and takes a negative or malformed length for a huge or empty one.
#pragma once

#include <httplib.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace kiln::server {

// The least rate at which a request body must arrive, in bytes per second (over a start of the
// read timeout). 16 KiB/s is 128 kbit/s, slower than any link a prompt is sent over in earnest,
// and lets the default 8 MiB body take 9 minutes; a client that trickles bodies to hold the
// server's threads needs that much bandwidth for each thread held, not only patience.
inline constexpr size_t kMinBodyBytesPerSecond = 16 << 10;

// The most a request's head (its request line and headers) may hold. httplib 0.11 keeps every
// header it reads, with no bound of its own; 64 KiB is twice what nginx takes by default and far
// more than any API client sends.
inline constexpr size_t kMaxHeadBytes = 64 << 10;
// The longest header line httplib 0.11 reads (its CPPHTTPLIB_HEADER_MAX_LENGTH, line break
// included); a longer one it calls malformed.
inline constexpr size_t kMaxHeaderLineBytes = 8192;

// One client connection, as the stream httplib reads requests from and writes responses to. It
// lives as long as the connection: input read past one request is the next one's.
class HttpConnection final : public httplib::Stream {
 public:
  using Duration = std::chrono::microseconds;
  HttpConnection(int fd, Duration read_timeout, Duration write_timeout);

  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  using httplib::Stream::write;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  int socket() const override { return fd_; }

  // Where the client stands: still sending; done sending (it closed its socket, or only
  // half-closed it: the two look alike until something is written); or gone (it reset the
  // connection, as a closed socket does when written to).
  enum class Peer { sending, done_sending, gone };
  Peer peer() const;

  // Waits up to `idle` for the next request to begin; false when none does, or once `stopping`.
  bool wait_for_request(Duration idle, const std::function<bool()>& stopping) const;
  // A request begins: its head (request line and headers) must have arrived within the read
  // timeout, in all.
  void begin_request();
  // Its head has been read: its body must arrive at kMinBodyBytesPerSecond or more, after a
  // start of the read timeout.
  void begin_body();
  // Whether the request's input ran past its deadline, or paused for the read timeout. Past
  // either, its input reads as ended: httplib then answers 400, which kiln makes 408.
  bool timed_out() const { return timed_out_; }
  // Ends the connection once the response being made is written.
  void close_after_response() { closing_ = true; }
  bool closing() const { return closing_; }
  // Lets the request being read have at most `bytes` more of input (its body as sent, chunk
  // framing included): a read past them fails, and body_too_large() says why.
  void limit_body(size_t bytes) { body_left_ = bytes; }
  bool body_too_large() const { return body_too_large_; }
  // Whether the request's head ran past kMaxHeadBytes, or a header line past
  // kMaxHeaderLineBytes; its input then reads as ended (httplib answers 400, which kiln makes 431).
  bool head_too_large() const { return head_too_large_ || header_line_too_long_; }
  bool header_line_too_long() const { return header_line_too_long_; }
  // Half-closes, reads what the client still sends (a refused body, a request after the last)
  // until it closes or a bound, then closes: closing with input unread would reset the connection.
  void close();

  // The connection whose request the calling thread is serving, or nullptr. httplib serves a
  // connection's requests on one thread, handlers included, and hands handlers no socket.
  static HttpConnection* current();

 private:
  // How long a read may wait for input: the read timeout, or less as the deadline nears.
  Duration read_wait() const;
  // Writes what it can of `size` bytes, waiting at most the write timeout for room.
  ssize_t send_some(const char* ptr, size_t size);

  int fd_;
  Duration read_timeout_, write_timeout_;
  std::chrono::steady_clock::time_point deadline_;  // of the request being read
  bool in_body_ = false;
  bool timed_out_ = false;
  bool status_line_due_ = true;  // the response's status line is yet to be written
  std::string buffer_;           // input read from the socket and not yet consumed
  size_t consumed_ = 0;
  bool closing_ = false;
  size_t body_left_ = SIZE_MAX;  // SIZE_MAX: no limit
  bool body_too_large_ = false;
  size_t head_bytes_ = 0;  // of the request being read, while its head is
  bool head_too_large_ = false;
  size_t head_lines_ = 0;  // ended so far, the request line first
  size_t line_bytes_ = 0;  // of the line being read, its line break not counted
  bool header_line_too_long_ = false;
};

// Ends the calling thread's connection once the response being made is written (and says so in
// it): after a request whose body is left unread, where the next request begins is unknown.
void close_connection_after_response();

// Whether httplib reads a body for this request: POST, PUT, PATCH and PRI always, DELETE with a
// Content-Length. The body of any other request is left unread.
bool reads_body(const httplib::Request& req);
// A request of another method that carries a body anyway (httplib leaves it unread).
bool carries_unread_body(const httplib::Request& req);

struct FramingError {
  int status;  // 400 malformed, 411 no length, 413 too large, 415 compressed
  std::string message;
};
// Why the body of a request httplib reads a body for cannot be read as it is framed, or nullopt:
// a Content-Length is required (or Transfer-Encoding: chunked, alone), well formed and at most
// `max_body_bytes`, and no Content-Encoding but identity.
std::optional<FramingError> framing_error(const httplib::Request& req, size_t max_body_bytes);

// httplib's server with kiln's connection loop.
class HttpServer : public httplib::Server {
 private:
  bool process_and_close_socket(int sock) override;
};

}  // namespace kiln::server
