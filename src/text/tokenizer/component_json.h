// Small helpers for reading tokenizer.json component specs.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"
#include "text/tokenizer/regex.h"

namespace kiln::tokenization {

// Sequences of components hold Sequences; they are built recursively, so a file nesting them
// thousands deep would overflow the stack. Real tokenizers nest one or two.
inline constexpr int kMaxComponentNesting = 64;

inline std::string type_of(const nlohmann::json& spec) {
  if (!spec.is_object()) return "";
  auto it = spec.find("type");
  return it != spec.end() && it->is_string() ? it->get<std::string>() : "";
}

inline bool bool_field(const nlohmann::json& spec, const char* name, bool fallback) {
  auto it = spec.find(name);
  return it != spec.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

inline std::string string_field(const nlohmann::json& spec, const char* name, const std::string& fallback = "") {
  auto it = spec.find(name);
  return it != spec.end() && it->is_string() ? it->get<std::string>() : fallback;
}

// A {"String": "..."} or {"Regex": "..."} pattern.
inline Result<Pattern> parse_pattern(const nlohmann::json& spec, const std::string& owner) {
  if (spec.is_object()) {
    if (auto it = spec.find("String"); it != spec.end() && it->is_string())
      return Pattern::literal(it->get<std::string>());
    if (auto it = spec.find("Regex"); it != spec.end() && it->is_string())
      return Pattern::regex(it->get<std::string>());
  }
  return make_error("{}: pattern must be {{\"String\": ...}} or {{\"Regex\": ...}}", owner);
}

}  // namespace kiln::tokenization
