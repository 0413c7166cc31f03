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

// How the caches of a launch store keys and values (KvQuant): bf16 rows (bits 0), or codes of
// `bits` per element with an f16 scale and bias per `group` elements of a head.
struct KvFormat {
  int bits;
  int group;
};

struct SeqDesc {
  int64_t row_begin;
  int64_t n_rows;
  bf16* k;  // bf16 rows, or a quantized cache's codes
  bf16* v;
  int32_t* slot_pos;
  int64_t capacity;
  int tile_begin;
  // a quantized cache's scales and biases [capacity, n_kv_heads, head_dim / group] (null otherwise)
  __half* k_scale;
  __half* k_bias;
  __half* v_scale;
  __half* v_bias;
};

struct SeqTable {
  int n;
  KvFormat format;  // the same for every sequence: they are one layer's caches
  SeqDesc seq[kMaxSeqs];
};

// Eight elements [c8, c8 + 8) of row `head_row` (slot · n_kv_heads + kv head) of a quantized cache's
// keys or values, dequantized (code · scale + bias in f32) and rounded to bf16.
__device__ __forceinline__ uint4 load_kv8_codes(const bf16* data, const __half* scales, const __half* biases,
                                                KvFormat f, int64_t head_row, int head_dim, int c8) {
  const auto* codes = reinterpret_cast<const unsigned char*>(data) + (head_row * head_dim + c8) * f.bits / 8;
  const int64_t g = head_row * (head_dim / f.group) + c8 / f.group;
  const float s = __half2float(scales[g]), b = __half2float(biases[g]);
  float x[8];
  if (f.bits == 8) {
    const uint2 raw = *reinterpret_cast<const uint2*>(codes);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[i] = fmaf(s, float((raw.x >> (8 * i)) & 0xffu), b);
      x[4 + i] = fmaf(s, float((raw.y >> (8 * i)) & 0xffu), b);
    }
  } else {  // 4 bits: element i in bits [4i, 4i + 4)
    const unsigned raw = *reinterpret_cast<const unsigned*>(codes);
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = fmaf(s, float((raw >> (4 * i)) & 0xfu), b);
  }
  uint4 out;
  unsigned* w = reinterpret_cast<unsigned*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
    w[i] = *reinterpret_cast<const unsigned*>(&pair);
  }
  return out;
}

// The same eight elements of a bf16 cache or a quantized one, as the format says.
__device__ __forceinline__ uint4 load_kv8(const bf16* data, const __half* scales, const __half* biases, KvFormat f,
                                          int64_t head_row, int head_dim, int c8) {
  if (f.bits == 0) return *reinterpret_cast<const uint4*>(data + head_row * head_dim + c8);
  return load_kv8_codes(data, scales, biases, f, head_row, head_dim, c8);
}

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
