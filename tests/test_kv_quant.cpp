// Quantized KV caches (--kv-bits, kv_config.json): attention over the codes equals attention over
// the round-tripped values, the formats a checkpoint asks for load or fail with the reason, a
// quantized state snapshots and restores exactly, perplexity on held text stays close to the
// unquantized caches', and the logits follow transformers with the same round trip applied to its
// keys and values (tools/oracle/make_kv_quant_fixtures.py).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "bundled_model.h"
#include "layers/attention.h"
#include "models/model.h"
#include "quant/affine.h"
#include "runtime/prefill.h"
#include "test_util.h"
#include "text/tokenizer/tokenizer.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

// The values a quantized cache gives back for a row: codes from the f32 scale and bias, then
// code · f16(scale) + f16(bias).
std::vector<float> round_trip(const float* x, int64_t n, int bits, int group_size) {
  std::vector<uint8_t> codes(static_cast<size_t>(n * bits / 8));
  const size_t groups = static_cast<size_t>(n / group_size);
  std::vector<float> scales(groups), biases(groups), out(static_cast<size_t>(n));
  quant::quantize_row(x, n, bits, group_size, codes.data(), scales.data(), biases.data());
  uint32_t c[8];
  for (int64_t i = 0; i < n; i += 8) {
    quant::unpack8(codes.data() + i / 8 * bits, bits, c);
    for (int k = 0; k < 8; ++k) {
      const int64_t g = (i + k) / group_size;
      out[size_t(i + k)] =
          f16_to_f32(f32_to_f16(scales[size_t(g)])) * float(c[k]) + f16_to_f32(f32_to_f16(biases[size_t(g)]));
    }
  }
  return out;
}

TEST(KvQuant, CpuAttentionOverCodesEqualsAttentionOverRoundTrippedValues) {
  CpuBackend backend(2);
  const int64_t T = 23, kv_heads = 2, heads = 4, hd = 64;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  auto random = [&](Shape shape) {
    Tensor t = backend.alloc(DType::f32, shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = normal(rng);
    return t;
  };
  const Tensor k = random(Shape{T, kv_heads, hd}), v = random(Shape{T, kv_heads, hd}), q = random(Shape{T, heads, hd});
  Tensor positions = backend.alloc(DType::i32, Shape{T});
  for (int64_t i = 0; i < T; ++i) positions.data_as<int32_t>()[i] = int32_t(i);
  for (const KvQuant quant : {KvQuant{4, 32}, KvQuant{8, 64}, KvQuant{4, 64}, KvQuant{8, 32}}) {
    SCOPED_TRACE(testing::Message() << quant.bits << " bits, groups of " << quant.group_size);
    // the plain cache gets the round-tripped values, the quantized one the originals
    Tensor k_rt = backend.alloc(DType::f32, k.shape()), v_rt = backend.alloc(DType::f32, v.shape());
    for (int64_t r = 0; r < T * kv_heads; ++r) {
      const auto kr = round_trip(k.data_as<float>() + r * hd, hd, quant.bits, quant.group_size);
      const auto vr = round_trip(v.data_as<float>() + r * hd, hd, quant.bits, quant.group_size);
      std::copy(kr.begin(), kr.end(), k_rt.data_as<float>() + r * hd);
      std::copy(vr.begin(), vr.end(), v_rt.data_as<float>() + r * hd);
    }
    std::vector<float> outputs[2];
    for (int quantized = 0; quantized < 2; ++quantized) {
      // a ring smaller than the sequence, with a window: slots are reused as positions advance
      const KvCacheView cache = new_kv_cache(backend, 16, int(kv_heads), int(hd), quantized ? quant : KvQuant{});
      EXPECT_EQ(cache.k.quantized(), bool(quantized));
      Tensor out = backend.alloc(DType::f32, Shape{T, heads, hd});
      for (int64_t begin = 0; begin < T; begin += 5) {
        const int64_t n = std::min<int64_t>(5, T - begin);
        const std::vector<SeqRows> seqs = {SeqRows{.row_begin = 0, .n_rows = n, .pos_begin = begin}};
        const Tensor& ks = quantized ? k : k_rt;
        const Tensor& vs = quantized ? v : v_rt;
        backend.kv_write(KvWriteArgs{.k = ks.rows_view(begin * kv_heads, n * kv_heads).reshape(Shape{n, kv_heads, hd}),
                                     .v = vs.rows_view(begin * kv_heads, n * kv_heads).reshape(Shape{n, kv_heads, hd}),
                                     .positions = positions.rows_view(begin, n).reshape(Shape{n}),
                                     .seqs = seqs,
                                     .caches = {cache}});
        Tensor o = out.rows_view(begin * heads, n * heads).reshape(Shape{n, heads, hd});
        backend.attention(AttentionArgs{.q = q.rows_view(begin * heads, n * heads).reshape(Shape{n, heads, hd}),
                                        .out = o,
                                        .positions = positions.rows_view(begin, n).reshape(Shape{n}),
                                        .seqs = seqs,
                                        .caches = {cache},
                                        .n_heads = int(heads),
                                        .n_kv_heads = int(kv_heads),
                                        .head_dim = int(hd),
                                        .scale = 0.125f,
                                        .window = 12});
      }
      outputs[quantized].assign(out.data_as<float>(), out.data_as<float>() + out.numel());
    }
    for (size_t i = 0; i < outputs[0].size(); ++i) ASSERT_NEAR(outputs[1][i], outputs[0][i], 1e-5f) << i;
  }
}

std::unique_ptr<Model> load(Backend& backend, const std::string& dir, ModelOptions options) {
  auto model = load_model(dir, backend, options);
  EXPECT_TRUE(model.ok()) << (model.ok() ? "" : model.error().message);
  return model.ok() ? std::move(model).value() : nullptr;
}

std::string load_error(Backend& backend, const std::string& dir, ModelOptions options = {}) {
  auto model = load_model(dir, backend, options);
  return model.ok() ? "(loaded)" : model.error().message;
}

// A copy of a fixture's checkpoint (links to its files) with the given kv_config.json.
std::string with_kv_config(const TempDir& tmp, const std::string& name, const std::string& fixture,
                           const std::string& kv_config) {
  const std::string dir = tmp.path() + "/" + name;
  fs::create_directories(dir);
  for (const auto& entry : fs::directory_iterator(fixture_path(fixture)))
    fs::create_symlink(entry.path(), dir + "/" + entry.path().filename().string());
  std::ofstream(dir + "/kv_config.json") << kv_config;
  return dir;
}

size_t state_bytes(Model& model) {
  auto state = model.new_sequence(256);
  EXPECT_TRUE(state.ok());
  return state.ok() ? (*state)->bytes() : 0;
}

TEST(KvQuant, CheckpointKvConfigSetsEachLayer) {
  CpuBackend backend(1);
  TempDir tmp;
  // qwen3_5_dense: attention at layers 3 and 7 (head size 32), the rest Gated DeltaNet
  const std::string dir = with_kv_config(tmp, "qwen3_5_dense", "qwen3_5_dense",
                                         R"([{"layer_idx": 3, "bits": 8, "group_size": 32},
                                             {"layer_idx": 7, "bits": 4, "group_size": 32},
                                             {"layer_idx": 0, "bits": 4, "group_size": 32}])");
  auto model = load(backend, dir, {});
  ASSERT_TRUE(model);
  auto state = model->new_sequence(64);
  ASSERT_TRUE(state.ok());
  const auto& layers = (*state)->layers();
  ASSERT_TRUE(layers[3].kv.k.quantized() && layers[7].kv.v.quantized());
  EXPECT_EQ(layers[3].kv.k.quant().bits, 8);
  EXPECT_EQ(layers[7].kv.k.quant().bits, 4);
  EXPECT_EQ(layers[7].kv.k.quant().scales.dtype(), DType::f16);
  EXPECT_FALSE(layers[0].kv.k.defined()) << "a Gated DeltaNet layer has no cache to quantize";

  // --kv-bits overrides the file: 16 keeps every cache unquantized, 4 quantizes them all
  auto plain = load(backend, dir, {.kv_quant = KvQuant{}});
  auto all4 = load(backend, dir, {.kv_quant = KvQuant{4, 32}});
  ASSERT_TRUE(plain && all4);
  EXPECT_LT(state_bytes(*model), state_bytes(*plain));
  EXPECT_LT(state_bytes(*all4), state_bytes(*model));
  // 4-bit codes with an f16 scale and bias per 32: 4 + 32 / 32 = 5 bits an element against 32
  auto plain_state = plain->new_sequence(256);
  auto all4_state = all4->new_sequence(256);
  ASSERT_TRUE(plain_state.ok() && all4_state.ok());
  EXPECT_EQ((*all4_state)->layers()[3].kv.k.stored_bytes() * 32, (*plain_state)->layers()[3].kv.k.nbytes() * 5);
}

TEST(KvQuant, BadFormatsAreRefusedWithTheReason) {
  CpuBackend backend(1);
  struct Case {
    std::string fixture, kv_config, want;
  };
  const std::vector<Case> cases = {
      {"qwen3_5_dense", "{not json", "kv_config.json: not valid JSON"},
      {"qwen3_5_dense", R"({"layer_idx": 3})", "expected a list"},
      {"qwen3_5_dense", R"([{"layer_idx": 3, "bits": 8}])", "entry 0 has no integer \"group_size\""},
      {"qwen3_5_dense", R"([{"layer_idx": 8, "bits": 8, "group_size": 32}])", "names layer 8, but the model has 8"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].kv_config);
    TempDir case_dir;
    const std::string dir = with_kv_config(case_dir, cases[i].fixture, cases[i].fixture, cases[i].kv_config);
    const std::string error = load_error(backend, dir);
    EXPECT_NE(error.find(cases[i].want), std::string::npos) << error;
  }
  // a group that does not divide a head: an error when asked for, a warning (and that layer's cache
  // unquantized) when only the checkpoint's kv_config.json asks, so such a checkpoint still loads
  TempDir tmp;
  auto model = load(backend,
                    with_kv_config(tmp, "q", "qwen3_5_dense",
                                   R"([{"layer_idx": 3, "bits": 8, "group_size": 32},
                                       {"layer_idx": 7, "bits": 4, "group_size": 64}])"),
                    {});
  ASSERT_TRUE(model);
  auto state = model->new_sequence(16);
  ASSERT_TRUE(state.ok());
  EXPECT_TRUE((*state)->layers()[3].kv.k.quantized());
  EXPECT_FALSE((*state)->layers()[7].kv.k.quantized());
  const std::vector<std::pair<KvQuant, std::string>> asked = {
      {KvQuant{8, 64}, "layer 0: its head size 32 is not a multiple of the KV cache group size 64"},
      {KvQuant{3, 32}, "layer 0: a KV cache of 3 bits is not supported (4 or 8)"},
      {KvQuant{8, 48}, "layer 0: a KV cache group size of 48 is not supported (32, 64 or 128)"}};
  for (const auto& [quant, want] : asked) {
    const std::string error = load_error(backend, fixture_path("gemma4_dense"), {.kv_quant = quant});
    EXPECT_NE(error.find(want), std::string::npos) << error;
  }
}

std::vector<float> continue_with(Model& model, SequenceState& state, const std::vector<int32_t>& ids, int64_t chunk) {
  auto logits = run_tokens(model, state, ids, chunk, LogitRows::all);
  EXPECT_TRUE(logits.ok()) << (logits.ok() ? "" : logits.error().message);
  return logits.ok() ? std::vector<float>(logits->data_as<float>(), logits->data_as<float>() + logits->numel())
                     : std::vector<float>();
}

TEST(KvQuant, SnapshotsRestoreQuantizedCachesExactly) {
  for (const std::string fixture : {"gemma4_dense", "qwen3_5_dense"}) {
    SCOPED_TRACE(fixture);
    CpuBackend backend(2);
    auto model = load(backend, fixture_path(fixture), {.max_chunk_tokens = 16, .kv_quant = KvQuant{4, 32}});
    ASSERT_TRUE(model);
    const auto ids = fixture_ids(fixture);
    const std::vector<int32_t> prefix(ids.begin(), ids.begin() + 40), suffix(ids.begin() + 40, ids.begin() + 60);
    auto state = model->new_sequence(100);
    ASSERT_TRUE(state.ok());
    continue_with(*model, **state, prefix, 16);
    auto snapshot = (*state)->clone(backend);
    EXPECT_EQ(snapshot->bytes(), (*state)->bytes());
    const auto first = continue_with(*model, **state, suffix, 5);
    (*state)->restore(backend, *snapshot);
    EXPECT_EQ(continue_with(*model, **state, suffix, 5), first);
    // the chunking does not matter either: every key is quantized as it is written
    auto whole = model->new_sequence(100);
    ASSERT_TRUE(whole.ok());
    const auto all = continue_with(*model, **whole, std::vector<int32_t>(ids.begin(), ids.begin() + 60), 16);
    const auto tail = std::vector<float>(all.end() - int64_t(first.size()), all.end());
    for (size_t i = 0; i < first.size(); ++i) ASSERT_NEAR(tail[i], first[i], 1e-4f) << i;
  }
}

// Mean negative log-likelihood (nats per token) of `ids` after their first token, in one sequence
// prefilled in chunks of 128 (the later chunks read the earlier ones' cached keys and values).
double mean_nll(Model& model, const std::vector<int32_t>& ids) {
  auto state = model.new_sequence(int64_t(ids.size()));
  EXPECT_TRUE(state.ok());
  auto logits = run_tokens(model, **state, ids, 128, LogitRows::all);
  EXPECT_TRUE(logits.ok()) << (logits.ok() ? "" : logits.error().message);
  if (!logits.ok()) return NAN;
  const int64_t vocab = model.info().vocab_size;
  double total = 0;
  for (size_t t = 0; t + 1 < ids.size(); ++t) {
    const float* row = logits->data_as<float>() + int64_t(t) * vocab;
    const float max = *std::max_element(row, row + vocab);
    double sum = 0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(double(row[j] - max));
    total += double(max) + std::log(sum) - double(row[ids[t + 1]]);
  }
  return total / double(ids.size() - 1);
}

TEST(KvQuant, PerplexityOfTheBundledModelOnHeldText) {
  // tests/fixtures/kjv_held.txt: the first three chapters of the model's validation split (Genesis
  // 20, Genesis 40, Exodus 10; see models/kiln-kjv-31m/README.md), never trained on
  auto tokenizer = Tokenizer::load(bundled_model_dir());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.error().message;
  std::ifstream in(fixtures_dir() + "/kjv_held.txt");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto encoded = (*tokenizer)->encode(text);
  ASSERT_TRUE(encoded.ok());
  std::vector<int32_t> ids = *encoded;
  ASSERT_GE(ids.size(), 1500u);
  ids.resize(1500);
  CpuBackend backend(2);
  double ppl[3];
  const KvQuant formats[3] = {KvQuant{}, KvQuant{8, 64}, KvQuant{4, 64}};
  for (int i = 0; i < 3; ++i) {
    auto model = load(backend, bundled_model_dir(), {.max_chunk_tokens = 128, .kv_quant = formats[i]});
    ASSERT_TRUE(model);
    ppl[i] = std::exp(mean_nll(*model, ids));
  }
  RecordProperty("perplexity_unquantized_kv", std::to_string(ppl[0]));
  RecordProperty("perplexity_8bit_kv", std::to_string(ppl[1]));
  RecordProperty("perplexity_4bit_kv", std::to_string(ppl[2]));
  std::printf("perplexity over %zu held tokens: unquantized KV %.4f, 8-bit %.4f, 4-bit %.4f\n", ids.size(), ppl[0],
              ppl[1], ppl[2]);
  EXPECT_GT(ppl[0], 5.0);
  EXPECT_LT(ppl[0], 200.0) << "the model should know this text's style";
  EXPECT_LT(std::fabs(ppl[1] / ppl[0] - 1.0), 0.01);
  EXPECT_LT(std::fabs(ppl[2] / ppl[0] - 1.0), 0.05);
  EXPECT_NE(ppl[2], ppl[0]) << "4-bit caches that change nothing quantize nothing";
}

// Logits against transformers with the same round trip on its keys and values: `kiln logits
// --kv-bits` for a format of every layer, and a model loaded beside a per-layer kv_config.json
// (which `kiln logits`, the parity check against unquantized transformers, leaves aside). Each
// fixture under tests/fixtures/kv_quant names its source checkpoint and format in oracle.json.
TEST(KvQuant, LogitsMatchTheRoundTripOracle) {
  const std::string root = fixtures_dir() + "/kv_quant";
  if (!fs::exists(root)) GTEST_SKIP() << "no tests/fixtures/kv_quant: run tools/oracle/make_kv_quant_fixtures.py";
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(root)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  ASSERT_GE(names.size(), 4u);
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const std::string dir = root + "/" + name;
    const auto oracle = read_json(dir + "/oracle.json");
    const std::string source = oracle["source"];
    const auto ids = fixture_ids(source);
    auto want = read_npy(dir + "/logits.npy");
    auto plain = read_npy(fixture_path(source) + "/logits.npy");
    ASSERT_TRUE(want.ok() && plain.ok());
    TempDir tmp;
    for (const int64_t chunk : {int64_t(ids.size()), int64_t(7)}) {
      std::vector<float> got;
      if (fs::exists(dir + "/kv_config.json")) {
        std::ifstream in(dir + "/kv_config.json");
        CpuBackend backend(2);
        auto model = load(backend,
                          with_kv_config(tmp, source + std::to_string(chunk), source,
                                         std::string(std::istreambuf_iterator<char>(in), {})),
                          {.max_chunk_tokens = chunk});
        ASSERT_TRUE(model);
        auto state = model->new_sequence(int64_t(ids.size()));
        ASSERT_TRUE(state.ok());
        got = continue_with(*model, **state, ids, chunk);
      } else {
        std::string csv;
        for (int32_t id : ids) csv += (csv.empty() ? "" : ",") + std::to_string(id);
        const std::string out = tmp.path() + "/logits.npy";
        auto r = run_command(std::string(KILN_BINARY) + " logits " + fixture_path(source) + " --ids " + csv +
                             " --out " + out + " --kv-bits " + std::to_string(oracle["kv_bits"].get<int>()) +
                             " --kv-group-size " + std::to_string(oracle["kv_group_size"].get<int>()) +
                             " --prefill-chunk " + std::to_string(chunk) + " --device cpu");
        ASSERT_EQ(r.exit_code, 0) << r.output;
        auto npy = read_npy(out);
        ASSERT_TRUE(npy.ok());
        got = npy->f32;
      }
      ASSERT_EQ(got.size(), want->f32.size());
      const auto c = compare_logits(got.data(), want->f32.data(), want->shape[0], want->shape[1]);
      EXPECT_LE(c.relative(), 1e-4) << "chunk " << chunk;
      EXPECT_GE(c.argmax_agreement, 0.99) << "chunk " << chunk;
      // and the round trip matters at this tolerance: unquantized caches would not pass
      const auto u = compare_logits(plain->f32.data(), want->f32.data(), want->shape[0], want->shape[1]);
      EXPECT_GT(u.relative(), 10 * c.relative()) << "chunk " << chunk;
    }
  }
}

TEST(KvQuant, LogitsLeavesKvConfigAsideUnlessAsked) {
  // transformers' logits: `kiln logits` on a checkpoint with a kv_config.json keeps its caches
  // unquantized, and follows --kv-bits when given
  TempDir tmp;
  const std::string dir =
      with_kv_config(tmp, "q", "qwen3_5_dense", R"([{"layer_idx": 3, "bits": 4, "group_size": 32}])");
  const auto ids = fixture_ids("qwen3_5_dense");
  std::string csv;
  for (int32_t id : ids) csv += (csv.empty() ? "" : ",") + std::to_string(id);
  auto plain = read_npy(fixture_path("qwen3_5_dense") + "/logits.npy");
  ASSERT_TRUE(plain.ok());
  for (const std::string flags : {"", " --kv-bits 4 --kv-group-size 32"}) {
    auto r = run_command(std::string(KILN_BINARY) + " logits " + dir + " --ids " + csv + " --out " + tmp.path() +
                         "/l.npy --device cpu" + flags);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto got = read_npy(tmp.path() + "/l.npy");
    ASSERT_TRUE(got.ok());
    const auto c = compare_logits(got->f32.data(), plain->f32.data(), plain->shape[0], plain->shape[1]);
    if (flags.empty())
      EXPECT_LE(c.relative(), 1e-4);
    else
      EXPECT_GT(c.relative(), 1e-3) << "4-bit caches in every attention layer";
  }
}

TEST(KvQuant, CliRefusesFormatsItCannotStore) {
  for (const std::string flags : {"--kv-bits 3", "--kv-bits 8 --kv-group-size 48"}) {
    auto r = run_command(std::string(KILN_BINARY) + " logits " + fixture_path("qwen3_5_dense") + " --ids 1,2 --out " +
                         "/dev/null " + flags + " --device cpu");
    EXPECT_NE(r.exit_code, 0) << flags;
    EXPECT_NE(r.output.find("--kv-"), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace kiln::test
