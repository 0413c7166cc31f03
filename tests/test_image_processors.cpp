// Each family's image processor: the resize rules and patch layouts on hand-checkable cases, the
// placeholder expansion and its reverse check, the factories, and the whole path against
// transformers' fixtures (tests/fixtures/images/oracle, from tools/oracle/make_image_fixtures.py):
// pixel values within 1e-2 after normalisation, grids, soft tokens and expanded ids exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/npy.h"
#include "image/image.h"
#include "models/family.h"
#include "models/gemma4/image_processor.h"
#include "models/image_processor.h"
#include "models/qwen3_5/image_processor.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

std::string images_dir() {
  return test::fixtures_dir() + "/images";
}
std::string oracle_dir() {
  return images_dir() + "/oracle";
}

ImagePlaceholder gemma_placeholder() {
  return {.token = "<|image|>", .token_id = 258880, .begin = "<|image>", .end = "<image|>"};
}
ImagePlaceholder qwen_placeholder() {
  return {.token = "<|image_pad|>", .token_id = 248056};
}

std::pair<int64_t, int64_t> gemma_size(int64_t h, int64_t w, int64_t max_soft_tokens = 280) {
  Gemma4ImageSettings s;
  s.max_soft_tokens = max_soft_tokens;
  auto size = gemma4_resized_size(h, w, s);
  EXPECT_TRUE(size.ok()) << size.error().message;
  return size.ok() ? *size : std::pair<int64_t, int64_t>{};
}

// get_aspect_ratio_preserving_size, worked in Python: {height, width}
TEST(Gemma4ImageProcessor, ResizedSizes) {
  EXPECT_EQ(gemma_size(103, 150), (std::pair<int64_t, int64_t>{624, 960}));
  EXPECT_EQ(gemma_size(70, 50), (std::pair<int64_t, int64_t>{912, 672}));
  EXPECT_EQ(gemma_size(301, 400), (std::pair<int64_t, int64_t>{672, 912}));
  EXPECT_EQ(gemma_size(103, 150, 70), (std::pair<int64_t, int64_t>{288, 480}));
  EXPECT_EQ(gemma_size(10, 1000), (std::pair<int64_t, int64_t>{48, 8016}));
  EXPECT_EQ(gemma_size(1, 1000), (std::pair<int64_t, int64_t>{48, 13440}));  // the zero-height branch
  EXPECT_EQ(gemma_size(1000, 1), (std::pair<int64_t, int64_t>{13440, 48}));
}

TEST(Gemma4ImageProcessor, Settings) {
  auto s = parse_gemma4_image_settings(nlohmann::json::object(), "none", false);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->max_soft_tokens, 280);
  EXPECT_FALSE(s->scaling.normalize);
  EXPECT_FALSE(s->unified);
  auto unified = parse_gemma4_image_settings({{"image_processor_type", "Gemma4UnifiedImageProcessor"}}, "p", false);
  ASSERT_TRUE(unified.ok());
  EXPECT_TRUE(unified->unified);
  auto bad = parse_gemma4_image_settings({{"max_soft_tokens", 100}}, "processor_config.json", false);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("processor_config.json: max_soft_tokens must be one of"), std::string::npos);
  auto bilinear = parse_gemma4_image_settings({{"resample", 2}}, "p.json", false);
  ASSERT_FALSE(bilinear.ok());
  EXPECT_NE(bilinear.error().message.find("resample 2 is not supported"), std::string::npos);
  auto other = parse_gemma4_image_settings({{"image_processor_type", "SiglipImageProcessor"}}, "p.json", false);
  ASSERT_FALSE(other.ok());
}

RgbImage numbered(int64_t w, int64_t h) {
  RgbImage img = RgbImage::blank(w, h);
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) img.row(y)[x * 3 + c] = uint8_t((7 * x + 13 * y + 71 * c) % 256);
  return img;
}
float rescaled(const RgbImage& img, int64_t x, int64_t y, int c) {
  return float(img.row(y)[x * 3 + c]) * float(1.0 / 255.0);
}

// convert_image_to_patches: patches row-major, each patch (row, column, channel)
TEST(Gemma4ImageProcessor, PatchLayout) {
  Gemma4ImageSettings s;
  s.do_resize = false;
  const RgbImage img = numbered(96, 48);  // 6 x 3 patches of 16
  auto out = make_gemma4_image_processor(s, gemma_placeholder())->process(img);
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(out->grid, (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(out->soft_tokens, 2);  // 18 patches / 3²
  ASSERT_EQ(out->pixels.shape(), (Shape{18, 768}));
  const float* px = out->pixels.data_as<float>();
  for (int64_t patch : {0, 5, 7, 17})
    for (int64_t dy : {0, 9, 15})
      for (int64_t dx : {0, 4, 15})
        for (int c = 0; c < 3; ++c)
          EXPECT_EQ(px[patch * 768 + (dy * 16 + dx) * 3 + c],
                    rescaled(img, (patch % 6) * 16 + dx, (patch / 6) * 16 + dy, c));

  s.unified = true;  // 48-pixel patches: 2 x 1
  auto merged = make_gemma4_image_processor(s, gemma_placeholder())->process(img);
  ASSERT_TRUE(merged.ok());
  EXPECT_EQ(merged->grid, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(merged->soft_tokens, 2);
  ASSERT_EQ(merged->pixels.shape(), (Shape{2, 48 * 48 * 3}));
  EXPECT_EQ(merged->pixels.data_as<float>()[1 * 6912 + (20 * 48 + 30) * 3 + 2], rescaled(img, 48 + 30, 20, 2));

  auto odd = make_gemma4_image_processor(Gemma4ImageSettings{.do_resize = false}, gemma_placeholder())
                 ->process(numbered(50, 48));
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.error().message.find("does not divide"), std::string::npos);
}

TEST(Gemma4ImageProcessor, ResizesToTheBudget) {
  auto out = make_gemma4_image_processor(Gemma4ImageSettings{}, gemma_placeholder())->process(numbered(150, 103));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->grid, (std::vector<int64_t>{39, 60}));  // 624 x 960
  EXPECT_EQ(out->soft_tokens, 260);
}

Qwen35ImageSettings qwen_release() {
  auto s = parse_qwen3_5_image_settings({{"patch_size", 16},
                                         {"image_mean", {0.5, 0.5, 0.5}},
                                         {"image_std", {0.5, 0.5, 0.5}},
                                         {"size", {{"shortest_edge", 65536}, {"longest_edge", 16777216}}}},
                                        "preprocessor_config.json");
  EXPECT_TRUE(s.ok());
  return *s;
}

std::pair<int64_t, int64_t> qwen_size(int64_t h, int64_t w, Qwen35ImageSettings s) {
  auto size = qwen3_5_resized_size(h, w, s);
  EXPECT_TRUE(size.ok()) << size.error().message;
  return size.ok() ? *size : std::pair<int64_t, int64_t>{};
}

// smart_resize, worked in Python: {height, width}
TEST(Qwen35ImageProcessor, SmartResize) {
  const Qwen35ImageSettings release = qwen_release();
  EXPECT_EQ(qwen_size(103, 150, release), (std::pair<int64_t, int64_t>{224, 320}));  // up to min_pixels
  EXPECT_EQ(qwen_size(5000, 3000, release), (std::pair<int64_t, int64_t>{4992, 3008}));
  EXPECT_EQ(qwen_size(103, 150, Qwen35ImageSettings{}), (std::pair<int64_t, int64_t>{112, 140}));  // class defaults
  Qwen35ImageSettings loose = release;
  loose.min_pixels = 1;
  EXPECT_EQ(qwen_size(80, 80, loose), (std::pair<int64_t, int64_t>{64, 64}));  // round(2.5) = 2: halves to even
  EXPECT_EQ(qwen_size(48, 48, loose), (std::pair<int64_t, int64_t>{64, 64}));  // round(1.5) = 2
  Qwen35ImageSettings small = release;
  small.min_pixels = 4096, small.max_pixels = 24576;
  EXPECT_EQ(qwen_size(301, 400, small), (std::pair<int64_t, int64_t>{128, 160}));  // down to max_pixels
  auto thin = qwen3_5_resized_size(10, 2500, release);
  ASSERT_FALSE(thin.ok());
  EXPECT_NE(thin.error().message.find("aspect ratio of 250.0"), std::string::npos) << thin.error().message;
}

TEST(Qwen35ImageProcessor, Settings) {
  auto defaults = parse_qwen3_5_image_settings(nlohmann::json::object(), "none");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->patch_size, 14);
  EXPECT_EQ(defaults->min_pixels, 3136);
  EXPECT_EQ(defaults->max_pixels, 1003520);
  EXPECT_DOUBLE_EQ(defaults->scaling.mean[0], 0.48145466);
  // min_pixels / max_pixels override size, as __init__ does
  auto over = parse_qwen3_5_image_settings(
      {{"size", {{"shortest_edge", 100}, {"longest_edge", 200000}}}, {"max_pixels", 50000}}, "p");
  ASSERT_TRUE(over.ok());
  EXPECT_EQ(over->min_pixels, 100);
  EXPECT_EQ(over->max_pixels, 50000);
  auto bad = parse_qwen3_5_image_settings({{"image_std", {0.5, 0.5}}}, "preprocessor_config.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("image_std must be"), std::string::npos);
}

// HF's view(gt, tp, c, gh/m, m, p, gw/m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8), by hand
TEST(Qwen35ImageProcessor, PatchLayout) {
  Qwen35ImageSettings s;
  s.patch_size = 16, s.do_resize = false;
  s.scaling = PixelScaling{};             // rescale only, to compare with the bytes
  const RgbImage img = numbered(64, 32);  // grid 2 x 4 patches, blocks of 2 x 2
  auto out = make_qwen3_5_image_processor(s, qwen_placeholder())->process(img);
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(out->grid, (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(out->soft_tokens, 2);
  ASSERT_EQ(out->pixels.shape(), (Shape{8, 3 * 2 * 16 * 16}));
  // patch order: block (0,0): (0,0) (0,1) (1,0) (1,1); block (0,1): (0,2) (0,3) (1,2) (1,3)
  const int64_t rows[] = {0, 0, 1, 1, 0, 0, 1, 1}, cols[] = {0, 1, 0, 1, 2, 3, 2, 3};
  const float* px = out->pixels.data_as<float>();
  for (int64_t i = 0; i < 8; ++i)
    for (int c = 0; c < 3; ++c)
      for (int t = 0; t < 2; ++t)
        for (int64_t dy : {0, 7, 15})
          for (int64_t dx : {0, 11, 15})
            EXPECT_EQ(px[i * 1536 + ((c * 2 + t) * 16 + dy) * 16 + dx],
                      rescaled(img, cols[i] * 16 + dx, rows[i] * 16 + dy, c))
                << i << " " << c << " " << t;
}

std::vector<ProcessedImage> with_soft_tokens(std::initializer_list<int64_t> counts) {
  std::vector<ProcessedImage> images;
  for (int64_t n : counts) images.push_back(ProcessedImage{.soft_tokens = n});
  return images;
}

TEST(ImagePlaceholders, ExpandAsTheProcessorsDo) {
  const auto two = with_soft_tokens({3, 1});
  auto gemma = expand_image_placeholders("a <|image|> b<|image|>", gemma_placeholder(), two);
  ASSERT_TRUE(gemma.ok());
  EXPECT_EQ(*gemma, "a <|image><|image|><|image|><|image|><image|> b<|image><|image|><image|>");
  auto qwen = expand_image_placeholders(
      "<|vision_start|><|image_pad|><|vision_end|>x<|vision_start|><|image_pad|><|vision_end|>", qwen_placeholder(),
      two);
  ASSERT_TRUE(qwen.ok());
  EXPECT_EQ(*qwen,
            "<|vision_start|><|image_pad|><|image_pad|><|image_pad|><|vision_end|>x<|vision_start|><|image_pad|><|"
            "vision_end|>");
  auto more = expand_image_placeholders("<|image|> and <|image|>", gemma_placeholder(), with_soft_tokens({4}));
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(more.error().message, "the prompt holds 2 image placeholders (<|image|>) for 1 image");
}

TEST(ImagePlaceholders, RunsInExpandedIds) {
  const int32_t I = 258880;
  const std::vector<int32_t> ids = {2, 255999, I, I, I, 258882, 9, 255999, I, 258882};
  auto offsets = find_image_runs(ids, gemma_placeholder(), with_soft_tokens({3, 1}));
  ASSERT_TRUE(offsets.ok()) << offsets.error().message;
  EXPECT_EQ(*offsets, (std::vector<int64_t>{2, 8}));
  auto short_run = find_image_runs(ids, gemma_placeholder(), with_soft_tokens({3, 2}));
  ASSERT_FALSE(short_run.ok());
  EXPECT_EQ(short_run.error().message, "image 2 fills 2 soft tokens, but the run of image tokens at id 8 is 1 long");
  auto count = find_image_runs(ids, gemma_placeholder(), with_soft_tokens({3}));
  ASSERT_FALSE(count.ok());
  EXPECT_EQ(count.error().message, "the ids hold 2 runs of the image token 258880 (<|image|>) for 1 image");
}

// A model directory with the files a release ships, in a temporary folder.
struct ModelDir {
  fs::path dir;
  explicit ModelDir(const std::string& name) : dir(fs::temp_directory_path() / ("kiln_image_" + name)) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~ModelDir() { fs::remove_all(dir); }
  void write(const std::string& file, const nlohmann::json& j) const { std::ofstream(dir / file) << j.dump(); }
};

TEST(ImageProcessorFactory, FromTheFamilyDescriptor) {
  ModelDir gemma("gemma");
  gemma.write("config.json", {{"model_type", "gemma4"},
                              {"image_token_id", 258880},
                              {"text_config", {{"model_type", "gemma4_text"}}},
                              {"vision_config", {{"model_type", "gemma4_vision"}}}});
  gemma.write("processor_config.json",
              {{"image_seq_length", 280},
               {"image_processor", {{"image_processor_type", "Gemma4ImageProcessor"}, {"max_soft_tokens", 560}}}});
  gemma.write("preprocessor_config.json", {{"max_soft_tokens", 70}});  // processor_config.json wins
  auto config = read_model_config(gemma.dir.string());
  ASSERT_TRUE(config.ok()) << config.error().message;
  auto family = family_of(*config);
  ASSERT_TRUE(family.ok());
  auto processor = (*family)->image_processor(gemma.dir.string(), *config);
  ASSERT_TRUE(processor.ok()) << processor.error().message;
  EXPECT_EQ((*processor)->describe(),
            "Gemma4ImageProcessor (max_soft_tokens 560, patch_size 16, pooling_kernel_size 3)");
  EXPECT_EQ((*processor)->placeholder().token, "<|image|>");
  EXPECT_EQ((*processor)->placeholder().begin, "<|image>");
  EXPECT_EQ((*processor)->placeholder().token_id, 258880);

  ModelDir qwen("qwen");
  qwen.write("config.json", {{"model_type", "qwen3_5"},
                             {"image_token_id", 248056},
                             {"text_config", {{"model_type", "qwen3_5_text"}}},
                             {"vision_config", {{"depth", 2}}}});
  qwen.write("preprocessor_config.json", {{"patch_size", 16}, {"min_pixels", 4096}, {"max_pixels", 65536}});
  auto qconfig = read_model_config(qwen.dir.string());
  ASSERT_TRUE(qconfig.ok()) << qconfig.error().message;
  auto qprocessor = qwen3_5_family().image_processor(qwen.dir.string(), *qconfig);
  ASSERT_TRUE(qprocessor.ok()) << qprocessor.error().message;
  EXPECT_EQ((*qprocessor)->describe(),
            "Qwen2VLImageProcessor (patch_size 16, merge_size 2, temporal_patch_size 2, pixels 4096..65536)");
  EXPECT_EQ((*qprocessor)->placeholder().token, "<|image_pad|>");
  EXPECT_EQ((*qprocessor)->placeholder().token_id, 248056);

  ModelDir text("text");
  text.write("config.json", {{"model_type", "qwen3_5_text"}});
  auto tconfig = read_model_config(text.dir.string());
  ASSERT_TRUE(tconfig.ok());
  auto none = qwen3_5_family().image_processor(text.dir.string(), *tconfig);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("has no vision_config: this model takes no images"), std::string::npos);

  gemma.write("processor_config.json", {{"image_processor", {{"max_soft_tokens", "many"}}}});
  auto broken = gemma4_family().image_processor(gemma.dir.string(), *config);
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.error().message.find("processor_config.json"), std::string::npos) << broken.error().message;
}

// ---- against transformers ----

struct OracleCase {
  std::string dir;
  nlohmann::json meta;
};

std::vector<OracleCase> oracle_cases() {
  std::vector<OracleCase> cases;
  if (!fs::is_directory(oracle_dir())) return cases;
  for (const auto& entry : fs::recursive_directory_iterator(oracle_dir()))
    if (entry.path().filename() == "meta.json")
      cases.push_back({entry.path().parent_path().string(), test::read_json(entry.path().string())});
  std::sort(cases.begin(), cases.end(), [](const auto& a, const auto& b) { return a.dir < b.dir; });
  return cases;
}

Result<std::unique_ptr<ImageProcessor>> oracle_processor(const nlohmann::json& meta) {
  const std::string where = "oracle " + meta["setting"].get<std::string>();
  if (meta["family"] == "gemma4") {
    KILN_ASSIGN(auto s, parse_gemma4_image_settings(meta["settings"], where, false));
    return make_gemma4_image_processor(s, gemma_placeholder());
  }
  KILN_ASSIGN(auto s, parse_qwen3_5_image_settings(meta["settings"], where));
  return make_qwen3_5_image_processor(s, qwen_placeholder());
}

uint64_t fnv1a64(const std::vector<uint8_t>& bytes) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (uint8_t b : bytes) h = (h ^ b) * 0x100000001B3ull;
  return h;
}

TEST(ImageProcessorOracle, PixelsGridsAndSoftTokens) {
  const auto cases = oracle_cases();
  if (cases.empty())
    GTEST_SKIP() << "no oracle fixtures in " << oracle_dir() << ": run tools/oracle/make_image_fixtures.py";
  for (const auto& c : cases) {
    const nlohmann::json& m = c.meta;
    SCOPED_TRACE(m["setting"].get<std::string>() + " / " + m["image"].get<std::string>());
    auto image = read_image(images_dir() + "/" + m["image"].get<std::string>());
    ASSERT_TRUE(image.ok()) << image.error().message;
    EXPECT_EQ(image->width, m["decoded"]["width"].get<int64_t>());
    EXPECT_EQ(image->height, m["decoded"]["height"].get<int64_t>());
    EXPECT_EQ(fmt::format("{:016x}", fnv1a64(image->pixels)), m["decoded"]["fnv1a64"].get<std::string>())
        << "the decoded RGB differs from PIL's";

    auto processor = oracle_processor(m);
    ASSERT_TRUE(processor.ok()) << processor.error().message;
    auto out = (*processor)->process(*image);
    ASSERT_TRUE(out.ok()) << out.error().message;
    EXPECT_EQ(out->grid, m["grid"].get<std::vector<int64_t>>());
    EXPECT_EQ(out->soft_tokens, m["soft_tokens"].get<int64_t>());
    const int64_t patches = m["patches"], values = m["values"];
    ASSERT_EQ(out->pixels.shape(), (Shape{patches, values}));
    const float* px = out->pixels.data_as<float>();

    auto rows = read_npy(c.dir + "/rows.npy");
    ASSERT_TRUE(rows.ok()) << rows.error().message;
    const auto picks = m["sampled_rows"].get<std::vector<int64_t>>();
    ASSERT_EQ(rows->shape, (std::vector<int64_t>{int64_t(picks.size()), values}));
    double worst = 0;
    int64_t worst_at = -1;
    for (size_t r = 0; r < picks.size(); ++r)
      for (int64_t v = 0; v < values; ++v) {
        const double d = std::abs(double(px[picks[r] * values + v]) - double(rows->f32[r * values + v]));
        if (d > worst) worst = d, worst_at = picks[r] * values + v;
      }
    EXPECT_LE(worst, 1e-2) << "largest difference at patch " << worst_at / values << " value " << worst_at % values;

    auto sums = read_npy(c.dir + "/row_sums.npy");
    ASSERT_TRUE(sums.ok()) << sums.error().message;
    ASSERT_EQ(int64_t(sums->f32.size()), patches);
    int bad_rows = 0;
    for (int64_t r = 0; r < patches; ++r) {
      double sum = 0;
      for (int64_t v = 0; v < values; ++v) sum += px[r * values + v];
      // every value within 1e-2 bounds the row's sum by 1e-2 per value
      if (std::abs(sum - sums->f32[r]) > 1e-2 * double(values) + 1e-3 * std::abs(sums->f32[r])) ++bad_rows;
    }
    EXPECT_EQ(bad_rows, 0) << "patch rows whose sums differ from HF's";
  }
}

// The tiny tokenizer the oracle runs the HF processor with: its special tokens split out first,
// the rest split on whitespace, each piece looked up in the vocabulary.
std::vector<int32_t> tiny_tokenize(const std::string& text, const nlohmann::json& record) {
  const auto vocab = record["vocab"].get<std::map<std::string, int32_t>>();
  const auto specials = record["specials"].get<std::vector<std::string>>();
  const int32_t unk = vocab.at(record["unk"].get<std::string>());
  std::vector<int32_t> ids;
  std::string word;
  auto flush = [&] {
    if (word.empty()) return;
    auto it = vocab.find(word);
    ids.push_back(it == vocab.end() ? unk : it->second);
    word.clear();
  };
  for (size_t i = 0; i < text.size();) {
    const std::string* hit = nullptr;
    for (const auto& s : specials)
      if (text.compare(i, s.size(), s) == 0 && (!hit || s.size() > hit->size())) hit = &s;
    if (hit) {
      flush();
      ids.push_back(vocab.at(*hit));
      i += hit->size();
    } else if (std::isspace(static_cast<unsigned char>(text[i]))) {
      flush();
      ++i;
    } else {
      word += text[i++];
    }
  }
  flush();
  return ids;
}

TEST(ImageProcessorOracle, PlaceholderExpansion) {
  int seen = 0;
  for (const char* family : {"gemma4", "qwen3_5"}) {
    const std::string path = oracle_dir() + "/expansion_" + family + ".json";
    if (!fs::exists(path)) continue;
    ++seen;
    SCOPED_TRACE(family);
    const nlohmann::json record = test::read_json(path);
    const nlohmann::json meta = test::read_json(oracle_dir() + "/" + record["setting"].get<std::string>() + "/" + [&] {
      std::string n = record["images"][0];
      std::replace(n.begin(), n.end(), '.', '_');
      return n;
    }() + "/meta.json");
    auto processor = oracle_processor(meta);
    ASSERT_TRUE(processor.ok()) << processor.error().message;
    std::vector<ProcessedImage> images;
    for (const auto& name : record["images"]) {
      auto image = read_image(images_dir() + "/" + name.get<std::string>());
      ASSERT_TRUE(image.ok()) << image.error().message;
      auto out = (*processor)->process(*image);
      ASSERT_TRUE(out.ok()) << out.error().message;
      images.push_back(std::move(*out));
    }
    ImagePlaceholder placeholder = (*processor)->placeholder();
    placeholder.token_id = record["vocab"][placeholder.token].get<int32_t>();  // the tiny tokenizer's id
    auto text = expand_image_placeholders(record["text"].get<std::string>(), placeholder, images);
    ASSERT_TRUE(text.ok()) << text.error().message;
    const auto ids = tiny_tokenize(*text, record);
    EXPECT_EQ(ids, record["input_ids"].get<std::vector<int32_t>>());
    auto runs = find_image_runs(ids, placeholder, images);
    ASSERT_TRUE(runs.ok()) << runs.error().message;
    EXPECT_EQ(runs->size(), images.size());
  }
  if (seen == 0)
    GTEST_SKIP() << "no expansion fixtures in " << oracle_dir() << ": run tools/oracle/make_image_fixtures.py";
}

}  // namespace
}  // namespace kiln
