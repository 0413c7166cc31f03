// The bundled model (models/kiln-kjv-31m, 4-bit) follows transformers' greedy continuations of
// its dequantized weights token for token, and is what `kiln generate` runs when no model is named.
#include "backend/cpu/cpu_backend.h"
#include "bundled_model.h"

namespace kiln::test {
namespace {

TEST(BundledModel, FollowsTransformersGreedyOnCpu) {
  CpuBackend backend(2);
  auto model = load_model(bundled_model_dir(), backend);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const auto prompts = recorded_prompts();
  ASSERT_GE(prompts.size(), 3u);
  for (const RecordedPrompt& p : prompts) {
    ASSERT_EQ(p.tokens.size(), 64u);
    auto got = greedy_continuation(**model, p.prompt, p.tokens.size());
    ASSERT_TRUE(got.ok()) << got.error().message;
    EXPECT_EQ(*got, p.tokens) << p.text;
  }
}

TEST(BundledModel, IsTheDefaultOfGenerate) {
  // no model named: the binary finds the bundled one beside it (../models)
  const auto result = run_command(
      std::string(KILN_BINARY) + " generate --raw --prompt 'In the beginning' --max-tokens 8 --device cpu", false);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_GE(result.output.size(), 8u) << result.output;
}

}  // namespace
}  // namespace kiln::test
