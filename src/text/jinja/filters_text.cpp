// jinja2's text filters (filters.py), with transformers' tojson.
#include <algorithm>
#include <cstdlib>

#include "text/jinja/arguments.h"
#include "text/jinja/filters.h"
#include "text/jinja/json.h"
#include "text/jinja/operators.h"
#include "text/jinja/pystr.h"

namespace kiln::jinja::filters {

namespace {

// html.unescape for the entities templates meet.
std::string unescape_html(const std::string& s) {
  static const std::pair<std::string_view, std::string_view> kEntities[] = {
      {"amp", "&"},        {"lt", "<"},         {"gt", ">"},         {"quot", "\""},       {"apos", "'"},
      {"nbsp", "\u00a0"},  {"copy", "\u00a9"},  {"reg", "\u00ae"},   {"hellip", "\u2026"}, {"mdash", "\u2014"},
      {"ndash", "\u2013"}, {"lsquo", "\u2018"}, {"rsquo", "\u2019"}, {"ldquo", "\u201c"},  {"rdquo", "\u201d"}};
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out.push_back(s[i]);
      continue;
    }
    size_t semi = s.find(';', i);
    if (semi != std::string::npos && semi - i <= 12) {
      std::string name = s.substr(i + 1, semi - i - 1);
      if (name.size() > 1 && name[0] == '#') {
        bool hex = name[1] == 'x' || name[1] == 'X';
        char* end = nullptr;
        std::string digits = name.substr(hex ? 2 : 1);
        long code = std::strtol(digits.c_str(), &end, hex ? 16 : 10);
        if (!digits.empty() && end && *end == '\0' && code > 0 && code <= 0x10FFFF) {
          py::append_utf8(out, char32_t(code));
          i = semi;
          continue;
        }
      }
      bool matched = false;
      for (const auto& [entity, text] : kEntities) {
        if (name == entity) {
          out += text;
          i = semi;
          matched = true;
          break;
        }
      }
      if (matched) continue;
    }
    out.push_back('&');
  }
  return out;
}

}  // namespace

Value filter_capitalize(Renderer& r, const Value& v, CallArgs& args) {
  bind_arguments("capitalize", args, {});
  Value s = soft_str(r, v);
  return Value::string(py::capitalize(s.as_string()), s.is_markup());
}

Value filter_center(Renderer& r, const Value& v, CallArgs& args) {
  auto a = bind_arguments("center", args, {{"width", Value::integer(80)}});
  Value s = soft_str(r, v);
  int64_t width = integer_argument("center", a[0]);
  r.check_string(size_t(std::max<int64_t>(width, 0)));
  return Value::string(py::center(s.as_string(), width, U' '), s.is_markup());
}

Value filter_escape(Renderer& r, const Value& v, CallArgs& args) {
  bind_arguments("escape", args, {});
  if (v.is_markup()) return v;
  return Value::string(py::escape_html(r.str(v)), true);
}

Value filter_forceescape(Renderer& r, const Value& v, CallArgs& args) {
  bind_arguments("forceescape", args, {});
  return Value::string(py::escape_html(r.str(v)), true);
}

Value filter_format(Renderer& r, const Value& v, CallArgs& args) {
  if (!args.positional.empty() && !args.keyword.empty())
    fail(FailureKind::runtime, "can't handle positional and keyword arguments at the same time");
  Value format_args;
  if (!args.keyword.empty()) {
    Dict kwargs;
    for (const auto& [name, value] : args.keyword) kwargs.set(Value::string(name), value);
    format_args = Value::dict(std::move(kwargs));
  } else {
    format_args = Value::tuple(args.positional);
  }
  Value s = soft_str(r, v);
  return Value::string(percent_format(s.as_string(), format_args, r.limits().max_output_bytes), s.is_markup());
}

Value filter_indent(Renderer& r, const Value& v, CallArgs& args) {
  auto a = bind_arguments(
      "indent", args,
      {{"width", Value::integer(4)}, {"first", Value::boolean(false)}, {"blank", Value::boolean(false)}});
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_string()) type_error("unsupported operand type(s) for +=: '{}' and 'str'", type_name(v));
  std::string indention;
  if (a[0].is_string()) {
    indention = a[0].as_string();
  } else {
    int64_t width = integer_argument("indent", a[0]);
    r.check_string(size_t(std::max<int64_t>(width, 0)));
    indention = std::string(size_t(std::max<int64_t>(width, 0)), ' ');
  }
  std::vector<std::string> lines = py::splitlines(v.as_string() + "\n", false);
  std::string out;
  if (truthy(a[2])) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) out += "\n" + indention;
      out += lines[i];
      r.check_string(out.size());
    }
  } else {
    out = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      out += "\n";
      if (!lines[i].empty()) out += indention;
      out += lines[i];
      r.check_string(out.size());
    }
  }
  if (truthy(a[1])) out = indention + out;
  r.check_string(out.size());
  return Value::string(std::move(out), v.is_markup());
}

Value filter_lower(Renderer& r, const Value& v, CallArgs& args) {
  bind_arguments("lower", args, {});
  Value s = soft_str(r, v);
  return Value::string(py::lower(s.as_string()), s.is_markup());
}

Value filter_upper(Renderer& r, const Value& v, CallArgs& args) {
  bind_arguments("upper", args, {});
  Value s = soft_str(r, v);
  return Value::string(py::upper(s.as_string()), s.is_markup());
}

Value filter_replace(Renderer& r, const Value& v, CallArgs& args) {
  auto a = bind_arguments("replace", args, {{"old", {}}, {"new", {}}, {"count", Value::none()}});
  int64_t count = a[2].is_none() ? -1 : integer_argument("replace", a[2]);
  std::string out = py::replace(r.str(v), r.str(a[0]), r.str(a[1]), count, r.limits().max_output_bytes);
  r.check_string(out.size());
  return Value::string(std::move(out));
}

Value filter_safe(Renderer& r, const Value& v, CallArgs& args) {
  bind_arguments("safe", args, {});
  return Value::string(r.str(v), true);
}

Value filter_string(Renderer& r, const Value& v, CallArgs& args) {
  bind_arguments("string", args, {});
  return soft_str(r, v);
}

Value filter_striptags(Renderer& r, const Value& v, CallArgs& args) {
  bind_arguments("striptags", args, {});
  std::string value = r.str(v);
  // markupsafe's algorithm rebuilds the text once per tag: charge that work up front.
  r.charge_units(uint64_t(std::count(value.begin(), value.end(), '<')) * (value.size() / 64 + 1));
  for (size_t start; (start = value.find("<!--")) != std::string::npos;) {
    size_t end = value.find("-->", start);
    if (end == std::string::npos) break;
    value = value.substr(0, start) + value.substr(end + 3);
  }
  for (size_t start; (start = value.find('<')) != std::string::npos;) {
    size_t end = value.find('>', start);
    if (end == std::string::npos) break;
    value = value.substr(0, start) + value.substr(end + 1);
  }
  std::string collapsed;
  for (const std::string& word : py::split(value, std::nullopt, -1)) collapsed += (collapsed.empty() ? "" : " ") + word;
  return Value::string(unescape_html(collapsed));  // Markup.unescape() gives a plain str
}

Value filter_title(Renderer& r, const Value& v, CallArgs& args) {
  bind_arguments("title", args, {});
  Value s = soft_str(r, v);
  // jinja2 capitalises each piece between runs of "-", whitespace, "(", "{", "[" and "<".
  std::u32string text = py::decode_utf8(s.as_string());
  auto separator = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py::is_space(c);
  };
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i;
    bool sep = separator(text[i]);
    while (j < text.size() && separator(text[j]) == sep) ++j;
    std::u32string_view piece = std::u32string_view(text).substr(i, j - i);
    out += py::upper(py::encode_utf8(piece.substr(0, 1))) + py::lower(py::encode_utf8(piece.substr(1)));
    i = j;
  }
  return Value::string(std::move(out), s.is_markup());
}

Value filter_tojson(Renderer& r, const Value& v, CallArgs& args) {
  auto a = bind_arguments("tojson", args,
                          {{"ensure_ascii", Value::boolean(false)},
                           {"indent", Value::none()},
                           {"separators", Value::none()},
                           {"sort_keys", Value::boolean(false)}});
  JsonDumpOptions options;
  options.ensure_ascii = truthy(a[0]);
  if (a[1].is_int() || a[1].is_bool()) {
    options.indent = std::string(size_t(std::clamp<int64_t>(a[1].as_int(), 0, 1 << 16)), ' ');
  } else if (a[1].is_string()) {
    options.indent = a[1].as_string();
  } else if (!a[1].is_none()) {
    type_error("indent must be an int or a str, not {}", type_name(a[1]));
  }
  if (!a[2].is_none()) {
    List parts = iterate(a[2]);
    if (parts.size() != 2) fail(FailureKind::runtime, "separators must be a pair of strings");
    if (!parts[0].is_string() || !parts[1].is_string()) type_error("separators must be strings");
    options.item_separator = parts[0].as_string();
    options.key_separator = parts[1].as_string();
  }
  options.sort_keys = truthy(a[3]);
  options.max_bytes = r.limits().max_output_bytes;
  std::string out = dump_json(v, options);
  r.check_string(out.size());
  return Value::string(std::move(out));
}

Value filter_trim(Renderer& r, const Value& v, CallArgs& args) {
  auto a = bind_arguments("trim", args, {{"chars", Value::none()}});
  Value s = soft_str(r, v);
  return Value::string(py::strip(s.as_string(), optional_string_argument("trim", a[0])), s.is_markup());
}

Value filter_truncate(Renderer& r, const Value& v, CallArgs& args) {
  auto a = bind_arguments("truncate", args,
                          {{"length", Value::integer(255)},
                           {"killwords", Value::boolean(false)},
                           {"end", Value::string("...")},
                           {"leeway", Value::none()}});
  int64_t size = length(v);
  int64_t max_length = integer_argument("truncate", a[0]);
  int64_t leeway = a[3].is_none() ? 5 : integer_argument("truncate", a[3]);
  int64_t end_length = length(a[2]);
  if (max_length < end_length) fail(FailureKind::runtime, "expected length >= {}, got {}", end_length, max_length);
  if (leeway < 0) fail(FailureKind::runtime, "expected leeway >= 0, got {}", leeway);
  if (size - leeway <= max_length) return v;  // len(s) <= length + leeway, without overflow
  Value head = slice(v, std::nullopt, max_length - end_length, std::nullopt);
  // Python slices a list or tuple too, then fails to join it with the end string
  if (!head.is_string() && truthy(a[1]))
    fail(FailureKind::runtime, "can only concatenate {} (not \"str\") to {}", type_name(head), type_name(head));
  if (!head.is_string()) fail(FailureKind::runtime, "'{}' object has no attribute 'rsplit'", type_name(head));
  std::string end = r.str(a[2]);
  if (truthy(a[1])) return Value::string(head.as_string() + end);
  return Value::string(py::rsplit(head.as_string(), std::string(" "), 1).front() + end);
}

Value filter_wordcount(Renderer& r, const Value& v, CallArgs& args) {
  bind_arguments("wordcount", args, {});
  int64_t words = 0;
  bool in_word = false;
  for (char32_t c : py::decode_utf8(r.str(v))) {
    bool word = py::is_word_char(c);
    if (word && !in_word) ++words;
    in_word = word;
  }
  return Value::integer(words);
}

}  // namespace kiln::jinja::filters
