// CUDA backend: mixture-of-experts routing and the routed expert feed-forwards.
//
// The experts run per (token, slot) pair as matrix-vector products that read each chosen expert's
// rows straight from its stacked weights: at decode batch sizes that reads every routed expert
// once, which is what bounds the step; routing never leaves the GPU.
//
// Decode-sized calls (up to kMaxStreamPairs pairs, bf16 input, sizes multiples of 32) run on the
// tensor cores, as the small products do (cuda_mma_tiles.cuh): a warp multiplies 16 rows of an
// expert with the pair's input row, so the weights stream with almost no ALU work per byte. The
// GLU output goes to the down product as bf16, as a dense MLP's does; the routing weight scales
// the down product's f32 result. At 26B-A4B decode (hidden 2816, inter 704, top-8, one token) the
// up kernel runs 8 × 44 tiles of 4 warps and the down kernel 176 tiles of 8 warps, a warp per slot:
// 1408 warps each, one resident wave.
//
// Other shapes take CUDA-core streaming kernels, which keep as many weight loads in flight as they
// can: each lane issues all of its 16-byte loads of a round (the gate and up rows together; the
// down rows of all of a token's experts together) before it consumes any, so a warp pays one
// memory latency per round instead of one per row. Many pairs, shapes that are not multiples of 8
// and unaligned rows take the generic kernels.
//
// Prefill-sized calls with 64-aligned sizes run grouped by expert (cuda_moe_grouped.cu).
#include <algorithm>
#include <cassert>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_mma_tiles.cuh"
#include "backend/cuda/cuda_ops.cuh"

namespace kiln::cuda {

namespace {

constexpr int kMaxExpertsPerLane = 16;  // up to 512 experts
static_assert(32 * kMaxExpertsPerLane == kMaxRoutedExperts);
constexpr int kMaxTopK = kMaxRoutedTopK;

template <typename T>
__global__ void route_kernel(Rows<const T> logits, int n_experts, int top_k, bool renormalize, const float* scale,
                             int32_t* ids, float* weights) {
  wait_for_inputs();
  const int t = blockIdx.x, lane = threadIdx.x;
  const T* row = logits.row(t);
  float p[kMaxExpertsPerLane];
  float mx = -INFINITY;
  for (int i = 0; i < kMaxExpertsPerLane; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < n_experts ? to_float(row[e]) : -INFINITY;
    mx = fmaxf(mx, p[i]);
  }
  mx = warp_max(mx);
  float sum = 0;
  for (int i = 0; i < kMaxExpertsPerLane; ++i) {
    p[i] = lane + 32 * i < n_experts ? expf(p[i] - mx) : 0.0f;
    sum += p[i];
  }
  sum = warp_sum(sum);
  float chosen[kMaxTopK];
  int chosen_id[kMaxTopK];
  float total = 0;
  for (int k = 0; k < top_k; ++k) {
    // largest remaining probability; the lower expert index wins a tie
    float best = -1.0f;
    int best_e = n_experts;
    for (int i = 0; i < kMaxExpertsPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < n_experts && (p[i] > best || (p[i] == best && e < best_e))) best = p[i], best_e = e;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (ob > best || (ob == best && oe < best_e)) best = ob, best_e = oe;
    }
    if (best_e % 32 == lane) p[best_e / 32] = -2.0f;  // taken
    chosen[k] = best / sum;
    chosen_id[k] = best_e;
    total += chosen[k];
  }
  if (lane == 0) {
    for (int k = 0; k < top_k; ++k) {
      float w = renormalize ? chosen[k] / total : chosen[k];
      if (scale) w *= scale[chosen_id[k]];
      ids[t * top_k + k] = chosen_id[k];
      weights[t * top_k + k] = w;
    }
  }
}

// ---- tensor-core kernels for decode-sized calls ----
//
// Batch invariance: the warps of a tile depend on the model's shape alone (one token's tiles, the
// top-k), never on the token count, so a token's output has the same bits at any count this path
// takes.

constexpr int kMaxDownWarps = 8;  // a warp per slot up to top-8; more slots share warps

// act[pair, i] = act(gate_e[i] · x_t) · (up_e[i] · x_t), rounded to bf16, for a tile of 16 rows i
// of gate and up (inter is a multiple of 32: whole tiles); the warps split hidden.
__global__ void __launch_bounds__(256)
    expert_up_mma_kernel(const bf16* __restrict__ x, int64_t ldx, const int32_t* __restrict__ ids,
                         const bf16* __restrict__ gate, const bf16* __restrict__ up, bf16* __restrict__ act,
                         int64_t hidden, int64_t inter, int top_k, bool gelu) {
  extern __shared__ float red[];
  wait_for_inputs();  // the expert comes from the router
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int64_t pair = blockIdx.y, row0 = int64_t(blockIdx.x) * kTileRows;
  const int64_t lo = (ids[pair] * inter + row0 + lane / 4) * hidden, hi = lo + 8 * hidden;
  TileSource<2> src;
  src.lo[0] = reinterpret_cast<const uint4*>(gate + lo) + lane % 4;
  src.hi[0] = reinterpret_cast<const uint4*>(gate + hi) + lane % 4;
  src.lo[1] = reinterpret_cast<const uint4*>(up + lo) + lane % 4;
  src.hi[1] = reinterpret_cast<const uint4*>(up + hi) + lane % 4;
  const uint4* xs[1] = {reinterpret_cast<const uint4*>(x + pair / top_k * ldx) + lane % 4};
  float acc[2][1][4];
  tile_partials<1, 2, 2>(src, xs, hidden / kStepK, warp, warps, acc);
  reduce_tile<1, 2>(red, acc, 1, [&](int r, int, const float(&v)[2]) {
    act[pair * inter + row0 + r] = __float2bfloat16((gelu ? gelu_tanh(v[0]) : silu(v[0])) * v[1]);
  });
}

// out[t, c] = Σ_k weight[t, k] · down_{e_k}[c] · act[t, k] for a tile of 16 features c (hidden is a
// multiple of 32: whole tiles). Warp w takes slots w, w + warps, ..., each over all of inter; the
// warps' weighted sums are added in warp order, which is slot order when there is a warp per slot.
template <typename T>
__global__ void __launch_bounds__(kMaxDownWarps * 32)
    expert_down_mma_kernel(const bf16* __restrict__ act, const int32_t* __restrict__ ids,
                           const float* __restrict__ weights, const bf16* __restrict__ down, Rows<T> out,
                           int64_t hidden, int64_t inter, int top_k) {
  extern __shared__ float red[];
  wait_for_inputs();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int64_t t = blockIdx.y, row0 = int64_t(blockIdx.x) * kTileRows;
  float sum[1][1][4] = {};
  for (int k = warp; k < top_k; k += warps) {
    const int64_t pair = t * top_k + k;
    const int64_t lo = (ids[pair] * hidden + row0 + lane / 4) * inter;
    TileSource<1> src;
    src.lo[0] = reinterpret_cast<const uint4*>(down + lo) + lane % 4;
    src.hi[0] = reinterpret_cast<const uint4*>(down + lo + 8 * inter) + lane % 4;
    const uint4* xs[1] = {reinterpret_cast<const uint4*>(act + pair * inter) + lane % 4};
    float acc[1][1][4];
    tile_partials<1, 1, 4>(src, xs, inter / kStepK, 0, 1, acc);
    const float w = weights[pair];
#pragma unroll
    for (int i = 0; i < 4; ++i) sum[0][0][i] = fmaf(w, acc[0][0][i], sum[0][0][i]);
  }
  reduce_tile<1, 1>(red, sum, 1, [&](int r, int, const float(&v)[1]) { out.row(t)[row0 + r] = from_float<T>(v[0]); });
}

// ---- CUDA-core streaming kernels ----

constexpr int kStreamWarps = 8;
constexpr int kStreamLoads = 24;  // 16-byte weight loads a lane holds in flight: 96 registers

// w · x over eight values: w packed bf16, x eight f32
__device__ __forceinline__ float dot8(const uint4& w, const float (&x)[8]) {
  const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&w);
  float acc = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = __bfloat1622float2(wp[i]);
    acc = fmaf(a.x, x[2 * i], acc);
    acc = fmaf(a.y, x[2 * i + 1], acc);
  }
  return acc;
}

// Eight consecutive values of a 16-byte aligned row, as f32.
__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p)), b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
template <typename T>
__device__ __forceinline__ void load8(const T* p, float (&v)[8]) {
  const uint4 packed = __ldg(reinterpret_cast<const uint4*>(p));
  const T* h = reinterpret_cast<const T*>(&packed);
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = to_float(h[j]);
}
__device__ __forceinline__ void load8_shared(const float* p, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// act[pair, i] = act(gate_e[i] · x_t) · (up_e[i] · x_t), a warp per row i. A round covers up to
// kStreamLoads / 2 chunks of 8 per lane of both rows, all loaded before any is used; the token's
// row x is read from cache (every warp of the block reads the same row) as it is consumed.
template <typename T>
__global__ void __launch_bounds__(kStreamWarps * 32)
    expert_up_stream_kernel(Rows<const T> x, const int32_t* __restrict__ ids, const bf16* __restrict__ gate,
                            const bf16* __restrict__ up, float* __restrict__ act, int64_t hidden, int64_t inter,
                            int top_k, bool gelu) {
  constexpr int kPerRow = kStreamLoads / 2;
  wait_for_inputs();
  const int64_t pair = blockIdx.x;
  const int64_t i = int64_t(blockIdx.y) * kStreamWarps + threadIdx.x / 32;
  if (i >= inter) return;
  const int lane = threadIdx.x % 32;
  const int64_t e = ids[pair];
  const uint4* g = reinterpret_cast<const uint4*>(gate + (e * inter + i) * hidden);
  const uint4* u = reinterpret_cast<const uint4*>(up + (e * inter + i) * hidden);
  const T* xr = x.row(pair / top_k);
  // the rows' chunks spread evenly over as few rounds as hold them
  const int chunks = int(hidden / 8);
  const int per_lane = (chunks + 31) / 32;
  const int rounds = (per_lane + kPerRow - 1) / kPerRow;
  const int step = (per_lane + rounds - 1) / rounds;
  float gs = 0, us = 0;
  for (int c0 = 0; c0 < chunks; c0 += 32 * step) {
    uint4 gw[kPerRow], uw[kPerRow];
#pragma unroll
    for (int j = 0; j < kPerRow; ++j) {
      const int c = c0 + lane + 32 * j;
      if (j < step && c < chunks) gw[j] = __ldg(g + c), uw[j] = __ldg(u + c);
    }
#pragma unroll
    for (int j = 0; j < kPerRow; ++j) {
      const int c = c0 + lane + 32 * j;
      if (j < step && c < chunks) {
        float xv[8];
        load8(xr + int64_t(c) * 8, xv);
        gs += dot8(gw[j], xv);
        us += dot8(uw[j], xv);
      }
    }
  }
  gs = warp_sum(gs);
  us = warp_sum(us);
  if (lane == 0) act[pair * inter + i] = (gelu ? gelu_tanh(gs) : silu(gs)) * us;
}

// out[t, c] = Σ_k weight[t, k] · down_{e_k}[c] · act[t, k], a warp per output feature. A lane's
// chunks of 8 run over (expert k, chunk j of the row); a round loads up to kStreamLoads of them,
// every expert's row at once at decode, before any is used. The block's token activations, scaled
// by the routing weights, are staged in shared memory while the first round's loads are in flight.
template <typename T>
__global__ void __launch_bounds__(kStreamWarps * 32)
    expert_down_stream_kernel(const float* __restrict__ act, const int32_t* __restrict__ ids,
                              const float* __restrict__ weights, const bf16* __restrict__ down, Rows<T> out,
                              int64_t hidden, int64_t inter, int top_k) {
  wait_for_inputs();
  extern __shared__ float4 token_act4[];  // [top_k, inter]: weight[t, k] · act[t, k]
  float* token_act = reinterpret_cast<float*>(token_act4);
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x % 32;
  const int64_t c = int64_t(blockIdx.y) * kStreamWarps + threadIdx.x / 32;
  const bool live = c < hidden;  // every warp stays for the barrier
  const int chunks = int(inter / 8);
  const int per_expert = (chunks + 31) / 32;
  const int slots = top_k * per_expert;
  const int32_t lane_expert = lane < top_k ? ids[t * top_k + lane] : 0;
  float acc = 0;
  for (int s0 = 0; s0 < slots; s0 += kStreamLoads) {
    uint4 w[kStreamLoads];
    int k = s0 / per_expert, j = s0 % per_expert;
#pragma unroll
    for (int s = 0; s < kStreamLoads; ++s) {
      const int64_t e = __shfl_sync(0xffffffffu, lane_expert, k % 32);
      const int ch = lane + 32 * j;
      if (live && s0 + s < slots && ch < chunks)
        w[s] = __ldg(reinterpret_cast<const uint4*>(down + (e * hidden + c) * inter) + ch);
      if (++j == per_expert) j = 0, ++k;
    }
    if (s0 == 0) {
      const float4* a4 = reinterpret_cast<const float4*>(act + t * top_k * inter);
      for (int64_t q = threadIdx.x; q < top_k * inter / 4; q += blockDim.x) {
        const float wk = weights[t * top_k + q * 4 / inter];
        float4 v = a4[q];
        v.x *= wk, v.y *= wk, v.z *= wk, v.w *= wk;
        token_act4[q] = v;
      }
      __syncthreads();
    }
    k = s0 / per_expert, j = s0 % per_expert;
#pragma unroll
    for (int s = 0; s < kStreamLoads; ++s) {
      const int ch = lane + 32 * j;
      if (live && s0 + s < slots && ch < chunks) {
        float av[8];
        load8_shared(token_act + k * inter + ch * 8, av);
        acc += dot8(w[s], av);
      }
      if (++j == per_expert) j = 0, ++k;
    }
  }
  acc = warp_sum(acc);
  if (live && lane == 0) out.row(t)[c] = from_float<T>(acc);
}

// Generic kernels: any shape, one f32 copy of the input vector per block.

__device__ __forceinline__ float dot_bf16(const bf16* w, const float* x, int64_t n, int lane) {
  float acc = 0;
  if (n % 8 == 0) {
    const uint4* w8 = reinterpret_cast<const uint4*>(w);
#pragma unroll 4  // independent 16-byte loads: keep several in flight
    for (int64_t c = lane; c < n / 8; c += 32) {
      const uint4 packed = __ldg(w8 + c);
      const bf16* v = reinterpret_cast<const bf16*>(&packed);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc = fmaf(__bfloat162float(v[j]), x[c * 8 + j], acc);
    }
  } else {
    for (int64_t i = lane; i < n; i += 32) acc += __bfloat162float(w[i]) * x[i];
  }
  return warp_sum(acc);
}

// act[pair, i] = act(gate_e[i] · x_t) · (up_e[i] · x_t); a warp per output row
template <typename T>
__global__ void expert_up_kernel(Rows<const T> x, const int32_t* ids, const bf16* gate, const bf16* up, float* act,
                                 int64_t hidden, int64_t inter, int top_k, bool gelu) {
  wait_for_inputs();
  extern __shared__ float xs[];
  const int64_t pair = blockIdx.x;
  const int64_t t = pair / top_k;
  const int64_t e = ids[pair];
  for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x) xs[c] = to_float(x.row(t)[c]);
  __syncthreads();
  const int lane = threadIdx.x % 32;
  const int64_t i = int64_t(blockIdx.y) * (blockDim.x / 32) + threadIdx.x / 32;
  if (i >= inter) return;
  const int64_t offset = (e * inter + i) * hidden;
  const float g = dot_bf16(gate + offset, xs, hidden, lane);
  const float u = dot_bf16(up + offset, xs, hidden, lane);
  if (lane == 0) act[pair * inter + i] = (gelu ? gelu_tanh(g) : silu(g)) * u;
}

// y[pair, c] = down_e[c] · act[pair]
__global__ void expert_down_kernel(const float* act, const int32_t* ids, const bf16* down, float* y, int64_t hidden,
                                   int64_t inter) {
  wait_for_inputs();
  extern __shared__ float as[];
  const int64_t pair = blockIdx.x;
  const int64_t e = ids[pair];
  for (int64_t i = threadIdx.x; i < inter; i += blockDim.x) as[i] = act[pair * inter + i];
  __syncthreads();
  const int lane = threadIdx.x % 32;
  const int64_t c = int64_t(blockIdx.y) * (blockDim.x / 32) + threadIdx.x / 32;
  if (c >= hidden) return;
  const float d = dot_bf16(down + (e * hidden + c) * inter, as, inter, lane);
  if (lane == 0) y[pair * hidden + c] = d;
}

// out[t, c] = Σ_k weight[t, k] · down_{e_k}[c] · act[t, k]: the down products and the weighted sum
// in one pass, a warp per output feature, the token's activations for all its experts in shared
// memory.
template <typename T>
__global__ void expert_down_combine_kernel(const float* act, const int32_t* ids, const float* weights, const bf16* down,
                                           Rows<T> out, int64_t hidden, int64_t inter, int top_k) {
  wait_for_inputs();
  extern __shared__ float token_act[];  // [top_k, inter]
  const int64_t t = blockIdx.x;
  for (int64_t i = threadIdx.x; i < top_k * inter; i += blockDim.x) token_act[i] = act[t * top_k * inter + i];
  __syncthreads();
  const int lane = threadIdx.x % 32;
  const int64_t c = int64_t(blockIdx.y) * (blockDim.x / 32) + threadIdx.x / 32;
  if (c >= hidden) return;
  float acc = 0;
  for (int k = 0; k < top_k; ++k) {
    const int64_t e = ids[t * top_k + k];
    acc += weights[t * top_k + k] * dot_bf16(down + (e * hidden + c) * inter, token_act + k * inter, inter, lane);
  }
  if (lane == 0) out.row(t)[c] = from_float<T>(acc);
}

template <typename T>
__global__ void expert_combine_kernel(const float* y, const float* weights, Rows<T> out, int64_t tokens, int64_t hidden,
                                      int top_k) {
  wait_for_inputs();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * hidden) return;
  const int64_t t = i / hidden, c = i % hidden;
  float acc = 0;
  for (int k = 0; k < top_k; ++k) acc += weights[t * top_k + k] * y[(t * top_k + k) * hidden + c];
  out.row(t)[c] = from_float<T>(acc);
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Above this many (token, expert) pairs the generic kernels are faster: every pair still reads its
// expert's rows, now mostly from L2, where the generic kernels' shared copy of the input pays off.
// On an H200 at 26B-A4B geometry (hidden 2816, inter 704, top-8), streaming against generic:
// 46 against 82 µs at 1 token, 138 against 152 at 4, 484 against 506 at 16, 1947 against 1857 at 64.
constexpr int64_t kMaxStreamPairs = 128;

// Rows of whole 16-byte chunks, 16-byte aligned: what both the streaming and the tensor-core
// kernels load.
bool aligned_rows(const MoeExpertsArgs& args) {
  const int64_t hidden = args.x.cols(), inter = args.gate.dim(1);
  const size_t x_row_bytes = size_t(args.x.row_stride()) * dtype_size(args.x.dtype());
  return hidden % 8 == 0 && inter % 8 == 0 && aligned16(args.x.data()) && x_row_bytes % 16 == 0 &&
         aligned16(args.gate.data()) && aligned16(args.up.data()) && aligned16(args.down.data()) &&
         args.gate.contiguous() && args.up.contiguous() && args.down.contiguous();
}

// The streaming kernels' shapes: few pairs of aligned rows.
bool streamable(const MoeExpertsArgs& args) {
  return args.x.rows() * args.ids.cols() <= kMaxStreamPairs && aligned_rows(args);
}

// The tensor-core kernels take every call of up to 32 tokens (a batch-invariant serving step's
// decode rows): each token's arithmetic there is the same at any token count, so the kernel
// choice must not depend on the count within that range. A bf16 input, whole 32-wide k steps.
bool mma_shape(const MoeExpertsArgs& args) {
  return args.x.rows() <= kMaxDecodeExpertTokens && aligned_rows(args) && args.x.dtype() == DType::bf16 &&
         args.x.cols() % kStepK == 0 && args.gate.dim(1) % kStepK == 0;
}

// Up and down on the tensor cores; act is bf16.
void moe_experts_mma(const MoeExpertsArgs& args, const Allocate& allocate, cudaStream_t stream) {
  const int64_t tokens = args.x.rows(), hidden = args.x.cols();
  const int64_t inter = args.gate.dim(1);
  const int top_k = int(args.ids.cols());
  const int64_t pairs = tokens * top_k;
  Tensor act = allocate(DType::bf16, Shape{pairs, inter});
  const int inter_tiles = ceil_div(inter, kTileRows);
  // sized for one token, so that the split does not change with the token count
  const int up_warps = mma_warps(int64_t(inter_tiles) * top_k, hidden / kStepK, 8);
  launch(expert_up_mma_kernel, dim3(unsigned(inter_tiles), unsigned(pairs)), up_warps * 32,
         size_t(up_warps) * 2 * 4 * 32 * sizeof(float), stream, args.x.data_as<bf16>(), args.x.row_stride(),
         args.ids.data_as<int32_t>(), args.gate.data_as<bf16>(), args.up.data_as<bf16>(), act.data_as<bf16>(), hidden,
         inter, top_k, args.act == Activation::gelu_tanh);
  const int down_warps = std::min(top_k, kMaxDownWarps);
  dispatch_float(args.out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch(expert_down_mma_kernel<T>, dim3(unsigned(ceil_div(hidden, kTileRows)), unsigned(tokens)), down_warps * 32,
           size_t(down_warps) * 4 * 32 * sizeof(float), stream, act.data_as<bf16>(), args.ids.data_as<int32_t>(),
           args.weights.data_as<float>(), args.down.data_as<bf16>(), rows_of<T>(args.out), hidden, inter, top_k);
  });
}

}  // namespace

void combine_experts(const Tensor& y, const Tensor& weights, const Tensor& out, cudaStream_t stream) {
  const int64_t tokens = out.rows(), hidden = out.cols();
  const int top_k = int(weights.cols());
  dispatch_float(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch(expert_combine_kernel<T>, ceil_div(tokens * hidden, 256), 256, 0, stream, y.data_as<float>(),
           weights.data_as<float>(), rows_of<T>(out), tokens, hidden, top_k);
  });
}

void moe_route(const MoeRouteArgs& args, cudaStream_t stream) {
  const int64_t tokens = args.logits.rows();
  const int n_experts = int(args.logits.cols());
  assert(n_experts <= 32 * kMaxExpertsPerLane && args.top_k <= kMaxTopK);
  if (tokens == 0) return;
  const float* scale = args.expert_scale.defined() ? args.expert_scale.data_as<float>() : nullptr;
  dispatch_float(args.logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch(route_kernel<T>, int(tokens), 32, 0, stream, rows_of<const T>(args.logits), n_experts, args.top_k,
           args.renormalize, scale, args.ids.data_as<int32_t>(), args.weights.data_as<float>());
  });
}

void moe_experts(const MoeExpertsArgs& args, const Allocate& allocate, cudaStream_t stream) {
  const int64_t tokens = args.x.rows(), hidden = args.x.cols();
  const int64_t inter = args.gate.dim(1);
  const int top_k = int(args.ids.cols());
  const int64_t pairs = tokens * top_k;
  if (pairs == 0) return;
  assert(args.gate.dtype() == DType::bf16);
  if (mma_shape(args)) return moe_experts_mma(args, allocate, stream);
  if (grouped_moe_experts(args, allocate, stream)) return;
  Tensor act = allocate(DType::f32, Shape{pairs, inter});
  constexpr int kWarps = 8;
  constexpr size_t kDefaultSharedBytes = 48 * 1024;  // more needs a per-kernel opt-in
  const bool gelu = args.act == Activation::gelu_tanh;
  const bool stream_kernels = streamable(args);
  dispatch_float(args.x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (stream_kernels)
      launch(expert_up_stream_kernel<T>, dim3(unsigned(pairs), unsigned(ceil_div(inter, kStreamWarps))),
             kStreamWarps * 32, 0, stream, rows_of<const T>(args.x), args.ids.data_as<int32_t>(),
             args.gate.data_as<bf16>(), args.up.data_as<bf16>(), act.data_as<float>(), hidden, inter, top_k, gelu);
    else
      launch(expert_up_kernel<T>, dim3(unsigned(pairs), unsigned(ceil_div(inter, kWarps))), kWarps * 32,
             size_t(hidden) * sizeof(float), stream, rows_of<const T>(args.x), args.ids.data_as<int32_t>(),
             args.gate.data_as<bf16>(), args.up.data_as<bf16>(), act.data_as<float>(), hidden, inter, top_k, gelu);
  });
  const size_t token_act_bytes = size_t(top_k) * size_t(inter) * sizeof(float);
  if (token_act_bytes <= kDefaultSharedBytes) {  // decode and small batches: one pass
    dispatch_float(args.out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if (stream_kernels)
        launch(expert_down_stream_kernel<T>, dim3(unsigned(tokens), unsigned(ceil_div(hidden, kStreamWarps))),
               kStreamWarps * 32, token_act_bytes, stream, act.data_as<float>(), args.ids.data_as<int32_t>(),
               args.weights.data_as<float>(), args.down.data_as<bf16>(), rows_of<T>(args.out), hidden, inter, top_k);
      else
        launch(expert_down_combine_kernel<T>, dim3(unsigned(tokens), unsigned(ceil_div(hidden, kWarps))), kWarps * 32,
               token_act_bytes, stream, act.data_as<float>(), args.ids.data_as<int32_t>(),
               args.weights.data_as<float>(), args.down.data_as<bf16>(), rows_of<T>(args.out), hidden, inter, top_k);
    });
    return;
  }
  Tensor y = allocate(DType::f32, Shape{pairs, hidden});
  launch(expert_down_kernel, dim3(unsigned(pairs), unsigned(ceil_div(hidden, kWarps))), kWarps * 32,
         size_t(inter) * sizeof(float), stream, act.data_as<float>(), args.ids.data_as<int32_t>(),
         args.down.data_as<bf16>(), y.data_as<float>(), hidden, inter);
  combine_experts(y, args.weights, args.out, stream);
}

}  // namespace kiln::cuda
