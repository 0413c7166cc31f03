// config.json access with errors that name the file and key.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace kiln {

// The largest integer a config field may hold: sizes and counts go into ints and int products,
// and a larger value is a broken file, not a geometry.
inline constexpr int64_t kMaxConfigInteger = INT32_MAX;

// Reads typed fields from one JSON object. The first failure is remembered and returned by
// status(), so a config struct can be filled field by field and checked once.
class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& object, std::string where) : j_(object), where_(std::move(where)) {}

  bool has(const std::string& key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  const nlohmann::json& json() const { return j_; }
  const std::string& where() const { return where_; }

  int64_t get_int(const std::string& key, std::optional<int64_t> fallback = std::nullopt);
  double get_float(const std::string& key, std::optional<double> fallback = std::nullopt);
  bool get_bool(const std::string& key, std::optional<bool> fallback = std::nullopt);
  std::string get_string(const std::string& key, std::optional<std::string> fallback = std::nullopt);
  std::vector<std::string> get_strings(const std::string& key);
  std::vector<int64_t> get_ints(const std::string& key);

  // Records a failure found by the caller (a value out of range, an inconsistency).
  void fail(const std::string& message);
  Status status() const { return error_ ? Status(*error_) : Status(); }

 private:
  const nlohmann::json* find(const std::string& key, const char* kind);
  const nlohmann::json& j_;
  std::string where_;
  std::optional<Error> error_;
};

// config.json of a model directory. For multimodal checkpoints the language model's settings live
// under "text_config"; text() returns that object with top-level fallbacks merged in.
struct ModelConfigFile {
  std::string path;
  nlohmann::json root;
  nlohmann::json text;     // the language-model config
  std::string model_type;  // text model type, e.g. "gemma4_text"
  std::string outer_model_type;
  // a release-form wrapper: the language model's settings sit under text_config
  bool wrapped = false;
};

Result<ModelConfigFile> read_model_config(const std::string& model_dir);
// The same from a config.json file anywhere.
Result<ModelConfigFile> read_model_config_file(const std::string& path);

}  // namespace kiln
