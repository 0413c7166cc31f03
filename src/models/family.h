// What kiln knows about a model family, in one place: the model_types it answers to (the
// release-form wrappers included), how its config is read and its weights loaded, the tensors of
// a checkpoint of any geometry (synthetic models), its policy for `kiln quantize`, the markup its
// chat models write (reasoning, tool calls), and the parts of its released checkpoints that kiln
// sets aside, and how it turns an image into pixels and prompt tokens. The registry
// (models/registry.cpp) is a list of these.
//
// Adding a family: a folder under src/models/ that defines one ModelFamily, and one line in the
// registry's list. Adding a model_type alias: one entry in its family's `model_types`.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/config.h"
#include "io/synthetic.h"
#include "io/weights.h"
#include "models/image_processor.h"
#include "models/model.h"

namespace kiln {

// A model_type a family answers to, as config.json spells it.
struct ModelTypeEntry {
  std::string model_type;
  // transformers' class for checkpoints of this type (documentation, and `kiln ls`)
  std::string hf_class;
  // a release-form wrapper: its language model's settings sit under text_config, with the types
  // named in text_model_types
  bool wrapper = false;
  std::vector<std::string> text_model_types;
};

// A part of a released checkpoint that kiln does not run yet, or runs only when the checkpoint holds
// it (a vision tower that a text-only conversion dropped). Tensors the model leaves unread are
// accepted, checked for a valid header, set aside at load, and their presence reported in one line;
// a part the config describes but whose tensors are absent is reported too.
struct SetAsidePart {
  std::string name;                      // "vision tower"
  std::vector<std::string> prefixes;     // canonical tensor-name prefixes, e.g. "vision_tower."
  std::vector<std::string> config_keys;  // config.json sections that describe it, e.g. "vision_config"
  std::vector<std::string> sidecars;     // files of its own in mlx conversions, e.g. "mtp.safetensors"
  std::string not_yet;                   // what that means for a user: "images not supported yet"
};

// How a chat model of the family writes reasoning and tool calls. Markers the model's vocabulary
// lacks are dropped when a parser is made for a model.
enum class ToolCallSyntax { none, qwen_xml, hermes_json, gemma };
struct ChatMarkup {
  std::string think_open, think_close;
  std::string call_open, call_close;
  ToolCallSyntax tool_calls = ToolCallSyntax::none;
  // further special tokens a parser must see in the decoded text (decoding skips other specials)
  std::vector<std::string> kept_tokens;
};

// One tensor of mlx-lm's form of a checkpoint (names after mlx-lm's `sanitize`), made on demand.
struct MlxTensor {
  std::string name;  // e.g. "language_model.model.layers.0.mlp.switch_mlp.gate_proj.weight"
  Shape shape;
  DType dtype = DType::f32;
  std::function<Tensor()> make;
};

// `kiln quantize`: what mlx-lm's conversion does for this family.
struct QuantizePolicy {
  // The checkpoint's text-model tensors as mlx-lm names and lays them out (expert stacks, norm
  // conventions, conv layout), from the canonical names of `store`.
  std::function<Result<std::vector<MlxTensor>>(const ModelConfigFile&, const WeightStore&)> mlx_layout;
  // Modules mlx-lm quantizes at 8 bits in groups of 64 whatever the default (routers, gates),
  // by mlx module path.
  std::function<bool(const ModelConfigFile&, const std::string& module)> eight_bit;
};

struct ModelFamily {
  std::string name;  // "gemma4", "qwen3_5"
  std::vector<ModelTypeEntry> model_types;

  // Builds the model (its config read from `file`, its weights from `weights`) on `backend`.
  std::function<Result<std::unique_ptr<Model>>(const ModelConfigFile&, const WeightStore&, Backend&,
                                               const ModelOptions&)>
      load;
  // The text-model tensors a checkpoint of this config holds, named as transformers saves the
  // text-only model ("model." prefix): what `kiln synth-model` writes.
  std::function<Result<std::vector<CheckpointTensor>>(const ModelConfigFile&)> checkpoint_tensors;
  // Tensors of the set-aside parts a release-form config describes (towers, embedders, MTP),
  // named as transformers saves the wrapper; written by `kiln synth-model` beside the text model.
  std::function<Result<std::vector<CheckpointTensor>>(const ModelConfigFile&)> part_tensors;
  // Text-model tensors that the reference holds but never computes with (for example the K and V
  // projections of Gemma 4's KV-sharing layers): accepted, not reported.
  std::function<bool(const ModelConfigFile&, const std::string& canonical_name)> unused_by_design;

  // The family's image processor for a model directory: its HF image processor class's settings
  // from the directory (image_processor.h says which files), its placeholder from config.json and
  // tokenizer_config.json. An error for a config without a vision tower.
  std::function<Result<std::unique_ptr<ImageProcessor>>(const std::string& model_dir, const ModelConfigFile&)>
      image_processor;

  std::vector<SetAsidePart> set_aside;
  QuantizePolicy quantize;
  ChatMarkup chat;

  // For families whose rotary positions a prompt lays out itself (Qwen 3.5's multimodal RoPE): a
  // whole prompt's positions, [axes × ids.size()] axis-major, from its ids and the patch grid of
  // each of its images in order (ProcessedImage::grid); the engine hands each chunk its columns in
  // SeqChunk::positions. Null for families whose positions are the token indices (Gemma 4).
  std::function<Result<std::vector<int32_t>>(const ModelConfigFile&, std::span<const int32_t> ids,
                                             std::span<const std::vector<int64_t>> image_grids)>
      rope_positions;

  // The set-aside part a canonical tensor name belongs to by its prefix, or null.
  const SetAsidePart* part_of(const std::string& name) const {
    for (const auto& part : set_aside)
      for (const auto& prefix : part.prefixes)
        if (name.rfind(prefix, 0) == 0) return &part;
    return nullptr;
  }

  const ModelTypeEntry* entry(const std::string& model_type) const {
    for (const auto& e : model_types)
      if (e.model_type == model_type) return &e;
    return nullptr;
  }
};

// The families kiln runs, in the registry's order.
const std::vector<const ModelFamily*>& model_families();
// The family a config belongs to (by its text model_type, else its outer one); an error naming
// the model_type when none does.
Result<const ModelFamily*> family_of(const ModelConfigFile& config);
// The family by name ("gemma4"), or null.
const ModelFamily* family_named(const std::string& name);

// Each family's descriptor, defined in its folder.
const ModelFamily& gemma4_family();
const ModelFamily& qwen3_5_family();

}  // namespace kiln
