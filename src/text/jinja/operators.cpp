// Python's operators on template values. See operators.h.
#include "text/jinja/operators.h"

#include <cmath>
#include <cstdio>

#include "text/jinja/jinja.h"
#include "text/jinja/pystr.h"

namespace kiln::jinja {

namespace {

using ast::BinaryOp;
using ast::CompareOp;

[[noreturn]] void integer_overflow() {
  fail(FailureKind::limit, "integer overflow (kiln's integers are 64-bit; Python's are unbounded)");
}

[[noreturn]] void zero_division(const char* message) {
  fail(FailureKind::runtime, "{}", message);
}

[[noreturn]] void unsupported(const char* op, const Value& a, const Value& b) {
  type_error("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b));
}

bool is_integral(const Value& v) {
  return v.is_int() || v.is_bool();
}

void check_string_size(size_t bytes, const RenderLimits& limits) {
  if (bytes > limits.max_output_bytes)
    fail(FailureKind::limit, "string of {} bytes exceeds kiln's output limit", bytes);
}

void check_items(size_t items, const RenderLimits& limits) {
  if (items > limits.max_container_items) fail(FailureKind::limit, "list of {} items exceeds kiln's limit", items);
}

// Python's float floor division and modulo (floatobject.c's float_divmod).
void float_divmod(double vx, double wx, double& floordiv, double& mod) {
  mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0) {
    if ((wx < 0) != (mod < 0)) {
      mod += wx;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, wx);
  }
  if (div != 0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, vx / wx);
  }
}

Value add(const Value& a, const Value& b, const RenderLimits& limits) {
  if (is_integral(a) && is_integral(b)) {
    int64_t r;
    if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) integer_overflow();
    return Value::integer(r);
  }
  if (a.is_number() && b.is_number()) return Value::floating(a.as_double() + b.as_double());
  if (a.is_string() && b.is_string()) {
    check_string_size(a.as_string().size() + b.as_string().size(), limits);
    // Markup escapes whatever plain text is added to it (markupsafe's __add__/__radd__).
    if (a.is_markup() != b.is_markup()) {
      return a.is_markup() ? Value::string(a.as_string() + py::escape_html(b.as_string()), true)
                           : Value::string(py::escape_html(a.as_string()) + b.as_string(), true);
    }
    return Value::string(a.as_string() + b.as_string(), a.is_markup());
  }
  if ((a.is_list() && b.is_list()) || (a.is_tuple() && b.is_tuple())) {
    check_items(a.as_list().size() + b.as_list().size(), limits);
    List items = a.as_list();
    items.insert(items.end(), b.as_list().begin(), b.as_list().end());
    return a.is_list() ? Value::list(std::move(items)) : Value::tuple(std::move(items));
  }
  if (a.is_string() && !a.is_markup()) type_error("can only concatenate str (not \"{}\") to str", type_name(b));
  if (a.is_list() || a.is_tuple())
    type_error("can only concatenate {} (not \"{}\") to {}", type_name(a), type_name(b), type_name(a));
  unsupported("+", a, b);
}

Value repeat(const Value& sequence, int64_t times, const RenderLimits& limits) {
  if (times < 0) times = 0;
  // Repeating nothing is nothing, however many times (and must not loop that many times).
  if (sequence.is_string() && sequence.as_string().empty()) return Value::string("", sequence.is_markup());
  if (!sequence.is_string() && sequence.as_list().empty()) times = 0;
  if (sequence.is_string()) {
    const std::string& s = sequence.as_string();
    if (!s.empty() && uint64_t(times) > limits.max_output_bytes / s.size())
      fail(FailureKind::limit, "string repetition exceeds kiln's output limit");
    std::string out;
    out.reserve(s.size() * size_t(times));
    for (int64_t i = 0; i < times; ++i) out += s;
    return Value::string(std::move(out), sequence.is_markup());
  }
  const List& items = sequence.as_list();
  if (!items.empty() && uint64_t(times) > limits.max_container_items / items.size())
    fail(FailureKind::limit, "list repetition exceeds kiln's limit");
  List out;
  out.reserve(items.size() * size_t(times));
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), items.begin(), items.end());
  return sequence.is_list() ? Value::list(std::move(out)) : Value::tuple(std::move(out));
}

Value multiply(const Value& a, const Value& b, const RenderLimits& limits) {
  if (is_integral(a) && is_integral(b)) {
    int64_t r;
    if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) integer_overflow();
    return Value::integer(r);
  }
  if (a.is_number() && b.is_number()) return Value::floating(a.as_double() * b.as_double());
  bool a_seq = a.is_string() || a.is_sequence(), b_seq = b.is_string() || b.is_sequence();
  if (a_seq && is_integral(b)) return repeat(a, b.as_int(), limits);
  if (b_seq && is_integral(a)) return repeat(b, a.as_int(), limits);
  if (a_seq && !b_seq) type_error("can't multiply sequence by non-int of type '{}'", type_name(b));
  if (b_seq && !a_seq) type_error("can't multiply sequence by non-int of type '{}'", type_name(a));
  unsupported("*", a, b);
}

Value power(const Value& a, const Value& b) {
  if (is_integral(a) && is_integral(b) && b.as_int() >= 0) {
    int64_t base = a.as_int(), exponent = b.as_int(), result = 1;
    while (exponent > 0) {
      if (exponent & 1)
        if (__builtin_mul_overflow(result, base, &result)) integer_overflow();
      exponent >>= 1;
      if (exponent > 0 && __builtin_mul_overflow(base, base, &base)) integer_overflow();
    }
    return Value::integer(result);
  }
  if (!a.is_number() || !b.is_number()) unsupported("** or pow()", a, b);
  double x = a.as_double(), y = b.as_double();
  if (x == 0 && y < 0) zero_division("0.0 cannot be raised to a negative power");
  if (x < 0 && y != std::floor(y) && std::isfinite(y))
    fail(FailureKind::limit,
         "negative number to a fractional power gives a complex number, which kiln does not support");
  double r = std::pow(x, y);
  if (std::isinf(r) && std::isfinite(x) && std::isfinite(y))
    fail(FailureKind::runtime, "(34, 'Numerical result out of range')");
  return Value::floating(r);
}

}  // namespace

Value binary_operation(BinaryOp op, const Value& a, const Value& b, const RenderLimits& limits) {
  // str % x formats even an undefined x (Python treats anything with __getitem__ as a mapping).
  if (op == BinaryOp::modulo && a.is_string())
    return Value::string(percent_format(a.as_string(), b, limits.max_output_bytes), a.is_markup());
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  switch (op) {
    case BinaryOp::add:
      return add(a, b, limits);
    case BinaryOp::subtract:
      if (is_integral(a) && is_integral(b)) {
        int64_t r;
        if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) integer_overflow();
        return Value::integer(r);
      }
      if (a.is_number() && b.is_number()) return Value::floating(a.as_double() - b.as_double());
      unsupported("-", a, b);
    case BinaryOp::multiply:
      return multiply(a, b, limits);
    case BinaryOp::divide:
      if (!a.is_number() || !b.is_number()) unsupported("/", a, b);
      if (b.as_double() == 0)
        zero_division(is_integral(a) && is_integral(b) ? "division by zero" : "float division by zero");
      if (is_integral(a) && is_integral(b))
        return Value::floating(double((long double)a.as_int() / (long double)b.as_int()));
      return Value::floating(a.as_double() / b.as_double());
    case BinaryOp::floor_divide:
    case BinaryOp::modulo: {
      bool floor_div = op == BinaryOp::floor_divide;
      if (!floor_div && a.is_string())
        return Value::string(percent_format(a.as_string(), b, limits.max_output_bytes), a.is_markup());
      if (!a.is_number() || !b.is_number()) unsupported(floor_div ? "//" : "%", a, b);
      if (is_integral(a) && is_integral(b)) {
        int64_t x = a.as_int(), y = b.as_int();
        if (y == 0) zero_division(floor_div ? "integer division or modulo by zero" : "integer modulo by zero");
        if (x == INT64_MIN && y == -1) {
          if (floor_div) integer_overflow();
          return Value::integer(0);
        }
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {
          q -= 1;
          r += y;
        }
        return Value::integer(floor_div ? q : r);
      }
      double y = b.as_double();
      if (y == 0) zero_division(floor_div ? "float floor division by zero" : "float modulo");
      double q, r;
      float_divmod(a.as_double(), y, q, r);
      return Value::floating(floor_div ? q : r);
    }
    case BinaryOp::power:
      return power(a, b);
    default:
      break;
  }
  type_error("unsupported binary operation");
}

Value negate(const Value& v) {
  if (v.is_undefined()) fail_undefined(v);
  if (is_integral(v)) {
    if (v.as_int() == INT64_MIN) integer_overflow();
    return Value::integer(-v.as_int());
  }
  if (v.is_float()) return Value::floating(-v.as_double());
  type_error("bad operand type for unary -: '{}'", type_name(v));
}

Value unary_plus(const Value& v) {
  if (v.is_undefined()) fail_undefined(v);
  if (is_integral(v)) return Value::integer(v.as_int());
  if (v.is_float()) return v;
  type_error("bad operand type for unary +: '{}'", type_name(v));
}

namespace {

const char* symbol(CompareOp op) {
  switch (op) {
    case CompareOp::lt:
      return "<";
    case CompareOp::le:
      return "<=";
    case CompareOp::gt:
      return ">";
    case CompareOp::ge:
      return ">=";
    default:
      return "==";
  }
}

bool ordered(CompareOp op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  auto apply = [op](int c) {
    switch (op) {
      case CompareOp::lt:
        return c < 0;
      case CompareOp::le:
        return c <= 0;
      case CompareOp::gt:
        return c > 0;
      default:
        return c >= 0;
    }
  };
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      long double x = a.is_float() ? (long double)a.as_double() : (long double)a.as_int();
      long double y = b.is_float() ? (long double)b.as_double() : (long double)b.as_int();
      if (std::isnan(x) || std::isnan(y)) return false;
      return apply(x < y ? -1 : x > y ? 1 : 0);
    }
    int64_t x = a.as_int(), y = b.as_int();
    return apply(x < y ? -1 : x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) return apply(a.as_string().compare(b.as_string()));
  if ((a.is_list() && b.is_list()) || (a.is_tuple() && b.is_tuple())) {
    const List &x = a.as_list(), &y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!equals(x[i], y[i])) return ordered(op, x[i], y[i]);
    return apply(x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0);
  }
  type_error("'{}' not supported between instances of '{}' and '{}'", symbol(op), type_name(a), type_name(b));
}

}  // namespace

bool compare(CompareOp op, const Value& a, const Value& b) {
  switch (op) {
    case CompareOp::eq:
      return equals(a, b);
    case CompareOp::ne:
      return !equals(a, b);
    case CompareOp::in:
      return contains(b, a);
    case CompareOp::not_in:
      return !contains(b, a);
    default:
      return ordered(op, a, b);
  }
}

Value slice(const Value& value, std::optional<int64_t> start_in, std::optional<int64_t> stop_in,
            std::optional<int64_t> step_in) {
  int64_t step = step_in.value_or(1);
  if (step == 0) fail(FailureKind::runtime, "slice step cannot be zero");
  std::u32string text;
  int64_t length;
  if (value.is_string()) {
    text = py::decode_utf8(value.as_string());
    length = int64_t(text.size());
  } else {
    length = int64_t(value.as_list().size());
  }
  // CPython's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> index, bool is_start) {
    if (!index) return is_start ? (step < 0 ? length - 1 : 0) : (step < 0 ? -1 : length);
    int64_t i = *index;
    if (i < 0) {
      i += length;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= length) {
      i = step < 0 ? length - 1 : length;
    }
    return i;
  };
  int64_t start = adjust(start_in, true), stop = adjust(stop_in, false);
  std::vector<int64_t> picks;
  if (step > 0) {
    for (int64_t i = start; i < stop; i += step) picks.push_back(i);
  } else {
    for (int64_t i = start; i > stop; i += step) picks.push_back(i);
  }
  if (value.is_string()) {
    std::u32string out;
    for (int64_t i : picks) out.push_back(text[size_t(i)]);
    return Value::string(py::encode_utf8(out), value.is_markup());
  }
  List out;
  for (int64_t i : picks) out.push_back(value.as_list()[size_t(i)]);
  return value.is_list() ? Value::list(std::move(out)) : Value::tuple(std::move(out));
}

}  // namespace kiln::jinja
