// jinja2's parser (parser.py) for the statements and expressions kiln supports. See parser.h.
#include "text/jinja/parser.h"

#include <algorithm>
#include <initializer_list>

#include "text/jinja/builtins.h"
#include "text/jinja/lexer.h"

namespace kiln::jinja {

namespace {

using namespace ast;

constexpr int kMaxExpressionDepth = 400;
constexpr int kMaxNesting = 200;

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
  void stmt(const Generation& n) { body(n.body); }
  void stmt(const Block& n) { body(n.body); }
  void stmt(const NeedsLoader& n) { expr(n.template_name); }
};

bool mentions(const MacroDecl& macro, std::string_view name) {
  NameFinder finder{name};
  finder.macro(macro);
  return finder.found;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  TemplateBody parse() {
    TemplateBody result;
    result.body = subparse({});
    return result;
  }

 private:
  // --- token stream ------------------------------------------------------------------------------
  const Token& current() const { return tokens_[pos_]; }
  const Token& look() const { return tokens_[std::min(pos_ + 1, tokens_.size() - 1)]; }
  Token next() {
    Token t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  static bool is_op(const Token& t, std::string_view op) { return t.type == TokenType::op && t.text == op; }
  static bool is_name(const Token& t, std::string_view name) { return t.type == TokenType::name && t.text == name; }
  bool skip_op(std::string_view op) {
    if (!is_op(current(), op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(current(), name)) return false;
    next();
    return true;
  }

  [[noreturn]] void fail(const std::string& message, int line) {
    throw TemplateException(FailureKind::syntax, message, line);
  }
  [[noreturn]] void fail_expected(std::string_view expected) {
    if (current().type == TokenType::eof)
      fail(fmt::format("unexpected end of template, expected '{}'.", expected), current().line);
    fail(fmt::format("expected token '{}', got '{}'", expected, describe_token(current())), current().line);
  }
  Token expect_op(std::string_view op) {
    if (!is_op(current(), op)) fail_expected(op);
    return next();
  }
  Token expect_name() {
    if (current().type != TokenType::name) fail_expected("name");
    return next();
  }
  Token expect_name(std::string_view name) {
    if (!is_name(current(), name)) fail_expected(name);
    return next();
  }
  Token expect(TokenType type, std::string_view description) {
    if (current().type != type) fail_expected(description);
    return next();
  }
  void expect_block_end() { expect(TokenType::block_end, "end of statement block"); }

  template <typename Node>
  ExprPtr make(int line, Node&& node) {
    auto e = std::make_unique<Expr>();
    e->line = line;
    e->node = std::forward<Node>(node);
    e->depth = 1 + std::visit(ChildDepth{}, e->node);
    if (e->depth > kMaxExpressionDepth) fail("expression nested too deeply", line);
    return e;
  }

  // Guards recursion of the recursive-descent functions themselves.
  struct NestingGuard {
    NestingGuard(Parser& p, int line) : parser(p) {
      if (++parser.nesting_ > kMaxNesting) parser.fail("template nested too deeply", line);
    }
    ~NestingGuard() { --parser.nesting_; }
    Parser& parser;
  };

  // Scoped settings of the statement context.
  struct ContextGuard {
    ContextGuard(Parser& p, bool soft, bool reset_loops) : parser(p), soft(p.soft_), loops(p.loop_depth_) {
      p.soft_ = soft;
      if (reset_loops) p.loop_depth_ = 0;
    }
    ~ContextGuard() {
      parser.soft_ = soft;
      parser.loop_depth_ = loops;
    }
    Parser& parser;
    bool soft;
    int loops;
  };

  // --- templates and statements ------------------------------------------------------------------
  Body subparse(std::initializer_list<std::string_view> end_tokens) {
    NestingGuard guard(*this, current().line);
    Body body;
    while (current().type != TokenType::eof) {
      const Token& token = current();
      if (token.type == TokenType::data) {
        Stmt s;
        s.line = token.line;
        s.node = Output{token.text};
        body.push_back(std::move(s));
        next();
      } else if (token.type == TokenType::variable_begin) {
        Stmt s;
        s.line = next().line;
        s.node = Print{parse_tuple(false, true, {}, false)};
        body.push_back(std::move(s));
        expect(TokenType::variable_end, "end of print statement");
      } else if (token.type == TokenType::block_begin) {
        next();
        for (std::string_view end : end_tokens)
          if (is_name(current(), end)) return body;
        parse_statement(body);
        expect_block_end();
      } else {
        fail("internal parsing error", token.line);
      }
    }
    return body;
  }

  // parse_statements: an optional colon, the end of the opening tag, then a body up to end_tokens.
  Body parse_statements(std::initializer_list<std::string_view> end_tokens, bool drop_needle) {
    skip_op(":");
    expect_block_end();
    Body body = subparse(end_tokens);
    if (current().type == TokenType::eof) {
      std::string names;
      for (std::string_view end : end_tokens) names += (names.empty() ? "'" : " or '") + std::string(end) + "'";
      fail(fmt::format("Unexpected end of template. Jinja was looking for the following tags: {}.", names),
           current().line);
    }
    if (drop_needle) next();
    return body;
  }

  void parse_statement(Body& body) {
    const Token& token = current();
    if (token.type != TokenType::name) fail("tag name expected", token.line);
    const std::string tag = token.text;
    const int line = token.line;
    Stmt s;
    s.line = line;
    if (tag == "if") {
      s.node = parse_if();
    } else if (tag == "for") {
      s.node = parse_for();
    } else if (tag == "set") {
      parse_set(s);
    } else if (tag == "macro") {
      s.node = parse_macro();
    } else if (tag == "call") {
      s.node = parse_call_block();
    } else if (tag == "filter") {
      s.node = parse_filter_block();
    } else if (tag == "with") {
      s.node = parse_with();
    } else if (tag == "print") {
      next();
      bool first = true;
      while (current().type != TokenType::block_end) {
        if (!first) expect_op(",");
        first = false;
        Stmt p;
        p.line = line;
        p.node = Print{parse_expression(true)};
        body.push_back(std::move(p));
      }
      return;
    } else if (tag == "break" || tag == "continue") {
      next();
      // jinja2 compiles these to Python's break/continue, which Python rejects outside a loop.
      if (loop_depth_ == 0) fail(fmt::format("'{}' outside loop", tag), line);
      if (tag == "break") {
        s.node = Break{};
      } else {
        s.node = Continue{};
      }
    } else if (tag == "generation") {
      next();
      ContextGuard context(*this, false, true);
      s.node = Generation{parse_statements({"endgeneration"}, true)};
    } else if (tag == "block") {
      s.node = parse_block();
    } else if (tag == "extends" || tag == "include" || tag == "import" || tag == "from") {
      s.node = parse_needs_loader();
    } else if (tag == "autoescape") {
      fail("kiln does not support the 'autoescape' tag (transformers renders without autoescaping)", line);
    } else {
      fail(fmt::format("Encountered unknown tag '{}'.", tag), line);
    }
    body.push_back(std::move(s));
  }

  Block parse_block() {
    next();
    Block node;
    Token name = expect_name();
    node.name = name.text;
    node.scoped = skip_name("scoped");
    node.required = skip_name("required");
    if (is_op(current(), "-"))
      fail(
          "Block names in Jinja have to be valid Python identifiers and may not contain hyphens, use an underscore "
          "instead.",
          current().line);
    if (std::find(block_names_.begin(), block_names_.end(), node.name) != block_names_.end())
      fail(fmt::format("block '{}' defined twice", node.name), name.line);
    block_names_.push_back(node.name);
    ContextGuard context(*this, false, true);
    node.body = parse_statements({"endblock"}, true);
    skip_name(node.name);
    return node;
  }

  // The statements that load other templates parse as in jinja2 and fail when they run: the
  // environment transformers builds has no loader.
  NeedsLoader parse_needs_loader() {
    Token tag = next();
    NeedsLoader node{tag.text, parse_expression(true)};
    if (tag.text == "include" && is_name(current(), "ignore") && is_name(look(), "missing")) {
      next();
      next();
    }
    if (tag.text == "import") {
      expect_name("as");
      expect_name();
    }
    if (tag.text == "from") {
      expect_name("import");
      while (current().type != TokenType::block_end && current().type != TokenType::eof) next();
    }
    if ((is_name(current(), "with") || is_name(current(), "without")) && is_name(look(), "context")) {
      next();
      next();
    }
    return node;
  }

  If parse_if() {
    ContextGuard context(*this, true, false);
    expect_name("if");
    If node;
    while (true) {
      ExprPtr test = parse_tuple(false, false, {}, false);
      Body branch = parse_statements({"elif", "else", "endif"}, false);
      node.branches.emplace_back(std::move(test), std::move(branch));
      Token token = next();
      if (is_name(token, "elif")) continue;
      if (is_name(token, "else")) node.otherwise = parse_statements({"endif"}, true);
      break;
    }
    return node;
  }

  For parse_for() {
    expect_name("for");
    For node;
    node.target = parse_assign_target(true, false, {"in"}, false);
    expect_name("in");
    node.iterable = parse_tuple(false, false, {"recursive"}, false);
    if (skip_name("if")) node.filter = parse_expression(true);
    node.recursive = skip_name("recursive");
    {
      ContextGuard context(*this, false, false);
      ++loop_depth_;
      node.body = parse_statements({"endfor", "else"}, false);
    }
    if (next().text == "endfor") return node;
    ContextGuard context(*this, false, false);
    node.otherwise = parse_statements({"endfor"}, true);
    return node;
  }

  void parse_set(Stmt& s) {
    next();
    Target target = parse_assign_target(true, false, {}, true);
    if (skip_op("=")) {
      s.node = Set{std::move(target), parse_tuple(false, true, {}, false)};
      return;
    }
    SetBlock block;
    block.target = std::move(target);
    block.filter = parse_filter(nullptr, false);
    ContextGuard context(*this, false, true);
    block.body = parse_statements({"endset"}, true);
    s.node = std::move(block);
  }

  void parse_signature(MacroDecl& macro) {
    expect_op("(");
    while (!is_op(current(), ")")) {
      if (!macro.params.empty()) expect_op(",");
      Token name = expect_name();
      check_assignable_name(name.text, name.line);
      if (skip_op("=")) {
        macro.defaults.push_back(parse_expression(true));
      } else if (!macro.defaults.empty()) {
        fail("non-default argument follows default argument", name.line);
      }
      macro.params.push_back(name.text);
    }
    expect_op(")");
  }

  void finish_macro(MacroDecl& macro) {
    macro.uses_caller = mentions(macro, "caller");
    macro.uses_varargs = mentions(macro, "varargs");
    macro.uses_kwargs = mentions(macro, "kwargs");
  }

  MacroDef parse_macro() {
    next();
    auto macro = std::make_shared<MacroDecl>();
    Token name = expect_name();
    check_assignable_name(name.text, name.line);
    macro->name = name.text;
    parse_signature(*macro);
    ContextGuard context(*this, false, true);
    macro->body = parse_statements({"endmacro"}, true);
    finish_macro(*macro);
    return MacroDef{std::move(macro)};
  }

  CallBlock parse_call_block() {
    int line = next().line;
    auto caller = std::make_shared<MacroDecl>();
    caller->name = "caller";
    if (is_op(current(), "(")) parse_signature(*caller);
    ExprPtr call = parse_expression(true);
    if (!std::holds_alternative<Call>(call->node)) fail("expected call", line);
    ContextGuard context(*this, false, true);
    caller->body = parse_statements({"endcall"}, true);
    finish_macro(*caller);
    return CallBlock{std::move(caller), std::move(call)};
  }

  FilterBlock parse_filter_block() {
    next();
    FilterBlock node;
    node.filter = parse_filter(nullptr, true);
    ContextGuard context(*this, false, false);
    node.body = parse_statements({"endfilter"}, true);
    return node;
  }

  With parse_with() {
    next();
    With node;
    while (current().type != TokenType::block_end) {
      if (!node.targets.empty()) expect_op(",");
      node.targets.push_back(parse_assign_target(true, false, {}, false));
      expect_op("=");
      node.values.push_back(parse_expression(true));
    }
    ContextGuard context(*this, false, false);
    node.body = parse_statements({"endwith"}, true);
    return node;
  }

  void check_assignable_name(const std::string& name, int line) {
    if (name == "true" || name == "false" || name == "none" || name == "True" || name == "False" || name == "None")
      fail("can't assign to 'const'", line);
  }

  Target to_target(const ExprPtr& e) {
    if (auto* name = std::get_if<Name>(&e->node)) {
      Target t;
      t.kind = Target::Kind::name;
      t.name = name->name;
      return t;
    }
    if (auto* tuple = std::get_if<TupleLiteral>(&e->node)) {
      Target t;
      t.kind = Target::Kind::tuple;
      for (const auto& item : tuple->items) t.items.push_back(to_target(item));
      return t;
    }
    std::string kind = std::holds_alternative<Literal>(e->node) ? "const" : "expression";
    fail(fmt::format("can't assign to '{}'", kind), e->line);
  }

  Target parse_assign_target(bool with_tuple, bool name_only, std::initializer_list<std::string_view> extra_end,
                             bool with_namespace) {
    if (with_namespace && current().type == TokenType::name && is_op(look(), ".")) {
      Target t;
      t.kind = Target::Kind::namespace_attribute;
      t.name = next().text;
      next();
      t.attribute = expect_name().text;
      return t;
    }
    if (name_only) {
      Token name = expect_name();
      Target t;
      t.name = name.text;
      return t;
    }
    ExprPtr e = with_tuple ? parse_tuple(true, true, extra_end, false) : parse_primary();
    return to_target(e);
  }

  // --- expressions -------------------------------------------------------------------------------
  ExprPtr parse_expression(bool with_conditional) {
    NestingGuard guard(*this, current().line);
    return with_conditional ? parse_conditional() : parse_or();
  }

  ExprPtr parse_conditional() {
    int line = current().line;
    ExprPtr then = parse_or();
    while (skip_name("if")) {
      ContextGuard context(*this, true, false);
      ExprPtr test = parse_or();
      ExprPtr otherwise = skip_name("else") ? parse_conditional() : nullptr;
      then = make(line, Conditional{std::move(test), std::move(then), std::move(otherwise)});
      line = current().line;
    }
    return then;
  }

  ExprPtr parse_or() {
    int line = current().line;
    ExprPtr left = parse_and();
    while (skip_name("or")) {
      ExprPtr right = parse_and();
      left = make(line, Binary{BinaryOp::logical_or, std::move(left), std::move(right)});
      line = current().line;
    }
    return left;
  }

  ExprPtr parse_and() {
    int line = current().line;
    ExprPtr left = parse_not();
    while (skip_name("and")) {
      ExprPtr right = parse_not();
      left = make(line, Binary{BinaryOp::logical_and, std::move(left), std::move(right)});
      line = current().line;
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name(current(), "not")) {
      NestingGuard guard(*this, current().line);
      int line = next().line;
      return make(line, Unary{UnaryOp::logical_not, parse_not()});
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = current().line;
    ExprPtr first = parse_math1();
    std::vector<std::pair<CompareOp, ExprPtr>> rest;
    while (true) {
      const Token& t = current();
      std::optional<CompareOp> op;
      if (t.type == TokenType::op) {
        if (t.text == "==") op = CompareOp::eq;
        if (t.text == "!=") op = CompareOp::ne;
        if (t.text == "<") op = CompareOp::lt;
        if (t.text == "<=") op = CompareOp::le;
        if (t.text == ">") op = CompareOp::gt;
        if (t.text == ">=") op = CompareOp::ge;
        if (op) next();
      } else if (is_name(t, "in")) {
        next();
        op = CompareOp::in;
      } else if (is_name(t, "not") && is_name(look(), "in")) {
        next();
        next();
        op = CompareOp::not_in;
      }
      if (!op) break;
      rest.emplace_back(*op, parse_math1());
      line = current().line;
    }
    if (rest.empty()) return first;
    return make(line, Compare{std::move(first), std::move(rest)});
  }

  ExprPtr parse_math1() {
    int line = current().line;
    ExprPtr left = parse_concat();
    while (is_op(current(), "+") || is_op(current(), "-")) {
      BinaryOp op = next().text == "+" ? BinaryOp::add : BinaryOp::subtract;
      ExprPtr right = parse_concat();
      left = make(line, Binary{op, std::move(left), std::move(right)});
      line = current().line;
    }
    return left;
  }

  ExprPtr parse_concat() {
    int line = current().line;
    std::vector<ExprPtr> parts;
    parts.push_back(parse_math2());
    while (skip_op("~")) parts.push_back(parse_math2());
    if (parts.size() == 1) return std::move(parts[0]);
    return make(line, Concat{std::move(parts)});
  }

  ExprPtr parse_math2() {
    int line = current().line;
    ExprPtr left = parse_pow();
    while (true) {
      const Token& t = current();
      BinaryOp op;
      if (is_op(t, "*")) {
        op = BinaryOp::multiply;
      } else if (is_op(t, "/")) {
        op = BinaryOp::divide;
      } else if (is_op(t, "//")) {
        op = BinaryOp::floor_divide;
      } else if (is_op(t, "%")) {
        op = BinaryOp::modulo;
      } else {
        break;
      }
      next();
      ExprPtr right = parse_pow();
      left = make(line, Binary{op, std::move(left), std::move(right)});
      line = current().line;
    }
    return left;
  }

  ExprPtr parse_pow() {
    int line = current().line;
    ExprPtr left = parse_unary(true);
    while (skip_op("**")) {
      ExprPtr right = parse_unary(true);
      left = make(line, Binary{BinaryOp::power, std::move(left), std::move(right)});
      line = current().line;
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    NestingGuard guard(*this, current().line);
    int line = current().line;
    ExprPtr node;
    if (is_op(current(), "-")) {
      next();
      node = make(line, Unary{UnaryOp::negate, parse_unary(false)});
    } else if (is_op(current(), "+")) {
      next();
      node = make(line, Unary{UnaryOp::plus, parse_unary(false)});
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    NestingGuard guard(*this, current().line);
    const Token& token = current();
    int line = token.line;
    switch (token.type) {
      case TokenType::name: {
        std::string name = next().text;
        if (name == "true" || name == "True") return make(line, Literal{Value::boolean(true)});
        if (name == "false" || name == "False") return make(line, Literal{Value::boolean(false)});
        if (name == "none" || name == "None") return make(line, Literal{Value::none()});
        return make(line, Name{std::move(name)});
      }
      case TokenType::string: {
        std::string text = next().text;
        while (current().type == TokenType::string) text += next().text;
        return make(line, Literal{Value::string(std::move(text))});
      }
      case TokenType::integer:
        return make(line, Literal{Value::integer(next().integer)});
      case TokenType::floating:
        return make(line, Literal{Value::floating(next().floating)});
      case TokenType::op:
        if (token.text == "(") {
          next();
          ExprPtr e = parse_tuple(false, true, {}, true);
          expect_op(")");
          return e;
        }
        if (token.text == "[") return parse_list();
        if (token.text == "{") return parse_dict();
        break;
      default:
        break;
    }
    fail(fmt::format("unexpected '{}'", describe_token(token)), line);
  }

  bool is_tuple_end(std::initializer_list<std::string_view> extra_end) const {
    const Token& t = current();
    if (t.type == TokenType::variable_end || t.type == TokenType::block_end || is_op(t, ")")) return true;
    for (std::string_view end : extra_end)
      if (is_name(t, end)) return true;
    return false;
  }

  // simplified: elements are primaries (assignment targets); with_conditional: `a if b else c`.
  ExprPtr parse_tuple(bool simplified, bool with_conditional, std::initializer_list<std::string_view> extra_end,
                      bool explicit_parentheses) {
    int line = current().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(simplified ? parse_primary() : parse_expression(with_conditional));
      if (is_op(current(), ",")) {
        is_tuple = true;
      } else {
        break;
      }
      line = current().line;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses)
        fail(fmt::format("Expected an expression, got '{}'", describe_token(current())), current().line);
    }
    return make(line, TupleLiteral{std::move(items)});
  }

  ExprPtr parse_list() {
    int line = expect_op("[").line;
    std::vector<ExprPtr> items;
    while (!is_op(current(), "]")) {
      if (!items.empty()) expect_op(",");
      if (is_op(current(), "]")) break;
      items.push_back(parse_expression(true));
    }
    expect_op("]");
    return make(line, ListLiteral{std::move(items)});
  }

  ExprPtr parse_dict() {
    int line = expect_op("{").line;
    std::vector<std::pair<ExprPtr, ExprPtr>> items;
    while (!is_op(current(), "}")) {
      if (!items.empty()) expect_op(",");
      if (is_op(current(), "}")) break;
      ExprPtr key = parse_expression(true);
      expect_op(":");
      ExprPtr value = parse_expression(true);
      items.emplace_back(std::move(key), std::move(value));
    }
    expect_op("}");
    return make(line, DictLiteral{std::move(items)});
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(current(), ".") || is_op(current(), "[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op(current(), "(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op(current(), "|")) {
        node = parse_filter(std::move(node), false);
      } else if (is_name(current(), "is")) {
        node = parse_test(std::move(node));
      } else if (is_op(current(), "(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    Token token = next();
    if (token.text == ".") {
      Token attribute = next();
      if (attribute.type == TokenType::name) return make(token.line, GetAttr{std::move(node), attribute.text});
      if (attribute.type != TokenType::integer) fail("expected name or number", attribute.line);
      ExprPtr key = make(attribute.line, Literal{Value::integer(attribute.integer)});
      return make(token.line, GetItem{std::move(node), std::move(key)});
    }
    std::vector<ExprPtr> keys;
    while (!is_op(current(), "]")) {
      if (!keys.empty()) expect_op(",");
      keys.push_back(parse_subscribed());
    }
    expect_op("]");
    ExprPtr key = keys.size() == 1 ? std::move(keys[0]) : make(token.line, TupleLiteral{std::move(keys)});
    return make(token.line, GetItem{std::move(node), std::move(key)});
  }

  ExprPtr parse_subscribed() {
    int line = current().line;
    std::vector<ExprPtr> parts;
    if (skip_op(":")) {
      parts.push_back(nullptr);
    } else {
      ExprPtr node = parse_expression(true);
      if (!skip_op(":")) return node;
      parts.push_back(std::move(node));
    }
    auto at_end = [&] { return is_op(current(), "]") || is_op(current(), ","); };
    if (is_op(current(), ":")) {
      parts.push_back(nullptr);
    } else if (!at_end()) {
      parts.push_back(parse_expression(true));
    } else {
      parts.push_back(nullptr);
    }
    if (skip_op(":")) {
      parts.push_back(at_end() ? nullptr : parse_expression(true));
    } else {
      parts.push_back(nullptr);
    }
    return make(line, Slice{std::move(parts[0]), std::move(parts[1]), std::move(parts[2])});
  }

  Arguments parse_call_args() {
    int line = expect_op("(").line;
    Arguments args;
    auto ensure = [&](bool ok) {
      if (!ok) fail("invalid syntax for function call expression", line);
    };
    bool require_comma = false;
    while (!is_op(current(), ")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(current(), ")")) break;
      }
      if (is_op(current(), "*")) {
        ensure(!args.star_args && !args.star_kwargs);
        next();
        args.star_args = parse_expression(true);
      } else if (is_op(current(), "**")) {
        ensure(!args.star_kwargs);
        next();
        args.star_kwargs = parse_expression(true);
      } else if (current().type == TokenType::name && is_op(look(), "=")) {
        ensure(!args.star_kwargs);
        std::string key = next().text;
        next();
        args.keyword.emplace_back(std::move(key), parse_expression(true));
      } else {
        ensure(!args.star_args && !args.star_kwargs && args.keyword.empty());
        args.positional.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
    return args;
  }

  ExprPtr parse_call(ExprPtr node) {
    int line = current().line;
    Arguments args = parse_call_args();
    return make(line, Call{std::move(node), std::move(args)});
  }

  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    while (is_op(current(), "|") || start_inline) {
      if (!start_inline) next();
      Token token = expect_name();
      std::string name = token.text;
      while (skip_op(".")) name += fmt::format(".{}", expect_name().text);
      Arguments args;
      if (is_op(current(), "(")) args = parse_call_args();
      // jinja2 rejects unknown filters at compile time, except inside conditionals where it
      // defers the error to when the filter is actually used.
      if (!soft_ && !find_filter(name)) fail(fmt::format("No filter named '{}'.", name), token.line);
      node = make(token.line, Filter{std::move(node), std::move(name), std::move(args)});
      start_inline = false;
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    int line = next().line;  // "is"
    bool negated = skip_name("not");
    Token token = expect_name();
    std::string name = token.text;
    while (skip_op(".")) name += fmt::format(".{}", expect_name().text);
    Arguments args;
    const Token& t = current();
    if (is_op(t, "(")) {
      args = parse_call_args();
    } else if ((t.type == TokenType::name || t.type == TokenType::string || t.type == TokenType::integer ||
                t.type == TokenType::floating || is_op(t, "[") || is_op(t, "{")) &&
               !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and")) {
      if (is_name(t, "is")) fail("You cannot chain multiple tests with is", t.line);
      ExprPtr arg = parse_postfix(parse_primary());
      args.positional.push_back(std::move(arg));
    }
    if (!soft_ && !find_test(name)) fail(fmt::format("No test named '{}'.", name), token.line);
    ExprPtr test = make(line, Test{std::move(node), std::move(name), std::move(args)});
    if (negated) test = make(line, Unary{UnaryOp::logical_not, std::move(test)});
    return test;
  }

  std::vector<Token> tokens_;
  std::vector<std::string> block_names_;
  size_t pos_ = 0;
  int nesting_ = 0;
  bool soft_ = false;   // inside an if or conditional expression: unknown filters fail only when used
  int loop_depth_ = 0;  // for loops around the current statement, within the current macro
};

}  // namespace

ast::TemplateBody parse_source(std::string_view source) {
  return Parser(tokenize(source)).parse();
}

}  // namespace kiln::jinja
