// jinja2's optimizer (optimizer.py and the nodes' as_const): before generating code, jinja2
// evaluates every constant subexpression and replaces it with its value when that value has a safe
// repr. This is observable, so kiln does the same:
//  - `1 or x|nosuchfilter` never compiles its right side (no unknown-filter error);
//  - a {{ }} whose whole expression is constant is rendered at compile time, through jinja2's
//    forgiving getitem (so `'abc'['a':]` prints nothing instead of raising);
//  - a folded float inf/nan is written into the generated Python as the bare name inf/nan, which
//    is a NameError when that code runs.
// Constant evaluation follows each node's as_const: and/or/if-else and comparisons short-circuit,
// calls and the filters that take the context (map, select, ...) are never constant, and any
// error just leaves the expression to runtime.
#include <algorithm>
#include <cmath>

#include "text/jinja/builtins.h"
#include "text/jinja/operators.h"
#include "text/jinja/parser_impl.h"
#include "text/jinja/renderer.h"

namespace kiln::jinja::parsing {

namespace {

struct Impossible {};  // jinja2's nodes.Impossible: not constant

bool has_safe_repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::none:
    case Value::Kind::boolean:
    case Value::Kind::integer:
    case Value::Kind::floating:
    case Value::Kind::string:
      return true;
    case Value::Kind::list:
    case Value::Kind::tuple:
      for (const Value& item : v.as_list())
        if (!has_safe_repr(item)) return false;
      return true;
    case Value::Kind::dict:
      for (const auto& [key, value] : v.as_dict().items())
        if (!has_safe_repr(key) || !has_safe_repr(value)) return false;
      return true;
    default:
      return false;
  }
}

// The first name repr() writes for a non-finite float inside `v`, or "".
std::string non_finite_name(const Value& v) {
  if (v.is_float() && !std::isfinite(v.as_double())) return std::isnan(v.as_double()) ? "nan" : "inf";
  if (v.is_sequence()) {
    for (const Value& item : v.as_list())
      if (auto name = non_finite_name(item); !name.empty()) return name;
  }
  if (v.is_dict()) {
    for (const auto& [key, value] : v.as_dict().items()) {
      if (auto name = non_finite_name(key); !name.empty()) return name;
      if (auto name = non_finite_name(value); !name.empty()) return name;
    }
  }
  return "";
}

bool is_context_filter(std::string_view name) {
  return name == "map" || name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr";
}

class ConstantFolder {
 public:
  ConstantFolder() : renderer_(options_, std::chrono::system_clock::time_point()) {}

  void body(Body& statements) {
    for (Stmt& s : statements) std::visit([&](auto& n) { statement(n); }, s.node);
  }

 private:
  // --- as_const --------------------------------------------------------------------------------
  template <typename F>
  Value guarded(F&& f) {
    try {
      return f();
    } catch (const TemplateException&) {
      throw Impossible{};
    }
  }

  Value as_const(const Expr& e) {
    return std::visit([&](const auto& n) { return constant(n); }, e.node);
  }

  CallArgs constant_arguments(const Arguments& a) {
    CallArgs out;
    for (const auto& e : a.positional) out.positional.push_back(as_const(*e));
    for (const auto& [name, e] : a.keyword) {
      // jinja2 collects constant keyword arguments in a dict: a repeated one keeps the last value.
      Value value = as_const(*e);
      auto it = std::find_if(out.keyword.begin(), out.keyword.end(), [&](const auto& kw) { return kw.first == name; });
      if (it != out.keyword.end()) {
        it->second = std::move(value);
      } else {
        out.keyword.emplace_back(name, std::move(value));
      }
    }
    if (a.star_args) {
      Value extra = as_const(*a.star_args);
      Value items = guarded([&] { return Value::list(iterate(extra)); });
      for (const Value& v : items.as_list()) out.positional.push_back(v);
    }
    if (a.star_kwargs) {
      Value extra = as_const(*a.star_kwargs);
      if (!extra.is_dict()) throw Impossible{};
      for (const auto& [key, value] : extra.as_dict().items()) {
        if (!key.is_string()) throw Impossible{};
        out.keyword.emplace_back(key.as_string(), value);
      }
    }
    return out;
  }

  Value constant(const Literal& n) { return n.value; }
  Value constant(const Name&) { throw Impossible{}; }
  Value constant(const Call&) { throw Impossible{}; }  // never in the sandbox
  Value constant(const Slice&) { throw Impossible{}; }
  Value constant(const ListLiteral& n) {
    List items;
    for (const auto& e : n.items) items.push_back(as_const(*e));
    return Value::list(std::move(items));
  }
  Value constant(const TupleLiteral& n) {
    List items;
    for (const auto& e : n.items) items.push_back(as_const(*e));
    return Value::tuple(std::move(items));
  }
  Value constant(const DictLiteral& n) {
    Dict dict;
    for (const auto& [k, v] : n.items) {
      Value key = as_const(*k), value = as_const(*v);
      // dict() raises here, outside jinja2's Impossible handling: the template fails to compile.
      if (!is_hashable(key)) type_error("unhashable type: '{}'", type_name(key));
      dict.set(std::move(key), std::move(value));
    }
    return Value::dict(std::move(dict));
  }
  Value constant(const GetAttr& n) {
    Value object = as_const(*n.object);
    return guarded([&] { return renderer_.get_attribute(object, n.attribute); });
  }
  Value constant(const GetItem& n) {
    Value object = as_const(*n.object);
    if (const auto* range = std::get_if<Slice>(&n.key->node)) {
      auto bound = [&](const ExprPtr& part, bool& valid) -> std::optional<int64_t> {
        if (!part) return std::nullopt;
        Value v = as_const(*part);
        if (v.is_none()) return std::nullopt;
        if (v.is_int() || v.is_bool()) return v.as_int();
        valid = false;
        return std::nullopt;
      };
      bool valid = true;
      auto start = bound(range->start, valid), stop = bound(range->stop, valid), step = bound(range->step, valid);
      if (object.is_undefined()) throw Impossible{};
      // jinja2's getitem turns the TypeError of a bad slice into an undefined value.
      if (!valid || !(object.is_string() || object.is_sequence()))
        return Value::undefined(fmt::format("{} object has no element slice", type_name(object)));
      return guarded([&] { return slice(object, start, stop, step); });
    }
    Value key = as_const(*n.key);
    return guarded([&] { return renderer_.get_item(object, key); });
  }
  Value constant(const Filter& n) {
    if (!n.operand || !find_filter(n.name) || is_context_filter(n.name)) throw Impossible{};
    Value operand = as_const(*n.operand);
    CallArgs args = constant_arguments(n.args);
    return guarded([&] { return renderer_.apply_filter(n.name, operand, args); });
  }
  Value constant(const Test& n) {
    if (!find_test(n.name)) throw Impossible{};
    Value operand = as_const(*n.operand);
    CallArgs args = constant_arguments(n.args);
    return guarded([&] { return Value::boolean(renderer_.apply_test(n.name, operand, args)); });
  }
  Value constant(const Unary& n) {
    Value operand = as_const(*n.operand);
    switch (n.op) {
      case UnaryOp::logical_not:
        return Value::boolean(!truthy(operand));
      case UnaryOp::negate:
        return guarded([&] { return negate(operand); });
      case UnaryOp::plus:
        return guarded([&] { return unary_plus(operand); });
    }
    throw Impossible{};
  }
  Value constant(const Binary& n) {
    if (n.op == BinaryOp::logical_and) {
      Value left = as_const(*n.left);
      return truthy(left) ? as_const(*n.right) : left;
    }
    if (n.op == BinaryOp::logical_or) {
      Value left = as_const(*n.left);
      return truthy(left) ? left : as_const(*n.right);
    }
    Value left = as_const(*n.left), right = as_const(*n.right);
    return guarded([&] { return binary_operation(n.op, left, right, options_.limits); });
  }
  Value constant(const Concat& n) {
    std::string out;
    for (const auto& part : n.parts) out += to_str(as_const(*part), options_.limits.max_output_bytes);
    return Value::string(std::move(out));
  }
  Value constant(const Compare& n) {
    Value left = as_const(*n.first);
    Value result = Value::boolean(true);
    for (const auto& [op, e] : n.rest) {
      Value right = as_const(*e);
      bool ok = false;
      try {
        ok = compare(op, left, right);
      } catch (const TemplateException&) {
        throw Impossible{};
      }
      if (!ok) return Value::boolean(false);
      left = std::move(right);
    }
    return result;
  }
  Value constant(const Conditional& n) {
    if (truthy(as_const(*n.test))) return as_const(*n.then);
    if (!n.otherwise) throw Impossible{};  // an undefined result is left to runtime
    return as_const(*n.otherwise);
  }

  // --- folding ---------------------------------------------------------------------------------
  void fold(ExprPtr& e) {
    if (!e) return;
    std::visit([&](auto& n) { children(n); }, e->node);
    if (std::holds_alternative<Literal>(e->node)) return;
    try {
      Value value = as_const(*e);
      if (!has_safe_repr(value)) return;
      auto folded = std::make_unique<Expr>();
      folded->line = e->line;
      folded->node = Literal{value, non_finite_name(value)};
      e = std::move(folded);
    } catch (const Impossible&) {
    }
  }

  void arguments(Arguments& a) {
    for (auto& e : a.positional) fold(e);
    for (auto& [name, e] : a.keyword) fold(e);
    fold(a.star_args);
    fold(a.star_kwargs);
  }

  void children(Literal&) {}
  void children(Name&) {}
  void children(ListLiteral& n) {
    for (auto& e : n.items) fold(e);
  }
  void children(TupleLiteral& n) {
    for (auto& e : n.items) fold(e);
  }
  void children(DictLiteral& n) {
    for (auto& [k, v] : n.items) fold(k), fold(v);
  }
  void children(GetAttr& n) { fold(n.object); }
  void children(GetItem& n) {
    fold(n.object);
    if (auto* range = std::get_if<Slice>(&n.key->node)) {
      fold(range->start), fold(range->stop), fold(range->step);
    } else {
      fold(n.key);
    }
  }
  void children(Slice& n) { fold(n.start), fold(n.stop), fold(n.step); }
  void children(Call& n) { fold(n.callee), arguments(n.args); }
  void children(Filter& n) { fold(n.operand), arguments(n.args); }
  void children(Test& n) { fold(n.operand), arguments(n.args); }
  void children(Unary& n) { fold(n.operand); }
  void children(Binary& n) { fold(n.left), fold(n.right); }
  void children(Concat& n) {
    for (auto& e : n.parts) fold(e);
  }
  void children(Compare& n) {
    fold(n.first);
    for (auto& [op, e] : n.rest) fold(e);
  }
  void children(Conditional& n) { fold(n.test), fold(n.then), fold(n.otherwise); }

  void macro(MacroDecl& m) {
    for (auto& d : m.defaults) fold(d);
    body(m.body);
  }

  void statement(Output&) {}
  void statement(Print& n) {
    fold(n.expr);
    // jinja2 renders a constant {{ }} to text when it compiles the template.
    try {
      n.constant_text = to_str(as_const(*n.expr), options_.limits.max_output_bytes);
    } catch (const Impossible&) {
    } catch (const TemplateException&) {
    }
  }
  void statement(If& n) {
    for (auto& [test, b] : n.branches) fold(test), body(b);
    body(n.otherwise);
  }
  void statement(For& n) {
    fold(n.iterable), fold(n.filter);
    body(n.body), body(n.otherwise);
  }
  void statement(Set& n) { fold(n.value); }
  void statement(SetBlock& n) { fold(n.filter), body(n.body); }
  void statement(MacroDef& n) { macro(*n.macro); }
  void statement(CallBlock& n) { fold(n.call), macro(*n.caller); }
  void statement(FilterBlock& n) { fold(n.filter), body(n.body); }
  void statement(With& n) {
    for (auto& v : n.values) fold(v);
    body(n.body);
  }
  void statement(Break&) {}
  void statement(Continue&) {}
  void statement(Generation& n) { macro(*n.caller); }
  void statement(Block& n) { body(n.body); }
  void statement(NeedsLoader& n) { fold(n.template_name); }

  RenderOptions options_;
  Renderer renderer_;
};

}  // namespace

void fold_constants(TemplateBody& body) {
  ConstantFolder().body(body.body);
}

}  // namespace kiln::jinja::parsing
