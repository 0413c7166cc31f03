#include "image/resize.h"

#include <algorithm>
#include <cmath>

namespace kiln {

namespace {

// Keys' cubic convolution with a = -0.5 (PIL's bicubic; torch's aa_filter for bicubic).
double keys_cubic(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0.0;
}

}  // namespace

ResampleTaps bicubic_antialias_taps(int64_t in_size, int64_t out_size) {
  // torch: area_pixel_compute_scale (align_corners false, no scale given) and
  // _compute_indices_min_size_weights_aa in double, then _compute_index_ranges_int16_weights
  const double scale = double(in_size) / double(out_size);
  const double support = scale >= 1.0 ? 2.0 * scale : 2.0;  // interp_size 4, times 0.5
  const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
  ResampleTaps taps;
  std::vector<std::vector<double>> weights(static_cast<size_t>(out_size));
  double wt_max = 0.0;
  for (int64_t i = 0; i < out_size; ++i) {
    const double center = scale * (double(i) + 0.5);
    const int64_t xmin = std::max(int64_t(center - support + 0.5), int64_t(0));
    const int64_t xsize = std::max(std::min(int64_t(center + support + 0.5), in_size) - xmin, int64_t(0));
    std::vector<double>& w = weights[size_t(i)];
    w.resize(size_t(xsize));
    double total = 0.0;
    for (int64_t j = 0; j < xsize; ++j)
      total += w[size_t(j)] = keys_cubic((double(j + xmin) - center + 0.5) * invscale);
    if (total != 0.0)
      for (double& v : w) wt_max = std::max(wt_max, v /= total);
    taps.first.push_back(xmin);
  }
  int precision = 0;
  for (; precision < 22; ++precision)
    if (int(0.5 + wt_max * double(1 << (precision + 1))) >= (1 << 15)) break;
  taps.precision = precision;
  for (const auto& w : weights) {
    std::vector<int16_t> q;
    for (double v : w) {
      v *= double(1 << precision);
      q.push_back(int16_t(v < 0 ? int(-0.5 + v) : int(0.5 + v)));
    }
    taps.weights.push_back(std::move(q));
  }
  return taps;
}

namespace {

inline uint8_t round_shift(int32_t acc, int precision) {
  const int32_t v = acc >> precision;
  return uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
}

RgbImage resize_width(const RgbImage& in, int64_t width) {
  const ResampleTaps taps = bicubic_antialias_taps(in.width, width);
  RgbImage out = RgbImage::blank(width, in.height);
  const int32_t half = int32_t(1) << (taps.precision - 1);
  for (int64_t y = 0; y < in.height; ++y) {
    const uint8_t* src = in.row(y);
    uint8_t* dst = out.row(y);
    for (int64_t x = 0; x < width; ++x) {
      const auto& w = taps.weights[size_t(x)];
      const uint8_t* s = src + taps.first[size_t(x)] * 3;
      for (int c = 0; c < 3; ++c) {
        int32_t acc = half;
        for (size_t k = 0; k < w.size(); ++k) acc += int32_t(s[k * 3 + c]) * w[k];
        dst[x * 3 + c] = round_shift(acc, taps.precision);
      }
    }
  }
  return out;
}

RgbImage resize_height(const RgbImage& in, int64_t height) {
  const ResampleTaps taps = bicubic_antialias_taps(in.height, height);
  RgbImage out = RgbImage::blank(in.width, height);
  const int32_t half = int32_t(1) << (taps.precision - 1);
  const int64_t row = in.width * 3;
  for (int64_t y = 0; y < height; ++y) {
    const auto& w = taps.weights[size_t(y)];
    const uint8_t* src = in.row(taps.first[size_t(y)]);
    uint8_t* dst = out.row(y);
    for (int64_t i = 0; i < row; ++i) {
      int32_t acc = half;
      for (size_t k = 0; k < w.size(); ++k) acc += int32_t(src[int64_t(k) * row + i]) * w[k];
      dst[i] = round_shift(acc, taps.precision);
    }
  }
  return out;
}

}  // namespace

RgbImage resize_bicubic_antialias(const RgbImage& image, int64_t width, int64_t height) {
  if (width == image.width && height == image.height) return image;
  if (width == image.width) return resize_height(image, height);
  RgbImage wide = resize_width(image, width);
  if (height == image.height) return wide;
  return resize_height(wide, height);
}

PixelPlanes scale_pixels(const RgbImage& image, const PixelScaling& s) {
  PixelPlanes out{image.width, image.height, std::vector<float>(size_t(3 * image.width * image.height))};
  float mul[3], sub[3], div[3];
  for (int c = 0; c < 3; ++c) {
    if (s.normalize && s.rescale) {
      // torch.tensor(mean) * (1.0 / rescale_factor): float32 times a scalar cast to float32
      const float inv = float(1.0 / s.rescale_factor);
      sub[c] = float(s.mean[c]) * inv, div[c] = float(s.std[c]) * inv, mul[c] = 1.0f;
    } else if (s.normalize) {
      sub[c] = float(s.mean[c]), div[c] = float(s.std[c]), mul[c] = 1.0f;
    } else {
      sub[c] = 0.0f, div[c] = 1.0f, mul[c] = s.rescale ? float(s.rescale_factor) : 1.0f;
    }
  }
  const size_t plane = size_t(image.width * image.height);
  for (size_t i = 0; i < plane; ++i)
    for (int c = 0; c < 3; ++c) {
      const float x = float(image.pixels[3 * i + size_t(c)]);
      out.values[size_t(c) * plane + i] = s.normalize ? (x - sub[c]) / div[c] : x * mul[c];
    }
  return out;
}

}  // namespace kiln
