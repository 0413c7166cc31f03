// An ActivationDump that keeps every named activation, rows appended across forward calls (a
// prompt fed in chunks gives the same arrays as one forward), and writes them as .npy files.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "models/model.h"

namespace kiln {

class ActivationRecorder final : public ActivationDump {
 public:
  struct Array {
    std::vector<int64_t> row_shape;  // the shape of one token's row
    int64_t rows = 0;
    std::vector<float> data;
  };

  void record(const std::string& name, const Tensor& host_f32) override;

  const std::map<std::string, Array>& arrays() const { return arrays_; }
  const Array* find(const std::string& name) const;
  // DIR/<name>.npy for every array, [rows, ...] float32; the directory is created.
  Status write_npy_dir(const std::string& dir) const;

 private:
  std::map<std::string, Array> arrays_;
};

}  // namespace kiln
