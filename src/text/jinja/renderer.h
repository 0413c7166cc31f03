// Executes a parsed template: statements, expressions, scopes, macros and loops with jinja2's
// semantics. Scoping follows what jinja2's compiled code does: every loop iteration, macro call,
// {% with %}, {% filter %} and block-{% set %} body gets a fresh scope whose assignments do not
// leak out; {% if %} bodies assign into the enclosing scope; macros see the scope they were
// defined in (by reference, so later top-level assignments are visible).
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/jinja.h"
#include "text/jinja/value.h"

namespace kiln::jinja {

// A variable scope. Scopes live in the renderer's arena for the whole render, so that macros can
// refer to the scope they were defined in without reference cycles.
class Scope {
 public:
  explicit Scope(const Scope* parent) : parent_(parent) {}
  const Value* find(std::string_view name) const;
  void set(std::string_view name, Value value);

 private:
  const Scope* parent_;
  std::vector<std::pair<std::string, Value>> variables_;
};

// A macro (or the `caller` of a call block) bound to the scope it was defined in.
class Macro : public Object {
 public:
  Macro(const ast::MacroDecl* decl, Scope* closure) : decl(decl), closure(closure) {}
  std::string type_name() const override { return "Macro"; }
  std::string repr() const override { return "<Macro '" + decl->name + "'>"; }
  bool is_callable() const override { return true; }
  Value call(Renderer& renderer, CallArgs& args) override;
  Value get_attribute(std::string_view name) override;

  const ast::MacroDecl* decl;
  Scope* closure;
};

// jinja2's LoopContext: the `loop` variable.
class LoopState : public Object {
 public:
  std::string type_name() const override { return "LoopContext"; }
  std::string repr() const override;
  bool is_callable() const override { return true; }  // loop(children) in recursive loops
  Value call(Renderer& renderer, CallArgs& args) override;
  Value get_attribute(std::string_view name) override;

  List items;
  size_t index0 = 0;
  int depth0 = 0;
  const ast::For* recursive_loop = nullptr;  // set for `recursive` loops
  Scope* loop_scope = nullptr;               // where the for statement runs, for recursion
  std::optional<List> last_changed;
};

class Renderer {
 public:
  Renderer(const RenderOptions& options, std::chrono::system_clock::time_point now);

  std::string render(const ast::TemplateBody& body, const Variables& variables);
  int line() const { return current_line_; }

  // --- services for filters, methods and callables -----------------------------------------------
  Value call(const Value& callee, CallArgs& args);
  Value invoke_macro(Macro& macro, CallArgs& args);
  std::string render_loop_recursively(LoopState& loop, const Value& iterable);
  Value get_attribute(const Value& object, std::string_view name);  // jinja2's sandboxed getattr
  Value get_item(const Value& object, const Value& key);            // jinja2's sandboxed getitem
  Value apply_filter(std::string_view name, const Value& operand, CallArgs& args);
  bool apply_test(std::string_view name, const Value& operand, CallArgs& args);
  // namespace() objects are the only values that can hold themselves; the renderer clears them at
  // the end so that no reference cycle outlives the render.
  void track(const std::shared_ptr<Namespace>& ns) { namespaces_.push_back(ns); }
  const RenderLimits& limits() const { return options_.limits; }
  std::chrono::system_clock::time_point now() const { return now_; }
  void count_step();
  // Counts work proportional to a value's size (builtins that walk or build big values).
  void charge(const Value& value);
  void charge(const CallArgs& args);
  void charge_units(uint64_t units);
  void check_string(size_t bytes) const;
  // str(value), bounded by the output limit.
  std::string str(const Value& value) const { return to_str(value, options_.limits.max_output_bytes); }

 private:
  enum class Flow { normal, break_loop, continue_loop };

  Scope* new_scope(const Scope* parent);
  // A frame's scope, with the names it assigns before reading them starting out undefined.
  Scope* new_frame(const Scope* parent, const std::vector<std::string>& unset_names);
  void emit(std::string_view text);
  void emit_block_result(const Value& result);

  Flow exec_body(const ast::Body& body, Scope* scope);
  Flow exec(const ast::Stmt& stmt, Scope* scope);
  Flow run(const ast::Output& node, Scope* scope);
  Flow run(const ast::Print& node, Scope* scope);
  Flow run(const ast::If& node, Scope* scope);
  Flow run(const ast::For& node, Scope* scope);
  Flow run(const ast::Set& node, Scope* scope);
  Flow run(const ast::SetBlock& node, Scope* scope);
  Flow run(const ast::MacroDef& node, Scope* scope);
  Flow run(const ast::CallBlock& node, Scope* scope);
  Flow run(const ast::FilterBlock& node, Scope* scope);
  Flow run(const ast::With& node, Scope* scope);
  Flow run(const ast::Break& node, Scope* scope);
  Flow run(const ast::Continue& node, Scope* scope);
  Flow run(const ast::Generation& node, Scope* scope);
  Flow run(const ast::Block& node, Scope* scope);
  Flow run(const ast::NeedsLoader& node, Scope* scope);

  Flow render_for(const ast::For& node, Scope* scope, const Value& iterable, int depth0);
  std::string render_to_string(const ast::Body& body, Scope* scope);
  void assign(const ast::Target& target, const Value& value, Scope* scope);

  Value eval(const ast::Expr& expr, Scope* scope);
  Value eval_node(const ast::Literal& node, Scope* scope);
  Value eval_node(const ast::Name& node, Scope* scope);
  Value eval_node(const ast::ListLiteral& node, Scope* scope);
  Value eval_node(const ast::TupleLiteral& node, Scope* scope);
  Value eval_node(const ast::DictLiteral& node, Scope* scope);
  Value eval_node(const ast::GetAttr& node, Scope* scope);
  Value eval_node(const ast::GetItem& node, Scope* scope);
  Value eval_node(const ast::Slice& node, Scope* scope);
  Value eval_node(const ast::Call& node, Scope* scope);
  Value eval_node(const ast::Filter& node, Scope* scope);
  Value eval_node(const ast::Test& node, Scope* scope);
  Value eval_node(const ast::Unary& node, Scope* scope);
  Value eval_node(const ast::Binary& node, Scope* scope);
  Value eval_node(const ast::Concat& node, Scope* scope);
  Value eval_node(const ast::Compare& node, Scope* scope);
  Value eval_node(const ast::Conditional& node, Scope* scope);
  CallArgs eval_arguments(const ast::Arguments& args, Scope* scope);
  Value call_with_caller(const ast::Call& call, Value caller, Scope* scope);

  const RenderOptions& options_;
  std::chrono::system_clock::time_point now_;
  std::deque<Scope> scopes_;
  Scope* root_ = nullptr;  // the template's top-level scope
  std::vector<std::weak_ptr<Namespace>> namespaces_;
  // Where output goes: the template's, or a macro's or block's buffer. Python joins each buffer
  // with str.join when it is complete, so a non-string that a call or filter block yields into it
  // fails only then, after everything before the end of the buffer has run.
  struct OutputBuffer {
    std::string text;
    std::optional<std::string> join_error;
  };
  OutputBuffer* out_ = nullptr;
  // Runs `body` into a fresh buffer and returns the joined text.
  template <typename Body>
  std::string capture(Body&& body);
  const Value* filter_block_input_ = nullptr;  // the body text a {% filter %} / {% set | f %} applies to
  int current_line_ = 0;
  int call_depth_ = 0;
  uint64_t steps_ = 0;
};

}  // namespace kiln::jinja
