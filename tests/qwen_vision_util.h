// What the CPU and GPU tests of Qwen 3.5's image path share: a tiny vision tower on the oracle's
// qwen3_5_dense text model (transformers' or mlx-vlm's layout), random images, a prompt with two
// images, and running such a prompt in chunks with its soft tokens and laid-out positions.
#pragma once

#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "models/model.h"
#include "test_util.h"

namespace kiln::test {

using Positions = std::vector<int32_t>;

// ---- a tiny tower on the oracle's text fixture ----

// Vision geometry small enough for a naive reference: 2 blocks of width 32 in 2 heads of 16, 2×2
// patches of 3 channels and 2 frames (24 values), a 4×4 position table, merged 2×2 into the text's 64.
struct TinyTower {
  int64_t depth = 2, hidden = 32, heads = 2, inter = 48, channels = 3, patch = 2, temporal = 2, merge = 2, side = 4,
          out = 64;
  double theta = 10000.0;
  int64_t values() const { return channels * temporal * patch * patch; }
  nlohmann::json config() const {
    return {{"model_type", "qwen3_5_vision"},
            {"depth", depth},
            {"hidden_size", hidden},
            {"hidden_act", "gelu_pytorch_tanh"},
            {"intermediate_size", inter},
            {"num_heads", heads},
            {"in_channels", channels},
            {"patch_size", patch},
            {"temporal_patch_size", temporal},
            {"spatial_merge_size", merge},
            {"out_hidden_size", out},
            {"num_position_embeddings", side * side},
            {"deepstack_visual_indexes", nlohmann::json::array()}};
  }
};

constexpr int32_t kTinyImage = 300;  // the placeholder in the tiny vocabulary of 320

// The tower's tensors as transformers names them (without "model.visual."), random, f32.
inline std::map<std::string, Tensor> tower_weights(const TinyTower& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::map<std::string, Tensor> w;
  auto random = [&](const std::string& name, Shape shape, float std, float mean = 0.0f) {
    Tensor t = host_tensor(DType::f32, shape);
    std::normal_distribution<float> d(mean, std);
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = d(rng);
    w[name] = t;
  };
  const int64_t H = c.hidden, merged = H * c.merge * c.merge;
  random("patch_embed.proj.weight", Shape{H, c.channels, c.temporal, c.patch, c.patch}, 0.2f);
  random("patch_embed.proj.bias", Shape{H}, 0.1f);
  random("pos_embed.weight", Shape{c.side * c.side, H}, 0.5f);
  for (int64_t i = 0; i < c.depth; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    for (const char* n : {"norm1", "norm2"}) {
      random(b + n + ".weight", Shape{H}, 0.2f, 1.0f);
      random(b + n + ".bias", Shape{H}, 0.1f);
    }
    random(b + "attn.qkv.weight", Shape{3 * H, H}, 0.25f);
    random(b + "attn.qkv.bias", Shape{3 * H}, 0.1f);
    random(b + "attn.proj.weight", Shape{H, H}, 0.2f);
    random(b + "attn.proj.bias", Shape{H}, 0.1f);
    random(b + "mlp.linear_fc1.weight", Shape{c.inter, H}, 0.2f);
    random(b + "mlp.linear_fc1.bias", Shape{c.inter}, 0.1f);
    random(b + "mlp.linear_fc2.weight", Shape{H, c.inter}, 0.2f);
    random(b + "mlp.linear_fc2.bias", Shape{H}, 0.1f);
  }
  random("merger.norm.weight", Shape{H}, 0.2f, 1.0f);
  random("merger.norm.bias", Shape{H}, 0.1f);
  random("merger.linear_fc1.weight", Shape{merged, merged}, 0.1f);
  random("merger.linear_fc1.bias", Shape{merged}, 0.1f);
  random("merger.linear_fc2.weight", Shape{c.out, merged}, 0.1f);
  random("merger.linear_fc2.bias", Shape{c.out}, 0.1f);
  return w;
}

inline std::vector<NamedTensor> read_all(const std::string& path) {
  std::vector<NamedTensor> tensors;
  auto file = SafetensorsFile::open(path);
  EXPECT_TRUE(file.ok());
  if (!file.ok()) return tensors;
  for (const auto& info : (*file)->tensors()) {
    auto view = (*file)->view(info);
    Tensor copy = host_tensor(view->dtype(), view->shape());
    std::memcpy(copy.data(), view->data(), view->nbytes());
    tensors.push_back({info.name, copy});
  }
  return tensors;
}

// The oracle's qwen3_5_dense text model inside a qwen3_5 wrapper with the tiny tower: under
// transformers' names in model.safetensors, or (mlx) under mlx-vlm's names, the Conv3d weight
// channels-last, in optiq_vision.safetensors. No tower at all with `with_tower` false.
inline std::string tower_checkpoint(const TempDir& tmp, const std::string& name, const TinyTower& c,
                                    const std::map<std::string, Tensor>& weights, bool mlx, bool with_tower = true) {
  const std::string dir = tmp.copy_fixture("qwen3_5_dense", name);
  nlohmann::json text = read_json(dir + "/config.json");
  text.erase("architectures");
  const bool tied = text["tie_word_embeddings"].get<bool>();
  nlohmann::json wrapper = {{"architectures", {"Qwen3_5ForConditionalGeneration"}},
                            {"model_type", "qwen3_5"},
                            {"text_config", text},
                            {"vision_config", c.config()},
                            {"image_token_id", kTinyImage},
                            {"tie_word_embeddings", tied}};
  std::ofstream(dir + "/config.json", std::ios::trunc) << wrapper.dump(2);
  if (!with_tower) return dir;
  std::vector<NamedTensor> tower;
  for (const auto& [n, t] : weights) {
    Tensor value = t;
    if (mlx && n == "patch_embed.proj.weight") {  // [H, C, T, P, P] -> [H, T, P, P, C]
      value = host_tensor(DType::f32, Shape{c.hidden, c.temporal, c.patch, c.patch, c.channels});
      for (int64_t o = 0; o < c.hidden; ++o)
        for (int64_t ch = 0; ch < c.channels; ++ch)
          for (int64_t f = 0; f < c.temporal; ++f)
            for (int64_t y = 0; y < c.patch; ++y)
              for (int64_t x = 0; x < c.patch; ++x)
                value.data_as<float>()[(((o * c.temporal + f) * c.patch + y) * c.patch + x) * c.channels + ch] =
                    t.data_as<float>()[(((o * c.channels + ch) * c.temporal + f) * c.patch + y) * c.patch + x];
    }
    tower.push_back({(mlx ? "vision_tower." : "model.visual.") + n, value});
  }
  if (mlx) {
    EXPECT_TRUE(write_safetensors(dir + "/optiq_vision.safetensors", tower).ok());
  } else {
    auto all = read_all(dir + "/model.safetensors");
    all.insert(all.end(), tower.begin(), tower.end());
    EXPECT_TRUE(write_safetensors(dir + "/model.safetensors", all).ok());
  }
  return dir;
}

inline ProcessedImage random_image(const TinyTower& c, std::vector<int64_t> grid, uint32_t seed) {
  ProcessedImage image;
  const int64_t n = grid[0] * grid[1] * grid[2];
  image.pixels = host_tensor(DType::f32, Shape{n, c.values()});
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (int64_t i = 0; i < image.pixels.numel(); ++i) image.pixels.data_as<float>()[i] = d(rng);
  image.soft_tokens = n / (c.merge * c.merge);
  image.grid = std::move(grid);
  return image;
}

// ---- prompts with images ----

struct ImagePrompt {
  std::vector<int32_t> ids;
  std::vector<ProcessedImage> images;
};

// text, an image of 2×3 soft tokens, text, an image of 1×2, text (vision start/end are plain text here)
inline ImagePrompt two_image_prompt(const TinyTower& c) {
  ImagePrompt p;
  const auto base = fixture_ids("qwen3_5_dense");
  auto text = [&](int64_t from, int64_t n) { p.ids.insert(p.ids.end(), base.begin() + from, base.begin() + from + n); };
  text(0, 9);
  p.images.push_back(random_image(c, {1, 4, 6}, 21));
  p.ids.insert(p.ids.end(), 6, kTinyImage);
  text(9, 7);
  p.images.push_back(random_image(c, {1, 2, 4}, 22));
  p.ids.insert(p.ids.end(), 2, kTinyImage);
  text(16, 5);
  return p;
}

// Runs a prompt in chunks of `chunk` tokens (0: whole), each with its share of the images' soft
// tokens (the runs of `image_token`, in order) and of the laid-out positions; the logits of every
// token.
inline Result<std::vector<float>> run_image_prompt(Model& model, SequenceState& state, const std::vector<int32_t>& ids,
                                                   int32_t image_token, const std::vector<Tensor>& encoded,
                                                   const Positions& positions, int64_t chunk) {
  const int64_t n = int64_t(ids.size());
  if (chunk == 0) chunk = n;
  std::vector<int64_t> starts;  // where each image's soft tokens start
  for (int64_t i = 0; i < n; ++i)
    if (ids[size_t(i)] == image_token && (starts.empty() || i >= starts.back() + encoded[starts.size() - 1].rows()))
      if (starts.size() < encoded.size()) starts.push_back(i);
  std::vector<float> all;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t len = std::min(chunk, n - begin);
    std::vector<SoftTokens> soft;
    for (size_t k = 0; k < starts.size(); ++k) {
      const int64_t s = std::max(starts[k], begin), e = std::min(starts[k] + encoded[k].rows(), begin + len);
      if (s >= e) continue;
      soft.push_back(SoftTokens{.offset = s - begin,
                                .rows = encoded[k].rows_view(s - starts[k], e - s),
                                .first = s - starts[k],
                                .image_rows = encoded[k].rows()});
    }
    Positions part;
    for (int64_t a = 0; a < 3; ++a)
      part.insert(part.end(), positions.begin() + a * n + begin, positions.begin() + a * n + begin + len);
    SeqChunk c{.state = &state,
               .tokens = std::span<const int32_t>(ids).subspan(size_t(begin), size_t(len)),
               .soft = soft,
               .positions = part};
    KILN_ASSIGN(Tensor logits, model.forward(std::span<const SeqChunk>(&c, 1), LogitRows::all));
    const Tensor host = model.backend().to_host(logits);
    all.insert(all.end(), host.data_as<float>(), host.data_as<float>() + host.numel());
  }
  return all;
}

inline double relative_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return a.size() == b.size() ? diff / scale : 1e30;
}

}  // namespace kiln::test
