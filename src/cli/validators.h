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

// A finite number in [lo, hi] (lo excluded when `open_lo`); `requirement` says so in the error.
inline CLI::Validator finite_number(double lo, double hi, bool open_lo, std::string requirement) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v))
          return fmt::format("'{}' is not a finite number", text);
        if (v < lo || v > hi || (open_lo && v == lo)) return fmt::format("must be {}, got {}", requirement, text);
        return "";
      },
      requirement, requirement);
}

inline CLI::Validator positive_number() {
  return finite_number(0, HUGE_VAL, true, "positive");
}
inline CLI::Validator non_negative_number() {
  return finite_number(0, HUGE_VAL, false, "non-negative");
}
inline CLI::Validator number_in(double lo, double hi) {
  return finite_number(lo, hi, false, fmt::format("within [{}, {}]", lo, hi));
}

// A whole number in [0, 2^64): CLI11 reads "-1" into an unsigned option as 2^64 - 1 and saturates
// longer numbers there, so a seed of -1 and one of 2^64 - 1 gave the same output.
inline CLI::Validator unsigned_64() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        std::strtoull(text.c_str(), &end, 10);
        if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
          return fmt::format("'{}' is not a whole number from 0", text);
        if (errno == ERANGE) return fmt::format("'{}' is beyond 18446744073709551615", text);
        return "";
      },
      "", "unsigned 64-bit");
}

}  // namespace kiln::cli
