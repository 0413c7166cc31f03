// Splitting a model's output text into reasoning, answer and tool calls, as it streams.
//
// Each family writes these in its own markup:
//  - Qwen 3.5: `<think>…</think>` and `<tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n
//    </parameter>\n</function>\n</tool_call>` (Qwen3-Coder XML);
//  - Qwen 3: `<think>…</think>` and `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`;
//  - Gemma 4: `<|channel>thought\n…<channel|>` and `<|tool_call>call:NAME{key:value,…}<tool_call|>`
//    with strings quoted as `<|"|>…<|"|>`.
// The parser holds back text that may be the start of a marker, so no markup ever reaches the
// answer, and emits each tool call whole once its closing marker arrives.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "models/family.h"
#include "text/chat_template.h"

namespace kiln::engine {

enum class ToolFormat { none, qwen_xml, hermes_json, gemma };

struct OutputFormat {
  ToolFormat tools = ToolFormat::none;
  std::string think_open, think_close;  // empty: no reasoning markup
  std::string call_open, call_close;
  bool starts_in_reasoning = false;  // the prompt opened the reasoning block
  nlohmann::json tool_schemas;       // the request's tools (argument types), or null
  // A JSON call body (Qwen 3): what the chat template writes from the call marker to a function's
  // name and from the name to its arguments (`\n{"name": "` and `", "arguments":`); empty when
  // not known.
  std::string json_before_name, json_after_name;

  // The format of a model whose vocabulary holds the tokens `has_token` accepts (each family's
  // markup tokens are in its vocabulary; Qwen's XML and JSON calls are told apart by their body).
  static OutputFormat for_vocabulary(const std::function<bool(const std::string&)>& has_token);
  // The format a model family's chat markup describes (its descriptor's ChatMarkup), keeping the
  // reasoning and the tool-call marker pairs whose tokens the model's vocabulary holds.
  static OutputFormat for_markup(const ChatMarkup& markup, const std::function<bool(const std::string&)>& has_token);
  // Special tokens the parser needs to see in the decoded text (decoding skips other specials).
  std::vector<std::string> markers() const;
  // How a tool call opens, as the model writes it: the call marker, then, when a function is given,
  // its name as the format writes it first (Gemma 4 `call:NAME`, Qwen XML `<function=NAME>` and a
  // newline, Qwen's JSON body up to `"arguments":` when the template's form of it is known). Empty
  // without tool calls.
  std::string call_opening(const std::string& function) const;
  // What the model writes between the end of its reasoning and its answer.
  std::string answer_separator() const;
};

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct OutputDelta {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
};

// Qwen's XML and JSON call bodies share their markers (so the vocabulary cannot tell them apart):
// sets format.tools to the one `tmpl` renders an assistant's tool call in (qwen_xml when it cannot
// tell) and, for JSON bodies, the text the template writes around a function's name.
void read_qwen_call_body(const ChatTemplate& tmpl, OutputFormat& format);

class OutputParser {
 public:
  explicit OutputParser(OutputFormat format);
  // Adds text; returns what became final.
  OutputDelta push(const std::string& text);
  // The end of the output: whatever is held back (an unfinished tool call becomes content).
  OutputDelta finish();

 private:
  enum class Mode { content, reasoning, call };
  void scan(OutputDelta& out, bool final);

  OutputFormat format_;
  Mode mode_ = Mode::content;
  std::string buffer_;
  std::string call_;
  bool strip_newlines_ = false;  // after the reasoning, until the answer starts
};

// The body of one tool call (between its markers) as a name and JSON arguments.
Result<ToolCall> parse_tool_call(ToolFormat format, const std::string& body, const nlohmann::json& tool_schemas);

}  // namespace kiln::engine
