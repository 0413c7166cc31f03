// Expression evaluation and jinja2's sandboxed attribute and item lookup. See renderer.h.
#include <algorithm>

#include "text/jinja/builtins.h"
#include "text/jinja/operators.h"
#include "text/jinja/pystr.h"
#include "text/jinja/renderer.h"

namespace kiln::jinja {

namespace {

// jinja2's object_type_repr, used in "has no attribute" messages.
std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  return type_name(v) + " object";
}

Value missing_attribute(const Value& object, std::string_view name) {
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_type_repr(object), name));
}

Value unsafe_attribute(const Value& object, std::string_view name) {
  return Value::undefined(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, type_name(object)),
                          FailureKind::security);
}

}  // namespace

Value Renderer::eval(const ast::Expr& expr, Scope* scope) {
  count_step();
  current_line_ = expr.line;
  return std::visit([&](const auto& node) { return eval_node(node, scope); }, expr.node);
}

Value Renderer::eval_node(const ast::Literal& node, Scope*) {
  if (!node.name_error.empty()) fail(FailureKind::runtime, "name '{}' is not defined", node.name_error);
  return node.value;
}

Value Renderer::eval_node(const ast::Name& node, Scope* scope) {
  if (const Value* v = scope->find(node.name)) return *v;
  Value global = find_global(node.name);
  if (!global.is_undefined()) return global;
  return Value::undefined(fmt::format("'{}' is undefined", node.name));
}

Value Renderer::eval_node(const ast::ListLiteral& node, Scope* scope) {
  List items;
  items.reserve(node.items.size());
  for (const auto& item : node.items) items.push_back(eval(*item, scope));
  return Value::list(std::move(items));
}

Value Renderer::eval_node(const ast::TupleLiteral& node, Scope* scope) {
  List items;
  items.reserve(node.items.size());
  for (const auto& item : node.items) items.push_back(eval(*item, scope));
  return Value::tuple(std::move(items));
}

Value Renderer::eval_node(const ast::DictLiteral& node, Scope* scope) {
  Dict dict;
  for (const auto& [key_expr, value_expr] : node.items) {
    Value key = eval(*key_expr, scope);
    if (!is_hashable(key)) type_error("unhashable type: '{}'", type_name(key));
    dict.set(std::move(key), eval(*value_expr, scope));
  }
  return Value::dict(std::move(dict));
}

Value Renderer::eval_node(const ast::GetAttr& node, Scope* scope) {
  return get_attribute(eval(*node.object, scope), node.attribute);
}

Value Renderer::eval_node(const ast::GetItem& node, Scope* scope) {
  Value object = eval(*node.object, scope);
  if (const auto* range = std::get_if<ast::Slice>(&node.key->node)) {
    auto bound = [&](const ast::ExprPtr& e, bool& valid) -> std::optional<int64_t> {
      if (!e) return std::nullopt;
      Value v = eval(*e, scope);
      if (v.is_none()) return std::nullopt;
      if (v.is_int() || v.is_bool()) return v.as_int();
      valid = false;
      return std::nullopt;
    };
    bool valid = true;
    auto start = bound(range->start, valid);
    auto stop = bound(range->stop, valid);
    auto step = bound(range->step, valid);
    if (object.is_undefined()) fail_undefined(object);
    charge(object);
    bool sliceable = object.is_string() || object.is_sequence();
    if (sliceable && valid) return slice(object, start, stop, step);

    if (sliceable) type_error("slice indices must be integers or None or have an __index__ method");
    if (object.is_dict()) type_error("unhashable type: 'slice'");
    type_error("'{}' object is not subscriptable", type_name(object));
  }
  Value key = eval(*node.key, scope);
  charge(key);
  return get_item(object, key);
}

Value Renderer::eval_node(const ast::Slice&, Scope*) {
  type_error("slice outside a subscript");
}

CallArgs Renderer::eval_arguments(const ast::Arguments& args, Scope* scope) {
  CallArgs out;
  for (const auto& e : args.positional) out.positional.push_back(eval(*e, scope));
  for (const auto& [name, e] : args.keyword) out.keyword.emplace_back(name, eval(*e, scope));
  if (args.star_args) {
    for (Value& v : iterate(eval(*args.star_args, scope))) out.positional.push_back(std::move(v));
  }
  if (args.star_kwargs) {
    Value mapping = eval(*args.star_kwargs, scope);
    if (!mapping.is_dict()) type_error("argument after ** must be a mapping, not {}", type_name(mapping));
    for (const auto& [key, value] : mapping.as_dict().items()) {
      if (!key.is_string()) type_error("keywords must be strings");
      out.keyword.emplace_back(key.as_string(), value);
    }
  }
  return out;
}

Value Renderer::eval_node(const ast::Call& node, Scope* scope) {
  Value callee = eval(*node.callee, scope);
  CallArgs args = eval_arguments(node.args, scope);
  return call(callee, args);
}

Value Renderer::call_with_caller(const ast::Call& node, Value caller, Scope* scope) {
  Value callee = eval(*node.callee, scope);
  CallArgs args = eval_arguments(node.args, scope);
  args.keyword.emplace_back("caller", std::move(caller));
  return call(callee, args);
}

Value Renderer::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) fail_undefined(callee);
  if (callee.is_object() && callee.as_object()->is_callable()) {
    charge(callee);  // a bound method pays for the value it is bound to
    charge(args);
    Value result = callee.as_object()->call(*this, args);
    charge(result);
    return result;
  }
  type_error("'{}' object is not callable", type_name(callee));
}

Value Renderer::eval_node(const ast::Filter& node, Scope* scope) {
  Value operand;
  if (node.operand) {
    operand = eval(*node.operand, scope);
  } else if (filter_block_input_) {
    operand = *filter_block_input_;
  }
  CallArgs args = eval_arguments(node.args, scope);
  return apply_filter(node.name, operand, args);
}

Value Renderer::eval_node(const ast::Test& node, Scope* scope) {
  Value operand = eval(*node.operand, scope);
  CallArgs args = eval_arguments(node.args, scope);
  return Value::boolean(apply_test(node.name, operand, args));
}

Value Renderer::apply_filter(std::string_view name, const Value& operand, CallArgs& args) {
  FilterFunction filter = find_filter(name);
  if (!filter) fail(FailureKind::runtime, "No filter named '{}' found.", name);
  charge(operand);
  charge(args);
  Value result = filter(*this, operand, args);
  charge(result);
  return result;
}

bool Renderer::apply_test(std::string_view name, const Value& operand, CallArgs& args) {
  TestFunction test = find_test(name);
  if (!test) fail(FailureKind::runtime, "No test named '{}' found.", name);
  charge(operand);
  charge(args);
  return test(*this, operand, args);
}

Value Renderer::eval_node(const ast::Unary& node, Scope* scope) {
  Value operand = eval(*node.operand, scope);
  switch (node.op) {
    case ast::UnaryOp::logical_not:
      return Value::boolean(!truthy(operand));
    case ast::UnaryOp::negate:
      return negate(operand);
    case ast::UnaryOp::plus:
      return unary_plus(operand);
  }
  return operand;
}

Value Renderer::eval_node(const ast::Binary& node, Scope* scope) {
  Value left = eval(*node.left, scope);
  if (node.op == ast::BinaryOp::logical_and) return truthy(left) ? eval(*node.right, scope) : left;
  if (node.op == ast::BinaryOp::logical_or) return truthy(left) ? left : eval(*node.right, scope);
  Value right = eval(*node.right, scope);
  Value result = binary_operation(node.op, left, right, options_.limits);
  charge(result);
  return result;
}

Value Renderer::eval_node(const ast::Concat& node, Scope* scope) {
  std::string out;
  for (const auto& part : node.parts) {
    Value value = eval(*part, scope);
    charge(value);
    out += str(value);
    check_string(out.size());
  }
  return Value::string(std::move(out));
}

Value Renderer::eval_node(const ast::Compare& node, Scope* scope) {
  Value left = eval(*node.first, scope);
  for (const auto& [op, expr] : node.rest) {
    Value right = eval(*expr, scope);
    charge(left);
    charge(right);
    if (!compare(op, left, right)) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Renderer::eval_node(const ast::Conditional& node, Scope* scope) {
  if (truthy(eval(*node.test, scope))) return eval(*node.then, scope);
  if (node.otherwise) return eval(*node.otherwise, scope);
  return Value::undefined("the inline if-expression evaluated to false and no else section was defined.");
}

// jinja2's SandboxedEnvironment.getattr: the Python attribute first (if the sandbox allows it),
// then the item of that name, else undefined.
Value Renderer::get_attribute(const Value& object, std::string_view name) {
  // Every Python object (undefined ones too) has double-underscore attributes, and the sandbox
  // refuses them all.
  if (name.size() >= 2 && name.substr(0, 2) == "__") return unsafe_attribute(object, name);
  if (object.is_undefined()) fail_undefined(object);
  if (object.is_object()) return object.as_object()->get_attribute(name);
  bool found = false;
  Value attribute = python_attribute(object, name, found);
  if (found) return attribute;
  if (object.is_dict()) {
    if (const Value* v = object.as_dict().find(name)) return *v;
  }
  return missing_attribute(object, name);
}

// jinja2's SandboxedEnvironment.getitem: the item first, then (for string keys) the attribute.
Value Renderer::get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) fail_undefined(object);
  switch (object.kind()) {
    case Value::Kind::dict:
      if (is_hashable(key)) {
        if (const Value* v = object.as_dict().find(key)) return *v;
      }
      break;
    case Value::Kind::list:
    case Value::Kind::tuple:
      if (key.is_int() || key.is_bool()) {
        int64_t size = int64_t(object.as_list().size()), i = key.as_int();
        if (i < 0) i += size;
        if (i >= 0 && i < size) return object.as_list()[size_t(i)];
      }
      break;
    case Value::Kind::string:
      if (key.is_int() || key.is_bool()) {
        std::u32string text = py::decode_utf8(object.as_string());
        int64_t size = int64_t(text.size()), i = key.as_int();
        if (i < 0) i += size;
        if (i >= 0 && i < size) {
          std::string ch;
          py::append_utf8(ch, text[size_t(i)]);
          return Value::string(std::move(ch), object.is_markup());
        }
      }
      break;
    default:
      break;
  }
  if (key.is_string()) {
    const std::string& name = key.as_string();
    if (name.size() >= 2 && name.substr(0, 2) == "__") return unsafe_attribute(object, name);
    if (object.is_object()) return object.as_object()->get_attribute(name);
    bool found = false;
    Value attribute = python_attribute(object, name, found);
    if (found) return attribute;
    return missing_attribute(object, name);
  }
  std::string key_text = "<value>";
  try {
    key_text = to_repr(key, 4096);
  } catch (const TemplateException&) {
    // An enormous key: the message names it loosely rather than failing the lookup.
  }
  return Value::undefined(fmt::format("{} has no element {}", object_type_repr(object), key_text));
}

}  // namespace kiln::jinja
