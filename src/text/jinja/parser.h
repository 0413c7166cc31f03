// Builds the syntax tree from tokens, following jinja2's parser.py: the same precedence (filters
// bind tighter than unary minus's operand, `**` is left-associative, comparisons chain), the same
// statements, and the same errors for what jinja2 rejects at compile time (unknown filters and tests
// outside conditionals, `break` outside a loop).
#pragma once

#include <string_view>

#include "text/jinja/ast.h"

namespace kiln::jinja {

// Throws TemplateException (syntax) on invalid templates.
ast::TemplateBody parse_source(std::string_view source);

}  // namespace kiln::jinja
