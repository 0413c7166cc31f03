// kiln's Jinja2 engine: parses and renders chat templates with the semantics of Python's jinja2 as
// Hugging Face transformers configures it for apply_chat_template:
//   ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
//                                 extensions=[loopcontrols, the "generation" block tag])
// with transformers' own `tojson` filter and the globals `raise_exception` and `strftime_now`.
// Values printed by a template come out exactly as Python would print them (repr of lists and
// dicts, float formatting, json.dumps). See docs/chat-templates.md for what is covered.
//
// Variables come in as JSON (ordered, so that dict iteration order is the file's order, as with
// Python's json module). Errors are values; nothing is thrown out of this API.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"

namespace kiln::jinja {

namespace ast {
struct TemplateBody;
}

// What stopped a parse or a render, for callers that need more than the one-line message.
enum class FailureKind {
  syntax,     // the source is not a valid template (jinja2's TemplateSyntaxError and friends)
  raised,     // the template called raise_exception(message)
  undefined,  // an undefined value was used where a value is needed (jinja2's UndefinedError)
  security,   // the sandbox refused an operation, e.g. list.append (jinja2's SecurityError)
  runtime,    // any other error Python would raise: TypeError, ValueError, ZeroDivisionError...
  limit,      // one of kiln's RenderLimits was exceeded (jinja2 has no such limits)
};

struct TemplateFailure {
  FailureKind kind = FailureKind::runtime;
  int line = 0;         // 1-based template line, 0 when unknown
  std::string message;  // for `raised`, exactly the template's message
};

// Guards that keep a hostile or broken template from hanging or exhausting memory. jinja2 itself
// has none of these (beyond the sandbox's range() cap); the defaults are far above what any chat
// template needs.
struct RenderLimits {
  size_t max_output_bytes = size_t(64) << 20;  // rendered text, and any one string value
  size_t max_container_items = size_t(1) << 22;
  int max_call_depth = 256;         // nested macro calls and recursive loops
  uint64_t max_steps = 50'000'000;  // evaluated nodes and loop iterations
};

struct RenderOptions {
  RenderLimits limits;
  // The local time strftime_now() formats; unset means the clock at the start of the render.
  std::optional<std::chrono::system_clock::time_point> now;
};

// Variables of a render: a JSON object whose members become template variables.
using Variables = nlohmann::ordered_json;

class Template {
 public:
  // Parses `source`. On failure, `failure` (if given) receives the details.
  static Result<Template> parse(std::string_view source, TemplateFailure* failure = nullptr);

  // Renders with `variables` (a JSON object). The error message is the template's own message for
  // raise_exception, else "template error at line N: ..." naming what went wrong.
  Result<std::string> render(const Variables& variables, const RenderOptions& options = {},
                             TemplateFailure* failure = nullptr) const;

  // The error render() would give for a variable nested deeper than template values may nest,
  // found without recursion. Copying JSON recurses as deep as it nests, so a caller that copies
  // untrusted variables before rendering checks them first.
  static Status check_depth(const nlohmann::ordered_json& variable, TemplateFailure* failure = nullptr);

 private:
  explicit Template(std::shared_ptr<const ast::TemplateBody> body) : body_(std::move(body)) {}
  std::shared_ptr<const ast::TemplateBody> body_;
};

}  // namespace kiln::jinja
