// What the decode products of quantized weights share between their kernels: the products of one
// launch, an input chunk's quantization to int16, and the tensor-core pass of the 4-bit products
// (cuda_quant_gemv.cu runs the GEMVs and the dp2a products, cuda_quant_mma.cu the tensor-core ones).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace kiln::cuda {

// The products of one launch: up to four weights sharing the input, all of one width, group size and
// input size k. Blocks [block_end[s-1], block_end[s]) compute product s. A GLU launch holds gate (0)
// and up (1) and writes out[0].
constexpr int kMaxProducts = 4;
struct QProducts {
  const uint32_t* packed[kMaxProducts];
  const bf16* scales[kMaxProducts];
  const bf16* biases[kMaxProducts];
  void* out[kMaxProducts];
  int64_t ldo[kMaxProducts];
  int64_t n[kMaxProducts];
  int block_end[kMaxProducts];
  int count;
  int64_t k;
  int group_shift;  // log2(group_size / 32): a chunk's group is c >> group_shift
};

// A 32-element input chunk of the integer products: its values in element order, their sum (in
// element order) and largest magnitude, and the factor 32767 / max |x| that quantizes it (0 for a
// zero chunk). Both input layouts (dp2a pairs, MMA bytes) quantize through it, so they hold the same integers.
struct InputChunk {
  float v[32];
  float inv, step, sum;

  __device__ __forceinline__ void read(const bf16* __restrict__ src) {
    const uint4* words = reinterpret_cast<const uint4*>(src);
    uint4 raw[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) raw[q] = words[q];
    from(raw);
  }
  __device__ __forceinline__ void from(const uint4 (&raw)[4]) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint32_t w[4] = {raw[q].x, raw[q].y, raw[q].z, raw[q].w};
#pragma unroll
      for (int j = 0; j < 4; ++j)
        v[8 * q + 2 * j] = __uint_as_float(w[j] << 16), v[8 * q + 2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
    float amax = 0.0f;
    sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(v[j])), sum += v[j];
    inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
    step = amax * (1.0f / 32767.0f);
  }
  __device__ __forceinline__ int quantized(int j) const {
    return __float2int_rn(v[j] * inv);
  }
};

// One pass of the 4-bit products on the tensor cores over the first of `rows_left` rows of xs (a GLU
// launch: `products` = 1 output, gate and up in p), with the dp2a kernel's bits (its `parts`); returns
// the rows it took, 0 where the tensor cores do not take this pass (too few rows, or too few fit).
int run_tensor_core_pass(QProducts p, int products, bool glu, bool gelu, const bf16* xs, int64_t ldx, int64_t rows_left,
                         int parts, bool f32_out, cudaStream_t stream);

}  // namespace kiln::cuda
