// The CUDA backend's routed experts against the CPU f32 reference at decode and prefill sizes, with
// tolerances that know which kernel rounds what (tighter than the op table's, test_gpu_ops.cpp, for
// the kernels that keep f32), and their batch invariance. Skipped, visibly, where no GPU is present.
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "gpu_test_util.h"
#include "test_util.h"

namespace kiln::test {
namespace {

class GpuMoe : public GpuTest {
 protected:
  GpuMoe() : GpuTest(7) {}
};

// The routed experts at Gemma 4 26B-A4B's expert geometry (hidden 2816, inter 704, top-8; 16
// experts rather than 128 keep the CPU reference quick and change no kernel path): decode-like
// calls of 1, 4 and 16 tokens take the streaming kernels, 40 tokens (320 pairs) the generic ones,
// and a shape that is not a multiple of 8 the generic ones at any size. Both backends get the same
// routing; an f32 output differs from the reference only by accumulation order, a bf16 one by its
// own rounding (at most 2^-9 of the largest value).
TEST_F(GpuMoe, MoeExpertsDecodeAndPrefill) {
  struct Case {
    int64_t hidden, inter, experts;
    int top_k;
    std::vector<int64_t> tokens;
  };
  // 26B-A4B's sizes; sizes of whole 32-wide steps whose tiles do not fill a block (1056 = 33 · 32)
  // with more slots than down warps; sizes the tensor-core kernels do not take; many experts, some
  // routed no pair. Up to 32 tokens run on the tensor cores per pair, more grouped by expert where
  // the sizes are multiples of 64 (several row tiles an expert at 130 tokens), else on the
  // streaming (≤ 128 pairs) or generic kernels.
  const Case cases[] = {{2816, 704, 16, 8, {1, 3, 4, 16, 32, 40, 130}},
                        {1056, 96, 12, 10, {1, 3, 13, 40}},
                        {100, 36, 6, 3, {1, 5}},
                        {256, 128, 64, 2, {100}}};
  for (const Case& c : cases) {
    Tensor gate = random(Shape{c.experts, c.inter, c.hidden}, 0.05f);
    Tensor up = random(Shape{c.experts, c.inter, c.hidden}, 0.05f);
    Tensor down = random(Shape{c.experts, c.hidden, c.inter}, 0.05f);
    Tensor gate_g = to_gpu(gate), up_g = to_gpu(up), down_g = to_gpu(down);
    for (int64_t tokens : c.tokens) {
      Tensor logits = random(Shape{tokens, c.experts}, 2.0f), x = random(Shape{tokens, c.hidden});
      Tensor ids = cpu.alloc(DType::i32, Shape{tokens, c.top_k}), w = cpu.alloc(DType::f32, Shape{tokens, c.top_k});
      cpu.moe_route({.logits = logits, .ids = ids, .weights = w, .top_k = c.top_k});
      Tensor ids_g = to_gpu(ids), w_g = to_gpu(w, DType::f32), x_g = to_gpu(x);
      for (Activation act : {Activation::gelu_tanh, Activation::silu}) {
        Tensor want = cpu.alloc(DType::f32, Shape{tokens, c.hidden});
        cpu.moe_experts(
            {.x = x, .ids = ids, .weights = w, .gate = gate, .up = up, .down = down, .out = want, .act = act});
        for (DType out_type : {DType::f32, DType::bf16}) {
          Tensor got = gpu->alloc(out_type, Shape{tokens, c.hidden});
          gpu->moe_experts({.x = x_g,
                            .ids = ids_g,
                            .weights = w_g,
                            .gate = gate_g,
                            .up = up_g,
                            .down = down_g,
                            .out = got,
                            .act = act});
          // The tensor-core kernels round the GLU output to bf16 before the down product, as a dense
          // MLP does: each term gains a relative error of at most 2^-8 (rms about 0.4 · 2^-8), and
          // the errors add with random signs as the terms do, so the largest difference is about
          // 0.4 · 2^-8 of the largest output (0.3–0.7 · 2^-8 in a CPU simulation of these cases).
          // The f32 bound allows 2^-8. A bf16 output adds its own rounding, up to 2^-8 of a value:
          // 2^-8 + 0.7 · 2^-8 on that path (the simulation reached 4.4e-3).
          const bool mma = (tokens <= 32 && c.hidden % 32 == 0 && c.inter % 32 == 0) ||
                           (tokens > 32 && c.hidden % 64 == 0 && c.inter % 64 == 0);  // grouped
          const double tol = out_type == DType::bf16 ? (mma ? 7e-3 : 5e-3) : mma ? 4e-3 : 1e-4;
          EXPECT_LT(rel(from_gpu(got), want), tol)
              << "hidden " << c.hidden << ", " << tokens << " tokens, "
              << (act == Activation::silu ? "silu" : "gelu_tanh") << (out_type == DType::f32 ? ", f32" : ", bf16");
        }
      }
    }
  }
}

// A token's routed-expert output gets the same bits alone as among up to 31 other tokens (a
// batch-invariant serving step's decode rows), at 26B-A4B's sizes with top-8.
TEST_F(GpuMoe, MoeExpertRowsAreBatchInvariant) {
  const int64_t hidden = 2816, inter = 704, experts = 16;
  const int top_k = 8;
  Tensor gate_g = to_gpu(random(Shape{experts, inter, hidden}, 0.05f));
  Tensor up_g = to_gpu(random(Shape{experts, inter, hidden}, 0.05f));
  Tensor down_g = to_gpu(random(Shape{experts, hidden, inter}, 0.05f));
  for (int64_t tokens : {17, 32}) {
    Tensor logits = random(Shape{tokens, experts}, 2.0f), x = random(Shape{tokens, hidden});
    Tensor ids = cpu.alloc(DType::i32, Shape{tokens, top_k}), w = cpu.alloc(DType::f32, Shape{tokens, top_k});
    cpu.moe_route({.logits = logits, .ids = ids, .weights = w, .top_k = top_k});
    Tensor ids_g = to_gpu(ids), w_g = to_gpu(w, DType::f32), x_g = to_gpu(x);
    MoeExpertsArgs args{.x = x_g,
                        .ids = ids_g,
                        .weights = w_g,
                        .gate = gate_g,
                        .up = up_g,
                        .down = down_g,
                        .act = Activation::gelu_tanh};
    args.out = gpu->alloc(DType::bf16, Shape{tokens, hidden});
    gpu->moe_experts(args);
    const Tensor all = from_gpu(args.out);
    for (int64_t t = 0; t < tokens; ++t) {
      MoeExpertsArgs one = args;
      one.x = x_g.rows_view(t, 1), one.ids = ids_g.rows_view(t, 1), one.weights = w_g.rows_view(t, 1);
      one.out = gpu->alloc(DType::bf16, Shape{1, hidden});
      gpu->moe_experts(one);
      const Tensor alone = from_gpu(one.out);
      for (int64_t c = 0; c < hidden; ++c)
        ASSERT_EQ(alone.data_as<float>()[c], all.data_as<float>()[t * hidden + c]) << tokens << " token " << t;
    }
  }
}

}  // namespace
}  // namespace kiln::test
