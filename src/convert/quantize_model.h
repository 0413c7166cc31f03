// Quantizes a bf16/f16/f32 model directory into MLX's affine format, laid out as mlx-lm's convert
// writes it: mlx-lm's tensor names and expert stacks, packed weights with scales and biases,
// config.json with the `quantization` block (and its `quantization_config` mirror), shards of at
// most ~5 GB with an index, and the tokenizer and generation files copied.
//
// What is quantized follows mlx-lm: every Linear, Embedding and expert (switch) projection whose
// input size the group size divides; norms, conv weights and 1-D parameters stay as they are. The
// model families' own choices are kept (Gemma 4's router.proj and Qwen 3.5 MoE's router and shared
// expert gate at 8 bits, group 64); overrides then set bits per module glob.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace kiln {

struct QuantOverride {
  std::string glob;    // fnmatch pattern over the module path, e.g. "*.mlp.down_proj"
  int bits = 0;        // 0: leave unquantized
  int group_size = 0;  // 0: the default group size
};

// "GLOB=BITS" or "GLOB=BITS:GROUP"; BITS may be "none" (or 0) to keep the module unquantized.
Result<QuantOverride> parse_quant_override(const std::string& text);

struct QuantizeOptions {
  int bits = 4;
  int group_size = 64;
  std::vector<QuantOverride> overrides;  // the last matching one wins
  size_t shard_bytes = size_t(5) << 30;
  int threads = 0;
};

struct QuantizeReport {
  int quantized_modules = 0;
  // left unquantized because their group size does not divide their input size (as mlx-lm does)
  int indivisible_modules = 0;
  std::string indivisible_example;  // the first of them
  int64_t params = 0;
  size_t bytes_written = 0;
  double bits_per_weight = 0;
};

Result<QuantizeReport> quantize_model_dir(const std::string& in_dir, const std::string& out_dir,
                                          const QuantizeOptions& options);

}  // namespace kiln
