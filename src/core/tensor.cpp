#include "core/tensor.h"

#include <cassert>
#include <cstdlib>
#include <cstring>
#include <new>

namespace kiln {

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[i]);
  }
  return s + "]";
}

Tensor Tensor::reshape(Shape shape) const {
  assert(shape.numel() == numel());
  if (contiguous()) return Tensor(dtype_, shape, data_, owner_, device_);
  assert(shape[-1] == cols());
  return Tensor(dtype_, shape, data_, owner_, device_, row_stride_);
}

Tensor Tensor::rows_view(int64_t begin, int64_t count) const {
  assert(begin >= 0 && begin + count <= rows());
  char* base = static_cast<char*>(data_) + size_t(begin * row_stride_) * dtype_size(dtype_);
  return Tensor(dtype_, Shape{count, cols()}, base, owner_, device_, row_stride_);
}

Tensor Tensor::cols_view(int64_t begin, int64_t count) const {
  assert(begin >= 0 && begin + count <= cols());
  char* base = static_cast<char*>(data_) + size_t(begin) * dtype_size(dtype_);
  return Tensor(dtype_, Shape{rows(), count}, base, owner_, device_, row_stride_);
}

void convert_host(const Tensor& src, DType dst_type, void* dst) {
  const int64_t rows = src.rows(), cols = src.cols();
  for (int64_t r = 0; r < rows; ++r) {
    const char* in = static_cast<const char*>(src.data()) + size_t(r * src.row_stride()) * dtype_size(src.dtype());
    char* out = static_cast<char*>(dst) + size_t(r * cols) * dtype_size(dst_type);
    for (int64_t c = 0; c < cols; ++c) {
      float v = 0;
      switch (src.dtype()) {
        case DType::f32:
          std::memcpy(&v, in + c * 4, 4);
          break;
        case DType::bf16:
          v = bf16_to_f32(reinterpret_cast<const uint16_t*>(in)[c]);
          break;
        case DType::f16:
          v = f16_to_f32(reinterpret_cast<const uint16_t*>(in)[c]);
          break;
        default:
          assert(false && "not a float tensor");
      }
      switch (dst_type) {
        case DType::f32:
          std::memcpy(out + c * 4, &v, 4);
          break;
        case DType::bf16:
          reinterpret_cast<uint16_t*>(out)[c] = f32_to_bf16(v);
          break;
        case DType::f16:
          reinterpret_cast<uint16_t*>(out)[c] = f32_to_f16(v);
          break;
        default:
          assert(false && "not a float type");
      }
    }
  }
}

Tensor host_tensor(DType dtype, Shape shape) {
  size_t bytes = size_t(shape.numel()) * dtype_size(dtype);
  // 64-byte alignment suits vector loads and BLAS
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  if (!p) throw std::bad_alloc();
  std::shared_ptr<void> owner(p, [](void* q) { std::free(q); });
  return Tensor(dtype, shape, p, owner, Device::cpu);
}

}  // namespace kiln
