#include "quant/tiles.h"

#include <cstring>

#include "quant/affine.h"

namespace kiln::quant {

bool tileable(const Tensor& w) {
  if (!w.quantized() || w.shape().rank() != 2 || w.cols() % 32 != 0 || w.rows() < 1) return false;
  const int bits = w.quant().bits;
  return (bits == 4 || bits == 8) && supported_group_size(w.quant().group_size) && w.cols() % w.quant().group_size == 0;
}

void write_tiles(const Tensor& w, uint8_t* out) {
  const TileLayout t = tile_layout(w);
  const QuantParams& q = w.quant();
  const int64_t row_bytes = t.cols * t.bits / 8, groups = t.cols / t.group_size;
  const auto* codes = static_cast<const uint8_t*>(w.data());
  const auto* scales = static_cast<const uint8_t*>(q.scales.data());
  const auto* biases = static_cast<const uint8_t*>(q.biases.data());
  const size_t scale_size = dtype_size(q.scales.dtype()), bias_size = dtype_size(q.biases.dtype());
  auto as_bf16 = [](const void* row, DType dtype, int64_t i) {
    return dtype == DType::bf16 ? static_cast<const uint16_t*>(row)[i] : f32_to_bf16(load_float(row, dtype, i));
  };
  std::memset(out, 0, size_t(t.total_bytes()));  // the tiles' padding
  for (int64_t row = 0; row < t.rows; ++row) {
    const void* scale_row = scales + size_t(row * q.scales.row_stride()) * scale_size;
    const void* bias_row = biases + size_t(row * q.biases.row_stride()) * bias_size;
    for (int s = 0; s < t.slices(); ++s) {
      const int64_t first_chunk = int64_t(s) * (t.slice / 32), first_group = int64_t(s) * (t.slice / t.group_size);
      std::memcpy(out + t.chunk_offset(row, first_chunk), codes + row * row_bytes + first_chunk * t.bits * 4,
                  size_t(t.codes_bytes(1, t.slice_cols(s))));
      for (int64_t g = first_group; g < first_group + t.slice_cols(s) / t.group_size && g < groups; ++g) {
        const int64_t at = t.scale_offset(row, g);
        const uint16_t sv = as_bf16(scale_row, q.scales.dtype(), g), bv = as_bf16(bias_row, q.biases.dtype(), g);
        std::memcpy(out + at, &sv, 2);
        std::memcpy(out + at + t.bias_distance(row, g), &bv, 2);
      }
    }
  }
}

}  // namespace kiln::quant
