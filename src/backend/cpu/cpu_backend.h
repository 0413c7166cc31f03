// The CPU backend: f32 compute, multi-threaded; the reference implementation of every op.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>

#include "core/thread_pool.h"
#include "ops/backend.h"
#include "ops/op_profile.h"

namespace kiln {

class CpuBackend final : public Backend {
 public:
  // n_threads: worker threads for kiln's own kernels and for OpenBLAS (0: all cores).
  // emulate_bf16: compute in f32 but round weights, activations and caches to bf16 wherever the
  // CUDA backend stores bf16, so that a GPU result can be checked against the same roundings and a
  // model's sensitivity to bf16 can be measured without a GPU.
  explicit CpuBackend(int n_threads = 0, bool emulate_bf16 = false);

  Device device() const override { return Device::cpu; }
  std::string name() const override;
  DType activation_dtype() const override { return emulate_bf16_ ? DType::bf16 : DType::f32; }
  DType matrix_dtype() const override { return emulate_bf16_ ? DType::bf16 : DType::f32; }
  bool quantized_kv_caches() const override { return true; }
  int threads() const { return pool_.size(); }

  Tensor alloc(DType dtype, Shape shape) override;
  Tensor upload(const Tensor& host, DType dtype) override;
  Tensor upload_quantized(const Tensor& host) override { return host; }  // read in place
  Tensor to_host(const Tensor& t) override;
  void copy(const Tensor& src, Tensor& dst) override;
  void fill(Tensor& t, float value) override;
  void synchronize() override {}
  std::unique_ptr<Timer> timer() override;
  double copy_bandwidth() override;
  // There is nothing to record on the CPU: a graph runs its ops again.
  Result<std::unique_ptr<Graph>> capture(const std::function<Status()>& record) override;

  void matmul(const Tensor& x, const Tensor& w, Tensor& out) override;
  void embed(const Tensor& ids, const Tensor& table, float scale, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, float weight_offset, Tensor& out) override;
  void rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& weight, float eps, Tensor& out) override;
  void add(const Tensor& a, const Tensor& b, float scale, Tensor& out) override;
  void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out) override;
  void bias_act(const Tensor& x, const Tensor& bias, BiasActivation act, Tensor& out) override;
  void residual_norm(const ResidualNormArgs& args) override;
  void scale(const Tensor& x, float s, Tensor& out) override;
  void glu(const Tensor& gate, const Tensor& up, Activation act, Tensor& out) override;
  void sigmoid_mul(const Tensor& x, const Tensor& gate, Tensor& out) override;
  void add_sigmoid_gated(Tensor& acc, const Tensor& x, const Tensor& gate) override;
  void softcap(Tensor& x, float cap) override;
  void clamp(const Tensor& x, float lo, float hi, Tensor& out) override;
  void column_affine(const Tensor& x, float scale, const Tensor& shift, const Tensor& mul, Tensor& out) override;
  void gather_sum(const Tensor& ids, const Tensor& table, float scale, Tensor& out) override;
  void argmax(const Tensor& x, Tensor& out) override;
  void top_k(const Tensor& logits, const Tensor& temperatures, int k, Tensor& values, Tensor& ids) override;

  void rope(const RopeArgs& args) override;
  void kv_write(const KvWriteArgs& args) override;
  void attention(const AttentionArgs& args) override;
  void causal_conv1d(const CausalConvArgs& args) override;
  void gated_delta(const GatedDeltaArgs& args) override;
  void moe_route(const MoeRouteArgs& args) override;
  void moe_experts(const MoeExpertsArgs& args) override;

  ThreadPool& pool() { return pool_; }

  // Host time by op while profiling is on (the CPU's ops are synchronous).
  void set_profiling(bool on) override {
    profiling_ = on;
    if (on) profile_.clear();
  }
  std::string profile_report() override {
    std::string report = profile_.report();
    profile_.clear();
    return report;
  }

 private:
  // Adds its op's time to the profile when it goes out of scope, while profiling is on.
  class OpTimer {
   public:
    OpTimer(CpuBackend* backend, const char* op)
        : backend_(backend->profiling_ ? backend : nullptr), op_(op), start_(std::chrono::steady_clock::now()) {}
    ~OpTimer() {
      if (backend_)
        backend_->profile_.add(
            op_, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count());
    }
    OpTimer(const OpTimer&) = delete;
    OpTimer& operator=(const OpTimer&) = delete;

   private:
    CpuBackend* backend_;
    const char* op_;
    std::chrono::steady_clock::time_point start_;
  };

  // cpu_quant.cpp: the products and lookups of quantized weights
  void quantized_matmul(const Tensor& x, const Tensor& w, Tensor& out);
  void quantized_embed(const Tensor& ids, const Tensor& table, float scale, Tensor& out);

  // Under bf16 emulation: rounds t to bf16 if it lives in memory allocated as bf16.
  void finish(const Tensor& t);

  ThreadPool pool_;
  bool emulate_bf16_ = false;
  bool profiling_ = false;
  OpProfile profile_;
  // bf16 allocations (held as f32): start address -> end address
  std::shared_ptr<std::map<const char*, const char*>> bf16_regions_;
  std::shared_ptr<std::mutex> regions_mutex_;
};

// Row access helpers shared by the CPU kernels (all CPU tensors of floats are f32).
inline float* row_ptr(const Tensor& t, int64_t r) {
  return t.data_as<float>() + r * t.row_stride();
}

}  // namespace kiln
