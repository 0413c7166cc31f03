// Python's json.load and json.dumps over template values. See json.h.
#include "text/jinja/json.h"

#include <algorithm>
#include <cmath>

#include "text/jinja/pystr.h"

namespace kiln::jinja {

namespace {

// `depth`: how deep a container here would nest (1 at the top). Deeper than templates' values may
// nest fails before recursing further, so a hostile document cannot exhaust the stack.
Value from_json(const nlohmann::ordered_json& json, int depth) {
  using Type = nlohmann::ordered_json::value_t;
  switch (json.type()) {
    case Type::null:
      return Value::none();
    case Type::boolean:
      return Value::boolean(json.get<bool>());
    case Type::number_integer:
      return Value::integer(json.get<int64_t>());
    case Type::number_unsigned: {
      uint64_t u = json.get<uint64_t>();
      // Python keeps big integers exact; kiln's are 64-bit, so larger ones become floats.
      return u <= uint64_t(INT64_MAX) ? Value::integer(int64_t(u)) : Value::floating(double(u));
    }
    case Type::number_float:
      return Value::floating(json.get<double>());
    case Type::string:
      return Value::string(json.get<std::string>());
    case Type::array: {
      Value::check_depth(depth);
      List items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(from_json(item, depth + 1));
      return Value::list(std::move(items));
    }
    case Type::object: {
      Value::check_depth(depth);
      Dict dict;
      for (const auto& [key, item] : json.items()) dict.set(Value::string(key), from_json(item, depth + 1));
      return Value::dict(std::move(dict));
    }
    default:
      return Value::none();
  }
}

}  // namespace

Value from_json(const nlohmann::ordered_json& json) {
  return from_json(json, 1);
}

bool nested_deeper_than(const nlohmann::ordered_json& json, int max_depth) {
  // depth-first with a stack of its own: the document may be far deeper than the call stack allows
  std::vector<std::pair<const nlohmann::ordered_json*, int>> stack = {{&json, 1}};
  while (!stack.empty()) {
    const auto [value, depth] = stack.back();
    stack.pop_back();
    if (!value->is_structured()) continue;
    if (depth > max_depth) return true;
    for (const auto& item : *value) stack.emplace_back(&item, depth + 1);
  }
  return false;
}

namespace {

void append_json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out.push_back('"');
  auto escape_code_unit = [&](uint32_t unit) { out += fmt::format("\\u{:04x}", unit); };
  for (char32_t c : py::decode_utf8(s)) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
          if (c >= 0x10000) {
            uint32_t v = uint32_t(c) - 0x10000;
            escape_code_unit(0xD800 | (v >> 10));
            escape_code_unit(0xDC00 | (v & 0x3FF));
          } else {
            escape_code_unit(uint32_t(c));
          }
        } else {
          py::append_utf8(out, c);
        }
    }
  }
  out.push_back('"');
}

std::string float_json(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  return py::float_repr(x);
}

class JsonWriter {
 public:
  explicit JsonWriter(const JsonDumpOptions& options) : options_(options) {
    item_separator_ = options.item_separator.value_or(options.indent ? "," : ", ");
    key_separator_ = options.key_separator.value_or(": ");
  }

  void write(const Value& v, int level) {
    if (out_.size() > options_.max_bytes)
      fail(FailureKind::limit, "JSON text exceeds kiln's output limit of {} bytes", options_.max_bytes);
    switch (v.kind()) {
      case Value::Kind::none:
        out_ += "null";
        return;
      case Value::Kind::boolean:
        out_ += v.as_bool() ? "true" : "false";
        return;
      case Value::Kind::integer:
        out_ += std::to_string(v.as_int());
        return;
      case Value::Kind::floating:
        out_ += float_json(v.as_double());
        return;
      case Value::Kind::string:
        append_json_string(out_, v.as_string(), options_.ensure_ascii);
        return;
      case Value::Kind::list:
      case Value::Kind::tuple:
        write_array(v.as_list(), level);
        return;
      case Value::Kind::dict:
        write_object(v.as_dict(), level);
        return;
      default:
        type_error("Object of type {} is not JSON serializable", type_name(v));
    }
  }

  std::string take() { return std::move(out_); }

 private:
  void newline(int level) {
    out_.push_back('\n');
    for (int i = 0; i < level; ++i) out_ += *options_.indent;
  }

  void write_array(const List& items, int level) {
    if (items.empty()) {
      out_ += "[]";
      return;
    }
    out_.push_back('[');
    if (options_.indent) newline(level + 1);
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) {
        out_ += item_separator_;
        if (options_.indent) newline(level + 1);
      }
      write(items[i], level + 1);
    }
    if (options_.indent) newline(level);
    out_.push_back(']');
  }

  std::string key_text(const Value& key) {
    switch (key.kind()) {
      case Value::Kind::string:
        return key.as_string();
      case Value::Kind::none:
        return "null";
      case Value::Kind::boolean:
        return key.as_bool() ? "true" : "false";
      case Value::Kind::integer:
        return std::to_string(key.as_int());
      case Value::Kind::floating:
        return float_json(key.as_double());
      default:
        type_error("keys must be str, int, float, bool or None, not {}", type_name(key));
    }
  }

  void write_object(const Dict& dict, int level) {
    if (dict.empty()) {
      out_ += "{}";
      return;
    }
    std::vector<const Dict::Item*> items;
    for (const auto& item : dict.items()) items.push_back(&item);
    if (options_.sort_keys)
      std::stable_sort(items.begin(), items.end(),
                       [](const Dict::Item* a, const Dict::Item* b) { return less_than(a->first, b->first); });
    out_.push_back('{');
    if (options_.indent) newline(level + 1);
    bool first = true;
    for (const Dict::Item* item : items) {
      if (!first) {
        out_ += item_separator_;
        if (options_.indent) newline(level + 1);
      }
      first = false;
      append_json_string(out_, key_text(item->first), options_.ensure_ascii);
      out_ += key_separator_;
      write(item->second, level + 1);
    }
    if (options_.indent) newline(level);
    out_.push_back('}');
  }

  const JsonDumpOptions& options_;
  std::string item_separator_, key_separator_;
  std::string out_;
};

}  // namespace

std::string dump_json(const Value& value, const JsonDumpOptions& options) {
  JsonWriter writer(options);
  writer.write(value, 0);
  return writer.take();
}

}  // namespace kiln::jinja
