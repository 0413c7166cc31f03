// Binding Python-style call arguments (positional and keyword) to a builtin's parameters, with
// Python's errors for unknown, duplicate or missing arguments.
#pragma once

#include <initializer_list>
#include <optional>
#include <string_view>
#include <vector>

#include "text/jinja/value.h"

namespace kiln::jinja {

struct Parameter {
  std::string_view name;
  std::optional<Value> default_value;  // nullopt: required
};

class BoundArguments {
 public:
  explicit BoundArguments(std::vector<Value> values) : values_(std::move(values)) {}
  const Value& operator[](size_t i) const { return values_[i]; }

 private:
  std::vector<Value> values_;
};

BoundArguments bind_arguments(std::string_view function, const CallArgs& args, std::initializer_list<Parameter> params);

// Helpers for argument values.
int64_t integer_argument(std::string_view function, const Value& v);  // ints and bools; TypeError otherwise
std::optional<std::string> optional_string_argument(std::string_view function, const Value& v);  // None → nullopt

}  // namespace kiln::jinja
