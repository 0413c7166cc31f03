// The CUDA kernels for quantized weights against the CPU reference on the same packed weights:
// the fused GEMV (up to 32 rows, 8 per pass; alone, several products in one launch, and the GLU
// product; some with several tiles a warp), its batch invariance, the blocked dequantize + cuBLAS
// product, embedding rows and the routed experts, for every width and group size on odd sizes; then
// every quantized fixture end to end. The kernel tests run on both GPU layouts of 4- and 8-bit
// matrices (MLX's rows, and the tiles of the streamed products).
// Skipped, visibly, where no GPU is present.
#include <cmath>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "gpu_test_util.h"
#include "models/model.h"
#include "quant/tiles.h"
#include "quant_test_util.h"
#include "runtime/prefill.h"
#include "test_util.h"

namespace kiln::test {
namespace {

// Every test runs on both layouts of the GPU's 4- and 8-bit matrices: MLX's rows (the default) and
// the tiled layout of the streamed products (src/quant/tiles.h).
class GpuQuant : public GpuTest, public testing::WithParamInterface<bool> {
 protected:
  GpuQuant() : GpuTest(17) {}

  void SetUp() override {
    if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
    auto made = make_cuda_backend(0, CudaBackendOptions{.tiled_quantized_weights = GetParam()});
    ASSERT_TRUE(made.ok()) << made.error().message;
    gpu = std::move(made).value();
  }

  // The routed experts on both backends, the same host weights (gate and up packed, down packed or
  // dense): the GPU's f32 output against the CPU's, as max |Δ| / max |want|.
  double experts_error(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& gate, const Tensor& up,
                       const Tensor& down, Activation act) {
    Tensor want = cpu.alloc(DType::f32, Shape{x.rows(), x.cols()});
    cpu.moe_experts(
        {.x = x, .ids = ids, .weights = weights, .gate = gate, .up = up, .down = down, .out = want, .act = act});
    Tensor got = gpu->alloc(DType::f32, Shape{x.rows(), x.cols()});
    gpu->moe_experts({.x = gpu->upload(x, DType::bf16),
                      .ids = gpu->upload(ids, DType::i32),
                      .weights = gpu->upload(weights, DType::f32),
                      .gate = gpu->upload_quantized(gate),
                      .up = gpu->upload_quantized(up),
                      .down = down.quantized() ? gpu->upload_quantized(down) : gpu->upload(down, DType::bf16),
                      .out = got,
                      .act = act});
    return rel(gpu->to_host(got), want);
  }
};

// Tolerances, as max |got - want| / max |want| against the CPU's f32 product of the same packed
// weights: an f32 output differs in the order of f32 sums, and by the GEMV's int16 inputs (2, 4, 8
// bits: steps of 2^-16 of a 32-element chunk's largest value) or offset codes (3, 5, 6 bits: ~5 of
// f32's 24 bits); a bf16 output adds one rounding (2^-9 relative); the cuBLAS path (more than 32
// rows) rounds the dequantized weights to bf16.
// The int16 inputs' error over a whole row is ~1e-5 of the largest output, but with two outputs the
// largest can be small: 2.6e-4 was seen on an H200.
constexpr double kF32Tol = 1e-4, kIntegerF32Tol = 5e-4, kBf16Tol = 5e-3, kCublasTol = 1e-2;

double tolerance(DType out, int64_t m, int bits) {
  const bool integer_inputs = bits == 2 || bits == 4 || bits == 8;
  return m > 32 ? kCublasTol : out == DType::bf16 ? kBf16Tol : integer_inputs ? kIntegerF32Tol : kF32Tol;
}

// Bit equality of two host tensors of one shape.
::testing::AssertionResult same_bits(const Tensor& a, const Tensor& b) {
  for (int64_t i = 0; i < b.numel(); ++i)
    if (std::memcmp(&a.data_as<float>()[i], &b.data_as<float>()[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure()
             << "element " << i << ": " << a.data_as<float>()[i] << " vs " << b.data_as<float>()[i];
  return ::testing::AssertionSuccess();
}

TEST_P(GpuQuant, MatmulEveryWidthAndGroup) {
  // n: fewer rows than a warp computes, and counts that are no multiple of a warp's or a block's
  // rows; k: a few chunks (some lanes idle), 100 chunks (lanes run three or four iterations, both
  // buffers of the loop), and 132 chunks, which these few rows split over a block's warps
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int group : {32, 64, 128})
      for (int64_t k : {int64_t(3 * group + (group == 32 ? 64 : 0)), int64_t(3200), int64_t(4224)})
        for (int64_t n : {2, 31, 33}) {
          Tensor w = random_quantized(rng, Shape{n, k}, bits, group);  // bf16 scales, as the GPU keeps them
          Tensor wg = gpu->upload_quantized(w);
          for (int64_t m : {1, 3, 8, 9, 17, 32, 33}) {
            Tensor x = random(Shape{m, k});
            Tensor want = cpu.alloc(DType::f32, Shape{m, n});
            cpu.matmul(x, w, want);
            Tensor xg = gpu->upload(x, DType::bf16);
            for (DType out : {DType::f32, DType::bf16}) {
              Tensor got = gpu->alloc(out, Shape{m, n});
              gpu->matmul(xg, wg, got);
              EXPECT_LT(rel(gpu->to_host(got), want), tolerance(out, m, bits))
                  << bits << " bits, group " << group << ", " << m << "x" << n << "x" << k << ", " << dtype_name(out);
            }
          }
        }
}

// Several products of one input in one launch: each as the CPU computes it, and bit for bit what the
// product alone gives; then products of different widths, which fall back to one launch each.
TEST_P(GpuQuant, FusedProducts) {
  const int64_t k = 640;
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    const int group = bits == 4 ? 64 : bits % 2 ? 128 : 32;
    std::vector<Tensor> weights = {
        random_quantized(rng, Shape{31, k}, bits, group), random_quantized(rng, Shape{64, k}, bits, group),
        random_quantized(rng, Shape{9, k}, bits, group), random_quantized(rng, Shape{3, k}, bits, group)};
    std::vector<Tensor> on_gpu;
    for (const Tensor& w : weights) on_gpu.push_back(gpu->upload_quantized(w));
    for (int64_t m : {1, 3, 8, 9, 32})
      for (DType out : {DType::f32, DType::bf16}) {
        Tensor x = random(Shape{m, k});
        Tensor xg = gpu->upload(x, DType::bf16);
        std::vector<MatmulProduct> products;
        for (const Tensor& w : on_gpu) products.push_back({w, gpu->alloc(out, Shape{m, w.rows()})});
        gpu->matmul_many(xg, products);
        for (size_t i = 0; i < weights.size(); ++i) {
          Tensor want = cpu.alloc(DType::f32, Shape{m, weights[i].rows()});
          cpu.matmul(x, weights[i], want);
          Tensor got = gpu->to_host(products[i].out);
          EXPECT_LT(rel(got, want), tolerance(out, m, bits)) << bits << " bits, " << m << " rows, product " << i;
          Tensor alone = gpu->alloc(out, Shape{m, weights[i].rows()});
          gpu->matmul(xg, on_gpu[i], alone);
          EXPECT_TRUE(same_bits(got, gpu->to_host(alone))) << bits << " bits, " << m << " rows, product " << i;
        }
      }
  }
  // widths differ: no fused launch, the same values
  const int64_t m = 3;
  Tensor x = random(Shape{m, k});
  std::vector<Tensor> weights = {random_quantized(rng, Shape{40, k}, 4, 64), random_quantized(rng, Shape{24, k}, 8, 64),
                                 random_quantized(rng, Shape{17, k}, 4, 32)};
  std::vector<MatmulProduct> products;
  for (const Tensor& w : weights)
    products.push_back({gpu->upload_quantized(w), gpu->alloc(DType::f32, Shape{m, w.rows()})});
  gpu->matmul_many(gpu->upload(x, DType::bf16), products);
  for (size_t i = 0; i < weights.size(); ++i) {
    Tensor want = cpu.alloc(DType::f32, Shape{m, weights[i].rows()});
    cpu.matmul(x, weights[i], want);
    EXPECT_LT(rel(gpu->to_host(products[i].out), want), kIntegerF32Tol) << "product " << i;
  }
}

// out = act(x · gateᵀ) ⊙ (x · upᵀ) in one launch over quantized gate and up.
TEST_P(GpuQuant, GluProduct) {
  const int64_t n = 45;           // no multiple of a warp's rows
  for (int64_t k : {2560, 4096})  // 4096: the chunks split over a block's warps
    for (int bits : {2, 3, 4, 5, 6, 8}) {
      const int group = bits == 4 ? 64 : bits % 2 ? 32 : 128;
      Tensor gate = random_quantized(rng, Shape{n, k}, bits, group),
             up = random_quantized(rng, Shape{n, k}, bits, group);
      Tensor gate_g = gpu->upload_quantized(gate), up_g = gpu->upload_quantized(up);
      for (int64_t m : {1, 3, 8, 9, 32}) {
        Tensor x = random(Shape{m, k}, 0.05f);  // gate values of a few units, where both activations bend
        Tensor xg = gpu->upload(x, DType::bf16);
        for (Activation act : {Activation::silu, Activation::gelu_tanh}) {
          Tensor want = cpu.alloc(DType::f32, Shape{m, n});
          cpu.glu_matmul(x, gate, up, act, want);
          for (DType out : {DType::f32, DType::bf16}) {
            Tensor got = gpu->alloc(out, Shape{m, n});
            gpu->glu_matmul(xg, gate_g, up_g, act, got);
            // the activation's slope (at most ~1.1) passes the gate's error on
            EXPECT_LT(rel(gpu->to_host(got), want), 2 * tolerance(out, m, bits))
                << bits << " bits, " << m << " rows, " << (act == Activation::silu ? "silu" : "gelu_tanh") << ", "
                << dtype_name(out);
          }
        }
      }
    }
}

// Products large enough that a warp runs several tiles of several iterations each through its two
// register buffers (the loads of a tile's first iterations go out while the tile before is finished):
// plain and GLU products at 2, 4 and 8 bits, 65 groups a row (scales and biases at odd and even
// offsets), one and several input rows.
TEST_P(GpuQuant, ProductsWithManyTilesAWarp) {
  const int64_t n = 12000, k = 4160;
  for (int bits : {2, 4, 8}) {
    Tensor gate = random_quantized(rng, Shape{n, k}, bits, 64), up = random_quantized(rng, Shape{n, k}, bits, 64);
    Tensor gate_g = gpu->upload_quantized(gate), up_g = gpu->upload_quantized(up);
    for (int64_t m : {1, 3, 8}) {
      Tensor x = random(Shape{m, k}, 0.05f);
      Tensor xg = gpu->upload(x, DType::bf16);
      Tensor want = cpu.alloc(DType::f32, Shape{m, n}), want_glu = cpu.alloc(DType::f32, Shape{m, n});
      cpu.matmul(x, gate, want);
      cpu.glu_matmul(x, gate, up, Activation::silu, want_glu);
      Tensor got = gpu->alloc(DType::f32, Shape{m, n}), got_glu = gpu->alloc(DType::f32, Shape{m, n});
      gpu->matmul(xg, gate_g, got);
      gpu->glu_matmul(xg, gate_g, up_g, Activation::silu, got_glu);
      EXPECT_LT(rel(gpu->to_host(got), want), tolerance(DType::f32, m, bits)) << bits << " bits, " << m << " rows";
      EXPECT_LT(rel(gpu->to_host(got_glu), want_glu), 2 * tolerance(DType::f32, m, bits))
          << bits << " bits, " << m << " rows, GLU";
    }
  }
}

// A row of a product of many rows gets exactly the bits it gets alone (up to 32 rows, the GEMV's
// limit): plain, fused and GLU products, for widths that give a warp four rows (3, 4 bits) and two
// (8 bits) at one input row.
TEST_P(GpuQuant, ProductRowsAreBatchInvariant) {
  const int64_t n = 77;
  // 4096: the chunks split over a block's warps; 24576: fewer than 8 input rows a pass (2, 4, 8 bits)
  for (int64_t k : {1024, 4096, 24576})
    for (int bits : {3, 4, 8}) {
      Tensor w = random_quantized(rng, Shape{n, k}, bits, 64), gate = random_quantized(rng, Shape{n, k}, bits, 64);
      Tensor other = random_quantized(rng, Shape{13, k}, bits, 64);
      Tensor wg = gpu->upload_quantized(w), gate_g = gpu->upload_quantized(gate),
             other_g = gpu->upload_quantized(other);
      for (int64_t m : {2, 3, 8, 9, 13, 32}) {
        Tensor xg = gpu->upload(random(Shape{m, k}), DType::bf16);
        Tensor all = gpu->alloc(DType::f32, Shape{m, n}), all_glu = gpu->alloc(DType::f32, Shape{m, n});
        gpu->matmul(xg, wg, all);
        gpu->glu_matmul(xg, gate_g, wg, Activation::gelu_tanh, all_glu);
        Tensor all_fused = gpu->alloc(DType::f32, Shape{m, 13}), all_fused_w = gpu->alloc(DType::f32, Shape{m, n});
        gpu->matmul_many(xg, std::vector<MatmulProduct>{{other_g, all_fused}, {wg, all_fused_w}});
        const Tensor all_host = gpu->to_host(all), glu_host = gpu->to_host(all_glu),
                     fused_host = gpu->to_host(all_fused);
        EXPECT_TRUE(same_bits(gpu->to_host(all_fused_w), all_host)) << bits << " bits, " << m << " rows";
        for (int64_t r = 0; r < m; ++r) {
          Tensor one = gpu->alloc(DType::f32, Shape{1, n}), one_glu = gpu->alloc(DType::f32, Shape{1, n});
          Tensor one_fused = gpu->alloc(DType::f32, Shape{1, 13});
          gpu->matmul(xg.rows_view(r, 1), wg, one);
          gpu->glu_matmul(xg.rows_view(r, 1), gate_g, wg, Activation::gelu_tanh, one_glu);
          gpu->matmul(xg.rows_view(r, 1), other_g, one_fused);
          const Tensor one_host = gpu->to_host(one), one_glu_host = gpu->to_host(one_glu);
          const Tensor one_fused_host = gpu->to_host(one_fused);
          for (int64_t c = 0; c < n; ++c) {
            ASSERT_EQ(one_host.data_as<float>()[c], all_host.data_as<float>()[r * n + c])
                << bits << " bits, " << m << " rows, row " << r << ", column " << c;
            ASSERT_EQ(one_glu_host.data_as<float>()[c], glu_host.data_as<float>()[r * n + c])
                << bits << " bits, " << m << " rows, row " << r << ", column " << c;
          }
          for (int64_t c = 0; c < 13; ++c)
            ASSERT_EQ(one_fused_host.data_as<float>()[c], fused_host.data_as<float>()[r * 13 + c])
                << bits << " bits, " << m << " rows, row " << r << ", column " << c;
        }
      }
    }
}

// From twelve input rows the 4-bit products run on the tensor cores (MLX's rows); each row must still
// get the bits it gets alone (the dp2a kernel): every group size, runs of 32 chunks cut short (20 and
// 80 chunks) or whole (128), one or two tiles of input rows a pass, a pass cut by the shared memory
// (4,096 columns: 24 rows, then 8 by dp2a) or too short for the tensor cores (9,216 columns: 10
// rows), tiles of weight rows cut short, plain, fused and GLU products, f32 and bf16 outputs.
TEST_P(GpuQuant, FourBitRowsOnTheTensorCoresMatchRowsAlone) {
  for (int group : {32, 64, 128})
    for (int64_t k : {640, 2560, 4096, 9216}) {
      if (group != 64 && (k == 4096 || k == 9216)) continue;
      Tensor w = random_quantized(rng, Shape{45, k}, 4, group), up = random_quantized(rng, Shape{45, k}, 4, group);
      Tensor other = random_quantized(rng, Shape{21, k}, 4, group);
      Tensor wg = gpu->upload_quantized(w), up_g = gpu->upload_quantized(up), other_g = gpu->upload_quantized(other);
      for (int64_t m : {3, 12, 16, 17, 23, 32})
        for (DType out : {DType::f32, DType::bf16}) {
          Tensor x = random(Shape{m, k}, 0.05f);
          Tensor xg = gpu->upload(x, DType::bf16);
          Tensor all = gpu->alloc(out, Shape{m, 45}), all_glu = gpu->alloc(out, Shape{m, 45});
          Tensor all_other = gpu->alloc(out, Shape{m, 21}), all_w = gpu->alloc(out, Shape{m, 45});
          gpu->matmul(xg, wg, all);
          gpu->glu_matmul(xg, wg, up_g, Activation::silu, all_glu);
          gpu->matmul_many(xg, std::vector<MatmulProduct>{{other_g, all_other}, {wg, all_w}});
          ASSERT_TRUE(gpu->status().ok()) << gpu->status().error().message;
          Tensor want = cpu.alloc(DType::f32, Shape{m, 45});
          cpu.matmul(x, w, want);
          const std::string where = fmt::format("group {}, {}x45x{}, {}", group, m, k, dtype_name(out));
          EXPECT_LT(rel(gpu->to_host(all), want), tolerance(out, m, 4)) << where;
          const Tensor all_host = gpu->to_host(all), glu_host = gpu->to_host(all_glu),
                       other_host = gpu->to_host(all_other);
          EXPECT_TRUE(same_bits(gpu->to_host(all_w), all_host)) << where;
          for (int64_t r = 0; r < m; ++r) {
            Tensor one = gpu->alloc(out, Shape{1, 45}), one_glu = gpu->alloc(out, Shape{1, 45});
            Tensor one_other = gpu->alloc(out, Shape{1, 21});
            gpu->matmul(xg.rows_view(r, 1), wg, one);
            gpu->glu_matmul(xg.rows_view(r, 1), wg, up_g, Activation::silu, one_glu);
            gpu->matmul(xg.rows_view(r, 1), other_g, one_other);
            EXPECT_TRUE(same_bits(gpu->to_host(one), all_host.rows_view(r, 1))) << where << ", row " << r;
            EXPECT_TRUE(same_bits(gpu->to_host(one_glu), glu_host.rows_view(r, 1))) << where << ", GLU, row " << r;
            EXPECT_TRUE(same_bits(gpu->to_host(one_other), other_host.rows_view(r, 1)))
                << where << ", fused, row " << r;
          }
        }
    }
}

// A block's quantized output projection and the residual update after it in one launch (2, 4 and 8
// bits): as the CPU computes them, and bit for bit what the product and the update give apart.
TEST_P(GpuQuant, ProductWithResidualNorm) {
  const int64_t k = 4096;
  for (int bits : {2, 4, 8})
    for (int64_t n : {2560, 160, 5120})  // 5120: four row chunks a thread in the update
      for (int64_t m : {1, 2, 3}) {
        const bool block_norm = m != 2;
        Tensor x = random(Shape{m, k}, 0.5f), h = random(Shape{m, n});
        Tensor w = random_quantized(rng, Shape{n, k}, bits, bits == 8 ? 32 : 64);
        Tensor wb = random(Shape{n}), wn = random(Shape{n});
        Tensor xg = gpu->upload(x, DType::bf16), wg = gpu->upload_quantized(w), wbg = gpu->upload(wb, DType::f32),
               wng = gpu->upload(wn, DType::f32);
        auto args = [&](Backend& b, const Tensor& residual, DType dt) {
          return ResidualNormArgs{.residual = residual,
                                  .block_out = b.alloc(dt, Shape{m, n}),
                                  .block_norm = block_norm ? (dt == DType::f32 ? wb : wbg) : Tensor(),
                                  .next = b.alloc(dt, Shape{m, n}),
                                  .next_norm = dt == DType::f32 ? wn : wng,
                                  .eps = 1e-6f,
                                  .norm_offset = 1.0f,
                                  .scale = 1.0f};
        };
        Tensor h_cpu = cpu.alloc(DType::f32, Shape{m, n});  // updated in place; h stays the input
        cpu.copy(h, h_cpu);
        ResidualNormArgs want = args(cpu, h_cpu, DType::f32);
        cpu.matmul_residual_norm(x, w, want);
        for (int repeat = 0; repeat < 2; ++repeat) {  // the second launch finds its block count reset
          Tensor hg = gpu->upload(h, DType::bf16), hs = gpu->upload(h, DType::bf16);
          ResidualNormArgs fused = args(*gpu, hg, DType::bf16), split = args(*gpu, hs, DType::bf16);
          gpu->matmul_residual_norm(xg, wg, fused);
          Tensor out = split.block_out;
          gpu->matmul(xg, wg, out);
          gpu->residual_norm(split);
          ASSERT_TRUE(gpu->status().ok()) << gpu->status().error().message;
          EXPECT_LT(rel(gpu->to_host(hg), want.residual), 1e-2) << bits << " bits, " << n << " " << m;
          EXPECT_LT(rel(gpu->to_host(fused.next), want.next), 2e-2) << bits << " bits, " << n << " " << m;
          for (auto [a, b] : {std::pair{hg, hs}, std::pair{fused.next, split.next}, std::pair{fused.block_out, out}})
            EXPECT_TRUE(same_bits(gpu->to_host(a), gpu->to_host(b))) << bits << " bits, " << n << " " << m;
        }
      }
}

// 4- and 8-bit matrices in the tiled layout are one buffer of codes, scales and biases (other widths
// keep MLX's rows), and their products stream it: a short last row block, a short last slice, and
// few row blocks over many slices (each row block's columns split over SMs, the partial sums added
// by its last split), plain and GLU, one to nine input rows.
TEST_P(GpuQuant, ProductsOverSlicesAndSplits) {
  Tensor three = random_quantized(rng, Shape{8, 256}, 3, 64);
  EXPECT_EQ(gpu->upload_quantized(three).quant().tiled_bytes, 0u);  // other widths keep MLX's rows
  struct Case {
    int64_t n, k;
    int bits, group;
  };
  for (const Case& c : {Case{40, 4160, 4, 64}, Case{64, 15360, 4, 128}, Case{33, 5120, 8, 32}}) {
    Tensor gate = random_quantized(rng, Shape{c.n, c.k}, c.bits, c.group),
           up = random_quantized(rng, Shape{c.n, c.k}, c.bits, c.group);
    Tensor gate_g = gpu->upload_quantized(gate), up_g = gpu->upload_quantized(up);
    const quant::TileLayout layout = quant::tile_layout(gate);
    EXPECT_EQ(gate_g.quant().tiled_bytes, GetParam() ? size_t(layout.total_bytes()) : 0u);
    EXPECT_EQ(gate_g.stored_bytes(), GetParam() ? size_t(layout.total_bytes()) : gate.stored_bytes());
    EXPECT_GT(layout.slices(), 2);
    for (int64_t m : {1, 2, 5, 9}) {
      Tensor x = random(Shape{m, c.k}, 0.05f);
      Tensor xg = gpu->upload(x, DType::bf16);
      Tensor want = cpu.alloc(DType::f32, Shape{m, c.n}), want_glu = cpu.alloc(DType::f32, Shape{m, c.n});
      cpu.matmul(x, gate, want);
      cpu.glu_matmul(x, gate, up, Activation::silu, want_glu);
      Tensor got = gpu->alloc(DType::f32, Shape{m, c.n}), got_glu = gpu->alloc(DType::f32, Shape{m, c.n});
      for (int repeat = 0; repeat < 2; ++repeat) {  // the second launch finds the split counts reset
        gpu->matmul(xg, gate_g, got);
        gpu->glu_matmul(xg, gate_g, up_g, Activation::silu, got_glu);
        ASSERT_TRUE(gpu->status().ok()) << gpu->status().error().message;
        EXPECT_LT(rel(gpu->to_host(got), want), tolerance(DType::f32, m, c.bits))
            << c.n << "x" << c.k << ", " << m << " rows";
        EXPECT_LT(rel(gpu->to_host(got_glu), want_glu), 2 * tolerance(DType::f32, m, c.bits))
            << c.n << "x" << c.k << ", " << m << " rows, GLU";
      }
    }
  }
}

TEST_P(GpuQuant, MatmulBf16OutputAndStridedInput) {
  const int64_t m = 5, n = 97, k = 256;
  Tensor w = random_quantized(rng, Shape{n, k}, 4, 64);
  Tensor x = random(Shape{m, 2 * k});
  Tensor want = cpu.alloc(DType::f32, Shape{m, n});
  cpu.matmul(x.cols_view(k, k), w, want);
  Tensor xg = gpu->upload(x, DType::bf16);
  Tensor got = gpu->alloc(DType::bf16, Shape{m, n});
  gpu->matmul(xg.cols_view(k, k), gpu->upload_quantized(w), got);
  EXPECT_LT(rel(gpu->to_host(got), want), 1e-2);
}

TEST_P(GpuQuant, PrefillProductSpansSeveralDequantizedBlocks) {
  const int64_t m = 40, n = 20011, k = 4096;  // blocks of 16384 rows of 4096
  Tensor w = random_quantized(rng, Shape{n, k}, 4, 64);
  Tensor x = random(Shape{m, k}, 0.1f);
  Tensor want = cpu.alloc(DType::f32, Shape{m, n});
  cpu.matmul(x, w, want);
  Tensor got = gpu->alloc(DType::f32, Shape{m, n});
  gpu->matmul(gpu->upload(x, DType::bf16), gpu->upload_quantized(w), got);
  EXPECT_LT(rel(gpu->to_host(got), want), 1e-2);
}

TEST_P(GpuQuant, Embed) {
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    Tensor table = random_quantized(rng, Shape{53, 160}, bits, 32);
    Tensor ids = host_tensor(DType::i32, Shape{7});
    for (int i = 0; i < 7; ++i) ids.data_as<int32_t>()[i] = (i * 13 + 5) % 53;
    Tensor want = cpu.alloc(DType::f32, Shape{7, 160});
    cpu.embed(ids, table, 3.0f, want);
    Tensor got = gpu->alloc(DType::f32, Shape{7, 160});
    gpu->embed(gpu->upload(ids, DType::i32), gpu->upload_quantized(table), 3.0f, got);
    EXPECT_LT(rel(gpu->to_host(got), want), 1e-5) << bits << " bits";
  }
}

// A dense stand-in for a packed matrix: its dequantized values rounded to bf16, which both backends
// then multiply exactly alike.
Tensor bf16_exact_dequantized(const Tensor& q) {
  Tensor d = dequantized(q);
  for (int64_t i = 0; i < d.numel(); ++i) d.data_as<float>()[i] = bf16_to_f32(f32_to_bf16(d.data_as<float>()[i]));
  return d;
}

// Routing of `tokens` tokens to top_k of the first `routed` experts, every one of them used, with
// weights of a few sizes.
void route_evenly(int64_t tokens, int top_k, int routed, Tensor& ids, Tensor& weights) {
  ids = host_tensor(DType::i32, Shape{tokens, top_k});
  weights = host_tensor(DType::f32, Shape{tokens, top_k});
  for (int64_t i = 0; i < tokens * top_k; ++i) {
    ids.data_as<int32_t>()[i] = int32_t((i * 7 + i / top_k) % routed);
    weights.data_as<float>()[i] = 0.2f + 0.1f * float(i % 4);
  }
}

TEST_P(GpuQuant, RoutedExperts) {
  const int64_t tokens = 19, hidden = 96, inter = 64, experts = 10;
  const int top_k = 3;
  for (int bits : {3, 4, 8}) {
    Tensor gate = random_quantized(rng, Shape{experts, inter, hidden}, bits, 32);
    Tensor up = random_quantized(rng, Shape{experts, inter, hidden}, bits, 32);
    // a dense down projection beside quantized gate and up, as when its input size is not a
    // multiple of the group size
    const bool dense_down = bits == 8;
    Tensor down = random_quantized(rng, Shape{experts, hidden, inter}, bits, 32);
    if (dense_down) down = bf16_exact_dequantized(down);
    Tensor x = random(Shape{tokens, hidden}, 0.5f);
    Tensor ids, weights;
    route_evenly(tokens, top_k, int(experts), ids, weights);
    EXPECT_LT(experts_error(x, ids, weights, gate, up, down, Activation::silu), 1e-3) << bits << " bits";
  }
}

// A prefill's routed experts grouped by expert (more than 32 tokens, sizes multiples of 64): every
// width, group sizes 32 to 128, a dense down projection beside packed gate and up, two experts no
// pair is routed to. The GEMMs round the dequantized weights and the GLU output to bf16.
TEST_P(GpuQuant, RoutedExpertsGroupedForPrefill) {
  const int64_t tokens = 100, hidden = 128, inter = 64, experts = 12, routed = 10;
  const int top_k = 3;
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    const int group = bits % 2 ? 64 : bits == 4 ? 128 : 32;
    Tensor gate = random_quantized(rng, Shape{experts, inter, hidden}, bits, group);
    Tensor up = random_quantized(rng, Shape{experts, inter, hidden}, bits, group);
    const bool dense_down = bits == 6;
    Tensor down = random_quantized(rng, Shape{experts, hidden, inter}, bits, 32);
    if (dense_down) down = bf16_exact_dequantized(down);
    Tensor x = random(Shape{tokens, hidden}, 0.5f);
    Tensor ids, weights;
    route_evenly(tokens, top_k, int(routed), ids, weights);
    for (Activation act : {Activation::silu, Activation::gelu_tanh})
      EXPECT_LT(experts_error(x, ids, weights, gate, up, down, act), 1e-2) << bits << " bits";
  }
}

// Whole quantized models: GPU logits against the CPU's on the same packed weights (and, where the
// transformers reference is present, the oracle tests of test_gpu.cpp cover them too).

std::vector<float> run_model(Backend& backend, const std::string& fixture, const std::vector<int32_t>& ids,
                             int64_t chunk) {
  auto model = load_model(fixture_path(fixture), backend, ModelOptions{.max_chunk_tokens = chunk});
  EXPECT_TRUE(model.ok()) << (model.ok() ? "" : model.error().message);
  if (!model.ok()) return {};
  auto state = (*model)->new_sequence(int64_t(ids.size()));
  auto logits = run_tokens(**model, **state, ids, chunk, LogitRows::all);  // host f32, whatever the backend
  EXPECT_TRUE(logits.ok()) << (logits.ok() ? "" : logits.error().message);
  if (!logits.ok()) return {};
  return std::vector<float>(logits->data_as<float>(), logits->data_as<float>() + logits->numel());
}

INSTANTIATE_TEST_SUITE_P(Layouts, GpuQuant, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& info) { return info.param ? "Tiles" : "Rows"; });

class GpuQuantFixtures : public testing::TestWithParam<std::string> {};

TEST_P(GpuQuantFixtures, MatchCpuOnTheSameWeights) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  ASSERT_TRUE(gpu.ok());
  CpuBackend cpu(4);
  const auto ids = fixture_ids(GetParam());
  const int64_t n = int64_t(ids.size());
  const auto want = run_model(cpu, GetParam(), ids, n);
  for (int64_t chunk : {int64_t(1), int64_t(7), n}) {
    const auto got = run_model(**gpu, GetParam(), ids, chunk);
    ASSERT_EQ(want.size(), got.size());
    auto c = compare_logits(got.data(), want.data(), n, int64_t(want.size()) / n);
    EXPECT_LE(c.relative(), 2e-2) << "chunk " << chunk;
    EXPECT_GE(c.argmax_agreement, 0.97) << "chunk " << chunk;
  }
  EXPECT_TRUE((*gpu)->status().ok());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuQuantFixtures, testing::ValuesIn(quantized_fixtures()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kiln::test
