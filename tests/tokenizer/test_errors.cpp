// Bad input gives one-line errors, never a crash: invalid UTF-8, missing or corrupt files, ids
// outside the vocabulary.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tokenizer_test_util.h"

namespace kiln::test {
namespace {

using json = nlohmann::json;

std::shared_ptr<const Tokenizer> small_tokenizer() {
  json vocab = {{"a", 0}, {"b", 1}, {"ab", 2}, {"<unk>", 3}};
  return toy_tokenizer(vocab, json::array({"a b"}), {{"model", {{"unk_token", "<unk>"}}}});
}

void expect_one_line_error(const Status& status, const std::string& fragment) {
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find(fragment), std::string::npos) << status.error().message;
  EXPECT_EQ(status.error().message.find('\n'), std::string::npos) << status.error().message;
}

template <typename T>
Status status_of(const Result<T>& result) {
  if (result.ok()) return ok_status();
  return result.error();
}

// An empty vocabulary, and ids far past the vocabulary's size (the id table would take gigabytes),
// are refused when the tokenizer loads.
TEST(Errors, VocabularyWithoutTokensOrWithAStrayHugeId) {
  for (const auto& [vocab, fragment] : std::vector<std::pair<json, std::string>>{
           {json::object(), "model.vocab is empty"},
           {json{{"a", 0}, {"b", 1}, {"ab", 1000000000}}, "ids reach 1000000000 for 3 tokens"}}) {
    std::string error;
    EXPECT_EQ(toy_tokenizer(vocab, json::array(), json::object(), &error), nullptr);
    EXPECT_NE(error.find(fragment), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }
}

TEST(Errors, InvalidUtf8IsAnErrorNotACrash) {
  auto tokenizer = small_tokenizer();
  ASSERT_TRUE(tokenizer);
  const std::vector<std::string> invalid = {
      "\xff",              // never valid
      "ab\xc3",            // truncated two-byte sequence
      "\xc0\xaf",          // overlong '/'
      "\xed\xa0\x80",      // a UTF-16 surrogate
      "\xf4\x90\x80\x80",  // above U+10FFFF
      "a\x80"
      "b",         // lone continuation byte
      "\xe2\x82",  // truncated three-byte sequence
  };
  for (const std::string& text : invalid) {
    auto ids = tokenizer->encode(text);
    expect_one_line_error(status_of(ids), "not valid UTF-8");
  }
  EXPECT_TRUE(tokenizer->encode(std::string("a\0b", 3)).ok());  // NUL is valid UTF-8
}

TEST(Errors, InvalidUtf8WithRealTokenizer) {
  KILN_REQUIRE_NPM_ASSETS();
  auto qwen = real_tokenizer("qwen3");
  ASSERT_TRUE(qwen);
  expect_one_line_error(status_of(qwen->encode("hello \xf0\x9f\x98 world")), "offset 6");
}

// Sequences of components nested thousands deep overflowed the stack as they were built; past 64
// levels they are refused by name, and a few levels still load.
TEST(Errors, DeeplyNestedSequencesAreRefused) {
  const json vocab = {{"a", 0}, {"b", 1}};
  struct Kind {
    std::string section, list, leaf;
  };
  for (const Kind& k : std::vector<Kind>{{"normalizer", "normalizers", R"({"type": "NFC"})"},
                                         {"pre_tokenizer", "pretokenizers", R"({"type": "ByteLevel"})"},
                                         {"decoder", "decoders", R"({"type": "ByteLevel"})"},
                                         {"post_processor", "processors", R"({"type": "ByteLevel"})"}}) {
    auto nested = [&](int levels) {
      std::string text;
      for (int i = 0; i < levels; ++i) text += R"({"type": "Sequence", ")" + k.list + R"(": [)";
      text += k.leaf;
      for (int i = 0; i < levels; ++i) text += "]}";
      return json{{k.section, json::parse(text)}};
    };
    std::string error;
    EXPECT_EQ(toy_tokenizer(vocab, json::array(), nested(1000), &error), nullptr) << k.section;
    EXPECT_NE(error.find(k.section + " Sequences nested deeper than 64"), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
    error.clear();
    EXPECT_NE(toy_tokenizer(vocab, json::array(), nested(3), &error), nullptr) << error;
  }
}

TEST(Errors, DecodeSkipsIdsOutsideTheVocabulary) {
  auto tokenizer = small_tokenizer();
  ASSERT_TRUE(tokenizer);
  EXPECT_EQ(*tokenizer->decode(std::vector<int32_t>{-5, 2, 1000000, INT32_MAX, 0}), "ab a");
  EXPECT_EQ(*tokenizer->decode(std::vector<int32_t>{}), "");
  IncrementalDecoder decoder(tokenizer);
  EXPECT_EQ(decoder.push(-1) + decoder.push(2) + decoder.push(99) + decoder.flush(), "ab");
}

class TokenizerFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kiln_tokenizer_errors_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& content) {
    std::ofstream(dir_ / name, std::ios::binary) << content;
  }
  Status load() { return status_of(Tokenizer::load(dir_.string())); }
  std::filesystem::path dir_;
};

TEST_F(TokenizerFilesTest, MissingDirectory) {
  expect_one_line_error(status_of(Tokenizer::load((dir_ / "nope").string())), "does not exist");
}

TEST_F(TokenizerFilesTest, MissingTokenizerJson) {
  expect_one_line_error(load(), "has no tokenizer.json");
}

TEST_F(TokenizerFilesTest, CorruptJson) {
  write("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [)");
  expect_one_line_error(load(), "tokenizer.json: invalid JSON");
  write("tokenizer.json", "");
  expect_one_line_error(load(), "tokenizer.json: invalid JSON");
  write("tokenizer.json", "[1, 2]");
  expect_one_line_error(load(), "not a JSON object");
  write("tokenizer.json", "\x89PNG\r\n\x1a\n");
  expect_one_line_error(load(), "invalid JSON");
}

TEST_F(TokenizerFilesTest, InconsistentContent) {
  write("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})");
  expect_one_line_error(load(), "not in the vocabulary");
  write("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}})");
  expect_one_line_error(load(), "makes 'ab', which is not in the vocabulary");
  write("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": -1}, "merges": []}})");
  expect_one_line_error(load(), "invalid id");
  write("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b c"]}})");
  expect_one_line_error(load(), "not two tokens");
  // a token with a newline in the message stays on one line
  write("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["\n\n", "a"]]}})");
  expect_one_line_error(load(), "('\\n\\n a')");
  write("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}}})");
  expect_one_line_error(load(), "no merges");
  write("tokenizer.json", R"({"normalizer": {"type": "NFC"}})");
  expect_one_line_error(load(), "unsupported model type");
  write("tokenizer.json", R"({"model": {"type": 3, "vocab": {"a": 0}, "merges": []}})");  // was read as BPE
  expect_one_line_error(load(), "model.type 3 is not a string");
  write("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                              "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}})");
  expect_one_line_error(load(), "cannot compile regex");
  write("tokenizer.json",
        R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "added_tokens": [{"content": 5}]})");
  expect_one_line_error(load(), "added token");
}

TEST_F(TokenizerFilesTest, CorruptConfig) {
  write("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
  EXPECT_TRUE(load().ok());
  write("tokenizer_config.json", "{not json");
  expect_one_line_error(load(), "tokenizer_config.json: invalid JSON");
  // both were taken as no file at all
  write("tokenizer_config.json", "");
  expect_one_line_error(load(), "tokenizer_config.json is empty, not a JSON object");
  write("tokenizer_config.json", "[1, 2]");
  expect_one_line_error(load(), "tokenizer_config.json: not a JSON object");
  write("tokenizer_config.json", "{}");
  write("generation_config.json", "");
  expect_one_line_error(load(), "generation_config.json is empty");
}

}  // namespace
}  // namespace kiln::test
