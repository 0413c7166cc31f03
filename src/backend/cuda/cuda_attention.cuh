// What the attention kernels share: the table of sequences a launch covers and the parameters of
// a prefill launch (cuda_attention.cu, cuda_flash_prefill.cu, cuda_decode_attention.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.cuh"

namespace kiln::cuda {

constexpr int kMaxSeqs = 64;  // sequences per launch; larger batches are split

struct SeqDesc {
  int64_t row_begin;
  int64_t n_rows;
  bf16* k;
  bf16* v;
  int32_t* slot_pos;
  int64_t capacity;
  int tile_begin;
};

struct SeqTable {
  int n;
  SeqDesc seq[kMaxSeqs];
};

__device__ __forceinline__ int find_seq(const SeqTable& t, int64_t row) {
  int s = 0;
  while (s + 1 < t.n && t.seq[s + 1].row_begin <= row) ++s;
  return s;
}

// The table of sequences [begin, begin + kMaxSeqs) of a launch; tile_begin left 0.
SeqTable make_table(const std::vector<SeqRows>& seqs, const std::vector<KvCacheView>& caches, size_t begin);

struct AttnParams {
  const bf16* q;
  bf16* out;
  const int32_t* positions;
  int n_heads, n_kv_heads, group, head_dim;
  int tokens_per_tile;
  float scale;
  int64_t window;
  // bidirectional blocks: [first, last] per row, or null (AttentionArgs::blocks)
  const int32_t* blocks;
  bool block_window;
  int total_tiles;
  SeqTable seqs;
};

// Whether a key at position kp is visible to a query at qp whose block is [first, last] (an empty
// block when last < first), under AttentionArgs' rule.
__device__ __forceinline__ bool key_visible(int kp, int qp, int first, int last, int64_t window, bool block_window) {
  if (kp < 0) return false;
  const bool in_block = first <= kp && kp <= last;
  const bool in_window = window <= 0 || int64_t(qp) - kp < window;
  return block_window ? (kp <= qp || in_block) && in_window : (kp <= qp && in_window) || in_block;
}

// Query rows per block of the flash prefill kernel; tokens_per_tile follows from it.
constexpr int kFlashRows = 64;
// Whether the flash prefill kernel takes this head dim and GQA group on this device.
bool flash_prefill_fits(int head_dim, int group);
// One launch of the flash prefill kernel over params.total_tiles tiles of kFlashRows rows.
void flash_prefill(const AttnParams& params, cudaStream_t stream);

// Decode (cuda_decode_attention.cu): rows of at most kDecodeMaxRows a sequence, head dims up to
// kMaxDecodeDim in multiples of 8, any output gate in bf16.
constexpr int kDecodeMaxRows = 4;
constexpr int kMaxDecodeDim = 512;
bool decode_attention_takes(const AttentionArgs& args);
void decode_attention(const AttentionArgs& args, const Allocate& allocate, cudaStream_t stream);

}  // namespace kiln::cuda
