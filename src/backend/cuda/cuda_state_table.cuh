// The sequences of a recurrent op's launch (the causal conv, the gated delta rule): each one's
// rows of the batch and its state, passed to the kernels by value.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_ops.cuh"

namespace kiln::cuda {

struct StateSeq {
  int64_t row_begin;
  int64_t n_rows;
  void* state;  // conv: [kernel - 1, channels] activation dtype; delta rule: [Hv, Dk, Dv] f32
};

struct StateTable {
  int n;
  StateSeq seq[kMaxDeltaSeqs];
};

}  // namespace kiln::cuda
