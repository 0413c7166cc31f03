// The planning backend: a model loads and runs on it as it would on a real device, but nothing is
// stored or computed. It counts the bytes the target device would hold (weights as that backend
// keeps them, caches, the activations of a forward) live and at their peak, which is how
// `kiln fit` plans memory before anything is allocated. Tensors carry distinct addresses that
// point at nothing; ops do nothing, and to_host hands back zeros.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "backend/meta/meta_backend.h"

namespace kiln {

// What the planned-for backend keeps tensors as.
struct PlanTarget {
  std::string name;                     // "cuda" or "cpu"
  DType activation_dtype = DType::f32;  // activations and caches
  DType matrix_dtype = DType::f32;      // uploaded weights
  // a quantized matrix's scales and biases; unset: as the checkpoint stores them
  std::optional<DType> quant_scale_dtype;
  bool quantized_kv_caches = false;
};

// The targets of the two real backends.
PlanTarget cuda_plan_target();
PlanTarget cpu_plan_target();

class PlanBackend final : public InertBackend {
 public:
  explicit PlanBackend(PlanTarget target);

  size_t live_memory_bytes() const override { return counter_->live; }
  size_t peak_memory_bytes() const override { return counter_->peak; }
  void reset_peak_memory() override { counter_->peak = size_t(counter_->live); }

  std::string name() const override { return "plan for " + target_.name; }
  DType activation_dtype() const override { return target_.activation_dtype; }
  DType matrix_dtype() const override { return target_.matrix_dtype; }
  bool quantized_kv_caches() const override { return target_.quantized_kv_caches; }

  Tensor alloc(DType dtype, Shape shape) override;
  Tensor upload(const Tensor& host, DType dtype) override;
  Tensor upload_quantized(const Tensor& host) override;
  Tensor to_host(const Tensor& t) override;

 private:
  struct Counter {
    std::atomic<size_t> live{0};
    std::atomic<size_t> peak{0};
    std::atomic<uintptr_t> next_address{uintptr_t(1) << 44};  // far from any real mapping
  };
  // A tensor that stands for `bytes` of device memory until its last copy goes.
  Tensor counted(DType dtype, Shape shape, size_t bytes);

  PlanTarget target_;
  std::shared_ptr<Counter> counter_ = std::make_shared<Counter>();
};

}  // namespace kiln
