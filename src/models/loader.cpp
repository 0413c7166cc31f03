#include "models/loader.h"

#include <cstring>

namespace kiln {

Tensor to_f32_host(const Tensor& t) {
  Tensor out = host_tensor(DType::f32, t.shape());
  float* dst = out.data_as<float>();
  const int64_t cols = t.cols();
  for (int64_t r = 0; r < t.rows(); ++r) {
    const char* row = static_cast<const char*>(t.data()) + size_t(r * t.row_stride()) * dtype_size(t.dtype());
    for (int64_t c = 0; c < cols; ++c) {
      float v = 0;
      switch (t.dtype()) {
        case DType::f32:
          std::memcpy(&v, row + c * 4, 4);
          break;
        case DType::bf16:
          v = bf16_to_f32(reinterpret_cast<const uint16_t*>(row)[c]);
          break;
        case DType::f16:
          v = f16_to_f32(reinterpret_cast<const uint16_t*>(row)[c]);
          break;
        default:
          break;
      }
      dst[r * cols + c] = v;
    }
  }
  return out;
}

namespace {
bool is_float(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16;
}
}  // namespace

Result<Tensor> WeightLoader::host(const std::string& name, const Shape& shape) {
  KILN_ASSIGN(Tensor t, store_.get(name, shape));
  if (!is_float(t.dtype()))
    return make_error("tensor {} has dtype {}, expected a float type", store_.describe(name), dtype_name(t.dtype()));
  return t;
}

Result<Tensor> WeightLoader::matrix(const std::string& name, const Shape& shape) {
  KILN_ASSIGN(Tensor t, host(name, shape));
  return backend_.upload(t, backend_.matrix_dtype());
}

Result<Tensor> WeightLoader::vector(const std::string& name, const Shape& shape) {
  KILN_ASSIGN(Tensor t, host(name, shape));
  return backend_.upload(t, DType::f32);
}

Result<Tensor> WeightLoader::host_f32(const std::string& name, const Shape& shape) {
  KILN_ASSIGN(Tensor t, host(name, shape));
  return to_f32_host(t);
}

}  // namespace kiln
