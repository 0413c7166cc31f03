// Splits template source into tokens exactly as jinja2's lexer does with trim_blocks=True and
// lstrip_blocks=True: template data between tags (with `{%-`/`-%}` stripping, `+` opt-outs, the
// newline after a block or comment tag removed, and indentation before a block tag removed), and
// the names, literals and operators inside `{{ }}` and `{% %}`. Comments and raw blocks are resolved
// here; `{% raw %}` content comes out as data.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::jinja {

enum class TokenType {
  data,
  variable_begin,
  variable_end,
  block_begin,
  block_end,
  name,
  string,
  integer,
  floating,
  op,  // text holds the operator: "+", "//", "(", "|", ...
  eof,
};

struct Token {
  TokenType type = TokenType::eof;
  std::string text;  // data, name, operator, or the decoded string literal
  int64_t integer = 0;
  double floating = 0;
  int line = 1;
};

// Throws TemplateException (syntax) on text jinja2's lexer rejects.
std::vector<Token> tokenize(std::string_view source);

// How jinja2 names a token in "unexpected ..." messages.
std::string describe_token(const Token& token);

}  // namespace kiln::jinja
