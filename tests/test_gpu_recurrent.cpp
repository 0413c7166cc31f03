// The causal conv1d and the gated delta rule of Gated DeltaNet on the CUDA backend against the CPU
// f32 reference, on random inputs: the two chained as a layer runs them, and the rule's outputs
// held closer than the op table (test_gpu_ops.cpp) holds them (within 5e-5 to 1e-4 of the largest
// beyond their own bf16 rounding). Skipped, visibly, where no GPU is present.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "gpu_test_util.h"
#include "test_util.h"

namespace kiln::test {
namespace {

class GpuRecurrent : public GpuTest {
 protected:
  GpuRecurrent() : GpuTest(7) {}
  struct DeltaCase {
    int hk, hv, dk, dv;
    std::vector<int64_t> rows;  // tokens per sequence in each call
    int calls;
    DeltaRuleAlgorithm algorithm = DeltaRuleAlgorithm::recurrent;
    bool zero_state = false;   // else a random one
    bool output_norm = false;  // with the DeltaNet's gated output norm
  };
  void delta_case(const DeltaCase& c);
};

TEST_F(GpuRecurrent, CausalConvAndGatedDelta) {
  const int hk = 2, hv = 4, dk = 32, dv = 64;
  const int64_t conv_dim = 2 * hk * dk + hv * dv, n = 150;
  Tensor x = random(Shape{n, conv_dim}, 0.5f), w = random(Shape{conv_dim, 4}, 0.5f);
  Tensor a = random(Shape{n, hv}), b = random(Shape{n, hv});
  Tensor a_log = host_tensor(DType::f32, Shape{hv}), dt = host_tensor(DType::f32, Shape{hv});
  for (int h = 0; h < hv; ++h) a_log.data_as<float>()[h] = -2.0f + h, dt.data_as<float>()[h] = 0.3f * h;
  for (auto algo : {DeltaRuleAlgorithm::chunked, DeltaRuleAlgorithm::recurrent}) {
    Tensor cs = cpu.alloc(DType::f32, Shape{3, conv_dim}), gs = gpu->alloc(DType::bf16, Shape{3, conv_dim});
    Tensor cr = cpu.alloc(DType::f32, Shape{hv, dk, dv}), gr = gpu->alloc(DType::f32, Shape{hv, dk, dv});
    cpu.fill(cs, 0.0f);
    gpu->fill(gs, 0.0f);
    cpu.fill(cr, 0.0f);
    gpu->fill(gr, 0.0f);
    Tensor xg = to_gpu(x), wg = to_gpu(w, DType::f32), ag = to_gpu(a), bg = to_gpu(b);
    Tensor alg = to_gpu(a_log, DType::f32), dtg = to_gpu(dt, DType::f32);
    double worst_out = 0;
    const int64_t call = algo == DeltaRuleAlgorithm::chunked ? 70 : 1;
    for (int64_t begin = 0; begin < n; begin += call) {
      const int64_t len = std::min(call, n - begin);
      std::vector<SeqRows> seqs = {SeqRows{0, len, begin}};
      Tensor cx = cpu.alloc(DType::f32, Shape{len, conv_dim}), gx = gpu->alloc(DType::bf16, Shape{len, conv_dim});
      cpu.causal_conv1d({.x = x.rows_view(begin, len), .weight = w, .out = cx, .seqs = seqs, .states = {cs}});
      gpu->causal_conv1d({.x = xg.rows_view(begin, len), .weight = wg, .out = gx, .seqs = seqs, .states = {gs}});
      Tensor co = cpu.alloc(DType::f32, Shape{len, hv * dv}), go = gpu->alloc(DType::bf16, Shape{len, hv * dv});
      // both sides run the rule on the same (bf16-rounded) conv output
      Tensor cx_rounded = from_gpu(gx);
      cpu.gated_delta({.qkv = cx_rounded,
                       .a = a.rows_view(begin, len),
                       .b = b.rows_view(begin, len),
                       .a_log = a_log,
                       .dt_bias = dt,
                       .out = co,
                       .seqs = seqs,
                       .states = {cr},
                       .n_k_heads = hk,
                       .n_v_heads = hv,
                       .k_dim = dk,
                       .v_dim = dv,
                       .algorithm = algo});
      gpu->gated_delta({.qkv = gx,
                        .a = ag.rows_view(begin, len),
                        .b = bg.rows_view(begin, len),
                        .a_log = alg,
                        .dt_bias = dtg,
                        .out = go,
                        .seqs = seqs,
                        .states = {gr},
                        .n_k_heads = hk,
                        .n_v_heads = hv,
                        .k_dim = dk,
                        .v_dim = dv,
                        .algorithm = algo});
      EXPECT_LT(rel(from_gpu(gx), cx), 2e-2);
      worst_out = std::max(worst_out, rel(from_gpu(go), co));
    }
    EXPECT_LT(worst_out, 2e-2) << (algo == DeltaRuleAlgorithm::chunked ? "chunked" : "recurrent");
    EXPECT_LT(rel(from_gpu(gr), cr), 1e-3)
        << "state, " << (algo == DeltaRuleAlgorithm::chunked ? "chunked" : "recurrent");
  }
}

// The recurrent (decode) form against the CPU reference, from the same random state on the same
// bf16-exact inputs, `calls` calls in a row: the state differs only by f32 rounding, the output by
// that and its own rounding to bf16.
TEST_F(GpuRecurrent, GatedDeltaRecurrent) {
  const DeltaCase cases[] = {
      {16, 32, 128, 128, {1}, 6},                     // Qwen 3.5 4B, one sequence
      {16, 32, 128, 128, {1, 1, 1, 1, 1}, 3},         // 4B, several sequences
      {16, 32, 128, 128, {3, 1, 5}, 2},               // several tokens per sequence
      {2, 4, 32, 36, {1, 2}, 3},                      // a half-empty column slice, rows past k_dim
      {1, 3, 200, 12, {2}, 2},                        // k_dim over 128
      {2, 4, 48, 30, {1, 3}, 2},                      // v_dim no multiple of 4: the block-per-head kernel
      {1, 2, 16, 8, std::vector<int64_t>(70, 1), 2},  // more sequences than one launch takes
      // with the output norm: in the decode kernel (its counters reused call after call), in the
      // block-per-head kernel's case a launch of its own
      {16, 32, 128, 128, {1, 1, 1}, 3, DeltaRuleAlgorithm::recurrent, false, true},
      {16, 48, 128, 128, {2, 1}, 2, DeltaRuleAlgorithm::recurrent, false, true},
      {1, 2, 16, 8, std::vector<int64_t>(70, 1), 2, DeltaRuleAlgorithm::recurrent, false, true},
      {2, 4, 48, 30, {1, 3}, 2, DeltaRuleAlgorithm::recurrent, false, true},
  };
  for (const DeltaCase& c : cases) delta_case(c);
}

// The chunked (prefill) form against the CPU's chunked form, chunks of 64 from the start of each
// call. On an H200 the cases below take each of the kernel's column slice widths: 16 (one 4B
// sequence), 32 (several sequences; 27B) and 8 (few heads).
TEST_F(GpuRecurrent, GatedDeltaChunked) {
  constexpr auto chunked = DeltaRuleAlgorithm::chunked;
  const DeltaCase cases[] = {
      {16, 32, 128, 128, {200}, 2, chunked, true},           // Qwen 3.5 4B: a prompt from a zero state, then continued
      {16, 32, 128, 128, {200}, 1, chunked},                 // from a random state
      {16, 32, 128, 128, {70, 64, 130}, 2, chunked},         // sequences of several lengths in one call
      {16, 48, 128, 128, {200}, 1, chunked},                 // Qwen 3.5 27B: three value heads per key head
      {1, 3, 200, 36, {100, 1}, 2, chunked},                 // k_dim padded to 16, a part-filled slice, one token
      {2, 4, 36, 20, {100, 3}, 2, chunked},                  // q and k rows not in 16-byte pieces: copied by element
      {16, 32, 128, 128, {70, 1}, 1, chunked, false, true},  // with the output norm
  };
  for (const DeltaCase& c : cases) delta_case(c);
}

void GpuRecurrent::delta_case(const DeltaCase& c) {
  const bool recurrent = c.algorithm == DeltaRuleAlgorithm::recurrent;
  const std::string name = std::string(recurrent ? "recurrent, " : "chunked, ") + std::to_string(c.hk) + "/" +
                           std::to_string(c.hv) + " heads, " + std::to_string(c.dk) + "x" + std::to_string(c.dv) +
                           ", " + std::to_string(c.rows.size()) + " sequences";
  std::vector<SeqRows> seqs;
  int64_t tokens = 0;
  for (int64_t r : c.rows) {
    seqs.push_back(SeqRows{.row_begin = tokens, .n_rows = r});
    tokens += r;
  }
  // decays e^g from about 0.97 down to about 0.2 across the heads
  Tensor a_log = host_tensor(DType::f32, Shape{c.hv}), dt = host_tensor(DType::f32, Shape{c.hv});
  for (int h = 0; h < c.hv; ++h) {
    a_log.data_as<float>()[h] = -3.0f + 2.5f * float(h) / float(std::max(c.hv - 1, 1));
    dt.data_as<float>()[h] = 0.5f - 0.05f * float(h % 8);
  }
  Tensor a_log_g = to_gpu(a_log, DType::f32), dt_g = to_gpu(dt, DType::f32);
  std::vector<Tensor> cpu_states, gpu_states;
  for (size_t i = 0; i < seqs.size(); ++i) {
    cpu_states.push_back(random(Shape{c.hv, c.dk, c.dv}, 0.5f));
    if (c.zero_state) cpu.fill(cpu_states.back(), 0.0f);
    gpu_states.push_back(to_gpu(cpu_states.back(), DType::f32));
  }
  const int64_t width = 2 * int64_t(c.hk) * c.dk + int64_t(c.hv) * c.dv;
  for (int call = 0; call < c.calls; ++call) {
    Tensor qkv = random(Shape{tokens, width}), a = random(Shape{tokens, c.hv}), b = random(Shape{tokens, c.hv});
    Tensor want = cpu.alloc(DType::f32, Shape{tokens, int64_t(c.hv) * c.dv});
    Tensor got = gpu->alloc(DType::bf16, Shape{tokens, int64_t(c.hv) * c.dv});
    GatedDeltaArgs args{.qkv = qkv,
                        .a = a,
                        .b = b,
                        .a_log = a_log,
                        .dt_bias = dt,
                        .out = want,
                        .seqs = seqs,
                        .states = cpu_states,
                        .n_k_heads = c.hk,
                        .n_v_heads = c.hv,
                        .k_dim = c.dk,
                        .v_dim = c.dv,
                        .algorithm = c.algorithm};
    Tensor z = random(Shape{tokens, int64_t(c.hv) * c.dv}), norm = random(Shape{c.dv});
    if (c.output_norm) args.norm_z = z, args.norm_weight = norm, args.norm_eps = 1e-6f;
    cpu.gated_delta(args);
    args.qkv = to_gpu(qkv), args.a = to_gpu(a), args.b = to_gpu(b);
    args.a_log = a_log_g, args.dt_bias = dt_g, args.out = got, args.states = gpu_states;
    if (c.output_norm) args.norm_z = to_gpu(z), args.norm_weight = to_gpu(norm, DType::f32);
    gpu->gated_delta(args);
    if (c.output_norm)  // the GPU normalises the bf16-rounded rule outputs: 2^-9 relative, and its own rounding
      EXPECT_LT(rel(from_gpu(got), want), 1e-2) << name << ", normalised, call " << call;
    else
      EXPECT_LT(bf16_excess(from_gpu(got), want), recurrent ? 5e-5 : 1e-4) << name << ", call " << call;
  }
  // recurrent: only the order of f32 sums differs, about 1e-7 after six calls at 128x128 when
  // simulated. Chunked: the GPU also solves for β (V − e^γ K S) where the CPU solves for βV and
  // β K e^γ apart, applies the l2 norms as scales after the products, and sums K Kᵀ and Q Kᵀ on
  // the tensor cores; each is f32 rounding (~1e-7) grown by 128-term sums, the 64-row solve and a
  // few chunks, so 1e-4 leaves a wide margin while a wrong row, column, head or decay is O(1e-2..1).
  for (size_t i = 0; i < seqs.size(); ++i)
    EXPECT_LT(rel(from_gpu(gpu_states[i]), cpu_states[i]), recurrent ? 1e-5 : 1e-4) << name << ", state " << i;
}

}  // namespace
}  // namespace kiln::test
