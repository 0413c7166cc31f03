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
  if (p.temperature <= 0.0f) {  // the first of the largest, a NaN never chosen: the device's argmax
    int64_t best = 0;
    for (int64_t t = 1; t < n; ++t)
      if (work_[size_t(t)] > work_[size_t(best)] ||
          (work_[size_t(best)] != work_[size_t(best)] && work_[size_t(t)] == work_[size_t(t)]))
        best = t;
    return int32_t(best);
  }

  const float temperature = p.temperature;  // held apart from the logits, so the loop vectorizes
  for (float& l : work_) {                  // each logit over the temperature; a NaN is never drawn
    const float v = l / temperature;
    l = v == v ? v : -INFINITY;
  }

  // The candidates: every id, or the top_k of them (descending logit, ties to the lower id). The
  // cuts keep sets: the smallest set of most likely candidates reaching top_p, those within min_p
  // of the best. A draw walks its set in whatever order it lies, which draws alike, so nothing past
  // top_k is sorted (a full sort of a 250K vocabulary took ~30 ms a token).
  auto before = [&](int32_t a, int32_t b) {
    return work_[size_t(a)] > work_[size_t(b)] || (work_[size_t(a)] == work_[size_t(b)] && a < b);
  };
  const bool cut_to_top_k = p.top_k > 0 && p.top_k < n;
  if (cut_to_top_k) {
    // One pass with the best k so far in a heap whose root is the worst of them: nearly every
    // logit loses to the root at once (a later id never wins a tie), so the pass is one comparison
    // a logit instead of partial_sort's work through an index array.
    const size_t k = size_t(p.top_k);
    order_.resize(k);
    std::iota(order_.begin(), order_.end(), 0);
    std::make_heap(order_.begin(), order_.end(), before);
    float worst = work_[size_t(order_[0])];
    for (int64_t t = int64_t(k); t < n; ++t) {
      if (!(work_[size_t(t)] > worst)) continue;
      std::pop_heap(order_.begin(), order_.end(), before);
      order_.back() = int32_t(t);
      std::push_heap(order_.begin(), order_.end(), before);
      worst = work_[size_t(order_[0])];
    }
    std::sort_heap(order_.begin(), order_.end(), before);  // most likely first
  } else {
    order_.resize(size_t(n));
    std::iota(order_.begin(), order_.end(), 0);
  }
  return draw(cut_to_top_k);
}

bool plain_greedy(const SamplingParams& p) {
  return p.temperature <= 0.0f && p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f &&
         p.frequency_penalty == 0.0f && p.logit_bias.empty();
}

bool draws_from_top_k(const SamplingParams& p, int64_t vocab_size) {
  return p.temperature > 0.0f && p.top_k > 0 && p.top_k <= Backend::kMaxTopK && p.top_k < vocab_size &&
         p.logit_bias.empty() && p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f &&
         p.frequency_penalty == 0.0f;
}

int32_t Sampler::sample_top_k(std::span<const float> values, std::span<const int32_t> ids, int64_t vocab_size) {
  if (values.empty() || values.size() != ids.size()) return 0;
  // only the candidates' entries are read; the rest keep whatever an earlier call left
  if (work_.size() < size_t(vocab_size)) work_.resize(size_t(vocab_size));
  order_.assign(ids.begin(), ids.end());
  for (size_t i = 0; i < ids.size(); ++i) work_[size_t(ids[i])] = values[i];
  return draw(true);
}

int32_t Sampler::draw(bool cut_to_top_k) {
  const SamplingParams& p = params_;
  auto before = [&](int32_t a, int32_t b) {
    return work_[size_t(a)] > work_[size_t(b)] || (work_[size_t(a)] == work_[size_t(b)] && a < b);
  };
  const float top = cut_to_top_k ? work_[size_t(order_[0])] : *std::max_element(work_.begin(), work_.end());
  if (!std::isfinite(top))  // no finite logit, or an infinite one: the first of the largest
    return cut_to_top_k ? order_[0] : int32_t(std::find(work_.begin(), work_.end(), top) - work_.begin());
  // softmax weights exp(logit - top), by id; the most likely weighs 1
  if (weights_.size() < work_.size()) weights_.resize(work_.size());
  double total = 0;
  for (int32_t t : order_) total += weights_[size_t(t)] = std::exp(work_[size_t(t)] - top);
  size_t cut = order_.size();
  if (p.top_p < 1.0f) cut = nucleus(double(p.top_p) * total, before);
  if (p.min_p > 0.0f)  // a probability of at least min_p times the most likely's
    cut = size_t(std::partition(order_.begin(), order_.begin() + ptrdiff_t(cut),
                                [&](int32_t t) { return weights_[size_t(t)] >= p.min_p; }) -
                 order_.begin());
  double mass = 0;
  for (size_t i = 0; i < cut; ++i) mass += weights_[size_t(order_[i])];
  double u = std::uniform_real_distribution<double>(0.0, mass)(rng_);
  for (size_t i = 0; i < cut; ++i) {
    const double w = weights_[size_t(order_[i])];
    if (u < w) return order_[i];
    u -= w;
  }
  return *std::min_element(order_.begin(), order_.begin() + ptrdiff_t(cut), before);  // rounding: the best
}

template <typename Before>
size_t Sampler::nucleus(double target, const Before& before) {
  // The most likely 256 first, sorted: a trained model's nucleus is usually among them.
  size_t lo = std::min<size_t>(256, order_.size()), hi = order_.size();
  std::partial_sort(order_.begin(), order_.begin() + ptrdiff_t(lo), order_.end(), before);
  double above = 0;  // the weight of order_[0..lo), all in the set
  for (size_t i = 0; i < lo; ++i)
    if ((above += weights_[size_t(order_[i])]) >= target) return i + 1;
  // Otherwise a selection: partition [lo, hi) around a pivot, keep to the side the boundary is in.
  while (hi - lo > 32) {
    const int32_t a = order_[lo], b = order_[lo + (hi - lo) / 2], c = order_[hi - 1];
    const int32_t pivot =
        before(a, b) ? (before(b, c) ? b : (before(a, c) ? c : a)) : (before(a, c) ? a : (before(b, c) ? c : b));
    const auto first = order_.begin() + ptrdiff_t(lo), last = order_.begin() + ptrdiff_t(hi);
    const auto split = std::partition(first, last, [&](int32_t t) { return before(t, pivot); });
    std::iter_swap(split, std::find(split, last, pivot));  // the pivot right after those before it
    const size_t m = size_t(split - order_.begin());
    double w = 0;
    for (size_t i = lo; i < m; ++i) w += weights_[size_t(order_[i])];
    if (above + w >= target) {
      hi = m;
      continue;
    }
    above += w + weights_[size_t(pivot)];
    if (above >= target) return m + 1;
    lo = m + 1;
  }
  std::sort(order_.begin() + ptrdiff_t(lo), order_.begin() + ptrdiff_t(hi), before);
  for (size_t i = lo; i < hi; ++i)
    if ((above += weights_[size_t(order_[i])]) >= target) return i + 1;
  return hi;  // rounding: all of them
}

}  // namespace kiln
