// The image floor: decoding of each format against PIL, the limits, every bad input as a one-line
// error, EXIF orientation, and the resize and pixel scaling on hand-checkable cases.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "image/image.h"
#include "image/orientation.h"
#include "image/resize.h"
#include "test_util.h"

namespace kiln {
namespace {

std::string image_path(const std::string& name) {
  return test::fixtures_dir() + "/images/" + name;
}

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

uint64_t fnv1a64(const std::vector<uint8_t>& bytes) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (uint8_t b : bytes) h = (h ^ b) * 0x100000001B3ull;
  return h;
}

void expect_one_line(const std::string& message, const std::string& name) {
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_NE(message.find(name), std::string::npos) << message;
}

// Each test image as PIL reads it for transformers' load_image: ImageOps.exif_transpose, then
// convert("RGB"). Hashes (FNV-1a 64 of the RGB bytes) from Debian 12's python3-pil 9.4.0 on the same
// files; the oracle fixtures check the same against the oracle's Pillow.
struct PilReference {
  const char* name;
  int64_t width, height;
  uint64_t rgb_hash;
};
const PilReference kPil[] = {
    {"alpha.webp", 400, 301, 0x2e116518534f96e5},      // RGBA: alpha dropped
    {"cmyk.jpg", 150, 103, 0xc0063a4adbf1b5fa},        // CMYK: inverted Adobe, cmyk2rgb
    {"exif6.jpg", 50, 70, 0xa68c4de2d8830948},         // 70x50 stored, orientation 6
    {"gray.jpg", 150, 103, 0x8bc1a9142b4d25be},        // L
    {"gray16.png", 32, 32, 0x2ddfd74a0cba383c},        // I: clipped to 255
    {"gray_alpha16.png", 32, 32, 0x01613a57576421fd},  // LA 16-bit: high bytes
    {"interlaced.gif", 150, 103, 0x521819e148af8e22},  // P, interlaced
    {"lossless.webp", 75, 100, 0x6886a49e0e1b5c1e},    // VP8L
    {"lossy.webp", 150, 100, 0x5b946755e4043bcb},      // VP8
    {"palette4.png", 32, 32, 0x0908649a6b34bb05},      // P, 4 bits
    {"palette_trns.png", 32, 32, 0x534df53c8f059db4},  // P with tRNS: ignored
    {"rgba.png", 32, 32, 0x8da78cfa13ff55a5},          // RGBA: alpha dropped
    {"triangle.gif", 256, 128, 0x36d3d02cf30fb05f},    // P
    {"video_420.jpg", 150, 103, 0xaa91848285beb793},   // 4:2:0
};

TEST(ImageDecode, EveryFormatAsPilReadsIt) {
  for (const auto& ref : kPil) {
    SCOPED_TRACE(ref.name);
    auto image = read_image(image_path(ref.name));
    ASSERT_TRUE(image.ok()) << image.error().message;
    EXPECT_EQ(image->width, ref.width);
    EXPECT_EQ(image->height, ref.height);
    EXPECT_EQ(fnv1a64(image->pixels), ref.rgb_hash);
  }
}

TEST(ImageDecode, FormatByContentNotName) {
  const auto bytes = file_bytes(image_path("rgba.png"));
  auto format = sniff_image_format(bytes, "x");
  ASSERT_TRUE(format.ok());
  EXPECT_EQ(*format, ImageFormat::png);
  const auto path = std::filesystem::temp_directory_path() / "kiln_png_named.jpg";
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  auto image = read_image(path.string());
  ASSERT_TRUE(image.ok()) << image.error().message;
  EXPECT_EQ(image->width, 32);
  std::filesystem::remove(path);
  EXPECT_EQ(*sniff_image_format(file_bytes(image_path("lossy.webp")), "x"), ImageFormat::webp);
  EXPECT_EQ(*sniff_image_format(file_bytes(image_path("triangle.gif")), "x"), ImageFormat::gif);
  EXPECT_EQ(*sniff_image_format(file_bytes(image_path("gray.jpg")), "x"), ImageFormat::jpeg);
}

TEST(ImageDecode, MissingEmptyAndUnknownFiles) {
  auto missing = read_image("/nonexistent/cat.png");
  ASSERT_FALSE(missing.ok());
  expect_one_line(missing.error().message, "/nonexistent/cat.png");

  std::vector<uint8_t> empty;
  auto e = decode_image(empty, "empty.png");
  ASSERT_FALSE(e.ok());
  expect_one_line(e.error().message, "empty.png");
  EXPECT_NE(e.error().message.find("empty"), std::string::npos);

  const std::string text = "BM6\x00\x00\x00 a bitmap, or a text file";
  std::vector<uint8_t> bmp(text.begin(), text.end());
  auto u = decode_image(bmp, "picture.bmp");
  ASSERT_FALSE(u.ok());
  expect_one_line(u.error().message, "picture.bmp");
  EXPECT_NE(u.error().message.find("unsupported image format"), std::string::npos);
}

// Every format cut short, at several points: an error naming the image, never a crash.
TEST(ImageDecode, TruncatedFilesAreErrors) {
  for (const char* name :
       {"video_420.jpg", "exif6.jpg", "gray.jpg", "cmyk.jpg", "rgba.png", "palette4.png", "gray16.png", "lossy.webp",
        "alpha.webp", "lossless.webp", "triangle.gif", "interlaced.gif"}) {
    const auto bytes = file_bytes(image_path(name));
    for (double keep : {0.1, 0.5, 0.9}) {
      SCOPED_TRACE(std::string(name) + " cut at " + std::to_string(keep));
      std::vector<uint8_t> cut(bytes.begin(),
                               bytes.begin() + std::max<size_t>(16, size_t(double(bytes.size()) * keep)));
      auto image = decode_image(cut, "cut.img");
      ASSERT_FALSE(image.ok());
      expect_one_line(image.error().message, "cut.img");
      const std::string& m = image.error().message;
      EXPECT_TRUE(m.find("truncated") != std::string::npos || m.find("corrupt") != std::string::npos) << m;
    }
  }
}

TEST(ImageDecode, CorruptFilesAreErrors) {
  {  // a PNG whose IHDR no longer matches its CRC
    auto bytes = file_bytes(image_path("rgba.png"));
    bytes[16] ^= 0x40;
    auto image = decode_image(bytes, "crc.png");
    ASSERT_FALSE(image.ok());
    expect_one_line(image.error().message, "crc.png");
    EXPECT_NE(image.error().message.find("corrupt"), std::string::npos) << image.error().message;
  }
  {  // a JPEG whose SOF declares 0 components
    auto bytes = file_bytes(image_path("gray.jpg"));
    for (size_t i = 2; i + 9 < bytes.size(); ++i)
      if (bytes[i] == 0xFF && bytes[i + 1] == 0xC0) {
        bytes[i + 9] = 0;
        break;
      }
    auto image = decode_image(bytes, "sof.jpg");
    ASSERT_FALSE(image.ok());
    expect_one_line(image.error().message, "sof.jpg");
  }
  {  // a WebP whose VP8 frame tag is garbage
    auto bytes = file_bytes(image_path("lossy.webp"));
    for (size_t i = 20; i < 30; ++i) bytes[i] = 0xEE;
    auto image = decode_image(bytes, "garbage.webp");
    ASSERT_FALSE(image.ok());
    expect_one_line(image.error().message, "garbage.webp");
  }
  {  // a GIF whose LZW code size is out of range
    auto bytes = file_bytes(image_path("triangle.gif"));
    for (size_t i = 13; i + 10 < bytes.size(); ++i)
      if (bytes[i] == 0x2C) {  // image descriptor: 9 bytes, then (no local table) the LZW minimum code size
        if (!(bytes[i + 9] & 0x80)) bytes[i + 10] = 0x0F;
        break;
      }
    auto image = decode_image(bytes, "lzw.gif");
    if (!image.ok()) expect_one_line(image.error().message, "lzw.gif");  // giflib may still decode garbage
  }
}

TEST(ImageLimits, RefusedBeforeDecoding) {
  const ImageLimits tiny{.max_pixels = 1000, .max_bytes = int64_t(1) << 20};
  for (const char* name : {"video_420.jpg", "rgba.png", "lossy.webp", "triangle.gif"}) {
    SCOPED_TRACE(name);
    auto image = read_image(image_path(name), tiny);
    ASSERT_FALSE(image.ok());
    expect_one_line(image.error().message, name);
    EXPECT_NE(image.error().message.find("too large"), std::string::npos) << image.error().message;
    EXPECT_NE(image.error().message.find("over the limit of 1000"), std::string::npos) << image.error().message;
  }
  auto bytes = read_image(image_path("alpha.webp"), ImageLimits{.max_bytes = 1000});
  ASSERT_FALSE(bytes.ok());
  EXPECT_NE(bytes.error().message.find("bytes, over the limit of 1000"), std::string::npos) << bytes.error().message;
}

uint32_t crc32(const uint8_t* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
  }
  return ~c;
}

// Headers that declare 4 billion pixels in a few bytes: refused with the default limits.
TEST(ImageLimits, DecompressionBombs) {
  {
    auto png = file_bytes(image_path("rgba.png"));
    const uint8_t big[8] = {0, 0, 0xFF, 0xFF, 0, 0, 0xFF, 0xFF};  // 65535 x 65535
    std::memcpy(&png[16], big, 8);
    const uint32_t crc = crc32(&png[12], 17);
    const uint8_t be[4] = {uint8_t(crc >> 24), uint8_t(crc >> 16), uint8_t(crc >> 8), uint8_t(crc)};
    std::memcpy(&png[29], be, 4);
    auto image = decode_image(png, "bomb.png");
    ASSERT_FALSE(image.ok());
    EXPECT_NE(image.error().message.find("too large: 65535x65535"), std::string::npos) << image.error().message;
  }
  {
    auto jpeg = file_bytes(image_path("gray.jpg"));
    for (size_t i = 2; i + 8 < jpeg.size(); ++i)
      if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC0) {
        jpeg[i + 5] = jpeg[i + 7] = 0xEA, jpeg[i + 6] = jpeg[i + 8] = 0x60;  // height, width 60000 (libjpeg's
        break;                                                               // own cap is 65500)
      }
    auto image = decode_image(jpeg, "bomb.jpg");
    ASSERT_FALSE(image.ok());
    EXPECT_NE(image.error().message.find("too large: 60000x60000"), std::string::npos) << image.error().message;
  }
  {
    auto gif = file_bytes(image_path("triangle.gif"));
    gif[6] = gif[7] = gif[8] = gif[9] = 0xFF;  // logical screen 65535 x 65535
    auto image = decode_image(gif, "bomb.gif");
    ASSERT_FALSE(image.ok());
    EXPECT_NE(image.error().message.find("too large: 65535x65535"), std::string::npos) << image.error().message;
  }
}

RgbImage numbered(int64_t w, int64_t h) {
  RgbImage img = RgbImage::blank(w, h);
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) img.row(y)[x * 3 + c] = uint8_t(10 * y + x + 100 * c);
  return img;
}

// PIL's transposes on a 3x2 image whose pixel (x, y) is 10y + x: the expected rows, top to bottom.
TEST(ImageOrientation, EachOfTheEight) {
  const RgbImage img = numbered(3, 2);  // rows {0 1 2} {10 11 12}
  const std::vector<std::vector<int>> want[] = {
      {{0, 1, 2}, {10, 11, 12}},    // 1
      {{2, 1, 0}, {12, 11, 10}},    // 2 mirror
      {{12, 11, 10}, {2, 1, 0}},    // 3 rotate 180
      {{10, 11, 12}, {0, 1, 2}},    // 4 flip
      {{0, 10}, {1, 11}, {2, 12}},  // 5 transpose
      {{10, 0}, {11, 1}, {12, 2}},  // 6 rotate 90 clockwise
      {{12, 2}, {11, 1}, {10, 0}},  // 7 transverse
      {{2, 12}, {1, 11}, {0, 10}},  // 8 rotate 90 counter-clockwise
  };
  for (int o = 1; o <= 8; ++o) {
    SCOPED_TRACE(o);
    const RgbImage out = apply_orientation(img, o);
    const auto& rows = want[o - 1];
    ASSERT_EQ(out.height, int64_t(rows.size()));
    ASSERT_EQ(out.width, int64_t(rows[0].size()));
    for (int64_t y = 0; y < out.height; ++y)
      for (int64_t x = 0; x < out.width; ++x) EXPECT_EQ(out.row(y)[x * 3], rows[y][x]) << x << "," << y;
  }
}

TEST(ImageOrientation, ExifAndXmp) {
  // little-endian TIFF, IFD0 at 8 with one entry: orientation SHORT 8
  const std::string le("II*\0\x08\0\0\0\x01\0\x12\x01\x03\0\x01\0\0\0\x08\0\0\0\0\0\0\0", 26);
  EXPECT_EQ(image_orientation(le, ""), 8);
  EXPECT_EQ(image_orientation(std::string("Exif\0\0", 6) + le, ""), 8);
  const std::string be("MM\0*\0\0\0\x08\0\x01\x01\x12\0\x03\0\0\0\x01\0\x03\0\0\0\0\0\0", 26);
  EXPECT_EQ(image_orientation(be, ""), 3);
  EXPECT_EQ(image_orientation("", "<x:xmpmeta tiff:Orientation=\"6\"/>"), 6);
  EXPECT_EQ(image_orientation("", "<tiff:Orientation>5</tiff:Orientation>"), 5);
  EXPECT_EQ(image_orientation(le, "tiff:Orientation=\"6\""), 8);                 // EXIF first
  EXPECT_EQ(image_orientation(std::string("II*\0\xFF\xFF\xFF\xFF", 8), ""), 1);  // IFD past the end
  EXPECT_EQ(image_orientation("", ""), 1);
}

// A 4-pixel row halved: torch's antialiased bicubic taps, worked by hand. scale 2, support 4: output
// 0 reads inputs 0..3 at distances (j - 1 + 0.5) / 2 = -0.25, 0.25, 0.75, 1.25; Keys (a = -0.5)
// gives 0.8671875, 0.8671875, 0.2265625, -0.0703125, normalised by their sum 1.890625. The largest,
// 0.45868, fits 16 bits of precision (2^17 would overflow int16), so the weights are
// round(w · 65536) = 30060, 30060, 7853, -2437.
TEST(ImageResize, TapsByHand) {
  const ResampleTaps t = bicubic_antialias_taps(4, 2);
  EXPECT_EQ(t.precision, 16);
  ASSERT_EQ(t.first.size(), 2u);
  EXPECT_EQ(t.first[0], 0);
  EXPECT_EQ(t.first[1], 0);
  EXPECT_EQ(t.weights[0], (std::vector<int16_t>{30060, 30060, 7853, -2437}));
  EXPECT_EQ(t.weights[1], (std::vector<int16_t>{-2437, 7853, 30060, 30060}));
}

TEST(ImageResize, ByHand) {
  // the row 0 0 255 255 halved: (255 · (7853 - 2437) + 2^15) >> 16 = 21, and its mirror 234
  RgbImage row = RgbImage::blank(4, 1);
  for (int x = 0; x < 4; ++x)
    for (int c = 0; c < 3; ++c) row.row(0)[x * 3 + c] = x < 2 ? 0 : 255;
  const RgbImage half = resize_bicubic_antialias(row, 2, 1);
  EXPECT_EQ(half.row(0)[0], 21);
  EXPECT_EQ(half.row(0)[3], 234);
  // the same along the height: the column pass alone
  RgbImage col = RgbImage::blank(1, 4);
  for (int y = 0; y < 4; ++y)
    for (int c = 0; c < 3; ++c) col.row(y)[c] = y < 2 ? 0 : 255;
  const RgbImage half_col = resize_bicubic_antialias(col, 1, 2);
  EXPECT_EQ(half_col.row(0)[0], 21);
  EXPECT_EQ(half_col.row(1)[0], 234);
}

TEST(ImageResize, ConstantStaysConstantAndSizesHold) {
  RgbImage flat = RgbImage::blank(37, 23);
  for (size_t i = 0; i < flat.pixels.size(); ++i) flat.pixels[i] = uint8_t(i % 3 == 0 ? 200 : i % 3 == 1 ? 7 : 255);
  for (auto [w, h] : {std::pair{5, 3}, {37, 64}, {100, 23}, {1, 1}, {361, 230}}) {
    const RgbImage out = resize_bicubic_antialias(flat, w, h);
    ASSERT_EQ(out.width, w);
    ASSERT_EQ(out.height, h);
    for (size_t i = 0; i < out.pixels.size(); ++i)
      ASSERT_EQ(out.pixels[i], i % 3 == 0 ? 200 : i % 3 == 1 ? 7 : 255) << w << "x" << h << " at " << i;
  }
  const RgbImage same = resize_bicubic_antialias(flat, 37, 23);
  EXPECT_EQ(same.pixels, flat.pixels);
}

TEST(ImagePixels, RescaleAndNormalize) {
  RgbImage img = RgbImage::blank(2, 1);
  const uint8_t px[6] = {0, 128, 255, 255, 0, 51};
  std::memcpy(img.pixels.data(), px, 6);
  const PixelPlanes rescaled = scale_pixels(img, PixelScaling{});
  EXPECT_EQ(rescaled.at(0, 0, 0), 0.0f);
  EXPECT_EQ(rescaled.at(2, 0, 0), 255.0f * float(1.0 / 255.0));
  EXPECT_NEAR(rescaled.at(1, 0, 0), 128.0 / 255.0, 1e-7);
  EXPECT_NEAR(rescaled.at(2, 0, 1), 0.2, 1e-7);
  const PixelPlanes normalized =
      scale_pixels(img, PixelScaling{.normalize = true, .mean = {0.5, 0.5, 0.5}, .std = {0.5, 0.5, 0.5}});
  EXPECT_EQ(normalized.at(0, 0, 0), -1.0f);  // (0 - 127.5) / 127.5
  EXPECT_EQ(normalized.at(2, 0, 0), 1.0f);
  EXPECT_NEAR(normalized.at(1, 0, 0), (128 - 127.5) / 127.5, 1e-7);
}

}  // namespace
}  // namespace kiln
