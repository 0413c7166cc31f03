// CUDA backend: RoPE, the KV-cache ring, and attention over it.
//
// Prefill runs the flash-attention kernel of cuda_flash_prefill.cu for the head dims it is built
// for, and otherwise the general tiled kernel here: a block takes a tile of query
// rows that share a KV head (tokens × the query heads of that group) and streams the sequence's
// cache through shared memory in tiles of BK slots, with scores and P·V on tensor cores (WMMA, bf16
// in, f32 accumulate) and an online softmax in f32. Decode (a few rows per sequence) splits the
// slots over blocks instead (cuda_decode_attention.cu). Masks follow each slot's stored position, so sliding-window
// rings and KV sharing need no special case. Kernel arguments never hold positions (those are read from device memory),
// so a decode step can be captured once and replayed.
#include <mma.h>

#include <cassert>
#include <climits>
#include <mutex>

#include "backend/cuda/cuda_attention.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.cuh"

namespace kiln::cuda {

SeqTable make_table(const std::vector<SeqRows>& seqs, const std::vector<KvCacheView>& caches, size_t begin) {
  SeqTable table{};
  table.n = int(std::min<size_t>(kMaxSeqs, seqs.size() - begin));
  const bool quantized = !caches.empty() && caches[0].k.quantized();
  table.format = quantized ? KvFormat{caches[0].k.quant().bits, caches[0].k.quant().group_size} : KvFormat{0, 0};
  auto half_ptr = [](const Tensor& t) { return t.defined() ? t.data_as<__half>() : nullptr; };
  for (int i = 0; i < table.n; ++i) {
    const SeqRows& s = seqs[begin + size_t(i)];
    const KvCacheView& c = caches[begin + size_t(i)];
    assert(c.k.quantized() == quantized);
    table.seq[i] = SeqDesc{s.row_begin,
                           s.n_rows,
                           c.k.data_as<bf16>(),
                           c.v.data_as<bf16>(),
                           c.slot_pos.data_as<int32_t>(),
                           c.capacity,
                           0,
                           quantized ? half_ptr(c.k.quant().scales) : nullptr,
                           quantized ? half_ptr(c.k.quant().biases) : nullptr,
                           quantized ? half_ptr(c.v.quant().scales) : nullptr,
                           quantized ? half_ptr(c.v.quant().biases) : nullptr};
  }
  return table;
}

namespace {

// Where a token's pairs read their positions: positions[t] for all of them, or, with pair_axis
// (multimodal RoPE), pair i reads positions[pair_axis[i] · tokens + t].
struct RopePositions {
  const int32_t* positions;
  const int32_t* pair_axis;  // null: one axis
  int64_t tokens;

  // The position pair i of token t turns by.
  __device__ __forceinline__ float at(int64_t t, int i) const {
    return float(pair_axis ? positions[int64_t(pair_axis[i]) * tokens + t] : positions[t]);
  }
};

RopePositions rope_positions(const RopeArgs& args) {
  const bool axes = args.pair_axis.defined();
  return RopePositions{args.positions.data_as<int32_t>(), axes ? args.pair_axis.data_as<int32_t>() : nullptr,
                       axes ? args.positions.cols() : args.positions.numel()};
}

template <typename T>
__global__ void rope_kernel(Rows<T> x, RopePositions positions, const float* inv_freq, int heads, int n_pairs,
                            int offset, int64_t rows) {
  wait_for_inputs();
  const int64_t r = blockIdx.x;
  if (r >= rows) return;
  const int64_t token = r / heads;
  T* p = x.row(r);
  for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) {
    float s, c;
    sincosf(positions.at(token, i) * inv_freq[i], &s, &c);  // the angle in f32, as the reference forms it
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
// given), rotated at token `token`'s positions, stored to dst. A warp's lanes take its columns.
template <typename T, typename S>
__device__ __forceinline__ void norm_rope_row(const S* src, T* dst, float* row, int lane, int head_dim,
                                              const float* weight, float eps, float weight_offset,
                                              const RopePositions& pos, int64_t token, const float* inv_freq,
                                              int n_pairs, int offset) {
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
      sincosf(pos.at(token, c) * inv_freq[c], &s, &co);
      v = row[c] * co - row[c + offset] * s;
    } else if (c >= offset && c < offset + n_pairs) {
      float s, co;
      sincosf(pos.at(token, c - offset) * inv_freq[c - offset], &s, &co);
      v = row[c] * co + row[c - offset] * s;
    }
    dst[c] = from_float<T>(v);
  }
}

template <typename T>
__global__ void norm_rope_kernel(Rows<T> x, Rows<const T> in, RopePositions positions, const float* inv_freq, int heads,
                                 int n_pairs, int offset, int64_t rows, int head_dim, const float* weight, float eps,
                                 float weight_offset) {
  wait_for_inputs();
  __shared__ float staged[kNormRopeWarps][kNormRopeMaxDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = int64_t(blockIdx.x) * kNormRopeWarps + warp;
  if (r >= rows) return;
  norm_rope_row(in.row(r), x.row(r), staged[warp], lane, head_dim, weight, eps, weight_offset, positions, r / heads,
                inv_freq, n_pairs, offset);
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
  RopePositions positions;
};

// `positions`: each token's position in its sequence (its cache slot); the rotations read theirs
// from q.positions and k.positions, which may have several axes.
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
                  q.positions, unit / q_heads, q.inv_freq, q.n_pairs, q.offset);
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
                k.positions, token, k.inv_freq, k.n_pairs, k.offset);
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

// One head vector of one token quantized into a cache, as quant::quantize_row does on the CPU (mlx's
// GPU quantizer: the range [min, max(0, max)], the larger-magnitude extreme kept exact as the bias,
// halves rounded away from zero; codes from the unrounded scale and bias, which are stored as f16).
// A warp per vector: lane l holds elements [l·E, (l + 1)·E), so a group spans group / E lanes.
template <int E>
__device__ __forceinline__ void quantize_head(const bf16* src, bf16* codes_base, __half* scales, __half* biases,
                                              KvFormat f, int64_t head_row, int head_dim, int lane) {
  float x[E];
#pragma unroll
  for (int i = 0; i < E; ++i) x[i] = __bfloat162float(src[lane * E + i]);
  float lo = x[0], hi = 0.0f;
#pragma unroll
  for (int i = 0; i < E; ++i) {
    lo = fminf(lo, x[i]);
    hi = fmaxf(hi, x[i]);
  }
  const int lanes_per_group = f.group / E;  // a power of two, 2 to 32
  for (int offset = 1; offset < lanes_per_group; offset <<= 1) {
    lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, offset));
    hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, offset));
  }
  const float n_bins = float((1 << f.bits) - 1);
  const bool low_side = fabsf(lo) > fabsf(hi);
  float scale = fmaxf(__fdiv_rn(hi - lo, n_bins), 1e-7f);
  scale = low_side ? scale : -scale;
  const float edge = low_side ? lo : hi;
  const float q0 = roundf(__fdiv_rn(edge, scale));
  float bias = 0.0f;
  if (q0 != 0.0f) {
    scale = __fdiv_rn(edge, q0);
    bias = edge;
  }
  unsigned code[E];
#pragma unroll
  for (int i = 0; i < E; ++i) code[i] = unsigned(fminf(fmaxf(roundf(__fdiv_rn(x[i] - bias, scale)), 0.0f), n_bins));
  auto* out = reinterpret_cast<unsigned char*>(codes_base);
  const int64_t first = head_row * head_dim + int64_t(lane) * E;  // element index of this lane's first
  if (f.bits == 8) {
#pragma unroll
    for (int i = 0; i < E; ++i) out[first + i] = static_cast<unsigned char>(code[i]);
  } else if constexpr (E >= 2) {
#pragma unroll
    for (int i = 0; i < E; i += 2) out[(first + i) / 2] = static_cast<unsigned char>(code[i] | (code[i + 1] << 4));
  } else {  // one element a lane: even lanes take their neighbour's code into the high nibble
    const unsigned next = __shfl_down_sync(0xffffffffu, code[0], 1);
    if (lane % 2 == 0) out[first / 2] = static_cast<unsigned char>(code[0] | (next << 4));
  }
  if (lane % lanes_per_group == 0) {
    const int64_t g = head_row * (head_dim / f.group) + int64_t(lane) * E / f.group;
    scales[g] = __float2half_rn(scale);
    biases[g] = __float2half_rn(bias);
  }
}

// kv_write into quantized caches: a warp per (row, KV head).
template <int E>
__global__ void kv_write_quantized_kernel(SeqTable table, const bf16* k, const bf16* v, const int32_t* positions,
                                          int kv_heads, int head_dim, int64_t first_row, int64_t units) {
  wait_for_inputs();
  const int64_t unit = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (unit >= units) return;  // whole warps
  const int lane = threadIdx.x % 32;
  const int64_t row = first_row + unit / kv_heads;
  const int kvh = int(unit % kv_heads);
  const SeqDesc& s = table.seq[find_seq(table, row)];
  if (row < s.row_begin || row >= s.row_begin + s.n_rows) return;
  const int64_t pos = positions[row];
  const int64_t slot = pos % s.capacity;
  const int64_t head_row = slot * kv_heads + kvh;
  const int64_t src = (row * kv_heads + kvh) * head_dim;
  quantize_head<E>(k + src, s.k, s.k_scale, s.k_bias, table.format, head_row, head_dim, lane);
  quantize_head<E>(v + src, s.v, s.v_scale, s.v_bias, table.format, head_row, head_dim, lane);
  if (kvh == 0 && lane == 0) s.slot_pos[slot] = int32_t(pos);
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
  static constexpr size_t qfirst = align(qpos + size_t(BQ) * 4);  // the rows' bidirectional blocks
  static constexpr size_t qlast = align(qfirst + size_t(BQ) * 4);
  static constexpr size_t kpos = align(qlast + size_t(BQ) * 4);
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
  int* qfirst = reinterpret_cast<int*>(smem + L::qfirst);
  int* qlast = reinterpret_cast<int*>(smem + L::qlast);
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
    const bool valid = tl < p.tokens_per_tile && token < seq.n_rows;
    qpos[r] = valid ? p.positions[seq.row_begin + token] : -1;
    qfirst[r] = valid && p.blocks ? p.blocks[2 * (seq.row_begin + token)] : 1;
    qlast[r] = valid && p.blocks ? p.blocks[2 * (seq.row_begin + token) + 1] : 0;
    ms[r] = -INFINITY;
    ls[r] = 0.0f;
  }
  for (int i = tid; i < BQ * L::ldo; i += n_threads) os[i] = 0.0f;
  if (tid == 0) {
    // keys beyond the newest query's position (or its block's end) are still empty or in the future
    const int64_t end = min(seq.n_rows, token0 + p.tokens_per_tile);
    int64_t newest = p.positions[seq.row_begin + end - 1];
    for (int64_t t = token0; p.blocks && t < end; ++t) {
      const int first = p.blocks[2 * (seq.row_begin + t)], last = p.blocks[2 * (seq.row_begin + t) + 1];
      if (last >= first) newest = max(newest, int64_t(last));
    }
    *n_slots_shared = min(seq.capacity, newest + 1);
  }
  __syncthreads();
  const int64_t n_slots = *n_slots_shared;

  for (int64_t kt = 0; kt < n_slots; kt += BK) {
    for (int i = tid; i < BK * kChunks; i += n_threads) {
      const int j = i / kChunks, c8 = (i % kChunks) * 8;
      const int64_t slot = kt + j;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (slot < n_slots && c8 < hd) {
        const int64_t head_row = slot * p.n_kv_heads + kvh;
        kv = load_kv8(seq.k, seq.k_scale, seq.k_bias, p.seqs.format, head_row, hd, c8);
        vv = load_kv8(seq.v, seq.v_scale, seq.v_bias, p.seqs.format, head_row, hd, c8);
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
        const bool visible = key_visible(kp, qp, qfirst[r], qlast[r], p.window, p.block_window);
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
  const RopePositions positions = rope_positions(args);
  const int64_t rows = args.x.rows(), tokens = positions.tokens;
  if (rows == 0) return;
  const int heads = int(rows / tokens);
  const float* norm_w = args.norm_weight.defined() ? args.norm_weight.data_as<float>() : nullptr;
  const Tensor& in = args.input.defined() ? args.input : args.x;
  if (args.normalize && args.x.cols() <= kNormRopeMaxDim) {
    dispatch_float(args.x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      launch(norm_rope_kernel<T>, ceil_div(rows, kNormRopeWarps), kNormRopeWarps * 32, 0, stream, rows_of<T>(args.x),
             rows_of<const T>(in), positions, args.inv_freq.numel() ? args.inv_freq.data_as<float>() : nullptr, heads,
             int(args.inv_freq.numel()), args.pair_offset, rows, int(args.x.cols()), norm_w, args.norm_eps,
             args.norm_offset);
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
    launch(rope_kernel<T>, int(rows), 64, 0, stream, rows_of<T>(args.x), positions, args.inv_freq.data_as<float>(),
           heads, int(args.inv_freq.numel()), args.pair_offset, rows);
  });
}

void kv_write(const KvWriteArgs& args, cudaStream_t stream) {
  assert(args.k.dtype() == DType::bf16 && args.k.contiguous() && args.v.contiguous());
  const int64_t row_elems = args.caches.empty() ? 0 : args.caches[0].k.numel() / args.caches[0].capacity;
  for (size_t begin = 0; begin < args.seqs.size(); begin += kMaxSeqs) {
    const SeqTable table = make_table(args.seqs, args.caches, begin);
    const int64_t first = table.seq[0].row_begin;
    const int64_t last = table.seq[table.n - 1].row_begin + table.seq[table.n - 1].n_rows;
    if (table.format.bits) {
      const int kv_heads = int(args.caches[0].k.dim(1)), head_dim = int(args.caches[0].k.dim(2));
      const int64_t units = (last - first) * kv_heads;
      constexpr int kWarps = 4;
      auto go = [&](auto kernel) {
        launch(kernel, ceil_div(units, kWarps), kWarps * 32, 0, stream, table, args.k.data_as<bf16>(),
               args.v.data_as<bf16>(), args.positions.data_as<int32_t>(), kv_heads, head_dim, first, units);
      };
      switch (head_dim / 32) {  // check_kv_quant: a group of 32, 64 or 128 divides the head
        case 1:
          go(kv_write_quantized_kernel<1>);
          break;
        case 2:
          go(kv_write_quantized_kernel<2>);
          break;
        case 4:
          go(kv_write_quantized_kernel<4>);
          break;
        case 8:
          go(kv_write_quantized_kernel<8>);
          break;
        default:
          assert(head_dim == 512);
          go(kv_write_quantized_kernel<16>);
          break;
      }
      continue;
    }
    launch(kv_write_kernel, int(last - first), 64, 0, stream, table, args.k.data_as<bf16>(), args.v.data_as<bf16>(),
           args.positions.data_as<int32_t>(), row_elems, first);
  }
}

bool attention_inputs(const AttentionInputsArgs& args, cudaStream_t stream) {
  const RopeArgs &q = args.q, &k = args.k;
  const int64_t tokens = args.kv.positions.numel(), head_dim = q.x.cols();
  if (args.kv.caches.empty() || args.kv.caches[0].k.quantized()) return false;  // kv_write quantizes
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
                    r.pair_offset,
                    rope_positions(r)};
  };
  const Tensor& v_in = args.v_input.defined() ? args.v_input : args.v;
  const SeqTable table = make_table(args.kv.seqs, args.kv.caches, 0);
  const int64_t units = tokens * (q_heads + kv_heads);
  launch(attention_inputs_kernel, ceil_div(units, kNormRopeWarps), kNormRopeWarps * 32, 0, stream, head_rows(q),
         head_rows(k), rows_of<bf16>(args.v), rows_of<const bf16>(v_in), args.v_input.defined(), args.v_norm_eps, table,
         args.kv.positions.data_as<int32_t>(), int(q_heads), int(kv_heads), int(head_dim), tokens);
  return true;
}

void attention(const AttentionArgs& args, const Allocate& allocate, cudaStream_t stream) {
  assert(args.q.dtype() == DType::bf16 && args.q.contiguous());
  if (decode_attention_takes(args)) {
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
  params.blocks = args.blocks.defined() ? args.blocks.data_as<int32_t>() : nullptr;
  params.block_window = args.block_window;
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
