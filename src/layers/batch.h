// The shape of one forward call, which every layer of a model shares.
#pragma once

#include <vector>

#include "ops/backend.h"
#include "runtime/sequence_state.h"

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

}  // namespace kiln
