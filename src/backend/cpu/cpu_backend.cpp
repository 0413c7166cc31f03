// CPU backend: memory, matrix products (OpenBLAS) and elementwise ops.
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_math.h"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

namespace kiln {

namespace {

int resolve_threads(int n) {
  if (n > 0) return n;
  unsigned hw = std::thread::hardware_concurrency();
  return hw ? int(hw) : 1;
}

// Rows per parallel task so that each task does at least ~16k element operations.
int64_t grain_for(int64_t cols) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols));
}

using cpu::gelu_erf;
using cpu::gelu_tanh;
using cpu::sigmoid;
using cpu::silu;

}  // namespace

CpuBackend::CpuBackend(int n_threads, bool emulate_bf16)
    : pool_(resolve_threads(n_threads)),
      emulate_bf16_(emulate_bf16),
      bf16_regions_(std::make_shared<std::map<const char*, const char*>>()),
      regions_mutex_(std::make_shared<std::mutex>()) {
  openblas_set_num_threads(pool_.size());
}

std::string CpuBackend::name() const {
  return fmt::format("cpu ({} threads{})", pool_.size(), emulate_bf16_ ? ", bf16 emulation" : "");
}

Tensor CpuBackend::alloc(DType dtype, Shape shape) {
  if (!emulate_bf16_ || dtype != DType::bf16) return host_tensor(dtype, shape);
  // held as f32; every op that writes it rounds to bf16
  Tensor t = host_tensor(DType::f32, shape);
  const char* begin = static_cast<const char*>(t.data());
  {
    std::lock_guard<std::mutex> lock(*regions_mutex_);
    (*bf16_regions_)[begin] = begin + t.nbytes();
  }
  auto regions = bf16_regions_;
  auto mutex = regions_mutex_;
  std::shared_ptr<void> storage = t.owner();
  std::shared_ptr<void> owner(t.data(), [regions, mutex, storage](void* p) mutable {
    std::lock_guard<std::mutex> lock(*mutex);
    regions->erase(static_cast<const char*>(p));
    storage.reset();
  });
  return Tensor(DType::f32, shape, t.data(), owner, Device::cpu);
}

void CpuBackend::finish(const Tensor& t) {
  if (!emulate_bf16_ || t.dtype() != DType::f32) return;
  const char* p = static_cast<const char*>(t.data());
  {
    std::lock_guard<std::mutex> lock(*regions_mutex_);
    auto it = bf16_regions_->upper_bound(p);
    if (it == bf16_regions_->begin()) return;
    --it;
    if (p >= it->second) return;
  }
  for (int64_t r = 0; r < t.rows(); ++r) {
    float* row = row_ptr(t, r);
    for (int64_t c = 0; c < t.cols(); ++c) row[c] = bf16_to_f32(f32_to_bf16(row[c]));
  }
}

Tensor CpuBackend::upload(const Tensor& host, DType dtype) {
  const bool is_float = host.dtype() == DType::f32 || host.dtype() == DType::bf16 || host.dtype() == DType::f16;
  if (!is_float) {  // integer data is copied as it is
    Tensor out = host_tensor(host.dtype(), host.shape());
    for (int64_t r = 0; r < host.rows(); ++r)
      std::memcpy(static_cast<char*>(out.data()) + size_t(r * host.cols()) * dtype_size(host.dtype()),
                  static_cast<const char*>(host.data()) + size_t(r * host.row_stride()) * dtype_size(host.dtype()),
                  size_t(host.cols()) * dtype_size(host.dtype()));
    return out;
  }
  // the CPU computes in f32; f32 weights that are contiguous and aligned are used in place,
  // straight from the mapping (unless emulation must round them to bf16)
  const bool round = emulate_bf16_ && dtype == DType::bf16;
  if (host.dtype() == DType::f32 && host.contiguous() && reinterpret_cast<uintptr_t>(host.data()) % 4 == 0 && !round)
    return host;
  Tensor out = alloc(round ? DType::bf16 : DType::f32, host.shape());
  convert_host(host, DType::f32, out.data());
  finish(out);
  return out;
}

Tensor CpuBackend::to_host(const Tensor& t) {
  if (t.dtype() != DType::f32 && t.dtype() != DType::bf16 && t.dtype() != DType::f16) return upload(t, t.dtype());
  Tensor out = host_tensor(DType::f32, t.shape());
  convert_host(t, DType::f32, out.data());
  return out;
}

void CpuBackend::copy(const Tensor& src, Tensor& dst) {
  assert(src.rows() == dst.rows() && src.cols() == dst.cols() && src.dtype() == dst.dtype());
  const size_t row_bytes = size_t(src.cols()) * dtype_size(src.dtype());
  for (int64_t r = 0; r < src.rows(); ++r)
    std::memcpy(static_cast<char*>(dst.data()) + size_t(r * dst.row_stride()) * dtype_size(dst.dtype()),
                static_cast<const char*>(src.data()) + size_t(r * src.row_stride()) * dtype_size(src.dtype()),
                row_bytes);
  finish(dst);
}

std::unique_ptr<Backend::Timer> CpuBackend::timer() {
  struct WallTimer : Timer {
    std::chrono::steady_clock::time_point t0;
    void start() override { t0 = std::chrono::steady_clock::now(); }
    double stop_ms() override {
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
  };
  return std::make_unique<WallTimer>();
}

double CpuBackend::copy_bandwidth() {
  const size_t bytes = size_t(256) << 20;
  std::vector<char> a(bytes, 1), b(bytes);
  std::vector<double> seconds;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    pool_.parallel_for(int64_t(bytes >> 20), [&](int64_t begin, int64_t end) {
      std::memcpy(b.data() + (begin << 20), a.data() + (begin << 20), size_t(end - begin) << 20);
    });
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return 2.0 * double(bytes) / seconds[seconds.size() / 2];
}

Result<std::unique_ptr<Backend::Graph>> CpuBackend::capture(const std::function<Status()>& record) {
  struct Rerun : Graph {
    std::function<Status()> record;
    Status replay() override { return record(); }
  };
  auto graph = std::make_unique<Rerun>();
  graph->record = record;
  return std::unique_ptr<Graph>(std::move(graph));
}

void CpuBackend::fill(Tensor& t, float value) {
  if (t.dtype() == DType::i32) {
    for (int64_t r = 0; r < t.rows(); ++r) {
      int32_t* p = t.data_as<int32_t>() + r * t.row_stride();
      std::fill(p, p + t.cols(), int32_t(value));
    }
    return;
  }
  assert(t.dtype() == DType::f32);
  for (int64_t r = 0; r < t.rows(); ++r) std::fill(row_ptr(t, r), row_ptr(t, r) + t.cols(), value);
}

void CpuBackend::matmul(const Tensor& x, const Tensor& w, Tensor& out) {
  OpTimer timed(this, w.quantized() ? "qmatmul" : "matmul");
  if (w.quantized()) return quantized_matmul(x, w, out);
  const int64_t m = x.rows(), k = x.cols(), n = w.numel() / k;
  // out is [m, n]: either its own last dim is n (row-strided allowed), or it is contiguous
  const int64_t ldc = out.cols() == n ? out.row_stride() : n;
  assert(w.cols() == k && w.contiguous() && out.numel() == m * n && (out.cols() == n || out.contiguous()));
  if (m == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(n), int(k), 1.0f, x.data_as<float>(),
              int(x.row_stride()), w.data_as<float>(), int(k), 0.0f, out.data_as<float>(), int(ldc));
  finish(out);
}

void CpuBackend::embed(const Tensor& ids, const Tensor& table, float scale, Tensor& out) {
  OpTimer timed(this, table.quantized() ? "qembed" : "embed");
  if (table.quantized()) return quantized_embed(ids, table, scale, out);
  const int64_t n = ids.numel(), dim = table.cols(), vocab = table.dim(0);
  const int32_t* id = ids.data_as<int32_t>();
  pool_.parallel_for(
      n,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          int64_t row = std::clamp<int64_t>(id[i], 0, vocab - 1);  // callers validate ids; never read out of range
          const float* src = row_ptr(table, row);
          float* dst = row_ptr(out, i);
          for (int64_t c = 0; c < dim; ++c) dst[c] = src[c] * scale;
        }
      },
      grain_for(dim));
  finish(out);
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, float weight_offset, Tensor& out) {
  OpTimer timed(this, "rms_norm");
  const int64_t cols = x.cols();
  const float* w = weight.defined() && weight.numel() ? weight.data_as<float>() : nullptr;
  pool_.parallel_for(
      x.rows(),
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const float* in = row_ptr(x, r);
          float* o = row_ptr(out, r);
          double sum = 0;
          for (int64_t c = 0; c < cols; ++c) sum += double(in[c]) * in[c];
          const float inv = float(1.0 / std::sqrt(sum / double(cols) + double(eps)));
          if (w) {
            for (int64_t c = 0; c < cols; ++c) o[c] = in[c] * inv * (w[c] + weight_offset);
          } else {
            for (int64_t c = 0; c < cols; ++c) o[c] = in[c] * inv;
          }
        }
      },
      grain_for(cols));
  finish(out);
}

void CpuBackend::rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& weight, float eps, Tensor& out) {
  OpTimer timed(this, "rms_norm_gated");
  const int64_t cols = x.cols();
  const float* w = weight.data_as<float>();
  pool_.parallel_for(
      x.rows(),
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const float* in = row_ptr(x, r);
          const float* g = row_ptr(z, r);
          float* o = row_ptr(out, r);
          double sum = 0;
          for (int64_t c = 0; c < cols; ++c) sum += double(in[c]) * in[c];
          const float inv = float(1.0 / std::sqrt(sum / double(cols) + double(eps)));
          for (int64_t c = 0; c < cols; ++c) o[c] = w[c] * (in[c] * inv) * silu(g[c]);
        }
      },
      grain_for(cols));
  finish(out);
}

void CpuBackend::add(const Tensor& a, const Tensor& b, float scale, Tensor& out) {
  OpTimer timed(this, "add");
  const int64_t cols = a.cols();
  pool_.parallel_for(
      a.rows(),
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const float* pa = row_ptr(a, r);
          const float* pb = row_ptr(b, r);
          float* o = row_ptr(out, r);
          if (scale == 1.0f) {
            for (int64_t c = 0; c < cols; ++c) o[c] = pa[c] + pb[c];
          } else {
            for (int64_t c = 0; c < cols; ++c) o[c] = (pa[c] + pb[c]) * scale;
          }
        }
      },
      grain_for(cols));
  finish(out);
}

void CpuBackend::layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out) {
  OpTimer timed(this, "layer_norm");
  const int64_t cols = x.cols();
  const float* w = weight.defined() ? weight.data_as<float>() : nullptr;
  const float* b = bias.defined() ? bias.data_as<float>() : nullptr;
  pool_.parallel_for(
      x.rows(),
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const float* in = row_ptr(x, r);
          float* o = row_ptr(out, r);
          double sum = 0;
          for (int64_t c = 0; c < cols; ++c) sum += in[c];
          const double mean = sum / double(cols);
          double squares = 0;  // two passes: the variance of the centred values
          for (int64_t c = 0; c < cols; ++c) squares += (in[c] - mean) * (in[c] - mean);
          const float inv = float(1.0 / std::sqrt(squares / double(cols) + double(eps)));
          const float m = float(mean);
          for (int64_t c = 0; c < cols; ++c) {
            float v = (in[c] - m) * inv;
            if (w) v *= w[c];
            if (b) v += b[c];
            o[c] = v;
          }
        }
      },
      grain_for(cols));
  finish(out);
}

void CpuBackend::bias_act(const Tensor& x, const Tensor& bias, BiasActivation act, Tensor& out) {
  OpTimer timed(this, "bias_act");
  const int64_t cols = x.cols();
  const float* b = bias.data_as<float>();
  pool_.parallel_for(
      x.rows(),
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const float* in = row_ptr(x, r);
          float* o = row_ptr(out, r);
          for (int64_t c = 0; c < cols; ++c) {
            const float v = in[c] + b[c];
            o[c] = act == BiasActivation::gelu_tanh ? gelu_tanh(v) : act == BiasActivation::gelu_erf ? gelu_erf(v) : v;
          }
        }
      },
      grain_for(cols));
  finish(out);
}

// The same arithmetic, in the same order, as rms_norm, add, scale and rms_norm one after the other.
void CpuBackend::residual_norm(const ResidualNormArgs& args) {
  OpTimer timed(this, "residual_norm");
  const int64_t cols = args.residual.cols();
  const float* block_w = args.block_norm.defined() ? args.block_norm.data_as<float>() : nullptr;
  const float offset = args.norm_offset, scale = args.scale;
  pool_.parallel_for(
      args.residual.rows(),
      [&](int64_t begin, int64_t end) {
        std::vector<float> normed(size_t(block_w ? cols : 0));
        for (int64_t r = begin; r < end; ++r) {
          float* res = row_ptr(args.residual, r);
          const float* b = row_ptr(args.block_out, r);
          if (block_w) {
            double sum = 0;
            for (int64_t c = 0; c < cols; ++c) sum += double(b[c]) * b[c];
            const float inv = float(1.0 / std::sqrt(sum / double(cols) + double(args.eps)));
            for (int64_t c = 0; c < cols; ++c) normed[size_t(c)] = b[c] * inv * (block_w[c] + offset);
            b = normed.data();
          }
          for (int64_t c = 0; c < cols; ++c) res[c] = res[c] + b[c];
          if (scale != 1.0f)
            for (int64_t c = 0; c < cols; ++c) res[c] = res[c] * scale;
        }
      },
      grain_for(cols));
  finish(args.residual);
  if (args.next.defined()) {
    Tensor next = args.next;
    rms_norm(args.residual, args.next_norm, args.eps, offset, next);
  }
  for (size_t i = 0; i < args.more_next.size(); ++i) {
    if (!args.more_next[i].defined()) continue;
    Tensor next = args.more_next[i];
    rms_norm(args.residual, args.more_next_norm[i], args.eps, offset, next);
  }
}

void CpuBackend::scale(const Tensor& x, float s, Tensor& out) {
  OpTimer timed(this, "scale");
  const int64_t cols = x.cols();
  pool_.parallel_for(
      x.rows(),
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const float* in = row_ptr(x, r);
          float* o = row_ptr(out, r);
          for (int64_t c = 0; c < cols; ++c) o[c] = in[c] * s;
        }
      },
      grain_for(cols));
  finish(out);
}

void CpuBackend::glu(const Tensor& gate, const Tensor& up, Activation act, Tensor& out) {
  OpTimer timed(this, "glu");
  const int64_t cols = gate.cols();
  pool_.parallel_for(
      gate.rows(),
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const float* g = row_ptr(gate, r);
          const float* u = row_ptr(up, r);
          float* o = row_ptr(out, r);
          if (act == Activation::gelu_tanh) {
            for (int64_t c = 0; c < cols; ++c) o[c] = gelu_tanh(g[c]) * u[c];
          } else {
            for (int64_t c = 0; c < cols; ++c) o[c] = silu(g[c]) * u[c];
          }
        }
      },
      grain_for(cols));
  finish(out);
}

void CpuBackend::sigmoid_mul(const Tensor& x, const Tensor& gate, Tensor& out) {
  OpTimer timed(this, "sigmoid_mul");
  const int64_t cols = x.cols();
  pool_.parallel_for(
      x.rows(),
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const float* in = row_ptr(x, r);
          const float* g = row_ptr(gate, r);
          float* o = row_ptr(out, r);
          for (int64_t c = 0; c < cols; ++c) o[c] = in[c] * sigmoid(g[c]);
        }
      },
      grain_for(cols));
  finish(out);
}

void CpuBackend::add_sigmoid_gated(Tensor& acc, const Tensor& x, const Tensor& gate) {
  OpTimer timed(this, "add_sigmoid_gated");
  const int64_t cols = x.cols();
  pool_.parallel_for(
      x.rows(),
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const float s = sigmoid(row_ptr(gate, r)[0]);
          const float* in = row_ptr(x, r);
          float* o = row_ptr(acc, r);
          for (int64_t c = 0; c < cols; ++c) o[c] += s * in[c];
        }
      },
      grain_for(cols));
  finish(acc);
}

void CpuBackend::softcap(Tensor& x, float cap) {
  OpTimer timed(this, "softcap");
  const int64_t cols = x.cols();
  pool_.parallel_for(
      x.rows(),
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          float* p = row_ptr(x, r);
          for (int64_t c = 0; c < cols; ++c) p[c] = cap * std::tanh(p[c] / cap);
        }
      },
      grain_for(cols));
  finish(x);
}

void CpuBackend::clamp(const Tensor& x, float lo, float hi, Tensor& out) {
  OpTimer timed(this, "clamp");
  const int64_t cols = x.cols();
  pool_.parallel_for(
      x.rows(),
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const float* in = row_ptr(x, r);
          float* o = row_ptr(out, r);
          for (int64_t c = 0; c < cols; ++c) o[c] = std::min(std::max(in[c], lo), hi);
        }
      },
      grain_for(cols));
  finish(out);
}

void CpuBackend::column_affine(const Tensor& x, float scale, const Tensor& shift, const Tensor& mul, Tensor& out) {
  OpTimer timed(this, "column_affine");
  const int64_t cols = x.cols();
  const float* b = shift.defined() ? shift.data_as<float>() : nullptr;
  const float* m = mul.defined() ? mul.data_as<float>() : nullptr;
  pool_.parallel_for(
      x.rows(),
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const float* in = row_ptr(x, r);
          float* o = row_ptr(out, r);
          for (int64_t c = 0; c < cols; ++c) {
            float v = in[c] * scale;
            if (b) v += b[c];
            if (m) v *= m[c];
            o[c] = v;
          }
        }
      },
      grain_for(cols));
  finish(out);
}

void CpuBackend::gather_sum(const Tensor& ids, const Tensor& table, float scale, Tensor& out) {
  OpTimer timed(this, "gather_sum");
  const int64_t rows = ids.rows(), n = ids.cols(), cols = table.cols(), vocab = table.rows();
  pool_.parallel_for(
      rows,
      [&](int64_t begin, int64_t end) {
        std::vector<double> acc(static_cast<size_t>(cols));
        for (int64_t r = begin; r < end; ++r) {
          std::fill(acc.begin(), acc.end(), 0.0);
          const int32_t* id = ids.data_as<int32_t>() + r * ids.row_stride();
          for (int64_t j = 0; j < n; ++j) {
            const float* src = row_ptr(table, std::clamp<int64_t>(id[j], 0, vocab - 1));
            for (int64_t c = 0; c < cols; ++c) acc[size_t(c)] += src[c];
          }
          float* o = row_ptr(out, r);
          for (int64_t c = 0; c < cols; ++c) o[c] = float(acc[size_t(c)]) * scale;
        }
      },
      grain_for(cols * n));
  finish(out);
}

void CpuBackend::argmax(const Tensor& x, Tensor& out) {
  OpTimer timed(this, "argmax");
  const int64_t cols = x.cols();
  int32_t* o = out.data_as<int32_t>();
  for (int64_t r = 0; r < x.rows(); ++r) {
    const float* p = row_ptr(x, r);
    o[r] = int32_t(std::max_element(p, p + cols) - p);
  }
}

void CpuBackend::top_k(const Tensor& logits, const Tensor& temperatures, int k, Tensor& values, Tensor& ids) {
  OpTimer timed(this, "top_k");
  const int64_t cols = logits.cols();
  std::vector<float> tempered(static_cast<size_t>(cols));
  std::vector<int32_t> order(static_cast<size_t>(cols));
  for (int64_t r = 0; r < logits.rows(); ++r) {
    const float* p = row_ptr(logits, r);
    const float t = temperatures.data_as<float>()[r];
    for (int64_t c = 0; c < cols; ++c) {
      const float v = p[c] / t;
      tempered[size_t(c)] = v == v ? v : -INFINITY;
    }
    std::iota(order.begin(), order.end(), 0);
    k = int(std::min<int64_t>(k, cols));  // the op's callers keep k <= cols
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return tempered[size_t(a)] > tempered[size_t(b)] || (tempered[size_t(a)] == tempered[size_t(b)] && a < b);
    });
    for (int j = 0; j < k; ++j) {
      values.data_as<float>()[r * k + j] = tempered[size_t(order[size_t(j)])];
      ids.data_as<int32_t>()[r * k + j] = order[size_t(j)];
    }
  }
}

}  // namespace kiln
