// Number checks for command-line options. CLI11's own print their limits as doubles ("not in range
// 0.000000 to 1797…") and let NaN through; these name the limit plainly and take finite numbers only.
#pragma once

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

namespace kiln::cli {

// The most worker threads a command takes (more fail to start on ordinary systems).
constexpr int kMaxThreads = 1024;

// An error message unless `text` is a finite number.
inline std::string check_number(const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v))
    return fmt::format("'{}' is not a finite number", text);
  return "";
}

inline CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& s) {
        const std::string e = check_number(s);
        if (!e.empty()) return e;
        return std::strtod(s.c_str(), nullptr) > 0 ? std::string() : fmt::format("must be positive, got {}", s);
      },
      "POSITIVE", "positive");
}

inline CLI::Validator non_negative_number() {
  return CLI::Validator(
      [](std::string& s) {
        const std::string e = check_number(s);
        if (!e.empty()) return e;
        return std::strtod(s.c_str(), nullptr) >= 0 ? std::string() : fmt::format("must not be negative, got {}", s);
      },
      "NONNEGATIVE", "non-negative");
}

// lo <= value <= hi
inline CLI::Validator number_in(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) {
        const std::string e = check_number(s);
        if (!e.empty()) return e;
        const double v = std::strtod(s.c_str(), nullptr);
        return v >= lo && v <= hi ? std::string() : fmt::format("must be within [{}, {}], got {}", lo, hi, s);
      },
      fmt::format("[{} - {}]", lo, hi), "range");
}

}  // namespace kiln::cli
