// Tokens a generation must emit whatever it samples: once its output ends with `after` (from its
// first token when `after` is empty), its next tokens are `tokens`, each fed back as the model's
// input as a sampled token would be; then it samples freely again. A stop token sampled while
// `after` is awaited is replaced by `after` itself, so the forced tokens still come. With an
// `opener`, `after` is awaited only when the output's first token is the opener; any other first
// token is replaced by `at_once` instead. kiln serve forces the opening of a tool call
// this way when a request requires one (tool_choice "required" or a named function): after the
// reasoning's end when the prompt opened the reasoning, or when the model opens it itself (Gemma 4
// with thinking on), at once otherwise.
//
// A reasoning budget caps the reasoning (Anthropic's thinking.budget_tokens, vLLM's
// thinking_token_budget): once that many tokens have come inside it, its closing marker is
// forced, and the model goes on to its answer. Forced tokens count as output like sampled ones, so
// a closing marker forced by the budget is also what a forced tool call may be waiting for.
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
  // The reasoning's cap in tokens (-1: none). It is open from the first token when
  // `reasoning_opener` is -1, else from where the output writes that token, and closed where the
  // output writes `reasoning_close` (needed for a cap).
  int64_t reasoning_budget = -1;
  int32_t reasoning_opener = -1;
  std::vector<int32_t> reasoning_close;
};

// One generation's progress through its ForcedTokens.
class ForcedContinuation {
 public:
  ForcedContinuation() = default;
  ForcedContinuation(ForcedTokens forced, std::vector<int32_t> stop_ids);
  // The token to emit in place of `sampled`; called once for every output token, in order.
  int32_t choose(int32_t sampled);

 private:
  int32_t pick(int32_t sampled);
  void watch(int32_t token);                       // follows the output as emitted, forced tokens included
  void force(const std::vector<int32_t>& tokens);  // queued after what is queued still

  ForcedTokens forced_;
  std::vector<int32_t> stop_ids_;
  bool deciding_ = false;       // the first token, which decides whether `after` is awaited
  bool awaiting_ = false;       // `after` not yet seen
  std::vector<int32_t> queue_;  // tokens to emit next, in place of sampled ones
  size_t next_ = 0;             // of queue_, emitted
  std::vector<int32_t> tail_;   // the last output tokens, as many as `after` holds
  bool capped_ = false;         // a reasoning budget applies
  bool reasoning_ = false;      // inside the reasoning
  int64_t reasoning_tokens_ = 0;
  std::vector<int32_t> reasoning_tail_;  // the last tokens inside it, as many as its close holds
};

}  // namespace kiln
