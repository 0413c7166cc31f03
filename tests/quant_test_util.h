// Helpers for the quantization tests: random quantized matrices, their dequantized f32 twins, and
// a dequantized copy of a quantized model directory.
#pragma once

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <vector>

#include "io/safetensors.h"
#include "quant/affine.h"
#include "test_util.h"

namespace kiln::test {

// A quantized host matrix (or stack) of the dequantized shape `logical`, from normal random weights,
// scales and biases stored as `scale_dtype`.
inline Tensor random_quantized(std::mt19937& gen, Shape logical, int bits, int group_size,
                               DType scale_dtype = DType::bf16) {
  const int64_t cols = logical[-1], rows = logical.numel() / cols, groups = cols / group_size;
  Shape packed_shape = logical, scale_shape = logical;
  packed_shape[-1] = cols * bits / 32;
  scale_shape[-1] = groups;
  Tensor packed = host_tensor(DType::u32, packed_shape);
  Tensor scales = host_tensor(scale_dtype, scale_shape), biases = host_tensor(scale_dtype, scale_shape);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> row(static_cast<size_t>(cols)), s(static_cast<size_t>(groups)), b(static_cast<size_t>(groups));
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& v : row) v = normal(gen);
    quant::quantize_row(row.data(), cols, bits, group_size,
                        static_cast<uint8_t*>(packed.data()) + size_t(r * cols * bits / 8), s.data(), b.data());
    Tensor sv(DType::f32, Shape{groups}, s.data(), nullptr, Device::cpu);
    Tensor bv(DType::f32, Shape{groups}, b.data(), nullptr, Device::cpu);
    convert_host(sv, scale_dtype, static_cast<char*>(scales.data()) + size_t(r * groups) * dtype_size(scale_dtype));
    convert_host(bv, scale_dtype, static_cast<char*>(biases.data()) + size_t(r * groups) * dtype_size(scale_dtype));
  }
  return quant::make_quantized(packed, scales, biases, logical, bits, group_size);
}

// The dense f32 matrix a quantized host tensor stands for.
inline Tensor dequantized(const Tensor& q) {
  Tensor out = host_tensor(DType::f32, q.shape());
  quant::dequantize_rows(q, 0, q.rows(), out.data_as<float>());
  return out;
}

// Copies a quantized model directory with every quantized module replaced by its dequantized f32
// weight and the quantization block removed: the float model kiln's quantized path must match.
inline void write_dequantized_copy(const std::string& src, const std::string& dst) {
  std::filesystem::create_directories(dst);
  auto config = read_json(src + "/config.json");
  config.erase("quantization");
  config.erase("quantization_config");
  std::ofstream(dst + "/config.json") << config.dump(2);
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(src))
    if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
  std::vector<NamedTensor> out;
  std::vector<std::shared_ptr<SafetensorsFile>> keep;
  std::map<std::string, Tensor> all;
  for (const auto& f : files) {
    auto file = SafetensorsFile::open(f);
    ASSERT_TRUE(file.ok());
    keep.push_back(*file);
    for (const auto& info : (*file)->tensors()) all[info.name] = *(*file)->view(info);
  }
  for (const auto& [name, t] : all) {
    if (name.ends_with(".scales") || name.ends_with(".biases")) continue;
    const std::string module = name.ends_with(".weight") ? name.substr(0, name.size() - 7) : "";
    if (!module.empty() && all.count(module + ".scales")) {
      const Tensor& s = all.at(module + ".scales");
      const nlohmann::json qconfig = read_json(src + "/config.json")["quantization"];
      std::string key = module;
      int bits = qconfig["bits"], group = qconfig["group_size"];
      if (qconfig.contains(key) && qconfig[key].is_object()) {
        bits = qconfig[key]["bits"];
        group = qconfig[key]["group_size"];
      }
      Shape logical = t.shape();
      logical[-1] = t.dim(-1) * 32 / bits;
      Tensor q = quant::make_quantized(t, s, all.at(module + ".biases"), logical, bits, group);
      out.push_back({name, dequantized(q)});
    } else {
      Tensor copy = host_tensor(t.dtype(), t.shape());
      std::memcpy(copy.data(), t.data(), t.nbytes());
      out.push_back({name, copy});
    }
  }
  ASSERT_TRUE(write_safetensors(dst + "/model.safetensors", out).ok());
}

}  // namespace kiln::test
