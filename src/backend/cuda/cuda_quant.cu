// CUDA backend: products, lookups and experts of quantized weights (MLX's affine format,
// src/quant/affine.h).
//
// Decode (a few rows): a fused dequantize-GEMV streams the packed codes once. A warp owns a few
// output features (rows_per_warp); each lane takes 32-element chunks of those rows, which are
// exactly `bits` 32-bit words of codes and never straddle a group (groups are 32, 64 or 128), so a
// chunk needs one scale and one bias: acc += scale · Σ x·q + bias · Σ x. A lane loads its input chunk
// once for all the warp's rows and sums it in registers; two iterations' codes, scales and biases
// are in flight at a time. Products sharing an input (q/k/v; gate/up with the GLU applied) run in
// one launch.
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

// ---- decode: fused dequantize + GEMV ----
//
// Turning codes into floats is what bounds this kernel, not the multiply (see cuda_quant_codes.cuh
// for how a code becomes a float without an integer conversion). With the input chunk's sum Σx,
//   Σ x·q = 2^(BITS+1) · Σ x·f − 2^BITS · Σ x,    acc += s · Σ x·q + b · Σ x.
// The offset costs ~5 of f32's 24 bits, far below bf16's rounding of the inputs.

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

constexpr int kGemvWarps = 4;
// Products that give fewer warps than this (at one input row) split each row's chunks over a
// block's warps: about 16 warps an SM on an H100/H200.
constexpr int64_t kSplitBelowWarps = 2048;

// Weight rows per warp for M input rows. At M = 1 four rows amortize the input chunk's conversion and
// sum over four dots and keep 4 × 16 bytes (4 bits) of codes per lane per iteration in flight; 6 and 8
// bits take two rows, as many bytes, within the 128 registers that four blocks per SM leave. With more
// input rows the unpacked codes are what is reused, and two rows bound the registers.
constexpr int rows_per_warp(int m, int bits) {
  return m == 1 && bits < 6 ? 4 : 2;
}

// A 32-element input chunk as floats, and their sum, always formed in this order.
__device__ __forceinline__ float load_x_chunk(const bf16* __restrict__ x, float (&xf)[32]) {
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  float sum = 0.0f;
#pragma unroll
  for (int v = 0; v < 4; ++v) {
    const uint4 xv = __ldg(xr + v);
    const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&xv);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(xp[j]);
      xf[8 * v + 2 * j] = f.x;
      xf[8 * v + 2 * j + 1] = f.y;
      sum += f.x + f.y;
    }
  }
  return sum;
}

// Σ x·f over a chunk, one FMA chain in element order.
template <int BITS>
__device__ __forceinline__ float dot32(const float (&xf)[32], const ChunkCodes<BITS>& q) {
  float dot = 0.0f;
#pragma unroll
  for (int i = 0; i < 32; ++i) dot = fmaf(xf[i], q.f[i], dot);
  return dot;
}

// The loads of one iteration of a lane: the codes, scale and bias of chunk c of each of the warp's rows.
template <int BITS, int R>
struct Fetched {
  uint32_t words[R][BITS];
  bf16 scale[R], bias[R];
};

// out[m, row] for the warp's rows: acc += s · Σ x·q + b · Σ x per chunk, with
// Σ x·q = kScale · (Σ x·f − Σ x / 2), so acc += s_f · Σ x·f + b_f · Σ x.
// Every (weight row, input row) pair gets the same operations in the same order whatever M, R, the
// loop order below and the products launched beside it are: a row of a batch gets the bits it gets
// alone. M is an upper bound (rows ≤ M input rows are computed), as in cuda_gemv.cu.
//
// splits = 1: the block's warps own different rows. splits = kGemvWarps: they share the block's
// rows and split the chunks (warp w takes every kGemvWarps-th run of 32), their sums added in warp
// order: for products with few rows (the 2560-row projections of a 4B model give 640 warps
// otherwise, and a warp's serial unpacking bounds the product). The host picks it from the shapes
// alone, so the bits still do not depend on the row count.
template <int BITS, int M, int R, bool GLU>
__global__ void __launch_bounds__(kGemvWarps * 32, M == 1 ? 4 : 3)
    qgemv_kernel(QProducts p, const bf16* __restrict__ x, int64_t ldx, int rows, bool f32_out, bool gelu, int splits) {
  constexpr int kOut = GLU ? R / 2 : R;  // output features of a warp
  constexpr float kScale = ChunkCodes<BITS>::kScale;
  __shared__ float partial[kGemvWarps][R][M];
  int s = 0;
  if constexpr (!GLU)
    while (s + 1 < p.count && int(blockIdx.x) >= p.block_end[s]) ++s;
  const int first_block = s ? p.block_end[s - 1] : 0;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t n = p.n[s];
  const int row_warps = splits == 1 ? kGemvWarps : 1, part = splits == 1 ? 0 : warp;
  const int64_t first = (int64_t(int(blockIdx.x) - first_block) * row_warps + (splits == 1 ? warp : 0)) * kOut;
  if (first >= n) return;  // with splits > 1, the whole block
  const int chunks = int(p.k / 32);
  const int64_t groups = (p.k / 32) >> p.group_shift;
  const uint32_t* codes[R];
  const bf16* scales[R];
  const bf16* biases[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int src = GLU ? r / kOut : s;
    const int64_t row = min(first + r % kOut, n - 1);  // the last warp of an odd count repeats a row
    codes[r] = p.packed[src] + row * chunks * BITS;
    scales[r] = p.scales[src] + row * groups;
    biases[r] = p.biases[src] + row * groups;
  }
  auto fetch = [&](Fetched<BITS, R>& f, int c) {
#pragma unroll
    for (int r = 0; r < R; ++r) load_chunk<BITS>(codes[r] + c * BITS, f.words[r]);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      f.scale[r] = __ldg(scales[r] + (c >> p.group_shift));
      f.bias[r] = __ldg(biases[r] + (c >> p.group_shift));
    }
  };
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  auto consume = [&](const Fetched<BITS, R>& f, int c) {
    float s_f[R], b_f[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float sv = __bfloat162float(f.scale[r]);
      s_f[r] = sv * kScale;                                            // exact: a power of two
      b_f[r] = fmaf(-0.5f * kScale, sv, __bfloat162float(f.bias[r]));  // b − s · kScale / 2
    }
    const bf16* xc = x + int64_t(c) * 32;
    if constexpr (M == 1) {  // one input chunk held, each row's codes unpacked in turn
      float xf[32];
      const float xs = load_x_chunk(xc, xf);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        ChunkCodes<BITS> q;
        q.unpack(f.words[r]);
        acc[r][0] = fmaf(s_f[r], dot32(xf, q), fmaf(b_f[r], xs, acc[r][0]));
      }
    } else {  // every row's codes unpacked once, the input chunks loaded in turn
      ChunkCodes<BITS> q[R];
#pragma unroll
      for (int r = 0; r < R; ++r) q[r].unpack(f.words[r]);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        if (m >= rows) break;
        float xf[32];
        const float xs = load_x_chunk(xc + m * ldx, xf);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][m] = fmaf(s_f[r], dot32(xf, q[r]), fmaf(b_f[r], xs, acc[r][m]));
      }
    }
  };
  // Two iterations' loads in flight per lane (ping-pong buffers, no register copies). The packed
  // weights, scales and biases are constant, so the first two are requested before waiting on the
  // previous kernel, whose tail they overlap.
  Fetched<BITS, R> a, b;
  const int step = 32 * splits;
  int c = lane + 32 * part;
  if (c < chunks) fetch(a, c);
  if (c + step < chunks) fetch(b, c + step);
  wait_for_inputs();
  while (c < chunks) {
    consume(a, c);
    if (c + 2 * step < chunks) fetch(a, c + 2 * step);
    c += step;
    if (c >= chunks) break;
    consume(b, c);
    if (c + 2 * step < chunks) fetch(b, c + 2 * step);
    c += step;
  }
  if (splits > 1) {  // the warps' sums, added in warp order by warp 0
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const float v = warp_sum(acc[r][m]);
        if (lane == 0) partial[warp][r][m] = v;
      }
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float v = 0.0f;
        for (int w = 0; w < splits; ++w) v += partial[w][r][m];
        acc[r][m] = lane == 0 ? v : 0.0f;  // the warp sums below then return v
      }
  }
  auto store = [&](int o, int m, float v) {
    if (lane != 0 || first + o >= n) return;
    const int64_t i = m * p.ldo[s] + first + o;
    if (f32_out)
      static_cast<float*>(p.out[s])[i] = v;
    else
      static_cast<bf16*>(p.out[s])[i] = __float2bfloat16(v);
  };
#pragma unroll
  for (int m = 0; m < M; ++m) {
    if (m >= rows) break;
#pragma unroll
    for (int o = 0; o < kOut; ++o) {
      if constexpr (GLU) {
        const float g = warp_sum(acc[o][m]), u = warp_sum(acc[o + kOut][m]);
        store(o, m, (gelu ? gelu_tanh(g) : silu(g)) * u);
      } else {
        store(o, m, warp_sum(acc[o][m]));
      }
    }
  }
}

// Calls f(std::integral_constant<int, M>{}) with M ≥ rows (1..8) among 1, 2, 4, 8; the kernel stops at
// `rows`.
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

// ---- prefill: dequantize a block of rows for cuBLAS ----

template <int BITS>
__global__ void dequantize_kernel(QView w, int64_t row_begin, int64_t n_rows, bf16* __restrict__ out) {
  wait_for_inputs();
  const int64_t chunks = w.cols / 32;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_rows * chunks) return;
  const int64_t r = i / chunks, c = i % chunks, row = row_begin + r;
  float q[32];
  unpack32<BITS>(w.row_words(row) + c * BITS, q);
  const int64_t g = row * w.groups() + c * 32 / w.group_size;
  const float s = __bfloat162float(w.scales[g]), b = __bfloat162float(w.biases[g]);
  store_dequantized(q, s, b, reinterpret_cast<uint4*>(out + r * w.cols + c * 32));
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
    unpack32<BITS>(table.row_words(id) + c * BITS, q);
    const int64_t g = id * table.groups() + c * 32 / table.group_size;
    const float s = __bfloat162float(table.scales[g]), b = __bfloat162float(table.biases[g]);
#pragma unroll
    for (int j = 0; j < 32; ++j) dst[c * 32 + j] = from_float<O>(fmaf(s, q[j], b) * scale);
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
    const uint32_t* codes = w.row_words(row);
    const int64_t per_group = w.group_size / 32;
    for (int64_t c = lane; c < w.cols / 32; c += 32) {
      float q[32];
      unpack32<BITS>(codes + c * BITS, q);
      const int64_t g = row * w.groups() + c / per_group;
      float dot = 0.0f, sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        dot = fmaf(xs[c * 32 + j], q[j], dot);
        sum += xs[c * 32 + j];
      }
      acc = fmaf(__bfloat162float(w.scales[g]), dot, fmaf(__bfloat162float(w.biases[g]), sum, acc));
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

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// What the GEMV takes: bf16 input rows, 16-byte aligned; bf16 or f32 outputs; weights quantized
// alike (width, group size, input size), scales and biases in bf16.
bool gemv_input(const Tensor& x) {
  return x.rows() >= 1 && x.dtype() == DType::bf16 && x.cols() % 32 == 0 && aligned16(x.data()) &&
         (x.row_stride() * 2) % 16 == 0;
}

bool gemv_weight(const Tensor& w, const Tensor& like, int64_t k) {
  if (!w.quantized() || w.cols() != k || !aligned16(w.data())) return false;
  const QuantParams& q = w.quant();
  const QuantParams& l = like.quant();
  return q.bits == l.bits && q.group_size == l.group_size && q.scales.dtype() == DType::bf16 &&
         q.biases.dtype() == DType::bf16 && q.scales.contiguous() && q.biases.contiguous();
}

bool gemv_output(const Tensor& out, const Tensor& first) {
  return (out.dtype() == DType::bf16 || out.dtype() == DType::f32) && out.dtype() == first.dtype();
}

int64_t output_stride(const Tensor& out, int64_t n) {
  return out.cols() == n ? out.row_stride() : n;
}

void add_product(QProducts& p, int i, const Tensor& w, const Tensor& out) {
  const QuantParams& q = w.quant();
  p.packed[i] = static_cast<const uint32_t*>(w.data());
  p.scales[i] = q.scales.data_as<bf16>();
  p.biases[i] = q.biases.data_as<bf16>();
  p.n[i] = w.rows();
  p.out[i] = out.data();
  p.ldo[i] = output_stride(out, w.rows());
}

// Runs the products of p over all rows of x, eight input rows per pass over the weights (a GLU
// launch: `products` = 1 output, gate and up in p).
void run_gemv(QProducts p, int products, bool glu, bool gelu, int bits, const Tensor& x, DType out_dtype,
              cudaStream_t stream) {
  const int64_t m = x.rows(), ldx = x.row_stride();
  const size_t out_size = dtype_size(out_dtype);
  const void* out0[kMaxProducts];
  for (int i = 0; i < products; ++i) out0[i] = p.out[i];
  for (int64_t r0 = 0; r0 < m; r0 += 8) {
    const int rows = int(std::min<int64_t>(8, m - r0));
    for (int i = 0; i < products; ++i)
      p.out[i] = const_cast<char*>(static_cast<const char*>(out0[i])) + size_t(r0 * p.ldo[i]) * out_size;
    const bf16* xs = x.data_as<bf16>() + r0 * ldx;
    with_bits(bits, [&](auto bits_tag) {
      constexpr int BITS = decltype(bits_tag)::value;
      // the chunks split over a block's warps when the products alone give fewer than
      // kSplitBelowWarps warps; decided on the shapes (the warps at one input row), never on m
      constexpr int kOutAtOneRow = rows_per_warp(1, BITS);
      int64_t warps_at_one_row = 0;
      for (int i = 0; i < products; ++i) warps_at_one_row += ceil_div(p.n[i], glu ? kOutAtOneRow / 2 : kOutAtOneRow);
      const int splits = warps_at_one_row < kSplitBelowWarps && p.k / 32 >= 32 * kGemvWarps ? kGemvWarps : 1;
      dispatch_pass_rows(rows, [&](auto rows_tag) {
        constexpr int M = decltype(rows_tag)::value, R = rows_per_warp(M, BITS);
        const int per_block = (splits == 1 ? kGemvWarps : 1) * (glu ? R / 2 : R);  // output features of a block
        int blocks = 0;
        for (int i = 0; i < products; ++i) p.block_end[i] = blocks += ceil_div(p.n[i], per_block);
        const bool f32 = out_dtype == DType::f32;
        if (glu)
          launch(qgemv_kernel<BITS, M, R, true>, blocks, kGemvWarps * 32, 0, stream, p, xs, ldx, rows, f32, gelu,
                 splits);
        else
          launch(qgemv_kernel<BITS, M, R, false>, blocks, kGemvWarps * 32, 0, stream, p, xs, ldx, rows, f32, gelu,
                 splits);
      });
    });
  }
}

int group_shift(int group_size) {
  return group_size == 128 ? 2 : group_size == 64 ? 1 : 0;
}

}  // namespace

bool quantized_gemv(const Tensor& x, const Tensor& w, Tensor& out, cudaStream_t stream) {
  return quantized_gemv_many(x, &w, &out, 1, stream);
}

bool quantized_gemv_many(const Tensor& x, const Tensor* weights, Tensor* outs, int count, cudaStream_t stream) {
  const int64_t k = x.cols();
  if (!gemv_input(x) || count < 1 || count > kMaxProducts) return false;
  for (int i = 0; i < count; ++i)
    if (!gemv_weight(weights[i], weights[0], k) || !gemv_output(outs[i], outs[0])) return false;
  QProducts p{};
  p.count = count;
  p.k = k;
  p.group_shift = group_shift(weights[0].quant().group_size);
  for (int i = 0; i < count; ++i) add_product(p, i, weights[i], outs[i]);
  run_gemv(p, count, false, false, weights[0].quant().bits, x, outs[0].dtype(), stream);
  return true;
}

bool quantized_glu_gemv(const Tensor& x, const Tensor& gate, const Tensor& up, Activation act, Tensor& out,
                        cudaStream_t stream) {
  const int64_t k = x.cols();
  if (!gemv_input(x) || !gemv_weight(gate, gate, k) || !gemv_weight(up, gate, k) || up.rows() != gate.rows() ||
      !gemv_output(out, out))
    return false;
  QProducts p{};
  p.count = 2;
  p.k = k;
  p.group_shift = group_shift(gate.quant().group_size);
  add_product(p, 0, gate, out);
  add_product(p, 1, up, out);
  run_gemv(p, 1, true, act == Activation::gelu_tanh, gate.quant().bits, x, out.dtype(), stream);
  return true;
}

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
