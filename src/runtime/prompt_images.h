// A prompt's images as a model runs them. Two steps, so that a client can do the first where the
// request arrives and a runtime the second where the model runs:
//  - the layout (CPU only): each image processed by its family's processor, where its soft tokens
//    sit in the prompt, the rotary positions the family lays out for the whole prompt (Qwen 3.5's
//    multimodal RoPE), and a hash of each image's content for the prefix cache;
//  - the encoding on the model's device.
// Chunks of the prompt then carry the soft tokens and the positions that fall in them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "image/image.h"
#include "models/family.h"
#include "models/image_processor.h"
#include "models/model.h"

namespace kiln {

struct ImageLayout {
  std::vector<ProcessedImage> images;  // in prompt order
  std::vector<int64_t> offsets;        // the prompt token each image's soft tokens start at
  std::vector<uint64_t> hashes;        // each image's content: its pixels and grid
  int64_t prompt_tokens = 0;
  int64_t rope_axes = 0;           // of `positions`
  std::vector<int32_t> positions;  // [rope_axes × prompt tokens], axis-major; empty: token indices
  bool whole = false;              // an image's span must stay in one chunk (bidirectional attention)
  bool empty() const { return images.empty() && positions.empty(); }
};

// Finds the runs of the processor's placeholder token in `ids` (already expanded: a run per image,
// of its soft tokens) and lays out the prompt's rotary positions where the model needs them. An
// error, one line, when runs and images differ.
Result<ImageLayout> lay_out_images(const BatchNeeds& needs, const ModelFamily& family, const ModelConfigFile& config,
                                   const ImagePlaceholder& placeholder, std::span<const int32_t> ids,
                                   std::vector<ProcessedImage> images);

// The key a prompt with images has in the prefix cache: its ids, with each image's run replaced by
// values drawn from the image's hash (negative, so never a token id). Two prompts share a key prefix
// only where their images are the same.
std::vector<int32_t> image_cache_key(std::span<const int32_t> ids, const ImageLayout& layout);

struct PromptImages {
  struct Placed {
    int64_t offset = 0;  // the prompt token its soft tokens start at
    int64_t tokens = 0;  // its soft tokens
    Tensor rows;         // [tokens, hidden] on the model's backend; empty when not encoded
  };
  std::vector<Placed> images;  // by offset
  int64_t prompt_tokens = 0;
  int64_t rope_axes = 0;
  std::vector<int32_t> positions;
  bool whole = false;
  bool empty() const { return images.empty() && positions.empty(); }
};

// Encodes the layout's images on `model`, all but those that end at or before token `from` (a
// prompt resumed from the prefix cache runs only the rest).
Result<PromptImages> encode_images(Model& model, const ImageLayout& layout, int64_t from = 0);

// The same in steps: each image placed with nothing encoded, then the images that overlap prompt
// tokens [begin, end) encoded when a chunk is about to run them (a runtime that batches prompts
// encodes a prompt's images as it reaches them, not all at once when the prompt arrives).
PromptImages images_to_encode(const ImageLayout& layout);
Status encode_range(Model& model, const ImageLayout& layout, PromptImages& images, int64_t begin, int64_t end);

// A model directory's image front end: its family's image processor, and the layout of a prompt's
// images for that model. What every client that takes images (the CLI, the server) goes through.
class ImageInput {
 public:
  // None (null, no error) for a model that runs no images: a family without an image processor, or
  // a checkpoint without a vision tower (`needs.hidden` is 0).
  static Result<std::unique_ptr<ImageInput>> load(const std::string& model_dir, const ModelConfigFile& config,
                                                  const ModelFamily& family, const BatchNeeds& needs,
                                                  ImageLimits limits = {});

  // An image file's bytes decoded (JPEG, PNG, WebP, GIF) and processed; errors name `name`.
  Result<ProcessedImage> read(std::span<const uint8_t> bytes, const std::string& name) const;
  Result<ProcessedImage> read_file(const std::string& path) const;

  const ImagePlaceholder& placeholder() const { return processor_->placeholder(); }
  const ImageProcessor& processor() const { return *processor_; }
  const ImageLimits& limits() const { return limits_; }

  // expand_image_placeholders with this model's placeholder.
  Result<std::string> expand(std::string_view text, std::span<const ProcessedImage> images) const;
  // lay_out_images for this model.
  Result<ImageLayout> lay_out(std::span<const int32_t> ids, std::vector<ProcessedImage> images) const;

 private:
  ImageInput() = default;
  std::unique_ptr<ImageProcessor> processor_;
  const ModelFamily* family_ = nullptr;
  ModelConfigFile config_;
  BatchNeeds needs_;
  ImageLimits limits_;
};

// Both steps at once (`kiln logits --image`).
Result<PromptImages> place_images(Model& model, const ModelFamily& family, const ModelConfigFile& config,
                                  const ImagePlaceholder& placeholder, std::span<const int32_t> ids,
                                  std::vector<ProcessedImage> images);

// What prompt tokens [begin, end) carry: their soft tokens (offsets within the chunk) and their
// columns of the laid-out positions. Every image that overlaps them must be encoded.
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
