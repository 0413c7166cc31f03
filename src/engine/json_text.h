// Bounds on JSON text that arrives from outside (request bodies, a model's tool-call arguments):
// nesting is measured without recursion and refused beyond kMaxNesting before anything parses it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace kiln::engine {

// JSON texts (a request body, tool call arguments) nest at most this deep: deeper ones are refused
// before they are parsed, so that nothing walks them recursively.
constexpr int kMaxNesting = 64;

// The deepest nesting of arrays and objects in a JSON text (strings skipped), found without
// recursion.
int nesting_depth(std::string_view text);

// j[key] when j is an object holding a string there, else "" (never throws).
inline std::string string_field(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) return "";
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace kiln::engine
