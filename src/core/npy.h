// NumPy .npy (format 1.0) reading and writing for float32 and int32 arrays.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace kiln {

struct NpyArray {
  std::vector<int64_t> shape;
  std::string descr;         // "<f4" or "<i4"
  std::vector<float> f32;    // filled for "<f4"
  std::vector<int32_t> i32;  // filled for "<i4"
};

Status write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);
Result<NpyArray> read_npy(const std::string& path);

}  // namespace kiln
