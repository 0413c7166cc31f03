// Synthetic checkpoints: random weights of any geometry, written as a Hugging Face model
// directory, so that full-size speed can be measured without downloading a model.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"

namespace kiln {

struct SyntheticTensor {
  enum class Fill { normal, constant, uniform };
  std::string name;
  Shape shape;
  Fill fill = Fill::normal;
  float a = 0.02f;  // normal: std; constant: value; uniform: low
  float b = 0.0f;   // uniform: high
};

struct SyntheticOptions {
  DType dtype = DType::bf16;  // bf16 or f32
  uint64_t seed = 0;
  size_t shard_bytes = size_t(4) << 30;  // shards of at most this size, with an index when several
  int threads = 0;                        // 0: all cores
};

// Writes config.json (as given) and the tensors, generated in parallel and streamed to disk.
Status write_synthetic_checkpoint(const std::string& out_dir, const nlohmann::json& config,
                                  const std::vector<SyntheticTensor>& tensors, const SyntheticOptions& options);

}  // namespace kiln
