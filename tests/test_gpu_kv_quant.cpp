// Quantized KV caches on the CUDA backend against the CPU f32 reference with the same format: the
// cache write's quantizer and the three attention kernels' dequantizing loads (decode rows, the
// flash prefill kernel for head dims 64 to 512, the tiled kernel for others), end to end, and a
// snapshot restored from a quantized state. Skipped, visibly, where no GPU is present.
#include <gtest/gtest.h>

#include <cstring>
#include <span>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "models/model.h"
#include "runtime/prefill.h"
#include "test_util.h"

namespace kiln::test {
namespace {

// Logits of the fixture's ids: the first `prompt` in chunks of `chunk`, then one at a time (decode).
std::vector<float> run(Backend& backend, const std::string& fixture, KvQuant quant, int64_t prompt, int64_t chunk) {
  auto model = load_model(fixture_path(fixture), backend, ModelOptions{.max_chunk_tokens = chunk, .kv_quant = quant});
  EXPECT_TRUE(model.ok()) << (model.ok() ? "" : model.error().message);
  if (!model.ok()) return {};
  const auto ids = fixture_ids(fixture);
  auto state = (*model)->new_sequence(int64_t(ids.size()));
  EXPECT_TRUE(state.ok());
  auto head = run_tokens(**model, **state, std::span(ids).first(size_t(prompt)), chunk, LogitRows::all);
  EXPECT_TRUE(head.ok()) << (head.ok() ? "" : head.error().message);
  if (!head.ok()) return {};
  std::vector<float> all(head->data_as<float>(), head->data_as<float>() + head->numel());
  for (size_t i = size_t(prompt); i < ids.size(); ++i) {
    auto step = run_tokens(**model, **state, std::span(ids).subspan(i, 1), 1, LogitRows::all);
    EXPECT_TRUE(step.ok()) << (step.ok() ? "" : step.error().message);
    if (!step.ok()) return {};
    all.insert(all.end(), step->data_as<float>(), step->data_as<float>() + step->numel());
  }
  return all;
}

TEST(GpuKvQuant, MatchesTheCpuWithTheSameFormat) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  ASSERT_TRUE(gpu.ok());
  CpuBackend cpu(4);
  for (const std::string fixture : {"qwen3_5_dense", "gemma4_dense", "gemma4_ple_shared"}) {
    const auto ids = fixture_ids(fixture);
    const int64_t n = int64_t(ids.size()), prompt = n - 16;
    for (const KvQuant quant : {KvQuant{8, 32}, KvQuant{4, 32}}) {
      for (const int64_t chunk : {int64_t(7), prompt}) {
        SCOPED_TRACE(testing::Message() << fixture << ", " << quant.bits << " bits, chunk " << chunk);
        const auto want = run(cpu, fixture, quant, prompt, chunk);
        const auto got = run(**gpu, fixture, quant, prompt, chunk);
        const auto plain = run(cpu, fixture, KvQuant{}, prompt, chunk);
        ASSERT_EQ(want.size(), got.size());
        ASSERT_FALSE(want.empty());
        const int64_t vocab = int64_t(want.size()) / n;
        const auto c = compare_logits(got.data(), want.data(), n, vocab);
        // the GPU's keys are bf16, so a code may land one step away where the f32 key sits at a
        // boundary: 4-bit caches get twice the bf16 tolerance
        const double tol = (quant.bits == 8 ? 2e-2 : 4e-2) * c.max_abs_reference;
        EXPECT_LE(c.max_abs_diff, tol);
        EXPECT_GE(c.argmax_agreement, 0.95);
        std::printf("%s %d-bit chunk %lld: max |gpu - cpu| %.4g (tolerance %.4g), vs unquantized %.4g\n",
                    fixture.c_str(), quant.bits, static_cast<long long>(chunk), c.max_abs_diff, tol,
                    compare_logits(plain.data(), want.data(), n, vocab).max_abs_diff);
      }
    }
  }
}

TEST(GpuKvQuant, SnapshotsOfQuantizedStatesRestoreExactly) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  ASSERT_TRUE(gpu.ok());
  auto model =
      load_model(fixture_path("gemma4_dense"), **gpu, ModelOptions{.max_chunk_tokens = 16, .kv_quant = KvQuant{4, 32}});
  ASSERT_TRUE(model.ok()) << model.error().message;
  const auto ids = fixture_ids("gemma4_dense");
  auto state = (*model)->new_sequence(100);
  ASSERT_TRUE(state.ok());
  ASSERT_TRUE(run_tokens(**model, **state, std::span(ids).first(40), 16, LogitRows::last).ok());
  auto snapshot = (*state)->clone(**gpu);
  auto first = run_tokens(**model, **state, std::span(ids).subspan(40, 10), 5, LogitRows::all);
  ASSERT_TRUE(first.ok());
  (*state)->restore(**gpu, *snapshot);
  auto again = run_tokens(**model, **state, std::span(ids).subspan(40, 10), 5, LogitRows::all);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(first->numel(), again->numel());
  EXPECT_EQ(0, std::memcmp(first->data(), again->data(), size_t(first->numel()) * 4));
}

}  // namespace
}  // namespace kiln::test
