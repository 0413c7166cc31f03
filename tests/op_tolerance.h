// The tolerance rule of the backend op table (op_table.h), after FlashAttention 3's tests: a
// device's result may be as far from the f32 reference as a naive bf16 implementation is, times a
// small factor, plus a floor for what any implementation of the output's type must round.
//
//   ref   the CPU backend in f32, on the inputs the device holds (bf16 cases: inputs rounded to bf16)
//   emu   the CPU backend emulating bf16 (CpuBackend(n, true)) on the same inputs: every tensor the
//         CUDA backend keeps in bf16 (outputs, caches, the intermediates its kernels store) rounded
//         to bf16, and the few other roundings a kernel makes applied by the case (the int16 inputs
//         of the integer products, the bf16 weights of quantized products of more than 32 rows and
//         of the grouped experts)
//   tol = kFactor · max |emu − ref|                       what the device's storage costs
//       + ulp(output type, max |ref|) / 2                 its own rounding, so exact ops are not held to 0
//       + kSumUlps · 2^-24 · √terms · max |ref|           f32 sums of `terms` terms in another order
//
// A device result passes when max |got − ref| ≤ tol and it holds no NaN or infinity where the
// reference is finite. Exact outputs (ids, positions, copied values) must equal the reference.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "core/tensor.h"

namespace kiln::test {

constexpr double kFactor = 2.0;
// The integer products (2, 4 and 8 bits, up to 32 rows): the emulation puts their inputs on the
// device's int16 grid but sums the scaled chunks in another order; on an H100 the device's error
// reached 4.8 times the emulation's (matmul_many, one row, 2 and 8 bits), 1.05 times the rule at 2.
constexpr double kIntegerProductFactor = 3.0;
constexpr double kSumUlps = 32.0;

// A unit in the last place of `type` at `magnitude` (0 at 0).
inline double ulp(DType type, double magnitude) {
  if (!(magnitude > 0) || !std::isfinite(magnitude)) return 0.0;
  const int mantissa_bits = type == DType::bf16 ? 7 : type == DType::f16 ? 10 : 23;
  return std::ldexp(1.0, std::ilogb(magnitude) - mantissa_bits);
}

// Element i of a host tensor of floats (f32) or integers (i32), as a double.
inline double element(const Tensor& t, int64_t i) {
  const int64_t r = i / std::max<int64_t>(t.cols(), 1), c = i % std::max<int64_t>(t.cols(), 1);
  const int64_t at = r * t.row_stride() + c;
  return t.dtype() == DType::i32 ? double(t.data_as<int32_t>()[at]) : double(t.data_as<float>()[at]);
}

struct Comparison {
  int64_t count = 0;
  double max_ref = 0;    // max |ref|
  double emu_error = 0;  // max |emu − ref|
  double floor = 0;      // the last two terms of the rule
  double tolerance = 0;  // 0 for exact outputs
  double factor = kFactor;
  double max_error = 0;  // max |got − ref|
  int64_t worst = -1;    // where max_error is, or the first non-finite value
  double got_at_worst = 0, ref_at_worst = 0;
  bool non_finite = false;  // got holds NaN or infinity where ref is finite
  bool shape_differs = false;
  bool exact = false;  // held to equality
  bool passed() const { return !shape_differs && !non_finite && max_error <= tolerance; }
};

// got, ref and emu: host tensors of one shape (f32 or i32). out_type: what the device stores the
// output in; terms: the length of the longest f32 sum behind an element (1 for elementwise ops).
inline Comparison compare(const Tensor& got, const Tensor& ref, const Tensor& emu, DType out_type, int64_t terms,
                          bool exact, double factor = kFactor) {
  Comparison c;
  c.count = ref.numel();
  c.exact = exact;
  if (got.numel() != ref.numel() || emu.numel() != ref.numel()) {
    c.shape_differs = true;
    return c;
  }
  for (int64_t i = 0; i < c.count; ++i) {
    const double r = element(ref, i);
    if (std::isfinite(r)) c.max_ref = std::max(c.max_ref, std::fabs(r));
    const double e = element(emu, i);
    if (std::isfinite(r) && std::isfinite(e)) c.emu_error = std::max(c.emu_error, std::fabs(e - r));
  }
  if (!exact) {
    c.floor = ulp(out_type, c.max_ref) / 2 +
              kSumUlps * std::ldexp(std::sqrt(double(std::max<int64_t>(terms, 1))), -24) * c.max_ref;
    c.factor = factor;
    c.tolerance = factor * c.emu_error + c.floor;
  }
  for (int64_t i = 0; i < c.count; ++i) {
    const double g = element(got, i), r = element(ref, i);
    if (!std::isfinite(r)) {  // a reference's own -inf or NaN (masked values): the device must agree
      if (std::isnan(r) != std::isnan(g) || (!std::isnan(r) && g != r)) {
        c.non_finite = true, c.worst = i, c.got_at_worst = g, c.ref_at_worst = r;
        return c;
      }
      continue;
    }
    if (!std::isfinite(g)) {
      c.non_finite = true, c.worst = i, c.got_at_worst = g, c.ref_at_worst = r;
      return c;
    }
    const double d = std::fabs(g - r);
    if (d > c.max_error || c.worst < 0)
      c.max_error = std::max(c.max_error, d), c.worst = i, c.got_at_worst = g, c.ref_at_worst = r;
  }
  return c;
}

// One line naming what was compared and how it failed or passed.
inline std::string describe(const std::string& what, const Comparison& c) {
  if (c.shape_differs) return fmt::format("{}: the outputs' sizes differ", what);
  if (c.non_finite)
    return fmt::format("{}: element {} is {} where the reference holds {}", what, c.worst, c.got_at_worst,
                       c.ref_at_worst);
  if (c.exact)
    return fmt::format("{}: must equal the reference; element {} is {} where the reference holds {} ({} elements)",
                       what, c.worst, c.got_at_worst, c.ref_at_worst, c.count);
  return fmt::format(
      "{}: max |got - ref| {:.4g} at element {} (got {:.6g}, ref {:.6g}), tolerance {:.4g} = {} x {:.4g} "
      "(bf16 emulation) + {:.4g} (floor), max |ref| {:.4g}, {} elements",
      what, c.max_error, c.worst, c.got_at_worst, c.ref_at_worst, c.tolerance, c.factor, c.emu_error, c.floor, c.max_ref,
      c.count);
}

}  // namespace kiln::test
