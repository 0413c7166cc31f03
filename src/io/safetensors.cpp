#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/files.h"

namespace kiln {

namespace {

std::optional<DType> parse_dtype(const std::string& s) {
  if (s == "F32") return DType::f32;
  if (s == "F16") return DType::f16;
  if (s == "BF16") return DType::bf16;
  if (s == "I32") return DType::i32;
  if (s == "U32") return DType::u32;
  if (s == "I64") return DType::i64;
  if (s == "U8") return DType::u8;
  if (s == "I8") return DType::i8;
  return std::nullopt;
}

size_t element_size_of(const std::string& s) {
  if (s == "F64" || s == "I64" || s == "U64") return 8;
  if (s == "F32" || s == "I32" || s == "U32") return 4;
  if (s == "F16" || s == "BF16" || s == "I16" || s == "U16") return 2;
  if (s == "U8" || s == "I8" || s == "BOOL" || s.rfind("F8", 0) == 0) return 1;
  return 0;
}

const char* safetensors_name(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::f16:
      return "F16";
    case DType::bf16:
      return "BF16";
    case DType::i32:
      return "I32";
    case DType::u32:
      return "U32";
    case DType::i64:
      return "I64";
    case DType::u8:
      return "U8";
    case DType::i8:
      return "I8";
  }
  return "?";
}

}  // namespace

SafetensorsFile::~SafetensorsFile() {
  if (map_ && map_ != MAP_FAILED) munmap(map_, size_);
}

Result<std::shared_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  KILN_TRY(require_regular_file_if_present(path));
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return make_error("missing file {}", path);
    return make_error("cannot open {}: {}", path, std::strerror(errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    return make_error("cannot stat {}: {}", path, std::strerror(errno));
  }
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->size_ = size_t(st.st_size);
  if (file->size_ < 8) {
    ::close(fd);
    return make_error("{} is truncated: {} bytes, too short for a safetensors header", path, file->size_);
  }
  file->map_ = mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (file->map_ == MAP_FAILED) {
    file->map_ = nullptr;
    return make_error("cannot map {}: {}", path, std::strerror(errno));
  }

  const auto* bytes = static_cast<const unsigned char*>(file->map_);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);
  if (header_len == 0 || header_len > file->size_ - 8 || header_len > (uint64_t(1) << 30))
    return make_error("{} is corrupt or truncated: header length {} does not fit in {} bytes", path, header_len,
                      file->size_);
  size_t data_start = 8 + size_t(header_len);
  size_t data_size = file->size_ - data_start;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + header_len);
  } catch (const nlohmann::json::exception& e) {
    return make_error("{} has a corrupt safetensors header: {}", path, e.what());
  }
  if (!header.is_object()) return make_error("{} has a corrupt safetensors header: not a JSON object", path);

  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const auto& entry = it.value();
    TensorInfo info;
    info.name = it.key();
    if (!entry.is_object())
      return make_error("{}: tensor '{}' has a header entry that is not an object", path, info.name);
    for (const char* key : {"dtype", "shape", "data_offsets"})
      if (!entry.contains(key))
        return make_error("{}: tensor '{}' has no '{}' in its header entry", path, info.name, key);
    if (!entry["dtype"].is_string())
      return make_error("{}: tensor '{}' has a dtype {} that is not a string", path, info.name, entry["dtype"].dump());
    try {
      info.dtype_name = entry.at("dtype").get<std::string>();
      const auto& shape = entry.at("shape");
      const auto& offsets = entry.at("data_offsets");
      if (!shape.is_array() || shape.size() > size_t(Shape::kMaxRank) || !offsets.is_array() || offsets.size() != 2)
        return make_error("{}: tensor '{}' has a malformed header entry", path, info.name);
      std::vector<int64_t> dims;
      for (const auto& d : shape) {
        if (!d.is_number_integer())
          return make_error("{}: tensor '{}' has a dimension {} that is not an integer", path, info.name, d.dump());
        if (!d.is_number_unsigned() && d.get<int64_t>() < 0)
          return make_error("{}: tensor '{}' has a negative dimension {}", path, info.name, d.dump());
        if (d.is_number_unsigned() && d.get<uint64_t>() > uint64_t(INT64_MAX))
          return make_error("{}: tensor '{}' has a dimension {} past the largest size", path, info.name, d.dump());
        dims.push_back(d.get<int64_t>());
      }
      for (const auto& o : offsets)
        if (!o.is_number_unsigned())
          return make_error("{}: tensor '{}' has a data offset {} that is not a byte position", path, info.name,
                            o.dump());
      info.shape = Shape(dims.begin(), dims.end());
      size_t esize = element_size_of(info.dtype_name);
      if (esize == 0) return make_error("{}: tensor '{}' has unknown dtype '{}'", path, info.name, info.dtype_name);
      info.dtype = parse_dtype(info.dtype_name);
      const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
      if (end < begin) return make_error("{}: tensor '{}' has inverted data offsets", path, info.name);
      if (end > data_size)
        return make_error("{} is truncated: tensor '{}' ends at byte {} of a {}-byte data section", path, info.name,
                          end, data_size);
      info.nbytes = size_t(end - begin);
      const std::optional<int64_t> numel = info.shape.checked_numel();
      size_t needs = 0;
      if (!numel || __builtin_mul_overflow(size_t(*numel), esize, &needs))
        return make_error("{}: tensor '{}' has shape {}, whose size in bytes overflows 64 bits", path, info.name,
                          info.shape.str());
      if (info.nbytes != needs)
        return make_error("{}: tensor '{}' holds {} bytes but {} {} needs {}", path, info.name, info.nbytes,
                          info.dtype_name, info.shape.str(), needs);
      info.offset = data_start + size_t(begin);
    } catch (const nlohmann::json::exception& e) {
      return make_error("{}: tensor '{}' has a malformed header entry: {}", path, info.name, e.what());
    }
    file->index_[info.name] = file->tensors_.size();
    file->tensors_.push_back(std::move(info));
  }

  // as the safetensors library requires, the tensors tile the data section: in order of their
  // offsets, each starts where the one before ends, and the last ends where the file does
  std::vector<const TensorInfo*> by_offset;
  for (const auto& info : file->tensors_) by_offset.push_back(&info);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return std::pair(a->offset, a->nbytes) < std::pair(b->offset, b->nbytes);
  });
  size_t end = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo* info : by_offset) {
    const size_t begin = info->offset - data_start;
    if (begin != end && !previous)
      return make_error("{}: tensor '{}' at data_offsets [{}, {}) leaves a gap at the start of the data section", path,
                        info->name, begin, begin + info->nbytes);
    if (begin != end)
      return make_error("{}: tensor '{}' at data_offsets [{}, {}) {} tensor '{}', which ends at {}", path, info->name,
                        begin, begin + info->nbytes, begin < end ? "overlaps" : "leaves a gap after", previous->name,
                        end);
    end = begin + info->nbytes;
    previous = info;
  }
  if (end != data_size)
    return make_error("{} has {} bytes after the last tensor (its data section is {} bytes, the tensors end at {})",
                      path, data_size - end, data_size, end);
  return file;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Result<Tensor> SafetensorsFile::view(const TensorInfo& info) const {
  if (!info.dtype)
    return make_error("{}: tensor '{}' has dtype {}, which kiln does not read", path_, info.name, info.dtype_name);
  auto* base = static_cast<char*>(map_) + info.offset;
  // The tensor shares ownership of this file, so the mapping outlives every view of it.
  std::shared_ptr<void> owner = std::const_pointer_cast<SafetensorsFile>(shared_from_this());
  return Tensor(*info.dtype, info.shape, base, owner, Device::cpu);
}

Status write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                         const std::vector<std::pair<std::string, std::string>>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  size_t offset = 0;
  for (const auto& t : tensors) {
    if (t.tensor.device() != Device::cpu || !t.tensor.contiguous())
      return make_error("write_safetensors: tensor '{}' must be contiguous host memory", t.name);
    std::vector<int64_t> shape;
    for (int i = 0; i < t.tensor.rank(); ++i) shape.push_back(t.tensor.dim(i));
    header[t.name] = {{"dtype", safetensors_name(t.tensor.dtype())},
                      {"shape", shape},
                      {"data_offsets", {offset, offset + t.tensor.nbytes()}}};
    offset += t.tensor.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint64_t len = text.size();

  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return make_error("cannot open {} for writing: {}", path, std::strerror(errno));
  bool ok = std::fwrite(&len, 8, 1, f) == 1 && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  for (const auto& t : tensors) ok = ok && std::fwrite(t.tensor.data(), 1, t.tensor.nbytes(), f) == t.tensor.nbytes();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) return make_error("cannot write {}: {}", path, std::strerror(errno));
  return ok_status();
}

}  // namespace kiln
