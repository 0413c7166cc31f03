// CPU backend: products and lookups of quantized weights (MLX's affine format).
//
// A few input rows (decode) read the packed codes directly: per group, the codes become floats
// once and each row takes s · Σ x·q + b · Σ x (the group sums of x computed once per product), so
// a weight is read once and never written out dequantized. Each row's result is computed the same
// way whatever the other rows. More rows (prefill) dequantize a block of weight rows into scratch
// and multiply it with OpenBLAS. Neither ever holds more than a block of the matrix in f32.
// The group loops are compiled for AVX-512, AVX2 and baseline x86-64, chosen when the program
// starts (one binary for every x86-64 machine).
#include <cblas.h>

#include <algorithm>
#include <cassert>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "quant/affine.h"

namespace kiln {

namespace {

constexpr int64_t kGemvRows = 8;                    // up to this many input rows: dot per weight row
constexpr int64_t kBlockFloats = int64_t(1) << 20;  // f32 scratch of a dequantized block (4 MiB)
constexpr int kLanes = 16;                          // partial sums of a dot: one AVX-512 register

// A portable build compiles the product loops three times and picks one at start; the helpers they
// call are inlined into each, so that every copy is vectorised for its own instruction set. A
// -march=native build (KILN_NATIVE) is tuned for its machine already.
#if defined(__x86_64__) && !defined(__clang__) && !defined(KILN_NATIVE_BUILD)
#define KILN_CPU_CLONES __attribute__((target_clones("default", "avx2", "arch=x86-64-v4")))
#define KILN_INLINE inline __attribute__((always_inline))
#else
#define KILN_CPU_CLONES
#define KILN_INLINE inline
#endif

// Σ a·b over n (a multiple of kLanes) in kLanes partial sums, added pairwise at the end.
KILN_INLINE float dot_lanes(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {};
  for (int64_t c = 0; c < n; c += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += a[c + k] * b[c + k];
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0];
}

// The codes of one group (group_size of them, starting at a byte boundary) as floats.
KILN_INLINE void unpack_group(const uint8_t* p, int bits, int64_t group_size, float* q) {
  if (bits == 4) {
    for (int64_t t = 0; t < group_size / 2; ++t) {
      q[2 * t] = float(p[t] & 15);
      q[2 * t + 1] = float(p[t] >> 4);
    }
  } else if (bits == 8) {
    for (int64_t t = 0; t < group_size; ++t) q[t] = float(p[t]);
  } else {
    uint32_t codes[8];
    for (int64_t t = 0; t < group_size; t += 8) {
      quant::unpack8(p + t / 8 * bits, bits, codes);
      for (int k = 0; k < 8; ++k) q[t + k] = float(codes[k]);
    }
  }
}

// Σ over a 4-bit group of x·q, x given as the group's even elements then its odd ones (the low and
// high nibbles of each byte): the bytes become floats in place, with no interleaving.
KILN_INLINE float dot_nibbles(const float* x_even, const float* x_odd, const uint8_t* p, int64_t half) {
  float acc[kLanes] = {};
  for (int64_t t = 0; t < half; t += kLanes)
    for (int k = 0; k < kLanes; ++k)
      acc[k] += x_even[t + k] * float(p[t + k] & 15) + x_odd[t + k] * float(p[t + k] >> 4);
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0];
}

// 4-bit weight rows [begin, end) against m input rows permuted as dot_nibbles reads them.
KILN_CPU_CLONES void gemv_rows4(const Tensor& w, const float* x_split, const float* group_sums, int64_t m,
                                int64_t begin, int64_t end, float* out, int64_t ldc) {
  const QuantParams& qp = w.quant();
  const int64_t k = w.cols(), gs = qp.group_size, groups = k / gs;
  const size_t row_bytes = size_t(k) / 2;
  const DType sdt = qp.scales.dtype();
  const size_t s_row = size_t(groups) * dtype_size(sdt);
  const auto* packed = static_cast<const uint8_t*>(w.data());
  float acc[kGemvRows];
  for (int64_t j = begin; j < end; ++j) {
    const uint8_t* p = packed + size_t(j) * row_bytes;
    const void* srow = static_cast<const char*>(qp.scales.data()) + size_t(j) * s_row;
    const void* brow = static_cast<const char*>(qp.biases.data()) + size_t(j) * s_row;
    for (int64_t i = 0; i < m; ++i) acc[i] = 0.0f;
    for (int64_t g = 0; g < groups; ++g) {
      const float scale = quant::load_float(srow, sdt, g), bias = quant::load_float(brow, sdt, g);
      for (int64_t i = 0; i < m; ++i) {
        const float* xg = x_split + i * k + g * gs;
        acc[i] += scale * dot_nibbles(xg, xg + gs / 2, p + g * gs / 2, gs / 2) + bias * group_sums[i * groups + g];
      }
    }
    for (int64_t i = 0; i < m; ++i) out[i * ldc + j] = acc[i];
  }
}

// out[i, j] for weight rows [begin, end) and m input rows: per group, s · (x·q) + b · Σx.
KILN_CPU_CLONES void gemv_rows(const Tensor& x, const Tensor& w, const float* group_sums, int64_t m, int64_t begin,
                               int64_t end, float* out, int64_t ldc) {
  const QuantParams& qp = w.quant();
  const int64_t k = w.cols(), gs = qp.group_size, groups = k / gs;
  const size_t row_bytes = size_t(k) * size_t(qp.bits) / 8, group_bytes = size_t(gs) * size_t(qp.bits) / 8;
  const DType sdt = qp.scales.dtype();
  const size_t s_row = size_t(groups) * dtype_size(sdt);
  const auto* packed = static_cast<const uint8_t*>(w.data());
  alignas(64) float q[128];
  float acc[kGemvRows];
  for (int64_t j = begin; j < end; ++j) {
    const uint8_t* p = packed + size_t(j) * row_bytes;
    const void* srow = static_cast<const char*>(qp.scales.data()) + size_t(j) * s_row;
    const void* brow = static_cast<const char*>(qp.biases.data()) + size_t(j) * s_row;
    for (int64_t i = 0; i < m; ++i) acc[i] = 0.0f;
    for (int64_t g = 0; g < groups; ++g) {
      unpack_group(p + size_t(g) * group_bytes, qp.bits, gs, q);
      const float scale = quant::load_float(srow, sdt, g), bias = quant::load_float(brow, sdt, g);
      for (int64_t i = 0; i < m; ++i)
        acc[i] += scale * dot_lanes(row_ptr(x, i) + g * gs, q, gs) + bias * group_sums[i * groups + g];
    }
    for (int64_t i = 0; i < m; ++i) out[i * ldc + j] = acc[i];
  }
}

}  // namespace

void CpuBackend::quantized_matmul(const Tensor& x, const Tensor& w, Tensor& out) {
  const int64_t m = x.rows(), k = x.cols(), n = w.rows();
  const int64_t ldc = out.cols() == n ? out.row_stride() : n;
  assert(w.cols() == k && out.numel() == m * n);
  if (m == 0) return;
  float* o = out.data_as<float>();
  if (m <= kGemvRows) {
    const int64_t gs = w.quant().group_size, groups = k / gs;
    std::vector<float> group_sums(size_t(m * groups));
    alignas(64) float ones[128];
    std::fill(ones, ones + 128, 1.0f);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t g = 0; g < groups; ++g)
        group_sums[size_t(i * groups + g)] = dot_lanes(row_ptr(x, i) + g * gs, ones, gs);
    if (w.quant().bits == 4) {
      // each group's even elements, then its odd ones: the low and high nibbles of its bytes
      std::vector<float> split(size_t(m * k));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t g = 0; g < groups; ++g) {
          const float* src = row_ptr(x, i) + g * gs;
          float* dst = split.data() + i * k + g * gs;
          for (int64_t t = 0; t < gs / 2; ++t) {
            dst[t] = src[2 * t];
            dst[gs / 2 + t] = src[2 * t + 1];
          }
        }
      pool_.parallel_for(
          n, [&](int64_t begin, int64_t end) { gemv_rows4(w, split.data(), group_sums.data(), m, begin, end, o, ldc); },
          std::max<int64_t>(1, 65536 / k));
    } else {
      pool_.parallel_for(
          n, [&](int64_t begin, int64_t end) { gemv_rows(x, w, group_sums.data(), m, begin, end, o, ldc); },
          std::max<int64_t>(1, 65536 / k));
    }
  } else {
    const int64_t block = std::clamp<int64_t>(kBlockFloats / k, 16, n);
    std::vector<float> tile(static_cast<size_t>(block * k));
    for (int64_t n0 = 0; n0 < n; n0 += block) {
      const int64_t count = std::min(block, n - n0);
      pool_.parallel_for(count, [&](int64_t begin, int64_t end) {
        quant::dequantize_rows(w, n0 + begin, end - begin, tile.data() + begin * k);
      });
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(count), int(k), 1.0f, x.data_as<float>(),
                  int(x.row_stride()), tile.data(), int(k), 0.0f, o + n0, int(ldc));
    }
  }
  finish(out);
}

void CpuBackend::quantized_embed(const Tensor& ids, const Tensor& table, float scale, Tensor& out) {
  const int64_t n = ids.numel(), dim = table.cols(), vocab = table.dim(0);
  const int32_t* id = ids.data_as<int32_t>();
  pool_.parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t row = std::clamp<int64_t>(id[i], 0, vocab - 1);
      float* dst = row_ptr(out, i);
      quant::dequantize_rows(table, row, 1, dst);
      if (scale != 1.0f)
        for (int64_t c = 0; c < dim; ++c) dst[c] *= scale;
    }
  });
  finish(out);
}

}  // namespace kiln
