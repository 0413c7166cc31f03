// Mixture-of-experts checkpoints in bf16 against the f32 path. A router whose top-k choice sits
// on a near-tie can choose another expert under bf16 rounding, and that changes a position's output
// by far more than rounding does elsewhere. So every position whose logits differ by more than the
// dense fixtures' tolerance must be explained by such a tie: at that position some layer's bf16
// choice of experts differs from the f32 one, and there the f32 margin between its k-th and
// (k+1)-th router logit is within bf16 resolution (kTieUlps bf16 ulps, 2^-8 each, of the row's
// largest router logit: on the CPU's bf16 emulation, rounding alone flips choices at margins of up
// to 6.4 ulps, see docs/correctness.md). Anything else is a real error. Used by the CPU suite (bf16 emulation) and
// the GPU suite (the CUDA backend).
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "models/activation_dump.h"
#include "models/model.h"
#include "runtime/prefill.h"
#include "test_util.h"

namespace kiln::test {

constexpr double kTolerance = 2e-2;  // of max |reference logit|, as the dense fixtures' GPU test
constexpr double kTieUlps = 8.0;     // a margin within this many bf16 ulps (2^-8) of the largest logit

struct MoeRun {
  std::vector<float> logits;
  int64_t vocab = 0;
  ActivationRecorder dump;
};

// The fixture's ids through the model in `dir`, in chunks of `chunk` tokens (0: all at once).
inline void moe_run(Backend& backend, const std::string& dir, const std::vector<int32_t>& ids, MoeRun& out,
                    int64_t chunk = 0) {
  if (chunk <= 0) chunk = int64_t(ids.size());
  auto model = load_model(dir, backend, ModelOptions{.max_chunk_tokens = chunk});
  ASSERT_TRUE(model.ok()) << model.error().message;
  (*model)->set_activation_dump(&out.dump);
  auto state = (*model)->new_sequence(int64_t(ids.size()));
  ASSERT_TRUE(state.ok());
  auto logits = run_tokens(**model, **state, ids, chunk, LogitRows::all);
  ASSERT_TRUE(logits.ok()) << logits.error().message;
  out.vocab = logits->dim(1);
  out.logits.assign(logits->data_as<float>(), logits->data_as<float>() + logits->numel());
}

// The experts a router row chooses, and the margin between its k-th and (k+1)-th logit.
inline std::pair<std::set<int>, double> top_k(const float* row, int64_t experts, int k) {
  std::vector<int> order(static_cast<size_t>(experts));
  for (int e = 0; e < int(experts); ++e) order[size_t(e)] = e;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
  std::set<int> chosen(order.begin(), order.begin() + k);
  const double margin = k < experts ? double(row[order[size_t(k - 1)]]) - double(row[order[size_t(k)]]) : INFINITY;
  return {chosen, margin};
}

// Runs the fixture `fixture` (or the checkpoint in `dir`, with the fixture's ids) on `reference`
// (f32) and `candidate` (bf16), in chunks of `chunk` tokens (0: all at once), and fails the test for
// every position outside the tolerance that no expert-choice tie explains.
inline void expect_deviations_are_expert_ties(Backend& reference, Backend& candidate, const std::string& fixture,
                                              std::string dir = "", int64_t chunk = 0) {
  if (dir.empty()) dir = fixture_path(fixture);
  const auto config = read_json(dir + "/config.json");
  const auto& text = config.contains("text_config") ? config["text_config"] : config;
  const char* key = text.contains("num_experts_per_tok") ? "num_experts_per_tok" : "top_k_experts";
  const int k = text.contains(key) && text[key].is_number_integer() ? text[key].get<int>() : 0;
  ASSERT_GT(k, 0);
  const auto ids = fixture_ids(fixture);
  const int64_t n = int64_t(ids.size());

  MoeRun want, got;
  moe_run(reference, dir, ids, want, chunk);
  moe_run(candidate, dir, ids, got, chunk);
  ASSERT_EQ(want.logits.size(), got.logits.size());
  const int64_t vocab = want.vocab;
  const auto c = compare_logits(got.logits.data(), want.logits.data(), n, vocab);
  const double tol = kTolerance * c.max_abs_reference;

  int64_t outside = 0, flips = 0, unexplained = 0;
  double worst_tie = 0;
  for (int64_t r = 0; r < n; ++r) {
    double diff = 0;
    for (int64_t v = 0; v < vocab; ++v)
      diff = std::max(diff, double(std::fabs(got.logits[size_t(r * vocab + v)] - want.logits[size_t(r * vocab + v)])));
    if (diff <= tol) continue;
    ++outside;
    bool explained = false;
    std::string where;
    for (int layer = 0;; ++layer) {
      const auto* w = want.dump.find(fmt::format("layers.{}.router_logits", layer));
      const auto* g = got.dump.find(fmt::format("layers.{}.router_logits", layer));
      if (!w || !g) break;
      const int64_t experts = w->row_shape.empty() ? 1 : w->row_shape[0];
      const float* wr = w->data.data() + r * experts;
      const float* gr = g->data.data() + r * experts;
      auto [cpu_choice, margin] = top_k(wr, experts, k);
      auto [gpu_choice, unused] = top_k(gr, experts, k);
      if (cpu_choice == gpu_choice) continue;
      ++flips;
      double largest = 0;
      for (int64_t e = 0; e < experts; ++e) largest = std::max(largest, double(std::fabs(wr[e])));
      const double resolution = kTieUlps * std::ldexp(largest, -8);
      where += fmt::format(" layer {} margin {:.3g} (resolution {:.3g});", layer, margin, resolution);
      if (margin <= resolution) {
        explained = true;
        worst_tie = std::max(worst_tie, margin / std::max(largest, 1e-30));
      }
    }
    if (!explained) {
      ++unexplained;
      ADD_FAILURE() << fixture << " on " << candidate.name() << ": position " << r << " differs by "
                    << diff / c.max_abs_reference << " of max |logit| without an expert-choice tie;" << where;
    }
  }
  // every flip anywhere, for the record: how wide a margin bf16 rounding flips
  int64_t all_flips = 0;
  double widest_flip = 0;
  for (int layer = 0;; ++layer) {
    const auto* w = want.dump.find(fmt::format("layers.{}.router_logits", layer));
    const auto* g = got.dump.find(fmt::format("layers.{}.router_logits", layer));
    if (!w || !g) break;
    const int64_t experts = w->row_shape.empty() ? 1 : w->row_shape[0];
    for (int64_t r = 0; r < n; ++r) {
      const float* wr = w->data.data() + r * experts;
      auto [cpu_choice, margin] = top_k(wr, experts, k);
      if (cpu_choice == top_k(g->data.data() + r * experts, experts, k).first) continue;
      ++all_flips;
      double largest = 1e-30;
      for (int64_t e = 0; e < experts; ++e) largest = std::max(largest, double(std::fabs(wr[e])));
      widest_flip = std::max(widest_flip, margin / largest);
    }
  }
  std::printf(
      "%s on %s (chunks of %lld): max |diff| %.3g of max |logit|, argmax agreement %.3f, %lld of %lld positions outside %.0e "
      "(%lld flips there, widest tie %.3g); %lld expert-choice flips in all, the widest at a margin of %.3g "
      "of the row's largest router logit\n",
      fixture.c_str(), candidate.name().c_str(), (long long)(chunk > 0 ? chunk : n), c.relative(), c.argmax_agreement, (long long)outside, (long long)n,
      kTolerance, (long long)flips, worst_tie, (long long)all_flips, widest_flip);
  EXPECT_EQ(unexplained, 0);
}

inline std::vector<std::string> moe_fixtures() {
  std::vector<std::string> out;
  for (const auto& name : fixture_names()) {
    const auto config = read_json(fixture_path(name) + "/config.json");
    const auto& text = config.contains("text_config") ? config["text_config"] : config;
    if (text.contains("num_experts") && text["num_experts"].is_number_integer() && text["num_experts"].get<int>() > 0)
      out.push_back(name);
  }
  return out;
}

}  // namespace kiln::test
