// The Gemma 4 family: gemma4_text and gemma4_unified_text language models, flat or inside the
// released multimodal wrappers (gemma4: e2b, e4b, 26B-A4B, 31B; gemma4_unified: 12B), with the
// wrappers' image front ends.
#include <map>

#include "models/family.h"
#include "models/gemma4/gemma4.h"
#include "models/gemma4/image_processor.h"
#include "models/gemma4/towers.h"
#include "models/mlx_layout.h"

namespace kiln {

namespace {

// Tensors transformers keeps that the forward pass never reads: the key/value projections and
// key norm of KV-sharing layers (they attend with a donor layer's cache), and the head of a tied
// model (transformers ties it to embed_tokens after loading).
bool unused_in(const Gemma4Config& c, const std::string& name) {
  if (name == "lm_head.weight") return c.tie_word_embeddings;
  if (!starts_with(name, "layers.")) return false;
  const size_t dot = name.find('.', 7);
  if (dot == std::string::npos) return false;
  int64_t layer = -1;
  try {
    layer = std::stoll(name.substr(7, dot - 7));
  } catch (...) {
    return false;
  }
  if (layer < 0 || layer >= int64_t(c.layers.size()) || !c.layers[size_t(layer)].shares_kv) return false;
  const std::string rest = name.substr(dot + 1);
  for (const char* p : {"self_attn.k_proj.", "self_attn.v_proj.", "self_attn.k_norm.", "self_attn.v_norm."})
    if (starts_with(rest, p)) return true;
  return false;
}

bool gemma4_unused_by_design(const ModelConfigFile& file, const std::string& name) {
  auto parsed = parse_gemma4_config(file);
  return parsed.ok() && unused_in(*parsed, name);
}

// mlx-lm's names: the language model under "language_model." in the wrappers, "model." in flat
// checkpoints; experts as switch_glu stacks with gate and up apart.
Result<std::vector<MlxTensor>> gemma4_mlx_layout(const ModelConfigFile& file, const WeightStore& store) {
  KILN_ASSIGN(Gemma4Config c, parse_gemma4_config(file));
  const ModelTypeEntry* outer = gemma4_family().entry(file.outer_model_type);
  const bool flat = !outer || !outer->wrapper;
  const std::string prefix = flat ? "model." : "language_model.model.";
  const std::string head = flat ? "lm_head" : "language_model.lm_head";
  std::vector<MlxTensor> out;
  auto get = [&store](const std::string& name) { return [&store, name]() { return *store.get(name); }; };
  for (const auto& name : store.names()) {
    if (!store.sidecar_of(name).empty()) continue;
    if (gemma4_family().part_of(name) || unused_in(c, name)) continue;
    KILN_ASSIGN(Tensor t, store.get(name));
    if (name == "lm_head.weight") {
      out.push_back({head + ".weight", t.shape(), t.dtype(), get(name)});
      continue;
    }
    if (fused_experts_to_mlx(store, name, t, prefix, ".experts.switch_glu.", out)) continue;
    out.push_back({prefix + name, t.shape(), t.dtype(), get(name)});
  }
  return out;
}

ModelFamily make_gemma4_family() {
  ModelFamily f;
  f.name = "gemma4";
  f.model_types = {
      {.model_type = "gemma4_text", .hf_class = "Gemma4ForCausalLM"},
      {.model_type = "gemma4",
       .hf_class = "Gemma4ForConditionalGeneration",
       .wrapper = true,
       .text_model_types = {"gemma4_text"}},
      {.model_type = "gemma4_unified_text", .hf_class = "Gemma4UnifiedForCausalLM"},
      {.model_type = "gemma4_unified",
       .hf_class = "Gemma4UnifiedForConditionalGeneration",
       .wrapper = true,
       .text_model_types = {"gemma4_unified_text"}},
  };
  f.load = load_gemma4;
  f.checkpoint_tensors = [](const ModelConfigFile& file) -> Result<std::vector<CheckpointTensor>> {
    KILN_ASSIGN(Gemma4Config c, parse_gemma4_config(file));
    return gemma4_checkpoint_tensors(c);
  };
  f.part_tensors = gemma4_part_tensors;
  f.unused_by_design = gemma4_unused_by_design;
  f.image_processor = load_gemma4_image_processor;
  // The vision encoder runs when the checkpoint holds all of its weights (vision.h); only one that
  // is incomplete (or beside a config without vision_config) is set aside.
  f.set_aside = {
      {.name = "vision encoder",
       .prefixes = {"vision_tower.", "embed_vision.", "vision_embedder."},
       .config_keys = {"vision_config"},
       .sidecars = {"optiq_vision.safetensors"},
       .not_yet = "its weights are incomplete or not described: images are refused"},
      {.name = "audio encoder",
       .prefixes = {"audio_tower.", "embed_audio."},
       .config_keys = {"audio_config"},
       .not_yet = "audio not supported yet"},
  };
  f.quantize.mlx_layout = gemma4_mlx_layout;
  f.quantize.eight_bit = [](const ModelConfigFile&, const std::string& module) {
    return ends_with(module, "router.proj");
  };
  f.chat = ChatMarkup{.think_open = "<|channel>thought",
                      .think_close = "<channel|>",
                      .call_open = "<|tool_call>",
                      .call_close = "<tool_call|>",
                      .tool_calls = ToolCallSyntax::gemma,
                      // think_open is this token followed by the text "thought"; strings in calls
                      .kept_tokens = {"<|channel>", "<|\"|>"}};
  return f;
}

}  // namespace

const ModelFamily& gemma4_family() {
  static const ModelFamily family = make_gemma4_family();
  return family;
}

}  // namespace kiln
