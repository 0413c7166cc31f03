// Python semantics of template values. See value.h.
#include "text/jinja/value.h"

#include <cmath>

#include "text/jinja/pystr.h"

namespace kiln::jinja {

// --- Dict ----------------------------------------------------------------------------------------

const Value* Dict::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.as_string()));
  for (const auto& [k, v] : items_)
    if (equals(k, key)) return &v;
  return nullptr;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items_)
    if (k.is_string() && k.as_string() == key) return &v;
  return nullptr;
}

void Dict::set(Value key, Value value) {
  for (auto& [k, v] : items_) {
    if (equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items_.emplace_back(std::move(key), std::move(value));
}

// --- Value constructors --------------------------------------------------------------------------

Value Value::undefined(std::string message, FailureKind kind) {
  Value v;
  v.ptr_ = std::make_shared<UndefinedInfo>(UndefinedInfo{std::move(message), kind});
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::none;
  return v;
}

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::boolean;
  v.scalar_.b = b;
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::integer;
  v.scalar_.i = i;
  return v;
}

Value Value::floating(double f) {
  Value v;
  v.kind_ = Kind::floating;
  v.scalar_.f = f;
  return v;
}

Value Value::string(std::string s, bool markup) {
  Value v;
  v.kind_ = Kind::string;
  v.markup_ = markup;
  v.ptr_ = std::make_shared<std::string>(std::move(s));
  return v;
}

Value Value::list(List items) {
  Value v;
  v.kind_ = Kind::list;
  v.ptr_ = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::tuple(List items) {
  Value v;
  v.kind_ = Kind::tuple;
  v.ptr_ = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::dict(Dict dict) {
  Value v;
  v.kind_ = Kind::dict;
  v.ptr_ = std::make_shared<Dict>(std::move(dict));
  return v;
}

Value Value::object(std::shared_ptr<Object> object) {
  Value v;
  v.kind_ = Kind::object;
  v.ptr_ = std::move(object);
  return v;
}

double Value::as_double() const {
  switch (kind_) {
    case Kind::boolean:
      return scalar_.b ? 1.0 : 0.0;
    case Kind::integer:
      return double(scalar_.i);
    case Kind::floating:
      return scalar_.f;
    default:
      return 0.0;
  }
}

// --- objects -------------------------------------------------------------------------------------

std::string Object::repr() const {
  return fmt::format("<{} object>", type_name());
}

Value Object::call(Renderer&, CallArgs&) {
  type_error("'{}' object is not callable", type_name());
}

Value Object::get_attribute(std::string_view name) {
  return Value::undefined(fmt::format("'{} object' has no attribute '{}'", type_name(), name));
}

std::string Namespace::repr() const {
  return "<Namespace " + to_repr(Value::dict(attributes)) + ">";
}

Value Namespace::get_attribute(std::string_view name) {
  if (const Value* v = attributes.find(name)) return *v;
  return Value::undefined(fmt::format("'jinja2.utils.Namespace object' has no attribute '{}'", name));
}

std::string Iterator::repr() const {
  return fmt::format("<{} object>", type_name_);
}

List Iterator::take_all() {
  List rest(items_.begin() + static_cast<std::ptrdiff_t>(next_), items_.end());
  next_ = items_.size();
  return rest;
}

bool Iterator::take_one(Value& out) {
  if (next_ >= items_.size()) return false;
  out = items_[next_++];
  return true;
}

// --- Python semantics ----------------------------------------------------------------------------

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined:
      return "Undefined";
    case Value::Kind::none:
      return "NoneType";
    case Value::Kind::boolean:
      return "bool";
    case Value::Kind::integer:
      return "int";
    case Value::Kind::floating:
      return "float";
    case Value::Kind::string:
      return v.is_markup() ? "Markup" : "str";
    case Value::Kind::list:
      return "list";
    case Value::Kind::tuple:
      return "tuple";
    case Value::Kind::dict:
      return "dict";
    case Value::Kind::object:
      return v.as_object()->type_name();
  }
  return "object";
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined:
    case Value::Kind::none:
      return false;
    case Value::Kind::boolean:
      return v.as_bool();
    case Value::Kind::integer:
      return v.as_int() != 0;
    case Value::Kind::floating:
      return v.as_double() != 0.0;
    case Value::Kind::string:
      return !v.as_string().empty();
    case Value::Kind::list:
    case Value::Kind::tuple:
      return !v.as_list().empty();
    case Value::Kind::dict:
      return !v.as_dict().empty();
    case Value::Kind::object:
      return true;
  }
  return true;
}

namespace {

// Python compares ints and floats exactly; long double holds every int64 exactly on x86-64.
int compare_numbers(const Value& a, const Value& b) {
  if (!a.is_float() && !b.is_float()) {
    int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  long double x = a.is_float() ? (long double)a.as_double() : (long double)a.as_int();
  long double y = b.is_float() ? (long double)b.as_double() : (long double)b.as_int();
  if (std::isnan(x) || std::isnan(y)) return 2;  // unordered
  return x < y ? -1 : x > y ? 1 : 0;
}

}  // namespace

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return compare_numbers(a, b) == 0;
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::undefined:
    case Value::Kind::none:
      return true;
    case Value::Kind::string:
      return a.as_string() == b.as_string();
    case Value::Kind::list:
    case Value::Kind::tuple: {
      const List &x = a.as_list(), &y = b.as_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equals(x[i], y[i])) return false;
      return true;
    }
    case Value::Kind::dict: {
      const Dict &x = a.as_dict(), &y = b.as_dict();
      if (x.size() != y.size()) return false;
      for (const auto& [key, value] : x.items()) {
        const Value* other = y.find(key);
        if (!other || !equals(value, *other)) return false;
      }
      return true;
    }
    case Value::Kind::object:
      return a.identity() == b.identity();
    default:
      return false;
  }
}

bool less_than(const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) return compare_numbers(a, b) == -1;
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if ((a.is_list() && b.is_list()) || (a.is_tuple() && b.is_tuple())) {
    const List &x = a.as_list(), &y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!equals(x[i], y[i])) return less_than(x[i], y[i]);
    return x.size() < y.size();
  }
  type_error("'<' not supported between instances of '{}' and '{}'", type_name(a), type_name(b));
}

bool is_hashable(const Value& v) {
  if (v.is_list() || v.is_dict()) return false;
  if (v.is_tuple()) {
    for (const Value& item : v.as_list())
      if (!is_hashable(item)) return false;
  }
  return true;
}

std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined:
      return "";
    case Value::Kind::none:
      return "None";
    case Value::Kind::boolean:
      return v.as_bool() ? "True" : "False";
    case Value::Kind::integer:
      return std::to_string(v.as_int());
    case Value::Kind::floating:
      return py::float_repr(v.as_double());
    case Value::Kind::string:
      return v.as_string();
    default:
      return to_repr(v);
  }
}

std::string to_repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined:
      return "Undefined";
    case Value::Kind::string:
      return v.is_markup() ? "Markup(" + py::repr(v.as_string()) + ")" : py::repr(v.as_string());
    case Value::Kind::list:
    case Value::Kind::tuple: {
      const List& items = v.as_list();
      std::string out = v.is_list() ? "[" : "(";
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        out += to_repr(items[i]);
      }
      if (v.is_tuple() && items.size() == 1) out += ",";
      out += v.is_list() ? "]" : ")";
      return out;
    }
    case Value::Kind::dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, value] : v.as_dict().items()) {
        if (!first) out += ", ";
        first = false;
        out += to_repr(key) + ": " + to_repr(value);
      }
      return out + "}";
    }
    case Value::Kind::object:
      return v.as_object()->repr();
    default:
      return to_str(v);
  }
}

void fail_undefined(const Value& v) {
  const UndefinedInfo* info = v.undefined_info();
  if (info) throw TemplateException(info->kind, info->message);
  throw TemplateException(FailureKind::undefined, "None is undefined");
}

List iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined:
      return {};
    case Value::Kind::string: {
      List chars;
      for (char32_t c : py::decode_utf8(v.as_string())) {
        std::string s;
        py::append_utf8(s, c);
        chars.push_back(Value::string(std::move(s)));
      }
      return chars;
    }
    case Value::Kind::list:
    case Value::Kind::tuple:
      return v.as_list();
    case Value::Kind::dict: {
      List keys;
      keys.reserve(v.as_dict().size());
      for (const auto& item : v.as_dict().items()) keys.push_back(item.first);
      return keys;
    }
    case Value::Kind::object:
      if (auto* iterator = v.object_as<Iterator>()) return iterator->take_all();
      break;
    default:
      break;
  }
  type_error("'{}' object is not iterable", type_name(v));
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined:
      return 0;
    case Value::Kind::string:
      return int64_t(py::code_point_count(v.as_string()));
    case Value::Kind::list:
    case Value::Kind::tuple:
      return int64_t(v.as_list().size());
    case Value::Kind::dict:
      return int64_t(v.as_dict().size());
    default:
      type_error("object of type '{}' has no len()", type_name(v));
  }
}

bool contains(const Value& haystack, const Value& needle) {
  switch (haystack.kind()) {
    case Value::Kind::undefined:
      return false;
    case Value::Kind::string:
      if (!needle.is_string()) type_error("'in <string>' requires string as left operand, not {}", type_name(needle));
      return haystack.as_string().find(needle.as_string()) != std::string::npos;
    case Value::Kind::list:
    case Value::Kind::tuple:
      for (const Value& item : haystack.as_list())
        if (equals(item, needle)) return true;
      return false;
    case Value::Kind::dict:
      if (!is_hashable(needle)) type_error("unhashable type: '{}'", type_name(needle));
      return haystack.as_dict().find(needle) != nullptr;
    case Value::Kind::object:
      if (auto* iterator = haystack.object_as<Iterator>()) {
        Value item;
        while (iterator->take_one(item))
          if (equals(item, needle)) return true;
        return false;
      }
      break;
    default:
      break;
  }
  type_error("argument of type '{}' is not iterable", type_name(haystack));
}

}  // namespace kiln::jinja
