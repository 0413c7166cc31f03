// Images as kiln takes them in: JPEG, PNG, WebP and GIF (its first frame), told apart by their
// first bytes, decoded to 8-bit RGB the way transformers' `load_image` leaves a file. That is
// PIL's reading: `ImageOps.exif_transpose` (EXIF orientation, or XMP tiff:Orientation when EXIF has
// none) and then `convert("RGB")`, which drops alpha without compositing (transparent pixels keep
// their stored colour), clips 16-bit grayscale to 255, keeps the high byte of other 16-bit samples,
// and maps CMYK JPEGs through PIL's inverted-Adobe cmyk2rgb. The processors' own `convert_to_rgb`
// then has nothing left to do.
//
// Limits come first: the size a header declares is checked against ImageLimits before any pixel
// buffer exists, so a decompression bomb is refused, not allocated. Every failure is one line that
// names the image and what is wrong with it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace kiln {

// An 8-bit RGB image, rows top to bottom, each row width × 3 bytes (R, G, B).
struct RgbImage {
  int64_t width = 0;
  int64_t height = 0;
  std::vector<uint8_t> pixels;  // [height, width, 3]

  static RgbImage blank(int64_t width, int64_t height) {
    return {width, height, std::vector<uint8_t>(size_t(width * height * 3))};
  }
  uint8_t* row(int64_t y) { return pixels.data() + y * width * 3; }
  const uint8_t* row(int64_t y) const { return pixels.data() + y * width * 3; }
};

struct ImageLimits {
  // width × height of the stored image (a GIF's logical screen, a WebP's canvas). 8192 × 8192 by
  // default: 192 MiB of RGB, above every released processor's resize target by far.
  int64_t max_pixels = int64_t(8192) * 8192;
  // bytes of the encoded file
  int64_t max_bytes = int64_t(64) << 20;
};

enum class ImageFormat { jpeg, png, webp, gif };

const char* format_name(ImageFormat format);  // "JPEG", "PNG", "WebP", "GIF"

// The format by the file's first bytes; an error when they are none of the four.
Result<ImageFormat> sniff_image_format(std::span<const uint8_t> bytes, const std::string& name);

// Decodes an image held in memory. `name` labels it in errors ("photo.jpg", "image 2 of the
// request").
Result<RgbImage> decode_image(std::span<const uint8_t> bytes, const std::string& name, const ImageLimits& limits = {});

// Reads and decodes a file; the byte limit is checked before it is read.
Result<RgbImage> read_image(const std::string& path, const ImageLimits& limits = {});

}  // namespace kiln
