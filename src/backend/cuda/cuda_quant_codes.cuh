// Packed codes of MLX's affine quantization (src/quant/affine.h) as CUDA kernels read them: a
// matrix's view, one 32-element chunk's words, its codes as exact floats, and the integer
// products' dot of a chunk's codes against int16 input pairs. Shared by the quantized products
// (cuda_quant.cu, cuda_quant_gemv.cu) and the grouped experts (cuda_moe.cu).
//
// Turning codes into floats is what bounds these kernels, not the multiply: an integer-to-float
// conversion runs at a quarter of the FMA rate. So a code goes into the mantissa of a float whose
// exponent is fixed instead: f = 0.5 + q · 2^-(BITS+1) for the general widths (one shift and one
// LOP3), f = 0.5 + q / 256 for 4 bits (one byte permute per code after splitting nibbles into
// bytes).
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "core/tensor.h"
#include "quant/tiles.h"

namespace kiln::cuda {

// A quantized matrix as the kernels read it: scales and biases are bf16 on the device, in MLX's
// row layout or the tiled one (src/quant/tiles.h, `tiled`). The expert kernels also take a plain
// bf16 stack through it (`values` set), since a checkpoint may leave one projection of the experts
// unquantized.
struct QView {
  const uint32_t* packed;
  const bf16* scales;
  const bf16* biases;
  const bf16* values;  // a dense bf16 matrix instead
  int64_t rows = 0, cols = 0;
  int bits = 0, group_size = 0;
  bool tiled = false;
  __device__ __forceinline__ quant::TileLayout layout() const {
    return quant::make_tile_layout(rows, cols, bits, group_size);
  }
  __device__ __forceinline__ int64_t groups() const { return cols / group_size; }
  // row r's codes in the row layout (stacks of experts, which are never tiled)
  __device__ __forceinline__ const uint32_t* row_words(int64_t r) const { return packed + r * (cols / 32) * bits; }
  // the `bits` words of chunk c (columns 32c .. 32c + 31) of row r
  __device__ __forceinline__ const uint32_t* chunk_words(int64_t r, int64_t c) const {
    if (tiled)
      return reinterpret_cast<const uint32_t*>(reinterpret_cast<const char*>(packed) + layout().chunk_offset(r, c));
    return packed + (r * (cols / 32) + c) * bits;
  }
  // the scale and bias of group g of row r
  __device__ __forceinline__ float2 scale_bias(int64_t r, int64_t g) const {
    if (tiled) {
      const quant::TileLayout t = layout();
      const char* at = reinterpret_cast<const char*>(packed) + t.scale_offset(r, g);
      return make_float2(__bfloat162float(*reinterpret_cast<const bf16*>(at)),
                         __bfloat162float(*reinterpret_cast<const bf16*>(at + t.bias_distance(r, g))));
    }
    return make_float2(__bfloat162float(scales[r * groups() + g]), __bfloat162float(biases[r * groups() + g]));
  }
};

inline QView view_of(const Tensor& w) {
  if (!w.quantized())
    return QView{.packed = nullptr,
                 .scales = nullptr,
                 .biases = nullptr,
                 .values = w.data_as<bf16>(),
                 .rows = w.rows(),
                 .cols = w.cols()};
  const QuantParams& q = w.quant();
  const bool tiled = q.tiled_bytes != 0;
  return QView{.packed = static_cast<const uint32_t*>(w.data()),
               .scales = tiled ? nullptr : q.scales.data_as<bf16>(),
               .biases = tiled ? nullptr : q.biases.data_as<bf16>(),
               .values = nullptr,
               .rows = w.rows(),
               .cols = w.cols(),
               .bits = q.bits,
               .group_size = q.group_size,
               .tiled = tiled};
}

// The BITS words of codes of one 32-element chunk.
template <int BITS>
__device__ __forceinline__ void load_chunk(const uint32_t* p, uint32_t (&w)[BITS]) {
  if constexpr (BITS == 4 || BITS == 8) {
#pragma unroll
    for (int i = 0; i < BITS / 4; ++i) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
      w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
  } else if constexpr (BITS == 2 || BITS == 6) {
#pragma unroll
    for (int i = 0; i < BITS / 2; ++i) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(p) + i);
      w[2 * i] = v.x, w[2 * i + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < BITS; ++i) w[i] = __ldg(p + i);
  }
}

// Calls f(std::integral_constant<int, BITS>) for a runtime width (kernels and host code alike).
template <typename F>
__host__ __device__ __forceinline__ void with_bits(int bits, F&& f) {
  switch (bits) {
    case 2:
      f(std::integral_constant<int, 2>{});
      break;
    case 3:
      f(std::integral_constant<int, 3>{});
      break;
    case 4:
      f(std::integral_constant<int, 4>{});
      break;
    case 5:
      f(std::integral_constant<int, 5>{});
      break;
    case 6:
      f(std::integral_constant<int, 6>{});
      break;
    default:
      f(std::integral_constant<int, 8>{});
      break;
  }
}

// Calls f(std::integral_constant<int, M>{}) with M ≥ rows (1..8) among 1, 2, 4, 8; the kernels stop at
// `rows` (the decode products' passes of input rows).
template <typename F>
void dispatch_pass_rows(int rows, F&& f) {
  if (rows == 1)
    f(std::integral_constant<int, 1>{});
  else if (rows == 2)
    f(std::integral_constant<int, 2>{});
  else if (rows <= 4)
    f(std::integral_constant<int, 4>{});
  else
    f(std::integral_constant<int, 8>{});
}

// Σ x·f over one chunk, with f(q) = 0.5 + q · 2^-(BITS+1) (4 bits: q / 256), and the factor that
// turns it back into Σ x·q.
template <int BITS>
struct ChunkCodes {
  float f[32];
  static constexpr float kScale = BITS == 4 ? 256.0f : float(2 << BITS);

  __device__ __forceinline__ void unpack(const uint32_t (&w)[BITS]) {
    if constexpr (BITS == 4) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // word j holds codes 8j .. 8j+7, four bits each
        const uint32_t lo = w[j] & 0x0f0f0f0fu, hi = (w[j] >> 4) & 0x0f0f0f0fu;
#pragma unroll
        for (int b = 0; b < 4; ++b) {  // byte b of lo: code 2b; of hi: code 2b+1 -> bits 16..23 of 0x3f000000
          f[8 * j + 2 * b] = __uint_as_float(__byte_perm(lo, 0x3f000000u, 0x7044u | (unsigned(b) << 8)));
          f[8 * j + 2 * b + 1] = __uint_as_float(__byte_perm(hi, 0x3f000000u, 0x7044u | (unsigned(b) << 8)));
        }
      }
    } else {
      constexpr int kTop = 23 - BITS;  // the code's place in the mantissa
      constexpr uint32_t kMask = ((1u << BITS) - 1u) << kTop;
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int pos = i * BITS, word = pos / 32, shift = pos % 32;
        uint32_t v;
        if (shift + BITS > 32)
          v = __funnelshift_r(w[word], w[word + 1], shift) << kTop;
        else
          v = shift >= kTop ? w[word] >> (shift - kTop) : w[word] << (kTop - shift);
        f[i] = __uint_as_float((v & kMask) | 0x3f000000u);
      }
    }
  }
};

// The 32 codes of a chunk's words as exact floats, through ChunkCodes' mantissa placement (one FMA
// each instead of an integer conversion): q = kScale · f − kScale / 2.
template <int BITS>
__device__ __forceinline__ void chunk_values(const uint32_t (&words)[BITS], float (&q)[32]) {
  ChunkCodes<BITS> codes;
  codes.unpack(words);
#pragma unroll
  for (int i = 0; i < 32; ++i) q[i] = fmaf(codes.f[i], ChunkCodes<BITS>::kScale, -0.5f * ChunkCodes<BITS>::kScale);
}

// A chunk's 32 weights s·q + b as bf16, written as four 16-byte stores at dst (16-byte aligned):
// the dequantized rows cuBLAS and the grouped experts multiply.
__device__ __forceinline__ void store_dequantized(const float (&q)[32], float s, float b, uint4* dst) {
#pragma unroll
  for (int v = 0; v < 4; ++v) {
    uint4 packed;
    __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
    for (int j = 0; j < 4; ++j)
      pairs[j] = __floats2bfloat162_rn(fmaf(s, q[8 * v + 2 * j], b), fmaf(s, q[8 * v + 2 * j + 1], b));
    dst[v] = packed;
  }
}

// Two int16 inputs (a pair) times two unsigned bytes of codes, added to acc: bytes 0 and 1 of
// `bytes` (lo) or bytes 2 and 3 (hi). The integer products' inner step.
__device__ __forceinline__ int dp2a_lo(uint32_t pair, uint32_t bytes, int acc) {
  int d;
  asm("dp2a.lo.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(pair), "r"(bytes), "r"(acc));
  return d;
}
__device__ __forceinline__ int dp2a_hi(uint32_t pair, uint32_t bytes, int acc) {
  int d;
  asm("dp2a.hi.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(pair), "r"(bytes), "r"(acc));
  return d;
}

// A word's codes as bytes: byte register t = (w >> t·BITS) & kMask holds codes j·S + t in byte j.
template <int BITS>
struct ByteCodes {
  static constexpr int S = 8 / BITS;  // codes in a byte
  static constexpr uint32_t kMask = 0x01010101u * ((1u << BITS) - 1u);
};

// The codes whose inputs int16 pair p of a chunk holds (half 0: low 16 bits): pair i·2S + 2t + h
// meets byte register t of word i, under dp2a.lo (h = 0: bytes 0, 1) or dp2a.hi (h = 1: bytes 2, 3).
template <int BITS>
__host__ __device__ constexpr int code_of_pair(int p, int half) {
  constexpr int S = ByteCodes<BITS>::S;
  const int i = p / (2 * S), t = (p % (2 * S)) / 2, h = p % 2;
  return i * 4 * S + (2 * h + half) * S + t;
}

// Element i of product output `out`, f32 or bf16.
__device__ __forceinline__ void store_output(void* out, int64_t i, float v, bool f32) {
  if (f32)
    static_cast<float*>(out)[i] = v;
  else
    static_cast<bf16*>(out)[i] = __float2bfloat16(v);
}

// Chunk c of input row m as the integer products keep their inputs in shared memory: piece v
// (pairs 4v .. 4v+3) at pieces[(m·4 + v)·chunks + c], so that lanes taking consecutive chunks read
// consecutive 16 bytes. Fills the chunk's 16 pairs and returns its (step, sum).
__device__ __forceinline__ float2 input_chunk(const uint4* pieces, const float2* stats, int m, int chunks, int c,
                                              uint32_t (&pairs)[16]) {
#pragma unroll
  for (int v = 0; v < 4; ++v) {
    const uint4 p = pieces[(m * 4 + v) * chunks + c];
    pairs[4 * v] = p.x, pairs[4 * v + 1] = p.y, pairs[4 * v + 2] = p.z, pairs[4 * v + 3] = p.w;
  }
  return stats[m * chunks + c];
}

// Σ xq·q over one chunk: its BITS words of codes against its 16 input pairs.
template <int BITS>
__device__ __forceinline__ int chunk_dot(const uint32_t (&w)[BITS], const uint32_t (&pairs)[16]) {
  using C = ByteCodes<BITS>;
  int lo = 0, hi = 0;
#pragma unroll
  for (int i = 0; i < BITS; ++i)
#pragma unroll
    for (int t = 0; t < C::S; ++t) {
      const uint32_t bytes = (w[i] >> (t * BITS)) & C::kMask;
      lo = dp2a_lo(pairs[i * 2 * C::S + 2 * t], bytes, lo);
      hi = dp2a_hi(pairs[i * 2 * C::S + 2 * t + 1], bytes, hi);
    }
  return lo + hi;
}

// The 32 codes of the chunk at p as exact floats.
template <int BITS>
__device__ __forceinline__ void unpack32(const uint32_t* p, float (&q)[32]) {
  uint32_t words[BITS];
  load_chunk<BITS>(p, words);
  chunk_values<BITS>(words, q);
}

}  // namespace kiln::cuda
