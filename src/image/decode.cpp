// Format sniffing, the limits, and the steps after decoding that every format shares (orientation).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "image/decoders.h"
#include "image/image.h"
#include "image/orientation.h"

namespace kiln {

const char* format_name(ImageFormat format) {
  switch (format) {
    case ImageFormat::jpeg:
      return "JPEG";
    case ImageFormat::png:
      return "PNG";
    case ImageFormat::webp:
      return "WebP";
    case ImageFormat::gif:
      return "GIF";
  }
  return "?";
}

Result<ImageFormat> sniff_image_format(std::span<const uint8_t> b, const std::string& name) {
  auto starts = [&](std::string_view magic, size_t at = 0) {
    return b.size() >= at + magic.size() && std::memcmp(b.data() + at, magic.data(), magic.size()) == 0;
  };
  if (starts("\xFF\xD8\xFF")) return ImageFormat::jpeg;
  if (starts("\x89PNG\r\n\x1A\n")) return ImageFormat::png;
  if (starts("RIFF") && starts("WEBP", 8)) return ImageFormat::webp;
  if (starts("GIF87a") || starts("GIF89a")) return ImageFormat::gif;
  if (b.empty()) return make_error("{}: empty file, not an image", name);
  return make_error("{}: unsupported image format (not JPEG, PNG, WebP or GIF by its first bytes)", name);
}

namespace image_detail {

Status check_size(int64_t width, int64_t height, const ImageLimits& limits) {
  if (width <= 0 || height <= 0) return make_error("corrupt: it declares a size of {}x{}", width, height);
  if (width > limits.max_pixels / height)
    return make_error("too large: {}x{} is {} pixels, over the limit of {}", width, height, width * height,
                      limits.max_pixels);
  return ok_status();
}

}  // namespace image_detail

Result<RgbImage> decode_image(std::span<const uint8_t> bytes, const std::string& name, const ImageLimits& limits) {
  if (int64_t(bytes.size()) > limits.max_bytes)
    return make_error("{}: too large: {} bytes, over the limit of {}", name, bytes.size(), limits.max_bytes);
  KILN_ASSIGN(ImageFormat format, sniff_image_format(bytes, name));
  Result<image_detail::Decoded> decoded = Error{};
  switch (format) {
    case ImageFormat::jpeg:
      decoded = image_detail::decode_jpeg(bytes, limits);
      break;
    case ImageFormat::png:
      decoded = image_detail::decode_png(bytes, limits);
      break;
    case ImageFormat::webp:
      decoded = image_detail::decode_webp(bytes, limits);
      break;
    case ImageFormat::gif:
      decoded = image_detail::decode_gif(bytes, limits);
      break;
  }
  if (!decoded.ok()) return make_error("{}: {} {}", name, format_name(format), one_line(decoded.error().message));
  const int orientation = image_orientation(decoded->exif, decoded->xmp);
  if (orientation == 1) return std::move(decoded->image);
  return apply_orientation(decoded->image, orientation);
}

Result<RgbImage> read_image(const std::string& path, const ImageLimits& limits) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) return make_error("{}: cannot open: {}", path, std::strerror(errno));
  if (std::fseek(f.get(), 0, SEEK_END) != 0) return make_error("{}: cannot read: {}", path, std::strerror(errno));
  const long size = std::ftell(f.get());
  if (size < 0) return make_error("{}: cannot read: {}", path, std::strerror(errno));
  if (size > limits.max_bytes)
    return make_error("{}: too large: {} bytes, over the limit of {}", path, size, limits.max_bytes);
  std::rewind(f.get());
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  if (std::fread(bytes.data(), 1, bytes.size(), f.get()) != bytes.size())
    return make_error("{}: cannot read: {}", path, std::ferror(f.get()) ? std::strerror(errno) : "short read");
  return decode_image(bytes, path, limits);
}

}  // namespace kiln
