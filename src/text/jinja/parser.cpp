// jinja2's parser (parser.py): templates and statements. See parser.h and parser_impl.h.
#include "text/jinja/parser.h"

#include "text/jinja/builtins.h"
#include "text/jinja/parser_impl.h"

namespace kiln::jinja {

namespace parsing {

Body Parser::subparse(std::initializer_list<std::string_view> end_tokens) {
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
Body Parser::parse_statements(std::initializer_list<std::string_view> end_tokens, bool drop_needle) {
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

void Parser::parse_statement(Body& body) {
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
    if (tag == "break") {
      s.node = Break{};
    } else {
      s.node = Continue{};
    }
  } else if (tag == "generation") {
    next();
    // transformers' extension parses this into a CallBlock: the body is a caller() macro.
    auto caller = std::make_shared<MacroDecl>();
    caller->name = "caller";
    caller->body = parse_statements({"endgeneration"}, true);
    finish_macro(*caller);
    s.node = Generation{std::move(caller)};
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

Block Parser::parse_block() {
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
  node.body = parse_statements({"endblock"}, true);
  skip_name(node.name);
  return node;
}

// The statements that load other templates parse as in jinja2 and fail when they run: the
// environment transformers builds has no loader.
NeedsLoader Parser::parse_needs_loader() {
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

If Parser::parse_if() {
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

For Parser::parse_for() {
  expect_name("for");
  For node;
  node.target = parse_assign_target(true, false, {"in"}, false);
  expect_name("in");
  node.iterable = parse_tuple(false, false, {"recursive"}, false);
  if (skip_name("if")) node.filter = parse_expression(true);
  node.recursive = skip_name("recursive");
  { node.body = parse_statements({"endfor", "else"}, false); }
  if (next().text == "endfor") return node;
  node.otherwise = parse_statements({"endfor"}, true);
  return node;
}

void Parser::parse_set(Stmt& s) {
  next();
  Target target = parse_assign_target(true, false, {}, true);
  if (skip_op("=")) {
    s.node = Set{std::move(target), parse_tuple(false, true, {}, false)};
    return;
  }
  SetBlock block;
  block.target = std::move(target);
  block.filter = parse_filter(nullptr, false);
  block.body = parse_statements({"endset"}, true);
  s.node = std::move(block);
}

void Parser::parse_signature(MacroDecl& macro) {
  expect_op("(");
  while (!is_op(current(), ")")) {
    if (!macro.params.empty()) expect_op(",");
    Token name = expect_name();
    check_assignable_name(name.text, name.line);
    if (std::find(macro.params.begin(), macro.params.end(), name.text) != macro.params.end())
      fail(fmt::format("duplicate argument '{}' in function definition", name.text), name.line);
    if (skip_op("=")) {
      macro.defaults.push_back(parse_expression(true));
    } else if (!macro.defaults.empty()) {
      fail("non-default argument follows default argument", name.line);
    }
    macro.params.push_back(name.text);
  }
  expect_op(")");
}

void Parser::finish_macro(MacroDecl& macro) {
  macro.uses_caller = ast::mentions(macro, "caller");
  macro.uses_varargs = ast::mentions(macro, "varargs");
  macro.uses_kwargs = ast::mentions(macro, "kwargs");
}

MacroDef Parser::parse_macro() {
  next();
  auto macro = std::make_shared<MacroDecl>();
  Token name = expect_name();
  check_assignable_name(name.text, name.line);
  macro->name = name.text;
  parse_signature(*macro);
  macro->body = parse_statements({"endmacro"}, true);
  finish_macro(*macro);
  return MacroDef{std::move(macro)};
}

CallBlock Parser::parse_call_block() {
  int line = next().line;
  auto caller = std::make_shared<MacroDecl>();
  caller->name = "caller";
  if (is_op(current(), "(")) parse_signature(*caller);
  ExprPtr call = parse_expression(true);
  if (!std::holds_alternative<Call>(call->node)) fail("expected call", line);
  caller->body = parse_statements({"endcall"}, true);
  finish_macro(*caller);
  return CallBlock{std::move(caller), std::move(call)};
}

FilterBlock Parser::parse_filter_block() {
  next();
  FilterBlock node;
  node.filter = parse_filter(nullptr, true);
  node.body = parse_statements({"endfilter"}, true);
  return node;
}

With Parser::parse_with() {
  next();
  With node;
  while (current().type != TokenType::block_end) {
    if (!node.targets.empty()) expect_op(",");
    node.targets.push_back(parse_assign_target(true, false, {}, false));
    expect_op("=");
    node.values.push_back(parse_expression(true));
  }
  node.body = parse_statements({"endwith"}, true);
  return node;
}

void Parser::check_assignable_name(const std::string& name, int line) {
  if (name == "true" || name == "false" || name == "none" || name == "True" || name == "False" || name == "None")
    fail("can't assign to 'const'", line);
}

Target Parser::to_target(const ExprPtr& e) {
  if (auto* name = std::get_if<Name>(&e->node)) {
    Target t;
    t.kind = Target::Kind::name;
    t.name = name->name;
    t.line = e->line;
    return t;
  }
  if (auto* tuple = std::get_if<TupleLiteral>(&e->node)) {
    Target t;
    t.kind = Target::Kind::tuple;
    t.line = e->line;
    for (const auto& item : tuple->items) t.items.push_back(to_target(item));
    return t;
  }
  std::string kind = std::holds_alternative<Literal>(e->node) ? "const" : "expression";
  fail(fmt::format("can't assign to '{}'", kind), e->line);
}

Target Parser::parse_assign_target(bool with_tuple, bool name_only, std::initializer_list<std::string_view> extra_end,
                                   bool with_namespace) {
  if (with_namespace && current().type == TokenType::name && is_op(look(), ".")) {
    Target t;
    t.kind = Target::Kind::namespace_attribute;
    t.line = current().line;
    t.name = next().text;
    next();
    t.attribute = expect_name().text;
    return t;
  }
  if (name_only) {
    Token name = expect_name();
    Target t;
    t.name = name.text;
    t.line = name.line;
    return t;
  }
  ExprPtr e = with_tuple ? parse_tuple(true, true, extra_end, false) : parse_primary();
  return to_target(e);
}

}  // namespace parsing

ast::TemplateBody parse_source(std::string_view source) {
  ast::TemplateBody body = parsing::Parser(tokenize(source)).parse();
  // Then what jinja2 does when it compiles: optimize, generate code (and fail), track variables.
  parsing::fold_constants(body);
  parsing::check_compiles(body);
  parsing::analyze_frames(body);
  return body;
}

}  // namespace kiln::jinja
