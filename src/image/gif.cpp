// GIF through giflib, first frame only, as PIL opens a GIF and converts it to RGB: the logical
// screen (widened to hold the first frame when it reaches past it), filled with the frame's
// transparent index when its graphic control extension names one and with index 0 otherwise, the
// frame drawn at its offset, and every index looked up in the frame's palette (its local one, else
// the global one). Indices past the palette's end read as gray (i, i, i), PIL's palette default.
// Only the first image is read, so a file of many frames costs no more than one.
#include <gif_lib.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "image/decoders.h"

namespace kiln::image_detail {

namespace {

struct Source {
  std::span<const uint8_t> bytes;
  size_t at = 0;
  bool short_read = false;
};

int on_read(GifFileType* gif, GifByteType* out, int n) {
  auto* s = static_cast<Source*>(gif->UserData);
  const size_t take = std::min(size_t(n), s->bytes.size() - s->at);
  if (take < size_t(n)) s->short_read = true;
  std::memcpy(out, s->bytes.data() + s->at, take);
  s->at += take;
  return int(take);
}

void close_gif(GifFileType* gif) {
  int error = 0;
  if (gif) DGifCloseFile(gif, &error);
}

}  // namespace

Result<Decoded> decode_gif(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  Source source{.bytes = bytes};
  int error = 0;
  std::unique_ptr<GifFileType, void (*)(GifFileType*)> gif(DGifOpen(&source, on_read, &error), &close_gif);
  auto failure = [&](int code) -> Error {
    if (source.short_read) return make_error("truncated (the data ends before the image does)");
    const char* what = GifErrorString(code);
    return make_error("corrupt: {}", what ? what : "giflib error");
  };
  if (!gif) return failure(error);
  KILN_TRY(check_size(gif->SWidth, gif->SHeight, limits));

  int transparent = -1;  // from the graphic control extension before the first image
  for (;;) {
    GifRecordType record;
    if (DGifGetRecordType(gif.get(), &record) == GIF_ERROR) return failure(gif->Error);
    if (record == TERMINATE_RECORD_TYPE) return make_error("corrupt: no image in the file");
    if (record == EXTENSION_RECORD_TYPE) {
      int code = 0;
      GifByteType* ext = nullptr;
      if (DGifGetExtension(gif.get(), &code, &ext) == GIF_ERROR) return failure(gif->Error);
      if (code == GRAPHICS_EXT_FUNC_CODE && ext && ext[0] >= 4) transparent = (ext[1] & 1) ? ext[4] : -1;
      while (ext) {
        if (DGifGetExtensionNext(gif.get(), &ext) == GIF_ERROR) return failure(gif->Error);
      }
      continue;
    }
    if (record != IMAGE_DESC_RECORD_TYPE) continue;
    if (DGifGetImageDesc(gif.get()) == GIF_ERROR) return failure(gif->Error);
    break;
  }

  const GifImageDesc& frame = gif->Image;
  const int64_t left = frame.Left, top = frame.Top, fw = frame.Width, fh = frame.Height;
  KILN_TRY(check_size(fw, fh, limits));
  const int64_t width = std::max<int64_t>(gif->SWidth, left + fw);
  const int64_t height = std::max<int64_t>(gif->SHeight, top + fh);
  KILN_TRY(check_size(width, height, limits));

  std::vector<uint8_t> indices(size_t(width * height), uint8_t(transparent >= 0 ? transparent : 0));
  std::vector<GifPixelType> line(static_cast<size_t>(fw));
  auto read_row = [&](int64_t y) -> Status {
    if (DGifGetLine(gif.get(), line.data(), int(fw)) == GIF_ERROR) return failure(gif->Error);
    std::memcpy(&indices[size_t((top + y) * width + left)], line.data(), size_t(fw));
    return ok_status();
  };
  if (frame.Interlace) {
    static constexpr int kStart[] = {0, 4, 2, 1}, kStep[] = {8, 8, 4, 2};
    for (int pass = 0; pass < 4; ++pass)
      for (int64_t y = kStart[pass]; y < fh; y += kStep[pass]) KILN_TRY(read_row(y));
  } else {
    for (int64_t y = 0; y < fh; ++y) KILN_TRY(read_row(y));
  }

  const ColorMapObject* map = frame.ColorMap ? frame.ColorMap : gif->SColorMap;
  const int colors = map ? map->ColorCount : 0;
  Decoded out;
  out.image = RgbImage::blank(width, height);
  for (size_t i = 0; i < indices.size(); ++i) {
    const int index = indices[i];
    uint8_t* px = &out.image.pixels[3 * i];
    if (index < colors) {
      const GifColorType& c = map->Colors[index];
      px[0] = c.Red, px[1] = c.Green, px[2] = c.Blue;
    } else {
      px[0] = px[1] = px[2] = uint8_t(index);
    }
  }
  return out;
}

}  // namespace kiln::image_detail
