// CPU backend: products and lookups of quantized weights (MLX's affine format).
//
// A few input rows (decode) dot each weight row as it is dequantized, reading the packed codes
// once; more rows (prefill) dequantize a block of weight rows into scratch and multiply it with
// OpenBLAS. Neither ever holds more than a block of the matrix in f32.
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

}  // namespace

void CpuBackend::quantized_matmul(const Tensor& x, const Tensor& w, Tensor& out) {
  const int64_t m = x.rows(), k = x.cols(), n = w.rows();
  const int64_t ldc = out.cols() == n ? out.row_stride() : n;
  assert(w.cols() == k && out.numel() == m * n);
  if (m == 0) return;
  float* o = out.data_as<float>();
  if (m <= kGemvRows) {
    pool_.parallel_for(
        n,
        [&](int64_t begin, int64_t end) {
          std::vector<float> row(static_cast<size_t>(k));
          for (int64_t j = begin; j < end; ++j) {
            quant::dequantize_rows(w, j, 1, row.data());
            for (int64_t i = 0; i < m; ++i) o[i * ldc + j] = cblas_sdot(int(k), row_ptr(x, i), 1, row.data(), 1);
          }
        },
        std::max<int64_t>(1, 65536 / k));
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
