// The set-up the GPU test suites share: a CUDA backend per test (skipped, visibly, without a GPU),
// a CPU reference backend, bf16-exact random inputs and the measures of a difference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"

namespace kiln::test {

class GpuTest : public testing::Test {
 public:
  // max |a - b| / max |b|, infinite when a holds a NaN
  static double rel(const Tensor& a, const Tensor& b) {
    double diff = 0, scale = 1e-30;
    for (int64_t i = 0; i < b.numel(); ++i) {
      const double x = a.data_as<float>()[i], y = b.data_as<float>()[i];
      if (std::isnan(x)) return INFINITY;
      diff = std::max(diff, std::fabs(x - y));
      scale = std::max(scale, std::fabs(y));
    }
    return diff / scale;
  }

  // The worst of |got - want| beyond half a bf16 ulp of want (2^-8 |want|: the rounding of a bf16
  // output), over max |want|; what remains is the difference of the f32 arithmetic. Infinite on NaN.
  static double bf16_excess(const Tensor& got, const Tensor& want) {
    double scale = 1e-30, excess = 0;
    for (int64_t i = 0; i < want.numel(); ++i) scale = std::max(scale, double(std::fabs(want.data_as<float>()[i])));
    for (int64_t i = 0; i < want.numel(); ++i) {
      const double g = got.data_as<float>()[i], w = want.data_as<float>()[i];
      if (std::isnan(g)) return INFINITY;
      excess = std::max(excess, std::fabs(g - w) - std::ldexp(std::fabs(w), -8));
    }
    return excess / scale;
  }

 protected:
  explicit GpuTest(unsigned seed) : rng(seed) {}

  void SetUp() override {
    if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
    auto made = make_cuda_backend(0);
    ASSERT_TRUE(made.ok()) << made.error().message;
    gpu = std::move(made).value();
  }
  void TearDown() override {
    if (gpu) {
      EXPECT_TRUE(gpu->status().ok()) << gpu->status().error().message;
    }
  }

  // A random host f32 tensor whose values are exactly representable in bf16, so that only the
  // products' rounding differs between the backends.
  Tensor random(Shape shape, float std = 1.0f) {
    Tensor t = host_tensor(DType::f32, shape);
    std::normal_distribution<float> dist(0.0f, std);
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = bf16_to_f32(f32_to_bf16(dist(rng)));
    return t;
  }

  Tensor to_gpu(const Tensor& host, DType dtype = DType::bf16) { return gpu->upload(host, dtype); }
  Tensor from_gpu(const Tensor& device) { return gpu->to_host(device); }

  std::unique_ptr<Backend> gpu;
  CpuBackend cpu{4};
  std::mt19937 rng;
};

}  // namespace kiln::test
