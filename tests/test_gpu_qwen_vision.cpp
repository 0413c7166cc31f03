// Qwen 3.5's image path on the CUDA backend against the CPU f32 reference: the vision encoder, and
// a prompt with two images through prefill (whole and in chunks that split the images) and decode
// replayed as a CUDA graph, which must carry the rope delta on all three axes. Skipped, visibly,
// where no GPU is present.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "io/config.h"
#include "models/family.h"
#include "models/model.h"
#include "qwen_vision_util.h"
#include "runtime/decode_loop.h"
#include "test_util.h"

namespace kiln::test {
namespace {

struct DeviceRun {
  std::vector<float> encoded;  // both images' soft tokens
  std::vector<float> prefill;  // every prompt token's logits
  std::vector<float> decoded;  // logits of four replayed decode steps
};

DeviceRun run_on(Backend& backend, const std::string& dir, const ImagePrompt& p, int64_t chunk) {
  DeviceRun out;
  auto model = load_model(dir, backend);
  EXPECT_TRUE(model.ok()) << (model.ok() ? "" : model.error().message);
  if (!model.ok()) return out;
  std::vector<Tensor> encoded;
  std::vector<std::vector<int64_t>> grids;
  for (const auto& image : p.images) {
    auto rows = (*model)->encode_image(image);
    EXPECT_TRUE(rows.ok()) << (rows.ok() ? "" : rows.error().message);
    if (!rows.ok()) return out;
    encoded.push_back(*rows);
    grids.push_back(image.grid);
    const Tensor host = backend.to_host(*rows);
    out.encoded.insert(out.encoded.end(), host.data_as<float>(), host.data_as<float>() + host.numel());
  }
  auto config = read_model_config(dir);
  auto positions = family_named("qwen3_5")->rope_positions(*config, p.ids, grids);
  EXPECT_TRUE(positions.ok());
  auto state = (*model)->new_sequence(int64_t(p.ids.size()) + 8);
  auto logits = run_image_prompt(**model, **state, p.ids, kTinyImage, encoded, *positions, chunk);
  EXPECT_TRUE(logits.ok()) << (logits.ok() ? "" : logits.error().message);
  if (!logits.ok()) return out;
  out.prefill = *logits;
  auto loop = DecodeLoop::create(**model, {state->get()}, std::vector<int32_t>{17});
  EXPECT_TRUE(loop.ok()) << (loop.ok() ? "" : loop.error().message);
  for (int step = 0; step < 4 && loop.ok(); ++step) {
    EXPECT_TRUE((*loop)->step().ok());
    const Tensor host = backend.to_host((*loop)->logits());
    out.decoded.insert(out.decoded.end(), host.data_as<float>(), host.data_as<float>() + host.numel());
    (*loop)->set_tokens(std::vector<int32_t>{int32_t(20 + step)});  // the same inputs on both backends
  }
  return out;
}

TEST(GpuQwenVision, ImagePromptMatchesCpuReference) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  ASSERT_TRUE(gpu.ok()) << gpu.error().message;
  const TinyTower c;
  TempDir tmp;
  const std::string dir = tower_checkpoint(tmp, "hf", c, tower_weights(c, 31), false);
  const ImagePrompt p = two_image_prompt(c);
  CpuBackend cpu(4);
  for (int64_t chunk : {int64_t(0), int64_t(5)}) {
    const DeviceRun want = run_on(cpu, dir, p, chunk), got = run_on(**gpu, dir, p, chunk);
    ASSERT_FALSE(want.decoded.empty());
    EXPECT_LE(relative_diff(got.encoded, want.encoded), 2e-2) << "soft tokens, chunk " << chunk;
    const int64_t vocab = 320, n = int64_t(p.ids.size());
    auto prefill = compare_logits(got.prefill.data(), want.prefill.data(), n, vocab);
    EXPECT_LE(prefill.relative(), 2e-2) << "prefill, chunk " << chunk;
    EXPECT_GE(prefill.argmax_agreement, 0.97) << "prefill, chunk " << chunk;
    auto decoded = compare_logits(got.decoded.data(), want.decoded.data(), 4, vocab);
    EXPECT_LE(decoded.relative(), 2e-2) << "decode, chunk " << chunk;
  }
  EXPECT_TRUE((*gpu)->status().ok());
}

}  // namespace
}  // namespace kiln::test
