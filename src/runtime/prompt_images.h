// A prompt's images as a model runs them: where each image's soft tokens sit in the prompt, their
// encoding on the model's device, and the rotary positions its family lays out for the whole
// prompt (Qwen 3.5's multimodal RoPE). Chunks of the prompt then carry the soft tokens and the
// positions that fall in them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "models/family.h"
#include "models/model.h"

namespace kiln {

struct PromptImages {
  struct Placed {
    int64_t offset = 0;  // the prompt token its soft tokens start at
    Tensor rows;         // [soft tokens, hidden] on the model's backend
  };
  std::vector<Placed> images;  // by offset
  int64_t prompt_tokens = 0;
  int64_t rope_axes = 0;           // of `positions`
  std::vector<int32_t> positions;  // [rope_axes × prompt tokens], axis-major; empty: token indices
  bool whole = false;              // an image's span must stay in one chunk (bidirectional attention)
  bool empty() const { return images.empty() && positions.empty(); }
};

// Encodes `images` (in prompt order) on `model` and places them at the runs of the processor's
// placeholder token in `ids` (already expanded: a run per image, of its soft tokens); lays out the
// prompt's rotary positions where the family does. An error, one line, when runs and images differ.
Result<PromptImages> place_images(Model& model, const ModelFamily& family, const ModelConfigFile& config,
                                  const ImagePlaceholder& placeholder, std::span<const int32_t> ids,
                                  std::span<const ProcessedImage> images);

// What prompt tokens [begin, end) carry: their soft tokens (offsets within the chunk) and their
// columns of the laid-out positions.
struct ChunkInputs {
  std::vector<SoftTokens> soft;
  std::vector<int32_t> positions;
};
ChunkInputs chunk_inputs(const PromptImages& images, int64_t begin, int64_t end);

// Where a chunk of at most `max_tokens` from `begin` ends (at most `end`): before an image that
// must stay whole and would not fit. An error when one image's span alone is longer than a chunk.
Result<int64_t> chunk_end(const PromptImages& images, int64_t begin, int64_t end, int64_t max_tokens);

// run_tokens (prefill.h) for a prompt with images.
Result<Tensor> run_prompt(Model& model, SequenceState& state, std::span<const int32_t> ids, const PromptImages& images,
                          int64_t chunk, LogitRows rows);

}  // namespace kiln
