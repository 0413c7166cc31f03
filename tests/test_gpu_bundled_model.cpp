// The bundled model on the GPU follows transformers' greedy continuations token for token, as it
// does on the CPU (test_bundled_model.cpp). Skipped, visibly, where no GPU is present.
#include <chrono>

#include "backend/cuda/cuda_backend.h"
#include "bundled_model.h"
#include "runtime/scheduler.h"

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

std::vector<int32_t> tokens_of(const std::shared_ptr<Generation>& g) {
  std::vector<int32_t> tokens;
  for (;;) {
    auto u = g->wait(std::chrono::milliseconds(100));
    tokens.insert(tokens.end(), u.tokens.begin(), u.tokens.end());
    if (u.finish != FinishReason::running) return tokens;
  }
}

// The server's sampled rows draw from their top_k candidates on the GPU (Backend::top_k); asking for
// logprobs makes the same requests bring back whole rows instead. Both give the same tokens.
TEST(GpuBundledModel, SampledRowsDrawTheSameFromTheirTopK) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  auto backend = make_cuda_backend(0);
  ASSERT_TRUE(backend.ok()) << backend.error().message;
  auto model = load_model(bundled_model_dir(), **backend);
  ASSERT_TRUE(model.ok()) << model.error().message;
  auto scheduler = Scheduler::create(**model, SchedulerOptions{.max_batch = 4, .context = 160});
  ASSERT_TRUE(scheduler.ok()) << scheduler.error().message;
  const std::vector<int32_t> prompt = recorded_prompts().front().prompt;
  auto request = [&](SamplingParams sampling, int logprobs) {
    return GenerationParams{.prompt = prompt, .sampling = sampling, .max_tokens = 48, .logprobs = logprobs};
  };
  const SamplingParams sampled[] = {{.temperature = 0.8f, .top_k = 20, .top_p = 0.95f, .seed = 1},
                                    {.temperature = 1.0f, .top_k = 64, .seed = 2},
                                    {.temperature = 1.3f, .top_k = 5, .min_p = 0.05f, .seed = 3}};
  for (const SamplingParams& p : sampled) {
    auto whole = (*scheduler)->submit(request(p, 0));
    ASSERT_TRUE(whole.ok()) << whole.error().message;
    const auto want = tokens_of(*whole);
    auto from_top_k = (*scheduler)->submit(request(p, -1));
    ASSERT_TRUE(from_top_k.ok()) << from_top_k.error().message;
    EXPECT_EQ(tokens_of(*from_top_k), want) << "top_k " << p.top_k;
  }
  EXPECT_TRUE((*backend)->status().ok());
}

}  // namespace
}  // namespace kiln::test
