// The residual update between blocks and the norms read from it (ResidualNormArgs), for one row
// of bf16, shared by the standalone kernel (cuda_elementwise.cu) and the epilogue of the products
// that produce a block's output (cuda_gemv.cu).
//
// Both must give a row the same bits (a decode step may take either path depending on its row
// count), so the row is always held by threads [0, kRowThreads) of the block in 16-byte chunks of
// 8 columns (chunk j on thread j % kRowThreads), and every sum goes over those threads in one fixed
// order, whatever the block size. Rows of other types or layouts take the generic kernel.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "ops/op_args.h"

namespace kiln::cuda {

constexpr int kRowThreads = 256;
constexpr int kRowWarps = kRowThreads / 32;
constexpr int kMaxRowChunks = 4;  // per thread: rows of up to 8192 columns
constexpr int64_t kMaxRowNormCols = int64_t(kRowThreads) * kMaxRowChunks * 8;

constexpr int kNormOutputs = 3;
template <typename T>
struct NormOutputs {
  Rows<T> out[kNormOutputs];  // data null: not wanted
  const float* weight[kNormOutputs];
};

// The arguments of one residual update, by value for a kernel.
template <typename T>
struct ResidualRows {
  Rows<T> residual;
  Rows<const T> block_out;
  const float* block_weight;  // null: block_out is added as it is
  NormOutputs<T> next;
  int64_t cols;
  float eps, offset, scale;
};

template <typename T>
ResidualRows<T> residual_rows(const ResidualNormArgs& args) {
  ResidualRows<T> a{};
  a.residual = rows_of<T>(args.residual);
  a.block_out = rows_of<const T>(args.block_out);
  a.block_weight = args.block_norm.defined() ? args.block_norm.data_as<float>() : nullptr;
  const Tensor* outs[kNormOutputs] = {&args.next, &args.more_next[0], &args.more_next[1]};
  const Tensor* weights[kNormOutputs] = {&args.next_norm, &args.more_next_norm[0], &args.more_next_norm[1]};
  for (int n = 0, k = 0; n < kNormOutputs; ++n) {  // the wanted outputs first
    if (!outs[n]->defined()) continue;
    a.next.out[k] = rows_of<T>(*outs[n]);
    a.next.weight[k++] = weights[n]->defined() ? weights[n]->data_as<float>() : nullptr;
  }
  a.cols = args.residual.cols();
  a.eps = args.eps;
  a.offset = args.norm_offset;
  a.scale = args.scale;
  return a;
}

// Sum of v over the row threads in a fixed order; every thread of the block calls it and gets
// the sum. scratch: kRowWarps floats of shared memory.
__device__ __forceinline__ float row_sum(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  __syncthreads();  // scratch is free again
  if (lane == 0 && warp < kRowWarps) scratch[warp] = v;
  __syncthreads();
  float total = 0;
#pragma unroll
  for (int w = 0; w < kRowWarps; ++w) total += scratch[w];
  return total;
}

// bf16 to f32 is a shift of the bits; the bits of the 8 values of a chunk, in order
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i)
    f[2 * i] = __uint_as_float(w[i] << 16), f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  return uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}
__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  return make_uint4(pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]), pack2(f[6], f[7]));
}
// 8 f32 weights at column 8·chunk, plus offset
__device__ __forceinline__ void weights8(const float* w, int64_t chunk, float offset, float (&f)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(w) + 2 * chunk),
               b = __ldg(reinterpret_cast<const float4*>(w) + 2 * chunk + 1);
  f[0] = a.x + offset, f[1] = a.y + offset, f[2] = a.z + offset, f[3] = a.w + offset;
  f[4] = b.x + offset, f[5] = b.y + offset, f[6] = b.z + offset, f[7] = b.w + offset;
}

// Row r of the update: residual = (residual + b) · scale with b = block_out, or its norm under
// block_weight; then each wanted next output = rms_norm(residual) · (weight + offset). block_out is
// read through L2 (__ldcg): in the products' epilogue other blocks of the same kernel wrote it.
// Rows of a.cols / 8 <= kChunks · kRowThreads chunks, 16-byte aligned (row_norm_vectorizable).
// Every thread of the block must call it.
template <int kChunks>
__device__ __forceinline__ void residual_norm_row(const ResidualRows<bf16>& a, int64_t r, float* scratch) {
  const int64_t chunks = a.cols / 8;
  const uint4* b = reinterpret_cast<const uint4*>(a.block_out.row(r));
  uint4* res = reinterpret_cast<uint4*>(a.residual.row(r));
  auto held = [&](int j) { return threadIdx.x < kRowThreads && threadIdx.x + int64_t(j) * kRowThreads < chunks; };
  auto chunk = [&](int j) { return threadIdx.x + int64_t(j) * kRowThreads; };
  // the row, and the weights of the block norm and the first next norm, all requested at once
  float bv[kChunks][8], rv[kChunks][8], block_w[kChunks][8], next_w[kChunks][8];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    uint4 bw = make_uint4(0, 0, 0, 0), rw = bw;
    if (held(j)) bw = __ldcg(b + chunk(j)), rw = res[chunk(j)];
    unpack8(bw, bv[j]);
    unpack8(rw, rv[j]);
#pragma unroll
    for (int e = 0; e < 8; ++e) block_w[j][e] = next_w[j][e] = 1.0f;
    if (held(j) && a.block_weight) weights8(a.block_weight, chunk(j), a.offset, block_w[j]);
    if (held(j) && a.next.weight[0]) weights8(a.next.weight[0], chunk(j), a.offset, next_w[j]);
  }
  if (a.block_weight) {
    float sum = 0;
#pragma unroll
    for (int j = 0; j < kChunks; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e) sum += bv[j][e] * bv[j][e];
    const float inv = rsqrtf(row_sum(sum, scratch) / float(a.cols) + a.eps);
#pragma unroll
    for (int j = 0; j < kChunks; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e) bv[j][e] *= inv * block_w[j][e];
  }
  float sum = 0;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    if (!held(j)) continue;
#pragma unroll
    for (int e = 0; e < 8; ++e) rv[j][e] = (rv[j][e] + bv[j][e]) * a.scale;
    const uint4 stored = pack8(rv[j]);
    res[chunk(j)] = stored;
    unpack8(stored, rv[j]);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum += rv[j][e] * rv[j][e];
  }
  if (!a.next.out[0].data) return;
  const float inv = rsqrtf(row_sum(sum, scratch) / float(a.cols) + a.eps);
#pragma unroll
  for (int n = 0; n < kNormOutputs; ++n) {
    if (!a.next.out[n].data) continue;
    uint4* o = reinterpret_cast<uint4*>(a.next.out[n].row(r));
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      if (!held(j)) continue;
      float w[8] = {1, 1, 1, 1, 1, 1, 1, 1}, v[8];
      if (n == 0)
#pragma unroll
        for (int e = 0; e < 8; ++e) w[e] = next_w[j][e];
      else if (a.next.weight[n])
        weights8(a.next.weight[n], chunk(j), a.offset, w);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = rv[j][e] * inv * w[e];
      o[chunk(j)] = pack8(v);
    }
  }
}

// The fused form of a product and the residual update after it: every block calls this after
// storing its outputs; the last block to finish, counted on `done`, runs the update for `rows`
// rows (the bits of the standalone kernel) and sets the count back to zero for the next launch.
template <int kChunks>
__device__ __forceinline__ void update_in_last_block(const ResidualRows<bf16>& update, int rows, unsigned* done) {
  __shared__ float scratch[kRowWarps];
  __shared__ bool last_block;
  __syncthreads();  // the block's outputs are stored before thread 0 releases them
  if (threadIdx.x == 0) last_block = arrive_acq_rel(done) == gridDim.x - 1;
  __syncthreads();  // and the last block reads the others' after thread 0 acquired them
  if (!last_block) return;
  for (int r = 0; r < rows; ++r) residual_norm_row<kChunks>(update, r, scratch);
  if (threadIdx.x == 0) *done = 0;
}

// Whether the update's rows fit residual_norm_row: bf16, a multiple of 8 columns up to
// kMaxRowNormCols, every row and weight 16-byte aligned.
inline bool row_norm_vectorizable(const ResidualNormArgs& args) {
  const int64_t cols = args.residual.cols();
  if (cols % 8 != 0 || cols > kMaxRowNormCols || args.block_out.cols() != cols) return false;
  auto aligned = [](const Tensor& t) {
    return !t.defined() || (reinterpret_cast<uintptr_t>(t.data()) % 16 == 0 &&
                            (t.row_stride() * int64_t(dtype_size(t.dtype()))) % 16 == 0);
  };
  for (const Tensor* rows : {&args.residual, &args.block_out, &args.next, &args.more_next[0], &args.more_next[1]})
    if (!aligned(*rows) || (rows->defined() && rows->dtype() != DType::bf16)) return false;
  for (const Tensor* weight : {&args.block_norm, &args.next_norm, &args.more_next_norm[0], &args.more_next_norm[1]})
    if (!aligned(*weight)) return false;
  return true;
}

// Calls f(std::integral_constant<int, kChunks>{}) with the fewest chunks per thread that hold cols.
template <typename F>
void dispatch_row_chunks(int64_t cols, F&& f) {
  const int64_t chunks = cols / 8;
  if (chunks <= kRowThreads)
    f(std::integral_constant<int, 1>{});
  else if (chunks <= 2 * kRowThreads)
    f(std::integral_constant<int, 2>{});
  else
    f(std::integral_constant<int, 4>{});
}

}  // namespace kiln::cuda
