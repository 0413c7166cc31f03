// Tokens a generation must emit whatever it samples: once its output ends with `after` (from its
// first token when `after` is empty), its next tokens are `tokens`, each fed back as the model's
// input as a sampled token would be; then it samples freely again. A stop token sampled while
// `after` is awaited is replaced by `after` itself, so the forced tokens still come. With an
// `opener`, `after` is awaited only when the output's first token is the opener; any other first
// token is replaced by `at_once` instead. kiln serve forces the opening of a tool call
// this way when a request requires one (tool_choice "required" or a named function): after the
// reasoning's end when the prompt opened the reasoning, or when the model opens it itself (Gemma 4
// with thinking on), at once otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln {

struct ForcedTokens {
  std::vector<int32_t> after;
  std::vector<int32_t> tokens;
  int32_t opener = -1;           // with `after`: the first token that makes `tokens` wait for it
  std::vector<int32_t> at_once;  // with an opener: what replaces any other first token
};

// One generation's progress through its ForcedTokens.
class ForcedContinuation {
 public:
  ForcedContinuation() = default;
  ForcedContinuation(ForcedTokens forced, std::vector<int32_t> stop_ids);
  // The token to emit in place of `sampled`; called once for every output token, in order.
  int32_t choose(int32_t sampled);

 private:
  ForcedTokens forced_;
  std::vector<int32_t> stop_ids_;
  bool deciding_ = false;       // the first token, which decides whether `after` is awaited
  bool awaiting_ = false;       // `after` not yet seen
  std::vector<int32_t> queue_;  // tokens to emit next, in place of sampled ones
  size_t next_ = 0;             // of queue_, emitted
  std::vector<int32_t> tail_;   // the last output tokens, as many as `after` holds
};

}  // namespace kiln
