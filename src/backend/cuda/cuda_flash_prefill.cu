// CUDA backend: the flash-attention prefill kernel (see cuda_attention.cu for the general tiled
// kernel and decode).
#include <cassert>
#include <climits>
#include <mutex>

#include "backend/cuda/cuda_attention.cuh"
#include "backend/cuda/cuda_common.cuh"

namespace kiln::cuda {

namespace {

// Prefill: flash attention with the state in registers. A warp owns 16 query rows and a slice of
// the head dimension: it forms the rows' scores against a tile of BK slots over the whole head
// (m16n8k16 MMAs, operands through ldmatrix from shared memory), runs the online softmax on the
// score fragments, and multiplies the probabilities, converted to bf16 in place (an accumulator
// fragment of S is laid out as an A fragment of P), with its slice of V. Four row groups of 16 make
// a block of 64 rows; head dims above 256 give each row group two warps, each with half of O, so
// that O stays at 128 registers per lane (the two recompute the same scores: cheaper than a
// reduction through shared memory). K, V and slot positions are double-buffered with cp.async, and
// a block loads only the slot tiles that some slot of which is visible to one of its rows.
constexpr int kFlashRowGroups = 4;
static_assert(kFlashRows == kFlashRowGroups * 16);
constexpr int kFlashTileWords = 64;  // bitmap of needed slot tiles; tiles beyond it are all loaded
constexpr int kFlashMaxTiles = kFlashTileWords * 32;

template <int D>
struct FlashConfig {
  static constexpr int slices = D > 256 ? 2 : 1;  // warps per row group, each with D / slices of O
  static constexpr int dslice = D / slices;
  static constexpr int bk = D >= 256 ? 32 : 64;  // slots per tile: the score fragments stay small
  static constexpr int warps = kFlashRowGroups * slices;
  static constexpr int min_blocks = D > 256 ? 1 : 2;
  static constexpr int ld = D + 8;  // padded rows: ldmatrix's eight row addresses hit distinct banks
  static constexpr size_t q = 0;
  static constexpr size_t k = q + size_t(kFlashRows) * ld * 2;
  static constexpr size_t v = k + 2 * size_t(bk) * ld * 2;
  static constexpr size_t kpos = v + 2 * size_t(bk) * ld * 2;
  static constexpr size_t tiles = kpos + 2 * size_t(bk) * 4;
  static constexpr size_t range = tiles + size_t(kFlashTileWords) * 4;
  static constexpr size_t bytes = range + 16;
};

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // lo in the low half: the lower column
  return *reinterpret_cast<const unsigned*>(&v);
}

// The first tile at or after t that the block needs, or n_tiles.
__device__ __forceinline__ int next_tile(const unsigned* needed, int t, int n_tiles) {
  while (t < n_tiles && t < kFlashMaxTiles) {
    const unsigned bits = needed[t / 32] >> (t % 32);
    if (bits) return t + __ffs(int(bits)) - 1;
    t = (t / 32 + 1) * 32;
  }
  return min(t, n_tiles);
}

template <int D>
__global__ void __launch_bounds__(FlashConfig<D>::warps * 32, FlashConfig<D>::min_blocks)
    flash_prefill_kernel(AttnParams p) {
  using C = FlashConfig<D>;
  constexpr int BK = C::bk, LD = C::ld, kThreads = C::warps * 32, kChunks = D / 8;
  wait_for_inputs();
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem + C::q);
  bf16* ks = reinterpret_cast<bf16*>(smem + C::k);
  bf16* vs = reinterpret_cast<bf16*>(smem + C::v);
  int* kpos = reinterpret_cast<int*>(smem + C::kpos);
  unsigned* needed = reinterpret_cast<unsigned*>(smem + C::tiles);
  // min and max position of the block's rows, and the lowest first and highest last of their
  // bidirectional blocks
  int* range = reinterpret_cast<int*>(smem + C::range);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int group_rows = warp % kFlashRowGroups, slice = warp / kFlashRowGroups;
  const int g = lane / 4, t4 = lane % 4;  // fragment row and column pair of this lane
  int si = 0;
  while (si + 1 < p.seqs.n && p.seqs.seq[si + 1].tile_begin <= int(blockIdx.x)) ++si;
  const SeqDesc& seq = p.seqs.seq[si];
  const int local = int(blockIdx.x) - seq.tile_begin;
  const int kvh = local % p.n_kv_heads;
  const int64_t token0 = int64_t(local / p.n_kv_heads) * p.tokens_per_tile;

  // row r of the block: token token0 + r / group, query head kvh · group + r % group
  auto row_token = [&](int r) -> int64_t {
    const int tl = r / p.group;
    const int64_t token = token0 + tl;
    return tl < p.tokens_per_tile && token < seq.n_rows ? token : -1;
  };
  auto row_offset = [&](int r, int64_t token) {
    return ((seq.row_begin + token) * p.n_heads + kvh * p.group + r % p.group) * int64_t(D);
  };

  for (int i = tid; i < kFlashRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c8 = (i % kChunks) * 8;
    const int64_t token = row_token(r);
    cp_async16(qs + r * LD + c8, token >= 0 ? p.q + row_offset(r, token) + c8 : p.q, token >= 0);
  }
  if (tid == 0) {
    range[0] = INT_MAX;
    range[1] = -1;
    range[2] = INT_MAX;
    range[3] = -1;
  }
  for (int i = tid; i < kFlashTileWords; i += kThreads) needed[i] = 0;
  __syncthreads();
  if (tid < kFlashRows) {
    const int64_t token = row_token(tid);
    if (token >= 0) {
      const int qp = p.positions[seq.row_begin + token];
      atomicMin(&range[0], qp);
      atomicMax(&range[1], qp);
      if (p.blocks) {
        const int first = p.blocks[2 * (seq.row_begin + token)], last = p.blocks[2 * (seq.row_begin + token) + 1];
        if (last >= first) {
          atomicMin(&range[2], first);
          atomicMax(&range[3], last);
        }
      }
    }
  }
  __syncthreads();
  const int qmin = range[0], qmax = max(range[1], range[3]);
  // keys below this are visible through a block alone (a block that ignores the window)
  const int block_min = p.block_window ? INT_MAX : range[2];
  // a slot at or beyond the newest visible position's slot holds no visible key unless the ring wrapped
  const int64_t n_slots = min(seq.capacity, int64_t(qmax) + 1);
  const int n_tiles = int((n_slots + BK - 1) / BK);
  // the tiles holding a slot visible to some row: its position is in [qmin − window + 1, qmax], or
  // at or above block_min
  for (int64_t base = int64_t(warp) * 32; base < min(n_slots, int64_t(kFlashMaxTiles) * BK);
       base += int64_t(C::warps) * 32) {
    const int64_t slot = base + lane;
    const int kp = slot < n_slots ? seq.slot_pos[slot] : -1;
    const bool any = kp >= 0 && kp <= qmax && (p.window <= 0 || int64_t(qmin) - kp < p.window || kp >= block_min);
    if (__any_sync(0xffffffffu, any) && lane == 0) {
      const int tile = int(base / BK);
      atomicOr(&needed[tile / 32], 1u << (tile % 32));
    }
  }
  __syncthreads();

  auto load_tile = [&](int tile, int buf) {
    const int64_t first = int64_t(tile) * BK;
    bf16* kd = ks + buf * BK * LD;
    bf16* vd = vs + buf * BK * LD;
    for (int i = tid; i < BK * kChunks; i += kThreads) {
      const int j = i / kChunks, c8 = (i % kChunks) * 8;
      const int64_t slot = first + j;
      const bool in = slot < n_slots;  // zeros past the end: P · V must not meet stale NaNs
      if (p.seqs.format.bits) {
        // a quantized cache: dequantized on the way in, with plain loads (bf16 rows go by cp.async)
        const uint4 zero = make_uint4(0, 0, 0, 0);
        const int64_t head_row = slot * p.n_kv_heads + kvh;
        *reinterpret_cast<uint4*>(kd + j * LD + c8) =
            in ? load_kv8(seq.k, seq.k_scale, seq.k_bias, p.seqs.format, head_row, D, c8) : zero;
        *reinterpret_cast<uint4*>(vd + j * LD + c8) =
            in ? load_kv8(seq.v, seq.v_scale, seq.v_bias, p.seqs.format, head_row, D, c8) : zero;
        continue;
      }
      const int64_t off = in ? (slot * p.n_kv_heads + kvh) * int64_t(D) + c8 : 0;
      cp_async16(kd + j * LD + c8, seq.k + off, in);
      cp_async16(vd + j * LD + c8, seq.v + off, in);
    }
    for (int j = tid; j < BK; j += kThreads) {
      if (first + j < n_slots)
        cp_async4(kpos + buf * BK + j, seq.slot_pos + first + j);
      else
        kpos[buf * BK + j] = -1;
    }
  };

  // positions of this lane's two rows (g and g + 8 of the row group); -1 for padding rows
  int qp[2], qfirst[2], qlast[2];
  for (int h = 0; h < 2; ++h) {
    const int64_t token = row_token(group_rows * 16 + g + 8 * h);
    qp[h] = token >= 0 ? p.positions[seq.row_begin + token] : -1;
    qfirst[h] = token >= 0 && p.blocks ? p.blocks[2 * (seq.row_begin + token)] : 1;
    qlast[h] = token >= 0 && p.blocks ? p.blocks[2 * (seq.row_begin + token) + 1] : 0;
  }
  const float scale_log2 = p.scale * 1.4426950408889634f;  // exp(x) = exp2(x · log2 e)
  float o[C::dslice / 8][4];
#pragma unroll
  for (int n = 0; n < C::dslice / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this lane's columns only

  int tile = next_tile(needed, 0, n_tiles);
  if (tile < n_tiles) load_tile(tile, 0);
  cp_async_commit();  // Q with the first tile
  const bf16* q_base = qs + (group_rows * 16 + lane % 16) * LD + (lane / 16) * 8;
  for (int buf = 0; tile < n_tiles; buf ^= 1) {
    cp_async_wait_all();
    // the tile in buf is complete, and every warp is done with the other buffer
    __syncthreads();
    const int next = next_tile(needed, tile + 1, n_tiles);
    if (next < n_tiles) load_tile(next, buf ^ 1);
    cp_async_commit();

    // S = Q · Kᵀ for this warp's 16 rows over the whole head
    const bf16* kb = ks + buf * BK * LD + ((lane % 8) + 8 * (lane / 16)) * LD + 8 * ((lane / 8) % 2);
    float s[BK / 8][4];
#pragma unroll
    for (int n = 0; n < BK / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
      // unrolled by four only: fully unrolled, the loads hoisted ahead spill O at D = 256
#pragma unroll 4
    for (int kk = 0; kk < D / 16; ++kk) {
      unsigned a[4];
      ldmatrix_x4(a, q_base + kk * 16);
#pragma unroll
      for (int nn = 0; nn < BK / 16; ++nn) {
        unsigned b[4];
        ldmatrix_x4(b, kb + nn * 16 * LD + kk * 16);
        mma_bf16(s[2 * nn], a, b[0], b[1]);
        mma_bf16(s[2 * nn + 1], a, b[2], b[3]);
      }
    }

    // online softmax on the fragments: element e of tile n is row g + 8 (e / 2), column 8n + 2 t4 + e % 2
    const int* kp = kpos + buf * BK;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < BK / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2;
        const float x = key_visible(kp[8 * n + 2 * t4 + e % 2], qp[h], qfirst[h], qlast[h], p.window, p.block_window)
                            ? s[n][e] * scale_log2
                            : -INFINITY;
        s[n][e] = x;
        mx[h] = fmaxf(mx[h], x);
      }
    float alpha[2], m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      const float m_new = fmaxf(m[h], mx[h]);
      // a row with nothing visible yet keeps O = 0, l = 0; subtracting 0 keeps exp2 away from NaN
      m_use[h] = m_new == -INFINITY ? 0.0f : m_new;
      alpha[h] = exp2f(m[h] - m_use[h]);
      m[h] = m_new;
      l[h] *= alpha[h];
    }
#pragma unroll
    for (int n = 0; n < C::dslice / 8; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    unsigned pa[BK / 16][4];
#pragma unroll
    for (int n = 0; n < BK / 8; ++n) {
      float e[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        e[i] = exp2f(s[n][i] - m_use[i / 2]);
        l[i / 2] += e[i];
      }
      pa[n / 2][(n % 2) * 2] = pack_bf16(e[0], e[1]);
      pa[n / 2][(n % 2) * 2 + 1] = pack_bf16(e[2], e[3]);
    }

    // O += P · V over this warp's slice of the head
    const bf16* vb =
        vs + buf * BK * LD + ((lane % 8) + 8 * ((lane / 8) % 2)) * LD + slice * C::dslice + 8 * (lane / 16);
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk)
#pragma unroll
      for (int nd = 0; nd < C::dslice / 16; ++nd) {
        unsigned b[4];
        ldmatrix_x4_trans(b, vb + kk * 16 * LD + nd * 16);
        mma_bf16(o[2 * nd], pa[kk], b[0], b[1]);
        mma_bf16(o[2 * nd + 1], pa[kk], b[2], b[3]);
      }
    tile = next;
  }
  cp_async_wait_all();

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    const int r = group_rows * 16 + g + 8 * h;
    const int64_t token = row_token(r);
    if (token < 0) continue;
    const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;  // rows that see nothing give zeros
    bf16* out = p.out + row_offset(r, token) + slice * C::dslice + 2 * t4;
#pragma unroll
    for (int n = 0; n < C::dslice / 8; ++n)
      *reinterpret_cast<unsigned*>(out + 8 * n) = pack_bf16(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
  }
}

template <int D>
void launch_flash_prefill(const AttnParams& params, cudaStream_t stream) {
  using C = FlashConfig<D>;
  static std::once_flag configured;
  std::call_once(configured, [] {
    cudaFuncSetAttribute(flash_prefill_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::bytes));
  });
  launch(flash_prefill_kernel<D>, params.total_tiles, C::warps * 32, C::bytes, stream, params);
}

}  // namespace

// The flash kernel takes the head dims it is built for, exactly, and groups that fit its 64 rows,
// where the device grants its shared memory (Hopper does for all four).
bool flash_prefill_fits(int head_dim, int group) {
  size_t bytes = 0;
  switch (head_dim) {
    case 64:
      bytes = FlashConfig<64>::bytes;
      break;
    case 128:
      bytes = FlashConfig<128>::bytes;
      break;
    case 256:
      bytes = FlashConfig<256>::bytes;
      break;
    case 512:
      bytes = FlashConfig<512>::bytes;
      break;
    default:
      return false;
  }
  return group <= kFlashRows && bytes <= max_shared_memory();
}

void flash_prefill(const AttnParams& params, cudaStream_t stream) {
  switch (params.head_dim) {
    case 64:
      launch_flash_prefill<64>(params, stream);
      break;
    case 128:
      launch_flash_prefill<128>(params, stream);
      break;
    case 256:
      launch_flash_prefill<256>(params, stream);
      break;
    default:
      launch_flash_prefill<512>(params, stream);
      break;
  }
}

}  // namespace kiln::cuda
