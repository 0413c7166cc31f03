// The bundled model on the GPU follows transformers' greedy continuations token for token, as it
// does on the CPU (test_bundled_model.cpp). Skipped, visibly, where no GPU is present.
#include "backend/cuda/cuda_backend.h"
#include "bundled_model.h"

namespace kiln::test {
namespace {

TEST(GpuBundledModel, FollowsTransformersGreedy) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  auto backend = make_cuda_backend(0);
  ASSERT_TRUE(backend.ok()) << backend.error().message;
  auto model = load_model(bundled_model_dir(), **backend);
  ASSERT_TRUE(model.ok()) << model.error().message;
  for (const RecordedPrompt& p : recorded_prompts()) {
    auto got = greedy_continuation(**model, p.prompt, p.tokens.size());
    ASSERT_TRUE(got.ok()) << got.error().message;
    EXPECT_EQ(*got, p.tokens) << p.text;
  }
  EXPECT_TRUE((*backend)->status().ok());
}

}  // namespace
}  // namespace kiln::test
