// PNG through libpng, every colour type and depth, reduced as PIL opens and then converts to RGB:
// palette indices through the palette (a tRNS chunk ignored), 1/2/4-bit gray scaled to 8 bits, alpha
// dropped, 16-bit samples cut to their high byte except 16-bit gray without alpha, which PIL holds
// as "I;16" and clips to 255 on its way to RGB. libpng reports errors by longjmp: each call into it
// sits in a function that does setjmp and holds nothing that needs destroying.
#include <png.h>

#include <csetjmp>
#include <cstring>
#include <string>
#include <vector>

#include "image/decoders.h"

namespace kiln::image_detail {

namespace {

struct Reader {
  std::span<const uint8_t> bytes;
  size_t at = 0;
  bool short_read = false;
  char message[256] = {};
};

void on_read(png_structp png, png_bytep out, png_size_t n) {
  auto* r = static_cast<Reader*>(png_get_io_ptr(png));
  if (r->bytes.size() - r->at < n) {
    r->short_read = true;
    png_error(png, "truncated");
  }
  std::memcpy(out, r->bytes.data() + r->at, n);
  r->at += n;
}

void on_error(png_structp png, png_const_charp message) {
  auto* r = static_cast<Reader*>(png_get_error_ptr(png));
  std::snprintf(r->message, sizeof(r->message), "%s", message);
  png_longjmp(png, 1);
}

void on_warning(png_structp, png_const_charp) {}

struct Png {
  png_structp png = nullptr;
  png_infop info = nullptr;
  png_infop end = nullptr;
  ~Png() { png_destroy_read_struct(&png, &info, &end); }
};

struct Header {
  png_uint_32 width = 0, height = 0;
  int bit_depth = 0, color_type = 0;
  int channels = 0, out_depth = 0;  // after the transforms
};

bool read_header(Png& p, Header& h, const ImageLimits& limits) {
  if (setjmp(png_jmpbuf(p.png))) return false;
  // libpng's own guard, in case a chunk declares more than the limit before we look
  png_set_user_limits(p.png, 0x7fffffff, 0x7fffffff);
  png_set_chunk_malloc_max(p.png, png_alloc_size_t(limits.max_bytes));
  png_read_info(p.png, p.info);
  png_get_IHDR(p.png, p.info, &h.width, &h.height, &h.bit_depth, &h.color_type, nullptr, nullptr, nullptr);
  return true;
}

// Sets up the reduction to 8-bit RGB or gray (16-bit for "I;16" gray); libpng allocates its row
// buffers here, so only after the size passed the limits.
bool set_transforms(Png& p, Header& h) {
  if (setjmp(png_jmpbuf(p.png))) return false;
  const bool gray16 = h.color_type == PNG_COLOR_TYPE_GRAY && h.bit_depth == 16;
  if (h.color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(p.png);
  if (h.color_type == PNG_COLOR_TYPE_GRAY && h.bit_depth < 8) png_set_expand_gray_1_2_4_to_8(p.png);
  if (h.bit_depth == 16 && !gray16) png_set_strip_16(p.png);  // the high byte, as PIL's ";16B" modes
  if (gray16) png_set_swap(p.png);                            // host-order 16-bit samples
  png_set_strip_alpha(p.png);                                 // also the alpha palette_to_rgb makes from tRNS
  png_set_interlace_handling(p.png);
  png_read_update_info(p.png, p.info);
  h.channels = png_get_channels(p.png, p.info);
  h.out_depth = png_get_bit_depth(p.png, p.info);
  return true;
}

bool read_rows(Png& p, png_bytepp rows) {
  if (setjmp(png_jmpbuf(p.png))) return false;
  png_read_image(p.png, rows);
  png_read_end(p.png, p.end);
  return true;
}

void collect_metadata(Png& p, png_infop info, Decoded& out) {
  png_uint_32 exif_size = 0;
  png_bytep exif = nullptr;
  if (out.exif.empty() && png_get_eXIf_1(p.png, info, &exif_size, &exif) && exif)
    out.exif.assign(reinterpret_cast<const char*>(exif), exif_size);
  png_textp text = nullptr;
  int count = 0;
  png_get_text(p.png, info, &text, &count);
  for (int i = 0; i < count && out.xmp.empty(); ++i)
    if (std::strcmp(text[i].key, "XML:com.adobe.xmp") == 0)
      out.xmp.assign(text[i].text,
                     text[i].compression >= PNG_ITXT_COMPRESSION_NONE ? text[i].itxt_length : text[i].text_length);
}

}  // namespace

Result<Decoded> decode_png(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  Reader reader{.bytes = bytes};
  Png p;
  p.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &reader, on_error, on_warning);
  if (!p.png) return make_error("cannot start libpng");
  p.info = png_create_info_struct(p.png);
  p.end = png_create_info_struct(p.png);
  if (!p.info || !p.end) return make_error("cannot start libpng");
  png_set_read_fn(p.png, &reader, on_read);
  // CRC errors in ancillary chunks are warnings; in critical chunks, errors (libpng's defaults)

  auto failure = [&]() -> Error {
    if (reader.short_read) return make_error("truncated (the data ends before the image does)");
    return make_error("corrupt: {}", reader.message);
  };
  Header h;
  if (!read_header(p, h, limits)) return failure();
  KILN_TRY(check_size(h.width, h.height, limits));
  if (!set_transforms(p, h)) return failure();
  const int sample_bytes = h.out_depth == 16 ? 2 : 1;
  if ((h.channels != 1 && h.channels != 3) || (h.out_depth != 8 && h.out_depth != 16))
    return make_error("unsupported: {} channels of {} bits after conversion", h.channels, h.out_depth);

  const size_t row_bytes = size_t(h.width) * h.channels * sample_bytes;
  std::vector<uint8_t> samples(row_bytes * h.height);
  std::vector<png_bytep> rows(h.height);
  for (png_uint_32 y = 0; y < h.height; ++y) rows[y] = samples.data() + y * row_bytes;
  if (!read_rows(p, rows.data())) return failure();

  Decoded out;
  collect_metadata(p, p.info, out);
  collect_metadata(p, p.end, out);
  out.image = RgbImage::blank(h.width, h.height);
  uint8_t* dst = out.image.pixels.data();
  const size_t n = size_t(h.width) * h.height;
  if (h.channels == 3) {
    std::memcpy(dst, samples.data(), n * 3);
  } else if (sample_bytes == 1) {
    for (size_t i = 0; i < n; ++i) dst[3 * i] = dst[3 * i + 1] = dst[3 * i + 2] = samples[i];
  } else {
    const auto* gray = reinterpret_cast<const uint16_t*>(samples.data());
    for (size_t i = 0; i < n; ++i)
      dst[3 * i] = dst[3 * i + 1] = dst[3 * i + 2] = uint8_t(gray[i] > 255 ? 255 : gray[i]);
  }
  return out;
}

}  // namespace kiln::image_detail
