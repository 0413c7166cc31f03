// Python methods of str, dict, list and tuple values, as the immutable sandbox exposes them:
// mutating methods (list.append, dict.update, ...) resolve to an undefined value that raises a
// SecurityError when called.
#include <algorithm>
#include <iterator>

#include "text/jinja/arguments.h"
#include "text/jinja/builtins.h"
#include "text/jinja/operators.h"
#include "text/jinja/pystr.h"
#include "text/jinja/renderer.h"

namespace kiln::jinja {

namespace {

std::optional<int64_t> optional_index(std::string_view method, const Value& v) {
  if (v.is_none()) return std::nullopt;
  return integer_argument(method, v);
}

std::string string_argument(std::string_view method, const Value& v) {
  if (v.is_string()) return v.as_string();
  type_error("{}() argument must be str, not {}", method, type_name(v));
}

char32_t fill_argument(const Value& v) {
  if (!v.is_string()) type_error("The fill character must be a unicode character, not {}", type_name(v));
  std::u32string fill = py::decode_utf8(v.as_string());
  if (fill.size() != 1) type_error("The fill character must be exactly one character long");
  return fill[0];
}

Value str_list(std::vector<std::string> parts, bool markup) {
  List items;
  items.reserve(parts.size());
  for (auto& p : parts) items.push_back(Value::string(std::move(p), markup));
  return Value::list(std::move(items));
}

bool all_code_points(const std::string& s, bool (*predicate)(char32_t)) {
  std::u32string text = py::decode_utf8(s);
  return !text.empty() && std::all_of(text.begin(), text.end(), predicate);
}

Value call_str_method(Renderer& renderer, const Value& self, std::string_view m, CallArgs& args) {
  const std::string& s = self.as_string();
  const bool markup = self.is_markup();
  auto no_args = [&] { bind_arguments(m, args, {}); };
  auto keep = [&](std::string text) { return Value::string(std::move(text), markup); };

  if (m == "upper") return no_args(), keep(py::upper(s));
  if (m == "lower") return no_args(), keep(py::lower(s));
  if (m == "casefold") return no_args(), Value::string(py::casefold(s));
  if (m == "swapcase") return no_args(), keep(py::swapcase(s));
  if (m == "title") return no_args(), keep(py::title(s));
  if (m == "capitalize") return no_args(), keep(py::capitalize(s));
  if (m == "strip" || m == "lstrip" || m == "rstrip") {
    auto a = bind_arguments(m, args, {{"chars", Value::none()}});
    auto side = m == "strip" ? py::StripSide::both : m == "lstrip" ? py::StripSide::left : py::StripSide::right;
    return keep(py::strip(s, optional_string_argument(m, a[0]), side));
  }
  if (m == "split" || m == "rsplit") {
    auto a = bind_arguments(m, args, {{"sep", Value::none()}, {"maxsplit", Value::integer(-1)}});
    auto sep = optional_string_argument(m, a[0]);
    if (sep && sep->empty()) fail(FailureKind::runtime, "empty separator");
    int64_t maxsplit = integer_argument(m, a[1]);
    return str_list(m == "split" ? py::split(s, sep, maxsplit) : py::rsplit(s, sep, maxsplit), markup);
  }
  if (m == "splitlines") {
    auto a = bind_arguments(m, args, {{"keepends", Value::boolean(false)}});
    return str_list(py::splitlines(s, truthy(a[0])), markup);
  }
  if (m == "replace") {
    auto a = bind_arguments(m, args, {{"old", {}}, {"new", {}}, {"count", Value::integer(-1)}});
    std::string old_text = string_argument(m, a[0]), new_text = string_argument(m, a[1]);
    if (markup) {
      if (!a[0].is_markup()) old_text = py::escape_html(old_text);
      if (!a[1].is_markup()) new_text = py::escape_html(new_text);
    }
    std::string out = py::replace(s, old_text, new_text, integer_argument(m, a[2]), renderer.limits().max_output_bytes);
    renderer.check_string(out.size());
    return keep(std::move(out));
  }
  if (m == "startswith" || m == "endswith") {
    auto a = bind_arguments(m, args, {{"prefix", {}}, {"start", Value::none()}, {"end", Value::none()}});
    auto start = optional_index(m, a[1]), end = optional_index(m, a[2]);
    bool at_end = m == "endswith";
    if (a[0].is_tuple()) {
      for (const Value& affix : a[0].as_list()) {
        if (!affix.is_string()) type_error("tuple for {} must only contain str, not {}", m, type_name(affix));
        if (py::starts_with(s, affix.as_string(), start, end, at_end)) return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    if (!a[0].is_string()) type_error("{} first arg must be str or a tuple of str, not {}", m, type_name(a[0]));
    return Value::boolean(py::starts_with(s, a[0].as_string(), start, end, at_end));
  }
  if (m == "find" || m == "rfind" || m == "index" || m == "rindex") {
    auto a = bind_arguments(m, args, {{"sub", {}}, {"start", Value::none()}, {"end", Value::none()}});
    int64_t at = py::find(s, string_argument(m, a[0]), optional_index(m, a[1]), optional_index(m, a[2]),
                          m == "rfind" || m == "rindex");
    if (at < 0 && (m == "index" || m == "rindex")) fail(FailureKind::runtime, "substring not found");
    return Value::integer(at);
  }
  if (m == "count") {
    auto a = bind_arguments(m, args, {{"sub", {}}, {"start", Value::none()}, {"end", Value::none()}});
    return Value::integer(py::count(s, string_argument(m, a[0]), optional_index(m, a[1]), optional_index(m, a[2])));
  }
  if (m == "join") {
    auto a = bind_arguments(m, args, {{"iterable", {}}});
    List items = iterate(a[0]);
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string())
        type_error("sequence item {}: expected str instance, {} found", i, type_name(items[i]));
      if (i) out += s;
      out += markup && !items[i].is_markup() ? py::escape_html(items[i].as_string()) : items[i].as_string();
      renderer.check_string(out.size());
    }
    return keep(std::move(out));
  }
  if (m == "center" || m == "ljust" || m == "rjust") {
    auto a = bind_arguments(m, args, {{"width", {}}, {"fillchar", Value::string(" ")}});
    int64_t width = integer_argument(m, a[0]);
    renderer.check_string(size_t(std::max<int64_t>(width, 0)));
    char32_t fill = fill_argument(a[1]);
    if (m == "center") return keep(py::center(s, width, fill));
    return keep(py::pad(s, width, fill, m == "ljust" ? '<' : '>'));
  }
  if (m == "zfill") {
    auto a = bind_arguments(m, args, {{"width", {}}});
    int64_t width = integer_argument(m, a[0]);
    renderer.check_string(size_t(std::max<int64_t>(width, 0)));
    return keep(py::zfill(s, width));
  }
  if (m == "partition" || m == "rpartition") {
    auto a = bind_arguments(m, args, {{"sep", {}}});
    std::string sep = string_argument(m, a[0]);
    if (sep.empty()) fail(FailureKind::runtime, "empty separator");
    size_t at = m == "partition" ? s.find(sep) : s.rfind(sep);
    if (at == std::string::npos) {
      return m == "partition" ? Value::tuple({keep(s), keep(""), keep("")})
                              : Value::tuple({keep(""), keep(""), keep(s)});
    }
    return Value::tuple({keep(s.substr(0, at)), keep(sep), keep(s.substr(at + sep.size()))});
  }
  if (m == "removeprefix" || m == "removesuffix") {
    auto a = bind_arguments(m, args, {{"affix", {}}});
    std::string affix = string_argument(m, a[0]);
    if (m == "removeprefix") return keep(s.compare(0, affix.size(), affix) == 0 ? s.substr(affix.size()) : s);
    bool ends = s.size() >= affix.size() && s.compare(s.size() - affix.size(), affix.size(), affix) == 0;
    return keep(ends ? s.substr(0, s.size() - affix.size()) : s);
  }
  if (m == "expandtabs") {
    auto a = bind_arguments(m, args, {{"tabsize", Value::integer(8)}});
    int64_t tabsize = integer_argument(m, a[0]);
    std::u32string out;
    int64_t column = 0;
    for (char32_t c : py::decode_utf8(s)) {
      if (c == '\t') {
        if (tabsize > 0) {
          int64_t spaces = tabsize - column % tabsize;
          renderer.check_string(out.size() + size_t(spaces));
          out.append(size_t(spaces), U' ');
          column += spaces;
        }
      } else {
        out.push_back(c);
        column = (c == '\n' || c == '\r') ? 0 : column + 1;
      }
      renderer.check_string(out.size());
    }
    return keep(py::encode_utf8(out));
  }
  if (m == "format") return Value::string(brace_format(renderer, s, args), markup);
  // Predicates.
  no_args();
  if (m == "isalpha") return Value::boolean(all_code_points(s, py::is_alpha));
  if (m == "isalnum")
    return Value::boolean(all_code_points(s, [](char32_t c) { return py::is_alpha(c) || py::is_numeric(c); }));
  if (m == "isdecimal") return Value::boolean(all_code_points(s, py::is_decimal));
  if (m == "isdigit") return Value::boolean(all_code_points(s, py::is_digit));
  if (m == "isnumeric") return Value::boolean(all_code_points(s, py::is_numeric));
  if (m == "isspace") return Value::boolean(all_code_points(s, py::is_space));
  if (m == "isascii")
    return Value::boolean(std::all_of(s.begin(), s.end(), [](char c) { return (unsigned char)c < 0x80; }));
  if (m == "isprintable") {
    std::u32string text = py::decode_utf8(s);
    return Value::boolean(
        std::all_of(text.begin(), text.end(), [](char32_t c) { return c == ' ' || py::is_printable(c); }));
  }
  if (m == "islower") return Value::boolean(py::is_lower(s));
  if (m == "isupper") return Value::boolean(py::is_upper(s));
  if (m == "istitle") return Value::boolean(py::is_title(s));
  if (m == "isidentifier") {
    std::u32string text = py::decode_utf8(s);
    bool ok = !text.empty() && (text[0] == '_' || py::is_alpha(text[0]));
    for (size_t i = 1; ok && i < text.size(); ++i)
      ok = text[i] == '_' || py::is_alpha(text[i]) || py::is_decimal(text[i]);
    return Value::boolean(ok);
  }
  type_error("'str' object has no method '{}'", m);
}

constexpr std::string_view kStrMethods[] = {
    "capitalize", "casefold",    "center",       "count",        "endswith",   "expandtabs", "find",         "format",
    "index",      "isalnum",     "isalpha",      "isascii",      "isdecimal",  "isdigit",    "isidentifier", "islower",
    "isnumeric",  "isprintable", "isspace",      "istitle",      "isupper",    "join",       "ljust",        "lower",
    "lstrip",     "partition",   "removeprefix", "removesuffix", "replace",    "rfind",      "rindex",       "rjust",
    "rpartition", "rsplit",      "rstrip",       "split",        "splitlines", "startswith", "strip",        "swapcase",
    "title",      "upper",       "zfill"};

bool is_str_method(std::string_view name) {
  return std::find(std::begin(kStrMethods), std::end(kStrMethods), name) != std::end(kStrMethods);
}

Value call_dict_method(const Value& self, std::string_view m, CallArgs& args) {
  const Dict& dict = self.as_dict();
  if (m == "get") {
    auto a = bind_arguments(m, args, {{"key", {}}, {"default", Value::none()}});
    if (!is_hashable(a[0])) type_error("unhashable type: '{}'", type_name(a[0]));
    const Value* v = dict.find(a[0]);
    return v ? *v : a[1];
  }
  bind_arguments(m, args, {});
  if (m == "copy") return self;
  List out;
  for (const auto& [key, value] : dict.items()) {
    if (m == "keys") {
      out.push_back(key);
    } else if (m == "values") {
      out.push_back(value);
    } else {
      out.push_back(Value::tuple({key, value}));
    }
  }
  return Value::object(std::make_shared<DictView>(std::move(out), fmt::format("dict_{}", m)));
}

Value call_sequence_method(const Value& self, std::string_view m, CallArgs& args) {
  const List& items = self.as_list();
  if (m == "copy") return bind_arguments(m, args, {}), self;
  if (m == "count") {
    auto a = bind_arguments(m, args, {{"value", {}}});
    return Value::integer(std::count_if(items.begin(), items.end(), [&](const Value& v) { return equals(v, a[0]); }));
  }
  auto a = bind_arguments(m, args, {{"value", {}}, {"start", Value::integer(0)}, {"stop", Value::integer(INT64_MAX)}});
  int64_t lo, hi;
  py::adjust_range(integer_argument(m, a[1]), integer_argument(m, a[2]), int64_t(items.size()), lo, hi);
  for (int64_t i = lo; i < hi; ++i)
    if (equals(items[size_t(i)], a[0])) return Value::integer(i);
  fail(FailureKind::runtime, "{} is not in {}", to_repr(a[0]), type_name(self));
}

bool is_one_of(std::string_view name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

Value python_attribute(const Value& object, std::string_view name, bool& found) {
  found = false;
  auto bound = [&](auto method) {
    found = true;
    std::string method_name(name);
    return Value::object(std::make_shared<Builtin>(
        method_name,
        [object, method_name, method](Renderer& renderer, CallArgs& args) {
          return method(renderer, object, method_name, args);
        },
        fmt::format("<built-in method {} of {} object>", method_name, type_name(object)), object.weight()));
  };
  auto unsafe = [&] {
    found = true;
    return Value::undefined(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, type_name(object)),
                            FailureKind::security);
  };
  switch (object.kind()) {
    case Value::Kind::string:
      if (is_str_method(name))
        return bound([](Renderer& r, const Value& self, const std::string& m, CallArgs& a) {
          return call_str_method(r, self, m, a);
        });
      break;
    case Value::Kind::dict:
      if (is_one_of(name, {"items", "keys", "values", "get", "copy"}))
        return bound([](Renderer&, const Value& self, const std::string& m, CallArgs& a) {
          return call_dict_method(self, m, a);
        });
      if (is_one_of(name, {"clear", "pop", "popitem", "setdefault", "update"})) return unsafe();
      break;
    case Value::Kind::list:
      if (is_one_of(name, {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"})) return unsafe();
      [[fallthrough]];
    case Value::Kind::tuple:
      if (is_one_of(name, {"count", "index"}) || (object.is_list() && name == "copy"))
        return bound([](Renderer&, const Value& self, const std::string& m, CallArgs& a) {
          return call_sequence_method(self, m, a);
        });
      break;
    default:
      break;
  }
  return Value();
}

}  // namespace kiln::jinja
