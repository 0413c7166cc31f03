#include "image/orientation.h"

#include <cstdint>
#include <regex>
#include <string>

namespace kiln {

namespace {

// IFD0's orientation entry, or 0 when the block has none or cannot be read.
int exif_orientation(std::string_view exif) {
  if (exif.substr(0, 6) == std::string_view("Exif\0\0", 6)) exif.remove_prefix(6);
  if (exif.size() < 8) return 0;
  const bool little = exif.substr(0, 2) == "II";
  if (!little && exif.substr(0, 2) != "MM") return 0;
  auto byte = [&](size_t at) { return uint32_t(uint8_t(exif[at])); };
  auto u16 = [&](size_t at) { return little ? byte(at) | byte(at + 1) << 8 : byte(at) << 8 | byte(at + 1); };
  auto u32 = [&](size_t at) { return little ? u16(at) | u16(at + 2) << 16 : u16(at) << 16 | u16(at + 2); };
  if (u16(2) != 42) return 0;
  const size_t ifd = u32(4);
  if (ifd > exif.size() || exif.size() - ifd < 2) return 0;
  const size_t entries = u16(ifd);
  for (size_t i = 0; i < entries; ++i) {
    const size_t at = ifd + 2 + 12 * i;
    if (at + 12 > exif.size()) return 0;
    if (u16(at) != 0x0112) continue;
    const uint32_t type = u16(at + 2), count = u32(at + 4);
    if (count < 1) return 0;
    if (type == 3) return int(u16(at + 8));  // SHORT, stored in the value field
    if (type == 4) return int(u32(at + 8));  // LONG
    return 0;
  }
  return 0;
}

}  // namespace

int image_orientation(std::string_view exif, std::string_view xmp) {
  if (const int o = exif_orientation(exif); o != 0) return o;
  // PIL: re.search(r'tiff:Orientation(="|>)([0-9])', xmp)
  static const std::regex pattern(R"(tiff:Orientation(="|>)([0-9]))");
  std::match_results<std::string_view::const_iterator> match;
  if (std::regex_search(xmp.begin(), xmp.end(), match, pattern)) return match[2].str()[0] - '0';
  return 1;
}

RgbImage apply_orientation(const RgbImage& image, int orientation) {
  if (orientation < 2 || orientation > 8) return image;
  const int64_t w = image.width, h = image.height;
  const bool swap = orientation >= 5;  // the transposing ones
  RgbImage out = RgbImage::blank(swap ? h : w, swap ? w : h);
  for (int64_t y = 0; y < out.height; ++y) {
    uint8_t* dst = out.row(y);
    for (int64_t x = 0; x < out.width; ++x) {
      int64_t sx = x, sy = y;  // the source pixel of output pixel (x, y)
      switch (orientation) {
        case 2:
          sx = w - 1 - x;
          break;  // FLIP_LEFT_RIGHT
        case 3:
          sx = w - 1 - x, sy = h - 1 - y;
          break;  // ROTATE_180
        case 4:
          sy = h - 1 - y;
          break;  // FLIP_TOP_BOTTOM
        case 5:
          sx = y, sy = x;
          break;  // TRANSPOSE
        case 6:
          sx = y, sy = h - 1 - x;
          break;  // ROTATE_270 (90° clockwise)
        case 7:
          sx = w - 1 - y, sy = h - 1 - x;
          break;  // TRANSVERSE
        case 8:
          sx = w - 1 - y, sy = x;
          break;  // ROTATE_90 (90° counter-clockwise)
      }
      const uint8_t* src = image.row(sy) + sx * 3;
      dst[x * 3] = src[0], dst[x * 3 + 1] = src[1], dst[x * 3 + 2] = src[2];
    }
  }
  return out;
}

}  // namespace kiln
