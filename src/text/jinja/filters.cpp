// jinja2's built-in filters (filters.py) with transformers' tojson, evaluated eagerly. Filters
// that return generators in jinja2 (map, select, reject, selectattr, rejectattr, unique, batch,
// slice, items, reverse) return one-shot Iterator values, so that truthiness, len() and repeated
// iteration behave as they do in Python.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>

#include "text/jinja/filters.h"

#include "text/jinja/arguments.h"
#include "text/jinja/builtins.h"
#include "text/jinja/json.h"
#include "text/jinja/operators.h"
#include "text/jinja/pystr.h"
#include "text/jinja/renderer.h"

namespace kiln::jinja {

namespace filters {

Value soft_str(Renderer& r, const Value& v) {
  return v.is_string() ? v : Value::string(r.str(v));
}

Value generator(Iterator::Next next, const Value& source) {
  return Value::object(std::make_shared<Iterator>(std::move(next), source, "generator"));
}

Iterator::Next lazy_items(const Value& value) {
  // Python's `for item in value` inside a generator: an iterator is pulled one item at a time; a
  // container is read (and a non-iterable rejected) when the generator first runs.
  if (value.object_as<Iterator>()) return [value](Value& out) { return value.object_as<Iterator>()->take_one(out); };
  auto items = std::make_shared<std::optional<List>>();
  auto position = std::make_shared<size_t>(0);
  return [value, items, position](Value& out) {
    if (!*items) *items = iterate(value);
    if (*position >= (*items)->size()) return false;
    out = (**items)[(*position)++];
    return true;
  };
}

Value generator(List items, std::string type) {
  return Value::object(std::make_shared<Iterator>(std::move(items), std::move(type)));
}

// jinja2's make_attrgetter: a dotted path ("a.b.0"), each part looked up with getitem; digit parts
// are integers. `fallback` replaces undefined steps; `lowercase` is the ignore_case postprocess.
Value attribute_path(Renderer& r, Value item, const Value& attribute, const Value* fallback, bool lowercase) {
  std::vector<Value> parts;
  if (attribute.is_string()) {
    for (std::string& part : py::split(attribute.as_string(), std::string("."), -1)) {
      bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
      parts.push_back(digits && part.size() < 18 ? Value::integer(std::stoll(part)) : Value::string(std::move(part)));
    }
  } else if (!attribute.is_none()) {
    parts.push_back(attribute);
  }
  for (const Value& part : parts) {
    item = r.get_item(item, part);
    if (fallback && !fallback->is_none() && item.is_undefined()) item = *fallback;
  }
  if (lowercase && item.is_string()) item = Value::string(py::lower(item.as_string()));
  return item;
}

// make_multi_attrgetter: comma-separated paths, giving a list of keys.
Value multi_attribute_key(Renderer& r, const Value& item, const Value& attribute, bool lowercase) {
  List keys;
  if (attribute.is_string()) {
    for (std::string& path : py::split(attribute.as_string(), std::string(","), -1))
      keys.push_back(attribute_path(r, item, Value::string(std::move(path)), nullptr, lowercase));
  } else {
    keys.push_back(attribute_path(r, item, attribute, nullptr, lowercase));
  }
  return Value::list(std::move(keys));
}

// Python's sorted(items, key=..., reverse=...): stable in both directions.
void sort_by_keys(List& items, List keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return reverse ? less_than(keys[b], keys[a]) : less_than(keys[a], keys[b]);
  });
  List sorted;
  sorted.reserve(items.size());
  for (size_t i : order) sorted.push_back(std::move(items[i]));
  items = std::move(sorted);
}

bool parse_python_int(std::string text, int base, int64_t& out) {
  text = py::strip(text, std::nullopt);
  size_t i = 0;
  bool negative = false;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) negative = text[i++] == '-';
  auto prefix_base = [&](char c) { return c == 'x' ? 16 : c == 'o' ? 8 : c == 'b' ? 2 : 0; };
  if (i + 1 < text.size() && text[i] == '0') {
    int p = prefix_base(char(text[i + 1] | 0x20));
    if (p && (base == 0 || base == p)) {
      base = p;
      i += 2;
      if (i < text.size() && text[i] == '_') ++i;
    }
  }
  if (base == 0) {
    base = 10;
    // Base 0 rejects leading zeros in a non-zero decimal ("010").
    size_t j = i;
    while (j < text.size() && (text[j] == '0' || text[j] == '_')) ++j;
    if (j < text.size() && j > i && text[i] == '0') return false;
  }
  if (base < 2 || base > 36 || i >= text.size()) return false;
  __int128 value = 0;
  bool previous_digit = false;
  for (; i < text.size(); ++i) {
    char c = text[i];
    if (c == '_') {
      if (!previous_digit || i + 1 >= text.size()) return false;
      previous_digit = false;
      continue;
    }
    int d = (c >= '0' && c <= '9') ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'z' ? (c | 0x20) - 'a' + 10 : 99;
    if (d >= base) return false;
    value = value * base + d;
    if (value > (__int128)INT64_MAX + 1) return false;
    previous_digit = true;
  }
  if (!previous_digit) return false;
  if (negative) value = -value;
  if (value > INT64_MAX || value < INT64_MIN) return false;
  out = int64_t(value);
  return true;
}

bool parse_python_float(const std::string& input, double& out) {
  std::string text = py::strip(input, std::nullopt);
  std::string lowered = py::lower(text);
  std::string body = lowered;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) body = body.substr(1);
  if (body == "inf" || body == "infinity" || body == "nan") {
    out = body == "nan" ? NAN : INFINITY;
    if (lowered[0] == '-') out = -out;
    return true;
  }
  // [sign] digits [. digits] [e [sign] digits], with single underscores between digits.
  std::string clean;
  size_t i = 0;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) clean.push_back(text[i++]);
  bool digits = false, point = false, exponent = false;
  char previous = '\0';
  for (; i < text.size(); ++i) {
    char c = text[i];
    if (c >= '0' && c <= '9') {
      digits = true;
      clean.push_back(c);
    } else if (c == '_') {
      if (!(previous >= '0' && previous <= '9') || i + 1 >= text.size() || !(text[i + 1] >= '0' && text[i + 1] <= '9'))
        return false;
    } else if (c == '.' && !point && !exponent) {
      point = true;
      clean.push_back(c);
    } else if ((c == 'e' || c == 'E') && digits && !exponent) {
      exponent = true;
      clean.push_back('e');
      if (i + 1 < text.size() && (text[i + 1] == '+' || text[i + 1] == '-')) clean.push_back(text[++i]);
      if (i + 1 >= text.size()) return false;
      digits = false;
    } else {
      return false;
    }
    previous = c;
  }
  if (!digits) return false;
  out = std::strtod(clean.c_str(), nullptr);
  return true;
}

// --- the filters ---------------------------------------------------------------------------------

Value filter_abs(Renderer& r, const Value& v, CallArgs& args) {
  bind_arguments("abs", args, {});
  if (v.is_int() || v.is_bool()) {
    if (v.as_int() == INT64_MIN) fail(FailureKind::limit, "integer overflow (kiln's integers are 64-bit)");
    return Value::integer(std::llabs(v.as_int()));
  }
  if (v.is_float()) return Value::floating(std::fabs(v.as_double()));
  type_error("bad operand type for abs(): '{}'", type_name(v));
}

Value filter_attr(Renderer& r, const Value& v, CallArgs& args) {
  auto a = bind_arguments("attr", args, {{"name", {}}});
  if (v.is_undefined()) fail_undefined(v);
  if (!a[0].is_string()) type_error("attribute name must be string, not '{}'", type_name(a[0]));
  const std::string& name = a[0].as_string();
  if (name.rfind("__", 0) == 0 || v.is_object()) return r.get_attribute(v, name);
  bool found = false;
  Value attribute = python_attribute(v, name, found);
  if (found) return attribute;
  return Value::undefined(fmt::format("'{} object' has no attribute '{}'", type_name(v), name));
}

Value filter_batch(Renderer& r, const Value& v, CallArgs& args) {
  auto a = bind_arguments("batch", args, {{"linecount", {}}, {"fill_with", Value::none()}});
  Value linecount = a[0], fill_with = a[1];
  auto items = lazy_items(v);
  auto current = std::make_shared<List>();
  auto finished = std::make_shared<bool>(false);
  return generator(
      [&r, items, linecount, fill_with, current, finished](Value& out) {
        if (*finished) return false;
        Value item;
        while (items(item)) {
          r.count_step();
          if (equals(Value::integer(int64_t(current->size())), linecount)) {
            out = Value::list(std::move(*current));
            *current = {std::move(item)};
            return true;
          }
          current->push_back(std::move(item));
        }
        *finished = true;
        if (current->empty()) return false;
        if (!fill_with.is_none()) {
          int64_t want = integer_argument("batch", linecount);
          if (want > int64_t(r.limits().max_container_items))
            fail(FailureKind::limit, "batch size exceeds kiln's limit");
          while (int64_t(current->size()) < want) current->push_back(fill_with);
        }
        out = Value::list(std::move(*current));
        return true;
      },
      v);
}

Value filter_default(Renderer& r, const Value& v, CallArgs& args) {
  auto a = bind_arguments("default", args, {{"default_value", Value::string("")}, {"boolean", Value::boolean(false)}});
  if (v.is_undefined() || (truthy(a[1]) && !truthy(v))) return a[0];
  return v;
}

Value filter_dictsort(Renderer& r, const Value& v, CallArgs& args) {
  auto a = bind_arguments(
      "dictsort", args,
      {{"case_sensitive", Value::boolean(false)}, {"by", Value::string("key")}, {"reverse", Value::boolean(false)}});
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_dict()) type_error("'{}' object has no attribute 'items'", type_name(v));
  size_t position;
  if (a[1].is_string() && a[1].as_string() == "key") {
    position = 0;
  } else if (a[1].is_string() && a[1].as_string() == "value") {
    position = 1;
  } else {
    fail(FailureKind::runtime, "You can only sort by either \"key\" or \"value\"");
  }
  List items, keys;
  for (const auto& [key, value] : v.as_dict().items()) {
    items.push_back(Value::tuple({key, value}));
    Value k = position == 0 ? key : value;
    if (!truthy(a[0]) && k.is_string()) k = Value::string(py::lower(k.as_string()));
    keys.push_back(std::move(k));
  }
  sort_by_keys(items, std::move(keys), truthy(a[2]));
  return Value::list(std::move(items));
}

Value filter_first(Renderer& r, const Value& v, CallArgs& args) {
  bind_arguments("first", args, {});
  if (auto* iterator = v.object_as<Iterator>()) {
    Value item;
    if (iterator->take_one(item)) return item;
  } else {
    List items = iterate(v);
    if (!items.empty()) return items.front();
  }
  return Value::undefined("No first item, sequence was empty.");
}

Value filter_float(Renderer& r, const Value& v, CallArgs& args) {
  auto a = bind_arguments("float", args, {{"default", Value::floating(0.0)}});
  if (v.is_undefined()) fail_undefined(v);  // Undefined.__float__ raises
  if (v.is_number()) return Value::floating(v.as_double());
  double parsed;
  if (v.is_string() && parse_python_float(v.as_string(), parsed)) return Value::floating(parsed);
  return a[0];
}

Value filter_int(Renderer& r, const Value& v, CallArgs& args) {
  auto a = bind_arguments("int", args, {{"default", Value::integer(0)}, {"base", Value::integer(10)}});
  if (v.is_undefined()) fail_undefined(v);  // Undefined.__int__ raises
  if (v.is_int() || v.is_bool()) return Value::integer(v.as_int());
  if (v.is_float()) {
    double f = v.as_double();
    if (std::isnan(f)) return a[0];
    if (std::isinf(f)) fail(FailureKind::runtime, "cannot convert float infinity to integer");
    if (std::fabs(f) >= 9.2e18) fail(FailureKind::limit, "integer overflow (kiln's integers are 64-bit)");
    return Value::integer(int64_t(f));
  }
  if (v.is_string()) {
    int64_t parsed;
    int base = a[1].is_int() ? int(std::clamp<int64_t>(a[1].as_int(), -1, 99)) : 10;
    if (parse_python_int(v.as_string(), base, parsed)) return Value::integer(parsed);
    // jinja2's quirk: "42.23"|int is 42, through float().
    double f;
    if (parse_python_float(v.as_string(), f) && std::isfinite(f) && std::fabs(f) < 9.2e18)
      return Value::integer(int64_t(f));
  }
  return a[0];
}

Value filter_items(Renderer& r, const Value& v, CallArgs& args) {
  bind_arguments("items", args, {});
  auto position = std::make_shared<size_t>(0);
  return generator(
      [v, position](Value& out) {
        if (v.is_undefined()) return false;
        if (!v.is_dict()) fail(FailureKind::runtime, "Can only get item pairs from a mapping.");
        const auto& items = v.as_dict().items();
        if (*position >= items.size()) return false;
        const auto& [key, value] = items[(*position)++];
        out = Value::tuple({key, value});
        return true;
      },
      v);
}

Value filter_join(Renderer& r, const Value& v, CallArgs& args) {
  auto a = bind_arguments("join", args, {{"d", Value::string("")}, {"attribute", Value::none()}});
  std::string separator = r.str(a[0]), out;
  List items = iterate(v);
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += separator;
    out += r.str(a[1].is_none() ? items[i] : attribute_path(r, items[i], a[1], nullptr, false));
    r.check_string(out.size());
  }
  return Value::string(std::move(out));
}

Value filter_last(Renderer& r, const Value& v, CallArgs& args) {
  bind_arguments("last", args, {});
  if ((v.is_object() && !v.object_as<DictView>()) || v.is_number() || v.is_none())
    type_error("'{}' object is not reversible", type_name(v));
  List items = iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value filter_length(Renderer& r, const Value& v, CallArgs& args) {
  bind_arguments("length", args, {});
  if (auto* loop = v.object_as<LoopState>()) return Value::integer(int64_t(loop->items.size()));
  return Value::integer(length(v));
}

Value filter_list(Renderer& r, const Value& v, CallArgs& args) {
  bind_arguments("list", args, {});
  return Value::list(iterate(v));
}

Value filter_map(Renderer& r, const Value& v, CallArgs& args) {
  // Like jinja2's generator, nothing (not even the argument checks) runs until it is consumed.
  struct State {
    bool started = false;
    Iterator::Next items;
    bool by_attribute = false;
    Value attribute, fallback = Value::none(), filter_name;
    CallArgs filter_args;
  };
  auto state = std::make_shared<State>();
  CallArgs call = args;
  return generator(
      [&r, v, call, state](Value& out) {
        State& s = *state;
        if (!s.started) {
          s.started = true;
          if (!truthy(v)) return false;
          bool has_attribute = std::any_of(call.keyword.begin(), call.keyword.end(),
                                           [](const auto& kw) { return kw.first == "attribute"; });
          if (call.positional.empty() && has_attribute) {
            s.by_attribute = true;
            for (const auto& [name, value] : call.keyword) {
              if (name == "attribute") {
                s.attribute = value;
              } else if (name == "default") {
                s.fallback = value;
              } else {
                fail(FailureKind::runtime, "Unexpected keyword argument '{}'", name);
              }
            }
          } else {
            if (call.positional.empty()) fail(FailureKind::runtime, "map requires a filter argument");
            s.filter_name = call.positional.front();
            s.filter_args.positional.assign(call.positional.begin() + 1, call.positional.end());
            s.filter_args.keyword = call.keyword;
            if (!s.filter_name.is_string())
              fail(FailureKind::runtime, "No filter named {} found.", to_repr(s.filter_name));
          }
          s.items = lazy_items(v);
        }
        Value item;
        if (!s.items(item)) return false;
        if (s.by_attribute) {
          out = attribute_path(r, item, s.attribute, &s.fallback, false);
        } else {
          CallArgs call_args = s.filter_args;
          out = r.apply_filter(s.filter_name.as_string(), item, call_args);
        }
        return true;
      },
      v);
}

// select / reject / selectattr / rejectattr (jinja2's select_or_reject).
Value select_or_reject(Renderer& r, const Value& v, CallArgs& args, bool keep_matches, bool by_attribute) {
  struct State {
    bool started = false;
    Iterator::Next items;
    Value attribute;
    std::optional<std::string> test;
    CallArgs test_args;
  };
  auto state = std::make_shared<State>();
  CallArgs call = args;
  return generator(
      [&r, v, call, state, keep_matches, by_attribute](Value& out) {
        State& s = *state;
        if (!s.started) {
          s.started = true;
          if (!truthy(v)) return false;
          size_t offset = 0;
          if (by_attribute) {
            if (call.positional.empty()) fail(FailureKind::runtime, "Missing parameter for attribute name");
            s.attribute = call.positional[0];
            offset = 1;
          }
          if (call.positional.size() > offset) {
            const Value& name = call.positional[offset];
            if (!name.is_string()) fail(FailureKind::runtime, "No test named {} found.", to_repr(name));
            s.test = name.as_string();
            s.test_args.positional.assign(call.positional.begin() + static_cast<std::ptrdiff_t>(offset) + 1,
                                          call.positional.end());
            s.test_args.keyword = call.keyword;
          }
          s.items = lazy_items(v);
        }
        Value item;
        while (s.items(item)) {
          r.count_step();
          Value subject = by_attribute ? attribute_path(r, item, s.attribute, nullptr, false) : item;
          bool passed;
          if (s.test) {
            CallArgs test_args = s.test_args;
            passed = r.apply_test(*s.test, subject, test_args);
          } else {
            passed = truthy(subject);
          }
          if (passed == keep_matches) {
            out = std::move(item);
            return true;
          }
        }
        return false;
      },
      v);
}

Value filter_select(Renderer& r, const Value& v, CallArgs& args) {
  return select_or_reject(r, v, args, true, false);
}
Value filter_reject(Renderer& r, const Value& v, CallArgs& args) {
  return select_or_reject(r, v, args, false, false);
}
Value filter_selectattr(Renderer& r, const Value& v, CallArgs& args) {
  return select_or_reject(r, v, args, true, true);
}
Value filter_rejectattr(Renderer& r, const Value& v, CallArgs& args) {
  return select_or_reject(r, v, args, false, true);
}

Value min_or_max(Renderer& r, const Value& v, CallArgs& args, bool maximum) {
  auto a = bind_arguments(maximum ? "max" : "min", args,
                          {{"case_sensitive", Value::boolean(false)}, {"attribute", Value::none()}});
  List items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  bool lowercase = !truthy(a[0]);
  size_t best = 0;
  Value best_key = attribute_path(r, items[0], a[1], nullptr, lowercase);
  for (size_t i = 1; i < items.size(); ++i) {
    Value key = attribute_path(r, items[i], a[1], nullptr, lowercase);
    if (maximum ? less_than(best_key, key) : less_than(key, best_key)) {
      best = i;
      best_key = std::move(key);
    }
  }
  return items[best];
}

Value filter_max(Renderer& r, const Value& v, CallArgs& args) {
  return min_or_max(r, v, args, true);
}
Value filter_min(Renderer& r, const Value& v, CallArgs& args) {
  return min_or_max(r, v, args, false);
}

Value filter_reverse(Renderer& r, const Value& v, CallArgs& args) {
  bind_arguments("reverse", args, {});
  if (v.is_string()) return slice(v, std::nullopt, std::nullopt, -1);
  if (v.is_sequence() || v.is_dict() || v.is_undefined()) {
    List items = iterate(v);
    std::reverse(items.begin(), items.end());
    std::string type = v.is_list() ? "list_reverseiterator" : v.is_dict() ? "dict_reversekeyiterator" : "reversed";
    return generator(std::move(items), type);
  }
  if (auto* view = v.object_as<DictView>()) {
    List items = view->items;
    std::reverse(items.begin(), items.end());
    return generator(std::move(items),
                     view->type_name() == "dict_items" ? "dict_reverseitemiterator" : "dict_reversekeyiterator");
  }
  if (v.object_as<Iterator>()) {
    List items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  fail(FailureKind::runtime, "argument must be iterable");
}

// Python's round(x, n) for floats: correctly rounded, ties to even on the exact binary value.
double round_to_digits(double x, int64_t digits) {
  if (!std::isfinite(x)) return x;
  if (digits >= 0) {
    char buffer[512];
    std::snprintf(buffer, sizeof buffer, "%.*f", int(std::min<int64_t>(digits, 340)), x);
    return std::strtod(buffer, nullptr);
  }
  double scale = std::pow(10.0, double(-digits));
  return std::nearbyint(x / scale) * scale;
}

Value filter_round(Renderer& r, const Value& v, CallArgs& args) {
  auto a = bind_arguments("round", args, {{"precision", Value::integer(0)}, {"method", Value::string("common")}});
  std::string method = a[1].is_string() ? a[1].as_string() : "";
  if (method != "common" && method != "ceil" && method != "floor")
    fail(FailureKind::runtime, "method must be common, ceil or floor");
  int64_t precision = integer_argument("round", a[0]);
  if (!v.is_number()) type_error("type {} doesn't define __round__ method", type_name(v));
  if (method == "common") {
    if (v.is_float()) return Value::floating(round_to_digits(v.as_double(), precision));
    if (precision >= 0) return Value::integer(v.as_int());
    // round(int, -n): to a multiple of 10**n, ties to even.
    if (precision < -18) return Value::integer(0);
    int64_t scale = 1;
    for (int64_t i = 0; i < -precision; ++i) scale *= 10;
    int64_t x = v.as_int(), q = x / scale, r = x % scale;
    if (r < 0) r += scale, q -= 1;
    if (2 * r > scale || (2 * r == scale && (q & 1))) q += 1;
    return Value::integer(q * scale);
  }
  double scale = std::pow(10.0, double(precision));
  double scaled = v.as_double() * scale;
  if (!std::isfinite(scaled)) fail(FailureKind::runtime, "cannot convert float infinity to integer");
  double rounded = method == "ceil" ? std::ceil(scaled) : std::floor(scaled);
  return Value::floating(rounded / scale);
}

Value filter_slice(Renderer& r, const Value& v, CallArgs& args) {
  auto a = bind_arguments("slice", args, {{"slices", {}}, {"fill_with", Value::none()}});
  Value slices_value = a[0], fill_with = a[1];
  struct State {
    bool started = false;
    List seq;
    int64_t slices = 0, per_slice = 0, with_extra = 0, offset = 0, n = 0;
  };
  auto state = std::make_shared<State>();
  return generator(
      [&r, v, slices_value, fill_with, state](Value& out) {
        State& s = *state;
        if (!s.started) {
          s.started = true;
          s.seq = iterate(v);
          s.slices = integer_argument("slice", slices_value);
          if (s.slices == 0) fail(FailureKind::runtime, "integer division or modulo by zero");
          int64_t length = int64_t(s.seq.size());
          // Python's floor division and modulo.
          s.per_slice = length / s.slices - ((length % s.slices != 0 && ((length < 0) != (s.slices < 0))) ? 1 : 0);
          s.with_extra = length - s.per_slice * s.slices;
        }
        if (s.n >= s.slices) return false;
        r.count_step();
        int64_t length = int64_t(s.seq.size());
        int64_t start = s.offset + s.n * s.per_slice;
        if (s.n < s.with_extra) s.offset += 1;
        int64_t end = s.offset + (s.n + 1) * s.per_slice;
        List part;
        for (int64_t i = std::max<int64_t>(start, 0); i < std::min(end, length); ++i) part.push_back(s.seq[size_t(i)]);
        if (!fill_with.is_none() && s.n >= s.with_extra) part.push_back(fill_with);
        ++s.n;
        out = Value::list(std::move(part));
        return true;
      },
      v);
}

Value filter_sort(Renderer& r, const Value& v, CallArgs& args) {
  auto a = bind_arguments(
      "sort", args,
      {{"reverse", Value::boolean(false)}, {"case_sensitive", Value::boolean(false)}, {"attribute", Value::none()}});
  List items = iterate(v);
  List keys;
  keys.reserve(items.size());
  for (const Value& item : items) keys.push_back(multi_attribute_key(r, item, a[2], !truthy(a[1])));
  sort_by_keys(items, std::move(keys), truthy(a[0]));
  return Value::list(std::move(items));
}

Value filter_sum(Renderer& r, const Value& v, CallArgs& args) {
  auto a = bind_arguments("sum", args, {{"attribute", Value::none()}, {"start", Value::integer(0)}});
  if (a[1].is_string()) type_error("sum() can't sum strings [use ''.join(seq) instead]");
  Value total = a[1];
  for (const Value& item : iterate(v)) {
    Value term = a[0].is_none() ? item : attribute_path(r, item, a[0], nullptr, false);
    total = binary_operation(ast::BinaryOp::add, total, term, r.limits());
  }
  return total;
}

Value filter_unique(Renderer& r, const Value& v, CallArgs& args) {
  auto a = bind_arguments("unique", args, {{"case_sensitive", Value::boolean(false)}, {"attribute", Value::none()}});
  bool lowercase = !truthy(a[0]);
  Value attribute = a[1];
  auto items = lazy_items(v);
  auto seen = std::make_shared<Dict>();  // a set: keys only
  return generator(
      [&r, items, seen, lowercase, attribute](Value& out) {
        Value item;
        while (items(item)) {
          r.count_step();
          Value key = attribute_path(r, item, attribute, nullptr, lowercase);
          if (!is_hashable(key)) type_error("unhashable type: '{}'", type_name(key));
          if (!seen->find(key)) {
            seen->set(std::move(key), Value::none());
            out = std::move(item);
            return true;
          }
        }
        return false;
      },
      v);
}

}  // namespace filters

namespace {

using namespace filters;

struct FilterEntry {
  std::string_view name;
  FilterFunction function;
};

constexpr FilterEntry kFilters[] = {
    {"abs", filter_abs},           {"attr", filter_attr},
    {"batch", filter_batch},       {"capitalize", filter_capitalize},
    {"center", filter_center},     {"count", filter_length},
    {"d", filter_default},         {"default", filter_default},
    {"dictsort", filter_dictsort}, {"e", filter_escape},
    {"escape", filter_escape},     {"first", filter_first},
    {"float", filter_float},       {"forceescape", filter_forceescape},
    {"format", filter_format},     {"indent", filter_indent},
    {"int", filter_int},           {"items", filter_items},
    {"join", filter_join},         {"last", filter_last},
    {"length", filter_length},     {"list", filter_list},
    {"lower", filter_lower},       {"map", filter_map},
    {"max", filter_max},           {"min", filter_min},
    {"reject", filter_reject},     {"rejectattr", filter_rejectattr},
    {"replace", filter_replace},   {"reverse", filter_reverse},
    {"round", filter_round},       {"safe", filter_safe},
    {"select", filter_select},     {"selectattr", filter_selectattr},
    {"slice", filter_slice},       {"sort", filter_sort},
    {"string", filter_string},     {"striptags", filter_striptags},
    {"sum", filter_sum},           {"title", filter_title},
    {"tojson", filter_tojson},     {"trim", filter_trim},
    {"truncate", filter_truncate}, {"unique", filter_unique},
    {"upper", filter_upper},       {"wordcount", filter_wordcount},
};

}  // namespace

FilterFunction find_filter(std::string_view name) {
  for (const FilterEntry& entry : kFilters)
    if (entry.name == name) return entry.function;
  return nullptr;
}

}  // namespace kiln::jinja
