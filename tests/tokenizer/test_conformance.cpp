// Conformance: kiln's ids and decoded text must equal the references that transformers.js
// computed on the same tokenizer files (tests/tokenizer/references, made by
// tools/tokenizer/make_references.sh), for every string of tests/tokenizer/corpus.json.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tokenizer_test_util.h"

namespace kiln::test {
namespace {

struct Mismatch {
  std::string name;
  std::string what;
};

void check_against_reference(const std::string& tokenizer_name) {
  KILN_REQUIRE_NPM_ASSETS();
  auto tokenizer = real_tokenizer(tokenizer_name);
  ASSERT_TRUE(tokenizer);
  const nlohmann::json corpus = read_json_file(source_dir() + "/tests/tokenizer/corpus.json");
  const nlohmann::json expected = reference(tokenizer_name);
  std::map<std::string, std::string> text_of;
  for (const auto& item : corpus["cases"]) text_of[item["name"]] = item["text"];
  ASSERT_EQ(expected["cases"].size(), corpus["cases"].size()) << "references are stale: rerun make_references.sh";

  std::vector<Mismatch> mismatches;
  size_t checks = 0;
  for (const auto& ref : expected["cases"]) {
    const std::string name = ref["name"];
    ASSERT_TRUE(text_of.contains(name)) << name << " is not in the corpus: rerun make_references.sh";
    const std::string& text = text_of[name];
    auto compare_ids = [&](bool add_special, const nlohmann::json& want) {
      ++checks;
      auto ids = tokenizer->encode(text, add_special);
      if (!ids.ok()) {
        mismatches.push_back({name, "encode failed: " + ids.error().message});
        return;
      }
      const auto want_ids = want.get<std::vector<int32_t>>();
      if (*ids != want_ids)
        mismatches.push_back(
            {name, fmt::format("encode(add_special={}) of {}\n    want {}\n    got  {}", add_special, escaped(text),
                               nlohmann::json(want_ids).dump(), nlohmann::json(*ids).dump())});
    };
    auto compare_decode = [&](const nlohmann::json& ids_json, bool skip_special, const std::string& want) {
      ++checks;
      const auto ids = ids_json.get<std::vector<int32_t>>();
      auto text_out = tokenizer->decode(ids, skip_special);
      if (!text_out.ok()) {
        mismatches.push_back({name, "decode failed: " + text_out.error().message});
      } else if (*text_out != want) {
        mismatches.push_back({name, fmt::format("decode(skip_special={})\n    want {}\n    got  {}", skip_special,
                                                escaped(want), escaped(*text_out))});
      }
    };
    compare_ids(false, ref["ids"]);
    compare_ids(true, ref["ids_with_special"]);
    compare_decode(ref["ids"], false, ref["decoded"]);
    compare_decode(ref["ids_with_special"], true, ref["decoded_skip_special"]);
  }
  for (size_t i = 0; i < std::min<size_t>(mismatches.size(), 15); ++i)
    ADD_FAILURE() << mismatches[i].name << ": " << mismatches[i].what;
  EXPECT_TRUE(mismatches.empty()) << mismatches.size() << " of " << checks << " checks differ";
  std::printf("%s: %zu cases, %zu checks (encode, encode+special, decode, decode skip-special), %zu mismatches\n",
              tokenizer_name.c_str(), expected["cases"].size(), checks, mismatches.size());
}

TEST(Conformance, Qwen3MatchesTransformersJs) {
  check_against_reference("qwen3");
}

TEST(Conformance, Gemma3MatchesTransformersJs) {
  check_against_reference("gemma3");
}

// Qwen 3.5's regex (marks are letters, digits one at a time) on Qwen 3's vocabulary.
TEST(Conformance, Qwen3_5RegexVariantMatchesTransformersJs) {
  check_against_reference("qwen3_5_variant");
}

TEST(Conformance, SpecialTokenIdsAndConfig) {
  KILN_REQUIRE_NPM_ASSETS();
  auto qwen = real_tokenizer("qwen3");
  ASSERT_TRUE(qwen);
  EXPECT_EQ(qwen->vocab_size(), 151669);
  EXPECT_EQ(qwen->token_to_id("<|endoftext|>"), 151643);
  EXPECT_EQ(qwen->token_to_id("<|im_start|>"), 151644);
  EXPECT_EQ(qwen->token_to_id("<|im_end|>"), 151645);
  EXPECT_EQ(qwen->id_to_token(151644), "<|im_start|>");
  EXPECT_EQ(qwen->id_to_token(9707), "Hello");
  EXPECT_FALSE(qwen->id_to_token(200000).has_value());
  EXPECT_FALSE(qwen->bos_id().has_value());
  EXPECT_EQ(qwen->eos_ids(), std::vector<int32_t>{151645});
  EXPECT_TRUE(qwen->is_special(151644));
  EXPECT_FALSE(qwen->is_special(151667));  // <think> is an added token but not special
  EXPECT_FALSE(qwen->is_special(9707));
}

TEST(Conformance, GemmaSpecialTokenIdsAndConfig) {
  KILN_REQUIRE_NPM_ASSETS();
  auto gemma = real_tokenizer("gemma3");
  ASSERT_TRUE(gemma);
  EXPECT_EQ(gemma->vocab_size(), 262145);
  EXPECT_EQ(gemma->bos_id(), 2);
  EXPECT_EQ(gemma->eos_ids(), std::vector<int32_t>{106});  // <end_of_turn>
  EXPECT_EQ(gemma->token_to_id("<0x0A>"), 248);
  EXPECT_EQ(gemma->token_to_id("\n"), 107);
  EXPECT_TRUE(gemma->is_special(2));
  EXPECT_TRUE(gemma->is_special(106));
  EXPECT_FALSE(gemma->is_special(4));  // <mask> is an added token but not special
  auto ids = gemma->encode("Hello", true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->front(), 2);
}

}  // namespace
}  // namespace kiln::test
