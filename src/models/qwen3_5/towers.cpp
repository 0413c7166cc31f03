// The parts of Qwen 3.5's release-form checkpoints beside the language model, listed tensor by
// tensor with the shapes the configs give and the fills the modules initialise them with.
//
// The vision tower follows transformers' classes (modular_qwen3_5.py, modular_qwen3_5_moe.py, and
// the Qwen3-VL modules they inherit): Qwen3_5VisionModel / Qwen3_5MoeVisionModel, i.e.
// Qwen3VLVisionModel without its deepstack mergers: Qwen3VLVisionPatchEmbed (a Conv3d with bias),
// the learned pos_embed (nn.Embedding), Qwen3VLVisionBlock (LayerNorms norm1 / norm2,
// Qwen3VLVisionAttention's fused qkv and proj, Qwen3VLVisionMLP), and Qwen3VLVisionPatchMerger
// (norm before the 2x2 merge). Saved by Qwen3_5ForConditionalGeneration under "model.visual.".
// Keys vision_config leaves out take the defaults of Qwen3_5VisionConfig / Qwen3_5MoeVisionConfig
// (the same values). The rotary inv_freq is a non-persistent buffer and is not saved.
//
// transformers has no MTP module (it ignores "mtp.*" on load); the head is listed as the released
// checkpoints hold it: mtp.fc [H, 2H], the (1 + w) norms pre_fc_norm_embedding, pre_fc_norm_hidden
// and norm, and mtp.layers.N, full-attention decoder layers of the main layers' structure (experts
// one tensor each, as the released MoE checkpoints store them).
#include "models/qwen3_5/towers.h"

#include <string>

#include "models/qwen3_5/qwen3_5.h"

namespace kiln {

namespace {

using Fill = CheckpointTensor::Fill;

// Reads a size; a value below 1 is an error naming the key.
int64_t size_of(ConfigReader& r, const std::string& key, int64_t fallback) {
  const int64_t v = r.get_int(key, fallback);
  if (v < 1) r.fail("'" + key + "' must be at least 1, got " + std::to_string(v));
  return v;
}

Status vision_tower(const nlohmann::json& j, const std::string& where, std::vector<CheckpointTensor>& t) {
  ConfigReader c(j, where);
  const int64_t depth = size_of(c, "depth", 27);
  const int64_t hidden = size_of(c, "hidden_size", 1152);
  const int64_t intermediate = size_of(c, "intermediate_size", 4304);
  size_of(c, "num_heads", 16);  // splits qkv into heads; no tensor's shape depends on it
  const int64_t in_channels = size_of(c, "in_channels", 3);
  const int64_t patch = size_of(c, "patch_size", 16);
  const int64_t temporal = size_of(c, "temporal_patch_size", 2);
  const int64_t merge = size_of(c, "spatial_merge_size", 2);
  const int64_t out = size_of(c, "out_hidden_size", 3584);
  const int64_t positions = size_of(c, "num_position_embeddings", 2304);
  KILN_TRY(c.status());

  auto matrix = [&](const std::string& name, Shape shape) { t.push_back({name, shape, Fill::normal, 0.02f}); };
  auto constant = [&](const std::string& name, Shape shape, float v) { t.push_back({name, shape, Fill::constant, v}); };
  auto linear = [&](const std::string& name, int64_t out_features, int64_t in_features) {
    matrix(name + ".weight", Shape{out_features, in_features});
    constant(name + ".bias", Shape{out_features}, 0.0f);
  };
  auto layer_norm = [&](const std::string& name, int64_t dim) {
    constant(name + ".weight", Shape{dim}, 1.0f);
    constant(name + ".bias", Shape{dim}, 0.0f);
  };

  const std::string v = "model.visual.";
  // Conv3d over [channel, frame, row, column] of one patch
  matrix(v + "patch_embed.proj.weight", Shape{hidden, in_channels, temporal, patch, patch});
  constant(v + "patch_embed.proj.bias", Shape{hidden}, 0.0f);
  matrix(v + "pos_embed.weight", Shape{positions, hidden});
  for (int64_t i = 0; i < depth; ++i) {
    const std::string b = v + "blocks." + std::to_string(i) + ".";
    layer_norm(b + "norm1", hidden);
    layer_norm(b + "norm2", hidden);
    linear(b + "attn.qkv", 3 * hidden, hidden);
    linear(b + "attn.proj", hidden, hidden);
    linear(b + "mlp.linear_fc1", intermediate, hidden);
    linear(b + "mlp.linear_fc2", hidden, intermediate);
  }
  const int64_t merged = hidden * merge * merge;  // a 2x2 block of patches, concatenated
  layer_norm(v + "merger.norm", hidden);
  linear(v + "merger.linear_fc1", merged, merged);
  linear(v + "merger.linear_fc2", out, merged);
  return ok_status();
}

// The MTP head: norms of the next token's embedding and of the hidden state, their concatenation
// projected back to H, decoder layers of the full-attention kind, and a final norm.
void mtp_head(const Qwen35Config& text, int64_t layers, std::vector<CheckpointTensor>& t) {
  const int64_t H = text.hidden_size;
  t.push_back({"mtp.fc.weight", Shape{H, 2 * H}, Fill::normal, 0.02f});
  for (const char* norm : {"mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"})
    t.push_back({norm, Shape{H}, Fill::constant, 0.0f});  // (1 + w) norms
  // one full-attention layer of the main model's structure, renamed
  Qwen35Config one = text;
  one.num_hidden_layers = 1;
  one.layer_types = {"full_attention"};
  const std::string from = "model.layers.0.";
  const std::vector<CheckpointTensor> layer = qwen3_5_checkpoint_tensors(one);
  for (int64_t i = 0; i < layers; ++i) {
    const std::string to = "mtp.layers." + std::to_string(i) + ".";
    for (const auto& tensor : layer) {
      if (tensor.name.rfind(from, 0) != 0) continue;
      CheckpointTensor renamed = tensor;
      renamed.name = to + tensor.name.substr(from.size());
      t.push_back(std::move(renamed));
    }
  }
}

}  // namespace

Result<std::vector<CheckpointTensor>> qwen3_5_part_tensors(const ModelConfigFile& file) {
  KILN_ASSIGN(Qwen35Config text, parse_qwen3_5_config(file));
  std::vector<CheckpointTensor> out;
  if (file.root.contains("vision_config") && file.root.at("vision_config").is_object())
    KILN_TRY(vision_tower(file.root.at("vision_config"), file.path + " vision_config", out));
  ConfigReader c(file.text, file.path + " text_config");
  const int64_t mtp_layers = c.get_int("mtp_num_hidden_layers", 0);
  KILN_TRY(c.status());
  if (mtp_layers < 0) return make_error("{}: 'mtp_num_hidden_layers' must not be negative", file.path);
  if (mtp_layers > 0) mtp_head(text, mtp_layers, out);
  return out;
}

}  // namespace kiln
