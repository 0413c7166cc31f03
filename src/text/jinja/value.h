// The values a template computes with, and the Python semantics jinja2 gives them: truthiness,
// equality, ordering, str() and repr(), iteration, len(). A Value is a cheap handle: scalars
// inline, strings and containers shared and immutable (the sandbox forbids mutating them), and a
// few mutable objects (namespace(), iterators, loop state) shared by reference as in Python.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "text/jinja/errors.h"

namespace kiln::jinja {

class Value;
class Object;
class Renderer;

// Containers nest at most this deep (Python allows about as much before its recursion limit);
// every recursive walk over values (repr, equality, JSON) is bounded by it, and so is the
// destruction of a chain of nested lists.
constexpr int kMaxValueDepth = 256;

using List = std::vector<Value>;

// An insertion-ordered dict with Python's key equality (1 == 1.0 == True).
class Dict {
 public:
  using Item = std::pair<Value, Value>;
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  const std::vector<Item>& items() const { return items_; }
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  // Inserts, or replaces the value of an equal key in place (its position stays), as Python does.
  void set(Value key, Value value);

 private:
  // Small dicts (what chat templates see) are searched linearly; larger ones get a hash index so
  // that building one stays linear.
  static constexpr size_t kLinearSearchLimit = 8;
  void build_index();
  std::vector<Item> items_;
  std::unordered_multimap<size_t, size_t> index_;  // hash of a key -> position in items_
};

// What reading an undefined value reports if the template uses it where a value is needed.
struct UndefinedInfo {
  std::string message;
  FailureKind kind = FailureKind::undefined;  // `security` for the sandbox's unsafe attributes
};

class Value {
 public:
  enum class Kind : uint8_t { undefined, none, boolean, integer, floating, string, list, tuple, dict, object };

  Value() = default;  // undefined, without a message (prints as "")
  static Value undefined(std::string message, FailureKind kind = FailureKind::undefined);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value floating(double f);
  static Value string(std::string s, bool markup = false);
  static Value list(List items);
  static Value tuple(List items);
  static Value dict(Dict dict);
  static Value object(std::shared_ptr<Object> object);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::undefined; }
  bool is_none() const { return kind_ == Kind::none; }
  bool is_bool() const { return kind_ == Kind::boolean; }
  bool is_int() const { return kind_ == Kind::integer; }
  bool is_float() const { return kind_ == Kind::floating; }
  bool is_number() const { return kind_ == Kind::boolean || kind_ == Kind::integer || kind_ == Kind::floating; }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_markup() const { return kind_ == Kind::string && markup_; }
  bool is_list() const { return kind_ == Kind::list; }
  bool is_tuple() const { return kind_ == Kind::tuple; }
  bool is_sequence() const { return kind_ == Kind::list || kind_ == Kind::tuple; }  // list or tuple
  bool is_dict() const { return kind_ == Kind::dict; }
  bool is_object() const { return kind_ == Kind::object; }

  bool as_bool() const { return scalar_.b; }
  int64_t as_int() const { return kind_ == Kind::boolean ? int64_t(scalar_.b) : scalar_.i; }  // bool or int
  double as_double() const;                                                                   // any number
  const std::string& as_string() const { return *static_cast<const std::string*>(ptr_.get()); }
  const List& as_list() const { return *static_cast<const List*>(ptr_.get()); }  // list or tuple
  const Dict& as_dict() const { return *static_cast<const Dict*>(ptr_.get()); }
  Object* as_object() const { return static_cast<Object*>(ptr_.get()); }
  template <typename T>
  T* object_as() const {
    return kind_ == Kind::object ? dynamic_cast<T*>(as_object()) : nullptr;
  }
  const UndefinedInfo* undefined_info() const { return static_cast<const UndefinedInfo*>(ptr_.get()); }
  // Identity of shared payloads, for `is sameas` and for the identity-compared objects.
  const void* identity() const { return ptr_.get(); }
  // Nesting depth: 0 for scalars and strings, 1 + the deepest item for containers.
  int depth() const;
  // Work units a builtin that walks this value may do: 1 per item, nested items included (shared
  // ones counted each time they appear), 1 per 64 bytes of text. Saturates at 2^32-1.
  uint32_t weight() const;
  static void check_depth(int depth);  // a limit error beyond kMaxValueDepth

 private:
  Kind kind_ = Kind::undefined;
  bool markup_ = false;
  uint16_t depth_ = 0;
  uint32_t weight_ = 1;
  union {
    bool b;
    int64_t i;
    double f;
  } scalar_{};
  std::shared_ptr<void> ptr_;
};

// Arguments of a call, as Python receives them.
struct CallArgs {
  List positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// Mutable or behavioural values: namespace(), iterators, macros, loop state, bound methods...
class Object {
 public:
  virtual ~Object() = default;
  virtual std::string type_name() const = 0;  // Python's class name, for messages
  virtual std::string repr() const;
  // repr() into `out`, for objects that hold values (bounded like to_repr).
  virtual void append_repr(std::string& out, size_t max_bytes, int depth) const { out += repr(); }
  virtual int depth() const { return 1; }
  virtual uint32_t weight() const { return 1; }
  virtual bool is_callable() const { return false; }
  virtual Value call(Renderer& renderer, CallArgs& args);
  virtual Value get_attribute(std::string_view name);  // undefined Value when absent
};

// jinja2's namespace(): the one mutable mapping a template may assign to.
class Namespace : public Object {
 public:
  explicit Namespace(Dict initial = Dict());
  std::string type_name() const override { return "Namespace"; }
  std::string repr() const override;
  void append_repr(std::string& out, size_t max_bytes, int depth) const override;
  int depth() const override { return depth_; }
  Value get_attribute(std::string_view name) override;
  void set_attribute(std::string_view name, Value value);
  const Dict& attributes() const { return attributes_; }
  void clear() { attributes_ = Dict(); }

 private:
  Dict attributes_;
  int depth_ = 1;  // an upper bound: attributes only ever deepen it
};

// A one-shot iterator, as Python's generators (map/select filters) and reversed() are: always
// true, no len(), and iterating it consumes what it yields. A lazy one runs its producer as it is
// consumed, as a generator's body runs: its errors surface then, or never if nothing asks.
class Iterator : public Object {
 public:
  // Produces the next item into `out`; false once exhausted.
  using Next = std::function<bool(Value& out)>;
  Iterator(List items, std::string type_name);
  // `source` is what the producer draws from, for the depth and weight bookkeeping.
  Iterator(Next next, const Value& source, std::string type_name);
  std::string type_name() const override { return type_name_; }
  std::string repr() const override;
  int depth() const override { return depth_; }
  uint32_t weight() const override { return weight_; }
  List take_all();
  bool take_one(Value& out);

 private:
  List items_;
  size_t next_index_ = 0;
  Next next_;             // lazy producer, released once exhausted
  bool running_ = false;  // Python: "generator already executing"
  std::string type_name_;
  int depth_;
  uint32_t weight_;
};

// dict.keys(), .values() and .items(): re-iterable, sized, not subscriptable, not JSON.
class DictView : public Object {
 public:
  DictView(List items, std::string type_name);
  std::string type_name() const override { return type_name_; }
  std::string repr() const override;
  void append_repr(std::string& out, size_t max_bytes, int depth) const override;
  int depth() const override { return depth_; }
  uint32_t weight() const override { return weight_; }
  const List items;

 private:
  std::string type_name_;
  int depth_;
  uint32_t weight_;
};

// A callable implemented in C++ (range, namespace, bound string methods, ...).
class Builtin : public Object {
 public:
  using Function = std::function<Value(Renderer&, CallArgs&)>;
  Builtin(std::string name, Function function, std::string repr, uint32_t weight = 1)
      : name_(std::move(name)), function_(std::move(function)), repr_(std::move(repr)), weight_(weight) {}
  uint32_t weight() const override { return weight_; }
  std::string type_name() const override { return "builtin_function_or_method"; }
  std::string repr() const override { return repr_; }
  bool is_callable() const override { return true; }
  Value call(Renderer& renderer, CallArgs& args) override { return function_(renderer, args); }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  Function function_;
  std::string repr_;
  uint32_t weight_;  // of the value a bound method works on
};

// --- Python semantics ----------------------------------------------------------------------------

std::string type_name(const Value& v);  // type(v).__name__
bool truthy(const Value& v);
bool equals(const Value& a, const Value& b);
bool less_than(const Value& a, const Value& b);  // a < b, or a TypeError
bool is_hashable(const Value& v);
size_t hash_value(const Value& v);  // consistent with equals() for hashable values
// str(v) and repr(v); text longer than max_bytes raises a limit error instead.
std::string to_str(const Value& v, size_t max_bytes = SIZE_MAX);
std::string to_repr(const Value& v, size_t max_bytes = SIZE_MAX);
void append_repr(std::string& out, const Value& v, size_t max_bytes, int depth);
// Raises the error of using an undefined value (jinja2's _fail_with_undefined_error).
[[noreturn]] void fail_undefined(const Value& v);
// The items `for x in v` visits; undefined iterates as empty. Consumes iterators.
List iterate(const Value& v);
int64_t length(const Value& v);  // len(v)
// `needle in haystack`.
bool contains(const Value& haystack, const Value& needle);

}  // namespace kiln::jinja
