// Gemma 4's images on the CPU: bidirectional attention over image spans against a brute-force
// mask written from transformers' mask functions, the spans a batch carries, the image front ends
// on synthetic release-form checkpoints (shapes, determinism, errors), soft tokens in the text model
// (a text prompt unchanged by the vision path; what the placeholders' own ids do not change), and
// parity with transformers on the oracle fixtures that hold images (skipped, visibly, while there
// are none: tools/oracle/make_vision_fixtures.py writes them).
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "convert/check_model.h"
#include "io/config.h"
#include "io/synthetic.h"
#include "layers/attention.h"
#include "models/batch_prep.h"
#include "models/family.h"
#include "models/model.h"
#include "test_util.h"
#include "vision_test_util.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

Tensor random_host(std::mt19937& rng, Shape shape, float std = 1.0f) {
  Tensor t = host_tensor(DType::f32, shape);
  std::normal_distribution<float> dist(0.0f, std);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = dist(rng);
  return t;
}

// ---- the attention mask over image spans ----

// An image's soft tokens in a sequence: positions [begin, end).
struct Span {
  int64_t begin, end;
};

// transformers' block ids (get_block_sequence_ids_for_mask): contiguous image tokens share one id.
std::vector<int> block_ids(int64_t length, const std::vector<Span>& spans) {
  std::vector<bool> image(size_t(length), false);
  for (const Span& s : spans)
    for (int64_t i = s.begin; i < s.end; ++i) image[size_t(i)] = true;
  std::vector<int> ids(size_t(length), -1);
  int group = -1;
  for (int64_t i = 0; i < length; ++i) {
    if (image[size_t(i)] && (i == 0 || !image[size_t(i - 1)])) ++group;
    if (image[size_t(i)]) ids[size_t(i)] = group;
  }
  return ids;
}

// The masks of transformers 5.17 as predicates over (query, key) positions:
//   window_and (gemma4's sliding layers, create_masks_for_vision_model):
//     sliding_window_overlay AND (causal OR blockwise)
//   otherwise (create_causal_mask / create_sliding_window_causal_mask with block_sequence_ids):
//     (causal AND sliding_window_overlay) OR blockwise
bool hf_visible(int64_t q, int64_t kv, int64_t window, bool window_and, const std::vector<int>& blocks) {
  const bool causal = kv <= q;
  const bool in_window = window <= 0 || kv > q - window;
  const bool same_block = blocks[size_t(q)] >= 0 && blocks[size_t(q)] == blocks[size_t(kv)];
  return window_and ? in_window && (causal || same_block) : (causal && in_window) || same_block;
}

// Softmax attention of one query row over all keys of the sequence, under `visible`.
void dense_attention(const float* q, const float* k, const float* v, int64_t length, int hd, int64_t qpos,
                     const std::function<bool(int64_t)>& visible, float* out) {
  std::vector<double> p(size_t(length), 0.0);
  double max_score = -INFINITY;
  for (int64_t j = 0; j < length; ++j) {
    if (!visible(j)) continue;
    double dot = 0;
    for (int d = 0; d < hd; ++d) dot += double(q[d]) * k[j * hd + d];
    p[size_t(j)] = dot;
    max_score = std::max(max_score, dot);
  }
  double denom = 0;
  std::vector<double> acc(size_t(hd), 0.0);
  for (int64_t j = 0; j < length; ++j) {
    if (!visible(j)) continue;
    const double e = std::exp(p[size_t(j)] - max_score);
    denom += e;
    for (int d = 0; d < hd; ++d) acc[size_t(d)] += e * v[j * hd + d];
  }
  (void)qpos;
  for (int d = 0; d < hd; ++d) out[d] = float(acc[size_t(d)] / denom);
}

struct MaskCase {
  int64_t window;
  bool block_window;
};
void PrintTo(const MaskCase& c, std::ostream* os) {
  *os << "window " << c.window << (c.block_window ? " and window" : " or block");
}

class ImageAttention : public testing::TestWithParam<MaskCase> {};

// Two sequences prefilled in chunks through ring caches (as a sliding layer keeps them), then a few
// decode steps; images adjacent to each other (one block), one longer than the window, and chunks
// that never split an image. Every output row against the dense softmax under transformers' mask.
TEST_P(ImageAttention, MatchesTransformersMasks) {
  const MaskCase mc = GetParam();
  CpuBackend backend(2);
  std::mt19937 rng(7);
  const int heads = 2, hd = 8;
  struct Seq {
    int64_t length;
    std::vector<Span> images;
    std::vector<int64_t> chunk_ends;  // prefill chunks end at these positions; then decode steps
  };
  const std::vector<Seq> seqs = {
      {40, {{5, 13}, {13, 17}, {25, 36}}, {5, 20, 24, 37}},
      {30, {{2, 4}, {10, 22}}, {1, 9, 23}},
  };
  const int64_t max_chunk = 16;
  const int64_t capacity = mc.window ? mc.window - 1 + max_chunk : 64;
  // the whole sequences' queries, keys and values, [length, heads, hd]
  std::vector<Tensor> q, k, v;
  std::vector<std::unique_ptr<SequenceState>> states;
  std::vector<KvCacheView> caches;
  for (const Seq& s : seqs) {
    q.push_back(random_host(rng, Shape{s.length, heads, hd}));
    k.push_back(random_host(rng, Shape{s.length, heads, hd}));
    v.push_back(random_host(rng, Shape{s.length, heads, hd}));
    states.push_back(std::make_unique<SequenceState>(std::vector<LayerState>{}, s.length));
    caches.push_back(new_kv_cache(backend, capacity, heads, hd));
  }
  const Tensor dummy_rows = backend.alloc(DType::f32, Shape{64, 4});
  std::vector<int64_t> done(seqs.size(), 0);
  int64_t compared = 0;
  for (int step = 0;; ++step) {
    // each sequence's next chunk: to its next chunk end, then a token at a time
    std::vector<SeqChunk> chunks;
    std::vector<std::vector<int32_t>> tokens(seqs.size());
    std::vector<std::vector<SoftTokens>> soft(seqs.size());
    std::vector<size_t> in_batch;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int64_t begin = done[s];
      if (begin >= seqs[s].length) continue;
      int64_t end = begin + 1;
      for (int64_t e : seqs[s].chunk_ends)
        if (e > begin) {
          end = e;
          break;
        }
      end = std::min(end, seqs[s].length);
      tokens[s].assign(size_t(end - begin), 1);
      for (const Span& img : seqs[s].images) {
        if (img.end <= begin || img.begin >= end) continue;
        ASSERT_TRUE(img.begin >= begin && img.end <= end) << "the test's chunks must not split an image";
        const int64_t n = img.end - img.begin;
        soft[s].push_back(SoftTokens{.offset = img.begin - begin, .rows = dummy_rows.rows_view(0, n), .image_rows = n});
      }
      chunks.push_back(SeqChunk{.state = states[s].get(), .tokens = tokens[s], .soft = soft[s]});
      in_batch.push_back(s);
    }
    if (chunks.empty()) break;
    auto prepared = prepare_batch(backend, chunks, 8, max_chunk, BatchNeeds{.hidden = 4, .image_spans = true});
    ASSERT_TRUE(prepared.ok()) << prepared.error().message;
    const BatchLayout& layout = prepared->layout;
    const int64_t T = layout.n_tokens;
    Tensor qb = host_tensor(DType::f32, Shape{T, heads, hd}), kb = host_tensor(DType::f32, Shape{T, heads, hd}),
           vb = host_tensor(DType::f32, Shape{T, heads, hd});
    std::vector<KvCacheView> batch_caches;
    for (size_t i = 0; i < in_batch.size(); ++i) {
      const size_t s = in_batch[i];
      const SeqRows& rows = layout.seqs[i];
      const int64_t row_elems = heads * hd;
      for (int64_t r = 0; r < rows.n_rows; ++r)
        for (const auto& [dst, src] : {std::pair{&qb, &q[s]}, std::pair{&kb, &k[s]}, std::pair{&vb, &v[s]}})
          std::copy_n(src->data_as<float>() + (rows.pos_begin + r) * row_elems, row_elems,
                      dst->data_as<float>() + (rows.row_begin + r) * row_elems);
      batch_caches.push_back(caches[s]);
    }
    backend.kv_write(
        KvWriteArgs{.k = kb, .v = vb, .positions = layout.positions, .seqs = layout.seqs, .caches = batch_caches});
    Tensor out = backend.alloc(DType::f32, Shape{T, heads, hd});
    backend.attention(AttentionArgs{.q = qb,
                                    .out = out,
                                    .positions = layout.positions,
                                    .seqs = layout.seqs,
                                    .caches = batch_caches,
                                    .n_heads = heads,
                                    .n_kv_heads = heads,
                                    .head_dim = hd,
                                    .scale = 1.0f,
                                    .window = mc.window,
                                    .blocks = layout.soft_spans,
                                    .block_window = mc.block_window});
    for (size_t i = 0; i < in_batch.size(); ++i) {
      const size_t s = in_batch[i];
      const SeqRows& rows = layout.seqs[i];
      const auto blocks = block_ids(seqs[s].length, seqs[s].images);
      for (int64_t r = 0; r < rows.n_rows; ++r) {
        const int64_t pos = rows.pos_begin + r;
        for (int h = 0; h < heads; ++h) {
          // the keys of the sequence at this head: [length, hd]
          std::vector<float> kh(static_cast<size_t>(seqs[s].length * hd)), vh(static_cast<size_t>(seqs[s].length * hd));
          for (int64_t j = 0; j < seqs[s].length; ++j)
            for (int d = 0; d < hd; ++d) {
              kh[size_t(j * hd + d)] = k[s].data_as<float>()[(j * heads + h) * hd + d];
              vh[size_t(j * hd + d)] = v[s].data_as<float>()[(j * heads + h) * hd + d];
            }
          std::vector<float> want(static_cast<size_t>(hd));
          // over the whole sequence, as transformers' one forward sees it (the op has the keys up
          // to the chunk's end: no visible key lies beyond, as no chunk splits an image)
          dense_attention(
              q[s].data_as<float>() + (pos * heads + h) * hd, kh.data(), vh.data(), seqs[s].length, hd, pos,
              [&](int64_t j) { return hf_visible(pos, j, mc.window, mc.block_window, blocks); }, want.data());
          const float* got = out.data_as<float>() + ((rows.row_begin + r) * heads + h) * hd;
          for (int d = 0; d < hd; ++d)
            ASSERT_NEAR(got[d], want[size_t(d)], 1e-5) << "sequence " << s << " position " << pos << " head " << h;
          ++compared;
        }
      }
    }
    advance_sequences(layout);
    for (size_t i = 0; i < in_batch.size(); ++i) done[in_batch[i]] += layout.seqs[i].n_rows;
    ASSERT_LT(step, 100);
  }
  EXPECT_EQ(compared, (40 + 30) * heads);  // every row of both sequences, at every head
}

INSTANTIATE_TEST_SUITE_P(Masks, ImageAttention,
                         testing::Values(MaskCase{0, false}, MaskCase{0, true}, MaskCase{6, false}, MaskCase{6, true}),
                         [](const auto& info) {
                           return fmt::format("window{}_{}", info.param.window,
                                              info.param.block_window ? "and_window" : "or_block");
                         });

// A key the block would reach past the window: visible only when the block ignores the window.
TEST(ImageAttentionMask, TheWindowBoundsABlockOnlyWhenAsked) {
  const std::vector<int> blocks = block_ids(12, {{1, 11}});
  EXPECT_TRUE(hf_visible(9, 2, 4, false, blocks));
  EXPECT_FALSE(hf_visible(9, 2, 4, true, blocks));
  EXPECT_TRUE(hf_visible(2, 9, 4, true, blocks));    // forward within the image
  EXPECT_FALSE(hf_visible(0, 1, 0, false, blocks));  // text before the image stays causal
}

// ---- the spans a batch carries ----

TEST(ImageSpans, RowsOfARunOfImagesShareItsPositions) {
  CpuBackend backend(1);
  SequenceState state({}, 64);
  state.advance(3);
  const Tensor rows = backend.alloc(DType::f32, Shape{8, 4});
  std::vector<int32_t> tokens(10, 1);
  std::vector<SoftTokens> soft = {SoftTokens{.offset = 1, .rows = rows.rows_view(0, 2), .image_rows = 2},
                                  SoftTokens{.offset = 3, .rows = rows.rows_view(0, 3), .image_rows = 3},
                                  SoftTokens{.offset = 8, .rows = rows.rows_view(0, 1), .image_rows = 1}};
  std::vector<SeqChunk> chunk = {SeqChunk{.state = &state, .tokens = tokens, .soft = soft}};
  auto prepared = prepare_batch(backend, chunk, 4, 16, BatchNeeds{.hidden = 4, .image_spans = true});
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  const Tensor spans = backend.to_host(prepared->layout.soft_spans);
  const int32_t* s = spans.data_as<int32_t>();
  // positions 3..12: text, a run of two adjacent images [4, 8], text, text, one image [11, 11], text
  const std::vector<std::pair<int, int>> want = {{1, 0}, {4, 8}, {4, 8}, {4, 8},   {4, 8},
                                                 {4, 8}, {1, 0}, {1, 0}, {11, 11}, {1, 0}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(s[2 * i], want[i].first) << i;
    EXPECT_EQ(s[2 * i + 1], want[i].second) << i;
  }
  // without image spans the layout carries none
  auto plain = prepare_batch(backend, chunk, 4, 16, BatchNeeds{.hidden = 4});
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->layout.soft_spans.defined());
}

TEST(ImageSpans, AChunkThatSplitsAnImageIsRefused) {
  CpuBackend backend(1);
  SequenceState state({}, 64);
  const Tensor rows = backend.alloc(DType::f32, Shape{8, 4});
  std::vector<int32_t> tokens(4, 1);
  // the image's rows 5..7 of 8: the rest came in the previous chunk
  std::vector<SoftTokens> soft = {SoftTokens{.offset = 0, .rows = rows.rows_view(5, 3), .first = 5, .image_rows = 8}};
  std::vector<SeqChunk> chunk = {SeqChunk{.state = &state, .tokens = tokens, .soft = soft}};
  auto refused = prepare_batch(backend, chunk, 4, 16, BatchNeeds{.hidden = 4, .image_spans = true});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("one chunk"), std::string::npos) << refused.error().message;
  EXPECT_TRUE(prepare_batch(backend, chunk, 4, 16, BatchNeeds{.hidden = 4}).ok());  // causal models take parts
}

// ---- the image front ends on synthetic release-form checkpoints ----

class FrontEnds : public testing::TestWithParam<FrontEnd> {};

TEST_P(FrontEnds, EncodeShapesAndDeterminism) {
  const FrontEnd f = GetParam();
  TempDir tmp;
  const std::string dir = synthesize(tmp, f.name, f.config, lively(f.clip_bound));
  CpuBackend backend(2);
  auto model = load_model(dir, backend);
  ASSERT_TRUE(model.ok()) << model.error().message;
  for (const auto& part : (*model)->set_aside()) EXPECT_NE(part.part, "vision encoder");
  std::mt19937 rng(3);
  const ProcessedImage image = random_image(rng, f.rows, f.cols, f.values, f.soft);
  auto first = (*model)->encode_image(image);
  ASSERT_TRUE(first.ok()) << first.error().message;
  const int64_t hidden = (*model)->info().hidden_size;
  EXPECT_EQ(first->shape(), (Shape{f.soft, hidden}));
  const Tensor a = backend.to_host(*first);
  EXPECT_TRUE(all_finite(a));
  auto again = (*model)->encode_image(image);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(max_abs_diff(a, backend.to_host(*again)), 0.0) << "the same image encodes the same";
  // the rows differ from each other and with the image
  double spread = 0;
  for (int64_t c = 0; c < hidden; ++c)
    spread = std::max(spread, double(std::fabs(a.data_as<float>()[c] - a.data_as<float>()[hidden + c])));
  EXPECT_GT(spread, 0.0);
  const ProcessedImage other = random_image(rng, f.rows, f.cols, f.values, f.soft);
  auto encoded_other = (*model)->encode_image(other);
  ASSERT_TRUE(encoded_other.ok());
  EXPECT_GT(max_abs_diff(a, backend.to_host(*encoded_other)), 0.0);
  // the caller's pixels are left as they were
  std::mt19937 replay(3);
  EXPECT_EQ(max_abs_diff(image.pixels, random_image(replay, f.rows, f.cols, f.values, f.soft).pixels), 0.0);

  // errors: a count of soft tokens the grid does not give, a grid that does not hold the patches,
  // patches of another size
  ProcessedImage wrong = image;
  wrong.soft_tokens = f.soft + 1;
  EXPECT_FALSE((*model)->encode_image(wrong).ok());
  wrong = image;
  wrong.grid = {f.rows + 1, f.cols};
  EXPECT_FALSE((*model)->encode_image(wrong).ok());
  EXPECT_FALSE((*model)->encode_image(random_image(rng, f.rows, f.cols, f.values + 3, f.soft)).ok());
}

// kiln ls and kiln quantize check a checkpoint on the meta backend, which loads every front end
// without data: nothing of it is set aside.
TEST_P(FrontEnds, CheckedWithoutReadingWeights) {
  const FrontEnd f = GetParam();
  TempDir tmp;
  const std::string dir = synthesize(tmp, f.name, f.config, lively(f.clip_bound));
  auto parts = inspect_model(dir);
  ASSERT_TRUE(parts.ok()) << parts.error().message;
  for (const auto& part : *parts) EXPECT_NE(part.part, "vision encoder");
}

INSTANTIATE_TEST_SUITE_P(Gemma4, FrontEnds, testing::ValuesIn(front_ends()),
                         [](const auto& info) { return info.param.name; });

TEST(Gemma4Images, ACheckpointWithoutTheTowerRunsTextAndSaysWhatIsMissing) {
  CpuBackend backend(1);
  {  // a wrapper whose vision_config the files do not back (two stray tower tensors)
    auto model = load_model(fixture_path("gemma4_keqv"), backend);
    ASSERT_TRUE(model.ok()) << model.error().message;
    std::mt19937 rng(1);
    auto encoded = (*model)->encode_image(random_image(rng, 6, 6, 768, 4));
    ASSERT_FALSE(encoded.ok());
    EXPECT_NE(encoded.error().message.find("vision_tower."), std::string::npos) << encoded.error().message;
  }
  {  // a text-only checkpoint
    auto model = load_model(fixture_path("gemma4_dense"), backend);
    ASSERT_TRUE(model.ok());
    std::mt19937 rng(1);
    auto encoded = (*model)->encode_image(random_image(rng, 6, 6, 768, 4));
    ASSERT_FALSE(encoded.ok());
    EXPECT_NE(encoded.error().message.find("vision_config"), std::string::npos) << encoded.error().message;
  }
}

// The logits of `tokens` with `images` (encoded, at their offsets) in one forward.
Result<Tensor> logits_with_images(Model& model, const std::vector<int32_t>& tokens,
                                  const std::vector<std::pair<int64_t, Tensor>>& images) {
  KILN_ASSIGN(auto state, model.new_sequence(int64_t(tokens.size())));
  std::vector<SoftTokens> soft;
  for (const auto& [offset, rows] : images)
    soft.push_back(SoftTokens{.offset = offset, .rows = rows, .image_rows = rows.rows()});
  std::vector<SeqChunk> chunk = {SeqChunk{.state = state.get(), .tokens = tokens, .soft = soft}};
  KILN_ASSIGN(Tensor logits, model.forward(chunk, LogitRows::all));
  return model.backend().to_host(logits);
}

TEST(Gemma4Images, ATextPromptIsUnchangedByTheVisionPath) {
  TempDir tmp;
  const FrontEnd f = front_ends()[1];  // 26B-like: bidirectional images in the sliding layers
  const std::string with = synthesize(tmp, "with", f.config);
  nlohmann::json text_only = f.config;
  text_only.erase("vision_config");
  text_only["text_config"]["use_bidirectional_attention"] = nullptr;
  const std::string without = synthesize(tmp, "without", text_only);
  CpuBackend backend(2);
  auto a = load_model(with, backend), b = load_model(without, backend);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<int32_t> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back(int32_t(3 + (i * 37) % 300));
  auto la = logits_with_images(**a, tokens, {}), lb = logits_with_images(**b, tokens, {});
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_EQ(max_abs_diff(*la, *lb), 0.0);
}

TEST(Gemma4Images, SoftTokensReplaceThePlaceholders) {
  TempDir tmp;
  for (const FrontEnd& f : {front_ends()[0], front_ends()[1]}) {  // with per-layer inputs; bidirectional
    const std::string dir = synthesize(tmp, f.name, f.config, lively(f.clip_bound));
    CpuBackend backend(2);
    auto model = load_model(dir, backend);
    ASSERT_TRUE(model.ok()) << model.error().message;
    std::mt19937 rng(5);
    auto encoded = (*model)->encode_image(random_image(rng, f.rows, f.cols, f.values, f.soft));
    ASSERT_TRUE(encoded.ok()) << encoded.error().message;
    std::vector<int32_t> tokens;
    for (int i = 0; i < 30; ++i) tokens.push_back(int32_t(3 + (i * 53) % 300));
    const int64_t at = 7;
    auto image = logits_with_images(**model, tokens, {{at, *encoded}});
    ASSERT_TRUE(image.ok()) << image.error().message;
    // the placeholders' own ids change nothing: their embeddings are replaced, their per-layer
    // inputs read the pad token
    std::vector<int32_t> other = tokens;
    for (int64_t i = 0; i < f.soft; ++i) other[size_t(at + i)] = int32_t(100 + i);
    auto relabeled = logits_with_images(**model, other, {{at, *encoded}});
    ASSERT_TRUE(relabeled.ok());
    EXPECT_EQ(max_abs_diff(*image, *relabeled), 0.0) << f.name;
    // and the image changes the logits from its first row on
    auto text = logits_with_images(**model, tokens, {});
    ASSERT_TRUE(text.ok());
    const int64_t vocab = (*model)->info().vocab_size;
    EXPECT_EQ(max_abs_diff(text->rows_view(0, at).reshape(Shape{at * vocab}),
                           image->rows_view(0, at).reshape(Shape{at * vocab})),
              0.0)
        << "rows before the image";
    EXPECT_GT(max_abs_diff(*text, *image), 0.0);
  }
}

// ---- parity with transformers on the oracle fixtures that hold images ----

struct FixtureImage {
  ProcessedImage image;
  int64_t offset = 0;
  std::optional<NpyArray> features;
};

std::vector<FixtureImage> fixture_images(const std::string& fixture) {
  std::vector<FixtureImage> out;
  for (const auto& entry : read_json(fixture_path(fixture) + "/images.json")) {
    FixtureImage f;
    auto pixels = read_npy(fixture_path(fixture) + "/" + entry["pixels"].get<std::string>());
    EXPECT_TRUE(pixels.ok());
    f.image.pixels = host_tensor(DType::f32, Shape{pixels->shape[0], pixels->shape[1]});
    std::copy(pixels->f32.begin(), pixels->f32.end(), f.image.pixels.data_as<float>());
    f.image.grid = entry["grid"].get<std::vector<int64_t>>();
    f.image.soft_tokens = entry["soft_tokens"].get<int64_t>();
    f.offset = entry["offset"].get<int64_t>();
    if (entry.contains("features")) {
      auto features = read_npy(fixture_path(fixture) + "/" + entry["features"].get<std::string>());
      EXPECT_TRUE(features.ok());
      f.features = *features;
    }
    out.push_back(std::move(f));
  }
  return out;
}

TEST(Gemma4ImageOracle, MatchesTransformers) {
  const auto fixtures = image_fixture_names("gemma4");
  if (fixtures.empty()) GTEST_SKIP() << "no oracle fixture holds images yet (tools/oracle/make_vision_fixtures.py)";
  for (const std::string& fixture : fixtures) {
    SCOPED_TRACE(fixture);
    const auto ids = fixture_ids(fixture);
    const auto images = fixture_images(fixture);
    auto reference = read_npy(fixture_path(fixture) + "/logits.npy");
    ASSERT_TRUE(reference.ok());
    // the whole prompt in one chunk, and in chunks that end at every image's end
    std::vector<std::vector<int64_t>> chunkings = {{int64_t(ids.size())}};
    std::vector<int64_t> ends;
    for (const auto& img : images) ends.push_back(img.offset + img.image.soft_tokens);
    ends.push_back(int64_t(ids.size()));
    chunkings.push_back(ends);
    for (const auto& chunk_ends : chunkings) {
      CpuBackend backend(2);
      auto model = load_model(fixture_path(fixture), backend, ModelOptions{.max_chunk_tokens = int64_t(ids.size())});
      ASSERT_TRUE(model.ok()) << model.error().message;
      std::vector<Tensor> encoded;
      for (const auto& img : images) {
        auto rows = (*model)->encode_image(img.image);
        ASSERT_TRUE(rows.ok()) << rows.error().message;
        if (img.features) {
          const Tensor got = backend.to_host(*rows);
          ASSERT_EQ(got.numel(), int64_t(img.features->f32.size()));
          auto c = compare_logits(got.data_as<float>(), img.features->f32.data(), got.rows(), got.cols());
          EXPECT_LE(c.relative(), 1e-4) << "image features: max |diff| " << c.max_abs_diff << " of "
                                        << c.max_abs_reference;
        }
        encoded.push_back(*rows);
      }
      auto state = (*model)->new_sequence(int64_t(ids.size()));
      ASSERT_TRUE(state.ok());
      std::vector<float> logits;
      int64_t begin = 0;
      for (int64_t end : chunk_ends) {
        std::vector<int32_t> tokens(ids.begin() + begin, ids.begin() + end);
        std::vector<SoftTokens> soft;
        for (size_t i = 0; i < images.size(); ++i)
          if (images[i].offset >= begin && images[i].offset < end)
            soft.push_back(
                SoftTokens{.offset = images[i].offset - begin, .rows = encoded[i], .image_rows = encoded[i].rows()});
        std::vector<SeqChunk> chunk = {SeqChunk{.state = state->get(), .tokens = tokens, .soft = soft}};
        auto out = (*model)->forward(chunk, LogitRows::all);
        ASSERT_TRUE(out.ok()) << out.error().message;
        const Tensor host = backend.to_host(*out);
        logits.insert(logits.end(), host.data_as<float>(), host.data_as<float>() + host.numel());
        begin = end;
      }
      const int64_t vocab = (*model)->info().vocab_size;
      ASSERT_EQ(reference->shape, (std::vector<int64_t>{int64_t(ids.size()), vocab}));
      auto c = compare_logits(logits.data(), reference->f32.data(), int64_t(ids.size()), vocab);
      EXPECT_LE(c.relative(), 1e-4) << chunk_ends.size() << " chunks: max |diff| " << c.max_abs_diff << " of "
                                    << c.max_abs_reference;
      EXPECT_GE(c.argmax_agreement, 0.99);
    }
  }
}

}  // namespace
}  // namespace kiln::test
