// model_type -> family loader. An explicit table: every supported architecture is listed here.
#include <spdlog/spdlog.h>
#include <functional>
#include <map>

#include "io/config.h"
#include "io/weights.h"
#include "models/batch_prep.h"
#include "models/gemma4.h"
#include "models/model.h"
#include "models/qwen3_5.h"

namespace kiln {

namespace {

using Loader = std::function<Result<std::unique_ptr<Model>>(const ModelConfigFile&, const WeightStore&, Backend&,
                                                            const ModelOptions&)>;

const std::map<std::string, Loader>& registry() {
  static const std::map<std::string, Loader> table = {
      {"gemma4", load_gemma4},        {"gemma4_text", load_gemma4},  {"qwen3_5", load_qwen3_5},
      {"qwen3_5_text", load_qwen3_5}, {"qwen3_5_moe", load_qwen3_5}, {"qwen3_5_moe_text", load_qwen3_5},
  };
  return table;
}

}  // namespace

Result<std::vector<CheckpointTensor>> checkpoint_tensors(const ModelConfigFile& config) {
  const std::string& type = config.model_type;
  if (type == "gemma4" || type == "gemma4_text") {
    KILN_ASSIGN(Gemma4Config c, parse_gemma4_config(config));
    return gemma4_checkpoint_tensors(c);
  }
  if (type.rfind("qwen3_5", 0) == 0) {
    KILN_ASSIGN(Qwen35Config c, parse_qwen3_5_config(config));
    return qwen3_5_checkpoint_tensors(c);
  }
  return make_error("unsupported model_type '{}' in {}", type, config.path);
}

std::vector<std::string> supported_model_types() {
  std::vector<std::string> out;
  for (const auto& [name, loader] : registry()) out.push_back(name);
  return out;
}

Result<PreparedBatch> Model::prepare(std::span<const SeqChunk> batch) {
  try {
    return prepare_batch(backend(), batch, info().vocab_size, max_chunk_tokens());
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

Result<Tensor> Model::forward(std::span<const SeqChunk> batch, LogitRows rows) {
  KILN_ASSIGN(PreparedBatch prepared, prepare(batch));
  KILN_ASSIGN(Tensor logits, run(prepared, rows));
  advance_sequences(prepared.layout);
  return logits;
}

namespace {

Result<std::unique_ptr<Model>> load_model_unchecked(const std::string& model_dir, Backend& backend,
                                                    const ModelOptions& options) {
  KILN_ASSIGN(ModelConfigFile config, read_model_config(model_dir));
  auto it = registry().find(config.model_type);
  if (it == registry().end()) {
    std::string known;
    for (const auto& name : supported_model_types()) known += (known.empty() ? "" : ", ") + name;
    return make_error("unsupported model_type '{}' in {} (supported: {})", config.model_type, config.path, known);
  }
  KILN_ASSIGN(WeightStore weights, WeightStore::open(model_dir));
  KILN_ASSIGN(QuantizationConfig quantization, QuantizationConfig::parse(config.text, config.path));
  if (quantization.present())
    spdlog::info("{}: MLX affine quantization, {} bits in groups of {} ({} per-module settings); weights stay packed",
                 model_dir, quantization.bits(), quantization.group_size(), quantization.overrides().size());
  weights.set_quantization(std::move(quantization));
  KILN_ASSIGN(auto model, it->second(config, weights, backend, options));
  auto unused = weights.unused();
  if (!unused.empty())
    spdlog::warn("{} tensors in {} are not used by {} (first: {})", unused.size(), model_dir, config.model_type,
                 weights.describe(unused.front()));
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
