// The persistent decode prototype's device side (tools/gpu/persistent-decode.cu): phase
// descriptors, the producer and consumer kernel, the input stages, the stand-in small ops and the
// f32 reference kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "backend/cuda/cuda_bulk_copy.cuh"      // bulk copies into shared memory on mbarriers
#include "backend/cuda/cuda_quant_codes.cuh"    // the integer products' dot and the input's pair order
#include "backend/cuda/cuda_residual_norm.cuh"  // bf16 rows as floats and back

// What the product kernels already have: warp sums, silu, the last arrival's count, bf16 packing.
using kiln::cuda::arrive_acq_rel, kiln::cuda::code_of_pair, kiln::cuda::pack2, kiln::cuda::pack8, kiln::cuda::silu,
    kiln::cuda::unpack8, kiln::cuda::warp_sum;
// and the bulk copies into shared memory on mbarriers
using kiln::cuda::bulk_copy_to_shared, kiln::cuda::mbarrier_arrive, kiln::cuda::mbarrier_expect_bytes,
    kiln::cuda::mbarrier_init, kiln::cuda::mbarrier_wait, kiln::cuda::shared_address;

using bf16 = __nv_bfloat16;

constexpr int kConsumerWarps = 16;
constexpr int kConsumers = kConsumerWarps * 32;
constexpr int kThreads = kConsumers + 32;  // and one producer warp
#ifndef PD_ROWS_PER_WARP
#define PD_ROWS_PER_WARP 2
#endif
// Warp w takes tile rows w + 16q, q < kRowsPerWarp (a GLU tile: its first half gate rows, then the
// matching up rows).
constexpr int kRowsPerWarp = PD_ROWS_PER_WARP;
constexpr int kTileRows = kRowsPerWarp * kConsumerWarps;
static_assert(kRowsPerWarp % 2 == 0, "a GLU warp pairs gate and up rows");
constexpr int kMaxSlots = 12;
constexpr int kMaxK = 15360;
constexpr int kMaxChunks = kMaxK / 32;
constexpr int kGroup = 64;  // quantization group
constexpr float kEps = 1e-6f;

enum Kind { kProduct, kGlu, kDelta, kAttention };
enum Input { kNorm, kHeadNormGated, kPlain, kResAdd, kResNorm, kMerge };

// A vector another phase wrote (bf16).
struct Source {
  const bf16* bf = nullptr;
  int n = 0;
};

struct Phase {
  int kind = kProduct, input = kPlain;
  // products: n outputs (GLU: each half), input size k, tiles of kTileRows rows × `slice` columns
  int n = 0, k = 0, slice = 0, slices = 0, blocks = 0, splits = 1, per_split = 0, units = 0;
  int tasks = 0;            // small ops
  int dep = -1;             // the phase whose outputs this one reads
  unsigned dep_target = 0;  // its units or tasks
  const unsigned char* tiles = nullptr;
  Source in;                      // the input (kResAdd, kResNorm: the branch)
  const bf16* gate = nullptr;     // kHeadNormGated: z
  const bf16* res_in = nullptr;   // kResAdd, kResNorm: the residual before
  bf16* res_out = nullptr;        // and after (block 0 writes it)
  const float* norm_w = nullptr;  // the input's norm
  const float* branch_w = nullptr;
  const float* parts = nullptr;  // kMerge: [spans][heads·dim] partial outputs, then [spans][heads] (max, sum)
  int spans = 0, heads = 0, head_dim = 0;
  bf16* out = nullptr;              // the outputs (GLU applied)
  float* out_parts = nullptr;       // splits > 1: [splits][rows] partial sums (GLU: gate rows, then up rows)
  unsigned* block_count = nullptr;  // splits > 1: a row block's finished splits
  // small ops
  const bf16* qkv = nullptr;
  float* state = nullptr;
  bf16* conv_state = nullptr;
  bf16* kcache = nullptr;
  bf16* vcache = nullptr;
  int ctx = 0;
  float* part_out = nullptr;
};

__host__ __device__ inline int slice_cols(const Phase& p, int s) {
  return min(p.slice, p.k - s * p.slice);
}
// 32 rows × cols: codes (cols / 2 bytes a row), then scales and biases (2 bytes a group of 64)
__host__ __device__ inline int tile_bytes(int cols) {
  return kTileRows * cols / 2 + 2 * kTileRows * (cols / kGroup) * 2;
}
__host__ __device__ inline size_t tile_offset(const Phase& p, int block, int s) {
  return size_t(block) * tile_bytes(p.k) + size_t(s) * tile_bytes(p.slice);
}

// ---- PTX ----
__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}
__device__ __forceinline__ unsigned load_relaxed(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void add_release(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"r"(kConsumers) : "memory");
}

// Sum over the consumer threads; red: 32 floats of shared memory.
__device__ float consumers_sum(float v, float* red) {
  v = warp_sum(v);
  consumers_sync();
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  consumers_sync();
  float t = 0;
  for (int w = 0; w < kConsumerWarps; ++w) t += red[w];
  return t;
}

// Phases before this launch's first are done: the stream ordered them before it.
__device__ void wait_phase(const unsigned* counters, int dep, unsigned target, int begin) {
  if (dep < begin) return;
  if (threadIdx.x == 0) {
    long long spins = 0;
    while (load_relaxed(counters + dep) < target)
      if (++spins == (1ll << 24)) {
        printf("block %d: phase %d never finished (%u of %u)\n", blockIdx.x, dep, load_acquire(counters + dep), target);
        __trap();
      }
    asm volatile("fence.acq_rel.gpu;" ::: "memory");  // one acquire, not an L1 invalidation a poll
  }
  consumers_sync();
}

__device__ __forceinline__ void prefetch_l1(const void* p) {
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
}
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}
__device__ __forceinline__ void copy4_async(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(shared_address(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void wait_async_copies() {
  asm volatile("cp.async.wait_all;" ::: "memory");
}

// Elements 8w .. 8w+7 of a source (written by other SMs: read through L2).
__device__ __forceinline__ void load8(const Source& s, int w, float (&v)[8]) {
  unpack8(__ldcg(reinterpret_cast<const uint4*>(s.bf) + w), v);
}

// The product's input in shared memory: piece q (pairs 4q..4q+3, the inputs of code word q) of
// chunk c at pieces[q·C + c]; the chunk's (step, sum) at stats[c]. A thread holds 8 inputs, word q of
// a chunk, so four neighbouring lanes hold a chunk.
// kHeld > 1 (inputs longer than a word a thread): plain inputs only (the host checks).
template <int kHeld>
__device__ __noinline__ void input_stage(const Phase& p, uint4* pieces, float2* stats, float* red) {
  const int tid = threadIdx.x, k = p.k, words = k / 8, input = kHeld == 1 ? p.input : int(kPlain);
  const bool residual = input == kResAdd || input == kResNorm, gated = input == kHeadNormGated;
  float v[kHeld][8];
  float ss = 0, ss2 = 0;
  // every load of the stage first: one round trip to L2, not one a kind of input
  uint4 raw[kHeld], res_raw[kHeld], gate_raw[kHeld];
#pragma unroll
  for (int j = 0; j < kHeld; ++j) {
    const int w = tid + j * kConsumers;
    if (w >= words || input == kMerge) continue;
    raw[j] = __ldcg(reinterpret_cast<const uint4*>(p.in.bf) + w);
    if (residual) res_raw[j] = __ldcg(reinterpret_cast<const uint4*>(p.res_in) + w);
    if (gated) gate_raw[j] = __ldcg(reinterpret_cast<const uint4*>(p.gate) + w);
  }
#pragma unroll
  for (int j = 0; j < kHeld; ++j) {
    const int w = tid + j * kConsumers;
#pragma unroll
    for (int e = 0; e < 8; ++e) v[j][e] = 0;
    if (w >= words) continue;
    if (input == kMerge) {  // every span's loads issued before any is used
      constexpr int kMaxSpans = 8;
      const int e0 = w * 8, h = e0 / p.head_dim, hd = p.heads * p.head_dim;
      const float* st = p.parts + size_t(p.spans) * hd;
      float2 ml[kMaxSpans];
#pragma unroll
      for (int s = 0; s < kMaxSpans; ++s)
        if (s < p.spans) ml[s] = __ldcg(reinterpret_cast<const float2*>(st + (s * p.heads + h) * 2));
      float m = -1e30f, l = 0;
#pragma unroll
      for (int s = 0; s < kMaxSpans; ++s)
        if (s < p.spans) m = fmaxf(m, ml[s].x);
#pragma unroll 4
      for (int s = 0; s < p.spans; ++s) {
        const float4* src = reinterpret_cast<const float4*>(p.parts + size_t(s) * hd + e0);
        const float4 a = __ldcg(src), b = __ldcg(src + 1);
        const float wgt = __expf(ml[s].x - m);
        l += wgt * ml[s].y;
        v[j][0] += wgt * a.x, v[j][1] += wgt * a.y, v[j][2] += wgt * a.z, v[j][3] += wgt * a.w;
        v[j][4] += wgt * b.x, v[j][5] += wgt * b.y, v[j][6] += wgt * b.z, v[j][7] += wgt * b.w;
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) v[j][e] /= l;
    } else {
      unpack8(raw[j], v[j]);
    }
    if (input == kResAdd) {  // h = residual + branch, as the residual stream stores it
      float r[8];
      unpack8(res_raw[j], r);
#pragma unroll
      for (int e = 0; e < 8; ++e) r[e] += v[j][e];
      const uint4 h = pack8(r);
      if (blockIdx.x == 0) reinterpret_cast<uint4*>(p.res_out)[w] = h;
      unpack8(h, v[j]);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += v[j][e] * v[j][e];
  }
  auto normalise = [&](float sum_sq) {  // v = rms_norm(v) · norm_w, the sum of squares over the row given
    const float inv = rsqrtf(consumers_sum(sum_sq, red) / k + kEps);
#pragma unroll
    for (int j = 0; j < kHeld; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (tid + j * kConsumers < words) v[j][e] *= inv * __ldg(p.norm_w + (tid + j * kConsumers) * 8 + e);
  };
  if (input == kNorm || input == kResAdd) {
    normalise(ss);
  } else if (gated) {  // a head of 128 is 16 neighbouring lanes
#pragma unroll
    for (int j = 0; j < kHeld; ++j) {
      float s = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) s += v[j][e] * v[j][e];
      for (int o = 8; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
      const int w = tid + j * kConsumers;
      if (w >= words) continue;
      float z[8];
      unpack8(gate_raw[j], z);
      const float inv = rsqrtf(s / 128 + kEps);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[j][e] *= inv * __ldg(p.norm_w + (w * 8 + e) % 128) * silu(z[e]);
    }
  } else if (input == kResNorm) {  // h = residual + norm(branch) · w_b; input = norm(h) · w
    const float inv_b = rsqrtf(consumers_sum(ss, red) / k + kEps);
#pragma unroll
    for (int j = 0; j < kHeld; ++j) {
      const int w = tid + j * kConsumers;
      if (w >= words) continue;
      float r[8];
      unpack8(res_raw[j], r);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[j][e] = r[e] + v[j][e] * inv_b * __ldg(p.branch_w + w * 8 + e);
      const uint4 h = pack8(v[j]);
      if (blockIdx.x == 0) reinterpret_cast<uint4*>(p.res_out)[w] = h;
      unpack8(h, v[j]);
#pragma unroll
      for (int e = 0; e < 8; ++e) ss2 += v[j][e] * v[j][e];
    }
    normalise(ss2);
  }
  // int16 pairs per 32-element chunk: step = max |x| / 32767
  const int chunks = k / 32;
#pragma unroll
  for (int j = 0; j < kHeld; ++j) {
    const int w = tid + j * kConsumers;
    float amax = 0, sum = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(v[j][e])), sum += v[j][e];
    for (int o = 1; o < 4; o *= 2) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      sum += __shfl_xor_sync(0xffffffffu, sum, o);
    }
    if (w >= words) continue;
    const float inv = amax > 0 ? 32767.0f / amax : 0.0f;
    int q[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) q[e] = __float2int_rn(v[j][e] * inv);
    // pair p of this word holds the inputs of codes code_of_pair(4·word + p, half) - 8·word
    const int c = w / 4, word = w % 4;
    auto pair = [&](int p) {
      return (uint32_t(q[code_of_pair<4>(4 * word + p, 0) - 8 * word]) & 0xffffu) |
             (uint32_t(q[code_of_pair<4>(4 * word + p, 1) - 8 * word]) << 16);
    };
    pieces[word * chunks + c] = make_uint4(pair(0), pair(1), pair(2), pair(3));
    if (word == 0) stats[c] = make_float2(amax / 32767.0f, sum);
  }
}

// What a phase reads that no phase writes (norm weights, recurrent state, cached keys and values)
// asked for before its inputs are ready.
__device__ __noinline__ void prefetch_constants(const Phase& p) {
  const int tid = threadIdx.x;
  if (p.kind == kProduct || p.kind == kGlu) {
    for (int w = tid; w < p.k / 8; w += kConsumers) {
      if (p.norm_w) prefetch_l1(p.norm_w + 8 * (p.input == kHeadNormGated ? w % 16 : w));
      if (p.branch_w) prefetch_l1(p.branch_w + 8 * w);
    }
  } else if (p.kind == kDelta) {  // this block's tasks: the state slices (16 KB) and conv taps
    for (int t = blockIdx.x; t < p.tasks; t += gridDim.x) {
      const int h = t / 4, sl = t % 4, i = tid / 4, jq = tid % 4;
      prefetch_l1(p.state + (size_t(h) * 128 + i) * 128 + 32 * sl + 8 * jq);
    }
  } else {  // the span's keys and values (64 KB a task): into L2
    for (int t = blockIdx.x; t < p.tasks; t += gridDim.x) {
      const int spans = p.ctx / 64, g = t / spans, span = t % spans;
      const size_t base = (size_t(g) * p.ctx + span * 64) * 256;
      for (int c = tid; c < 64 * 256 / 64; c += kConsumers) {  // 128-byte lines of 64 bf16
        prefetch_l2(p.kcache + base + 64 * c);
        prefetch_l2(p.vcache + base + 64 * c);
      }
    }
  }
}

// Σ xq·q over one chunk's 4 words of 4-bit codes (the product kernels' integer dot).
__device__ __forceinline__ int chunk_dot(uint4 codes, const uint32_t (&pairs)[16]) {
  const uint32_t w[4] = {codes.x, codes.y, codes.z, codes.w};
  return kiln::cuda::chunk_dot<4>(w, pairs);
}

// A warp's rows (w + 16q) of the tile in `slot` (slice s of the product's columns), added to acc[q]
// by its lanes; the input chunk is loaded once for all of them.
__device__ __forceinline__ void tile_rows(int k, int slice, int s, const unsigned char* slot, const uint4* pieces,
                                          const float2* stats, float (&acc)[kRowsPerWarp]) {
  const int cols = min(slice, k - s * slice), chunks = cols / 32, groups = cols / kGroup, first = s * (slice / 32);
  const int all = k / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint4* codes = reinterpret_cast<const uint4*>(slot);
  const bf16* scales = reinterpret_cast<const bf16*>(slot + kTileRows * cols / 2);
  const bf16* biases = scales + kTileRows * groups;
#pragma unroll 2
  for (int c = lane; c < chunks; c += 32) {
    uint4 w[kRowsPerWarp];
#pragma unroll
    for (int q = 0; q < kRowsPerWarp; ++q) w[q] = codes[(warp + kConsumerWarps * q) * chunks + c];
    uint32_t pairs[16];
    const float2 st = kiln::cuda::input_chunk(pieces, stats, 0, all, first + c, pairs);
    const int g = c / (kGroup / 32);
#pragma unroll
    for (int q = 0; q < kRowsPerWarp; ++q) {
      const int r = warp + kConsumerWarps * q;
      const float d = __int2float_rn(chunk_dot(w[q], pairs));
      acc[q] += __bfloat162float(scales[r * groups + g]) * st.x * d + __bfloat162float(biases[r * groups + g]) * st.y;
    }
  }
}

// A Gated DeltaNet head's slice of 32 value columns: the conv's state for its channels, q and k
// L2-normalised, the state slice (128 × 32 f32) decayed, corrected and read out.
__device__ __noinline__ void delta_task(const Phase& p, int task, float* red) {
  const int h = task / 4, s = task % 4, kh = h / 2;
  const int tid = threadIdx.x, i = tid / 4, jq = tid % 4, warp = tid / 32, lane = tid % 32;
  __shared__ float vs[32], delta[32], part[kConsumerWarps][32];
  // the causal conv's taps for this thread's channels: row i of q and k
  float qi = 0, ki = 0;
  {
    const int cq = kh * 128 + i, ck = 2048 + kh * 128 + i;
    float tq = __bfloat162float(__ldcg(p.qkv + cq)), tk = __bfloat162float(__ldcg(p.qkv + ck));
    for (int t = 0; t < 3; ++t) {
      tq += 0.25f * __bfloat162float(p.conv_state[t * 8192 + cq]);
      tk += 0.25f * __bfloat162float(p.conv_state[t * 8192 + ck]);
    }
    qi = silu(tq), ki = silu(tk);
  }
  if (tid < 32) {
    const int cv = 4096 + h * 128 + 32 * s + tid;
    float tv = __bfloat162float(__ldcg(p.qkv + cv));
    for (int t = 0; t < 3; ++t) tv += 0.25f * __bfloat162float(p.conv_state[t * 8192 + cv]);
    for (int t = 0; t < 2; ++t) p.conv_state[t * 8192 + cv] = p.conv_state[(t + 1) * 8192 + cv];
    p.conv_state[2 * 8192 + cv] = __float2bfloat16(tv);
    vs[tid] = silu(tv);
  }
  const float qn = consumers_sum(jq == 0 ? qi * qi : 0.0f, red), kn = consumers_sum(jq == 0 ? ki * ki : 0.0f, red);
  qi *= rsqrtf(qn + kEps) * 0.088388f, ki *= rsqrtf(kn + kEps);
  const float a = __bfloat162float(__ldcg(p.qkv + 12320 + h)), b = __bfloat162float(__ldcg(p.qkv + 12288 + h));
  const float decay = __expf(-0.5f * log1pf(__expf(a))), beta = 1.0f / (1.0f + __expf(-b));
  float* st = p.state + (size_t(h) * 128 + i) * 128 + 32 * s + 8 * jq;
  float S[8];
  {
    const float4 x = reinterpret_cast<const float4*>(st)[0], y = reinterpret_cast<const float4*>(st)[1];
    S[0] = x.x, S[1] = x.y, S[2] = x.z, S[3] = x.w, S[4] = y.x, S[5] = y.y, S[6] = y.z, S[7] = y.w;
  }
  // Σ_i S[i][j] k_i for the slice's 32 columns: over a warp's 8 rows, then over the warps
  auto column_sums = [&](const float(&x)[8], float f) {
    float c[8];
    for (int e = 0; e < 8; ++e) {
      c[e] = x[e] * f;
      for (int o = 4; o < 32; o *= 2) c[e] += __shfl_xor_sync(0xffffffffu, c[e], o);
    }
    consumers_sync();
    if (lane < 4)
      for (int e = 0; e < 8; ++e) part[warp][8 * lane + e] = c[e];
    consumers_sync();
  };
  column_sums(S, ki);
  if (tid < 32) {
    float kv = 0;
    for (int w = 0; w < kConsumerWarps; ++w) kv += part[w][tid];
    delta[tid] = beta * (vs[tid] - decay * kv);
  }
  consumers_sync();
  for (int e = 0; e < 8; ++e) S[e] = decay * S[e] + ki * delta[8 * jq + e];
  reinterpret_cast<float4*>(st)[0] = make_float4(S[0], S[1], S[2], S[3]);
  reinterpret_cast<float4*>(st)[1] = make_float4(S[4], S[5], S[6], S[7]);
  column_sums(S, qi);
  if (tid < 32) {
    float o = 0;
    for (int w = 0; w < kConsumerWarps; ++w) o += part[w][tid];
    p.out[h * 128 + 32 * s + tid] = __float2bfloat16(o);
  }
}

// Attention of two query heads on one KV head (dim 256) over one span of 64 positions: partial
// output and (max, sum) for the merge in the next product's input stage.
__device__ __noinline__ void attention_task(const Phase& p, int task, float* red) {
  constexpr int kDim = 256, kSpan = 64;
  const int spans = p.ctx / kSpan, g = task / spans, span = task % spans;
  const int tid = threadIdx.x, pos_i = tid / 8, part_i = tid % 8;
  __shared__ float score[2][kSpan], stat[2][2];
  const int pos = span * kSpan + pos_i;
  const bf16* kc = p.kcache + (size_t(g) * p.ctx + pos) * kDim + 32 * part_i;
  const bf16* knew = p.qkv + 4096 + g * kDim + 32 * part_i;
  const bool fresh = pos == p.ctx - 1;  // the new token: its key from the projection, into the cache
  float dot[2] = {0, 0};
  for (int v = 0; v < 4; ++v) {
    float kf[8], q0[8], q1[8];
    const uint4 kw = fresh ? __ldcg(reinterpret_cast<const uint4*>(knew) + v) : reinterpret_cast<const uint4*>(kc)[v];
    if (fresh) const_cast<uint4*>(reinterpret_cast<const uint4*>(kc))[v] = kw;
    unpack8(kw, kf);
    unpack8(__ldcg(reinterpret_cast<const uint4*>(p.qkv + (2 * g) * kDim + 32 * part_i) + v), q0);
    unpack8(__ldcg(reinterpret_cast<const uint4*>(p.qkv + (2 * g + 1) * kDim + 32 * part_i) + v), q1);
    for (int e = 0; e < 8; ++e) dot[0] += q0[e] * kf[e], dot[1] += q1[e] * kf[e];
  }
  for (int o = 1; o < 8; o *= 2)
    for (int hh = 0; hh < 2; ++hh) dot[hh] += __shfl_xor_sync(0xffffffffu, dot[hh], o);
  if (part_i == 0) score[0][pos_i] = dot[0] * 0.0625f, score[1][pos_i] = dot[1] * 0.0625f;
  consumers_sync();
  const int warp = tid / 32, lane = tid % 32;
  if (warp < 2) {
    float m = fmaxf(score[warp][lane], score[warp][lane + 32]);
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float e0 = __expf(score[warp][lane] - m), e1 = __expf(score[warp][lane + 32] - m);
    score[warp][lane] = e0, score[warp][lane + 32] = e1;
    const float l = warp_sum(e0 + e1);
    if (lane == 0) stat[warp][0] = m, stat[warp][1] = l;
  }
  consumers_sync();
  // the values: a thread takes 8 dims of one head over 8 positions, then the 8 position groups meet
  const int hh = tid / kDim, dg = (tid % kDim) / 8, pg = tid % 8;
  float o[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  uint4 raw[8];
#pragma unroll
  for (int t = 0; t < 8; ++t) {
    const int pos_v = span * kSpan + pg * 8 + t;
    const bool f = pos_v == p.ctx - 1;
    uint4* slot_v = reinterpret_cast<uint4*>(p.vcache + (size_t(g) * p.ctx + pos_v) * kDim + dg * 8);
    raw[t] = f ? __ldcg(reinterpret_cast<const uint4*>(p.qkv + 6144 + g * kDim + dg * 8)) : *slot_v;
    if (f && hh == 0) *slot_v = raw[t];
  }
#pragma unroll
  for (int t = 0; t < 8; ++t) {
    float v[8];
    unpack8(raw[t], v);
    const float wgt = score[hh][pg * 8 + t];
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] += wgt * v[e];
  }
#pragma unroll
  for (int off = 1; off < 8; off *= 2)
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] += __shfl_xor_sync(0xffffffffu, o[e], off);
  const int head = 2 * g + hh, hd = p.heads * kDim;
  if (pg == 0) {
    float4* dst = reinterpret_cast<float4*>(p.part_out + size_t(span) * hd + head * kDim + dg * 8);
    dst[0] = make_float4(o[0], o[1], o[2], o[3]), dst[1] = make_float4(o[4], o[5], o[6], o[7]);
  }
  if (tid % kDim == 0) {
    float* st = p.part_out + size_t(spans) * hd + (span * p.heads + head) * 2;
    st[0] = stat[hh][0], st[1] = stat[hh][1];
  }
  (void)red;
}

__global__ void __launch_bounds__(kThreads, 1)
    decode_kernel(const Phase* phases, int begin, int end, unsigned* counters, int slots, int slot_bytes, int per_op,
                  int mode, unsigned long long* marks) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t full[kMaxSlots], empty[kMaxSlots];
  __shared__ float red[32];
  __shared__ int last_split;
  uint4* pieces = reinterpret_cast<uint4*>(smem + size_t(slots) * slot_bytes);
  float2* stats = reinterpret_cast<float2*>(pieces + 4 * kMaxChunks);
  if (threadIdx.x == 0) {
    for (int s = 0; s < slots; ++s) mbarrier_init(&full[s], 1), mbarrier_init(&empty[s], kConsumerWarps);
    kiln::cuda::mbarrier_init_fence();
  }
  __syncthreads();
  if (per_op) asm volatile("griddepcontrol.launch_dependents;");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp == kConsumerWarps) {  // the producer: weights only, so it never waits on inputs
    if (lane != 0) return;
    int slot = 0, round = 0;  // the ring position of the next tile
    for (int ph = begin; ph < end; ++ph) {
      const Phase& p = phases[ph];
      if (p.kind != kProduct && p.kind != kGlu) continue;
      const int units = p.units, splits = p.splits, per_split = p.per_split, slices = p.slices;
      const unsigned char* tiles = p.tiles;
      const int k = p.k, slice = p.slice;
      for (int u = blockIdx.x; u < units; u += gridDim.x) {
        const int b = u / splits, j = u % splits, s_end = min(slices, (j + 1) * per_split);
        for (int s = j * per_split; s < s_end; ++s) {
          if (round > 0) mbarrier_wait(&empty[slot], (round - 1) & 1);
          if (mode == 2) {
            mbarrier_arrive(&full[slot]);
          } else {
            const int bytes = tile_bytes(min(slice, k - s * slice));
            mbarrier_expect_bytes(&full[slot], bytes);
            bulk_copy_to_shared(smem + size_t(slot) * slot_bytes,
                                tiles + size_t(b) * tile_bytes(k) + size_t(s) * tile_bytes(slice), bytes, &full[slot]);
          }
          if (++slot == slots) slot = 0, ++round;
        }
      }
    }
    return;
  }
  // the phase descriptors in shared memory, the next one copied in while this one runs
  __shared__ __align__(16) Phase desc[2];
  constexpr int kDescWords = int(sizeof(Phase) / 4);
  static_assert(kDescWords <= kConsumers, "a descriptor word a thread");
  auto fetch_desc = [&](int ph) {
    if (threadIdx.x < kDescWords)
      copy4_async(reinterpret_cast<uint32_t*>(&desc[ph & 1]) + threadIdx.x,
                  reinterpret_cast<const uint32_t*>(phases + ph) + threadIdx.x);
  };
  fetch_desc(begin);
  wait_async_copies();
  consumers_sync();
  if (per_op) asm volatile("griddepcontrol.wait;" ::: "memory");
  int slot = 0, round = 0;
  for (int ph = begin; ph < end; ++ph) {
    const Phase& p = desc[ph & 1];
    if (ph + 1 < end) fetch_desc(ph + 1);  // its buffer's last reader (phase ph - 1) is past the barrier below
    unsigned long long* mark = marks ? marks + (size_t(ph) * gridDim.x + blockIdx.x) * 3 : nullptr;
    unsigned finished = 0;
    bool active = false;
    if (p.kind == kProduct || p.kind == kGlu) {
      active = int(blockIdx.x) < p.units;
    } else {
      active = int(blockIdx.x) < p.tasks;
    }
    if (active) prefetch_constants(p);
    if (!active) {
    } else if (p.kind == kProduct || p.kind == kGlu) {
      wait_phase(counters, p.dep, p.dep_target, begin);
      if (mark && threadIdx.x == 0) mark[0] = globaltimer();
      if (p.k / 8 <= kConsumers)
        input_stage<1>(p, pieces, stats, red);
      else
        input_stage<kMaxK / 8 / kConsumers + 1>(p, pieces, stats, red);
      consumers_sync();
      if (mark && threadIdx.x == 0) mark[1] = globaltimer();
      const int units = p.units, splits = p.splits, per_split = p.per_split, slices = p.slices, k = p.k,
                slice = p.slice, n = p.n;
      const bool glu = p.kind == kGlu;
      for (int u = blockIdx.x; u < units; u += gridDim.x, ++finished) {
        const int b = u / splits, j = u % splits, s_end = min(slices, (j + 1) * per_split);
        float acc[kRowsPerWarp];
#pragma unroll
        for (int q = 0; q < kRowsPerWarp; ++q) acc[q] = 0;
        for (int s = j * per_split; s < s_end; ++s) {
          mbarrier_wait(&full[slot], round & 1);
          if (mode != 1) tile_rows(k, slice, s, smem + size_t(slot) * slot_bytes, pieces, stats, acc);
          __syncwarp();
          if (lane == 0) mbarrier_arrive(&empty[slot]);
          if (++slot == slots) slot = 0, ++round;
        }
#pragma unroll
        for (int q = 0; q < kRowsPerWarp; ++q) acc[q] = warp_sum(acc[q]);
        // row q of the warp: stored row index (GLU: gate row o_q, then up row n + o_q) and output
        constexpr int kHalf = kRowsPerWarp / 2;
        auto stored = [&](int q) {
          if (!glu) return b * kTileRows + warp + kConsumerWarps * q;
          const int o = b * (kTileRows / 2) + warp + kConsumerWarps * (q % kHalf);
          return q < kHalf ? o : n + o;
        };
        auto finish = [&](const float(&v)[kRowsPerWarp]) {  // lane 0: the outputs
#pragma unroll
          for (int q = 0; q < kRowsPerWarp; ++q) {
            if (glu && q >= kHalf) break;
            if (glu)
              p.out[stored(q)] = __float2bfloat16(silu(v[q]) * v[q + kHalf]);
            else
              p.out[stored(q)] = __float2bfloat16(v[q]);
          }
        };
        if (splits == 1) {
          if (lane == 0) finish(acc);
          continue;
        }
        // split columns: partial sums; the row block's last split adds them in split order
        const int rows = glu ? 2 * n : n;
        if (lane == 0)
#pragma unroll
          for (int q = 0; q < kRowsPerWarp; ++q) p.out_parts[size_t(j) * rows + stored(q)] = acc[q];
        consumers_sync();
        if (threadIdx.x == 0) last_split = arrive_acq_rel(p.block_count + b) == unsigned(splits - 1);
        consumers_sync();
        if (!last_split) continue;
        float v[kRowsPerWarp];
#pragma unroll
        for (int q = 0; q < kRowsPerWarp; ++q) {
          v[q] = lane < splits ? __ldcg(p.out_parts + size_t(lane) * rows + stored(q)) : 0.0f;
          v[q] = warp_sum(v[q]);
        }
        if (lane == 0) finish(v);
        if (threadIdx.x == 0) p.block_count[b] = 0;
      }
    } else {
      wait_phase(counters, p.dep, p.dep_target, begin);
      if (mark && threadIdx.x == 0) mark[0] = mark[1] = globaltimer();
      for (int t = blockIdx.x; t < p.tasks; t += gridDim.x, ++finished) {
        if (p.kind == kDelta)
          delta_task(p, t, red);
        else
          attention_task(p, t, red);
        consumers_sync();
      }
    }
    wait_async_copies();
    consumers_sync();  // also: the next descriptor is in place
    if (!active) continue;
    if (mark && threadIdx.x == 0) mark[2] = globaltimer();
    if (threadIdx.x == 0) add_release(counters + ph, finished);
  }
}

// ---- the reference: the input stage in f32 by one block, then one thread an output ----
__global__ void ref_input(Phase p, float* x) {
  __shared__ float red[1024];
  const int k = p.k, tid = threadIdx.x;
  auto block_sum = [&](float v) {
    red[tid] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
      if (tid < s) red[tid] += red[tid + s];
      __syncthreads();
    }
    const float t = red[0];
    __syncthreads();
    return t;
  };
  auto round_bf16 = [](float v) { return __bfloat162float(__float2bfloat16(v)); };
  for (int w = tid; w < k / 8; w += blockDim.x) {
    float v[8];
    if (p.input == kMerge) {
      for (int e = 0; e < 8; ++e) {
        const int el = 8 * w + e, h = el / p.head_dim, hd = p.heads * p.head_dim;
        const float* st = p.parts + size_t(p.spans) * hd;
        float m = -1e30f, l = 0, acc = 0;
        for (int s = 0; s < p.spans; ++s) m = fmaxf(m, st[(s * p.heads + h) * 2]);
        for (int s = 0; s < p.spans; ++s) {
          const float wgt = expf(st[(s * p.heads + h) * 2] - m);
          l += wgt * st[(s * p.heads + h) * 2 + 1], acc += wgt * p.parts[size_t(s) * hd + el];
        }
        v[e] = acc / l;
      }
    } else {
      load8(p.in, w, v);
    }
    for (int e = 0; e < 8; ++e) x[8 * w + e] = v[e];
  }
  __syncthreads();
  float ss = 0;
  for (int e = tid; e < k; e += blockDim.x) ss += x[e] * x[e];
  ss = block_sum(ss);
  if (p.input == kResAdd) {
    for (int e = tid; e < k; e += blockDim.x) x[e] = round_bf16(__bfloat162float(p.res_in[e]) + x[e]);
    __syncthreads();
    float s2 = 0;
    for (int e = tid; e < k; e += blockDim.x) s2 += x[e] * x[e];
    s2 = block_sum(s2);
    for (int e = tid; e < k; e += blockDim.x) x[e] *= p.norm_w[e] / sqrtf(s2 / k + kEps);
  } else if (p.input == kNorm) {
    for (int e = tid; e < k; e += blockDim.x) x[e] *= p.norm_w[e] / sqrtf(ss / k + kEps);
  } else if (p.input == kHeadNormGated) {
    for (int e = tid; e < k; e += blockDim.x) {
      float s = 0;
      for (int j = e / 128 * 128; j < e / 128 * 128 + 128; ++j)
        s += __bfloat162float(p.in.bf[j]) * __bfloat162float(p.in.bf[j]);
      const float z = __bfloat162float(p.gate[e]);
      x[e] = __bfloat162float(p.in.bf[e]) / sqrtf(s / 128 + kEps) * p.norm_w[e % 128] * (z / (1 + expf(-z)));
    }
  } else if (p.input == kResNorm) {
    for (int e = tid; e < k; e += blockDim.x)
      x[e] = round_bf16(__bfloat162float(p.res_in[e]) + x[e] / sqrtf(ss / k + kEps) * p.branch_w[e]);
    __syncthreads();
    float s2 = 0;
    for (int e = tid; e < k; e += blockDim.x) s2 += x[e] * x[e];
    s2 = block_sum(s2);
    for (int e = tid; e < k; e += blockDim.x) x[e] *= p.norm_w[e] / sqrtf(s2 / k + kEps);
  }
}

// weight (tile-major) of stored row r (GLU: gate row o is r = o, up row o is r = n + o), column c
__device__ float ref_weight(const Phase& p, int r, int c) {
  int b, tr;
  if (p.kind == kGlu)
    b = (r % p.n) / (kTileRows / 2), tr = (r % p.n) % (kTileRows / 2) + (r >= p.n ? kTileRows / 2 : 0);
  else
    b = r / kTileRows, tr = r % kTileRows;
  const int s = c / p.slice, cc = c % p.slice, cols = slice_cols(p, s), groups = cols / kGroup;
  const unsigned char* tile = p.tiles + tile_offset(p, b, s);
  const uint32_t word = reinterpret_cast<const uint32_t*>(tile)[tr * cols / 8 + cc / 8];
  const bf16* sc = reinterpret_cast<const bf16*>(tile + kTileRows * cols / 2);
  const float q = float((word >> (4 * (cc % 8))) & 15u);
  return __bfloat162float(sc[tr * groups + cc / kGroup]) * q +
         __bfloat162float(sc[kTileRows * groups + tr * groups + cc / kGroup]);
}

__global__ void ref_product(Phase p, const float* x, float* y) {
  const int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= p.n) return;
  auto dot = [&](int r) {
    float acc = 0;
    for (int c = 0; c < p.k; ++c) acc += ref_weight(p, r, c) * x[c];
    return acc;
  };
  float v = dot(o);
  if (p.kind == kGlu) v = (v / (1 + expf(-v))) * dot(p.n + o);
  y[o] = v;
}

// The phase's outputs as f32.
__global__ void gather_outputs(Phase p, float* y) {
  const int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o < p.n) y[o] = __bfloat162float(p.out[o]);
}
