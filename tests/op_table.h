// The backend op table: every op of the op interface (src/ops/backend.h) on random inputs of many
// shapes, odd sizes included, and the dtypes a backend keeps them in; each case runs on the CPU in
// f32 (the reference), on the CPU emulating bf16 (what rounding costs) and on the backend under
// test, and every output is held to the rule of op_tolerance.h. test_gpu_ops.cpp runs the table on
// the CUDA backend; test_op_table.cpp runs it on the emulating CPU backend, which checks the table
// itself without a GPU.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "op_tolerance.h"
#include "ops/backend.h"

namespace kiln::test {

// One run of a case: the backend, the types it keeps the case's tensors in, and the case's inputs,
// drawn afresh from the case's seed by each run in the same order, so that every run sees the same.
class OpRun {
 public:
  // bf16_inputs: the case keeps bf16 (every run of it draws the same rounded inputs)
  OpRun(Backend& backend, DType act, DType out, bool emulating, uint32_t seed, bool bf16_inputs)
      : b(backend), act(act), out(out), emulating(emulating), rng_(seed), bf16_inputs_(bf16_inputs) {}

  Backend& b;
  const DType act;       // activations, caches and dense weights
  const DType out;       // the outputs of products and of the routed experts, which may be f32 in a bf16 case
  const bool emulating;  // the bf16 emulation run: a case applies its kernels' other roundings on the host

  // Host inputs. Floats are normal(0, std), rounded to bf16 when the case keeps bf16: the reference
  // then computes on the values the device holds.
  Tensor random(Shape shape, float std = 1.0f);
  Tensor quantized(Shape shape, int bits, int group);  // an MLX affine matrix (stack), bf16 scales
  Tensor ints(std::vector<int32_t> values);            // i32 [n]
  Tensor floats(std::vector<float> values);            // f32 [n], as given
  std::mt19937& rng() { return rng_; }

  // Device tensors.
  Tensor up(const Tensor& host) const { return b.upload(host, act); }
  Tensor up_f32(const Tensor& host) const { return b.upload(host, DType::f32); }
  Tensor up_i32(const Tensor& host) const { return b.upload(host, DType::i32); }
  Tensor weight(const Tensor& host) const { return host.quantized() ? b.upload_quantized(host) : up(host); }
  Tensor alloc(Shape shape) const { return b.alloc(act, shape); }
  Tensor alloc_out(Shape shape) const { return b.alloc(out, shape); }
  Tensor host(const Tensor& t) const { return b.to_host(t); }

 private:
  std::mt19937 rng_;
  bool bf16_inputs_;
};

// One output of a case, on the host (f32, or i32 for ids and positions).
struct OpOutput {
  std::string name;
  Tensor value;
  DType type = DType::f32;  // what the backend stores it in
  int64_t terms = 1;        // the length of the longest f32 sum behind an element
  bool exact = false;       // ids, positions and copied values: equal to the reference
  double factor = kFactor;  // the multiple of the emulation's error the device may make
};

struct OpCase {
  std::string op;     // the Backend method
  std::string shape;  // sizes and variant, for messages
  DType act = DType::bf16;
  DType out = DType::bf16;
  std::function<std::vector<OpOutput>(OpRun&)> run;

  std::string label() const;  // "op shape act[→out]"
  std::string name() const;   // the label as a test name
};

// How GoogleTest prints a case: its label.
inline void PrintTo(const OpCase& c, std::ostream* os) {
  *os << c.label();
}

// Every case, in op order.
std::vector<OpCase> op_table();

struct OpCheck {
  std::string what;  // label and output
  Comparison comparison;
  bool exact = false;
  DType type = DType::f32;
};

// Runs a case on the reference, the emulation and `device`, and compares each output.
std::vector<OpCheck> run_op_case(const OpCase& c, Backend& device, int cpu_threads = 2);

}  // namespace kiln::test
