// CUDA backend: a prefill's routed experts, grouped by expert.
//
// Prefill-sized calls with 64-aligned sizes run grouped by expert: read per pair, a prefill of T
// tokens would stream the experts' weights T·top_k times. The pairs are
// sorted by expert on the device (one block: counts, offsets, a scatter), then two grouped GEMMs
// run each expert's pairs as 64-row tiles against its weights on the tensor cores (mma.sync,
// operands through cp.async and ldmatrix): gate and up with the GLU in the epilogue, rounded to
// bf16 as a dense MLP's activations are, then down into f32 rows per pair, which the combine kernel
// weighs and adds per token in slot order. No host round trip: the grids are sized for the most row
// tiles routing can give (ceil(pairs / 64) + E) and blocks past the routed tiles return. A pair's
// row is computed from its own input row in a fixed k order wherever its tile places it, so the
// order of pairs within an expert (set by atomics) never changes a value.
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.cuh"
#include "backend/cuda/cuda_quant_codes.cuh"

namespace kiln::cuda {

namespace {

constexpr int kRowsPerTile = 64;  // pairs of one expert
constexpr int kColsPerTile = 64;  // output features
constexpr int kGroupedStepK = 32;
constexpr int kLead = kGroupedStepK + 8;  // shared-memory row stride (bf16): ldmatrix rows fall in distinct banks
constexpr int kGroupedThreads = 128;      // 2 x 2 warps of 32 x 32 outputs

// Sorts the pairs by expert: offsets[e] .. offsets[e + 1] of `sorted` are expert e's pair indices
// (token · top_k + slot), tile_starts[e] its first row tile; entry E holds the totals.
__global__ void __launch_bounds__(1024)
    group_pairs_kernel(const int32_t* ids, int pairs, int experts, int* offsets, int* tile_starts, int* sorted) {
  wait_for_inputs();
  __shared__ int count[kMaxRoutedExperts];
  __shared__ int cursor[kMaxRoutedExperts];
  auto expert_of = [&](int p) { return min(max(int(ids[p]), 0), experts - 1); };  // ids come from routing
  for (int e = threadIdx.x; e < experts; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) atomicAdd(&count[expert_of(p)], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int offset = 0, tiles = 0;
    for (int e = 0; e < experts; ++e) {
      offsets[e] = cursor[e] = offset;
      tile_starts[e] = tiles;
      offset += count[e];
      tiles += (count[e] + kRowsPerTile - 1) / kRowsPerTile;
    }
    offsets[experts] = offset;
    tile_starts[experts] = tiles;
  }
  __syncthreads();
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) sorted[atomicAdd(&cursor[expert_of(p)], 1)] = p;
}

// What one grouped GEMM reads and writes. GLU: A rows are the pairs' tokens' inputs (x, row
// pair / top_k), B the expert's gate and up, out the bf16 activations per pair. Down: A rows are
// the pairs' activations, B the expert's down, out f32 rows per pair.
struct GroupedGemm {
  const bf16* a;
  int64_t lda;
  int a_row_divisor;  // A row of a pair: pair / a_row_divisor
  QView b[2];         // expert stacks [E, n, k] (rows E·n): bf16 values or packed codes
  void* out;          // [pairs, n]
  int64_t n, k;
  const int* sorted;
  const int* offsets;
  const int* tile_starts;
  int experts;
  bool gelu;
};

// The expert whose row tiles hold tile `mt`: the last e with tile_starts[e] <= mt (experts without
// pairs share their successor's start and are passed over).
__device__ __forceinline__ int expert_of_tile(const int* tile_starts, int experts, int mt) {
  int lo = 0, hi = experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_starts[mid] <= mt)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// One 64 x 64 output tile of one expert's pairs: P = 2 multiplies gate and up and writes the GLU
// (bf16), P = 1 writes the product (f32). BITS = 16: bf16 weights, copied with cp.async; otherwise
// packed codes of that width, which threads fetch a step ahead into registers (thread i: row i % 64
// of matrix i / 64) and turn into bf16 rows of the next step's tile after this step's MMAs — w =
// s·q + b rounded to bf16, as the dense prefill's dequantized blocks (cuda_quant.cu).
template <int P, int BITS>
__global__ void __launch_bounds__(kGroupedThreads) grouped_expert_kernel(GroupedGemm g) {
  __shared__ __align__(16) bf16 a_tile[2][kRowsPerTile * kLead];
  __shared__ __align__(16) bf16 b_tile[2][P][kColsPerTile * kLead];
  wait_for_inputs();
  const int mt = blockIdx.y;
  if (mt >= g.tile_starts[g.experts]) return;
  const int e = expert_of_tile(g.tile_starts, g.experts, mt);
  const int first = g.offsets[e] + (mt - g.tile_starts[e]) * kRowsPerTile;
  const int rows = min(kRowsPerTile, g.offsets[e + 1] - first);
  const int64_t n0 = int64_t(blockIdx.x) * kColsPerTile;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;

  // Each thread copies two 16-byte chunks of every operand tile per k step: chunk c is row c / 4,
  // columns 8 (c % 4) .. + 8. Rows past the expert's pairs are zero-filled.
  const bf16* a_src[2];
  const bf16* b_src[2][P];
  bool a_in[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int c = tid + h * kGroupedThreads, r = c / 4, col = (c % 4) * 8;
    a_in[h] = r < rows;
    const int pair = a_in[h] ? g.sorted[first + r] : 0;
    a_src[h] = g.a + int64_t(pair / g.a_row_divisor) * g.lda + col;
#pragma unroll
    for (int p = 0; p < P; ++p)
      b_src[h][p] = BITS == 16 ? g.b[p].values + (int64_t(e) * g.n + n0 + r) * g.k + col : nullptr;
  }
  auto load = [&](int64_t k0, int buf) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c = tid + h * kGroupedThreads, r = c / 4, col = (c % 4) * 8;
      cp_async16(&a_tile[buf][r * kLead + col], a_src[h] + k0, a_in[h]);
      if constexpr (BITS == 16) {
#pragma unroll
        for (int p = 0; p < P; ++p) cp_async16(&b_tile[buf][p][r * kLead + col], b_src[h][p] + k0, true);
      }
    }
    cp_async_commit();
  };
  // packed weights: this thread's row of the B tile, its codes and group of one step in registers
  constexpr int kCodeWords = BITS == 16 ? 1 : BITS;
  const int b_matrix = P == 2 ? tid / kColsPerTile : 0, b_row = tid % kColsPerTile;
  const bool b_owner = BITS != 16 && (P == 2 || tid < kColsPerTile);
  const QView& bq = g.b[b_matrix];
  const int64_t weight_row = int64_t(e) * g.n + n0 + b_row;
  uint32_t codes[kCodeWords];
  bf16 scale, bias;
  auto fetch_codes = [&](int64_t step) {
    if constexpr (BITS != 16) {
      if (!b_owner) return;
      load_chunk<BITS>(bq.row_words(weight_row) + step * BITS, codes);
      const int64_t group = weight_row * bq.groups() + step * kGroupedStepK / bq.group_size;
      scale = bq.scales[group];
      bias = bq.biases[group];
    }
  };
  auto store_weights = [&](int buf) {
    if constexpr (BITS != 16) {
      if (!b_owner) return;
      float q[32];
      chunk_values<BITS>(codes, q);
      store_dequantized(q, __bfloat162float(scale), __bfloat162float(bias),
                        reinterpret_cast<uint4*>(&b_tile[buf][b_matrix][b_row * kLead]));
    }
  };

  const int wm = warp / 2, wn = warp % 2;  // the warp's 32 x 32 outputs
  float acc[P][2][4][4];
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int v = 0; v < 4; ++v) acc[p][i][j][v] = 0.0f;
  // ldmatrix addresses: A rows lane % 16 at k (lane / 16) · 8; B rows (lane % 8) + 8 (lane / 16)
  // at k 8 ((lane / 8) % 2), as in cuda_flash_prefill.cu
  const int a_off = (wm * 32 + lane % 16) * kLead + (lane / 16) * 8;
  const int b_off = (wn * 32 + (lane % 8) + 8 * (lane / 16)) * kLead + 8 * ((lane / 8) % 2);

  const int64_t steps = g.k / kGroupedStepK;
  load(0, 0);
  fetch_codes(0);
  store_weights(0);
  for (int64_t s = 0; s < steps; ++s) {
    const int buf = int(s & 1);
    cp_async_wait_all();
    __syncthreads();  // this step's tiles are in, and every warp is done with the other buffer
    if (s + 1 < steps) {
      load((s + 1) * kGroupedStepK, buf ^ 1);
      fetch_codes(s + 1);
    }
#pragma unroll
    for (int kk = 0; kk < kGroupedStepK / 16; ++kk) {
      unsigned a[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i) ldmatrix_x4(a[i], &a_tile[buf][a_off + i * 16 * kLead + kk * 16]);
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          unsigned b[4];
          ldmatrix_x4(b, &b_tile[buf][p][b_off + jj * 16 * kLead + kk * 16]);
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            mma_bf16(acc[p][i][2 * jj], a[i], b[0], b[1]);
            mma_bf16(acc[p][i][2 * jj + 1], a[i], b[2], b[3]);
          }
        }
    }
    if (s + 1 < steps) store_weights(buf ^ 1);  // read at the next step, after its barrier
  }

  // element v of fragment (i, j): row 16 i + g + 8 (v / 2), column 8 j + 2 t + v % 2 of the warp's
  const int gr = lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int v2 = 0; v2 < 2; ++v2) {
      const int r = wm * 32 + 16 * i + gr + 8 * v2;
      if (r >= rows) continue;
      const int64_t pair = g.sorted[first + r];
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int v1 = 0; v1 < 2; ++v1) {
          const int v = 2 * v2 + v1;
          const int64_t col = n0 + wn * 32 + 8 * j + 2 * t + v1;
          if constexpr (P == 2) {
            const float gate = acc[0][i][j][v], up = acc[1][i][j][v];
            static_cast<bf16*>(g.out)[pair * g.n + col] =
                __float2bfloat16((g.gelu ? gelu_tanh(gate) : silu(gate)) * up);
          } else {
            static_cast<float*>(g.out)[pair * g.n + col] = acc[0][i][j][v];
          }
        }
    }
}

// Weights the grouped GEMMs read: bf16 stacks, or packed codes with bf16 scales and biases.
bool grouped_weights(const Tensor& w) {
  if (!w.quantized()) return w.dtype() == DType::bf16 && w.contiguous();
  const QuantParams& q = w.quant();
  return q.tiled_bytes == 0 && q.scales.dtype() == DType::bf16 && q.biases.dtype() == DType::bf16 &&
         q.scales.contiguous() && q.biases.contiguous() && reinterpret_cast<uintptr_t>(w.data()) % 16 == 0;
}

// The width a launch's template takes: 16 for bf16 weights.
int weight_bits(const Tensor& w) {
  return w.quantized() ? w.quant().bits : 16;
}

template <typename F>
void with_weight_bits(int bits, F&& f) {
  if (bits == 16)
    f(std::integral_constant<int, 16>{});
  else
    with_bits(bits, f);
}

// Prefill-sized calls (more tokens than the per-pair tensor-core kernels take) whose sizes are
// multiples of the tiles; gate and up alike (both bf16, or packed at one width).
bool grouped_shape(const MoeExpertsArgs& args) {
  const int64_t hidden = args.x.cols(), inter = args.gate.dim(1), experts = args.gate.dim(0);
  return args.x.rows() > kMaxDecodeExpertTokens && args.x.dtype() == DType::bf16 && args.x.row_stride() % 8 == 0 &&
         reinterpret_cast<uintptr_t>(args.x.data()) % 16 == 0 && grouped_weights(args.gate) &&
         grouped_weights(args.up) && grouped_weights(args.down) && weight_bits(args.gate) == weight_bits(args.up) &&
         hidden % kColsPerTile == 0 && inter % kColsPerTile == 0 && experts <= kMaxRoutedExperts &&
         args.ids.contiguous() && args.weights.contiguous();
}

void moe_experts_grouped(const MoeExpertsArgs& args, const Allocate& allocate, cudaStream_t stream) {
  const int64_t tokens = args.x.rows(), hidden = args.x.cols();
  const int64_t experts = args.gate.dim(0), inter = args.gate.dim(1);
  const int top_k = int(args.ids.cols());
  const int64_t pairs = tokens * top_k;
  Tensor sorted = allocate(DType::i32, Shape{pairs});
  Tensor offsets = allocate(DType::i32, Shape{2, experts + 1});  // offsets, then tile starts
  Tensor act = allocate(DType::bf16, Shape{pairs, inter});
  Tensor y = allocate(DType::f32, Shape{pairs, hidden});
  int* offs = offsets.data_as<int32_t>();
  int* tile_starts = offs + experts + 1;
  launch(group_pairs_kernel, 1, 1024, 0, stream, args.ids.data_as<int32_t>(), int(pairs), int(experts), offs,
         tile_starts, sorted.data_as<int32_t>());
  const unsigned row_tiles = unsigned(ceil_div(pairs, kRowsPerTile) + experts);  // the most routing can give
  GroupedGemm up{.a = args.x.data_as<bf16>(),
                 .lda = args.x.row_stride(),
                 .a_row_divisor = top_k,
                 .b = {view_of(args.gate), view_of(args.up)},
                 .out = act.data(),
                 .n = inter,
                 .k = hidden,
                 .sorted = sorted.data_as<int32_t>(),
                 .offsets = offs,
                 .tile_starts = tile_starts,
                 .experts = int(experts),
                 .gelu = args.act == Activation::gelu_tanh};
  with_weight_bits(weight_bits(args.gate), [&](auto bits) {
    launch(grouped_expert_kernel<2, decltype(bits)::value>, dim3(unsigned(inter / kColsPerTile), row_tiles),
           kGroupedThreads, 0, stream, up);
  });
  GroupedGemm down = up;
  down.a = act.data_as<bf16>();
  down.lda = inter;
  down.a_row_divisor = 1;
  down.b[0] = view_of(args.down);
  down.b[1] = QView{};
  down.out = y.data();
  down.n = hidden;
  down.k = inter;
  with_weight_bits(weight_bits(args.down), [&](auto bits) {
    launch(grouped_expert_kernel<1, decltype(bits)::value>, dim3(unsigned(hidden / kColsPerTile), row_tiles),
           kGroupedThreads, 0, stream, down);
  });
  combine_experts(y, args.weights, args.out, stream);
}

}  // namespace

bool grouped_moe_experts(const MoeExpertsArgs& args, const Allocate& allocate, cudaStream_t stream) {
  if (args.x.rows() * args.ids.cols() == 0 || !grouped_shape(args)) return false;
  moe_experts_grouped(args, allocate, stream);
  return true;
}

}  // namespace kiln::cuda
