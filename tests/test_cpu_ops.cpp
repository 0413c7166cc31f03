// Each CPU op against an obviously correct reference written here (double precision, no tricks),
// on random inputs with odd sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace kiln {
namespace {

struct Rng {
  std::mt19937 gen{1234};
  float normal(float std = 1.0f) { return std::normal_distribution<float>(0.0f, std)(gen); }
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen); }
  int integer(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); }
};

Tensor random_tensor(Rng& rng, Shape shape, float std = 1.0f) {
  Tensor t = host_tensor(DType::f32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = rng.normal(std);
  return t;
}

Tensor i32_tensor(const std::vector<int32_t>& v) {
  Tensor t = host_tensor(DType::i32, Shape{int64_t(v.size())});
  std::copy(v.begin(), v.end(), t.data_as<int32_t>());
  return t;
}

double max_rel_diff(const float* a, const std::vector<double>& ref) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - ref[i]));
    scale = std::max(scale, std::fabs(ref[i]));
  }
  return diff / scale;
}

class CpuOps : public testing::Test {
 protected:
  CpuBackend backend{2};
  Rng rng;
};

TEST_F(CpuOps, MatmulMatchesNaive) {
  for (int64_t m : {1, 31, 33})
    for (int64_t n : {32, 33})
      for (int64_t k : {31, 64}) {
        Tensor x = random_tensor(rng, Shape{m, k});
        Tensor w = random_tensor(rng, Shape{n, k});
        Tensor y = backend.alloc(DType::f32, Shape{m, n});
        backend.matmul(x, w, y);
        std::vector<double> ref(static_cast<size_t>(m * n));
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j)
            for (int64_t p = 0; p < k; ++p)
              ref[size_t(i * n + j)] += double(x.data_as<float>()[i * k + p]) * w.data_as<float>()[j * k + p];
        EXPECT_LT(max_rel_diff(y.data_as<float>(), ref), 1e-5) << m << "x" << n << "x" << k;
      }
}

TEST_F(CpuOps, RmsNormOnStridedViews) {
  const int64_t rows = 7, cols = 33;
  Tensor wide = random_tensor(rng, Shape{rows, 2 * cols});
  Tensor weight = random_tensor(rng, Shape{cols});
  Tensor out = backend.alloc(DType::f32, Shape{rows, cols});
  const Tensor right_half = wide.cols_view(cols, cols);
  backend.rms_norm(right_half, weight, 1e-6f, 1.0f, out);
  std::vector<double> ref(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = wide.data_as<float>() + r * 2 * cols + cols;
    double ms = 0;
    for (int64_t c = 0; c < cols; ++c) ms += double(x[c]) * x[c];
    ms = 1.0 / std::sqrt(ms / cols + 1e-6);
    for (int64_t c = 0; c < cols; ++c) ref[size_t(r * cols + c)] = x[c] * ms * (1.0 + weight.data_as<float>()[c]);
  }
  EXPECT_LT(max_rel_diff(out.data_as<float>(), ref), 1e-6);
}

// residual = (residual + norm(block)·(w_b + offset))·scale; next = norm(residual)·(w_n + offset)
TEST_F(CpuOps, ResidualNormMatchesNaive) {
  const int64_t rows = 5, cols = 37;
  const float offset = 0.5f, scale = 0.75f, eps = 1e-6f;
  Tensor h = random_tensor(rng, Shape{rows, cols}), block = random_tensor(rng, Shape{rows, cols}, 3.0f);
  Tensor wb = random_tensor(rng, Shape{cols}), wn = random_tensor(rng, Shape{cols});
  std::vector<double> want_h(size_t(rows * cols)), want_next(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float* b = block.data_as<float>() + r * cols;
    double ms = 0;
    for (int64_t c = 0; c < cols; ++c) ms += double(b[c]) * b[c];
    const double inv_b = 1.0 / std::sqrt(ms / cols + eps);
    double ms_h = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = size_t(r * cols + c);
      want_h[i] = (h.data_as<float>()[i] + b[c] * inv_b * (wb.data_as<float>()[c] + offset)) * scale;
      ms_h += want_h[i] * want_h[i];
    }
    const double inv_h = 1.0 / std::sqrt(ms_h / cols + eps);
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = size_t(r * cols + c);
      want_next[i] = want_h[i] * inv_h * (wn.data_as<float>()[c] + offset);
    }
  }
  Tensor next = backend.alloc(DType::f32, Shape{rows, cols});
  backend.residual_norm(ResidualNormArgs{.residual = h,
                                         .block_out = block,
                                         .block_norm = wb,
                                         .next = next,
                                         .next_norm = wn,
                                         .eps = eps,
                                         .norm_offset = offset,
                                         .scale = scale});
  EXPECT_LT(max_rel_diff(h.data_as<float>(), want_h), 1e-6);
  EXPECT_LT(max_rel_diff(next.data_as<float>(), want_next), 1e-6);
}

// One input against several matrices, and the GLU product, against separate products.
TEST_F(CpuOps, FusedProductsMatchSeparateOnes) {
  const int64_t m = 3, k = 40;
  Tensor x = random_tensor(rng, Shape{m, k});
  Tensor a = random_tensor(rng, Shape{17, k}), b = random_tensor(rng, Shape{9, k});
  Tensor out_a = backend.alloc(DType::f32, Shape{m, 17}), out_b = backend.alloc(DType::f32, Shape{m, 9});
  backend.matmul_many(x, std::vector<MatmulProduct>{{a, out_a}, {b, out_b}});
  Tensor gate = backend.alloc(DType::f32, Shape{m, 9});
  backend.matmul(x, b, gate);
  for (int64_t i = 0; i < gate.numel(); ++i) EXPECT_EQ(out_b.data_as<float>()[i], gate.data_as<float>()[i]);
  Tensor up = backend.alloc(DType::f32, Shape{m, 17});
  backend.matmul(x, a, up);
  Tensor up9 = up.cols_view(0, 9);
  Tensor want = backend.alloc(DType::f32, Shape{m, 9});
  backend.glu(gate, up9, Activation::gelu_tanh, want);
  Tensor got = backend.alloc(DType::f32, Shape{m, 9});
  backend.glu_matmul(x, b, a.rows_view(0, 9), Activation::gelu_tanh, got);
  for (int64_t i = 0; i < want.numel(); ++i) EXPECT_NEAR(got.data_as<float>()[i], want.data_as<float>()[i], 1e-5);
}

TEST_F(CpuOps, RopeRotatesPairsAtTheirOffset) {
  // Gemma's proportional layout: 3 rotated pairs of a 16-wide head pair (i, i + 8)
  const int64_t tokens = 5, heads = 3, hd = 16, pairs = 3, offset = 8;
  Tensor x = random_tensor(rng, Shape{tokens, heads, hd});
  std::vector<float> original(x.data_as<float>(), x.data_as<float>() + x.numel());
  Tensor freqs = host_tensor(DType::f32, Shape{pairs});
  for (int i = 0; i < pairs; ++i) freqs.data_as<float>()[i] = std::pow(100.0f, -float(i) / pairs);
  Tensor pos = i32_tensor({0, 3, 7, 100, 4095});
  backend.rope(RopeArgs{.x = x, .positions = pos, .inv_freq = freqs, .pair_offset = int(offset)});
  std::vector<double> ref(original.begin(), original.end());
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < pairs; ++i) {
        const size_t base = size_t((t * heads + h) * hd);
        const double a = original[base + size_t(i)], b = original[base + size_t(i + offset)];
        const double angle = double(float(pos.data_as<int32_t>()[t]) * freqs.data_as<float>()[i]);
        ref[base + size_t(i)] = a * std::cos(angle) - b * std::sin(angle);
        ref[base + size_t(i + offset)] = b * std::cos(angle) + a * std::sin(angle);
      }
  EXPECT_LT(max_rel_diff(x.data_as<float>(), ref), 1e-6);
}

// Causal (optionally windowed) attention of one sequence computed directly from all its keys.
std::vector<double> naive_attention(const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& v, int64_t n, int64_t hq, int64_t hkv, int64_t hd,
                                    float scale, int64_t window) {
  std::vector<double> out(static_cast<size_t>(n * hq * hd));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = h / (hq / hkv);
      std::vector<double> s(size_t(n), -INFINITY);
      double mx = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {
        if (window > 0 && i - j >= window) continue;
        double dot = 0;
        for (int64_t d = 0; d < hd; ++d)
          dot += double(q[size_t((i * hq + h) * hd + d)]) * k[size_t((j * hkv + g) * hd + d)];
        s[size_t(j)] = dot * scale;
        mx = std::max(mx, s[size_t(j)]);
      }
      double denom = 0;
      for (int64_t j = 0; j <= i; ++j)
        if (s[size_t(j)] > -INFINITY) denom += std::exp(s[size_t(j)] - mx);
      for (int64_t j = 0; j <= i; ++j) {
        if (s[size_t(j)] == -INFINITY) continue;
        const double p = std::exp(s[size_t(j)] - mx) / denom;
        for (int64_t d = 0; d < hd; ++d) out[size_t((i * hq + h) * hd + d)] += p * v[size_t((j * hkv + g) * hd + d)];
      }
    }
  return out;
}

// Two sequences, fed in chunks through ring caches no larger than window - 1 + chunk, against
// direct attention over all keys.
TEST_F(CpuOps, AttentionOverRingCachesMatchesDirect) {
  const int64_t hq = 4, hkv = 2, hd = 33, chunk = 5;
  for (int64_t window : {int64_t(0), int64_t(7)}) {
    const std::vector<int64_t> lengths = {23, 17};
    std::vector<std::vector<float>> q(2), k(2), v(2);
    std::vector<KvCacheView> caches;
    for (int s = 0; s < 2; ++s) {
      for (auto* vec : {&q[size_t(s)]}) vec->resize(size_t(lengths[size_t(s)] * hq * hd));
      k[size_t(s)].resize(size_t(lengths[size_t(s)] * hkv * hd));
      v[size_t(s)].resize(size_t(lengths[size_t(s)] * hkv * hd));
      for (auto* vec : {&q[size_t(s)], &k[size_t(s)], &v[size_t(s)]})
        for (auto& e : *vec) e = rng.normal();
      KvCacheView c;
      c.capacity = window ? window - 1 + chunk : lengths[size_t(s)];
      c.k = backend.alloc(DType::f32, Shape{c.capacity, hkv, hd});
      c.v = backend.alloc(DType::f32, Shape{c.capacity, hkv, hd});
      c.slot_pos = backend.alloc(DType::i32, Shape{c.capacity});
      backend.fill(c.slot_pos, -1.0f);
      caches.push_back(c);
    }
    std::vector<std::vector<float>> got(2);
    for (int64_t begin = 0; begin < 23; begin += chunk) {
      // both sequences advance in one batch while they have tokens left
      std::vector<SeqRows> seqs;
      std::vector<KvCacheView> batch_caches;
      std::vector<int> members;
      int64_t rows = 0;
      for (int s = 0; s < 2; ++s) {
        const int64_t n = std::min(chunk, lengths[size_t(s)] - begin);
        if (n <= 0) continue;
        seqs.push_back(SeqRows{.row_begin = rows, .n_rows = n, .pos_begin = begin});
        batch_caches.push_back(caches[size_t(s)]);
        members.push_back(s);
        rows += n;
      }
      Tensor qt = host_tensor(DType::f32, Shape{rows, hq, hd});
      Tensor kt = host_tensor(DType::f32, Shape{rows, hkv, hd});
      Tensor vt = host_tensor(DType::f32, Shape{rows, hkv, hd});
      for (size_t i = 0; i < seqs.size(); ++i) {
        const int s = members[i];
        std::copy_n(&q[size_t(s)][size_t(begin * hq * hd)], seqs[i].n_rows * hq * hd,
                    qt.data_as<float>() + seqs[i].row_begin * hq * hd);
        std::copy_n(&k[size_t(s)][size_t(begin * hkv * hd)], seqs[i].n_rows * hkv * hd,
                    kt.data_as<float>() + seqs[i].row_begin * hkv * hd);
        std::copy_n(&v[size_t(s)][size_t(begin * hkv * hd)], seqs[i].n_rows * hkv * hd,
                    vt.data_as<float>() + seqs[i].row_begin * hkv * hd);
      }
      Tensor positions = host_tensor(DType::i32, Shape{rows});
      for (const auto& sr : seqs)
        for (int64_t i = 0; i < sr.n_rows; ++i)
          positions.data_as<int32_t>()[sr.row_begin + i] = int32_t(sr.pos_begin + i);
      backend.kv_write(KvWriteArgs{.k = kt, .v = vt, .positions = positions, .seqs = seqs, .caches = batch_caches});
      Tensor out = backend.alloc(DType::f32, Shape{rows, hq, hd});
      backend.attention(AttentionArgs{.q = qt,
                                      .out = out,
                                      .positions = positions,
                                      .seqs = seqs,
                                      .caches = batch_caches,
                                      .n_heads = int(hq),
                                      .n_kv_heads = int(hkv),
                                      .head_dim = int(hd),
                                      .scale = 0.3f,
                                      .window = window});
      for (size_t i = 0; i < seqs.size(); ++i) {
        const float* o = out.data_as<float>() + seqs[i].row_begin * hq * hd;
        got[size_t(members[i])].insert(got[size_t(members[i])].end(), o, o + seqs[i].n_rows * hq * hd);
      }
    }
    for (int s = 0; s < 2; ++s) {
      auto ref =
          naive_attention(q[size_t(s)], k[size_t(s)], v[size_t(s)], lengths[size_t(s)], hq, hkv, hd, 0.3f, window);
      EXPECT_LT(max_rel_diff(got[size_t(s)].data(), ref), 1e-5) << "window " << window << " sequence " << s;
    }
  }
}

TEST_F(CpuOps, CausalConvCarriesStateAcrossCalls) {
  const int64_t channels = 33, kernel = 4, n = 19;
  Tensor x = random_tensor(rng, Shape{n, channels});
  Tensor w = random_tensor(rng, Shape{channels, kernel});
  std::vector<double> ref(static_cast<size_t>(n * channels));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < channels; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < kernel; ++j) {
        const int64_t src = t - (kernel - 1) + j;
        if (src >= 0) acc += double(w.data_as<float>()[c * kernel + j]) * x.data_as<float>()[src * channels + c];
      }
      ref[size_t(t * channels + c)] = acc / (1.0 + std::exp(-acc));
    }
  Tensor state = backend.alloc(DType::f32, Shape{kernel - 1, channels});
  backend.fill(state, 0.0f);
  Tensor out = backend.alloc(DType::f32, Shape{n, channels});
  for (int64_t begin = 0; begin < n;) {  // uneven pieces, including single tokens
    const int64_t len = std::min<int64_t>(n - begin, begin % 2 ? 1 : 5);
    Tensor xs = x.rows_view(begin, len);
    Tensor os = out.rows_view(begin, len);
    backend.causal_conv1d(CausalConvArgs{
        .x = xs, .weight = w, .out = os, .seqs = {SeqRows{0, len, begin}}, .states = {state}, .silu = true});
    begin += len;
  }
  EXPECT_LT(max_rel_diff(out.data_as<float>(), ref), 1e-5);
}

// The gated delta rule in double precision, token by token.
struct DeltaReference {
  std::vector<double> out, state;
};

DeltaReference naive_delta_rule(const Tensor& qkv, const Tensor& a, const Tensor& b, const std::vector<float>& a_log,
                                const std::vector<float>& dt_bias, int64_t n, int hk, int hv, int dk, int dv) {
  DeltaReference r;
  r.out.assign(size_t(n * hv * dv), 0.0);
  r.state.assign(size_t(hv * dk * dv), 0.0);
  for (int h = 0; h < hv; ++h) {
    const int kh = h / (hv / hk);
    double* S = &r.state[size_t(h * dk * dv)];
    for (int64_t t = 0; t < n; ++t) {
      const float* row = qkv.data_as<float>() + t * qkv.cols();
      std::vector<double> q(static_cast<size_t>(dk)), k(static_cast<size_t>(dk)), v(static_cast<size_t>(dv));
      double qn = 0, kn = 0;
      for (int d = 0; d < dk; ++d) {
        q[size_t(d)] = row[kh * dk + d];
        k[size_t(d)] = row[hk * dk + kh * dk + d];
        qn += q[size_t(d)] * q[size_t(d)];
        kn += k[size_t(d)] * k[size_t(d)];
      }
      for (int d = 0; d < dk; ++d) {
        q[size_t(d)] = q[size_t(d)] / std::sqrt(qn + 1e-6) / std::sqrt(double(dk));
        k[size_t(d)] /= std::sqrt(kn + 1e-6);
      }
      for (int d = 0; d < dv; ++d) v[size_t(d)] = row[2 * hk * dk + h * dv + d];
      const double beta = 1.0 / (1.0 + std::exp(-double(b.data_as<float>()[t * hv + h])));
      const double x = double(a.data_as<float>()[t * hv + h]) + dt_bias[size_t(h)];
      const double g = -std::exp(double(a_log[size_t(h)])) * std::log1p(std::exp(x));
      for (int i = 0; i < dk * dv; ++i) S[i] *= std::exp(g);
      for (int j = 0; j < dv; ++j) {
        double mem = 0;
        for (int i = 0; i < dk; ++i) mem += S[i * dv + j] * k[size_t(i)];
        const double delta = beta * (v[size_t(j)] - mem);
        for (int i = 0; i < dk; ++i) S[i * dv + j] += k[size_t(i)] * delta;
      }
      for (int j = 0; j < dv; ++j) {
        double o = 0;
        for (int i = 0; i < dk; ++i) o += S[i * dv + j] * q[size_t(i)];
        r.out[size_t((t * hv + h) * dv + j)] = o;
      }
    }
  }
  return r;
}

struct DeltaRun {
  std::vector<float> out, state;
};

// Feeds n tokens in calls of `call` tokens with the given algorithm.
DeltaRun run_delta(CpuBackend& backend, const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& a_log,
                   const Tensor& dt_bias, int64_t n, int hk, int hv, int dk, int dv, DeltaRuleAlgorithm algo,
                   int64_t call) {
  Tensor state = backend.alloc(DType::f32, Shape{hv, dk, dv});
  backend.fill(state, 0.0f);
  Tensor out = backend.alloc(DType::f32, Shape{n, int64_t(hv) * dv});
  for (int64_t begin = 0; begin < n; begin += call) {
    const int64_t len = std::min(call, n - begin);
    Tensor o = out.rows_view(begin, len);
    backend.gated_delta(GatedDeltaArgs{.qkv = qkv.rows_view(begin, len),
                                       .a = a.rows_view(begin, len),
                                       .b = b.rows_view(begin, len),
                                       .a_log = a_log,
                                       .dt_bias = dt_bias,
                                       .out = o,
                                       .seqs = {SeqRows{0, len, begin}},
                                       .states = {state},
                                       .n_k_heads = hk,
                                       .n_v_heads = hv,
                                       .k_dim = dk,
                                       .v_dim = dv,
                                       .algorithm = algo});
  }
  DeltaRun r;
  r.out.assign(out.data_as<float>(), out.data_as<float>() + out.numel());
  r.state.assign(state.data_as<float>(), state.data_as<float>() + state.numel());
  return r;
}

TEST_F(CpuOps, GatedDeltaChunkedAndRecurrentAgree) {
  const int hk = 2, hv = 4, dk = 16, dv = 24;
  const int64_t n = 150;  // spans three chunks of 64
  Tensor qkv = random_tensor(rng, Shape{n, 2 * hk * dk + hv * dv});
  Tensor a = random_tensor(rng, Shape{n, hv});
  Tensor b = random_tensor(rng, Shape{n, hv});
  Tensor a_log = host_tensor(DType::f32, Shape{hv});
  Tensor dt_bias = host_tensor(DType::f32, Shape{hv});
  std::vector<float> a_log_v, dt_v;
  for (int h = 0; h < hv; ++h) {
    a_log_v.push_back(a_log.data_as<float>()[h] = rng.uniform(-3.0f, 1.0f));  // slow and fast decays
    dt_v.push_back(dt_bias.data_as<float>()[h] = rng.normal(0.5f));
  }
  const auto ref = naive_delta_rule(qkv, a, b, a_log_v, dt_v, n, hk, hv, dk, dv);
  const auto recurrent =
      run_delta(backend, qkv, a, b, a_log, dt_bias, n, hk, hv, dk, dv, DeltaRuleAlgorithm::recurrent, 1);
  const auto chunked = run_delta(backend, qkv, a, b, a_log, dt_bias, n, hk, hv, dk, dv, DeltaRuleAlgorithm::chunked, n);
  const auto chunked_split = run_delta(backend, qkv, a, b, a_log, dt_bias, n, hk, hv, dk, dv,
                                       DeltaRuleAlgorithm::chunked, 37);  // state carried across calls

  EXPECT_LT(max_rel_diff(recurrent.out.data(), ref.out), 1e-5);
  EXPECT_LT(max_rel_diff(recurrent.state.data(), ref.state), 1e-5);
  EXPECT_LT(max_rel_diff(chunked.out.data(), ref.out), 1e-5);
  EXPECT_LT(max_rel_diff(chunked_split.out.data(), ref.out), 1e-5);
  // the acceptance criterion: the same state after the same tokens, relative error <= 1e-5
  std::vector<double> recurrent_state(recurrent.state.begin(), recurrent.state.end());
  EXPECT_LT(max_rel_diff(chunked.state.data(), recurrent_state), 1e-5);
  EXPECT_LT(max_rel_diff(chunked_split.state.data(), recurrent_state), 1e-5);
}

TEST_F(CpuOps, MoeRoutingAndExpertsMatchNaive) {
  const int64_t tokens = 9, hidden = 33, inter = 17, experts = 6;
  const int top_k = 2;
  Tensor logits = random_tensor(rng, Shape{tokens, experts});
  Tensor scale = random_tensor(rng, Shape{experts});
  Tensor ids = backend.alloc(DType::i32, Shape{tokens, top_k});
  Tensor weights = backend.alloc(DType::f32, Shape{tokens, top_k});
  backend.moe_route(MoeRouteArgs{
      .logits = logits, .expert_scale = scale, .ids = ids, .weights = weights, .top_k = top_k, .renormalize = true});
  Tensor x = random_tensor(rng, Shape{tokens, hidden});
  Tensor gate = random_tensor(rng, Shape{experts, inter, hidden}, 0.2f);
  Tensor up = random_tensor(rng, Shape{experts, inter, hidden}, 0.2f);
  Tensor down = random_tensor(rng, Shape{experts, hidden, inter}, 0.2f);
  Tensor out = backend.alloc(DType::f32, Shape{tokens, hidden});
  backend.moe_experts(MoeExpertsArgs{.x = x,
                                     .ids = ids,
                                     .weights = weights,
                                     .gate = gate,
                                     .up = up,
                                     .down = down,
                                     .out = out,
                                     .act = Activation::gelu_tanh});

  std::vector<double> ref(static_cast<size_t>(tokens * hidden));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits.data_as<float>() + t * experts;
    std::vector<double> p(static_cast<size_t>(experts));
    double sum = 0;
    for (int64_t e = 0; e < experts; ++e) sum += p[size_t(e)] = std::exp(double(l[e]));
    std::vector<int> order(static_cast<size_t>(experts));
    for (int e = 0; e < experts; ++e) order[size_t(e)] = e;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return p[size_t(a)] > p[size_t(b)]; });
    const double kept = p[size_t(order[0])] + p[size_t(order[1])];
    for (int i = 0; i < top_k; ++i) {
      const int e = order[size_t(i)];
      ASSERT_EQ(ids.data_as<int32_t>()[t * top_k + i], e);
      const double w = p[size_t(e)] / kept * scale.data_as<float>()[e];
      EXPECT_NEAR(weights.data_as<float>()[t * top_k + i], w, 1e-6 * std::max(1.0, std::fabs(w)));
      std::vector<double> act(static_cast<size_t>(inter));
      for (int64_t j = 0; j < inter; ++j) {
        double g = 0, u = 0;
        for (int64_t c = 0; c < hidden; ++c) {
          g += double(gate.data_as<float>()[(e * inter + j) * hidden + c]) * x.data_as<float>()[t * hidden + c];
          u += double(up.data_as<float>()[(e * inter + j) * hidden + c]) * x.data_as<float>()[t * hidden + c];
        }
        act[size_t(j)] = 0.5 * g * (1 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u;
      }
      for (int64_t c = 0; c < hidden; ++c) {
        double d = 0;
        for (int64_t j = 0; j < inter; ++j)
          d += double(down.data_as<float>()[(e * hidden + c) * inter + j]) * act[size_t(j)];
        ref[size_t(t * hidden + c)] += w * d;
      }
    }
  }
  EXPECT_LT(max_rel_diff(out.data_as<float>(), ref), 1e-5);
}

}  // namespace
}  // namespace kiln
