// Argument binding for builtins. See arguments.h.
#include "text/jinja/arguments.h"

namespace kiln::jinja {

BoundArguments bind_arguments(std::string_view function, const CallArgs& args,
                              std::initializer_list<Parameter> params) {
  std::vector<std::optional<Value>> values(params.size());
  if (args.positional.size() > params.size())
    type_error("{}() takes at most {} arguments ({} given)", function, params.size(), args.positional.size());
  for (size_t i = 0; i < args.positional.size(); ++i) values[i] = args.positional[i];
  for (const auto& [name, value] : args.keyword) {
    size_t index = 0;
    for (const Parameter& p : params) {
      if (p.name == name) break;
      ++index;
    }
    if (index == params.size()) type_error("{}() got an unexpected keyword argument '{}'", function, name);
    if (values[index]) type_error("{}() got multiple values for argument '{}'", function, name);
    values[index] = value;
  }
  std::vector<Value> bound;
  bound.reserve(params.size());
  size_t i = 0;
  for (const Parameter& p : params) {
    if (values[i]) {
      bound.push_back(std::move(*values[i]));
    } else if (p.default_value) {
      bound.push_back(*p.default_value);
    } else {
      type_error("{}() missing required argument: '{}'", function, p.name);
    }
    ++i;
  }
  return BoundArguments(std::move(bound));
}

int64_t integer_argument(std::string_view function, const Value& v) {
  if (v.is_int() || v.is_bool()) return v.as_int();
  type_error("{}(): '{}' object cannot be interpreted as an integer", function, type_name(v));
}

std::optional<std::string> optional_string_argument(std::string_view function, const Value& v) {
  if (v.is_none()) return std::nullopt;
  if (v.is_string()) return v.as_string();
  type_error("{}() argument must be str or None, not {}", function, type_name(v));
}

}  // namespace kiln::jinja
