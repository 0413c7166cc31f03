// Reading a request body's fields with type and range checks. The first problem found becomes
// an ApiError naming the field, which the handlers return as a 4xx.
#pragma once

#include <cctype>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/json_text.h"

namespace kiln::server {

struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // the field at fault, or empty
  std::string code;   // e.g. "model_not_found", "context_length_exceeded"
};

// Request bodies nest at most kMaxNesting deep, as tool call arguments do (engine/json_text.h).
using engine::kMaxNesting;
using engine::nesting_depth;
using engine::string_field;

class RequestFields {
 public:
  // `path`: where `body` is in the request ("stream_options"), which the errors name; empty for
  // the request body itself.
  explicit RequestFields(const nlohmann::json& body, std::string path = {}) : body_(body), path_(std::move(path)) {}

  // Each reader leaves `out` untouched when the field is absent or null, and records an error
  // (the first one wins) when it has the wrong type or range.
  void number(const char* key, double lo, double hi, float& out);
  void integer(const char* key, int64_t lo, int64_t hi, int64_t& out);
  void boolean(const char* key, bool& out);
  void string(const char* key, std::string& out, bool required = false);
  // A string or an array of strings (OpenAI's `stop`); only an array without `or_string`
  // (Anthropic's `stop_sequences`).
  void strings(const char* key, std::vector<std::string>& out, size_t max_count, bool or_string = true);
  // An object or array field (`tools`, `messages`), by reference; null when absent.
  const nlohmann::json* object(const char* key, bool required = false);
  const nlohmann::json* array(const char* key, bool required = false);

  void fail(std::string param, std::string message);
  bool ok() const { return !error_; }
  const std::optional<ApiError>& error() const { return error_; }

 private:
  const nlohmann::json* field(const char* key);
  void refuse(const char* key, std::string_view problem);  // fails naming the field: "'key' problem"
  const nlohmann::json& body_;
  std::string path_;
  std::optional<ApiError> error_;
};

// A tool's name as OpenAI and Anthropic take it: letters, digits, '_' and '-', 1 to `longest`
// characters. The name goes verbatim into the model's tool-call markup (and a forced call's
// opening), where a quote or a line break could never be written back as a call.
inline bool valid_tool_name(const std::string& name, size_t longest) {
  if (name.empty() || name.size() > longest) return false;
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  return true;
}

}  // namespace kiln::server
