// jinja2's built-in tests (tests.py), for `x is name(args)`.
#include "text/jinja/arguments.h"
#include "text/jinja/builtins.h"
#include "text/jinja/operators.h"
#include "text/jinja/pystr.h"
#include "text/jinja/renderer.h"

namespace kiln::jinja {

namespace {

using ast::BinaryOp;
using ast::CompareOp;

void no_arguments(std::string_view test, CallArgs& args) {
  bind_arguments(test, args, {});
}

const Value& one_argument(std::string_view test, CallArgs& args, std::string_view name) {
  if (args.positional.size() + args.keyword.size() != 1)
    type_error("{}() takes exactly one argument ({} given)", test, args.positional.size() + args.keyword.size());
  if (!args.positional.empty()) return args.positional[0];
  if (args.keyword[0].first != name)
    type_error("{}() got an unexpected keyword argument '{}'", test, args.keyword[0].first);
  return args.keyword[0].second;
}

bool test_odd(Renderer& r, const Value& v, CallArgs& args) {
  no_arguments("odd", args);
  return equals(binary_operation(BinaryOp::modulo, v, Value::integer(2), r.limits()), Value::integer(1));
}

bool test_even(Renderer& r, const Value& v, CallArgs& args) {
  no_arguments("even", args);
  return equals(binary_operation(BinaryOp::modulo, v, Value::integer(2), r.limits()), Value::integer(0));
}

bool test_divisibleby(Renderer& r, const Value& v, CallArgs& args) {
  const Value& num = one_argument("divisibleby", args, "num");
  return equals(binary_operation(BinaryOp::modulo, v, num, r.limits()), Value::integer(0));
}

bool test_defined(Renderer& r, const Value& v, CallArgs& args) {
  return no_arguments("defined", args), !v.is_undefined();
}
bool test_undefined(Renderer& r, const Value& v, CallArgs& args) {
  return no_arguments("undefined", args), v.is_undefined();
}

bool test_filter(Renderer& r, const Value& v, CallArgs& args) {
  no_arguments("filter", args);
  if (v.is_string()) return find_filter(v.as_string()) != nullptr;
  if (!is_hashable(v)) type_error("unhashable type: '{}'", type_name(v));
  return false;
}

bool test_test(Renderer& r, const Value& v, CallArgs& args) {
  no_arguments("test", args);
  if (v.is_string()) return find_test(v.as_string()) != nullptr;
  if (!is_hashable(v)) type_error("unhashable type: '{}'", type_name(v));
  return false;
}

bool test_none(Renderer& r, const Value& v, CallArgs& args) {
  return no_arguments("none", args), v.is_none();
}
bool test_boolean(Renderer& r, const Value& v, CallArgs& args) {
  return no_arguments("boolean", args), v.is_bool();
}
bool test_false(Renderer& r, const Value& v, CallArgs& args) {
  return no_arguments("false", args), v.is_bool() && !v.as_bool();
}
bool test_true(Renderer& r, const Value& v, CallArgs& args) {
  return no_arguments("true", args), v.is_bool() && v.as_bool();
}
bool test_integer(Renderer& r, const Value& v, CallArgs& args) {
  return no_arguments("integer", args), v.is_int();
}
bool test_float(Renderer& r, const Value& v, CallArgs& args) {
  return no_arguments("float", args), v.is_float();
}
bool test_lower(Renderer& r, const Value& v, CallArgs& args) {
  return no_arguments("lower", args), py::is_lower(r.str(v));
}
bool test_upper(Renderer& r, const Value& v, CallArgs& args) {
  return no_arguments("upper", args), py::is_upper(r.str(v));
}
bool test_string(Renderer& r, const Value& v, CallArgs& args) {
  return no_arguments("string", args), v.is_string();
}
bool test_mapping(Renderer& r, const Value& v, CallArgs& args) {
  return no_arguments("mapping", args), v.is_dict();
}
bool test_number(Renderer& r, const Value& v, CallArgs& args) {
  return no_arguments("number", args), v.is_number();
}

// len() and __getitem__ (undefined has both; so do dicts).
bool test_sequence(Renderer& r, const Value& v, CallArgs& args) {
  no_arguments("sequence", args);
  return v.is_string() || v.is_sequence() || v.is_dict() || v.is_undefined();
}

bool test_iterable(Renderer& r, const Value& v, CallArgs& args) {
  no_arguments("iterable", args);
  return v.is_string() || v.is_sequence() || v.is_dict() || v.is_undefined() || v.object_as<Iterator>() ||
         v.object_as<DictView>() || v.object_as<LoopState>();
}

// Undefined is callable in jinja2 (calling it raises).
bool test_callable(Renderer& r, const Value& v, CallArgs& args) {
  no_arguments("callable", args);
  return v.is_undefined() || (v.is_object() && v.as_object()->is_callable());
}

// Python's `is`: None and the bools are singletons, small ints are cached, everything else is
// identity of the shared object.
bool test_sameas(Renderer& r, const Value& v, CallArgs& args) {
  const Value& other = one_argument("sameas", args, "other");
  if (v.kind() != other.kind() || v.is_undefined()) return false;
  switch (v.kind()) {
    case Value::Kind::none:
      return true;
    case Value::Kind::boolean:
      return v.as_bool() == other.as_bool();
    case Value::Kind::integer:
      return v.as_int() == other.as_int() && v.as_int() >= -5 && v.as_int() <= 256;
    case Value::Kind::floating:
      return false;
    default:
      return v.identity() == other.identity();
  }
}

bool test_escaped(Renderer& r, const Value& v, CallArgs& args) {
  return no_arguments("escaped", args), v.is_markup();
}

bool test_in(Renderer& r, const Value& v, CallArgs& args) {
  return contains(one_argument("in", args, "seq"), v);
}

template <CompareOp op>
bool test_compare(Renderer& r, const Value& v, CallArgs& args) {
  if (args.positional.size() != 1 || !args.keyword.empty())
    type_error("expected 2 arguments, got {}", 1 + args.positional.size() + args.keyword.size());
  return compare(op, v, args.positional[0]);
}

struct TestEntry {
  std::string_view name;
  TestFunction function;
};

constexpr TestEntry kTests[] = {
    {"odd", test_odd},
    {"even", test_even},
    {"divisibleby", test_divisibleby},
    {"defined", test_defined},
    {"undefined", test_undefined},
    {"filter", test_filter},
    {"test", test_test},
    {"none", test_none},
    {"boolean", test_boolean},
    {"false", test_false},
    {"true", test_true},
    {"integer", test_integer},
    {"float", test_float},
    {"lower", test_lower},
    {"upper", test_upper},
    {"string", test_string},
    {"mapping", test_mapping},
    {"number", test_number},
    {"sequence", test_sequence},
    {"iterable", test_iterable},
    {"callable", test_callable},
    {"sameas", test_sameas},
    {"escaped", test_escaped},
    {"in", test_in},
    {"==", test_compare<CompareOp::eq>},
    {"eq", test_compare<CompareOp::eq>},
    {"equalto", test_compare<CompareOp::eq>},
    {"!=", test_compare<CompareOp::ne>},
    {"ne", test_compare<CompareOp::ne>},
    {">", test_compare<CompareOp::gt>},
    {"gt", test_compare<CompareOp::gt>},
    {"greaterthan", test_compare<CompareOp::gt>},
    {">=", test_compare<CompareOp::ge>},
    {"ge", test_compare<CompareOp::ge>},
    {"<", test_compare<CompareOp::lt>},
    {"lt", test_compare<CompareOp::lt>},
    {"lessthan", test_compare<CompareOp::lt>},
    {"<=", test_compare<CompareOp::le>},
    {"le", test_compare<CompareOp::le>},
};

}  // namespace

TestFunction find_test(std::string_view name) {
  for (const TestEntry& entry : kTests)
    if (entry.name == name) return entry.function;
  return nullptr;
}

}  // namespace kiln::jinja
