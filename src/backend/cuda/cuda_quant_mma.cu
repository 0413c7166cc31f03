// CUDA backend: the 4-bit decode products of 12 to 32 input rows on the tensor cores, with the bits of
// the dp2a products (cuda_quant_gemv.cu), whose order of float sums they keep.
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_quant_codes.cuh"
#include "backend/cuda/cuda_quant_products.cuh"

namespace kiln::cuda {

namespace {

// ---- 4 bits, several input rows: the integer products on the tensor cores ----
//
// The dp2a kernel (cuda_quant_gemv.cu) repeats a chunk's unpacking and dp2a dot for every input row, eight rows a pass,
// so its time grows with the rows. From kMmaMinRows rows the 4-bit products run on the tensor cores
// instead, with the same bits: mma.sync m16n8k32 multiplies bytes into int32 exactly, so each int16
// input is split into a signed high and an unsigned low byte (xq = 256·hi + lo), and a chunk's
// Σ xq·q is two MMAs: (hi·q) shifted by 8 and accumulated with lo·q. The terms, the runs' balanced
// trees, the parts' order and the outputs are the dp2a kernel's order.
//
// The input rows are the MMA's rows (16 a tile, up to two tiles a pass), the weight rows its
// columns: a tile of 16 weight rows is two n8 products a chunk (a GLU tile: 8 gate rows, then the 8
// up rows of the same features, so a lane holds both of an output). A warp takes one run of 32
// chunks of one tile and sums its terms as the run's tree in registers; the run sums wait in shared
// memory until the block has done every run of its group of tiles, then are added in the parts'
// order by the whole block. The inputs sit in shared memory for the MMA: chunk c of row m as four
// 16-byte slots, slot t holding the high bytes of elements 8t, 8t+2, 8t+4, 8t+6, those of 8t+1,
// 8t+3, 8t+5, 8t+7, then the low bytes likewise, the order in which word t of a chunk's codes
// splits into bytes (its even codes, then its odd ones). A warp's next sub-span of codes is loaded
// while it computes one, and the sub-span after that is asked of the L2. Groups of tiles are sized
// so that the busiest warp has the fewest runs (the head's 15,520 tiles over 132 SMs were 1.4× off
// balance with the largest groups that fit). MLX's row layout only; the tiled layout has products of
// its own.

constexpr int kMmaMinRows = 12;  // measured: slower than dp2a at 8 rows on an H200, faster at 12
constexpr int kMmaWarps = 8;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kMmaMaxRows = 32;               // two tiles of input rows
constexpr int64_t kMmaRunBytes = 32 * 8 * 4;  // a run's sums for one tile of weight and input rows

__device__ __forceinline__ void mma_hi(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}
__device__ __forceinline__ void mma_lo(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Rows [0, rows) of x into the MMA's layout: chunk c of row m at slots[(c·rows + m)·4 + t], its
// (step, sum) at stats[c·rows + m]. Four chunks a thread are read before any is converted.
__device__ void quantize_input_for_mma(const bf16* __restrict__ x, int64_t ldx, int rows, int chunks, uint4* slots,
                                       float2* stats) {
  constexpr int kAhead = 4;
  const int total = rows * chunks;
  for (int base = threadIdx.x; base < total; base += kAhead * blockDim.x) {
    uint4 raw[kAhead][4];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      const int i = base + u * int(blockDim.x);
      if (i < total) {
        const uint4* src = reinterpret_cast<const uint4*>(x + (i % rows) * ldx + 32 * (i / rows));
#pragma unroll
        for (int q = 0; q < 4; ++q) raw[u][q] = src[q];
      }
    }
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      const int i = base + u * int(blockDim.x);
      if (i >= total) break;
      InputChunk chunk;
      chunk.from(raw[u]);
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        uint32_t hi_even = 0, hi_odd = 0, lo_even = 0, lo_odd = 0;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const uint32_t even = uint32_t(chunk.quantized(8 * t + 2 * b)),
                         odd = uint32_t(chunk.quantized(8 * t + 2 * b + 1));
          hi_even |= ((even >> 8) & 0xffu) << (8 * b), lo_even |= (even & 0xffu) << (8 * b);
          hi_odd |= ((odd >> 8) & 0xffu) << (8 * b), lo_odd |= (odd & 0xffu) << (8 * b);
        }
        slots[int64_t(i) * 4 + t] = make_uint4(hi_even, hi_odd, lo_even, lo_odd);
      }
      stats[i] = make_float2(chunk.step, chunk.sum);
    }
  }
}

// One sub-span's loads of a lane: word t of 8 chunks of its two weight rows (one an n8 product), and
// for tile row l % 16 the scale (l < 16) or bias (l ≥ 16) of each chunk, two bf16 a word; a lane
// takes the others' by shuffles.
struct MmaFetch {
  uint32_t words[8][2];
  uint32_t affine[4];
};

__device__ __forceinline__ uint32_t load_no_l1(const uint32_t* p) {
  uint32_t r;
  asm volatile("ld.global.nc.L1::no_allocate.b32 %0, [%1];" : "=r"(r) : "l"(p));
  return r;
}

// The items of a warp in order: (group q, task, sub-span of 8 chunks); a task is one run of one
// tile, groups go round the blocks.
struct MmaCursor {
  int q, task, sub;
};

// out[m, row] for input rows [0, rows) (rows ≤ 16·MT), 4-bit weights; a group is group_tiles tiles.
template <bool GLU, int MT>
__global__ void __launch_bounds__(kMmaThreads, 1)
    qmma_kernel(QProducts p, const bf16* __restrict__ x, int64_t ldx, int rows, bool f32_out, bool gelu, int parts,
                int tiles, int group_tiles) {
  constexpr int kValues = MT * 8;  // a lane's sums: (input tile, n8 product, C fragment element)
  extern __shared__ uint4 shared[];
  const int chunks = int(p.k / 32), runs = (chunks + 31) / 32;
  uint4* slots = shared;
  float2* stats = reinterpret_cast<float2*>(slots + rows * chunks * 4);
  float* run_sums_of = reinterpret_cast<float*>(slots + rows * chunks * 4 + (rows * chunks + 1) / 2);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;  // the MMA's group (row / column) and thread in the group
  const int groups = (tiles + group_tiles - 1) / group_tiles;
  const int row_groups = chunks >> p.group_shift;

  // tile → product and its first output feature (a GLU tile: 8 features; otherwise 16 rows)
  auto product_of = [&](int tile, int64_t& first) {
    int s = 0;
    if constexpr (!GLU)
      while (s + 1 < p.count && tile >= p.block_end[s]) ++s;
    first = int64_t(tile - (s ? p.block_end[s - 1] : 0)) * (GLU ? 8 : 16);
    return s;
  };
  // weight row `col` (0..15) of a tile: its product and row
  auto weight_row = [&](int s, int64_t first, int col, int& src) {
    src = GLU ? col / 8 : s;
    return min(first + (GLU ? col % 8 : col), p.n[src] - 1);  // a short last tile repeats a row
  };
  auto tasks_of = [&](int q) { return min(group_tiles, tiles - q * group_tiles) * runs; };
  auto advance = [&](MmaCursor& c) {
    if (++c.sub < 4) return;
    c.sub = 0, c.task += kMmaWarps;
    while (c.q < groups && c.task >= tasks_of(c.q)) c.q += int(gridDim.x), c.task = warp;
  };
  // the codes of tile row ng·8 + g of item c's tile
  auto codes_of = [&](const MmaCursor& c, int ng) {
    int64_t first;
    int src;
    const int64_t row = weight_row(product_of(c.q * group_tiles + c.task / runs, first), first, ng * 8 + g, src);
    return p.packed[src] + row * chunks * 4;
  };
  auto fetch = [&](const MmaCursor& c, MmaFetch& f) {
    if (c.q >= groups) return;
    const int c0 = 32 * (c.task % runs) + 8 * c.sub;
#pragma unroll
    for (int ng = 0; ng < 2; ++ng) {
      const uint32_t* codes = codes_of(c, ng) + t;
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (c0 + i < chunks) f.words[i][ng] = load_no_l1(codes + (c0 + i) * 4);
    }
    int64_t first;
    int src;
    const int64_t row = weight_row(product_of(c.q * group_tiles + c.task / runs, first), first, lane % 16, src);
    const unsigned short* affine =
        reinterpret_cast<const unsigned short*>((lane < 16 ? p.scales[src] : p.biases[src]) + row * row_groups);
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
      const uint32_t lo = __ldg(affine + (min(c0 + i, chunks - 1) >> p.group_shift));
      const uint32_t hi = __ldg(affine + (min(c0 + i + 1, chunks - 1) >> p.group_shift));
      f.affine[i / 2] = lo | (hi << 16);
    }
  };
  // item c's codes and scales asked of the L2 (no registers held): lane l < 16 the 128 bytes of
  // codes of tile row l, every lane its row's scales or biases
  auto request = [&](const MmaCursor& c) {
    if (c.q >= groups) return;
    const int c0 = 32 * (c.task % runs) + 8 * c.sub;
    if (c0 >= chunks) return;
    int64_t first;
    int src;
    const int64_t row = weight_row(product_of(c.q * group_tiles + c.task / runs, first), first, lane % 16, src);
    if (lane < 16) asm volatile("prefetch.global.L2 [%0];" ::"l"(p.packed[src] + row * chunks * 4 + c0 * 4));
    asm volatile("prefetch.global.L2 [%0];" ::"l"((lane < 16 ? p.scales[src] : p.biases[src]) + row * row_groups +
                                                  (c0 >> p.group_shift)));
  };

  // The consumer's input rows in shared memory: MMA rows g and g + 8 of each input tile, -1 past `rows`.
  int in_row[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) in_row[mt][h] = mt * 16 + h * 8 + g < rows ? mt * 16 + h * 8 + g : -1;

  // A sub-span's 8 chunks: the terms of each, summed as the run's tree does (pairs, then pairs of
  // pairs, then the four). kAtOnce chunks are taken at once: their loads, then their MMAs, then their
  // terms, so that a warp has several chunks' MMAs in flight.
  constexpr int kAtOnce = MT == 1 ? 4 : 2;
  auto sub_span = [&](const MmaFetch& f, int c0, float(&out)[kValues]) {
    float pair[kValues], quad[kValues];
    uint32_t s_pair[2][2], b_pair[2][2];  // this chunk and the next: scale and bias of columns 2t, 2t + 1
#pragma unroll
    for (int i0 = 0; i0 < 8; i0 += kAtOnce) {
      uint4 r[kAtOnce][MT][2];
      float2 st[kAtOnce][MT][2];
#pragma unroll
      for (int ii = 0; ii < kAtOnce; ++ii) {
        const int c = min(c0 + i0 + ii, chunks - 1);  // past the last chunk: any address, the term is +0
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            r[ii][mt][h] = make_uint4(0, 0, 0, 0), st[ii][mt][h] = make_float2(0.0f, 0.0f);
            if (in_row[mt][h] >= 0)
              r[ii][mt][h] = slots[(c * rows + in_row[mt][h]) * 4 + t], st[ii][mt][h] = stats[c * rows + in_row[mt][h]];
          }
      }
      // Every high-byte MMA goes out before any low-byte one (which needs its shifted result), so
      // that several are in flight; the two sweeps repeat the codes' split, which the compiler shares.
      int d[kAtOnce][MT][2][4];
      auto each_product = [&](auto&& product) {
#pragma unroll
        for (int ii = 0; ii < kAtOnce; ++ii)
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int ng = 0; ng < 2; ++ng) {
              const uint32_t w = f.words[i0 + ii][ng];
              product(d[ii][mt][ng], r[ii][mt], w & 0x0f0f0f0fu, (w >> 4) & 0x0f0f0f0fu);
            }
      };
      each_product([&](int(&acc)[4], const uint4(&a)[2], uint32_t lo_nibbles, uint32_t hi_nibbles) {
        const uint32_t a_hi[4] = {a[0].x, a[1].x, a[0].y, a[1].y};
        mma_hi(acc, a_hi, lo_nibbles, hi_nibbles);
      });
      each_product([&](int(&acc)[4], const uint4(&a)[2], uint32_t lo_nibbles, uint32_t hi_nibbles) {
        const uint32_t a_lo[4] = {a[0].z, a[1].z, a[0].w, a[1].w};
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[e] <<= 8;
        mma_lo(acc, a_lo, lo_nibbles, hi_nibbles);
      });
#pragma unroll
      for (int ii = 0; ii < kAtOnce; ++ii) {
        const int i = i0 + ii;
        if (i % 2 == 0)
#pragma unroll
          for (int ng = 0; ng < 2; ++ng)
#pragma unroll
            for (int j = 0; j < 2; ++j)
              s_pair[ng][j] = __shfl_sync(0xffffffffu, f.affine[i / 2], ng * 8 + 2 * t + j),
              b_pair[ng][j] = __shfl_sync(0xffffffffu, f.affine[i / 2], 16 + ng * 8 + 2 * t + j);
        float term[kValues];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int ng = 0; ng < 2; ++ng)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const uint32_t sp = s_pair[ng][e & 1], bp = b_pair[ng][e & 1];
              const float s_f = __uint_as_float(i % 2 ? sp & 0xffff0000u : sp << 16);
              const float b_f = __uint_as_float(i % 2 ? bp & 0xffff0000u : bp << 16);
              const float2 x = st[ii][mt][e / 2];
              const float v = fmaf(s_f * x.x, __int2float_rn(d[ii][mt][ng][e]), b_f * x.y);
              term[mt * 8 + ng * 4 + e] = c0 + i < chunks ? v : 0.0f;
            }
#pragma unroll
        for (int v = 0; v < kValues; ++v) {
          if (i % 2 == 0) {
            pair[v] = term[v];
          } else {
            const float two = pair[v] + term[v];
            if (i == 1)
              quad[v] = two;
            else if (i == 3)
              quad[v] = quad[v] + two;
            else if (i == 5)
              out[v] = two;
            else
              out[v] = quad[v] + (out[v] + two);
          }
        }
      }
    }
  };

  // The first item's codes go out before waiting on the kernel that writes x, the next kAhead − 1
  // items' to the L2; each item then loads the next one's (from the L2) and asks for the one kAhead on.
  constexpr int kAhead = 4;
  MmaCursor next{int(blockIdx.x), warp, 0};
  while (next.q < groups && next.task >= tasks_of(next.q)) next.q += int(gridDim.x);
  MmaFetch cur;
  fetch(next, cur);
  MmaCursor ahead = next;
  for (int i = 1; i < kAhead; ++i) {
    advance(ahead);
    request(ahead);
  }
  wait_for_inputs();
  quantize_input_for_mma(x, ldx, rows, chunks, slots, stats);
  __syncthreads();

  for (int q = int(blockIdx.x); q < groups; q += int(gridDim.x)) {
    const int tasks = tasks_of(q);
    for (int task = warp; task < tasks; task += kMmaWarps) {
      const int run = task % runs;
      float half[kValues], total[kValues];
#pragma unroll 1
      for (int sub = 0; sub < 4; ++sub) {
        // the next item's codes go out (from the L2, asked for an item ago), the one after to the L2
        advance(next);
        advance(ahead);
        MmaFetch following;
        fetch(next, following);
        request(ahead);
        float sum[kValues];
        sub_span(cur, 32 * run + 8 * sub, sum);
        cur = following;
#pragma unroll
        for (int v = 0; v < kValues; ++v) {
          if (sub == 0 || sub == 2)
            half[v] = sum[v];
          else if (sub == 1)
            total[v] = half[v] + sum[v];
          else
            total[v] = total[v] + (half[v] + sum[v]);
        }
      }
      float4* dst = reinterpret_cast<float4*>(run_sums_of + (task * 32 + lane) * kValues);
#pragma unroll
      for (int v = 0; v < kValues; v += 4) dst[v / 4] = make_float4(total[v], total[v + 1], total[v + 2], total[v + 3]);
    }
    __syncthreads();
    // The runs' sums in the parts' order (part w: runs w, w + parts, ...), then the outputs.
    const int iters = (runs + parts - 1) / parts, tile_count = tasks / runs;
    for (int i = threadIdx.x; i < tile_count * MT * 128; i += kMmaThreads) {
      const int e = i % 4, ln = (i / 4) % 32, mt = (i / 128) % MT, gi = i / (128 * MT);
      const int m = mt * 16 + ln / 4 + (e >= 2 ? 8 : 0), col = 2 * (ln % 4) + (e & 1);
      float out[2];
#pragma unroll
      for (int ng = 0; ng < 2; ++ng) {
        const float* sums = run_sums_of + (gi * runs * 32 + ln) * kValues + mt * 8 + ng * 4 + e;
        float total = 0.0f;
        for (int w = 0; w < parts; ++w) {
          float acc = 0.0f;
          for (int it = 0; it < iters; ++it) {
            const int r = w + it * parts;
            acc += r < runs ? sums[r * 32 * kValues] : 0.0f;
          }
          total = parts == 1 ? acc : total + acc;
        }
        out[ng] = total;
      }
      if (m >= rows) continue;
      int64_t first;
      const int s = product_of(q * group_tiles + gi, first);
      if constexpr (GLU) {
        if (first + col < p.n[0])
          store_output(p.out[0], m * p.ldo[0] + first + col, (gelu ? gelu_tanh(out[0]) : silu(out[0])) * out[1],
                       f32_out);
      } else {
#pragma unroll
        for (int ng = 0; ng < 2; ++ng)
          if (first + ng * 8 + col < p.n[s])
            store_output(p.out[s], m * p.ldo[s] + first + ng * 8 + col, out[ng], f32_out);
      }
    }
    __syncthreads();
  }
}

// A pass of the tensor-core products: its input rows (0: none fit), input tiles, tiles a group of
// the block's work and shared memory. The inputs and at least one tile's run sums must fit; a group
// holds as many tiles as give its busiest warp the fewest runs (groups a block × rounds of a group's
// tasks over the block's warps), the most of those that fit.
struct MmaPass {
  int rows = 0, m_tiles = 1, group_tiles = 1;
  size_t shared = 0;
};

MmaPass mma_pass(int chunks, int64_t rows_left, int64_t tiles, int sms) {
  const int64_t budget = int64_t(max_shared_memory()) - 1024;
  const int runs = ceil_div(chunks, 32);
  auto input_bytes = [&](int64_t rows) { return rows * chunks * 64 + (rows * chunks + 1) / 2 * 16; };
  MmaPass pass;
  for (int mt = kMmaMaxRows / 16; mt >= 1 && pass.rows == 0; --mt)
    for (int64_t r = std::min<int64_t>(rows_left, 16 * mt); r > 16 * (mt - 1); --r)
      if (input_bytes(r) + int64_t(runs) * mt * kMmaRunBytes <= budget) {
        pass.rows = int(r), pass.m_tiles = mt;
        break;
      }
  if (pass.rows == 0) return pass;
  const int64_t run_bytes = int64_t(pass.m_tiles) * kMmaRunBytes;
  const int64_t most = std::max<int64_t>(1, (budget - input_bytes(pass.rows)) / (run_bytes * runs));
  // the busiest warp's runs: groups a block times rounds of tasks a group (ties: fewer, larger groups)
  int64_t best = INT64_MAX;
  for (int64_t gt = 1; gt <= std::min<int64_t>(most, tiles); ++gt) {
    const int64_t cost = ceil_div(ceil_div(tiles, gt), sms) * ceil_div(gt * runs, kMmaWarps);
    if (cost <= best) best = cost, pass.group_tiles = int(gt);
  }
  pass.shared = size_t(input_bytes(pass.rows) + pass.group_tiles * runs * run_bytes);
  return pass;
}

// Input rows from which the 4-bit products take the tensor cores.
int mma_min_rows() {
#if KILN_CUDA_TIMELINE  // developer builds: forced from the environment, for measuring
  static const int rows = [] {
    const char* forced = std::getenv("KILN_QMMA_MIN_ROWS");
    return forced ? std::atoi(forced) : kMmaMinRows;
  }();
  return rows;
#else
  return kMmaMinRows;
#endif
}

}  // namespace

int run_tensor_core_pass(QProducts p, int products, bool glu, bool gelu, const bf16* xs, int64_t ldx, int64_t rows_left,
                         int parts, bool f32_out, cudaStream_t stream) {
  if (rows_left < mma_min_rows()) return 0;
  const int chunks = int(p.k / 32), sms = multiprocessors();
  int tiles = 0;
  for (int i = 0; i < products; ++i) p.block_end[i] = tiles += ceil_div(p.n[i], glu ? 8 : 16);
  const MmaPass pass = mma_pass(chunks, rows_left, tiles, sms);
  if (pass.rows < mma_min_rows()) return 0;
  const int grid = std::min(sms, ceil_div(tiles, pass.group_tiles));
  auto go = [&](auto kernel) {
    allow_most_dynamic_shared(kernel);
    launch(kernel, grid, kMmaThreads, pass.shared, stream, p, xs, ldx, pass.rows, f32_out, gelu, parts, tiles,
           pass.group_tiles);
  };
  if (glu)
    pass.m_tiles == 2 ? go(qmma_kernel<true, 2>) : go(qmma_kernel<true, 1>);
  else
    pass.m_tiles == 2 ? go(qmma_kernel<false, 2>) : go(qmma_kernel<false, 1>);
  return pass.rows;
}

}  // namespace kiln::cuda
