// Resizing and pixel scaling as transformers' torchvision backend does them for the Gemma 4 and
// Qwen 3.5 processors. Both resize the uint8 image tensor (PIL's pil_to_tensor) with
// torchvision.transforms.v2.functional.resize(..., BICUBIC, antialias=True); on the CPU torchvision
// hands uint8 straight to torch's _upsample_bicubic2d_aa, which runs Pillow's separable resampling
// in fixed point: per axis, the Keys cubic (a = -0.5) stretched by the scale when shrinking,
// weights normalised in double and rounded to int16 at the most bits the largest weight allows,
// the width pass first into uint8, then the height pass, each output rounded (+half, shift) and
// clamped to 0..255. An axis whose size does not change is not touched.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "image/image.h"

namespace kiln {

// The image at width × height (each at least 1).
RgbImage resize_bicubic_antialias(const RgbImage& image, int64_t width, int64_t height);

// The per-axis filter resize_bicubic_antialias applies, for tests: for each output index the first
// input index, the int16 weights, and the precision (bits) they are scaled by.
struct ResampleTaps {
  std::vector<int64_t> first;
  std::vector<std::vector<int16_t>> weights;
  int precision = 0;
};
ResampleTaps bicubic_antialias_taps(int64_t in_size, int64_t out_size);

// Channel-first float pixels [3, height, width], torchvision's layout after pil_to_tensor.
struct PixelPlanes {
  int64_t width = 0;
  int64_t height = 0;
  std::vector<float> values;  // [3, height, width]
  float at(int c, int64_t y, int64_t x) const { return values[size_t((c * height + y) * width + x)]; }
};

// TorchvisionBackend._rescale_and_normalize in float32: with both rescale and normalize, the mean
// and std are scaled by 1 / rescale_factor and applied to the uint8 values, (x - mean') / std';
// with rescale alone, x · rescale_factor; with neither, x.
struct PixelScaling {
  bool rescale = true;
  double rescale_factor = 1.0 / 255.0;
  bool normalize = false;
  std::array<double, 3> mean{0, 0, 0};
  std::array<double, 3> std{1, 1, 1};
};
PixelPlanes scale_pixels(const RgbImage& image, const PixelScaling& scaling);

}  // namespace kiln
