// The weights of a model directory: one safetensors file or shards listed by an index, under
// canonical names with the checkpoint's wrapper prefixes removed.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/quantization.h"
#include "io/safetensors.h"

namespace kiln {

// Canonical name of a checkpoint tensor: the wrapper prefixes "model.language_model.",
// "language_model.model.", "language_model." and "model." are dropped, so
// "model.language_model.layers.0.mlp.up_proj.weight" becomes "layers.0.mlp.up_proj.weight" and
// "model.vision_tower.encoder.x" becomes "vision_tower.encoder.x".
std::string canonical_weight_name(const std::string& checkpoint_name);

class WeightStore {
 public:
  // The weights of model.safetensors or the shards model.safetensors.index.json lists, plus the
  // sidecar files named in `sidecars` that exist in the directory (mlx conversions keep MTP heads
  // and vision towers in files of their own); a sidecar's tensors are kept apart (sidecar_of).
  static Result<WeightStore> open(const std::string& model_dir, const std::vector<std::string>& sidecars = {});

  bool has(const std::string& name) const { return entries_.count(name) > 0; }
  // The tensor, checked against the shape the config implies. Errors name the checkpoint tensor
  // and its file.
  Result<Tensor> get(const std::string& name, const Shape& expected) const;
  // The tensor whatever its shape (the caller checks it).
  Result<Tensor> get(const std::string& name) const;
  // Where a tensor came from, for messages: "'model.x.weight' in model.safetensors".
  std::string describe(const std::string& name) const;

  std::vector<std::string> names() const;
  // Names never fetched with get(); loaders report them so that nothing is ignored silently.
  std::vector<std::string> unused() const;
  // The sidecar file a tensor came from, or "" for the main files.
  std::string sidecar_of(const std::string& name) const;
  // True when the names were stored under mlx-lm's "language_model.model." prefix.
  bool mlx_prefixed() const { return mlx_prefixed_; }
  size_t total_bytes() const { return total_bytes_; }
  // Bytes of the tensors fetched with get() so far.
  size_t used_bytes() const;
  // Which modules are quantized, from config.json (set by whoever read it).
  const QuantizationConfig& quantization() const { return quantization_; }
  void set_quantization(QuantizationConfig q) { quantization_ = std::move(q); }

 private:
  struct Entry {
    std::shared_ptr<SafetensorsFile> file;
    const TensorInfo* info;
    std::string sidecar;  // the sidecar file's name, or "" for the main files
  };
  std::map<std::string, Entry> entries_;
  mutable std::set<std::string> used_;
  std::string dir_;
  bool mlx_prefixed_ = false;
  size_t total_bytes_ = 0;
  QuantizationConfig quantization_;
};

}  // namespace kiln
