// CUDA backend: products, lookups and experts of quantized weights (MLX's affine format,
// src/quant/affine.h).
//
// Decode (a few rows): a fused dequantize-GEMV streams the packed codes once. A warp owns an output
// feature; each lane takes 32-element chunks of the row, which are exactly `bits` 32-bit words of
// codes and never straddle a group (groups are 32, 64 or 128), so a chunk needs one scale and one
// bias: acc += scale · Σ x·q + bias · Σ x.
// Prefill: dequantize_rows expands a block of rows into bf16 scratch for cuBLAS (the caller bounds
// the block); see cuda_backend.cpp for the sizes.
// Experts: the routed (token, slot) pairs run as GEMVs over the chosen expert's packed rows, as the
// bf16 expert path does.
#include <algorithm>
#include <cassert>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.cuh"
#include "core/tensor.h"

namespace kiln::cuda {

namespace {

constexpr int kWarps = 8;

// A quantized matrix as the kernels read it: scales and biases are bf16 on the device. The
// expert kernels also take a plain bf16 stack through it (`values` set), since a checkpoint may
// leave one projection of the experts unquantized.
struct QView {
  const uint32_t* packed;
  const bf16* scales;
  const bf16* biases;
  const bf16* values;  // a dense bf16 matrix instead
  int64_t rows = 0, cols = 0;
  int bits = 0, group_size = 0;
  __device__ __forceinline__ const uint32_t* row_words(int64_t r) const { return packed + r * (cols / 32) * bits; }
  __device__ __forceinline__ int64_t groups() const { return cols / group_size; }
};

QView view_of(const Tensor& w) {
  if (!w.quantized())
    return QView{.packed = nullptr,
                 .scales = nullptr,
                 .biases = nullptr,
                 .values = w.data_as<bf16>(),
                 .rows = w.rows(),
                 .cols = w.cols()};
  const QuantParams& q = w.quant();
  return QView{.packed = static_cast<const uint32_t*>(w.data()),
               .scales = q.scales.data_as<bf16>(),
               .biases = q.biases.data_as<bf16>(),
               .values = nullptr,
               .rows = w.rows(),
               .cols = w.cols(),
               .bits = q.bits,
               .group_size = q.group_size};
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

// Calls f(std::integral_constant<int, BITS>) for a runtime width.
template <typename F>
__device__ __forceinline__ void with_bits(int bits, F&& f) {
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

// ---- decode: fused dequantize + GEMV ----
//
// Turning codes into floats is what bounds this kernel, not the multiply: an integer-to-float
// conversion runs at a quarter of the FMA rate. So a code goes into the mantissa of a float whose
// exponent is fixed instead: f = 0.5 + q · 2^-(BITS+1) for the general widths (one shift and one
// LOP3), f = 0.5 + q / 256 for 4 bits (one byte permute per code after splitting nibbles into
// bytes). With the input chunk's sum Σx computed once per block,
//   Σ x·q = 2^(BITS+1) · Σ x·f − 2^BITS · Σ x,    acc += s · Σ x·q + b · Σ x.
// The offset costs ~5 of f32's 24 bits, far below bf16's rounding of the inputs.

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

// The 32 codes of a chunk as exact floats, through ChunkCodes' mantissa placement (one FMA each
// instead of an integer conversion): q = kScale · f − kScale / 2.
template <int BITS>
__device__ __forceinline__ void unpack32(const uint32_t* p, float (&q)[32]) {
  uint32_t words[BITS];
  load_chunk<BITS>(p, words);
  ChunkCodes<BITS> codes;
  codes.unpack(words);
#pragma unroll
  for (int i = 0; i < 32; ++i) q[i] = fmaf(codes.f[i], ChunkCodes<BITS>::kScale, -0.5f * ChunkCodes<BITS>::kScale);
}

template <int BITS, int M, typename O>
__global__ void __launch_bounds__(kWarps * 32)
    qgemv_kernel(QView w, const bf16* __restrict__ x, int64_t ldx, O* __restrict__ out, int64_t ldo) {
  extern __shared__ float xsum[];  // [M, chunks]: Σ x over each 32-element chunk
  const int64_t chunks = w.cols / 32, groups = w.groups(), per_group = w.group_size / 32;
  for (int64_t i = threadIdx.x; i < M * chunks; i += blockDim.x) {
    const int64_t m = i / chunks, c = i % chunks;
    const uint4* xr = reinterpret_cast<const uint4*>(x + m * ldx + c * 32);
    float sum = 0.0f;
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const uint4 xv = __ldg(xr + v);
      const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&xv);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(xp[j]);
        sum += f.x + f.y;
      }
    }
    xsum[i] = sum;
  }
  __syncthreads();

  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= w.rows) return;
  const uint32_t* codes = w.row_words(row);
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  // one chunk: the codes' words already loaded, then the scale and bias, the inputs, the sums
  auto chunk = [&](const uint32_t(&words)[BITS], int64_t c) {
    ChunkCodes<BITS> q;
    q.unpack(words);
    const int64_t g = row * groups + c / per_group;
    const float s = __bfloat162float(w.scales[g]), b = __bfloat162float(w.biases[g]);
    const float s_f = s * ChunkCodes<BITS>::kScale, b_f = b - 0.5f * s * ChunkCodes<BITS>::kScale;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const uint4* xr = reinterpret_cast<const uint4*>(x + m * ldx + c * 32);
      float dot = 0.0f;
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const uint4 xv = __ldg(xr + v);
        const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&xv);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 f = __bfloat1622float2(xp[j]);
          dot = fmaf(f.x, q.f[8 * v + 2 * j], dot);
          dot = fmaf(f.y, q.f[8 * v + 2 * j + 1], dot);
        }
      }
      // s · Σ x·q + b · Σ x with Σ x·q = kScale · (dot − Σx / 2)
      acc[m] = fmaf(s_f, dot, fmaf(b_f, xsum[m * chunks + c], acc[m]));
    }
  };
  // two chunks per step, both chunks' words requested before either is unpacked: more loads in
  // flight per lane
  int64_t c = lane;
  for (; c + 32 < chunks; c += 64) {
    uint32_t first[BITS], second[BITS];
    load_chunk<BITS>(codes + c * BITS, first);
    load_chunk<BITS>(codes + (c + 32) * BITS, second);
    chunk(first, c);
    chunk(second, c + 32);
  }
  if (c < chunks) {
    uint32_t last[BITS];
    load_chunk<BITS>(codes + c * BITS, last);
    chunk(last, c);
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float v = warp_sum(acc[m]);
    if (lane == 0) out[m * ldo + row] = from_float<O>(v);
  }
}

template <int BITS, int M>
void launch_gemv(const QView& w, const Tensor& x, Tensor& out, int64_t ldo, cudaStream_t stream) {
  const int blocks = ceil_div(w.rows, kWarps);
  const size_t shared = size_t(M) * size_t(w.cols / 32) * sizeof(float);
  auto run = [&](auto kernel, auto* o) {
    if (shared > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared));
    kernel<<<blocks, kWarps * 32, shared, stream>>>(w, x.data_as<bf16>(), x.row_stride(), o, ldo);
  };
  if (out.dtype() == DType::f32)
    run(qgemv_kernel<BITS, M, float>, out.data_as<float>());
  else
    run(qgemv_kernel<BITS, M, bf16>, out.data_as<bf16>());
}

template <int BITS>
void gemv_rows(int64_t m, const QView& w, const Tensor& x, Tensor& out, int64_t ldo, cudaStream_t stream) {
  switch (m) {
    case 1:
      launch_gemv<BITS, 1>(w, x, out, ldo, stream);
      break;
    case 2:
      launch_gemv<BITS, 2>(w, x, out, ldo, stream);
      break;
    case 3:
      launch_gemv<BITS, 3>(w, x, out, ldo, stream);
      break;
    case 4:
      launch_gemv<BITS, 4>(w, x, out, ldo, stream);
      break;
    case 5:
      launch_gemv<BITS, 5>(w, x, out, ldo, stream);
      break;
    case 6:
      launch_gemv<BITS, 6>(w, x, out, ldo, stream);
      break;
    case 7:
      launch_gemv<BITS, 7>(w, x, out, ldo, stream);
      break;
    default:
      launch_gemv<BITS, 8>(w, x, out, ldo, stream);
      break;
  }
}

// ---- prefill: dequantize a block of rows for cuBLAS ----

template <int BITS>
__global__ void dequantize_kernel(QView w, int64_t row_begin, int64_t n_rows, bf16* __restrict__ out) {
  const int64_t chunks = w.cols / 32;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_rows * chunks) return;
  const int64_t r = i / chunks, c = i % chunks, row = row_begin + r;
  float q[32];
  unpack32<BITS>(w.row_words(row) + c * BITS, q);
  const int64_t g = row * w.groups() + c * 32 / w.group_size;
  const float s = __bfloat162float(w.scales[g]), b = __bfloat162float(w.biases[g]);
  uint4* dst = reinterpret_cast<uint4*>(out + r * w.cols + c * 32);
#pragma unroll
  for (int v = 0; v < 4; ++v) {
    uint4 packed;
    __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
    for (int j = 0; j < 4; ++j)
      p[j] = __floats2bfloat162_rn(fmaf(s, q[8 * v + 2 * j], b), fmaf(s, q[8 * v + 2 * j + 1], b));
    dst[v] = packed;
  }
}

// ---- embedding rows ----

template <int BITS, typename O>
__global__ void embed_kernel(QView table, const int32_t* ids, Rows<O> out, int64_t n, float scale) {
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

template <typename T>
__global__ void combine_kernel(const float* y, const float* weights, Rows<T> out, int64_t tokens, int64_t hidden,
                               int top_k) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * hidden) return;
  const int64_t t = i / hidden, c = i % hidden;
  float acc = 0;
  for (int k = 0; k < top_k; ++k) acc += weights[t * top_k + k] * y[(t * top_k + k) * hidden + c];
  out.row(t)[c] = from_float<T>(acc);
}

template <typename F>
void host_with_bits(int bits, F&& f) {
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

}  // namespace

void quantized_gemv(const Tensor& x, const Tensor& w, Tensor& out, cudaStream_t stream) {
  const int64_t m = x.rows(), n = w.rows();
  assert(m >= 1 && x.dtype() == DType::bf16);
  const int64_t ldo = out.cols() == n ? out.row_stride() : n;
  const QView v = view_of(w);
  // eight input rows per pass over the weights
  for (int64_t r0 = 0; r0 < m; r0 += 8) {
    const int64_t rows = std::min<int64_t>(8, m - r0);
    const Tensor xs = x.rows_view(r0, rows);
    char* base = static_cast<char*>(out.data()) + size_t(r0 * ldo) * dtype_size(out.dtype());
    Tensor os(out.dtype(), Shape{rows, n}, base, out.owner(), out.device(), ldo);
    host_with_bits(v.bits, [&](auto tag) { gemv_rows<decltype(tag)::value>(rows, v, xs, os, ldo, stream); });
  }
}

void dequantize_rows(const Tensor& w, int64_t row_begin, int64_t n_rows, Tensor& out, cudaStream_t stream) {
  const QView v = view_of(w);
  const int64_t work = n_rows * (v.cols / 32);
  if (work == 0) return;
  host_with_bits(v.bits, [&](auto tag) {
    dequantize_kernel<decltype(tag)::value>
        <<<ceil_div(work, 256), 256, 0, stream>>>(v, row_begin, n_rows, out.data_as<bf16>());
  });
}

void quantized_embed(const Tensor& ids, const Tensor& table, float scale, Tensor& out, cudaStream_t stream) {
  const int64_t n = ids.numel();
  if (n == 0) return;
  const QView v = view_of(table);
  host_with_bits(v.bits, [&](auto tag) {
    constexpr int BITS = decltype(tag)::value;
    dispatch_float(out.dtype(), [&](auto o_tag) {
      using O = decltype(o_tag);
      embed_kernel<BITS, O><<<int(n), 128, 0, stream>>>(v, ids.data_as<int32_t>(), rows_of<O>(out), n, scale);
    });
  });
}

void quantized_moe_experts(const MoeExpertsArgs& args, const Allocate& allocate, cudaStream_t stream) {
  const int64_t tokens = args.x.rows(), hidden = args.x.cols();
  const int64_t inter = args.gate.dim(1);
  const int top_k = int(args.ids.cols());
  const int64_t pairs = tokens * top_k;
  if (pairs == 0) return;
  Tensor act = allocate(DType::f32, Shape{pairs, inter});
  Tensor y = allocate(DType::f32, Shape{pairs, hidden});
  const bool gelu = args.act == Activation::gelu_tanh;
  dispatch_float(args.x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    expert_up_kernel<T>
        <<<dim3(unsigned(pairs), unsigned(ceil_div(inter, kWarps))), kWarps * 32, size_t(hidden) * sizeof(float),
           stream>>>(rows_of<const T>(args.x), args.ids.data_as<int32_t>(), view_of(args.gate), view_of(args.up),
                     act.data_as<float>(), hidden, inter, top_k, gelu);
  });
  expert_down_kernel<<<dim3(unsigned(pairs), unsigned(ceil_div(hidden, kWarps))), kWarps * 32,
                       size_t(inter) * sizeof(float), stream>>>(act.data_as<float>(), args.ids.data_as<int32_t>(),
                                                                view_of(args.down), y.data_as<float>(), hidden, inter);
  dispatch_float(args.out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    combine_kernel<T><<<ceil_div(tokens * hidden, 256), 256, 0, stream>>>(
        y.data_as<float>(), args.weights.data_as<float>(), rows_of<T>(args.out), tokens, hidden, top_k);
  });
}

}  // namespace kiln::cuda
