#include "runtime/sampling_defaults.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace kiln {

bool SamplingDefaults::empty() const {
  return !temperature && !top_k && !top_p && !min_p && !repetition_penalty;
}

std::string SamplingDefaults::describe() const {
  std::string out;
  auto add = [&](const char* name, const std::string& value) {
    out += (out.empty() ? "" : ", ") + std::string(name) + " " + value;
  };
  auto number = [](float v) {
    std::ostringstream s;
    s << v;
    return s.str();
  };
  if (temperature) add("temperature", number(*temperature));
  if (top_k) add("top_k", std::to_string(*top_k));
  if (top_p) add("top_p", number(*top_p));
  if (min_p) add("min_p", number(*min_p));
  if (repetition_penalty) add("repetition_penalty", number(*repetition_penalty));
  return out;
}

void SamplingDefaults::apply(SamplingParams& params) const {
  if (temperature) params.temperature = *temperature;
  if (top_k) params.top_k = *top_k;
  if (top_p) params.top_p = *top_p;
  if (min_p) params.min_p = *min_p;
  if (repetition_penalty) params.repetition_penalty = *repetition_penalty;
}

Result<SamplingDefaults> load_sampling_defaults(const std::string& model_dir) {
  SamplingDefaults d;
  const std::filesystem::path path = std::filesystem::path(model_dir) / "generation_config.json";
  std::ifstream in(path);
  if (!in) return d;
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return make_error("{} is not a JSON object", path.string());
  // a number in [lo, hi] (open at the low end when lo_open), else a warning and nothing
  auto number = [&](const char* key, double lo, double hi, bool lo_open) -> std::optional<float> {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    const nlohmann::json& v = j[key];
    const double x = v.is_number() ? v.get<double>() : NAN;
    if (!std::isfinite(x) || x < lo || (lo_open && x == lo) || x > hi) {
      spdlog::warn("{}: {} {} is not in {}{}, {}]; it is not used as a sampling default", path.string(), key, v.dump(),
                   lo_open ? "(" : "[", lo, hi);
      return std::nullopt;
    }
    return float(x);
  };
  d.temperature = number("temperature", 0, 1e6, false);
  d.top_p = number("top_p", 0, 1, true);
  d.min_p = number("min_p", 0, 1, false);
  d.repetition_penalty = number("repetition_penalty", 0, 1e6, true);
  if (j.contains("top_k") && !j["top_k"].is_null()) {
    const nlohmann::json& v = j["top_k"];
    if (v.is_number_integer() && v.get<int64_t>() >= -1 && v.get<int64_t>() <= (int64_t(1) << 30)) {
      if (v.get<int64_t>() > 0) d.top_k = int(v.get<int64_t>());  // -1 and 0: off, as without it
    } else {
      spdlog::warn("{}: top_k {} is not a count of tokens; it is not used as a sampling default", path.string(),
                   v.dump());
    }
  }
  return d;
}

}  // namespace kiln
