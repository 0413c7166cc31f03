// The syntax tree of a parsed template, mirroring jinja2's nodes.py for the constructs chat
// templates use.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "text/jinja/value.h"

namespace kiln::jinja::ast {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using Body = std::vector<Stmt>;

// Arguments of a call, filter or test: f(a, b, key=c, *d, **e).
struct Arguments {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
  ExprPtr star_args;    // *args
  ExprPtr star_kwargs;  // **kwargs
};

struct Literal {
  Literal() = default;
  explicit Literal(Value v, std::string name_error = "") : value(std::move(v)), name_error(std::move(name_error)) {}
  Value value;
  // jinja2 writes folded constants into its generated Python with repr(), and a float inf or nan
  // comes out as the bare name `inf`/`nan`: evaluating such a constant at runtime is a NameError.
  std::string name_error;
};
struct Name {
  std::string name;
};
struct ListLiteral {
  std::vector<ExprPtr> items;
};
struct TupleLiteral {
  std::vector<ExprPtr> items;
};
struct DictLiteral {
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};
struct GetAttr {  // obj.name
  ExprPtr object;
  std::string attribute;
};
struct GetItem {  // obj[key]; key may be a Slice
  ExprPtr object;
  ExprPtr key;
};
struct Slice {  // start:stop:step inside a subscript; each part optional
  ExprPtr start, stop, step;
};
struct Call {
  ExprPtr callee;
  Arguments args;
};
struct Filter {  // operand|name(args); operand is null in {% filter %} and {% set x | f %} blocks
  ExprPtr operand;
  std::string name;
  Arguments args;
};
struct Test {  // operand is name(args)
  ExprPtr operand;
  std::string name;
  Arguments args;
};
enum class UnaryOp { logical_not, negate, plus };
struct Unary {
  UnaryOp op;
  ExprPtr operand;
};
enum class BinaryOp { add, subtract, multiply, divide, floor_divide, modulo, power, logical_and, logical_or };
struct Binary {
  BinaryOp op;
  ExprPtr left, right;
};
struct Concat {  // a ~ b ~ c
  std::vector<ExprPtr> parts;
};
enum class CompareOp { eq, ne, lt, le, gt, ge, in, not_in };
struct Compare {  // chained: a < b < c
  ExprPtr first;
  std::vector<std::pair<CompareOp, ExprPtr>> rest;
};
struct Conditional {  // then if test else otherwise; otherwise may be null (gives undefined)
  ExprPtr test, then, otherwise;
};

struct Expr {
  int line = 0;
  int depth = 1;  // height of this subtree; the parser bounds it so evaluation cannot exhaust the stack
  std::variant<Literal, Name, ListLiteral, TupleLiteral, DictLiteral, GetAttr, GetItem, Slice, Call, Filter, Test,
               Unary, Binary, Concat, Compare, Conditional>
      node;
};

// Assignment targets: a name, a namespace attribute (ns.attr), or a tuple of targets.
struct Target {
  enum class Kind { name, namespace_attribute, tuple } kind = Kind::name;
  std::string name;       // name, or the namespace variable
  std::string attribute;  // namespace_attribute only
  std::vector<Target> items;
  int line = 0;
};

// A macro's signature and body; also the body of a {% call %} block (its `caller`).
struct MacroDecl {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() params
  Body body;
  // Whether the body mentions the special names that make the macro accept extra arguments.
  bool uses_caller = false, uses_varargs = false, uses_kwargs = false;
  // Names this frame assigns before reading them: jinja2 starts such a variable out undefined (not
  // the outer value), which nested macros and blocks see until the assignment runs (frames.cpp).
  std::vector<std::string> unset_names;
};

struct Output {  // template data
  std::string text;
};
struct Print {  // {{ expr }}
  explicit Print(ExprPtr e) : expr(std::move(e)) {}
  ExprPtr expr;
  // A constant expression jinja2 evaluates when it compiles the template (fold.cpp), as text.
  std::optional<std::string> constant_text;
};
struct If {
  std::vector<std::pair<ExprPtr, Body>> branches;  // if / elif
  Body otherwise;
};
struct For {
  Target target;
  ExprPtr iterable;
  ExprPtr filter;  // for x in xs if filter
  bool recursive = false;
  Body body;
  Body otherwise;  // {% else %}: runs when nothing was iterated
  // Names this frame assigns before reading them: jinja2 starts such a variable out undefined (not
  // the outer value), which nested macros and blocks see until the assignment runs (frames.cpp).
  std::vector<std::string> unset_names;
  std::vector<std::string> otherwise_unset_names;
};
struct Set {
  Target target;
  ExprPtr value;
};
struct SetBlock {  // {% set x | filter %}...{% endset %}
  Target target;
  ExprPtr filter;  // null, or a Filter chain whose innermost operand is null
  Body body;
  // Names this frame assigns before reading them: jinja2 starts such a variable out undefined (not
  // the outer value), which nested macros and blocks see until the assignment runs (frames.cpp).
  std::vector<std::string> unset_names;
};
struct MacroDef {
  std::shared_ptr<MacroDecl> macro;
};
struct CallBlock {  // {% call(args) macro(...) %}body{% endcall %}
  std::shared_ptr<MacroDecl> caller;
  ExprPtr call;
};
struct FilterBlock {
  ExprPtr filter;  // Filter chain whose innermost operand is null
  Body body;
  // Names this frame assigns before reading them: jinja2 starts such a variable out undefined (not
  // the outer value), which nested macros and blocks see until the assignment runs (frames.cpp).
  std::vector<std::string> unset_names;
};
struct With {
  std::vector<Target> targets;
  std::vector<ExprPtr> values;
  Body body;
  // Names this frame assigns before reading them: jinja2 starts such a variable out undefined (not
  // the outer value), which nested macros and blocks see until the assignment runs (frames.cpp).
  std::vector<std::string> unset_names;
};
struct Break {};
struct Continue {};
struct Generation {  // transformers' {% generation %} block: a call block whose caller() renders the body
  std::shared_ptr<MacroDecl> caller;
};
struct Block {  // {% block name [scoped] %}: rendered in place (no inheritance without a loader)
  std::string name;
  bool scoped = false;
  bool required = false;
  Body body;
  // Names this frame assigns before reading them: jinja2 starts such a variable out undefined (not
  // the outer value), which nested macros and blocks see until the assignment runs (frames.cpp).
  std::vector<std::string> unset_names;
};
struct NeedsLoader {  // extends, include, import, from: transformers' environment has no loader
  std::string tag;
  ExprPtr template_name;
};

struct Stmt {
  int line = 0;
  std::variant<Output, Print, If, For, Set, SetBlock, MacroDef, CallBlock, FilterBlock, With, Break, Continue,
               Generation, Block, NeedsLoader>
      node;
};

struct TemplateBody {
  Body body;
  // Names this frame assigns before reading them: jinja2 starts such a variable out undefined (not
  // the outer value), which nested macros and blocks see until the assignment runs (frames.cpp).
  std::vector<std::string> unset_names;
};

// 1 + the height of the children (their depth fields must be set).
int subtree_height(const Expr& e);
// Whether jinja2's optimizer would fold this expression to a constant (literals, and operators,
// subscripts and attributes of constants).
bool is_constant(const Expr& e);
// Whether a macro's defaults or body mention `name` (caller, varargs, kwargs make a macro accept
// extra arguments, as in jinja2).
bool mentions(const MacroDecl& macro, std::string_view name);

}  // namespace kiln::jinja::ast
