#include "models/gemma4/image_processor.h"

#include <algorithm>
#include <cmath>

namespace kiln {

namespace {

class Gemma4ImageProcessor final : public ImageProcessor {
 public:
  Gemma4ImageProcessor(const Gemma4ImageSettings& s, ImagePlaceholder placeholder)
      : ImageProcessor(std::move(placeholder)), s_(s) {}

  std::string describe() const override {
    return fmt::format("{} (max_soft_tokens {}, patch_size {}, pooling_kernel_size {})",
                       s_.unified ? "Gemma4UnifiedImageProcessor" : "Gemma4ImageProcessor", s_.max_soft_tokens,
                       s_.patch_size, s_.pooling_kernel_size);
  }

  Result<ProcessedImage> process(const RgbImage& image) const override {
    RgbImage resized;
    const RgbImage* src = &image;
    if (s_.do_resize) {
      KILN_ASSIGN(auto size, gemma4_resized_size(image.height, image.width, s_));
      if (size.first != image.height || size.second != image.width) {
        resized = resize_bicubic_antialias(image, size.second, size.first);
        src = &resized;
      }
    }
    const int64_t k = s_.pooling_kernel_size;
    // unified: the k × k merge of patch_size patches is a cut at k · patch_size
    const int64_t p = s_.unified ? k * s_.patch_size : s_.patch_size;
    if (src->height % p != 0 || src->width % p != 0)
      return make_error("a {}x{} image does not divide into {}-pixel patches (do_resize is off)", src->width,
                        src->height, p);
    const PixelPlanes planes = scale_pixels(*src, s_.scaling);
    const int64_t rows = src->height / p, cols = src->width / p, values = p * p * 3;

    ProcessedImage out;
    out.pixels = host_tensor(DType::f32, Shape{rows * cols, values});  // [patches, p·p·3]
    float* dst = out.pixels.data_as<float>();
    for (int64_t py = 0; py < rows; ++py)
      for (int64_t px = 0; px < cols; ++px)
        for (int64_t dy = 0; dy < p; ++dy)
          for (int64_t dx = 0; dx < p; ++dx)
            for (int c = 0; c < 3; ++c) *dst++ = planes.at(c, py * p + dy, px * p + dx);
    out.grid = {rows, cols};
    out.soft_tokens = s_.unified ? rows * cols : rows * cols / (k * k);
    return out;
  }

 private:
  Gemma4ImageSettings s_;
};

}  // namespace

Result<Gemma4ImageSettings> parse_gemma4_image_settings(const nlohmann::json& values, const std::string& where,
                                                        bool unified) {
  ConfigReader r(values, where);
  Gemma4ImageSettings s;
  const std::string type = r.get_string("image_processor_type", "");
  if (type.rfind("Gemma4UnifiedImageProcessor", 0) == 0) {
    unified = true;
  } else if (type.rfind("Gemma4ImageProcessor", 0) == 0) {
    unified = false;
  } else if (!type.empty()) {
    r.fail(fmt::format("image_processor_type {} is not a Gemma 4 image processor", type));
  }
  s.unified = unified;
  s.patch_size = r.get_int("patch_size", s.patch_size);
  s.max_soft_tokens = r.get_int("max_soft_tokens", s.max_soft_tokens);
  s.pooling_kernel_size = r.get_int("pooling_kernel_size", s.pooling_kernel_size);
  s.do_resize = r.get_bool("do_resize", s.do_resize);
  KILN_TRY(r.status());
  KILN_TRY(read_pixel_scaling(r, s.scaling));
  KILN_TRY(check_bicubic(r));
  static constexpr int64_t kSupported[] = {70, 140, 280, 560, 1120};
  if (std::find(std::begin(kSupported), std::end(kSupported), s.max_soft_tokens) == std::end(kSupported))
    return make_error("{}: max_soft_tokens must be one of 70, 140, 280, 560, 1120, got {}", where, s.max_soft_tokens);
  if (s.patch_size <= 0 || s.pooling_kernel_size <= 0)
    return make_error("{}: patch_size and pooling_kernel_size must be positive", where);
  return s;
}

Result<std::pair<int64_t, int64_t>> gemma4_resized_size(int64_t height, int64_t width, const Gemma4ImageSettings& s) {
  // get_aspect_ratio_preserving_size, in Python's double arithmetic
  const int64_t k = s.pooling_kernel_size, patch = s.patch_size;
  const int64_t max_patches = s.max_soft_tokens * k * k;
  const int64_t target_px = max_patches * patch * patch;
  const double factor = std::sqrt(double(target_px) / double(height * width));
  const int64_t side = k * patch;
  int64_t th = int64_t(std::floor(factor * double(height) / double(side))) * side;
  int64_t tw = int64_t(std::floor(factor * double(width) / double(side))) * side;
  if (th == 0 && tw == 0)
    return make_error("a {}x{} image would resize to 0x0 (sides must be multiples of {})", width, height, side);
  const int64_t max_side = (max_patches / (k * k)) * side;
  if (th == 0) {
    th = side;
    tw = std::min(int64_t(std::floor(double(width) / double(height))) * side, max_side);
  } else if (tw == 0) {
    tw = side;
    th = std::min(int64_t(std::floor(double(height) / double(width))) * side, max_side);
  }
  if (th * tw > target_px)
    return make_error("a {}x{} image would resize to {}x{}, more than {} patches of {} pixels", width, height, tw, th,
                      max_patches, patch);
  return std::pair{th, tw};
}

std::unique_ptr<ImageProcessor> make_gemma4_image_processor(const Gemma4ImageSettings& settings,
                                                            ImagePlaceholder placeholder) {
  return std::make_unique<Gemma4ImageProcessor>(settings, std::move(placeholder));
}

Result<std::unique_ptr<ImageProcessor>> load_gemma4_image_processor(const std::string& model_dir,
                                                                    const ModelConfigFile& config) {
  if (!config.root.contains("vision_config"))
    return make_error("{} has no vision_config: this model takes no images", config.path);
  KILN_ASSIGN(ImageProcessorSettings settings, read_image_processor_settings(model_dir));
  const bool unified = config.outer_model_type == "gemma4_unified" || config.model_type == "gemma4_unified_text";
  const std::string where = settings.source.empty() ? model_dir + " (no processor settings)" : settings.source;
  KILN_ASSIGN(Gemma4ImageSettings s, parse_gemma4_image_settings(settings.values, where, unified));
  ImagePlaceholder placeholder{.token = tokenizer_token(model_dir, "image_token", "<|image|>"),
                               .begin = tokenizer_token(model_dir, "boi_token", "<|image>"),
                               .end = tokenizer_token(model_dir, "eoi_token", "<image|>")};
  KILN_ASSIGN(placeholder.token_id, image_token_id(config, 258880));
  return make_gemma4_image_processor(s, std::move(placeholder));
}

}  // namespace kiln
