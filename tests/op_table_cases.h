// What the op table's rows (op_table.cpp, op_table_products.cpp, op_table_sequence.cpp) share: the
// table being filled, how outputs are named, and the inputs and emulated roundings of the products.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "op_table.h"
#include "quant_test_util.h"

namespace kiln::test::op_cases {

using Outputs = std::vector<OpOutput>;

// "a,b,c" of the numbers, joined by `sep`
template <typename Range>
inline std::string joined(const Range& numbers, const char* sep) {
  std::string s;
  for (auto n : numbers) {
    if (!s.empty()) s += sep;
    s += std::to_string(n);
  }
  return s;
}

inline std::string dims(std::initializer_list<int64_t> sizes) {
  return joined(sizes, "x");
}

// Host tensors laid end to end, as one flat tensor (f32 or i32).
inline Tensor concat(const std::vector<Tensor>& parts) {
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
inline Tensor int16_chunks(const Tensor& x) {
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

inline bool integer_inputs(int bits) {
  return bits == 2 || bits == 4 || bits == 8;
}

// A quantized matrix's values rounded to bf16: what the products of more than 32 rows (blocks of
// rows dequantized for cuBLAS) and the grouped experts multiply.
inline Tensor bf16_dequantized(const Tensor& q) {
  Tensor d = dequantized(q);
  for (int64_t i = 0; i < d.numel(); ++i) d.data_as<float>()[i] = bf16_to_f32(f32_to_bf16(d.data_as<float>()[i]));
  return d;
}

// The input of a quantized product of m rows, as the device's kernels read it (in the emulation).
inline Tensor product_input(OpRun& r, const Tensor& x, int bits) {
  if (r.emulating && integer_inputs(bits) && x.rows() <= 32) return r.b.upload(int16_chunks(x), DType::f32);
  return r.up(x);
}
// A product's weight; in the emulation of more than 32 rows a quantized one dequantized to bf16.
inline Tensor product_weight(OpRun& r, const Tensor& w, int64_t m) {
  if (r.emulating && w.quantized() && m > 32) return r.up(bf16_dequantized(w));
  return r.weight(w);
}

inline OpOutput output(std::string name, const Tensor& value, DType type, int64_t terms = 1) {
  return OpOutput{.name = std::move(name), .value = value, .type = type, .terms = terms};
}
// A quantized product's output: integer products are held to kIntegerProductFactor (op_tolerance.h).
inline OpOutput product_output(std::string name, const Tensor& value, DType type, int64_t terms, int bits,
                               int64_t rows) {
  OpOutput o = output(std::move(name), value, type, terms);
  if (integer_inputs(bits) && rows <= 32) o.factor = kIntegerProductFactor;
  return o;
}
inline OpOutput exact(std::string name, const Tensor& value) {
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

inline const char* act_name(Activation act) {
  return act == Activation::silu ? "silu" : "gelu_tanh";
}
inline const char* bias_act_name(BiasActivation act) {
  return act == BiasActivation::none ? "none" : act == BiasActivation::gelu_tanh ? "gelu_tanh" : "gelu_erf";
}

// The residual update's arguments on one run's backend; `more`: a second next norm.
struct ResidualInputs {
  Tensor residual, block_out;
  ResidualNormArgs args;
};
inline ResidualInputs residual_inputs(OpRun& r, int64_t rows, int64_t cols, bool block_norm, bool next, bool more) {
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

inline Outputs residual_outputs(OpRun& r, const ResidualNormArgs& a, int64_t terms) {
  Outputs outs{output("residual", r.host(a.residual), r.act, terms)};
  if (a.next.defined()) outs.push_back(output("next", r.host(a.next), r.act, terms));
  if (a.more_next[0].defined()) outs.push_back(output("more_next", r.host(a.more_next[0]), r.act, terms));
  return outs;
}

// The rows of each concern.
void elementwise(Table& t);
void selection(Table& t);
void norms(Table& t);
void residual(Table& t);
void dense_products(Table& t);
void quantized_products(Table& t);
void rope(Table& t);
void kv_and_attention(Table& t);
void recurrent(Table& t);
void moe(Table& t);

}  // namespace kiln::test::op_cases
