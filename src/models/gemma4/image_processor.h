// Gemma 4's image processor: transformers' Gemma4ImageProcessor (gemma4) and
// Gemma4UnifiedImageProcessor (gemma4_unified, the 12B), torchvision backend, and Gemma4Processor's
// placeholder expansion ("<|image|>" becomes "<|image>" + "<|image|>" × soft tokens + "<image|>").
//
// The image is resized, keeping its aspect ratio, to the largest size whose sides are multiples of
// pooling_kernel_size × patch_size and that holds at most max_soft_tokens × pooling_kernel_size²
// patches; scaled to [0, 1] (no normalisation by default); and cut into patch_size² × 3 patches,
// row-major, each patch's values (row, column, channel). gemma4_unified then merges each
// k × k block of patches into one (k·patch_size)² × 3 patch, which is the same as cutting at
// k·patch_size directly.
//
// Unlike HF, only real patches are kept: HF pads pixel_values to max_soft_tokens × k² rows (k² = 1
// for unified) with zeros and image_position_ids with -1; kiln passes the grid instead. For
// gemma4, grid = {patch rows, patch cols} of the 16-pixel patches, HF's position of row i being
// (i % cols, i / cols) as (x, y); soft_tokens = rows × cols / k². For gemma4_unified, grid = the
// merged patches' {rows, cols} and soft_tokens = rows × cols.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <utility>

#include "image/resize.h"
#include "io/config.h"
#include "models/image_processor.h"

namespace kiln {

struct Gemma4ImageSettings {
  int64_t patch_size = 16;
  int64_t max_soft_tokens = 280;  // one of 70, 140, 280, 560, 1120
  int64_t pooling_kernel_size = 3;
  bool do_resize = true;
  PixelScaling scaling;  // rescale by 1/255, no normalisation
  bool unified = false;  // Gemma4UnifiedImageProcessor: k × k patches merged
};

// The settings from a processor settings object (image_processor.h), the class defaults where it
// is silent. `unified` picks the class when the object's image_processor_type does not name one.
Result<Gemma4ImageSettings> parse_gemma4_image_settings(const nlohmann::json& values, const std::string& where,
                                                        bool unified);

// get_aspect_ratio_preserving_size: the resized {height, width}; an error where HF raises one.
Result<std::pair<int64_t, int64_t>> gemma4_resized_size(int64_t height, int64_t width, const Gemma4ImageSettings& s);

std::unique_ptr<ImageProcessor> make_gemma4_image_processor(const Gemma4ImageSettings& settings,
                                                            ImagePlaceholder placeholder);

// The family's factory (ModelFamily::image_processor).
Result<std::unique_ptr<ImageProcessor>> load_gemma4_image_processor(const std::string& model_dir,
                                                                    const ModelConfigFile& config);

}  // namespace kiln
