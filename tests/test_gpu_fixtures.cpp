// The CUDA backend against the CPU f32 reference on every oracle fixture, end to end: logits at
// several prefill chunk sizes and decode, and decode steps replayed as CUDA graphs. Skipped,
// visibly, where no GPU is present.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <span>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "convert/quantize_model.h"
#include "io/config.h"
#include "io/synthetic.h"
#include "models/model.h"
#include "runtime/decode_loop.h"
#include "runtime/prefill.h"
#include "runtime/scheduler.h"
#include "moe_parity.h"
#include "scheduler_test_util.h"
#include "test_util.h"

namespace kiln::test {
namespace {

// Whole models: GPU (bf16) logits against CPU (f32) logits on every oracle fixture. Prompts go in
// at chunk sizes 1, 7 and whole, then 32 tokens are decoded one at a time, fed the same ids.
class GpuFixtures : public testing::TestWithParam<std::string> {};

std::vector<float> run_device(Backend& backend, const std::string& fixture, const std::vector<int32_t>& ids,
                              int64_t prompt, int64_t chunk) {
  auto model = load_model(fixture_path(fixture), backend, ModelOptions{.max_chunk_tokens = chunk});
  EXPECT_TRUE(model.ok()) << (model.ok() ? "" : model.error().message);
  auto state = (*model)->new_sequence(int64_t(ids.size()));
  std::vector<float> all;
  auto head = run_tokens(**model, **state, std::span(ids).first(size_t(prompt)), chunk, LogitRows::all);
  EXPECT_TRUE(head.ok()) << (head.ok() ? "" : head.error().message);
  all.assign(head->data_as<float>(), head->data_as<float>() + head->numel());
  for (size_t i = size_t(prompt); i < ids.size(); ++i) {
    auto step = run_tokens(**model, **state, std::span(ids).subspan(i, 1), 1, LogitRows::all);
    EXPECT_TRUE(step.ok());
    all.insert(all.end(), step->data_as<float>(), step->data_as<float>() + step->numel());
  }
  return all;
}

TEST_P(GpuFixtures, MatchCpuReference) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  ASSERT_TRUE(gpu.ok());
  CpuBackend cpu(4);
  const auto ids = fixture_ids(GetParam());
  const int64_t prompt = int64_t(ids.size()) - 32, n = int64_t(ids.size());
  const auto moe_names = moe_fixtures();
  const bool moe = std::find(moe_names.begin(), moe_names.end(), GetParam()) != moe_names.end();
  for (int64_t chunk : {int64_t(1), int64_t(7), prompt}) {
    const auto want = run_device(cpu, GetParam(), ids, prompt, chunk);
    const auto got = run_device(**gpu, GetParam(), ids, prompt, chunk);
    ASSERT_EQ(want.size(), got.size());
    const int64_t vocab = int64_t(want.size()) / n;
    auto c = compare_logits(got.data(), want.data(), n, vocab);
    const double tol = 2e-2 * c.max_abs_reference;
    // MoE: a position beyond the tolerance must be an expert-choice tie within bf16 resolution
    if (moe)
      expect_deviations_are_expert_ties(cpu, **gpu, GetParam(), "", chunk);
    else
      EXPECT_LE(c.max_abs_diff, tol) << "chunk " << chunk;
    EXPECT_GE(c.argmax_agreement, 0.97) << "chunk " << chunk;
    // wherever the CPU's top two are further apart than the tolerance, the argmax must agree
    for (int64_t r = 0; r < n; ++r) {
      const float* w = want.data() + r * vocab;
      const float* g = got.data() + r * vocab;
      std::vector<float> sorted(w, w + vocab);
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      if (sorted[0] - sorted[1] <= tol) continue;
      EXPECT_EQ(std::max_element(g, g + vocab) - g, std::max_element(w, w + vocab) - w)
          << "position " << r << " chunk " << chunk;
    }
  }
  EXPECT_TRUE((*gpu)->status().ok());
}

// A decode step recorded as a CUDA graph and replayed chooses what step-by-step forwards choose.
TEST_P(GpuFixtures, GraphDecodeMatchesForwards) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  ASSERT_TRUE(gpu.ok());
  const auto ids = fixture_ids(GetParam());
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 40);
  auto model = load_model(fixture_path(GetParam()), **gpu);
  ASSERT_TRUE(model.ok());
  std::vector<std::vector<int32_t>> results;
  for (bool graph : {false, true}) {
    std::vector<std::unique_ptr<SequenceState>> seqs;
    std::vector<SequenceState*> states;
    std::vector<int32_t> next;
    for (int s = 0; s < 3; ++s) {  // three sequences decoded together
      seqs.push_back(std::move((*model)->new_sequence(100)).value());
      states.push_back(seqs.back().get());
      std::vector<int32_t> p(prompt.begin() + s, prompt.end());
      auto logits = run_tokens(**model, *seqs.back(), p, 0, LogitRows::last);
      ASSERT_TRUE(logits.ok());
      next.push_back(int32_t(std::max_element(logits->data_as<float>(), logits->data_as<float>() + logits->numel()) -
                             logits->data_as<float>()));
    }
    std::vector<int32_t> chosen = next;
    if (graph) {
      auto loop = DecodeLoop::create(**model, states, next);
      ASSERT_TRUE(loop.ok()) << loop.error().message;
      for (int step = 0; step < 20; ++step) {
        ASSERT_TRUE((*loop)->step().ok());
        auto t = (*loop)->tokens();
        chosen.insert(chosen.end(), t.begin(), t.end());
      }
    } else {
      for (int step = 0; step < 20; ++step) {
        std::vector<SeqChunk> chunks;
        for (int s = 0; s < 3; ++s) chunks.push_back({states[size_t(s)], std::span(&next[size_t(s)], 1)});
        auto logits = (*model)->forward(chunks, LogitRows::last);
        ASSERT_TRUE(logits.ok());
        Tensor host = (*gpu)->to_host(*logits);
        const int64_t vocab = host.cols();
        for (int s = 0; s < 3; ++s) {
          const float* row = host.data_as<float>() + s * vocab;
          next[size_t(s)] = int32_t(std::max_element(row, row + vocab) - row);
        }
        chosen.insert(chosen.end(), next.begin(), next.end());
      }
    }
    results.push_back(chosen);
  }
  EXPECT_EQ(results[0], results[1]);
}

// kiln generate's decode: a recorded step replayed with its candidates found on the device
// (SequenceDecoder) draws the tokens that forward calls and draw_next draw, greedy and sampled.
TEST_P(GpuFixtures, ReplayedSequenceDecodingDrawsAsForwards) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  ASSERT_TRUE(gpu.ok());
  auto model = load_model(fixture_path(GetParam()), **gpu);
  ASSERT_TRUE(model.ok());
  const auto ids = fixture_ids(GetParam());
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 20);
  const SamplingParams settings[] = {{.temperature = 0},
                                     {.temperature = 0.8f, .top_k = 20, .top_p = 0.95f, .seed = 1},
                                     {.temperature = 1.3f, .top_k = 5, .min_p = 0.05f, .seed = 2},
                                     {.temperature = 1.0f, .seed = 3}};  // no top_k: whole rows, forward calls
  for (const SamplingParams& p : settings) {
    std::vector<std::vector<int32_t>> drawn;
    for (bool replayed : {false, true}) {
      auto state = (*model)->new_sequence(64);
      ASSERT_TRUE(state.ok());
      Sampler sampler(p);
      std::vector<int32_t> history = prompt, out;
      auto logits = run_tokens(**model, **state, prompt, 0, LogitRows::last);
      ASSERT_TRUE(logits.ok());
      auto next = draw_next(**model, *logits, sampler, history, true, 1);
      ASSERT_TRUE(next.ok());
      SequenceDecoder decoder(**model, **state, sampler);
      for (int i = 0; i < 24; ++i) {
        out.push_back(*next);
        history.push_back(*next);
        if (replayed) {
          next = decoder.next(*next, history, true, i + 2);
        } else {
          auto step = run_token(**model, **state, *next);
          ASSERT_TRUE(step.ok());
          next = draw_next(**model, *step, sampler, history, true, i + 2);
        }
        ASSERT_TRUE(next.ok()) << next.error().message;
      }
      drawn.push_back(out);
    }
    EXPECT_EQ(drawn[0], drawn[1]) << "temperature " << p.temperature << " top_k " << p.top_k;
  }
  EXPECT_TRUE((*gpu)->status().ok());
}

// A sequence's decode logits do not depend on the other sequences in its forward call: one
// sequence stepped alone and its twin (same prompt, same tokens) stepped as the first of 2, 3 and
// 17 rows give the same bits, step after step (2 rows still take the fused output projections, 3
// do not). What kiln serve's batch invariance rests on. Returns what differed, empty when nothing.
std::vector<std::string> decode_rows_variance(Model& model, Backend& backend, const std::vector<int32_t>& ids,
                                              int64_t prompt) {
  std::vector<std::string> differ;
  const int64_t vocab = model.info().vocab_size;
  for (int others : {1, 2, 16}) {
    std::vector<std::unique_ptr<SequenceState>> states;
    for (int s = 0; s < others + 2; ++s) {  // 0: alone, 1: its twin, then the others
      auto state = model.new_sequence(int64_t(ids.size()) + 1);
      EXPECT_TRUE(state.ok());
      if (!state.ok()) return differ;
      std::vector<int32_t> p(ids.begin(), ids.begin() + prompt);
      if (s >= 2) std::rotate(p.begin(), p.begin() + (s % (prompt - 1)) + 1, p.end());  // other prompts
      EXPECT_TRUE(run_tokens(model, **state, p, 0, LogitRows::last).ok());
      states.push_back(std::move(*state));
    }
    for (int64_t i = prompt; i < int64_t(ids.size()); ++i) {
      const int32_t token = ids[size_t(i)];
      SeqChunk alone{.state = states[0].get(), .tokens = std::span<const int32_t>(&token, 1)};
      auto a = model.forward(std::span<const SeqChunk>(&alone, 1), LogitRows::last);
      EXPECT_TRUE(a.ok());
      if (!a.ok()) return differ;
      const Tensor want = backend.to_host(*a);
      std::vector<SeqChunk> batch;
      for (size_t s = 1; s < states.size(); ++s)
        batch.push_back({.state = states[s].get(), .tokens = std::span<const int32_t>(&token, 1)});
      auto b = model.forward(batch, LogitRows::last);
      EXPECT_TRUE(b.ok());
      if (!b.ok()) return differ;
      const Tensor got = backend.to_host(*b);
      int64_t first = -1, count = 0;
      for (int64_t c = 0; c < vocab; ++c)
        if (std::memcmp(want.data_as<float>() + c, got.data_as<float>() + c, sizeof(float)) != 0) {
          if (first < 0) first = c;
          ++count;
        }
      if (count > 0) {
        differ.push_back(fmt::format("step {} among {} rows: {} of {} logits differ, first {} ({} vs {})", i - prompt,
                                     others + 1, count, vocab, first, want.data_as<float>()[first],
                                     got.data_as<float>()[first]));
        break;  // the states now differ; the next composition starts afresh
      }
    }
  }
  return differ;
}

// A model directory loaded on a CUDA backend of its own.
struct GpuModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};

GpuModel load_on_gpu(const std::string& dir) {
  GpuModel g;
  auto backend = make_cuda_backend(0);
  EXPECT_TRUE(backend.ok());
  if (!backend.ok()) return g;
  g.backend = std::move(backend).value();
  auto model = load_model(dir, *g.backend);
  EXPECT_TRUE(model.ok()) << model.error().message;
  if (model.ok()) g.model = std::move(model).value();
  return g;
}

TEST_P(GpuFixtures, DecodeRowsAreBatchInvariant) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  GpuModel g = load_on_gpu(fixture_path(GetParam()));
  ASSERT_TRUE(g.model);
  const auto ids = fixture_ids(GetParam());
  for (const std::string& d : decode_rows_variance(*g.model, *g.backend, ids, int64_t(ids.size()) - 8))
    ADD_FAILURE() << d;
  EXPECT_TRUE(g.backend->status().ok());
}

// A request served among others that arrive while it runs gets the tokens it gets alone (kiln
// serve's batch-invariant steps, prompts of several lengths prefilled in chunks between decode
// steps; alone, its decode steps are replayed from a recording). Every third request samples from
// its top_k, seeded. Returns what differed, empty when nothing.
std::vector<std::string> served_variance(Model& model) {
  std::vector<std::string> differ;
  const int64_t vocab = model.info().vocab_size;
  constexpr int kRequests = 24;
  auto prompt = [vocab](int i) { return prompt_for(i, vocab, 5 + (i * 7) % 40); };
  auto request = [&](int i) {
    GenerationParams r = greedy(prompt(i), 12);
    if (i % 3 == 2) r.sampling = {.temperature = 0.8f, .top_k = 20, .top_p = 0.95f, .seed = uint64_t(i)};
    return r;
  };
  const SchedulerOptions alone_options{.max_batch = 1, .context = 256, .prefill_chunk = 16, .batch_invariant = true};
  std::vector<std::vector<int32_t>> alone(kRequests);
  {
    auto s = Scheduler::create(model, alone_options);
    EXPECT_TRUE(s.ok());
    if (!s.ok()) return differ;
    for (int i = 0; i < kRequests; ++i) {
      auto g = (*s)->submit(request(i));
      EXPECT_TRUE(g.ok());
      if (!g.ok()) return differ;
      alone[size_t(i)] = drain(*g).tokens;
    }
  }
  SchedulerOptions together_options = alone_options;
  together_options.max_batch = 32;
  auto s = Scheduler::create(model, together_options);
  EXPECT_TRUE(s.ok());
  if (!s.ok()) return differ;
  std::vector<std::shared_ptr<Generation>> gens;
  for (int i = 0; i < kRequests; ++i) {
    auto g = (*s)->submit(request(i));
    EXPECT_TRUE(g.ok());
    if (!g.ok()) return differ;
    gens.push_back(*g);
    if (i % 8 == 7) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int i = 0; i < kRequests; ++i) {
    const std::vector<int32_t> got = drain(gens[size_t(i)]).tokens;
    if (got != alone[size_t(i)]) {
      size_t at = 0;
      while (at < got.size() && at < alone[size_t(i)].size() && got[at] == alone[size_t(i)][at]) ++at;
      differ.push_back(fmt::format("request {} (prompt {}): token {} differs", i, prompt(i).size(), at));
    }
  }
  if ((*s)->stats().step_rows <= (*s)->stats().steps) differ.push_back("the requests never shared a step");
  return differ;
}

TEST_P(GpuFixtures, ServedOutputDoesNotDependOnTheBatch) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  GpuModel g = load_on_gpu(fixture_path(GetParam()));
  ASSERT_TRUE(g.model);
  for (const std::string& d : served_variance(*g.model)) ADD_FAILURE() << d;
  EXPECT_TRUE(g.backend->status().ok());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuFixtures, testing::ValuesIn(fixture_names()),
                         [](const auto& info) { return info.param; });

// The same at the real models' widths, where the products take other kernel forms than at the
// fixtures' sizes: a few layers of each geometry (the first sliding and global, or Gated DeltaNet
// and attention, layers), a short vocabulary, random weights, bf16 and 4-bit g64.
struct WidthCase {
  std::string config;  // under models/configs
  int layers;
  bool quantized;
};

class GpuModelWidths : public testing::TestWithParam<WidthCase> {};

// Writes the case's model into `dir` and returns its path.
std::string write_width_model(const WidthCase& c, const std::string& dir) {
  auto config = read_model_config_file(source_dir() + "/models/configs/" + c.config + ".json");
  EXPECT_TRUE(config.ok()) << config.error().message;
  nlohmann::json& text = config->text;
  text["num_hidden_layers"] = c.layers;
  auto types = text["layer_types"].get<std::vector<std::string>>();
  types.resize(size_t(c.layers));
  text["layer_types"] = types;
  text["vocab_size"] = 8192;
  config->root = text;
  auto tensors = checkpoint_tensors(*config);
  EXPECT_TRUE(tensors.ok()) << tensors.error().message;
  const std::string dense = dir + "/bf16", quantized = dir + "/q4";
  EXPECT_TRUE(write_synthetic_checkpoint(dense, text, *tensors, SyntheticOptions{.seed = 5}).ok());
  if (!c.quantized) return dense;
  EXPECT_TRUE(quantize_model_dir(dense, quantized, QuantizeOptions{.bits = 4, .group_size = 64}).ok());
  return quantized;
}

// Both checks on one written model (writing it is most of the test's time).
TEST_P(GpuModelWidths, DecodeAndServedRowsAreBatchInvariant) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  TempDir tmp;
  GpuModel g = load_on_gpu(write_width_model(GetParam(), tmp.path()));
  ASSERT_TRUE(g.model);
  std::vector<int32_t> ids;
  for (int i = 0; i < 30; ++i) ids.push_back(int32_t((i * 7919 + 11) % 8192));
  for (const std::string& d : decode_rows_variance(*g.model, *g.backend, ids, 22)) ADD_FAILURE() << "decode: " << d;
  for (const std::string& d : served_variance(*g.model)) ADD_FAILURE() << "served: " << d;
  EXPECT_TRUE(g.backend->status().ok());
}

INSTANTIATE_TEST_SUITE_P(Widths, GpuModelWidths,
                         testing::Values(WidthCase{"qwen3.5-4b", 4, false}, WidthCase{"qwen3.5-4b", 4, true},
                                         WidthCase{"gemma4-12b", 6, false}, WidthCase{"gemma4-12b", 6, true}),
                         [](const auto& info) {
                           std::string name = info.param.config + (info.param.quantized ? "_q4" : "_bf16");
                           std::replace(name.begin(), name.end(), '-', '_');
                           std::replace(name.begin(), name.end(), '.', '_');
                           return name;
                         });

}  // namespace
}  // namespace kiln::test
