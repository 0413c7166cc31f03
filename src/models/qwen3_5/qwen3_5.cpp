// Qwen 3.5 text decoder. Read against transformers' modeling_qwen3_5.py / modeling_qwen3_5_moe.py
// (Qwen3_5TextModel, Qwen3_5Model) and mlx-lm's qwen3_5.py.
#include "models/qwen3_5/qwen3_5.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <optional>

#include "layers/attention.h"
#include "layers/gated_delta_net.h"
#include "layers/loader.h"
#include "layers/mlp.h"
#include "models/batch_prep.h"
#include "models/qwen3_5/mrope.h"

namespace kiln {

Result<Qwen35Config> parse_qwen3_5_config(const ModelConfigFile& file) {
  ConfigReader r(file.text, file.path);
  Qwen35Config c;
  c.vocab_size = r.get_int("vocab_size");
  c.hidden_size = r.get_int("hidden_size");
  c.num_hidden_layers = r.get_int("num_hidden_layers");
  c.num_attention_heads = r.get_int("num_attention_heads");
  c.num_key_value_heads = r.get_int("num_key_value_heads");
  c.head_dim = r.get_int("head_dim", c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0);
  c.rms_norm_eps = r.get_float("rms_norm_eps", 1e-6);
  c.linear_conv_kernel_dim = r.get_int("linear_conv_kernel_dim", 4);
  c.linear_key_head_dim = r.get_int("linear_key_head_dim", 128);
  c.linear_value_head_dim = r.get_int("linear_value_head_dim", 128);
  c.linear_num_key_heads = r.get_int("linear_num_key_heads", 16);
  c.linear_num_value_heads = r.get_int("linear_num_value_heads", 32);
  // The wrapper classes tie the head by their own (top-level) setting, whatever text_config says:
  // transformers reads tie_word_embeddings from the config of the model it builds.
  if (file.wrapped) {
    ConfigReader top(file.root, file.path);
    c.tie_word_embeddings = top.get_bool("tie_word_embeddings", false);
    KILN_TRY(top.status());
  } else {
    c.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  }
  c.max_position_embeddings = r.get_int("max_position_embeddings", 32768);
  c.num_experts = r.get_int("num_experts", 0);
  if (c.num_experts > 0) {
    c.num_experts_per_tok = r.get_int("num_experts_per_tok");
    c.moe_intermediate_size = r.get_int("moe_intermediate_size");
    c.shared_expert_intermediate_size = r.get_int("shared_expert_intermediate_size", 0);
    c.norm_topk_prob = r.get_bool("norm_topk_prob", true);
  } else {
    c.intermediate_size = r.get_int("intermediate_size");
  }
  if (r.get_bool("attention_bias", false)) r.fail("attention_bias = true is not supported");
  if (!r.get_bool("attn_output_gate", true)) r.fail("attn_output_gate = false is not supported");
  const std::string act = r.get_string("hidden_act", "silu");
  if (act != "silu") r.fail("hidden_act '" + act + "' is not supported (silu)");

  // RoPE: rope_parameters (transformers 5), or the older top-level keys
  c.rope_theta = r.get_float("rope_theta", 1e7);
  c.partial_rotary_factor = r.get_float("partial_rotary_factor", 0.25);
  if (r.has("rope_parameters") && !file.text["rope_parameters"].is_object())
    return make_error("{}: 'rope_parameters' must be an object, got {}", file.path,
                      file.text["rope_parameters"].dump());
  if (r.has("rope_parameters")) {
    ConfigReader rp(file.text["rope_parameters"], file.path + " rope_parameters");
    c.rope_theta = rp.get_float("rope_theta", c.rope_theta);
    c.partial_rotary_factor = rp.get_float("partial_rotary_factor", c.partial_rotary_factor);
    if (rp.has("mrope_section")) c.mrope_section = rp.get_ints("mrope_section");
    std::string type = rp.get_string("rope_type", rp.get_string("type", "default"));
    if (type != "default" && type != "mrope") rp.fail("rope_type '" + type + "' is not supported (default)");
    KILN_TRY(rp.status());
  }
  KILN_TRY(r.status());

  const int64_t L = c.num_hidden_layers;
  if (L <= 0 || c.hidden_size <= 0 || c.vocab_size <= 0 || c.num_attention_heads <= 0 || c.num_key_value_heads <= 0 ||
      c.head_dim <= 0)
    return make_error("{}: sizes must be positive", file.path);
  c.layer_types = r.get_strings("layer_types");
  if (c.layer_types.empty()) {
    const int64_t interval = r.get_int("full_attention_interval", 4);
    if (interval <= 0) return make_error("{}: full_attention_interval must be positive", file.path);
    for (int64_t i = 0; i < L; ++i) c.layer_types.push_back((i + 1) % interval ? "linear_attention" : "full_attention");
  }
  KILN_TRY(r.status());
  if (int64_t(c.layer_types.size()) != L)
    return make_error("{}: layer_types has {} entries for {} layers", file.path, c.layer_types.size(), L);
  for (const auto& t : c.layer_types)
    if (t != "linear_attention" && t != "full_attention")
      return make_error("{}: unknown layer type '{}'", file.path, t);
  if (c.num_attention_heads % c.num_key_value_heads)
    return make_error("{}: {} query heads do not group over {} KV heads", file.path, c.num_attention_heads,
                      c.num_key_value_heads);
  if (c.linear_num_key_heads <= 0 || c.linear_num_value_heads % c.linear_num_key_heads)
    return make_error("{}: linear_num_value_heads {} must be a multiple of linear_num_key_heads {}", file.path,
                      c.linear_num_value_heads, c.linear_num_key_heads);
  if (c.num_experts > 0 && (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.num_experts))
    return make_error("{}: num_experts_per_tok {} of {} experts", file.path, c.num_experts_per_tok, c.num_experts);
  if (c.num_experts < 0) return make_error("{}: num_experts {} must not be negative", file.path, c.num_experts);
  if (c.num_experts > 0 ? c.moe_intermediate_size <= 0 || c.shared_expert_intermediate_size < 0
                        : c.intermediate_size <= 0)
    return make_error("{}: the MLP's intermediate size must be positive", file.path);
  if (c.linear_key_head_dim <= 0 || c.linear_value_head_dim <= 0 || c.linear_num_value_heads <= 0)
    return make_error("{}: linear attention head sizes must be positive", file.path);
  if (c.linear_conv_kernel_dim < 1)
    return make_error("{}: linear_conv_kernel_dim {} must be positive", file.path, c.linear_conv_kernel_dim);
  if (!(c.partial_rotary_factor >= 0.0 && c.partial_rotary_factor <= 1.0))
    return make_error("{}: partial_rotary_factor {} must be within [0, 1]", file.path, c.partial_rotary_factor);
  if (!(c.rope_theta > 0.0) || !std::isfinite(c.rope_theta))
    return make_error("{}: rope_theta {} must be positive", file.path, c.rope_theta);
  if (!(c.rms_norm_eps > 0.0) || !std::isfinite(c.rms_norm_eps))
    return make_error("{}: rms_norm_eps {} must be positive", file.path, c.rms_norm_eps);
  if (c.mrope_section.size() != 3 ||
      std::any_of(c.mrope_section.begin(), c.mrope_section.end(), [](int64_t v) { return v < 0; }))
    return make_error("{}: rope_parameters.mrope_section must be three pair counts (time, row, column)", file.path);
  return c;
}

Result<Qwen35ImageConfig> parse_qwen3_5_image_config(const ModelConfigFile& file) {
  Qwen35ImageConfig c;
  const bool has_vision = file.root.contains("vision_config") && !file.root["vision_config"].is_null();
  c.described = file.wrapped || has_vision;
  if (!c.described) return c;
  KILN_ASSIGN(c.vision, parse_qwen3_5_vision_config(has_vision ? file.root["vision_config"] : nlohmann::json(),
                                                    file.path + " vision_config"));
  ConfigReader top(file.root, file.path);
  c.image_token_id = int32_t(top.get_int("image_token_id", c.image_token_id));
  KILN_TRY(top.status());
  return c;
}

std::vector<CheckpointTensor> qwen3_5_checkpoint_tensors(const Qwen35Config& c) {
  using Fill = CheckpointTensor::Fill;
  std::vector<CheckpointTensor> t;
  auto matrix = [&](const std::string& name, Shape shape) { t.push_back({name, shape, Fill::normal, 0.02f}); };
  auto constant = [&](const std::string& name, Shape shape, float v) { t.push_back({name, shape, Fill::constant, v}); };
  const int64_t H = c.hidden_size, Hq = c.num_attention_heads, kv = c.num_key_value_heads, hd = c.head_dim;
  const int64_t hk = c.linear_num_key_heads, hv = c.linear_num_value_heads;
  const int64_t key_dim = hk * c.linear_key_head_dim, value_dim = hv * c.linear_value_head_dim;
  const int64_t conv_dim = 2 * key_dim + value_dim;
  matrix("model.embed_tokens.weight", Shape{c.vocab_size, H});
  constant("model.norm.weight", Shape{H}, 0.0f);  // transformers' (1 + w) form
  if (!c.tie_word_embeddings) matrix("lm_head.weight", Shape{c.vocab_size, H});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    constant(p + ".input_layernorm.weight", Shape{H}, 0.0f);
    constant(p + ".post_attention_layernorm.weight", Shape{H}, 0.0f);
    if (c.layer_types[size_t(i)] == "linear_attention") {
      const std::string a = p + ".linear_attn";
      matrix(a + ".in_proj_qkv.weight", Shape{conv_dim, H});
      matrix(a + ".in_proj_z.weight", Shape{value_dim, H});
      matrix(a + ".in_proj_b.weight", Shape{hv, H});
      matrix(a + ".in_proj_a.weight", Shape{hv, H});
      t.push_back({a + ".conv1d.weight", Shape{conv_dim, 1, c.linear_conv_kernel_dim}, Fill::normal, 0.3f});
      t.push_back({a + ".A_log", Shape{hv}, Fill::uniform, 0.0f, 2.7f});  // A in [1, 15]
      constant(a + ".dt_bias", Shape{hv}, 1.0f);
      constant(a + ".norm.weight", Shape{c.linear_value_head_dim}, 1.0f);
      matrix(a + ".out_proj.weight", Shape{H, value_dim});
    } else {
      const std::string a = p + ".self_attn";
      matrix(a + ".q_proj.weight", Shape{Hq * hd * 2, H});
      matrix(a + ".k_proj.weight", Shape{kv * hd, H});
      matrix(a + ".v_proj.weight", Shape{kv * hd, H});
      matrix(a + ".o_proj.weight", Shape{H, Hq * hd});
      constant(a + ".q_norm.weight", Shape{hd}, 0.0f);
      constant(a + ".k_norm.weight", Shape{hd}, 0.0f);
    }
    if (c.num_experts > 0) {
      const std::string m = p + ".mlp";
      const int64_t I = c.moe_intermediate_size;
      matrix(m + ".gate.weight", Shape{c.num_experts, H});
      for (int64_t e = 0; e < c.num_experts; ++e) {  // one tensor per expert, as the released checkpoints
        const std::string x = m + ".experts." + std::to_string(e);
        matrix(x + ".gate_proj.weight", Shape{I, H});
        matrix(x + ".up_proj.weight", Shape{I, H});
        matrix(x + ".down_proj.weight", Shape{H, I});
      }
      if (c.shared_expert_intermediate_size > 0) {
        const int64_t S = c.shared_expert_intermediate_size;
        matrix(m + ".shared_expert.gate_proj.weight", Shape{S, H});
        matrix(m + ".shared_expert.up_proj.weight", Shape{S, H});
        matrix(m + ".shared_expert.down_proj.weight", Shape{H, S});
        matrix(m + ".shared_expert_gate.weight", Shape{1, H});
      }
    } else {
      matrix(p + ".mlp.gate_proj.weight", Shape{c.intermediate_size, H});
      matrix(p + ".mlp.up_proj.weight", Shape{c.intermediate_size, H});
      matrix(p + ".mlp.down_proj.weight", Shape{H, c.intermediate_size});
    }
  }
  return t;
}

namespace {

struct Qwen35Layer {
  bool linear = true;
  Tensor input_layernorm, post_attention_layernorm;
  // Gated DeltaNet
  GatedDeltaNet delta;
  // gated attention
  Tensor q_proj, k_proj, v_proj, o_proj, q_norm, k_norm;
  // feed-forward: dense, or routed experts plus a gated shared expert
  GluMlp mlp;
  Tensor router;  // [E, H]
  ExpertStack experts;
  GluMlp shared_expert;
  Tensor shared_expert_gate;  // [1, H]
};

class Qwen35Model final : public Model {
 public:
  Qwen35Model(Qwen35Config config, Qwen35ImageConfig images, Backend& backend, const ModelOptions& options)
      : config_(std::move(config)), images_(std::move(images)), backend_(backend), options_(options) {}

  Status load(const WeightStore& store, const std::string& model_type);

  const ModelInfo& info() const override { return info_; }
  Backend& backend() const override { return backend_; }
  int64_t max_chunk_tokens() const override { return options_.max_chunk_tokens; }
  Result<std::unique_ptr<SequenceState>> new_sequence(int64_t max_context) override;
  size_t decode_bytes(int64_t context, int64_t batch) const override;
  double prefill_flops(int64_t tokens) const override;
  Result<Tensor> encode_image(const ProcessedImage& image) override;

 protected:
  Result<Tensor> run_impl(const PreparedBatch& batch, LogitRows rows) override;
  // Every layer rotates by three position axes (MRoPE), and image rows come in the text's width.
  BatchNeeds batch_needs() const override { return {.rope_axes = 3, .hidden = config_.hidden_size}; }

 private:
  // Each block ends with the residual update `then` that reads its output.
  void attention_block(const BatchLayout& batch, int64_t l, const Tensor& x, const ResidualNormArgs& then);
  void feed_forward_block(int64_t l, const Tensor& x, const ResidualNormArgs& then);
  Tensor norm(const Tensor& x, const Tensor& weight);
  // The vision encoder, when the checkpoint holds its tensors (under transformers' "visual." or
  // mlx-vlm's "vision_tower."); otherwise why images cannot be encoded.
  Status load_vision(WeightLoader& w);

  Qwen35Config config_;
  Qwen35ImageConfig images_;
  std::optional<Qwen35VisionEncoder> vision_;
  std::string no_vision_;
  Backend& backend_;
  ModelOptions options_;
  ModelInfo info_;
  GatedDeltaNetShape delta_shape_;
  // transformers stores the main norms as w with a (1 + w) multiplier; mlx-lm stores 1 + w
  float norm_offset_ = 1.0f;
  Tensor embed_tokens, norm_weight, lm_head;
  std::vector<Qwen35Layer> layers_;
  RopeTable rope_;
};

Status Qwen35Model::load(const WeightStore& store, const std::string& model_type) {
  const Qwen35Config& c = config_;
  WeightLoader w(store, backend_);
  const int64_t H = c.hidden_size, Hq = c.num_attention_heads, kv = c.num_key_value_heads, hd = c.head_dim;
  delta_shape_ = GatedDeltaNetShape{.n_k_heads = int(c.linear_num_key_heads),
                                    .n_v_heads = int(c.linear_num_value_heads),
                                    .k_dim = int(c.linear_key_head_dim),
                                    .v_dim = int(c.linear_value_head_dim),
                                    .conv_kernel = int(c.linear_conv_kernel_dim),
                                    .eps = float(c.rms_norm_eps)};

  // Which norm convention the checkpoint uses: mlx-lm's conversion moves the conv weight from
  // [C, 1, K] to [C, K, 1] and adds 1 to the norms in the same step, so the conv shape tells.
  bool saw_conv = false, hf_conv = false;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string name = "layers." + std::to_string(i) + ".linear_attn.conv1d.weight";
    if (!store.has(name)) continue;
    KILN_ASSIGN(Tensor conv, store.get(name));
    saw_conv = true;
    hf_conv = hf_conv || conv.dim(-1) != 1;
  }
  norm_offset_ = (saw_conv ? hf_conv : !store.mlx_prefixed()) ? 1.0f : 0.0f;

  KILN_ASSIGN(embed_tokens, w.matrix("embed_tokens.weight", Shape{c.vocab_size, H}));
  KILN_ASSIGN(norm_weight, w.vector("norm.weight", Shape{H}));
  if (c.tie_word_embeddings) {
    lm_head = embed_tokens;
  } else {
    KILN_ASSIGN(lm_head, w.matrix("lm_head.weight", Shape{c.vocab_size, H}));
  }

  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "layers." + std::to_string(i);
    Qwen35Layer layer;
    layer.linear = c.layer_types[size_t(i)] == "linear_attention";
    KILN_ASSIGN(layer.input_layernorm, w.vector(p + ".input_layernorm.weight", Shape{H}));
    KILN_ASSIGN(layer.post_attention_layernorm, w.vector(p + ".post_attention_layernorm.weight", Shape{H}));
    if (layer.linear) {
      KILN_ASSIGN(layer.delta, load_gated_delta_net(w, p + ".linear_attn", H, delta_shape_));
    } else {
      const std::string a = p + ".self_attn";
      KILN_ASSIGN(layer.q_proj, w.matrix(a + ".q_proj.weight", Shape{Hq * hd * 2, H}));
      KILN_ASSIGN(layer.k_proj, w.matrix(a + ".k_proj.weight", Shape{kv * hd, H}));
      KILN_ASSIGN(layer.v_proj, w.matrix(a + ".v_proj.weight", Shape{kv * hd, H}));
      KILN_ASSIGN(layer.o_proj, w.matrix(a + ".o_proj.weight", Shape{H, Hq * hd}));
      KILN_ASSIGN(layer.q_norm, w.vector(a + ".q_norm.weight", Shape{hd}));
      KILN_ASSIGN(layer.k_norm, w.vector(a + ".k_norm.weight", Shape{hd}));
    }
    if (c.num_experts > 0) {
      const std::string m = p + ".mlp";
      KILN_ASSIGN(layer.router, w.matrix(m + ".gate.weight", Shape{c.num_experts, H}));
      KILN_ASSIGN(layer.experts,
                  load_experts(w, m + ".experts", m + ".switch_mlp", c.num_experts, H, c.moe_intermediate_size));
      if (c.shared_expert_intermediate_size > 0) {
        KILN_ASSIGN(layer.shared_expert, load_glu_mlp(w, m + ".shared_expert", H, c.shared_expert_intermediate_size));
        KILN_ASSIGN(layer.shared_expert_gate, w.matrix(m + ".shared_expert_gate.weight", Shape{1, H}));
      }
    } else {
      KILN_ASSIGN(layer.mlp, load_glu_mlp(w, p + ".mlp", H, c.intermediate_size));
    }
    layers_.push_back(std::move(layer));
  }
  // partial RoPE: rotate-half within the first partial_rotary_factor share of each head; each pair
  // follows the time, row or column position of the interleaved MRoPE layout
  rope_ = make_rope(backend_, int(double(hd) * c.partial_rotary_factor), c.rope_theta);
  const std::vector<int32_t> axes = qwen3_5_mrope_pair_axes(rope_.inv_freq.numel(), c.mrope_section);
  Tensor axes_host = host_tensor(DType::i32, Shape{int64_t(axes.size())});
  std::copy(axes.begin(), axes.end(), axes_host.data_as<int32_t>());
  rope_.pair_axis = backend_.upload(axes_host, DType::i32);
  KILN_TRY(load_vision(w));

  info_ = ModelInfo{.family = "qwen3_5",
                    .model_type = model_type,
                    .vocab_size = c.vocab_size,
                    .hidden_size = H,
                    .n_layers = c.num_hidden_layers,
                    .max_position_embeddings = c.max_position_embeddings,
                    .weight_bytes = store.used_bytes()};
  return ok_status();
}

Status Qwen35Model::load_vision(WeightLoader& w) {
  const WeightStore& store = w.store();
  std::string prefix;
  for (const char* p : {"visual.", "vision_tower."})
    for (const auto& name : store.names())
      if (name.rfind(p, 0) == 0) {
        if (!prefix.empty() && prefix != p)
          return make_error("the checkpoint holds vision tensors under both 'visual.' and 'vision_tower.' ({})",
                            store.describe(name));
        prefix = p;
        break;
      }
  if (prefix.empty()) {
    no_vision_ = images_.described ? "the checkpoint holds no vision encoder weights (model.visual.*, or mlx-vlm's "
                                     "vision_tower.* in the model files or optiq_vision.safetensors)"
                                   : "a text-only Qwen 3.5 checkpoint (no vision_config, no vision encoder weights)";
    if (images_.described) spdlog::info("qwen3_5: {}; images cannot be encoded", no_vision_);
    return ok_status();
  }
  KILN_ASSIGN(Qwen35VisionEncoder encoder, Qwen35VisionEncoder::load(images_.vision, w, prefix, config_.hidden_size));
  vision_ = std::move(encoder);
  spdlog::info("qwen3_5: vision encoder under '{}': {} blocks of width {}, {}x{} patches merged {}x{}", prefix,
               images_.vision.depth, images_.vision.hidden_size, images_.vision.patch_size, images_.vision.patch_size,
               images_.vision.spatial_merge_size, images_.vision.spatial_merge_size);
  return ok_status();
}

Result<Tensor> Qwen35Model::encode_image(const ProcessedImage& image) {
  if (!vision_) return make_error("{}: cannot encode images: {}", info_.model_type, no_vision_);
  try {
    KILN_ASSIGN(Tensor rows,
                vision_->encode(backend_, image, [this](const std::string& name, const Tensor& t) { dump(name, t); }));
    KILN_TRY(backend_.status());
    return rows;
  } catch (const std::exception& e) {  // allocation failures surface here as exceptions
    return make_error("encoding an image failed: {}", e.what());
  }
}

Result<std::unique_ptr<SequenceState>> Qwen35Model::new_sequence(int64_t max_context) {
  if (max_context <= 0) return make_error("context size must be positive, got {}", max_context);
  std::vector<LayerState> layers(layers_.size());
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i].linear)
      init_gated_delta_state(backend_, layers[i], delta_shape_);
    else
      layers[i].kv = new_kv_cache(backend_, max_context, int(config_.num_key_value_heads), int(config_.head_dim),
                                  options_.kv_for(int64_t(i)));
  }
  return std::make_unique<SequenceState>(std::move(layers), max_context);
}

size_t Qwen35Model::decode_bytes(int64_t context, int64_t batch) const {
  const Qwen35Config& c = config_;
  size_t bytes = 0;
  auto add = [&](const Tensor& t) { bytes += t.defined() ? t.stored_bytes() : 0; };
  const size_t act = dtype_size(backend_.activation_dtype());
  bytes += size_t(batch) * embed_tokens.stored_bytes() / size_t(embed_tokens.dim(0));  // one row per token
  add(norm_weight);
  add(lm_head);
  for (const Qwen35Layer& w : layers_) {
    for (const Tensor* t : {&w.input_layernorm,
                            &w.post_attention_layernorm,
                            &w.q_proj,
                            &w.k_proj,
                            &w.v_proj,
                            &w.o_proj,
                            &w.q_norm,
                            &w.k_norm,
                            &w.mlp.gate,
                            &w.mlp.up,
                            &w.mlp.down,
                            &w.router,
                            &w.shared_expert.gate,
                            &w.shared_expert.up,
                            &w.shared_expert.down,
                            &w.shared_expert_gate,
                            &w.delta.in_proj_qkv,
                            &w.delta.in_proj_z,
                            &w.delta.in_proj_b,
                            &w.delta.in_proj_a,
                            &w.delta.conv1d,
                            &w.delta.a_log,
                            &w.delta.dt_bias,
                            &w.delta.norm,
                            &w.delta.out_proj})
      add(*t);
    if (c.num_experts > 0) {
      const int64_t routed = std::min(c.num_experts, batch * c.num_experts_per_tok);
      const size_t per_expert =
          (w.experts.gate.stored_bytes() + w.experts.up.stored_bytes() + w.experts.down.stored_bytes()) /
          size_t(c.num_experts);
      bytes += size_t(routed) * per_expert;
    }
    if (w.linear) {  // the f32 state is read and written, the conv state too
      bytes += size_t(batch) * 2 * size_t(delta_shape_.n_v_heads) * delta_shape_.k_dim * delta_shape_.v_dim * 4;
      bytes += size_t(batch) * 2 * size_t(delta_shape_.conv_kernel - 1) * size_t(delta_shape_.conv_dim()) * act;
    } else {
      bytes += size_t(batch) * size_t(context) * size_t(c.num_key_value_heads * c.head_dim) * 2 * act;
    }
  }
  return bytes;
}

double Qwen35Model::prefill_flops(int64_t tokens) const {
  const Qwen35Config& c = config_;
  const double t = double(tokens);
  double params = double(lm_head.numel()), other = 0;
  for (const Qwen35Layer& w : layers_) {
    for (const Tensor* m : {&w.q_proj, &w.k_proj, &w.v_proj, &w.o_proj, &w.mlp.gate, &w.mlp.up, &w.mlp.down, &w.router,
                            &w.shared_expert.gate, &w.shared_expert.up, &w.shared_expert.down, &w.delta.in_proj_qkv,
                            &w.delta.in_proj_z, &w.delta.in_proj_b, &w.delta.in_proj_a, &w.delta.out_proj})
      params += m->defined() ? double(m->numel()) : 0.0;
    if (c.num_experts > 0)
      params += double(c.num_experts_per_tok) *
                double(w.experts.gate.numel() + w.experts.up.numel() + w.experts.down.numel()) / double(c.num_experts);
    if (w.linear) {
      // the chunked delta rule: per chunk of 64, the key/query products, the state read, the update
      const double dk = delta_shape_.k_dim, dv = delta_shape_.v_dim;
      other += double(delta_shape_.n_v_heads) * t * 2.0 * (64.0 * dk * 2 + 64.0 * dv + 3.0 * dk * dv);
    } else {
      other += 4.0 * t * (t + 1) / 2 * double(c.num_attention_heads * c.head_dim);
    }
  }
  return 2.0 * t * params + other;
}

Tensor Qwen35Model::norm(const Tensor& x, const Tensor& weight) {
  Tensor out = backend_.alloc(backend_.activation_dtype(), Shape{x.rows(), x.cols()});
  backend_.rms_norm(x, weight, float(config_.rms_norm_eps), norm_offset_, out);
  return out;
}

void Qwen35Model::attention_block(const BatchLayout& batch, int64_t l, const Tensor& x, const ResidualNormArgs& then) {
  const Qwen35Layer& w = layers_[size_t(l)];
  const int64_t T = batch.n_tokens, Hq = config_.num_attention_heads, kv = config_.num_key_value_heads;
  const int64_t hd = config_.head_dim;
  const float eps = float(config_.rms_norm_eps);
  const DType dt = backend_.activation_dtype();

  // q_proj gives, per head, the query followed by an output gate of the same width
  Tensor q_and_gate = backend_.alloc(dt, Shape{T * Hq, 2 * hd});
  Tensor q_and_gate_rows = q_and_gate.reshape(Shape{T, Hq * 2 * hd});
  Tensor k = backend_.alloc(dt, Shape{T, kv, hd});
  Tensor v = backend_.alloc(dt, Shape{T, kv, hd});
  backend_.matmul_many(x, std::vector<MatmulProduct>{{w.q_proj, q_and_gate_rows}, {w.k_proj, k}, {w.v_proj, v}});
  Tensor gate = q_and_gate.cols_view(hd, hd);  // [T·Hq, hd], row-strided
  Tensor q = backend_.alloc(dt, Shape{T, Hq, hd});
  write_attention_inputs(backend_, batch, int(l), rope_,
                         AttentionInputs{.q_norm = HeadNorm{.weight = w.q_norm, .eps = eps, .offset = norm_offset_},
                                         .k_norm = HeadNorm{.weight = w.k_norm, .eps = eps, .offset = norm_offset_},
                                         .q_input = q_and_gate.cols_view(0, hd)},
                         q, k, v);

  // the output gate: attention ⊙ sigmoid(gate)
  Tensor attn = cached_attention(
      backend_, batch, int(l), q, nullptr, nullptr,
      AttentionShape{
          .n_heads = int(Hq), .n_kv_heads = int(kv), .head_dim = int(hd), .scale = float(1.0 / std::sqrt(double(hd)))},
      gate);
  Tensor out = backend_.alloc(dt, Shape{T, config_.hidden_size});
  project_to_residual(l, "self_attn", attn, w.o_proj, out, then);
}

void Qwen35Model::feed_forward_block(int64_t l, const Tensor& x, const ResidualNormArgs& then) {
  const Qwen35Layer& w = layers_[size_t(l)];
  if (config_.num_experts == 0) {
    mlp_to_residual(l, x, w.mlp, Activation::silu, then);
    return;
  }
  const bool shared = config_.shared_expert_intermediate_size > 0;
  Tensor logits = backend_.alloc(DType::f32, Shape{x.rows(), config_.num_experts});
  Tensor shared_gate = shared ? backend_.alloc(DType::f32, Shape{x.rows(), 1}) : Tensor();
  std::vector<MatmulProduct> products;
  products.reserve(2);
  products.push_back({w.router, logits});
  if (shared) products.push_back({w.shared_expert_gate, shared_gate});
  backend_.matmul_many(x, products);
  dump(fmt::format("layers.{}.router_logits", l), logits);
  Tensor out = routed_experts(
      backend_, logits, x, w.experts,
      MoeRouting{
          .top_k = int(config_.num_experts_per_tok), .renormalize = config_.norm_topk_prob, .expert_scale = Tensor()},
      Activation::silu);
  if (shared) backend_.add_sigmoid_gated(out, glu_mlp(backend_, x, w.shared_expert, Activation::silu), shared_gate);
  dump(fmt::format("layers.{}.mlp", l), out);
  backend_.residual_norm(reading(then, out));
}

Result<Tensor> Qwen35Model::run_impl(const PreparedBatch& prepared, LogitRows rows) {
  const BatchLayout& batch = prepared.layout;
  const int64_t T = batch.n_tokens, H = config_.hidden_size;

  Tensor h = backend_.alloc(backend_.activation_dtype(), Shape{T, H});
  backend_.embed(prepared.ids, embed_tokens, 1.0f, h);
  place_soft_tokens(backend_, batch, h);  // image placeholders embed as the image's soft tokens
  dump("embed_tokens", h);
  const int64_t L = config_.num_hidden_layers;
  const float eps = float(config_.rms_norm_eps);
  const DType dt = backend_.activation_dtype();
  Tensor x = norm(h, layers_[0].input_layernorm);  // each block's input norm comes with the residual update before it
  // the final norm too, when the logits are wanted for every row
  const bool every_row = selects_every_row(batch, rows);
  Tensor last;
  for (int64_t l = 0; l < L; ++l) {
    const Qwen35Layer& w = layers_[size_t(l)];
    Tensor ff_in = backend_.alloc(dt, Shape{T, H});
    const ResidualNormArgs mixer_residual{
        .residual = h, .next = ff_in, .next_norm = w.post_attention_layernorm, .eps = eps, .norm_offset = norm_offset_};
    if (w.linear && !dumping()) {
      gated_delta_net(backend_, batch, int(l), x, w.delta, delta_shape_, &mixer_residual);
    } else if (w.linear) {  // unfused: the fused op may not store the block's output
      Tensor out = gated_delta_net(backend_, batch, int(l), x, w.delta, delta_shape_, nullptr);
      dump(fmt::format("layers.{}.linear_attn", l), out);
      backend_.residual_norm(reading(mixer_residual, out));
    } else {
      attention_block(batch, l, x, mixer_residual);
    }
    ResidualNormArgs ff_residual{.residual = h, .eps = eps, .norm_offset = norm_offset_};
    if (l + 1 < L) {
      x = backend_.alloc(dt, Shape{T, H});
      ff_residual.next = x;
      ff_residual.next_norm = layers_[size_t(l + 1)].input_layernorm;
    } else if (every_row) {
      last = backend_.alloc(dt, Shape{T, H});
      ff_residual.next = last;
      ff_residual.next_norm = norm_weight;
    }
    feed_forward_block(l, ff_in, ff_residual);
    dump(fmt::format("layers.{}", l), h);
  }
  if (!last.defined()) last = norm(select_rows(backend_, h, batch, rows), norm_weight);
  dump("norm", last);
  Tensor logits = backend_.alloc(DType::f32, Shape{last.rows(), config_.vocab_size});
  backend_.matmul(last, lm_head, logits);
  dump("logits", logits);
  return logits;
}

}  // namespace

Result<std::unique_ptr<Model>> load_qwen3_5(const ModelConfigFile& file, const WeightStore& weights, Backend& backend,
                                            const ModelOptions& options) {
  KILN_ASSIGN(Qwen35Config config, parse_qwen3_5_config(file));
  KILN_ASSIGN(Qwen35ImageConfig images, parse_qwen3_5_image_config(file));
  ModelOptions settled = options;
  for (size_t i = 0; i < config.layer_types.size(); ++i)
    if (config.layer_types[i] != "linear_attention")
      KILN_TRY(settle_kv_format(settled, int64_t(i), int(config.head_dim)));
  auto model = std::make_unique<Qwen35Model>(std::move(config), std::move(images), backend, settled);
  KILN_TRY(model->load(weights, file.model_type));
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace kiln
