// Python semantics of template values. See value.h.
#include "text/jinja/value.h"

#include <algorithm>
#include <cmath>

#include "text/jinja/pystr.h"

namespace kiln::jinja {

// --- Dict ----------------------------------------------------------------------------------------

const Value* Dict::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.as_string()));
  if (items_.size() <= kLinearSearchLimit || !is_hashable(key)) {
    for (const auto& [k, v] : items_)
      if (equals(k, key)) return &v;
    return nullptr;
  }
  auto [begin, end] = index_.equal_range(hash_value(key));
  for (auto it = begin; it != end; ++it)
    if (equals(items_[it->second].first, key)) return &items_[it->second].second;
  return nullptr;
}

const Value* Dict::find(std::string_view key) const {
  if (items_.size() <= kLinearSearchLimit) {
    for (const auto& [k, v] : items_)
      if (k.is_string() && k.as_string() == key) return &v;
    return nullptr;
  }
  auto [begin, end] = index_.equal_range(std::hash<std::string_view>{}(key));
  for (auto it = begin; it != end; ++it) {
    const Value& k = items_[it->second].first;
    if (k.is_string() && k.as_string() == key) return &items_[it->second].second;
  }
  return nullptr;
}

void Dict::build_index() {
  index_.clear();
  for (size_t i = 0; i < items_.size(); ++i)
    if (is_hashable(items_[i].first)) index_.emplace(hash_value(items_[i].first), i);
}

void Dict::set(Value key, Value value) {
  if (const Value* existing = find(key)) {
    *const_cast<Value*>(existing) = std::move(value);
    return;
  }
  items_.emplace_back(std::move(key), std::move(value));
  if (items_.size() == kLinearSearchLimit + 1) {
    build_index();
  } else if (items_.size() > kLinearSearchLimit + 1 && is_hashable(items_.back().first)) {
    index_.emplace(hash_value(items_.back().first), items_.size() - 1);
  }
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
  v.weight_ = uint32_t(std::min<size_t>(1 + s.size() / 64, UINT32_MAX));
  v.ptr_ = std::make_shared<std::string>(std::move(s));
  return v;
}

namespace {

int items_depth(const List& items) {
  int depth = 0;
  for (const Value& item : items) depth = std::max(depth, item.depth());
  return depth + 1;
}

uint32_t add_weights(uint64_t a, uint64_t b) {
  return uint32_t(std::min<uint64_t>(a + b, UINT32_MAX));
}

uint32_t items_weight(const List& items) {
  uint32_t weight = 1;
  for (const Value& item : items) weight = add_weights(weight, item.weight());
  return weight;
}

}  // namespace

void Value::check_depth(int depth) {
  if (depth > kMaxValueDepth) fail(FailureKind::limit, "values nested deeper than kiln's limit of {}", kMaxValueDepth);
}

Value Value::list(List items) {
  Value v;
  v.kind_ = Kind::list;
  int depth = items_depth(items);
  check_depth(depth);
  v.depth_ = uint16_t(depth);
  v.weight_ = items_weight(items);
  v.ptr_ = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::tuple(List items) {
  Value v = list(std::move(items));
  v.kind_ = Kind::tuple;
  return v;
}

Value Value::dict(Dict dict) {
  Value v;
  v.kind_ = Kind::dict;
  int depth = 0;
  uint32_t weight = 1;
  for (const auto& [key, value] : dict.items()) {
    depth = std::max({depth, key.depth(), value.depth()});
    weight = add_weights(weight, add_weights(key.weight(), value.weight()));
  }
  check_depth(depth + 1);
  v.depth_ = uint16_t(depth + 1);
  v.weight_ = weight;
  v.ptr_ = std::make_shared<Dict>(std::move(dict));
  return v;
}

Value Value::object(std::shared_ptr<Object> object) {
  Value v;
  v.kind_ = Kind::object;
  v.ptr_ = std::move(object);
  return v;
}

int Value::depth() const {
  if (kind_ == Kind::object) return as_object()->depth();
  return depth_;
}

uint32_t Value::weight() const {
  if (kind_ == Kind::object) return as_object()->weight();
  return weight_;
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

Namespace::Namespace(Dict initial) {
  for (const auto& [key, value] : initial.items())
    set_attribute(key.is_string() ? key.as_string() : to_str(key), value);
}

std::string Namespace::repr() const {
  std::string out;
  append_repr(out, SIZE_MAX, 0);
  return out;
}

void Namespace::append_repr(std::string& out, size_t max_bytes, int depth) const {
  out += "<Namespace ";
  // The attributes are a dict to Python, which may (through lists) contain this namespace again.
  kiln::jinja::append_repr(out, Value::dict(attributes_), max_bytes, depth + 1);
  out += ">";
}

void Namespace::set_attribute(std::string_view name, Value value) {
  int depth = std::max(depth_, value.depth() + 2);  // namespace -> its dict -> value
  if (depth > kMaxValueDepth) fail(FailureKind::limit, "values nested deeper than kiln's limit of {}", kMaxValueDepth);
  depth_ = depth;
  attributes_.set(Value::string(std::string(name)), std::move(value));
}

Value Namespace::get_attribute(std::string_view name) {
  if (const Value* v = attributes_.find(name)) return *v;
  return Value::undefined(fmt::format("'jinja2.utils.Namespace object' has no attribute '{}'", name));
}

Iterator::Iterator(List items, std::string type_name)
    : items_(std::move(items)),
      type_name_(std::move(type_name)),
      depth_(items_depth(items_)),
      weight_(items_weight(items_)) {}

Iterator::Iterator(Next next, const Value& source, std::string type_name)
    : next_(std::move(next)), type_name_(std::move(type_name)), depth_(source.depth() + 1), weight_(source.weight()) {
  Value::check_depth(depth_);
}

std::string Iterator::repr() const {
  return fmt::format("<{} object>", type_name_);
}

bool Iterator::take_one(Value& out) {
  if (next_) {
    if (running_) fail(FailureKind::runtime, "generator already executing");
    running_ = true;
    struct Done {
      bool& running;
      ~Done() { running = false; }
    } done{running_};
    if (next_(out)) return true;
    next_ = nullptr;
    return false;
  }
  if (next_index_ >= items_.size()) return false;
  out = items_[next_index_++];
  return true;
}

List Iterator::take_all() {
  List rest;
  if (next_) {
    Value item;
    while (take_one(item)) rest.push_back(std::move(item));
    return rest;
  }
  rest.assign(items_.begin() + static_cast<std::ptrdiff_t>(next_index_), items_.end());
  next_index_ = items_.size();
  return rest;
}

DictView::DictView(List items, std::string type_name)
    : items(std::move(items)),
      type_name_(std::move(type_name)),
      depth_(items_depth(this->items)),
      weight_(items_weight(this->items)) {}

std::string DictView::repr() const {
  std::string out;
  append_repr(out, SIZE_MAX, 0);
  return out;
}

void DictView::append_repr(std::string& out, size_t max_bytes, int depth) const {
  out += type_name_ + "(";
  kiln::jinja::append_repr(out, Value::list(items), max_bytes, depth + 1);
  out += ")";
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
      if (auto* view = v.object_as<DictView>()) return !view->items.empty();
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

size_t hash_value(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::string:
      return std::hash<std::string_view>{}(v.as_string());
    case Value::Kind::boolean:
    case Value::Kind::integer:
      return std::hash<int64_t>{}(v.as_int());
    case Value::Kind::floating: {
      // Integral floats hash like the equal int (1.0 == 1).
      double f = v.as_double();
      if (f == std::trunc(f) && std::fabs(f) < 9.2e18) return std::hash<int64_t>{}(int64_t(f));
      return std::hash<double>{}(f);
    }
    case Value::Kind::tuple: {
      size_t h = 0x345678;
      for (const Value& item : v.as_list()) h = h * 1000003 ^ hash_value(item);
      return h;
    }
    case Value::Kind::object:
      return std::hash<const void*>{}(v.identity());
    default:
      return size_t(v.kind());
  }
}

std::string to_str(const Value& v, size_t max_bytes) {
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
      return to_repr(v, max_bytes);
  }
}

std::string to_repr(const Value& v, size_t max_bytes) {
  std::string out;
  append_repr(out, v, max_bytes, 0);
  return out;
}

void append_repr(std::string& out, const Value& v, size_t max_bytes, int depth) {
  // Values nest at most kMaxValueDepth deep; deeper recursion means a namespace that contains
  // itself, which Python prints with "..." and kiln refuses.
  if (depth > 2 * kMaxValueDepth) fail(FailureKind::limit, "repr of a value that contains itself");
  switch (v.kind()) {
    case Value::Kind::undefined:
      out += "Undefined";
      break;
    case Value::Kind::string:
      out += v.is_markup() ? "Markup(" + py::repr(v.as_string()) + ")" : py::repr(v.as_string());
      break;
    case Value::Kind::list:
    case Value::Kind::tuple: {
      const List& items = v.as_list();
      out += v.is_list() ? "[" : "(";
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        append_repr(out, items[i], max_bytes, depth + 1);
      }
      if (v.is_tuple() && items.size() == 1) out += ",";
      out += v.is_list() ? "]" : ")";
      break;
    }
    case Value::Kind::dict: {
      out += "{";
      bool first = true;
      for (const auto& [key, value] : v.as_dict().items()) {
        if (!first) out += ", ";
        first = false;
        append_repr(out, key, max_bytes, depth + 1);
        out += ": ";
        append_repr(out, value, max_bytes, depth + 1);
      }
      out += "}";
      break;
    }
    case Value::Kind::object:
      v.as_object()->append_repr(out, max_bytes, depth);
      break;
    default:
      out += to_str(v);
  }
  if (out.size() > max_bytes)
    fail(FailureKind::limit, "text of more than {} bytes exceeds kiln's output limit", max_bytes);
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
      if (auto* view = v.object_as<DictView>()) return view->items;
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
    case Value::Kind::object:
      if (auto* view = v.object_as<DictView>()) return int64_t(view->items.size());
      [[fallthrough]];
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
      if (auto* view = haystack.object_as<DictView>()) {
        for (const Value& item : view->items)
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
