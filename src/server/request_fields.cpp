#include "server/request_fields.h"

#include <fmt/format.h>
#include <algorithm>
#include <cmath>

namespace kiln::server {

using nlohmann::json;

const json* RequestFields::field(const char* key) {
  if (!body_.is_object()) return nullptr;
  auto it = body_.find(key);
  if (it == body_.end() || it->is_null()) return nullptr;
  return &*it;
}

void RequestFields::fail(std::string param, std::string message) {
  if (!error_) error_ = ApiError{.message = std::move(message), .param = std::move(param)};
}

void RequestFields::refuse(const char* key, std::string_view problem) {
  const std::string param = path_.empty() ? std::string(key) : path_ + "." + key;
  fail(param, fmt::format("'{}' {}", param, problem));
}

void RequestFields::number(const char* key, double lo, double hi, float& out) {
  const json* f = field(key);
  if (!f) return;
  if (!f->is_number()) return refuse(key, "must be a number");
  const double v = f->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) return refuse(key, fmt::format("must be between {} and {}", lo, hi));
  out = float(v);
}

void RequestFields::integer(const char* key, int64_t lo, int64_t hi, int64_t& out) {
  const json* f = field(key);
  if (!f) return;
  const auto out_of_range = [&] { refuse(key, fmt::format("must be between {} and {}", lo, hi)); };
  if (f->is_number_float()) {
    const double d = f->get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) return refuse(key, "must be an integer");
    // 2^63 itself does not fit: compare before converting
    if (d < double(lo) || d > double(hi) || d >= 9223372036854775808.0) return out_of_range();
    out = int64_t(d);
    return;
  }
  if (!f->is_number_integer()) return refuse(key, "must be an integer");
  if (f->is_number_unsigned() && f->get<uint64_t>() > uint64_t(INT64_MAX)) return out_of_range();
  const int64_t v = f->get<int64_t>();
  if (v < lo || v > hi) return out_of_range();
  out = v;
}

void RequestFields::boolean(const char* key, bool& out) {
  const json* f = field(key);
  if (!f) return;
  if (!f->is_boolean()) return refuse(key, "must be a boolean");
  out = f->get<bool>();
}

void RequestFields::string(const char* key, std::string& out, bool required) {
  const json* f = field(key);
  if (!f) {
    if (required) refuse(key, "is required");
    return;
  }
  if (!f->is_string()) return refuse(key, "must be a string");
  out = f->get<std::string>();
}

void RequestFields::strings(const char* key, std::vector<std::string>& out, size_t max_count, bool or_string) {
  const json* f = field(key);
  if (!f) return;
  const char* expected = or_string ? "must be a string or an array of strings" : "must be an array of strings";
  if (f->is_string() && or_string) {
    out = {f->get<std::string>()};
  } else if (f->is_array()) {
    if (f->size() > max_count) return refuse(key, fmt::format("holds at most {} strings", max_count));
    std::vector<std::string> values;
    for (const auto& s : *f) {
      if (!s.is_string()) return refuse(key, expected);
      values.push_back(s.get<std::string>());
    }
    out = std::move(values);
  } else {
    return refuse(key, expected);
  }
  for (const auto& s : out)
    if (s.empty()) return refuse(key, "must not hold empty strings");
}

const json* RequestFields::object(const char* key, bool required) {
  const json* f = field(key);
  if (!f) {
    if (required) refuse(key, "is required");
    return nullptr;
  }
  if (!f->is_object()) {
    refuse(key, "must be an object");
    return nullptr;
  }
  return f;
}

const json* RequestFields::array(const char* key, bool required) {
  const json* f = field(key);
  if (!f) {
    if (required) refuse(key, "is required");
    return nullptr;
  }
  if (!f->is_array()) {
    refuse(key, "must be an array");
    return nullptr;
  }
  return f;
}

}  // namespace kiln::server
