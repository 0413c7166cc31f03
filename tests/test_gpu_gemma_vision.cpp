// Gemma 4's image front ends on the CUDA backend against the CPU f32 reference: the e2b-like tower
// (clipped linears, per-layer inputs), the 26B-like one (GQA, standardisation, images attended
// bidirectionally in the sliding layers) and the 12B's encoder-free embedder (bidirectional on every
// layer): the encoding, and a prompt with two images run whole and in chunks that keep each image
// whole. Skipped, visibly, where no GPU is present.
#include <gtest/gtest.h>

#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "io/config.h"
#include "models/family.h"
#include "qwen_vision_util.h"
#include "runtime/prompt_images.h"
#include "test_util.h"
#include "vision_test_util.h"

namespace kiln::test {
namespace {

constexpr int32_t kImage = 299;  // the placeholder in the tiny vocabulary

struct DeviceRun {
  std::vector<float> encoded;  // the first image's soft tokens
  std::vector<float> logits;   // every prompt token's
};

DeviceRun run_on(Backend& backend, const std::string& dir, const std::vector<int32_t>& ids,
                 const std::vector<ProcessedImage>& images, int64_t chunk) {
  DeviceRun out;
  auto model = load_model(dir, backend);
  EXPECT_TRUE(model.ok()) << (model.ok() ? "" : model.error().message);
  if (!model.ok()) return out;
  auto config = read_model_config(dir);
  auto family = family_of(*config);
  auto layout =
      lay_out_images((*model)->batch_needs(), **family, *config, ImagePlaceholder{.token_id = kImage}, ids, images);
  EXPECT_TRUE(layout.ok()) << (layout.ok() ? "" : layout.error().message);
  if (!layout.ok()) return out;
  auto placed = encode_images(**model, *layout);
  EXPECT_TRUE(placed.ok()) << (placed.ok() ? "" : placed.error().message);
  if (!placed.ok()) return out;
  const Tensor encoded = backend.to_host(placed->images[0].rows);
  out.encoded.assign(encoded.data_as<float>(), encoded.data_as<float>() + encoded.numel());
  auto state = (*model)->new_sequence(int64_t(ids.size()) + 8);
  auto logits = run_prompt(**model, **state, ids, *placed, chunk, LogitRows::all);
  EXPECT_TRUE(logits.ok()) << (logits.ok() ? "" : logits.error().message);
  if (!logits.ok()) return out;
  out.logits.assign(logits->data_as<float>(), logits->data_as<float>() + logits->numel());
  return out;
}

TEST(GpuGemmaVision, ImagePromptsMatchCpuReference) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  ASSERT_TRUE(gpu.ok()) << gpu.error().message;
  TempDir tmp;
  CpuBackend cpu(4);
  for (const FrontEnd& f : front_ends()) {
    const std::string dir = synthesize(tmp, f.name, f.config, lively(f.clip_bound));
    std::mt19937 rng(7);
    const std::vector<ProcessedImage> images = {random_image(rng, f.rows, f.cols, f.values, f.soft),
                                                random_image(rng, f.rows, f.cols, f.values, f.soft)};
    std::vector<int32_t> ids;
    for (int i = 0; i < 7; ++i) ids.push_back(int32_t(3 + (i * 53) % 290));
    ids.insert(ids.end(), size_t(f.soft), kImage);
    for (int i = 0; i < 6; ++i) ids.push_back(int32_t(5 + (i * 37) % 290));
    ids.insert(ids.end(), size_t(f.soft), kImage);
    for (int i = 0; i < 5; ++i) ids.push_back(int32_t(11 + (i * 17) % 290));
    for (int64_t chunk : {int64_t(0), int64_t(f.soft + 2)}) {
      const DeviceRun want = run_on(cpu, dir, ids, images, chunk), got = run_on(**gpu, dir, ids, images, chunk);
      ASSERT_FALSE(want.logits.empty() || got.logits.empty()) << f.name;
      EXPECT_LE(relative_diff(got.encoded, want.encoded), 2e-2) << f.name << ": soft tokens";
      const int64_t vocab = int64_t(want.logits.size() / ids.size());
      auto logits = compare_logits(got.logits.data(), want.logits.data(), int64_t(ids.size()), vocab);
      EXPECT_LE(logits.relative(), 2e-2) << f.name << ", chunk " << chunk;
      EXPECT_GE(logits.argmax_agreement, 0.97) << f.name << ", chunk " << chunk;
    }
  }
  EXPECT_TRUE((*gpu)->status().ok());
}

}  // namespace
}  // namespace kiln::test
