// One request's generation as text: the scheduler's tokens detokenized, cut at stop strings and
// split into reasoning, answer and tool calls. The engine's streams and the server's protocol
// handlers (OpenAI, Anthropic) read deltas from it and format them.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "engine/output_parser.h"
#include "runtime/scheduler.h"
#include "runtime/stop_strings.h"
#include "text/tokenizer/tokenizer.h"

namespace kiln::engine {

// Detokenization that keeps the special tokens an output parser needs (other special tokens are
// skipped, as HF's skip_special_tokens does).
class TokenText {
 public:
  TokenText(std::shared_ptr<const Tokenizer> tokenizer, const std::vector<std::string>& kept_markers);
  std::string push(int32_t id);
  std::string flush();

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;
  IncrementalDecoder decoder_;
  std::unordered_set<int32_t> kept_;
};

// How a model writes reasoning and tool calls, read from its vocabulary (each family's markup
// tokens are in it) and, for Qwen's call bodies, its chat template. Plain text (everything is
// content) without a tokenizer. The one place the output format is chosen.
// The output format of a model of `family` (its descriptor's chat markup, as far as the vocabulary
// holds it; a family kiln does not know: what the vocabulary shows).
OutputFormat output_format(const std::string& family, const Tokenizer* tokenizer, const ChatTemplate* chat_template);

// The format a chat request's output is read in: the model's, without tool calls when the request
// offers no tools (`tools`: its JSON array, or null), and starting inside the reasoning when the
// rendered prompt ends by opening it.
OutputFormat chat_output_format(OutputFormat model_format, const std::string& rendered_prompt,
                                const nlohmann::json* tools);

struct TextGenerationOptions {
  std::vector<std::string> stops;
  OutputFormat format;         // tools == none and no think markers: everything is content
  bool one_tool_call = false;  // the generation ends once a tool call is complete
};

class TextGeneration {
 public:
  // `tokenizer` may be null (a model without tokenizer files): then no text comes out, only ids.
  TextGeneration(std::shared_ptr<Generation> generation, std::shared_ptr<const Tokenizer> tokenizer,
                 TextGenerationOptions options);
  ~TextGeneration();  // cancels the generation if it still runs

  // Waits up to `timeout` for more output; `delta` and `ids` (and `logprobs`, one per id, when the
  // generation asked for them) receive what arrived. Returns false once the generation has ended
  // (the last call may still carry output).
  bool next(OutputDelta& delta, std::vector<int32_t>& ids, std::chrono::milliseconds timeout,
            std::vector<SampledLogprobs>* logprobs = nullptr);
  // A token's text on its own, for logprobs (special tokens included); "token_id:N" without a tokenizer.
  std::string token_text(int32_t id) const;
  void cancel() { generation_->cancel(); }

  bool finished() const { return finished_; }
  // "stop", "length", "tool_calls", "cancelled" or "error" (after the end).
  std::string finish_reason() const;
  const std::string& error() const { return error_; }
  const std::string& matched_stop() const { return stop_.matched(); }
  bool called_tools() const { return tool_calls_ > 0; }
  int64_t completion_tokens() const { return tokens_; }
  const Generation& generation() const { return *generation_; }

 private:
  void add(OutputDelta& into, const OutputDelta& from);

  std::shared_ptr<Generation> generation_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::unique_ptr<TokenText> text_;
  StopMatcher stop_;
  OutputParser parser_;
  bool finished_ = false;
  FinishReason reason_ = FinishReason::running;
  std::string error_;
  int64_t tokens_ = 0;
  int64_t tool_calls_ = 0;
  bool one_tool_call_ = false;
};

}  // namespace kiln::engine
