// Text generation for the CLI: a model with its tokenizer and chat template, one sequence whose
// state carries over between calls, sampling, stop strings and streaming detokenization.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "models/model.h"
#include "runtime/sampler.h"
#include "text/chat_template.h"
#include "text/tokenizer/tokenizer.h"

namespace kiln::cli {

struct GenerationOptions {
  int64_t max_tokens = 256;
  int64_t context = 0;  // 0: the prompt plus max_tokens, within the model's limit
  SamplingParams sampling;
  std::vector<std::string> stops;
  std::string generation_config = "auto";  // auto: unset sampling follows the model's generation_config.json
  // The sampling options as parsed, which tell what the command line set itself.
  struct {
    CLI::Option *temperature = nullptr, *top_k = nullptr, *top_p = nullptr, *min_p = nullptr,
                *repetition_penalty = nullptr;
  } given;
};

struct GenerationStats {
  int64_t prompt_tokens = 0;  // tokens prefilled by this call
  int64_t generated_tokens = 0;
  double prompt_seconds = 0;
  double decode_seconds = 0;
  std::string finish_reason;  // "stop", "length" or "interrupted"
};

// Options shared by generate and chat.
void add_sampling_options(CLI::App& command, GenerationOptions& options);
// With --generation-config auto, the sampling settings the command line left unset take the values
// of MODEL_DIR/generation_config.json (noted on stderr when there are any).
Status apply_sampling_defaults(const std::string& model_dir, GenerationOptions& options);

// Refuses a --logit-bias token outside the model's vocabulary (the sampler would skip it silently).
Status check_logit_bias(const SamplingParams& sampling, int64_t vocab_size);

class TextSession {
 public:
  // `tokenizer`: one already loaded from model_dir, so its warnings are not printed twice.
  static Result<std::unique_ptr<TextSession>> open(const std::string& model_dir, Backend& backend, int64_t context,
                                                   std::shared_ptr<const Tokenizer> tokenizer = nullptr);

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const ChatTemplate* chat_template() const { return chat_template_ ? &*chat_template_ : nullptr; }
  Model& model() { return *model_; }

  // Continues the sequence with `prompt` (the tokens after what it already holds) and samples up
  // to max_tokens, calling `emit` with text as it becomes final; `stop` interrupts at the next
  // token. The generated tokens are appended to the history.
  // `prefilled` runs once the prompt is in the state, before the first token is sampled.
  Result<GenerationStats> generate(const std::vector<int32_t>& prompt, const GenerationOptions& options,
                                   const std::function<void(const std::string&)>& emit,
                                   const std::atomic<bool>* stop = nullptr,
                                   const std::function<void()>& prefilled = nullptr);

  // Feeds tokens into the sequence without sampling (a prompt's first part).
  Status prefill(const std::vector<int32_t>& tokens);

  // Tokens the sequence has consumed, in order.
  const std::vector<int32_t>& history() const { return history_; }
  SequenceState& state() { return *state_; }
  // Drops the state back to a snapshot taken with snapshot().
  std::unique_ptr<SequenceState> snapshot();
  void restore(const SequenceState& snapshot, size_t history_length);
  // Empties the sequence.
  void reset();

 private:
  std::unique_ptr<Model> model_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  std::unique_ptr<SequenceState> state_;
  std::vector<int32_t> history_;
};

}  // namespace kiln::cli
