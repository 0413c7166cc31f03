#include "core/npy.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

namespace kiln {

Status write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  int64_t count = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) dict += ",";
    if (i + 1 < shape.size()) dict += " ";
    count *= shape[i];
  }
  dict += "), }";
  // magic(6) + version(2) + header length(2) + dict + padding + '\n' is a multiple of 64
  size_t unpadded = 10 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict += '\n';

  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f) return make_error("cannot open {} for writing: {}", path, std::strerror(errno));
  const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  uint16_t header_len = uint16_t(dict.size());
  bool ok = std::fwrite(magic, 1, 8, f.get()) == 8 && std::fwrite(&header_len, 2, 1, f.get()) == 1 &&
            std::fwrite(dict.data(), 1, dict.size(), f.get()) == dict.size() &&
            std::fwrite(data, sizeof(float), size_t(count), f.get()) == size_t(count);
  if (!ok || std::fflush(f.get()) != 0) return make_error("cannot write {}: {}", path, std::strerror(errno));
  return ok_status();
}

Result<NpyArray> read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error("cannot open {}", path);
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) return make_error("{} is not a .npy file", path);
  uint32_t header_len = 0;
  if (magic[6] == 1) {
    uint16_t len16;
    in.read(reinterpret_cast<char*>(&len16), 2);
    header_len = len16;
  } else {
    in.read(reinterpret_cast<char*>(&header_len), 4);
  }
  std::string header(header_len, '\0');
  if (!in.read(header.data(), header_len)) return make_error("{}: truncated header", path);

  NpyArray out;
  auto descr_at = header.find("'descr':");
  auto shape_at = header.find("'shape':");
  if (descr_at == std::string::npos || shape_at == std::string::npos) return make_error("{}: malformed header", path);
  auto q1 = header.find('\'', descr_at + 8);
  auto q2 = header.find('\'', q1 + 1);
  out.descr = header.substr(q1 + 1, q2 - q1 - 1);
  if (header.find("'fortran_order': True") != std::string::npos)
    return make_error("{}: fortran order is not supported", path);
  auto p1 = header.find('(', shape_at);
  auto p2 = header.find(')', p1);
  std::stringstream dims(header.substr(p1 + 1, p2 - p1 - 1));
  std::string item;
  int64_t count = 1;
  while (std::getline(dims, item, ',')) {
    if (item.find_first_not_of(" ") == std::string::npos) continue;
    out.shape.push_back(std::stoll(item));
    count *= out.shape.back();
  }
  if (out.descr == "<f4") {
    out.f32.resize(size_t(count));
    if (!in.read(reinterpret_cast<char*>(out.f32.data()), count * 4)) return make_error("{}: truncated data", path);
  } else if (out.descr == "<i4") {
    out.i32.resize(size_t(count));
    if (!in.read(reinterpret_cast<char*>(out.i32.data()), count * 4)) return make_error("{}: truncated data", path);
  } else {
    return make_error("{}: unsupported dtype {}", path, out.descr);
  }
  return out;
}

}  // namespace kiln
