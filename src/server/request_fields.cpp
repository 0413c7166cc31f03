#include "server/request_fields.h"

#include <fmt/format.h>
#include <algorithm>
#include <cmath>

namespace kiln::server {

using nlohmann::json;

int nesting_depth(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

const json* RequestFields::field(const char* key) {
  if (!body_.is_object()) return nullptr;
  auto it = body_.find(key);
  if (it == body_.end() || it->is_null()) return nullptr;
  return &*it;
}

void RequestFields::fail(std::string param, std::string message) {
  if (!error_) error_ = ApiError{.message = std::move(message), .param = std::move(param)};
}

void RequestFields::number(const char* key, double lo, double hi, float& out) {
  const json* f = field(key);
  if (!f) return;
  if (!f->is_number()) return fail(key, fmt::format("'{}' must be a number", key));
  const double v = f->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi)
    return fail(key, fmt::format("'{}' must be between {} and {}", key, lo, hi));
  out = float(v);
}

void RequestFields::integer(const char* key, int64_t lo, int64_t hi, int64_t& out) {
  const json* f = field(key);
  if (!f) return;
  const auto out_of_range = [&] { fail(key, fmt::format("'{}' must be between {} and {}", key, lo, hi)); };
  if (f->is_number_float()) {
    const double d = f->get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) return fail(key, fmt::format("'{}' must be an integer", key));
    // 2^63 itself does not fit: compare before converting
    if (d < double(lo) || d > double(hi) || d >= 9223372036854775808.0) return out_of_range();
    out = int64_t(d);
    return;
  }
  if (!f->is_number_integer()) return fail(key, fmt::format("'{}' must be an integer", key));
  if (f->is_number_unsigned() && f->get<uint64_t>() > uint64_t(INT64_MAX)) return out_of_range();
  const int64_t v = f->get<int64_t>();
  if (v < lo || v > hi) return out_of_range();
  out = v;
}

void RequestFields::boolean(const char* key, bool& out) {
  const json* f = field(key);
  if (!f) return;
  if (!f->is_boolean()) return fail(key, fmt::format("'{}' must be a boolean", key));
  out = f->get<bool>();
}

void RequestFields::string(const char* key, std::string& out, bool required) {
  const json* f = field(key);
  if (!f) {
    if (required) fail(key, fmt::format("'{}' is required", key));
    return;
  }
  if (!f->is_string()) return fail(key, fmt::format("'{}' must be a string", key));
  out = f->get<std::string>();
}

void RequestFields::strings(const char* key, std::vector<std::string>& out, size_t max_count) {
  const json* f = field(key);
  if (!f) return;
  if (f->is_string()) {
    out = {f->get<std::string>()};
  } else if (f->is_array()) {
    if (f->size() > max_count) return fail(key, fmt::format("'{}' holds at most {} strings", key, max_count));
    std::vector<std::string> values;
    for (const auto& s : *f) {
      if (!s.is_string()) return fail(key, fmt::format("'{}' must be a string or an array of strings", key));
      values.push_back(s.get<std::string>());
    }
    out = std::move(values);
  } else {
    return fail(key, fmt::format("'{}' must be a string or an array of strings", key));
  }
  for (const auto& s : out)
    if (s.empty()) return fail(key, fmt::format("'{}' must not hold empty strings", key));
}

const json* RequestFields::object(const char* key, bool required) {
  const json* f = field(key);
  if (!f) {
    if (required) fail(key, fmt::format("'{}' is required", key));
    return nullptr;
  }
  if (!f->is_object()) {
    fail(key, fmt::format("'{}' must be an object", key));
    return nullptr;
  }
  return f;
}

const json* RequestFields::array(const char* key, bool required) {
  const json* f = field(key);
  if (!f) {
    if (required) fail(key, fmt::format("'{}' is required", key));
    return nullptr;
  }
  if (!f->is_array()) {
    fail(key, fmt::format("'{}' must be an array", key));
    return nullptr;
  }
  return f;
}

}  // namespace kiln::server
