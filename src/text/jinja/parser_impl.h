// Internal to the parser: the recursive-descent Parser, following jinja2's parser.py. Statements
// are parsed in parser.cpp, expressions in parse_expressions.cpp.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/lexer.h"

namespace kiln::jinja::parsing {

using namespace ast;

constexpr int kMaxExpressionDepth = 400;
constexpr int kMaxNesting = 200;

// Python's reserved words: jinja2 compiles keyword arguments into Python calls, where these fail.
inline bool is_python_keyword(std::string_view name) {
  static constexpr std::string_view kKeywords[] = {
      "False", "None",     "True",  "and",    "as",   "assert", "async",  "await",    "break",
      "class", "continue", "def",   "del",    "elif", "else",   "except", "finally",  "for",
      "from",  "global",   "if",    "import", "in",   "is",     "lambda", "nonlocal", "not",
      "or",    "pass",     "raise", "return", "try",  "while",  "with",   "yield"};
  return std::find(std::begin(kKeywords), std::end(kKeywords), name) != std::end(kKeywords);
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
    e->depth = ast::subtree_height(*e);
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

  // --- templates and statements (parser.cpp) --------------------------------------------------
  Body subparse(std::initializer_list<std::string_view> end_tokens);
  // parse_statements: an optional colon, the end of the opening tag, then a body up to end_tokens.
  Body parse_statements(std::initializer_list<std::string_view> end_tokens, bool drop_needle);
  void parse_statement(Body& body);
  Block parse_block();
  // The statements that load other templates parse as in jinja2 and fail when they run: the
  // environment transformers builds has no loader.
  NeedsLoader parse_needs_loader();
  If parse_if();
  For parse_for();
  void parse_set(Stmt& s);
  void parse_signature(MacroDecl& macro);
  void finish_macro(MacroDecl& macro);
  MacroDef parse_macro();
  CallBlock parse_call_block();
  FilterBlock parse_filter_block();
  With parse_with();
  void check_assignable_name(const std::string& name, int line);
  Target to_target(const ExprPtr& e);
  Target parse_assign_target(bool with_tuple, bool name_only, std::initializer_list<std::string_view> extra_end,
                             bool with_namespace);

  // --- expressions (parse_expressions.cpp) -----------------------------------------------------
  ExprPtr parse_expression(bool with_conditional);
  ExprPtr parse_conditional();
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  bool is_tuple_end(std::initializer_list<std::string_view> extra_end) const;
  // simplified: elements are primaries (assignment targets); with_conditional: `a if b else c`.
  ExprPtr parse_tuple(bool simplified, bool with_conditional, std::initializer_list<std::string_view> extra_end,
                      bool explicit_parentheses);
  ExprPtr parse_list();
  ExprPtr parse_dict();
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_filter_expr(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr node);
  ExprPtr parse_subscribed();
  Arguments parse_call_args();
  ExprPtr parse_call(ExprPtr node);
  ExprPtr parse_filter(ExprPtr node, bool start_inline);
  ExprPtr parse_test(ExprPtr node);

  std::vector<Token> tokens_;
  std::vector<std::string> block_names_;
  size_t pos_ = 0;
  int nesting_ = 0;
};

// What jinja2 rejects when it compiles the parsed template to Python (compile_checks.cpp): unknown
// filters and tests outside conditionals, break/continue outside a loop, repeated keyword arguments.
void check_compiles(const TemplateBody& body);
// jinja2's optimizer (fold.cpp): replaces constant subexpressions with their values.
void fold_constants(TemplateBody& body);
// jinja2's variable frames (frames.cpp): fills in the unset_names of every frame.
void analyze_frames(TemplateBody& body);

}  // namespace kiln::jinja::parsing
