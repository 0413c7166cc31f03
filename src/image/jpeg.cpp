// JPEG through libjpeg-turbo with PIL's settings: the library's default (islow) IDCT and fancy
// upsampling, RGB out for three components, gray for one, CMYK for four (YCCK converted by the
// library). libjpeg's error_exit would call exit(): ours longjmps back with the message. A
// premature end of data, which libjpeg only warns about, is an error here as it is in PIL ("image
// file is truncated").
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

// clang-format off
#include <jpeglib.h>
#include <jerror.h>
// clang-format on

#include "image/decoders.h"

namespace kiln::image_detail {

namespace {

// Progressive files can hold thousands of tiny scans; libjpeg-turbo's own tools cap them (djpeg
// -maxscans) against that denial of service. A real file has at most a few dozen.
constexpr int kMaxScans = 1000;

struct ErrorManager {
  jpeg_error_mgr pub;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void on_message(j_common_ptr cinfo, int level) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    std::snprintf(err->message, sizeof(err->message), "truncated (the data ends before the image does)");
    std::longjmp(err->jump, 1);
  }
  // other warnings (corrupt entropy data that libjpeg recovers from) pass, as in PIL
}

void on_progress(j_common_ptr cinfo) {
  auto* d = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (d->input_scan_number > kMaxScans) {
    auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
    std::snprintf(err->message, sizeof(err->message), "corrupt: more than %d progressive scans", kMaxScans);
    std::longjmp(err->jump, 1);
  }
}

// PIL's Convert.c cmyk2rgb on "CMYK;I" (inverted, Adobe's convention) samples.
inline uint8_t cmyk_channel(int c, int nk) {
  int tmp = c * nk + 128;
  const int scaled = ((tmp >> 8) + tmp) >> 8;  // MULDIV255
  const int v = nk - scaled;
  return uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
}

struct Session {
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  jpeg_progress_mgr progress;
};

// Reads the header. Only trivially destructible locals live here: longjmp skips destructors.
bool read_header(Session& s, std::span<const uint8_t> bytes) {
  if (setjmp(s.err.jump)) return false;
  jpeg_create_decompress(&s.cinfo);
  jpeg_mem_src(&s.cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_save_markers(&s.cinfo, JPEG_APP0 + 1, 0xFFFF);
  jpeg_read_header(&s.cinfo, TRUE);
  return true;
}

bool read_pixels(Session& s, uint8_t* out, size_t row_bytes) {
  if (setjmp(s.err.jump)) return false;
  jpeg_start_decompress(&s.cinfo);
  while (s.cinfo.output_scanline < s.cinfo.output_height) {
    JSAMPROW row = out + size_t(s.cinfo.output_scanline) * row_bytes;
    jpeg_read_scanlines(&s.cinfo, &row, 1);
  }
  jpeg_finish_decompress(&s.cinfo);
  return true;
}

}  // namespace

Result<Decoded> decode_jpeg(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  auto s = std::make_unique<Session>();
  s->cinfo.err = jpeg_std_error(&s->err.pub);
  s->err.pub.error_exit = on_error;
  s->err.pub.emit_message = on_message;
  s->err.message[0] = '\0';
  struct Destroy {
    jpeg_decompress_struct* c;
    ~Destroy() { jpeg_destroy_decompress(c); }
  } destroy{&s->cinfo};

  if (!read_header(*s, bytes)) return make_error("corrupt: {}", s->err.message);
  s->progress.progress_monitor = on_progress;
  s->cinfo.progress = &s->progress;
  jpeg_decompress_struct& c = s->cinfo;
  KILN_TRY(check_size(c.image_width, c.image_height, limits));

  Decoded out;
  for (jpeg_saved_marker_ptr m = c.marker_list; m; m = m->next) {
    const std::string_view data(reinterpret_cast<const char*>(m->data), m->data_length);
    if (m->marker != JPEG_APP0 + 1) continue;
    static constexpr std::string_view kXmp("http://ns.adobe.com/xap/1.0/\0", 29);
    if (data.substr(0, 6) == std::string_view("Exif\0\0", 6) && out.exif.empty()) out.exif = data;
    if (data.substr(0, kXmp.size()) == kXmp && out.xmp.empty()) out.xmp = data.substr(kXmp.size());
  }

  int channels = 0;
  switch (c.num_components) {
    case 1:
      c.out_color_space = JCS_GRAYSCALE, channels = 1;
      break;
    case 3:
      c.out_color_space = JCS_RGB, channels = 3;
      break;
    case 4:
      c.out_color_space = JCS_CMYK, channels = 4;
      break;
    default:
      return make_error("unsupported: {} color components", c.num_components);
  }
  const int64_t w = c.image_width, h = c.image_height;
  std::vector<uint8_t> samples(size_t(w * h * channels));
  if (!read_pixels(*s, samples.data(), size_t(w * channels))) {
    if (std::strncmp(s->err.message, "truncated", 9) == 0) return make_error("{}", s->err.message);
    return make_error("corrupt: {}", s->err.message);
  }

  out.image = RgbImage::blank(w, h);
  uint8_t* dst = out.image.pixels.data();
  const size_t n = size_t(w * h);
  if (channels == 3) {
    std::memcpy(dst, samples.data(), n * 3);
  } else if (channels == 1) {
    for (size_t i = 0; i < n; ++i) dst[3 * i] = dst[3 * i + 1] = dst[3 * i + 2] = samples[i];
  } else {
    // "CMYK;I" unpacking gives C = 255 - stored, K = 255 - stored; cmyk2rgb's nk = 255 - K is then
    // the stored K byte itself
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* p = &samples[4 * i];
      for (int ch = 0; ch < 3; ++ch) dst[3 * i + ch] = cmyk_channel(255 - p[ch], p[3]);
    }
  }
  return out;
}

}  // namespace kiln::image_detail
