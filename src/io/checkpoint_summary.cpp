#include "io/checkpoint_summary.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "io/config.h"
#include "io/quantization.h"
#include "io/safetensors.h"
#include "io/weights.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The safetensors files of a directory: those the index lists, else every *.safetensors.
Result<std::vector<std::string>> weight_files(const std::string& dir) {
  std::set<std::string> files;
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    std::ifstream in(index_path);
    const auto index = nlohmann::json::parse(in, nullptr, false);
    if (index.is_discarded() || !index.contains("weight_map") || !index["weight_map"].is_object())
      return make_error("{} has no weight_map", index_path);
    for (const auto& [name, file] : index["weight_map"].items())
      if (file.is_string()) files.insert(dir + "/" + file.get<std::string>());
  } else {
    for (const auto& entry : fs::directory_iterator(dir, ec))
      if (entry.path().extension() == ".safetensors") files.insert(entry.path().string());
  }
  return std::vector<std::string>(files.begin(), files.end());
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return text;
}

// How the quantization block reads in a table: "mlx 4-bit g64", "mlx mixed 4/8-bit g64".
std::string describe_mlx(const QuantizationConfig& q, const std::set<int>& bits_used) {
  std::set<int> groups = {q.group_size()};
  for (const auto& [module, spec] : q.overrides())
    if (spec.quantized) groups.insert(spec.group_size);
  std::string bits;
  for (int b : bits_used) bits += (bits.empty() ? "" : "/") + std::to_string(b);
  std::string group;
  for (int g : groups) group += (group.empty() ? "g" : "/") + std::to_string(g);
  return fmt::format("mlx {}{}-bit {}", bits_used.size() > 1 ? "mixed " : "", bits, group);
}

}  // namespace

std::string format_count(int64_t count) {
  const double n = double(count);
  if (n >= 1e12) return fmt::format("{:.3g}T", n / 1e12);
  if (n >= 1e9) return fmt::format("{:.3g}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.3g}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.3g}K", n / 1e3);
  return std::to_string(count);
}

Result<CheckpointSummary> summarize_checkpoint(const std::string& model_dir) {
  KILN_ASSIGN(ModelConfigFile config, read_model_config(model_dir));
  CheckpointSummary summary;
  summary.model_type = config.outer_model_type.empty() || config.outer_model_type == config.model_type
                           ? config.model_type
                           : config.outer_model_type + "/" + config.model_type;

  // another tool's quantization (GPTQ, AWQ, fp8, ...) is named by its method
  std::string foreign_method;
  QuantizationConfig quantization;
  auto parsed = QuantizationConfig::parse(config.text, config.path);
  if (parsed) {
    quantization = std::move(parsed).value();
  } else {
    const nlohmann::json& block =
        config.text.contains("quantization_config") ? config.text["quantization_config"] : config.text["quantization"];
    foreign_method = block.is_object() && block.contains("quant_method") && block["quant_method"].is_string()
                         ? block["quant_method"].get<std::string>()
                         : "unknown";
  }

  KILN_ASSIGN(const std::vector<std::string> files, weight_files(model_dir));
  std::map<std::string, int64_t> elements_by_dtype;  // unquantized tensors
  std::set<int> bits_used;
  for (const std::string& path : files) {
    KILN_ASSIGN(auto file, SafetensorsFile::open(path));
    for (const TensorInfo& t : file->tensors()) {
      const int64_t elements = t.shape.numel();
      if (quantization.present() && (ends_with(t.name, ".scales") || ends_with(t.name, ".biases"))) continue;
      // an MLX-packed weight: uint32 words of 32/bits weights each, beside its .scales
      if (quantization.present() && t.dtype_name == "U32" && ends_with(t.name, ".weight")) {
        const std::string module = t.name.substr(0, t.name.size() - 7);
        if (file->find(module + ".scales")) {
          const std::string canonical = canonical_weight_name(t.name);
          const QuantSpec spec = canonical.empty() ? QuantSpec{.quantized = true, .bits = quantization.bits()}
                                                   : quantization.module(canonical.substr(0, canonical.size() - 7));
          const int bits = spec.quantized && spec.bits > 0 ? spec.bits : quantization.bits();
          bits_used.insert(bits);
          summary.parameters += elements * 32 / bits;
          continue;
        }
      }
      summary.parameters += elements;
      elements_by_dtype[t.dtype_name] += elements;
    }
  }

  if (!foreign_method.empty()) {
    summary.quantization = foreign_method;
  } else if (quantization.present() && !bits_used.empty()) {
    summary.quantization = describe_mlx(quantization, bits_used);
  } else if (!elements_by_dtype.empty()) {
    // the dtype most parameters have; others named after it ("bf16+f32") when they hold a tenth
    std::vector<std::pair<int64_t, std::string>> by_size;
    for (const auto& [dtype, n] : elements_by_dtype) by_size.emplace_back(n, lower(dtype));
    std::sort(by_size.rbegin(), by_size.rend());
    summary.quantization = by_size.front().second;
    for (size_t i = 1; i < by_size.size(); ++i)
      if (by_size[i].first * 10 >= summary.parameters) summary.quantization += "+" + by_size[i].second;
  }
  return summary;
}

}  // namespace kiln
