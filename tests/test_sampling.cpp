// Sampling and stop strings.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "runtime/sampler.h"
#include "runtime/sampling_defaults.h"
#include "runtime/stop_strings.h"
#include "test_util.h"

namespace kiln {
namespace {

// generation_config.json's sampling keys as defaults: absent file, the keys a model ships (do_sample
// not read), values out of range left out, top_k 0 or -1 as off, and a file that is not an object.
TEST(SamplingDefaults, FromGenerationConfig) {
  test::TempDir dir;
  auto write = [&](const std::string& text) { std::ofstream(dir.path() + "/generation_config.json") << text; };
  auto none = load_sampling_defaults(dir.path());
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());

  write(R"({"do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "eos_token_id": [1, 2]})");
  auto qwen = load_sampling_defaults(dir.path());
  ASSERT_TRUE(qwen.ok()) << qwen.error().message;
  EXPECT_EQ(qwen->describe(), "temperature 0.6, top_k 20, top_p 0.95");
  SamplingParams p{.seed = 7};
  qwen->apply(p);
  EXPECT_FLOAT_EQ(p.temperature, 0.6f);
  EXPECT_EQ(p.top_k, 20);
  EXPECT_FLOAT_EQ(p.top_p, 0.95f);
  EXPECT_FLOAT_EQ(p.min_p, 0.0f);  // untouched
  EXPECT_FLOAT_EQ(p.repetition_penalty, 1.0f);
  EXPECT_EQ(p.seed, 7u);

  write(R"({"temperature": -1, "top_p": 1.5, "min_p": 0.05, "top_k": 2.5, "repetition_penalty": 0})");
  auto bad = load_sampling_defaults(dir.path());
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->describe(), "min_p 0.05");

  write(R"({"temperature": "hot", "top_k": 0, "top_p": null, "repetition_penalty": 1.05})");
  auto mixed = load_sampling_defaults(dir.path());
  ASSERT_TRUE(mixed.ok());
  EXPECT_EQ(mixed->describe(), "repetition_penalty 1.05");
  write(R"({"top_k": -1, "do_sample": false})");
  EXPECT_TRUE(load_sampling_defaults(dir.path())->empty());

  write("[1, 2]");
  auto list = load_sampling_defaults(dir.path());
  ASSERT_FALSE(list.ok());
  EXPECT_NE(list.error().message.find("generation_config.json"), std::string::npos);
  write("{not json");
  EXPECT_FALSE(load_sampling_defaults(dir.path()).ok());
}

TEST(Sampler, GreedyAndPenalties) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, -1.0f};
  Sampler greedy({.temperature = 0.0f});
  EXPECT_EQ(greedy.sample(logits, {}), 1);
  // repetition penalty 2 halves token 1's logit to 1.5 < 2.0
  Sampler rep({.temperature = 0.0f, .repetition_penalty = 2.0f});
  const std::vector<int32_t> seen = {1};
  EXPECT_EQ(rep.sample(logits, seen), 2);
  Sampler freq({.temperature = 0.0f, .frequency_penalty = 0.6f});
  const std::vector<int32_t> twice = {1, 1};
  EXPECT_EQ(freq.sample(logits, twice), 2);  // 3 - 1.2 = 1.8
  Sampler presence({.temperature = 0.0f, .presence_penalty = 0.5f});
  EXPECT_EQ(presence.sample(logits, twice), 1);  // 3 - 0.5 = 2.5
}

TEST(Sampler, LogitBiasComesFirst) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, -1.0f};
  Sampler lifted({.temperature = 0.0f, .logit_bias = {{3, 4.5f}}});
  EXPECT_EQ(lifted.sample(logits, {}), 3);  // -1 + 4.5 = 3.5
  // a ban holds at any temperature; an id past the logits is ignored
  Sampler banned({.temperature = 1.0f, .logit_bias = {{1, -100.0f}, {2, -100.0f}, {0, -100.0f}, {9, 50.0f}}});
  for (int i = 0; i < 32; ++i) EXPECT_EQ(banned.sample(logits, {}), 3);
  // the bias applies before the repetition penalty: (3 - 2) / 2 = 0.5 < 1
  Sampler ordered({.temperature = 0.0f, .repetition_penalty = 2.0f, .logit_bias = {{1, -2.0f}, {2, -1.5f}}});
  const std::vector<int32_t> seen = {1};
  EXPECT_EQ(ordered.sample(logits, seen), 0);
}

TEST(Sampler, LogprobsAreTheLogSoftmaxOfTheRawLogits) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f};
  const double total = std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0);
  const SampledLogprobs lp = logprobs_of(logits, 2, 3);
  EXPECT_NEAR(lp.logprob, 2.0 - std::log(total), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].token, 1);  // the tie keeps the lower id first
  EXPECT_EQ(lp.top[1].token, 3);
  EXPECT_EQ(lp.top[2].token, 2);
  EXPECT_NEAR(lp.top[0].logprob, 3.0 - std::log(total), 1e-6);
  EXPECT_EQ(lp.top[2].logprob, lp.logprob);
  EXPECT_TRUE(logprobs_of(logits, 0, 0).top.empty());
  EXPECT_EQ(logprobs_of(logits, 0, 99).top.size(), logits.size());
  // large logits do not overflow
  const std::vector<float> large = {1000.0f, 1000.0f};
  EXPECT_NEAR(logprobs_of(large, 0, 0).logprob, -std::log(2.0), 1e-6);
}

TEST(Sampler, SameSeedSameChoices) {
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(float(i));
  auto run = [&](uint64_t seed) {
    Sampler s({.temperature = 1.0f, .top_k = 20, .top_p = 0.9f, .seed = seed});
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(logits, {}));
    return out;
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));
}

TEST(Sampler, TruncationsKeepOnlyTheirCandidates) {
  const std::vector<float> logits = {0.0f, 5.0f, 4.9f, 1.0f, 4.8f};
  Sampler top_k({.temperature = 1.0f, .top_k = 2, .seed = 1});
  Sampler min_p({.temperature = 1.0f, .min_p = 0.5f, .seed = 2});
  Sampler top_p({.temperature = 1.0f, .top_p = 0.3f, .seed = 3});
  std::map<int32_t, int> k, m, p;
  for (int i = 0; i < 2000; ++i) {
    ++k[top_k.sample(logits, {})];
    ++m[min_p.sample(logits, {})];
    ++p[top_p.sample(logits, {})];
  }
  EXPECT_EQ(k.size(), 2u);
  EXPECT_TRUE(k.count(1) && k.count(2));
  EXPECT_EQ(m.size(), 3u);  // 5.0, 4.9, 4.8 are within a factor 2 of the best
  EXPECT_EQ(p.size(), 1u);  // the best alone holds 30% of the mass
  // temperature 1 over {5.0, 4.9}: frequencies near e^0.1 : 1
  EXPECT_NEAR(double(k[1]) / double(k[2]), std::exp(0.1), 0.15);
}

// Both ways of drawing (over the candidates in id order when nothing is cut, over the ordered
// prefix otherwise) follow the softmax of logit / temperature.
TEST(Sampler, DrawsFollowTheSoftmax) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.5f, 2.0f, 0.0f};
  std::vector<double> want(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) total += want[i] = std::exp(double(logits[i]) / 0.8);
  for (double& w : want) w /= total;
  for (float top_p : {1.0f, 0.9999f}) {
    Sampler s({.temperature = 0.8f, .top_p = top_p, .seed = 11});
    std::vector<int> seen(logits.size());
    const int draws = 40000;
    for (int i = 0; i < draws; ++i) ++seen[size_t(s.sample(logits, {}))];
    for (size_t i = 0; i < logits.size(); ++i)
      EXPECT_NEAR(double(seen[i]) / draws, want[i], 0.01) << "token " << i << ", top_p " << top_p;
  }
}

// A nucleus past the first 256 candidates (found by selection, not by sorting) keeps the weights:
// ten tokens at logit 3 among 2,000 at 0 hold e^3 · 10 / (e^3 · 10 + 1990) of the mass.
TEST(Sampler, WideNucleusKeepsTheWeights) {
  std::vector<float> logits(2000, 0.0f);
  for (int i = 0; i < 10; ++i) logits[size_t(100 * i + 7)] = 3.0f;
  const double top_mass = std::exp(3.0) * 10 / (std::exp(3.0) * 10 + 1990);
  Sampler s({.temperature = 1.0f, .top_p = 0.999f, .seed = 4});
  int top = 0;
  const int draws = 20000;
  std::set<int32_t> seen;
  for (int i = 0; i < draws; ++i) {
    const int32_t t = s.sample(logits, {});
    top += logits[size_t(t)] == 3.0f;
    seen.insert(t);
  }
  EXPECT_NEAR(double(top) / draws, top_mass, 0.015);
  EXPECT_GT(seen.size(), 1000u);  // the nucleus holds nearly all of the flat tokens
}

// A vocabulary of 200K: every draw lies in the set a full sort gives for the cut (ties at the
// edge included, lower ids first), and ties and NaNs are placed as the order says.
TEST(Sampler, LargeVocabularyCutsAgreeWithAFullSort) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(200000);
  for (float& l : logits) l = std::round(normal(rng) * 8.0f) / 8.0f;  // many ties
  logits[123] = NAN;
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const float temperature = 0.7f;
  auto key = [&](int32_t i) { return std::isnan(logits[size_t(i)]) ? -INFINITY : logits[size_t(i)] / temperature; };
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return key(a) > key(b) || (key(a) == key(b) && a < b); });
  struct Case {
    int top_k;
    float top_p, min_p;
  };
  for (const Case c : {Case{0, 0.5f, 0.0f}, Case{0, 0.95f, 0.0f}, Case{100, 1.0f, 0.0f}, Case{0, 1.0f, 0.3f},
                       Case{3000, 0.9f, 0.01f}}) {
    // the allowed set from the full order
    size_t keep = c.top_k > 0 ? size_t(c.top_k) : order.size();
    std::vector<double> prob(keep);
    double total = 0;
    for (size_t i = 0; i < keep; ++i) total += prob[i] = std::exp(double(key(order[i]) - key(order[0])));
    size_t cut = keep;
    double mass = 0;
    for (size_t i = 0; i < keep && c.top_p < 1.0f; ++i)
      if ((mass += prob[i] / total) >= double(c.top_p)) {
        cut = i + 1;
        break;
      }
    if (c.min_p > 0.0f) {
      size_t i = 1;
      while (i < cut && prob[i] >= double(c.min_p) * prob[0]) ++i;
      cut = i;
    }
    const std::set<int32_t> allowed(order.begin(), order.begin() + ptrdiff_t(cut));
    Sampler s({.temperature = temperature, .top_k = c.top_k, .top_p = c.top_p, .min_p = c.min_p, .seed = 3});
    std::set<int32_t> drawn;
    for (int i = 0; i < 120; ++i) {
      const int32_t t = s.sample(logits, {});
      ASSERT_TRUE(allowed.count(t)) << "token " << t << " outside the cut of " << cut << " (top_k " << c.top_k
                                    << ", top_p " << c.top_p << ", min_p " << c.min_p << ")";
      drawn.insert(t);
    }
    EXPECT_GT(drawn.size(), std::min<size_t>(cut, 10) / 2);  // draws spread over the cut
  }
}

// Backend::top_k on the CPU: the sampler's order (the logits over each row's temperature, ties to
// the lower id, NaN as -inf, -0 equal to +0), most likely first.
TEST(TopK, TheSamplersOrderRowByRow) {
  CpuBackend cpu(2);
  const int64_t cols = 9;
  const float rows[2][9] = {{1.0f, 3.0f, NAN, 3.0f, -0.0f, 0.0f, -INFINITY, 2.5f, -1.0f},
                            {0.5f, 0.25f, 4.0f, NAN, NAN, 1.0f, 4.0f, 0.0f, -2.0f}};
  Tensor logits = cpu.alloc(DType::f32, Shape{2, cols});
  std::copy(&rows[0][0], &rows[0][0] + 18, logits.data_as<float>());
  Tensor temperatures = cpu.alloc(DType::f32, Shape{2});
  temperatures.data_as<float>()[0] = 0.5f, temperatures.data_as<float>()[1] = 2.0f;
  const int k = 7;
  Tensor values = cpu.alloc(DType::f32, Shape{2, k}), ids = cpu.alloc(DType::i32, Shape{2, k});
  cpu.top_k(logits, temperatures, k, values, ids);
  const int32_t want_ids[2][7] = {{1, 3, 7, 0, 4, 5, 8}, {2, 6, 5, 0, 1, 7, 8}};
  for (int r = 0; r < 2; ++r)
    for (int j = 0; j < k; ++j) {
      const int32_t id = want_ids[r][j];
      EXPECT_EQ(ids.data_as<int32_t>()[r * k + j], id) << "row " << r << " place " << j;
      EXPECT_EQ(values.data_as<float>()[r * k + j], rows[r][id] / temperatures.data_as<float>()[r]);
    }
  Tensor all_values = cpu.alloc(DType::f32, Shape{2, cols}), all_ids = cpu.alloc(DType::i32, Shape{2, cols});
  cpu.top_k(logits, temperatures, int(cols), all_values, all_ids);
  EXPECT_EQ(all_ids.data_as<int32_t>()[cols - 2], 2);  // a NaN ranks as -inf: before id 6's -inf
  EXPECT_EQ(all_ids.data_as<int32_t>()[cols - 1], 6);
  EXPECT_EQ(all_ids.data_as<int32_t>()[2 * cols - 1], 4);  // NaN ties with NaN: the lower id first
  EXPECT_EQ(all_values.data_as<float>()[cols - 1], -INFINITY);
}

// A draw from Backend::top_k's candidates is the draw from the whole row: the same tokens for the
// same seed, over cuts, temperatures and rows with ties.
TEST(Sampler, TopKCandidatesDrawAsTheWholeRow) {
  CpuBackend cpu(2);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int64_t vocab = 5000;
  Tensor logits = cpu.alloc(DType::f32, Shape{1, vocab});
  struct Case {
    float temperature;
    int top_k;
    float top_p, min_p;
  };
  for (const Case c : {Case{1.0f, 20, 1.0f, 0.0f}, Case{0.6f, 20, 0.95f, 0.0f}, Case{1.0f, 64, 0.95f, 0.0f},
                       Case{0.3f, 256, 1.0f, 0.05f}, Case{2.0f, 1, 1.0f, 0.0f}, Case{1.5f, 40, 0.5f, 0.1f}}) {
    SamplingParams p{.temperature = c.temperature, .top_k = c.top_k, .top_p = c.top_p, .min_p = c.min_p, .seed = 9};
    ASSERT_TRUE(draws_from_top_k(p, vocab));
    Sampler whole(p), candidates(p);
    Tensor temperature = cpu.alloc(DType::f32, Shape{1});
    temperature.data_as<float>()[0] = c.temperature;
    Tensor values = cpu.alloc(DType::f32, Shape{1, c.top_k}), ids = cpu.alloc(DType::i32, Shape{1, c.top_k});
    for (int step = 0; step < 40; ++step) {
      float* l = logits.data_as<float>();
      for (int64_t i = 0; i < vocab; ++i) l[i] = std::round(normal(rng) * 4.0f) / 4.0f;  // many ties
      if (step % 7 == 3) l[step] = NAN;
      const int32_t want = whole.sample(std::span<const float>(l, size_t(vocab)), {});
      cpu.top_k(logits, temperature, c.top_k, values, ids);
      const int32_t got =
          candidates.sample_top_k(std::span<const float>(values.data_as<float>(), size_t(c.top_k)),
                                  std::span<const int32_t>(ids.data_as<int32_t>(), size_t(c.top_k)), vocab);
      ASSERT_EQ(got, want) << "step " << step << ", top_k " << c.top_k << ", temperature " << c.temperature;
    }
  }
  SamplingParams p{.temperature = 1.0f, .top_k = 20};
  EXPECT_TRUE(draws_from_top_k(p, vocab));
  EXPECT_FALSE(draws_from_top_k(p, 20));  // top_k of the whole vocabulary: no cut
  EXPECT_FALSE(draws_from_top_k({.temperature = 1.0f, .top_k = Backend::kMaxTopK + 1}, vocab));
  EXPECT_FALSE(draws_from_top_k({.temperature = 1.0f, .top_k = 0}, vocab));
  EXPECT_FALSE(draws_from_top_k({.temperature = 0.0f, .top_k = 20}, vocab));
  EXPECT_FALSE(draws_from_top_k({.temperature = 1.0f, .top_k = 20, .repetition_penalty = 1.1f}, vocab));
  EXPECT_FALSE(draws_from_top_k({.temperature = 1.0f, .top_k = 20, .logit_bias = {{3, 1.0f}}}, vocab));
}

TEST(Sampler, InfiniteAndMissingLogits) {
  const float inf = INFINITY;
  EXPECT_EQ(Sampler({.temperature = 1.0f}).sample(std::vector<float>{1.0f, inf, 3.0f, inf}, {}), 1);
  EXPECT_EQ(Sampler({.temperature = 1.0f}).sample(std::vector<float>{NAN, NAN, -inf}, {}), 0);
  EXPECT_EQ(Sampler({.temperature = 1.0f, .top_p = 0.5f}).sample(std::vector<float>{NAN, 2.0f, NAN}, {}), 1);
  EXPECT_EQ(Sampler({.temperature = 1.0f}).sample(std::vector<float>{}, {}), 0);
  // greedy: a NaN is never chosen, as by the device's argmax and top_k; ties to the lower id
  EXPECT_EQ(Sampler({.temperature = 0.0f}).sample(std::vector<float>{NAN, 1.0f, 2.0f, 2.0f}, {}), 2);
  EXPECT_EQ(Sampler({.temperature = 0.0f}).sample(std::vector<float>{1.0f, NAN, -inf}, {}), 0);
  EXPECT_EQ(Sampler({.temperature = 0.0f}).sample(std::vector<float>{NAN, NAN}, {}), 0);
}

TEST(StopMatcher, AcrossPiecesAndHeldBack) {
  StopMatcher m({"</end>", "STOP"});
  std::string shown;
  for (const std::string piece : {"Hello <", "/e", "n", "d> never"}) shown += m.push(piece);
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(shown, "Hello ");
  EXPECT_EQ(m.matched(), "</end>");

  StopMatcher n({"STOP"});
  std::string out = n.push("abc ST");
  EXPECT_EQ(out, "abc ");  // "ST" might still become STOP
  out += n.push("ILL going");
  out += n.flush();
  EXPECT_FALSE(n.stopped());
  EXPECT_EQ(out, "abc STILL going");
}

}  // namespace
}  // namespace kiln
