// CPU backend: mixture-of-experts routing and the expert feed-forwards, grouped by expert.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_math.h"
#include "quant/affine.h"

namespace kiln {

void CpuBackend::moe_route(const MoeRouteArgs& args) {
  OpTimer timed(this, "moe_route");
  const int64_t n_experts = args.logits.cols();
  const int k = args.top_k;
  const float* scale =
      args.expert_scale.defined() && args.expert_scale.numel() ? args.expert_scale.data_as<float>() : nullptr;
  pool_.parallel_for(args.logits.rows(), [&](int64_t begin, int64_t end) {
    std::vector<float> probs(static_cast<size_t>(n_experts));
    std::vector<int> order(static_cast<size_t>(n_experts));
    for (int64_t t = begin; t < end; ++t) {
      const float* logit = row_ptr(args.logits, t);
      const float max_logit = *std::max_element(logit, logit + n_experts);
      double sum = 0;
      for (int64_t e = 0; e < n_experts; ++e) sum += probs[size_t(e)] = std::exp(logit[e] - max_logit);
      for (auto& p : probs) p = float(p / sum);
      std::iota(order.begin(), order.end(), 0);
      // highest probability first; the lower index wins a tie
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
        return probs[size_t(a)] > probs[size_t(b)] || (probs[size_t(a)] == probs[size_t(b)] && a < b);
      });
      float total = 0;
      for (int i = 0; i < k; ++i) total += probs[size_t(order[size_t(i)])];
      int32_t* ids = args.ids.data_as<int32_t>() + t * k;
      float* w = args.weights.data_as<float>() + t * k;
      for (int i = 0; i < k; ++i) {
        const int e = order[size_t(i)];
        ids[i] = e;
        w[i] = args.renormalize ? probs[size_t(e)] / total : probs[size_t(e)];
        if (scale) w[i] *= scale[e];
      }
    }
  });
}

namespace {

// Expert e's [rows, cols] matrix of a stack: in place, or dequantized into `scratch` when the stack
// is quantized (one expert at a time, never the whole stack).
const float* expert_matrix(const Tensor& stack, int64_t e, std::vector<float>& scratch) {
  const int64_t rows = stack.dim(1), cols = stack.dim(2);
  if (!stack.quantized()) return stack.data_as<float>() + e * rows * cols;
  scratch.resize(size_t(rows * cols));
  quant::dequantize_rows(stack, e * rows, rows, scratch.data());
  return scratch.data();
}

}  // namespace

void CpuBackend::moe_experts(const MoeExpertsArgs& args) {
  OpTimer timed(this, "moe_experts");
  const int64_t n_tokens = args.x.rows(), hidden = args.x.cols();
  const int64_t n_experts = args.gate.dim(0), inter = args.gate.dim(1);
  const int64_t k = args.ids.cols();
  const int32_t* ids = args.ids.data_as<int32_t>();
  const float* weights = args.weights.data_as<float>();

  // tokens routed to each expert, in token order
  std::vector<std::vector<int64_t>> routed(static_cast<size_t>(n_experts));
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t i = 0; i < k; ++i) routed[size_t(ids[t * k + i])].push_back(t * k + i);

  for (int64_t r = 0; r < n_tokens; ++r) std::fill(row_ptr(args.out, r), row_ptr(args.out, r) + hidden, 0.0f);

  std::vector<float> xs, g, u, d, gate_scratch, up_scratch, down_scratch;
  for (int64_t e = 0; e < n_experts; ++e) {  // ascending expert order, as the reference accumulates
    const auto& picks = routed[size_t(e)];
    const int64_t m = int64_t(picks.size());
    if (m == 0) continue;
    xs.resize(size_t(m * hidden));
    for (int64_t i = 0; i < m; ++i) std::copy_n(row_ptr(args.x, picks[size_t(i)] / k), hidden, &xs[size_t(i * hidden)]);
    g.resize(size_t(m * inter));
    u.resize(size_t(m * inter));
    d.resize(size_t(m * hidden));
    const float* wg = expert_matrix(args.gate, e, gate_scratch);
    const float* wu = expert_matrix(args.up, e, up_scratch);
    const float* wd = expert_matrix(args.down, e, down_scratch);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(inter), int(hidden), 1.0f, xs.data(), int(hidden),
                wg, int(hidden), 0.0f, g.data(), int(inter));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(inter), int(hidden), 1.0f, xs.data(), int(hidden),
                wu, int(hidden), 0.0f, u.data(), int(inter));
    for (size_t i = 0; i < g.size(); ++i) {
      const float x = g[i];
      const float act = args.act == Activation::silu ? cpu::silu(x) : cpu::gelu_tanh(x);
      g[i] = act * u[i];
      // the GPU's tensor-core expert kernels store the GLU output in bf16, as a dense MLP does
      if (emulate_bf16_) g[i] = bf16_to_f32(f32_to_bf16(g[i]));
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(hidden), int(inter), 1.0f, g.data(), int(inter),
                wd, int(inter), 0.0f, d.data(), int(hidden));
    for (int64_t i = 0; i < m; ++i) {
      const int64_t pick = picks[size_t(i)];
      const float w = weights[pick];
      float* o = row_ptr(args.out, pick / k);
      for (int64_t c = 0; c < hidden; ++c) o[c] += w * d[size_t(i * hidden + c)];
    }
  }
  finish(args.out);
}

}  // namespace kiln
