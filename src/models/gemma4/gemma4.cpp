// Gemma 4 text decoder. Read against transformers' modeling_gemma4.py (Gemma4TextModel) and
// mlx-lm's gemma4_text.py.
#include "models/gemma4/gemma4.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <map>

#include "layers/attention.h"
#include "layers/loader.h"
#include "layers/mlp.h"
#include "models/batch_prep.h"
#include "models/gemma4/vision.h"

namespace kiln {

namespace {

Gemma4RopeConfig parse_rope(ConfigReader& parent, const nlohmann::json& j, const Gemma4RopeConfig& fallback,
                            const std::string& where) {
  if (!j.is_object()) {
    parent.fail("rope_parameters entries must be objects");
    return fallback;
  }
  ConfigReader r(j, where);
  Gemma4RopeConfig c;
  c.rope_type = r.get_string("rope_type", fallback.rope_type);
  c.rope_theta = r.get_float("rope_theta", fallback.rope_theta);
  c.partial_rotary_factor = r.get_float("partial_rotary_factor", fallback.partial_rotary_factor);
  c.factor = r.get_float("factor", 1.0);
  if (!r.status()) parent.fail(r.status().error().message);
  if (c.rope_type != "default" && c.rope_type != "proportional")
    parent.fail("rope_type '" + c.rope_type + "' is not supported (default, proportional)");
  if (!(c.partial_rotary_factor >= 0.0 && c.partial_rotary_factor <= 1.0))
    parent.fail(fmt::format("partial_rotary_factor {} must be within [0, 1]", c.partial_rotary_factor));
  if (!(c.rope_theta > 0.0) || !std::isfinite(c.rope_theta) || !(c.factor > 0.0) || !std::isfinite(c.factor))
    parent.fail(fmt::format("rope_theta {} and factor {} must be positive", c.rope_theta, c.factor));
  return c;
}

}  // namespace

Result<Gemma4Config> parse_gemma4_config(const ModelConfigFile& file) {
  ConfigReader r(file.text, file.path);
  Gemma4Config c;
  c.vocab_size = r.get_int("vocab_size");
  c.hidden_size = r.get_int("hidden_size");
  c.intermediate_size = r.get_int("intermediate_size");
  c.num_hidden_layers = r.get_int("num_hidden_layers");
  c.num_attention_heads = r.get_int("num_attention_heads");
  c.num_key_value_heads = r.get_int("num_key_value_heads");
  // defaults are those of transformers' config class for the model_type (save_pretrained leaves out
  // what equals them): Gemma4TextConfig, or Gemma4UnifiedTextConfig for the 12B's form
  const bool unified = file.model_type.rfind("gemma4_unified", 0) == 0;
  c.head_dim = r.get_int("head_dim", 256);
  c.sliding_window = r.get_int("sliding_window", unified ? 1024 : 512);
  c.rms_norm_eps = r.get_float("rms_norm_eps", 1e-6);
  c.max_position_embeddings = r.get_int("max_position_embeddings", unified ? 262144 : 131072);
  if (r.has("final_logit_softcapping")) c.final_logit_softcapping = r.get_float("final_logit_softcapping");
  c.hidden_size_per_layer_input = r.get_int("hidden_size_per_layer_input", 0);
  c.vocab_size_per_layer_input = r.get_int("vocab_size_per_layer_input", c.vocab_size);
  c.attention_k_eq_v = r.get_bool("attention_k_eq_v", false);
  c.num_kv_shared_layers = r.get_int("num_kv_shared_layers", 0);
  c.use_double_wide_mlp = r.get_bool("use_double_wide_mlp", false);
  c.enable_moe_block = r.get_bool("enable_moe_block", false);
  // The wrapper classes tie the head by their own (top-level) setting, whatever text_config says:
  // transformers reads tie_word_embeddings from the config of the model it builds.
  if (file.wrapped) {
    ConfigReader top(file.root, file.path);
    c.tie_word_embeddings = top.get_bool("tie_word_embeddings", true);
    KILN_TRY(top.status());
  } else {
    c.tie_word_embeddings = r.get_bool("tie_word_embeddings", true);
  }
  if (c.enable_moe_block) {
    c.num_experts = r.get_int("num_experts");
    c.top_k_experts = r.get_int("top_k_experts");
    c.moe_intermediate_size = r.get_int("moe_intermediate_size");
  }
  const std::string act = r.get_string("hidden_activation", "gelu_pytorch_tanh");
  if (act != "gelu_pytorch_tanh" && act != "gelu_tanh")
    r.fail("hidden_activation '" + act + "' is not supported (gelu_pytorch_tanh)");
  if (r.get_bool("attention_bias", false)) r.fail("attention_bias = true is not supported");
  // Gemma4UnifiedTextConfig defaults to "vision", Gemma4TextConfig to none
  c.use_bidirectional_attention = r.get_string("use_bidirectional_attention", unified ? "vision" : "");
  if (c.use_bidirectional_attention == "all")
    r.fail("use_bidirectional_attention = \"all\" (an embedding model) is not supported");
  else if (!c.use_bidirectional_attention.empty() && c.use_bidirectional_attention != "vision")
    r.fail("use_bidirectional_attention '" + c.use_bidirectional_attention + "' is not supported (vision)");
  if (c.use_bidirectional_attention == "vision")
    c.image_attention =
        unified ? Gemma4Config::ImageAttention::all_layers : Gemma4Config::ImageAttention::sliding_layers;
  c.pad_token_id = r.get_int("pad_token_id", 0);
  KILN_TRY(r.status());

  const int64_t L = c.num_hidden_layers;
  if (L <= 0 || c.hidden_size <= 0 || c.vocab_size <= 0 || c.num_attention_heads <= 0 || c.num_key_value_heads <= 0)
    return make_error("{}: sizes must be positive", file.path);

  c.layer_types = r.get_strings("layer_types");
  if (c.layer_types.empty()) {  // transformers' default pattern: five sliding layers, then a full one
    for (int64_t i = 0; i < L; ++i) c.layer_types.push_back((i + 1) % 6 ? "sliding_attention" : "full_attention");
  }
  if (int64_t(c.layer_types.size()) != L)
    return make_error("{}: layer_types has {} entries for {} layers", file.path, c.layer_types.size(), L);
  c.layer_types.back() = "full_attention";  // transformers forces the last layer to full attention
  for (const auto& t : c.layer_types)
    if (t != "sliding_attention" && t != "full_attention")
      return make_error("{}: unknown layer type '{}'", file.path, t);

  // RoPE per layer type
  Gemma4RopeConfig sliding_default{.rope_type = "default", .rope_theta = 10000.0};
  Gemma4RopeConfig full_default{.rope_type = "proportional", .rope_theta = 1e6, .partial_rotary_factor = 0.25};
  c.rope_sliding = sliding_default;
  c.rope_full = full_default;
  if (r.has("rope_parameters") && !file.text["rope_parameters"].is_object())
    return make_error("{}: 'rope_parameters' must be an object, got {}", file.path,
                      file.text["rope_parameters"].dump());
  if (r.has("rope_parameters")) {
    const auto& rp = file.text["rope_parameters"];
    if (rp.contains("rope_type")) {  // one setting for both types
      c.rope_sliding = c.rope_full = parse_rope(r, rp, sliding_default, file.path);
    } else {
      if (rp.contains("sliding_attention"))
        c.rope_sliding = parse_rope(r, rp["sliding_attention"], sliding_default, file.path);
      if (rp.contains("full_attention")) c.rope_full = parse_rope(r, rp["full_attention"], full_default, file.path);
    }
  }

  // Per-layer geometry, from per_layer_config when present, else from the released keys.
  std::map<int64_t, std::pair<int64_t, int64_t>> overrides;  // layer -> (head_dim, n_kv) (0: unset)
  if (r.has("per_layer_config")) {
    const auto& plc = file.text["per_layer_config"];
    if (!plc.is_object()) return make_error("{}: per_layer_config must be an object", file.path);
    for (auto it = plc.begin(); it != plc.end(); ++it) {
      int64_t idx = -1;
      try {
        idx = std::stoll(it.key());
      } catch (...) {
        return make_error("{}: per_layer_config key '{}' is not a layer index", file.path, it.key());
      }
      if (idx < 0 || idx >= L) return make_error("{}: per_layer_config names layer {} of {}", file.path, idx, L);
      ConfigReader lr(it.value(), file.path + " per_layer_config." + it.key());
      overrides[idx] = {lr.get_int("head_dim", 0), lr.get_int("num_key_value_heads", 0)};
      KILN_TRY(lr.status());
    }
  } else {
    const int64_t global_head_dim = r.get_int("global_head_dim", 512);
    const int64_t global_kv = r.has("num_global_key_value_heads") ? r.get_int("num_global_key_value_heads") : 0;
    for (int64_t i = 0; i < L; ++i)
      if (c.layer_types[size_t(i)] == "full_attention")
        overrides[i] = {global_head_dim, c.attention_k_eq_v ? global_kv : 0};
  }
  KILN_TRY(r.status());

  const int64_t first_shared = L - c.num_kv_shared_layers;
  if (c.num_kv_shared_layers < 0 || first_shared < 0)
    return make_error("{}: num_kv_shared_layers = {} for {} layers", file.path, c.num_kv_shared_layers, L);
  for (int64_t i = 0; i < L; ++i) {
    Gemma4Config::Layer layer;
    layer.sliding = c.layer_types[size_t(i)] == "sliding_attention";
    auto o = overrides.count(i) ? overrides[i] : std::pair<int64_t, int64_t>{0, 0};
    layer.head_dim = o.first ? o.first : c.head_dim;
    layer.n_kv_heads = o.second ? o.second : c.num_key_value_heads;
    layer.k_eq_v = c.attention_k_eq_v && !layer.sliding;
    layer.shares_kv = c.num_kv_shared_layers > 0 && i >= first_shared;
    layer.kv_source = i;
    if (layer.shares_kv) {
      int64_t donor = -1;
      for (int64_t j = first_shared - 1; j >= 0; --j)
        if (c.layer_types[size_t(j)] == c.layer_types[size_t(i)]) {
          donor = j;
          break;
        }
      if (donor < 0)
        return make_error("{}: layer {} shares KV but no earlier {} layer owns a cache", file.path, i,
                          c.layer_types[size_t(i)]);
      layer.kv_source = donor;
    }
    layer.mlp_width = c.intermediate_size * (c.use_double_wide_mlp && layer.shares_kv && first_shared > 0 ? 2 : 1);
    if (layer.head_dim <= 0 || layer.head_dim % 2 || c.num_attention_heads % layer.n_kv_heads)
      return make_error("{}: layer {} has head_dim {} and {} KV heads for {} query heads", file.path, i, layer.head_dim,
                        layer.n_kv_heads, c.num_attention_heads);
    c.layers.push_back(layer);
  }
  for (auto& layer : c.layers) {
    if (layer.shares_kv) {  // a sharer attends with its donor's geometry
      const auto& donor = c.layers[size_t(layer.kv_source)];
      layer.n_kv_heads = donor.n_kv_heads;
      if (donor.head_dim != layer.head_dim)
        return make_error("{}: a KV-sharing layer's head_dim differs from its donor's", file.path);
    }
  }
  if (c.enable_moe_block && (c.num_experts <= 0 || c.top_k_experts <= 0 || c.top_k_experts > c.num_experts))
    return make_error("{}: top_k_experts {} of {} experts", file.path, c.top_k_experts, c.num_experts);
  if (c.intermediate_size <= 0 || (c.enable_moe_block && c.moe_intermediate_size <= 0))
    return make_error("{}: the MLP's intermediate size must be positive", file.path);
  if (c.hidden_size_per_layer_input < 0 || (c.hidden_size_per_layer_input > 0 && c.vocab_size_per_layer_input <= 0))
    return make_error("{}: per-layer input sizes must be positive", file.path);
  if (c.hidden_size_per_layer_input > 0 && (c.pad_token_id < 0 || c.pad_token_id >= c.vocab_size_per_layer_input))
    return make_error("{}: pad_token_id {} is outside the per-layer vocabulary of {}", file.path, c.pad_token_id,
                      c.vocab_size_per_layer_input);
  if (c.sliding_window <= 0) return make_error("{}: sliding_window {} must be positive", file.path, c.sliding_window);
  if (!(c.rms_norm_eps > 0.0) || !std::isfinite(c.rms_norm_eps))
    return make_error("{}: rms_norm_eps {} must be positive", file.path, c.rms_norm_eps);
  if (c.final_logit_softcapping && !(*c.final_logit_softcapping > 0.0))
    return make_error("{}: final_logit_softcapping {} must be positive", file.path, *c.final_logit_softcapping);
  // one rotary table per attention type (as transformers builds them), so one head_dim per type
  int64_t type_head_dim[2] = {0, 0};  // full, sliding
  for (const auto& layer : c.layers) {
    int64_t& first = type_head_dim[layer.sliding];
    if (first == 0) first = layer.head_dim;
    if (layer.head_dim != first)
      return make_error("{}: {} layers have head_dim {} and {}; one attention type needs one head_dim", file.path,
                        layer.sliding ? "sliding" : "full", first, layer.head_dim);
  }
  return c;
}

std::vector<CheckpointTensor> gemma4_checkpoint_tensors(const Gemma4Config& c) {
  using Fill = CheckpointTensor::Fill;
  std::vector<CheckpointTensor> t;
  auto matrix = [&](const std::string& name, Shape shape) { t.push_back({name, shape, Fill::normal, 0.02f}); };
  auto ones = [&](const std::string& name, Shape shape) { t.push_back({name, shape, Fill::constant, 1.0f}); };
  const int64_t H = c.hidden_size, Hq = c.num_attention_heads, L = c.num_hidden_layers;
  const int64_t P = c.hidden_size_per_layer_input;
  matrix("model.embed_tokens.weight", Shape{c.vocab_size, H});
  ones("model.norm.weight", Shape{H});
  if (!c.tie_word_embeddings) matrix("lm_head.weight", Shape{c.vocab_size, H});
  if (P > 0) {
    matrix("model.embed_tokens_per_layer.weight", Shape{c.vocab_size_per_layer_input, L * P});
    matrix("model.per_layer_model_projection.weight", Shape{L * P, H});
    ones("model.per_layer_projection_norm.weight", Shape{P});
  }
  for (int64_t i = 0; i < L; ++i) {
    const auto& g = c.layers[size_t(i)];
    const std::string p = "model.layers." + std::to_string(i);
    for (const char* norm :
         {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"})
      ones(p + "." + norm + ".weight", Shape{H});
    matrix(p + ".self_attn.q_proj.weight", Shape{Hq * g.head_dim, H});
    ones(p + ".self_attn.q_norm.weight", Shape{g.head_dim});
    matrix(p + ".self_attn.o_proj.weight", Shape{H, Hq * g.head_dim});
    if (!g.shares_kv) {
      matrix(p + ".self_attn.k_proj.weight", Shape{g.n_kv_heads * g.head_dim, H});
      ones(p + ".self_attn.k_norm.weight", Shape{g.head_dim});
      if (!g.k_eq_v) matrix(p + ".self_attn.v_proj.weight", Shape{g.n_kv_heads * g.head_dim, H});
    }
    matrix(p + ".mlp.gate_proj.weight", Shape{g.mlp_width, H});
    matrix(p + ".mlp.up_proj.weight", Shape{g.mlp_width, H});
    matrix(p + ".mlp.down_proj.weight", Shape{H, g.mlp_width});
    ones(p + ".layer_scalar", Shape{1});
    if (c.enable_moe_block) {
      const int64_t E = c.num_experts, I = c.moe_intermediate_size;
      matrix(p + ".router.proj.weight", Shape{E, H});
      ones(p + ".router.scale", Shape{H});
      ones(p + ".router.per_expert_scale", Shape{E});
      matrix(p + ".experts.gate_up_proj", Shape{E, 2 * I, H});
      matrix(p + ".experts.down_proj", Shape{E, H, I});
      for (const char* norm :
           {"pre_feedforward_layernorm_2", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2"})
        ones(p + "." + norm + ".weight", Shape{H});
    }
    if (P > 0) {
      matrix(p + ".per_layer_input_gate.weight", Shape{P, H});
      matrix(p + ".per_layer_projection.weight", Shape{H, P});
      ones(p + ".post_per_layer_input_norm.weight", Shape{H});
    }
  }
  return t;
}

namespace {

struct Gemma4Layer {
  Tensor input_layernorm, post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm;
  Tensor q_proj, k_proj, v_proj, o_proj, q_norm, k_norm;
  GluMlp mlp;
  // MoE block
  Tensor router_proj, router_norm_weight, per_expert_scale;  // router_norm_weight = router.scale · hidden^-1/2
  ExpertStack experts;
  Tensor pre_feedforward_layernorm_2, post_feedforward_layernorm_1, post_feedforward_layernorm_2;
  // per-layer input
  Tensor per_layer_input_gate, per_layer_projection, post_per_layer_input_norm;
  float layer_scalar = 1.0f;
};

class Gemma4Model final : public Model {
 public:
  Gemma4Model(Gemma4Config config, Backend& backend, const ModelOptions& options)
      : config_(std::move(config)), backend_(backend), options_(options) {}

  Status load(const WeightStore& store, const ModelConfigFile& file);

  const ModelInfo& info() const override { return info_; }
  Backend& backend() const override { return backend_; }
  int64_t max_chunk_tokens() const override { return options_.max_chunk_tokens; }
  Result<std::unique_ptr<SequenceState>> new_sequence(int64_t max_context) override;
  size_t decode_bytes(int64_t context, int64_t batch) const override;
  double prefill_flops(int64_t tokens) const override;
  Result<Tensor> encode_image(const ProcessedImage& image) override;

 protected:
  // Soft tokens of the text width; image spans when images attend to themselves.
  BatchNeeds batch_needs() const override {
    return BatchNeeds{.hidden = config_.hidden_size,
                      .image_spans = config_.image_attention != Gemma4Config::ImageAttention::causal};
  }
  Result<Tensor> run_impl(const PreparedBatch& batch, LogitRows rows) override;

 private:
  // Each block ends with the residual update `then` that reads its output.
  void attention_block(const BatchLayout& batch, int64_t l, const Tensor& x, const ResidualNormArgs& then);
  struct FeedForwardInputs {
    Tensor mlp, router, experts;  // [T, hidden] each; router and experts in MoE layers only
  };
  void feed_forward_block(int64_t l, const FeedForwardInputs& in, const ResidualNormArgs& then);
  Tensor per_layer_inputs(const BatchLayout& batch, const Tensor& ids, const Tensor& embedded);
  Tensor norm(const Tensor& x, const Tensor& weight);

  Gemma4Config config_;
  Backend& backend_;
  ModelOptions options_;
  ModelInfo info_;
  Tensor embed_tokens, norm_weight, lm_head;
  Tensor embed_tokens_per_layer, per_layer_model_projection, per_layer_projection_norm;
  std::vector<Gemma4Layer> layers_;
  RopeTable rope_sliding_, rope_full_;
  std::unique_ptr<Gemma4ImageEncoder> vision_;  // null: the checkpoint runs no images
  std::string no_vision_;                       // why vision_ is null
};

Status Gemma4Model::load(const WeightStore& store, const ModelConfigFile& file) {
  const Gemma4Config& c = config_;
  const std::string& model_type = file.model_type;
  WeightLoader w(store, backend_);
  const int64_t H = c.hidden_size, Hq = c.num_attention_heads;
  KILN_ASSIGN(embed_tokens, w.matrix("embed_tokens.weight", Shape{c.vocab_size, H}));
  KILN_ASSIGN(norm_weight, w.vector("norm.weight", Shape{H}));
  if (c.tie_word_embeddings || !store.has("lm_head.weight")) {
    lm_head = embed_tokens;
  } else {
    KILN_ASSIGN(lm_head, w.matrix("lm_head.weight", Shape{c.vocab_size, H}));
  }
  const int64_t P = c.hidden_size_per_layer_input, L = c.num_hidden_layers;
  if (P > 0) {
    KILN_ASSIGN(embed_tokens_per_layer,
                w.matrix("embed_tokens_per_layer.weight", Shape{c.vocab_size_per_layer_input, L * P}));
    KILN_ASSIGN(per_layer_model_projection, w.matrix("per_layer_model_projection.weight", Shape{L * P, H}));
    KILN_ASSIGN(per_layer_projection_norm, w.vector("per_layer_projection_norm.weight", Shape{P}));
  }

  for (int64_t i = 0; i < L; ++i) {
    const auto& g = c.layers[size_t(i)];
    const std::string p = "layers." + std::to_string(i);
    Gemma4Layer layer;
    KILN_ASSIGN(layer.input_layernorm, w.vector(p + ".input_layernorm.weight", Shape{H}));
    KILN_ASSIGN(layer.post_attention_layernorm, w.vector(p + ".post_attention_layernorm.weight", Shape{H}));
    KILN_ASSIGN(layer.pre_feedforward_layernorm, w.vector(p + ".pre_feedforward_layernorm.weight", Shape{H}));
    KILN_ASSIGN(layer.post_feedforward_layernorm, w.vector(p + ".post_feedforward_layernorm.weight", Shape{H}));
    KILN_ASSIGN(layer.q_proj, w.matrix(p + ".self_attn.q_proj.weight", Shape{Hq * g.head_dim, H}));
    KILN_ASSIGN(layer.q_norm, w.vector(p + ".self_attn.q_norm.weight", Shape{g.head_dim}));
    KILN_ASSIGN(layer.o_proj, w.matrix(p + ".self_attn.o_proj.weight", Shape{H, Hq * g.head_dim}));
    if (!g.shares_kv) {
      KILN_ASSIGN(layer.k_proj, w.matrix(p + ".self_attn.k_proj.weight", Shape{g.n_kv_heads * g.head_dim, H}));
      KILN_ASSIGN(layer.k_norm, w.vector(p + ".self_attn.k_norm.weight", Shape{g.head_dim}));
      if (!g.k_eq_v) {
        KILN_ASSIGN(layer.v_proj, w.matrix(p + ".self_attn.v_proj.weight", Shape{g.n_kv_heads * g.head_dim, H}));
      }
    }
    KILN_ASSIGN(layer.mlp, load_glu_mlp(w, p + ".mlp", H, g.mlp_width));
    if (c.enable_moe_block) {
      const int64_t E = c.num_experts;
      KILN_ASSIGN(layer.router_proj, w.matrix(p + ".router.proj.weight", Shape{E, H}));
      KILN_ASSIGN(Tensor scale, w.host_f32(p + ".router.scale", Shape{H}));
      // router input = rms_norm(h) · scale · hidden^-1/2: fold both factors into one norm weight
      const float root = float(1.0 / std::sqrt(double(H)));
      for (int64_t k = 0; k < H; ++k) scale.data_as<float>()[k] *= root;
      layer.router_norm_weight = backend_.upload(scale, DType::f32);
      KILN_ASSIGN(layer.per_expert_scale, w.vector(p + ".router.per_expert_scale", Shape{E}));
      KILN_ASSIGN(layer.experts,
                  load_experts(w, p + ".experts", p + ".experts.switch_glu", E, H, c.moe_intermediate_size));
      KILN_ASSIGN(layer.pre_feedforward_layernorm_2, w.vector(p + ".pre_feedforward_layernorm_2.weight", Shape{H}));
      KILN_ASSIGN(layer.post_feedforward_layernorm_1, w.vector(p + ".post_feedforward_layernorm_1.weight", Shape{H}));
      KILN_ASSIGN(layer.post_feedforward_layernorm_2, w.vector(p + ".post_feedforward_layernorm_2.weight", Shape{H}));
    }
    if (P > 0) {
      KILN_ASSIGN(layer.per_layer_input_gate, w.matrix(p + ".per_layer_input_gate.weight", Shape{P, H}));
      KILN_ASSIGN(layer.per_layer_projection, w.matrix(p + ".per_layer_projection.weight", Shape{H, P}));
      KILN_ASSIGN(layer.post_per_layer_input_norm, w.vector(p + ".post_per_layer_input_norm.weight", Shape{H}));
    }
    if (store.has(p + ".layer_scalar")) {
      KILN_ASSIGN(Tensor s, w.host_f32(p + ".layer_scalar", Shape{1}));
      layer.layer_scalar = s.data_as<float>()[0];
    }
    layers_.push_back(std::move(layer));
  }

  // RoPE tables per layer type, from the head dim of that type's layers
  int64_t sliding_hd = c.head_dim, full_hd = c.head_dim;
  for (const auto& g : c.layers) (g.sliding ? sliding_hd : full_hd) = g.head_dim;
  auto build = [&](const Gemma4RopeConfig& rc, int64_t hd) {
    // transformers' default RoPE for Gemma 4 rotates the whole head and ignores partial_rotary_factor
    return rc.rope_type == "proportional"
               ? make_proportional_rope(backend_, int(hd), rc.rope_theta, rc.partial_rotary_factor, rc.factor)
               : make_rope(backend_, int(hd), rc.rope_theta);
  };
  rope_sliding_ = build(c.rope_sliding, sliding_hd);
  rope_full_ = build(c.rope_full, full_hd);

  // the image front end, when the checkpoint holds one (text-only conversions drop it)
  KILN_ASSIGN(vision_, load_gemma4_image_encoder(file, w, H, no_vision_));
  if (vision_)
    spdlog::info("{}: the image front end runs ({})", file.path,
                 file.outer_model_type == "gemma4_unified" ? "the unified embedder" : "the vision tower");
  else if (file.root.contains("vision_config") && file.root["vision_config"].is_object())
    spdlog::warn("{}: the vision encoder does not load ({}); images are refused", file.path, no_vision_);

  info_ = ModelInfo{.family = "gemma4",
                    .model_type = model_type,
                    .vocab_size = c.vocab_size,
                    .hidden_size = H,
                    .n_layers = L,
                    .max_position_embeddings = c.max_position_embeddings,
                    .weight_bytes = store.used_bytes()};
  return ok_status();
}

Result<std::unique_ptr<SequenceState>> Gemma4Model::new_sequence(int64_t max_context) {
  if (max_context <= 0) return make_error("context size must be positive, got {}", max_context);
  std::vector<LayerState> layers(config_.layers.size());
  for (size_t i = 0; i < config_.layers.size(); ++i) {
    const auto& g = config_.layers[i];
    if (g.shares_kv) continue;
    // a sliding layer needs the window behind the oldest query of a chunk, plus the chunk
    const int64_t capacity =
        g.sliding ? std::min(max_context, config_.sliding_window - 1 + options_.max_chunk_tokens) : max_context;
    layers[i].kv = new_kv_cache(backend_, capacity, int(g.n_kv_heads), int(g.head_dim), options_.kv_for(int64_t(i)));
  }
  return std::make_unique<SequenceState>(std::move(layers), max_context);
}

size_t Gemma4Model::decode_bytes(int64_t context, int64_t batch) const {
  const Gemma4Config& c = config_;
  size_t bytes = 0;
  auto add = [&](const Tensor& t) { bytes += t.defined() ? t.stored_bytes() : 0; };
  // the embedding lookups read one row per token; a tied head reads the whole table
  const size_t act = dtype_size(backend_.activation_dtype());
  bytes += size_t(batch) * embed_tokens.stored_bytes() / size_t(embed_tokens.dim(0));
  if (c.hidden_size_per_layer_input > 0) {
    bytes += size_t(batch) * embed_tokens_per_layer.stored_bytes() / size_t(embed_tokens_per_layer.dim(0));
    add(per_layer_model_projection);
    add(per_layer_projection_norm);
  }
  add(norm_weight);
  add(lm_head);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Gemma4Layer& w = layers_[i];
    const auto& g = c.layers[i];
    for (const Tensor* t : {&w.input_layernorm,
                            &w.post_attention_layernorm,
                            &w.pre_feedforward_layernorm,
                            &w.post_feedforward_layernorm,
                            &w.q_proj,
                            &w.k_proj,
                            &w.v_proj,
                            &w.o_proj,
                            &w.q_norm,
                            &w.k_norm,
                            &w.mlp.gate,
                            &w.mlp.up,
                            &w.mlp.down,
                            &w.router_proj,
                            &w.router_norm_weight,
                            &w.per_expert_scale,
                            &w.pre_feedforward_layernorm_2,
                            &w.post_feedforward_layernorm_1,
                            &w.post_feedforward_layernorm_2,
                            &w.per_layer_input_gate,
                            &w.per_layer_projection,
                            &w.post_per_layer_input_norm})
      add(*t);
    if (c.enable_moe_block) {  // only the routed experts are read
      const int64_t routed = std::min(c.num_experts, batch * c.top_k_experts);
      const size_t per_expert =
          (w.experts.gate.stored_bytes() + w.experts.up.stored_bytes() + w.experts.down.stored_bytes()) /
          size_t(c.num_experts);
      bytes += size_t(routed) * per_expert;
    }
    // keys and values in view of each query
    const int64_t visible = g.sliding ? std::min(context, c.sliding_window) : context;
    bytes += size_t(batch) * size_t(visible) * size_t(g.n_kv_heads * g.head_dim) * 2 * act;
  }
  return bytes;
}

double Gemma4Model::prefill_flops(int64_t tokens) const {
  const Gemma4Config& c = config_;
  const double t = double(tokens);
  double params = double(lm_head.numel());
  if (c.hidden_size_per_layer_input > 0) params += double(per_layer_model_projection.numel());
  double attention = 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Gemma4Layer& w = layers_[i];
    const auto& g = c.layers[i];
    for (const Tensor* m : {&w.q_proj, &w.k_proj, &w.v_proj, &w.o_proj, &w.mlp.gate, &w.mlp.up, &w.mlp.down,
                            &w.router_proj, &w.per_layer_input_gate, &w.per_layer_projection})
      params += m->defined() ? double(m->numel()) : 0.0;
    if (c.enable_moe_block)
      params += double(c.top_k_experts) *
                double(w.experts.gate.numel() + w.experts.up.numel() + w.experts.down.numel()) / double(c.num_experts);
    // visible keys summed over the queries: a triangle, cut off by the window
    double keys = 0;
    if (g.sliding && tokens > c.sliding_window)
      keys = double(c.sliding_window) * (double(c.sliding_window) + 1) / 2 +
             double(tokens - c.sliding_window) * double(c.sliding_window);
    else
      keys = t * (t + 1) / 2;
    attention += 4.0 * keys * double(c.num_attention_heads * g.head_dim);
  }
  return 2.0 * t * params + attention;
}

Tensor Gemma4Model::norm(const Tensor& x, const Tensor& weight) {
  Tensor out = backend_.alloc(backend_.activation_dtype(), Shape{x.rows(), x.cols()});
  backend_.rms_norm(x, weight, float(config_.rms_norm_eps), 0.0f, out);
  return out;
}

void Gemma4Model::attention_block(const BatchLayout& batch, int64_t l, const Tensor& x, const ResidualNormArgs& then) {
  const auto& g = config_.layers[size_t(l)];
  const Gemma4Layer& w = layers_[size_t(l)];
  const int64_t T = batch.n_tokens, Hq = config_.num_attention_heads, hd = g.head_dim, kv = g.n_kv_heads;
  const float eps = float(config_.rms_norm_eps);
  const DType dt = backend_.activation_dtype();
  const RopeTable& rope = g.sliding ? rope_sliding_ : rope_full_;

  // images attend to themselves (use_bidirectional_attention = "vision"): in the sliding layers
  // within the window (gemma4), or in every layer whatever the window (gemma4_unified)
  using ImageAttention = Gemma4Config::ImageAttention;
  const bool image_blocks =
      batch.soft_spans.defined() && (config_.image_attention == ImageAttention::all_layers ||
                                     (config_.image_attention == ImageAttention::sliding_layers && g.sliding));
  const AttentionShape shape{.n_heads = int(Hq),
                             .n_kv_heads = int(kv),
                             .head_dim = int(hd),
                             .scale = 1.0f,  // q and k are RMS-normalised; Gemma 4 does not scale scores
                             .window = g.sliding ? config_.sliding_window : 0,
                             .blocks = image_blocks ? batch.soft_spans : Tensor(),
                             .block_window = config_.image_attention == ImageAttention::sliding_layers};
  // the projections this layer makes: q always; k unless it reads another layer's cache; v unless
  // it is the key projection itself (k_eq_v)
  Tensor q = backend_.alloc(dt, Shape{T, Hq, hd});
  Tensor k, v;
  std::vector<MatmulProduct> products;
  products.reserve(3);
  products.push_back({w.q_proj, q});
  if (!g.shares_kv) {
    k = backend_.alloc(dt, Shape{T, kv, hd});
    v = backend_.alloc(dt, Shape{T, kv, hd});
    products.push_back({w.k_proj, k});
    if (!g.k_eq_v) products.push_back({w.v_proj, v});
  }
  backend_.matmul_many(x, products);

  const HeadNorm q_norm{.weight = w.q_norm, .eps = eps};
  Tensor attn;
  if (g.shares_kv) {
    norm_and_rope(backend_, batch, rope, q_norm, q);
    attn = cached_attention(backend_, batch, int(g.kv_source), q, nullptr, nullptr, shape);
  } else {
    // values: the raw value (or, with k_eq_v, key) projection under a norm without scale
    write_attention_inputs(backend_, batch, int(l), rope,
                           AttentionInputs{.q_norm = q_norm,
                                           .k_norm = HeadNorm{.weight = w.k_norm, .eps = eps},
                                           .v_input = (g.k_eq_v ? k : v).reshape(Shape{T * kv, hd}),
                                           .v_norm_eps = eps},
                           q, k, v);
    attn = cached_attention(backend_, batch, int(l), q, nullptr, nullptr, shape);
  }
  Tensor out = backend_.alloc(dt, Shape{T, config_.hidden_size});
  project_to_residual(l, "self_attn", attn, w.o_proj, out, then);
}

// The feed-forward block reads the post-attention residual h through up to three norms: the dense
// MLP's (pre_feedforward_layernorm), and in MoE layers the router's and the experts'. Its output,
// before post_feedforward_layernorm, goes to the residual update `then`.
void Gemma4Model::feed_forward_block(int64_t l, const FeedForwardInputs& in, const ResidualNormArgs& then) {
  const Gemma4Layer& w = layers_[size_t(l)];
  if (!config_.enable_moe_block) {
    mlp_to_residual(l, in.mlp, w.mlp, Activation::gelu_tanh, then);
    return;
  }
  Tensor mlp = glu_mlp(backend_, in.mlp, w.mlp, Activation::gelu_tanh);
  dump(fmt::format("layers.{}.mlp", l), mlp);

  Tensor logits = backend_.alloc(DType::f32, Shape{in.router.rows(), config_.num_experts});
  backend_.matmul(in.router, w.router_proj, logits);
  dump(fmt::format("layers.{}.router_logits", l), logits);
  Tensor experts = routed_experts(
      backend_, logits, in.experts, w.experts,
      MoeRouting{.top_k = int(config_.top_k_experts), .renormalize = true, .expert_scale = w.per_expert_scale},
      Activation::gelu_tanh);
  dump(fmt::format("layers.{}.experts", l), experts);
  Tensor out = norm(mlp, w.post_feedforward_layernorm_1);  // the dense part plus the experts' part
  backend_.residual_norm(ResidualNormArgs{.residual = out,
                                          .block_out = experts,
                                          .block_norm = w.post_feedforward_layernorm_2,
                                          .eps = float(config_.rms_norm_eps)});
  backend_.residual_norm(reading(then, out));
}

// Per-layer inputs: (per_layer_model_projection(e) · hidden^-1/2, normed per layer, plus the
// token's own per-layer embedding · sqrt(P)) · 2^-1/2. Returns [T, L · P], layer-major per token.
// At image positions the context part reads the image's rows (e holds them) and the token part
// the pad token's embedding (Gemma4Model.forward looks the table up with pad_token_id there).
Tensor Gemma4Model::per_layer_inputs(const BatchLayout& batch, const Tensor& ids, const Tensor& embedded) {
  const int64_t T = ids.numel(), L = config_.num_hidden_layers, P = config_.hidden_size_per_layer_input;
  const DType dt = backend_.activation_dtype();
  Tensor token_ids = ids;
  if (!batch.soft.empty()) {
    token_ids = backend_.alloc(DType::i32, Shape{T, 1});
    backend_.copy(ids.reshape(Shape{T, 1}), token_ids);
    for (const SoftRows& soft : batch.soft) {
      Tensor pads = token_ids.rows_view(soft.row, soft.rows.rows());
      backend_.fill(pads, float(config_.pad_token_id));
    }
    token_ids = token_ids.reshape(Shape{T});
  }
  Tensor token_part = backend_.alloc(dt, Shape{T, L * P});
  backend_.embed(token_ids, embed_tokens_per_layer, float(std::sqrt(double(P))), token_part);
  Tensor context_part = backend_.alloc(dt, Shape{T, L * P});
  backend_.matmul(embedded, per_layer_model_projection, context_part);
  backend_.scale(context_part, float(1.0 / std::sqrt(double(config_.hidden_size))), context_part);
  Tensor per_layer = context_part.reshape(Shape{T * L, P});
  backend_.rms_norm(per_layer, per_layer_projection_norm, float(config_.rms_norm_eps), 0.0f, per_layer);
  backend_.add(context_part, token_part, float(1.0 / std::sqrt(2.0)), context_part);
  return context_part;
}

Result<Tensor> Gemma4Model::encode_image(const ProcessedImage& image) {
  if (!vision_) return make_error("{} runs no images: {}", info_.model_type, no_vision_);
  try {
    KILN_ASSIGN(Tensor rows,
                vision_->encode(image, [this](const std::string& name, const Tensor& t) { dump(name, t); }));
    KILN_TRY(backend_.status());
    return rows;
  } catch (const std::exception& e) {  // allocation failures surface here as exceptions
    return make_error("encoding an image failed: {}", e.what());
  }
}

Result<Tensor> Gemma4Model::run_impl(const PreparedBatch& prepared, LogitRows rows) {
  const BatchLayout& batch = prepared.layout;
  const int64_t T = batch.n_tokens, H = config_.hidden_size, P = config_.hidden_size_per_layer_input;
  const DType dt = backend_.activation_dtype();

  Tensor h = backend_.alloc(dt, Shape{T, H});
  backend_.embed(prepared.ids, embed_tokens, float(std::sqrt(double(H))), h);  // [T, H]
  place_soft_tokens(backend_, batch, h);                                       // images: their encoded rows, unscaled
  dump("embed_tokens", h);
  Tensor ple;
  if (P > 0) ple = per_layer_inputs(batch, prepared.ids, h);  // [T, L·P]

  const int64_t L = config_.num_hidden_layers;
  const float eps = float(config_.rms_norm_eps);
  Tensor x = norm(h, layers_[0].input_layernorm);  // each block's input norm comes with the residual update before it
  // the final norm too, when the logits are wanted for every row
  const bool every_row = selects_every_row(batch, rows);
  Tensor final_normed;
  for (int64_t l = 0; l < L; ++l) {
    const Gemma4Layer& w = layers_[size_t(l)];
    const bool last = l + 1 == L;
    // where the layer's last residual update writes its norms: the next layer's input, or the final
    auto normed_next = [&](ResidualNormArgs& update) {
      if (!last) {
        x = backend_.alloc(dt, Shape{T, H});
        update.next = x;
        update.next_norm = layers_[size_t(l + 1)].input_layernorm;
      } else if (every_row) {
        final_normed = backend_.alloc(dt, Shape{T, H});
        update.next = final_normed;
        update.next_norm = norm_weight;
      }
    };
    // h += post_attention_layernorm(attention), and the feed-forward block's input norms of h
    FeedForwardInputs ff_in{.mlp = backend_.alloc(dt, Shape{T, H})};
    ResidualNormArgs attn_residual{.residual = h,
                                   .block_norm = w.post_attention_layernorm,
                                   .next = ff_in.mlp,
                                   .next_norm = w.pre_feedforward_layernorm,
                                   .eps = eps};
    if (config_.enable_moe_block) {
      ff_in.router = backend_.alloc(dt, Shape{T, H});
      ff_in.experts = backend_.alloc(dt, Shape{T, H});
      attn_residual.more_next = {ff_in.router, ff_in.experts};
      attn_residual.more_next_norm = {w.router_norm_weight, w.pre_feedforward_layernorm_2};
    }
    attention_block(batch, l, x, attn_residual);
    // h += post_feedforward_layernorm(feed-forward); then the per-layer input; h ·= layer_scalar
    ResidualNormArgs ff_residual{.residual = h, .block_norm = w.post_feedforward_layernorm, .eps = eps};
    if (P == 0) {
      ff_residual.scale = w.layer_scalar;
      normed_next(ff_residual);
    }
    feed_forward_block(l, ff_in, ff_residual);
    if (P > 0) {
      Tensor gate = backend_.alloc(dt, Shape{T, P});
      backend_.matmul(h, w.per_layer_input_gate, gate);
      backend_.glu(gate, ple.cols_view(l * P, P), Activation::gelu_tanh, gate);
      Tensor proj = backend_.alloc(dt, Shape{T, H});
      ResidualNormArgs per_layer_residual{
          .residual = h, .block_norm = w.post_per_layer_input_norm, .eps = eps, .scale = w.layer_scalar};
      normed_next(per_layer_residual);
      output_projection(backend_, gate, w.per_layer_projection, proj, &per_layer_residual);
    }
    dump(fmt::format("layers.{}", l), h);
  }

  if (!final_normed.defined()) final_normed = norm(select_rows(backend_, h, batch, rows), norm_weight);
  dump("norm", final_normed);
  Tensor logits = backend_.alloc(DType::f32, Shape{final_normed.rows(), config_.vocab_size});
  backend_.matmul(final_normed, lm_head, logits);
  if (config_.final_logit_softcapping) backend_.softcap(logits, float(*config_.final_logit_softcapping));
  dump("logits", logits);
  return logits;
}

}  // namespace

Result<std::unique_ptr<Model>> load_gemma4(const ModelConfigFile& file, const WeightStore& weights, Backend& backend,
                                           const ModelOptions& options) {
  KILN_ASSIGN(Gemma4Config config, parse_gemma4_config(file));
  ModelOptions settled = options;
  for (size_t i = 0; i < config.layers.size(); ++i)
    if (!config.layers[i].shares_kv) KILN_TRY(settle_kv_format(settled, int64_t(i), int(config.layers[i].head_dim)));
  auto model = std::make_unique<Gemma4Model>(std::move(config), backend, settled);
  KILN_TRY(model->load(weights, file));
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace kiln
