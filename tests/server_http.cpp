// kiln_server_http: HTTP/1.1 at the byte level against a running `kiln serve` (bare fixture: prompts
// are token ids), over raw sockets, where an HTTP client library would hide what is checked.
//
//   kiln_server_http [--read-timeout SECONDS] --url http://127.0.0.1:PORT
//
// --read-timeout must be the server's own (its --read-timeout).
//
// Each case sends bytes, reads what comes back until the server closes or a deadline passes, and
// checks the responses, how long they took and whether the connection was closed.
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

std::string g_host = "127.0.0.1", g_port = "8080";
double g_read_timeout = 10;  // the server's --read-timeout
int g_failures = 0;

void check(bool ok, const std::string& what, const std::string& detail = "") {
  std::printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", what.c_str(), detail.empty() ? "" : ": ", detail.c_str());
  if (!ok) ++g_failures;
}

// A connection to the server; closed on destruction.
class Socket {
 public:
  Socket() {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (::getaddrinfo(g_host.c_str(), g_port.c_str(), &hints, &found) != 0) return;
    for (addrinfo* a = found; a && fd_ < 0; a = a->ai_next) {
      fd_ = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd_ >= 0 && ::connect(fd_, a->ai_addr, a->ai_addrlen) != 0) ::close(std::exchange(fd_, -1));
    }
    ::freeaddrinfo(found);
  }
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool send(const std::string& bytes) const {
    for (size_t at = 0; at < bytes.size();) {
      const ssize_t n = ::send(fd_, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
      if (n <= 0) return false;
      at += size_t(n);
    }
    return true;
  }
  void half_close() const { ::shutdown(fd_, SHUT_WR); }
  // What arrives until the server closes (closed) or `deadline` passes.
  struct Received {
    std::string bytes;
    bool closed = false;
    double seconds = 0;
  };
  Received receive(double deadline_s) const {
    Received r;
    const auto start = Clock::now();
    for (;;) {
      const double left = deadline_s - std::chrono::duration<double>(Clock::now() - start).count();
      if (left <= 0) break;
      timeval tv{.tv_sec = time_t(left), .tv_usec = suseconds_t((left - double(time_t(left))) * 1e6)};
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      char buf[16384];
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n > 0) {
        r.bytes.append(buf, size_t(n));
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) r.closed = true;
      if (r.closed) break;
    }
    r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return r;
  }

 private:
  int fd_ = -1;
};

// Sends `bytes` a byte every `gap_s` seconds (less than the read timeout, so no single read
// stalls), reading what comes back in between, until the server closes the connection, all is
// sent, or `for_s` seconds have passed.
Socket::Received trickle(const Socket& s, const std::string& bytes, double gap_s, double for_s) {
  Socket::Received r;
  const auto start = Clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  for (size_t i = 0; i < bytes.size() && !r.closed && elapsed() < for_s; ++i) {
    s.send(bytes.substr(i, 1));
    const auto got = s.receive(gap_s);
    r.bytes += got.bytes;
    r.closed = got.closed;
  }
  r.seconds = elapsed();
  return r;
}

struct Reply {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lowercased
  std::string body;
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The responses in `bytes`, interim (1xx) ones included; parsing stops at the first incomplete one.
std::vector<Reply> parse_replies(const std::string& bytes) {
  std::vector<Reply> replies;
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t head_end = bytes.find("\r\n\r\n", at);
    if (head_end == std::string::npos || bytes.compare(at, 9, "HTTP/1.1 ") != 0) break;
    Reply r;
    r.status = std::atoi(bytes.c_str() + at + 9);
    for (size_t line = bytes.find("\r\n", at) + 2; line < head_end;) {
      const size_t end = bytes.find("\r\n", line);
      const std::string text = bytes.substr(line, end - line);
      const size_t colon = text.find(':');
      if (colon != std::string::npos)
        r.headers[lower(text.substr(0, colon))] = text.substr(text.find_first_not_of(' ', colon + 1));
      line = end + 2;
    }
    at = head_end + 4;
    if (r.status >= 200 && lower(r.header("transfer-encoding")) == "chunked") {
      for (;;) {
        const size_t size_end = bytes.find("\r\n", at);
        if (size_end == std::string::npos) return replies;
        const size_t size = std::stoul(bytes.substr(at, size_end - at), nullptr, 16);
        if (size_end + 2 + size + 2 > bytes.size()) return replies;
        r.body += bytes.substr(size_end + 2, size);
        at = size_end + 2 + size + 2;
        if (size == 0) break;
      }
    } else if (r.status >= 200) {
      const size_t length = std::stoul(r.header("content-length").empty() ? "0" : r.header("content-length"));
      if (at + length > bytes.size()) break;
      r.body = bytes.substr(at, length);
      at += length;
    }
    replies.push_back(std::move(r));
  }
  return replies;
}

std::vector<Reply> final_replies(const std::string& bytes) {
  std::vector<Reply> all = parse_replies(bytes), out;
  for (auto& r : all)
    if (r.status >= 200) out.push_back(std::move(r));
  return out;
}

std::string post(const std::string& path, const std::string& body, const std::string& extra_headers = "") {
  return "POST " + path +
         " HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n" + extra_headers + "\r\n" + body;
}

std::string get(const std::string& path, const std::string& extra_headers = "") {
  return "GET " + path + " HTTP/1.1\r\nHost: kiln\r\n" + extra_headers + "\r\n";
}

std::string statuses(const std::vector<Reply>& replies) {
  std::string s;
  for (const auto& r : replies) s += (s.empty() ? "" : " ") + std::to_string(r.status);
  return "[" + s + "]";
}

const std::string kCompletion = R"({"prompt":[1,2,3],"max_tokens":3,"temperature":0})";

// Requests sent back to back in one write are all answered, in order.
void pipelined() {
  Socket s;
  s.send(get("/health") + post("/v1/completions", kCompletion) + get("/v1/models", "Connection: close\r\n"));
  const auto got = s.receive(5);
  const auto replies = final_replies(got.bytes);
  check(replies.size() == 3 && replies[0].status == 200 && replies[1].status == 200 && replies[2].status == 200,
        "three pipelined requests get three answers", statuses(replies));
  check(replies.size() == 3 && json::parse(replies[1].body, nullptr, false).contains("choices") &&
            json::parse(replies[2].body, nullptr, false).contains("data"),
        "the pipelined answers come in order");
  check(got.closed && got.seconds < 3, "the connection closes after the last (Connection: close)");
}

// A connection serves many requests (not httplib's default of 5), pipelined ones in order.
void many_requests_per_connection() {
  constexpr int kRequests = 50;
  std::string requests;
  for (int i = 0; i < kRequests; ++i)
    requests += get(i % 2 ? "/v1/models" : "/health", i + 1 == kRequests ? "Connection: close\r\n" : "");
  Socket s;
  s.send(requests);
  const auto got = s.receive(5);
  const auto replies = final_replies(got.bytes);
  bool in_order = replies.size() == kRequests;
  for (size_t i = 0; in_order && i < replies.size(); ++i)
    in_order =
        replies[i].status == 200 && json::parse(replies[i].body, nullptr, false).contains(i % 2 ? "data" : "status");
  check(in_order && got.closed, "50 pipelined requests on one connection are all answered, in order",
        std::to_string(replies.size()) + " answers");
}

// A client that half-closes after a complete request still reads the answer, plain or streamed.
void half_closed() {
  for (const bool stream : {false, true}) {
    const std::string kind = stream ? "streamed" : "plain";
    json body = json::parse(kCompletion);
    body["stream"] = stream;
    Socket s;
    s.send(post("/v1/completions", body.dump()));
    s.half_close();
    const auto got = s.receive(10);
    const auto replies = final_replies(got.bytes);
    const bool answered = replies.size() == 1 && replies[0].status == 200 &&
                          (stream ? replies[0].body.find("data: [DONE]") != std::string::npos
                                  : json::parse(replies[0].body, nullptr, false).contains("choices"));
    check(answered, "a half-closed client reads its " + kind + " answer",
          statuses(replies) + " " + got.bytes.substr(0, 120));
  }
}

int running_generations() {
  Socket s;
  s.send(get("/health", "Connection: close\r\n"));
  const auto replies = final_replies(s.receive(5).bytes);
  if (replies.size() != 1) return -1;
  const json health = json::parse(replies[0].body, nullptr, false);
  return health.is_object() ? health.value("running", -1) : -1;
}

// A client that closes its socket before its non-streamed answer cancels the generation, which
// would otherwise run on for seconds (4000 tokens).
void closed_client_cancels() {
  for (const char* version : {"HTTP/1.1", "HTTP/1.0"}) {
    const std::string body = R"({"prompt":[1,2,3],"max_tokens":4000,"temperature":0})";
    std::optional<Socket> s(std::in_place);
    s->send("POST /v1/completions " + std::string(version) +
            "\r\nHost: kiln\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
    const auto start = Clock::now();
    while (running_generations() == 0 && Clock::now() - start < std::chrono::seconds(5)) {
    }
    s.reset();
    const auto closed = Clock::now();
    int running = 1;
    while ((running = running_generations()) != 0 && Clock::now() - closed < std::chrono::seconds(2)) {
    }
    check(running == 0, std::string("a closed ") + version + " client cancels its generation",
          std::to_string(std::chrono::duration<double>(Clock::now() - closed).count()) + " s");
  }
}

// The 499 a client gone before its answer gets says what it is (nginx's name for it), not
// "Internal Server Error". An HTTP/1.0 client that half-closes counts as gone, and reads it.
void client_closed_request() {
  const std::string body = R"({"prompt":[1,2,3],"max_tokens":4000,"temperature":0})";
  Socket s;
  s.send("POST /v1/completions HTTP/1.0\r\nHost: kiln\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
         body);
  s.half_close();
  const auto got = s.receive(5);
  const std::string status_line = got.bytes.substr(0, got.bytes.find("\r\n"));
  check(status_line == "HTTP/1.1 499 Client Closed Request" && final_replies(got.bytes).size() == 1,
        "a 499 is sent as 499 Client Closed Request", status_line);
}

// `count` headers of ~25 bytes each.
std::string many_headers(int count) {
  std::string out;
  for (int i = 0; i < count; ++i) out += "X-Filler-" + std::to_string(i) + ": 0123456789\r\n";
  return out;
}

// A request whose body cannot be read as framed, or whose headers are too large, is answered at
// once (the server would wait 10 s for more input), without its body being read, and its
// connection is closed after the answer.
void refused_framing() {
  struct Case {
    const char* what;
    std::string request;
    int status;
  };
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\n";
  const std::string framed = "Content-Length: " + std::to_string(kCompletion.size()) + "\r\n\r\n" + kCompletion;
  const std::vector<Case> cases = {
      {"a POST without Content-Length", head + "\r\n" + kCompletion, 411},
      {"a Content-Length over --max-body-bytes (body not sent)", head + "Content-Length: 1000000000\r\n\r\n", 413},
      {"a Content-Length past 64 bits", head + "Content-Length: 99999999999999999999999\r\n\r\n" + kCompletion, 413},
      {"a negative Content-Length", head + "Content-Length: -5\r\n\r\n" + kCompletion, 400},
      {"a Content-Length that is not a number", head + "Content-Length: abc\r\n\r\n" + kCompletion, 400},
      {"two different Content-Lengths",
       head + "Content-Length: " + std::to_string(kCompletion.size()) + "\r\nContent-Length: 5\r\n\r\n" + kCompletion,
       400},
      {"Content-Length with Transfer-Encoding",
       head + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
      {"a Transfer-Encoding other than chunked", head + "Transfer-Encoding: gzip, chunked\r\n\r\n", 400},
      {"an oversize body announced with Expect: 100-continue",
       head + "Expect: 100-continue\r\nContent-Length: 1000000000\r\n\r\n", 413},
      {"headers over 64 KiB (3,000 of them)", head + many_headers(3000) + framed, 431},
      {"one header of 70 KB", head + "X-Long: " + std::string(70000, 'a') + "\r\n" + framed, 431},
      {"one header of 10 KB (past httplib's 8 KiB a line)",
       head + "X-Long: " + std::string(10000, 'a') + "\r\n" + framed, 431},
      // httplib inflated gzip with no bound, and read other codings as plain JSON
      {"a gzip body", head + "Content-Encoding: gzip\r\n" + framed, 415},
      {"a GZIP body", head + "Content-Encoding: GZIP\r\n" + framed, 415},
      {"a zstd body", head + "Content-Encoding: zstd\r\n" + framed, 415},
  };
  for (const auto& c : cases) {
    Socket s;
    s.send(c.request);
    const auto got = s.receive(5);
    const auto replies = parse_replies(got.bytes);  // no 100 Continue may come first
    const bool answered = replies.size() == 1 && replies[0].status == c.status &&
                          json::parse(replies[0].body, nullptr, false).contains("error");
    check(answered && got.seconds < 2, std::string(c.what) + " gets " + std::to_string(c.status) + " at once",
          statuses(replies) + " after " + std::to_string(got.seconds) + " s");
    check(got.closed && replies.size() == 1 && replies[0].header("connection") == "close" &&
              replies[0].header("keep-alive").empty(),
          std::string(c.what) + ": the connection is closed after the answer");
  }
}

// A chunked body is held to --max-body-bytes (100000 here) as it is read; one within it is read.
void chunked_bodies() {
  const std::string head =
      "POST /v1/completions HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\n\r\n";
  const auto chunk = [](const std::string& data) {
    char size[32];
    std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
    return size + data + "\r\n";
  };
  {
    Socket s;
    s.send(head + chunk(kCompletion.substr(0, 10)) + chunk(kCompletion.substr(10)) + "0\r\n\r\n" + get("/health"));
    const auto replies = final_replies(s.receive(1).bytes);
    check(replies.size() == 2 && replies[0].status == 200 && replies[1].status == 200,
          "a chunked body is read, and the request after it", statuses(replies));
  }
  {
    Socket s;
    std::string body = head;
    for (int i = 0; i < 4; ++i) body += chunk(std::string(65536, ' '));
    s.send(body + "0\r\n\r\n");
    const auto got = s.receive(5);
    const auto replies = final_replies(got.bytes);
    check(replies.size() == 1 && replies[0].status == 413 && replies[0].header("connection") == "close" && got.closed,
          "a chunked body over --max-body-bytes gets 413 and its connection closed", statuses(replies));
  }
}

// A request that carries a body httplib does not read (a GET's) is answered, and the connection
// closed: the body would be read as the next request.
void unread_body_closes() {
  Socket s;
  s.send(get("/health", "Content-Length: 22\r\n") + "GET /v1/models HTTP/1.1");
  const auto got = s.receive(5);
  const auto replies = final_replies(got.bytes);
  check(replies.size() == 1 && replies[0].status == 200 && replies[0].header("connection") == "close" && got.closed &&
            got.seconds < 2,
        "a GET with a body is answered and its connection closed", statuses(replies));
}

// Requests framed right keep their connection.
void framed_keeps_alive() {
  Socket s;
  // (Content-Encoding: identity, and 8 KiB header lines, are taken)
  s.send(
      post("/v1/completions", kCompletion, "Content-Encoding: identity\r\nX-Long: " + std::string(8000, 'a') + "\r\n") +
      post("/v1/completions", "{bad json"));
  const auto got = s.receive(1);
  const auto replies = final_replies(got.bytes);
  check(replies.size() == 2 && replies[0].status == 200 && replies[1].status == 400 && !got.closed &&
            replies[1].header("connection").empty(),
        "a well-framed request, even with a bad body, keeps its connection", statuses(replies));
}

// A request's head must arrive within the read timeout in all, and its body at a least rate: a
// client that sends a byte at a time, each within the read timeout, gets 408 and its connection
// closed once the deadline passes, rather than holding its thread for as long as it likes. A body
// cut short gets 408 too once the read timeout passes without input.
void request_deadlines() {
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\n";
  const std::string full = post("/v1/completions", kCompletion);
  const std::string body_head = full.substr(0, full.size() - kCompletion.size());
  const double gap = g_read_timeout / 4;
  struct Case {
    const char* what;
    std::string at_once, trickled;  // sent at once, then a byte every `gap`
  };
  const std::vector<Case> cases = {
      {"a request line sent a byte at a time", "", head},
      {"headers sent a byte at a time", "POST /v1/completions HTTP/1.1\r\n",
       "Host: kiln\r\nX-Padding: " + std::string(64, 'x')},
      {"a body sent a byte at a time", body_head, kCompletion},
  };
  for (const auto& c : cases) {
    Socket s;
    s.send(c.at_once);
    const auto got = trickle(s, c.trickled, gap, 3 * g_read_timeout);
    const auto replies = final_replies(got.bytes);
    check(replies.size() == 1 && replies[0].status == 408 && got.closed && got.seconds < g_read_timeout + 1.5 &&
              json::parse(replies[0].body, nullptr, false).contains("error"),
          std::string(c.what) + " gets 408 and its connection closed after the read timeout",
          statuses(replies) + (got.closed ? " closed" : " open") + " after " + std::to_string(got.seconds) + " s");
  }
  {
    Socket s;
    s.send(body_head + kCompletion.substr(0, kCompletion.size() / 2));
    const auto got = s.receive(g_read_timeout + 3);
    const auto replies = final_replies(got.bytes);
    check(replies.size() == 1 && replies[0].status == 408 && replies[0].header("connection") == "close" && got.closed,
          "a body shorter than its Content-Length gets 408 and its connection closed",
          statuses(replies) + " after " + std::to_string(got.seconds) + " s");
  }
  {
    // pauses shorter than the read timeout, in a head and a body each sent within their bounds
    Socket s;
    const auto pause = std::chrono::duration<double>(0.3 * g_read_timeout);
    s.send(body_head.substr(0, 20));
    std::this_thread::sleep_for(pause);
    s.send(body_head.substr(20));
    std::this_thread::sleep_for(pause);
    s.send(kCompletion.substr(0, 10));
    std::this_thread::sleep_for(pause);
    s.send(kCompletion.substr(10));
    const auto replies = final_replies(s.receive(5).bytes);
    check(replies.size() == 1 && replies[0].status == 200, "a request sent in pieces within its deadlines is answered",
          statuses(replies));
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string url = "http://127.0.0.1:8080";
  CLI::App app{"kiln_server_http: HTTP/1.1 framing against a kiln server, over raw sockets"};
  app.add_option("--url", url)->capture_default_str();
  app.add_option("--read-timeout", g_read_timeout, "The server's --read-timeout")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const size_t host_at = url.find("://") == std::string::npos ? 0 : url.find("://") + 3;
  const size_t colon = url.rfind(':');
  if (colon == std::string::npos || colon < host_at) {
    std::fprintf(stderr, "--url must name a port: %s\n", url.c_str());
    return 2;
  }
  g_host = url.substr(host_at, colon - host_at);
  g_port = url.substr(colon + 1);

  pipelined();
  many_requests_per_connection();
  half_closed();
  closed_client_cancels();
  client_closed_request();
  refused_framing();
  chunked_bodies();
  unread_body_closes();
  framed_keeps_alive();
  request_deadlines();

  std::printf("%d failure(s)\n", g_failures);
  return g_failures == 0 ? 0 : 1;
}
