// Qwen 3.5: the hybrid of Gated DeltaNet (linear attention with a recurrent state) and gated full
// attention, dense and mixture-of-experts (qwen3_5, qwen3_5_text, qwen3_5_moe, qwen3_5_moe_text), in
// transformers' and mlx-lm's layouts and norm conventions; with the release wrappers' vision
// encoder (vision.h) when the checkpoint holds it, whose soft tokens the text model embeds in place
// of the image placeholders, and the multimodal RoPE that places them (mrope.h).
//
// Leaves out: the MTP head, videos.
#pragma once

#include <string>
#include <vector>

#include "io/config.h"
#include "io/weights.h"
#include "models/model.h"
#include "models/qwen3_5/vision.h"

namespace kiln {

// Field names follow config.json.
struct Qwen35Config {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  std::vector<std::string> layer_types;  // "linear_attention" / "full_attention"
  int64_t linear_conv_kernel_dim = 4;
  int64_t linear_key_head_dim = 128;
  int64_t linear_value_head_dim = 128;
  int64_t linear_num_key_heads = 16;
  int64_t linear_num_value_heads = 32;
  double rope_theta = 1e7;
  double partial_rotary_factor = 0.25;
  // rotary pairs per position axis (time, row, column), interleaved (rope_parameters.mrope_section)
  std::vector<int64_t> mrope_section = {11, 11, 10};
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;
  // MoE (num_experts > 0)
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;
  bool norm_topk_prob = true;
};

Result<Qwen35Config> parse_qwen3_5_config(const ModelConfigFile& file);

// What a release wrapper's config.json says of images beside the text model: its vision_config
// (defaults where keys are absent, as transformers fills them) and the placeholder token. Flat text
// configs (qwen3_5_text, qwen3_5_moe_text) have none.
struct Qwen35ImageConfig {
  bool described = false;  // a wrapper config, or one with a vision_config
  Qwen35VisionConfig vision;
  int32_t image_token_id = 248056;
};
Result<Qwen35ImageConfig> parse_qwen3_5_image_config(const ModelConfigFile& file);

std::vector<CheckpointTensor> qwen3_5_checkpoint_tensors(const Qwen35Config& config);

Result<std::unique_ptr<Model>> load_qwen3_5(const ModelConfigFile& file, const WeightStore& weights, Backend& backend,
                                            const ModelOptions& options);

}  // namespace kiln
