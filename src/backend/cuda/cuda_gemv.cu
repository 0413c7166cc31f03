// CUDA backend: matrix products of a few rows (decode, and serving batches up to 32 rows) against
// bf16 weights.
//
// At these row counts a product reads every weight once and does little with it, so the kernels
// are built to stream the weights. When k is a multiple of 32 a warp multiplies a 16-row tile of
// weights with all the input rows on the tensor cores (below, "tensor-core products"); otherwise a
// warp per output feature accumulates on the CUDA cores with 16-byte loads, several in flight per
// lane. Products that share an input (q/k/v, gate/up) run in one launch: at batch 1 a launch
// costs about as much as reading a small projection.
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_mma_tiles.cuh"
#include "backend/cuda/cuda_ops.cuh"
#include "backend/cuda/cuda_residual_norm.cuh"

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

// acc[m] += x[m] · w_row for one weight row and the first `rows` of M input rows, the calling
// warp's lanes splitting the row. Each input row's sum is formed in the same order whatever M and
// `rows` are: a product of many rows gives every row the bits it would get alone.
template <int M>
__device__ __forceinline__ void row_dots(const bf16* __restrict__ x, int64_t ldx, const uint4* __restrict__ wr,
                                         int64_t chunks, int lane, int rows, float (&acc)[M]) {
  int64_t c = lane;
  for (; c + 32 * (kUnroll - 1) < chunks; c += 32 * kUnroll) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wv[u] = __ldg(wr + c + 32 * u);  // all loads in flight first
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (m >= rows) break;
      const uint4* xr = reinterpret_cast<const uint4*>(x + m * ldx);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) fma8(acc[m], wv[u], __ldg(xr + c + 32 * u));
    }
  }
  for (; c < chunks; c += 32) {
    const uint4 wv = __ldg(wr + c);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (m >= rows) break;
      fma8(acc[m], wv, __ldg(reinterpret_cast<const uint4*>(x + m * ldx) + c));
    }
  }
}

// Up to four products of one input in one launch: blocks [block_end[s-1], block_end[s]) compute
// product s.
constexpr int kMaxProducts = 4;
struct Products {
  const bf16* w[kMaxProducts];
  void* out[kMaxProducts];
  int64_t ldo[kMaxProducts];
  int64_t n[kMaxProducts];
  int block_end[kMaxProducts];
  int count;
};

template <int M, typename O>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const bf16* __restrict__ x, int64_t ldx, Products p, int64_t k, int rows) {
  wait_for_inputs();
  int s = 0;
  while (s + 1 < p.count && int(blockIdx.x) >= p.block_end[s]) ++s;
  const int first_block = s ? p.block_end[s - 1] : 0;
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(int(blockIdx.x) - first_block) * kWarps + threadIdx.x / 32;
  if (row >= p.n[s]) return;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  row_dots<M>(x, ldx, reinterpret_cast<const uint4*>(p.w[s] + row * k), k / 8, lane, rows, acc);
  O* out = static_cast<O*>(p.out[s]);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    if (m >= rows) break;
    const float v = warp_sum(acc[m]);
    if (lane == 0) out[m * p.ldo[s] + row] = from_float<O>(v);
  }
}

// out = act(x · gateᵀ) ⊙ (x · upᵀ), a warp per output feature reading its gate and up rows.
template <int M, typename O>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_glu_kernel(const bf16* __restrict__ x, int64_t ldx, const bf16* __restrict__ gate, const bf16* __restrict__ up,
                    O* __restrict__ out, int64_t ldo, int64_t n, int64_t k, bool gelu, int rows) {
  wait_for_inputs();
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= n) return;
  float g[M], u[M];
#pragma unroll
  for (int m = 0; m < M; ++m) g[m] = u[m] = 0.0f;
  row_dots<M>(x, ldx, reinterpret_cast<const uint4*>(gate + row * k), k / 8, lane, rows, g);
  row_dots<M>(x, ldx, reinterpret_cast<const uint4*>(up + row * k), k / 8, lane, rows, u);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    if (m >= rows) break;
    const float gv = warp_sum(g[m]), uv = warp_sum(u[m]);
    if (lane == 0) out[m * ldo + row] = from_float<O>((gelu ? gelu_tanh(gv) : silu(gv)) * uv);
  }
}

// ---- tensor-core products of up to 32 rows ----
//
// The streaming kernel above does a warp's FMAs on the CUDA cores: at one row that is cheap, at 32
// rows it does 32 FMAs and 32 conversions per weight read and becomes compute-bound long before
// the weights are streamed. Here a warp owns a tile of 16 weight rows and multiplies it with the
// input rows on the tensor cores (mma.sync m16n8k16, bf16 in, f32 accumulate), 8 input rows per
// n-tile, so the weights are read once and the arithmetic is nearly free at any row count up to 32.
//
// Batch invariance: a block's warps split k in a fixed way that depends only on the weights' shape,
// each output (row, input row) accumulates its k steps in the same order, the MMA computes every
// output column from its own input column, and the warps' partial sums are added in warp order.
// So an input row gets the same bits whether it runs alone or with 31 others. The tile loop and
// its reduction are in cuda_mma_tiles.cuh.

template <int NT>
constexpr int rounds_of() {
  return NT >= 3 ? 2 : 4;
}

// One block's tile of a product: rows [row0, row0 + 16) of w (n x k) against the m input rows,
// stored as O into out (row stride ldo). `red`: the block's reduce_tile scratch.
template <int NT, typename O>
__device__ __forceinline__ void product_tile(const bf16* __restrict__ x, int64_t ldx, const bf16* __restrict__ w,
                                             int64_t row0, int64_t n, int64_t k, int m, O* __restrict__ out,
                                             int64_t ldo, float* red) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int64_t lo_row = min(row0 + lane / 4, n - 1), hi_row = min(row0 + lane / 4 + 8, n - 1);
  TileSource<1> src;
  src.lo[0] = reinterpret_cast<const uint4*>(w + lo_row * k) + lane % 4;
  src.hi[0] = reinterpret_cast<const uint4*>(w + hi_row * k) + lane % 4;
  const uint4* xs[NT];
  input_rows<NT>(x, ldx, m, lane, xs);
  float acc[1][NT][4];
  tile_partials<NT, 1, rounds_of<NT>()>(src, xs, k / kStepK, warp, warps, acc);
  reduce_tile<NT, 1>(red, acc, m, [&](int r, int input, const float(&v)[1]) {
    if (row0 + r < n) out[input * ldo + row0 + r] = from_float<O>(v[0]);
  });
}

// Products p.count of one input; blocks [block_end[s-1], block_end[s]) are the tiles of product s.
template <int NT, typename O>
__global__ void __launch_bounds__(512)
    mma_gemv_kernel(const bf16* __restrict__ x, int64_t ldx, Products p, int64_t k, int m) {
  extern __shared__ float red[];
  int s = 0;
  while (s + 1 < p.count && int(blockIdx.x) >= p.block_end[s]) ++s;
  const int first_block = s ? p.block_end[s - 1] : 0;
  const int64_t row0 = int64_t(int(blockIdx.x) - first_block) * kTileRows;
  product_tile<NT, O>(x, ldx, p.w[s], row0, p.n[s], k, m, static_cast<O*>(p.out[s]), p.ldo[s], red);
}

// out = act(x · gateᵀ) ⊙ (x · upᵀ): a warp's tile covers the same 16 rows of gate and up, so the
// input fragments serve both.
template <int NT, typename O>
__global__ void __launch_bounds__(256)
    mma_glu_kernel(const bf16* __restrict__ x, int64_t ldx, const bf16* __restrict__ gate, const bf16* __restrict__ up,
                   O* __restrict__ out, int64_t ldo, int64_t n, int64_t k, bool gelu, int m) {
  extern __shared__ float red[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int64_t row0 = int64_t(blockIdx.x) * kTileRows;
  const int64_t lo_row = min(row0 + lane / 4, n - 1), hi_row = min(row0 + lane / 4 + 8, n - 1);
  TileSource<2> src;
  src.lo[0] = reinterpret_cast<const uint4*>(gate + lo_row * k) + lane % 4;
  src.hi[0] = reinterpret_cast<const uint4*>(gate + hi_row * k) + lane % 4;
  src.lo[1] = reinterpret_cast<const uint4*>(up + lo_row * k) + lane % 4;
  src.hi[1] = reinterpret_cast<const uint4*>(up + hi_row * k) + lane % 4;
  const uint4* xs[NT];
  input_rows<NT>(x, ldx, m, lane, xs);
  float acc[2][NT][4];
  tile_partials<NT, 2, 2>(src, xs, k / kStepK, warp, warps, acc);
  reduce_tile<NT, 2>(red, acc, m, [&](int r, int input, const float(&v)[2]) {
    if (row0 + r < n) out[input * ldo + row0 + r] = from_float<O>((gelu ? gelu_tanh(v[0]) : silu(v[0])) * v[1]);
  });
}

// A block's output projection and the residual update after it (ResidualNormArgs) in one launch.
// At batch 1 the update is a single-block kernel of a few microseconds after every block's last
// product; here the product's blocks store their outputs as mma_gemv_kernel does (same tiles, same
// split of k: the same bits), and the last block to finish, counted on `done`, runs the update
// for the step's rows (cuda_residual_norm.cuh: the bits of the standalone kernel) and sets the
// count back to zero for the next launch.
template <int kChunks>
__global__ void __launch_bounds__(kRowThreads, 2)  // two blocks an SM, as mma_gemv_kernel's 8-warp tiles
    mma_gemv_residual_kernel(const bf16* __restrict__ x, int64_t ldx, const bf16* __restrict__ w, bf16* out,
                             int64_t ldo, int64_t n, int64_t k, int m, ResidualRows<bf16> update, unsigned* done) {
  extern __shared__ float red[];
  product_tile<1, bf16>(x, ldx, w, int64_t(blockIdx.x) * kTileRows, n, k, m, out, ldo, red);
  update_in_last_block<kChunks>(update, m, done);
}

// Calls f(std::integral_constant<int, NT>{}) with NT the n-tiles of 8 rows that m rows need.
template <typename F>
void dispatch_tiles(int64_t m, F&& f) {
  if (m <= 8)
    f(std::integral_constant<int, 1>{});
  else if (m <= 16)
    f(std::integral_constant<int, 2>{});
  else if (m <= 24)
    f(std::integral_constant<int, 3>{});
  else
    f(std::integral_constant<int, 4>{});
}

size_t reduce_bytes(int warps, int nt, int p) {
  return size_t(warps) * size_t(p * nt * 4 * 32) * sizeof(float);
}

// Calls f(std::integral_constant<int, M>{}) with M the row count m for 1..8, and 16 or 32 (the
// kernels then stop at m) up to kMaxRows.
constexpr int64_t kMaxRows = 32;
template <typename F>
void dispatch_rows(int64_t m, F&& f) {
  switch (m) {
    case 1:
      f(std::integral_constant<int, 1>{});
      break;
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
    case 7:
      f(std::integral_constant<int, 7>{});
      break;
    case 8:
      f(std::integral_constant<int, 8>{});
      break;
    default:
      if (m <= 16)
        f(std::integral_constant<int, 16>{});
      else
        f(std::integral_constant<int, 32>{});
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// The inputs the streaming kernels take: a few bf16 rows, 16-byte aligned, k a multiple of 8.
bool streamable(const Tensor& x) {
  return x.rows() >= 1 && x.rows() <= kMaxRows && x.cols() % 8 == 0 && x.dtype() == DType::bf16 &&
         aligned16(x.data()) && (x.row_stride() * 2) % 16 == 0;
}

bool streamable_weight(const Tensor& w, int64_t k) {
  return w.dtype() == DType::bf16 && w.contiguous() && w.cols() == k && aligned16(w.data());
}

bool streamable_output(const Tensor& out) {
  return out.dtype() == DType::bf16 || out.dtype() == DType::f32;
}

// Where row m of a product's [m, n] output starts: its own row stride when its last dim is n.
int64_t output_stride(const Tensor& out, int64_t n) {
  return out.cols() == n ? out.row_stride() : n;
}

}  // namespace

bool small_matmul(const Tensor& x, const Tensor& w, Tensor& out, cudaStream_t stream) {
  return small_matmul_many(x, &w, &out, 1, stream);
}

bool small_matmul_many(const Tensor& x, const Tensor* weights, Tensor* outs, int count, cudaStream_t stream) {
  const int64_t m = x.rows(), k = x.cols();
  if (!streamable(x) || count < 1 || count > kMaxProducts || !streamable_output(outs[0])) return false;
  Products p{};
  p.count = count;
  int blocks = 0;
  for (int i = 0; i < count; ++i) {
    const int64_t n = weights[i].numel() / k;
    if (!streamable_weight(weights[i], k) || outs[i].dtype() != outs[0].dtype()) return false;
    blocks += ceil_div(n, kWarps);
    p.w[i] = weights[i].data_as<bf16>();
    p.out[i] = outs[i].data();
    p.ldo[i] = output_stride(outs[i], n);
    p.n[i] = n;
    p.block_end[i] = blocks;
  }
  const bool f32_out = outs[0].dtype() == DType::f32;
  if (k % kStepK == 0) {
    // the same products as tiles of 16 rows
    int tiles = 0;
    for (int i = 0; i < count; ++i) {
      tiles += ceil_div(p.n[i], kTileRows);
      p.block_end[i] = tiles;
    }
    const int warps = mma_warps(tiles, k / kStepK);
    dispatch_tiles(m, [&](auto nt) {
      constexpr int NT = decltype(nt)::value;
      const size_t shared = reduce_bytes(warps, NT, 1);
      if (f32_out)
        launch(mma_gemv_kernel<NT, float>, tiles, warps * 32, shared, stream, x.data_as<bf16>(), x.row_stride(), p, k,
               int(m));
      else
        launch(mma_gemv_kernel<NT, bf16>, tiles, warps * 32, shared, stream, x.data_as<bf16>(), x.row_stride(), p, k,
               int(m));
    });
    return true;
  }
  dispatch_rows(m, [&](auto rows) {
    constexpr int M = decltype(rows)::value;
    if (f32_out)
      launch(gemv_kernel<M, float>, blocks, kWarps * 32, 0, stream, x.data_as<bf16>(), x.row_stride(), p, k, int(m));
    else
      launch(gemv_kernel<M, bf16>, blocks, kWarps * 32, 0, stream, x.data_as<bf16>(), x.row_stride(), p, k, int(m));
  });
  return true;
}

bool small_matmul_residual_norm(const Tensor& x, const Tensor& w, const ResidualNormArgs& args, unsigned* done,
                                cudaStream_t stream) {
  const int64_t m = x.rows(), k = x.cols(), n = args.residual.cols();
  const Tensor& out = args.block_out;
  if (m > kMaxFusedResidualRows || !streamable(x) || k % kStepK != 0 || !streamable_weight(w, k) ||
      w.numel() != n * k || out.rows() != m || args.residual.rows() != m || !row_norm_vectorizable(args))
    return false;
  const int tiles = ceil_div(n, kTileRows), warps = mma_warps(tiles, k / kStepK);
  if (warps * 32 != kRowThreads) return false;  // the update needs a full row of threads
  dispatch_row_chunks(n, [&](auto chunks) {
    launch(mma_gemv_residual_kernel<decltype(chunks)::value>, tiles, kRowThreads, reduce_bytes(warps, 1, 1), stream,
           x.data_as<bf16>(), x.row_stride(), w.data_as<bf16>(), out.data_as<bf16>(), out.row_stride(), n, k, int(m),
           residual_rows<bf16>(args), done);
  });
  return true;
}

bool small_glu_matmul(const Tensor& x, const Tensor& gate, const Tensor& up, Activation act, Tensor& out,
                      cudaStream_t stream) {
  const int64_t m = x.rows(), k = x.cols(), n = gate.numel() / k;
  if (!streamable(x) || !streamable_weight(gate, k) || !streamable_weight(up, k) || up.numel() != gate.numel() ||
      !streamable_output(out))
    return false;
  const int blocks = ceil_div(n, kWarps);
  const int64_t ldo = output_stride(out, n);
  const bool gelu = act == Activation::gelu_tanh;
  const bf16* xs = x.data_as<bf16>();
  if (k % kStepK == 0) {
    const int tiles = ceil_div(n, kTileRows), warps = mma_warps(tiles, k / kStepK);
    dispatch_tiles(m, [&](auto nt) {
      constexpr int NT = decltype(nt)::value;
      const size_t shared = reduce_bytes(warps, NT, 2);
      if (out.dtype() == DType::f32)
        launch(mma_glu_kernel<NT, float>, tiles, warps * 32, shared, stream, xs, x.row_stride(), gate.data_as<bf16>(),
               up.data_as<bf16>(), out.data_as<float>(), ldo, n, k, gelu, int(m));
      else
        launch(mma_glu_kernel<NT, bf16>, tiles, warps * 32, shared, stream, xs, x.row_stride(), gate.data_as<bf16>(),
               up.data_as<bf16>(), out.data_as<bf16>(), ldo, n, k, gelu, int(m));
    });
    return true;
  }
  dispatch_rows(m, [&](auto rows) {
    constexpr int M = decltype(rows)::value;
    if (out.dtype() == DType::f32)
      launch(gemv_glu_kernel<M, float>, blocks, kWarps * 32, 0, stream, xs, x.row_stride(), gate.data_as<bf16>(),
             up.data_as<bf16>(), out.data_as<float>(), ldo, n, k, gelu, int(m));
    else
      launch(gemv_glu_kernel<M, bf16>, blocks, kWarps * 32, 0, stream, xs, x.row_stride(), gate.data_as<bf16>(),
             up.data_as<bf16>(), out.data_as<bf16>(), ldo, n, k, gelu, int(m));
  });
  return true;
}

}  // namespace kiln::cuda
