// JSON in and out of template values: Python's json.load (what transformers' callers pass in) and
// json.dumps (transformers' `tojson` filter).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "text/jinja/value.h"

namespace kiln::jinja {

// Raises a limit error for containers nested deeper than kMaxValueDepth.
Value from_json(const nlohmann::ordered_json& json);

// Whether `json`'s arrays and objects nest more than `max_depth` deep ([] is 1 deep), found
// without recursion.
bool nested_deeper_than(const nlohmann::ordered_json& json, int max_depth);

// The arguments of json.dumps that transformers' tojson exposes.
struct JsonDumpOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;          // nullopt: one line
  std::optional<std::string> item_separator;  // default ", " (or "," when indenting)
  std::optional<std::string> key_separator;   // default ": "
  bool sort_keys = false;
  size_t max_bytes = SIZE_MAX;  // longer output raises a limit error
};

// json.dumps(value, ...); raises a TypeError for values JSON cannot hold.
std::string dump_json(const Value& value, const JsonDumpOptions& options);

}  // namespace kiln::jinja
