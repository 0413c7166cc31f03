#include "layers/loader.h"

#include <cstring>

#include "quant/affine.h"

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
  const std::string suffix = ".weight";
  if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
    const std::string module = name.substr(0, name.size() - suffix.size());
    if (store_.has(module + ".scales") || store_.has(module + ".biases")) return quantized_matrix(module, shape);
  }
  KILN_ASSIGN(Tensor t, host(name, shape));
  return backend_.upload(t, backend_.matrix_dtype());
}

Result<Tensor> WeightLoader::quantized_matrix(const std::string& module, const Shape& shape) {
  KILN_ASSIGN(Tensor host, quantized_host(module, shape));
  return backend_.upload_quantized(host);
}

Result<Tensor> WeightLoader::quantized_host(const std::string& module, const Shape& shape) {
  const std::string weight = module + ".weight";
  const QuantizationConfig& config = store_.quantization();
  if (!config.present())
    return make_error("tensor {} is quantized, but config.json has no quantization block", store_.describe(weight));
  const QuantSpec spec = config.module(module);
  if (!spec.quantized)
    return make_error("tensor {} is quantized, but config.json's quantization leaves '{}' unquantized",
                      store_.describe(weight), module);
  KILN_ASSIGN(Tensor packed, store_.get(weight));
  KILN_ASSIGN(Tensor scales, store_.get(module + ".scales"));
  KILN_ASSIGN(Tensor biases, store_.get(module + ".biases"));
  KILN_TRY(quant::check_quantized(quant::QuantizedNames{.weight = store_.describe(weight),
                                                        .scales = store_.describe(module + ".scales"),
                                                        .biases = store_.describe(module + ".biases")},
                                  packed, scales, biases, shape, spec.bits, spec.group_size));
  return quant::make_quantized(packed, scales, biases, shape, spec.bits, spec.group_size);
}

Result<Tensor> WeightLoader::vector(const std::string& name, const Shape& shape) {
  KILN_ASSIGN(Tensor t, host(name, shape));
  return backend_.upload(t, DType::f32);
}

Result<Tensor> WeightLoader::host_f32(const std::string& name, const Shape& shape) {
  KILN_ASSIGN(Tensor t, host(name, shape));
  return to_f32_host(t);
}

Result<Tensor> WeightLoader::host_matrix_f32(const std::string& name, const Shape& shape) {
  const std::string suffix = ".weight";
  if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
    const std::string module = name.substr(0, name.size() - suffix.size());
    if (store_.has(module + ".scales") || store_.has(module + ".biases")) {
      KILN_ASSIGN(Tensor q, quantized_host(module, shape));
      Tensor out = host_tensor(DType::f32, shape);
      quant::dequantize_rows(q, 0, out.numel() / shape[-1], out.data_as<float>());
      return out;
    }
  }
  return host_f32(name, shape);
}

}  // namespace kiln
