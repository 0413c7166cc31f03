// The public entry points: parse and render, with template errors turned into values.
#include <new>

#include "text/jinja/ast.h"
#include "text/jinja/jinja.h"
#include "text/jinja/json.h"
#include "text/jinja/parser.h"
#include "text/jinja/renderer.h"

namespace kiln::jinja {

namespace {

Error to_error(const TemplateFailure& failure) {
  if (failure.kind == FailureKind::raised) return Error{failure.message};
  const char* what = failure.kind == FailureKind::syntax ? "template syntax error" : "template error";
  if (failure.line > 0) return make_error("{} at line {}: {}", what, failure.line, failure.message);
  return make_error("{}: {}", what, failure.message);
}

Error report(TemplateFailure detail, TemplateFailure* failure) {
  if (failure) *failure = detail;
  return to_error(detail);
}

}  // namespace

Result<Template> Template::parse(std::string_view source, TemplateFailure* failure) {
  try {
    auto body = std::make_shared<ast::TemplateBody>(parse_source(source));
    return Template(std::move(body));
  } catch (const TemplateException& e) {
    return report({e.kind(), e.line(), e.message()}, failure);
  } catch (const std::bad_alloc&) {
    return report({FailureKind::limit, 0, "out of memory while parsing the template"}, failure);
  }
}

Result<std::string> Template::render(const Variables& variables, const RenderOptions& options,
                                     TemplateFailure* failure) const {
  if (!variables.is_object() && !variables.is_null())
    return report({FailureKind::runtime, 0, "template variables must be a JSON object"}, failure);
  Renderer renderer(options, options.now.value_or(std::chrono::system_clock::now()));
  try {
    return renderer.render(*body_, variables);
  } catch (const TemplateException& e) {
    return report({e.kind(), e.line() ? e.line() : renderer.line(), e.message()}, failure);
  } catch (const std::bad_alloc&) {
    return report({FailureKind::limit, renderer.line(), "out of memory while rendering the template"}, failure);
  }
}

Status Template::check_depth(const nlohmann::ordered_json& variable, TemplateFailure* failure) {
  if (!nested_deeper_than(variable, kMaxValueDepth)) return ok_status();
  return report({FailureKind::limit, 0, fmt::format("values nested deeper than kiln's limit of {}", kMaxValueDepth)},
                failure);
}

}  // namespace kiln::jinja
