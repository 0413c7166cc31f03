#include "models/mlx_layout.h"

#include <cstring>

namespace kiln {

Tensor stack_host(const std::vector<Tensor>& parts) {
  const Shape shape = parts.front().shape();
  std::vector<int64_t> dims{int64_t(parts.size())};
  for (int i = 0; i < shape.rank(); ++i) dims.push_back(shape[i]);
  Tensor out = host_tensor(parts.front().dtype(), Shape(dims.begin(), dims.end()));
  const size_t bytes = parts.front().nbytes();
  for (size_t i = 0; i < parts.size(); ++i)
    std::memcpy(static_cast<char*>(out.data()) + i * bytes, parts[i].data(), bytes);
  return out;
}

Tensor split_half_rows(const Tensor& fused, int which) {
  const int64_t e = fused.dim(0), rows = fused.dim(1) / 2, cols = fused.dim(2);
  Tensor out = host_tensor(fused.dtype(), Shape{e, rows, cols});
  const size_t half = size_t(rows * cols) * dtype_size(fused.dtype());
  for (int64_t x = 0; x < e; ++x)
    std::memcpy(static_cast<char*>(out.data()) + size_t(x) * half,
                static_cast<const char*>(fused.data()) + size_t(2 * x + which) * half, half);
  return out;
}

Tensor add_one(const Tensor& t) {
  Tensor f = host_tensor(DType::f32, t.shape());
  convert_host(t, DType::f32, f.data());
  for (int64_t i = 0; i < f.numel(); ++i) f.data_as<float>()[i] += 1.0f;
  Tensor out = host_tensor(t.dtype(), t.shape());
  convert_host(f, t.dtype(), out.data());
  return out;
}

bool fused_experts_to_mlx(const WeightStore& store, const std::string& name, const Tensor& t, const std::string& prefix,
                          const std::string& stack, std::vector<MlxTensor>& out) {
  const auto experts = name.find(".experts.");
  const bool down = ends_with(name, ".down_proj");
  if (experts == std::string::npos || t.rank() != 3 || !(down || ends_with(name, ".gate_up_proj"))) return false;
  const std::string base = prefix + name.substr(0, experts) + stack;
  if (down) {
    out.push_back({base + "down_proj.weight", t.shape(), t.dtype(), [&store, name]() { return *store.get(name); }});
    return true;
  }
  const Shape half{t.dim(0), t.dim(1) / 2, t.dim(2)};
  for (int which : {0, 1})
    out.push_back({base + (which ? "up_proj.weight" : "gate_proj.weight"), half, t.dtype(),
                   [&store, name, which]() { return split_half_rows(*store.get(name), which); }});
  return true;
}

}  // namespace kiln
