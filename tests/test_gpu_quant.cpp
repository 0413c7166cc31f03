// The CUDA kernels for quantized weights against the CPU reference on the same packed weights:
// the fused GEMV (up to 32 rows, 8 per pass), the blocked dequantize + cuBLAS product, embedding rows and the routed
// experts, for every width and group size on odd sizes; then every quantized fixture end to end.
// Skipped, visibly, where no GPU is present.
#include <cmath>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "gpu_test_util.h"
#include "models/model.h"
#include "quant_test_util.h"
#include "runtime/prefill.h"
#include "test_util.h"

namespace kiln::test {
namespace {

class GpuQuant : public GpuTest {
 protected:
  GpuQuant() : GpuTest(17) {}
};

TEST_F(GpuQuant, MatmulEveryWidthAndGroup) {
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int group : {32, 64, 128})
      for (int64_t m : {1, 3, 8, 9, 17, 33})
        for (int64_t n : {31, 33}) {
          const int64_t k = 3 * group + (group == 32 ? 64 : 0);        // odd multiples of the group
          Tensor w = random_quantized(rng, Shape{n, k}, bits, group);  // bf16 scales, as the GPU keeps them
          Tensor x = random(Shape{m, k});
          Tensor want = cpu.alloc(DType::f32, Shape{m, n});
          cpu.matmul(x, w, want);
          Tensor got = gpu->alloc(DType::f32, Shape{m, n});
          gpu->matmul(gpu->upload(x, DType::bf16), gpu->upload_quantized(w), got);
          // the GEMV (up to 32 rows) dequantizes in f32; the cuBLAS path rounds the dequantized
          // weights to bf16
          EXPECT_LT(rel(gpu->to_host(got), want), m <= 32 ? 1e-4 : 1e-2)
              << bits << " bits, group " << group << ", " << m << "x" << n;
        }
}

TEST_F(GpuQuant, MatmulBf16OutputAndStridedInput) {
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

TEST_F(GpuQuant, PrefillProductSpansSeveralDequantizedBlocks) {
  const int64_t m = 40, n = 20011, k = 4096;  // blocks of 16384 rows of 4096
  Tensor w = random_quantized(rng, Shape{n, k}, 4, 64);
  Tensor x = random(Shape{m, k}, 0.1f);
  Tensor want = cpu.alloc(DType::f32, Shape{m, n});
  cpu.matmul(x, w, want);
  Tensor got = gpu->alloc(DType::f32, Shape{m, n});
  gpu->matmul(gpu->upload(x, DType::bf16), gpu->upload_quantized(w), got);
  EXPECT_LT(rel(gpu->to_host(got), want), 1e-2);
}

TEST_F(GpuQuant, Embed) {
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

TEST_F(GpuQuant, RoutedExperts) {
  const int64_t tokens = 19, hidden = 96, inter = 64, experts = 10;
  const int top_k = 3;
  for (int bits : {3, 4, 8}) {
    Tensor gate = random_quantized(rng, Shape{experts, inter, hidden}, bits, 32);
    Tensor up = random_quantized(rng, Shape{experts, inter, hidden}, bits, 32);
    // a dense down projection beside quantized gate and up, as when its input size is not a
    // multiple of the group size
    const bool dense_down = bits == 8;
    Tensor down = random_quantized(rng, Shape{experts, hidden, inter}, bits, 32);
    if (dense_down) {  // values bf16 holds exactly, so that both sides multiply the same weights
      down = dequantized(down);
      for (int64_t i = 0; i < down.numel(); ++i)
        down.data_as<float>()[i] = bf16_to_f32(f32_to_bf16(down.data_as<float>()[i]));
    }
    Tensor x = random(Shape{tokens, hidden}, 0.5f);
    Tensor ids = host_tensor(DType::i32, Shape{tokens, top_k}), weights = host_tensor(DType::f32, Shape{tokens, top_k});
    for (int64_t i = 0; i < tokens * top_k; ++i) {
      ids.data_as<int32_t>()[i] = int32_t((i * 7 + i / top_k) % experts);
      weights.data_as<float>()[i] = 0.2f + 0.1f * float(i % 4);
    }
    Tensor want = cpu.alloc(DType::f32, Shape{tokens, hidden});
    cpu.moe_experts({.x = x,
                     .ids = ids,
                     .weights = weights,
                     .gate = gate,
                     .up = up,
                     .down = down,
                     .out = want,
                     .act = Activation::silu});
    Tensor got = gpu->alloc(DType::f32, Shape{tokens, hidden});
    gpu->moe_experts({.x = gpu->upload(x, DType::bf16),
                      .ids = gpu->upload(ids, DType::i32),
                      .weights = gpu->upload(weights, DType::f32),
                      .gate = gpu->upload_quantized(gate),
                      .up = gpu->upload_quantized(up),
                      .down = dense_down ? gpu->upload(down, DType::bf16) : gpu->upload_quantized(down),
                      .out = got,
                      .act = Activation::silu});
    EXPECT_LT(rel(gpu->to_host(got), want), 1e-3) << bits << " bits";
  }
}

// Whole quantized models: GPU logits against the CPU's on the same packed weights (and, where the
// transformers reference is present, the oracle tests of test_gpu.cpp cover them too).
std::vector<std::string> quantized_fixtures() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(fixtures_dir())) {
    const auto config = entry.path() / "config.json";
    if (std::filesystem::exists(config) && read_json(config.string()).contains("quantization"))
      names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

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
