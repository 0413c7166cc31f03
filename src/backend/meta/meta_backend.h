// The meta backend: tensors with a shape and a type but no data (Device::meta). A model loaded on
// it runs every check of its loader (names, shapes, dtypes, quantization) without copying a
// weight, which is how a checkpoint is checked before work that would read all of it. It computes
// nothing: the ops are never called on a model built only to be checked.
#pragma once

#include "ops/backend.h"

namespace kiln {

// A backend whose tensors live on Device::meta and whose ops compute nothing: the base of the meta
// backend below and of the planning backend (plan_backend.h), which differ in what a tensor holds.
class InertBackend : public Backend {
 public:
  Device device() const override { return Device::meta; }
  Result<std::unique_ptr<Graph>> capture(const std::function<Status()>& record) override {
    return make_error("the {} backend runs nothing", name());
  }

  void copy(const Tensor& src, Tensor& dst) override {}
  void fill(Tensor& t, float value) override {}
  void synchronize() override {}
  std::unique_ptr<Timer> timer() override { return nullptr; }
  double copy_bandwidth() override { return 0.0; }

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
};

class MetaBackend final : public InertBackend {
 public:
  std::string name() const override { return "meta"; }
  DType activation_dtype() const override { return DType::f32; }
  DType matrix_dtype() const override { return DType::f32; }

  Tensor alloc(DType dtype, Shape shape) override { return Tensor(dtype, shape, nullptr, nullptr, Device::meta); }
  Tensor upload(const Tensor& host, DType dtype) override { return alloc(dtype, host.shape()); }
  Tensor upload_quantized(const Tensor& host) override { return alloc(host.dtype(), host.shape()); }
  Tensor to_host(const Tensor& t) override { return t; }
};

}  // namespace kiln
