// The per-sequence state: sliding caches of fixed size, snapshot / restore / reset as one object,
// and several sequences in one forward call giving the same logits as each alone.
#include "backend/cpu/cpu_backend.h"
#include "models/model.h"
#include "runtime/prefill.h"
#include "test_util.h"

namespace kiln::test {
namespace {

std::unique_ptr<Model> load(CpuBackend& backend, const std::string& fixture, int64_t max_chunk = 512) {
  auto model = load_model(fixture_path(fixture), backend, ModelOptions{.max_chunk_tokens = max_chunk});
  EXPECT_TRUE(model.ok()) << (model.ok() ? "" : model.error().message);
  return model.ok() ? std::move(model).value() : nullptr;
}

TEST(SequenceState, SlidingCachesDoNotGrowWithContext) {
  CpuBackend backend(1);
  auto model = load(backend, "gemma4_dense", 8);
  const int64_t window = read_json(fixture_path("gemma4_dense") + "/config.json")["sliding_window"];
  const auto types = read_json(fixture_path("gemma4_dense") + "/config.json")["layer_types"];
  auto small = model->new_sequence(1000);
  auto large = model->new_sequence(100000);
  ASSERT_TRUE(small.ok() && large.ok());
  for (size_t l = 0; l < types.size(); ++l) {
    if (types[l] != "sliding_attention") continue;
    EXPECT_EQ((*small)->layers()[l].kv.capacity, window - 1 + 8);
    EXPECT_EQ((*large)->layers()[l].kv.capacity, window - 1 + 8);
  }
}

// Runs `ids` after whatever the state holds; returns the logits of every new position.
std::vector<float> continue_with(Model& model, SequenceState& state, const std::vector<int32_t>& ids, int64_t chunk) {
  auto logits = run_tokens(model, state, ids, chunk, LogitRows::all);
  EXPECT_TRUE(logits.ok());
  return std::vector<float>(logits->data_as<float>(), logits->data_as<float>() + logits->numel());
}

class StateSnapshots : public testing::TestWithParam<std::string> {};

TEST_P(StateSnapshots, RestoreAndResetReproduceLogits) {
  CpuBackend backend(2);
  auto model = load(backend, GetParam(), 16);
  const auto ids = fixture_ids(GetParam());
  const std::vector<int32_t> prefix(ids.begin(), ids.begin() + 100), suffix(ids.begin() + 100, ids.begin() + 130);
  auto state = model->new_sequence(200);
  ASSERT_TRUE(state.ok());
  continue_with(*model, **state, prefix, 16);
  auto snapshot = (*state)->clone(backend);
  const auto first = continue_with(*model, **state, suffix, 5);
  (*state)->restore(backend, *snapshot);
  EXPECT_EQ((*state)->length(), 100);
  EXPECT_EQ(continue_with(*model, **state, suffix, 5), first) << "a restored snapshot must continue identically";

  (*state)->reset(backend);
  EXPECT_EQ((*state)->length(), 0);
  auto fresh = model->new_sequence(200);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(continue_with(*model, **state, prefix, 16), continue_with(*model, **fresh, prefix, 16));
}

// Sequences of different lengths advanced together in one forward call.
TEST_P(StateSnapshots, BatchedSequencesMatchSingleRuns) {
  CpuBackend backend(2);
  auto model = load(backend, GetParam(), 64);
  const auto ids = fixture_ids(GetParam());
  const std::vector<std::vector<int32_t>> prompts = {std::vector<int32_t>(ids.begin(), ids.begin() + 40),
                                                     std::vector<int32_t>(ids.begin() + 50, ids.begin() + 61),
                                                     std::vector<int32_t>(ids.begin() + 3, ids.begin() + 4)};
  std::vector<std::unique_ptr<SequenceState>> batched, single;
  std::vector<std::vector<float>> expected;
  for (const auto& p : prompts) {
    batched.push_back(std::move(model->new_sequence(128)).value());
    single.push_back(std::move(model->new_sequence(128)).value());
    expected.push_back(continue_with(*model, *single.back(), p, 64));
  }
  std::vector<SeqChunk> chunks;
  for (size_t i = 0; i < prompts.size(); ++i) chunks.push_back({batched[i].get(), prompts[i]});
  auto logits = model->forward(chunks, LogitRows::all);
  ASSERT_TRUE(logits.ok()) << logits.error().message;
  Tensor host = backend.to_host(*logits);
  const int64_t vocab = model->info().vocab_size;
  int64_t row = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto c = compare_logits(host.data_as<float>() + row * vocab, expected[i].data(), int64_t(prompts[i].size()), vocab);
    // batching changes only the blocking of the matrix products: rounding-level differences
    EXPECT_LE(c.relative(), 1e-4) << "sequence " << i;
    row += int64_t(prompts[i].size());
  }
  // one decode step for all three at once
  const std::vector<int32_t> next = {7, 8, 9};
  std::vector<SeqChunk> step;
  for (size_t i = 0; i < prompts.size(); ++i) step.push_back({batched[i].get(), std::span(&next[i], 1)});
  auto decoded = model->forward(step, LogitRows::last);
  ASSERT_TRUE(decoded.ok());
  Tensor decoded_host = backend.to_host(*decoded);
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto alone = continue_with(*model, *single[i], {next[i]}, 1);
    auto c = compare_logits(decoded_host.data_as<float>() + int64_t(i) * vocab, alone.data(), 1, vocab);
    EXPECT_LE(c.relative(), 1e-4) << "decode of sequence " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, StateSnapshots,
                         testing::Values("gemma4_ple_shared", "gemma4_moe", "qwen3_5_dense", "qwen3_5_moe"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kiln::test
