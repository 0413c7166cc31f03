// The sampling a model's authors ship in its generation_config.json (temperature, top_k, top_p,
// min_p, repetition_penalty). What a request or a command line leaves unset takes these values, as
// vLLM does by default; do_sample is not read (an OpenAI-style request samples unless its
// temperature is 0).
#pragma once

#include <optional>
#include <string>

#include "core/status.h"
#include "runtime/sampler.h"

namespace kiln {

struct SamplingDefaults {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;

  bool empty() const;
  // "temperature 0.6, top_k 20, top_p 0.95"
  std::string describe() const;
  // Sets every setting these defaults hold.
  void apply(SamplingParams& params) const;
};

// MODEL_DIR/generation_config.json's sampling keys; none when the file is absent. A key whose value
// is out of range or not a number is left out with a warning naming it; a file that is not a JSON
// object is an error.
Result<SamplingDefaults> load_sampling_defaults(const std::string& model_dir);

}  // namespace kiln
