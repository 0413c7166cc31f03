// Qwen 3.5's image processor: transformers' Qwen2VLImageProcessor (the class AutoImageProcessor maps
// qwen3_5 and qwen3_5_moe to), torchvision backend, and Qwen3VLProcessor's placeholder expansion
// ("<|image_pad|>" repeated soft-token times; the chat template writes <|vision_start|> and
// <|vision_end|> around it).
//
// smart_resize picks a size whose sides are multiples of patch_size × merge_size and whose area
// lies within [min_pixels, max_pixels] (size.shortest_edge / size.longest_edge), nearest to the
// original's aspect ratio. The image is resized, rescaled and normalised with image_mean /
// image_std, repeated temporal_patch_size times (a still image is one frame), and cut into patches
// ordered (t, block row, block col, row in block, col in block) with merge_size × merge_size
// blocks, each patch's values ordered (channel, frame, row, column): HF's
// view(..., grid_h / m, m, p, grid_w / m, m, p).permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9).
// grid = {t, h, w} in patches (t = 1 for an image); soft_tokens = t · h · w / merge_size².
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <utility>

#include "image/resize.h"
#include "io/config.h"
#include "models/image_processor.h"

namespace kiln {

struct Qwen35ImageSettings {
  int64_t patch_size = 14;
  int64_t temporal_patch_size = 2;
  int64_t merge_size = 2;
  int64_t min_pixels = 56 * 56;         // size.shortest_edge
  int64_t max_pixels = 28 * 28 * 1280;  // size.longest_edge
  bool do_resize = true;
  // OPENAI_CLIP_MEAN / OPENAI_CLIP_STD, rescale by 1/255
  PixelScaling scaling{.rescale = true,
                       .rescale_factor = 1.0 / 255.0,
                       .normalize = true,
                       .mean = {0.48145466, 0.4578275, 0.40821073},
                       .std = {0.26862954, 0.26130258, 0.27577711}};
};

Result<Qwen35ImageSettings> parse_qwen3_5_image_settings(const nlohmann::json& values, const std::string& where);

// smart_resize: the resized {height, width}; an error where HF raises one.
Result<std::pair<int64_t, int64_t>> qwen3_5_resized_size(int64_t height, int64_t width, const Qwen35ImageSettings& s);

std::unique_ptr<ImageProcessor> make_qwen3_5_image_processor(const Qwen35ImageSettings& settings,
                                                             ImagePlaceholder placeholder);

// The family's factory (ModelFamily::image_processor).
Result<std::unique_ptr<ImageProcessor>> load_qwen3_5_image_processor(const std::string& model_dir,
                                                                     const ModelConfigFile& config);

}  // namespace kiln
