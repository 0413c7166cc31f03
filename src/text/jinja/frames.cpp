// jinja2's variable frames (its idtracking.py). Every loop body, macro, call-block caller, block
// set, filter block, with block and block is a frame with its own variables. A frame that assigns a
// name before any read of it in that frame (outside an {% if %}), while no enclosing frame refers to
// the name, starts that variable out *undefined*: until the assignment runs, a macro or nested
// block that reads the name sees undefined rather than the template variable of the same name.
// Every other read falls through to the enclosing frames, which is what kiln's scopes do anyway, so
// only those "unset" names need recording.
#include <functional>
#include <set>

#include "text/jinja/parser_impl.h"

namespace kiln::jinja::parsing {

namespace {

using Names = std::set<std::string>;

class FrameAnalyzer {
 public:
  // Analyzes a frame (its own statements), then the frames nested in it; returns its unset names.
  // `defaults` are a macro's default values, which read names inside the macro's frame.
  std::vector<std::string> frame(Body& body, const Names& enclosing, const std::vector<std::string>& parameters,
                                 const std::vector<ExprPtr>* defaults = nullptr) {
    Frame f{enclosing, {}, {}, {}};
    for (const std::string& p : parameters) f.refs.insert(p);
    if (defaults)
      for (const auto& d : *defaults) expr(f, d);
    for (Stmt& s : body) statement(f, s, false);
    Names visible = enclosing;
    visible.insert(f.refs.begin(), f.refs.end());
    for (auto& analyze_nested : f.nested) analyze_nested(visible);
    return f.unset;
  }

 private:
  struct Frame {
    const Names& enclosing;
    Names refs;
    std::vector<std::string> unset;
    std::vector<std::function<void(const Names&)>> nested;
  };

  static void load(Frame& f, const std::string& name) { f.refs.insert(name); }

  static void store(Frame& f, const Target& t, bool in_branch) {
    if (t.kind == Target::Kind::namespace_attribute) return load(f, t.name);  // {% set ns.x %} reads ns
    if (t.kind == Target::Kind::tuple) {
      for (const Target& item : t.items) store(f, item, in_branch);
      return;
    }
    if (f.refs.count(t.name)) return;
    f.refs.insert(t.name);
    // Inside an if, jinja2 resolves the variable from outside at the frame's start instead.
    if (!in_branch && !f.enclosing.count(t.name)) f.unset.push_back(t.name);
  }

  void expr(Frame& f, const ExprPtr& e) {
    if (!e) return;
    std::visit([&](const auto& n) { visit(f, n); }, e->node);
  }
  void arguments(Frame& f, const Arguments& a) {
    for (const auto& e : a.positional) expr(f, e);
    for (const auto& [k, e] : a.keyword) expr(f, e);
    expr(f, a.star_args);
    expr(f, a.star_kwargs);
  }
  void visit(Frame&, const Literal&) {}
  void visit(Frame& f, const Name& n) { load(f, n.name); }
  void visit(Frame& f, const ListLiteral& n) {
    for (const auto& e : n.items) expr(f, e);
  }
  void visit(Frame& f, const TupleLiteral& n) {
    for (const auto& e : n.items) expr(f, e);
  }
  void visit(Frame& f, const DictLiteral& n) {
    for (const auto& [k, v] : n.items) expr(f, k), expr(f, v);
  }
  void visit(Frame& f, const GetAttr& n) { expr(f, n.object); }
  void visit(Frame& f, const GetItem& n) { expr(f, n.object), expr(f, n.key); }
  void visit(Frame& f, const Slice& n) { expr(f, n.start), expr(f, n.stop), expr(f, n.step); }
  void visit(Frame& f, const Call& n) { expr(f, n.callee), arguments(f, n.args); }
  void visit(Frame& f, const Filter& n) { expr(f, n.operand), arguments(f, n.args); }
  void visit(Frame& f, const Test& n) { expr(f, n.operand), arguments(f, n.args); }
  void visit(Frame& f, const Unary& n) { expr(f, n.operand); }
  void visit(Frame& f, const Binary& n) { expr(f, n.left), expr(f, n.right); }
  void visit(Frame& f, const Concat& n) {
    for (const auto& e : n.parts) expr(f, e);
  }
  void visit(Frame& f, const Compare& n) {
    expr(f, n.first);
    for (const auto& [op, e] : n.rest) expr(f, e);
  }
  void visit(Frame& f, const Conditional& n) { expr(f, n.then), expr(f, n.test), expr(f, n.otherwise); }

  static std::vector<std::string> target_names(const Target& t) {
    std::vector<std::string> names;
    if (t.kind == Target::Kind::name) names.push_back(t.name);
    for (const Target& item : t.items) {
      auto more = target_names(item);
      names.insert(names.end(), more.begin(), more.end());
    }
    return names;
  }

  void macro(Frame& f, MacroDecl& m) {
    f.nested.push_back([this, &m](const Names& visible) {
      std::vector<std::string> params = m.params;
      params.insert(params.end(), {"caller", "varargs", "kwargs"});
      m.unset_names = frame(m.body, visible, params, &m.defaults);
    });
  }

  void nested_body(Frame& f, Body& body, std::vector<std::string>& unset, std::vector<std::string> params = {}) {
    f.nested.push_back([this, &body, &unset, params](const Names& visible) { unset = frame(body, visible, params); });
  }

  void statement(Frame& f, Stmt& s, bool in_branch) {
    std::visit([&](auto& n) { run(f, n, in_branch); }, s.node);
  }
  void statements(Frame& f, Body& body, bool in_branch) {
    for (Stmt& s : body) statement(f, s, in_branch);
  }

  void run(Frame&, Output&, bool) {}
  void run(Frame& f, Print& n, bool) { expr(f, n.expr); }
  void run(Frame& f, If& n, bool) {
    for (auto& [test, body] : n.branches) expr(f, test), statements(f, body, true);
    statements(f, n.otherwise, true);
  }
  void run(Frame& f, For& n, bool) {
    expr(f, n.iterable);
    std::vector<std::string> params = target_names(n.target);
    params.push_back("loop");
    nested_body(f, n.body, n.unset_names, params);
    nested_body(f, n.otherwise, n.otherwise_unset_names);
  }
  void run(Frame& f, Set& n, bool in_branch) {
    expr(f, n.value);
    store(f, n.target, in_branch);
  }
  void run(Frame& f, SetBlock& n, bool in_branch) {
    store(f, n.target, in_branch);
    nested_body(f, n.body, n.unset_names);
  }
  void run(Frame& f, MacroDef& n, bool in_branch) {
    Target name;
    name.name = n.macro->name;
    store(f, name, in_branch);
    macro(f, *n.macro);
  }
  void run(Frame& f, CallBlock& n, bool) {
    expr(f, n.call);
    macro(f, *n.caller);
  }
  void run(Frame& f, FilterBlock& n, bool) {
    expr(f, n.filter);
    nested_body(f, n.body, n.unset_names);
  }
  void run(Frame& f, With& n, bool) {
    for (const auto& v : n.values) expr(f, v);
    std::vector<std::string> params;
    for (const Target& t : n.targets) {
      auto names = target_names(t);
      params.insert(params.end(), names.begin(), names.end());
    }
    nested_body(f, n.body, n.unset_names, params);
  }
  void run(Frame&, Break&, bool) {}
  void run(Frame&, Continue&, bool) {}
  void run(Frame& f, Generation& n, bool) { macro(f, *n.caller); }
  void run(Frame& f, Block& n, bool) {
    // A block is its own function reading the template's variables, not the enclosing frames.
    f.nested.push_back([this, &n](const Names&) { n.unset_names = frame(n.body, Names(), {}); });
  }
  void run(Frame& f, NeedsLoader& n, bool) { expr(f, n.template_name); }
};

}  // namespace

void analyze_frames(TemplateBody& body) {
  body.unset_names = FrameAnalyzer().frame(body.body, Names(), {});
}

}  // namespace kiln::jinja::parsing
