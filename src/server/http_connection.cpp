#include "server/http_connection.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <strings.h>
#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <string_view>

namespace kiln::server {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Input is read from the socket this much at a time.
constexpr size_t kReadChunk = 16 << 10;
// A closing connection reads what the client still sends for at most this long, and stops
// sooner once the client has been silent for kLingerIdle.
constexpr auto kLingerTotal = milliseconds(2000);
constexpr auto kLingerIdle = milliseconds(250);
// How often a connection waiting for its next request checks that the server is not stopping.
constexpr auto kStopCheck = milliseconds(100);

thread_local HttpConnection* t_current = nullptr;

// The reason phrase of a status kiln uses and httplib 0.11 does not know, or nullptr.
const char* reason_phrase(int status) {
  return status == 499 ? "Client Closed Request" : nullptr;  // nginx's name
}

// The status of a status line at the start of `bytes`, or 0.
int status_of(std::string_view bytes) {
  constexpr std::string_view kVersion = "HTTP/1.1 ";
  int status = 0;
  if (bytes.size() < kVersion.size() + 3 || !bytes.starts_with(kVersion)) return 0;
  std::from_chars(bytes.data() + kVersion.size(), bytes.data() + kVersion.size() + 3, status);
  return status;
}

// Waits until `fd` is ready for `events` (or has hung up), at most `timeout`.
bool wait_ready(int fd, short events, HttpConnection::Duration timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now()).count();
    pollfd p{.fd = fd, .events = events, .revents = 0};
    const int n = ::poll(&p, 1, int(std::max<int64_t>(left, 0)));
    if (n > 0) return true;
    if (n == 0 || errno != EINTR) return false;
  }
}

// An address as httplib writes Request::remote_addr and remote_port.
void ip_and_port(const sockaddr_storage& addr, socklen_t length, std::string& ip, int& port) {
  int p = -1;
  if (addr.ss_family == AF_INET)
    p = ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
  else if (addr.ss_family == AF_INET6)
    p = ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
  else
    return;
  std::array<char, NI_MAXHOST> host{};
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&addr), length, host.data(), host.size(), nullptr, 0,
                    NI_NUMERICHOST) != 0)
    return;
  ip = host.data();
  port = p;
}

}  // namespace

HttpConnection::HttpConnection(int fd, Duration read_timeout, Duration write_timeout)
    : fd_(fd), read_timeout_(read_timeout), write_timeout_(write_timeout) {}

HttpConnection* HttpConnection::current() {
  return t_current;
}

bool HttpConnection::is_readable() const {
  return consumed_ < buffer_.size() || wait_ready(fd_, POLLIN, read_wait());
}

HttpConnection::Duration HttpConnection::read_wait() const {
  const auto left = std::chrono::duration_cast<Duration>(deadline_ - Clock::now());
  return std::clamp(left, Duration::zero(), read_timeout_);
}

void HttpConnection::begin_request() {
  deadline_ = Clock::now() + read_timeout_;
  in_body_ = false;
  timed_out_ = false;
  status_line_due_ = true;
  body_left_ = SIZE_MAX;
  body_too_large_ = false;
  head_bytes_ = 0;
  head_too_large_ = false;
  head_lines_ = 0;
  line_bytes_ = 0;
  header_line_too_long_ = false;
}

void HttpConnection::begin_body() {
  deadline_ = Clock::now() + read_timeout_;
  in_body_ = true;
}

// A client that has stopped sending may still read: only one that is gone is not written to.
bool HttpConnection::is_writable() const {
  return wait_ready(fd_, POLLOUT, write_timeout_) && peer() != Peer::gone;
}

HttpConnection::Peer HttpConnection::peer() const {
  tcp_info info{};
  socklen_t length = sizeof(info);
  if (::getsockopt(fd_, IPPROTO_TCP, TCP_INFO, &info, &length) == 0) {
    if (info.tcpi_state == TCP_CLOSE) return Peer::gone;  // reset (or closed here)
    return info.tcpi_state == TCP_CLOSE_WAIT ? Peer::done_sending : Peer::sending;
  }
  char byte = 0;
  const ssize_t n = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return Peer::done_sending;
  return n > 0 || errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? Peer::sending : Peer::gone;
}

ssize_t HttpConnection::read(char* ptr, size_t size) {
  if (body_left_ == 0) {
    body_too_large_ = true;
    return -1;
  }
  size = std::min(size, body_left_);
  if (!in_body_) {
    if (head_bytes_ >= kMaxHeadBytes) head_too_large_ = true;
    if (head_too_large_ || header_line_too_long_) return 0;
    size = std::min(size, kMaxHeadBytes - head_bytes_);
  }
  if (consumed_ == buffer_.size()) {
    // Past its deadline, or after a pause of the read timeout, the request's input ends. Ended
    // rather than failed: httplib then parses the partial line it holds and answers (400, made
    // 408), where a failed read in the request line would drop the connection without a word.
    if (Clock::now() >= deadline_ || !is_readable()) {
      timed_out_ = true;
      return 0;
    }
    buffer_.resize(kReadChunk);
    ssize_t n = 0;
    do {
      n = ::recv(fd_, buffer_.data(), buffer_.size(), 0);
    } while (n < 0 && errno == EINTR);
    buffer_.resize(size_t(std::max<ssize_t>(n, 0)));
    consumed_ = 0;
    if (n <= 0) return n;
  }
  const size_t n = std::min(size, buffer_.size() - consumed_);
  std::memcpy(ptr, buffer_.data() + consumed_, n);
  consumed_ += n;
  if (!in_body_) {
    head_bytes_ += n;
    // header lines past httplib's limit are refused here, as too large rather than malformed (the
    // request line has httplib's own 414)
    for (size_t i = 0; i < n; ++i) {
      if (ptr[i] == '\n') {
        ++head_lines_;
        line_bytes_ = 0;
      } else if (++line_bytes_ >= kMaxHeaderLineBytes && head_lines_ > 0) {
        header_line_too_long_ = true;
      }
    }
  }
  if (body_left_ != SIZE_MAX) body_left_ -= n;
  if (in_body_) deadline_ += std::chrono::duration_cast<Duration>(std::chrono::seconds(n)) / kMinBodyBytesPerSecond;
  return ssize_t(n);
}

// httplib hands over a response's status line and headers as one buffer, the status line first;
// an interim response (100 Continue) may come before them.
ssize_t HttpConnection::write(const char* ptr, size_t size) {
  if (!status_line_due_) return send_some(ptr, size);
  const std::string_view bytes(ptr, size);
  const int status = status_of(bytes);
  if (status >= 200) status_line_due_ = false;
  const char* reason = reason_phrase(status);
  const size_t line_end = bytes.find("\r\n");
  if (!reason || line_end == std::string_view::npos) return send_some(ptr, size);
  // the line with kiln's reason in place of httplib's; httplib writes the rest, from the CRLF
  const std::string line = "HTTP/1.1 " + std::to_string(status) + " " + reason;
  for (size_t at = 0; at < line.size();) {
    const ssize_t n = send_some(line.data() + at, line.size() - at);
    if (n <= 0) return -1;
    at += size_t(n);
  }
  return ssize_t(line_end);
}

ssize_t HttpConnection::send_some(const char* ptr, size_t size) {
  if (!wait_ready(fd_, POLLOUT, write_timeout_)) return -1;
  ssize_t n = 0;
  do {
    n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n;
}

void HttpConnection::get_remote_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage addr{};
  socklen_t length = sizeof(addr);
  if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &length) == 0) ip_and_port(addr, length, ip, port);
}

void HttpConnection::get_local_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage addr{};
  socklen_t length = sizeof(addr);
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &length) == 0) ip_and_port(addr, length, ip, port);
}

bool HttpConnection::wait_for_request(Duration idle, const std::function<bool()>& stopping) const {
  if (consumed_ < buffer_.size()) return true;  // pipelined: it has arrived already
  const auto deadline = Clock::now() + idle;
  while (!stopping()) {
    const auto left = std::chrono::duration_cast<Duration>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    if (wait_ready(fd_, POLLIN, std::min<Duration>(left, kStopCheck))) return true;
  }
  return false;
}

void HttpConnection::close() {
  ::shutdown(fd_, SHUT_WR);
  const auto deadline = Clock::now() + kLingerTotal;
  std::array<char, kReadChunk> discard;
  for (auto now = Clock::now(); now < deadline; now = Clock::now()) {
    if (!wait_ready(fd_, POLLIN, std::min<Duration>(kLingerIdle, std::chrono::duration_cast<Duration>(deadline - now))))
      break;
    const ssize_t n = ::recv(fd_, discard.data(), discard.size(), 0);
    if (n == 0 || (n < 0 && errno != EINTR)) break;
  }
  ::close(fd_);
}

void close_connection_after_response() {
  if (t_current) t_current->close_after_response();
}

bool reads_body(const httplib::Request& req) {
  const std::string& m = req.method;
  return m == "POST" || m == "PUT" || m == "PATCH" || m == "PRI" || (m == "DELETE" && req.has_header("Content-Length"));
}

bool carries_unread_body(const httplib::Request& req) {
  return !reads_body(req) && (req.has_header("Transfer-Encoding") ||
                              (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0"));
}

std::optional<FramingError> framing_error(const httplib::Request& req, size_t max_body_bytes) {
  if (!reads_body(req)) return std::nullopt;
  // httplib would inflate gzip and deflate with no bound (300 KB of gzip became 300 MB of JSON)
  // and read other codings as plain bytes; API clients send their JSON uncompressed
  if (req.has_header("Content-Encoding")) {
    std::string coding = req.get_header_value("Content-Encoding");
    coding.erase(0, coding.find_first_not_of(" \t"));
    coding.erase(coding.find_last_not_of(" \t") + 1);
    if (req.get_header_value_count("Content-Encoding") > 1 || ::strcasecmp(coding.c_str(), "identity") != 0)
      return FramingError{415, "Content-Encoding \"" + req.get_header_value("Content-Encoding") +
                                   "\" is not supported: send the body uncompressed"};
  }
  const size_t lengths = req.get_header_value_count("Content-Length");
  if (req.has_header("Transfer-Encoding")) {
    // both could be a request smuggled past a proxy that reads the other one (RFC 9112 §6.3)
    if (lengths > 0) return FramingError{400, "a request may not carry both Content-Length and Transfer-Encoding"};
    const std::string coding = req.get_header_value("Transfer-Encoding");
    if (req.get_header_value_count("Transfer-Encoding") > 1 || ::strcasecmp(coding.c_str(), "chunked") != 0)
      return FramingError{400, "Transfer-Encoding \"" + coding +
                                   "\" is not supported: send the body with a Content-Length, or chunked"};
    return std::nullopt;
  }
  // RFC 9112 §6.3 would read no length as an empty body, but every body kiln takes is a JSON
  // object, and what the client sent after its headers would be read as its next request: 411
  // Length Required names the mistake instead.
  if (lengths == 0)
    return FramingError{411, "a request body needs a Content-Length header (or Transfer-Encoding: chunked)"};
  const std::string length = req.get_header_value("Content-Length");
  for (size_t i = 0; i < lengths; ++i) {
    const std::string value = req.get_header_value("Content-Length", i);
    if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos)
      return FramingError{400, "malformed Content-Length \"" + value + "\": it must be a number of bytes"};
    if (value != length) return FramingError{400, "conflicting Content-Length headers"};
  }
  uint64_t bytes = 0;
  const bool overflows = std::from_chars(length.data(), length.data() + length.size(), bytes).ec != std::errc();
  if (overflows || bytes > max_body_bytes)
    return FramingError{413, "the request body exceeds " + std::to_string(max_body_bytes) + " bytes"};
  return std::nullopt;
}

bool HttpServer::process_and_close_socket(int sock) {
  using std::chrono::microseconds;
  using std::chrono::seconds;
  HttpConnection connection(sock, seconds(read_timeout_sec_) + microseconds(read_timeout_usec_),
                            seconds(write_timeout_sec_) + microseconds(write_timeout_usec_));
  t_current = &connection;
  const auto stopping = [this] { return svr_sock_ == INVALID_SOCKET; };
  bool ok = false;
  for (size_t left = keep_alive_max_count_;
       left > 0 && connection.wait_for_request(seconds(keep_alive_timeout_sec_), stopping); --left) {
    connection.begin_request();
    bool client_closes = false;
    ok = process_request(connection, left == 1, client_closes, nullptr);
    if (!ok || client_closes || connection.closing()) break;
  }
  t_current = nullptr;
  connection.close();
  return ok;
}

}  // namespace kiln::server
