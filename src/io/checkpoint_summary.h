// What a checkpoint directory holds, read from config.json and the safetensors headers only (no
// weights are read): the model type, the parameter count and how the weights are stored.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace kiln {

struct CheckpointSummary {
  std::string model_type;    // the text model's; "outer/text" when a wrapper names another
  int64_t parameters = 0;    // MLX-packed weights counted unpacked, scales and biases left out
  std::string quantization;  // "bf16", "mlx 4-bit g64", "mlx mixed 4/8-bit g64", "fp8", ...
};

// Errors name the file at fault (a missing config.json, an unreadable safetensors header).
Result<CheckpointSummary> summarize_checkpoint(const std::string& model_dir);

// 31234567 -> "31.2M", 4020000000 -> "4.02B".
std::string format_count(int64_t count);

}  // namespace kiln
