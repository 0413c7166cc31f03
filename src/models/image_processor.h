// The image processor of a model family: what the Hugging Face image processor class does to an
// image (resize, rescale and normalise, cut into patches in its order) and what the family's HF
// *processor* does to the prompt (each image placeholder the chat template wrote becomes the run of
// soft tokens the image fills). A family makes one from a model directory through
// ModelFamily::image_processor (family.h).
//
// Settings are read as transformers' AutoImageProcessor reads them: the "image_processor" object of
// processor_config.json when there is one, else preprocessor_config.json, and the class defaults
// for every key neither names. The image-token id comes from config.json (image_token_id), the
// token strings from tokenizer_config.json (image_token, boi_token, eoi_token), each with the
// family's default where the file is silent.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "image/image.h"
#include "image/resize.h"
#include "io/config.h"
#include "models/model.h"

namespace kiln {

// How an image's place in a prompt is written.
struct ImagePlaceholder {
  // What the chat template writes for an image, and the soft token repeated in its place:
  // Gemma 4 "<|image|>", Qwen 3.5 "<|image_pad|>".
  std::string token;
  int32_t token_id = -1;
  // Written around the run by the processor (Gemma 4: "<|image>" and "<image|>"); empty where the
  // chat template writes the frame itself (Qwen 3.5's <|vision_start|>, <|vision_end|>).
  std::string begin, end;
};

class ImageProcessor {
 public:
  virtual ~ImageProcessor() = default;

  // The image as the HF image processor leaves it: pixels [patches, values per patch] in the
  // class's patch order, the grid, and the soft tokens it fills in the prompt.
  virtual Result<ProcessedImage> process(const RgbImage& image) const = 0;

  // One line for logs: the class and its settings.
  virtual std::string describe() const = 0;

  const ImagePlaceholder& placeholder() const { return placeholder_; }

 protected:
  explicit ImageProcessor(ImagePlaceholder placeholder) : placeholder_(std::move(placeholder)) {}

 private:
  ImagePlaceholder placeholder_;
};

// The rendered chat text with the i-th placeholder replaced by images[i]'s run (begin, the token
// soft_tokens times, end), as the HF processor's replace_image_token does it. An error, one line,
// when the text holds a different number of placeholders than there are images.
Result<std::string> expand_image_placeholders(std::string_view text, const ImagePlaceholder& placeholder,
                                              std::span<const ProcessedImage> images);

// The reverse check on already-expanded ids (`kiln logits --ids ... --image ...`): the maximal runs
// of the image token, matched in order to the images. Returns each image's first token offset; an
// error, one line, when the number of runs or a run's length differs from the images'.
Result<std::vector<int64_t>> find_image_runs(std::span<const int32_t> ids, const ImagePlaceholder& placeholder,
                                             std::span<const ProcessedImage> images);

// The image processor's settings in a model directory (see the top of this file): the JSON object,
// empty when the directory has neither file, and which file it came from ("" for none).
struct ImageProcessorSettings {
  nlohmann::json values = nlohmann::json::object();
  std::string source;
};
Result<ImageProcessorSettings> read_image_processor_settings(const std::string& model_dir);

// tokenizer_config.json's string value for `key` in a model directory, or `fallback`.
std::string tokenizer_token(const std::string& model_dir, const std::string& key, const std::string& fallback);

// Helpers for the families' processors.
// do_rescale, rescale_factor, do_normalize, image_mean, image_std (three numbers, or one for all
// channels) into `scaling`, keeping its values for keys the settings do not name.
Status read_pixel_scaling(ConfigReader& settings, PixelScaling& scaling);
// `resample` must be PIL's BICUBIC (3), the only filter kiln implements; absent is fine.
Status check_bicubic(ConfigReader& settings);
// config.json's image_token_id (top level, or text_config), else `fallback`.
Result<int32_t> image_token_id(const ModelConfigFile& config, int32_t fallback);

}  // namespace kiln
