// Fetches checkpoint tensors, checks their shapes against the config and puts them on a backend.
#pragma once

#include <string>
#include <vector>

#include "io/weights.h"
#include "ops/backend.h"

namespace kiln {

class WeightLoader {
 public:
  WeightLoader(const WeightStore& store, Backend& backend) : store_(store), backend_(backend) {}

  const WeightStore& store() const { return store_; }
  Backend& backend() { return backend_; }
  bool has(const std::string& name) const { return store_.has(name); }

  // A matrix (or stack of matrices) in the backend's matrix type; `shape` is its dequantized shape.
  // A module the checkpoint stores quantized (name.scales and name.biases beside a packed
  // name.weight, as config.json's quantization describes) stays quantized on the backend.
  Result<Tensor> matrix(const std::string& name, const Shape& shape);
  // A small tensor (norm weights, scales) kept in f32.
  Result<Tensor> vector(const std::string& name, const Shape& shape);
  // The host tensor as stored, for load-time transforms.
  Result<Tensor> host(const std::string& name, const Shape& shape);
  // A host f32 copy, for load-time transforms.
  Result<Tensor> host_f32(const std::string& name, const Shape& shape);
  // A host f32 copy of a matrix (or table), dequantized when the checkpoint stores it quantized.
  Result<Tensor> host_matrix_f32(const std::string& name, const Shape& shape);

 private:
  Result<Tensor> quantized_matrix(const std::string& module, const Shape& shape);
  Result<Tensor> quantized_host(const std::string& module, const Shape& shape);

  const WeightStore& store_;
  Backend& backend_;
};

// A host f32 copy of any float host tensor.
Tensor to_f32_host(const Tensor& t);

}  // namespace kiln
