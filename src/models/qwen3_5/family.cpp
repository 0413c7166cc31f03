// The Qwen 3.5 family: qwen3_5_text and qwen3_5_moe_text language models, flat or inside the
// released multimodal wrappers (qwen3_5, qwen3_5_moe).
#include <map>

#include "models/family.h"
#include "models/mlx_layout.h"
#include "models/qwen3_5/image_processor.h"
#include "models/qwen3_5/mrope.h"
#include "models/qwen3_5/qwen3_5.h"
#include "models/qwen3_5/towers.h"

namespace kiln {

namespace {

bool is_set_aside(const std::string& name) {
  return qwen3_5_family().part_of(name) != nullptr;
}

// mlx-lm's form: the language model under "language_model.", experts stacked as switch_mlp, and,
// from transformers' layout, the conv weight [C, 1, K] as [C, K, 1] and the (1 + w) norms stored
// as 1 + w.
Result<std::vector<MlxTensor>> qwen3_5_mlx_layout(const ModelConfigFile& file, const WeightStore& store) {
  KILN_ASSIGN(Qwen35Config c, parse_qwen3_5_config(file));
  const std::string prefix = "language_model.model.";
  const std::string head = "language_model.lm_head";
  std::vector<MlxTensor> out;
  auto get = [&store](const std::string& name) { return [&store, name]() { return *store.get(name); }; };

  // transformers' layout still: conv [C, 1, K] and norms as w
  bool unsanitized_conv = false;
  for (const auto& name : store.names()) {
    if (!ends_with(name, "conv1d.weight") || is_set_aside(name)) continue;
    KILN_ASSIGN(Tensor conv, store.get(name));
    unsanitized_conv = unsanitized_conv || conv.dim(-1) != 1;
  }

  std::map<std::string, std::map<int64_t, std::string>> per_expert;  // "layers.N.mlp.switch_mlp.P" -> expert -> name
  for (const auto& name : store.names()) {
    if (!store.sidecar_of(name).empty() || is_set_aside(name)) continue;
    KILN_ASSIGN(Tensor t, store.get(name));
    if (name == "lm_head.weight") {
      if (!c.tie_word_embeddings) out.push_back({head + ".weight", t.shape(), t.dtype(), get(name)});
      continue;
    }
    if (fused_experts_to_mlx(store, name, t, prefix, ".switch_mlp.", out)) continue;
    const auto experts = name.find(".experts.");
    if (experts != std::string::npos) {  // layers.N.mlp.experts.E.P.weight
      const std::string rest = name.substr(experts + 9);
      const auto dot = rest.find('.');
      const std::string index = rest.substr(0, dot);
      if (dot == std::string::npos || index.empty() || index.size() > 9 ||
          index.find_first_not_of("0123456789") != std::string::npos || !ends_with(rest, ".weight") || t.rank() != 2)
        return make_error("tensor {} is not an expert's projection (layers.N.mlp.experts.E.PROJ.weight, 2-D)",
                          store.describe(name));
      const int64_t e = std::stoll(index);
      if (e >= c.num_experts)
        return make_error("tensor {} is expert {}, but config.json has num_experts {}", store.describe(name), e,
                          c.num_experts);
      const std::string proj = rest.substr(dot + 1, rest.size() - dot - 1 - 7);  // drop ".weight"
      per_expert[name.substr(0, experts) + ".switch_mlp." + proj][e] = name;
      continue;
    }
    std::function<Tensor()> make = get(name);
    Shape shape = t.shape();
    if (ends_with(name, "conv1d.weight") && unsanitized_conv) {
      shape = Shape{t.dim(0), t.dim(2), t.dim(1)};  // [C, 1, K] -> [C, K, 1]: the same bytes
      make = [&store, name, shape]() { return store.get(name)->reshape(shape); };
    }
    const bool one_plus_w_norm = name == "norm.weight" || ends_with(name, ".input_layernorm.weight") ||
                                 ends_with(name, ".post_attention_layernorm.weight") ||
                                 ends_with(name, ".q_norm.weight") || ends_with(name, ".k_norm.weight");
    if (unsanitized_conv && one_plus_w_norm && t.rank() == 1)
      make = [&store, name]() { return add_one(*store.get(name)); };
    out.push_back({prefix + name, shape, t.dtype(), make});
  }
  for (const auto& [base, parts] : per_expert) {
    std::vector<std::string> names;
    for (int64_t e = 0; e < int64_t(parts.size()); ++e) {
      auto it = parts.find(e);
      if (it == parts.end()) return make_error("expert {} of '{}' is missing", e, base);
      names.push_back(it->second);
    }
    KILN_ASSIGN(Tensor first, store.get(names.front()));
    out.push_back({prefix + base + ".weight", Shape{int64_t(names.size()), first.dim(0), first.dim(1)}, first.dtype(),
                   [&store, names]() {
                     std::vector<Tensor> ts;
                     for (const auto& n : names) ts.push_back(*store.get(n));
                     return stack_host(ts);
                   }});
  }
  return out;
}

ModelFamily make_qwen3_5_family() {
  ModelFamily f;
  f.name = "qwen3_5";
  f.model_types = {
      {.model_type = "qwen3_5_text", .hf_class = "Qwen3_5ForCausalLM"},
      {.model_type = "qwen3_5",
       .hf_class = "Qwen3_5ForConditionalGeneration",
       .wrapper = true,
       .text_model_types = {"qwen3_5_text"}},
      {.model_type = "qwen3_5_moe_text", .hf_class = "Qwen3_5MoeForCausalLM"},
      {.model_type = "qwen3_5_moe",
       .hf_class = "Qwen3_5MoeForConditionalGeneration",
       .wrapper = true,
       .text_model_types = {"qwen3_5_moe_text"}},
  };
  f.load = load_qwen3_5;
  f.checkpoint_tensors = [](const ModelConfigFile& file) -> Result<std::vector<CheckpointTensor>> {
    KILN_ASSIGN(Qwen35Config c, parse_qwen3_5_config(file));
    return qwen3_5_checkpoint_tensors(c);
  };
  f.part_tensors = qwen3_5_part_tensors;
  // transformers ties the head to embed_tokens after loading: a stored lm_head.weight is not read
  f.unused_by_design = [](const ModelConfigFile& file, const std::string& name) {
    if (name != "lm_head.weight") return false;
    auto c = parse_qwen3_5_config(file);
    return c.ok() && c->tie_word_embeddings;
  };
  f.image_processor = load_qwen3_5_image_processor;
  // The vision encoder runs when the checkpoint holds it (the model reads every one of its tensors);
  // the entry reports a config that describes a tower whose weights a conversion dropped, and names
  // the sidecar an mlx conversion keeps it in.
  f.set_aside = {
      {.name = "vision encoder",
       .prefixes = {"visual.", "vision_tower."},
       .config_keys = {"vision_config"},
       .sidecars = {"optiq_vision.safetensors"},
       .not_yet = "its weights are not in the checkpoint: images cannot be encoded"},
      {.name = "MTP head",
       .prefixes = {"mtp."},
       .sidecars = {"mtp.safetensors"},
       .not_yet = "speculative decoding not supported yet"},
  };
  f.rope_positions = [](const ModelConfigFile& file, std::span<const int32_t> ids,
                        std::span<const std::vector<int64_t>> grids) -> Result<std::vector<int32_t>> {
    KILN_ASSIGN(Qwen35ImageConfig images, parse_qwen3_5_image_config(file));
    return qwen3_5_rope_positions(ids, grids,
                                  Qwen35PromptTokens{.image_token_id = images.image_token_id,
                                                     .spatial_merge_size = images.vision.spatial_merge_size});
  };
  f.quantize.mlx_layout = qwen3_5_mlx_layout;
  f.quantize.eight_bit = [](const ModelConfigFile& file, const std::string& module) {
    const auto& n = file.text.contains("num_experts") ? file.text["num_experts"] : nlohmann::json();
    const bool moe = n.is_number_integer() && n.get<int64_t>() > 0;
    return moe && (ends_with(module, "mlp.gate") || ends_with(module, "shared_expert_gate"));
  };
  f.chat = ChatMarkup{.think_open = "<think>",
                      .think_close = "</think>",
                      .call_open = "<tool_call>",
                      .call_close = "</tool_call>",
                      // or JSON bodies (Qwen 3's): told apart by the body and the chat template
                      .tool_calls = ToolCallSyntax::qwen_xml};
  return f;
}

}  // namespace

const ModelFamily& qwen3_5_family() {
  static const ModelFamily family = make_qwen3_5_family();
  return family;
}

}  // namespace kiln
