// CUDA backend: RoPE, the KV-cache ring, and attention over it.
//
// Prefill runs the flash-attention kernel of cuda_flash_prefill.cu for the head dims it is built
// for, and otherwise the general tiled kernel here: a block takes a tile of query
// rows that share a KV head (tokens × the query heads of that group) and streams the sequence's
// cache through shared memory in tiles of BK slots, with scores and P·V on tensor cores (WMMA, bf16
// in, f32 accumulate) and an online softmax in f32. Decode (a few rows per sequence) splits the
// slots over blocks instead. Masks follow each slot's stored position, so sliding-window rings and
// KV sharing need no special case. Kernel arguments never hold positions (those are read from
// device memory), so a decode step can be captured once and replayed.
#include <mma.h>

#include <cassert>
#include <climits>
#include <cstdlib>
#include <mutex>

#include "backend/cuda/cuda_attention.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.cuh"

namespace kiln::cuda {

namespace {

// The table of sequences [begin, begin + kMaxSeqs) of a launch; tile_begin left 0.
SeqTable make_table(const std::vector<SeqRows>& seqs, const std::vector<KvCacheView>& caches, size_t begin) {
  SeqTable table{};
  table.n = int(std::min<size_t>(kMaxSeqs, seqs.size() - begin));
  for (int i = 0; i < table.n; ++i) {
    const SeqRows& s = seqs[begin + size_t(i)];
    const KvCacheView& c = caches[begin + size_t(i)];
    table.seq[i] = SeqDesc{
        s.row_begin, s.n_rows, c.k.data_as<bf16>(), c.v.data_as<bf16>(), c.slot_pos.data_as<int32_t>(), c.capacity, 0};
  }
  return table;
}

template <typename T>
__global__ void rope_kernel(Rows<T> x, const int32_t* positions, const float* inv_freq, int heads, int n_pairs,
                            int offset, int64_t rows) {
  wait_for_inputs();
  const int64_t r = blockIdx.x;
  if (r >= rows) return;
  const float pos = float(positions[r / heads]);
  T* p = x.row(r);
  for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) {
    float s, c;
    sincosf(pos * inv_freq[i], &s, &c);  // the angle in f32, as the reference forms it
    const float a = to_float(p[i]), b = to_float(p[i + offset]);
    p[i] = from_float<T>(a * c - b * s);
    p[i + offset] = from_float<T>(b * c + a * s);
  }
}

// The per-head q/k norm and the rotation in one pass: a warp per head row, the row staged in
// shared memory so that the rotation reads its partner elements after normalisation.
constexpr int kNormRopeWarps = 8;
constexpr int kNormRopeMaxDim = 512;

// One head row: staged in `row` (shared), normalised (scaled by weight + weight_offset when weight is
// given), rotated at position pos, stored to dst. A warp's lanes take its columns.
template <typename T, typename S>
__device__ __forceinline__ void norm_rope_row(const S* src, T* dst, float* row, int lane, int head_dim,
                                              const float* weight, float eps, float weight_offset, float pos,
                                              const float* inv_freq, int n_pairs, int offset) {
  float sum = 0;
  for (int c = lane; c < head_dim; c += 32) {
    const float v = to_float(src[c]);
    row[c] = v;
    sum += v * v;
  }
  const float inv = rsqrtf(warp_sum(sum) / float(head_dim) + eps);
  for (int c = lane; c < head_dim; c += 32) row[c] *= weight ? inv * (weight[c] + weight_offset) : inv;
  __syncwarp();
  for (int c = lane; c < head_dim; c += 32) {
    float v = row[c];
    if (c < n_pairs) {
      float s, co;
      sincosf(pos * inv_freq[c], &s, &co);
      v = row[c] * co - row[c + offset] * s;
    } else if (c >= offset && c < offset + n_pairs) {
      float s, co;
      sincosf(pos * inv_freq[c - offset], &s, &co);
      v = row[c] * co + row[c - offset] * s;
    }
    dst[c] = from_float<T>(v);
  }
}

template <typename T>
__global__ void norm_rope_kernel(Rows<T> x, Rows<const T> in, const int32_t* positions, const float* inv_freq,
                                 int heads, int n_pairs, int offset, int64_t rows, int head_dim, const float* weight,
                                 float eps, float weight_offset) {
  wait_for_inputs();
  __shared__ float staged[kNormRopeWarps][kNormRopeMaxDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = int64_t(blockIdx.x) * kNormRopeWarps + warp;
  if (r >= rows) return;
  norm_rope_row(in.row(r), x.row(r), staged[warp], lane, head_dim, weight, eps, weight_offset,
                float(positions[r / heads]), inv_freq, n_pairs, offset);
}

// A step's attention inputs in one launch (AttentionInputsArgs): a warp per query head row, then
// a warp per (token, KV head) that normalises and rotates the key, normalises the value (both
// read before either is written: the value may be the raw key), and stores both to the tensors
// and to the token's cache slot. The rows get the bits of norm_rope_kernel.
struct HeadRows {
  Rows<bf16> out;
  Rows<const bf16> in;
  const float* weight;
  float eps, weight_offset;
  const float* inv_freq;
  int n_pairs, offset;
};

__global__ void attention_inputs_kernel(HeadRows q, HeadRows k, Rows<bf16> v, Rows<const bf16> v_in, bool v_norm,
                                        float v_eps, SeqTable table, const int32_t* positions, int q_heads,
                                        int kv_heads, int head_dim, int64_t tokens) {
  wait_for_inputs();
  __shared__ float staged[kNormRopeWarps][2][kNormRopeMaxDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t unit = int64_t(blockIdx.x) * kNormRopeWarps + warp;
  const int64_t q_rows = tokens * q_heads;
  if (unit < q_rows) {
    norm_rope_row(q.in.row(unit), q.out.row(unit), staged[warp][0], lane, head_dim, q.weight, q.eps, q.weight_offset,
                  float(positions[unit / q_heads]), q.inv_freq, q.n_pairs, q.offset);
    return;
  }
  const int64_t r = unit - q_rows;  // row of k and v: token r / kv_heads, head r % kv_heads
  if (r >= tokens * kv_heads) return;
  const int64_t token = r / kv_heads;
  const int head = int(r % kv_heads);
  float* vrow = staged[warp][1];
  float sum = 0;
  for (int c = lane; c < head_dim; c += 32) {  // the value first: it may be the raw key
    const float x = to_float(v_in.row(r)[c]);
    vrow[c] = x;
    sum += x * x;
  }
  const float v_scale = v_norm ? rsqrtf(warp_sum(sum) / float(head_dim) + v_eps) : 1.0f;
  __syncwarp();
  const int32_t pos = positions[token];
  norm_rope_row(k.in.row(r), k.out.row(r), staged[warp][0], lane, head_dim, k.weight, k.eps, k.weight_offset,
                float(pos), k.inv_freq, k.n_pairs, k.offset);
  for (int c = lane; c < head_dim; c += 32) v.row(r)[c] = from_float<bf16>(v_norm ? vrow[c] * v_scale : vrow[c]);
  __syncwarp();
  const SeqDesc& s = table.seq[find_seq(table, token)];
  if (token < s.row_begin || token >= s.row_begin + s.n_rows) return;
  const int64_t slot = pos % s.capacity;
  const int64_t at = (slot * kv_heads + head) * head_dim;
  for (int c = lane; c < head_dim; c += 32) {  // each lane reads back what it stored itself
    s.k[at + c] = k.out.row(r)[c];
    s.v[at + c] = v.row(r)[c];
  }
  if (head == 0 && lane == 0) s.slot_pos[slot] = pos;
}

__global__ void kv_write_kernel(SeqTable table, const bf16* k, const bf16* v, const int32_t* positions,
                                int64_t row_elems, int64_t first_row) {
  wait_for_inputs();
  const int64_t row = first_row + blockIdx.x;
  const SeqDesc& s = table.seq[find_seq(table, row)];
  if (row < s.row_begin || row >= s.row_begin + s.n_rows) return;
  const int64_t pos = positions[row];
  const int64_t slot = pos % s.capacity;
  const uint4* ks = reinterpret_cast<const uint4*>(k + row * row_elems);
  const uint4* vs = reinterpret_cast<const uint4*>(v + row * row_elems);
  uint4* kd = reinterpret_cast<uint4*>(s.k + slot * row_elems);
  uint4* vd = reinterpret_cast<uint4*>(s.v + slot * row_elems);
  for (int64_t i = threadIdx.x; i < row_elems / 8; i += blockDim.x) {
    kd[i] = ks[i];
    vd[i] = vs[i];
  }
  if (threadIdx.x == 0) s.slot_pos[slot] = int32_t(pos);
}

// Shared-memory layout of one attention block, in bytes; each region starts 128-byte aligned.
template <int D, int BQ, int BK>
struct AttnSmem {
  static constexpr int ldq = D + 8, ldk = D + 8, ldv = D + 8, lds = BK + 4, ldp = BK + 8, ldo = D + 4;
  static constexpr size_t align(size_t x) { return (x + 127) / 128 * 128; }
  static constexpr size_t q = 0;
  static constexpr size_t k = align(q + size_t(BQ) * ldq * 2);
  static constexpr size_t v = align(k + size_t(BK) * ldk * 2);
  static constexpr size_t s = align(v + size_t(BK) * ldv * 2);
  static constexpr size_t p = align(s + size_t(BQ) * lds * 4);
  static constexpr size_t o = align(p + size_t(BQ) * ldp * 2);
  static constexpr size_t m = align(o + size_t(BQ) * ldo * 4);
  static constexpr size_t l = align(m + size_t(BQ) * 4);
  static constexpr size_t alpha = align(l + size_t(BQ) * 4);
  static constexpr size_t qpos = align(alpha + size_t(BQ) * 4);
  static constexpr size_t kpos = align(qpos + size_t(BQ) * 4);
  static constexpr size_t misc = align(kpos + size_t(BK) * 4);
  static constexpr size_t bytes = align(misc + 16);
};

template <int D, int BQ, int BK>
__global__ void __launch_bounds__(BQ / 16 * 32) attention_kernel(AttnParams p) {
  wait_for_inputs();
  using namespace nvcuda;
  using L = AttnSmem<D, BQ, BK>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem + L::q);
  bf16* ks = reinterpret_cast<bf16*>(smem + L::k);
  bf16* vs = reinterpret_cast<bf16*>(smem + L::v);
  float* ss = reinterpret_cast<float*>(smem + L::s);
  bf16* ps = reinterpret_cast<bf16*>(smem + L::p);
  float* os = reinterpret_cast<float*>(smem + L::o);
  float* ms = reinterpret_cast<float*>(smem + L::m);
  float* ls = reinterpret_cast<float*>(smem + L::l);
  float* alphas = reinterpret_cast<float*>(smem + L::alpha);
  int* qpos = reinterpret_cast<int*>(smem + L::qpos);
  int* kpos = reinterpret_cast<int*>(smem + L::kpos);
  int64_t* n_slots_shared = reinterpret_cast<int64_t*>(smem + L::misc);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, n_threads = blockDim.x;
  const int tile = blockIdx.x;
  int si = 0;
  while (si + 1 < p.seqs.n && p.seqs.seq[si + 1].tile_begin <= tile) ++si;
  const SeqDesc& seq = p.seqs.seq[si];
  const int local = tile - seq.tile_begin;
  const int kvh = local % p.n_kv_heads;
  const int64_t token0 = int64_t(local / p.n_kv_heads) * p.tokens_per_tile;
  const int hd = p.head_dim;
  constexpr int kChunks = D / 8;  // 16-byte chunks per padded row

  // query rows: (token, query head of this KV group)
  for (int i = tid; i < BQ * kChunks; i += n_threads) {
    const int r = i / kChunks, c8 = (i % kChunks) * 8;
    const int tl = r / p.group;
    const int64_t token = token0 + tl;
    const bool valid = tl < p.tokens_per_tile && token < seq.n_rows && c8 < hd;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (valid) {
      const int head = kvh * p.group + r % p.group;
      value = *reinterpret_cast<const uint4*>(p.q + ((seq.row_begin + token) * p.n_heads + head) * hd + c8);
    }
    *reinterpret_cast<uint4*>(qs + r * L::ldq + c8) = value;
  }
  for (int r = tid; r < BQ; r += n_threads) {
    const int tl = r / p.group;
    const int64_t token = token0 + tl;
    qpos[r] = (tl < p.tokens_per_tile && token < seq.n_rows) ? p.positions[seq.row_begin + token] : -1;
    ms[r] = -INFINITY;
    ls[r] = 0.0f;
  }
  for (int i = tid; i < BQ * L::ldo; i += n_threads) os[i] = 0.0f;
  if (tid == 0) {
    // keys beyond the newest query's position are still empty or in the future
    const int64_t last = min(seq.n_rows, token0 + p.tokens_per_tile) - 1;
    *n_slots_shared = min(seq.capacity, int64_t(p.positions[seq.row_begin + last]) + 1);
  }
  __syncthreads();
  const int64_t n_slots = *n_slots_shared;

  for (int64_t kt = 0; kt < n_slots; kt += BK) {
    for (int i = tid; i < BK * kChunks; i += n_threads) {
      const int j = i / kChunks, c8 = (i % kChunks) * 8;
      const int64_t slot = kt + j;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (slot < n_slots && c8 < hd) {
        const int64_t off = (slot * p.n_kv_heads + kvh) * hd + c8;
        kv = *reinterpret_cast<const uint4*>(seq.k + off);
        vv = *reinterpret_cast<const uint4*>(seq.v + off);
      }
      *reinterpret_cast<uint4*>(ks + j * L::ldk + c8) = kv;
      *reinterpret_cast<uint4*>(vs + j * L::ldv + c8) = vv;
    }
    for (int j = tid; j < BK; j += n_threads) kpos[j] = kt + j < n_slots ? seq.slot_pos[kt + j] : -1;
    __syncthreads();

    // scores of this warp's 16 rows against the BK keys
    const int r0 = warp * 16;
    for (int n = 0; n < BK / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int kk = 0; kk < D / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;
        wmma::load_matrix_sync(a, qs + r0 * L::ldq + kk * 16, L::ldq);
        wmma::load_matrix_sync(b, ks + (n * 16) * L::ldk + kk * 16, L::ldk);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(ss + r0 * L::lds + n * 16, acc, L::lds, wmma::mem_row_major);
    }
    __syncwarp();

    // online softmax: two lanes per row, half the columns each
    {
      const int r = r0 + lane / 2, half = lane % 2;
      const int qp = qpos[r];
      float row_max = -INFINITY;
      for (int c = half * (BK / 2); c < (half + 1) * (BK / 2); ++c) {
        const int kp = kpos[c];
        const bool visible = kp >= 0 && kp <= qp && (p.window <= 0 || int64_t(qp) - kp < p.window);
        const float s = visible ? ss[r * L::lds + c] * p.scale : -INFINITY;
        ss[r * L::lds + c] = s;
        row_max = fmaxf(row_max, s);
      }
      row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
      const float m_old = ms[r];
      const float m_new = fmaxf(m_old, row_max);
      float sum = 0.0f;
      for (int c = half * (BK / 2); c < (half + 1) * (BK / 2); ++c) {
        const float s = ss[r * L::lds + c];
        const float e = (s == -INFINITY) ? 0.0f : __expf(s - m_new);
        sum += e;
        ps[r * L::ldp + c] = __float2bfloat16(e);
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      __syncwarp();
      if (half == 0) {
        const float alpha =
            (m_new == -INFINITY || m_old == -INFINITY) ? (m_old == -INFINITY ? 0.0f : 1.0f) : __expf(m_old - m_new);
        ls[r] = ls[r] * alpha + sum;
        ms[r] = m_new;
        alphas[r] = alpha;
      }
    }
    __syncwarp();
    for (int i = lane; i < 16 * D; i += 32) {
      const int r = r0 + i / D, c = i % D;
      os[r * L::ldo + c] *= alphas[r];
    }
    __syncwarp();

    // O += P · V
    for (int n = 0; n < D / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, os + r0 * L::ldo + n * 16, L::ldo, wmma::mem_row_major);
      for (int kk = 0; kk < BK / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> b;
        wmma::load_matrix_sync(a, ps + r0 * L::ldp + kk * 16, L::ldp);
        wmma::load_matrix_sync(b, vs + (kk * 16) * L::ldv + n * 16, L::ldv);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(os + r0 * L::ldo + n * 16, acc, L::ldo, wmma::mem_row_major);
    }
    __syncthreads();
  }

  for (int i = tid; i < BQ * hd; i += n_threads) {
    const int r = i / hd, c = i % hd;
    const int tl = r / p.group;
    const int64_t token = token0 + tl;
    if (tl >= p.tokens_per_tile || token >= seq.n_rows) continue;
    const int head = kvh * p.group + r % p.group;
    const float l = ls[r];
    p.out[((seq.row_begin + token) * p.n_heads + head) * hd + c] =
        __float2bfloat16(l > 0.0f ? os[r * L::ldo + c] / l : 0.0f);
  }
}

// Decode (a few rows per sequence): flash-decoding. Blocks split each sequence's slots into
// spans, a warp per (row, query head) runs an online softmax over its span, and a second kernel
// merges the spans. Parallel over slots, so one KV head and a long context still fill the GPU.
// A KV head with a large group of query heads (Gemma 4's global layers: 16 on one) spreads its
// heads over several blocks of a span, so that a warp has one (row, head) pair, not several in turn.
//
// The grid is sized by the caches' capacities, so that a recorded step stays valid as the context
// grows; the span is sized on the device from the filled slots, so that a short context in a large
// cache still spreads over many blocks, and the blocks past the context return at once.
constexpr int kDecodeMaxRows = 4;
constexpr int kMaxDecodeDim = 512;
constexpr int kSlotUnroll = 8;  // slots whose keys and values are loaded together
constexpr int kMinSpan = 16;
constexpr int kMaxSplits = 1024;
constexpr int kCombineWarps = 8;

struct DecodeParams {
  const bf16* q;
  bf16* out;
  const int32_t* positions;
  float* partial_o;   // [rows, n_heads, splits, head_dim]
  float* partial_ml;  // [rows, n_heads, splits, 2]: running max, sum of exponentials
  int n_heads, n_kv_heads, group, head_dim;
  int splits;
  int heads_per_block;  // of a KV head's group; blockIdx.y = kv_head · ceil(group / heads_per_block) + part
  float scale;
  int64_t window;
  const bf16* gate;  // row (row · n_heads + head) of the output gate, or null
  int64_t gate_stride;
  SeqTable seqs;
};

// The filled slots of a sequence (its last row's position bounds them) and the span per block.
__device__ __forceinline__ int64_t filled_slots(const DecodeParams& p, const SeqDesc& seq) {
  return min(seq.capacity, int64_t(p.positions[seq.row_begin + seq.n_rows - 1]) + 1);
}
__device__ __forceinline__ int64_t span_for(int64_t n_slots, int splits) {
  return max(int64_t(kMinSpan), (n_slots + splits - 1) / splits);
}

__device__ __forceinline__ float dot8(const float* q, const uint4& raw) {
  const bf16* k = reinterpret_cast<const bf16*>(&raw);
  float d = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) d = fmaf(q[i], __bfloat162float(k[i]), d);
  return d;
}

template <int kChunksPerLane>  // head_dim / 256, rounded up: 16-byte chunks of q, k, v per lane
__global__ void __launch_bounds__(128) decode_attention_kernel(DecodeParams p) {
  wait_for_inputs();
  const SeqDesc& seq = p.seqs.seq[blockIdx.z];
  const int head_blocks = (p.group + p.heads_per_block - 1) / p.heads_per_block;
  const int kvh = int(blockIdx.y) / head_blocks, split = blockIdx.x;
  const int first_head = int(blockIdx.y) % head_blocks * p.heads_per_block;
  const int heads = min(p.heads_per_block, p.group - first_head);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int hd = p.head_dim, chunks = hd / 8;
  const int64_t n_slots = filled_slots(p, seq);
  const int64_t span = span_for(n_slots, p.splits);
  const int64_t j0 = int64_t(split) * span;
  if (j0 >= n_slots) return;
  const int64_t j1 = min(n_slots, j0 + span);
  const uint4 zero = make_uint4(0, 0, 0, 0);
  const int pairs = int(seq.n_rows) * heads;
  for (int pair = warp; pair < pairs; pair += warps) {
    const int r = pair / heads, head = kvh * p.group + first_head + pair % heads;
    const int64_t row = seq.row_begin + r;
    const int qp = p.positions[row];
    float q[kChunksPerLane][8], o[kChunksPerLane][8];
#pragma unroll
    for (int c = 0; c < kChunksPerLane; ++c) {
      const int chunk = lane + 32 * c;
#pragma unroll
      for (int i = 0; i < 8; ++i) o[c][i] = q[c][i] = 0.0f;
      if (chunk < chunks) {
        const uint4 raw = *reinterpret_cast<const uint4*>(p.q + (row * p.n_heads + head) * hd + chunk * 8);
        const bf16* v = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
        for (int i = 0; i < 8; ++i) q[c][i] = __bfloat162float(v[i]) * p.scale;
      }
    }
    float m = -INFINITY, l = 0.0f;
    for (int64_t j = j0; j < j1; j += kSlotUnroll) {
      // every key and value of the group in flight at once
      uint4 kr[kSlotUnroll][kChunksPerLane], vr[kSlotUnroll][kChunksPerLane];
      int kp[kSlotUnroll];
#pragma unroll
      for (int u = 0; u < kSlotUnroll; ++u) {
        const int64_t slot = j + u;
        const bool in_span = slot < j1;
        kp[u] = in_span ? seq.slot_pos[slot] : -1;
#pragma unroll
        for (int c = 0; c < kChunksPerLane; ++c) {
          const int chunk = lane + 32 * c;
          const bool load = in_span && chunk < chunks;
          const int64_t at = (slot * p.n_kv_heads + kvh) * hd + chunk * 8;
          kr[u][c] = load ? *reinterpret_cast<const uint4*>(seq.k + at) : zero;
          vr[u][c] = load ? *reinterpret_cast<const uint4*>(seq.v + at) : zero;
        }
      }
      float s[kSlotUnroll];
#pragma unroll
      for (int u = 0; u < kSlotUnroll; ++u) {
        float d = 0.0f;
#pragma unroll
        for (int c = 0; c < kChunksPerLane; ++c) d += dot8(q[c], kr[u][c]);
        s[u] = d;
      }
#pragma unroll
      for (int u = 0; u < kSlotUnroll; ++u) s[u] = warp_sum(s[u]);
      float m_new = m;
#pragma unroll
      for (int u = 0; u < kSlotUnroll; ++u) {
        const bool visible = kp[u] >= 0 && kp[u] <= qp && (p.window <= 0 || int64_t(qp) - kp[u] < p.window);
        if (!visible) s[u] = -INFINITY;
        m_new = fmaxf(m_new, s[u]);
      }
      if (m_new == -INFINITY) continue;  // nothing visible in this group
      const float alpha = __expf(m - m_new);
      l *= alpha;
#pragma unroll
      for (int c = 0; c < kChunksPerLane; ++c)
#pragma unroll
        for (int i = 0; i < 8; ++i) o[c][i] *= alpha;
#pragma unroll
      for (int u = 0; u < kSlotUnroll; ++u) {
        const float e = s[u] == -INFINITY ? 0.0f : __expf(s[u] - m_new);
        l += e;
#pragma unroll
        for (int c = 0; c < kChunksPerLane; ++c) {
          const bf16* vv = reinterpret_cast<const bf16*>(&vr[u][c]);
#pragma unroll
          for (int i = 0; i < 8; ++i) o[c][i] = fmaf(e, __bfloat162float(vv[i]), o[c][i]);
        }
      }
      m = m_new;
    }
    const int64_t part = (row * p.n_heads + head) * p.splits + split;
    if (lane == 0) {
      p.partial_ml[part * 2] = m;
      p.partial_ml[part * 2 + 1] = l;
    }
    float* out = p.partial_o + part * hd;
#pragma unroll
    for (int c = 0; c < kChunksPerLane; ++c) {
      const int chunk = lane + 32 * c;
      if (chunk >= chunks) continue;
      reinterpret_cast<float4*>(out + chunk * 8)[0] = make_float4(o[c][0], o[c][1], o[c][2], o[c][3]);
      reinterpret_cast<float4*>(out + chunk * 8)[1] = make_float4(o[c][4], o[c][5], o[c][6], o[c][7]);
    }
  }
}

__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float total = -INFINITY;
  for (int w = 0; w < int(blockDim.x + 31) / 32; ++w) total = fmaxf(total, partial[w]);
  return total;
}

// out[row, head] = Σ_span e^{m_s − m} o_s / Σ_span e^{m_s − m} l_s over the spans that hold slots:
// the spans' weights first, then each warp sums a share of the spans for every dimension.
__global__ void __launch_bounds__(kCombineWarps * 32) decode_combine_kernel(DecodeParams p, int64_t row_begin) {
  wait_for_inputs();
  __shared__ float weight[kMaxSplits];
  __shared__ float4 sums[kCombineWarps][kMaxDecodeDim / 4];
  const int64_t row = row_begin + blockIdx.x;
  const int head = blockIdx.y, hd = p.head_dim;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const SeqDesc& seq = p.seqs.seq[find_seq(p.seqs, row)];
  const int64_t n_slots = filled_slots(p, seq);
  const int spans = int((n_slots + span_for(n_slots, p.splits) - 1) / span_for(n_slots, p.splits));
  const int64_t base = (row * p.n_heads + head) * p.splits;
  float m = -INFINITY;
  for (int s = threadIdx.x; s < spans; s += blockDim.x) m = fmaxf(m, p.partial_ml[(base + s) * 2]);
  m = block_max(m);
  float l = 0.0f;
  for (int s = threadIdx.x; s < spans; s += blockDim.x) {
    const float ms = p.partial_ml[(base + s) * 2];
    const float w = ms == -INFINITY ? 0.0f : __expf(ms - m);
    weight[s] = w;
    l += w * p.partial_ml[(base + s) * 2 + 1];
  }
  l = block_sum(l);  // its barrier also publishes weight[]
  for (int d4 = lane; d4 < hd / 4; d4 += 32) {
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s = warp; s < spans; s += kCombineWarps) {
      const float w = weight[s];
      if (w == 0.0f) continue;
      const float4 v = reinterpret_cast<const float4*>(p.partial_o + (base + s) * hd)[d4];
      acc.x = fmaf(w, v.x, acc.x);
      acc.y = fmaf(w, v.y, acc.y);
      acc.z = fmaf(w, v.z, acc.z);
      acc.w = fmaf(w, v.w, acc.w);
    }
    sums[warp][d4] = acc;
  }
  __syncthreads();
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  const bf16* gate = p.gate ? p.gate + (row * p.n_heads + head) * p.gate_stride : nullptr;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float total = 0.0f;
    for (int w = 0; w < kCombineWarps; ++w) total += reinterpret_cast<const float*>(sums[w])[d];
    bf16 o = __float2bfloat16(total * inv);
    if (gate) o = __float2bfloat16(__bfloat162float(o) * sigmoid(__bfloat162float(gate[d])));  // as sigmoid_mul
    p.out[(row * p.n_heads + head) * hd + d] = o;
  }
}

template <int D, int BQ, int BK>
void launch_attention(const AttnParams& params, cudaStream_t stream) {
  using L = AttnSmem<D, BQ, BK>;
  static std::once_flag configured;
  std::call_once(configured, [] {
    cudaFuncSetAttribute(attention_kernel<D, BQ, BK>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(L::bytes));
  });
  launch(attention_kernel<D, BQ, BK>, params.total_tiles, BQ / 16 * 32, L::bytes, stream, params);
}

// Tiles of 64 query rows where shared memory allows (Hopper), else 32. The launch's tokens per
// tile follow from rows_per_tile, so it and dispatch_tile must take the same decision.
template <int D>
bool wide_tiles() {
  return D <= 256 && AttnSmem<D, 64, 64>::bytes <= max_shared_memory();
}

template <int D>
void dispatch_tile(AttnParams params, cudaStream_t stream) {
  if (wide_tiles<D>()) {
    launch_attention<D, 64, 64>(params, stream);
  } else {
    launch_attention<D, 32, 32>(params, stream);
  }
}

int rows_per_tile(int head_dim) {
  if (head_dim <= 32) return wide_tiles<32>() ? 64 : 32;
  if (head_dim <= 64) return wide_tiles<64>() ? 64 : 32;
  if (head_dim <= 128) return wide_tiles<128>() ? 64 : 32;
  if (head_dim <= 256) return wide_tiles<256>() ? 64 : 32;
  return 32;
}

}  // namespace

bool attention_supported(int head_dim, int group) {
  if (head_dim < 8 || head_dim % 8 != 0 || head_dim > kMaxDecodeDim) return false;  // 16-byte K/V loads
  if (flash_prefill_fits(head_dim, group)) return true;
  // the tiled kernel: its shared memory, and all of a KV head's query heads in one tile
  const bool fits = head_dim <= 256 || AttnSmem<512, 32, 32>::bytes <= max_shared_memory();
  return fits && group <= rows_per_tile(head_dim);
}

void rope(const RopeArgs& args, cudaStream_t stream) {
  const int64_t rows = args.x.rows(), tokens = args.positions.numel();
  if (rows == 0) return;
  const int heads = int(rows / tokens);
  const float* norm_w = args.norm_weight.defined() ? args.norm_weight.data_as<float>() : nullptr;
  const Tensor& in = args.input.defined() ? args.input : args.x;
  if (args.normalize && args.x.cols() <= kNormRopeMaxDim) {
    dispatch_float(args.x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      launch(norm_rope_kernel<T>, ceil_div(rows, kNormRopeWarps), kNormRopeWarps * 32, 0, stream, rows_of<T>(args.x),
             rows_of<const T>(in), args.positions.data_as<int32_t>(),
             args.inv_freq.numel() ? args.inv_freq.data_as<float>() : nullptr, heads, int(args.inv_freq.numel()),
             args.pair_offset, rows, int(args.x.cols()), norm_w, args.norm_eps, args.norm_offset);
    });
    return;
  }
  if (args.normalize) {
    Tensor x = args.x;
    rms_norm(in, args.norm_weight, args.norm_eps, args.norm_offset, x, stream);
  }
  if (args.inv_freq.numel() == 0) return;
  dispatch_float(args.x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch(rope_kernel<T>, int(rows), 64, 0, stream, rows_of<T>(args.x), args.positions.data_as<int32_t>(),
           args.inv_freq.data_as<float>(), heads, int(args.inv_freq.numel()), args.pair_offset, rows);
  });
}

void kv_write(const KvWriteArgs& args, cudaStream_t stream) {
  assert(args.k.dtype() == DType::bf16 && args.k.contiguous() && args.v.contiguous());
  const int64_t row_elems = args.caches.empty() ? 0 : args.caches[0].k.numel() / args.caches[0].capacity;
  for (size_t begin = 0; begin < args.seqs.size(); begin += kMaxSeqs) {
    const SeqTable table = make_table(args.seqs, args.caches, begin);
    const int64_t first = table.seq[0].row_begin;
    const int64_t last = table.seq[table.n - 1].row_begin + table.seq[table.n - 1].n_rows;
    launch(kv_write_kernel, int(last - first), 64, 0, stream, table, args.k.data_as<bf16>(), args.v.data_as<bf16>(),
           args.positions.data_as<int32_t>(), row_elems, first);
  }
}

bool attention_inputs(const AttentionInputsArgs& args, cudaStream_t stream) {
  const RopeArgs &q = args.q, &k = args.k;
  const int64_t tokens = q.positions.numel(), head_dim = q.x.cols();
  if (tokens == 0 || !q.normalize || !k.normalize || head_dim > kNormRopeMaxDim || k.x.cols() != head_dim ||
      args.v.cols() != head_dim || args.kv.seqs.empty() || args.kv.seqs.size() > size_t(kMaxSeqs) ||
      q.inv_freq.numel() != k.inv_freq.numel() || q.pair_offset != k.pair_offset)
    return false;
  for (const Tensor* t : {&q.x, &k.x, &args.v, &q.input, &k.input, &args.v_input})
    if (t->defined() && t->dtype() != DType::bf16) return false;
  const int64_t q_heads = q.x.numel() / (tokens * head_dim), kv_heads = k.x.numel() / (tokens * head_dim);
  const int64_t row_elems = args.kv.caches[0].k.numel() / args.kv.caches[0].capacity;
  if (row_elems != kv_heads * head_dim || args.v.numel() != k.x.numel() || !k.x.contiguous() || !args.v.contiguous())
    return false;
  auto head_rows = [&](const RopeArgs& r) {
    return HeadRows{rows_of<bf16>(r.x),
                    rows_of<const bf16>(r.input.defined() ? r.input : r.x),
                    r.norm_weight.defined() ? r.norm_weight.data_as<float>() : nullptr,
                    r.norm_eps,
                    r.norm_offset,
                    r.inv_freq.numel() ? r.inv_freq.data_as<float>() : nullptr,
                    int(r.inv_freq.numel()),
                    r.pair_offset};
  };
  const Tensor& v_in = args.v_input.defined() ? args.v_input : args.v;
  const SeqTable table = make_table(args.kv.seqs, args.kv.caches, 0);
  const int64_t units = tokens * (q_heads + kv_heads);
  launch(attention_inputs_kernel, ceil_div(units, kNormRopeWarps), kNormRopeWarps * 32, 0, stream, head_rows(q),
         head_rows(k), rows_of<bf16>(args.v), rows_of<const bf16>(v_in), args.v_input.defined(), args.v_norm_eps, table,
         q.positions.data_as<int32_t>(), int(q_heads), int(kv_heads), int(head_dim), tokens);
  return true;
}

namespace {

void decode_attention(const AttentionArgs& args, const Allocate& allocate, cudaStream_t stream) {
  DecodeParams p{};
  p.q = args.q.data_as<bf16>();
  p.out = args.out.data_as<bf16>();
  p.positions = args.positions.data_as<int32_t>();
  p.n_heads = args.n_heads;
  p.n_kv_heads = args.n_kv_heads;
  p.group = args.n_heads / args.n_kv_heads;
  p.head_dim = args.head_dim;
  p.scale = args.scale;
  p.window = args.window;
  p.gate = args.output_gate.defined() ? args.output_gate.data_as<bf16>() : nullptr;
  p.gate_stride = args.output_gate.defined() ? args.output_gate.row_stride() : 0;
  int64_t capacity = 1, rows = 0, most_rows = 1;
  for (size_t i = 0; i < args.seqs.size(); ++i) {
    capacity = std::max(capacity, args.caches[i].capacity);
    rows = std::max(rows, args.seqs[i].row_begin + args.seqs[i].n_rows);
    most_rows = std::max(most_rows, args.seqs[i].n_rows);
  }
  // as many blocks as spans of the smallest length fit the largest cache, at most kMaxSplits
  p.splits = int(std::min<int64_t>(kMaxSplits, ceil_div(capacity, kMinSpan)));
  Tensor partial = allocate(DType::f32, Shape{rows, args.n_heads, p.splits, args.head_dim + 2});
  p.partial_o = partial.data_as<float>();
  p.partial_ml = p.partial_o + rows * args.n_heads * p.splits * args.head_dim;
  // a warp per (row, query head) of a KV head: no more warps than that, and the group's heads over
  // as many blocks as give each warp one pair
  const int warps = int(std::min<int64_t>(4, most_rows * p.group));
  const int head_blocks = int(std::min<int64_t>(p.group, ceil_div(most_rows * p.group, warps)));
  p.heads_per_block = ceil_div(p.group, head_blocks);
#if KILN_CUDA_TIMELINE
  // developer builds: a KV head's query heads per block forced from the environment, for measuring
  if (const char* forced = std::getenv("KILN_DECODE_HEADS_PER_BLOCK"))
    p.heads_per_block = std::max(1, std::min(p.group, std::atoi(forced)));
#endif
  const int64_t blocks_y = int64_t(p.n_kv_heads) * ceil_div(p.group, p.heads_per_block);
  for (size_t begin = 0; begin < args.seqs.size(); begin += kMaxSeqs) {
    p.seqs = make_table(args.seqs, args.caches, begin);
    const dim3 grid(unsigned(p.splits), unsigned(blocks_y), unsigned(p.seqs.n));
    if (args.head_dim <= 256)
      launch(decode_attention_kernel<1>, grid, warps * 32, 0, stream, p);
    else
      launch(decode_attention_kernel<2>, grid, warps * 32, 0, stream, p);
    const int64_t first = p.seqs.seq[0].row_begin;
    const int64_t last = p.seqs.seq[p.seqs.n - 1].row_begin + p.seqs.seq[p.seqs.n - 1].n_rows;
    launch(decode_combine_kernel, dim3(unsigned(last - first), unsigned(p.n_heads)), kCombineWarps * 32, 0, stream, p,
           first);
  }
}

}  // namespace

void attention(const AttentionArgs& args, const Allocate& allocate, cudaStream_t stream) {
  assert(args.q.dtype() == DType::bf16 && args.q.contiguous());
  bool decode = args.head_dim % 8 == 0 && args.head_dim <= kMaxDecodeDim;
  for (const SeqRows& s : args.seqs) decode = decode && s.n_rows <= kDecodeMaxRows;
  if (decode && (!args.output_gate.defined() || args.output_gate.dtype() == DType::bf16)) {
    decode_attention(args, allocate, stream);  // the gate applied by the merge
    return;
  }
  const int group = args.n_heads / args.n_kv_heads;
  const bool flash = flash_prefill_fits(args.head_dim, group);
  const int bq = flash ? kFlashRows : rows_per_tile(args.head_dim);
  AttnParams params{};
  params.q = args.q.data_as<bf16>();
  params.positions = args.positions.data_as<int32_t>();
  params.out = args.out.data_as<bf16>();
  params.n_heads = args.n_heads;
  params.n_kv_heads = args.n_kv_heads;
  params.group = group;
  params.head_dim = args.head_dim;
  params.tokens_per_tile = std::max(1, bq / group);
  params.scale = args.scale;
  params.window = args.window;
  for (size_t begin = 0; begin < args.seqs.size(); begin += kMaxSeqs) {
    params.seqs = make_table(args.seqs, args.caches, begin);
    int tiles = 0;
    for (int i = 0; i < params.seqs.n; ++i) {
      params.seqs.seq[i].tile_begin = tiles;
      tiles += ceil_div(params.seqs.seq[i].n_rows, params.tokens_per_tile) * args.n_kv_heads;
    }
    params.total_tiles = tiles;
    if (tiles == 0) continue;
    if (flash) {
      flash_prefill(params, stream);
      continue;
    }
    switch (args.head_dim <= 32    ? 32
            : args.head_dim <= 64  ? 64
            : args.head_dim <= 128 ? 128
            : args.head_dim <= 256 ? 256
                                   : 512) {
      case 32:
        dispatch_tile<32>(params, stream);
        break;
      case 64:
        dispatch_tile<64>(params, stream);
        break;
      case 128:
        dispatch_tile<128>(params, stream);
        break;
      case 256:
        dispatch_tile<256>(params, stream);
        break;
      default:
        dispatch_tile<512>(params, stream);
        break;
    }
  }
  if (args.output_gate.defined()) {
    Tensor heads = args.out.reshape(Shape{args.out.numel() / args.head_dim, args.head_dim});
    sigmoid_mul(heads, args.output_gate, heads, stream);
  }
}

}  // namespace kiln::cuda
