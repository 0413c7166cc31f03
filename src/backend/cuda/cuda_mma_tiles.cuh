// Tensor-core tiles of weight rows against a few input rows, shared by the small products
// (cuda_gemv.cu) and the decode experts (cuda_moe.cu).
//
// A warp owns a tile of 16 weight rows and multiplies it with up to 8 input rows per n-tile on the
// tensor cores (mma.sync m16n8k16, bf16 in, f32 accumulate).
//
// Loads: lane (g, t) = (lane / 4, lane % 4) reads 16 bytes (8 consecutive k) of weight rows g and
// g + 8 and of input row g for every 32-wide k step. The MMA's k slots a lane feeds ({2t, 2t+1,
// 2t+8, 2t+9}) are only labels: as long as the weight and input fragments give a slot the same
// physical k, the sum is the same dot product. So the 8 loaded k of a lane feed its slots of two
// MMAs directly, with no shuffles.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace kiln::cuda {

constexpr int kTileRows = 16;
constexpr int kStepK = 32;
// How many warps a product's grid may hold: about two waves of these kernels on an H100/H200 (~18
// warps an SM at their register use, 132 SMs). More warps keep more loads in flight: on an H200 an
// 18432 x 2560 product went from 1 to 2 warps a tile at this bound and from 36 to 30 us.
constexpr int64_t kMaxGridWarps = 4096;
// The most warps one tile's k is split over. 16 was slower than 8 on 2560-row products (160
// tiles: the grid no longer fits in one wave).
constexpr int kMaxTileWarps = 8;

// One 32-wide k step of a 16-row tile against one 8-row n-tile: lo/hi are the lane's 8 k of
// weight rows g and g + 8, x the same 8 k of input row g.
__device__ __forceinline__ void mma_step(float (&c)[4], const uint4& lo, const uint4& hi, const uint4& x) {
  mma_bf16(c, {lo.x, hi.x, lo.y, hi.y}, x.x, x.y);
  mma_bf16(c, {lo.z, hi.z, lo.w, hi.w}, x.z, x.w);
}

// How many warps split k for a product of `tiles` 16-row tiles over `steps` k steps. It depends
// on the shape alone, never on the row count, which batch invariance needs.
// Doubling stops before the grid outgrows kMaxGridWarps or a warp gets fewer than 8 steps.
inline int mma_warps(int64_t tiles, int64_t steps, int max_warps = kMaxTileWarps) {
  int warps = 1;
  while (warps * 2 <= max_warps && tiles * warps * 2 <= kMaxGridWarps && steps >= int64_t(warps) * 2 * 8) warps *= 2;
  return warps;
}

// Where a lane's fragments come from: P weight matrices (1, or gate and up) of one tile.
template <int P>
struct TileSource {
  const uint4* lo[P];  // weight row g of the tile, at the lane's 8 k of step 0
  const uint4* hi[P];  // weight row g + 8
};

// The warp's partial sums of one tile over its share of k: steps warp, warp + warps, ..., U steps
// per round with all of a round's weight and input loads issued before its MMAs. The first round's
// weights are requested before wait_for_inputs(): they are constants, so their latency overlaps the
// tail of the kernel before. Kernels whose weight addresses come from an earlier kernel (the
// experts, chosen by the router) call wait_for_inputs() first; the call here then returns at once.
template <int NT, int P, int U>
__device__ __forceinline__ void tile_partials(const TileSource<P>& src, const uint4* const (&xs)[NT], int64_t steps,
                                              int warp, int warps, float (&acc)[P][NT][4]) {
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[p][j][i] = 0.0f;
  // the weights of the round starting at step s0, into lo/hi
  auto load_weights = [&](int64_t s0, uint4(&lo)[U][P], uint4(&hi)[U][P]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t s = s0 + int64_t(u) * warps;
      if (s < steps) {
#pragma unroll
        for (int p = 0; p < P; ++p) {
          lo[u][p] = load_streaming(src.lo[p] + s * (kStepK / 8));
          hi[u][p] = load_streaming(src.hi[p] + s * (kStepK / 8));
        }
      }
    }
  };
  uint4 lo[U][P], hi[U][P];
  int64_t s0 = warp;
  load_weights(s0, lo, hi);
  wait_for_inputs();
  while (s0 < steps) {
    uint4 x[U][NT];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t s = s0 + int64_t(u) * warps;
      if (s < steps) {
#pragma unroll
        for (int j = 0; j < NT; ++j) x[u][j] = __ldg(xs[j] + s * (kStepK / 8));
      }
    }
    uint4 next_lo[U][P], next_hi[U][P];
    const int64_t next = s0 + int64_t(U) * warps;
    load_weights(next, next_lo, next_hi);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (s0 + int64_t(u) * warps < steps) {
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
          for (int j = 0; j < NT; ++j) mma_step(acc[p][j], lo[u][p], hi[u][p], x[u][j]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int p = 0; p < P; ++p) lo[u][p] = next_lo[u][p], hi[u][p] = next_hi[u][p];
    s0 = next;
  }
}

// The lane's input-row pointers, one per n-tile: row 8j + g, rows past m clamped to the last one
// (their results are never stored).
template <int NT>
__device__ __forceinline__ void input_rows(const bf16* x, int64_t ldx, int m, int lane, const uint4* (&xs)[NT]) {
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int r = min(8 * j + lane / 4, m - 1);
    xs[j] = reinterpret_cast<const uint4*>(x + r * ldx) + lane % 4;
  }
}

// Adds the warps' partial sums in warp order and hands each (tile row, input row) output to
// store(row_in_tile, input_row, values[P]).
template <int NT, int P, typename Store>
__device__ __forceinline__ void reduce_tile(float* red, const float (&acc)[P][NT][4], int m, Store&& store) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  constexpr int kPerWarp = P * NT * 4 * 32;  // lane-minor: conflict-free stores
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[warp * kPerWarp + ((p * NT + j) * 4 + i) * 32 + lane] = acc[p][j][i];
  __syncthreads();
  for (int e = threadIdx.x; e < NT * 4 * 32; e += blockDim.x) {
    const int l = e % 32, i = (e / 32) % 4, j = e / 128;
    const int row = l / 4 + (i >= 2 ? 8 : 0), input = 8 * j + 2 * (l % 4) + (i & 1);
    if (input >= m) continue;
    float v[P];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      float sum = 0.0f;
      for (int w = 0; w < warps; ++w) sum += red[w * kPerWarp + p * NT * 128 + e];
      v[p] = sum;
    }
    store(row, input, v);
  }
}

}  // namespace kiln::cuda
