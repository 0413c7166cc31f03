// MLX's affine group quantization: the packing of codes, quantizing as mlx does, and dequantizing.
//
// A row of `cols` weights splits into groups of `group_size` consecutive elements; group g has a
// scale s and a bias b, and element i of it is w = s · q_i + b with q_i an unsigned `bits`-bit code.
// Codes are packed per row as one little-endian bit stream, least significant bit first: code i
// occupies bits [i · bits, (i + 1) · bits) of the row's bytes, crossing byte and word boundaries
// where the width does not divide 32 (3, 5, 6 bits). Eight codes take exactly `bits` bytes, so a
// row is cols · bits / 8 bytes, stored as cols · bits / 32 uint32 words. See docs/quantization.md.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"

namespace kiln::quant {

inline bool supported_bits(int bits) {
  return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
}
inline bool supported_group_size(int group_size) {
  return group_size == 32 || group_size == 64 || group_size == 128;
}

// The eight codes stored in `bits` bytes at p.
inline void unpack8(const uint8_t* p, int bits, uint32_t out[8]) {
  uint64_t v = 0;
  std::memcpy(&v, p, size_t(bits));  // little-endian host
  const uint64_t mask = (uint64_t(1) << bits) - 1;
  for (int k = 0; k < 8; ++k) out[k] = uint32_t((v >> (k * bits)) & mask);
}

// Writes eight codes into `bits` bytes at p.
inline void pack8(const uint32_t codes[8], int bits, uint8_t* p) {
  uint64_t v = 0;
  for (int k = 0; k < 8; ++k) v |= uint64_t(codes[k]) << (k * bits);
  std::memcpy(p, &v, size_t(bits));
}

// Reads element i of a row of scales or biases stored as f32, bf16 or f16.
inline float load_float(const void* row, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::bf16:
      return bf16_to_f32(static_cast<const uint16_t*>(row)[i]);
    case DType::f16:
      return f16_to_f32(static_cast<const uint16_t*>(row)[i]);
    default:
      return static_cast<const float*>(row)[i];
  }
}

// Dequantizes rows [row_begin, row_begin + n_rows) of a quantized host tensor (rows of the
// collapsed [rows, in] view; a stack of matrices is rows of all of them) into out [n_rows, in],
// each element computed in f32 as scale · q + bias.
void dequantize_rows(const Tensor& w, int64_t row_begin, int64_t n_rows, float* out);

// Quantizes a row of `cols` floats as mlx's quantize does on the GPU (Metal and CUDA kernels, what
// mlx-lm's convert runs by default): per group, the range [min(min, ...), max(0, max)] maps to codes
// 0 .. 2^bits - 1 with the larger-magnitude extreme kept exact as the bias; rounding is half away
// from zero. Scales and biases come back in f32: callers store them rounded to the weight's type,
// as mlx does, while the codes come from the unrounded values. (mlx's CPU kernel starts the max at
// -inf and rounds halves to even: it differs in all-negative groups and at exact ties.)
void quantize_row(const float* w, int64_t cols, int bits, int group_size, uint8_t* packed, float* scales,
                  float* biases);

// The names of a quantized module's three tensors, as messages should show them.
struct QuantizedNames {
  std::string weight, scales, biases;
};

// Checks a quantized matrix against its dequantized shape `logical` ([..., out, in]) and the
// module's bits and group size; errors name the tensor at fault.
Status check_quantized(const QuantizedNames& names, const Tensor& packed, const Tensor& scales, const Tensor& biases,
                       const Shape& logical, int bits, int group_size);

// The quantized tensor (logical shape, packed data, scales and biases) over the given host tensors.
Tensor make_quantized(const Tensor& packed, const Tensor& scales, const Tensor& biases, const Shape& logical, int bits,
                      int group_size);

}  // namespace kiln::quant
