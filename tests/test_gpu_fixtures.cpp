// The CUDA backend against the CPU f32 reference on every oracle fixture, end to end: logits at
// several prefill chunk sizes and decode, and decode steps replayed as CUDA graphs. Skipped,
// visibly, where no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <span>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "models/model.h"
#include "runtime/decode_loop.h"
#include "runtime/prefill.h"
#include "test_util.h"

namespace kiln::test {
namespace {

// Whole models: GPU (bf16) logits against CPU (f32) logits on every oracle fixture. Prompts go in
// at chunk sizes 1, 7 and whole, then 32 tokens are decoded one at a time, fed the same ids.
class GpuFixtures : public testing::TestWithParam<std::string> {};

std::vector<float> run_device(Backend& backend, const std::string& fixture, const std::vector<int32_t>& ids,
                              int64_t prompt, int64_t chunk) {
  auto model = load_model(fixture_path(fixture), backend, ModelOptions{.max_chunk_tokens = chunk});
  EXPECT_TRUE(model.ok()) << (model.ok() ? "" : model.error().message);
  auto state = (*model)->new_sequence(int64_t(ids.size()));
  std::vector<float> all;
  auto head = run_tokens(**model, **state, std::span(ids).first(size_t(prompt)), chunk, LogitRows::all);
  EXPECT_TRUE(head.ok()) << (head.ok() ? "" : head.error().message);
  all.assign(head->data_as<float>(), head->data_as<float>() + head->numel());
  for (size_t i = size_t(prompt); i < ids.size(); ++i) {
    auto step = run_tokens(**model, **state, std::span(ids).subspan(i, 1), 1, LogitRows::all);
    EXPECT_TRUE(step.ok());
    all.insert(all.end(), step->data_as<float>(), step->data_as<float>() + step->numel());
  }
  return all;
}

TEST_P(GpuFixtures, MatchCpuReference) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  ASSERT_TRUE(gpu.ok());
  CpuBackend cpu(4);
  const auto ids = fixture_ids(GetParam());
  const int64_t prompt = int64_t(ids.size()) - 32, n = int64_t(ids.size());
  for (int64_t chunk : {int64_t(1), int64_t(7), prompt}) {
    const auto want = run_device(cpu, GetParam(), ids, prompt, chunk);
    const auto got = run_device(**gpu, GetParam(), ids, prompt, chunk);
    ASSERT_EQ(want.size(), got.size());
    const int64_t vocab = int64_t(want.size()) / n;
    auto c = compare_logits(got.data(), want.data(), n, vocab);
    const double tol = 2e-2 * c.max_abs_reference;
    EXPECT_LE(c.max_abs_diff, tol) << "chunk " << chunk;
    EXPECT_GE(c.argmax_agreement, 0.97) << "chunk " << chunk;
    // wherever the CPU's top two are further apart than the tolerance, the argmax must agree
    for (int64_t r = 0; r < n; ++r) {
      const float* w = want.data() + r * vocab;
      const float* g = got.data() + r * vocab;
      std::vector<float> sorted(w, w + vocab);
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      if (sorted[0] - sorted[1] <= tol) continue;
      EXPECT_EQ(std::max_element(g, g + vocab) - g, std::max_element(w, w + vocab) - w)
          << "position " << r << " chunk " << chunk;
    }
  }
  EXPECT_TRUE((*gpu)->status().ok());
}

// A decode step recorded as a CUDA graph and replayed chooses what step-by-step forwards choose.
TEST_P(GpuFixtures, GraphDecodeMatchesForwards) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  ASSERT_TRUE(gpu.ok());
  const auto ids = fixture_ids(GetParam());
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 40);
  auto model = load_model(fixture_path(GetParam()), **gpu);
  ASSERT_TRUE(model.ok());
  std::vector<std::vector<int32_t>> results;
  for (bool graph : {false, true}) {
    std::vector<std::unique_ptr<SequenceState>> seqs;
    std::vector<SequenceState*> states;
    std::vector<int32_t> next;
    for (int s = 0; s < 3; ++s) {  // three sequences decoded together
      seqs.push_back(std::move((*model)->new_sequence(100)).value());
      states.push_back(seqs.back().get());
      std::vector<int32_t> p(prompt.begin() + s, prompt.end());
      auto logits = run_tokens(**model, *seqs.back(), p, 0, LogitRows::last);
      ASSERT_TRUE(logits.ok());
      next.push_back(int32_t(std::max_element(logits->data_as<float>(), logits->data_as<float>() + logits->numel()) -
                             logits->data_as<float>()));
    }
    std::vector<int32_t> chosen = next;
    if (graph) {
      auto loop = DecodeLoop::create(**model, states, next);
      ASSERT_TRUE(loop.ok()) << loop.error().message;
      for (int step = 0; step < 20; ++step) {
        ASSERT_TRUE((*loop)->step().ok());
        auto t = (*loop)->tokens();
        chosen.insert(chosen.end(), t.begin(), t.end());
      }
    } else {
      for (int step = 0; step < 20; ++step) {
        std::vector<SeqChunk> chunks;
        for (int s = 0; s < 3; ++s) chunks.push_back({states[size_t(s)], std::span(&next[size_t(s)], 1)});
        auto logits = (*model)->forward(chunks, LogitRows::last);
        ASSERT_TRUE(logits.ok());
        Tensor host = (*gpu)->to_host(*logits);
        const int64_t vocab = host.cols();
        for (int s = 0; s < 3; ++s) {
          const float* row = host.data_as<float>() + s * vocab;
          next[size_t(s)] = int32_t(std::max_element(row, row + vocab) - row);
        }
        chosen.insert(chosen.end(), next.begin(), next.end());
      }
    }
    results.push_back(chosen);
  }
  EXPECT_EQ(results[0], results[1]);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuFixtures, testing::ValuesIn(fixture_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kiln::test
