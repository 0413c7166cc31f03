// Statement execution, scoping, macros and loops. See renderer.h; expressions are in
// expressions.cpp.
#include "text/jinja/renderer.h"

#include <algorithm>

#include "text/jinja/builtins.h"
#include "text/jinja/json.h"
#include "text/jinja/operators.h"
#include "text/jinja/pystr.h"

namespace kiln::jinja {

// --- Scope ---------------------------------------------------------------------------------------

const Value* Scope::find(std::string_view name) const {
  for (const Scope* scope = this; scope; scope = scope->parent_)
    for (const auto& [key, value] : scope->variables_)
      if (key == name) return &value;
  return nullptr;
}

void Scope::set(std::string_view name, Value value) {
  for (auto& [key, existing] : variables_) {
    if (key == name) {
      existing = std::move(value);
      return;
    }
  }
  variables_.emplace_back(std::string(name), std::move(value));
}

// --- Macro and LoopState -------------------------------------------------------------------------

Value Macro::call(Renderer& renderer, CallArgs& args) {
  return renderer.invoke_macro(*this, args);
}

Value Macro::get_attribute(std::string_view name) {
  if (name == "name") return Value::string(decl->name);
  if (name == "arguments") {
    List names;
    for (const auto& p : decl->params) names.push_back(Value::string(p));
    return Value::tuple(std::move(names));
  }
  if (name == "catch_kwargs") return Value::boolean(decl->uses_kwargs);
  if (name == "catch_varargs") return Value::boolean(decl->uses_varargs);
  if (name == "caller") return Value::boolean(decl->uses_caller);
  return Object::get_attribute(name);
}

std::string LoopState::repr() const {
  return fmt::format("<LoopContext {}/{}>", index0 + 1, items.size());
}

Value LoopState::call(Renderer& renderer, CallArgs& args) {
  if (!recursive_loop) type_error("The loop must have the 'recursive' marker to be called recursively.");
  if (args.positional.size() != 1 || !args.keyword.empty()) type_error("loop() takes exactly one argument");
  return Value::string(renderer.render_loop_recursively(*this, args.positional[0]));
}

Value LoopState::get_attribute(std::string_view name) {
  const int64_t length = int64_t(items.size()), index = int64_t(index0);
  if (name == "index") return Value::integer(index + 1);
  if (name == "index0") return Value::integer(index);
  if (name == "revindex") return Value::integer(length - index);
  if (name == "revindex0") return Value::integer(length - index - 1);
  if (name == "first") return Value::boolean(index == 0);
  if (name == "last") return Value::boolean(index + 1 == length);
  if (name == "length") return Value::integer(length);
  if (name == "depth") return Value::integer(depth0 + 1);
  if (name == "depth0") return Value::integer(depth0);
  if (name == "previtem") return index > 0 ? items[index0 - 1] : Value::undefined("there is no previous item");
  if (name == "nextitem") return index + 1 < length ? items[index0 + 1] : Value::undefined("there is no next item");
  if (name == "cycle") {
    size_t at = index0;
    return Value::object(std::make_shared<Builtin>(
        "cycle",
        [at](Renderer&, CallArgs& args) -> Value {
          if (args.positional.empty()) type_error("no items for cycling given");
          return args.positional[at % args.positional.size()];
        },
        "<bound method LoopContext.cycle>"));
  }
  if (name == "changed") {
    // The bound method must update this loop's state; the loop outlives the call.
    LoopState* self = this;
    return Value::object(std::make_shared<Builtin>(
        "changed",
        [self](Renderer&, CallArgs& args) -> Value {
          List values = args.positional;
          Value current = Value::tuple(values);
          if (self->last_changed && equals(Value::tuple(*self->last_changed), current)) return Value::boolean(false);
          self->last_changed = std::move(values);
          return Value::boolean(true);
        },
        "<bound method LoopContext.changed>"));
  }
  return Object::get_attribute(name);
}

// --- Renderer ------------------------------------------------------------------------------------

Renderer::Renderer(const RenderOptions& options, std::chrono::system_clock::time_point now)
    : options_(options), now_(now) {}

Scope* Renderer::new_scope(const Scope* parent) {
  return &scopes_.emplace_back(parent);
}

Scope* Renderer::new_frame(const Scope* parent, const std::vector<std::string>& unset_names) {
  Scope* scope = new_scope(parent);
  for (const std::string& name : unset_names)
    scope->set(name, Value::undefined(fmt::format("'{}' is undefined", name)));
  return scope;
}

void Renderer::count_step() {
  if (++steps_ > options_.limits.max_steps)
    fail(FailureKind::limit, "template exceeded kiln's limit of {} evaluation steps", options_.limits.max_steps);
}

void Renderer::charge(const Value& value) {
  charge_units(value.weight());
}

void Renderer::charge(const CallArgs& args) {
  uint64_t units = 0;
  for (const Value& v : args.positional) units += v.weight();
  for (const auto& [name, v] : args.keyword) units += v.weight();
  charge_units(units);
}

void Renderer::charge_units(uint64_t units) {
  steps_ += units;
  count_step();
}

void Renderer::check_string(size_t bytes) const {
  if (bytes > options_.limits.max_output_bytes)
    fail(FailureKind::limit, "text of {} bytes exceeds kiln's output limit of {} bytes", bytes,
         options_.limits.max_output_bytes);
}

void Renderer::emit(std::string_view text) {
  out_->text.append(text);
  check_string(out_->text.size());
}

template <typename Body>
std::string Renderer::capture(Body&& body) {
  OutputBuffer buffer;
  OutputBuffer* saved = out_;
  out_ = &buffer;
  struct Restore {
    OutputBuffer*& target;
    OutputBuffer* value;
    ~Restore() { target = value; }
  } restore{out_, saved};
  body();
  if (buffer.join_error) type_error("{}", *buffer.join_error);
  return std::move(buffer.text);
}

std::string Renderer::render(const ast::TemplateBody& body, const Variables& variables) {
  Scope* root = root_ = new_scope(nullptr);
  if (variables.is_object())
    for (const auto& [name, value] : variables.items()) root->set(name, from_json(value));
  for (const std::string& name : body.unset_names)
    root->set(name, Value::undefined(fmt::format("'{}' is undefined", name)));
  struct ClearNamespaces {
    std::vector<std::weak_ptr<Namespace>>& namespaces;
    ~ClearNamespaces() {
      for (auto& weak : namespaces)
        if (auto ns = weak.lock()) ns->clear();
    }
  } clear{namespaces_};
  return capture([&] { exec_body(body.body, root); });
}

std::string Renderer::render_to_string(const ast::Body& body, Scope* scope) {
  return capture([&] { exec_body(body, scope); });
}

Renderer::Flow Renderer::exec_body(const ast::Body& body, Scope* scope) {
  for (const ast::Stmt& stmt : body) {
    Flow flow = exec(stmt, scope);
    if (flow != Flow::normal) return flow;
  }
  return Flow::normal;
}

Renderer::Flow Renderer::exec(const ast::Stmt& stmt, Scope* scope) {
  count_step();
  current_line_ = stmt.line;
  return std::visit([&](const auto& node) { return run(node, scope); }, stmt.node);
}

Renderer::Flow Renderer::run(const ast::Output& node, Scope*) {
  emit(node.text);
  return Flow::normal;
}

Renderer::Flow Renderer::run(const ast::Print& node, Scope* scope) {
  if (node.constant_text) {
    emit(*node.constant_text);
    return Flow::normal;
  }
  Value value = eval(*node.expr, scope);
  charge(value);
  emit(str(value));
  return Flow::normal;
}

Renderer::Flow Renderer::run(const ast::If& node, Scope* scope) {
  for (const auto& [test, body] : node.branches)
    if (truthy(eval(*test, scope))) return exec_body(body, scope);
  return exec_body(node.otherwise, scope);
}

Renderer::Flow Renderer::run(const ast::For& node, Scope* scope) {
  Value iterable = eval(*node.iterable, scope);
  return render_for(node, scope, iterable, 0);
}

Renderer::Flow Renderer::render_for(const ast::For& node, Scope* scope, const Value& iterable, int depth0) {
  charge(iterable);
  List items = iterate(iterable);
  if (node.filter) {
    List kept;
    for (Value& item : items) {
      count_step();
      Scope* test_scope = new_scope(scope);
      assign(node.target, item, test_scope);
      if (truthy(eval(*node.filter, test_scope))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) return exec_body(node.otherwise, new_frame(scope, node.otherwise_unset_names));
  auto loop = std::make_shared<LoopState>();
  loop->items = std::move(items);
  loop->depth0 = depth0;
  loop->recursive_loop = node.recursive ? &node : nullptr;
  loop->loop_scope = scope;
  Value loop_value = Value::object(loop);
  for (size_t i = 0; i < loop->items.size(); ++i) {
    count_step();
    loop->index0 = i;
    Scope* iteration = new_frame(scope, node.unset_names);
    assign(node.target, loop->items[i], iteration);
    iteration->set("loop", loop_value);
    if (exec_body(node.body, iteration) == Flow::break_loop) break;
  }
  return Flow::normal;
}

std::string Renderer::render_loop_recursively(LoopState& loop, const Value& iterable) {
  if (++call_depth_ > options_.limits.max_call_depth)
    fail(FailureKind::limit, "recursion deeper than kiln's limit of {} calls", options_.limits.max_call_depth);
  struct Depth {
    int& depth;
    ~Depth() { --depth; }
  } depth{call_depth_};
  return capture([&] { render_for(*loop.recursive_loop, loop.loop_scope, iterable, loop.depth0 + 1); });
}

void Renderer::assign(const ast::Target& target, const Value& value, Scope* scope) {
  switch (target.kind) {
    case ast::Target::Kind::name:
      scope->set(target.name, value);
      return;
    case ast::Target::Kind::tuple: {
      if (!value.is_string() && !value.is_sequence() && !value.is_dict() && !value.is_undefined() &&
          !value.object_as<Iterator>() && !value.object_as<DictView>())
        type_error("cannot unpack non-iterable {} object", type_name(value));
      charge(value);
      List items = iterate(value);
      size_t expected = target.items.size();
      if (items.size() > expected) fail(FailureKind::runtime, "too many values to unpack (expected {})", expected);
      if (items.size() < expected)
        fail(FailureKind::runtime, "not enough values to unpack (expected {}, got {})", expected, items.size());
      for (size_t i = 0; i < expected; ++i) assign(target.items[i], items[i], scope);
      return;
    }
    case ast::Target::Kind::namespace_attribute: {
      const Value* ns_value = scope->find(target.name);
      Namespace* ns = ns_value ? ns_value->object_as<Namespace>() : nullptr;
      if (!ns) fail(FailureKind::runtime, "cannot assign attribute on non-namespace object");
      ns->set_attribute(target.attribute, value);
      return;
    }
  }
}

Renderer::Flow Renderer::run(const ast::Set& node, Scope* scope) {
  assign(node.target, eval(*node.value, scope), scope);
  return Flow::normal;
}

Renderer::Flow Renderer::run(const ast::SetBlock& node, Scope* scope) {
  Value text = Value::string(render_to_string(node.body, new_frame(scope, node.unset_names)));
  if (node.filter) {
    const Value* saved = filter_block_input_;
    filter_block_input_ = &text;
    Value filtered = eval(*node.filter, scope);
    filter_block_input_ = saved;
    assign(node.target, filtered, scope);
  } else {
    assign(node.target, text, scope);
  }
  return Flow::normal;
}

Renderer::Flow Renderer::run(const ast::MacroDef& node, Scope* scope) {
  scope->set(node.macro->name, Value::object(std::make_shared<Macro>(node.macro.get(), scope)));
  return Flow::normal;
}

// jinja2 yields what a call block or filter block produces straight into the output, which
// Python's str.join then rejects unless it is a string.
void Renderer::emit_block_result(const Value& result) {
  if (result.is_string()) return emit(result.as_string());
  if (!out_->join_error)
    out_->join_error = fmt::format("sequence item 0: expected str instance, {} found", type_name(result));
}

Renderer::Flow Renderer::run(const ast::CallBlock& node, Scope* scope) {
  Value caller = Value::object(std::make_shared<Macro>(node.caller.get(), scope));
  const auto& call = std::get<ast::Call>(node.call->node);
  emit_block_result(call_with_caller(call, std::move(caller), scope));
  return Flow::normal;
}

Renderer::Flow Renderer::run(const ast::FilterBlock& node, Scope* scope) {
  Value text = Value::string(render_to_string(node.body, new_frame(scope, node.unset_names)));
  const Value* saved = filter_block_input_;
  filter_block_input_ = &text;
  Value filtered = eval(*node.filter, scope);
  filter_block_input_ = saved;
  emit_block_result(filtered);
  return Flow::normal;
}

Renderer::Flow Renderer::run(const ast::With& node, Scope* scope) {
  Scope* inner = new_frame(scope, node.unset_names);
  for (size_t i = 0; i < node.targets.size(); ++i) assign(node.targets[i], eval(*node.values[i], scope), inner);
  return exec_body(node.body, inner);
}

Renderer::Flow Renderer::run(const ast::Break&, Scope*) {
  return Flow::break_loop;
}
Renderer::Flow Renderer::run(const ast::Continue&, Scope*) {
  return Flow::continue_loop;
}

Renderer::Flow Renderer::run(const ast::Generation& node, Scope* scope) {
  // transformers' AssistantTracker returns caller(): the body rendered as a macro of no arguments.
  Macro caller(node.caller.get(), scope);
  CallArgs no_arguments;
  emit(str(invoke_macro(caller, no_arguments)));
  return Flow::normal;
}

Renderer::Flow Renderer::run(const ast::Block& node, Scope* scope) {
  // A block renders with the template's variables, not the local ones, unless it is `scoped`.
  if (node.required) fail(FailureKind::runtime, "Required block '{}' not found.", node.name);
  // A block is a generator that yields into the template's own output.
  exec_body(node.body, new_frame(node.scoped ? scope : root_, node.unset_names));
  return Flow::normal;
}

Renderer::Flow Renderer::run(const ast::NeedsLoader& node, Scope* scope) {
  eval(*node.template_name, scope);
  fail(FailureKind::runtime, "no loader for this environment specified");
}

Value Renderer::invoke_macro(Macro& macro, CallArgs& args) {
  const ast::MacroDecl& decl = *macro.decl;
  if (++call_depth_ > options_.limits.max_call_depth)
    fail(FailureKind::limit, "macro calls nested deeper than kiln's limit of {}", options_.limits.max_call_depth);
  struct Depth {
    int& depth;
    ~Depth() { --depth; }
  } depth{call_depth_};

  // Argument binding as jinja2's runtime.Macro.__call__ does it.
  const size_t n = decl.params.size();
  std::vector<std::optional<Value>> values(n);
  const size_t given = std::min(n, args.positional.size());
  for (size_t i = 0; i < given; ++i) values[i] = args.positional[i];
  auto kwargs = args.keyword;
  auto take_keyword = [&](std::string_view name) -> std::optional<Value> {
    for (auto it = kwargs.begin(); it != kwargs.end(); ++it) {
      if (it->first == name) {
        Value v = std::move(it->second);
        kwargs.erase(it);
        return v;
      }
    }
    return std::nullopt;
  };
  bool found_caller = false;
  if (given != n) {
    for (size_t i = given; i < n; ++i) {
      values[i] = take_keyword(decl.params[i]);
      if (decl.params[i] == "caller") found_caller = true;
    }
  } else {
    found_caller = std::find(decl.params.begin(), decl.params.end(), "caller") != decl.params.end();
  }
  std::optional<Value> caller;
  if (decl.uses_caller && !found_caller) {
    caller = take_keyword("caller");
    if (!caller) caller = Value::undefined("No caller defined");
  }
  Dict extra_kwargs;
  if (decl.uses_kwargs) {
    for (auto& [name, value] : kwargs) extra_kwargs.set(Value::string(name), std::move(value));
  } else if (!kwargs.empty()) {
    for (const auto& [name, value] : kwargs)
      if (name == "caller")
        type_error("macro '{}' was invoked with two values for the special caller argument. This is most likely a bug.",
                   decl.name);
    type_error("macro '{}' takes no keyword argument '{}'", decl.name, kwargs.front().first);
  }
  Value varargs;
  if (decl.uses_varargs) {
    varargs = Value::tuple(List(args.positional.begin() + static_cast<std::ptrdiff_t>(given), args.positional.end()));
  } else if (args.positional.size() > n) {
    type_error("macro '{}' takes not more than {} argument(s)", decl.name, n);
  }

  Scope* scope = new_frame(macro.closure, decl.unset_names);
  const size_t first_default = n - decl.defaults.size();
  for (size_t i = 0; i < n; ++i) {
    if (values[i]) {
      scope->set(decl.params[i], std::move(*values[i]));
    } else if (i >= first_default) {
      scope->set(decl.params[i], eval(*decl.defaults[i - first_default], scope));
    } else {
      scope->set(decl.params[i], Value::undefined(fmt::format("parameter '{}' was not provided", decl.params[i])));
    }
  }
  if (caller) scope->set("caller", std::move(*caller));
  if (decl.uses_kwargs) scope->set("kwargs", Value::dict(std::move(extra_kwargs)));
  if (decl.uses_varargs) scope->set("varargs", std::move(varargs));
  return Value::string(render_to_string(decl.body, scope));
}

}  // namespace kiln::jinja
