// MLX affine quantization: the packing of every width, quantizing as mlx does, the CPU kernels on
// packed weights against the dequantized f32 reference, whole quantized models against their
// dequantized twins, kiln quantize, and the errors a bad quantized checkpoint gives.
#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "convert/check_model.h"
#include "convert/quantize_model.h"
#include "io/quantization.h"
#include "models/model.h"
#include "quant/affine.h"
#include "quant/tiles.h"
#include "quant_test_util.h"
#include "runtime/prefill.h"
#include "test_util.h"

namespace kiln::test {
namespace {

constexpr int kAllBits[] = {2, 3, 4, 5, 6, 8};

// ---- the format ----

TEST(QuantFormat, CodesFormALittleEndianBitStream) {
  for (int bits : kAllBits) {
    std::vector<uint32_t> codes(64);
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = uint32_t(i * 7 + 3) % (1u << bits);
    // the expected bytes, one bit at a time: bit j of code i is bit i·bits + j of the stream
    std::vector<uint8_t> want(codes.size() * size_t(bits) / 8, 0);
    for (size_t i = 0; i < codes.size(); ++i)
      for (int j = 0; j < bits; ++j)
        if (codes[i] >> j & 1u) want[(i * size_t(bits) + size_t(j)) / 8] |= uint8_t(1u << ((i * bits + j) % 8));
    std::vector<uint8_t> got(want.size(), 0);
    for (size_t i = 0; i < codes.size(); i += 8) quant::pack8(&codes[i], bits, &got[i / 8 * size_t(bits)]);
    EXPECT_EQ(got, want) << bits << " bits";
    uint32_t back[8];
    for (size_t i = 0; i < codes.size(); i += 8) {
      quant::unpack8(&got[i / 8 * size_t(bits)], bits, back);
      for (int k = 0; k < 8; ++k) EXPECT_EQ(back[k], codes[i + size_t(k)]) << bits << " bits, code " << i + k;
    }
  }
}

TEST(QuantFormat, KnownPackings) {
  auto pack = [](std::vector<uint32_t> codes, int bits) {
    std::vector<uint8_t> out(size_t(bits), 0);
    quant::pack8(codes.data(), bits, out.data());
    return out;
  };
  // 4 bits: the first element in the low nibble of the first uint32 (0x87654321 little-endian)
  EXPECT_EQ(pack({1, 2, 3, 4, 5, 6, 7, 8}, 4), (std::vector<uint8_t>{0x21, 0x43, 0x65, 0x87}));
  // 3 bits: eight codes in three bytes, codes straddling byte boundaries
  EXPECT_EQ(pack({1, 2, 3, 4, 5, 6, 7, 0}, 3), (std::vector<uint8_t>{0xd1, 0x58, 0x1f}));
  // 5 bits: eight codes in five bytes
  EXPECT_EQ(pack({1, 2, 3, 4, 5, 6, 7, 31}, 5), (std::vector<uint8_t>{0x41, 0x0c, 0x52, 0xcc, 0xf9}));
  // 6 bits: four codes in three bytes
  EXPECT_EQ(pack({1, 2, 3, 63, 0, 0, 0, 0}, 6), (std::vector<uint8_t>{0x81, 0x30, 0xfc, 0, 0, 0}));
  // 8 bits: a byte per code
  EXPECT_EQ(pack({1, 2, 3, 4, 5, 6, 7, 255}, 8), (std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 255}));
}

TEST(QuantFormat, QuantizesAsMlx) {
  std::vector<uint8_t> packed(16);
  float scale = 0, bias = 0;
  uint32_t codes[8];
  // the larger-magnitude extreme (max here) becomes the bias; the scale steps down from it
  std::vector<float> up(32);
  for (int i = 0; i < 32; ++i) up[size_t(i)] = float(i) / 31.0f;
  quant::quantize_row(up.data(), 32, 4, 32, packed.data(), &scale, &bias);
  EXPECT_EQ(bias, 1.0f);
  EXPECT_FLOAT_EQ(scale, 1.0f / -15.0f);
  for (int i = 0; i < 32; i += 8) {
    quant::unpack8(&packed[size_t(i / 2)], 4, codes);
    for (int k = 0; k < 8; ++k) EXPECT_EQ(codes[k], uint32_t(std::round(15.0f * (1.0f - up[size_t(i + k)]))));
  }
  // an all-negative group: the range reaches up to 0 (mlx's GPU kernels start the max at 0)
  std::vector<float> negative(32, -1.0f);
  negative[0] = -3.0f;
  quant::quantize_row(negative.data(), 32, 4, 32, packed.data(), &scale, &bias);
  EXPECT_EQ(bias, -3.0f);
  EXPECT_FLOAT_EQ(scale, -3.0f / std::round(-3.0f / (3.0f / 15.0f)));
  quant::unpack8(&packed[0], 4, codes);
  EXPECT_EQ(codes[0], 0u);
  EXPECT_EQ(codes[1], 10u);  // (-1 - -3) / 0.2
  // halves round away from zero: codes 0.5 and 2.5 steps above the bias
  std::vector<float> ties(32, 0.0f);
  ties[0] = -15.0f, ties[1] = -14.5f, ties[2] = -12.5f;
  quant::quantize_row(ties.data(), 32, 4, 32, packed.data(), &scale, &bias);
  EXPECT_EQ(bias, -15.0f);
  EXPECT_EQ(scale, 1.0f);
  quant::unpack8(&packed[0], 4, codes);
  EXPECT_EQ(codes[1], 1u);
  EXPECT_EQ(codes[2], 3u);
  // the min dominates: bias = min, scale = min / round(min / step)
  std::vector<float> low(32, 0.5f);
  low[3] = -2.0f;
  quant::quantize_row(low.data(), 32, 4, 32, packed.data(), &scale, &bias);
  EXPECT_EQ(bias, -2.0f);
  EXPECT_FLOAT_EQ(scale, -2.0f / std::rint(-2.0f / (2.5f / 15.0f)));
  // an all-zero group keeps a zero bias and codes
  std::vector<float> zero(32, 0.0f);
  quant::quantize_row(zero.data(), 32, 4, 32, packed.data(), &scale, &bias);
  EXPECT_EQ(bias, 0.0f);
  EXPECT_FLOAT_EQ(scale, -1e-7f);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(packed[size_t(i)], 0);
}

TEST(QuantFormat, RoundTripWithinHalfAStep) {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int bits : kAllBits) {
    for (int group : {32, 64, 128}) {
      const int64_t cols = 256;
      std::vector<float> w(cols), s(cols / group), b(cols / group);
      for (auto& v : w) v = normal(gen);
      std::vector<uint8_t> packed(size_t(cols * bits / 8));
      quant::quantize_row(w.data(), cols, bits, group, packed.data(), s.data(), b.data());
      Tensor p(DType::u8, Shape{int64_t(packed.size())}, packed.data(), nullptr, Device::cpu);
      Tensor sv(DType::f32, Shape{1, cols / group}, s.data(), nullptr, Device::cpu);
      Tensor bv(DType::f32, Shape{1, cols / group}, b.data(), nullptr, Device::cpu);
      Tensor q = quant::make_quantized(p, sv, bv, Shape{1, cols}, bits, group);
      std::vector<float> back(static_cast<size_t>(cols));
      quant::dequantize_rows(q, 0, 1, back.data());
      // half a step inside the range the codes cover from the bias; clamped beyond it (mlx keeps the
      // larger extreme exact and rounds the number of steps to it, so the other end may fall short)
      const float steps = float((1 << bits) - 1);
      for (int64_t i = 0; i < cols; ++i) {
        const float step = std::fabs(s[size_t(i / group)]), from_bias = std::fabs(w[size_t(i)] - b[size_t(i / group)]);
        EXPECT_LE(std::fabs(back[size_t(i)] - w[size_t(i)]),
                  step * 0.5001f + std::max(0.0f, from_bias - steps * step) + 1e-6f)
            << bits << " bits, group " << group << ", element " << i;
      }
    }
  }
}

// ---- the CPU kernels against the dequantized f32 reference ----

double rel_diff(const Tensor& a, const Tensor& b) {
  double diff = 0, scale = 1e-30;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff, std::fabs(double(a.data_as<float>()[i]) - b.data_as<float>()[i]));
    scale = std::max(scale, std::fabs(double(b.data_as<float>()[i])));
  }
  return diff / scale;
}

Tensor random_f32(std::mt19937& gen, Shape shape) {
  Tensor t = host_tensor(DType::f32, shape);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = normal(gen);
  return t;
}

// The GPU's tiled layout holds every code, scale and bias where its offsets say (scales and
// biases as bf16), in the MLX layout's bytes plus at most 15 a tile, for short last row blocks
// and slices, every group size and scale type.
TEST(QuantFormat, TiledLayoutHoldsEveryValue) {
  std::mt19937 gen(5);
  struct Case {
    int64_t rows, cols;
    int bits, group;
    DType scale_dtype;
  };
  const Case cases[] = {{1, 64, 4, 64, DType::bf16},      {33, 2560, 4, 64, DType::bf16}, {40, 4160, 4, 64, DType::f16},
                        {64, 9216, 4, 32, DType::f32},    {7, 3840, 8, 128, DType::bf16}, {96, 1024, 8, 32, DType::f16},
                        {31, 15360, 4, 128, DType::bf16}, {2, 96, 8, 32, DType::bf16}};
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << c.rows << " x " << c.cols << ", " << c.bits << " bits, group " << c.group);
    Tensor w = random_quantized(gen, Shape{c.rows, c.cols}, c.bits, c.group, c.scale_dtype);
    ASSERT_TRUE(quant::tileable(w));
    const quant::TileLayout t = quant::tile_layout(w);
    EXPECT_LE(t.slice * c.bits / 8, 1024);
    EXPECT_EQ(t.slice % c.group, 0);
    const int64_t tiles = t.row_blocks() * t.slices();
    EXPECT_GE(t.total_bytes(), int64_t(w.nbytes()) + 4 * c.rows * (c.cols / c.group));
    EXPECT_LE(t.total_bytes(), int64_t(w.nbytes()) + 4 * c.rows * (c.cols / c.group) + 15 * tiles);
    std::vector<uint8_t> tiled(size_t(t.total_bytes()));
    quant::write_tiles(w, tiled.data());
    const auto* codes = static_cast<const uint8_t*>(w.data());
    const int64_t row_bytes = c.cols * c.bits / 8, groups = c.cols / c.group;
    int64_t bad_codes = 0, bad_scales = 0;
    for (int64_t r = 0; r < c.rows; ++r) {
      for (int64_t chunk = 0; chunk < c.cols / 32; ++chunk)
        bad_codes += std::memcmp(tiled.data() + t.chunk_offset(r, chunk), codes + r * row_bytes + chunk * c.bits * 4,
                                 size_t(c.bits * 4)) != 0;
      for (int64_t g = 0; g < groups; ++g) {
        uint16_t s = 0, b = 0;
        std::memcpy(&s, tiled.data() + t.scale_offset(r, g), 2);
        std::memcpy(&b, tiled.data() + t.scale_offset(r, g) + t.bias_distance(r, g), 2);
        const float want_s = quant::load_float(
            static_cast<const char*>(w.quant().scales.data()) + size_t(r * groups) * dtype_size(c.scale_dtype),
            c.scale_dtype, g);
        const float want_b = quant::load_float(
            static_cast<const char*>(w.quant().biases.data()) + size_t(r * groups) * dtype_size(c.scale_dtype),
            c.scale_dtype, g);
        bad_scales +=
            bf16_to_f32(s) != bf16_to_f32(f32_to_bf16(want_s)) || bf16_to_f32(b) != bf16_to_f32(f32_to_bf16(want_b));
      }
    }
    EXPECT_EQ(bad_codes, 0);
    EXPECT_EQ(bad_scales, 0);
    // tiles start 16-byte aligned and follow one another without overlap
    int64_t expected = 0;
    for (int64_t b = 0; b < t.row_blocks(); ++b)
      for (int s = 0; s < t.slices(); ++s) {
        EXPECT_EQ(t.tile_offset(b, s), expected);
        EXPECT_EQ(t.tile_offset(b, s) % 16, 0);
        expected += t.tile_bytes(t.block_rows(b), t.slice_cols(s));
      }
    EXPECT_EQ(expected, t.total_bytes());
  }
  for (int bits : {2, 3, 5, 6})  // the other widths keep the MLX layout on the GPU
    EXPECT_FALSE(quant::tileable(random_quantized(gen, Shape{4, 128}, bits, 64)));
  EXPECT_FALSE(quant::tileable(random_quantized(gen, Shape{2, 4, 128}, 4, 64)));  // a stack of experts
}

TEST(QuantCpu, MatmulMatchesDequantized) {
  std::mt19937 gen(11);
  CpuBackend cpu(2);
  for (int bits : kAllBits) {
    for (int group : {32, 64, 128}) {
      for (int64_t m : {1, 3, 8, 9, 33}) {
        const int64_t n = 33, k = 2 * group + (group == 128 ? 0 : 64);
        Tensor w = random_quantized(gen, Shape{n, k}, bits, group, group == 64 ? DType::f16 : DType::bf16);
        Tensor x = random_f32(gen, Shape{m, k});
        Tensor got = cpu.alloc(DType::f32, Shape{m, n}), want = cpu.alloc(DType::f32, Shape{m, n});
        cpu.matmul(x, cpu.upload_quantized(w), got);
        cpu.matmul(x, dequantized(w), want);
        EXPECT_LE(rel_diff(got, want), 1e-5) << bits << " bits, group " << group << ", " << m << " rows";
      }
    }
  }
}

TEST(QuantCpu, EmbedMatchesDequantized) {
  std::mt19937 gen(12);
  CpuBackend cpu(2);
  for (int bits : kAllBits) {
    Tensor table = random_quantized(gen, Shape{37, 96}, bits, 32);
    Tensor ids = host_tensor(DType::i32, Shape{5});
    for (int i = 0; i < 5; ++i) ids.data_as<int32_t>()[i] = (i * 11 + 2) % 37;
    Tensor got = cpu.alloc(DType::f32, Shape{5, 96}), want = cpu.alloc(DType::f32, Shape{5, 96});
    cpu.embed(ids, table, 2.5f, got);
    cpu.embed(ids, dequantized(table), 2.5f, want);
    EXPECT_EQ(rel_diff(got, want), 0.0) << bits << " bits";
  }
}

TEST(QuantCpu, ExpertsMatchDequantized) {
  std::mt19937 gen(13);
  CpuBackend cpu(2);
  const int64_t E = 5, H = 64, I = 96, T = 7, K = 2;
  for (int bits : {3, 4, 8}) {
    Tensor gate = random_quantized(gen, Shape{E, I, H}, bits, 32), up = random_quantized(gen, Shape{E, I, H}, bits, 32);
    Tensor down = random_quantized(gen, Shape{E, H, I}, bits, 32);
    if (bits == 8) down = dequantized(down);  // a dense projection beside quantized ones
    Tensor x = random_f32(gen, Shape{T, H});
    Tensor ids = host_tensor(DType::i32, Shape{T, K}), weights = host_tensor(DType::f32, Shape{T, K});
    for (int64_t i = 0; i < T * K; ++i) {
      ids.data_as<int32_t>()[i] = int32_t((i * 3 + i / K) % E);
      weights.data_as<float>()[i] = 0.25f + 0.1f * float(i % 3);
    }
    Tensor got = cpu.alloc(DType::f32, Shape{T, H}), want = cpu.alloc(DType::f32, Shape{T, H});
    cpu.moe_experts(MoeExpertsArgs{.x = x,
                                   .ids = ids,
                                   .weights = weights,
                                   .gate = gate,
                                   .up = up,
                                   .down = down,
                                   .out = got,
                                   .act = Activation::silu});
    cpu.moe_experts(MoeExpertsArgs{.x = x,
                                   .ids = ids,
                                   .weights = weights,
                                   .gate = dequantized(gate),
                                   .up = dequantized(up),
                                   .down = down.quantized() ? dequantized(down) : down,
                                   .out = want,
                                   .act = Activation::silu});
    EXPECT_LE(rel_diff(got, want), 1e-6) << bits << " bits";
  }
}

// ---- whole quantized models ----

std::vector<float> run_logits(const std::string& dir, const std::vector<int32_t>& ids, int64_t chunk) {
  CpuBackend backend(2);
  ModelOptions options{.max_chunk_tokens = chunk ? chunk : int64_t(ids.size())};
  auto model = load_model(dir, backend, options);
  EXPECT_TRUE(model.ok()) << (model.ok() ? "" : model.error().message);
  if (!model.ok()) return {};
  auto state = (*model)->new_sequence(int64_t(ids.size()));
  auto logits = run_tokens(**model, **state, ids, options.max_chunk_tokens, LogitRows::all);
  EXPECT_TRUE(logits.ok());
  return std::vector<float>(logits->data_as<float>(), logits->data_as<float>() + logits->numel());
}

TEST(QuantFixtures, AllVariantsPresent) {
  EXPECT_GE(quantized_fixtures().size(), 9u);
}

// Until the transformers references exist for a fixture, and beside them, the quantized path is
// checked against the same model with every quantized weight dequantized to f32 up front.
class QuantizedModel : public testing::TestWithParam<std::string> {};

TEST_P(QuantizedModel, MatchesItsDequantizedTwin) {
  TempDir tmp;
  const std::string dir = fixture_path(GetParam()), twin = tmp.path() + "/dequantized";
  write_dequantized_copy(dir, twin);
  const auto all_ids = fixture_ids(GetParam());
  const std::vector<int32_t> ids(all_ids.begin(), all_ids.begin() + 96);
  const auto want = run_logits(twin, ids, 0);
  for (int64_t chunk : {int64_t(0), int64_t(1), int64_t(7)}) {
    const auto got = run_logits(dir, ids, chunk);
    ASSERT_EQ(got.size(), want.size());
    auto c = compare_logits(got.data(), want.data(), int64_t(ids.size()), int64_t(want.size() / ids.size()));
    EXPECT_LE(c.relative(), 1e-5) << "chunk " << chunk << ": max |diff| " << c.max_abs_diff;
    EXPECT_EQ(c.argmax_agreement, 1.0) << "chunk " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, QuantizedModel, testing::ValuesIn(quantized_fixtures()),
                         [](const auto& info) { return info.param; });

TEST(QuantFixtures, WeightsStayPacked) {
  CpuBackend backend(2);
  auto model = load_model(fixture_path("q4g64_qwen3_5_dense"), backend);
  ASSERT_TRUE(model.ok()) << model.error().message;
  // a decode step reads the packed codes, scales and biases: far fewer bytes than f32 weights
  auto dense = load_model(fixture_path("qwen3_5_dense"), backend);
  ASSERT_TRUE(dense.ok());
  EXPECT_LT((*model)->decode_bytes(1, 1), (*dense)->decode_bytes(1, 1) / 3);
}

// ---- kiln quantize ----

TEST(QuantizeCommand, WritesMlxLayout) {
  TempDir tmp;
  const auto src = tmp.copy_fixture("qwen3_5_moe");
  std::ofstream(src + "/tokenizer.json") << "{}";
  std::ofstream(src + "/chat_template.jinja") << "{{ messages }}";
  const std::string out = tmp.path() + "/q";
  auto r = run_command(std::string(KILN_BINARY) + " quantize " + src + " " + out +
                       " --bits 4 --group-size 32 --override '*.shared_expert.[gu]*=8:64' --override '*.o_proj=none'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto config = read_json(out + "/config.json");
  ASSERT_TRUE(config.contains("quantization"));
  EXPECT_EQ(config["quantization"], config["quantization_config"]);
  EXPECT_EQ(config["quantization"]["bits"], 4);
  EXPECT_EQ(config["quantization"]["group_size"], 32);
  EXPECT_EQ(config["quantization"]["mode"], "affine");
  // mlx-lm's own choice for Qwen 3.5 MoE routers, the overrides, and modules left alone
  EXPECT_EQ(config["quantization"]["language_model.model.layers.0.mlp.gate"],
            (nlohmann::json{{"bits", 8}, {"group_size", 64}}));
  EXPECT_EQ(config["quantization"]["language_model.model.layers.0.mlp.shared_expert.gate_proj"],
            (nlohmann::json{{"bits", 8}, {"group_size", 64}}));
  EXPECT_EQ(config["quantization"]["language_model.model.layers.3.self_attn.o_proj"], false);
  const auto index = read_json(out + "/model.safetensors.index.json")["weight_map"];
  EXPECT_TRUE(index.contains("language_model.model.layers.0.mlp.switch_mlp.gate_proj.scales"));
  EXPECT_TRUE(index.contains("language_model.model.embed_tokens.biases"));
  EXPECT_TRUE(index.contains("language_model.lm_head.weight"));
  EXPECT_TRUE(index.contains("language_model.model.layers.3.self_attn.o_proj.weight"));
  EXPECT_FALSE(index.contains("language_model.model.layers.3.self_attn.o_proj.scales"));
  EXPECT_TRUE(std::filesystem::exists(out + "/tokenizer.json"));
  EXPECT_TRUE(std::filesystem::exists(out + "/chat_template.jinja"));
  EXPECT_FALSE(std::filesystem::exists(out + "/logits.npy"));
  // the conventions mlx-lm converts to: conv [C, K, 1], norms stored as 1 + w
  auto file = SafetensorsFile::open(out + "/model.safetensors");
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->find("language_model.model.layers.0.linear_attn.conv1d.weight")->shape, (Shape{128, 4, 1}));
  CpuBackend backend(2);
  EXPECT_TRUE(load_model(out, backend).ok());
}

TEST(QuantizeCommand, RejectsBadOptions) {
  TempDir tmp;
  const std::string kiln = KILN_BINARY, src = fixture_path("qwen3_5_dense");
  for (const std::string args : {"--bits 7", "--group-size 48", "--override '*.mlp=9'", "--override nonsense"}) {
    auto r = run_command(kiln + " quantize " + src + " " + tmp.path() + "/q " + args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.output.find("kiln: error: "), std::string::npos) << r.output;
  }
  auto again = run_command(kiln + " quantize " + fixture_path("q4g64_qwen3_5_dense") + " " + tmp.path() + "/q2");
  EXPECT_NE(again.output.find("already quantized"), std::string::npos) << again.output;
}

TEST(QuantizeCommand, RefusesAnExistingOutput) {
  TempDir tmp;
  const std::string kiln = KILN_BINARY, src = fixture_path("qwen3_5_dense"), out = tmp.path() + "/q";
  std::filesystem::create_directories(out);
  std::ofstream(out + "/config.json") << "{\"keep\": true}";
  auto r = run_command(kiln + " quantize " + src + " " + out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("kiln: error: " + out + " already exists"), std::string::npos) << r.output;
  EXPECT_EQ(read_json(out + "/config.json"), (nlohmann::json{{"keep", true}}));
  std::ofstream(tmp.path() + "/file") << "x";
  EXPECT_NE(run_command(kiln + " quantize " + src + " " + tmp.path() + "/file").exit_code, 0);
  // an empty directory is written into
  std::filesystem::create_directories(tmp.path() + "/empty");
  auto fresh = run_command(kiln + " quantize " + src + " " + tmp.path() + "/empty");
  EXPECT_EQ(fresh.exit_code, 0) << fresh.output;
  EXPECT_TRUE(std::filesystem::exists(tmp.path() + "/empty/config.json"));
}

std::string load_error(const std::string& dir) {
  CpuBackend backend(1);
  auto model = load_model(dir, backend);
  return model.ok() ? "" : model.error().message;
}

void edit_config(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  auto config = read_json(dir + "/config.json");
  edit(config);
  std::ofstream(dir + "/config.json") << config.dump(2);
}

void edit_tensors(const std::string& dir, const std::function<void(std::map<std::string, Tensor>&)>& edit) {
  std::map<std::string, Tensor> all;
  {
    auto file = SafetensorsFile::open(dir + "/model.safetensors");
    ASSERT_TRUE(file.ok());
    for (const auto& info : (*file)->tensors()) {
      auto view = (*file)->view(info);
      Tensor copy = host_tensor(view->dtype(), view->shape());
      std::memcpy(copy.data(), view->data(), view->nbytes());
      all[info.name] = copy;
    }
  }
  edit(all);
  std::vector<NamedTensor> list;
  for (const auto& [n, t] : all) list.push_back({n, t});
  ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", list).ok());
  std::filesystem::remove(dir + "/model.safetensors.index.json");
}

// An override that names a group size its module cannot take is refused; the defaults leave such
// modules unquantized, as mlx-lm does, and say how many.
TEST(QuantizeCommand, OverrideGroupSizeMustDivide) {
  TempDir tmp;
  const std::string kiln = KILN_BINARY, src = fixture_path("qwen3_5_dense"), out = tmp.path() + "/q";
  auto r = run_command(kiln + " quantize " + src + " " + out +
                       " --bits 4 --group-size 32 --override '*.mlp.down_proj=8:64'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.output,
            "kiln: error: override '*.mlp.down_proj=8:64': group size 64 does not divide the input size 96 of "
            "'language_model.model.layers.0.mlp.down_proj'\n");
  EXPECT_FALSE(std::filesystem::exists(out));
  // the default group of 64 does not divide the MLPs' 96 inputs either: those stay as they are
  auto fine = run_command(kiln + " quantize " + src + " " + out);
  ASSERT_EQ(fine.exit_code, 0) << fine.output;
  EXPECT_NE(fine.output.find("8 modules left unquantized: the group size does not divide their input size (first: "
                             "language_model.model.layers.0.mlp.down_proj)"),
            std::string::npos)
      << fine.output;
  EXPECT_FALSE(read_json(out + "/model.safetensors.index.json")["weight_map"].contains(
      "language_model.model.layers.0.mlp.down_proj.scales"));
}

// What kiln logits would refuse, kiln quantize refuses first, with the same error and nothing written.
TEST(QuantizeCommand, ChecksItsInputLikeTheLoader) {
  TempDir tmp;
  const std::string kiln = KILN_BINARY, out = tmp.path() + "/q";
  const std::string down = "model.layers.0.mlp.down_proj.weight";
  const std::vector<std::function<void(std::map<std::string, Tensor>&)>> edits = {
      [&](auto& all) { all.erase(down); },
      [&](auto& all) {  // the same elements, transposed
        const Tensor w = all.at(down);
        all[down] = w.reshape(Shape{w.dim(1), w.dim(0)});
      },
      [&](auto& all) { all.erase("model.layers.1.linear_attn.conv1d.weight"); },
  };
  for (const auto& edit : edits) {
    TempDir in;
    const auto dir = in.copy_fixture("qwen3_5_dense");
    edit_tensors(dir, edit);
    const std::string error = load_error(dir);
    ASSERT_FALSE(error.empty());
    EXPECT_EQ(check_model(dir).error().message, error);
    auto r = run_command(kiln + " quantize " + dir + " " + out);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_EQ(r.output, "kiln: error: " + error + "\n");
    EXPECT_FALSE(std::filesystem::exists(out));
  }
}

// A Qwen 3.5 expert's tensor past num_experts, or one whose index is not a number, is refused by
// name before anything is written: the model would not use it.
TEST(QuantizeCommand, RefusesExpertsTheConfigDoesNotHave) {
  TempDir tmp;
  const std::string kiln = KILN_BINARY, out = tmp.path() + "/q";
  const std::string expert0 = "model.language_model.layers.0.mlp.experts.0.gate_proj.weight";
  for (const std::string name : {"model.language_model.layers.0.mlp.experts.99.gate_proj.weight",
                                 "model.language_model.layers.0.mlp.experts.first.gate_proj.weight"}) {
    const std::string message = "tensor '" + name + "' in model.safetensors is not used";
    TempDir in;
    const auto dir = in.copy_fixture("qwen3_5_moe");
    edit_tensors(dir, [&](auto& all) { all[name] = all.at(expert0); });
    auto r = run_command(kiln + " quantize " + dir + " " + out);
    EXPECT_NE(r.exit_code, 0) << name;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("kiln: error: "), r.output.rfind("kiln: error: ")) << r.output;  // one error line
    EXPECT_FALSE(std::filesystem::exists(out));
  }
}

// Every fixture passes the check without its weights being read.
TEST(QuantizeCommand, CheckAcceptsEveryFixture) {
  for (const auto& name : fixture_names()) EXPECT_TRUE(check_model(fixture_path(name)).ok()) << name;
}

// A failure after writing has begun takes back what was written.
TEST(QuantizeCommand, LeavesNothingBehindOnFailure) {
  TempDir tmp;
  const std::string kiln = KILN_BINARY;
  const auto src = tmp.copy_fixture("qwen3_5_dense");
  ASSERT_EQ(::mkfifo((src + "/tokenizer.json").c_str(), 0600), 0);  // copied last, and refused
  auto r = run_command(kiln + " quantize " + src + " " + tmp.path() + "/new/q");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("tokenizer.json is not a regular file"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(tmp.path() + "/new"));
  // an empty directory that was there stays, empty
  std::filesystem::create_directories(tmp.path() + "/empty");
  EXPECT_NE(run_command(kiln + " quantize " + src + " " + tmp.path() + "/empty").exit_code, 0);
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path() + "/empty"));
}

// ---- bad quantized checkpoints ----

void expect_error(const std::string& error, const std::string& needle) {
  EXPECT_FALSE(error.empty());
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  EXPECT_NE(error.find(needle), std::string::npos) << error;
}

const std::string kProj = "language_model.model.layers.0.mlp.gate_proj";

TEST(QuantLoaderErrors, ScalesOfTheWrongShape) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("q4g64_qwen3_5_dense");
  edit_tensors(dir, [](auto& all) {
    const Tensor s = all.at(kProj + ".scales");
    Tensor cut = host_tensor(s.dtype(), Shape{s.rows() - 1, s.cols()});
    std::memcpy(cut.data(), s.data(), cut.nbytes());
    all[kProj + ".scales"] = cut;
  });
  expect_error(load_error(dir), kProj + ".scales");
}

TEST(QuantLoaderErrors, PackedWeightDisagreesWithBits) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("q4g64_qwen3_5_dense");
  edit_config(dir, [](auto& c) { c["quantization"][kProj] = {{"bits", 8}, {"group_size", 64}}; });
  expect_error(load_error(dir), kProj + ".weight");
}

TEST(QuantLoaderErrors, TruncatedPackedWeight) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("q4g64_qwen3_5_dense");
  edit_tensors(dir, [](auto& all) {
    const Tensor w = all.at(kProj + ".weight");
    Tensor cut = host_tensor(DType::u32, Shape{w.rows(), w.cols() - 1});
    for (int64_t r = 0; r < w.rows(); ++r)
      std::memcpy(cut.data_as<uint32_t>() + r * cut.cols(), w.data_as<uint32_t>() + r * w.cols(), cut.cols() * 4);
    all[kProj + ".weight"] = cut;
  });
  expect_error(load_error(dir), kProj + ".weight");
}

TEST(QuantLoaderErrors, UnsupportedBitsAndGroups) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("q4g64_qwen3_5_dense");
  edit_config(dir, [](auto& c) { c["quantization"][kProj] = {{"bits", 7}, {"group_size", 64}}; });
  expect_error(load_error(dir), "7 bits");
  edit_config(dir, [](auto& c) { c["quantization"][kProj] = {{"bits", 4}, {"group_size", 16}}; });
  expect_error(load_error(dir), "groups of 16");
  edit_config(dir, [](auto& c) {
    c["quantization"].erase(kProj);
    c["quantization"]["mode"] = "mxfp4";
  });
  expect_error(load_error(dir), "mxfp4");
  edit_config(dir, [](auto& c) {
    c["quantization"]["mode"] = "affine";
    c["quantization"]["quant_method"] = "gptq";
  });
  expect_error(load_error(dir), "gptq");
}

// The quantization block is checked whole, even where no tensor is quantized: bits and group
// sizes kiln computes with, and module entries that are settings or false.
TEST(QuantLoaderErrors, InvalidBlockOfAFloatModel) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("qwen3_5_dense");
  const std::string config = dir + "/config.json";
  edit_config(dir, [](auto& c) { c["quantization"] = {{"group_size", 16}, {"bits", 7}}; });
  expect_error(load_error(dir), config + " quantization: 7 bits is not supported");
  edit_config(dir, [](auto& c) { c["quantization"] = {{"group_size", 16}, {"bits", 4}}; });
  expect_error(load_error(dir), config + " quantization: groups of 16 are not supported");
  const std::string module = "language_model.model.layers.0.mlp.up_proj";
  for (const nlohmann::json& entry : {nlohmann::json(4), nlohmann::json("x"), nlohmann::json(nullptr)}) {
    edit_config(dir, [&](auto& c) { c["quantization"] = {{"group_size", 64}, {"bits", 4}, {module, entry}}; });
    expect_error(load_error(dir), config + " quantization." + module + " must be an object");
  }
  edit_config(dir, [&](auto& c) {
    c["quantization"] = {{"group_size", 64}, {"bits", 4}, {module, {{"bits", 4}, {"group_size", 48}}}};
  });
  expect_error(load_error(dir), config + " quantization." + module + ": groups of 48");
  // a valid block over float weights: an empty entry takes the defaults, as mlx reads it
  edit_config(dir, [&](auto& c) {
    c["quantization"] = {{"group_size", 64}, {"bits", 4}, {module, nlohmann::json::object()}, {kProj, false}};
  });
  EXPECT_EQ(load_error(dir), "");
  auto q = QuantizationConfig::parse(read_json(config), config);
  ASSERT_TRUE(q.ok());
  EXPECT_TRUE(q->module("layers.0.mlp.up_proj").quantized);
  EXPECT_EQ(q->module("layers.0.mlp.up_proj").bits, 4);
  EXPECT_FALSE(q->module("layers.0.mlp.gate_proj").quantized);
}

// A dequantized shape too large for its input size times the bits to be computed is refused, not
// wrapped around to a packed shape that matches.
TEST(QuantLoaderErrors, PackedShapeDoesNotOverflow) {
  const int64_t in = int64_t(1) << 62;
  const Tensor packed(DType::u32, Shape{1, 0}, nullptr, nullptr, Device::cpu);
  const Tensor scales(DType::bf16, Shape{1, in / 64}, nullptr, nullptr, Device::cpu);
  const auto status = quant::check_quantized({.weight = "w", .scales = "s", .biases = "b"}, packed, scales, scales,
                                             Shape{1, in}, 4, 64);
  ASSERT_FALSE(status.ok());
  expect_error(status.error().message, "tensor w has shape [1, 0]");
}

TEST(QuantLoaderErrors, MissingBiases) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("q4g64_qwen3_5_dense");
  edit_tensors(dir, [](auto& all) { all.erase(kProj + ".biases"); });
  expect_error(load_error(dir), "layers.0.mlp.gate_proj.biases");
}

TEST(QuantLoaderErrors, QuantizedWithoutConfig) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("q4g64_qwen3_5_dense");
  edit_config(dir, [](auto& c) {
    c.erase("quantization");
    c.erase("quantization_config");
  });
  expect_error(load_error(dir), "no quantization block");
  edit_config(dir, [](auto& c) { c["quantization"] = {{"bits", 4}, {"group_size", 64}, {kProj, false}}; });
  expect_error(load_error(dir), "leaves");
}

TEST(QuantLoaderErrors, CliPrintsOneLine) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("q4g64_qwen3_5_dense");
  edit_config(dir, [](auto& c) { c["quantization"]["bits"] = 3; });
  auto r = run_command(std::string(KILN_BINARY) + " logits " + dir + " --ids 1,2 --out " + tmp.path() +
                       "/l.npy --device cpu");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_NE(r.output.find("kiln: error: tensor"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace kiln::test
