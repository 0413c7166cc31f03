// WebP through libwebp's animation decoder, as PIL reads every WebP file: the first frame drawn on
// the canvas in non-premultiplied RGBA, then alpha dropped. A still image is that frame alone.
#include <webp/decode.h>
#include <webp/demux.h>

#include <memory>

#include "image/decoders.h"

namespace kiln::image_detail {

Result<Decoded> decode_webp(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  WebPBitstreamFeatures features;
  const VP8StatusCode status = WebPGetFeatures(bytes.data(), bytes.size(), &features);
  if (status == VP8_STATUS_NOT_ENOUGH_DATA) return make_error("truncated (the data ends before the header does)");
  if (status != VP8_STATUS_OK) return make_error("corrupt: unreadable header (libwebp status {})", int(status));
  // the canvas size, checked before the decoder allocates it
  KILN_TRY(check_size(features.width, features.height, limits));

  WebPAnimDecoderOptions options;
  if (!WebPAnimDecoderOptionsInit(&options)) return make_error("cannot start libwebp");
  options.color_mode = MODE_RGBA;
  options.use_threads = 0;
  const WebPData data{bytes.data(), bytes.size()};
  std::unique_ptr<WebPAnimDecoder, void (*)(WebPAnimDecoder*)> dec(WebPAnimDecoderNew(&data, &options),
                                                                   &WebPAnimDecoderDelete);
  if (!dec) return make_error("corrupt or truncated: libwebp cannot parse the file");
  WebPAnimInfo info;
  if (!WebPAnimDecoderGetInfo(dec.get(), &info)) return make_error("corrupt: no canvas");
  KILN_TRY(check_size(info.canvas_width, info.canvas_height, limits));
  uint8_t* rgba = nullptr;
  int timestamp = 0;
  if (!WebPAnimDecoderHasMoreFrames(dec.get()) || !WebPAnimDecoderGetNext(dec.get(), &rgba, &timestamp))
    return make_error("corrupt or truncated: the first frame does not decode");

  Decoded out;
  out.image = RgbImage::blank(info.canvas_width, info.canvas_height);
  const size_t n = size_t(info.canvas_width) * info.canvas_height;
  for (size_t i = 0; i < n; ++i)
    for (int ch = 0; ch < 3; ++ch) out.image.pixels[3 * i + ch] = rgba[4 * i + ch];

  const WebPDemuxer* demux = WebPAnimDecoderGetDemuxer(dec.get());
  WebPChunkIterator chunk;
  if (WebPDemuxGetChunk(demux, "EXIF", 1, &chunk)) {
    out.exif.assign(reinterpret_cast<const char*>(chunk.chunk.bytes), chunk.chunk.size);
    WebPDemuxReleaseChunkIterator(&chunk);
  }
  if (WebPDemuxGetChunk(demux, "XMP ", 1, &chunk)) {
    out.xmp.assign(reinterpret_cast<const char*>(chunk.chunk.bytes), chunk.chunk.size);
    WebPDemuxReleaseChunkIterator(&chunk);
  }
  return out;
}

}  // namespace kiln::image_detail
