// CPU backend: the causal conv1d and the gated delta rule of Gated DeltaNet.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_math.h"

namespace kiln {

namespace {

float softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(x));
}

// x / sqrt(Σx² + 1e-6), as the reference's l2norm (eps inside the root, on the sum).
void l2_normalize(float* x, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double(x[i]) * x[i];
  const float inv = float(1.0 / std::sqrt(sum + 1e-6));
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

// One value head of one sequence, prepared: normalised q (scaled) and k, v, beta, log-decay g.
struct HeadInputs {
  int64_t n = 0, dk = 0, dv = 0;
  std::vector<float> q, k, v, beta, g;
};

// Token-by-token recurrence: S = e^g S; S += k (β (v − Sᵀk))ᵀ; o = Sᵀq.  S is [dk, dv].
void recurrent_rule(const HeadInputs& in, float* state, float* out, int64_t out_stride) {
  const int64_t dk = in.dk, dv = in.dv;
  std::vector<float> kv_mem(static_cast<size_t>(dv)), delta(static_cast<size_t>(dv));
  for (int64_t t = 0; t < in.n; ++t) {
    const float* q = &in.q[size_t(t * dk)];
    const float* k = &in.k[size_t(t * dk)];
    const float* v = &in.v[size_t(t * dv)];
    const float decay = std::exp(in.g[size_t(t)]);
    for (int64_t i = 0; i < dk * dv; ++i) state[i] *= decay;
    std::fill(kv_mem.begin(), kv_mem.end(), 0.0f);
    for (int64_t i = 0; i < dk; ++i)
      for (int64_t j = 0; j < dv; ++j) kv_mem[size_t(j)] += state[i * dv + j] * k[i];
    for (int64_t j = 0; j < dv; ++j) delta[size_t(j)] = (v[j] - kv_mem[size_t(j)]) * in.beta[size_t(t)];
    for (int64_t i = 0; i < dk; ++i)
      for (int64_t j = 0; j < dv; ++j) state[i * dv + j] += k[i] * delta[size_t(j)];
    float* o = out + t * out_stride;
    std::fill(o, o + dv, 0.0f);
    for (int64_t i = 0; i < dk; ++i)
      for (int64_t j = 0; j < dv; ++j) o[j] += state[i * dv + j] * q[i];
  }
}

// The chunked (UT-transform) form over chunks of `chunk` tokens aligned to the start of the call:
// within a chunk the delta-rule updates are solved as one unit-lower-triangular system, and the
// state is carried across chunks. Same function as recurrent_rule, different rounding.
void chunked_rule(const HeadInputs& in, float* state, float* out, int64_t out_stride, int chunk) {
  const int64_t dk = in.dk, dv = in.dv;
  std::vector<float> cum, system, new_values, k_cumdecay, intra, v_new;
  std::vector<float> new_state(static_cast<size_t>(dk * dv));
  for (int64_t c0 = 0; c0 < in.n; c0 += chunk) {
    const int64_t c = std::min<int64_t>(chunk, in.n - c0);
    const float* q = &in.q[size_t(c0 * dk)];
    const float* k = &in.k[size_t(c0 * dk)];
    const float* v = &in.v[size_t(c0 * dv)];
    const float* beta = &in.beta[size_t(c0)];
    cum.assign(size_t(c), 0.0f);
    float running = 0;
    for (int64_t i = 0; i < c; ++i) cum[size_t(i)] = running += in.g[size_t(c0 + i)];

    // system[i][j] = β_i (k_i·k_j) e^{cum_i − cum_j} for j < i;  intra[i][j] = (q_i·k_j) e^{cum_i − cum_j}, j ≤ i
    system.assign(size_t(c * c), 0.0f);
    intra.assign(size_t(c * c), 0.0f);
    for (int64_t i = 0; i < c; ++i) {
      for (int64_t j = 0; j <= i; ++j) {
        float kk = 0, qk = 0;
        for (int64_t d = 0; d < dk; ++d) {
          kk += k[i * dk + d] * k[j * dk + d];
          qk += q[i * dk + d] * k[j * dk + d];
        }
        const float decay = std::exp(cum[size_t(i)] - cum[size_t(j)]);
        if (j < i) system[size_t(i * c + j)] = beta[i] * kk * decay;
        intra[size_t(i * c + j)] = qk * decay;
      }
    }
    // forward substitution with (I + strictly-lower(system)):
    //   new_values = solve(β v),  k_cumdecay = solve(β k e^{cum})
    new_values.assign(size_t(c * dv), 0.0f);
    k_cumdecay.assign(size_t(c * dk), 0.0f);
    for (int64_t i = 0; i < c; ++i) {
      float* nv = &new_values[size_t(i * dv)];
      float* kc = &k_cumdecay[size_t(i * dk)];
      const float e = std::exp(cum[size_t(i)]);
      for (int64_t d = 0; d < dv; ++d) nv[d] = v[i * dv + d] * beta[i];
      for (int64_t d = 0; d < dk; ++d) kc[d] = k[i * dk + d] * beta[i] * e;
      for (int64_t j = 0; j < i; ++j) {
        const float a = system[size_t(i * c + j)];
        if (a == 0.0f) continue;
        for (int64_t d = 0; d < dv; ++d) nv[d] -= a * new_values[size_t(j * dv + d)];
        for (int64_t d = 0; d < dk; ++d) kc[d] -= a * k_cumdecay[size_t(j * dk + d)];
      }
    }
    // v_new_i = new_values_i − k_cumdecay_i S
    v_new.assign(size_t(c * dv), 0.0f);
    for (int64_t i = 0; i < c; ++i) {
      float* vn = &v_new[size_t(i * dv)];
      std::memcpy(vn, &new_values[size_t(i * dv)], size_t(dv) * 4);
      const float* kc = &k_cumdecay[size_t(i * dk)];
      for (int64_t a = 0; a < dk; ++a)
        for (int64_t d = 0; d < dv; ++d) vn[d] -= kc[a] * state[a * dv + d];
    }
    // o_i = (q_i e^{cum_i}) S + Σ_{j≤i} intra_ij v_new_j
    for (int64_t i = 0; i < c; ++i) {
      float* o = out + (c0 + i) * out_stride;
      const float e = std::exp(cum[size_t(i)]);
      std::fill(o, o + dv, 0.0f);
      for (int64_t a = 0; a < dk; ++a) {
        const float qa = q[i * dk + a] * e;
        for (int64_t d = 0; d < dv; ++d) o[d] += qa * state[a * dv + d];
      }
      for (int64_t j = 0; j <= i; ++j) {
        const float w = intra[size_t(i * c + j)];
        for (int64_t d = 0; d < dv; ++d) o[d] += w * v_new[size_t(j * dv + d)];
      }
    }
    // S = S e^{cum_last} + Σ_i (k_i e^{cum_last − cum_i}) v_new_iᵀ
    const float last = cum[size_t(c - 1)];
    const float chunk_decay = std::exp(last);
    for (int64_t i = 0; i < dk * dv; ++i) new_state[size_t(i)] = state[i] * chunk_decay;
    for (int64_t i = 0; i < c; ++i) {
      const float e = std::exp(last - cum[size_t(i)]);
      for (int64_t a = 0; a < dk; ++a) {
        const float ka = k[i * dk + a] * e;
        for (int64_t d = 0; d < dv; ++d) new_state[size_t(a * dv + d)] += ka * v_new[size_t(i * dv + d)];
      }
    }
    std::memcpy(state, new_state.data(), size_t(dk * dv) * 4);
  }
}

}  // namespace

void CpuBackend::causal_conv1d(const CausalConvArgs& args) {
  OpTimer timed(this, "causal_conv1d");
  const int64_t channels = args.x.cols();
  const int64_t kernel = args.weight.numel() / channels;
  const float* w = args.weight.data_as<float>();
  for (size_t s = 0; s < args.seqs.size(); ++s) {
    const SeqRows& seq = args.seqs[s];
    float* st = args.states[s].data_as<float>();  // [kernel - 1, channels]
    pool_.parallel_for(
        channels,
        [&](int64_t c_begin, int64_t c_end) {
          std::vector<float> window(static_cast<size_t>(kernel - 1 + seq.n_rows));
          for (int64_t c = c_begin; c < c_end; ++c) {
            for (int64_t i = 0; i < kernel - 1; ++i) window[size_t(i)] = st[i * channels + c];
            for (int64_t t = 0; t < seq.n_rows; ++t)
              window[size_t(kernel - 1 + t)] = row_ptr(args.x, seq.row_begin + t)[c];
            for (int64_t t = 0; t < seq.n_rows; ++t) {
              float acc = 0;
              for (int64_t j = 0; j < kernel; ++j) acc += w[c * kernel + j] * window[size_t(t + j)];
              if (args.silu) acc = cpu::silu(acc);
              row_ptr(args.out, seq.row_begin + t)[c] = acc;
            }
            // keep the last kernel-1 inputs for the next call
            for (int64_t i = 0; i < kernel - 1; ++i) st[i * channels + c] = window[size_t(seq.n_rows + i)];
          }
        },
        16);
  }
  finish(args.out);
}

void CpuBackend::gated_delta(const GatedDeltaArgs& args) {
  OpTimer timed(this, "gated_delta");
  const int64_t hk = args.n_k_heads, hv = args.n_v_heads, dk = args.k_dim, dv = args.v_dim;
  const int64_t group = hv / hk;
  const float* a_log = args.a_log.data_as<float>();
  const float* dt_bias = args.dt_bias.data_as<float>();
  const float q_scale = 1.0f / std::sqrt(float(dk));
  const int64_t n_tasks = int64_t(args.seqs.size()) * hv;
  pool_.parallel_for(n_tasks, [&](int64_t begin, int64_t end) {
    HeadInputs in;
    for (int64_t task = begin; task < end; ++task) {
      const size_t s = size_t(task / hv);
      const int64_t h = task % hv;
      const int64_t kh = h / group;
      const SeqRows& seq = args.seqs[s];
      in.n = seq.n_rows;
      in.dk = dk;
      in.dv = dv;
      in.q.resize(size_t(in.n * dk));
      in.k.resize(size_t(in.n * dk));
      in.v.resize(size_t(in.n * dv));
      in.beta.resize(size_t(in.n));
      in.g.resize(size_t(in.n));
      for (int64_t t = 0; t < in.n; ++t) {
        const float* row = row_ptr(args.qkv, seq.row_begin + t);
        float* q = &in.q[size_t(t * dk)];
        float* k = &in.k[size_t(t * dk)];
        std::memcpy(q, row + kh * dk, size_t(dk) * 4);
        std::memcpy(k, row + hk * dk + kh * dk, size_t(dk) * 4);
        std::memcpy(&in.v[size_t(t * dv)], row + 2 * hk * dk + h * dv, size_t(dv) * 4);
        l2_normalize(q, dk);
        l2_normalize(k, dk);
        for (int64_t d = 0; d < dk; ++d) q[d] *= q_scale;
        const float b = row_ptr(args.b, seq.row_begin + t)[h];
        const float a = row_ptr(args.a, seq.row_begin + t)[h];
        in.beta[size_t(t)] = cpu::sigmoid(b);
        in.g[size_t(t)] = -std::exp(a_log[h]) * softplus(a + dt_bias[h]);
      }
      float* state = args.states[s].data_as<float>() + h * dk * dv;
      float* out = row_ptr(args.out, seq.row_begin) + h * dv;
      if (args.algorithm == DeltaRuleAlgorithm::recurrent)
        recurrent_rule(in, state, out, args.out.row_stride());
      else
        chunked_rule(in, state, out, args.out.row_stride(), args.chunk_size);
    }
  });
  finish(args.out);
  if (args.norm_weight.defined()) {
    const int64_t rows = args.out.rows() * hv;
    Tensor heads = args.out.reshape(Shape{rows, dv}), z = args.norm_z.reshape(Shape{rows, dv});
    rms_norm_gated(heads, z, args.norm_weight, args.norm_eps, heads);
  }
}

}  // namespace kiln
