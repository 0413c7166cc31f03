// Gemma 4 text decoder: gemma4_text and gemma4_unified_text checkpoints and the language model of
// the gemma4 and gemma4_unified (multimodal) wrappers, in transformers' and mlx-lm's layouts.
//
// Covers every text variant: sliding and full attention layers with their own head dims and KV
// heads, attention_k_eq_v, q/k/v norms, attention scale 1, default and "proportional" RoPE,
// per-layer inputs (e2b/e4b), KV sharing and the double-wide MLP, layer_scalar, the MoE block
// (26B-A4B), GeGLU, final logit softcapping, tied embeddings.
// Images (the wrappers): encode_image runs the image front end (vision.h); a chunk's soft tokens
// replace their placeholders' embeddings unscaled, the per-layer inputs see the pad token there,
// and with use_bidirectional_attention = "vision" an image's tokens attend to each other (so an
// image must come within one chunk).
// Leaves out: the audio encoders (set aside, see family.cpp), video, use_bidirectional_attention =
// "all" (embedding models).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/config.h"
#include "io/weights.h"
#include "models/model.h"

namespace kiln {

struct Gemma4RopeConfig {
  std::string rope_type = "default";  // "default" or "proportional"
  double rope_theta = 10000.0;
  double partial_rotary_factor = 1.0;
  double factor = 1.0;
};

// Field names follow config.json.
struct Gemma4Config {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  std::vector<std::string> layer_types;  // "sliding_attention" / "full_attention"
  int64_t sliding_window = 0;
  double rms_norm_eps = 1e-6;
  Gemma4RopeConfig rope_sliding, rope_full;
  std::optional<double> final_logit_softcapping;
  int64_t hidden_size_per_layer_input = 0;
  int64_t vocab_size_per_layer_input = 0;
  bool attention_k_eq_v = false;
  int64_t num_kv_shared_layers = 0;
  bool use_double_wide_mlp = false;
  bool enable_moe_block = false;
  int64_t num_experts = 0;
  int64_t top_k_experts = 0;
  int64_t moe_intermediate_size = 0;
  bool tie_word_embeddings = true;
  int64_t max_position_embeddings = 0;
  int64_t pad_token_id = 0;                 // what the per-layer inputs look up at image positions
  std::string use_bidirectional_attention;  // "" or "vision"

  // How image tokens see each other, from use_bidirectional_attention = "vision" and what
  // transformers 5.17 builds for the model type:
  //   sliding_layers (gemma4, Gemma4Model.forward → create_masks_for_vision_model): sliding layers
  //     AND(window, OR(causal, same image)); full layers causal.
  //   all_layers (gemma4_unified, Gemma4UnifiedModel.forward → create_masks_for_generate with
  //     block_sequence_ids): every layer OR(its causal or sliding mask, same image).
  enum class ImageAttention { causal, sliding_layers, all_layers };
  ImageAttention image_attention = ImageAttention::causal;

  // Resolved per layer from either config form: the released checkpoints' global_head_dim /
  // num_global_key_value_heads, or transformers 5.x's per_layer_config.
  struct Layer {
    bool sliding = true;
    int64_t head_dim = 0;
    int64_t n_kv_heads = 0;
    bool k_eq_v = false;     // full layer whose values reuse the key projection
    bool shares_kv = false;  // reads the cache of kv_source instead of owning one
    int64_t kv_source = 0;   // the layer whose cache it attends (itself unless shares_kv)
    int64_t mlp_width = 0;
  };
  std::vector<Layer> layers;
};

Result<Gemma4Config> parse_gemma4_config(const ModelConfigFile& file);

std::vector<CheckpointTensor> gemma4_checkpoint_tensors(const Gemma4Config& config);

Result<std::unique_ptr<Model>> load_gemma4(const ModelConfigFile& file, const WeightStore& weights, Backend& backend,
                                           const ModelOptions& options);

}  // namespace kiln
