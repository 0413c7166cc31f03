// Choosing the next token from logits: penalties, temperature, top-k, top-p, min-p, and a seeded
// random draw (greedy when the temperature is 0). Reproducible: same seed, same choices.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "ops/backend.h"

namespace kiln {

struct SamplingParams {
  float temperature = 1.0f;         // 0: greedy
  int top_k = 0;                    // 0: off
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off
  float repetition_penalty = 1.0f;  // transformers': divide positive logits, multiply negative ones
  float presence_penalty = 0.0f;    // OpenAI's: subtract once for every token already present
  float frequency_penalty = 0.0f;   // OpenAI's: subtract per occurrence
  // OpenAI's logit_bias: (token id, bias) added to the logits before the penalties; -100 bans a token.
  std::vector<std::pair<int32_t, float>> logit_bias;
  uint64_t seed = 0;
};

// OpenAI's bound on a logit bias, either way.
constexpr double kMaxLogitBias = 100;
// The first biased token id outside a vocabulary of `vocab_size` (which the sampler would skip).
std::optional<int32_t> biased_token_outside(const SamplingParams& params, int64_t vocab_size);

// The log-probability of a chosen token under the model's own distribution (the log-softmax of the
// raw logits, before biases, penalties and temperature), and the `top` most likely tokens'.
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
};
struct SampledLogprobs {
  float logprob = 0;
  std::vector<TokenLogprob> top;  // most likely first; ties keep the lower id first
};
SampledLogprobs logprobs_of(std::span<const float> logits, int32_t token, int top);

// Greedy without penalties or biases: the next token is the argmax of the logits alone.
bool plain_greedy(const SamplingParams& params);

// Whether a draw with these parameters needs only the top_k most likely tokens of the logits over
// the temperature (Backend::top_k): sampling with 0 < top_k <= Backend::kMaxTopK, top_k below the
// vocabulary, and no biases or penalties, which would change the order before the cut.
bool draws_from_top_k(const SamplingParams& params, int64_t vocab_size);

class Sampler {
 public:
  explicit Sampler(SamplingParams params) : params_(params), rng_(params.seed) {}

  // `history`: the tokens the penalties look at (prompt and generated so far).
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);
  // The same draw from Backend::top_k's answer for one row (draws_from_top_k holds): `values` the
  // logits over the temperature of `ids`, most likely first, ties to the lower id.
  int32_t sample_top_k(std::span<const float> values, std::span<const int32_t> ids, int64_t vocab_size);

  const SamplingParams& params() const { return params_; }

 private:
  // Moves the smallest set of most likely candidates whose weights reach `target` to the front of
  // order_ and returns its size.
  template <typename Before>
  size_t nucleus(double target, const Before& before);
  // The draw from order_'s candidates (the top_k, most likely first, when `cut_to_top_k`; otherwise
  // every id) with the logits over the temperature in work_.
  int32_t draw(bool cut_to_top_k);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> work_;     // the logits as the draw sees them, by id
  std::vector<float> weights_;  // exp(logit - the largest), by id
  std::vector<int32_t> order_;  // the candidates
};

}  // namespace kiln
