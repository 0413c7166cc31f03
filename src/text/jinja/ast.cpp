// Walks over the syntax tree that the parser needs: the height of an expression (bounded so that
// evaluation cannot exhaust the stack) and whether a macro mentions a name.
#include <algorithm>

#include "text/jinja/ast.h"

namespace kiln::jinja::ast {

namespace {

int depth_of(const ExprPtr& e) {
  return e ? e->depth : 0;
}

int depth_of(const Arguments& args) {
  int d = std::max(depth_of(args.star_args), depth_of(args.star_kwargs));
  for (const auto& a : args.positional) d = std::max(d, depth_of(a));
  for (const auto& [name, a] : args.keyword) d = std::max(d, depth_of(a));
  return d;
}

// Height of the children of a node, so that every Expr knows its own height.
struct ChildDepth {
  int operator()(const Literal&) const { return 0; }
  int operator()(const Name&) const { return 0; }
  int operator()(const ListLiteral& n) const { return of(n.items); }
  int operator()(const TupleLiteral& n) const { return of(n.items); }
  int operator()(const DictLiteral& n) const {
    int d = 0;
    for (const auto& [k, v] : n.items) d = std::max({d, depth_of(k), depth_of(v)});
    return d;
  }
  int operator()(const GetAttr& n) const { return depth_of(n.object); }
  int operator()(const GetItem& n) const { return std::max(depth_of(n.object), depth_of(n.key)); }
  int operator()(const Slice& n) const { return std::max({depth_of(n.start), depth_of(n.stop), depth_of(n.step)}); }
  int operator()(const Call& n) const { return std::max(depth_of(n.callee), depth_of(n.args)); }
  int operator()(const Filter& n) const { return std::max(depth_of(n.operand), depth_of(n.args)); }
  int operator()(const Test& n) const { return std::max(depth_of(n.operand), depth_of(n.args)); }
  int operator()(const Unary& n) const { return depth_of(n.operand); }
  int operator()(const Binary& n) const { return std::max(depth_of(n.left), depth_of(n.right)); }
  int operator()(const Concat& n) const { return of(n.parts); }
  int operator()(const Compare& n) const {
    int d = depth_of(n.first);
    for (const auto& [op, e] : n.rest) d = std::max(d, depth_of(e));
    return d;
  }
  int operator()(const Conditional& n) const {
    return std::max({depth_of(n.test), depth_of(n.then), depth_of(n.otherwise)});
  }
  static int of(const std::vector<ExprPtr>& items) {
    int d = 0;
    for (const auto& e : items) d = std::max(d, depth_of(e));
    return d;
  }
};

// Whether a body mentions `name` (for the special macro variables caller/varargs/kwargs).
struct NameFinder {
  std::string_view name;
  bool found = false;

  void expr(const ExprPtr& e) {
    if (!e || found) return;
    std::visit([this](const auto& n) { visit(n); }, e->node);
  }
  void args(const Arguments& a) {
    for (const auto& e : a.positional) expr(e);
    for (const auto& [k, e] : a.keyword) expr(e);
    expr(a.star_args);
    expr(a.star_kwargs);
  }
  void visit(const Literal&) {}
  void visit(const Name& n) { found = found || n.name == name; }
  void visit(const ListLiteral& n) {
    for (const auto& e : n.items) expr(e);
  }
  void visit(const TupleLiteral& n) {
    for (const auto& e : n.items) expr(e);
  }
  void visit(const DictLiteral& n) {
    for (const auto& [k, v] : n.items) expr(k), expr(v);
  }
  void visit(const GetAttr& n) { expr(n.object); }
  void visit(const GetItem& n) { expr(n.object), expr(n.key); }
  void visit(const Slice& n) { expr(n.start), expr(n.stop), expr(n.step); }
  void visit(const Call& n) { expr(n.callee), args(n.args); }
  void visit(const Filter& n) { expr(n.operand), args(n.args); }
  void visit(const Test& n) { expr(n.operand), args(n.args); }
  void visit(const Unary& n) { expr(n.operand); }
  void visit(const Binary& n) { expr(n.left), expr(n.right); }
  void visit(const Concat& n) {
    for (const auto& e : n.parts) expr(e);
  }
  void visit(const Compare& n) {
    expr(n.first);
    for (const auto& [op, e] : n.rest) expr(e);
  }
  void visit(const Conditional& n) { expr(n.test), expr(n.then), expr(n.otherwise); }

  void body(const Body& b) {
    for (const Stmt& s : b) std::visit([this](const auto& n) { stmt(n); }, s.node);
  }
  void macro(const MacroDecl& m) {
    for (const auto& d : m.defaults) expr(d);
    body(m.body);
  }
  void stmt(const Output&) {}
  void stmt(const Print& n) { expr(n.expr); }
  void stmt(const If& n) {
    for (const auto& [test, b] : n.branches) expr(test), body(b);
    body(n.otherwise);
  }
  void stmt(const For& n) { expr(n.iterable), expr(n.filter), body(n.body), body(n.otherwise); }
  void stmt(const Set& n) { expr(n.value); }
  void stmt(const SetBlock& n) { expr(n.filter), body(n.body); }
  void stmt(const MacroDef& n) { macro(*n.macro); }
  void stmt(const CallBlock& n) { macro(*n.caller), expr(n.call); }
  void stmt(const FilterBlock& n) { expr(n.filter), body(n.body); }
  void stmt(const With& n) {
    for (const auto& v : n.values) expr(v);
    body(n.body);
  }
  void stmt(const Break&) {}
  void stmt(const Continue&) {}
  void stmt(const Generation& n) { macro(*n.caller); }
  void stmt(const Block& n) { body(n.body); }
  void stmt(const NeedsLoader& n) { expr(n.template_name); }
};

}  // namespace

bool mentions(const MacroDecl& macro, std::string_view name) {
  NameFinder finder{name};
  finder.macro(macro);
  return finder.found;
}

int subtree_height(const Expr& e) {
  return 1 + std::visit(ChildDepth{}, e.node);
}

namespace {

bool constant(const ExprPtr& e) {
  return !e || is_constant(*e);
}

bool all_constant(const std::vector<ExprPtr>& items) {
  return std::all_of(items.begin(), items.end(), [](const ExprPtr& e) { return is_constant(*e); });
}

struct ConstantCheck {
  bool operator()(const Literal&) const { return true; }
  bool operator()(const ListLiteral& n) const { return all_constant(n.items); }
  bool operator()(const TupleLiteral& n) const { return all_constant(n.items); }
  bool operator()(const DictLiteral& n) const {
    return std::all_of(n.items.begin(), n.items.end(),
                       [](const auto& kv) { return constant(kv.first) && constant(kv.second); });
  }
  bool operator()(const GetAttr& n) const { return constant(n.object); }
  bool operator()(const GetItem& n) const { return constant(n.object) && constant(n.key); }
  bool operator()(const Slice& n) const { return constant(n.start) && constant(n.stop) && constant(n.step); }
  bool operator()(const Unary& n) const { return constant(n.operand); }
  bool operator()(const Binary& n) const { return constant(n.left) && constant(n.right); }
  bool operator()(const Concat& n) const { return all_constant(n.parts); }
  bool operator()(const Compare& n) const {
    return constant(n.first) &&
           std::all_of(n.rest.begin(), n.rest.end(), [](const auto& r) { return constant(r.second); });
  }
  bool operator()(const Conditional& n) const { return constant(n.test) && constant(n.then) && constant(n.otherwise); }
  template <typename Other>
  bool operator()(const Other&) const {
    return false;  // names, calls, filters and tests
  }
};

}  // namespace

bool is_constant(const Expr& e) {
  return std::visit(ConstantCheck{}, e.node);
}

}  // namespace kiln::jinja::ast
