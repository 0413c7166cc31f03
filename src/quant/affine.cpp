#include "quant/affine.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kiln::quant {

void dequantize_rows(const Tensor& w, int64_t row_begin, int64_t n_rows, float* out) {
  const QuantParams& q = w.quant();
  const int64_t cols = w.cols(), groups = cols / q.group_size;
  const size_t row_bytes = size_t(cols) * size_t(q.bits) / 8;
  const DType sdt = q.scales.dtype();
  const size_t s_row = size_t(groups) * dtype_size(sdt);
  const auto* packed = static_cast<const uint8_t*>(w.data());
  const auto* scales = static_cast<const char*>(q.scales.data());
  const auto* biases = static_cast<const char*>(q.biases.data());
  uint32_t codes[8];
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t row = row_begin + r;
    const uint8_t* p = packed + size_t(row) * row_bytes;
    const void* srow = scales + size_t(row) * s_row;
    const void* brow = biases + size_t(row) * s_row;
    float* o = out + r * cols;
    for (int64_t g = 0; g < groups; ++g) {
      const float s = load_float(srow, sdt, g), b = load_float(brow, sdt, g);
      for (int64_t c = g * q.group_size; c < (g + 1) * q.group_size; c += 8) {
        unpack8(p + c / 8 * q.bits, q.bits, codes);
        for (int k = 0; k < 8; ++k) o[c + k] = s * float(codes[k]) + b;
      }
    }
  }
}

void quantize_row(const float* w, int64_t cols, int bits, int group_size, uint8_t* packed, float* scales,
                  float* biases) {
  const float n_bins = float((1 << bits) - 1);
  const float eps = 1e-7f;
  uint32_t codes[8];
  for (int64_t g = 0; g < cols / group_size; ++g) {
    const float* x = w + g * group_size;
    // as mlx's GPU kernels (Metal and CUDA) reduce: the max starts at 0, so an all-negative group
    // keeps 0 inside its range
    float lo = std::numeric_limits<float>::max(), hi = 0.0f;
    for (int j = 0; j < group_size; ++j) {
      lo = std::min(lo, x[j]);
      hi = std::max(hi, x[j]);
    }
    // the extreme of larger magnitude becomes the bias, exactly; the scale steps from it
    const bool low_side = std::fabs(lo) > std::fabs(hi);
    float scale = std::max((hi - lo) / n_bins, eps);
    scale = low_side ? scale : -scale;
    const float edge = low_side ? lo : hi;
    const float q0 = std::round(edge / scale);
    float bias = 0.0f;
    if (q0 != 0.0f) {  // else the whole group is ~0 and keeps a zero bias
      scale = edge / q0;
      bias = edge;
    }
    for (int j = 0; j < group_size; j += 8) {
      for (int k = 0; k < 8; ++k) codes[k] = uint32_t(std::clamp(std::round((x[j + k] - bias) / scale), 0.0f, n_bins));
      pack8(codes, bits, packed + size_t(g * group_size + j) / 8 * size_t(bits));
    }
    scales[g] = scale;
    biases[g] = bias;
  }
}

Status check_quantized(const QuantizedNames& names, const Tensor& packed, const Tensor& scales, const Tensor& biases,
                       const Shape& logical, int bits, int group_size) {
  if (!supported_bits(bits))
    return make_error("tensor {} is quantized with {} bits, which kiln does not support (2, 3, 4, 5, 6, 8)",
                      names.weight, bits);
  if (!supported_group_size(group_size))
    return make_error("tensor {} is quantized in groups of {}, which kiln does not support (32, 64, 128)", names.weight,
                      group_size);
  const int64_t in = logical[-1];
  if (in % group_size)
    return make_error("tensor {}: its input size {} is not a multiple of the group size {}", names.weight, in,
                      group_size);
  if (packed.dtype() != DType::u32)
    return make_error("tensor {} has dtype {}, but a quantized weight is packed as U32", names.weight,
                      dtype_name(packed.dtype()));
  Shape want_packed = logical;
  want_packed[-1] = in / 32 * bits;  // exact: 32 divides every group size; in · bits could overflow
  if (packed.shape() != want_packed)
    return make_error("tensor {} has shape {}, but {}-bit codes of a {} matrix take {}", names.weight,
                      packed.shape().str(), bits, logical.str(), want_packed.str());
  Shape want_scales = logical;
  want_scales[-1] = in / group_size;
  for (const auto& [t, name] : {std::pair<const Tensor&, const std::string&>{scales, names.scales},
                                std::pair<const Tensor&, const std::string&>{biases, names.biases}}) {
    if (t.dtype() != DType::f32 && t.dtype() != DType::bf16 && t.dtype() != DType::f16)
      return make_error("tensor {} has dtype {}, expected a float type", name, dtype_name(t.dtype()));
    if (t.shape() != want_scales)
      return make_error("tensor {} has shape {}, but groups of {} over a {} matrix need {}", name, t.shape().str(),
                        group_size, logical.str(), want_scales.str());
  }
  if (scales.dtype() != biases.dtype())
    return make_error("tensor {} has dtype {}, unlike its scales ({})", names.biases, dtype_name(biases.dtype()),
                      dtype_name(scales.dtype()));
  return ok_status();
}

Tensor make_quantized(const Tensor& packed, const Tensor& scales, const Tensor& biases, const Shape& logical, int bits,
                      int group_size) {
  auto params = std::make_shared<QuantParams>();
  params->bits = bits;
  params->group_size = group_size;
  params->scales = scales;
  params->biases = biases;
  Tensor t(DType::u32, logical, packed.data(), packed.owner(), packed.device());
  return t.with_quant(std::move(params));
}

}  // namespace kiln::quant
