// Python's operators on template values: arithmetic (int/float promotion, floor division and
// modulo with Python's signs, string and list repetition), comparisons, slicing, and the two
// string formatting mini-languages (printf-style `%` and str.format).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "text/jinja/ast.h"
#include "text/jinja/value.h"

namespace kiln::jinja {

struct RenderLimits;

Value binary_operation(ast::BinaryOp op, const Value& left, const Value& right, const RenderLimits& limits);
Value negate(const Value& operand);
Value unary_plus(const Value& operand);
bool compare(ast::CompareOp op, const Value& left, const Value& right);

// value[start:stop:step] for lists, tuples and strings; nullopt parts are omitted bounds.
Value slice(const Value& value, std::optional<int64_t> start, std::optional<int64_t> stop, std::optional<int64_t> step);

// format % args, as Python's str.__mod__ does.
std::string percent_format(std::string_view format, const Value& args, size_t max_bytes = SIZE_MAX);

// format.format(*args, **kwargs), as Python's str.format (jinja2's SandboxedFormatter) does.
std::string brace_format(Renderer& renderer, std::string_view format, const CallArgs& args);

// format(value, spec) for one replacement field.
std::string format_value(const Value& value, std::string_view spec, size_t max_bytes = SIZE_MAX);

}  // namespace kiln::jinja
