// Feeding a token list through one sequence in bounded chunks.
#pragma once

#include <span>

#include "models/model.h"

namespace kiln {

// Runs `tokens` through `state` `chunk` tokens at a time (capped at the model's largest chunk) and
// returns host f32 logits: [tokens, vocab] for LogitRows::all, [1, vocab] (the last token) for last.
Result<Tensor> run_tokens(Model& model, SequenceState& state, std::span<const int32_t> tokens, int64_t chunk,
                          LogitRows rows);

}  // namespace kiln
