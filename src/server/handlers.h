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

class HttpConnection;
class ResponseStore;  // server/responses.h

// Whether the client that sent a request has gone, for responses written only at the end (a
// non-streamed generation is cancelled then). Made and asked on the thread serving the request.
class ClientConnection {
 public:
  explicit ClientConnection(const httplib::Request& req);
  // True once the client can no longer read the answer: it reset the connection, or closed it.
  // A client that has sent its last byte may have closed its socket or only half-closed it and
  // be waiting for the answer; the first time that is seen an interim 100 (Continue), which
  // HTTP/1.1 clients read past, is written, and a closed socket answers it with a reset. HTTP/1.0
  // has no interim responses: there a client that has sent its last byte counts as gone.
  bool closed() const;

 private:
  HttpConnection* connection_;  // nullptr: not served by HttpServer; then closed() is always false
  bool interim_allowed_;
  mutable bool probed_ = false;
};

// The request body as a JSON object, or an ApiError for malformed JSON or any other JSON value.
std::variant<nlohmann::json, ApiError> parse_body(const httplib::Request& req);
// parse_body with the body's "model" (a string, required where `model_required`) checked against
// the served model: how every endpoint that takes a body begins.
std::variant<nlohmann::json, ApiError> read_request(const Service& service, const httplib::Request& req,
                                                    bool model_required = false);

// Sampling fields shared by the OpenAI endpoints (temperature, top_p, top_k, min_p, penalties, seed).
SamplingParams read_sampling(RequestFields& fields, const SamplingParams& defaults);

// OpenAI's error object.
nlohmann::json openai_error(const ApiError& error);
// Anthropic's error object.
nlohmann::json anthropic_error(const ApiError& error);

// A short random id (for response, tool call and message ids).
std::string random_id(const char* prefix);

// The reasoning efforts OpenAI names (none, minimal, low, medium, high, xhigh), which reach the chat
// template as reasoning_effort.
bool known_reasoning_effort(const std::string& effort);

void handle_chat_completions(Service& service, const httplib::Request& req, httplib::Response& res);
void handle_completions(Service& service, const httplib::Request& req, httplib::Response& res);
void handle_messages(Service& service, const httplib::Request& req, httplib::Response& res);
// Anthropic's /v1/messages/count_tokens: a Messages request's prompt tokens.
void handle_count_tokens(Service& service, const httplib::Request& req, httplib::Response& res);
// /tokenize and /detokenize, in vLLM's shapes (and llama.cpp's field names).
void handle_tokenize(Service& service, const httplib::Request& req, httplib::Response& res);
void handle_detokenize(Service& service, const httplib::Request& req, httplib::Response& res);
// The OpenAI Responses API: POST /v1/responses, and GET and DELETE /v1/responses/{id} (the id in
// req.matches[1]).
void handle_responses(Service& service, ResponseStore& store, const httplib::Request& req, httplib::Response& res);
void handle_get_response(Service& service, ResponseStore& store, const httplib::Request& req, httplib::Response& res);
void handle_delete_response(Service& service, ResponseStore& store, const httplib::Request& req,
                            httplib::Response& res);

}  // namespace kiln::server
