// A prototype of a persistent 4-bit decode step: does one kernel that streams every layer's packed
// weights into shared memory ahead of their inputs reach the bandwidth that a kernel per op cannot?
// (Findings in docs/performance.md, "A persistent decode step, prototyped".)
//
// One block an SM runs the whole step. Its last warp is a producer: one thread bulk-copies
// (cp.async.bulk, completing on an mbarrier) the SM's tiles of every product of the step, in step
// order, into a ring of shared-memory slots, held back only by free slots, never by inputs. The
// weights are stored tile-major (a tile of 16·rows-a-warp rows × up to `slice` columns, its codes,
// scales and biases in one contiguous piece, a row block's tiles one after another), so a tile is
// one copy. The other 16 warps walk the same phases: a product phase waits until the phase it
// reads has been finished by every SM (a count in global memory, release/acquire), forms its input
// in shared memory (norms, the residual, a merge of attention spans: each SM redoes that small
// work instead of a kernel doing it once), then each warp multiplies its rows of every tile as it
// lands (int16 inputs against 4-bit codes with dp2a, as the product kernels do) and releases the
// slot with its own arrival, so warps never wait for each other inside a product. A product with
// few row blocks splits its columns over SMs: partial sums, added in split order by the row
// block's last split to finish. A small-op phase (a delta-rule step, attention over a span) is
// spread over the SMs as tasks. Descriptors, norm weights, recurrent state and cached keys and
// values are requested before a phase's wait. The same kernel run one phase a launch (a CUDA graph
// of programmatically serialized launches) is the kernel-per-op form of the same work.
//
// Layers shaped like Qwen 3.5 4B's Gated DeltaNet layers and Gemma 4 12B's layers, MLX 4-bit g64
// weights (random), each layer's own weights so that none stay in L2; the small ops read and write
// state of the real sizes with arithmetic of the real kind, not the models' exact functions. The
// products of layer 0 and the head are checked against a plain GEMV over the same inputs.
//   nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -I src [-DPD_ROWS_PER_WARP=4] \
//        tools/gpu/persistent-decode.cu -o persistent-decode
//   ./persistent-decode qwen4b|gemma12b [layers] [slots] [slice columns] [mode] [marks]
//   mode 0: as described; 1: tiles copied, not multiplied; 2: tiles multiplied, not copied.
//   marks 1: each block notes when its phases' inputs were ready, its input stage ended and its
//   phase ended (%globaltimer), summarised for a middle layer.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_quant_codes.cuh"  // the integer products' dp2a step

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CHECK(call)                                                                             \
  do {                                                                                          \
    const cudaError_t e = (call);                                                               \
    if (e != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e)); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

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
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}
__device__ __forceinline__ unsigned arrive_acq_rel(unsigned* count) {
  unsigned before;
  asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;" : "=r"(before) : "l"(count) : "memory");
  return before;
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
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float silu(float v) {
  return v / (1.0f + __expf(-v));
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
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void wait_async_copies() {
  asm volatile("cp.async.wait_all;" ::: "memory");
}

__device__ __forceinline__ void unpack8(uint4 v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  for (int i = 0; i < 4; ++i)
    f[2 * i] = __uint_as_float(w[i] << 16), f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  return uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

// Elements 8w .. 8w+7 of a source (written by other SMs: read through L2).
__device__ __forceinline__ void load8(const Source& s, int w, float (&v)[8]) {
  unpack8(__ldcg(reinterpret_cast<const uint4*>(s.bf) + w), v);
}

__device__ __forceinline__ uint4 pack8(const float (&v)[8]) {
  return make_uint4(pack2(v[0], v[1]), pack2(v[2], v[3]), pack2(v[4], v[5]), pack2(v[6], v[7]));
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
  if (input == kNorm || input == kResAdd) {
    const float inv = rsqrtf(consumers_sum(ss, red) / k + kEps);
#pragma unroll
    for (int j = 0; j < kHeld; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (tid + j * kConsumers < words) v[j][e] *= inv * __ldg(p.norm_w + (tid + j * kConsumers) * 8 + e);
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
    const float inv = rsqrtf(consumers_sum(ss2, red) / k + kEps);
#pragma unroll
    for (int j = 0; j < kHeld; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (tid + j * kConsumers < words) v[j][e] *= inv * __ldg(p.norm_w + (tid + j * kConsumers) * 8 + e);
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
    auto pair = [&](int a, int b) { return (uint32_t(q[a]) & 0xffffu) | (uint32_t(q[b]) << 16); };
    const int c = w / 4, word = w % 4;
    pieces[word * chunks + c] = make_uint4(pair(0, 2), pair(4, 6), pair(1, 3), pair(5, 7));
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

// Σ xq·q over one chunk's 4 words of 4-bit codes.
__device__ __forceinline__ int chunk_dot(uint4 codes, const uint32_t (&pairs)[16]) {
  const uint32_t w[4] = {codes.x, codes.y, codes.z, codes.w};
  int lo = 0, hi = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const uint32_t bytes = (w[i] >> (4 * t)) & 0x0f0f0f0fu;
      lo = kiln::cuda::dp2a_lo(pairs[4 * i + 2 * t], bytes, lo);
      hi = kiln::cuda::dp2a_hi(pairs[4 * i + 2 * t + 1], bytes, hi);
    }
  return lo + hi;
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
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint4 v = pieces[q * all + first + c];
      pairs[4 * q] = v.x, pairs[4 * q + 1] = v.y, pairs[4 * q + 2] = v.z, pairs[4 * q + 3] = v.w;
    }
    const float2 st = stats[first + c];
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
    for (int s = 0; s < slots; ++s) mbar_init(&full[s], 1), mbar_init(&empty[s], kConsumerWarps);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
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
          if (round > 0) mbar_wait(&empty[slot], (round - 1) & 1);
          if (mode == 2) {
            mbar_arrive(&full[slot]);
          } else {
            const int bytes = tile_bytes(min(slice, k - s * slice));
            mbar_expect(&full[slot], bytes);
            bulk_copy(smem + size_t(slot) * slot_bytes,
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
          mbar_wait(&full[slot], round & 1);
          if (mode != 1) tile_rows(k, slice, s, smem + size_t(slot) * slot_bytes, pieces, stats, acc);
          __syncwarp();
          if (lane == 0) mbar_arrive(&empty[slot]);
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

// ---- the step's buffers ----
__device__ __forceinline__ uint32_t hash(uint32_t x) {
  x ^= x >> 16, x *= 0x7feb352du, x ^= x >> 15, x *= 0x846ca68bu, x ^= x >> 16;
  return x;
}
// One block a tile: random codes, scales in [0.5, 1.5]·scale, biases in [-7.5, -7]·scale.
__global__ void fill_tiles(Phase p, uint32_t seed, float scale) {
  const int b = blockIdx.x / p.slices, s = blockIdx.x % p.slices, cols = slice_cols(p, s);
  unsigned char* tile = const_cast<unsigned char*>(p.tiles) + tile_offset(p, b, s);
  const int words = kTileRows * cols / 8, groups = kTileRows * (cols / kGroup);
  uint32_t* codes = reinterpret_cast<uint32_t*>(tile);
  bf16* sb = reinterpret_cast<bf16*>(tile + kTileRows * cols / 2);
  const uint32_t base = seed * 0x9e3779b9u + blockIdx.x * 0x85ebca6bu;
  for (int i = threadIdx.x; i < words; i += blockDim.x) codes[i] = hash(base + i);
  for (int i = threadIdx.x; i < groups; i += blockDim.x) {
    const float u = float(hash(base ^ (0x1234567u + i)) >> 8) * (1.0f / 16777216.0f);
    const float v = float(hash(base ^ (0x7654321u + i)) >> 8) * (1.0f / 16777216.0f);
    sb[i] = __float2bfloat16((0.5f + u) * scale);
    sb[groups + i] = __float2bfloat16((-7.5f + 0.5f * v) * scale);
  }
}
__global__ void fill_bf16(bf16* p, size_t n, float lo, float hi, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(lo + (hi - lo) * float(hash(uint32_t(i) ^ seed * 0x9e3779b9u) >> 8) * (1.0f / 16777216.0f));
}
__global__ void fill_f32(float* p, size_t n, float v) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) p[i] = v;
}
// Reads every byte of [p, p + 16n) once: the plain read rate of the step's weights.
__global__ void read_all(const uint4* p, size_t n, unsigned* sink) {
  uint32_t x = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x12345678u) *sink = x;
}

struct Arena {
  unsigned char* base = nullptr;
  size_t used = 0, size = 0;
  void* take(size_t bytes) {
    bytes = (bytes + 255) / 256 * 256;
    if (used + bytes > size) {
      std::fprintf(stderr, "arena too small\n");
      std::exit(1);
    }
    void* p = base + used;
    used += bytes;
    return p;
  }
};

template <typename T>
T* device_alloc(size_t n) {
  T* p = nullptr;
  CHECK(cudaMalloc(&p, n * sizeof(T)));
  CHECK(cudaMemset(p, 0, n * sizeof(T)));
  return p;
}
bf16* random_bf16(size_t n, float lo, float hi, uint32_t seed) {
  bf16* p = device_alloc<bf16>(n);
  fill_bf16<<<256, 256>>>(p, n, lo, hi, seed);
  return p;
}
float* ones(size_t n) {
  float* p = device_alloc<float>(n);
  fill_f32<<<256, 256>>>(p, n, 1.0f);
  return p;
}

struct Builder {
  Arena weights;
  int sms = 0, slice = 1024;
  std::vector<Phase> phases;

  // A product's tiles and outputs; its columns split over SMs when that evens the SMs' tiles
  // (never when a small op reads its outputs: one_split).
  Phase product(int kind, int n, int k, uint32_t seed, bool one_split = false) {
    Phase p;
    p.kind = kind, p.n = n, p.k = k, p.slice = std::min(k, slice);
    p.slices = (k + p.slice - 1) / p.slice;
    const int rows_a_block = kind == kGlu ? kTileRows / 2 : kTileRows;
    if (n % rows_a_block || k % kGroup || p.slice % kGroup)
      std::fprintf(stderr, "shape %d x %d does not tile\n", n, k), std::exit(1);
    p.blocks = n / rows_a_block;
    long best = -1;
    for (int splits = 1; splits <= (one_split ? 1 : p.slices); ++splits) {
      const int per = (p.slices + splits - 1) / splits;
      // a split unit also pays its partial sums' barrier and count (about a tile's time)
      const long rounds = (p.blocks * splits + sms - 1) / sms;
      const long cost = rounds * per + (splits > 1 ? rounds : 0);
      if (best < 0 || cost < best) best = cost, p.splits = splits, p.per_split = per;
    }
    p.splits = (p.slices + p.per_split - 1) / p.per_split;
    p.units = p.blocks * p.splits;
    p.tiles = static_cast<unsigned char*>(weights.take(size_t(p.blocks) * tile_bytes(k)));
    fill_tiles<<<p.blocks * p.slices, 256>>>(p, seed, 2.0f / std::sqrt(float(k)) / 7.5f);
    CHECK(cudaGetLastError());
    p.out = device_alloc<bf16>(n);
    if (p.splits > 1) {
      p.out_parts = device_alloc<float>(size_t(p.splits) * (kind == kGlu ? 2 * n : n));
      p.block_count = device_alloc<unsigned>(p.blocks);
    }
    return p;
  }
  static Source source_of(const Phase& p) {
    Source s;
    s.bf = p.out, s.n = p.n;
    return s;
  }
  int add(Phase p) {
    phases.push_back(p);
    return int(phases.size()) - 1;
  }
};

// The input stage that adds `branch` to the residual `res_in` (kResAdd; kResNorm: its norm), writes
// the sum to `res_out` and normalises it; the phase reads the phase added last.
void residual_input(const Builder& m, Phase& p, int input, const Source& branch, const bf16* res_in, bf16* res_out,
                    const float* norm) {
  p.input = input, p.in = branch, p.res_in = res_in, p.res_out = res_out, p.norm_w = norm;
  if (input == kResNorm) p.branch_w = norm;
  p.dep = int(m.phases.size()) - 1;
}

// A layer's GLU (its input the residual after the attention or mixer branch `out`, into h_mid) and
// down-projection; returns the down-projection's outputs, the next branch.
Source add_mlp(Builder& m, int input, const Phase& out, const bf16* h, bf16* h_mid, const float* norm, int H, int I,
               uint32_t seed) {
  Phase glu = m.product(kGlu, I, H, seed + 20);
  residual_input(m, glu, input, Builder::source_of(out), h, h_mid, norm);
  m.add(glu);
  Phase down = m.product(kProduct, H, I, seed + 30);
  down.input = kPlain, down.in = Builder::source_of(glu), down.dep = int(m.phases.size()) - 1;
  m.add(down);
  return Builder::source_of(down);
}

void add_head(Builder& m, int input, const Source& branch, const bf16* res, const float* norm, int vocab, int H) {
  Phase head = m.product(kProduct, vocab, H, 99);
  residual_input(m, head, input, branch, res, device_alloc<bf16>(H), norm);
  m.add(head);
}

// Qwen 3.5 4B: hidden 2560, 32 layers taken as Gated DeltaNet layers (16 key heads and 32 value
// heads of 128; in-projection q, k, v, z, b, a = 12352 rows), GLU 9216, vocabulary 248320.
void qwen4b(Builder& m, int layers) {
  const int H = 2560, I = 9216;
  const float* norm = ones(I);
  bf16* res = random_bf16(H, -1, 1, 7);
  Source branch;
  branch.bf = device_alloc<bf16>(H), branch.n = H;  // zero: layer 0's stage gives back the embedding
  for (int l = 0; l < layers; ++l) {
    const uint32_t seed = 1000 * (l + 1);
    bf16* h = device_alloc<bf16>(H);
    bf16* h_mid = device_alloc<bf16>(H);
    Phase in = m.product(kProduct, 12352, H, seed, true);
    residual_input(m, in, kResAdd, branch, res, h, norm);
    const int in_i = m.add(in);
    Phase delta;
    delta.kind = kDelta, delta.tasks = 128, delta.dep = in_i, delta.qkv = in.out, delta.out = device_alloc<bf16>(4096);
    delta.state = device_alloc<float>(size_t(32) * 128 * 128);
    delta.conv_state = device_alloc<bf16>(3 * 8192);
    const int delta_i = m.add(delta);
    Phase out = m.product(kProduct, H, 4096, seed + 10);
    out.input = kHeadNormGated, out.in.bf = delta.out, out.in.n = 4096, out.gate = in.out + 8192, out.norm_w = norm,
    out.dep = delta_i;
    m.add(out);
    branch = add_mlp(m, kResAdd, out, h, h_mid, norm, H, I, seed), res = h_mid;
  }
  add_head(m, kResAdd, branch, res, norm, 248320, H);
}

// Gemma 4 12B: hidden 3840, 48 layers of 16 query heads and 8 KV heads of 256 (q, k, v = 8192
// rows), attention over the 512 cached positions in 8 spans, GLU 15360, vocabulary 262144; the
// branch norms after attention and the MLP folded into the next product's input stage.
void gemma12b(Builder& m, int layers) {
  const int H = 3840, I = 15360, ctx = 512, spans = ctx / 64;
  const float* norm = ones(I);
  bf16* res = random_bf16(H, -1, 1, 7);
  Source branch;
  branch.bf = device_alloc<bf16>(H), branch.n = H;
  for (int l = 0; l < layers; ++l) {
    const uint32_t seed = 1000 * (l + 1);
    bf16* h = device_alloc<bf16>(H);
    bf16* h_mid = device_alloc<bf16>(H);
    Phase in = m.product(kProduct, 8192, H, seed, true);
    residual_input(m, in, kResNorm, branch, res, h, norm);
    const int in_i = m.add(in);
    Phase att;
    att.kind = kAttention, att.tasks = 8 * spans, att.dep = in_i, att.qkv = in.out, att.ctx = ctx, att.heads = 16;
    att.part_out = device_alloc<float>(size_t(spans) * 4096 + spans * 16 * 2);
    att.kcache = random_bf16(size_t(8) * ctx * 256, -1, 1, seed + 5);
    att.vcache = random_bf16(size_t(8) * ctx * 256, -1, 1, seed + 6);
    const int att_i = m.add(att);
    Phase out = m.product(kProduct, H, 4096, seed + 10);
    out.input = kMerge, out.parts = att.part_out, out.spans = spans, out.heads = 16, out.head_dim = 256,
    out.dep = att_i;
    m.add(out);
    branch = add_mlp(m, kResNorm, out, h, h_mid, norm, H, I, seed), res = h_mid;
  }
  add_head(m, kResNorm, branch, res, norm, 262144, H);
}

// Checks every product of layer 0 and the head against the reference, from the inputs the step
// left in memory; returns the largest |error| / max |reference|.
float check(const std::vector<Phase>& phases) {
  float worst = 0;
  float* x = device_alloc<float>(kMaxK);
  float* y = device_alloc<float>(262144);
  float* got_d = device_alloc<float>(262144);
  for (int ph : {0, 2, 3, 4, int(phases.size()) - 1}) {
    const Phase& p = phases[ph];
    ref_input<<<1, 1024>>>(p, x);
    ref_product<<<(p.n + 127) / 128, 128>>>(p, x, y);
    gather_outputs<<<(p.n + 255) / 256, 256>>>(p, got_d);
    CHECK(cudaDeviceSynchronize());
    std::vector<float> ref(p.n), got(p.n);
    CHECK(cudaMemcpy(ref.data(), y, p.n * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(got.data(), got_d, p.n * sizeof(float), cudaMemcpyDeviceToHost));
    float peak = 0, err = 0;
    for (int i = 0; i < p.n; ++i) {
      peak = std::max(peak, std::fabs(ref[i]));
      err = std::max(err, std::fabs(ref[i] - got[i]));
    }
    const float rel = peak > 0 ? err / peak : err;
    std::printf("  phase %d (%s, %d x %d, %d splits): max |err| %.3g of max |ref| %.3g = %.2e\n", ph,
                p.kind == kGlu ? "GLU" : "product", p.n, p.k, p.splits, err, peak, rel);
    worst = std::max(worst, rel);
  }
  return worst;
}

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "qwen4b";
  const bool gemma = which == "gemma12b";
  const int layers = argc > 2 ? std::atoi(argv[2]) : (gemma ? 48 : 32);
  const int slots = argc > 3 ? std::atoi(argv[3]) : 8;
  Builder m;
  m.slice = argc > 4 ? std::atoi(argv[4]) : 1024;
  const int mode = argc > 5 ? std::atoi(argv[5]) : 0;
  const bool with_marks = argc > 6 && std::atoi(argv[6]) != 0;
  if (slots < 2 || slots > kMaxSlots) return std::fprintf(stderr, "slots: 2..%d\n", kMaxSlots), 1;
  CHECK(cudaDeviceGetAttribute(&m.sms, cudaDevAttrMultiProcessorCount, 0));
  m.weights.size = size_t(gemma ? 7600 : 2700) << 20;
  CHECK(cudaMalloc(&m.weights.base, m.weights.size));
  if (gemma)
    gemma12b(m, layers);
  else
    qwen4b(m, layers);
  CHECK(cudaDeviceSynchronize());
  for (Phase& p : m.phases) {
    if ((p.kind == kProduct || p.kind == kGlu) && p.k / 8 > kConsumers && p.input != kPlain)
      return std::fprintf(stderr, "a long input (%d) must be plain\n", p.k), 1;
    if (p.dep >= 0) {
      const Phase& d = m.phases[p.dep];
      p.dep_target = d.kind == kProduct || d.kind == kGlu ? d.units : d.tasks;
    }
  }
  const std::vector<Phase>& host = m.phases;
  const int np = int(host.size());
  Phase* phases = device_alloc<Phase>(np);
  CHECK(cudaMemcpy(phases, host.data(), np * sizeof(Phase), cudaMemcpyHostToDevice));
  unsigned* counters = device_alloc<unsigned>(np);
  unsigned long long* marks = with_marks ? device_alloc<unsigned long long>(size_t(np) * m.sms * 3) : nullptr;
  unsigned* sink = device_alloc<unsigned>(1);
  const int slot_bytes = (tile_bytes(m.slice) + 127) / 128 * 128;
  const size_t smem = size_t(slots) * slot_bytes + 4 * kMaxChunks * sizeof(uint4) + kMaxChunks * sizeof(float2);
  CHECK(cudaFuncSetAttribute(decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t weight_bytes = m.weights.used;
  const size_t head_bytes = size_t(host.back().blocks) * tile_bytes(host.back().k);
  const size_t layer_bytes = weight_bytes - head_bytes;
  std::printf("%s: %d layers + head, %.1f MB of weights (%.2f MB a layer), %d SMs, %d slots of %d KB, mode %d\n",
              which.c_str(), layers, weight_bytes / 1e6, layer_bytes / 1e6 / layers, m.sms, slots, slot_bytes >> 10,
              mode);
  for (int ph : {0, 2, 3, 4, np - 1}) {
    const Phase& p = host[ph];
    std::printf("  %s %d x %d: %d blocks x %d slices, %d splits, %d units (%.2f a SM)\n",
                p.kind == kGlu ? "GLU" : "product", p.n, p.k, p.blocks, p.slices, p.splits, p.units,
                double(p.units) / m.sms);
  }

  auto launch = [&](int begin, int end, int per_op) {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(m.sms);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &attribute;
    config.numAttrs = per_op ? 1 : 0;
    CHECK(cudaLaunchKernelEx(&config, decode_kernel, static_cast<const Phase*>(phases), begin, end, counters, slots,
                             slot_bytes, per_op, mode, marks));
  };
  // the step as one graph: the counters cleared, then one launch (persistent) or one a phase
  auto graph_of = [&](bool per_op, int begin, int end) {
    cudaGraph_t graph;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemsetAsync(counters, 0, np * sizeof(unsigned), stream));
    if (per_op)
      for (int p = begin; p < end; ++p) launch(p, p + 1, 1);
    else
      launch(begin, end, 0);
    CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    return exec;
  };
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  auto time_us = [&](cudaGraphExec_t exec) {
    for (int r = 0; r < 3; ++r) CHECK(cudaGraphLaunch(exec, stream));
    constexpr int kReps = 20;
    CHECK(cudaEventRecord(start, stream));
    for (int r = 0; r < kReps; ++r) CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    return 1000.0f * ms / kReps;
  };

  cudaGraphExec_t persistent = graph_of(false, 0, np);
  CHECK(cudaGraphLaunch(persistent, stream));
  CHECK(cudaStreamSynchronize(stream));
  if (std::getenv("PERSISTENT_DECODE_ONCE")) return 0;  // one step, for a profiler
  float worst = 0;
  if (mode == 0) {
    worst = check(host);
    std::printf("products against the f32 reference: worst %.2e of max |ref| (%s)\n", worst,
                worst < 2e-2f ? "ok" : "WRONG");
  }

  float read_us = 0;
  {
    constexpr int kReps = 10;
    const uint4* all = reinterpret_cast<const uint4*>(m.weights.base);
    read_all<<<m.sms * 8, 512, 0, stream>>>(all, weight_bytes / 16, sink);
    CHECK(cudaEventRecord(start, stream));
    for (int r = 0; r < kReps; ++r) read_all<<<m.sms * 8, 512, 0, stream>>>(all, weight_bytes / 16, sink);
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    read_us = 1000.0f * ms / kReps;
  }
  const double read_rate = weight_bytes / (read_us * 1e-6) / 1e9;
  std::printf("reading the weights once: %.1f us, %.0f GB/s\n", read_us, read_rate);

  cudaGraphExec_t per_op = graph_of(true, 0, np);
  cudaGraphExec_t layers_only = graph_of(false, 0, np - 1);
  cudaGraphExec_t head_only = graph_of(false, np - 1, np);
  const float t_persistent = time_us(persistent), t_per_op = time_us(per_op);
  const float t_layers = time_us(layers_only), t_head = time_us(head_only);
  auto line = [&](const char* name, float us, size_t bytes) {
    std::printf("%-36s %9.1f us  %7.0f GB/s  %5.1f%% of the read rate\n", name, us, bytes / (us * 1e-6) / 1e9,
                100.0 * (bytes / (us * 1e-6) / 1e9) / read_rate);
  };
  line("step, one persistent kernel", t_persistent, weight_bytes);
  line("step, a kernel a phase (PDL graph)", t_per_op, weight_bytes);
  line("layers alone, persistent", t_layers, layer_bytes);
  line("head alone, persistent", t_head, head_bytes);
  std::printf("a layer: %.2f us persistent (%.2f us of bytes at the read rate)\n", t_layers / layers,
              layer_bytes / layers / (read_rate * 1e3));
  if (marks) {  // the last persistent step's marks: where a middle layer's time goes
    CHECK(cudaGraphLaunch(persistent, stream));
    CHECK(cudaStreamSynchronize(stream));
    std::vector<unsigned long long> t(size_t(np) * m.sms * 3);
    CHECK(cudaMemcpy(t.data(), marks, t.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    auto at = [&](int ph, int b, int w) { return t[(size_t(ph) * m.sms + b) * 3 + w]; };
    auto active = [&](int ph) {
      const Phase& p = host[ph];
      return p.kind == kProduct || p.kind == kGlu ? p.units : p.tasks;
    };
    auto last_end = [&](int ph) {
      unsigned long long e = 0;
      for (int b = 0; b < std::min(m.sms, active(ph)); ++b) e = std::max(e, at(ph, b, 2));
      return e;
    };
    const char* names[5] = {"in-projection", "small op", "out-projection", "GLU", "down-projection"};
    double sig[5] = {}, stage[5] = {}, span[5] = {}, work[5] = {};
    int counted = 0;
    for (int l = 2; l + 2 < layers; ++l, ++counted)
      for (int q = 0; q < 5; ++q) {
        const int ph = 5 * l + q, n = std::min(m.sms, active(ph));
        const unsigned long long dep_end = last_end(ph - 1);
        unsigned long long first_ready = ~0ull;
        double st = 0, wk = 0;
        for (int b = 0; b < n; ++b) {
          first_ready = std::min(first_ready, at(ph, b, 0));
          st += double(at(ph, b, 1) - at(ph, b, 0)), wk += double(at(ph, b, 2) - at(ph, b, 1));
        }
        sig[q] += double(first_ready) - double(dep_end);
        stage[q] += st / n, work[q] += wk / n;
        span[q] += double(last_end(ph)) - double(dep_end);
      }
    std::printf(
        "a middle layer, µs (mean of %d layers): phase: last end of the phase before -> first block released; "
        "input stage (mean over blocks); tiles or tasks (mean over blocks); the phase's share of the step\n",
        counted);
    double total = 0;
    for (int q = 0; q < 5; ++q) {
      std::printf("  %-16s %6.2f %6.2f %6.2f %6.2f\n", names[q], sig[q] / counted / 1e3, stage[q] / counted / 1e3,
                  work[q] / counted / 1e3, span[q] / counted / 1e3);
      total += span[q] / counted / 1e3;
    }
    std::printf("  %-16s %27.2f\n", "layer", total);
  }
  std::printf(
      "RESULT %s rows/warp=%d slots=%d slice=%d mode=%d persistent_us=%.1f per_op_us=%.1f layers_us=%.1f head_us=%.1f "
      "read_gbs=%.0f check=%.2e\n",
      which.c_str(), kRowsPerWarp, slots, m.slice, mode, t_persistent, t_per_op, t_layers, t_head, read_rate, worst);
  return worst < 2e-2f ? 0 : 2;
}
