// Gemma 4's image front ends against a plain re-derivation of transformers' formulas (double
// precision, no ops, no kiln code beyond reading the checkpoint), on synthetic checkpoints whose
// position tables, norms, biases, standardisation and clip bounds are random so that each matters:
//   Gemma4VisionModel.forward + Gemma4MultimodalEmbedder (modeling_gemma4.py)
//   Gemma4UnifiedVisionEmbedder.forward (modeling_gemma4_unified.py)
// Until the oracle fixtures hold images this is what pins the arithmetic; the 2-D RoPE layout
// (first half of a head by x, second by y), the pooling order, the clip placement and the
// standardisation are written here from the reference, independently of vision.cpp.
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "io/weights.h"
#include "layers/loader.h"
#include "vision_test_util.h"

namespace kiln::test {
namespace {

using Mat = std::vector<double>;  // row-major

class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir) {
    auto store = WeightStore::open(dir);
    EXPECT_TRUE(store.ok()) << (store.ok() ? "" : store.error().message);
    store_ = std::make_unique<WeightStore>(std::move(*store));
  }
  std::vector<double> get(const std::string& name) const {
    auto t = store_->get(name);
    EXPECT_TRUE(t.ok()) << name;
    const Tensor f = to_f32_host(*t);
    return std::vector<double>(f.data_as<float>(), f.data_as<float>() + f.numel());
  }
  bool has(const std::string& name) const { return store_->has(name); }

 private:
  std::unique_ptr<WeightStore> store_;
};

// y [rows, out] = x [rows, in] · wᵀ (w [out, in])
Mat linear(const Mat& x, int64_t rows, int64_t in, const std::vector<double>& w, int64_t out) {
  Mat y(static_cast<size_t>(rows * out), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < in; ++i) s += x[size_t(r * in + i)] * w[size_t(o * in + i)];
      y[size_t(r * out + o)] = s;
    }
  return y;
}

// Gemma4RMSNorm over rows of `cols`: x · (mean(x²) + eps)^-1/2 (· w)
void rms_rows(Mat& x, int64_t cols, const std::vector<double>* w, double eps) {
  for (size_t r = 0; r < x.size() / size_t(cols); ++r) {
    double ms = 0;
    for (int64_t c = 0; c < cols; ++c) ms += x[r * size_t(cols) + size_t(c)] * x[r * size_t(cols) + size_t(c)];
    const double inv = 1.0 / std::sqrt(ms / double(cols) + eps);
    for (int64_t c = 0; c < cols; ++c) x[r * size_t(cols) + size_t(c)] *= inv * (w ? (*w)[size_t(c)] : 1.0);
  }
}

// nn.LayerNorm over rows of `cols`
void layer_norm_rows(Mat& x, int64_t cols, const std::vector<double>& w, const std::vector<double>& b) {
  for (size_t r = 0; r < x.size() / size_t(cols); ++r) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < cols; ++c) mean += x[r * size_t(cols) + size_t(c)];
    mean /= double(cols);
    for (int64_t c = 0; c < cols; ++c) var += std::pow(x[r * size_t(cols) + size_t(c)] - mean, 2);
    const double inv = 1.0 / std::sqrt(var / double(cols) + 1e-5);
    for (int64_t c = 0; c < cols; ++c) {
      double& v = x[r * size_t(cols) + size_t(c)];
      v = (v - mean) * inv * w[size_t(c)] + b[size_t(c)];
    }
  }
}

double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

// Gemma4ClippableLinear
Mat clippable(const Checkpoint& w, const std::string& prefix, const Mat& x, int64_t rows, int64_t in, int64_t out) {
  Mat input = x;
  const bool clipped = w.has(prefix + ".input_min");
  if (clipped) {
    const double lo = w.get(prefix + ".input_min")[0], hi = w.get(prefix + ".input_max")[0];
    for (double& v : input) v = std::min(std::max(v, lo), hi);
  }
  Mat y = linear(input, rows, in, w.get(prefix + ".linear.weight"), out);
  if (clipped) {
    const double lo = w.get(prefix + ".output_min")[0], hi = w.get(prefix + ".output_max")[0];
    for (double& v : y) v = std::min(std::max(v, lo), hi);
  }
  return y;
}

// apply_multidimensional_rope on one head row: the first half of the head turns by x, the second by
// y, each with rotate_half inside its half and the frequencies of a head_dim / 2 wide head
void rope_2d(double* head, int64_t hd, int64_t x, int64_t y, double theta) {
  const int64_t half = hd / 2, pairs = half / 2;
  for (int d = 0; d < 2; ++d) {
    double* part = head + d * half;
    const double pos = d == 0 ? double(x) : double(y);
    for (int64_t i = 0; i < pairs; ++i) {
      const double inv_freq = 1.0 / std::pow(theta, double(2 * i) / double(half));
      const double c = std::cos(pos * inv_freq), s = std::sin(pos * inv_freq);
      const double a = part[i], b = part[i + pairs];
      part[i] = a * c - b * s;
      part[i + pairs] = b * c + a * s;
    }
  }
}

// Gemma4VisionModel.forward then Gemma4MultimodalEmbedder, for one image without padding.
Mat gemma4_reference(const Checkpoint& w, const nlohmann::json& vc, int64_t text_hidden, const ProcessedImage& image) {
  const int64_t H = vc["hidden_size"], I = vc["intermediate_size"], layers = vc["num_hidden_layers"];
  const int64_t Hq = vc["num_attention_heads"], Hkv = vc["num_key_value_heads"], hd = vc["head_dim"];
  const int64_t S = vc["position_embedding_size"], k = vc.value("pooling_kernel_size", 3);
  const double eps = vc.value("rms_norm_eps", 1e-6), theta = vc["rope_parameters"]["rope_theta"];
  const int64_t P = image.pixels.rows(), V = image.pixels.cols(), cols = image.grid[1];
  const std::string v = "vision_tower.";

  // Gemma4VisionPatchEmbedder
  Mat pix(static_cast<size_t>(P * V));
  for (int64_t i = 0; i < P * V; ++i) pix[size_t(i)] = 2.0 * (double(image.pixels.data_as<float>()[i]) - 0.5);
  Mat h = linear(pix, P, V, w.get(v + "patch_embedder.input_proj.weight"), H);
  const auto table = w.get(v + "patch_embedder.position_embedding_table");  // [2, S, H]
  for (int64_t p = 0; p < P; ++p)
    for (int64_t c = 0; c < H; ++c)
      h[size_t(p * H + c)] += table[size_t((0 * S + p % cols) * H + c)] + table[size_t((1 * S + p / cols) * H + c)];

  // Gemma4VisionEncoderLayer, every patch attending to every other
  for (int64_t l = 0; l < layers; ++l) {
    const std::string pre = v + "encoder.layers." + std::to_string(l) + ".";
    const auto norm = [&](const char* name) { return w.get(pre + name + std::string(".weight")); };
    Mat x = h;
    auto in_norm = norm("input_layernorm");
    rms_rows(x, H, &in_norm, eps);
    Mat q = clippable(w, pre + "self_attn.q_proj", x, P, H, Hq * hd);
    Mat kk = clippable(w, pre + "self_attn.k_proj", x, P, H, Hkv * hd);
    Mat vv = clippable(w, pre + "self_attn.v_proj", x, P, H, Hkv * hd);
    const auto qn = w.get(pre + "self_attn.q_norm.weight"), kn = w.get(pre + "self_attn.k_norm.weight");
    rms_rows(q, hd, &qn, eps);
    rms_rows(kk, hd, &kn, eps);
    rms_rows(vv, hd, nullptr, eps);
    for (int64_t p = 0; p < P; ++p) {
      for (int64_t i = 0; i < Hq; ++i) rope_2d(&q[size_t((p * Hq + i) * hd)], hd, p % cols, p / cols, theta);
      for (int64_t i = 0; i < Hkv; ++i) rope_2d(&kk[size_t((p * Hkv + i) * hd)], hd, p % cols, p / cols, theta);
    }
    Mat attn(static_cast<size_t>(P * Hq * hd), 0.0);
    for (int64_t p = 0; p < P; ++p)
      for (int64_t i = 0; i < Hq; ++i) {
        const int64_t g = i / (Hq / Hkv);
        std::vector<double> scores(static_cast<size_t>(P));
        double mx = -INFINITY;
        for (int64_t j = 0; j < P; ++j) {
          double s = 0;  // scaling 1.0
          for (int64_t d = 0; d < hd; ++d) s += q[size_t((p * Hq + i) * hd + d)] * kk[size_t((j * Hkv + g) * hd + d)];
          scores[size_t(j)] = s;
          mx = std::max(mx, s);
        }
        double denom = 0;
        for (double& s : scores) denom += (s = std::exp(s - mx));
        for (int64_t j = 0; j < P; ++j)
          for (int64_t d = 0; d < hd; ++d)
            attn[size_t((p * Hq + i) * hd + d)] += scores[size_t(j)] / denom * vv[size_t((j * Hkv + g) * hd + d)];
      }
    Mat o = clippable(w, pre + "self_attn.o_proj", attn, P, Hq * hd, H);
    auto post_attn = norm("post_attention_layernorm");
    rms_rows(o, H, &post_attn, eps);
    for (size_t i = 0; i < h.size(); ++i) h[i] += o[i];
    Mat m = h;
    auto pre_ff = norm("pre_feedforward_layernorm");
    rms_rows(m, H, &pre_ff, eps);
    Mat gate = clippable(w, pre + "mlp.gate_proj", m, P, H, I), up = clippable(w, pre + "mlp.up_proj", m, P, H, I);
    for (size_t i = 0; i < gate.size(); ++i) gate[i] = gelu_tanh(gate[i]) * up[i];
    Mat down = clippable(w, pre + "mlp.down_proj", gate, P, I, H);
    auto post_ff = norm("post_feedforward_layernorm");
    rms_rows(down, H, &post_ff, eps);
    for (size_t i = 0; i < h.size(); ++i) h[i] += down[i];
  }

  // Gemma4VisionPooler._avg_pool_by_positions: kernel index x / k + (max_x / k) · (y / k)
  const int64_t L = P / (k * k), max_x = cols;
  Mat pooled(static_cast<size_t>(L * H), 0.0);
  for (int64_t p = 0; p < P; ++p) {
    const int64_t j = (p % cols) / k + (max_x / k) * ((p / cols) / k);
    for (int64_t c = 0; c < H; ++c) pooled[size_t(j * H + c)] += h[size_t(p * H + c)] / double(k * k);
  }
  for (double& x : pooled) x *= std::sqrt(double(H));
  if (vc.value("standardize", false)) {
    const auto bias = w.get(v + "std_bias"), scale = w.get(v + "std_scale");
    for (int64_t j = 0; j < L; ++j)
      for (int64_t c = 0; c < H; ++c)
        pooled[size_t(j * H + c)] = (pooled[size_t(j * H + c)] - bias[size_t(c)]) * scale[size_t(c)];
  }
  // Gemma4MultimodalEmbedder
  rms_rows(pooled, H, nullptr, eps);
  return linear(pooled, L, H, w.get("embed_vision.embedding_projection.weight"), text_hidden);
}

// Gemma4UnifiedVisionEmbedder.forward and its multimodal embedder, for one image of model patches.
Mat unified_reference(const Checkpoint& w, const nlohmann::json& vc, int64_t text_hidden, const ProcessedImage& image) {
  const int64_t D = vc["mm_embed_dim"], S = vc["mm_posemb_size"];
  const double eps = vc.value("rms_norm_eps", 1e-6);
  const int64_t P = image.pixels.rows(), V = image.pixels.cols(), cols = image.grid[1];
  const std::string e = "vision_embedder.";  // the released names (towers.cpp)
  Mat x(image.pixels.data_as<float>(), image.pixels.data_as<float>() + P * V);
  layer_norm_rows(x, V, w.get(e + "patch_ln1.weight"), w.get(e + "patch_ln1.bias"));
  Mat h = linear(x, P, V, w.get(e + "patch_dense.weight"), D);
  const auto bias = w.get(e + "patch_dense.bias");
  for (int64_t p = 0; p < P; ++p)
    for (int64_t c = 0; c < D; ++c) h[size_t(p * D + c)] += bias[size_t(c)];
  layer_norm_rows(h, D, w.get(e + "patch_ln2.weight"), w.get(e + "patch_ln2.bias"));
  const auto pos = w.get(e + "pos_embedding");  // [S, 2, D]: pos_embedding[x, 0] + pos_embedding[y, 1]
  for (int64_t p = 0; p < P; ++p)
    for (int64_t c = 0; c < D; ++c)
      h[size_t(p * D + c)] += pos[size_t(((p % cols) * 2 + 0) * D + c)] + pos[size_t(((p / cols) * 2 + 1) * D + c)];
  (void)S;
  layer_norm_rows(h, D, w.get(e + "pos_norm.weight"), w.get(e + "pos_norm.bias"));
  rms_rows(h, D, nullptr, eps);
  return linear(h, P, D, w.get("embed_vision.embedding_projection.weight"), text_hidden);
}

class FrontEndReference : public testing::TestWithParam<FrontEnd> {};

TEST_P(FrontEndReference, MatchesTheReferenceFormulas) {
  const FrontEnd f = GetParam();
  TempDir tmp;
  const std::string dir = synthesize(tmp, f.name, f.config, lively(f.clip_bound));
  CpuBackend backend(2);
  auto model = load_model(dir, backend);
  ASSERT_TRUE(model.ok()) << model.error().message;
  std::mt19937 rng(11);
  const ProcessedImage image = random_image(rng, f.rows, f.cols, f.values, f.soft);
  auto encoded = (*model)->encode_image(image);
  ASSERT_TRUE(encoded.ok()) << encoded.error().message;
  const Tensor got = backend.to_host(*encoded);

  const Checkpoint w(dir);
  const nlohmann::json& vc = f.config["vision_config"];
  const int64_t text_hidden = (*model)->info().hidden_size;
  const Mat want = f.config["model_type"] == "gemma4_unified" ? unified_reference(w, vc, text_hidden, image)
                                                              : gemma4_reference(w, vc, text_hidden, image);
  ASSERT_EQ(int64_t(want.size()), got.numel());
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(want[i]));
    max_diff = std::max(max_diff, std::fabs(double(got.data_as<float>()[i]) - want[i]));
  }
  EXPECT_GT(max_ref, 0.0);
  EXPECT_LE(max_diff, 1e-4 * max_ref) << "max |diff| " << max_diff << " of max |reference| " << max_ref;
}

INSTANTIATE_TEST_SUITE_P(Gemma4, FrontEndReference, testing::ValuesIn(front_ends()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace kiln::test
