// The shape of one forward call, which every layer of a model shares.
#pragma once

#include <vector>

#include "layers/sequence_state.h"
#include "ops/backend.h"

namespace kiln {

struct BatchLayout {
  int64_t n_tokens = 0;
  std::vector<SeqRows> seqs;           // one per sequence in the batch
  std::vector<SequenceState*> states;  // same order as seqs
  Tensor positions;                    // [n_tokens] i32, on the backend
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
