// Synthetic checkpoints name and shape their tensors as the real ones: a model written from each
// fixture's config holds the fixture's tensors (in transformers' layout) and loads.
#include <set>

#include "backend/cpu/cpu_backend.h"
#include "io/weights.h"
#include "models/model.h"
#include "runtime/decode_loop.h"
#include "runtime/prefill.h"
#include "test_util.h"

namespace kiln::test {
namespace {

std::set<std::pair<std::string, std::string>> tensor_set(const std::string& dir) {
  auto store = WeightStore::open(dir);
  EXPECT_TRUE(store.ok());
  std::set<std::pair<std::string, std::string>> out;
  for (const auto& name : store->names()) out.insert({name, store->get(name)->shape().str()});
  return out;
}

class Synthetic : public testing::TestWithParam<std::string> {};

TEST_P(Synthetic, MatchesFixtureTensorsAndLoads) {
  TempDir tmp;
  const std::string out = tmp.path() + "/synth";
  auto config = read_model_config(fixture_path(GetParam()));
  ASSERT_TRUE(config.ok());
  auto tensors = checkpoint_tensors(*config);
  ASSERT_TRUE(tensors.ok()) << tensors.error().message;
  nlohmann::json text = config->text;
  ASSERT_TRUE(write_synthetic_checkpoint(out, text, *tensors, SyntheticOptions{.seed = 3, .threads = 2}).ok());
  CpuBackend backend(2);
  auto model = load_model(out, backend);
  ASSERT_TRUE(model.ok()) << model.error().message;
  // fixtures stored in transformers' own layout hold exactly these tensors
  if (GetParam() == "gemma4_dense" || GetParam() == "gemma4_ple_shared" || GetParam() == "qwen3_5_dense" ||
      GetParam() == "qwen3_5_moe") {
    EXPECT_EQ(tensor_set(out), tensor_set(fixture_path(GetParam())));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Synthetic, testing::ValuesIn(fixture_names()),
                         [](const auto& info) { return info.param; });

// The replayed decode loop chooses the same greedy tokens as step-by-step forwards.
class DecodeLoopGreedy : public testing::TestWithParam<std::string> {};

TEST_P(DecodeLoopGreedy, MatchesTransformersGenerate) {
  const auto greedy = read_json(fixture_path(GetParam()) + "/greedy.json");
  const auto prompt = greedy["prompt"].get<std::vector<int32_t>>();
  const auto expected = greedy["tokens"].get<std::vector<int32_t>>();
  CpuBackend backend(2);
  auto model = load_model(fixture_path(GetParam()), backend);
  ASSERT_TRUE(model.ok());
  auto state = (*model)->new_sequence(int64_t(prompt.size() + expected.size()));
  auto logits = run_tokens(**model, **state, prompt, 0, LogitRows::last);
  ASSERT_TRUE(logits.ok());
  const int64_t vocab = (*model)->info().vocab_size;
  const float* row = logits->data_as<float>();
  const int32_t first = int32_t(std::max_element(row, row + vocab) - row);
  std::vector<SequenceState*> seqs = {state->get()};
  auto loop = DecodeLoop::create(**model, seqs, std::vector<int32_t>{first});
  ASSERT_TRUE(loop.ok()) << loop.error().message;
  std::vector<int32_t> got = {first};
  while (got.size() < expected.size()) {
    ASSERT_TRUE((*loop)->step().ok());
    got.push_back((*loop)->tokens()[0]);
  }
  EXPECT_EQ(got, expected);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DecodeLoopGreedy, testing::ValuesIn(fixture_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kiln::test
