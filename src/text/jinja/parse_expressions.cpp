// jinja2's parser (parser.py): expressions, with its precedence. See parser_impl.h.
#include <cmath>
#include <optional>

#include "text/jinja/builtins.h"
#include "text/jinja/parser_impl.h"

namespace kiln::jinja::parsing {

ExprPtr Parser::parse_expression(bool with_conditional) {
  NestingGuard guard(*this, current().line);
  return with_conditional ? parse_conditional() : parse_or();
}

ExprPtr Parser::parse_conditional() {
  int line = current().line;
  ExprPtr then = parse_or();
  while (skip_name("if")) {
    ExprPtr test = parse_or();
    ExprPtr otherwise = skip_name("else") ? parse_conditional() : nullptr;
    then = make(line, Conditional{std::move(test), std::move(then), std::move(otherwise)});
    line = current().line;
  }
  return then;
}

ExprPtr Parser::parse_or() {
  int line = current().line;
  ExprPtr left = parse_and();
  while (skip_name("or")) {
    ExprPtr right = parse_and();
    left = make(line, Binary{BinaryOp::logical_or, std::move(left), std::move(right)});
    line = current().line;
  }
  return left;
}

ExprPtr Parser::parse_and() {
  int line = current().line;
  ExprPtr left = parse_not();
  while (skip_name("and")) {
    ExprPtr right = parse_not();
    left = make(line, Binary{BinaryOp::logical_and, std::move(left), std::move(right)});
    line = current().line;
  }
  return left;
}

ExprPtr Parser::parse_not() {
  if (is_name(current(), "not")) {
    NestingGuard guard(*this, current().line);
    int line = next().line;
    return make(line, Unary{UnaryOp::logical_not, parse_not()});
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
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

ExprPtr Parser::parse_math1() {
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

ExprPtr Parser::parse_concat() {
  int line = current().line;
  std::vector<ExprPtr> parts;
  parts.push_back(parse_math2());
  while (skip_op("~")) parts.push_back(parse_math2());
  if (parts.size() == 1) return std::move(parts[0]);
  return make(line, Concat{std::move(parts)});
}

ExprPtr Parser::parse_math2() {
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

ExprPtr Parser::parse_pow() {
  int line = current().line;
  ExprPtr left = parse_unary(true);
  while (skip_op("**")) {
    ExprPtr right = parse_unary(true);
    left = make(line, Binary{BinaryOp::power, std::move(left), std::move(right)});
    line = current().line;
  }
  return left;
}

ExprPtr Parser::parse_unary(bool with_filter) {
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

ExprPtr Parser::parse_primary() {
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
    case TokenType::floating: {
      double f = next().floating;  // 1e400 is inf, which jinja2's generated code cannot spell
      return make(line, Literal{Value::floating(f), std::isfinite(f) ? "" : "inf"});
    }
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

bool Parser::is_tuple_end(std::initializer_list<std::string_view> extra_end) const {
  const Token& t = current();
  if (t.type == TokenType::variable_end || t.type == TokenType::block_end || is_op(t, ")")) return true;
  for (std::string_view end : extra_end)
    if (is_name(t, end)) return true;
  return false;
}

// simplified: elements are primaries (assignment targets); with_conditional: `a if b else c`.
ExprPtr Parser::parse_tuple(bool simplified, bool with_conditional, std::initializer_list<std::string_view> extra_end,
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

ExprPtr Parser::parse_list() {
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

ExprPtr Parser::parse_dict() {
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

ExprPtr Parser::parse_postfix(ExprPtr node) {
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

ExprPtr Parser::parse_filter_expr(ExprPtr node) {
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

ExprPtr Parser::parse_subscript(ExprPtr node) {
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

ExprPtr Parser::parse_subscribed() {
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

Arguments Parser::parse_call_args() {
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

ExprPtr Parser::parse_call(ExprPtr node) {
  int line = current().line;
  Arguments args = parse_call_args();
  return make(line, Call{std::move(node), std::move(args)});
}

ExprPtr Parser::parse_filter(ExprPtr node, bool start_inline) {
  while (is_op(current(), "|") || start_inline) {
    if (!start_inline) next();
    Token token = expect_name();
    std::string name = token.text;
    while (skip_op(".")) name += fmt::format(".{}", expect_name().text);
    Arguments args;
    if (is_op(current(), "(")) args = parse_call_args();
    node = make(token.line, Filter{std::move(node), std::move(name), std::move(args)});
    start_inline = false;
  }
  return node;
}

ExprPtr Parser::parse_test(ExprPtr node) {
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
  ExprPtr test = make(line, Test{std::move(node), std::move(name), std::move(args)});
  if (negated) test = make(line, Unary{UnaryOp::logical_not, std::move(test)});
  return test;
}

}  // namespace kiln::jinja::parsing
