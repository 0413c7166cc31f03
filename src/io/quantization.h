// The `quantization` block of an mlx-lm config.json: default bits and group size, and per-module
// overrides that give a module its own bits / group size or leave it unquantized (false).
//
//   "quantization": {"group_size": 64, "bits": 4, "mode": "affine",
//                    "language_model.model.layers.0.mlp.down_proj": {"group_size": 64, "bits": 8},
//                    "language_model.model.layers.0.mlp.gate": false}
//
// mlx-lm also writes the same object as "quantization_config"; either is read. Module keys are
// mlx module paths; they are matched on their canonical names (see canonical_weight_name).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"

namespace kiln {

struct QuantSpec {
  bool quantized = false;
  int bits = 0;
  int group_size = 0;
};

class QuantizationConfig {
 public:
  // From a (text) config object; an absent block gives a config under which nothing is quantized.
  static Result<QuantizationConfig> parse(const nlohmann::json& config, const std::string& where);

  bool present() const { return present_; }
  int bits() const { return bits_; }
  int group_size() const { return group_size_; }
  // The setting of a module by canonical name, e.g. "layers.0.mlp.gate_proj".
  QuantSpec module(const std::string& canonical_module) const;
  const std::map<std::string, QuantSpec>& overrides() const { return overrides_; }

 private:
  bool present_ = false;
  int bits_ = 4;
  int group_size_ = 64;
  std::map<std::string, QuantSpec> overrides_;
};

}  // namespace kiln
