// The quantized decode GEMV of src/backend/cuda/cuda_quant.cu on its own: a check against a double
// reference (every width, a few shapes, batch invariance) and the bandwidth of decode-sized products.
//   nvcc -O3 -std=c++20 -arch=sm_90a --expt-relaxed-constexpr -I src dev/kernels/qgemv_bench.cu \
//     src/core/tensor.cpp -o qgemv_bench && ./qgemv_bench
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/cuda_quant.cu"

using namespace kiln;
using cuda::bf16;

namespace {

std::mt19937 rng(7);

float bf16_round(float v) {
  return __bfloat162float(__float2bfloat16(v));
}

template <typename T>
T* to_device(const std::vector<T>& v) {
  T* p = nullptr;
  cudaMalloc(&p, v.size() * sizeof(T));
  cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  return p;
}

// A random quantized [n, k] matrix: host codes, scales and biases, and the device tensor.
struct QMatrix {
  int64_t n, k;
  int bits, group;
  std::vector<uint32_t> codes;  // one per element
  std::vector<float> scales, biases;
  Tensor device;

  QMatrix(int64_t n_, int64_t k_, int bits_, int group_) : n(n_), k(k_), bits(bits_), group(group_) {
    std::uniform_int_distribution<uint32_t> code(0, (1u << bits) - 1);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    codes.resize(n * k);
    for (auto& c : codes) c = code(rng);
    std::vector<uint32_t> packed(n * k * bits / 32, 0);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < k; ++i) {
        const int64_t bit = r * k * bits + i * bits;  // rows are whole words
        const uint64_t v = uint64_t(codes[r * k + i]) << (bit % 32);
        packed[bit / 32] |= uint32_t(v);
        if ((bit % 32) + bits > 32) packed[bit / 32 + 1] |= uint32_t(v >> 32);
      }
    std::vector<bf16> s(n * k / group), b(n * k / group);
    for (size_t i = 0; i < s.size(); ++i) {
      scales.push_back(bf16_round(normal(rng)));
      biases.push_back(bf16_round(normal(rng) * 4));
      s[i] = __float2bfloat16(scales.back());
      b[i] = __float2bfloat16(biases.back());
    }
    auto params = std::make_shared<QuantParams>();
    params->bits = bits;
    params->group_size = group;
    params->scales = Tensor(DType::bf16, Shape{n, k / group}, to_device(s), nullptr, Device::cuda);
    params->biases = Tensor(DType::bf16, Shape{n, k / group}, to_device(b), nullptr, Device::cuda);
    device = Tensor(DType::u32, Shape{n, k}, to_device(packed), nullptr, Device::cuda).with_quant(params);
  }
  double weight(int64_t r, int64_t i) const {
    const int64_t g = (r * k + i) / group;
    return double(scales[g]) * codes[r * k + i] + biases[g];
  }
};

struct Input {
  std::vector<float> host;
  Tensor device;
  Input(int64_t m, int64_t k) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<bf16> d(m * k);
    for (auto& v : d) {
      v = __float2bfloat16(normal(rng));
      host.push_back(__bfloat162float(v));
    }
    device = Tensor(DType::bf16, Shape{m, k}, to_device(d), nullptr, Device::cuda);
  }
};

Tensor output(int64_t m, int64_t n) {
  float* p = nullptr;
  cudaMalloc(&p, m * n * sizeof(float));
  return Tensor(DType::f32, Shape{m, n}, p, nullptr, Device::cuda);
}

std::vector<float> host(const Tensor& t) {
  std::vector<float> v(t.numel());
  cudaMemcpy(v.data(), t.data(), v.size() * sizeof(float), cudaMemcpyDeviceToHost);
  return v;
}

int failures = 0;

void check(const char* what, const std::vector<float>& got, const std::vector<double>& want) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::fabs(got[i] - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  const bool ok = diff / scale < 1e-4 && diff == diff;  // as tests/test_gpu_quant.cpp
  if (!ok) ++failures;
  std::printf("%-48s rel %.2e %s\n", what, diff / scale, ok ? "ok" : "FAIL");
}

void correctness() {
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int group : {32, 64, 128})
      for (int64_t n : {3, 37}) {
        const int64_t k = group * 25;  // chunks: 25, 50 or 100
        QMatrix w(n, k, bits, group), up(n, k, bits, group);
        for (int64_t m : {1, 3, 9, 32}) {
          Input x(m, k);
          std::vector<double> want(m * n), want_glu(m * n);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t r = 0; r < n; ++r) {
              double a = 0, u = 0;
              for (int64_t j = 0; j < k; ++j) {
                a += x.host[i * k + j] * w.weight(r, j);
                u += x.host[i * k + j] * up.weight(r, j);
              }
              want[i * n + r] = a;
              want_glu[i * n + r] = a / (1 + std::exp(-a)) * u;
            }
          Tensor out = output(m, n), glu = output(m, n);
          cuda::quantized_gemv(x.device, w.device, out, nullptr);
          cuda::quantized_glu_gemv(x.device, w.device, up.device, Activation::silu, glu, nullptr);
          char name[96];
          std::snprintf(name, sizeof name, "%d bits g%d %ldx%ldx%ld", bits, group, long(m), long(n), long(k));
          const std::vector<float> got = host(out);
          check(name, got, want);
          std::snprintf(name, sizeof name, "%d bits g%d %ldx%ldx%ld glu", bits, group, long(m), long(n), long(k));
          check(name, host(glu), want_glu);
          for (int64_t i = 0; i < m; ++i) {  // each row alone: the same bits
            Tensor one = output(1, n);
            cuda::quantized_gemv(x.device.rows_view(i, 1), w.device, one, nullptr);
            const std::vector<float> alone = host(one);
            if (std::memcmp(alone.data(), got.data() + i * n, n * sizeof(float)) != 0) {
              ++failures;
              std::printf("%s: row %ld differs alone\n", name, long(i));
            }
          }
        }
      }
}

template <typename F>
double time_us(F&& f) {
  for (int i = 0; i < 20; ++i) f();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  const int reps = 500;
  for (int i = 0; i < reps; ++i) f();
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  return ms * 1000.0 / reps;
}

void bench(int64_t n, int64_t k, int bits, int group, int64_t m, bool glu) {
  QMatrix w(n, k, bits, group), up(glu ? n : 1, k, bits, group);
  Input x(m, k);
  Tensor out = output(m, n);
  const double us = time_us([&] {
    if (glu)
      cuda::quantized_glu_gemv(x.device, w.device, up.device, Activation::silu, out, nullptr);
    else
      cuda::quantized_gemv(x.device, w.device, out, nullptr);
  });
  const double bytes = (glu ? 2 : 1) * (double(n) * k * bits / 8 + 2.0 * 2 * n * (k / group));
  std::printf("%5ldx%-5ld %d bits g%-3d m=%-2ld %s %7.2f us  %6.0f GB/s\n", long(n), long(k), bits, group, long(m),
              glu ? "glu " : "    ", us, bytes / us / 1e3);
}

}  // namespace

int main() {
  correctness();
  std::printf("%d failures\n", failures);
  for (int bits : {4, 8, 3}) bench(9216, 2560, bits, 64, 1, false);
  bench(2560, 9216, 4, 64, 1, false);
  bench(4096, 2560, 4, 64, 1, false);
  bench(1024, 2560, 4, 64, 1, false);
  bench(9216, 2560, 4, 64, 1, true);
  bench(65536, 2560, 4, 64, 1, false);  // a large product: the streaming ceiling
  for (int64_t m : {2, 4, 8, 32}) bench(9216, 2560, 4, 64, m, false);
  return failures != 0;
}
