// The image floor's per-format decoders (jpeg.cpp, png.cpp, webp.cpp, gif.cpp), used by decode.cpp.
// Each returns the stored image as PIL's convert("RGB") leaves it, before any orientation, plus the
// metadata that carries an orientation. Errors are the bare reason ("truncated", "corrupt: ...");
// decode.cpp puts the image's name and format in front.
#pragma once

#include <span>
#include <string>

#include "core/status.h"
#include "image/image.h"

namespace kiln::image_detail {

struct Decoded {
  RgbImage image;
  std::string exif;  // a TIFF block, with or without the "Exif\0\0" prefix; empty: none
  std::string xmp;   // an XMP packet; empty: none
};

// The one check every decoder makes on the size a header declares, before allocating.
Status check_size(int64_t width, int64_t height, const ImageLimits& limits);

Result<Decoded> decode_jpeg(std::span<const uint8_t> bytes, const ImageLimits& limits);
Result<Decoded> decode_png(std::span<const uint8_t> bytes, const ImageLimits& limits);
Result<Decoded> decode_webp(std::span<const uint8_t> bytes, const ImageLimits& limits);
Result<Decoded> decode_gif(std::span<const uint8_t> bytes, const ImageLimits& limits);

}  // namespace kiln::image_detail
