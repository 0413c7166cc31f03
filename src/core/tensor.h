// Tensor: a typed view of host or device memory with shared ownership.
//
// The last dimension is always contiguous. All leading dimensions collapse into "rows" that sit
// `row_stride` elements apart, which lets a kernel read a column slice (a query half of a fused
// projection, one layer's share of a packed embedding) without a copy.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>

#include "core/dtype.h"

namespace kiln {

// meta: a shape and a type without data, what a model's loader builds when it only checks a
// checkpoint (PyTorch's meta device)
enum class Device : uint8_t { cpu, cuda, meta };

struct QuantParams;

class Shape {
 public:
  static constexpr int kMaxRank = 5;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) {
    for (int64_t d : dims) dims_[rank_++] = d;
  }
  template <typename It>
  Shape(It begin, It end) {
    for (; begin != end; ++begin) dims_[rank_++] = int64_t(*begin);
  }

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[i < 0 ? rank_ + i : i]; }
  int64_t& operator[](int i) { return dims_[i < 0 ? rank_ + i : i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[i];
    return n;
  }
  // numel() of a shape read from a file: nothing when a dimension is negative or the count
  // overflows int64.
  std::optional<int64_t> checked_numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank_; ++i)
      if (dims_[i] < 0 || __builtin_mul_overflow(n, dims_[i], &n)) return std::nullopt;
    return n;
  }
  bool operator==(const Shape& other) const {
    if (rank_ != other.rank_) return false;
    for (int i = 0; i < rank_; ++i)
      if (dims_[i] != other.dims_[i]) return false;
    return true;
  }
  bool operator!=(const Shape& other) const { return !(*this == other); }
  std::string str() const;

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape shape, void* data, std::shared_ptr<void> owner, Device device, int64_t row_stride = -1)
      : dtype_(dtype),
        shape_(shape),
        data_(data),
        owner_(std::move(owner)),
        device_(device),
        row_stride_(row_stride < 0 ? (shape.rank() ? shape[-1] : 1) : row_stride) {}

  bool defined() const { return data_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const { return shape_.numel(); }
  int64_t cols() const { return shape_.rank() ? shape_[-1] : 1; }
  int64_t rows() const { return cols() ? numel() / cols() : 0; }
  int64_t row_stride() const { return row_stride_; }
  bool contiguous() const { return row_stride_ == cols() || rows() <= 1; }
  // Bytes of the data (for a quantized matrix: of its packed codes).
  size_t nbytes() const;
  // Bytes the tensor occupies, a quantized matrix's scales and biases included.
  size_t stored_bytes() const;

  // A quantized matrix (or stack of matrices) in MLX's affine format: the shape is the
  // dequantized [..., out, in], data() holds the packed u32 codes, quant() the rest
  // (src/quant/affine.h). Backends compute on the packed codes.
  bool quantized() const { return quant_ != nullptr; }
  const QuantParams& quant() const { return *quant_; }
  Tensor with_quant(std::shared_ptr<const QuantParams> quant) const {
    Tensor t = *this;
    t.quant_ = std::move(quant);
    return t;
  }

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  const std::shared_ptr<void>& owner() const { return owner_; }

  // Same rows and columns under another shape; the last dimension must stay the same unless the
  // tensor is contiguous.
  Tensor reshape(Shape shape) const;
  // Rows [begin, begin + count) of the collapsed [rows, cols] view, as a [count, cols] tensor.
  Tensor rows_view(int64_t begin, int64_t count) const;
  // Columns [begin, begin + count) of every row, as a strided [rows, count] tensor.
  Tensor cols_view(int64_t begin, int64_t count) const;

 private:
  DType dtype_ = DType::f32;
  Shape shape_{0};  // an undefined tensor holds nothing
  void* data_ = nullptr;
  std::shared_ptr<void> owner_;
  Device device_ = Device::cpu;
  int64_t row_stride_ = 0;
  std::shared_ptr<const QuantParams> quant_;
};

// Affine group quantization: w = scale · q + bias, one scale and bias per `group_size`
// consecutive elements of a row, q an unsigned `bits`-bit code.
struct QuantParams {
  int bits = 4;
  int group_size = 64;
  Tensor scales;  // [..., out, in / group_size], f32, bf16 or f16
  Tensor biases;  // same shape and type
  // Non-zero: a GPU matrix in the tiled layout (src/quant/tiles.h), its codes, scales and biases
  // in this many bytes at data(); scales and biases are then undefined.
  size_t tiled_bytes = 0;
};

inline size_t Tensor::nbytes() const {
  if (quant_) return size_t(numel()) * size_t(quant_->bits) / 8;
  return size_t(numel()) * dtype_size(dtype_);
}

inline size_t Tensor::stored_bytes() const {
  if (quant_ && quant_->tiled_bytes) return quant_->tiled_bytes;
  return nbytes() + (quant_ ? quant_->scales.nbytes() + quant_->biases.nbytes() : 0);
}

// Host memory, owned by the returned tensor.
Tensor host_tensor(DType dtype, Shape shape);

// Writes a host tensor of floats (f32, bf16 or f16, row-strided allowed) into `dst` as contiguous
// values of `dst_type` (f32, bf16 or f16), rounding to nearest even.
void convert_host(const Tensor& src, DType dst_type, void* dst);

}  // namespace kiln
