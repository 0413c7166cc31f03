// The backend op table (op_table.h): a row per op and shape and dtype, each running the op through
// the Backend interface alone, so that the same code runs on the reference, the bf16 emulation and
// the backend under test.
//
// Ops covered: matmul (dense f32 and bf16, quantized at 2-8 bits and groups of 32-128), matmul_many,
// glu_matmul, matmul_residual_norm, embed (dense and quantized), rms_norm, rms_norm_gated, add,
// residual_norm, scale, glu, sigmoid_mul, add_sigmoid_gated, softcap, argmax, top_k, rope (plain and
// with the per-head norm), kv_write, attention_inputs, attention, causal_conv1d, gated_delta,
// moe_route and moe_experts (dense and quantized).
// Left to other tests: alloc, upload, to_host, copy and fill (every case goes through them), capture
// and graphs (whole models: test_gpu_fixtures.cpp), timers and profiling (no values), batch
// invariance and the bits fused launches share with their parts (test_gpu*.cpp), and shapes a kernel
// refuses (test_gpu.cpp).
#include "op_table.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "quant_test_util.h"

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

namespace {

using Outputs = std::vector<OpOutput>;

// "a,b,c" of the numbers, joined by `sep`
template <typename Range>
std::string joined(const Range& numbers, const char* sep) {
  std::string s;
  for (auto n : numbers) {
    if (!s.empty()) s += sep;
    s += std::to_string(n);
  }
  return s;
}

std::string dims(std::initializer_list<int64_t> sizes) {
  return joined(sizes, "x");
}

// Host tensors laid end to end, as one flat tensor (f32 or i32).
Tensor concat(const std::vector<Tensor>& parts) {
  int64_t n = 0;
  for (const Tensor& p : parts) n += p.numel();
  const DType type = parts.empty() ? DType::f32 : parts[0].dtype();
  Tensor out = host_tensor(type, Shape{n});
  char* at = static_cast<char*>(out.data());
  for (const Tensor& p : parts) {
    const size_t row_bytes = size_t(p.cols()) * dtype_size(type);
    for (int64_t r = 0; r < p.rows(); ++r, at += row_bytes)
      std::memcpy(at, static_cast<const char*>(p.data()) + size_t(r * p.row_stride()) * dtype_size(type), row_bytes);
  }
  return out;
}

// The input rows as the integer products (2, 4 and 8 bits, up to 32 rows) read them: each 32-element
// chunk on an int16 grid whose step is the chunk's max |x| / 32767 (cuda_quant_products.cuh).
Tensor int16_chunks(const Tensor& x) {
  Tensor out = host_tensor(DType::f32, Shape{x.rows(), x.cols()});
  for (int64_t r = 0; r < x.rows(); ++r)
    for (int64_t c0 = 0; c0 < x.cols(); c0 += 32) {
      const float* in = x.data_as<float>() + r * x.row_stride() + c0;
      float* o = out.data_as<float>() + r * x.cols() + c0;
      const int64_t n = std::min<int64_t>(32, x.cols() - c0);
      float amax = 0.0f;
      for (int64_t j = 0; j < n; ++j) amax = std::max(amax, std::fabs(in[j]));
      const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f, step = amax * (1.0f / 32767.0f);
      for (int64_t j = 0; j < n; ++j) o[j] = std::nearbyint(in[j] * inv) * step;
    }
  return out;
}

bool integer_inputs(int bits) {
  return bits == 2 || bits == 4 || bits == 8;
}

// A quantized matrix's values rounded to bf16: what the products of more than 32 rows (blocks of
// rows dequantized for cuBLAS) and the grouped experts multiply.
Tensor bf16_dequantized(const Tensor& q) {
  Tensor d = dequantized(q);
  for (int64_t i = 0; i < d.numel(); ++i) d.data_as<float>()[i] = bf16_to_f32(f32_to_bf16(d.data_as<float>()[i]));
  return d;
}

// The input of a quantized product of m rows, as the device's kernels read it (in the emulation).
Tensor product_input(OpRun& r, const Tensor& x, int bits) {
  if (r.emulating && integer_inputs(bits) && x.rows() <= 32) return r.b.upload(int16_chunks(x), DType::f32);
  return r.up(x);
}
// A product's weight; in the emulation of more than 32 rows a quantized one dequantized to bf16.
Tensor product_weight(OpRun& r, const Tensor& w, int64_t m) {
  if (r.emulating && w.quantized() && m > 32) return r.up(bf16_dequantized(w));
  return r.weight(w);
}

OpOutput output(std::string name, const Tensor& value, DType type, int64_t terms = 1) {
  return OpOutput{.name = std::move(name), .value = value, .type = type, .terms = terms};
}
OpOutput exact(std::string name, const Tensor& value) {
  return OpOutput{.name = std::move(name), .value = value, .type = value.dtype(), .terms = 1, .exact = true};
}

class Table {
 public:
  void add(std::string op, std::string shape, DType act, DType out, std::function<Outputs(OpRun&)> run) {
    cases.push_back(
        OpCase{.op = std::move(op), .shape = std::move(shape), .act = act, .out = out, .run = std::move(run)});
  }
  void add(std::string op, std::string shape, DType act, std::function<Outputs(OpRun&)> run) {
    add(std::move(op), std::move(shape), act, act, std::move(run));
  }
  std::vector<OpCase> cases;
};

constexpr DType kF32 = DType::f32, kBf16 = DType::bf16;
constexpr DType kFloatTypes[] = {DType::f32, DType::bf16};

const char* act_name(Activation act) {
  return act == Activation::silu ? "silu" : "gelu_tanh";
}

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
    }
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

// The residual update's arguments on one run's backend; `more`: a second next norm.
struct ResidualInputs {
  Tensor residual, block_out;
  ResidualNormArgs args;
};
ResidualInputs residual_inputs(OpRun& r, int64_t rows, int64_t cols, bool block_norm, bool next, bool more) {
  const Tensor h = r.random(Shape{rows, cols}), b = r.random(Shape{rows, cols}, 3.0f);
  const Tensor wb = r.random(Shape{cols}), wn = r.random(Shape{cols}), wm = r.random(Shape{cols});
  ResidualInputs in;
  in.residual = r.up(h);
  in.block_out = r.up(b);
  in.args = ResidualNormArgs{.residual = in.residual,
                             .block_out = in.block_out,
                             .block_norm = block_norm ? r.up_f32(wb) : Tensor(),
                             .next = next ? r.alloc(Shape{rows, cols}) : Tensor(),
                             .next_norm = r.up_f32(wn),
                             .more_next = {more ? r.alloc(Shape{rows, cols}) : Tensor(), Tensor()},
                             .more_next_norm = {r.up_f32(wm), Tensor()},
                             .eps = 1e-6f,
                             .norm_offset = 0.5f,
                             .scale = 0.75f};
  return in;
}

Outputs residual_outputs(OpRun& r, const ResidualNormArgs& a, int64_t terms) {
  Outputs outs{output("residual", r.host(a.residual), r.act, terms)};
  if (a.next.defined()) outs.push_back(output("next", r.host(a.next), r.act, terms));
  if (a.more_next[0].defined()) outs.push_back(output("more_next", r.host(a.more_next[0]), r.act, terms));
  return outs;
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

// ---- products ----

void dense_products(Table& t) {
  struct Product {
    int64_t m, n, k;
  };
  std::vector<Product> products;
  for (int64_t m : {1, 2, 33, 256})
    for (int64_t n : {31, 128}) products.push_back({m, n, 96});
  products.insert(products.end(), {{5, 63, 33}, {9, 65, 264}, {17, 127, 2560}});
  struct Types {
    DType act, out;
  };
  for (const Product p : products)
    for (const Types ty : {Types{kBf16, kBf16}, Types{kBf16, kF32}, Types{kF32, kF32}})
      t.add("matmul", dims({p.m, p.n, p.k}), ty.act, ty.out, [=](OpRun& r) {
        const Tensor x = r.random(Shape{p.m, p.k}), w = r.random(Shape{p.n, p.k});
        Tensor out = r.alloc_out(Shape{p.m, p.n});
        r.b.matmul(r.up(x), r.weight(w), out);
        return Outputs{output("out", r.host(out), r.out, p.k)};
      });
  for (DType out_type : kFloatTypes)  // the right half of wider input rows
    t.add("matmul", "5x97x256 strided input", kBf16, out_type, [=](OpRun& r) {
      const Tensor x = r.random(Shape{5, 512}), w = r.random(Shape{97, 256});
      Tensor out = r.alloc_out(Shape{5, 97});
      r.b.matmul(r.up(x).cols_view(256, 256), r.weight(w), out);
      return Outputs{output("out", r.host(out), r.out, 256)};
    });
  // several products of one input (q/k/v), and the GLU product; k a multiple of 32 takes the
  // tensor-core kernels (2560: many warps share a tile), 264 the streaming ones
  for (int64_t k : {264, 2560})
    for (int64_t m : {1, 3, 8, 9, 17, 32, 33}) {
      for (DType out_type : kFloatTypes)
        t.add("matmul_many", dims({m, 31 + 64 + 9, k}), kBf16, out_type, [=](OpRun& r) {
          const Tensor x = r.random(Shape{m, k});
          std::vector<MatmulProduct> products;
          for (int64_t n : {31, 64, 9}) products.push_back({r.weight(r.random(Shape{n, k})), r.alloc_out(Shape{m, n})});
          r.b.matmul_many(r.up(x), products);
          Outputs outs;
          for (size_t i = 0; i < products.size(); ++i)
            outs.push_back(output(fmt::format("out {}", i), r.host(products[i].out), r.out, k));
          return outs;
        });
      for (Activation act : {Activation::silu, Activation::gelu_tanh})
        for (DType out_type : kFloatTypes) {
          if (out_type == kF32 && m != 1 && m != 33) continue;
          t.add("glu_matmul", fmt::format("{} {}", dims({m, 45, k}), act_name(act)), kBf16, out_type, [=](OpRun& r) {
            const Tensor x = r.random(Shape{m, k}), gate = r.random(Shape{45, k}, 0.1f), up = r.random(Shape{45, k});
            Tensor out = r.alloc_out(Shape{m, 45});
            r.b.glu_matmul(r.up(x), r.weight(gate), r.weight(up), act, out);
            return Outputs{output("out", r.host(out), r.out, k)};
          });
        }
    }
  // a block's output projection with the residual update after it: the fused launch (one or two
  // rows) and the plain ops (three)
  for (int64_t n : {160, 2560})
    for (bool block_norm : {false, true})
      for (int64_t m : {1, 2, 3})
        t.add("matmul_residual_norm", fmt::format("{}{}", dims({m, n, 4096}), block_norm ? " block norm" : ""), kBf16,
              [=](OpRun& r) {
                const Tensor x = r.random(Shape{m, 4096}, 0.5f), w = r.random(Shape{n, 4096});
                ResidualInputs in = residual_inputs(r, m, n, block_norm, true, true);
                in.args.block_out = r.alloc(Shape{m, n});
                r.b.matmul_residual_norm(r.up(x), r.weight(w), in.args);
                Outputs outs = residual_outputs(r, in.args, 4096);
                outs.push_back(output("block_out", r.host(in.args.block_out), r.act, 4096));
                return outs;
              });
  for (int64_t cols : {33, 160})
    for (float scale : {1.0f, 3.0f})
      for (DType dt : kFloatTypes)
        t.add("embed", fmt::format("53x{} scale {}", cols, scale), dt, [=](OpRun& r) {
          const Tensor table = r.random(Shape{53, cols});
          std::vector<int32_t> ids;
          for (int i = 0; i < 7; ++i) ids.push_back((i * 13 + 5) % 53);
          Tensor out = r.alloc(Shape{7, cols});
          r.b.embed(r.up_i32(r.ints(ids)), r.weight(table), scale, out);
          return Outputs{scale == 1.0f ? exact("out", r.host(out)) : output("out", r.host(out), r.act)};  // copied rows
        });
}

constexpr int kBits[] = {2, 3, 4, 5, 6, 8};

void quantized_products(Table& t) {
  for (int bits : kBits)
    for (int group : {32, 64, 128})
      for (int64_t k : {int64_t(3 * group + (group == 32 ? 64 : 0)), int64_t(4224)})
        for (int64_t m : {1, 9, 33})
          for (DType out_type : kFloatTypes)
            t.add("matmul", fmt::format("{} q{} g{}", dims({m, 31, k}), bits, group), kBf16, out_type, [=](OpRun& r) {
              const Tensor w = r.quantized(Shape{31, k}, bits, group), x = r.random(Shape{m, k});
              Tensor out = r.alloc_out(Shape{m, 31});
              r.b.matmul(product_input(r, x, bits), product_weight(r, w, m), out);
              return Outputs{output("out", r.host(out), r.out, k)};
            });
  for (int bits : kBits) {
    const int group = bits == 4 ? 64 : bits % 2 ? 128 : 32;
    for (int64_t m : {1, 3, 9, 32, 40})
      for (DType out_type : kFloatTypes) {
        t.add("matmul_many", fmt::format("{} q{} g{}", dims({m, 31 + 64 + 9 + 3, 640}), bits, group), kBf16, out_type,
              [=](OpRun& r) {
                const Tensor x = r.random(Shape{m, 640});
                std::vector<MatmulProduct> products;
                for (int64_t n : {31, 64, 9, 3})
                  products.push_back(
                      {product_weight(r, r.quantized(Shape{n, 640}, bits, group), m), r.alloc_out(Shape{m, n})});
                r.b.matmul_many(product_input(r, x, bits), products);
                Outputs outs;
                for (size_t i = 0; i < products.size(); ++i)
                  outs.push_back(output(fmt::format("out {}", i), r.host(products[i].out), r.out, 640));
                return outs;
              });
        for (Activation act : {Activation::silu, Activation::gelu_tanh})
          t.add("glu_matmul", fmt::format("{} q{} g{} {}", dims({m, 45, 2560}), bits, group, act_name(act)), kBf16,
                out_type, [=](OpRun& r) {
                  const Tensor gate = r.quantized(Shape{45, 2560}, bits, group),
                               up = r.quantized(Shape{45, 2560}, bits, group);
                  const Tensor x = r.random(Shape{m, 2560}, 0.05f);  // gates of a few units, where both bend
                  Tensor out = r.alloc_out(Shape{m, 45});
                  r.b.glu_matmul(product_input(r, x, bits), product_weight(r, gate, m), product_weight(r, up, m), act,
                                 out);
                  return Outputs{output("out", r.host(out), r.out, 2560)};
                });
      }
  }
  for (int bits : {2, 3, 4, 8})
    for (int64_t m : {1, 2, 3})
      t.add("matmul_residual_norm", fmt::format("{} q{} g64", dims({m, 160, 4096}), bits), kBf16, [=](OpRun& r) {
        const Tensor x = r.random(Shape{m, 4096}, 0.5f), w = r.quantized(Shape{160, 4096}, bits, 64);
        ResidualInputs in = residual_inputs(r, m, 160, true, true, false);
        in.args.block_out = r.alloc(Shape{m, 160});
        r.b.matmul_residual_norm(product_input(r, x, bits), product_weight(r, w, m), in.args);
        Outputs outs = residual_outputs(r, in.args, 4096);
        outs.push_back(output("block_out", r.host(in.args.block_out), r.act, 4096));
        return outs;
      });
  for (int bits : kBits)
    for (int group : {32, 64})
      for (DType out_type : kFloatTypes)
        t.add("embed", fmt::format("53x192 q{} g{} scale 3", bits, group), out_type, [=](OpRun& r) {
          const Tensor table = r.quantized(Shape{53, 192}, bits, group);
          std::vector<int32_t> ids;
          for (int i = 0; i < 7; ++i) ids.push_back((i * 13 + 5) % 53);
          Tensor out = r.alloc(Shape{7, 192});
          r.b.embed(r.up_i32(r.ints(ids)), r.weight(table), 3.0f, out);
          return Outputs{output("out", r.host(out), r.act)};
        });
}

// ---- sequence ops ----

std::vector<float> inv_freqs(int n_pairs) {
  std::vector<float> f;
  for (int i = 0; i < n_pairs; ++i) f.push_back(std::pow(10000.0f, -float(i) / float(n_pairs)));
  return f;
}

std::vector<int32_t> positions_of(const std::vector<SeqRows>& seqs) {
  std::vector<int32_t> pos;
  for (const SeqRows& s : seqs)
    for (int64_t i = 0; i < s.n_rows; ++i) pos.push_back(int32_t(s.pos_begin + i));
  return pos;
}

// A ring cache of the run's type, zeroed (the reference's host memory is not), every slot empty.
KvCacheView zeroed_cache(OpRun& r, int64_t capacity, int hkv, int hd) {
  KvCacheView c;
  c.capacity = capacity;
  c.k = r.b.alloc_cache(r.act, Shape{capacity, hkv, hd});
  c.v = r.b.alloc_cache(r.act, Shape{capacity, hkv, hd});
  c.slot_pos = r.b.alloc(DType::i32, Shape{capacity});
  r.b.fill(c.k, 0.0f);
  r.b.fill(c.v, 0.0f);
  r.b.fill(c.slot_pos, -1.0f);
  return c;
}

void rope(Table& t) {
  struct Plain {
    int64_t tokens, heads;
    int hd, n_pairs, offset;
  };
  for (const Plain p :
       {Plain{9, 4, 64, 16, 32}, Plain{5, 3, 96, 24, 48}, Plain{1, 1, 128, 64, 64}, Plain{33, 2, 256, 64, 128}})
    for (DType dt : kFloatTypes)
      t.add("rope", fmt::format("{} pairs {} offset {}", dims({p.tokens, p.heads, p.hd}), p.n_pairs, p.offset), dt,
            [=](OpRun& r) {
              const Tensor x = r.random(Shape{p.tokens, p.heads, p.hd});
              std::vector<int32_t> pos;
              for (int64_t i = 0; i < p.tokens; ++i) pos.push_back(int32_t(i * 37));
              Tensor xd = r.up(x);
              r.b.rope(RopeArgs{.x = xd,
                                .positions = r.up_i32(r.ints(pos)),
                                .inv_freq = r.up_f32(r.floats(inv_freqs(p.n_pairs))),
                                .pair_offset = p.offset});
              return Outputs{output("x", r.host(xd), r.act, 2)};
            });
  // per-head norms folded into the rotation: full, partial and proportional pairings, a strided
  // input, no rotation at all, and a head too wide for the fused kernel
  struct Normed {
    int hd, n_pairs, offset;
    bool strided, weighted;
  };
  for (const Normed c :
       {Normed{64, 32, 32, true, true}, Normed{256, 16, 32, false, true}, Normed{512, 64, 256, false, true},
        Normed{128, 0, 0, false, false}, Normed{640, 32, 320, true, true}})
    for (DType dt : kFloatTypes)
      t.add("rope",
            fmt::format("7x3x{} pairs {} offset {} normalized{}{}", c.hd, c.n_pairs, c.offset,
                        c.strided ? " strided" : "", c.weighted ? "" : " unweighted"),
            dt, [=](OpRun& r) {
              const int64_t tokens = 7, heads = 3;
              const Tensor wide = r.random(Shape{tokens * heads, 2 * c.hd}, 2.0f);
              const Tensor x = r.random(Shape{tokens, heads, c.hd}, 2.0f), weight = r.random(Shape{c.hd});
              std::vector<int32_t> pos;
              for (int64_t i = 0; i < tokens; ++i) pos.push_back(int32_t(i * 101));
              Tensor xd = c.strided ? r.alloc(Shape{tokens, heads, c.hd}) : r.up(x);
              r.b.rope(RopeArgs{.x = xd,
                                .positions = r.up_i32(r.ints(pos)),
                                .inv_freq = c.n_pairs ? r.up_f32(r.floats(inv_freqs(c.n_pairs))) : Tensor(),
                                .pair_offset = c.offset,
                                .normalize = true,
                                .input = c.strided ? r.up(wide).cols_view(0, c.hd) : Tensor(),
                                .norm_weight = c.weighted ? r.up_f32(weight) : Tensor(),
                                .norm_eps = 1e-6f,
                                .norm_offset = 1.0f});
              return Outputs{output("x", r.host(xd), r.act, c.hd)};
            });
}

// The caches' keys and values (copies of the inputs, or computed from them over `terms` terms) and
// which positions their slots hold.
Outputs cache_outputs(OpRun& r, const std::vector<KvCacheView>& caches, bool k_copied, bool v_copied, int64_t terms) {
  Outputs outs;
  for (size_t i = 0; i < caches.size(); ++i) {
    const Tensor k = r.host(caches[i].k), v = r.host(caches[i].v);
    const std::string k_name = fmt::format("cache {} k", i), v_name = fmt::format("cache {} v", i);
    outs.push_back(k_copied ? exact(k_name, k) : output(k_name, k, r.act, terms));
    outs.push_back(v_copied ? exact(v_name, v) : output(v_name, v, r.act, terms));
    outs.push_back(exact(fmt::format("cache {} slot_pos", i), r.host(caches[i].slot_pos)));
  }
  return outs;
}

void kv_and_attention(Table& t) {
  // two sequences, one decode row and a three-row chunk whose ring wraps
  const std::vector<SeqRows> seqs = {SeqRows{0, 1, 5}, SeqRows{1, 3, 17}};
  for (int hd : {64, 256})
    t.add("kv_write", fmt::format("4x2x{} capacity 8", hd), kBf16, [=](OpRun& r) {
      const Tensor k = r.random(Shape{4, 2, hd}), v = r.random(Shape{4, 2, hd});
      std::vector<KvCacheView> caches = {zeroed_cache(r, 8, 2, hd), zeroed_cache(r, 8, 2, hd)};
      r.b.kv_write(KvWriteArgs{.k = r.up(k),
                               .v = r.up(v),
                               .positions = r.up_i32(r.ints(positions_of(seqs))),
                               .seqs = seqs,
                               .caches = caches});
      return cache_outputs(r, caches, true, true, 1);
    });
  // Gemma 4's global layer (keys as values, a value norm, proportional RoPE on 512-wide heads), its
  // sliding layer (the value norm in place) and Qwen 3.5's (queries read from a strided view, norm
  // offset 1, no value norm)
  struct Inputs {
    int hq, hkv, hd, n_pairs, pair_offset;
    bool k_as_v, v_norm, strided_q;
    float norm_offset;
  };
  for (const Inputs c :
       {Inputs{4, 1, 512, 64, 256, true, true, false, 0.0f}, Inputs{4, 2, 256, 128, 128, false, true, false, 0.0f},
        Inputs{4, 2, 128, 32, 32, false, false, true, 1.0f}})
    t.add("attention_inputs",
          fmt::format("4x{}x{} kv {}{}{}{}", c.hq, c.hd, c.hkv, c.k_as_v ? " k as v" : "", c.v_norm ? " v norm" : "",
                      c.strided_q ? " strided q" : ""),
          kBf16, [=](OpRun& r) {
            const int64_t tokens = 4;
            const Tensor q_wide = r.random(Shape{tokens * c.hq, 2 * c.hd}, 2.0f);
            const Tensor q_in = r.random(Shape{tokens * c.hq, c.hd}, 2.0f);
            const Tensor k = r.random(Shape{tokens, c.hkv, c.hd}, 2.0f), v = r.random(Shape{tokens, c.hkv, c.hd}, 2.0f);
            const Tensor q_norm = r.random(Shape{c.hd}), k_norm = r.random(Shape{c.hd});
            const Tensor pos = r.up_i32(r.ints(positions_of(seqs))), freqs = r.up_f32(r.floats(inv_freqs(c.n_pairs)));
            std::vector<KvCacheView> caches = {zeroed_cache(r, 8, c.hkv, c.hd), zeroed_cache(r, 8, c.hkv, c.hd)};
            Tensor q = r.alloc(Shape{tokens, c.hq, c.hd}), kd = r.up(k), vd = r.up(v);
            auto rope_args = [&](const Tensor& x, const Tensor& input, const Tensor& norm) {
              return RopeArgs{.x = x,
                              .positions = pos,
                              .inv_freq = freqs,
                              .pair_offset = c.pair_offset,
                              .normalize = true,
                              .input = input,
                              .norm_weight = r.up_f32(norm),
                              .norm_eps = 1e-6f,
                              .norm_offset = c.norm_offset};
            };
            r.b.attention_inputs(AttentionInputsArgs{
                .q = rope_args(q, c.strided_q ? r.up(q_wide).cols_view(0, c.hd) : r.up(q_in), q_norm),
                .k = rope_args(kd, Tensor(), k_norm),
                .v = vd,
                .v_input = c.v_norm ? (c.k_as_v ? kd : vd).reshape(Shape{tokens * c.hkv, c.hd}) : Tensor(),
                .v_norm_eps = 1e-6f,
                .kv = KvWriteArgs{.k = kd, .v = vd, .positions = pos, .seqs = seqs, .caches = caches}});
            Outputs outs{output("q", r.host(q), r.act, c.hd)};
            for (OpOutput& o : cache_outputs(r, caches, false, !c.v_norm, c.hd)) outs.push_back(std::move(o));
            return outs;
          });

  // Chunked prefill then decode through ring caches, two sequences a call (45 and 19 tokens): the
  // outputs of every call, laid end to end.
  struct Attn {
    int hq, hkv, hd;
    int64_t window, chunk;
    bool gated;
  };
  std::vector<Attn> cases;
  for (int hd : {32, 64, 128, 256, 512})
    for (int64_t window : {0, 9}) cases.push_back({8, 2, hd, window, 7, false});
  cases.insert(cases.end(), {{6, 1, 128, 0, 13, false},  // a group that does not divide the tile
                             {16, 16, 64, 0, 5, false},  // no grouping
                             {16, 1, 512, 0, 3, false},  // Gemma 4's global layers: 16 heads on one
                             {16, 1, 512, 9, 5, false},  // KV head, spread over blocks
                             {8, 2, 128, 0, 7, true},    // with an output gate, as Qwen 3.5's
                             {8, 2, 256, 0, 7, true}});
  for (const Attn c : cases)
    t.add(
        "attention",
        fmt::format("{}x{} kv {} window {} chunk {}{}", c.hq, c.hd, c.hkv, c.window, c.chunk, c.gated ? " gated" : ""),
        kBf16, [=](OpRun& r) {
          const std::vector<int64_t> lengths = {45, 19};
          const int64_t capacity = c.window ? c.window - 1 + c.chunk : 64;
          std::vector<KvCacheView> all = {zeroed_cache(r, capacity, c.hkv, c.hd),
                                          zeroed_cache(r, capacity, c.hkv, c.hd)};
          std::vector<Tensor> outs;
          for (int64_t begin = 0; begin < 45;) {
            const int64_t step = begin < 30 ? c.chunk : 1;  // prefill in chunks, then decode
            std::vector<SeqRows> seqs;
            std::vector<KvCacheView> caches;
            int64_t rows = 0;
            for (size_t s = 0; s < lengths.size(); ++s) {
              const int64_t n = std::min(step, lengths[s] - begin);
              if (n <= 0) continue;
              seqs.push_back(SeqRows{rows, n, begin});
              caches.push_back(all[s]);
              rows += n;
            }
            const Tensor q = r.random(Shape{rows, c.hq, c.hd}), k = r.random(Shape{rows, c.hkv, c.hd}),
                         v = r.random(Shape{rows, c.hkv, c.hd}), gate = r.random(Shape{rows * c.hq, 2 * c.hd});
            // everything uploaded first, so that the attention runs right after the cache write
            const Tensor pos = r.up_i32(r.ints(positions_of(seqs))), qd = r.up(q), kd = r.up(k), vd = r.up(v);
            const Tensor gated = c.gated ? r.up(gate).cols_view(c.hd, c.hd) : Tensor();
            Tensor out = r.alloc(Shape{rows, c.hq, c.hd});
            r.b.kv_write(KvWriteArgs{.k = kd, .v = vd, .positions = pos, .seqs = seqs, .caches = caches});
            r.b.attention(AttentionArgs{.q = qd,
                                        .out = out,
                                        .positions = pos,
                                        .seqs = seqs,
                                        .caches = caches,
                                        .n_heads = c.hq,
                                        .n_kv_heads = c.hkv,
                                        .head_dim = c.hd,
                                        .scale = 0.125f,
                                        .window = c.window,
                                        .output_gate = gated});
            outs.push_back(r.host(out));
            begin += step;
          }
          return Outputs{output("out", concat(outs), r.act, std::max<int64_t>(c.hd, 45))};
        });
}

// ---- recurrent: causal conv, gated delta ----

void recurrent(Table& t) {
  // every kernel size the decode kernel's window registers hold, channels that are no multiple of a
  // block, sequences of 1 to 4 tokens; then sequences longer than one run of tokens (the
  // token-parallel kernel), short ones beside them
  struct Conv {
    int64_t channels;
    std::vector<int64_t> lengths;
    int kernel, calls;
    bool silu;
  };
  std::vector<Conv> convs;
  for (int kernel : {2, 3, 4, 8}) convs.push_back({8192 + 33, {1, 4, 2}, kernel, 3, true});
  for (int kernel : {2, 4, 8}) convs.push_back({1024 + 33, {700, 1, 3, 129}, kernel, 2, true});
  convs.push_back({63, {5, 1}, 4, 2, false});
  for (const Conv& c : convs)
    for (DType dt : kFloatTypes) {
      const std::string lengths = joined(c.lengths, ",");
      t.add("causal_conv1d",
            fmt::format("{} channels kernel {} rows {} calls {}{}", c.channels, c.kernel, lengths, c.calls,
                        c.silu ? "" : " no silu"),
            dt, [=](OpRun& r) {
              std::vector<SeqRows> seqs;
              int64_t tokens = 0;
              for (int64_t n : c.lengths) {
                seqs.push_back(SeqRows{.row_begin = tokens, .n_rows = n});
                tokens += n;
              }
              const Tensor w = r.up_f32(r.random(Shape{c.channels, c.kernel}, 0.5f));
              std::vector<Tensor> states;
              for (size_t i = 0; i < seqs.size(); ++i)
                states.push_back(r.up(r.random(Shape{c.kernel - 1, c.channels})));
              std::vector<Tensor> outs, state_values;
              for (int call = 0; call < c.calls; ++call) {
                Tensor out = r.alloc(Shape{tokens, c.channels});
                r.b.causal_conv1d({.x = r.up(r.random(Shape{tokens, c.channels})),
                                   .weight = w,
                                   .out = out,
                                   .seqs = seqs,
                                   .states = states,
                                   .silu = c.silu});
                outs.push_back(r.host(out));
                for (const Tensor& s : states) state_values.push_back(r.host(s));
              }
              return Outputs{output("out", concat(outs), r.act, c.kernel), exact("states", concat(state_values))};
            });
    }

  struct Delta {
    int hk, hv, dk, dv;
    std::vector<int64_t> rows;  // tokens per sequence in each call
    int calls;
    DeltaRuleAlgorithm algorithm;
    bool output_norm;
  };
  constexpr auto recurrent = DeltaRuleAlgorithm::recurrent, chunked = DeltaRuleAlgorithm::chunked;
  const Delta deltas[] = {
      {16, 32, 128, 128, {1, 1, 1}, 2, recurrent, false},               // Qwen 3.5 4B's heads, several sequences
      {16, 32, 128, 128, {3, 1, 5}, 2, recurrent, false},               // several tokens per sequence
      {2, 4, 32, 36, {1, 2}, 3, recurrent, false},                      // a half-empty column slice, rows past k_dim
      {1, 3, 200, 12, {2}, 2, recurrent, false},                        // k_dim over 128
      {2, 4, 48, 30, {1, 3}, 2, recurrent, false},                      // v_dim no multiple of 4
      {1, 2, 16, 8, std::vector<int64_t>(70, 1), 2, recurrent, false},  // more sequences than a launch takes
      {16, 32, 128, 128, {1, 1, 1}, 2, recurrent, true},                // with the output norm
      {2, 4, 48, 30, {1, 3}, 2, recurrent, true},
      {16, 32, 128, 128, {200}, 1, chunked, false},    // a prompt
      {16, 48, 128, 128, {70, 1}, 1, chunked, false},  // three value heads per key head
      {1, 3, 200, 36, {100, 1}, 2, chunked, false},    // k_dim padded to 16, a part-filled slice
      {2, 4, 36, 20, {100, 3}, 2, chunked, false},     // q and k rows not in 16-byte pieces
      {16, 32, 128, 128, {70, 1}, 1, chunked, true},   // with the output norm
  };
  for (const Delta& c : deltas) {
    std::string rows =
        joined(std::vector<int64_t>(c.rows.begin(), c.rows.begin() + std::min<size_t>(c.rows.size(), 3)), ",");
    if (c.rows.size() > 3) rows += fmt::format(" ({} sequences)", c.rows.size());
    t.add("gated_delta",
          fmt::format("{} heads {}/{} {}x{} rows {} calls {}{}", c.algorithm == recurrent ? "recurrent" : "chunked",
                      c.hk, c.hv, c.dk, c.dv, rows, c.calls, c.output_norm ? " normed" : ""),
          kBf16, [=](OpRun& r) {
            std::vector<SeqRows> seqs;
            int64_t tokens = 0;
            for (int64_t n : c.rows) {
              seqs.push_back(SeqRows{.row_begin = tokens, .n_rows = n});
              tokens += n;
            }
            // decays e^g from about 0.97 down to about 0.2 across the heads
            std::vector<float> a_log, dt;
            for (int h = 0; h < c.hv; ++h) {
              a_log.push_back(-3.0f + 2.5f * float(h) / float(std::max(c.hv - 1, 1)));
              dt.push_back(0.5f - 0.05f * float(h % 8));
            }
            const Tensor a_log_d = r.up_f32(r.floats(a_log)), dt_d = r.up_f32(r.floats(dt));
            std::vector<Tensor> states;
            for (size_t i = 0; i < seqs.size(); ++i)
              states.push_back(r.up_f32(r.random(Shape{c.hv, c.dk, c.dv}, 0.5f)));
            const int64_t width = 2 * int64_t(c.hk) * c.dk + int64_t(c.hv) * c.dv, out_width = int64_t(c.hv) * c.dv;
            std::vector<Tensor> outs;
            for (int call = 0; call < c.calls; ++call) {
              const Tensor qkv = r.random(Shape{tokens, width}), a = r.random(Shape{tokens, c.hv}),
                           b = r.random(Shape{tokens, c.hv});
              const Tensor z = r.random(Shape{tokens, out_width}), norm = r.random(Shape{c.dv});
              Tensor out = r.alloc(Shape{tokens, out_width});
              GatedDeltaArgs args{.qkv = r.up(qkv),
                                  .a = r.up(a),
                                  .b = r.up(b),
                                  .a_log = a_log_d,
                                  .dt_bias = dt_d,
                                  .out = out,
                                  .seqs = seqs,
                                  .states = states,
                                  .n_k_heads = c.hk,
                                  .n_v_heads = c.hv,
                                  .k_dim = c.dk,
                                  .v_dim = c.dv,
                                  .algorithm = c.algorithm};
              if (c.output_norm) args.norm_z = r.up(z), args.norm_weight = r.up_f32(norm), args.norm_eps = 1e-6f;
              r.b.gated_delta(args);
              outs.push_back(r.host(out));
            }
            std::vector<Tensor> state_values;
            for (const Tensor& s : states) state_values.push_back(r.host(s));
            int64_t longest = 0;
            for (int64_t n : c.rows) longest = std::max(longest, n);
            const int64_t terms = int64_t(c.dk) * longest * c.calls;
            return Outputs{output("out", concat(outs), r.act, terms),
                           output("states", concat(state_values), kF32, terms)};
          });
  }
}

// ---- mixture of experts ----

// Routing of `tokens` tokens to top_k of `routed` experts, every one of them used, with weights of
// a few sizes: the same for every run.
void route_evenly(OpRun& r, int64_t tokens, int top_k, int routed, Tensor& ids, Tensor& weights) {
  std::vector<int32_t> id;
  std::vector<float> w;
  for (int64_t i = 0; i < tokens * top_k; ++i) {
    id.push_back(int32_t((i * 7 + i / top_k) % routed));
    w.push_back(0.2f + 0.1f * float(i % 4));
  }
  ids = r.up_i32(r.ints(id)).reshape(Shape{tokens, top_k});
  weights = r.up_f32(r.floats(w)).reshape(Shape{tokens, top_k});
}

void moe(Table& t) {
  struct Route {
    int64_t tokens, experts;
    int top_k;
    bool renormalize, scaled;
  };
  for (const Route c : {Route{19, 10, 3, true, true}, Route{33, 64, 8, true, false}, Route{1, 128, 8, false, true},
                        Route{5, 6, 1, true, false}, Route{7, 512, 32, true, false}})
    for (DType dt : kFloatTypes)
      t.add("moe_route",
            fmt::format("{} of {} top {}{}{}", c.tokens, c.experts, c.top_k, c.renormalize ? "" : " unnormalized",
                        c.scaled ? " scaled" : ""),
            dt, [=](OpRun& r) {
              const Tensor logits = r.random(Shape{c.tokens, c.experts}, 2.0f), scale = r.random(Shape{c.experts});
              Tensor ids = r.b.alloc(DType::i32, Shape{c.tokens, c.top_k});
              Tensor weights = r.b.alloc(DType::f32, Shape{c.tokens, c.top_k});
              r.b.moe_route({.logits = r.up(logits),
                             .expert_scale = c.scaled ? r.up_f32(scale) : Tensor(),
                             .ids = ids,
                             .weights = weights,
                             .top_k = c.top_k,
                             .renormalize = c.renormalize});
              return Outputs{exact("ids", r.host(ids)), output("weights", r.host(weights), kF32, c.experts)};
            });

  // inter 48: the down products and their weighted sum in one pass; 4200: the two-pass path;
  // 26B-A4B-like sizes at decode (the tensor-core kernels) and prefill (grouped by expert); sizes the
  // tensor-core kernels do not take
  struct Experts {
    int64_t hidden, inter, experts;
    int top_k;
    int64_t tokens;
  };
  for (const Experts c : {Experts{96, 48, 10, 3, 19}, Experts{96, 4200, 10, 3, 19}, Experts{1056, 96, 12, 10, 1},
                          Experts{1056, 96, 12, 10, 13}, Experts{1056, 96, 12, 10, 40}, Experts{100, 36, 6, 3, 5},
                          Experts{256, 128, 64, 2, 100}})
    for (Activation act : {Activation::silu, Activation::gelu_tanh})
      for (DType out_type : kFloatTypes)
        t.add("moe_experts",
              fmt::format("{} tokens hidden {} inter {} {} experts top {} {}", c.tokens, c.hidden, c.inter, c.experts,
                          c.top_k, act_name(act)),
              kBf16, out_type, [=](OpRun& r) {
                const Tensor gate = r.random(Shape{c.experts, c.inter, c.hidden}, 0.05f);
                const Tensor up = r.random(Shape{c.experts, c.inter, c.hidden}, 0.05f);
                const Tensor down = r.random(Shape{c.experts, c.hidden, c.inter}, 0.05f);
                const Tensor x = r.random(Shape{c.tokens, c.hidden});
                Tensor ids, weights;
                route_evenly(r, c.tokens, c.top_k, int(c.experts), ids, weights);
                Tensor out = r.alloc_out(Shape{c.tokens, c.hidden});
                r.b.moe_experts({.x = r.up(x),
                                 .ids = ids,
                                 .weights = weights,
                                 .gate = r.weight(gate),
                                 .up = r.weight(up),
                                 .down = r.weight(down),
                                 .out = out,
                                 .act = act});
                return Outputs{output("out", r.host(out), r.out, std::max(c.hidden, c.inter) * c.top_k)};
              });

  // quantized stacks, per pair (19 tokens) and grouped by expert (100), a dense down projection
  // beside packed gate and up; the emulation multiplies the weights as bf16, as the grouped GEMMs do
  for (int bits : {3, 4, 8})
    for (int64_t tokens : {19, 100})
      for (bool dense_down : {false, true}) {
        if (dense_down && bits != 8) continue;
        t.add("moe_experts",
              fmt::format("{} tokens hidden 128 inter 64 12 experts top 3 q{} g32{}", tokens, bits,
                          dense_down ? " dense down" : ""),
              kBf16, kF32, [=](OpRun& r) {
                const Tensor gate = r.quantized(Shape{12, 64, 128}, bits, 32),
                             up = r.quantized(Shape{12, 64, 128}, bits, 32);
                Tensor down = r.quantized(Shape{12, 128, 64}, bits, 32);
                if (dense_down) down = bf16_dequantized(down);
                const Tensor x = r.random(Shape{tokens, 128}, 0.5f);
                Tensor ids, weights;
                route_evenly(r, tokens, 3, 10, ids, weights);
                auto stack = [&](const Tensor& w) {
                  return r.emulating && w.quantized() ? r.up(bf16_dequantized(w)) : r.weight(w);
                };
                Tensor out = r.alloc_out(Shape{tokens, 128});
                r.b.moe_experts({.x = r.up(x),
                                 .ids = ids,
                                 .weights = weights,
                                 .gate = stack(gate),
                                 .up = stack(up),
                                 .down = stack(down),
                                 .out = out,
                                 .act = Activation::silu});
                return Outputs{output("out", r.host(out), r.out, 128 * 3)};
              });
      }
}

}  // namespace

std::vector<OpCase> op_table() {
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
    check.comparison = compare(got[i].value, want[i].value, emu[i].value, got[i].type, got[i].terms, got[i].exact);
    checks.push_back(std::move(check));
  }
  if (want.size() != got.size() || want.size() != emu.size())
    checks.push_back(OpCheck{.what = c.label() + ": the runs gave different numbers of outputs",
                             .comparison = Comparison{.shape_differs = true}});
  return checks;
}

}  // namespace kiln::test
