// Memory-mapped safetensors files: the header is parsed and checked once, tensors are read in place.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace kiln {

struct TensorInfo {
  std::string name;
  std::string dtype_name;      // as written in the header, e.g. "BF16"
  std::optional<DType> dtype;  // empty for types kiln does not read (F64, F8, ...)
  Shape shape;
  size_t offset = 0;  // from the start of the file
  size_t nbytes = 0;
};

class SafetensorsFile : public std::enable_shared_from_this<SafetensorsFile> {
 public:
  // Maps `path` and validates its header: every tensor's byte range must lie inside the file and
  // match its dtype and shape. Errors name the file (and the tensor, where one is at fault).
  static Result<std::shared_ptr<SafetensorsFile>> open(const std::string& path);
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  // A host tensor that reads the mapped bytes; it keeps the mapping alive.
  Result<Tensor> view(const TensorInfo& info) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

// Writes tensors (host, contiguous) to a safetensors file; used by tools and tests.
struct NamedTensor {
  std::string name;
  Tensor tensor;
};
Status write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                         const std::vector<std::pair<std::string, std::string>>& metadata = {});

}  // namespace kiln
