#include "models/loader.h"

#include <cstring>

namespace kiln {

Tensor to_f32_host(const Tensor& t) {
  Tensor out = host_tensor(DType::f32, t.shape());
  convert_host(t, DType::f32, out.data());
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
