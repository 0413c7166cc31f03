// CUDA backend: the gated delta rule of Gated DeltaNet.
//
// Decode uses the recurrent form. The rule is independent per value column, so a head's state is
// cut into slices of 8 columns, each slice one warp holding its part of the state in registers:
// at batch 1 of Qwen 3.5 4B that is 512 warps over the GPU rather than 32 blocks, and the step
// is one round trip to memory instead of a latency-bound loop on a few SMs. Shapes that do not
// fit the slices (v_dim not a multiple of 4, k_dim above 256) keep the block-per-head form.
// Prefill uses the chunked form of the reference (chunks of 64): per chunk the delta-rule updates
// are solved as a unit-lower-triangular system in shared memory and the state advances once. It
// too is cut into column slices, a block each, so that one sequence's 32 heads fill the GPU.
#include <algorithm>
#include <cassert>
#include <cstdint>
#include <mutex>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.cuh"
#include "backend/cuda/cuda_state_table.cuh"

namespace kiln::cuda {

namespace {

constexpr int kMaxSeqs = kMaxDeltaSeqs;

struct DeltaParams {
  const bf16* qkv;
  int64_t qkv_stride;
  const bf16* a;
  const bf16* b;
  int64_t ab_stride;
  const float* a_log;
  const float* dt_bias;
  bf16* out;
  int64_t out_stride;
  int hk, hv, dk, dv;
  // the output norm in the decode kernel (norm_weight null: none there): the last slice of a
  // (sequence, head) to finish, counted on done[sequence · hv + head], normalises the head's row
  const bf16* norm_z;
  int64_t norm_z_stride;
  const float* norm_weight;
  float norm_eps;
  unsigned* done;
  bool qk_copies;  // q and k rows copied to shared memory 16 bytes at a time (aligned: dk, stride, base)
  StateTable seqs;
};

__device__ __forceinline__ float softplus(float x) {
  return x > 20.0f ? x : log1pf(expf(x));
}

// Loads token t's q and k of key head kh into shared memory, l2-normalised (q also scaled by
// dk^-1/2), with beta and the log-decay g; warp 0 does the normalisation.
__device__ void load_token(const DeltaParams& p, int64_t row, int h, float* q, float* k, float* beta_g) {
  const int kh = h / (p.hv / p.hk);
  const bf16* r = p.qkv + row * p.qkv_stride;
  const int lane = threadIdx.x % 32;
  if (threadIdx.x < 32) {
    float qn = 0, kn = 0;
    for (int d = lane; d < p.dk; d += 32) {
      const float qv = to_float(r[kh * p.dk + d]), kv = to_float(r[p.hk * p.dk + kh * p.dk + d]);
      q[d] = qv;
      k[d] = kv;
      qn += qv * qv;
      kn += kv * kv;
    }
    qn = warp_sum(qn);
    kn = warp_sum(kn);
    const float qs = rsqrtf(qn + 1e-6f) * rsqrtf(float(p.dk)), ks = rsqrtf(kn + 1e-6f);
    for (int d = lane; d < p.dk; d += 32) {
      q[d] *= qs;
      k[d] *= ks;
    }
    if (lane == 0) {
      beta_g[0] = sigmoid(to_float(p.b[row * p.ab_stride + h]));
      beta_g[1] = -expf(p.a_log[h]) * softplus(to_float(p.a[row * p.ab_stride + h]) + p.dt_bias[h]);
    }
  }
}

constexpr int kMaxRowsPerThread = 32;

// blockDim = dv · splits; thread (j, part) keeps rows [part·rows, (part+1)·rows) of column j.
__global__ void delta_recurrent_kernel(DeltaParams p, int splits) {
  wait_for_inputs();
  extern __shared__ float shared[];
  float* q = shared;            // [dk]
  float* k = q + p.dk;          // [dk]
  float* beta_g = k + p.dk;     // [2]
  float* partial = beta_g + 2;  // [splits, dv]
  const StateSeq& seq = p.seqs.seq[blockIdx.x];
  const int h = blockIdx.y;
  const int j = threadIdx.x % p.dv, part = threadIdx.x / p.dv;
  const int rows = p.dk / splits, row0 = part * rows;
  float* state = static_cast<float*>(seq.state) + int64_t(h) * p.dk * p.dv;
  float s[kMaxRowsPerThread];
  for (int i = 0; i < rows; ++i) s[i] = state[(row0 + i) * p.dv + j];

  for (int64_t t = 0; t < seq.n_rows; ++t) {
    const int64_t row = seq.row_begin + t;
    load_token(p, row, h, q, k, beta_g);
    __syncthreads();
    const float decay = expf(beta_g[1]);
    float mem = 0;
    for (int i = 0; i < rows; ++i) {
      s[i] *= decay;
      mem += s[i] * k[row0 + i];
    }
    partial[part * p.dv + j] = mem;
    __syncthreads();
    mem = 0;
    for (int x = 0; x < splits; ++x) mem += partial[x * p.dv + j];
    const float v = to_float(p.qkv[row * p.qkv_stride + 2 * p.hk * p.dk + h * p.dv + j]);
    const float delta = beta_g[0] * (v - mem);
    float o = 0;
    for (int i = 0; i < rows; ++i) {
      s[i] += k[row0 + i] * delta;
      o += s[i] * q[row0 + i];
    }
    __syncthreads();  // everyone has read partial
    partial[part * p.dv + j] = o;
    __syncthreads();
    if (part == 0) {
      float total = 0;
      for (int x = 0; x < splits; ++x) total += partial[x * p.dv + j];
      p.out[row * p.out_stride + h * p.dv + j] = __float2bfloat16(total);
    }
    __syncthreads();
  }
  for (int i = 0; i < rows; ++i) state[(row0 + i) * p.dv + j] = s[i];
}

// Column slices: lane = row_group · kSliceGroups + column_group; a lane holds 4 consecutive
// columns (one float4) of rows row_group + kRowGroups · i, so a warp's load covers 16 rows of 32
// bytes, whole sectors.
constexpr int kSliceCols = 8;
constexpr int kSliceGroups = kSliceCols / 4;
constexpr int kRowGroups = 32 / kSliceGroups;
constexpr int kMaxSliceRows = 16;  // rows per lane: k_dim up to 256

// Sum over the lanes of one column group (all row groups); every such lane gets the total.
__device__ __forceinline__ float sum_over_rows(float v) {
  for (int o = kSliceGroups; o < 32; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One warp per (slice of kSliceCols columns, value head, sequence), up to kDecodeSlices slices a
// block, in grid order; dk ≤ kRowGroups · kRows, dv a multiple of 4, state 16-byte aligned. Each warp redoes
// its head's q/k normalisation, beta and g: 2·dk values, cheaper than sharing them across blocks.
//
// The state and the head's constants are requested before the inputs are ready: only this rule
// writes the state, never the op just before it (GatedDeltaArgs).
constexpr int kDecodeSlices = 4;  // a block of 4 warps: at 32 sequences 60.7 → 55.4 µs a call on an H200

template <int kRows>
__global__ void __launch_bounds__(32 * kDecodeSlices) delta_decode_kernel(DeltaParams p) {
  const StateSeq& seq = p.seqs.seq[blockIdx.z];
  const int h = blockIdx.y, kh = h / (p.hv / p.hk);
  const int dk = p.dk, dv = p.dv;
  const int lane = threadIdx.x % 32, slice = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int n_slices = (dv + kSliceCols - 1) / kSliceCols;
  if (slice >= n_slices) return;
  const int rg = lane / kSliceGroups;
  const int j0 = slice * kSliceCols + (lane % kSliceGroups) * 4;  // first of the lane's 4 columns
  const bool has_cols = j0 < dv;  // dv % 4 == 0: the lane's columns are all in or all out
  float* state = static_cast<float*>(seq.state) + int64_t(h) * dk * dv + j0;
  float4 s[kRows];  // lanes without columns, and rows past dk, hold zeros and take part in the sums
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int r = rg + kRowGroups * i;
    s[i] = has_cols && r < dk ? *reinterpret_cast<const float4*>(state + int64_t(r) * dv) : make_float4(0, 0, 0, 0);
  }
  const float neg_a = -expf(p.a_log[h]), dt_bias = p.dt_bias[h];
  wait_for_inputs();

  for (int64_t t = 0; t < seq.n_rows; ++t) {
    const int64_t row = seq.row_begin + t;
    const bf16* x = p.qkv + row * p.qkv_stride;
    float q[kRows], k[kRows], v[4] = {0, 0, 0, 0};
    float qn = 0, kn = 0;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = rg + kRowGroups * i;
      q[i] = r < dk ? to_float(x[kh * dk + r]) : 0.0f;
      k[i] = r < dk ? to_float(x[p.hk * dk + kh * dk + r]) : 0.0f;
      qn += q[i] * q[i];
      kn += k[i] * k[i];
    }
    if (has_cols)
      for (int c = 0; c < 4; ++c) v[c] = to_float(x[2 * p.hk * dk + h * dv + j0 + c]);
    const float beta = sigmoid(to_float(p.b[row * p.ab_stride + h]));
    const float g = neg_a * softplus(to_float(p.a[row * p.ab_stride + h]) + dt_bias);
    // l2 norms over all dk rows: each column group's row groups together hold every row once
    const float qs = rsqrtf(sum_over_rows(qn) + 1e-6f) * rsqrtf(float(dk)), ks = rsqrtf(sum_over_rows(kn) + 1e-6f);
    const float decay = expf(g);
    float mem[4] = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      q[i] *= qs;
      k[i] *= ks;
      s[i].x *= decay;
      s[i].y *= decay;
      s[i].z *= decay;
      s[i].w *= decay;
      mem[0] += s[i].x * k[i];
      mem[1] += s[i].y * k[i];
      mem[2] += s[i].z * k[i];
      mem[3] += s[i].w * k[i];
    }
    float delta[4], o[4] = {0, 0, 0, 0};
    for (int c = 0; c < 4; ++c) delta[c] = beta * (v[c] - sum_over_rows(mem[c]));
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      s[i].x += k[i] * delta[0];
      s[i].y += k[i] * delta[1];
      s[i].z += k[i] * delta[2];
      s[i].w += k[i] * delta[3];
      o[0] += s[i].x * q[i];
      o[1] += s[i].y * q[i];
      o[2] += s[i].z * q[i];
      o[3] += s[i].w * q[i];
    }
    for (int c = 0; c < 4; ++c) o[c] = sum_over_rows(o[c]);
    if (rg == 0 && has_cols)
      for (int c = 0; c < 4; ++c) p.out[row * p.out_stride + h * dv + j0 + c] = __float2bfloat16(o[c]);
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int r = rg + kRowGroups * i;
    if (has_cols && r < dk) *reinterpret_cast<float4*>(state + int64_t(r) * dv) = s[i];
  }
  if (!p.norm_weight) return;
  // The head's output norm, by the last of its slices: by then every slice has stored its columns.
  unsigned* count = p.done + int64_t(blockIdx.z) * p.hv + h;
  __syncwarp();  // the slice's columns are stored before lane 0 releases them
  const bool last = __shfl_sync(0xffffffffu, lane == 0 ? arrive_acq_rel(count) == unsigned(n_slices) - 1 : false, 0);
  if (!last) return;
  __syncwarp();  // the lanes read the other slices' columns after lane 0 acquired them
  for (int64_t t = 0; t < seq.n_rows; ++t) {
    const int64_t row = seq.row_begin + t;
    bf16* o = p.out + row * p.out_stride + int64_t(h) * dv;
    const bf16* z = p.norm_z + row * p.norm_z_stride + int64_t(h) * dv;
    float xv[kNormRegisterCols], wv[kNormRegisterCols], zv[kNormRegisterCols];
#pragma unroll
    for (int i = 0; i < kNormRegisterCols; ++i) {
      const int c = lane + 32 * i;
      xv[i] = c < dv ? __bfloat162float(__ldcg(o + c)) : 0.0f;  // from L2: other SMs stored them
      wv[i] = c < dv ? p.norm_weight[c] : 1.0f;
      zv[i] = c < dv ? __bfloat162float(z[c]) : 0.0f;
    }
    norm_row_registers<bf16, true>(xv, wv, zv, true, o, dv, p.norm_eps, lane);
  }
  if (lane == 0) *count = 0;
}

constexpr int kChunk = 64;
constexpr int kChunkThreads = 256;
constexpr int kLdA = kChunk + 1;  // odd row stride: the solve reads a column of A across the lanes

// The chunk's shared memory: raw q and k rows (bf16, dk padded to the mma's 16 with zeros, plus 8
// so that fragment loads of 8 rows fall in distinct banks), the block's state columns, its
// values / solved values X, e^γ q·S, the solve's system A, the intra-chunk attention QK, and per
// token the log-decay cumsum, beta, the norms' scales and the state update's weight.
struct ChunkSmem {
  int dk, cols;
  __host__ __device__ int dk_pad() const { return (dk + 15) / 16 * 16; }
  __host__ __device__ int ldk() const { return dk_pad() + 8; }
  __host__ __device__ size_t q() const { return 0; }  // bf16 [kChunk, ldk]
  __host__ __device__ size_t k() const { return q() + size_t(kChunk) * ldk() * 2; }
  __host__ __device__ size_t state() const { return k() + size_t(kChunk) * ldk() * 2; }   // f32 [dk_pad, cols]
  __host__ __device__ size_t x() const { return state() + size_t(dk_pad()) * cols * 4; }  // f32 [kChunk, cols]
  __host__ __device__ size_t qs() const { return x() + size_t(kChunk) * cols * 4; }       // f32 [kChunk, cols]
  __host__ __device__ size_t a() const { return qs() + size_t(kChunk) * cols * 4; }       // f32 [kChunk, kLdA]
  __host__ __device__ size_t qk() const { return a() + size_t(kChunk) * kLdA * 4; }       // f32 [kChunk, kLdA]
  __host__ __device__ size_t token() const { return qk() + size_t(kChunk) * kLdA * 4; }   // f32 [5, kChunk]
  // the solve's inverses of A's diagonal blocks (f32 [kChunk / 16, 16, 16]) and a block's right-hand side
  __host__ __device__ size_t inverses() const { return token() + size_t(5) * kChunk * 4; }
  __host__ __device__ size_t rhs() const { return inverses() + size_t(kChunk) * 16 * 4; }  // f32 [16, cols]
  __host__ __device__ size_t bytes() const { return rhs() + size_t(16) * cols * 4; }
};

__device__ __forceinline__ uint32_t bf16_pair(const bf16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
__device__ __forceinline__ uint32_t tf32_of(bf16 v) {
  return __float_as_uint(__bfloat162float(v));
}

// The chunked form, one block per (sequence, value head, slice of kCols value columns), chunks in
// order. The rule is independent per value column, so each block redoes its head's key-side work
// (norms, decays, K Kᵀ and Q Kᵀ) and keeps only its columns of the state: hv · dv / kCols blocks
// per sequence instead of hv. Per chunk of c tokens, with γ_i the cumulative log-decay:
//   A   = strictly-lower(β_i (k_i·k_j) e^(γ_i − γ_j)),  QK = lower((q_i·k_j) e^(γ_i − γ_j))
//   X   = (I + A)⁻¹ β (V − e^γ K S)        the reference's T βV − T (β K e^γ) S, factored
//   O   = e^γ Q S + QK X
//   S  <- e^(γ_last) S + Σ_t k_t e^(γ_last − γ_t) x_tᵀ
// K Kᵀ and Q Kᵀ run on the tensor cores over the raw bf16 q and k: the products are exact and
// the sums f32, and the l2 norms are applied to the results as per-row and per-column scales.
// K S, Q S, the state's update Kᵀ (w ∘ X) and QK X run on the tensor cores in tf32, the raw q and k
// exact and each f32 operand as a pair of tf32 values (hi + lo), so they keep nearly f32's
// precision; the solve, by blocks of 16 rows, is f32 on the CUDA cores.
template <int kCols>
__global__ void __launch_bounds__(kChunkThreads, 2) delta_chunked_kernel(DeltaParams p) {
  static_assert(kCols == 8 || kCols == 16 || kCols == 32, "tiles of 8 columns; a block's 16 rows within two passes");
  constexpr int kWarps = kChunkThreads / 32;
  wait_for_inputs();
  extern __shared__ __align__(16) unsigned char smem[];
  const int dk = p.dk, dv = p.dv;
  const ChunkSmem L{dk, kCols};
  const int dk_pad = L.dk_pad(), ldk = L.ldk();
  bf16* q_raw = reinterpret_cast<bf16*>(smem + L.q());
  bf16* k_raw = reinterpret_cast<bf16*>(smem + L.k());
  float* S = reinterpret_cast<float*>(smem + L.state());
  float* X = reinterpret_cast<float*>(smem + L.x());
  float* QS = reinterpret_cast<float*>(smem + L.qs());
  float* A = reinterpret_cast<float*>(smem + L.a());
  float* QK = reinterpret_cast<float*>(smem + L.qk());
  float* cum = reinterpret_cast<float*>(smem + L.token());
  float* beta = cum + kChunk;
  float* q_scale = beta + kChunk;
  float* k_scale = q_scale + kChunk;
  float* w = k_scale + kChunk;  // k's weight in the state update: k_scale e^(γ_last − γ_t)
  float* inverses = reinterpret_cast<float*>(smem + L.inverses());
  float* rhs = reinterpret_cast<float*>(smem + L.rhs());

  const StateSeq& seq = p.seqs.seq[blockIdx.x];
  const int h = blockIdx.y, kh = h / (p.hv / p.hk);
  const int j0 = blockIdx.z * kCols, n_cols = min(kCols, dv - j0);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, tq = lane % 4;
  float* state = static_cast<float*>(seq.state) + int64_t(h) * dk * dv + j0;
  const float neg_a = -expf(p.a_log[h]), dt_bias = p.dt_bias[h];

  // the padding of q, k and the state stays zero: chunks write only the first dk entries
  for (int i = tid; i < kChunk * (dk_pad - dk); i += kChunkThreads) {
    const int t = i / (dk_pad - dk), d = dk + i % (dk_pad - dk);
    q_raw[t * ldk + d] = k_raw[t * ldk + d] = __float2bfloat16(0.0f);
  }
  for (int i = tid; i < dk_pad * kCols; i += kChunkThreads) {
    const int a = i / kCols, j = i % kCols;
    S[i] = a < dk && j < n_cols ? state[int64_t(a) * dv + j] : 0.0f;
  }

  for (int64_t c0 = 0; c0 < seq.n_rows; c0 += kChunk) {
    const int c = int(seq.n_rows - c0 < kChunk ? seq.n_rows - c0 : kChunk);
    __syncthreads();  // the previous chunk is done with q, k, X
    // 1. the chunk's raw q and k rows in one trip (16-byte copies that hold no registers) while the
    // block's values, beta and the log-decay load; then their norms, a warp per token
    const int64_t row0 = seq.row_begin + c0;
    const int pieces = dk / 8;  // 16-byte pieces of a q or k row
    if (p.qk_copies) {
      // (token, piece) stepped by the block's threads without a division a copy
      const int per_token = 2 * pieces, step_t = kChunkThreads / per_token, step_rest = kChunkThreads % per_token;
      for (int t = tid / per_token, rest = tid % per_token; t < c;) {
        const int which = rest >= pieces ? 1 : 0, piece = rest - which * pieces;
        const bf16* src = p.qkv + (row0 + t) * p.qkv_stride + which * p.hk * dk + kh * dk + piece * 8;
        cp_async16((which ? k_raw : q_raw) + t * ldk + piece * 8, src, true);
        t += step_t;
        rest += step_rest;
        if (rest >= per_token) rest -= per_token, ++t;
      }
      cp_async_commit();
    } else {
      for (int idx = tid; idx < c * 2 * dk; idx += kChunkThreads) {
        const int t = idx / (2 * dk), which = idx % (2 * dk) / dk, d = idx % dk;
        (which ? k_raw : q_raw)[t * ldk + d] = p.qkv[(row0 + t) * p.qkv_stride + which * p.hk * dk + kh * dk + d];
      }
    }
    {  // the values: every load issued before any store (stores to shared memory between loads
       // would keep the loads apart, a trip to memory each)
      constexpr int kValues = kChunk * kCols / kChunkThreads;
      float values[kValues];
#pragma unroll
      for (int e = 0; e < kValues; ++e) {
        const int t = (tid + e * kChunkThreads) / kCols, j = (tid + e * kChunkThreads) % kCols;
        values[e] =
            t < c && j < n_cols ? to_float(p.qkv[(row0 + t) * p.qkv_stride + 2 * p.hk * dk + h * dv + j0 + j]) : 0.0f;
      }
#pragma unroll
      for (int e = 0; e < kValues; ++e) {
        const int t = (tid + e * kChunkThreads) / kCols, j = (tid + e * kChunkThreads) % kCols;
        if (t < c && j < n_cols) X[t * kCols + j] = values[e];
      }
    }
    if (tid < c) {
      beta[tid] = sigmoid(to_float(p.b[(row0 + tid) * p.ab_stride + h]));
      cum[tid] = neg_a * softplus(to_float(p.a[(row0 + tid) * p.ab_stride + h]) + dt_bias);
    }
    if (p.qk_copies) cp_async_wait_all();
    __syncthreads();
    {  // four threads a token (a warp per token took 6.3 of the chunk's 38 thousand cycles), each a
       // quarter of the row, in 16-byte pieces where dk allows
      static_assert(kChunkThreads == 4 * kChunk, "four threads a token");
      const int t = tid / 4, part = tid % 4;
      float qn = 0, kn = 0;
      if (t < c && dk % 8 == 0) {
        for (int d = part * 8; d < dk; d += 32) {
          const uint4 qv = *reinterpret_cast<const uint4*>(q_raw + t * ldk + d);
          const uint4 kv = *reinterpret_cast<const uint4*>(k_raw + t * ldk + d);
          const __nv_bfloat162* q2 = reinterpret_cast<const __nv_bfloat162*>(&qv);
          const __nv_bfloat162* k2 = reinterpret_cast<const __nv_bfloat162*>(&kv);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float2 qf = __bfloat1622float2(q2[e]), kf = __bfloat1622float2(k2[e]);
            qn += qf.x * qf.x + qf.y * qf.y;
            kn += kf.x * kf.x + kf.y * kf.y;
          }
        }
      } else if (t < c) {
        for (int d = part; d < dk; d += 4) {
          const float qv = to_float(q_raw[t * ldk + d]), kv = to_float(k_raw[t * ldk + d]);
          qn += qv * qv;
          kn += kv * kv;
        }
      }
      qn += __shfl_xor_sync(0xffffffffu, qn, 1);
      kn += __shfl_xor_sync(0xffffffffu, kn, 1);
      qn += __shfl_xor_sync(0xffffffffu, qn, 2);
      kn += __shfl_xor_sync(0xffffffffu, kn, 2);
      if (t < c && part == 0) {
        q_scale[t] = rsqrtf(qn + 1e-6f) * rsqrtf(float(dk));
        k_scale[t] = rsqrtf(kn + 1e-6f);
      }
    }
    __syncthreads();
    // 2. γ = cumsum(g) by a warp scan (lane holds tokens lane and lane + 32), then the weights w
    if (warp == 0) {
      float lo = lane < c ? cum[lane] : 0.0f, hi = lane + 32 < c ? cum[lane + 32] : 0.0f;
      for (int o = 1; o < 32; o <<= 1) {
        const float lo_up = __shfl_up_sync(0xffffffffu, lo, o), hi_up = __shfl_up_sync(0xffffffffu, hi, o);
        if (lane >= o) {
          lo += lo_up;
          hi += hi_up;
        }
      }
      hi += __shfl_sync(0xffffffffu, lo, 31);
      const float last = __shfl_sync(0xffffffffu, c - 1 < 32 ? lo : hi, (c - 1) % 32);
      if (lane < c) cum[lane] = lo, w[lane] = k_scale[lane] * expf(last - lo);
      if (lane + 32 < c) cum[lane + 32] = hi, w[lane + 32] = k_scale[lane + 32] * expf(last - hi);
    }
    __syncthreads();
    // 3a. A and QK: warp → 16 rows (m_tile) by 32 columns (4 tiles of 8), tiles right of the
    // diagonal skipped; fragments as in the PTX ISA's m16n8k16 layout (g = lane / 4, t = lane % 4)
    {
      const int m_tile = warp / 2, n_first = (warp % 2) * 4;
      float acc_k[4][4] = {}, acc_q[4][4] = {};
      const int r0 = m_tile * 16 + g;
      for (int d0 = 0; d0 < dk_pad; d0 += 16) {
        const int d = d0 + 2 * tq;
        const uint32_t fk[4] = {bf16_pair(k_raw + r0 * ldk + d), bf16_pair(k_raw + (r0 + 8) * ldk + d),
                                bf16_pair(k_raw + r0 * ldk + d + 8), bf16_pair(k_raw + (r0 + 8) * ldk + d + 8)};
        const uint32_t fq[4] = {bf16_pair(q_raw + r0 * ldk + d), bf16_pair(q_raw + (r0 + 8) * ldk + d),
                                bf16_pair(q_raw + r0 * ldk + d + 8), bf16_pair(q_raw + (r0 + 8) * ldk + d + 8)};
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          const int n0 = (n_first + n) * 8;
          if (n0 > m_tile * 16 + 15) continue;  // all j > i
          const bf16* kn = k_raw + (n0 + g) * ldk + d;
          const uint32_t b0 = bf16_pair(kn), b1 = bf16_pair(kn + 8);
          mma_bf16(acc_k[n], fk, b0, b1);
          mma_bf16(acc_q[n], fq, b0, b1);
        }
      }
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int n0 = (n_first + n) * 8;
        if (n0 > m_tile * 16 + 15) continue;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = r0 + (e / 2) * 8, j = n0 + 2 * tq + e % 2;
          if (j > i) continue;
          const float decay = expf(cum[i] - cum[j]);
          A[i * kLdA + j] = beta[i] * k_scale[i] * k_scale[j] * acc_k[n][e] * decay;
          QK[i * kLdA + j] = q_scale[i] * k_scale[j] * acc_q[n][e] * decay;
        }
      }
    }
    // 3b. K S and Q S on the tensor cores, a warp per 16 × 8 tile (the old S), then the right-hand
    // side β (v − e^γ k·S) into X and e^γ q·S into QS
    {
      constexpr int kNTiles = kCols / 8;
      for (int tile = warp; tile < (kChunk / 16) * kNTiles; tile += kWarps) {
        const int i0 = tile / kNTiles * 16, n0 = tile % kNTiles * 8;
        float acc_k[4] = {}, acc_q[4] = {};
        for (int d0 = 0; d0 < dk_pad; d0 += 8) {
          const bf16* kr = k_raw + (i0 + g) * ldk + d0 + tq;
          const bf16* qr = q_raw + (i0 + g) * ldk + d0 + tq;
          const uint32_t fk[4] = {tf32_of(kr[0]), tf32_of(kr[8 * ldk]), tf32_of(kr[4]), tf32_of(kr[8 * ldk + 4])};
          const uint32_t fq[4] = {tf32_of(qr[0]), tf32_of(qr[8 * ldk]), tf32_of(qr[4]), tf32_of(qr[8 * ldk + 4])};
          uint32_t hi0, lo0, hi1, lo1;
          split_tf32(S[(d0 + tq) * kCols + n0 + g], hi0, lo0);
          split_tf32(S[(d0 + tq + 4) * kCols + n0 + g], hi1, lo1);
          mma_tf32(acc_k, fk, hi0, hi1);
          mma_tf32(acc_k, fk, lo0, lo1);
          mma_tf32(acc_q, fq, hi0, hi1);
          mma_tf32(acc_q, fq, lo0, lo1);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = i0 + g + e / 2 * 8, j = n0 + 2 * tq + e % 2;
          if (i >= c || j >= n_cols) continue;
          const float ex = expf(cum[i]);
          QS[i * kCols + j] = ex * q_scale[i] * acc_q[e];
          X[i * kCols + j] = beta[i] * (X[i * kCols + j] - ex * k_scale[i] * acc_k[e]);
        }
      }
    }
    __syncthreads();
    // 4. X = (I + A)⁻¹ X by blocks of 16 rows: first the inverses of the four diagonal blocks, in
    // parallel (two warps a block, a lane a row and four of its columns, 15 dependent steps), then
    // block after block X_b = inv_b (X_b − Σ_{j<b} A_bj X_j). The dependent chain is 15 broadcasts and
    // four short sums instead of 63 broadcasts (7.9 of a chunk's 34 thousand cycles before).
    {
      const int b = warp / 2, r = lane % 16, first_col = (warp % 2) * 8 + (lane / 16) * 4;
      float x[4];
#pragma unroll
      for (int m = 0; m < 4; ++m) x[m] = r == first_col + m ? 1.0f : 0.0f;
      const float* a_row = A + (b * 16 + r) * kLdA + b * 16;
#pragma unroll
      for (int i = 0; i < 15; ++i) {
        const float a = a_row[i];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const float xi = __shfl_sync(0xffffffffu, x[m], (lane / 16) * 16 + i);
          if (r > i) x[m] -= a * xi;
        }
      }
#pragma unroll
      for (int m = 0; m < 4; ++m) inverses[(b * 16 + r) * 16 + first_col + m] = x[m];
    }
    {
      constexpr int kOuts = (16 * kCols + kChunkThreads - 1) / kChunkThreads;  // a block's outputs a thread
      for (int b0 = 0; b0 < c; b0 += 16) {
#pragma unroll
        for (int e = 0; e < kOuts; ++e) {
          const int idx = tid + e * kChunkThreads, r = idx / kCols, j = idx % kCols, i = b0 + r;
          if (idx >= 16 * kCols || i >= c) continue;
          const float* a_row = A + i * kLdA;
          float sum = X[i * kCols + j], sum2 = 0.0f;
          for (int t = 0; t < b0; t += 2) {
            sum -= a_row[t] * X[t * kCols + j];
            sum2 -= a_row[t + 1] * X[(t + 1) * kCols + j];
          }
          rhs[r * kCols + j] = sum + sum2;
        }
        __syncthreads();  // the inverses (first block) and this block's right-hand side
#pragma unroll
        for (int e = 0; e < kOuts; ++e) {
          const int idx = tid + e * kChunkThreads, r = idx / kCols, j = idx % kCols, i = b0 + r;
          if (idx >= 16 * kCols || i >= c) continue;
          const float* inv_row = inverses + (b0 + r) * 16;
          float sum = 0.0f;
          for (int k = 0; k <= r; ++k) sum += inv_row[k] * rhs[k * kCols + j];
          X[i * kCols + j] = sum;
        }
        __syncthreads();  // X_b final before the next block reads it (and rhs free again)
      }
    }
    // 5. outputs o_i = e^γ_i q_i S + Σ_{t≤i} QK_it x_t, QK X on the tensor cores with both operands
    // as tf32 pairs (hi·hi + hi·lo + lo·hi), a warp per 16 × 8 tile; QK's upper triangle and X's rows
    // past the chunk are zeros
    {
      constexpr int kNTiles = kCols / 8;
      for (int tile = warp; tile < (kChunk / 16) * kNTiles; tile += kWarps) {
        const int i0 = tile / kNTiles * 16, n0 = tile % kNTiles * 8;
        float acc[4] = {};
        for (int t0 = 0; t0 < i0 + 16 && t0 < c; t0 += 8) {
          const int ta = t0 + tq, tb = t0 + tq + 4, ia = i0 + g, ib = i0 + g + 8;
          uint32_t a_hi[4], a_lo[4], b_hi0, b_lo0, b_hi1, b_lo1;
          split_tf32(ta <= ia ? QK[ia * kLdA + ta] : 0.0f, a_hi[0], a_lo[0]);
          split_tf32(ta <= ib ? QK[ib * kLdA + ta] : 0.0f, a_hi[1], a_lo[1]);
          split_tf32(tb <= ia ? QK[ia * kLdA + tb] : 0.0f, a_hi[2], a_lo[2]);
          split_tf32(tb <= ib ? QK[ib * kLdA + tb] : 0.0f, a_hi[3], a_lo[3]);
          split_tf32(ta < c ? X[ta * kCols + n0 + g] : 0.0f, b_hi0, b_lo0);
          split_tf32(tb < c ? X[tb * kCols + n0 + g] : 0.0f, b_hi1, b_lo1);
          mma_tf32(acc, a_hi, b_hi0, b_hi1);
          mma_tf32(acc, a_hi, b_lo0, b_lo1);
          mma_tf32(acc, a_lo, b_hi0, b_hi1);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = i0 + g + e / 2 * 8, j = n0 + 2 * tq + e % 2;
          if (i < c && j < n_cols)
            p.out[(seq.row_begin + c0 + i) * p.out_stride + h * dv + j0 + j] =
                __float2bfloat16(QS[i * kCols + j] + acc[e]);
        }
      }
    }
    // 6. the state on the tensor cores, a warp per 16 × 8 tile: S = e^γ_last S + Kᵀ (w ∘ X), where
    // w_t = k_scale e^(γ_last − γ_t); tokens past the chunk's end are zeros on both sides. Each warp
    // reads and writes its own tiles of S only, which no other thread reads until the next chunk.
    {
      constexpr int kNTiles = kCols / 8;
      const float chunk_decay = expf(cum[c - 1]);
      for (int tile = warp; tile < dk_pad / 16 * kNTiles; tile += kWarps) {
        const int a0 = tile / kNTiles * 16, n0 = tile % kNTiles * 8;
        float* s_lo = S + (a0 + g) * kCols + n0 + 2 * tq;
        float* s_hi = s_lo + 8 * kCols;
        float acc[4] = {s_lo[0] * chunk_decay, s_lo[1] * chunk_decay, s_hi[0] * chunk_decay, s_hi[1] * chunk_decay};
        const bool col_in = n0 + g < n_cols;
        for (int t0 = 0; t0 < c; t0 += 8) {
          const int t_a = t0 + tq, t_b = t0 + tq + 4;
          const bool in_a = t_a < c, in_b = t_b < c;
          const uint32_t fa[4] = {
              in_a ? tf32_of(k_raw[t_a * ldk + a0 + g]) : 0u, in_a ? tf32_of(k_raw[t_a * ldk + a0 + g + 8]) : 0u,
              in_b ? tf32_of(k_raw[t_b * ldk + a0 + g]) : 0u, in_b ? tf32_of(k_raw[t_b * ldk + a0 + g + 8]) : 0u};
          uint32_t hi0, lo0, hi1, lo1;
          split_tf32(in_a && col_in ? w[t_a] * X[t_a * kCols + n0 + g] : 0.0f, hi0, lo0);
          split_tf32(in_b && col_in ? w[t_b] * X[t_b * kCols + n0 + g] : 0.0f, hi1, lo1);
          mma_tf32(acc, fa, hi0, hi1);
          mma_tf32(acc, fa, lo0, lo1);
        }
        s_lo[0] = acc[0];
        s_lo[1] = acc[1];
        s_hi[0] = acc[2];
        s_hi[1] = acc[3];
      }
    }
  }
  __syncthreads();
  for (int i = tid; i < dk * kCols; i += kChunkThreads) {
    const int a = i / kCols, j = i % kCols;
    if (j < n_cols) state[int64_t(a) * dv + j] = S[i];
  }
}

}  // namespace

void gated_delta(const GatedDeltaArgs& args, unsigned* done, cudaStream_t stream) {
  assert(args.qkv.dtype() == DType::bf16 && args.out.dtype() == DType::bf16);
  DeltaParams p{};
  p.qkv = args.qkv.data_as<bf16>();
  p.qkv_stride = args.qkv.row_stride();
  p.a = args.a.data_as<bf16>();
  p.b = args.b.data_as<bf16>();
  p.ab_stride = args.a.row_stride();
  p.a_log = args.a_log.data_as<float>();
  p.dt_bias = args.dt_bias.data_as<float>();
  p.out = args.out.data_as<bf16>();
  p.out_stride = args.out.row_stride();
  p.hk = args.n_k_heads;
  p.hv = args.n_v_heads;
  p.dk = args.k_dim;
  p.dv = args.v_dim;
  p.qk_copies = p.dk % 8 == 0 && p.qkv_stride % 8 == 0 && reinterpret_cast<uintptr_t>(p.qkv) % 16 == 0;
  const int max_smem = int(max_shared_memory()), n_sms = multiprocessors();
  // chunked: the column slice widths, fewest columns (most blocks) first, and how many blocks of
  // each the GPU holds at once
  struct ChunkedKernel {
    int cols;
    void (*kernel)(DeltaParams);
    size_t bytes = 0;
    int64_t resident = 0;  // 0: does not fit
  };
  ChunkedKernel chunked_kernels[] = {
      {8, delta_chunked_kernel<8>}, {16, delta_chunked_kernel<16>}, {32, delta_chunked_kernel<32>}};
  static std::once_flag configured;
  std::call_once(configured, [max_smem, &chunked_kernels] {
    for (const ChunkedKernel& v : chunked_kernels)
      cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem);
  });
  const bool want_chunked = args.algorithm == DeltaRuleAlgorithm::chunked;
  bool chunked = false;
  for (ChunkedKernel& v : chunked_kernels) {
    v.bytes = ChunkSmem{p.dk, v.cols}.bytes();
    int per_sm = 0;
    if (want_chunked && v.bytes <= size_t(max_smem))
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, v.kernel, kChunkThreads, v.bytes);
    v.resident = int64_t(per_sm) * n_sms;
    chunked = chunked || v.resident > 0;
  }
  // recurrent: column slices where the shape fits them (rows per lane rounded up to 4, 8 or 16)
  const int slice_rows = ceil_div(p.dk, kRowGroups);
  bool sliced = p.dv % 4 == 0 && slice_rows <= kMaxSliceRows;
  for (const Tensor& s : args.states) sliced = sliced && reinterpret_cast<uintptr_t>(s.data()) % 16 == 0;
  void (*decode_kernel)(DeltaParams) = slice_rows <= 4   ? delta_decode_kernel<4>
                                       : slice_rows <= 8 ? delta_decode_kernel<8>
                                                         : delta_decode_kernel<16>;
  // otherwise, the block-per-head layout: columns × splits threads, each split at most 32 rows of the state
  int splits = 1;
  while ((p.dk / splits > kMaxRowsPerThread || p.dk % splits) && splits < p.dk) ++splits;
  while (p.dv * splits * 2 <= 512 && p.dk % (splits * 2) == 0) splits *= 2;
  // the output norm: in the sliced decode kernel where it fits (heads of up to 256 values, bf16 gates,
  // the counters), otherwise its own launch after the rule
  const bool norm = args.norm_weight.defined();
  const bool fuse_norm = norm && !chunked && sliced && done && p.hv <= kMaxDeltaNormHeads &&
                         p.dv <= 32 * kNormRegisterCols && args.norm_z.dtype() == DType::bf16;
  for (size_t begin = 0; begin < args.seqs.size(); begin += kMaxSeqs) {
    p.seqs = StateTable{};
    p.seqs.n = int(std::min<size_t>(kMaxSeqs, args.seqs.size() - begin));
    for (int i = 0; i < p.seqs.n; ++i) {
      const SeqRows& s = args.seqs[begin + size_t(i)];
      p.seqs.seq[i] = StateSeq{s.row_begin, s.n_rows, args.states[begin + size_t(i)].data()};
    }
    const dim3 grid(unsigned(p.seqs.n), unsigned(p.hv));
    if (chunked) {
      // the narrowest slices whose grid fits on the GPU in one wave (Qwen 3.5 4B, one sequence:
      // 32 heads x 8 slices of 16 = 256 blocks, two per SM); past one wave more slices only
      // repeat key-side work, so then the widest that fits in shared memory
      const ChunkedKernel* pick = nullptr;
      for (const ChunkedKernel& v : chunked_kernels) {
        if (v.resident == 0) continue;
        pick = &v;
        if (int64_t(p.seqs.n) * p.hv * ceil_div(p.dv, v.cols) <= v.resident) break;
      }
      const dim3 slices(unsigned(p.seqs.n), unsigned(p.hv), unsigned(ceil_div(p.dv, pick->cols)));
      launch(pick->kernel, slices, kChunkThreads, pick->bytes, stream, p);
    } else if (sliced) {
      // slices in x: a head's slices are neighbours in launch order, so its state (64 KB on Qwen
      // 3.5 4B) is read at once; with sequences in x, 32 of them read 32 bytes of each 512-byte row
      // in each of seven waves, and the rule took 1.6x as long
      const int n_slices = ceil_div(p.dv, kSliceCols), block_slices = std::min(kDecodeSlices, n_slices);
      const dim3 slices(unsigned(ceil_div(n_slices, block_slices)), unsigned(p.hv), unsigned(p.seqs.n));
      DeltaParams fused = p;
      if (fuse_norm) {
        fused.norm_z = args.norm_z.data_as<bf16>();
        fused.norm_z_stride = args.norm_z.row_stride();
        fused.norm_weight = args.norm_weight.data_as<float>();
        fused.norm_eps = args.norm_eps;
        fused.done = done;
      }
      launch(decode_kernel, slices, 32 * block_slices, 0, stream, fused);
    } else {
      const size_t bytes = (2 * size_t(p.dk) + 2 + size_t(splits) * p.dv) * sizeof(float);
      launch(delta_recurrent_kernel, grid, p.dv * splits, bytes, stream, p, splits);
    }
  }
  if (norm && !fuse_norm) {
    const int64_t rows = args.out.rows() * p.hv;
    Tensor heads = args.out.reshape(Shape{rows, p.dv});
    rms_norm_gated(heads, args.norm_z.reshape(Shape{rows, p.dv}), args.norm_weight, args.norm_eps, heads, stream);
  }
}

}  // namespace kiln::cuda
