// CUDA backend: the decode products of quantized weights (MLX's affine format, src/quant/affine.h).
//
// A few input rows (decode, small batches): fused dequantize-GEMVs stream the packed codes once;
// from 12 rows the 4-bit ones run on the tensor cores, with the same bits (cuda_quant_mma.cu).
// A warp owns a few output features (rows_per_warp); each lane takes 32-element chunks of those rows,
// which are exactly `bits` 32-bit words of codes and never straddle a group (groups are 32, 64 or
// 128), so a chunk needs one scale and one bias: acc += scale · Σ x·q + bias · Σ x. Products sharing
// an input (q/k/v; gate/up with the GLU applied) run in one launch.
#include <algorithm>
#include <cassert>
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.cuh"
#include "backend/cuda/cuda_quant_codes.cuh"
#include "backend/cuda/cuda_quant_products.cuh"
#include "backend/cuda/cuda_residual_norm.cuh"
#include "core/tensor.h"

namespace kiln::cuda {

namespace {

// ---- decode: fused dequantize + GEMV ----
//
// Turning codes into floats is what bounds this kernel, not the multiply (see cuda_quant_codes.cuh
// for how a code becomes a float without an integer conversion). With the input chunk's sum Σx,
//   Σ x·q = 2^(BITS+1) · Σ x·f − 2^BITS · Σ x,    acc += s · Σ x·q + b · Σ x.
// The offset costs ~5 of f32's 24 bits, far below bf16's rounding of the inputs.

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
    store_output(p.out[s], m * p.ldo[s] + first + o, v, f32_out);
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

// ---- 2, 4 and 8 bits: integer dot products ----
//
// Turning codes into floats costs the float kernel above ~3 instructions a weight, and at 0.56 bytes
// a weight that bounds it well below the memory's speed. Here the input rows are quantized instead:
// per 32-element chunk to int16 (scale = max |x| / 32767, a step of 2^-16 of the chunk's largest
// value, far below bf16's own rounding), once per block, into shared memory. A word of codes is
// split into bytes (an AND, plus a shift per further code in a byte) that dp2a multiplies with two
// int16 inputs at a time: ~1 instruction a weight. The integer sums are exact, so how a chunk's
// products are grouped cannot change a bit.
//
// The float sums follow one order, the same at any row count, so a row gets the bits it gets alone:
// a chunk's term is (s · sx) · Σ xq·q + b · Σ x (one FMA over two rounded products); the terms of a
// run of 32 chunks are added as a balanced tree over the chunks in order (pairs, pairs of pairs,
// ...; chunks past the end give +0); a part's runs are added in turn to its sum, which starts at +0;
// the parts' sums are added in part order from +0 (one part: its sum alone). A lane adds one run
// value a step (run_sums), not a chain of its own chunks, so a kernel that holds a chunk's dots for
// all rows at once (tensor cores) can form the same sums streaming over the chunks.
//
// Blocks of 16 warps, one an SM, loop over tiles of R weight rows (a GLU tile: R/2 gate and R/2 up
// rows). `parts` warps share a tile, each taking every parts-th run of 32 chunks, their sums added
// in part order (any count up to 16; the warps past the last whole group idle); parts is chosen
// from the shapes and the GPU alone, never the number of input rows, so a row gets the same bits in
// any batch. A warp's loads run two iterations ahead, across tiles.

constexpr int kDotWarps = 16;
constexpr int kDotThreads = kDotWarps * 32;
constexpr int64_t kDotChunkBytes = 4 * 16 + 8;   // a chunk's input pairs, scale and sum
constexpr int64_t kDotSharedBudget = 200 << 10;  // the input rows one pass holds

constexpr bool integer_dot_width(int bits) {
  return bits == 2 || bits == 4 || bits == 8;
}

// Input rows one pass of the integer products holds in shared memory (0: k too large for them).
int dot_pass_rows(int64_t k) {
  return int(std::min<int64_t>(8, kDotSharedBudget / ((k / 32) * kDotChunkBytes)));
}

// Input rows [0, rows) as the dot products read them, one thread a chunk: piece v (pairs 4v..4v+3)
// of row m's chunk c at pieces[(m·4 + v)·chunks + c], so that a warp's lanes, which take consecutive
// chunks, read consecutive 16 bytes; the chunk's scale and sum at stats[m·chunks + c].
template <int BITS>
__device__ void quantize_input(const bf16* __restrict__ x, int64_t ldx, int rows, int chunks, uint4* pieces,
                               float2* stats) {
  for (int i = threadIdx.x; i < rows * chunks; i += blockDim.x) {
    const int m = i / chunks, c = i % chunks;
    InputChunk chunk;
    chunk.read(x + m * ldx + 32 * c);
    uint32_t pairs[16];
#pragma unroll
    for (int p = 0; p < 16; ++p) {
      const int lo = chunk.quantized(code_of_pair<BITS>(p, 0));
      const int hi = chunk.quantized(code_of_pair<BITS>(p, 1));
      pairs[p] = (uint32_t(lo) & 0xffffu) | (uint32_t(hi) << 16);
    }
#pragma unroll
    for (int q = 0; q < 4; ++q)
      pieces[(m * 4 + q) * chunks + c] = make_uint4(pairs[4 * q], pairs[4 * q + 1], pairs[4 * q + 2], pairs[4 * q + 3]);
    stats[m * chunks + c] = make_float2(chunk.step, chunk.sum);
  }
}

#if KILN_CUDA_DECODE_FLOOR
// Developer builds (-DKILN_CUDA_DECODE_FLOOR=ON), for measuring what bounds a decode step:
// KILN_DECODE_FLOOR=1 makes every integer product return once its inputs are ready (its first
// loads issued), =2 makes it load all its weights and skip the arithmetic (its input stage, its
// tiles' finish and its residual update kept). Outputs are meaningless then; timing only.
__constant__ int decode_floor_mode;
#endif

// One iteration's loads of a lane: the codes, scale and bias of one chunk of each of the tile's rows.
template <int BITS, int R>
struct DotFetch {
  uint32_t words[R][BITS];
  bf16 scale[R], bias[R];
};

__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// The value of N (a power of two, at most 32) that lane ℓ keeps after run_sums: its low log2 N bits
// reversed. The mapping is its own inverse, so it also names the first lane keeping value i.
template <int N>
__device__ __forceinline__ int kept_value(int lane) {
  int i = 0;
#pragma unroll
  for (int n = N; n > 1; n /= 2, lane >>= 1) i += (lane & 1) * (n / 2);
  return i;
}

// N values a lane, each summed over the warp's lanes as a balanced tree in lane order (lane offsets
// 1, 2, 4, 8, 16 in turn: the tree the run order above names). Each level a lane keeps half of its
// values and sends the other half to its partner, so N − 1 + 5 − log2 N shuffles instead of 5N;
// lane ℓ returns value kept_value<N>(ℓ).
template <int N>
__device__ __forceinline__ float run_sums(float (&v)[N], int lane) {
#pragma unroll
  for (int level = 0; level < 5; ++level) {
    const int offset = 1 << level, n = N >> level;  // n: the values still held
    if (n > 1) {
      const bool upper = lane & offset;
#pragma unroll
      for (int i = 0; i < n / 2; ++i) {
        const float send = upper ? v[i] : v[i + n / 2], keep = upper ? v[i + n / 2] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, offset);
      }
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], offset);
    }
  }
  return v[0];
}

// out[m, row] for rows [0, rows) of x; RESIDUAL > 0 (a single product, bf16 out): then the last
// block to finish runs the residual update after it (cuda_residual_norm.cuh, RESIDUAL chunks a
// thread) and sets `done` back to zero, as the bf16 products' fused form does.
template <int BITS, int M, int R, bool GLU, int RESIDUAL>
__global__ void __launch_bounds__(kDotThreads, 1)
    qdot_kernel(QProducts p, const bf16* __restrict__ x, int64_t ldx, int rows, bool f32_out, bool gelu, int parts,
                int tiles, ResidualRows<bf16> update, unsigned* done) {
  constexpr int kOut = GLU ? R / 2 : R;  // output features of a tile
  extern __shared__ uint4 pieces[];
  __shared__ float partial[2][kDotWarps][R * M];
  const int chunks = int(p.k / 32);
  float2* stats = reinterpret_cast<float2*>(pieces + int64_t(rows) * 4 * chunks);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int groups = kDotWarps / parts, group = warp / parts, part = warp % parts;
  const int step = 32 * parts, iters = (chunks + step - 1) / step;
  const int tile_stride = int(gridDim.x) * groups, first_tile = int(blockIdx.x) * groups + group;
  // warps past the last whole group (16 % parts of them) take no tiles
  const int my_tiles = group < groups && first_tile < tiles ? (tiles - 1 - first_tile) / tile_stride + 1 : 0;
  const int items = my_tiles * iters;  // (tile, iteration) pairs of this warp, in order
  const int64_t row_groups = (p.k / 32) >> p.group_shift;

  auto product_of = [&](int t, int64_t& first) {  // tile t's product and first output feature
    int s = 0;
    if constexpr (!GLU)
      while (s + 1 < p.count && t >= p.block_end[s]) ++s;
    first = int64_t(t - (s ? p.block_end[s - 1] : 0)) * kOut;
    return s;
  };

  // The fetch cursor: the next item to load, and its tile's rows.
  const uint32_t* codes[R];
  const bf16* scales[R];
  const bf16* biases[R];
  int fetch_tile = 0, fetch_it = 0;
  auto locate = [&](int k) {
    int64_t first;
    const int s = product_of(first_tile + k * tile_stride, first);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int src = GLU ? r / kOut : s;
      const int64_t row = min(first + r % kOut, p.n[src] - 1);  // a short last tile repeats a row
      codes[r] = p.packed[src] + row * chunks * BITS;
      scales[r] = p.scales[src] + row * row_groups;
      biases[r] = p.biases[src] + row * row_groups;
    }
  };
  auto fetch = [&](DotFetch<BITS, R>& f) {
    const int c = lane + 32 * part + fetch_it * step;
    if (c < chunks) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if constexpr (BITS == 2) {
          const uint2 v = __ldg(reinterpret_cast<const uint2*>(codes[r] + c * BITS));
          f.words[r][0] = v.x, f.words[r][1] = v.y;
        } else {
#pragma unroll
          for (int v = 0; v < BITS / 4; ++v) {
            const uint4 q = load_streaming(reinterpret_cast<const uint4*>(codes[r] + c * BITS) + v);
            f.words[r][4 * v] = q.x, f.words[r][4 * v + 1] = q.y, f.words[r][4 * v + 2] = q.z,
                           f.words[r][4 * v + 3] = q.w;
          }
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        f.scale[r] = __ldg(scales[r] + (c >> p.group_shift));
        f.bias[r] = __ldg(biases[r] + (c >> p.group_shift));
      }
    }
    if (++fetch_it == iters) {
      fetch_it = 0;
      if (++fetch_tile < my_tiles) locate(fetch_tile);
    }
  };

  // The R·M sums (value r·M + m: weight row r, input row m) are spread over the lanes: each lane
  // adds the runs of the value it keeps (run_sums), lanes 0 .. R·M − 1 one value each.
  constexpr int kValues = R * M;
  const int kept = kept_value<kValues>(lane);
  float acc = 0.0f;

  auto finish = [&](int k) {  // tile k of this warp: the parts' sums, then the outputs
    float total = acc;
    acc = 0.0f;
    if (parts > 1) {  // double-buffered by tile: a part writes tile k + 2's sums only after part 0 read k's
      if (lane < kValues) partial[k & 1][warp][kept] = total;
      named_barrier(1 + group, parts * 32);
      if (part != 0) return;
      if (lane < kValues) {
        float v = 0.0f;
        for (int w = 0; w < parts; ++w) v += partial[k & 1][group * parts + w][kept];
        total = v;
      }
    }
    int64_t first;
    const int s = product_of(first_tile + k * tile_stride, first);
    const int64_t n = p.n[s];
    const int r = kept / M, m = kept % M;
    float v = total;
    if constexpr (GLU) {  // the up row's sum, from the lane keeping it
      const float up = __shfl_sync(0xffffffffu, total, kept_value<kValues>(min(kValues - 1, kept + kOut * M)));
      v = (gelu ? gelu_tanh(v) : silu(v)) * up;
      if (r >= kOut) return;
    }
    if (lane < kValues && m < rows && first + r < n) store_output(p.out[s], m * p.ldo[s] + first + r, v, f32_out);
  };

  int consume_tile = 0, consume_it = 0;
  auto consume = [&](const DotFetch<BITS, R>& f) {
    const int c = lane + 32 * part + consume_it * step;
#if KILN_CUDA_DECODE_FLOOR
    if (decode_floor_mode == 2) {  // the codes read, nothing computed: a word's bits kept alive
      uint32_t folded = 0;
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int w = 0; w < BITS; ++w) folded ^= f.words[r][w];
      acc += __uint_as_float(folded & 0x3ffu) + __bfloat162float(f.scale[0]) * __bfloat162float(f.bias[0]);
      if (++consume_it < iters) return false;
      consume_it = 0;
      return true;
    }
#endif
    float terms[kValues];
#pragma unroll
    for (int i = 0; i < kValues; ++i) terms[i] = 0.0f;
    if (c < chunks) {
      float s_f[R], b_f[R];
#pragma unroll
      for (int r = 0; r < R; ++r) s_f[r] = __bfloat162float(f.scale[r]), b_f[r] = __bfloat162float(f.bias[r]);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        if (m >= rows) break;
        uint32_t pairs[16];
        const float2 st = input_chunk(pieces, stats, m, chunks, c, pairs);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float dot = __int2float_rn(chunk_dot<BITS>(f.words[r], pairs));
          terms[r * M + m] = fmaf(s_f[r] * st.x, dot, b_f[r] * st.y);
        }
      }
    }
    acc += run_sums<kValues>(terms, lane);  // every lane: the run's tree is warp-wide
    if (++consume_it < iters) return false;
    consume_it = 0;
    return true;  // the tile's last iteration: finish it once the buffer is refilled
  };
  auto finish_if = [&](bool tile_done) {
    if (tile_done) finish(consume_tile++);
  };

  // The weights are constant: the first two iterations' loads go out before waiting on the kernel
  // that writes x, and overlap its tail and the input's quantization.
  DotFetch<BITS, R> a, b;
  if (my_tiles > 0) locate(0);
  if (items > 0) fetch(a);
  if (items > 1) fetch(b);
  wait_for_inputs();
#if KILN_CUDA_DECODE_FLOOR
  if (decode_floor_mode == 1) {  // the first iterations' codes waited for, nothing else done
    asm volatile("" ::"r"(a.words[0][0]), "r"(b.words[0][0]));
    return;
  }
#endif
  quantize_input<BITS>(x, ldx, rows, chunks, pieces, stats);
  __syncthreads();
  // A tile's sums are formed after the buffer just read is refilled: two iterations stay in flight
  // while the warp reduces, waits for its parts and stores.
  for (int i = 0; i < items; i += 2) {
    const bool done_a = consume(a);
    if (i + 2 < items) fetch(a);
    finish_if(done_a);
    if (i + 1 >= items) break;
    const bool done_b = consume(b);
    if (i + 3 < items) fetch(b);
    finish_if(done_b);
  }
  if constexpr (RESIDUAL > 0) update_in_last_block<RESIDUAL>(update, rows, done);
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
  if (!w.quantized() || w.quant().tiled_bytes || w.cols() != k || !aligned16(w.data())) return false;
  const QuantParams& q = w.quant();
  const QuantParams& l = like.quant();
  if (integer_dot_width(q.bits) && dot_pass_rows(k) == 0) return false;
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

// One pass of the float GEMV (3, 5 and 6 bits) over `rows` (≤ 8) input rows. The chunks split over a
// block's warps when the products alone give fewer than kSplitBelowWarps warps; decided on the shapes
// (the warps at one input row), never on the row count.
template <int BITS>
void run_float_gemv(QProducts& p, int products, bool glu, bool gelu, int rows, const bf16* xs, int64_t ldx,
                    DType out_dtype, cudaStream_t stream) {
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
      launch(qgemv_kernel<BITS, M, R, true>, blocks, kGemvWarps * 32, 0, stream, p, xs, ldx, rows, f32, gelu, splits);
    else
      launch(qgemv_kernel<BITS, M, R, false>, blocks, kGemvWarps * 32, 0, stream, p, xs, ldx, rows, f32, gelu, splits);
  });
}

// Warps sharing a tile of the integer products, from the tiles at one input row, the chunks and the
// GPU's size (never the row count): the busiest group's cost, in iterations, with a tile's finish
// (its reductions and stores) counted as one more and the barrier of a shared tile as another. Any
// count up to a block's warps and the tile's runs of 32 chunks: groups of three warps leave one of
// 16 idle but give a 4B model's down-projection (640 tiles of 288 chunks) 3 iterations, not 5.
int dot_parts(int64_t tiles_at_one_row, int chunks, int sms) {
  int best = 1;
  int64_t best_cost = INT64_MAX;
  for (int parts = 1; parts <= kDotWarps && 32 * (parts - 1) < chunks; ++parts) {
    const int64_t rounds = ceil_div(tiles_at_one_row, int64_t(sms) * (kDotWarps / parts));
    const int64_t cost = rounds * (ceil_div(chunks, 32 * parts) + 1 + (parts > 1));
    if (cost < best_cost) best = parts, best_cost = cost;
  }
  return best;
}

// The integer products of p over all rows of x (a GLU launch: `products` = 1 output, gate and up in
// p): passes of up to kMmaMaxRows rows on the tensor cores (4 bits, from kMmaMinRows rows), otherwise
// dot_pass_rows(k) rows a pass of the dp2a kernel. With `residual` (one product, at most
// kMaxFusedResidualRows rows, bf16 out) the residual update runs in the same launch.
template <int BITS>
void run_dot(QProducts p, int products, bool glu, bool gelu, const Tensor& x, DType out_dtype, cudaStream_t stream,
             const ResidualNormArgs* residual = nullptr, unsigned* done = nullptr) {
  const int64_t m = x.rows(), ldx = x.row_stride();
  const int chunks = int(p.k / 32), sms = multiprocessors(), cap = dot_pass_rows(p.k);
  const size_t out_size = dtype_size(out_dtype);
  const int out_at_one_row = glu ? rows_per_warp(1, BITS) / 2 : rows_per_warp(1, BITS);
  int64_t tiles_at_one_row = 0;
  for (int i = 0; i < products; ++i) tiles_at_one_row += ceil_div(p.n[i], out_at_one_row);
  int parts = dot_parts(tiles_at_one_row, chunks, sms);
#if KILN_CUDA_TIMELINE
  // developer builds: the parts of a kind of product forced from the environment, for measuring
  if (const char* forced = std::getenv(glu        ? "KILN_DOT_PARTS_GLU"
                                       : residual ? "KILN_DOT_PARTS_RES"
                                                  : "KILN_DOT_PARTS_PLAIN")) {
    const int f = std::atoi(forced);
    if (f >= 1 && f <= kDotWarps && 32 * (f - 1) < chunks) parts = f;
  }
#endif
  const int groups = kDotWarps / parts;
  const bool f32 = out_dtype == DType::f32;
  const void* out0[kMaxProducts];
  for (int i = 0; i < products; ++i) out0[i] = p.out[i];
  for (int64_t r0 = 0; r0 < m;) {
    for (int i = 0; i < products; ++i)
      p.out[i] = const_cast<char*>(static_cast<const char*>(out0[i])) + size_t(r0 * p.ldo[i]) * out_size;
    const bf16* xs = x.data_as<bf16>() + r0 * ldx;
    if constexpr (BITS == 4)
      if (!residual)
        if (const int taken = run_tensor_core_pass(p, products, glu, gelu, xs, ldx, m - r0, parts, f32, stream)) {
          r0 += taken;
          continue;
        }
    const int rows = int(std::min<int64_t>(cap, m - r0));
    dispatch_pass_rows(rows, [&](auto rows_tag) {
      constexpr int M = decltype(rows_tag)::value, R = rows_per_warp(M, BITS);
      const int per_tile = glu ? R / 2 : R;
      int tiles = 0;
      for (int i = 0; i < products; ++i) p.block_end[i] = tiles += ceil_div(p.n[i], per_tile);
      const int grid = std::min(sms, ceil_div(tiles, groups));
      const size_t shared = size_t(rows) * size_t(chunks) * kDotChunkBytes;
      auto go = [&](auto kernel, const ResidualRows<bf16>& update) {
        allow_most_dynamic_shared(kernel);
        launch(kernel, grid, kDotThreads, shared, stream, p, xs, ldx, rows, f32, gelu, parts, tiles, update, done);
      };
      if (glu) {
        go(qdot_kernel<BITS, M, R, true, 0>, ResidualRows<bf16>{});
      } else if (residual) {
        if constexpr (M <= kMaxFusedResidualRows)
          dispatch_row_chunks(residual->residual.cols(), [&](auto chunks_tag) {
            go(qdot_kernel<BITS, M, R, false, decltype(chunks_tag)::value>, residual_rows<bf16>(*residual));
          });
      } else {
        go(qdot_kernel<BITS, M, R, false, 0>, ResidualRows<bf16>{});
      }
    });
    r0 += rows;
  }
}

#if KILN_CUDA_DECODE_FLOOR
}  // namespace

void init_decode_floor() {
  const char* mode = std::getenv("KILN_DECODE_FLOOR");
  const int value = mode ? std::atoi(mode) : 0;
  cudaMemcpyToSymbol(decode_floor_mode, &value, sizeof value);
}

namespace {
#endif

// Runs the products of p over all rows of x (a GLU launch: `products` = 1 output, gate and up in
// p): the integer products for 2, 4 and 8 bits, otherwise the float GEMV, eight input rows per pass
// over the weights.
void run_gemv(QProducts p, int products, bool glu, bool gelu, int bits, const Tensor& x, DType out_dtype,
              cudaStream_t stream) {
  if (integer_dot_width(bits)) {  // gemv_weight saw that k fits
    with_bits(bits, [&](auto bits_tag) {
      constexpr int BITS = decltype(bits_tag)::value;
      if constexpr (integer_dot_width(BITS)) run_dot<BITS>(p, products, glu, gelu, x, out_dtype, stream);
    });
    return;
  }
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
      if constexpr (!integer_dot_width(BITS))
        run_float_gemv<BITS>(p, products, glu, gelu, rows, xs, ldx, out_dtype, stream);
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

bool quantized_gemv_residual_norm(const Tensor& x, const Tensor& w, const ResidualNormArgs& args, unsigned* done,
                                  cudaStream_t stream) {
  const int64_t m = x.rows(), k = x.cols(), n = args.residual.cols();
  const Tensor& out = args.block_out;
  if (m < 1 || m > kMaxFusedResidualRows || !gemv_input(x) || !gemv_weight(w, w, k) ||
      !integer_dot_width(w.quant().bits) || w.rows() != n || out.rows() != m || out.dtype() != DType::bf16 ||
      args.residual.rows() != m || !row_norm_vectorizable(args))
    return false;
  QProducts p{};
  p.count = 1;
  p.k = k;
  p.group_shift = group_shift(w.quant().group_size);
  add_product(p, 0, w, out);
  with_bits(w.quant().bits, [&](auto bits_tag) {
    constexpr int BITS = decltype(bits_tag)::value;
    if constexpr (integer_dot_width(BITS)) run_dot<BITS>(p, 1, false, false, x, DType::bf16, stream, &args, done);
  });
  return true;
}

}  // namespace kiln::cuda
