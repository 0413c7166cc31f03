// The errors jinja2 raises while compiling a parsed template to Python rather than while parsing
// it: an unknown filter or test (unless inside an {% if %} or a conditional expression, where jinja2
// defers the error to when it is used), break/continue outside a loop, and keyword arguments given
// twice (Python's "keyword argument repeated"). The walk follows jinja2's frames: bodies that
// compile to functions (macros, call blocks, blocks) or inner frames reset the "soft" state.
#include <algorithm>

#include "text/jinja/builtins.h"
#include "text/jinja/parser_impl.h"

namespace kiln::jinja::parsing {

namespace {

class CompileChecker {
 public:
  void body(const Body& statements, bool soft, bool in_loop) {
    for (const Stmt& s : statements) std::visit([&](const auto& n) { stmt(n, s.line, soft, in_loop); }, s.node);
  }

 private:
  [[noreturn]] static void fail(const std::string& message, int line) {
    throw TemplateException(FailureKind::syntax, message, line);
  }

  void expr(const ExprPtr& e, bool soft) {
    if (e) std::visit([&](const auto& n) { visit(n, e->line, soft); }, e->node);
  }

  void arguments(const Arguments& args, int line, bool soft) {
    for (const auto& e : args.positional) expr(e, soft);
    for (const auto& [name, e] : args.keyword) expr(e, soft);
    expr(args.star_args, soft);
    expr(args.star_kwargs, soft);
    // jinja2 writes keyword arguments into a Python call, unless one is a Python keyword: then it
    // passes them as a **{...} dict, where a repeated key is simply overwritten.
    bool as_dict = std::any_of(args.keyword.begin(), args.keyword.end(),
                               [](const auto& kw) { return is_python_keyword(kw.first); });
    if (as_dict) return;
    for (size_t i = 0; i < args.keyword.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        if (args.keyword[i].first == args.keyword[j].first)
          fail(fmt::format("keyword argument repeated: {}", args.keyword[i].first), line);
  }

  void visit(const Literal&, int, bool) {}
  void visit(const Name&, int, bool) {}
  void visit(const ListLiteral& n, int, bool soft) {
    for (const auto& e : n.items) expr(e, soft);
  }
  void visit(const TupleLiteral& n, int, bool soft) {
    for (const auto& e : n.items) expr(e, soft);
  }
  void visit(const DictLiteral& n, int, bool soft) {
    for (const auto& [k, v] : n.items) expr(k, soft), expr(v, soft);
  }
  void visit(const GetAttr& n, int, bool soft) { expr(n.object, soft); }
  void visit(const GetItem& n, int, bool soft) { expr(n.object, soft), expr(n.key, soft); }
  void visit(const Slice& n, int, bool soft) { expr(n.start, soft), expr(n.stop, soft), expr(n.step, soft); }
  void visit(const Call& n, int line, bool soft) { expr(n.callee, soft), arguments(n.args, line, soft); }
  void visit(const Filter& n, int line, bool soft) {
    if (!soft && !find_filter(n.name)) fail(fmt::format("No filter named '{}'.", n.name), line);
    expr(n.operand, soft);
    arguments(n.args, line, soft);
  }
  void visit(const Test& n, int line, bool soft) {
    if (!soft && !find_test(n.name)) fail(fmt::format("No test named '{}'.", n.name), line);
    expr(n.operand, soft);
    arguments(n.args, line, soft);
  }
  void visit(const Unary& n, int, bool soft) { expr(n.operand, soft); }
  void visit(const Binary& n, int, bool soft) { expr(n.left, soft), expr(n.right, soft); }
  void visit(const Concat& n, int, bool soft) {
    for (const auto& e : n.parts) expr(e, soft);
  }
  void visit(const Compare& n, int, bool soft) {
    expr(n.first, soft);
    for (const auto& [op, e] : n.rest) expr(e, soft);
  }
  void visit(const Conditional& n, int, bool) { expr(n.then, true), expr(n.test, true), expr(n.otherwise, true); }

  // A macro (or a call block's caller) compiles to a Python function: a fresh frame, outside loops.
  void macro(const MacroDecl& m) {
    for (const auto& d : m.defaults) expr(d, false);
    body(m.body, false, false);
  }

  void stmt(const Output&, int, bool, bool) {}
  void stmt(const Print& n, int, bool soft, bool) { expr(n.expr, soft); }
  void stmt(const If& n, int, bool, bool in_loop) {
    for (const auto& [test, b] : n.branches) expr(test, true), body(b, true, in_loop);
    body(n.otherwise, true, in_loop);
  }
  // jinja2 refuses any assignment to a name `loop` anywhere inside a for loop.
  static void check_loop_stores(const Target& t) {
    if (t.kind == Target::Kind::name && t.name == "loop")
      fail("Can't assign to special loop variable in for-loop target", t.line);
    for (const Target& item : t.items) check_loop_stores(item);
  }
  static void check_loop_stores(const Body& statements) {
    for (const Stmt& s : statements) {
      if (auto* n = std::get_if<For>(&s.node)) {
        check_loop_stores(n->target), check_loop_stores(n->body), check_loop_stores(n->otherwise);
      } else if (auto* n = std::get_if<Set>(&s.node)) {
        check_loop_stores(n->target);
      } else if (auto* n = std::get_if<SetBlock>(&s.node)) {
        check_loop_stores(n->target), check_loop_stores(n->body);
      } else if (auto* n = std::get_if<If>(&s.node)) {
        for (const auto& [test, b] : n->branches) check_loop_stores(b);
        check_loop_stores(n->otherwise);
      } else if (auto* n = std::get_if<MacroDef>(&s.node)) {
        check_loop_stores(n->macro->body);
      } else if (auto* n = std::get_if<CallBlock>(&s.node)) {
        check_loop_stores(n->caller->body);
      } else if (auto* n = std::get_if<FilterBlock>(&s.node)) {
        check_loop_stores(n->body);
      } else if (auto* n = std::get_if<With>(&s.node)) {
        check_loop_stores(n->body);
      } else if (auto* n = std::get_if<Generation>(&s.node)) {
        check_loop_stores(n->caller->body);
      } else if (auto* n = std::get_if<Block>(&s.node)) {
        check_loop_stores(n->body);
      }
    }
  }

  void stmt(const For& n, int, bool soft, bool in_loop) {
    check_loop_stores(n.target);
    check_loop_stores(n.body);
    check_loop_stores(n.otherwise);
    expr(n.iterable, soft);
    expr(n.filter, false);
    body(n.body, false, true);
    body(n.otherwise, soft, in_loop);
  }
  void stmt(const Set& n, int, bool soft, bool) { expr(n.value, soft); }
  void stmt(const SetBlock& n, int, bool, bool in_loop) {
    body(n.body, false, in_loop);
    expr(n.filter, false);
  }
  void stmt(const MacroDef& n, int, bool, bool) { macro(*n.macro); }
  void stmt(const CallBlock& n, int, bool soft, bool) {
    expr(n.call, soft);
    macro(*n.caller);
  }
  void stmt(const FilterBlock& n, int, bool, bool in_loop) {
    body(n.body, false, in_loop);
    expr(n.filter, false);
  }
  void stmt(const With& n, int, bool soft, bool in_loop) {
    for (const auto& v : n.values) expr(v, soft);
    body(n.body, false, in_loop);
  }
  void stmt(const Break&, int line, bool, bool in_loop) {
    if (!in_loop) fail("'break' outside loop", line);
  }
  void stmt(const Continue&, int line, bool, bool in_loop) {
    if (!in_loop) fail("'continue' not properly in loop", line);
  }
  void stmt(const Generation& n, int, bool, bool) { macro(*n.caller); }
  void stmt(const Block& n, int, bool, bool) { body(n.body, false, false); }
  void stmt(const NeedsLoader& n, int, bool soft, bool) { expr(n.template_name, soft); }
};

}  // namespace

void check_compiles(const TemplateBody& body) {
  CompileChecker().body(body.body, false, false);
}

}  // namespace kiln::jinja::parsing
