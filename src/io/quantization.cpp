#include "io/quantization.h"

#include "io/weights.h"
#include "quant/affine.h"

namespace kiln {

namespace {

Result<int> read_int(const nlohmann::json& j, const char* key, int fallback, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number_integer()) return make_error("{}: '{}' must be an integer, got {}", where, key, j[key].dump());
  // read wide, so that a value past int's range is refused rather than wrapped to a valid one
  const bool in_range = j[key].is_number_unsigned()
                            ? j[key].get<uint64_t>() <= uint64_t(INT32_MAX)
                            : j[key].get<int64_t>() >= INT32_MIN && j[key].get<int64_t>() <= INT32_MAX;
  if (!in_range) return make_error("{}: '{}' = {} is out of range", where, key, j[key].dump());
  return int(j[key].get<int64_t>());
}

// The bits and group size kiln computes with (those check_quantized accepts).
Status check_spec(int bits, int group_size, const std::string& where) {
  if (!quant::supported_bits(bits)) return make_error("{}: {} bits is not supported (2, 3, 4, 5, 6, 8)", where, bits);
  if (!quant::supported_group_size(group_size))
    return make_error("{}: groups of {} are not supported (32, 64, 128)", where, group_size);
  return ok_status();
}

// The affine mode of a block or of one module's entry; another mode, or one that is not a string, is an error.
Status check_mode(const nlohmann::json& j, const std::string& where) {
  if (!j.contains("mode") || j["mode"].is_null()) return ok_status();
  if (!j["mode"].is_string()) return make_error("{}: 'mode' must be a string, got {}", where, j["mode"].dump());
  const std::string mode = j["mode"].get<std::string>();
  if (mode != "affine") return make_error("{}: mode '{}' is not supported (affine)", where, mode);
  return ok_status();
}

bool is_setting(const std::string& key) {
  return key == "bits" || key == "group_size" || key == "mode" || key == "quant_method";
}

}  // namespace

Result<QuantizationConfig> QuantizationConfig::parse(const nlohmann::json& config, const std::string& where) {
  QuantizationConfig q;
  const char* key = config.contains("quantization") ? "quantization" : "quantization_config";
  if (!config.contains(key) || config[key].is_null()) return q;
  const nlohmann::json& block = config[key];
  const std::string here = where + " " + key;
  if (!block.is_object()) return make_error("{} must be an object", here);
  // other tools' blocks (GPTQ, AWQ, bitsandbytes, compressed-tensors) name their method; mlx-lm's do not
  if (block.contains("quant_method") && block["quant_method"] != "mlx")
    return make_error("{}: quant_method {} is not supported (kiln reads MLX's affine quantization)", here,
                      block["quant_method"].dump());
  KILN_TRY(check_mode(block, here));
  q.present_ = true;
  KILN_ASSIGN(q.bits_, read_int(block, "bits", 4, here));
  KILN_ASSIGN(q.group_size_, read_int(block, "group_size", 64, here));
  KILN_TRY(check_spec(q.bits_, q.group_size_, here));
  for (auto it = block.begin(); it != block.end(); ++it) {
    if (is_setting(it.key())) continue;
    const nlohmann::json& v = it.value();
    const std::string at = here + "." + it.key();
    // a module's entry is its own settings (an empty object: the defaults) or whether to quantize it
    if (!v.is_object() && !v.is_boolean())
      return make_error("{} must be an object of bits and group_size, or true or false, got {}", at, v.dump());
    QuantSpec spec;
    if (v.is_boolean()) {
      spec = QuantSpec{.quantized = v.get<bool>(), .bits = q.bits_, .group_size = q.group_size_};
    } else {
      KILN_TRY(check_mode(v, at));
      spec.quantized = true;
      KILN_ASSIGN(spec.bits, read_int(v, "bits", q.bits_, at));
      KILN_ASSIGN(spec.group_size, read_int(v, "group_size", q.group_size_, at));
      KILN_TRY(check_spec(spec.bits, spec.group_size, at));
    }
    const std::string canonical = canonical_weight_name(it.key());
    if (!canonical.empty()) q.overrides_[canonical] = spec;
  }
  return q;
}

QuantSpec QuantizationConfig::module(const std::string& canonical_module) const {
  if (!present_) return QuantSpec{};
  auto it = overrides_.find(canonical_module);
  if (it != overrides_.end()) return it->second;
  return QuantSpec{.quantized = true, .bits = bits_, .group_size = group_size_};
}

}  // namespace kiln
