// Helpers shared by the test binaries: fixture discovery and logits comparison.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <stdlib.h>
#include <sys/wait.h>

#include "core/npy.h"

namespace kiln::test {

inline std::string source_dir() {
  return KILN_SOURCE_DIR;
}
inline std::string fixtures_dir() {
  return source_dir() + "/tests/fixtures";
}
inline std::string fixture_path(const std::string& name) {
  return fixtures_dir() + "/" + name;
}

// Every text oracle fixture directory (those holding logits.npy, and no images.json), sorted.
inline std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(fixtures_dir()))
    if (std::filesystem::exists(entry.path() / "logits.npy") && !std::filesystem::exists(entry.path() / "images.json"))
      names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Every oracle fixture of a prompt with images (logits.npy beside images.json), sorted; their
// format is described in test_qwen_vision.cpp.
inline std::vector<std::string> image_fixture_names(const std::string& family = "") {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(fixtures_dir())) {
    if (!std::filesystem::exists(entry.path() / "logits.npy") || !std::filesystem::exists(entry.path() / "images.json"))
      continue;
    // a family's fixtures: config.json's model_type starts with its name (gemma4, qwen3_5)
    if (!family.empty()) {
      std::ifstream in(entry.path() / "config.json");
      const auto config = nlohmann::json::parse(in, nullptr, false);
      const std::string type = config.is_object() ? config.value("model_type", std::string()) : std::string();
      if (type.rfind(family, 0) != 0) continue;
    }
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// The fixture directories whose config.json declares a quantization, sorted.
inline std::vector<std::string> quantized_fixtures() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(fixtures_dir())) {
    const auto config = entry.path() / "config.json";
    if (std::filesystem::exists(config) && read_json(config.string()).contains("quantization"))
      names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

inline std::vector<int32_t> fixture_ids(const std::string& name) {
  return read_json(fixture_path(name) + "/ids.json").get<std::vector<int32_t>>();
}

struct LogitsComparison {
  double max_abs_diff = 0;
  double max_abs_reference = 0;
  double argmax_agreement = 0;
  double relative() const { return max_abs_reference > 0 ? max_abs_diff / max_abs_reference : max_abs_diff; }
};

// Compares logits [rows, vocab] with a reference of the same shape.
inline LogitsComparison compare_logits(const float* got, const float* want, int64_t rows, int64_t vocab) {
  LogitsComparison c;
  int64_t agree = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = got + r * vocab;
    const float* w = want + r * vocab;
    for (int64_t v = 0; v < vocab; ++v) {
      c.max_abs_diff = std::max(c.max_abs_diff, double(std::fabs(g[v] - w[v])));
      c.max_abs_reference = std::max(c.max_abs_reference, double(std::fabs(w[v])));
      if (std::isnan(g[v])) c.max_abs_diff = INFINITY;
    }
    agree += std::max_element(g, g + vocab) - g == std::max_element(w, w + vocab) - w;
  }
  c.argmax_agreement = rows ? double(agree) / double(rows) : 1.0;
  return c;
}

}  // namespace kiln::test

namespace kiln::test {

// A scratch directory removed when the object goes away.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "kiln-test-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  // A copy of an oracle fixture inside this directory (under another name if given).
  std::string copy_fixture(const std::string& name, const std::string& as = "") const {
    const auto dst = std::filesystem::path(path_) / (as.empty() ? name : as);
    std::filesystem::copy(fixture_path(name), dst, std::filesystem::copy_options::recursive);
    return dst.string();
  }

 private:
  std::string path_;
};

struct CommandResult {
  int exit_code = 0;
  std::string output;  // stdout and stderr together
};

// Runs a shell command, capturing its output (stdout, and stderr unless told otherwise).
inline CommandResult run_command(const std::string& command, bool with_stderr = true) {
  CommandResult r;
  FILE* pipe = popen((command + (with_stderr ? " 2>&1" : " 2>/dev/null")).c_str(), "r");
  if (!pipe) return {-1, "popen failed"};
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) r.output.append(buffer, n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace kiln::test
