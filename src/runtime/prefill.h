// Feeding a token list through one sequence in bounded chunks.
#pragma once

#include <span>

#include "models/model.h"
#include "runtime/sampler.h"

namespace kiln {

// Runs `tokens` through `state` `chunk` tokens at a time (capped at the model's largest chunk) and
// returns host f32 logits: [tokens, vocab] for LogitRows::all, [1, vocab] (the last token) for last.
Result<Tensor> run_tokens(Model& model, SequenceState& state, std::span<const int32_t> tokens, int64_t chunk,
                          LogitRows rows);

// One token through `state`; its logits [1, vocab] stay on the model's device.
Result<Tensor> run_token(Model& model, SequenceState& state, int32_t token);

// The next token drawn from the last row of `logits` (f32 on the host, or on the model's device).
// From a GPU, a greedy or top_k draw (draws_from_top_k) brings back only the candidates
// (Backend::top_k), anything else the whole row. With `check_finite`, logits the draw cannot use are an error naming
// `generated_index`: any non-finite value of a row brought back, a best candidate that is not finite.
Result<int32_t> draw_next(Model& model, const Tensor& logits, Sampler& sampler, std::span<const int32_t> history,
                          bool check_finite, int64_t generated_index);

// The next token drawn from a row's best candidates (values best first, and their ids), as
// draw_next draws from them: the first when greedy.
Result<int32_t> draw_from_candidates(Sampler& sampler, std::span<const float> values, std::span<const int32_t> ids,
                                     int64_t vocab, bool check_finite, int64_t generated_index);

}  // namespace kiln
