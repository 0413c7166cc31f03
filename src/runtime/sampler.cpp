#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

namespace kiln {

std::optional<int32_t> biased_token_outside(const SamplingParams& params, int64_t vocab_size) {
  for (const auto& [token, bias] : params.logit_bias)
    if (token >= vocab_size) return token;
  return std::nullopt;
}

SampledLogprobs logprobs_of(std::span<const float> logits, int32_t token, int top) {
  const float peak = *std::max_element(logits.begin(), logits.end());
  double total = 0;
  for (float l : logits) total += std::exp(double(l) - double(peak));
  const double log_total = double(peak) + std::log(total);
  SampledLogprobs out;
  out.logprob = float(double(logits[size_t(token)]) - log_total);
  const size_t k = std::min(size_t(std::max(top, 0)), logits.size());
  if (k == 0) return out;
  // a NaN ranks last, so the order stays strict
  const auto value = [&](int32_t i) { return std::isnan(logits[size_t(i)]) ? -INFINITY : logits[size_t(i)]; };
  const auto before = [&](int32_t a, int32_t b) { return value(a) > value(b) || (value(a) == value(b) && a < b); };
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::nth_element(order.begin(), order.begin() + ptrdiff_t(k - 1), order.end(), before);
  std::sort(order.begin(), order.begin() + ptrdiff_t(k), before);
  for (size_t i = 0; i < k; ++i) out.top.push_back({order[i], float(double(logits[size_t(order[i])]) - log_total)});
  return out;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  const int64_t n = int64_t(logits.size());
  if (n == 0) return 0;
  work_.assign(logits.begin(), logits.end());
  const SamplingParams& p = params_;

  for (const auto& [token, bias] : p.logit_bias)
    if (token >= 0 && token < n) work_[size_t(token)] += bias;
  // penalties, in transformers' order: repetition first, then the additive ones
  if (p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : history)
      if (t >= 0 && t < n) ++counts[t];
    for (const auto& [t, c] : counts) {
      float& l = work_[size_t(t)];
      if (p.repetition_penalty != 1.0f) l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
      l -= p.presence_penalty + p.frequency_penalty * float(c);
    }
  }
  if (p.temperature <= 0.0f) return int32_t(std::max_element(work_.begin(), work_.end()) - work_.begin());

  // Each logit over the temperature; a NaN is never drawn.
  for (float& l : work_) l /= p.temperature;  // separate passes: each one vectorizes
  for (float& l : work_) l = std::isnan(l) ? -INFINITY : l;
  const float top = *std::max_element(work_.begin(), work_.end());
  if (!std::isfinite(top))  // no finite logit, or an infinite one: the first of the largest
    return int32_t(std::find(work_.begin(), work_.end(), top) - work_.begin());

  // Candidates in descending logit, ties keeping the lower id first. Only as much is ordered as
  // top_k, the cuts and the draw reach (a full sort of a 250K vocabulary took ~30 ms a token):
  // `order_` grows in sorted prefixes, each picked from what is left.
  auto before = [&](int32_t a, int32_t b) {
    return work_[size_t(a)] > work_[size_t(b)] || (work_[size_t(a)] == work_[size_t(b)] && a < b);
  };
  size_t sorted = 0;
  auto sort_to = [&](size_t end) {  // order_[0..end) in order
    std::partial_sort(order_.begin() + ptrdiff_t(sorted), order_.begin() + ptrdiff_t(end), order_.end(), before);
    sorted = end;
  };
  auto sort_through = [&](size_t i) {  // order_[0..i] in order, and some more
    if (i >= sorted) sort_to(std::min(order_.size(), std::max<size_t>(256, 4 * (i + 1))));
  };
  order_.resize(size_t(n));
  std::iota(order_.begin(), order_.end(), 0);
  const bool top_k = p.top_k > 0 && p.top_k < n;
  if (top_k) {  // only the top_k candidates stay
    sort_to(size_t(p.top_k));
    order_.resize(size_t(p.top_k));
  }
  // softmax over the candidates: weights exp(logit - top), by id
  weights_.resize(size_t(n));
  double total = 0;
  if (top_k) {
    for (int32_t t : order_) total += weights_[size_t(t)] = std::exp(work_[size_t(t)] - top);
  } else {
    for (int64_t i = 0; i < n; ++i) total += weights_[size_t(i)] = std::exp(work_[size_t(i)] - top);
  }
  auto prob = [&](size_t i) { return double(weights_[size_t(order_[i])]) / total; };
  const size_t kept = order_.size();
  if (p.top_p >= 1.0f && p.min_p <= 0.0f) {  // no cut: any order of the candidates draws alike
    double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
    for (size_t i = 0; i < kept; ++i) {  // order_: sorted with top_k, ids otherwise
      const double q = prob(i);
      if (u < q) return order_[i];
      u -= q;
    }
    sort_through(0);  // rounding left u past the end: the most likely
    return order_[0];
  }
  size_t cut = kept;
  double mass = 1.0;     // of the candidates before the cut
  if (p.top_p < 1.0f) {  // the smallest prefix whose mass reaches top_p
    double reached = 0;
    for (size_t i = 0; i < kept; ++i) {
      sort_through(i);
      reached += prob(i);
      if (reached >= double(p.top_p)) {
        cut = i + 1, mass = reached;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {  // drop candidates below min_p times the most likely one
    sort_through(0);
    const double floor = double(p.min_p) * prob(0);
    size_t i = 1;
    double kept_mass = prob(0);
    while (i < cut) {
      sort_through(i);
      const double q = prob(i);
      if (q < floor) break;
      kept_mass += q, ++i;
    }
    if (i < cut) cut = i, mass = kept_mass;
  }
  double u = std::uniform_real_distribution<double>(0.0, mass)(rng_);
  for (size_t i = 0; i < cut; ++i) {
    sort_through(i);
    const double q = prob(i);
    if (u < q) return order_[i];
    u -= q;
  }
  sort_through(cut - 1);
  return order_[cut - 1];
}

}  // namespace kiln
