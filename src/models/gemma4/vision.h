// Gemma 4's image front ends: a processed image (kiln::ProcessedImage, as transformers' image
// processor leaves it) in, its soft tokens in the text model's embedding space out.
//
//   gemma4 (e2b, e4b, 26B-A4B, 31B)  Gemma4VisionModel: the patch embedder (2 · (pixels − 0.5)
//     through input_proj, plus the x and y rows of its position table), encoder layers (clippable
//     linears, q/k/v norms, 2-D RoPE, attention over the whole image, a GeGLU MLP, sandwich norms),
//     the pooler (the mean of each k × k block of patches, times sqrt(hidden)), the optional
//     standardisation; then Gemma4MultimodalEmbedder (an RMS norm without weight, a projection to the
//     text model's width).
//   gemma4_unified (12B)  Gemma4UnifiedVisionEmbedder, no encoder: merged patches through LayerNorm,
//     a Dense layer with bias and LayerNorm, plus the factorised x and y position rows, LayerNorm,
//     then Gemma4UnifiedMultimodalEmbedder (RMS norm without weight, projection).
//
// Read against transformers 5.17's modeling_gemma4.py and modeling_gemma4_unified.py. Leaves out:
// video (frames through the same encoder), several images in one call, padding patches (an image
// comes with its real patches only, so the encoder's padding mask has nothing to hide).
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "io/config.h"
#include "layers/loader.h"
#include "models/model.h"

namespace kiln {

// vision_config of a gemma4 checkpoint; field names and defaults are Gemma4VisionConfig's.
struct Gemma4VisionConfig {
  int64_t hidden_size = 768;
  int64_t intermediate_size = 3072;
  int64_t num_hidden_layers = 16;
  int64_t num_attention_heads = 12;
  int64_t num_key_value_heads = 12;
  int64_t head_dim = 64;
  double rms_norm_eps = 1e-6;
  double rope_theta = 100.0;  // rope_parameters.rope_theta ("default" RoPE only)
  int64_t pooling_kernel_size = 3;
  int64_t patch_size = 16;
  int64_t position_embedding_size = 10 * 1024;
  bool use_clipped_linears = false;
  bool standardize = false;
};

// vision_config of a gemma4_unified checkpoint; Gemma4UnifiedVisionConfig's names and defaults.
struct Gemma4UnifiedVisionConfig {
  int64_t patch_size = 16;
  int64_t pooling_kernel_size = 3;  // a model patch is pooling_kernel_size² patches
  int64_t mm_embed_dim = 3840;
  int64_t mm_posemb_size = 1120;
  double rms_norm_eps = 1e-6;
  int64_t output_proj_dims = 3840;
};

Result<Gemma4VisionConfig> parse_gemma4_vision_config(const nlohmann::json& j, const std::string& where);
Result<Gemma4UnifiedVisionConfig> parse_gemma4_unified_vision_config(const nlohmann::json& j, const std::string& where);

// Receives the named intermediates of an encoding (Model::dump's names: "vision_tower.encoder.layers.3").
using VisionDump = std::function<void(const std::string& name, const Tensor& t)>;

class Gemma4ImageEncoder {
 public:
  virtual ~Gemma4ImageEncoder() = default;
  // The image's soft tokens: [image.soft_tokens, text hidden] on the backend, in its activation type.
  virtual Result<Tensor> encode(const ProcessedImage& image, const VisionDump& dump) = 0;
};

// The image front end a gemma4 or gemma4_unified config.json describes (its vision_config), with its
// weights from `w` under the checkpoint's names ("vision_tower.", "embed_vision."; transformers' and
// mlx-vlm's layouts name them alike). Null, with `missing` saying why, when the config describes none
// or the checkpoint lacks its weights (a text-only conversion): nothing is read from the store then.
// An error when the weights are there but disagree with the config.
Result<std::unique_ptr<Gemma4ImageEncoder>> load_gemma4_image_encoder(const ModelConfigFile& file, WeightLoader& w,
                                                                      int64_t text_hidden, std::string& missing);

}  // namespace kiln
