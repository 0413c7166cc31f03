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

#include "ops/backend.h"

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

class PlanBackend final : public Backend {
 public:
  explicit PlanBackend(PlanTarget target);

  size_t live_memory_bytes() const override { return counter_->live; }
  size_t peak_memory_bytes() const override { return counter_->peak; }
  void reset_peak_memory() override { counter_->peak = size_t(counter_->live); }

  Device device() const override { return Device::meta; }
  std::string name() const override { return "plan for " + target_.name; }
  DType activation_dtype() const override { return target_.activation_dtype; }
  DType matrix_dtype() const override { return target_.matrix_dtype; }
  bool quantized_kv_caches() const override { return target_.quantized_kv_caches; }

  Tensor alloc(DType dtype, Shape shape) override;
  Tensor upload(const Tensor& host, DType dtype) override;
  Tensor upload_quantized(const Tensor& host) override;
  Tensor to_host(const Tensor& t) override;
  void copy(const Tensor& src, Tensor& dst) override {}
  void fill(Tensor& t, float value) override {}
  void synchronize() override {}
  std::unique_ptr<Timer> timer() override { return nullptr; }
  double copy_bandwidth() override { return 0.0; }
  Result<std::unique_ptr<Graph>> capture(const std::function<Status()>& record) override {
    return make_error("the planning backend runs nothing");
  }

  void matmul(const Tensor& x, const Tensor& w, Tensor& out) override {}
  void embed(const Tensor& ids, const Tensor& table, float scale, Tensor& out) override {}
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, float weight_offset, Tensor& out) override {}
  void rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& weight, float eps, Tensor& out) override {}
  void add(const Tensor& a, const Tensor& b, float scale, Tensor& out) override {}
  void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out) override {}
  void bias_act(const Tensor& x, const Tensor& bias, BiasActivation act, Tensor& out) override {}
  void residual_norm(const ResidualNormArgs& args) override {}
  void scale(const Tensor& x, float s, Tensor& out) override {}
  void glu(const Tensor& gate, const Tensor& up, Activation act, Tensor& out) override {}
  void sigmoid_mul(const Tensor& x, const Tensor& gate, Tensor& out) override {}
  void add_sigmoid_gated(Tensor& acc, const Tensor& x, const Tensor& gate) override {}
  void softcap(Tensor& x, float cap) override {}
  void clamp(const Tensor& x, float lo, float hi, Tensor& out) override {}
  void column_affine(const Tensor& x, float scale, const Tensor& shift, const Tensor& mul, Tensor& out) override {}
  void gather_sum(const Tensor& ids, const Tensor& table, float scale, Tensor& out) override {}
  void argmax(const Tensor& x, Tensor& out) override {}
  void top_k(const Tensor& logits, const Tensor& temperatures, int k, Tensor& values, Tensor& ids) override {}
  void rope(const RopeArgs& args) override {}
  void kv_write(const KvWriteArgs& args) override {}
  void attention(const AttentionArgs& args) override {}
  void causal_conv1d(const CausalConvArgs& args) override {}
  void gated_delta(const GatedDeltaArgs& args) override {}
  void moe_route(const MoeRouteArgs& args) override {}
  void moe_experts(const MoeExpertsArgs& args) override {}

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
