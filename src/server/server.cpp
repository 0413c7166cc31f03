#include "server/server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <map>
#include <random>
#include <set>

#include "server/handlers.h"
#include "server/http_connection.h"
#include "server/responses.h"

namespace kiln::server {

using nlohmann::json;

// ---- helpers the handlers share ----

void respond_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void respond_events(httplib::Response& res, Service& service, EventSource source) {
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  auto provide = [source = std::move(source)](size_t, httplib::DataSink& sink) {
    bool broken = false;
    const Send send = [&](const std::string& data) {
      if (broken || !sink.is_writable()) return !(broken = true);
      if (data.empty()) return true;  // a liveness check only
      if (!sink.write(data.data(), data.size())) broken = true;
      return !broken;
    };
    bool more = false;
    try {
      more = source(send);
    } catch (const std::exception& e) {
      // never let a failure in one stream take the server down: end this response
      spdlog::error("a streamed response failed: {}", e.what());
      return false;
    }
    if (broken) return false;  // the client has gone: drop the connection
    if (!more) sink.done();
    return true;
  };
  service.stream_opened();
  // released once written, or abandoned, with the response
  res.set_chunked_content_provider("text/event-stream", std::move(provide),
                                   [&service](bool) { service.stream_closed(); });
}

ClientConnection::ClientConnection(const httplib::Request& req)
    : connection_(HttpConnection::current()), interim_allowed_(req.version == "HTTP/1.1") {}

bool ClientConnection::closed() const {
  if (!connection_) return false;
  switch (connection_->peer()) {
    case HttpConnection::Peer::sending:
      return false;
    case HttpConnection::Peer::gone:
      return true;
    case HttpConnection::Peer::done_sending:
      break;
  }
  if (!interim_allowed_) return true;
  if (probed_) return false;  // a closed socket's reset comes back within a round trip
  probed_ = true;
  return connection_->write("HTTP/1.1 100 Continue\r\n\r\n") < 0;
}

std::variant<json, ApiError> parse_body(const httplib::Request& req) {
  if (nesting_depth(req.body) > kMaxNesting)
    return ApiError{.message = fmt::format("the request body nests deeper than {} levels", kMaxNesting)};
  json body;
  try {
    body = json::parse(req.body);
  } catch (const json::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 5: ..." without its prefix
    std::string why = e.what();
    if (const size_t at = why.find("] "); at != std::string::npos) why.erase(0, at + 2);
    return ApiError{.message = "the request body is not valid JSON: " + why, .code = "invalid_json"};
  }
  if (!body.is_object()) return ApiError{.message = "the request body must be a JSON object"};
  return body;
}

std::variant<json, ApiError> read_request(const Service& service, const httplib::Request& req, bool model_required) {
  auto parsed = parse_body(req);
  if (std::holds_alternative<ApiError>(parsed)) return parsed;
  RequestFields fields(std::get<json>(parsed));
  std::string model;
  fields.string("model", model, model_required);
  if (!fields.ok()) return *fields.error();
  if (auto e = service.check_model(model)) return *e;
  return parsed;
}

json openai_error(const ApiError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? json() : json(e.param)},
            {"code", e.code.empty() ? json() : json(e.code)}}}};
}

json anthropic_error(const ApiError& e) {
  std::string type = e.status == 401   ? "authentication_error"
                     : e.status == 404 ? "not_found_error"
                     : e.status == 413 ? "request_too_large"
                     : e.status == 503 ? "overloaded_error"
                     : e.status >= 500 ? "api_error"
                                       : "invalid_request_error";
  // Anthropic's error has no param: the message starts with the field instead (once: "x: must
  // be ...", not "x: 'x' must be ...")
  std::string message = e.message;
  if (!e.param.empty()) {
    const std::string quoted = "'" + e.param + "' ";
    message = e.param + ": " + (message.rfind(quoted, 0) == 0 ? message.substr(quoted.size()) : message);
  }
  return {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
}

std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char digits[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += digits[rng() % (sizeof(digits) - 1)];
  return id;
}

// ---- the server ----

struct Server::Impl {
  Service service;
  ResponseStore responses;  // the Responses API's stored responses
  ServerOptions options;
  HttpServer http;
  bool bound = false;

  Impl(ServedModel model, const ServerOptions& o) : service(std::move(model)), options(o) {}

  bool is_anthropic(const httplib::Request& req) const { return req.path.rfind("/v1/messages", 0) == 0; }

  void error(const httplib::Request& req, httplib::Response& res, const ApiError& e) {
    respond_json(res, e.status, is_anthropic(req) ? anthropic_error(e) : openai_error(e));
  }

  // A request whose body cannot be read as it is framed is answered before httplib reads any of
  // it (at once, not after waiting for a body that may never end), and its connection closed.
  bool refuse_unframed(const httplib::Request& req, httplib::Response& res) {
    const auto problem = framing_error(req, options.max_body_bytes);
    if (!problem) return false;
    close_connection_after_response();
    error(req, res, ApiError{.status = problem->status, .message = problem->message});
    return true;
  }

  bool authorized(const httplib::Request& req) const {
    if (options.api_key.empty()) return true;
    const std::string bearer = "Bearer " + options.api_key;
    return req.get_header_value("Authorization") == bearer || req.get_header_value("x-api-key") == options.api_key;
  }

  void routes() {
    http.set_payload_max_length(options.max_body_bytes);
    // a client that stalls mid-request holds a thread only this long
    http.set_read_timeout(options.read_timeout_s, 0);
    http.set_write_timeout(60, 0);
    // httplib closes a connection after 5 requests by default, and its clients reconnect that
    // often; 1000 is nginx's keepalive_requests (the 5 s idle timeout stays)
    http.set_keep_alive_max_count(1000);
    // every request holds a thread until it is answered, queued ones included
    const int64_t batch = service.scheduler().options().max_batch;
    const int threads = options.http_threads > 0 ? options.http_threads : int(std::max<int64_t>(256, 4 * batch + 16));
    http.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
    service.set_max_waiting(options.max_waiting > 0 ? options.max_waiting
                                                    : std::max<int64_t>(1, int64_t(threads) - batch - 16));

    // with Expect: 100-continue the client waits for a go-ahead before sending the body
    http.set_expect_100_continue_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!refuse_unframed(req, res)) return 100;
      // httplib writes this answer without the Content-Length it gives the others
      res.set_header("Content-Length", std::to_string(res.body.size()));
      return res.status;
    });
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      // the head is read (and any 100 Continue written): the body's time starts
      if (HttpConnection* connection = HttpConnection::current()) connection->begin_body();
      if (refuse_unframed(req, res)) return httplib::Server::HandlerResponse::Handled;
      if (carries_unread_body(req)) close_connection_after_response();
      // httplib 0.11 holds a chunked body to no limit: its length is known only once it is read
      if (HttpConnection* connection = HttpConnection::current();
          connection && reads_body(req) && req.has_header("Transfer-Encoding"))
        connection->limit_body(options.max_body_bytes);
      if (req.path == "/health" || authorized(req)) return httplib::Server::HandlerResponse::Unhandled;
      // a fixed set of labels: a client without a key must not add series (or text) to /metrics
      static const std::set<std::string> kEndpoints = {"/v1/chat/completions", "/v1/completions", "/v1/messages",
                                                       "/v1/responses",        "/v1/models",      "/metrics"};
      service.metrics().request(kEndpoints.count(req.path) ? req.path : std::string("other"), 401);
      error(req, res,
            ApiError{.status = 401,
                     .type = "authentication_error",
                     .message = "a valid API key is required (Authorization: Bearer KEY)",
                     .code = "invalid_api_key"});
      if (reads_body(req)) close_connection_after_response();  // refused unread
      return httplib::Server::HandlerResponse::Handled;
    });
    // statuses httplib sets itself (413 body too large, 404 unknown path, 400 bad HTTP or a
    // request cut short, made 408 when its time ran out and 431 when its head was too large) get
    // an error body
    http.set_error_handler(
        httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
          if (!res.body.empty() || res.is_chunked_content_provider_) return httplib::Server::HandlerResponse::Unhandled;
          // httplib stops short of the body on any of its errors but an unknown path
          if (res.status != 404) close_connection_after_response();
          const HttpConnection* connection = HttpConnection::current();
          if (connection && connection->body_too_large())
            res.status = 413;
          else if (connection && connection->head_too_large())
            res.status = 431;
          else if (connection && connection->timed_out())
            res.status = 408;
          ApiError e{.status = res.status, .message = fmt::format("HTTP status {}", res.status)};
          if (res.status == 400) e.message = "malformed HTTP request (headers, chunked body or encoding)";
          if (res.status == 408)
            e.message = fmt::format(
                "the request did not arrive in time (headers within {} s, the body at {} KiB/s or more, no pause "
                "of {} s)",
                options.read_timeout_s, kMinBodyBytesPerSecond >> 10, options.read_timeout_s);
          if (res.status == 414) e.message = "the request line is too long";
          if (res.status == 431)
            e.message = connection && connection->header_line_too_long()
                            ? fmt::format("a header line exceeds {} KiB", kMaxHeaderLineBytes >> 10)
                            : fmt::format("the request's headers exceed {} KiB", kMaxHeadBytes >> 10);
          if (res.status == 415) e.message = "unsupported Content-Encoding (send the body uncompressed)";
          if (res.status == 413) e.message = fmt::format("the request body exceeds {} bytes", options.max_body_bytes);
          if (res.status == 404) e.message = fmt::format("no endpoint {} {}", req.method, req.path);
          if (res.status == 404) e.code = "not_found";
          // a known path asked with the wrong method
          static const std::map<std::string, std::string> kMethods = {{"/v1/chat/completions", "POST"},
                                                                      {"/v1/completions", "POST"},
                                                                      {"/v1/messages", "POST"},
                                                                      {"/v1/responses", "POST"},
                                                                      {"/v1/responses/ID", "GET, DELETE"},
                                                                      {"/v1/models", "GET"},
                                                                      {"/health", "GET"},
                                                                      {"/metrics", "GET"}};
          const bool one_model = req.path.rfind("/v1/models/", 0) == 0 && req.path.size() > 11;  // /v1/models/ID
          // /v1/responses/ID (one path segment)
          const bool one_response = req.path.rfind("/v1/responses/", 0) == 0 && req.path.size() > 14 &&
                                    req.path.find('/', 14) == std::string::npos;
          if (auto known = kMethods.find(one_model      ? std::string("/v1/models")
                                         : one_response ? std::string("/v1/responses/ID")
                                                        : req.path);
              res.status == 404 && known != kMethods.end()) {
            e.status = res.status = 405;
            e.message = fmt::format("{} takes {}, not {}", req.path, known->second, req.method);
            e.code = "method_not_allowed";
            res.set_header("Allow", known->second);
          }
          error(req, res, e);
          return httplib::Server::HandlerResponse::Handled;
        }));
    http.set_post_routing_handler([](const httplib::Request&, httplib::Response& res) {
      const HttpConnection* connection = HttpConnection::current();
      if (!connection || !connection->closing()) return;
      res.headers.erase("Keep-Alive");  // what httplib writes unless it closes the connection itself
      res.headers.erase("Connection");
      res.set_header("Connection", "close");
    });
    http.set_exception_handler([this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "internal error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      spdlog::error("{} {}: {}", req.method, req.path, what);
      error(req, res, ApiError{.status = 500, .type = "server_error", .message = what});
    });

    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      const SchedulerStats s = service.scheduler().stats();
      respond_json(res, 200,
                   {{"status", "ok"}, {"model", service.model_name()}, {"running", s.running}, {"queued", s.queued}});
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(service.metrics().prometheus(service.scheduler().stats()), "text/plain; version=0.0.4");
    });
    auto models = [this](const httplib::Request&, httplib::Response& res) {
      service.metrics().request("/v1/models", 200);
      respond_json(res, 200,
                   {{"object", "list"},
                    {"data",
                     {{{"id", service.model_name()},
                       {"object", "model"},
                       {"created", 0},
                       {"owned_by", "kiln"},
                       {"max_model_len", service.context()}}}}});
    };
    http.Get("/v1/models", models);
    http.Get("/v1/models/(.+)", [this](const httplib::Request& req, httplib::Response& res) {
      if (auto e = service.check_model(req.matches[1])) return error(req, res, *e);
      respond_json(res, 200, {{"id", service.model_name()}, {"object", "model"}, {"created", 0}, {"owned_by", "kiln"}});
    });
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      handle_chat_completions(service, req, res);
    });
    http.Post("/v1/completions",
              [this](const httplib::Request& req, httplib::Response& res) { handle_completions(service, req, res); });
    http.Post("/v1/messages",
              [this](const httplib::Request& req, httplib::Response& res) { handle_messages(service, req, res); });
    http.Post("/v1/messages/count_tokens",
              [this](const httplib::Request& req, httplib::Response& res) { handle_count_tokens(service, req, res); });
    http.Post("/v1/responses", [this](const httplib::Request& req, httplib::Response& res) {
      handle_responses(service, responses, req, res);
    });
    http.Get("/v1/responses/([^/]+)", [this](const httplib::Request& req, httplib::Response& res) {
      handle_get_response(service, responses, req, res);
    });
    http.Delete("/v1/responses/([^/]+)", [this](const httplib::Request& req, httplib::Response& res) {
      handle_delete_response(service, responses, req, res);
    });
    http.Post("/tokenize",
              [this](const httplib::Request& req, httplib::Response& res) { handle_tokenize(service, req, res); });
    http.Post("/detokenize",
              [this](const httplib::Request& req, httplib::Response& res) { handle_detokenize(service, req, res); });
  }
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() {
  stop();
}

Result<std::unique_ptr<Server>> Server::create(ServedModel model, const ServerOptions& options) {
  if (!model.scheduler) return make_error("the server needs a scheduler");
  auto impl = std::make_unique<Impl>(std::move(model), options);
  impl->routes();
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Result<int> Server::bind() {
  const int port =
      impl_->options.port == 0
          ? impl_->http.bind_to_any_port(impl_->options.host)
          : (impl_->http.bind_to_port(impl_->options.host, impl_->options.port) ? impl_->options.port : -1);
  if (port < 0) return make_error("cannot listen on {}:{}", impl_->options.host, impl_->options.port);
  impl_->bound = true;
  return port;
}

Status Server::listen() {
  if (!impl_->bound) KILN_TRY(bind());
  if (!impl_->http.listen_after_bind() && impl_->http.is_running()) return make_error("the HTTP listener failed");
  return ok_status();
}

void Server::stop() {
  impl_->http.stop();
}

void Server::stop_after_streams() {
  impl_->service.wait_for_streams();
  impl_->http.stop();
}

}  // namespace kiln::server
