// Qwen 3.5's image path on the CPU: the multimodal RoPE layout of prompts (hand-worked from
// transformers' get_rope_index), three equal rotary axes against 1-D RoPE, the vision encoder
// against a naive reference written from the transformers modules, its mlx-vlm layout, shapes on
// synthetic release-form checkpoints, prompts with images through prefill and decode, checkpoints
// without a tower, and (when tests/fixtures holds them) transformers' own image fixtures.
//
// Image fixtures: a directory under tests/fixtures with images.json beside the usual files
// (config.json of a qwen3_5 or qwen3_5_moe wrapper, model.safetensors, ids.json, logits.npy):
//   images.json: [{"pixels": "pixel_values_0.npy", "grid_thw": [t, h, w]}, ...]  (pixels: f32
//     [t·h·w, C·T·P·P], the processor's pixel_values rows of that image)
//   optional: positions.npy (i32 [3, n], get_rope_index's position ids), image_embeds.npy (f32
//     [soft tokens of all images, hidden], get_image_features' pooler output, images concatenated).
// tests/test_util.h keeps these directories out of the text-only oracle tests.
#include <cstring>
#include <map>
#include <random>
#include <tuple>

#include "backend/cpu/cpu_backend.h"
#include "core/npy.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "io/synthetic.h"
#include "models/activation_dump.h"
#include "models/family.h"
#include "models/model.h"
#include "models/qwen3_5/mrope.h"
#include "models/qwen3_5/vision.h"
#include "qwen_vision_util.h"
#include "runtime/decode_loop.h"
#include "runtime/prefill.h"
#include "test_util.h"

namespace kiln::test {
namespace {

// ---- the position layout ----

constexpr int32_t kImage = 9;  // the placeholder id in these hand-worked prompts
const Qwen35PromptTokens kTokens{.image_token_id = kImage, .spatial_merge_size = 2};

// [t…, h…, w…] from three rows
Positions axes(const Positions& t, const Positions& h, const Positions& w) {
  Positions out = t;
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), w.begin(), w.end());
  return out;
}

Positions layout(const std::vector<int32_t>& ids, const std::vector<std::vector<int64_t>>& grids) {
  auto p = qwen3_5_rope_positions(ids, grids, kTokens);
  EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.error().message);
  return p.ok() ? *p : Positions{};
}

TEST(QwenMrope, TextAloneCountsOnAllAxes) {
  EXPECT_EQ(layout({1, 2, 3, 4}, {}), axes({0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}));
}

// A 1×4×4 patch grid merged 2×2 is 2×2 soft tokens: rows (0,0,1,1), columns (0,1,0,1) from the
// image's start; the text after it starts at start + max(4, 4) / 2.
TEST(QwenMrope, ImageAtTheStart) {
  const std::vector<int32_t> ids = {kImage, kImage, kImage, kImage, 5, 6, 7};
  EXPECT_EQ(layout(ids, {{1, 4, 4}}), axes({0, 0, 0, 0, 2, 3, 4}, {0, 0, 1, 1, 2, 3, 4}, {0, 1, 0, 1, 2, 3, 4}));
}

// 1×2×6 patches: one row of three soft tokens at 2; the text after at 2 + max(2, 6) / 2 = 5.
TEST(QwenMrope, ImageInTheMiddle) {
  const std::vector<int32_t> ids = {1, 2, kImage, kImage, kImage, 3, 4};
  EXPECT_EQ(layout(ids, {{1, 2, 6}}), axes({0, 1, 2, 2, 2, 5, 6}, {0, 1, 2, 2, 2, 5, 6}, {0, 1, 2, 3, 4, 5, 6}));
}

// Two images with text between and after: a 4×2 grid (two rows of one soft token) at 1, the
// text at 1 + 2 = 3, a 2×2 grid (one soft token) at 4, the last text at 4 + 1 = 5.
TEST(QwenMrope, TwoImagesAndTextAfter) {
  const std::vector<int32_t> ids = {1, kImage, kImage, 2, kImage, 3, 4};
  EXPECT_EQ(layout(ids, {{1, 4, 2}, {1, 2, 2}}),
            axes({0, 1, 1, 3, 4, 5, 6}, {0, 1, 2, 3, 4, 5, 6}, {0, 1, 1, 3, 4, 5, 6}));
}

// As the chat template writes an image: <|vision_start|> pads <|vision_end|>, here a 4×6 grid (2×3
// soft tokens) after three tokens of text: positions 0…2, the image over 3…5, then 6…9. Decoding
// continues by the rope delta max + 1 − length = 10 − 13 = −3.
TEST(QwenMrope, AsTheChatTemplateWritesIt) {
  const std::vector<int32_t> ids = {1, 2, 3, kImage, kImage, kImage, kImage, kImage, kImage, 4, 5, 6, 7};
  const Positions p = layout(ids, {{1, 4, 6}});
  EXPECT_EQ(p, axes({0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7, 8, 9}, {0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7, 8, 9},
                    {0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(*std::max_element(p.begin(), p.end()) + 1 - int32_t(ids.size()), -3);
}

// A grid of two frames (what the reference does with t > 1): frames count on the time axis.
TEST(QwenMrope, FramesCountOnTheTimeAxis) {
  const std::vector<int32_t> ids = {1, kImage, kImage, 2};
  EXPECT_EQ(layout(ids, {{2, 2, 2}}), axes({0, 1, 2, 2}, {0, 1, 1, 2}, {0, 1, 1, 2}));
}

TEST(QwenMrope, PlaceholdersAndImagesMustAgree) {
  auto short_run = qwen3_5_rope_positions(std::vector<int32_t>{1, kImage, kImage, 2},
                                          std::vector<std::vector<int64_t>>{{1, 4, 4}}, kTokens);
  ASSERT_FALSE(short_run.ok());
  EXPECT_NE(short_run.error().message.find("4 soft tokens"), std::string::npos) << short_run.error().message;
  auto no_image = qwen3_5_rope_positions(std::vector<int32_t>{1, kImage}, {}, kTokens);
  EXPECT_FALSE(no_image.ok());
  auto extra = qwen3_5_rope_positions(std::vector<int32_t>{1, kImage},
                                      std::vector<std::vector<int64_t>>{{1, 2, 2}, {1, 2, 2}}, kTokens);
  EXPECT_FALSE(extra.ok());
  auto odd =
      qwen3_5_rope_positions(std::vector<int32_t>{kImage}, std::vector<std::vector<int64_t>>{{1, 3, 2}}, kTokens);
  EXPECT_FALSE(odd.ok());
}

// transformers' apply_interleaved_mrope: of 32 pairs with mrope_section [11, 11, 10], the row takes
// 1, 4, …, 31, the column 2, 5, …, 29, the time the rest (0, 3, …, 30).
TEST(QwenMrope, PairAxesInterleave) {
  const std::vector<int64_t> section = {11, 11, 10};
  const std::vector<int32_t> a = qwen3_5_mrope_pair_axes(32, section);
  ASSERT_EQ(a.size(), 32u);
  int counts[3] = {0, 0, 0};
  for (int i = 0; i < 32; ++i) {
    const int want = i % 3 == 1 ? 1 : (i % 3 == 2 && i < 30) ? 2 : 0;
    EXPECT_EQ(a[size_t(i)], want) << i;
    ++counts[a[size_t(i)]];
  }
  EXPECT_EQ(counts[0], 11);
  EXPECT_EQ(counts[1], 11);
  EXPECT_EQ(counts[2], 10);
  // the fixtures' tiny heads: 4 pairs, [2, 1, 1]
  const std::vector<int64_t> tiny = {2, 1, 1};
  EXPECT_EQ(qwen3_5_mrope_pair_axes(4, tiny), (std::vector<int32_t>{0, 1, 2, 0}));
}

// The family's entry point reads the wrapper's image token and merge size.
TEST(QwenMrope, TheFamilyLaysOutAPromptFromItsConfig) {
  TempDir tmp;
  nlohmann::json config = read_json(fixture_path("qwen3_5_untied_mlx") + "/config.json");
  config["image_token_id"] = 7;
  config["vision_config"] = {{"spatial_merge_size", 1}};
  std::ofstream(tmp.path() + "/config.json") << config.dump();
  auto file = read_model_config(tmp.path());
  ASSERT_TRUE(file.ok()) << file.error().message;
  const ModelFamily* family = family_named("qwen3_5");
  ASSERT_TRUE(family && family->rope_positions);
  EXPECT_EQ(family_named("gemma4")->rope_positions, nullptr);
  auto p =
      family->rope_positions(*file, std::vector<int32_t>{3, 7, 7, 4}, std::vector<std::vector<int64_t>>{{1, 1, 2}});
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_EQ(*p, axes({0, 1, 1, 3}, {0, 1, 1, 3}, {0, 1, 2, 3}));
}

// ---- three equal axes are 1-D RoPE ----

std::vector<float> host_floats(const Tensor& t) {
  return std::vector<float>(t.data_as<float>(), t.data_as<float>() + t.numel());
}

TEST(QwenMrope, EqualAxesRotateAsOneDimensionalRope) {
  for (bool emulate : {false, true})
    for (bool normalize : {false, true}) {
      CpuBackend backend(2, emulate);
      const int64_t tokens = 11, heads = 3, hd = 32, pairs = 8;
      std::mt19937 rng(5);
      std::normal_distribution<float> dist(0.0f, 1.0f);
      Tensor x = host_tensor(DType::f32, Shape{tokens, heads, hd}), weight = host_tensor(DType::f32, Shape{hd});
      for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = dist(rng);
      for (int64_t i = 0; i < hd; ++i) weight.data_as<float>()[i] = dist(rng);
      Tensor freqs = host_tensor(DType::f32, Shape{pairs}), one = host_tensor(DType::i32, Shape{tokens}),
             three = host_tensor(DType::i32, Shape{3, tokens}), axis = host_tensor(DType::i32, Shape{pairs});
      for (int64_t i = 0; i < pairs; ++i) {
        freqs.data_as<float>()[i] = std::pow(1e7f, -float(2 * i) / float(2 * pairs));
        axis.data_as<int32_t>()[i] = int32_t(i % 3);
      }
      for (int64_t t = 0; t < tokens; ++t) {
        one.data_as<int32_t>()[t] = int32_t(t * 13 + 4);
        for (int a = 0; a < 3; ++a) three.data_as<int32_t>()[a * tokens + t] = int32_t(t * 13 + 4);
      }
      Tensor plain = backend.upload(x, backend.activation_dtype()),
             multi = backend.upload(x, backend.activation_dtype());
      const Tensor w = backend.upload(weight, DType::f32), f = backend.upload(freqs, DType::f32);
      auto args = [&](Tensor& t, const Tensor& positions, const Tensor& pair_axis) {
        return RopeArgs{.x = t,
                        .positions = positions,
                        .inv_freq = f,
                        .pair_offset = int(hd / 2),
                        .normalize = normalize,
                        .norm_weight = normalize ? w : Tensor(),
                        .norm_offset = 1.0f,
                        .pair_axis = pair_axis};
      };
      backend.rope(args(plain, backend.upload(one, DType::i32), Tensor()));
      backend.rope(args(multi, backend.upload(three, DType::i32), backend.upload(axis, DType::i32)));
      EXPECT_EQ(host_floats(backend.to_host(plain)), host_floats(backend.to_host(multi)))
          << "emulate " << emulate << " normalize " << normalize;
    }
}

// A text prompt whose laid-out positions are its token indices on all three axes gives the logits of
// the same prompt without them, bit for bit, in one forward and in chunks.
TEST(QwenMrope, LaidOutTextPositionsChangeNothing) {
  const auto ids = fixture_ids("qwen3_5_dense");
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 40);
  CpuBackend backend(2);
  auto model = load_model(fixture_path("qwen3_5_dense"), backend);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const int64_t n = int64_t(prompt.size());
  Positions laid(static_cast<size_t>(3 * n));
  for (int64_t a = 0; a < 3; ++a)
    for (int64_t i = 0; i < n; ++i) laid[size_t(a * n + i)] = int32_t(i);
  std::vector<std::vector<float>> runs;
  for (bool with_positions : {false, true}) {
    auto state = (*model)->new_sequence(n + 1);
    ASSERT_TRUE(state.ok());
    SeqChunk chunk{.state = state->get(), .tokens = prompt};
    if (with_positions) chunk.positions = laid;
    auto logits = (*model)->forward(std::span<const SeqChunk>(&chunk, 1), LogitRows::all);
    ASSERT_TRUE(logits.ok()) << logits.error().message;
    runs.push_back(host_floats(*logits));
    EXPECT_EQ((*state)->rope_offset(), 0);
  }
  EXPECT_EQ(runs[0], runs[1]);
}

// ---- a naive reference of the tower, written from transformers' modules in double ----

using Rows = std::vector<std::vector<double>>;

Rows linear(const Rows& x, const Tensor& w, const Tensor& b) {
  const int64_t out = w.dim(0), in = w.numel() / out;
  Rows y(x.size(), std::vector<double>(size_t(out)));
  for (size_t r = 0; r < x.size(); ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = b.data_as<float>()[o];
      for (int64_t i = 0; i < in; ++i) s += double(w.data_as<float>()[o * in + i]) * x[r][size_t(i)];
      y[r][size_t(o)] = s;
    }
  return y;
}

Rows layer_norm(const Rows& x, const Tensor& w, const Tensor& b) {  // nn.LayerNorm(eps=1e-6)
  Rows y = x;
  for (auto& row : y) {
    double mean = 0, var = 0;
    for (double v : row) mean += v;
    mean /= double(row.size());
    for (double v : row) var += (v - mean) * (v - mean);
    var /= double(row.size());
    for (size_t i = 0; i < row.size(); ++i)
      row[i] = (row[i] - mean) / std::sqrt(var + 1e-6) * w.data_as<float>()[i] + b.data_as<float>()[i];
  }
  return y;
}

Rows naive_tower(const TinyTower& c, const std::map<std::string, Tensor>& w, const ProcessedImage& image) {
  const int64_t t = image.grid[0], h = image.grid[1], wd = image.grid[2], m = c.merge, H = c.hidden;
  const int64_t frame = h * wd, n = t * frame, hd = H / c.heads;
  // the processor's patch order within a frame: blocks of m × m, block rows, block columns, then within
  std::vector<std::pair<int64_t, int64_t>> at;
  for (int64_t br = 0; br < h / m; ++br)
    for (int64_t bc = 0; bc < wd / m; ++bc)
      for (int64_t ir = 0; ir < m; ++ir)
        for (int64_t ic = 0; ic < m; ++ic) at.push_back({br * m + ir, bc * m + ic});
  // Conv3d with stride = kernel over one patch each: a dot product with the flattened kernel
  Rows x(size_t(n), std::vector<double>(size_t(c.values())));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < c.values(); ++k)
      x[size_t(i)][size_t(k)] = image.pixels.data_as<float>()[i * c.values() + k];
  Rows hs = linear(x, w.at("patch_embed.proj.weight"), w.at("patch_embed.proj.bias"));
  // F.interpolate(bilinear, align_corners=True) of the side × side table to h × w
  const float* table = w.at("pos_embed.weight").data_as<float>();
  auto axis = [&](int64_t i, int64_t size) {
    const double src = size > 1 ? double(i) * double(c.side - 1) / double(size - 1) : 0.0;
    const int64_t lo = int64_t(std::floor(src)), hi = std::min(lo + 1, c.side - 1);
    return std::tuple{lo, hi, src - double(lo)};
  };
  for (int64_t i = 0; i < n; ++i) {
    const auto [row, col] = at[size_t(i % frame)];
    const auto [r0, r1, fr] = axis(row, h);
    const auto [c0, c1, fc] = axis(col, wd);
    for (int64_t d = 0; d < H; ++d)
      hs[size_t(i)][size_t(d)] +=
          (1 - fr) * (1 - fc) * table[(r0 * c.side + c0) * H + d] + (1 - fr) * fc * table[(r0 * c.side + c1) * H + d] +
          fr * (1 - fc) * table[(r1 * c.side + c0) * H + d] + fr * fc * table[(r1 * c.side + c1) * H + d];
  }
  // rotate-half over whole heads: element j < hd/4 by the row, hd/4 <= j < hd/2 by the column
  auto rotate = [&](std::vector<double>& v, int64_t i) {
    const auto [row, col] = at[size_t(i % frame)];
    for (int64_t head = 0; head < c.heads; ++head) {
      double* e = v.data() + head * hd;
      for (int64_t j = 0; j < hd / 2; ++j) {
        const int64_t q = j % (hd / 4);
        const double freq = 1.0 / std::pow(c.theta, double(2 * q) / double(hd / 2));
        const double angle = double(j < hd / 4 ? row : col) * freq;
        const double a = e[j], b = e[j + hd / 2];
        e[j] = a * std::cos(angle) - b * std::sin(angle);
        e[j + hd / 2] = b * std::cos(angle) + a * std::sin(angle);
      }
    }
  };
  for (int64_t blk = 0; blk < c.depth; ++blk) {
    const std::string b = "blocks." + std::to_string(blk) + ".";
    const Rows qkv = linear(layer_norm(hs, w.at(b + "norm1.weight"), w.at(b + "norm1.bias")),
                            w.at(b + "attn.qkv.weight"), w.at(b + "attn.qkv.bias"));
    Rows q(static_cast<size_t>(n)), k(static_cast<size_t>(n)), v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const auto& r = qkv[size_t(i)];
      q[size_t(i)].assign(r.begin(), r.begin() + H);
      k[size_t(i)].assign(r.begin() + H, r.begin() + 2 * H);
      v[size_t(i)].assign(r.begin() + 2 * H, r.end());
      rotate(q[size_t(i)], i);
      rotate(k[size_t(i)], i);
    }
    Rows attn(size_t(n), std::vector<double>(size_t(H), 0.0));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t head = 0; head < c.heads; ++head) {
        const int64_t f0 = (i / frame) * frame;  // attention within the frame (cu_seqlens)
        std::vector<double> s(static_cast<size_t>(frame));
        double mx = -1e300, z = 0;
        for (int64_t j = 0; j < frame; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d)
            dot += q[size_t(i)][size_t(head * hd + d)] * k[size_t(f0 + j)][size_t(head * hd + d)];
          s[size_t(j)] = dot / std::sqrt(double(hd));
          mx = std::max(mx, s[size_t(j)]);
        }
        for (double& e : s) z += (e = std::exp(e - mx));
        for (int64_t j = 0; j < frame; ++j)
          for (int64_t d = 0; d < hd; ++d)
            attn[size_t(i)][size_t(head * hd + d)] += s[size_t(j)] / z * v[size_t(f0 + j)][size_t(head * hd + d)];
      }
    const Rows proj = linear(attn, w.at(b + "attn.proj.weight"), w.at(b + "attn.proj.bias"));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t d = 0; d < H; ++d) hs[size_t(i)][size_t(d)] += proj[size_t(i)][size_t(d)];
    Rows up = linear(layer_norm(hs, w.at(b + "norm2.weight"), w.at(b + "norm2.bias")),
                     w.at(b + "mlp.linear_fc1.weight"), w.at(b + "mlp.linear_fc1.bias"));
    for (auto& row : up)
      for (double& e : row) e = 0.5 * e * (1 + std::tanh(std::sqrt(2 / M_PI) * (e + 0.044715 * e * e * e)));
    const Rows down = linear(up, w.at(b + "mlp.linear_fc2.weight"), w.at(b + "mlp.linear_fc2.bias"));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t d = 0; d < H; ++d) hs[size_t(i)][size_t(d)] += down[size_t(i)][size_t(d)];
  }
  // the merger: norm, m² consecutive patches as one row, GELU (erf) MLP
  const Rows normed = layer_norm(hs, w.at("merger.norm.weight"), w.at("merger.norm.bias"));
  Rows merged(static_cast<size_t>(n / (m * m)));
  for (int64_t i = 0; i < n; ++i)
    merged[size_t(i / (m * m))].insert(merged[size_t(i / (m * m))].end(), normed[size_t(i)].begin(),
                                       normed[size_t(i)].end());
  Rows mid = linear(merged, w.at("merger.linear_fc1.weight"), w.at("merger.linear_fc1.bias"));
  for (auto& row : mid)
    for (double& e : row) e = 0.5 * e * (1 + std::erf(e / std::sqrt(2.0)));
  return linear(mid, w.at("merger.linear_fc2.weight"), w.at("merger.linear_fc2.bias"));
}

double max_relative(const Tensor& got, const Rows& want) {
  double diff = 0, scale = 1e-30;
  for (size_t r = 0; r < want.size(); ++r)
    for (size_t c = 0; c < want[r].size(); ++c) {
      diff = std::max(diff, std::fabs(double(got.data_as<float>()[r * want[r].size() + c]) - want[r][c]));
      scale = std::max(scale, std::fabs(want[r][c]));
    }
  return diff / scale;
}

TEST(QwenVision, EncoderMatchesANaiveReference) {
  const TinyTower c;
  const auto weights = tower_weights(c, 11);
  TempDir tmp;
  const std::string dir = tower_checkpoint(tmp, "hf", c, weights, false);
  CpuBackend backend(2);
  auto model = load_model(dir, backend);
  ASSERT_TRUE(model.ok()) << model.error().message;
  EXPECT_TRUE((*model)->set_aside().empty()) << (*model)->set_aside()[0].part;  // the tower is in use
  // grids: square, wide (rows resampled from fewer than the table's), one frame and two
  for (const auto& grid : std::vector<std::vector<int64_t>>{{1, 4, 4}, {1, 2, 6}, {1, 6, 4}, {2, 4, 2}}) {
    const ProcessedImage image = random_image(c, grid, 3);
    auto rows = (*model)->encode_image(image);
    ASSERT_TRUE(rows.ok()) << rows.error().message;
    ASSERT_EQ(rows->shape(), (Shape{image.soft_tokens, c.out}));
    const Tensor got = backend.to_host(*rows);
    EXPECT_LE(max_relative(got, naive_tower(c, weights, image)), 2e-5) << grid[0] << "x" << grid[1] << "x" << grid[2];
  }
}

// mlx-vlm's names and channels-last Conv3d, in an mlx conversion's sidecar: the same encoding.
TEST(QwenVision, MlxLayoutEncodesTheSame) {
  const TinyTower c;
  const auto weights = tower_weights(c, 12);
  TempDir tmp;
  CpuBackend backend(2);
  std::vector<std::vector<float>> outs;
  for (bool mlx : {false, true}) {
    auto model = load_model(tower_checkpoint(tmp, mlx ? "mlx" : "hf", c, weights, mlx), backend);
    ASSERT_TRUE(model.ok()) << model.error().message;
    EXPECT_TRUE((*model)->set_aside().empty());
    auto rows = (*model)->encode_image(random_image(c, {1, 4, 6}, 4));
    ASSERT_TRUE(rows.ok()) << rows.error().message;
    outs.push_back(host_floats(backend.to_host(*rows)));
  }
  EXPECT_EQ(outs[0], outs[1]);
}

// A wrapper whose config describes a tower the checkpoint lacks: text runs, the tower is reported
// missing, and encode_image says what is missing. A flat text model says it takes no images.
TEST(QwenVision, WithoutTowerWeightsTextStillRuns) {
  const TinyTower c;
  TempDir tmp;
  const std::string dir = tower_checkpoint(tmp, "bare", c, {}, false, false);
  CpuBackend backend(2);
  auto model = load_model(dir, backend);
  ASSERT_TRUE(model.ok()) << model.error().message;
  ASSERT_EQ((*model)->set_aside().size(), 1u);
  EXPECT_EQ((*model)->set_aside()[0].part, "vision encoder");
  EXPECT_EQ((*model)->set_aside()[0].tensors, 0u);
  auto encoded = (*model)->encode_image(random_image(c, {1, 2, 2}, 1));
  ASSERT_FALSE(encoded.ok());
  EXPECT_NE(encoded.error().message.find("no vision encoder weights"), std::string::npos) << encoded.error().message;
  // the text model is the oracle's: its logits
  const auto ids = fixture_ids("qwen3_5_dense");
  auto state = (*model)->new_sequence(int64_t(ids.size()));
  auto logits = run_tokens(**model, **state, ids, 64, LogitRows::all);
  ASSERT_TRUE(logits.ok()) << logits.error().message;
  auto want = read_npy(fixture_path("qwen3_5_dense") + "/logits.npy");
  ASSERT_TRUE(want.ok());
  auto cmp = compare_logits(logits->data_as<float>(), want->f32.data(), int64_t(ids.size()), logits->dim(1));
  EXPECT_LE(cmp.relative(), 1e-4);

  auto flat = load_model(fixture_path("qwen3_5_dense"), backend);
  ASSERT_TRUE(flat.ok());
  auto refused = (*flat)->encode_image(random_image(c, {1, 2, 2}, 1));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("text-only"), std::string::npos) << refused.error().message;
}

// A tower whose tensors are incomplete is an error naming the missing one, not a silent text model.
TEST(QwenVision, AnIncompleteTowerIsAnError) {
  const TinyTower c;
  auto weights = tower_weights(c, 13);
  weights.erase("blocks.1.attn.proj.bias");
  TempDir tmp;
  CpuBackend backend(1);
  auto model = load_model(tower_checkpoint(tmp, "broken", c, weights, false), backend);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.error().message.find("blocks.1.attn.proj.bias"), std::string::npos) << model.error().message;
}

TEST(QwenVision, ImagesThatDoNotFitTheTowerAreRefused) {
  const TinyTower c;
  TempDir tmp;
  CpuBackend backend(1);
  auto model = load_model(tower_checkpoint(tmp, "hf", c, tower_weights(c, 14), false), backend);
  ASSERT_TRUE(model.ok()) << model.error().message;
  ProcessedImage odd = random_image(c, {1, 3, 4}, 1);  // rows not a multiple of the merge
  EXPECT_FALSE((*model)->encode_image(odd).ok());
  ProcessedImage wrong = random_image(c, {1, 2, 4}, 1);
  wrong.soft_tokens = 3;
  EXPECT_FALSE((*model)->encode_image(wrong).ok());
  wrong = random_image(c, {1, 2, 4}, 1);
  wrong.grid = {1, 4, 4};  // pixels of 8 patches for a grid of 16
  EXPECT_FALSE((*model)->encode_image(wrong).ok());
}

// The whole path on the CPU: encode, lay out, prefill whole and in chunks that split the images,
// then decode (one forward a token, and the replayed decode loop) from the rope delta.
TEST(QwenVision, AnImagePromptPrefillsAndDecodes) {
  const TinyTower c;
  TempDir tmp;
  CpuBackend backend(2);
  auto model = load_model(tower_checkpoint(tmp, "hf", c, tower_weights(c, 15), false), backend);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const ImagePrompt p = two_image_prompt(c);
  std::vector<Tensor> encoded;
  std::vector<std::vector<int64_t>> grids;
  for (const auto& image : p.images) {
    auto rows = (*model)->encode_image(image);
    ASSERT_TRUE(rows.ok()) << rows.error().message;
    encoded.push_back(*rows);
    grids.push_back(image.grid);
  }
  auto config = read_model_config(tmp.path() + "/hf");
  ASSERT_TRUE(config.ok());
  auto positions = family_named("qwen3_5")->rope_positions(*config, p.ids, grids);
  ASSERT_TRUE(positions.ok()) << positions.error().message;
  const int64_t n = int64_t(p.ids.size());
  const int32_t delta = *std::max_element(positions->begin(), positions->end()) + 1 - int32_t(n);
  EXPECT_EQ(delta, -3);  // the first image's 6 tokens advance 3 positions, the second's 2 advance 2

  std::vector<std::vector<float>> runs;
  for (int64_t chunk : {int64_t(0), int64_t(5), int64_t(1)}) {
    auto state = (*model)->new_sequence(n + 4);
    auto logits = run_image_prompt(**model, **state, p.ids, kTinyImage, encoded, *positions, chunk);
    ASSERT_TRUE(logits.ok()) << logits.error().message;
    EXPECT_EQ((*state)->rope_offset(), delta) << chunk;
    runs.push_back(*logits);
  }
  EXPECT_LE(relative_diff(runs[1], runs[0]), 1e-5);
  EXPECT_LE(relative_diff(runs[2], runs[0]), 1e-5);

  // the images matter, and so does their layout
  {
    auto state = (*model)->new_sequence(n);
    auto text_only = run_image_prompt(**model, **state, p.ids, kTinyImage, {}, *positions, 0);
    ASSERT_TRUE(text_only.ok());
    EXPECT_GT(relative_diff(*text_only, runs[0]), 1e-3);
    Positions flat(static_cast<size_t>(3 * n));
    for (int64_t a = 0; a < 3; ++a)
      for (int64_t i = 0; i < n; ++i) flat[size_t(a * n + i)] = int32_t(i);
    auto state2 = (*model)->new_sequence(n);
    auto unlaid = run_image_prompt(**model, **state2, p.ids, kTinyImage, encoded, flat, 0);
    ASSERT_TRUE(unlaid.ok());
    EXPECT_GT(relative_diff(*unlaid, runs[0]), 1e-4);
  }

  // decoding continues at max + 1 on every axis: a token after the prompt through forward, equal to
  // the same token appended to the prompt with its position laid out by hand
  const int32_t next = 17;
  auto state = (*model)->new_sequence(n + 4);
  ASSERT_TRUE(run_image_prompt(**model, **state, p.ids, kTinyImage, encoded, *positions, 0).ok());
  auto stepped = run_token(**model, **state, next);
  ASSERT_TRUE(stepped.ok()) << stepped.error().message;
  const std::vector<float> step_logits = host_floats(backend.to_host(*stepped));
  ImagePrompt longer = p;
  longer.ids.push_back(next);
  Positions extended;
  for (int64_t a = 0; a < 3; ++a) {
    extended.insert(extended.end(), positions->begin() + a * n, positions->begin() + (a + 1) * n);
    extended.push_back(int32_t(n) + delta);
  }
  auto whole_state = (*model)->new_sequence(n + 4);
  auto whole = run_image_prompt(**model, **whole_state, longer.ids, kTinyImage, encoded, extended, 0);
  ASSERT_TRUE(whole.ok());
  const std::vector<float> last(whole->end() - int64_t(step_logits.size()), whole->end());
  EXPECT_LE(relative_diff(step_logits, last), 1e-5);

  // the replayed decode loop reads the same positions
  auto loop_state = (*model)->new_sequence(n + 4);
  ASSERT_TRUE(run_image_prompt(**model, **loop_state, p.ids, kTinyImage, encoded, *positions, 0).ok());
  auto loop = DecodeLoop::create(**model, {loop_state->get()}, std::vector<int32_t>{next});
  ASSERT_TRUE(loop.ok()) << loop.error().message;
  ASSERT_TRUE((*loop)->step().ok());
  EXPECT_LE(relative_diff(host_floats(backend.to_host((*loop)->logits())), step_logits), 1e-6);
}

// ---- synthetic release-form checkpoints ----

std::string release_config(const std::string& name) {
  return source_dir() + "/models/configs/release/" + name + ".json";
}

// models/configs/release/NAME.json with the oracle fixture's language model and a shrunk tower,
// written as `kiln synth-model` writes a release form
std::string synth_release(const TempDir& tmp, const std::string& release, const std::string& text_fixture) {
  nlohmann::json config = read_json(release_config(release));
  nlohmann::json text = read_json(fixture_path(text_fixture) + "/config.json");
  text = text.contains("text_config") ? text["text_config"] : text;
  text.erase("architectures");
  config["text_config"] = text;
  config["tie_word_embeddings"] = text.value("tie_word_embeddings", false);
  config["image_token_id"] = kTinyImage;
  auto& v = config["vision_config"];
  v["depth"] = 2;
  v["hidden_size"] = 32;
  v["intermediate_size"] = 48;
  v["num_heads"] = 2;
  v["num_position_embeddings"] = 16;
  v["out_hidden_size"] = text["hidden_size"];
  const std::string config_path = tmp.path() + "/" + release + ".json";
  std::ofstream(config_path) << config.dump(2);
  auto file = read_model_config_file(config_path);
  EXPECT_TRUE(file.ok());
  auto tensors = checkpoint_tensors(*file);
  auto parts = checkpoint_part_tensors(*file);
  EXPECT_TRUE(tensors.ok() && parts.ok());
  for (auto& t : *tensors)
    if (t.name.rfind("model.", 0) == 0) t.name = "model.language_model." + t.name.substr(6);
  tensors->insert(tensors->end(), parts->begin(), parts->end());
  const std::string dir = tmp.path() + "/" + release;
  EXPECT_TRUE(
      write_synthetic_checkpoint(dir, config, *tensors, SyntheticOptions{.dtype = DType::bf16, .threads = 2}).ok());
  return dir;
}

TEST(QwenVision, ReleaseFormsEncodeToTheTextWidth) {
  for (const auto& [release, fixture] :
       {std::pair{"qwen3.5-0.8b", "qwen3_5_dense"}, {"qwen3.5-35b-a3b", "qwen3_5_moe"}}) {
    TempDir tmp;
    const std::string dir = synth_release(tmp, release, fixture);
    CpuBackend backend(2);
    auto model = load_model(dir, backend);
    ASSERT_TRUE(model.ok()) << model.error().message;
    for (const auto& p : (*model)->set_aside()) EXPECT_NE(p.part, "vision encoder") << release;
    const int64_t hidden = (*model)->info().hidden_size;
    // 16×16 patches of 3 channels and 2 frames, as the released towers take them
    ProcessedImage image;
    image.grid = {1, 6, 4};
    image.soft_tokens = 6;
    image.pixels = host_tensor(DType::f32, Shape{24, 3 * 2 * 16 * 16});
    for (int64_t i = 0; i < image.pixels.numel(); ++i) image.pixels.data_as<float>()[i] = float(i % 97) / 50.0f - 1.0f;
    auto rows = (*model)->encode_image(image);
    ASSERT_TRUE(rows.ok()) << rows.error().message;
    EXPECT_EQ(rows->shape(), (Shape{6, hidden})) << release;
    const Tensor host = backend.to_host(*rows);
    for (int64_t i = 0; i < host.numel(); ++i) ASSERT_TRUE(std::isfinite(host.data_as<float>()[i])) << release;
    // the soft tokens run through the text model
    std::vector<int32_t> ids = {1, 2, 3};
    ids.insert(ids.end(), 6, kTinyImage);
    ids.push_back(4);
    auto config = read_model_config(dir);
    auto positions =
        family_named("qwen3_5")->rope_positions(*config, ids, std::vector<std::vector<int64_t>>{image.grid});
    ASSERT_TRUE(positions.ok()) << positions.error().message;
    auto state = (*model)->new_sequence(int64_t(ids.size()));
    const std::vector<SoftTokens> soft = {SoftTokens{.offset = 3, .rows = *rows, .first = 0, .image_rows = 6}};
    SeqChunk chunk{.state = state->get(), .tokens = ids, .soft = soft, .positions = *positions};
    auto logits = (*model)->forward(std::span<const SeqChunk>(&chunk, 1), LogitRows::last);
    ASSERT_TRUE(logits.ok()) << logits.error().message;
  }
}

// ---- transformers' image fixtures ----

class QwenImageOracle : public testing::TestWithParam<std::string> {};

TEST_P(QwenImageOracle, MatchesTransformers) {
  const std::string dir = fixture_path(GetParam());
  if (GetParam() == "none") GTEST_SKIP() << "no image fixtures in tests/fixtures yet (a directory with images.json)";
  CpuBackend backend(2);
  auto model = load_model(dir, backend);
  ASSERT_TRUE(model.ok()) << model.error().message;
  if ((*model)->info().family != "qwen3_5")
    GTEST_SKIP() << GetParam() << " is a " << (*model)->info().family << " fixture";
  const auto ids = read_json(dir + "/ids.json").get<std::vector<int32_t>>();
  const auto images_json = read_json(dir + "/images.json");
  std::vector<Tensor> encoded;
  std::vector<std::vector<int64_t>> grids;
  std::vector<float> embeds;
  for (const auto& entry : images_json) {
    auto pixels = read_npy(dir + "/" + entry["pixels"].get<std::string>());
    ASSERT_TRUE(pixels.ok()) << pixels.error().message;
    ProcessedImage image;
    image.grid = entry["grid_thw"].get<std::vector<int64_t>>();
    image.pixels = host_tensor(DType::f32, Shape{pixels->shape[0], pixels->shape[1]});
    std::copy(pixels->f32.begin(), pixels->f32.end(), image.pixels.data_as<float>());
    auto vision = read_json(dir + "/config.json")["vision_config"];
    const int64_t m = vision.value("spatial_merge_size", 2);
    image.soft_tokens = image.grid[0] * image.grid[1] * image.grid[2] / (m * m);
    auto rows = (*model)->encode_image(image);
    ASSERT_TRUE(rows.ok()) << rows.error().message;
    encoded.push_back(*rows);
    grids.push_back(image.grid);
    const Tensor host = backend.to_host(*rows);
    embeds.insert(embeds.end(), host.data_as<float>(), host.data_as<float>() + host.numel());
  }
  if (std::filesystem::exists(dir + "/image_embeds.npy")) {
    auto want = read_npy(dir + "/image_embeds.npy");
    ASSERT_TRUE(want.ok());
    EXPECT_LE(relative_diff(embeds, want->f32), 1e-4) << "image embeddings";
  }
  auto config = read_model_config(dir);
  auto family = family_of(*config);
  ASSERT_TRUE(family.ok());
  auto positions = (*family)->rope_positions(*config, ids, grids);
  ASSERT_TRUE(positions.ok()) << positions.error().message;
  if (std::filesystem::exists(dir + "/positions.npy")) {
    auto want = read_npy(dir + "/positions.npy");
    ASSERT_TRUE(want.ok());
    ASSERT_EQ(want->i32.size(), positions->size());
    for (size_t i = 0; i < positions->size(); ++i) ASSERT_EQ((*positions)[i], want->i32[i]) << "position " << i;
  }
  auto want = read_npy(dir + "/logits.npy");
  ASSERT_TRUE(want.ok());
  const int32_t image_token = read_json(dir + "/config.json").value("image_token_id", 248056);
  const int64_t vocab = (*model)->info().vocab_size;
  for (int64_t chunk : {int64_t(0), int64_t(7)}) {
    auto state = (*model)->new_sequence(int64_t(ids.size()));
    auto logits = run_image_prompt(**model, **state, ids, image_token, encoded, *positions, chunk);
    ASSERT_TRUE(logits.ok()) << logits.error().message;
    ASSERT_EQ(int64_t(logits->size()), int64_t(ids.size()) * vocab);
    auto cmp = compare_logits(logits->data(), want->f32.data(), int64_t(ids.size()), vocab);
    EXPECT_LE(cmp.relative(), 1e-4) << "chunk " << chunk << ": max |diff| " << cmp.max_abs_diff;
    EXPECT_GE(cmp.argmax_agreement, 0.99);
  }
}

std::vector<std::string> image_fixtures_or_none() {
  std::vector<std::string> names = image_fixture_names("qwen3_5");
  if (names.empty()) names.push_back("none");
  return names;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, QwenImageOracle, testing::ValuesIn(image_fixtures_or_none()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kiln::test
