// CUDA backend: matrix products of a few rows (decode) against bf16 weights.
//
// At batch sizes of a handful of tokens a product reads every weight once and does little with
// it, so the kernel is built to stream the weights: a warp per output feature, 16-byte loads,
// several loads in flight per lane, the few input rows read from cache.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.cuh"

namespace kiln::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kUnroll = 4;

__device__ __forceinline__ void fma8(float& acc, const uint4& w, const uint4& x) {
  const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&w);
  const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&x);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = __bfloat1622float2(wp[i]), b = __bfloat1622float2(xp[i]);
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
}

template <int M, typename O>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const bf16* __restrict__ x, int64_t ldx,
                                                           const bf16* __restrict__ w, O* __restrict__ out,
                                                           int64_t ldo, int64_t n, int64_t k) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= n) return;
  const uint4* wr = reinterpret_cast<const uint4*>(w + row * k);
  const int64_t chunks = k / 8;  // 16-byte chunks per weight row
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  int64_t c = lane;
  for (; c + 32 * (kUnroll - 1) < chunks; c += 32 * kUnroll) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wv[u] = __ldg(wr + c + 32 * u);  // all loads in flight first
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const uint4* xr = reinterpret_cast<const uint4*>(x + m * ldx);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) fma8(acc[m], wv[u], __ldg(xr + c + 32 * u));
    }
  }
  for (; c < chunks; c += 32) {
    const uint4 wv = __ldg(wr + c);
#pragma unroll
    for (int m = 0; m < M; ++m) fma8(acc[m], wv, __ldg(reinterpret_cast<const uint4*>(x + m * ldx) + c));
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float v = warp_sum(acc[m]);
    if (lane == 0) out[m * ldo + row] = from_float<O>(v);
  }
}

template <int M>
void launch(const Tensor& x, const Tensor& w, Tensor& out, int64_t n, int64_t k, int64_t ldo, cudaStream_t stream) {
  const int blocks = ceil_div(n, kWarps);
  if (out.dtype() == DType::f32)
    gemv_kernel<M, float><<<blocks, kWarps * 32, 0, stream>>>(x.data_as<bf16>(), x.row_stride(), w.data_as<bf16>(),
                                                              out.data_as<float>(), ldo, n, k);
  else
    gemv_kernel<M, bf16><<<blocks, kWarps * 32, 0, stream>>>(x.data_as<bf16>(), x.row_stride(), w.data_as<bf16>(),
                                                             out.data_as<bf16>(), ldo, n, k);
}

}  // namespace

bool small_matmul(const Tensor& x, const Tensor& w, Tensor& out, cudaStream_t stream) {
  const int64_t m = x.rows(), k = x.cols(), n = w.numel() / k;
  const bool aligned = reinterpret_cast<uintptr_t>(x.data()) % 16 == 0 && (x.row_stride() * 2) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(w.data()) % 16 == 0;
  if (m < 1 || m > 8 || k % 8 != 0 || x.dtype() != DType::bf16 || w.dtype() != DType::bf16 || !w.contiguous() ||
      !aligned || (out.dtype() != DType::bf16 && out.dtype() != DType::f32))
    return false;
  const int64_t ldo = out.cols() == n ? out.row_stride() : n;
  switch (m) {
    case 1: launch<1>(x, w, out, n, k, ldo, stream); break;
    case 2: launch<2>(x, w, out, n, k, ldo, stream); break;
    case 3: launch<3>(x, w, out, n, k, ldo, stream); break;
    case 4: launch<4>(x, w, out, n, k, ldo, stream); break;
    case 5: launch<5>(x, w, out, n, k, ldo, stream); break;
    case 6: launch<6>(x, w, out, n, k, ldo, stream); break;
    case 7: launch<7>(x, w, out, n, k, ldo, stream); break;
    default: launch<8>(x, w, out, n, k, ldo, stream); break;
  }
  return true;
}

}  // namespace kiln::cuda
