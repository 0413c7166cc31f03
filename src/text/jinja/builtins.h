// The filters, tests, globals and Python methods templates can call, looked up by name from
// constant tables (no registration at start-up, no global state).
#pragma once

#include <string_view>

#include "text/jinja/value.h"

namespace kiln::jinja {

using FilterFunction = Value (*)(Renderer& renderer, const Value& operand, CallArgs& args);
using TestFunction = bool (*)(Renderer& renderer, const Value& operand, CallArgs& args);

FilterFunction find_filter(std::string_view name);  // nullptr if jinja2 has no such filter (here)
TestFunction find_test(std::string_view name);

// Globals of transformers' environment: range, dict, namespace, cycler, joiner, raise_exception,
// strftime_now. Returns an undefined Value for other names.
Value find_global(std::string_view name);

// Python attribute lookup on a value (str/dict/list methods, bound to the value). Sets `found`
// false when the value has no such attribute; unsafe methods (list.append...) come back as the
// sandbox's unsafe-undefined value, which raises a SecurityError when called.
Value python_attribute(const Value& object, std::string_view name, bool& found);

}  // namespace kiln::jinja
