#include "models/activation_dump.h"

#include <filesystem>

#include "core/npy.h"

namespace kiln {

void ActivationRecorder::record(const std::string& name, const Tensor& t) {
  Array& a = arrays_[name];
  const int64_t rows = t.rank() == 0 ? 1 : t.dim(0);
  std::vector<int64_t> row_shape;
  for (int i = 1; i < t.rank(); ++i) row_shape.push_back(t.dim(i));
  if (a.rows == 0) a.row_shape = row_shape;
  if (a.row_shape != row_shape) return;  // a name reused with another shape: keep the first
  const float* p = t.data_as<float>();
  a.data.insert(a.data.end(), p, p + t.numel());
  a.rows += rows;
}

const ActivationRecorder::Array* ActivationRecorder::find(const std::string& name) const {
  auto it = arrays_.find(name);
  return it == arrays_.end() ? nullptr : &it->second;
}

Status ActivationRecorder::write_npy_dir(const std::string& dir) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error("cannot create {}: {}", dir, ec.message());
  for (const auto& [name, a] : arrays_) {
    std::vector<int64_t> shape{a.rows};
    shape.insert(shape.end(), a.row_shape.begin(), a.row_shape.end());
    KILN_TRY(write_npy_f32(dir + "/" + name + ".npy", a.data.data(), shape));
  }
  return ok_status();
}

}  // namespace kiln
