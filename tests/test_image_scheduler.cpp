// Prompts with images through the scheduler: the tokens of a direct run (the whole prompt in one
// forward call, then greedy steps), whatever the prefill chunk and batch, resumed from the prefix
// cache too, whose keys tell images apart by their content.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "models/family.h"
#include "qwen_vision_util.h"
#include "runtime/prefill.h"
#include "runtime/prompt_images.h"
#include "runtime/scheduler.h"
#include "scheduler_test_util.h"
#include "vision_test_util.h"

namespace kiln::test {
namespace {

struct ImageCase {
  std::string dir;
  std::vector<int32_t> ids;
  std::vector<ProcessedImage> images;
  int32_t image_token = 0;
};

// Qwen 3.5: two images, causal, laid-out multimodal positions.
ImageCase qwen_case(const TempDir& tmp) {
  const TinyTower c;
  ImagePrompt p = two_image_prompt(c);
  // soft tokens as large as the text's embeddings, so that the images move the last token's logits
  auto weights = tower_weights(c, 11);
  for (const char* name : {"merger.linear_fc2.weight", "merger.linear_fc2.bias"}) {
    Tensor& t = weights.at(name);
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] *= 40.0f;
  }
  return {tower_checkpoint(tmp, "qwen", c, weights, false), p.ids, p.images, kTinyImage};
}

// Gemma 4 (26B-like): an image of 3 soft tokens attended bidirectionally.
ImageCase gemma_case(const TempDir& tmp) {
  const FrontEnd f = front_ends()[1];
  ImageCase out{.dir = synthesize(tmp, f.name, f.config, lively(f.clip_bound)), .image_token = 299};
  std::mt19937 rng(5);
  for (int i = 0; i < 9; ++i) out.ids.push_back(int32_t(3 + (i * 53) % 290));
  out.ids.insert(out.ids.end(), size_t(f.soft), out.image_token);
  for (int i = 0; i < 5; ++i) out.ids.push_back(int32_t(7 + (i * 31) % 290));
  out.ids.insert(out.ids.end(), size_t(f.soft), out.image_token);
  for (int i = 0; i < 4; ++i) out.ids.push_back(int32_t(11 + (i * 17) % 290));
  out.images.push_back(random_image(rng, f.rows, f.cols, f.values, f.soft));
  out.images.push_back(random_image(rng, f.rows, f.cols, f.values, f.soft));
  return out;
}

std::shared_ptr<const ImageLayout> layout_of(Model& model, const ImageCase& c, std::vector<ProcessedImage> images) {
  auto config = read_model_config(c.dir);
  EXPECT_TRUE(config.ok());
  auto family = family_of(*config);
  EXPECT_TRUE(family.ok());
  auto layout = lay_out_images(model.batch_needs(), **family, *config, ImagePlaceholder{.token_id = c.image_token},
                               c.ids, std::move(images));
  EXPECT_TRUE(layout.ok()) << layout.error().message;
  return std::make_shared<const ImageLayout>(std::move(layout).value());
}

constexpr int kTop = 3;

struct Greedy {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // of each token, then of its kTop most likely alternatives
  bool operator==(const Greedy&) const = default;
};

// The whole prompt in one forward call, then `steps` greedy tokens one at a time.
Greedy direct_greedy(Model& model, const ImageCase& c, const ImageLayout& layout, int steps) {
  auto state = model.new_sequence(128);
  auto placed = encode_images(model, layout);
  EXPECT_TRUE(placed.ok()) << placed.error().message;
  auto logits = run_prompt(model, **state, c.ids, *placed, 0, LogitRows::last);
  EXPECT_TRUE(logits.ok()) << logits.error().message;
  Greedy out;
  Tensor last = *logits;
  const int64_t vocab = model.info().vocab_size;
  for (int s = 0; s < steps; ++s) {
    const Tensor host = model.backend().to_host(last);
    const float* row = host.data_as<float>() + (host.rows() - 1) * vocab;
    out.tokens.push_back(int32_t(std::max_element(row, row + vocab) - row));
    const auto l = logprobs_of(std::span<const float>(row, size_t(vocab)), out.tokens.back(), kTop);
    out.logprobs.push_back(l.logprob);
    for (const auto& t : l.top) out.logprobs.push_back(t.logprob);
    if (s + 1 < steps) last = *run_token(model, **state, out.tokens.back());
  }
  return out;
}

// A generation's tokens with their log-probabilities, and how much of its prompt was cached.
struct Drained {
  Greedy greedy;
  int64_t cached = 0;
};
Drained drain_logprobs(const std::shared_ptr<Generation>& g) {
  Drained out;
  for (;;) {
    auto u = g->wait(std::chrono::milliseconds(100));
    out.greedy.tokens.insert(out.greedy.tokens.end(), u.tokens.begin(), u.tokens.end());
    for (const auto& l : u.logprobs) {
      out.greedy.logprobs.push_back(l.logprob);
      for (const auto& t : l.top) out.greedy.logprobs.push_back(t.logprob);
    }
    if (u.finish != FinishReason::running) break;
  }
  out.cached = g->cached_tokens();
  return out;
}

// Same tokens, and log-probabilities within f32 rounding of a different chunking.
void expect_same(const Greedy& got, const Greedy& want, const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << what;
  for (size_t i = 0; i < got.logprobs.size(); ++i)
    EXPECT_NEAR(got.logprobs[i], want.logprobs[i], 1e-4) << what << ", token " << i;
}

class ImageScheduling : public testing::TestWithParam<const char*> {};

TEST_P(ImageScheduling, MatchesADirectRunInChunksBatchesAndFromTheCache) {
  TempDir tmp;
  const bool qwen = std::string(GetParam()) == "qwen";
  const ImageCase c = qwen ? qwen_case(tmp) : gemma_case(tmp);
  CpuBackend backend(2);
  auto model = load_model(c.dir, backend);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const auto layout = layout_of(**model, c, c.images);
  EXPECT_EQ(layout->whole, !qwen);
  constexpr int kSteps = 6;
  const Greedy expected = direct_greedy(**model, c, *layout, kSteps);
  // the images matter: the same ids with other pictures give other log-probabilities
  {
    std::vector<ProcessedImage> blank = c.images;
    for (auto& image : blank) {
      image.pixels = host_tensor(DType::f32, image.pixels.shape());
      std::fill_n(image.pixels.data_as<float>(), image.pixels.numel(), 0.5f);  // a flat grey picture
    }
    const Greedy without = direct_greedy(**model, c, *layout_of(**model, c, blank), kSteps);
    double most = 0;
    for (size_t i = 0; i < expected.logprobs.size(); ++i)
      most = std::max(most, double(std::fabs(without.logprobs[i] - expected.logprobs[i])));
    EXPECT_GT(most, 1e-2);
  }

  for (bool invariant : {true, false}) {
    // chunks of 2: Qwen's images are split over chunks, Gemma's run whole beyond the chunk
    auto scheduler = Scheduler::create(**model, SchedulerOptions{.max_batch = 3,
                                                                 .context = 128,
                                                                 .prefill_chunk = 2,
                                                                 .prompt_cache_bytes = size_t(256) << 20,
                                                                 .cache_block = 2,
                                                                 .batch_invariant = invariant});
    ASSERT_TRUE(scheduler.ok()) << scheduler.error().message;
    auto request = [&](std::shared_ptr<const ImageLayout> images) {
      GenerationParams p = greedy(c.ids, kSteps);
      p.logprobs = kTop;
      p.images = std::move(images);
      auto g = (*scheduler)->submit(std::move(p));
      EXPECT_TRUE(g.ok()) << g.error().message;
      return *g;
    };
    // beside a text request
    auto text = (*scheduler)->submit(greedy(prompt_for(1, 290, 13), kSteps));
    ASSERT_TRUE(text.ok());
    const Drained first = drain_logprobs(request(layout));
    drain(*text);
    const std::string mode = invariant ? "batch-invariant" : "batched rows";
    expect_same(first.greedy, expected, mode);

    // the same prompt again resumes from the cache (never inside an image that runs whole)
    const Drained again = drain_logprobs(request(layout));
    expect_same(again.greedy, expected, mode + ", from the cache");
    EXPECT_GT(again.cached, layout->offsets.back());
    if (layout->whole) {
      for (size_t i = 0; i < layout->offsets.size(); ++i)
        EXPECT_FALSE(again.cached > layout->offsets[i] &&
                     again.cached < layout->offsets[i] + layout->images[i].soft_tokens);
    }

    // the same ids with another first image: the cache holds nothing past that image's start
    std::vector<ProcessedImage> swapped = c.images;
    if (qwen) {  // another picture of the first one's size
      const Tensor& first = c.images[0].pixels;
      swapped[0].pixels = host_tensor(DType::f32, first.shape());
      for (int64_t k = 0; k < first.numel(); ++k) swapped[0].pixels.data_as<float>()[k] = -first.data_as<float>()[k];
    } else {
      std::swap(swapped[0], swapped[1]);
    }
    const auto other = layout_of(**model, c, swapped);
    const Drained changed = drain_logprobs(request(other));
    EXPECT_LE(changed.cached, layout->offsets[0]);
    expect_same(changed.greedy, direct_greedy(**model, c, *other, kSteps), mode + ", another image");
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ImageScheduling, testing::Values("qwen", "gemma"));

// The cache key: image runs by content, other ids as they are.
TEST(ImageCacheKey, TellsImagesApartByContent) {
  const TinyTower c;
  ImagePrompt p = two_image_prompt(c);
  ImageLayout layout;
  layout.images = p.images;
  layout.prompt_tokens = int64_t(p.ids.size());
  layout.offsets = {9, 22};
  layout.hashes = {1, 2};
  const auto key = image_cache_key(p.ids, layout);
  ASSERT_EQ(key.size(), p.ids.size());
  for (size_t i = 0; i < key.size(); ++i) {
    const bool in_image = (i >= 9 && i < 15) || (i >= 22 && i < 24);
    if (in_image)
      EXPECT_LT(key[i], 0) << i;
    else
      EXPECT_EQ(key[i], p.ids[i]) << i;
  }
  layout.hashes = {3, 2};
  const auto other = image_cache_key(p.ids, layout);
  EXPECT_NE(std::vector<int32_t>(key.begin() + 9, key.begin() + 15),
            std::vector<int32_t>(other.begin() + 9, other.begin() + 15));
  EXPECT_EQ(std::vector<int32_t>(key.begin() + 22, key.end()), std::vector<int32_t>(other.begin() + 22, other.end()));
}

}  // namespace
}  // namespace kiln::test
