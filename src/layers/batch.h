// The shape of one forward call, which every layer of a model shares.
#pragma once

#include <vector>

#include "layers/sequence_state.h"
#include "ops/backend.h"

namespace kiln {

// Rows of the batch that embed as given rows (an image's encoding) instead of their token ids.
struct SoftRows {
  int64_t row = 0;  // first row of the batch they replace
  Tensor rows;      // [n, hidden] on the backend
};

struct BatchLayout {
  int64_t n_tokens = 0;
  std::vector<SeqRows> seqs;           // one per sequence in the batch
  std::vector<SequenceState*> states;  // same order as seqs
  Tensor positions;                    // [n_tokens] i32, on the backend: each token's index in its sequence
  // Rotary positions [axes, n_tokens] i32 on the backend, for models that ask for them (several
  // axes, or positions a prompt laid out itself); undefined otherwise: the rotation follows
  // `positions`.
  Tensor rope_positions;
  std::vector<int64_t> next_rope_offsets;  // per sequence, its rope offset after this batch
  std::vector<SoftRows> soft;              // by increasing row
  // For models that ask for image spans, when the batch holds soft tokens: [n_tokens, 2] i32 on the
  // backend, per row the first and last position of the run of soft tokens it belongs to (adjacent
  // images make one run, as transformers groups contiguous image tokens), and an empty range
  // (last < first) for other rows: AttentionArgs::blocks of bidirectional attention over images.
  Tensor soft_spans;
};

// How a model reads a batch beyond its token ids.
struct BatchNeeds {
  int64_t rope_axes = 0;  // rotary position axes it rotates by (0: it follows token indices alone)
  int64_t hidden = 0;     // width of soft-token rows (0: the model takes no images)
  // Images attend to themselves bidirectionally: the layout carries soft_spans, and an image's soft
  // tokens must all come in one chunk (a chunk that splits an image is refused; whoever chunks a
  // prompt keeps each image's placeholders together).
  bool image_spans = false;
};

// A batch ready to run: its layout and its token ids, on the backend.
struct PreparedBatch {
  BatchLayout layout;
  Tensor ids;  // [n_tokens] i32
};

// The residual update `then` applied to a block's output.
inline ResidualNormArgs reading(const ResidualNormArgs& then, const Tensor& block_out) {
  ResidualNormArgs args = then;
  args.block_out = block_out;
  return args;
}

// out = x · wᵀ as the last step of a block. With `then`, the residual update that reads the block's
// output runs with the product as one op, which saves a launch per block at decode.
inline void output_projection(Backend& backend, const Tensor& x, const Tensor& w, Tensor& out,
                              const ResidualNormArgs* then) {
  if (!then) return backend.matmul(x, w, out);
  backend.matmul_residual_norm(x, w, reading(*then, out));
}

}  // namespace kiln
