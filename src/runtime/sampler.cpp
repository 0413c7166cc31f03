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

  for (float& l : work_) l /= p.temperature;
  // candidates by descending logit; ties keep the lower id first
  order_.resize(size_t(n));
  std::iota(order_.begin(), order_.end(), 0);
  int64_t keep = n;
  if (p.top_k > 0 && p.top_k < n) keep = p.top_k;
  auto by_logit = [&](int32_t a, int32_t b) {
    return work_[size_t(a)] > work_[size_t(b)] || (work_[size_t(a)] == work_[size_t(b)] && a < b);
  };
  if (keep < n) {
    std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(), by_logit);
  } else {
    std::sort(order_.begin(), order_.end(), by_logit);
  }
  order_.resize(size_t(keep));
  // softmax over the kept candidates
  const float top = work_[size_t(order_[0])];
  std::vector<double> prob(order_.size());
  double total = 0;
  for (size_t i = 0; i < order_.size(); ++i) total += prob[i] = std::exp(double(work_[size_t(order_[i])] - top));
  for (double& q : prob) q /= total;
  size_t cut = prob.size();
  if (p.top_p < 1.0f) {  // the smallest prefix whose mass reaches top_p
    double mass = 0;
    for (size_t i = 0; i < prob.size(); ++i) {
      mass += prob[i];
      if (mass >= double(p.top_p)) {
        cut = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {  // drop candidates below min_p times the most likely one
    size_t i = 1;
    while (i < cut && prob[i] >= double(p.min_p) * prob[0]) ++i;
    cut = i;
  }
  double mass = 0;
  for (size_t i = 0; i < cut; ++i) mass += prob[i];
  double u = std::uniform_real_distribution<double>(0.0, mass)(rng_);
  for (size_t i = 0; i < cut; ++i) {
    if (u < prob[i]) return order_[i];
    u -= prob[i];
  }
  return order_[cut - 1];
}

}  // namespace kiln
