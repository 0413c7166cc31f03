// The CUDA backend beyond what the op table (test_gpu_ops.cpp) checks of each op's values: argmax
// and top-k on ties, NaNs and vocabulary-wide rows, bits that batched rows and fused launches share
// with rows alone and their parts, refused shapes, new caches, and the prefill attention's long
// prompts and emptied caches. Skipped, visibly, where no GPU is present. The gated delta rule:
// test_gpu_recurrent.cpp; routed experts: test_gpu_moe.cpp; whole models: test_gpu_fixtures.cpp.
#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "gpu_test_util.h"
#include "layers/attention.h"
#include "test_util.h"

namespace kiln::test {
namespace {

class Gpu : public GpuTest {
 protected:
  Gpu() : GpuTest(7) {}
};

// Rows as wide as a vocabulary, searched by many blocks: ties across blocks go to the lower index,
// a row of -inf (with a NaN in it) answers 0, bf16 and strided rows give the CPU's answer.
TEST_F(Gpu, ArgmaxOfWideRows) {
  const int64_t cols = 262147;  // not a multiple of any block's span
  Tensor logits = random(Shape{4, cols}, 10.0f);
  float* l = logits.data_as<float>();
  l[1 * cols + 5000] = l[1 * cols + 200000] = 1e6f;  // the same maximum in two blocks' spans
  for (int64_t c = 0; c < cols; ++c) l[2 * cols + c] = -INFINITY;
  l[2 * cols + 100000] = NAN;
  l[3 * cols + cols - 1] = 1e6f;  // the last value of the row
  Tensor want = cpu.alloc(DType::i32, Shape{4});
  cpu.argmax(logits, want);
  const int32_t expected[4] = {want.data_as<int32_t>()[0], 5000, 0, int32_t(cols - 1)};
  for (int r = 0; r < 4; ++r) ASSERT_EQ(want.data_as<int32_t>()[r], expected[r]) << "row " << r;
  for (DType dtype : {DType::f32, DType::bf16}) {
    Tensor ids = gpu->alloc(DType::i32, Shape{4});
    gpu->argmax(to_gpu(logits, dtype), ids);
    Tensor got = gpu->to_host(ids);
    if (dtype == DType::bf16) {  // rounding may tie row 0's top values: compare with the CPU on the rounded row
      Tensor rounded = from_gpu(to_gpu(logits, dtype));
      cpu.argmax(rounded, want);
    }
    for (int r = 0; r < 4; ++r) EXPECT_EQ(got.data_as<int32_t>()[r], want.data_as<int32_t>()[r]) << "row " << r;
  }
  Tensor wide = random(Shape{3, 2 * cols});  // the right half of wider rows
  Tensor view = wide.cols_view(cols, cols);
  Tensor view_gpu = to_gpu(wide, DType::f32).cols_view(cols, cols);
  Tensor ids = gpu->alloc(DType::i32, Shape{3}), want3 = cpu.alloc(DType::i32, Shape{3});
  cpu.argmax(view, want3);
  gpu->argmax(view_gpu, ids);
  Tensor got = gpu->to_host(ids);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(got.data_as<int32_t>()[r], want3.data_as<int32_t>()[r]) << "row " << r;
}

// Backend::top_k against the CPU, bit for bit: rows wider than a Gemma vocabulary, ties in
// different spans, a row of -inf with a NaN and two finite values, a row of many ties, per-row
// temperatures, k from 1 to the largest, f32 and bf16 logits.
TEST_F(Gpu, TopKOfWideRows) {
  const int64_t cols = 262147, rows = 5;
  Tensor logits = random(Shape{rows, cols}, 10.0f);
  float* l = logits.data_as<float>();
  l[1 * cols + 7] = l[1 * cols + 5000] = l[1 * cols + 200000] = 1e3f;
  for (int64_t c = 0; c < cols; ++c) l[2 * cols + c] = -INFINITY;
  l[2 * cols + 100000] = NAN, l[2 * cols + 3] = 1.0f, l[2 * cols + cols - 1] = 1.0f;
  for (int64_t c = 0; c < cols; ++c) l[3 * cols + c] = std::round(l[3 * cols + c]);
  l[4 * cols + cols - 1] = 1e3f;
  Tensor temperatures = cpu.alloc(DType::f32, Shape{rows});
  const float t[rows] = {1.0f, 0.7f, 1.0f, 0.3f, 2.0f};
  std::copy(t, t + rows, temperatures.data_as<float>());
  const Tensor temperatures_gpu = gpu->upload(temperatures, DType::f32);
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Tensor device = to_gpu(logits, dtype);
    const Tensor seen = from_gpu(device);  // the values the GPU reads (bf16 rounded)
    for (int k : {1, 20, 64, Backend::kMaxTopK}) {
      Tensor want_values = cpu.alloc(DType::f32, Shape{rows, k}), want_ids = cpu.alloc(DType::i32, Shape{rows, k});
      cpu.top_k(seen, temperatures, k, want_values, want_ids);
      Tensor values = gpu->alloc(DType::f32, Shape{rows, k}), ids = gpu->alloc(DType::i32, Shape{rows, k});
      gpu->top_k(device, temperatures_gpu, k, values, ids);
      const Tensor got_values = from_gpu(values), got_ids = from_gpu(ids);
      for (int64_t i = 0; i < rows * k; ++i) {
        ASSERT_EQ(got_ids.data_as<int32_t>()[i], want_ids.data_as<int32_t>()[i])
            << "row " << i / k << " place " << i % k << ", k " << k << ", " << dtype_name(dtype);
        ASSERT_EQ(std::memcmp(got_values.data_as<float>() + i, want_values.data_as<float>() + i, 4), 0)
            << "row " << i / k << " place " << i % k << ", k " << k;
      }
    }
  }
  // a k the kernels do not take is an error, not garbage (on a backend of its own: the error stays)
  auto other = make_cuda_backend(0);
  ASSERT_TRUE(other.ok());
  Backend& b = **other;
  Tensor values = b.alloc(DType::f32, Shape{rows, 300}), ids = b.alloc(DType::i32, Shape{rows, 300});
  b.top_k(b.upload(logits, DType::f32), b.upload(temperatures, DType::f32), 300, values, ids);
  ASSERT_FALSE(b.status().ok());
  EXPECT_NE(b.status().error().message.find("top_k: 300 candidates"), std::string::npos);
}

// Held to a fixed 1e-2 of the largest value, which the op table's tolerance (derived from a bf16
// emulation that rounds the GLU product's two halves as well) exceeds for some of these shapes.
TEST_F(Gpu, FusedProducts) {
  // several products of one input in one launch, bf16 and f32 outputs, then the GLU product; k a
  // multiple of 32 takes the tensor-core kernel (2560: many warps share a tile), 264 the streaming one
  for (int64_t k : {264, 2560})
    for (int64_t m : {1, 3, 8, 9, 17, 32, 33}) {
      Tensor x = random(Shape{m, k});
      Tensor xg = to_gpu(x);
      std::vector<Tensor> weights = {random(Shape{31, k}), random(Shape{64, k}), random(Shape{9, k})};
      for (DType out_type : {DType::bf16, DType::f32}) {
        std::vector<MatmulProduct> on_gpu;
        for (const Tensor& w : weights) on_gpu.push_back({to_gpu(w), gpu->alloc(out_type, Shape{m, w.dim(0)})});
        gpu->matmul_many(xg, on_gpu);
        for (size_t i = 0; i < weights.size(); ++i) {
          Tensor want = cpu.alloc(DType::f32, Shape{m, weights[i].dim(0)});
          cpu.matmul(x, weights[i], want);
          EXPECT_LT(rel(from_gpu(on_gpu[i].out), want), out_type == DType::f32 ? 1e-4 : 1e-2) << m << " " << i;
        }
      }
      Tensor gate = random(Shape{45, k}, 0.1f), up = random(Shape{45, k});
      for (Activation act : {Activation::silu, Activation::gelu_tanh}) {
        Tensor want = cpu.alloc(DType::f32, Shape{m, 45});
        cpu.glu_matmul(x, gate, up, act, want);
        Tensor got = gpu->alloc(DType::bf16, Shape{m, 45});
        gpu->glu_matmul(xg, to_gpu(gate), to_gpu(up), act, got);
        EXPECT_LT(rel(from_gpu(got), want), 1e-2) << m;
      }
    }
}

// A row of a product of many rows gets exactly the bits it gets alone (up to 32 rows, the streaming
// kernel's limit): what batch-invariant serving rests on.
TEST_F(Gpu, ProductRowsAreBatchInvariant) {
  for (int64_t k : {1024, 264}) {
    const int64_t n = 77;
    Tensor w = random(Shape{n, k}), gate = random(Shape{n, k}, 0.1f);
    Tensor wg = to_gpu(w), gateg = to_gpu(gate);
    for (int64_t m : {2, 8, 13, 20, 32}) {
      Tensor x = random(Shape{m, k});
      Tensor xg = to_gpu(x);
      Tensor all = gpu->alloc(DType::bf16, Shape{m, n}), all_glu = gpu->alloc(DType::bf16, Shape{m, n});
      gpu->matmul(xg, wg, all);
      gpu->glu_matmul(xg, gateg, wg, Activation::silu, all_glu);
      Tensor all_host = from_gpu(all), glu_host = from_gpu(all_glu);
      for (int64_t r = 0; r < m; ++r) {
        Tensor one = gpu->alloc(DType::bf16, Shape{1, n}), one_glu = gpu->alloc(DType::bf16, Shape{1, n});
        gpu->matmul(xg.rows_view(r, 1), wg, one);
        gpu->glu_matmul(xg.rows_view(r, 1), gateg, wg, Activation::silu, one_glu);
        Tensor one_host = from_gpu(one), one_glu_host = from_gpu(one_glu);
        for (int64_t c = 0; c < n; ++c) {
          ASSERT_EQ(one_host.data_as<float>()[c], all_host.data_as<float>()[r * n + c]) << m << " row " << r;
          ASSERT_EQ(one_glu_host.data_as<float>()[c], glu_host.data_as<float>()[r * n + c]) << m << " row " << r;
        }
      }
    }
  }
}

// Held to a fixed 1e-2 of the largest value (the residual), which the op table's derived tolerance
// exceeds by a little for some of these shapes.
TEST_F(Gpu, ResidualNorm) {
  for (int64_t cols : {160, 1031, 3840}) {
    for (bool block_norm : {false, true})
      for (bool next : {false, true}) {
        const int64_t rows = 5;
        Tensor h = random(Shape{rows, cols}), b = random(Shape{rows, cols}, 3.0f);
        Tensor wb = random(Shape{cols}), wn = random(Shape{cols});
        Tensor hg = to_gpu(h);
        Tensor next_cpu = next ? cpu.alloc(DType::f32, Shape{rows, cols}) : Tensor();
        Tensor next_gpu = next ? gpu->alloc(DType::bf16, Shape{rows, cols}) : Tensor();
        cpu.residual_norm(ResidualNormArgs{.residual = h,
                                           .block_out = b,
                                           .block_norm = block_norm ? wb : Tensor(),
                                           .next = next_cpu,
                                           .next_norm = wn,
                                           .eps = 1e-6f,
                                           .norm_offset = 0.5f,
                                           .scale = 0.75f});
        gpu->residual_norm(ResidualNormArgs{.residual = hg,
                                            .block_out = to_gpu(b),
                                            .block_norm = block_norm ? to_gpu(wb, DType::f32) : Tensor(),
                                            .next = next_gpu,
                                            .next_norm = to_gpu(wn, DType::f32),
                                            .eps = 1e-6f,
                                            .norm_offset = 0.5f,
                                            .scale = 0.75f});
        EXPECT_LT(rel(from_gpu(hg), h), 1e-2) << cols;
        if (next) {
          EXPECT_LT(rel(from_gpu(next_gpu), next_cpu), 2e-2) << cols;
        }
      }
  }
}

// A long bf16 row's norm gives the bits the residual update's next norm gives the same row (a step
// takes the first or the second for its final norm depending on which rows want logits), and the
// CPU's values; also without a weight, and on a row-strided view.
TEST_F(Gpu, LongRowNormHasTheResidualUpdatesBits) {
  for (int64_t cols : {1024, 2560, 3840, 5376}) {
    const int64_t rows = 3;
    Tensor h = random(Shape{rows, cols}, 2.0f), w = random(Shape{cols});
    Tensor hg = gpu->upload(h, DType::bf16), wg = to_gpu(w, DType::f32);
    for (bool weighted : {true, false}) {
      const Tensor weight = weighted ? wg : Tensor();
      Tensor alone = gpu->alloc(DType::bf16, Shape{rows, cols}), fused = gpu->alloc(DType::bf16, Shape{rows, cols});
      gpu->rms_norm(hg, weight, 1e-6f, 1.0f, alone);
      Tensor zero = gpu->alloc(DType::bf16, Shape{rows, cols});
      gpu->fill(zero, 0.0f);
      Tensor residual = gpu->alloc(DType::bf16, Shape{rows, cols});
      gpu->copy(hg, residual);
      gpu->residual_norm(ResidualNormArgs{.residual = residual,
                                          .block_out = zero,
                                          .next = fused,
                                          .next_norm = weight,
                                          .eps = 1e-6f,
                                          .norm_offset = 1.0f});
      Tensor a = gpu->to_host(alone), f = gpu->to_host(fused);
      EXPECT_EQ(std::memcmp(a.data(), f.data(), size_t(a.numel()) * sizeof(float)), 0) << cols << " " << weighted;
      Tensor want = cpu.alloc(DType::f32, Shape{rows, cols});
      cpu.rms_norm(gpu->to_host(hg), weighted ? w : Tensor(), 1e-6f, 1.0f, want);
      EXPECT_LT(rel(a, want), 1e-2) << cols << " " << weighted;
    }
    // the right half of a wider tensor, into a strided view
    Tensor wide = gpu->upload(random(Shape{rows, 2 * cols}), DType::bf16);
    Tensor out_wide = gpu->alloc(DType::bf16, Shape{rows, 2 * cols});
    Tensor out_view = out_wide.cols_view(cols, cols);
    gpu->rms_norm(wide.cols_view(cols, cols), wg, 1e-6f, 0.0f, out_view);
    Tensor want = cpu.alloc(DType::f32, Shape{rows, cols});
    cpu.rms_norm(gpu->to_host(wide).cols_view(cols, cols), w, 1e-6f, 0.0f, want);
    Tensor got = cpu.alloc(DType::f32, Shape{rows, cols});
    cpu.copy(gpu->to_host(out_wide).cols_view(cols, cols), got);
    EXPECT_LT(rel(got, want), 1e-2) << cols;
  }
}

// A block's output projection with the residual update after it: the fused launch (one or two
// rows, 8 warps a tile) against the CPU, and bit for bit against the product and the update run
// one after the other, which is what rows of a larger step get; twice in a row, since the launch
// leaves its completion counter for the next.
TEST_F(Gpu, ProductWithResidualNorm) {
  const int64_t k = 4096;
  for (int64_t n : {2560, 160})
    for (bool block_norm : {false, true})
      for (int64_t m : {1, 2, 3}) {
        Tensor x = random(Shape{m, k}, 0.5f), w = random(Shape{n, k}), h = random(Shape{m, n});
        Tensor wb = random(Shape{n}), wn = random(Shape{n}), wm = random(Shape{n});
        Tensor xg = to_gpu(x), wg = to_gpu(w), wbg = to_gpu(wb, DType::f32), wng = to_gpu(wn, DType::f32),
               wmg = to_gpu(wm, DType::f32);
        auto args = [&](Backend& b, const Tensor& residual, DType dt) {
          return ResidualNormArgs{.residual = residual,
                                  .block_out = b.alloc(dt, Shape{m, n}),
                                  .block_norm = block_norm ? (dt == DType::f32 ? wb : wbg) : Tensor(),
                                  .next = b.alloc(dt, Shape{m, n}),
                                  .next_norm = dt == DType::f32 ? wn : wng,
                                  .more_next = {b.alloc(dt, Shape{m, n}), Tensor()},
                                  .more_next_norm = {dt == DType::f32 ? wm : wmg, Tensor()},
                                  .eps = 1e-6f,
                                  .norm_offset = 0.5f,
                                  .scale = 0.75f};
        };
        Tensor h_cpu = cpu.alloc(DType::f32, Shape{m, n});  // updated in place; h stays the input
        cpu.copy(h, h_cpu);
        ResidualNormArgs want = args(cpu, h_cpu, DType::f32);
        cpu.matmul_residual_norm(x, w, want);
        for (int repeat = 0; repeat < 2; ++repeat) {
          Tensor hg = to_gpu(h), hs = to_gpu(h);
          ResidualNormArgs fused = args(*gpu, hg, DType::bf16), split = args(*gpu, hs, DType::bf16);
          gpu->matmul_residual_norm(xg, wg, fused);
          Tensor out = split.block_out;
          gpu->matmul(xg, wg, out);
          gpu->residual_norm(split);
          ASSERT_TRUE(gpu->status().ok()) << gpu->status().error().message;
          EXPECT_LT(rel(from_gpu(hg), want.residual), 1e-2) << n << " " << m;
          EXPECT_LT(rel(from_gpu(fused.next), want.next), 2e-2) << n << " " << m;
          EXPECT_LT(rel(from_gpu(fused.more_next[0]), want.more_next[0]), 2e-2) << n << " " << m;
          for (auto [a, b] : {std::pair{hg, hs}, std::pair{fused.next, split.next},
                              std::pair{fused.more_next[0], split.more_next[0]}, std::pair{fused.block_out, out}}) {
            Tensor ah = from_gpu(a), bh = from_gpu(b);
            for (int64_t i = 0; i < ah.numel(); ++i)
              ASSERT_EQ(ah.data_as<float>()[i], bh.data_as<float>()[i]) << n << " " << m << " at " << i;
          }
        }
      }
}

// Shapes the kernels cannot take are refused with an error (each on a backend of its own: the
// error sticks), never run on wrong results.
TEST_F(Gpu, ShapesBeyondTheKernelsAreRefused) {
  auto refused = [](const std::function<void(Backend&)>& op, const std::string& expected) {
    auto made = make_cuda_backend(0);
    ASSERT_TRUE(made.ok()) << made.error().message;
    std::unique_ptr<Backend> b = std::move(made).value();
    op(*b);
    b->synchronize();
    ASSERT_FALSE(b->status().ok()) << expected;
    EXPECT_NE(b->status().error().message.find(expected), std::string::npos) << b->status().error().message;
  };
  refused(
      [](Backend& b) {
        b.moe_route({.logits = b.alloc(DType::f32, Shape{2, 600}),
                     .ids = b.alloc(DType::i32, Shape{2, 8}),
                     .weights = b.alloc(DType::f32, Shape{2, 8}),
                     .top_k = 8});
      },
      "CUDA routing takes up to 512 experts");
  refused(
      [](Backend& b) {
        b.moe_route({.logits = b.alloc(DType::f32, Shape{2, 64}),
                     .ids = b.alloc(DType::i32, Shape{2, 40}),
                     .weights = b.alloc(DType::f32, Shape{2, 40}),
                     .top_k = 40});
      },
      "top-k 1 to 32");
  refused(
      [](Backend& b) {
        Tensor x = b.alloc(DType::bf16, Shape{3, 16});
        Tensor out = b.alloc(DType::bf16, Shape{3, 16});
        Tensor state = b.alloc(DType::bf16, Shape{8, 16});
        b.causal_conv1d({.x = x,
                         .weight = b.alloc(DType::f32, Shape{16, 9}),
                         .out = out,
                         .seqs = {SeqRows{.row_begin = 0, .n_rows = 3}},
                         .states = {state}});
      },
      "CUDA causal conv takes kernels of 1 to 8 taps, not 9");
}

// A new cache's keys and values hold zeros even where the pool recycles NaN-filled memory: the
// prefill kernels weigh empty slots by zero, and 0 · NaN would be NaN.
TEST_F(Gpu, NewCacheHoldsNoNaN) {
  const int64_t capacity = 64, heads = 2, dim = 128;
  {
    Tensor junk = gpu->alloc(DType::bf16, Shape{capacity * 2, heads, dim});
    gpu->fill(junk, NAN);
    gpu->synchronize();
  }
  KvCacheView cache = new_kv_cache(*gpu, capacity, int(heads), int(dim));
  for (const Tensor& t : {cache.k, cache.v}) {
    Tensor host = from_gpu(t);
    for (int64_t i = 0; i < host.numel(); ++i) ASSERT_EQ(host.data_as<float>()[i], 0.0f) << i;
  }
}

// Decode attention gives a sequence's row the bits it gets alone when another sequence with more
// rows shares the launch, for a short and a long cache (few and many spans), at Gemma 4's sliding and
// global head shapes and Qwen 3.5's gated one.
TEST_F(Gpu, DecodeAttentionBatchInvariant) {
  struct Case {
    int hq, hkv, hd;
    bool gated;
  };
  for (const Case& c : {Case{16, 8, 256, false}, Case{16, 1, 512, false}, Case{16, 4, 256, true}})
    for (int64_t capacity : {int64_t(700), int64_t(20000)}) {
      const int64_t filled = 600;  // slots already in both caches
      std::vector<KvCacheView> caches = {new_kv_cache(*gpu, capacity, c.hkv, c.hd),
                                         new_kv_cache(*gpu, capacity, c.hkv, c.hd)};
      for (KvCacheView& cache : caches) {
        Tensor pos = host_tensor(DType::i32, Shape{filled});
        for (int64_t i = 0; i < filled; ++i) pos.data_as<int32_t>()[i] = int32_t(i);
        gpu->kv_write(KvWriteArgs{.k = to_gpu(random(Shape{filled, c.hkv, c.hd})),
                                  .v = to_gpu(random(Shape{filled, c.hkv, c.hd})),
                                  .positions = gpu->upload(pos, DType::i32),
                                  .seqs = {SeqRows{0, filled, 0}},
                                  .caches = {cache}});
      }
      // sequence 0 decodes one row; sequence 1 three (its rows are not written, only attended from)
      const Tensor q = random(Shape{4, c.hq, c.hd}), gate = random(Shape{4 * c.hq, 2 * c.hd});
      Tensor pos = host_tensor(DType::i32, Shape{4});
      for (int i = 0; i < 4; ++i) pos.data_as<int32_t>()[i] = int32_t(i == 0 ? filled - 1 : filled - 4 + i);
      auto first_rows = [](const Tensor& t, int64_t rows) {  // a host copy of t's first rows
        Shape shape = t.shape();
        const int64_t per_row = t.numel() / shape[0];
        shape[0] = rows;
        Tensor out = host_tensor(t.dtype(), shape);
        std::memcpy(out.data(), t.data(), size_t(rows * per_row) * dtype_size(t.dtype()));
        return out;
      };
      auto run = [&](int64_t rows, std::vector<SeqRows> seqs, std::vector<KvCacheView> cc) {
        Tensor got = gpu->alloc(DType::bf16, Shape{rows, c.hq, c.hd});
        Tensor gate_gpu = c.gated ? to_gpu(first_rows(gate, rows * c.hq)).cols_view(c.hd, c.hd) : Tensor();
        gpu->attention(AttentionArgs{.q = to_gpu(first_rows(q, rows)),
                                     .out = got,
                                     .positions = gpu->upload(first_rows(pos, rows), DType::i32),
                                     .seqs = seqs,
                                     .caches = cc,
                                     .n_heads = c.hq,
                                     .n_kv_heads = c.hkv,
                                     .head_dim = c.hd,
                                     .scale = 1.0f / 16,
                                     .window = 0,
                                     .output_gate = gate_gpu});
        return from_gpu(got);
      };
      const Tensor alone = run(1, {SeqRows{0, 1, filled - 1}}, {caches[0]});
      const Tensor batched = run(4, {SeqRows{0, 1, filled - 1}, SeqRows{1, 3, filled - 3}}, caches);
      int64_t differ = 0, meaningful = 0;  // meaningful: finite and not zero, so equal outputs say something
      for (int64_t i = 0; i < alone.numel(); ++i) {
        const float v = alone.data_as<float>()[i];
        differ += v != batched.data_as<float>()[i];
        meaningful += std::isfinite(v) && v != 0.0f;
      }
      EXPECT_EQ(differ, 0) << "hq " << c.hq << " hkv " << c.hkv << " hd " << c.hd << " capacity " << capacity;
      EXPECT_GT(meaningful, alone.numel() / 2) << "hq " << c.hq << " hd " << c.hd << " capacity " << capacity;
    }
}

// The flash prefill kernel: head dims 128, 256 and 512, GQA groups 1, 2 and 4, causal with and
// without a window shorter than the prompt. Three sequences per call with prompts that are no
// multiple of the tiles (1030, 37 and 1 rows), then a continuation chunk that attends to the
// first call's slots (200, 1 and 37 rows; with the window it wraps the ring), then the same chunk
// over caches whose slots were emptied, which must give zeros. The tolerance is what rounding P
// to bf16 before P·V allows (2^-9 per term, well under 1e-3 of the output's scale here), with
// margin, beyond half a bf16 ulp of each output.
TEST_F(Gpu, AttentionPrefillShapes) {
  const std::vector<std::vector<int64_t>> calls = {{1030, 37, 1}, {200, 1, 37}};  // rows per sequence
  for (int hd : {128, 256, 512})
    for (int group : {1, 2, 4})
      for (int64_t window : {int64_t(0), int64_t(100)}) {
        const int hkv = hd == 512 ? 1 : 2, hq = hkv * group;
        const float scale = 1.0f / std::sqrt(float(hd));
        const int64_t capacity = window ? window - 1 + 1030 : 1280;
        std::vector<KvCacheView> cpu_caches, gpu_caches;
        for (size_t s = 0; s < calls[0].size(); ++s) {
          cpu_caches.push_back(new_kv_cache(cpu, capacity, hkv, hd));
          gpu_caches.push_back(new_kv_cache(*gpu, capacity, hkv, hd));
        }
        std::vector<int64_t> done(calls[0].size(), 0);
        for (size_t call = 0; call <= calls.size(); ++call) {
          const bool emptied = call == calls.size();  // the last chunk again, over emptied caches
          const std::vector<int64_t>& n_rows = calls[emptied ? call - 1 : call];
          std::vector<SeqRows> seqs;
          int64_t rows = 0;
          for (size_t s = 0; s < n_rows.size(); ++s) {
            seqs.push_back(SeqRows{rows, n_rows[s], emptied ? done[s] - n_rows[s] : done[s]});
            rows += n_rows[s];
          }
          Tensor q = random(Shape{rows, hq, hd}), k = random(Shape{rows, hkv, hd}), v = random(Shape{rows, hkv, hd});
          Tensor pos = host_tensor(DType::i32, Shape{rows});
          for (const SeqRows& s : seqs)
            for (int64_t i = 0; i < s.n_rows; ++i) pos.data_as<int32_t>()[s.row_begin + i] = int32_t(s.pos_begin + i);
          Tensor pos_gpu = gpu->upload(pos, DType::i32);
          if (emptied) {
            for (size_t s = 0; s < seqs.size(); ++s) {
              cpu.fill(cpu_caches[s].slot_pos, -1.0f);
              gpu->fill(gpu_caches[s].slot_pos, -1.0f);
            }
          } else {
            cpu.kv_write(KvWriteArgs{.k = k, .v = v, .positions = pos, .seqs = seqs, .caches = cpu_caches});
            gpu->kv_write(
                KvWriteArgs{.k = to_gpu(k), .v = to_gpu(v), .positions = pos_gpu, .seqs = seqs, .caches = gpu_caches});
          }
          Tensor want = cpu.alloc(DType::f32, Shape{rows, hq, hd});
          cpu.attention(AttentionArgs{.q = q,
                                      .out = want,
                                      .positions = pos,
                                      .seqs = seqs,
                                      .caches = cpu_caches,
                                      .n_heads = hq,
                                      .n_kv_heads = hkv,
                                      .head_dim = hd,
                                      .scale = scale,
                                      .window = window});
          Tensor got = gpu->alloc(DType::bf16, Shape{rows, hq, hd});
          gpu->attention(AttentionArgs{.q = to_gpu(q),
                                       .out = got,
                                       .positions = pos_gpu,
                                       .seqs = seqs,
                                       .caches = gpu_caches,
                                       .n_heads = hq,
                                       .n_kv_heads = hkv,
                                       .head_dim = hd,
                                       .scale = scale,
                                       .window = window});
          const Tensor host = from_gpu(got);
          if (emptied) {
            int64_t nonzero = 0;  // NaN counts too
            for (int64_t i = 0; i < host.numel(); ++i) nonzero += !(host.data_as<float>()[i] == 0.0f);
            EXPECT_EQ(nonzero, 0) << "emptied caches: hd " << hd << " group " << group << " window " << window;
          } else {
            EXPECT_LT(bf16_excess(host, want), 4e-3)
                << "call " << call << " hd " << hd << " group " << group << " window " << window;
          }
          if (!emptied)
            for (size_t s = 0; s < n_rows.size(); ++s) done[s] += n_rows[s];
        }
      }
}

}  // namespace
}  // namespace kiln::test
