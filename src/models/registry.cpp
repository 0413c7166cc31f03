// The registry: the list of model families, and building a model from a checkpoint directory
// through the family its config.json names. A checkpoint's tensors are all accounted for: the
// family's model uses them, its reference holds them without computing with them, or they belong
// to a part kiln sets aside and reports (towers, MTP heads); anything else is an error naming it.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <map>

#include "io/config.h"
#include "io/weights.h"
#include "layers/attention.h"
#include "models/batch_prep.h"
#include "models/family.h"
#include "models/model.h"

namespace kiln {

const std::vector<const ModelFamily*>& model_families() {
  static const std::vector<const ModelFamily*> families = {
      &gemma4_family(),
      &qwen3_5_family(),
  };
  return families;
}

const ModelFamily* family_named(const std::string& name) {
  for (const ModelFamily* f : model_families())
    if (f->name == name) return f;
  return nullptr;
}

std::vector<std::string> supported_model_types() {
  std::vector<std::string> out;
  for (const ModelFamily* f : model_families())
    for (const auto& e : f->model_types) out.push_back(e.model_type);
  return out;
}

Result<const ModelFamily*> family_of(const ModelConfigFile& config) {
  const ModelFamily* text_family = nullptr;
  const ModelFamily* outer_family = nullptr;
  for (const ModelFamily* f : model_families()) {
    if (f->entry(config.model_type)) text_family = f;
    if (!config.outer_model_type.empty() && f->entry(config.outer_model_type)) outer_family = f;
  }
  if (text_family && outer_family && text_family != outer_family)
    return make_error("{}: text_config's model_type '{}' is a {} model inside a {} wrapper ('{}')", config.path,
                      config.model_type, text_family->name, outer_family->name, config.outer_model_type);
  if (text_family) return text_family;
  std::string known;
  for (const auto& name : supported_model_types()) known += (known.empty() ? "" : ", ") + name;
  return make_error("unsupported model_type '{}' in {} (supported: {})", config.model_type, config.path, known);
}

Result<std::vector<CheckpointTensor>> checkpoint_tensors(const ModelConfigFile& config) {
  KILN_ASSIGN(const ModelFamily* family, family_of(config));
  return family->checkpoint_tensors(config);
}

Result<std::vector<CheckpointTensor>> checkpoint_part_tensors(const ModelConfigFile& config) {
  KILN_ASSIGN(const ModelFamily* family, family_of(config));
  if (!family->part_tensors) return std::vector<CheckpointTensor>{};
  return family->part_tensors(config);
}

Result<PreparedBatch> Model::prepare(std::span<const SeqChunk> batch) {
  try {
    return prepare_batch(backend(), batch, info().vocab_size, max_chunk_tokens(), batch_needs());
  } catch (const std::exception& e) {
    return make_error("forward failed: {}", e.what());
  }
}

Result<Tensor> Model::run(const PreparedBatch& batch, LogitRows rows) {
  try {
    KILN_ASSIGN(Tensor logits, run_impl(batch, rows));
    KILN_TRY(backend().status());
    return logits;
  } catch (const std::exception& e) {  // allocation failures surface here as exceptions
    return make_error("forward failed: {}", e.what());
  }
}

Result<Tensor> Model::encode_image(const ProcessedImage&) {
  return make_error("{} ({}) runs no images", info().model_type, info().family);
}

void Model::dump(const std::string& name, const Tensor& t) const {
  if (!dump_ || !t.defined()) return;
  dump_->record(name, backend().to_host(t));
}

void Model::project_to_residual(int64_t layer, const char* block, const Tensor& x, const Tensor& w, Tensor& out,
                                const ResidualNormArgs& then) {
  if (!dumping()) return output_projection(backend(), x, w, out, &then);
  output_projection(backend(), x, w, out, nullptr);
  dump(fmt::format("layers.{}.{}", layer, block), out);
  backend().residual_norm(reading(then, out));
}

void Model::mlp_to_residual(int64_t layer, const Tensor& x, const GluMlp& mlp, Activation act,
                            const ResidualNormArgs& then) {
  if (!dumping()) {
    glu_mlp(backend(), x, mlp, act, &then);
    return;
  }
  Tensor out = glu_mlp(backend(), x, mlp, act);
  dump(fmt::format("layers.{}.mlp", layer), out);
  backend().residual_norm(reading(then, out));
}

Result<Tensor> Model::forward(std::span<const SeqChunk> batch, LogitRows rows) {
  KILN_ASSIGN(PreparedBatch prepared, prepare(batch));
  KILN_ASSIGN(Tensor logits, run(prepared, rows));
  advance_sequences(prepared.layout);
  return logits;
}

namespace {

// Sorts the tensors the model did not fetch: set-aside parts (reported), tensors the reference
// holds without using (accepted), and the rest (an error naming the first).
Result<std::vector<SetAsideFinding>> account_for_tensors(const ModelFamily& family, const ModelConfigFile& config,
                                                         const WeightStore& weights) {
  std::map<std::string, SetAsideFinding> parts;
  for (const std::string& name : weights.unused()) {
    const SetAsidePart* part = family.part_of(name);
    const std::string sidecar = weights.sidecar_of(name);
    for (const auto& p : family.set_aside)
      for (const auto& file : p.sidecars)
        if (sidecar == file) part = &p;
    if (!part && !sidecar.empty()) {  // a file config.json names whose tensors belong to no known part
      auto& found = parts["tensors of " + sidecar];
      found.part = "tensors of " + sidecar;
      found.not_yet = "not used";
      ++found.tensors;
      continue;
    }
    if (part) {
      auto& found = parts[part->name];
      found.part = part->name;
      found.not_yet = part->not_yet;
      ++found.tensors;
      continue;
    }
    if (family.unused_by_design && family.unused_by_design(config, name)) continue;
    return make_error("tensor {} is not used by {} (a {} checkpoint holds no such tensor for this config.json)",
                      weights.describe(name), config.model_type, family.name);
  }
  const std::vector<std::string> names = weights.names(), unused = weights.unused();
  auto model_reads_part = [&](const SetAsidePart& p) {  // some of its tensors are in use
    for (const auto& name : names)
      if (family.part_of(name) == &p && !std::binary_search(unused.begin(), unused.end(), name)) return true;
    return false;
  };
  for (const auto& p : family.set_aside) {  // a part the config describes whose tensors are elsewhere
    if (parts.count(p.name) || model_reads_part(p)) continue;
    for (const auto& key : p.config_keys)
      if (config.root.contains(key) && config.root[key].is_object()) {
        parts[p.name] = SetAsideFinding{.part = p.name, .not_yet = p.not_yet};
        break;
      }
  }
  std::vector<SetAsideFinding> out;
  for (auto& [name, finding] : parts) out.push_back(std::move(finding));
  return out;
}

// Files beside the main safetensors that hold parts of the model: the family's known sidecars and
// those config.json names (mlx conversions: "mlx_lm_extra_tensors": {"mtp_file": "mtp.safetensors"}).
std::vector<std::string> sidecar_files(const ModelFamily& family, const ModelConfigFile& config) {
  std::vector<std::string> files;
  for (const auto& p : family.set_aside) files.insert(files.end(), p.sidecars.begin(), p.sidecars.end());
  for (const auto* j : {&config.root, &config.text}) {
    if (!j->contains("mlx_lm_extra_tensors") || !(*j)["mlx_lm_extra_tensors"].is_object()) continue;
    for (const auto& [key, value] : (*j)["mlx_lm_extra_tensors"].items())
      if (value.is_string()) files.push_back(value.get<std::string>());
  }
  return files;
}

// The per-layer cache formats a checkpoint's kv_config.json asks for (MLX and OptiQ conversions):
// a list of {"layer_idx", "bits", "group_size"}; empty when there is no such file.
Result<std::vector<KvQuant>> read_kv_config(const std::string& model_dir, int64_t n_layers) {
  const std::string path = model_dir + "/kv_config.json";
  std::ifstream in(path);
  if (!in) return std::vector<KvQuant>{};
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return make_error("{}: not valid JSON", path);
  if (!j.is_array()) return make_error("{}: expected a list of {{layer_idx, bits, group_size}}", path);
  std::vector<KvQuant> layers(size_t(std::max<int64_t>(n_layers, 0)));
  for (size_t e = 0; e < j.size(); ++e) {
    const nlohmann::json& entry = j[e];
    auto field = [&](const char* name) -> Result<int64_t> {
      if (!entry.is_object() || !entry.contains(name) || !entry[name].is_number_integer())
        return make_error("{}: entry {} has no integer \"{}\"", path, e, name);
      return entry[name].get<int64_t>();
    };
    KILN_ASSIGN(const int64_t layer, field("layer_idx"));
    KILN_ASSIGN(const int64_t bits, field("bits"));
    KILN_ASSIGN(const int64_t group_size, field("group_size"));
    if (layer < 0 || layer >= n_layers)
      return make_error("{}: entry {} names layer {}, but the model has {} layers", path, e, layer, n_layers);
    if (bits >= 16) continue;  // left in the activations' type
    layers[size_t(layer)] = KvQuant{.bits = int(bits), .group_size = int(group_size)};
  }
  return layers;
}

// Sets options.kv_layers: kv_quant for every layer when given, else the checkpoint's kv_config.json
// where the backend can honour it.
Status resolve_kv_formats(const std::string& model_dir, const ModelConfigFile& config, const Backend& backend,
                          ModelOptions& options) {
  const int64_t n_layers = config.text.value("num_hidden_layers", int64_t(0));
  if (options.kv_quant) {
    if (options.kv_quant->quantized() && !backend.quantized_kv_caches())
      return make_error("quantized KV caches are not supported on the {} backend yet", backend.name());
    options.kv_layers.assign(size_t(std::max<int64_t>(n_layers, 0)), *options.kv_quant);
    return ok_status();
  }
  KILN_ASSIGN(std::vector<KvQuant> layers, read_kv_config(model_dir, n_layers));
  const auto quantized = std::count_if(layers.begin(), layers.end(), [](const KvQuant& q) { return q.quantized(); });
  if (!quantized) return ok_status();
  if (!backend.quantized_kv_caches()) {
    spdlog::warn(
        "{}: kv_config.json asks for quantized KV caches, which the {} backend does not support yet; the "
        "caches stay in the activations' type",
        model_dir, backend.name());
    return ok_status();
  }
  spdlog::info("{}: KV caches of {} layers quantized as kv_config.json sets (--kv-bits 16 keeps them unquantized)",
               model_dir, quantized);
  options.kv_layers = std::move(layers);
  return ok_status();
}

}  // namespace

Status settle_kv_format(ModelOptions& options, int64_t layer, int head_dim) {
  const Status fits = check_kv_quant(options.kv_for(layer), head_dim, int(layer));
  if (fits.ok() || options.kv_quant) return fits;
  spdlog::warn("kv_config.json: {}; that layer's cache stays unquantized", fits.error().message);
  options.kv_layers[size_t(layer)] = KvQuant{};
  return ok_status();
}

namespace {

Result<std::unique_ptr<Model>> load_model_unchecked(const std::string& model_dir, Backend& backend,
                                                    ModelOptions options) {
  KILN_ASSIGN(ModelConfigFile config, read_model_config(model_dir));
  KILN_ASSIGN(const ModelFamily* family, family_of(config));
  KILN_TRY(resolve_kv_formats(model_dir, config, backend, options));
  KILN_ASSIGN(WeightStore weights, WeightStore::open(model_dir, sidecar_files(*family, config)));
  KILN_ASSIGN(QuantizationConfig quantization, QuantizationConfig::parse(config.text, config.path));
  if (quantization.present())
    spdlog::info("{}: MLX affine quantization, {} bits in groups of {} ({} per-module settings); weights stay packed",
                 model_dir, quantization.bits(), quantization.group_size(), quantization.overrides().size());
  weights.set_quantization(std::move(quantization));
  KILN_ASSIGN(auto model, family->load(config, weights, backend, options));
  KILN_ASSIGN(auto set_aside, account_for_tensors(*family, config, weights));
  for (const auto& s : set_aside) {
    if (s.tensors > 0)
      spdlog::warn("{} present ({} tensors, set aside): {}", s.part, s.tensors, s.not_yet);
    else
      spdlog::warn("{} described in config.json: {}", s.part, s.not_yet);
  }
  model->set_set_aside(std::move(set_aside));
  KILN_TRY(backend.status());
  return model;
}

}  // namespace

Result<std::unique_ptr<Model>> load_model(const std::string& model_dir, Backend& backend, const ModelOptions& options) {
  try {
    return load_model_unchecked(model_dir, backend, options);
  } catch (const std::exception& e) {
    return make_error("loading {} failed: {}", model_dir, e.what());
  }
}

}  // namespace kiln
