#include "io/config.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/files.h"

namespace kiln {

namespace {

// A config value as an integer kiln can hold in an int anywhere it goes (a size, a count, an id);
// nothing when it is not an integer or lies beyond that. Whole floats (`4.0`) count as integers.
std::optional<int64_t> integer_in_range(const nlohmann::json& v) {
  if (v.is_number_unsigned())
    return v.get<uint64_t>() <= uint64_t(kMaxConfigInteger) ? std::optional(int64_t(v.get<uint64_t>())) : std::nullopt;
  if (v.is_number_integer()) {
    const int64_t n = v.get<int64_t>();
    return n >= -kMaxConfigInteger && n <= kMaxConfigInteger ? std::optional(n) : std::nullopt;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::trunc(d) == d && d >= -double(kMaxConfigInteger) && d <= double(kMaxConfigInteger)) return int64_t(d);
  }
  return std::nullopt;
}

}  // namespace

const nlohmann::json* ConfigReader::find(const std::string& key, const char* kind) {
  if (!has(key)) return nullptr;
  (void)kind;
  return &j_.at(key);
}

void ConfigReader::fail(const std::string& message) {
  if (!error_) error_ = Error{where_ + ": " + message};
}

int64_t ConfigReader::get_int(const std::string& key, std::optional<int64_t> fallback) {
  const auto* v = find(key, "integer");
  if (!v) {
    if (!fallback) fail("missing integer '" + key + "'");
    return fallback.value_or(0);
  }
  if (auto n = integer_in_range(*v)) return *n;
  if (v->is_number_integer() || (v->is_number_float() && std::trunc(v->get<double>()) == v->get<double>()))
    fail(fmt::format("'{}' is {}, beyond the {} kiln takes", key, v->dump(), kMaxConfigInteger));
  else
    fail("'" + key + "' must be an integer, got " + v->dump());
  return fallback.value_or(0);
}

double ConfigReader::get_float(const std::string& key, std::optional<double> fallback) {
  const auto* v = find(key, "number");
  if (!v) {
    if (!fallback) fail("missing number '" + key + "'");
    return fallback.value_or(0.0);
  }
  if (v->is_number()) return v->get<double>();
  fail("'" + key + "' must be a number, got " + v->dump());
  return fallback.value_or(0.0);
}

bool ConfigReader::get_bool(const std::string& key, std::optional<bool> fallback) {
  const auto* v = find(key, "boolean");
  if (!v) {
    if (!fallback) fail("missing boolean '" + key + "'");
    return fallback.value_or(false);
  }
  if (v->is_boolean()) return v->get<bool>();
  fail("'" + key + "' must be true or false, got " + v->dump());
  return fallback.value_or(false);
}

std::string ConfigReader::get_string(const std::string& key, std::optional<std::string> fallback) {
  const auto* v = find(key, "string");
  if (!v) {
    if (!fallback) fail("missing string '" + key + "'");
    return fallback.value_or("");
  }
  if (v->is_string()) return v->get<std::string>();
  fail("'" + key + "' must be a string, got " + v->dump());
  return fallback.value_or("");
}

std::vector<std::string> ConfigReader::get_strings(const std::string& key) {
  const auto* v = find(key, "list");
  std::vector<std::string> out;
  if (!v) return out;
  if (!v->is_array()) {
    fail("'" + key + "' must be a list of strings");
    return out;
  }
  for (const auto& e : *v) {
    if (!e.is_string()) {
      fail("'" + key + "' must be a list of strings");
      return {};
    }
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::vector<int64_t> ConfigReader::get_ints(const std::string& key) {
  const auto* v = find(key, "list");
  std::vector<int64_t> out;
  if (!v) return out;
  if (v->is_number_integer()) {
    if (auto n = integer_in_range(*v)) return {*n};
    fail(fmt::format("'{}' is {}, beyond the {} kiln takes", key, v->dump(), kMaxConfigInteger));
    return out;
  }
  if (!v->is_array()) {
    fail("'" + key + "' must be a list of integers");
    return out;
  }
  for (const auto& e : *v) {
    if (!e.is_number_integer()) {
      fail("'" + key + "' must be a list of integers");
      return {};
    }
    auto n = integer_in_range(e);
    if (!n) {
      fail(fmt::format("'{}' holds {}, beyond the {} kiln takes", key, e.dump(), kMaxConfigInteger));
      return {};
    }
    out.push_back(*n);
  }
  return out;
}

Result<ModelConfigFile> read_model_config(const std::string& model_dir) {
  std::error_code error;
  if (!std::filesystem::exists(model_dir + "/config.json", error))
    return make_error("missing file {}/config.json (is {} a model directory?)", model_dir, model_dir);
  return read_model_config_file(model_dir + "/config.json");
}

Result<ModelConfigFile> read_model_config_file(const std::string& path) {
  ModelConfigFile cfg;
  cfg.path = path;
  KILN_TRY(require_regular_file_if_present(cfg.path));
  std::ifstream in(cfg.path);
  if (!in) return make_error("cannot read {}", cfg.path);
  try {
    cfg.root = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return make_error("{} is not valid JSON: {}", cfg.path, e.what());
  }
  if (!cfg.root.is_object()) return make_error("{} must hold a JSON object", cfg.path);

  auto string_field = [](const nlohmann::json& j, const char* key) {
    return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
  };
  cfg.outer_model_type = string_field(cfg.root, "model_type");
  if (cfg.root.contains("text_config") && cfg.root["text_config"].is_object()) {
    cfg.text = cfg.root["text_config"];
    cfg.wrapped = true;
    // settings that wrappers keep at the top level only
    for (const char* key : {"tie_word_embeddings", "quantization", "quantization_config"}) {
      if (!cfg.text.contains(key) && cfg.root.contains(key)) cfg.text[key] = cfg.root[key];
    }
  } else {
    cfg.text = cfg.root;
  }
  cfg.model_type = string_field(cfg.text, "model_type");
  if (cfg.model_type.empty()) cfg.model_type = cfg.outer_model_type;
  if (cfg.model_type.empty()) return make_error("{} has no model_type", cfg.path);
  return cfg;
}

}  // namespace kiln
