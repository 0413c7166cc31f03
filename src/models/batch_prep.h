// What every model's forward does first and last: check and lay out the batch, and pick the rows
// whose logits are wanted.
#pragma once

#include <span>
#include <vector>

#include "layers/batch.h"
#include "models/model.h"

namespace kiln {

// Checks token ids against the vocabulary, chunk sizes against max_chunk and context room, soft
// tokens and laid-out positions against what the model takes, then concatenates the chunks'
// tokens and uploads ids and positions.
Result<PreparedBatch> prepare_batch(Backend& backend, std::span<const SeqChunk> batch, int64_t vocab_size,
                                    int64_t max_chunk, const BatchNeeds& needs = {});

// Overwrites the rows of `embeddings` [T, hidden] that soft tokens replace.
void place_soft_tokens(Backend& backend, const BatchLayout& layout, Tensor& embeddings);

// The rows of h [T, hidden] whose logits are wanted.
Tensor select_rows(Backend& backend, const Tensor& h, const BatchLayout& layout, LogitRows rows);
// Whether select_rows gives every row of h in order (all rows wanted, or a decode step's one row a
// sequence): then the final norm can come with the last residual update.
bool selects_every_row(const BatchLayout& layout, LogitRows rows);

// Moves every sequence past the tokens it just consumed (and its rope offset to where the batch left it).
void advance_sequences(const BatchLayout& layout);

}  // namespace kiln
