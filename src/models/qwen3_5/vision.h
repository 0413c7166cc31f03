// Qwen 3.5's vision encoder (qwen3_5 and qwen3_5_moe wrappers alike): patch embedding, the learned
// position table resampled to each image's grid, transformer blocks with 2-D rotary attention over
// an image's patches, and the patch merger that turns each 2×2 block of patches into one soft token
// of the text model's width. Read against transformers' modeling_qwen3_5.py (Qwen3_5VisionModel,
// Qwen3_5VisionPatchEmbed, Qwen3_5VisionRotaryEmbedding, Qwen3_5VisionBlock, Qwen3_5VisionAttention,
// Qwen3_5VisionMLP, Qwen3_5VisionPatchMerger) and vision_utils.py (get_vision_position_ids,
// get_vision_interpolation_indices_and_weights, get_vision_cu_seqlens).
//
// The tower has no deepstack mergers (Qwen3-VL's; Qwen 3.5's configs say deepstack_visual_indexes:
// [] and transformers' tower holds none), so the text model takes nothing from it but the soft
// tokens. Checkpoints: transformers' names ("model.visual."), mlx-vlm's ("vision_tower.", its Conv3d
// weight channels-last), in the main files or an mlx conversion's optiq_vision.safetensors.
// Leaves out: videos (several frames attend frame by frame here as in the reference, but nothing
// upstream makes them yet).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "io/config.h"
#include "layers/loader.h"
#include "models/model.h"

namespace kiln {

// Field names follow vision_config's keys (Qwen3_5VisionConfig; absent keys take its defaults).
struct Qwen35VisionConfig {
  int64_t depth = 27;
  int64_t hidden_size = 1152;
  std::string hidden_act = "gelu_pytorch_tanh";
  int64_t intermediate_size = 4304;
  int64_t num_heads = 16;
  int64_t in_channels = 3;
  int64_t patch_size = 16;
  int64_t spatial_merge_size = 2;
  int64_t temporal_patch_size = 2;
  int64_t out_hidden_size = 3584;
  int64_t num_position_embeddings = 2304;
  double rope_theta = 10000.0;  // rope_parameters.rope_theta of the axial rotary embedding

  int64_t head_dim() const { return hidden_size / num_heads; }
  int64_t patch_values() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
};

// `vision_config` (an object; null or absent: every default). `where` names it in messages.
Result<Qwen35VisionConfig> parse_qwen3_5_vision_config(const nlohmann::json& vision_config, const std::string& where);

// Host-side layout of an image's patches, in the order the image processor emits them: frame by
// frame, each frame in blocks of merge × merge patches (block rows, block columns, then the rows and
// columns within a block).
//
// The (row, column) of every patch in its frame: [2 × patches], rows then columns (transformers'
// get_vision_position_ids, the positions the blocks' rotary embedding turns by).
std::vector<int32_t> qwen3_5_vision_patch_positions(int64_t t, int64_t h, int64_t w, int64_t merge);
// The learned position table (host f32 [side², hidden], side = sqrt(num_position_embeddings))
// bilinearly resampled with aligned corners to each patch's (row, column) of an h × w grid: host f32
// [t·h·w, hidden] (transformers' get_vision_interpolation_indices_and_weights, then the weighted sum
// of the four table rows, formed in f32 in the reference's order).
Tensor qwen3_5_vision_position_embeddings(const Tensor& table, int64_t side, int64_t t, int64_t h, int64_t w,
                                          int64_t merge);

// Records a named intermediate (on the backend) for activation dumps.
using VisionDump = std::function<void(const std::string& name, const Tensor& value)>;

class Qwen35VisionEncoder {
 public:
  // Loads the tower whose tensors are named `prefix` + the reference's module path ("visual." for
  // transformers' checkpoints, "vision_tower." for mlx-vlm's). text_hidden: the text model's width,
  // which the merger's output must have.
  static Result<Qwen35VisionEncoder> load(const Qwen35VisionConfig& config, WeightLoader& weights,
                                          const std::string& prefix, int64_t text_hidden);

  // The image's soft tokens, [image.soft_tokens, out_hidden_size] on the backend.
  Result<Tensor> encode(Backend& backend, const ProcessedImage& image, const VisionDump& dump = {}) const;

  const Qwen35VisionConfig& config() const { return config_; }

 private:
  struct Linear {
    Tensor weight;  // [out, in] (matrix type)
    Tensor bias;    // [out] f32
  };
  struct LayerNorm {
    Tensor weight, bias;  // [dim] f32
  };
  struct Block {
    LayerNorm norm1, norm2;
    Linear attn_qkv, attn_proj;
    Linear mlp_linear_fc1, mlp_linear_fc2;
  };

  Tensor attention(Backend& backend, const Block& block, const Tensor& x, const Tensor& rope_positions,
                   const std::vector<SeqRows>& frames, const std::vector<KvCacheView>& caches,
                   const Tensor& slot_positions, const Tensor& query_positions) const;

  Qwen35VisionConfig config_;
  BiasActivation mlp_act_ = BiasActivation::gelu_tanh;
  Linear patch_embed_proj_;  // the Conv3d as a product: [hidden, C·T·P·P], the pixels' order
  Tensor pos_embed_;         // host f32 [num_position_embeddings, hidden]: resampled per image on the host
  int64_t grid_side_ = 0;    // sqrt(num_position_embeddings)
  // the axial rotation: pair i < head_dim/4 turns by the patch's row, the rest by its column,
  // both with the frequencies theta^(-4j / head_dim)
  Tensor rope_inv_freq_, rope_pair_axis_;
  std::vector<Block> blocks_;
  LayerNorm merger_norm_;
  Linear merger_linear_fc1_, merger_linear_fc2_;
};

}  // namespace kiln
