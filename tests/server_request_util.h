// What the server's request tests share: posting a body to a handler with no model behind it, and
// reading the answer's status, the field it names and its message.
#pragma once

#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>

#include "server/handlers.h"
#include "server/service.h"

namespace kiln::server {

using nlohmann::json;

// A handler's answer to a request body: the status and, for an error, the field it names
// (OpenAI's `param`; Anthropic's error has none and starts its message with it) and the message.
struct Answer {
  int status = 0;
  std::string param, message;
};

using Handler = void (*)(Service&, const httplib::Request&, httplib::Response&);

inline Answer post(Handler handler, const std::string& body) {
  // no model behind it: a request that passes every check fails when its prompt is made, with
  // "this model has no tokenizer..." and no field named
  static Service service(ServedModel{.name = "m"});
  httplib::Request req;
  req.body = body;
  httplib::Response res;
  handler(service, req, res);
  const json answer = json::parse(res.body);
  const json& error = answer.at("error");
  return {.status = res.status,
          .param = error.contains("param") && error["param"].is_string() ? error["param"].get<std::string>() : "",
          .message = error.at("message").get<std::string>()};
}

// Passed every check of the request's fields (what is left is the missing model).
inline bool passes_checks(const Answer& a) {
  return a.status == 400 && a.message.find("no tokenizer") != std::string::npos;
}

inline std::string deep(size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

// `request` with `field` set to `value` (JSON text).
inline std::string with(const json& request, const std::string& field, const std::string& value) {
  json out = request;
  out[field] = json::parse(value);
  return out.dump();
}

}  // namespace kiln::server
