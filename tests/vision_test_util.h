// Helpers of the Gemma 4 image tests: release-form configs shrunk around a fixture's language model,
// synthetic checkpoints of them (with fills that make every weight matter), random processed images.
#pragma once

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "io/config.h"
#include "io/synthetic.h"
#include "models/model.h"
#include "test_util.h"

namespace kiln::test {

inline std::string release_config(const std::string& name) {
  return source_dir() + "/models/configs/release/" + name + ".json";
}

// A release-form config with the language model of a fixture (its vocabulary of 320), `text_changes`
// applied to it, and the tower's sub-config changed by `vision`; no audio tower.
inline nlohmann::json shrunk(const std::string& release, const std::string& text_fixture, const nlohmann::json& vision,
                             const nlohmann::json& text_changes = nlohmann::json::object()) {
  auto config = read_json(release_config(release));
  auto text = read_json(fixture_path(text_fixture) + "/config.json");
  if (text.contains("text_config")) text = nlohmann::json(text["text_config"]);  // a wrapper fixture
  text.erase("architectures");
  text["model_type"] = config["text_config"]["model_type"];
  for (auto it = text_changes.begin(); it != text_changes.end(); ++it) text[it.key()] = it.value();
  config["text_config"] = text;
  config.erase("audio_config");
  for (auto it = vision.begin(); it != vision.end(); ++it) config["vision_config"][it.key()] = it.value();
  for (const char* id : {"image_token_id", "boi_token_id", "eoi_token_id"}) config.erase(id);
  return config;
}

// How a test wants a front end's tensors filled (transformers initialises the position tables to
// ones, the norms to ones and the clip bounds to ±inf, which would hide their bugs).
using Refill = std::function<void(CheckpointTensor&)>;

// Position tables, norms, biases and the standardisation drawn at random; clip bounds at ±bound.
inline Refill lively(float clip_bound = INFINITY) {
  return [clip_bound](CheckpointTensor& t) {
    const std::string& n = t.name;
    auto ends = [&](const char* s) {
      return n.size() >= strlen(s) && n.compare(n.size() - strlen(s), strlen(s), s) == 0;
    };
    using Fill = CheckpointTensor::Fill;
    if (n.find("position_embedding_table") != std::string::npos || ends("pos_embedding"))
      t = {n, t.shape, Fill::normal, 1.0f};
    else if (ends("_min"))
      t = {n, t.shape, Fill::constant, -clip_bound};
    else if (ends("_max"))
      t = {n, t.shape, Fill::constant, clip_bound};
    else if (ends("std_bias") || ends(".bias"))
      t = {n, t.shape, Fill::normal, 0.3f};
    else if (ends("std_scale") || (t.shape.rank() == 1 && ends(".weight")))
      t = {n, t.shape, Fill::uniform, 0.5f, 1.5f};
    else if (t.shape.rank() >= 2)
      t = {n, t.shape, Fill::normal, 0.2f};
  };
}

// Writes `config` as kiln synth-model does (the language model under model.language_model., the
// parts beside it, f32), the parts refilled by `refill`. The text weights depend on the text
// tensors alone (the fill is seeded by tensor index, and the text tensors come first).
inline std::string synthesize(const TempDir& tmp, const std::string& name, const nlohmann::json& config,
                              const Refill& refill = nullptr) {
  const std::string dir = tmp.path() + "/" + name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << config.dump(2);
  auto parsed = read_model_config(dir);
  EXPECT_TRUE(parsed.ok()) << (parsed.ok() ? "" : parsed.error().message);
  auto tensors = checkpoint_tensors(*parsed);
  EXPECT_TRUE(tensors.ok()) << (tensors.ok() ? "" : tensors.error().message);
  for (auto& t : *tensors)
    if (t.name.rfind("model.", 0) == 0) t.name = "model.language_model." + t.name.substr(6);
  auto parts = checkpoint_part_tensors(*parsed);
  EXPECT_TRUE(parts.ok());
  for (auto& t : *parts) {
    if (refill) refill(t);
    tensors->push_back(t);
  }
  EXPECT_TRUE(
      write_synthetic_checkpoint(dir, config, *tensors, SyntheticOptions{.dtype = DType::f32, .seed = 9, .threads = 2})
          .ok());
  return dir;
}

inline ProcessedImage random_image(std::mt19937& rng, int64_t rows, int64_t cols, int64_t values, int64_t soft) {
  ProcessedImage image;
  image.pixels = host_tensor(DType::f32, Shape{rows * cols, values});
  std::uniform_real_distribution<float> dist(0.0f, 1.0f);
  for (int64_t i = 0; i < image.pixels.numel(); ++i) image.pixels.data_as<float>()[i] = dist(rng);
  image.grid = {rows, cols};
  image.soft_tokens = soft;
  return image;
}

inline bool all_finite(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(t.data_as<float>()[i])) return false;
  return true;
}

inline double max_abs(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, double(std::fabs(t.data_as<float>()[i])));
  return m;
}

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  double d = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    d = std::max(d, double(std::fabs(a.data_as<float>()[i] - b.data_as<float>()[i])));
  return d;
}

// A front end at a small geometry, and an image it takes.
struct FrontEnd {
  std::string name;
  nlohmann::json config;
  int64_t values;            // per patch
  int64_t rows, cols, soft;  // a test image
  float clip_bound = INFINITY;
};

inline void PrintTo(const FrontEnd& f, std::ostream* os) {
  *os << f.name;
}

inline std::vector<FrontEnd> front_ends() {
  const nlohmann::json tower = {{"hidden_size", 16},        {"intermediate_size", 24},      {"num_hidden_layers", 2},
                                {"num_attention_heads", 2}, {"num_key_value_heads", 2},     {"head_dim", 8},
                                {"patch_size", 4},          {"position_embedding_size", 16}};
  nlohmann::json gqa = tower;  // 26B-like: standardize, two query heads a KV head, head_dim 12
  gqa["num_attention_heads"] = 4;
  gqa["head_dim"] = 12;
  return {
      // e2b: clipped linears, here with bounds that clip
      {"e2b", shrunk("gemma4-e2b", "gemma4_ple_shared", tower), 48, 6, 9, 6, 1.5f},
      {"26b", shrunk("gemma4-26b-a4b", "gemma4_keqv", gqa, {{"use_bidirectional_attention", "vision"}}), 48, 9, 3, 3},
      {"12b",
       shrunk("gemma4-12b", "gemma4_dense",
              {{"patch_size", 2},
               {"pooling_kernel_size", 2},
               {"mm_embed_dim", 24},
               {"mm_posemb_size", 8},
               {"output_proj_dims", 24}}),
       48, 3, 4, 12},
  };
}

}  // namespace kiln::test
