// The towers of Gemma 4's release-form checkpoints, listed tensor by tensor as transformers'
// save_pretrained writes them beside the language model: parameters and persistent buffers, with
// the shapes the sub-configs give and the fills the modules initialise them with.
//
// Follows transformers' classes (modeling_gemma4.py, modular_gemma4_unified.py):
//   gemma4 (Gemma4ForConditionalGeneration -> Gemma4Model)
//     vision_tower  Gemma4VisionModel: Gemma4VisionPatchEmbedder, Gemma4VisionEncoder of
//                   Gemma4VisionEncoderLayer (Gemma4VisionAttention, Gemma4VisionMLP, Gemma4RMSNorm),
//                   std_bias / std_scale buffers when `standardize`
//     audio_tower   Gemma4AudioModel: Gemma4AudioSubSampleConvProjection, Gemma4AudioLayer
//                   (Gemma4AudioFeedForward x2, Gemma4AudioAttention, Gemma4AudioLightConv1d),
//                   output_proj
//     embed_vision, embed_audio  Gemma4MultimodalEmbedder (its pre-projection norm has no weight)
//     every linear of both towers a Gemma4ClippableLinear: `.linear.weight`, plus the scalar
//     input_min / input_max / output_min / output_max buffers when `use_clipped_linears`
//   gemma4_unified (Gemma4UnifiedForConditionalGeneration -> Gemma4UnifiedModel), no towers
//     embed_vision  Gemma4UnifiedVisionEmbedder: patch_ln1, patch_dense, patch_ln2, pos_embedding,
//                   pos_norm, multimodal_embedder (Gemma4UnifiedMultimodalEmbedder)
//     embed_audio   Gemma4UnifiedMultimodalEmbedder
//     saved under the released checkpoint's names (transformers renames them back on save,
//     conversion_mapping.py "gemma4_unified"): "vision_embedder.{patch_ln1, patch_dense, patch_ln2,
//     pos_embedding, pos_norm}" and "embed_vision.embedding_projection"
// Keys a sub-config leaves out take the defaults of Gemma4VisionConfig, Gemma4AudioConfig,
// Gemma4UnifiedVisionConfig and Gemma4UnifiedAudioConfig. Not saved (non-persistent buffers): the
// rotary inv_freq tables, the audio encoder's inv_timescales and softcap.
#include "models/gemma4/towers.h"

#include <cmath>
#include <string>

#include "models/gemma4/gemma4.h"

namespace kiln {

namespace {

using Fill = CheckpointTensor::Fill;

class Listing {
 public:
  explicit Listing(std::vector<CheckpointTensor>& out) : out_(out) {}
  void matrix(const std::string& name, Shape shape, float std = 0.02f) {
    out_.push_back({name, shape, Fill::normal, std});
  }
  void constant(const std::string& name, Shape shape, float value) {
    out_.push_back({name, shape, Fill::constant, value});
  }
  void ones(const std::string& name, Shape shape) { constant(name, shape, 1.0f); }
  void zeros(const std::string& name, Shape shape) { constant(name, shape, 0.0f); }
  // nn.LayerNorm with its affine weight (ones) and bias (zeros)
  void layer_norm(const std::string& name, int64_t dim) {
    ones(name + ".weight", Shape{dim});
    zeros(name + ".bias", Shape{dim});
  }
  // Gemma4ClippableLinear (no bias): the weight under `.linear`, and the clip bounds as scalar
  // buffers, initialised to let everything through
  void clippable(const std::string& name, int64_t out, int64_t in, bool clipped) {
    matrix(name + ".linear.weight", Shape{out, in});
    if (!clipped) return;
    constant(name + ".input_min", Shape{}, -INFINITY);
    constant(name + ".input_max", Shape{}, INFINITY);
    constant(name + ".output_min", Shape{}, -INFINITY);
    constant(name + ".output_max", Shape{}, INFINITY);
  }

 private:
  std::vector<CheckpointTensor>& out_;
};

// A sub-config ("vision_config", "audio_config") when config.json holds it as an object.
const nlohmann::json* sub_config(const ModelConfigFile& file, const char* key) {
  if (!file.root.contains(key) || !file.root.at(key).is_object()) return nullptr;
  return &file.root.at(key);
}

// Reads a size; a value below 1 is an error naming the key.
int64_t size_of(ConfigReader& r, const std::string& key, int64_t fallback) {
  const int64_t v = r.get_int(key, fallback);
  if (v < 1) r.fail("'" + key + "' must be at least 1, got " + std::to_string(v));
  return v;
}

// Gemma4VisionModel under "model.vision_tower.", and the Gemma4MultimodalEmbedder that projects its
// output into the text model, "model.embed_vision." [text_hidden, vision width].
Status vision_tower(const nlohmann::json& j, const std::string& where, int64_t text_hidden, Listing& t) {
  ConfigReader c(j, where);
  const int64_t hidden = size_of(c, "hidden_size", 768);
  const int64_t intermediate = size_of(c, "intermediate_size", 3072);
  const int64_t layers = size_of(c, "num_hidden_layers", 16);
  const int64_t heads = size_of(c, "num_attention_heads", 12);
  const int64_t kv_heads = size_of(c, "num_key_value_heads", 12);
  const int64_t head_dim = size_of(c, "head_dim", 64);
  const int64_t patch = size_of(c, "patch_size", 16);
  const int64_t positions = size_of(c, "position_embedding_size", 10 * 1024);
  const bool clipped = c.get_bool("use_clipped_linears", false);
  const bool standardize = c.get_bool("standardize", false);
  // the embedder's input width: getattr(vision_config, "output_proj_dims", hidden_size)
  const int64_t embedded = size_of(c, "output_proj_dims", hidden);
  KILN_TRY(c.status());

  const std::string v = "model.vision_tower.";
  t.matrix(v + "patch_embedder.input_proj.weight", Shape{hidden, 3 * patch * patch});
  t.ones(v + "patch_embedder.position_embedding_table", Shape{2, positions, hidden});  // [x|y, position, hidden]
  for (int64_t i = 0; i < layers; ++i) {
    const std::string p = v + "encoder.layers." + std::to_string(i) + ".";
    t.clippable(p + "self_attn.q_proj", heads * head_dim, hidden, clipped);
    t.clippable(p + "self_attn.k_proj", kv_heads * head_dim, hidden, clipped);
    t.clippable(p + "self_attn.v_proj", kv_heads * head_dim, hidden, clipped);
    t.clippable(p + "self_attn.o_proj", hidden, heads * head_dim, clipped);
    t.ones(p + "self_attn.q_norm.weight", Shape{head_dim});
    t.ones(p + "self_attn.k_norm.weight", Shape{head_dim});  // v_norm has no weight
    t.clippable(p + "mlp.gate_proj", intermediate, hidden, clipped);
    t.clippable(p + "mlp.up_proj", intermediate, hidden, clipped);
    t.clippable(p + "mlp.down_proj", hidden, intermediate, clipped);
    for (const char* norm :
         {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"})
      t.ones(p + norm + ".weight", Shape{hidden});
  }
  if (standardize) {
    t.zeros(v + "std_bias", Shape{hidden});
    t.ones(v + "std_scale", Shape{hidden});
  }
  t.matrix("model.embed_vision.embedding_projection.weight", Shape{text_hidden, embedded});
  return ok_status();
}

// Gemma4AudioModel (a conformer) under "model.audio_tower.", and its embedder "model.embed_audio.".
Status audio_tower(const nlohmann::json& j, const std::string& where, int64_t text_hidden, Listing& t) {
  ConfigReader c(j, where);
  const int64_t hidden = size_of(c, "hidden_size", 1024);
  const int64_t layers = size_of(c, "num_hidden_layers", 12);
  const int64_t heads = size_of(c, "num_attention_heads", 8);
  const int64_t kernel = size_of(c, "conv_kernel_size", 5);
  const bool clipped = c.get_bool("use_clipped_linears", true);
  const int64_t out = size_of(c, "output_proj_dims", 1536);
  std::vector<int64_t> channels = {128, 32};
  if (c.has("subsampling_conv_channels")) channels = c.get_ints("subsampling_conv_channels");
  KILN_TRY(c.status());
  if (channels.size() < 2 || channels[0] < 1 || channels[1] < 1)
    return make_error("{}: 'subsampling_conv_channels' must hold two positive channel counts", where);
  const int64_t head_dim = hidden / heads;
  if (head_dim < 1)
    return make_error("{}: 'hidden_size' {} is smaller than 'num_attention_heads' {}", where, hidden, heads);
  const int64_t c0 = channels[0], c1 = channels[1];
  // the subsampler flattens [channels, frequency / 4] per frame; transformers sizes it from c0
  const int64_t flattened = (c0 / 4) * c1;
  if (flattened < 1) return make_error("{}: 'subsampling_conv_channels'[0] must be at least 4", where);

  const std::string a = "model.audio_tower.";
  const std::string s = a + "subsample_conv_projection.";
  t.matrix(s + "layer0.conv.weight", Shape{c0, 1, 3, 3});
  t.ones(s + "layer0.norm.weight", Shape{c0});  // LayerNorm without bias
  t.matrix(s + "layer1.conv.weight", Shape{c1, c0, 3, 3});
  t.ones(s + "layer1.norm.weight", Shape{c1});
  t.matrix(s + "input_proj_linear.weight", Shape{hidden, flattened});
  for (int64_t i = 0; i < layers; ++i) {
    const std::string p = a + "layers." + std::to_string(i) + ".";
    for (const char* ff : {"feed_forward1.", "feed_forward2."}) {
      t.clippable(p + ff + "ffw_layer_1", 4 * hidden, hidden, clipped);
      t.clippable(p + ff + "ffw_layer_2", hidden, 4 * hidden, clipped);
      t.ones(p + ff + "pre_layer_norm.weight", Shape{hidden});
      t.ones(p + ff + "post_layer_norm.weight", Shape{hidden});
    }
    t.clippable(p + "self_attn.q_proj", heads * head_dim, hidden, clipped);
    t.clippable(p + "self_attn.k_proj", heads * head_dim, hidden, clipped);
    t.clippable(p + "self_attn.v_proj", heads * head_dim, hidden, clipped);
    t.clippable(p + "self_attn.post", hidden, hidden, clipped);
    t.matrix(p + "self_attn.relative_k_proj.weight", Shape{heads * head_dim, hidden});
    t.zeros(p + "self_attn.per_dim_scale", Shape{head_dim});
    t.clippable(p + "lconv1d.linear_start", 2 * hidden, hidden, clipped);
    t.clippable(p + "lconv1d.linear_end", hidden, hidden, clipped);
    t.matrix(p + "lconv1d.depthwise_conv1d.weight", Shape{hidden, 1, kernel});
    t.ones(p + "lconv1d.pre_layer_norm.weight", Shape{hidden});
    t.ones(p + "lconv1d.conv_norm.weight", Shape{hidden});
    for (const char* norm : {"norm_pre_attn", "norm_post_attn", "norm_out"})
      t.ones(p + norm + ".weight", Shape{hidden});
  }
  t.matrix(a + "output_proj.weight", Shape{out, hidden});
  t.zeros(a + "output_proj.bias", Shape{out});
  t.matrix("model.embed_audio.embedding_projection.weight", Shape{text_hidden, out});
  return ok_status();
}

// Gemma4UnifiedVisionEmbedder, "model.vision_embedder." as saved: raw merged patches through
// LayerNorm -> Linear -> LayerNorm, factorised 2-D positions, LayerNorm, then the projection.
Status unified_vision(const nlohmann::json& j, const std::string& where, int64_t text_hidden, Listing& t) {
  ConfigReader c(j, where);
  const int64_t patch = size_of(c, "patch_size", 16);
  const int64_t pooling = size_of(c, "pooling_kernel_size", 3);
  const int64_t width = size_of(c, "mm_embed_dim", 3840);
  const int64_t positions = size_of(c, "mm_posemb_size", 1120);
  const int64_t out = size_of(c, "output_proj_dims", 3840);
  const double init_std = c.get_float("initializer_range", 0.02);
  // a property of the class: setting it to anything but patch_size * pooling_kernel_size fails
  if (c.has("model_patch_size") && c.get_int("model_patch_size") != patch * pooling)
    c.fail(fmt::format("'model_patch_size' must be patch_size * pooling_kernel_size = {}", patch * pooling));
  KILN_TRY(c.status());
  const int64_t patch_dim = (patch * pooling) * (patch * pooling) * 3;

  const std::string e = "model.vision_embedder.";
  t.layer_norm(e + "patch_ln1", patch_dim);
  t.matrix(e + "patch_dense.weight", Shape{width, patch_dim});
  t.zeros(e + "patch_dense.bias", Shape{width});
  t.layer_norm(e + "patch_ln2", width);
  t.matrix(e + "pos_embedding", Shape{positions, 2, width}, float(init_std));  // [position, x|y, width]
  t.layer_norm(e + "pos_norm", width);
  t.matrix("model.embed_vision.embedding_projection.weight", Shape{text_hidden, out});
  return ok_status();
}

// Gemma4UnifiedMultimodalEmbedder for raw waveform frames, "model.embed_audio.".
Status unified_audio(const nlohmann::json& j, const std::string& where, int64_t text_hidden, Listing& t) {
  ConfigReader c(j, where);
  // hidden_size, output_proj_dims and audio_samples_per_token are properties whose setters write
  // audio_embed_dim, applied after the dataclass fields
  int64_t frame = size_of(c, "audio_embed_dim", 640);
  std::string set_by;
  for (const char* alias : {"hidden_size", "output_proj_dims", "audio_samples_per_token"}) {
    if (!c.has(alias)) continue;
    const int64_t v = size_of(c, alias, frame);
    if (!set_by.empty() && v != frame)
      c.fail(fmt::format("'{}' and '{}' disagree (both set audio_embed_dim)", set_by, alias));
    frame = v;
    set_by = alias;
  }
  KILN_TRY(c.status());
  t.matrix("model.embed_audio.embedding_projection.weight", Shape{text_hidden, frame});
  return ok_status();
}

}  // namespace

Result<std::vector<CheckpointTensor>> gemma4_part_tensors(const ModelConfigFile& file) {
  KILN_ASSIGN(Gemma4Config text, parse_gemma4_config(file));
  std::vector<CheckpointTensor> out;
  Listing t(out);
  const bool unified = file.outer_model_type == "gemma4_unified";
  const nlohmann::json* vision = sub_config(file, "vision_config");
  const nlohmann::json* audio = sub_config(file, "audio_config");
  if (vision) {
    const std::string where = file.path + " vision_config";
    KILN_TRY(unified ? unified_vision(*vision, where, text.hidden_size, t)
                     : vision_tower(*vision, where, text.hidden_size, t));
  }
  if (audio) {
    const std::string where = file.path + " audio_config";
    KILN_TRY(unified ? unified_audio(*audio, where, text.hidden_size, t)
                     : audio_tower(*audio, where, text.hidden_size, t));
  }
  return out;
}

}  // namespace kiln
