// The backend op table (op_table.h): a row per op and shape and dtype, each running the op through
// the Backend interface alone, so that the same code runs on the reference, the bf16 emulation and
// the backend under test.
//
// Ops covered: matmul (dense f32 and bf16, quantized at 2-8 bits and groups of 32-128), matmul_many,
// glu_matmul, matmul_residual_norm, embed (dense and quantized), gather_sum, rms_norm, rms_norm_gated,
// layer_norm, add, residual_norm, scale, glu, bias_act, sigmoid_mul, add_sigmoid_gated, softcap,
// clamp, column_affine, argmax, top_k, rope (plain, with the per-head norm, and over several
// position axes), kv_write, attention_inputs (one and three position axes), attention (causal,
// windowed, bidirectional: every query at its sequence's last position, and with bidirectional
// blocks), causal_conv1d, gated_delta,
// moe_route and moe_experts (dense and quantized). Each in f32 and bf16 where the CUDA backend takes
// both; in bf16 alone where its kernels take bf16 alone (kv_write, attention_inputs, attention,
// gated_delta, and the inputs of moe_experts and of quantized products, whose outputs may be f32).
// Left to other tests: alloc, upload, to_host, copy and fill (every case goes through them), capture
// and graphs (whole models: test_gpu_fixtures.cpp), timers and profiling (no values), batch
// invariance and the bits fused launches share with their parts (test_gpu*.cpp), and shapes a kernel
// refuses (test_gpu.cpp).
#include "op_table.h"

#include <fmt/format.h>

#include "op_table_cases.h"

namespace kiln::test {

Tensor OpRun::random(Shape shape, float std) {
  Tensor t = host_tensor(DType::f32, shape);
  std::normal_distribution<float> dist(0.0f, std);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = dist(rng_);
    t.data_as<float>()[i] = bf16_inputs_ ? bf16_to_f32(f32_to_bf16(v)) : v;
  }
  return t;
}

Tensor OpRun::quantized(Shape shape, int bits, int group) {
  return random_quantized(rng_, shape, bits, group);
}

Tensor OpRun::ints(std::vector<int32_t> values) {
  Tensor t = host_tensor(DType::i32, Shape{int64_t(values.size())});
  std::copy(values.begin(), values.end(), t.data_as<int32_t>());
  return t;
}

Tensor OpRun::floats(std::vector<float> values) {
  Tensor t = host_tensor(DType::f32, Shape{int64_t(values.size())});
  std::copy(values.begin(), values.end(), t.data_as<float>());
  return t;
}

std::string OpCase::label() const {
  const std::string types =
      act == out ? std::string(dtype_name(act)) : fmt::format("{}->{}", dtype_name(act), dtype_name(out));
  return fmt::format("{} {} {}", op, shape, types);
}

std::string OpCase::name() const {
  std::string n = label();
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

namespace op_cases {

// ---- elementwise ----

struct Size2 {
  int64_t rows, cols;
};
constexpr Size2 kElementwise[] = {{1, 1}, {1, 31}, {33, 32}, {63, 65}, {127, 33}, {37, 160}, {5, 333}, {3, 1031}};

void elementwise(Table& t) {
  for (const Size2 s : kElementwise)
    for (DType dt : kFloatTypes) {
      const Shape shape{s.rows, s.cols};
      for (float scale : {1.0f, 0.75f})
        t.add("add", fmt::format("{} scale {}", dims({s.rows, s.cols}), scale), dt, [=](OpRun& r) {
          const Tensor a = r.random(shape), b = r.random(shape);
          Tensor out = r.alloc(shape);
          r.b.add(r.up(a), r.up(b), scale, out);
          return Outputs{output("out", r.host(out), r.act)};
        });
      t.add("scale", dims({s.rows, s.cols}), dt, [=](OpRun& r) {
        const Tensor x = r.random(shape, 3.0f);
        Tensor out = r.alloc(shape);
        r.b.scale(r.up(x), -1.37f, out);
        return Outputs{output("out", r.host(out), r.act)};
      });
      for (Activation act : {Activation::silu, Activation::gelu_tanh})
        t.add("glu", fmt::format("{} {}", dims({s.rows, s.cols}), act_name(act)), dt, [=](OpRun& r) {
          const Tensor gate = r.random(shape, 2.0f), up = r.random(shape);
          Tensor out = r.alloc(shape);
          r.b.glu(r.up(gate), r.up(up), act, out);
          return Outputs{output("out", r.host(out), r.act)};
        });
      for (const BiasActivation act : {BiasActivation::none, BiasActivation::gelu_tanh, BiasActivation::gelu_erf})
        for (bool in_place : {false, true})
          t.add("bias_act",
                fmt::format("{} {}{}", dims({s.rows, s.cols}), bias_act_name(act), in_place ? " in place" : ""), dt,
                [=](OpRun& r) {
                  const Tensor x = r.random(shape, 2.0f), bias = r.random(Shape{s.cols});
                  Tensor xd = r.up(x);
                  Tensor out = in_place ? xd : r.alloc(shape);
                  r.b.bias_act(xd, r.up_f32(bias), act, out);
                  return Outputs{output("out", r.host(out), r.act)};
                });
      for (bool strided : {false, true})  // strided: the gate is the right half of wider rows
        t.add("sigmoid_mul", fmt::format("{}{}", dims({s.rows, s.cols}), strided ? " strided gate" : ""), dt,
              [=](OpRun& r) {
                const Tensor x = r.random(shape), gate = r.random(Shape{s.rows, (strided ? 2 : 1) * s.cols}, 2.0f);
                const Tensor g = strided ? r.up(gate).cols_view(s.cols, s.cols) : r.up(gate);
                Tensor out = r.alloc(shape);
                r.b.sigmoid_mul(r.up(x), g, out);
                return Outputs{output("out", r.host(out), r.act)};
              });
      for (bool f32_gate : {false, true})
        t.add("add_sigmoid_gated", fmt::format("{}{}", dims({s.rows, s.cols}), f32_gate ? " f32 gate" : ""), dt,
              [=](OpRun& r) {
                const Tensor acc = r.random(shape), x = r.random(shape), gate = r.random(Shape{s.rows, 1}, 2.0f);
                Tensor a = r.up(acc);
                r.b.add_sigmoid_gated(a, r.up(x), f32_gate ? r.up_f32(gate) : r.up(gate));
                return Outputs{output("acc", r.host(a), r.act)};
              });
      t.add("softcap", dims({s.rows, s.cols}), dt, [=](OpRun& r) {
        Tensor x = r.up(r.random(shape, 20.0f));
        r.b.softcap(x, 30.0f);
        return Outputs{output("x", r.host(x), r.act)};
      });
      // a clippable linear's bounds: both, one side open, and none
      for (const auto& [lo, hi] : {std::pair{-0.75f, 1.25f}, std::pair{-INFINITY, 0.5f}, std::pair{-INFINITY, INFINITY}})
        t.add("clamp", fmt::format("{} [{}, {}]", dims({s.rows, s.cols}), lo, hi), dt, [=](OpRun& r) {
          const Tensor x = r.random(shape);
          Tensor out = r.alloc(shape);
          r.b.clamp(r.up(x), lo, hi, out);
          return Outputs{exact("out", r.host(out))};  // the value or a bound
        });
      // a bias (shift), an affine standardisation (scale, shift and mul), a scale alone
      for (int variant : {0, 1, 2})
        t.add("column_affine",
              fmt::format("{} {}", dims({s.rows, s.cols}),
                          variant == 0   ? "shift"
                          : variant == 1 ? "scale shift mul"
                                         : "scale"),
              dt, [=](OpRun& r) {
                const Tensor x = r.random(shape, 3.0f), shift = r.random(Shape{s.cols}), mul = r.random(Shape{s.cols});
                Tensor out = r.alloc(shape);
                r.b.column_affine(r.up(x), variant == 0 ? 1.0f : 27.7128f, variant < 2 ? r.up_f32(shift) : Tensor(),
                                  variant == 1 ? r.up_f32(mul) : Tensor(), out);
                return Outputs{output("out", r.host(out), r.act)};
              });
    }
  // an f32 product's bias into the activation type (the unified vision embedder's Dense layer)
  t.add("column_affine", "37x160 f32 in, shift", kBf16, [=](OpRun& r) {
    const Tensor x = r.random(Shape{37, 160}, 3.0f), shift = r.random(Shape{160});
    Tensor out = r.alloc(Shape{37, 160});
    r.b.column_affine(r.up_f32(x), 1.0f, r.up_f32(shift), Tensor(), out);
    return Outputs{output("out", r.host(out), r.act)};
  });
  // in place, as the residual stream is updated
  for (DType dt : kFloatTypes)
    t.add("add", "37x160 in place", dt, [=](OpRun& r) {
      const Tensor a = r.random(Shape{37, 160}), b = r.random(Shape{37, 160});
      Tensor acc = r.up(a);
      r.b.add(acc, r.up(b), 0.5f, acc);
      return Outputs{output("out", r.host(acc), r.act)};
    });
}

// ---- selection: argmax, top_k ----

void selection(Table& t) {
  for (const Size2 s : {Size2{1, 1}, Size2{5, 33}, Size2{3, 333}, Size2{2, 4099}, Size2{4, 65537}})
    for (DType dt : kFloatTypes)
      t.add("argmax", dims({s.rows, s.cols}), dt, [=](OpRun& r) {
        const Tensor x = r.random(Shape{s.rows, s.cols}, 10.0f);
        Tensor ids = r.b.alloc(DType::i32, Shape{s.rows});
        r.b.argmax(r.up(x), ids);
        return Outputs{exact("ids", r.host(ids))};
      });
  for (const Size2 s : {Size2{5, 300}, Size2{5, 4099}})
    for (int k : {1, 20, 64, Backend::kMaxTopK})
      for (DType dt : kFloatTypes)
        t.add("top_k", fmt::format("{} k {}", dims({s.rows, s.cols}), k), dt, [=](OpRun& r) {
          const Tensor logits = r.random(Shape{s.rows, s.cols}, 10.0f);
          const Tensor temps = r.floats({1.0f, 0.7f, 1.0f, 0.3f, 2.0f});
          Tensor values = r.b.alloc(DType::f32, Shape{s.rows, k}), ids = r.b.alloc(DType::i32, Shape{s.rows, k});
          r.b.top_k(r.up(logits), r.up_f32(temps), k, values, ids);
          return Outputs{exact("ids", r.host(ids)), exact("values", r.host(values))};
        });
}

// ---- norms ----

void norms(Table& t) {
  const Size2 sizes[] = {{1, 32},   {31, 33},  {33, 127}, {37, 160}, {65, 160},
                         {3, 1031}, {2, 1024}, {5, 4096}, {3, 5376}};
  struct Weighting {
    const char* name;
    bool weight;
    float offset;
  };
  for (const Size2 s : sizes)
    for (const Weighting w :
         {Weighting{"weight", true, 0.0f}, Weighting{"weight+1", true, 1.0f}, Weighting{"no weight", false, 0.0f}})
      for (DType dt : kFloatTypes)
        t.add("rms_norm", fmt::format("{} {}", dims({s.rows, s.cols}), w.name), dt, [=](OpRun& r) {
          const Tensor x = r.random(Shape{s.rows, s.cols}, 2.0f), weight = r.random(Shape{s.cols});
          Tensor out = r.alloc(Shape{s.rows, s.cols});
          r.b.rms_norm(r.up(x), w.weight ? r.up_f32(weight) : Tensor(), 1e-6f, w.offset, out);
          return Outputs{output("out", r.host(out), r.act, s.cols)};
        });
  // the right half of wider rows, into the right half of other wide rows
  for (const Size2 s : {Size2{7, 160}, Size2{3, 1024}, Size2{3, 2560}})
    for (DType dt : kFloatTypes)
      t.add("rms_norm", fmt::format("{} strided", dims({s.rows, s.cols})), dt, [=](OpRun& r) {
        const Tensor x = r.random(Shape{s.rows, 2 * s.cols}), weight = r.random(Shape{s.cols});
        Tensor wide = r.alloc(Shape{s.rows, 2 * s.cols});
        Tensor out = wide.cols_view(s.cols, s.cols);
        r.b.rms_norm(r.up(x).cols_view(s.cols, s.cols), r.up_f32(weight), 1e-6f, 0.0f, out);
        return Outputs{output("out", r.host(out), r.act, s.cols)};
      });
  // LayerNorm (vision towers): weight and bias, neither, a strided view in and out; rows with an
  // offset far from zero, where the centring matters
  for (const Size2 s : {Size2{1, 31}, Size2{33, 32}, Size2{37, 160}, Size2{7, 1152}, Size2{3, 4608}, Size2{2, 1031}, Size2{5, 6912}})
    for (bool affine : {true, false})
      for (DType dt : kFloatTypes)
        t.add("layer_norm", fmt::format("{}{}", dims({s.rows, s.cols}), affine ? "" : " no weight or bias"), dt,
              [=](OpRun& r) {
                Tensor x = r.random(Shape{s.rows, s.cols}, 2.0f);
                for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] += 3.0f;
                const Tensor weight = r.random(Shape{s.cols}), bias = r.random(Shape{s.cols});
                Tensor out = r.alloc(Shape{s.rows, s.cols});
                r.b.layer_norm(r.up(x), affine ? r.up_f32(weight) : Tensor(), affine ? r.up_f32(bias) : Tensor(), 1e-6f,
                               out);
                return Outputs{output("out", r.host(out), r.act, s.cols)};
              });
  for (DType dt : kFloatTypes)
    t.add("layer_norm", "5x160 strided", dt, [=](OpRun& r) {
      const Tensor x = r.random(Shape{5, 320}), weight = r.random(Shape{160}), bias = r.random(Shape{160});
      Tensor wide = r.alloc(Shape{5, 320});
      Tensor out = wide.cols_view(160, 160);
      r.b.layer_norm(r.up(x).cols_view(160, 160), r.up_f32(weight), r.up_f32(bias), 1e-6f, out);
      return Outputs{output("out", r.host(out), r.act, 160)};
    });
  for (const Size2 s : {Size2{1, 32}, Size2{37, 160}, Size2{63, 65}, Size2{4, 128}, Size2{9, 256}})
    for (DType dt : kFloatTypes)
      t.add("rms_norm_gated", dims({s.rows, s.cols}), dt, [=](OpRun& r) {
        const Tensor x = r.random(Shape{s.rows, s.cols}), z = r.random(Shape{s.rows, s.cols}),
                     weight = r.random(Shape{s.cols});
        Tensor out = r.alloc(Shape{s.rows, s.cols});
        r.b.rms_norm_gated(r.up(x), r.up(z), r.up_f32(weight), 1e-6f, out);
        return Outputs{output("out", r.host(out), r.act, s.cols)};
      });
}

void residual(Table& t) {
  struct Variant {
    int64_t rows, cols;
  };
  for (const Variant v : {Variant{5, 33}, Variant{5, 160}, Variant{5, 1031}, Variant{5, 3840}, Variant{1, 3840}})
    for (bool block_norm : {false, true})
      for (int next : {0, 1, 2})  // no next norm, one, two
        for (DType dt : kFloatTypes) {
          const std::string shape = fmt::format("{}{}{}", dims({v.rows, v.cols}), block_norm ? " block norm" : "",
                                                next == 0   ? ""
                                                : next == 1 ? " next"
                                                            : " next+more");
          t.add("residual_norm", shape, dt, [=](OpRun& r) {
            ResidualInputs in = residual_inputs(r, v.rows, v.cols, block_norm, next > 0, next > 1);
            r.b.residual_norm(in.args);
            return residual_outputs(r, in.args, v.cols);
          });
        }
}

}  // namespace op_cases

std::vector<OpCase> op_table() {
  using namespace op_cases;
  Table t;
  dense_products(t);
  quantized_products(t);
  norms(t);
  residual(t);
  elementwise(t);
  selection(t);
  rope(t);
  kv_and_attention(t);
  recurrent(t);
  moe(t);
  return std::move(t.cases);
}

std::vector<OpCheck> run_op_case(const OpCase& c, Backend& device, int cpu_threads) {
  uint32_t seed = 2166136261u;  // FNV-1a of the label: each case its own inputs, the same every time
  for (char ch : c.label()) seed = (seed ^ uint8_t(ch)) * 16777619u;
  const bool bf16_inputs = c.act == DType::bf16;
  CpuBackend reference(cpu_threads, false), emulation(cpu_threads, true);
  OpRun ref_run(reference, DType::f32, DType::f32, false, seed, bf16_inputs);
  OpRun emu_run(emulation, c.act, c.out, true, seed, bf16_inputs);
  OpRun dev_run(device, c.act, c.out, false, seed, bf16_inputs);
  const std::vector<OpOutput> want = c.run(ref_run), emu = c.run(emu_run), got = c.run(dev_run);
  device.synchronize();
  std::vector<OpCheck> checks;
  for (size_t i = 0; i < want.size() && i < got.size() && i < emu.size(); ++i) {
    OpCheck check{.what = c.label() + ", " + got[i].name, .exact = got[i].exact, .type = got[i].type};
    check.comparison = compare(got[i].value, want[i].value, emu[i].value, got[i].type, got[i].terms, got[i].exact,
                               got[i].factor);
    checks.push_back(std::move(check));
  }
  if (want.size() != got.size() || want.size() != emu.size())
    checks.push_back(OpCheck{.what = c.label() + ": the runs gave different numbers of outputs",
                             .comparison = Comparison{.shape_differs = true}});
  return checks;
}

}  // namespace kiln::test
