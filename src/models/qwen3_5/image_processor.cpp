#include "models/qwen3_5/image_processor.h"

#include <algorithm>
#include <cfenv>
#include <cmath>

namespace kiln {

namespace {

class Qwen35ImageProcessor final : public ImageProcessor {
 public:
  Qwen35ImageProcessor(const Qwen35ImageSettings& s, ImagePlaceholder placeholder)
      : ImageProcessor(std::move(placeholder)), s_(s) {}

  std::string describe() const override {
    return fmt::format("Qwen2VLImageProcessor (patch_size {}, merge_size {}, temporal_patch_size {}, pixels {}..{})",
                       s_.patch_size, s_.merge_size, s_.temporal_patch_size, s_.min_pixels, s_.max_pixels);
  }

  Result<ProcessedImage> process(const RgbImage& image) const override {
    RgbImage resized;
    const RgbImage* src = &image;
    if (s_.do_resize) {
      KILN_ASSIGN(auto size, qwen3_5_resized_size(image.height, image.width, s_));
      if (size.first != image.height || size.second != image.width) {
        resized = resize_bicubic_antialias(image, size.second, size.first);
        src = &resized;
      }
    }
    const int64_t p = s_.patch_size, m = s_.merge_size, tp = s_.temporal_patch_size;
    if (src->height % (p * m) != 0 || src->width % (p * m) != 0)
      return make_error("a {}x{} image does not divide into {}-pixel blocks (do_resize is off)", src->width,
                        src->height, p * m);
    const PixelPlanes planes = scale_pixels(*src, s_.scaling);
    const int64_t gh = src->height / p, gw = src->width / p, values = 3 * tp * p * p;

    ProcessedImage out;
    out.pixels = host_tensor(DType::f32, Shape{gh * gw, values});  // [patches, 3 · tp · p · p]
    float* dst = out.pixels.data_as<float>();
    for (int64_t bh = 0; bh < gh / m; ++bh)
      for (int64_t bw = 0; bw < gw / m; ++bw)
        for (int64_t mh = 0; mh < m; ++mh)
          for (int64_t mw = 0; mw < m; ++mw) {
            const int64_t y0 = (bh * m + mh) * p, x0 = (bw * m + mw) * p;
            for (int c = 0; c < 3; ++c)
              for (int64_t t = 0; t < tp; ++t)  // the frame repeated: the image is its only frame
                for (int64_t dy = 0; dy < p; ++dy)
                  for (int64_t dx = 0; dx < p; ++dx) *dst++ = planes.at(c, y0 + dy, x0 + dx);
          }
    out.grid = {1, gh, gw};
    out.soft_tokens = gh * gw / (m * m);
    return out;
  }

 private:
  Qwen35ImageSettings s_;
};

// Python's round(): halves to even (the default rounding mode of nearbyint).
int64_t python_round(double x) {
  return int64_t(std::nearbyint(x));
}

}  // namespace

Result<Qwen35ImageSettings> parse_qwen3_5_image_settings(const nlohmann::json& values, const std::string& where) {
  ConfigReader r(values, where);
  Qwen35ImageSettings s;
  const std::string type = r.get_string("image_processor_type", "");
  if (!type.empty() && type.rfind("Qwen2VLImageProcessor", 0) != 0)
    r.fail(fmt::format("image_processor_type {} is not Qwen2VLImageProcessor", type));
  s.patch_size = r.get_int("patch_size", s.patch_size);
  s.temporal_patch_size = r.get_int("temporal_patch_size", s.temporal_patch_size);
  s.merge_size = r.get_int("merge_size", s.merge_size);
  s.do_resize = r.get_bool("do_resize", s.do_resize);
  // __init__: size (or the class's), then min_pixels / max_pixels over it
  if (r.has("size")) {
    const nlohmann::json& size = r.json().at("size");
    if (!size.is_object()) return make_error("{}: size must be an object", where);
    ConfigReader sr(size, where + " size");
    s.min_pixels = sr.get_int("shortest_edge", s.min_pixels);
    s.max_pixels = sr.get_int("longest_edge", s.max_pixels);
    KILN_TRY(sr.status());
  }
  s.min_pixels = r.get_int("min_pixels", s.min_pixels);
  s.max_pixels = r.get_int("max_pixels", s.max_pixels);
  KILN_TRY(r.status());
  KILN_TRY(read_pixel_scaling(r, s.scaling));
  KILN_TRY(check_bicubic(r));
  if (s.patch_size <= 0 || s.merge_size <= 0 || s.temporal_patch_size <= 0)
    return make_error("{}: patch_size, merge_size and temporal_patch_size must be positive", where);
  if (s.min_pixels <= 0 || s.max_pixels < s.min_pixels)
    return make_error("{}: the pixel range {}..{} is empty", where, s.min_pixels, s.max_pixels);
  return s;
}

Result<std::pair<int64_t, int64_t>> qwen3_5_resized_size(int64_t height, int64_t width, const Qwen35ImageSettings& s) {
  // smart_resize, in Python's double arithmetic
  const int64_t factor = s.patch_size * s.merge_size;
  const double ratio = double(std::max(height, width)) / double(std::min(height, width));
  if (ratio > 200)
    return make_error("a {}x{} image has an aspect ratio of {:.1f}, over smart_resize's 200", width, height, ratio);
  int64_t h = python_round(double(height) / double(factor)) * factor;
  int64_t w = python_round(double(width) / double(factor)) * factor;
  if (h * w > s.max_pixels) {
    const double beta = std::sqrt(double(height * width) / double(s.max_pixels));
    h = std::max(factor, int64_t(std::floor(double(height) / beta / double(factor))) * factor);
    w = std::max(factor, int64_t(std::floor(double(width) / beta / double(factor))) * factor);
  } else if (h * w < s.min_pixels) {
    const double beta = std::sqrt(double(s.min_pixels) / double(height * width));
    h = int64_t(std::ceil(double(height) * beta / double(factor))) * factor;
    w = int64_t(std::ceil(double(width) * beta / double(factor))) * factor;
  }
  return std::pair{h, w};
}

std::unique_ptr<ImageProcessor> make_qwen3_5_image_processor(const Qwen35ImageSettings& settings,
                                                             ImagePlaceholder placeholder) {
  return std::make_unique<Qwen35ImageProcessor>(settings, std::move(placeholder));
}

Result<std::unique_ptr<ImageProcessor>> load_qwen3_5_image_processor(const std::string& model_dir,
                                                                     const ModelConfigFile& config) {
  if (!config.root.contains("vision_config"))
    return make_error("{} has no vision_config: this model takes no images", config.path);
  KILN_ASSIGN(ImageProcessorSettings settings, read_image_processor_settings(model_dir));
  const std::string where = settings.source.empty() ? model_dir + " (no processor settings)" : settings.source;
  KILN_ASSIGN(Qwen35ImageSettings s, parse_qwen3_5_image_settings(settings.values, where));
  ImagePlaceholder placeholder{.token = tokenizer_token(model_dir, "image_token", "<|image_pad|>")};
  KILN_ASSIGN(placeholder.token_id, image_token_id(config, 248056));
  return make_qwen3_5_image_processor(s, std::move(placeholder));
}

}  // namespace kiln
