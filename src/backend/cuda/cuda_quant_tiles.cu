// CUDA backend: the decode products of tiled 4- and 8-bit weights (src/quant/tiles.h).
//
// One block an SM. A producer warp copies the block's tiles whole (one bulk copy a tile: codes,
// scales and biases) into a ring of shared-memory slots, starting before the inputs are ready (the
// weights are constant) and held back only by free slots. Sixteen consumer warps wait for the
// inputs, quantize them to int16 pairs per 32-element chunk in shared memory (the integer products
// of cuda_quant_gemv.cu: exact integer sums, so how chunks are grouped cannot change a bit), then
// take the tiles as they land: warp w owns rows w and w + 16 of every tile, its lanes the tile's
// chunks, and frees the slot itself.
//
// A unit of work is a row block's run of slices: all of them, or, when a product has too few row
// blocks to spread over the SMs, a split of them, whose partial sums the row block's last split adds
// in split order. A GLU unit takes the gate's and the up's tiles of the same rows. The units, splits
// and slots are chosen from the shapes and the GPU alone, never the number of input rows, so a row
// gets the same bits in any batch.
//
// On an H200 at batch 1 these are not yet faster than cuda_quant_gemv.cu's products over MLX's rows
// (docs/performance.md, "Tiled weights streamed by a producer warp"), so the backend lays weights
// out in tiles only when asked to (CudaBackendOptions).
#include <algorithm>

#include "backend/cuda/cuda_bulk_copy.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.cuh"
#include "backend/cuda/cuda_quant_codes.cuh"
#include "backend/cuda/cuda_residual_norm.cuh"
#include "quant/tiles.h"

namespace kiln::cuda {

namespace {

constexpr int kTileWarps = 16;  // consumers
constexpr int kTileConsumers = kTileWarps * 32;
constexpr int kTileThreads = kTileConsumers + 32;  // and the producer warp
constexpr int kTileRows = quant::TileLayout::kTileRows;
constexpr int kRowsPerWarp = kTileRows / kTileWarps;
// Slots of the ring: 4 measured best on an H200 (2, 3 and 8 slower: docs/performance.md).
constexpr int kSlots = 4;
constexpr int kMaxTileProducts = 4;
constexpr int64_t kChunkInputBytes = 4 * 16 + 8;  // a chunk's input pairs, step and sum

struct TileProducts {
  const unsigned char* tiles[kMaxTileProducts];  // product s's buffer (a GLU: gate 0, up 1)
  void* out[kMaxTileProducts];
  int64_t ldo[kMaxTileProducts];
  int n[kMaxTileProducts];           // rows of product s (a GLU: of each)
  int unit_end[kMaxTileProducts];    // product s's units: [unit_end[s - 1], unit_end[s])
  int row_base[kMaxTileProducts];    // its first row among a split's partial sums
  int count_base[kMaxTileProducts];  // its first row block's counter
  int splits[kMaxTileProducts];      // its row blocks' splits, of per_split[s] slices each
  int per_split[kMaxTileProducts];
  int count;  // products (a GLU: 1)
  int k, group_size, group_chunks_shift, partial_rows;
  float* partials;  // splits > 1: [split][input row][partial_rows]
  unsigned* counts;
  int slots, slot_bytes;
};

__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"r"(kTileConsumers) : "memory");
}

// Input rows [0, rows) as int16 pairs: a thread takes 8 inputs (code word `word` of a chunk, so four
// neighbouring lanes hold a chunk), written as piece `word` of the chunk at pieces[(m·4 + word)·chunks
// + c] (the layout cuda_quant_gemv.cu's integer products read), the chunk's step and sum at
// stats[m·chunks + c].
template <int BITS>
__device__ __noinline__ void quantize_input_words(const bf16* __restrict__ x, int64_t ldx, int rows, int k,
                                                  uint4* pieces, float2* stats) {
  const int words = k / 8, chunks = k / 32, total = rows * words;
  for (int base = 0; base < total; base += kTileConsumers) {  // every lane takes part in the shuffles
    const int i = base + int(threadIdx.x);
    const bool active = i < total;
    const int m = active ? i / words : 0, w = active ? i % words : 0;
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (active) unpack8(*reinterpret_cast<const uint4*>(x + m * ldx + 8 * w), v);
    float amax = 0.0f, sum = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(v[e])), sum += v[e];
#pragma unroll
    for (int o = 1; o < 4; o *= 2) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      sum += __shfl_xor_sync(0xffffffffu, sum, o);
    }
    if (!active) continue;
    const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
    int q[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) q[e] = __float2int_rn(v[e] * inv);
    const int c = w / 4, word = w % 4;
    auto pair = [&](int p) {  // the inputs of pair 4·word + p, which lie in this word's 8 (4 and 8 bits)
      return (uint32_t(q[code_of_pair<BITS>(4 * word + p, 0) - 8 * word]) & 0xffffu) |
             (uint32_t(q[code_of_pair<BITS>(4 * word + p, 1) - 8 * word]) << 16);
    };
    pieces[(m * 4 + word) * chunks + c] = make_uint4(pair(0), pair(1), pair(2), pair(3));
    if (word == 0) stats[m * chunks + c] = make_float2(amax * (1.0f / 32767.0f), sum);
  }
}

template <int BITS>
__device__ __forceinline__ void load_shared_chunk(const uint32_t* p, uint32_t (&w)[BITS]) {
#pragma unroll
  for (int i = 0; i < BITS / 4; ++i) {
    const uint4 v = reinterpret_cast<const uint4*>(p)[i];
    w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
  }
}

// The warp's rows of one tile (rb rows × cols columns, starting at chunk c0 of the row) added to
// acc[q][m], rows ≤ M input rows.
template <int BITS, int M>
__device__ __forceinline__ void tile_rows(const unsigned char* tile, int rb, int cols, int c0, int chunks,
                                          int group_chunks_shift, int rows, const uint4* pieces, const float2* stats,
                                          float (&acc)[kRowsPerWarp][M]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tchunks = cols / 32, tgroups = tchunks >> group_chunks_shift;
  const uint32_t* codes = reinterpret_cast<const uint32_t*>(tile);
  const bf16* scales = reinterpret_cast<const bf16*>(tile + int64_t(rb) * tchunks * BITS * 4);
  const bf16* biases = scales + rb * tgroups;
  int row[kRowsPerWarp];
#pragma unroll
  for (int q = 0; q < kRowsPerWarp; ++q) row[q] = min(warp + kTileWarps * q, rb - 1);  // a short block repeats a row
#pragma unroll 2
  for (int cc = lane; cc < tchunks; cc += 32) {
    uint32_t w[kRowsPerWarp][BITS];
    float s[kRowsPerWarp], b[kRowsPerWarp];
    const int g = cc >> group_chunks_shift;
#pragma unroll
    for (int q = 0; q < kRowsPerWarp; ++q) {
      load_shared_chunk<BITS>(codes + (row[q] * tchunks + cc) * BITS, w[q]);
      s[q] = __bfloat162float(scales[row[q] * tgroups + g]);
      b[q] = __bfloat162float(biases[row[q] * tgroups + g]);
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (m >= rows) break;
      uint32_t pairs[16];
      const float2 st = input_chunk(pieces, stats, m, chunks, c0 + cc, pairs);
#pragma unroll
      for (int q = 0; q < kRowsPerWarp; ++q) {
        const float dot = __int2float_rn(chunk_dot<BITS>(w[q], pairs));
        acc[q][m] = fmaf(s[q] * st.x, dot, fmaf(b[q], st.y, acc[q][m]));
      }
    }
  }
}

// out[m, row] for rows [0, rows) of x. RESIDUAL > 0 (one product, bf16 out): the last block to
// finish then runs the residual update (cuda_residual_norm.cuh), as the other products' fused forms.
template <int BITS, int M, bool GLU, int RESIDUAL>
__global__ void __launch_bounds__(kTileThreads, 1)
    qtile_kernel(TileProducts p, const bf16* __restrict__ x, int64_t ldx, int rows, bool f32_out, bool gelu,
                 ResidualRows<bf16> update, unsigned* done) {
  constexpr int kParts = GLU ? 2 : 1;  // tiles a unit takes per slice
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t full[kSlots], empty[kSlots];
  __shared__ int last_split;
  const int chunks = p.k / 32, units = p.unit_end[p.count - 1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint4* pieces = reinterpret_cast<uint4*>(smem + size_t(p.slots) * p.slot_bytes);
  float2* stats = reinterpret_cast<float2*>(pieces + M * 4 * chunks);
  if (threadIdx.x == 0) {
    for (int s = 0; s < p.slots; ++s) mbarrier_init(&full[s], 1), mbarrier_init(&empty[s], kTileWarps);
    mbarrier_init_fence();
  }
  __syncthreads();

  // unit u: product s, row block b, split j; the product's layout
  auto unit_of = [&](int u, int& s, int& b, int& j) {
    s = 0;
    if constexpr (!GLU)
      while (s + 1 < p.count && u >= p.unit_end[s]) ++s;
    const int local = u - (s ? p.unit_end[s - 1] : 0);
    b = local / p.splits[s], j = local % p.splits[s];
  };
  auto layout_of = [&](int s) { return quant::make_tile_layout(p.n[s], p.k, BITS, p.group_size); };
  auto each_sum = [](auto&& f) {  // f(part, q, m) over a unit's sums
#pragma unroll
    for (int part = 0; part < kParts; ++part)
#pragma unroll
      for (int q = 0; q < kRowsPerWarp; ++q)
#pragma unroll
        for (int m = 0; m < M; ++m) f(part, q, m);
  };

  if (warp == kTileWarps) {  // the producer: weights only, so it never waits on the kernel before
    if (lane == 0) {
      int slot = 0, round = 0;
      for (int u = blockIdx.x; u < units; u += gridDim.x) {
        int s, b, j;
        unit_of(u, s, b, j);
        const quant::TileLayout t = layout_of(s);
        const int end = min(t.slices(), (j + 1) * p.per_split[s]);
        for (int sl = j * p.per_split[s]; sl < end; ++sl)
#pragma unroll
          for (int part = 0; part < kParts; ++part) {
            if (round > 0) mbarrier_wait(&empty[slot], (round - 1) & 1);
            const unsigned bytes = unsigned(t.tile_bytes(t.block_rows(b), t.slice_cols(sl)));
            mbarrier_expect_bytes(&full[slot], bytes);
            bulk_copy_to_shared(smem + size_t(slot) * p.slot_bytes, p.tiles[GLU ? part : s] + t.tile_offset(b, sl),
                                bytes, &full[slot]);
            if (++slot == p.slots) slot = 0, ++round;
          }
      }
    }
  } else {
    wait_for_inputs();
    quantize_input_words<BITS>(x, ldx, rows, p.k, pieces, stats);
    consumers_sync();
    int slot = 0, round = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
      int s, b, j;
      unit_of(u, s, b, j);
      const quant::TileLayout t = layout_of(s);
      const int rb = t.block_rows(b), splits = p.splits[s], end = min(t.slices(), (j + 1) * p.per_split[s]);
      float acc[kParts][kRowsPerWarp][M];
      each_sum([&](int part, int q, int m) { acc[part][q][m] = 0.0f; });
      for (int sl = j * p.per_split[s]; sl < end; ++sl)
#pragma unroll
        for (int part = 0; part < kParts; ++part) {
          mbarrier_wait(&full[slot], round & 1);
          tile_rows<BITS, M>(smem + size_t(slot) * p.slot_bytes, rb, t.slice_cols(sl), sl * (t.slice / 32), chunks,
                             p.group_chunks_shift, rows, pieces, stats, acc[part]);
          __syncwarp();
          if (lane == 0) mbarrier_arrive(&empty[slot]);
          if (++slot == p.slots) slot = 0, ++round;
        }
      each_sum([&](int part, int q, int m) { acc[part][q][m] = warp_sum(acc[part][q][m]); });
      const int n = p.n[s];
      auto finish = [&](const float(&v)[kParts][kRowsPerWarp][M]) {  // lane 0: the outputs
#pragma unroll
        for (int q = 0; q < kRowsPerWarp; ++q) {
          const int r = b * kTileRows + warp + kTileWarps * q;
          if (r >= n) break;
#pragma unroll
          for (int m = 0; m < M; ++m) {
            if (m >= rows) break;
            float o = v[0][q][m];
            if constexpr (GLU) o = (gelu ? gelu_tanh(o) : silu(o)) * v[kParts - 1][q][m];
            store_output(p.out[s], m * p.ldo[s] + r, o, f32_out);
          }
        }
      };
      if (splits == 1) {
        if (lane == 0) finish(acc);
        continue;
      }
      // split columns: partial sums, added in split order by the row block's last split
      auto partial = [&](int split, int part, int q, int m) {
        return p.partials + (size_t(split) * M + m) * p.partial_rows + p.row_base[s] + part * n + b * kTileRows + warp +
               kTileWarps * q;
      };
      auto held = [&](int q, int m) { return m < rows && b * kTileRows + warp + kTileWarps * q < n; };
      if (lane == 0)
        each_sum([&](int part, int q, int m) {
          if (held(q, m)) *partial(j, part, q, m) = acc[part][q][m];
        });
      consumers_sync();
      if (threadIdx.x == 0) last_split = arrive_acq_rel(p.counts + p.count_base[s] + b) == unsigned(splits - 1);
      consumers_sync();
      if (!last_split) continue;
      float total[kParts][kRowsPerWarp][M];
      each_sum([&](int part, int q, int m) {
        total[part][q][m] = warp_sum(lane < splits && held(q, m) ? __ldcg(partial(lane, part, q, m)) : 0.0f);
      });
      if (lane == 0) finish(total);
      if (threadIdx.x == 0) p.counts[p.count_base[s] + b] = 0;
    }
  }
  if constexpr (RESIDUAL > 0) update_in_last_block<RESIDUAL>(update, rows, done);
}

int shared_memory_limit() {
  return int(max_shared_memory()) - 2048;  // the kernel's static shared memory, with room to spare
}

// Input rows one pass holds beside two slots: 1, 2, 4 or 8 (0: k too large).
int tile_pass_rows(int64_t k, int64_t slot_bytes, int shared_limit) {
  const int64_t fit = (shared_limit - 2 * slot_bytes) / ((k / 32) * kChunkInputBytes);
  return fit >= 8 ? 8 : fit >= 4 ? 4 : fit >= 2 ? 2 : fit >= 1 ? 1 : 0;
}

// The products of p over all rows of x, passes of tile_pass_rows() rows. p's tiles, outputs and
// rows are set; the rest is chosen here from the shapes and the GPU.
template <int BITS>
bool run_tiles(TileProducts p, bool glu, bool gelu, const Tensor& x, DType out_dtype, const TileScratch& scratch,
               cudaStream_t stream, const ResidualNormArgs* residual, unsigned* done) {
  const int parts = glu ? 2 : 1, products = glu ? 1 : p.count, sms = multiprocessors();
  // Each product's splits as if it ran alone (so a product gets the same bits in any launch): the
  // busiest SM's tiles, a split unit's partial sums and count costed as one more tile.
  int64_t slot_bytes = 0, partial_rows = 0;
  int units = 0, blocks_before = 0;
  for (int s = 0; s < products; ++s) {
    const quant::TileLayout t = quant::make_tile_layout(p.n[s], p.k, BITS, p.group_size);
    const int64_t blocks = t.row_blocks();
    const int slices = t.slices();
    slot_bytes = std::max(slot_bytes, t.tile_bytes(t.block_rows(0), t.slice));
    int64_t best_cost = ((blocks + sms - 1) / sms) * slices * parts;  // no split
    p.splits[s] = 1, p.per_split[s] = slices;
    for (int splits = 2; splits <= slices; ++splits) {
      const int per = (slices + splits - 1) / splits;
      // a quarter of the scratch a product, so that the products of any launch fit together
      const bool fits = (slices + per - 1) / per == splits && blocks <= scratch.count_slots / kMaxTileProducts &&
                        int64_t(splits) * 8 * parts * p.n[s] <= scratch.partial_floats / kMaxTileProducts;
      const int64_t rounds = (blocks * splits + sms - 1) / sms, cost = rounds * per * parts + rounds;
      if (fits && cost < best_cost) best_cost = cost, p.splits[s] = splits, p.per_split[s] = per;
    }
    p.unit_end[s] = units += int(blocks) * p.splits[s];
    p.count_base[s] = blocks_before, blocks_before += int(blocks);
    p.row_base[s] = int(partial_rows), partial_rows += int64_t(parts) * p.n[s];
  }
  const int limit = shared_memory_limit(), cap = tile_pass_rows(p.k, slot_bytes, limit);
  if (cap == 0) return false;
  p.count = products;
  p.partial_rows = int(partial_rows);
  p.partials = scratch.partials;
  p.counts = scratch.counts;
  p.slot_bytes = int(slot_bytes);
  p.group_chunks_shift = p.group_size == 128 ? 2 : p.group_size == 64 ? 1 : 0;
  const int64_t m = x.rows(), ldx = x.row_stride(), chunks = p.k / 32;
  const size_t out_size = dtype_size(out_dtype);
  const bool f32 = out_dtype == DType::f32;
  void* out0[kMaxTileProducts];
  for (int s = 0; s < products; ++s) out0[s] = p.out[s];
  const int grid = std::min(sms, units);
  for (int64_t r0 = 0; r0 < m; r0 += cap) {
    const int rows = int(std::min<int64_t>(cap, m - r0));
    for (int s = 0; s < products; ++s) p.out[s] = static_cast<char*>(out0[s]) + size_t(r0 * p.ldo[s]) * out_size;
    const bf16* xs = x.data_as<bf16>() + r0 * ldx;
    auto go = [&](auto M_tag, auto kernel, const ResidualRows<bf16>& update) {
      constexpr int M = decltype(M_tag)::value;
      const int64_t inputs = M * chunks * kChunkInputBytes;
      p.slots = int(std::min<int64_t>(kSlots, (limit - inputs) / slot_bytes));
      const size_t shared = size_t(p.slots) * size_t(slot_bytes) + size_t(inputs);
      allow_most_dynamic_shared(kernel);
      launch(kernel, grid, kTileThreads, shared, stream, p, xs, ldx, rows, f32, gelu, update, done);
    };
    dispatch_pass_rows(rows, [&](auto M_tag) {
      constexpr int M = decltype(M_tag)::value;
      if (glu) {
        go(M_tag, qtile_kernel<BITS, M, true, 0>, ResidualRows<bf16>{});
      } else if (residual) {
        if constexpr (M <= kMaxFusedResidualRows)
          dispatch_row_chunks(residual->residual.cols(), [&](auto chunks_tag) {
            go(M_tag, qtile_kernel<BITS, M, false, decltype(chunks_tag)::value>, residual_rows<bf16>(*residual));
          });
      } else {
        go(M_tag, qtile_kernel<BITS, M, false, 0>, ResidualRows<bf16>{});
      }
    });
  }
  return true;
}

bool tiled_alike(const Tensor& w, const Tensor& like, int64_t k) {
  return w.quantized() && w.quant().tiled_bytes && w.cols() == k && w.quant().bits == like.quant().bits &&
         w.quant().group_size == like.quant().group_size && w.rows() <= INT32_MAX / 2;
}

bool tiled_input(const Tensor& x) {
  return x.rows() >= 1 && x.dtype() == DType::bf16 && x.cols() % 32 == 0 &&
         reinterpret_cast<uintptr_t>(x.data()) % 16 == 0 && (x.row_stride() * 2) % 16 == 0;
}

bool tiled_output(const Tensor& out, const Tensor& first) {
  return (out.dtype() == DType::bf16 || out.dtype() == DType::f32) && out.dtype() == first.dtype();
}

void add_tiled(TileProducts& p, int s, const Tensor& w, const Tensor& out) {
  p.tiles[s] = static_cast<const unsigned char*>(w.data());
  p.n[s] = int(w.rows());
  p.out[s] = out.data();
  p.ldo[s] = out.cols() == w.rows() ? out.row_stride() : w.rows();
}

template <typename F>
bool with_tiled_bits(int bits, F&& f) {
  if (bits == 4) return f(std::integral_constant<int, 4>{});
  if (bits == 8) return f(std::integral_constant<int, 8>{});
  return false;
}

}  // namespace

bool tiled_gemv_many(const Tensor& x, const Tensor* weights, Tensor* outs, int count, const TileScratch& scratch,
                     cudaStream_t stream) {
  const int64_t k = x.cols();
  if (!tiled_input(x) || count < 1 || count > kMaxTileProducts) return false;
  for (int i = 0; i < count; ++i)
    if (!tiled_alike(weights[i], weights[0], k) || !tiled_output(outs[i], outs[0])) return false;
  TileProducts p{};
  p.count = count;
  p.k = int(k);
  p.group_size = weights[0].quant().group_size;
  for (int i = 0; i < count; ++i) add_tiled(p, i, weights[i], outs[i]);
  return with_tiled_bits(weights[0].quant().bits, [&](auto bits_tag) {
    return run_tiles<decltype(bits_tag)::value>(p, false, false, x, outs[0].dtype(), scratch, stream, nullptr, nullptr);
  });
}

bool tiled_glu_gemv(const Tensor& x, const Tensor& gate, const Tensor& up, Activation act, Tensor& out,
                    const TileScratch& scratch, cudaStream_t stream) {
  const int64_t k = x.cols();
  if (!tiled_input(x) || !tiled_alike(gate, gate, k) || !tiled_alike(up, gate, k) || up.rows() != gate.rows() ||
      !tiled_output(out, out))
    return false;
  TileProducts p{};
  p.count = 2;
  p.k = int(k);
  p.group_size = gate.quant().group_size;
  add_tiled(p, 0, gate, out);
  add_tiled(p, 1, up, out);
  return with_tiled_bits(gate.quant().bits, [&](auto bits_tag) {
    return run_tiles<decltype(bits_tag)::value>(p, true, act == Activation::gelu_tanh, x, out.dtype(), scratch, stream,
                                                nullptr, nullptr);
  });
}

bool tiled_gemv_residual_norm(const Tensor& x, const Tensor& w, const ResidualNormArgs& args, unsigned* done,
                              const TileScratch& scratch, cudaStream_t stream) {
  const int64_t m = x.rows(), k = x.cols(), n = args.residual.cols();
  const Tensor& out = args.block_out;
  if (m < 1 || m > kMaxFusedResidualRows || !tiled_input(x) || !tiled_alike(w, w, k) || w.rows() != n ||
      out.rows() != m || out.dtype() != DType::bf16 || args.residual.rows() != m || !row_norm_vectorizable(args))
    return false;
  TileProducts p{};
  p.count = 1;
  p.k = int(k);
  p.group_size = w.quant().group_size;
  add_tiled(p, 0, w, out);
  return with_tiled_bits(w.quant().bits, [&](auto bits_tag) {
    return run_tiles<decltype(bits_tag)::value>(p, false, false, x, DType::bf16, scratch, stream, &args, done);
  });
}

}  // namespace kiln::cuda
