#include "core/tensor.h"

#include <cassert>
#include <cstdlib>
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
