// CUDA backend: lookups, prefill products and experts of quantized weights (MLX's affine format,
// src/quant/affine.h). The decode products are in cuda_quant_gemv.cu.
//
// Prefill: dequantize_rows expands a block of rows into bf16 scratch for cuBLAS (the caller bounds
// the block); see cuda_backend.cpp for the sizes.
// Experts: the routed (token, slot) pairs run as GEMVs over the chosen expert's packed rows, as the
// bf16 expert path does.
#include <algorithm>
#include <cassert>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.cuh"
#include "backend/cuda/cuda_quant_codes.cuh"
#include "core/tensor.h"

namespace kiln::cuda {

namespace {

constexpr int kWarps = 8;

// ---- prefill: dequantize a block of rows for cuBLAS ----

template <int BITS>
__global__ void dequantize_kernel(QView w, int64_t row_begin, int64_t n_rows, bf16* __restrict__ out) {
  wait_for_inputs();
  const int64_t chunks = w.cols / 32;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_rows * chunks) return;
  const int64_t r = i / chunks, c = i % chunks, row = row_begin + r;
  float q[32];
  unpack32<BITS>(w.chunk_words(row, c), q);
  const float2 sb = w.scale_bias(row, c * 32 / w.group_size);
  store_dequantized(q, sb.x, sb.y, reinterpret_cast<uint4*>(out + r * w.cols + c * 32));
}

// ---- embedding rows ----

template <int BITS, typename O>
__global__ void embed_kernel(QView table, const int32_t* ids, Rows<O> out, int64_t n, float scale) {
  wait_for_inputs();
  const int64_t t = blockIdx.x;
  if (t >= n) return;
  int64_t id = ids[t];
  id = id < 0 ? 0 : (id >= table.rows ? table.rows - 1 : id);  // ids are validated on the host
  O* dst = out.row(t);
  for (int64_t c = threadIdx.x; c < table.cols / 32; c += blockDim.x) {
    float q[32];
    unpack32<BITS>(table.chunk_words(id, c), q);
    const float2 sb = table.scale_bias(id, c * 32 / table.group_size);
#pragma unroll
    for (int j = 0; j < 32; ++j) dst[c * 32 + j] = from_float<O>(fmaf(sb.x, q[j], sb.y) * scale);
  }
}

// ---- experts ----

// row · xs over a quantized row, xs in shared memory (f32); the warp's lanes split the chunks
__device__ __forceinline__ float quant_dot(const QView& w, int64_t row, const float* xs, int lane) {
  float acc = 0.0f;
  if (w.values) {
    const bf16* r = w.values + row * w.cols;
    for (int64_t i = lane; i < w.cols; i += 32) acc = fmaf(__bfloat162float(r[i]), xs[i], acc);
    return warp_sum(acc);
  }
  with_bits(w.bits, [&](auto bits_tag) {
    constexpr int BITS = decltype(bits_tag)::value;
    const int64_t per_group = w.group_size / 32;
    for (int64_t c = lane; c < w.cols / 32; c += 32) {
      float q[32];
      unpack32<BITS>(w.chunk_words(row, c), q);
      const float2 sb = w.scale_bias(row, c / per_group);
      float dot = 0.0f, sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        dot = fmaf(xs[c * 32 + j], q[j], dot);
        sum += xs[c * 32 + j];
      }
      acc = fmaf(sb.x, dot, fmaf(sb.y, sum, acc));
    }
  });
  return warp_sum(acc);
}

template <typename T>
__global__ void expert_up_kernel(Rows<const T> x, const int32_t* ids, QView gate, QView up, float* act, int64_t hidden,
                                 int64_t inter, int top_k, bool gelu) {
  wait_for_inputs();
  extern __shared__ float xs[];
  const int64_t pair = blockIdx.x;
  const int64_t t = pair / top_k, e = ids[pair];
  for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x) xs[c] = to_float(x.row(t)[c]);
  __syncthreads();
  const int lane = threadIdx.x % 32;
  const int64_t i = int64_t(blockIdx.y) * (blockDim.x / 32) + threadIdx.x / 32;
  if (i >= inter) return;
  const float g = quant_dot(gate, e * inter + i, xs, lane);
  const float u = quant_dot(up, e * inter + i, xs, lane);
  if (lane == 0) act[pair * inter + i] = (gelu ? gelu_tanh(g) : silu(g)) * u;
}

__global__ void expert_down_kernel(const float* act, const int32_t* ids, QView down, float* y, int64_t hidden,
                                   int64_t inter) {
  wait_for_inputs();
  extern __shared__ float as[];
  const int64_t pair = blockIdx.x, e = ids[pair];
  for (int64_t i = threadIdx.x; i < inter; i += blockDim.x) as[i] = act[pair * inter + i];
  __syncthreads();
  const int lane = threadIdx.x % 32;
  const int64_t c = int64_t(blockIdx.y) * (blockDim.x / 32) + threadIdx.x / 32;
  if (c >= hidden) return;
  const float d = quant_dot(down, e * hidden + c, as, lane);
  if (lane == 0) y[pair * hidden + c] = d;
}

}  // namespace

void dequantize_rows(const Tensor& w, int64_t row_begin, int64_t n_rows, Tensor& out, cudaStream_t stream) {
  const QView v = view_of(w);
  const int64_t work = n_rows * (v.cols / 32);
  if (work == 0) return;
  with_bits(v.bits, [&](auto tag) {
    launch(dequantize_kernel<decltype(tag)::value>, ceil_div(work, 256), 256, 0, stream, v, row_begin, n_rows,
           out.data_as<bf16>());
  });
}

void quantized_embed(const Tensor& ids, const Tensor& table, float scale, Tensor& out, cudaStream_t stream) {
  const int64_t n = ids.numel();
  if (n == 0) return;
  const QView v = view_of(table);
  with_bits(v.bits, [&](auto tag) {
    constexpr int BITS = decltype(tag)::value;
    dispatch_float(out.dtype(), [&](auto o_tag) {
      using O = decltype(o_tag);
      launch(embed_kernel<BITS, O>, int(n), 128, 0, stream, v, ids.data_as<int32_t>(), rows_of<O>(out), n, scale);
    });
  });
}

void quantized_moe_experts(const MoeExpertsArgs& args, const Allocate& allocate, cudaStream_t stream) {
  const int64_t tokens = args.x.rows(), hidden = args.x.cols();
  const int64_t inter = args.gate.dim(1);
  const int top_k = int(args.ids.cols());
  const int64_t pairs = tokens * top_k;
  if (pairs == 0) return;
  if (grouped_moe_experts(args, allocate, stream)) return;  // prefill: each expert's pairs as one GEMM
  Tensor act = allocate(DType::f32, Shape{pairs, inter});
  Tensor y = allocate(DType::f32, Shape{pairs, hidden});
  const bool gelu = args.act == Activation::gelu_tanh;
  dispatch_float(args.x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch(expert_up_kernel<T>, dim3(unsigned(pairs), unsigned(ceil_div(inter, kWarps))), kWarps * 32,
           size_t(hidden) * sizeof(float), stream, rows_of<const T>(args.x), args.ids.data_as<int32_t>(),
           view_of(args.gate), view_of(args.up), act.data_as<float>(), hidden, inter, top_k, gelu);
  });
  launch(expert_down_kernel, dim3(unsigned(pairs), unsigned(ceil_div(hidden, kWarps))), kWarps * 32,
         size_t(inter) * sizeof(float), stream, act.data_as<float>(), args.ids.data_as<int32_t>(), view_of(args.down),
         y.data_as<float>(), hidden, inter);
  combine_experts(y, args.weights, args.out, stream);
}

}  // namespace kiln::cuda
