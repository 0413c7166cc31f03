// The components of the general machinery on small synthetic tokenizer.json files, with expected
// values worked out from HF tokenizers' rules (cited per test). Most use a "piece vocabulary":
// ignore_merges with every expected piece in the vocabulary, so that ids show how text was split.
#include <gtest/gtest.h>

#include "tokenizer_test_util.h"

namespace kiln::test {
namespace {

using json = nlohmann::json;

// A vocabulary of the given strings (ids in order) plus <unk>.
json vocab_of(const std::vector<std::string>& tokens) {
  json vocab = json::object();
  for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = int(i);
  if (!vocab.contains("<unk>")) vocab["<unk>"] = int(tokens.size());
  return vocab;
}

// Tokenizer whose model maps each piece in the vocabulary to one token (ignore_merges).
std::shared_ptr<const Tokenizer> piece_tokenizer(const std::vector<std::string>& pieces, json overrides) {
  json model = {{"ignore_merges", true}, {"unk_token", "<unk>"}};
  if (overrides.contains("model")) model.update(overrides["model"]);
  overrides["model"] = model;
  std::string error;
  auto tokenizer = toy_tokenizer(vocab_of(pieces), json::array(), overrides, &error);
  EXPECT_TRUE(tokenizer) << error;
  return tokenizer;
}

std::vector<std::string> tokens_of(const Tokenizer& tokenizer, const std::string& text, bool add_special = false) {
  auto ids = tokenizer.encode(text, add_special);
  EXPECT_TRUE(ids.ok()) << (ids.ok() ? "" : ids.error().message);
  std::vector<std::string> tokens;
  if (ids.ok())
    for (int32_t id : *ids) tokens.push_back(tokenizer.id_to_token(id).value_or("?"));
  return tokens;
}

using Tokens = std::vector<std::string>;

TEST(Bpe, MergesInStringAndPairFormAgree) {
  const json vocab = vocab_of({"a", "b", "c", "ab", "bc", "abc"});
  auto strings = toy_tokenizer(vocab, json::array({"a b", "ab c"}));
  auto pairs = toy_tokenizer(vocab, json::array({json::array({"a", "b"}), json::array({"ab", "c"})}));
  ASSERT_TRUE(strings && pairs);
  EXPECT_EQ(tokens_of(*strings, "abc"), Tokens{"abc"});
  EXPECT_EQ(tokens_of(*pairs, "abc"), Tokens{"abc"});
  EXPECT_EQ(tokens_of(*pairs, "cab"), (Tokens{"c", "ab"}));
}

TEST(Bpe, LowestRankFirstThenLeftmost) {
  const json vocab = vocab_of({"a", "b", "c", "ab", "bc", "abc", "aa"});
  // "b c" outranks "a b": abc -> a + bc; "a bc" is not a merge, so it stays two tokens
  auto tokenizer = toy_tokenizer(vocab, json::array({"b c", "a b", "ab c"}));
  ASSERT_TRUE(tokenizer);
  EXPECT_EQ(tokens_of(*tokenizer, "abc"), (Tokens{"a", "bc"}));
  // equal ranks: the leftmost pair merges first
  auto repeats = toy_tokenizer(vocab, json::array({"a a"}));
  ASSERT_TRUE(repeats);
  EXPECT_EQ(tokens_of(*repeats, "aaa"), (Tokens{"aa", "a"}));
  EXPECT_EQ(tokens_of(*repeats, "aaaa"), (Tokens{"aa", "aa"}));
}

TEST(Bpe, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  const json vocab = vocab_of({"a", "b", "c", "ab", "abc", "bc"});
  auto merging = toy_tokenizer(vocab, json::array({"b c"}));
  auto ignoring = toy_tokenizer(vocab, json::array({"b c"}), {{"model", {{"ignore_merges", true}}}});
  ASSERT_TRUE(merging && ignoring);
  EXPECT_EQ(tokens_of(*merging, "abc"), (Tokens{"a", "bc"}));
  EXPECT_EQ(tokens_of(*ignoring, "abc"), Tokens{"abc"});
}

TEST(Bpe, UnknownCharactersBecomeUnkFusedOrNot) {
  const json vocab = vocab_of({"a", "<unk>"});
  auto fused = toy_tokenizer(vocab, json::array(), {{"model", {{"unk_token", "<unk>"}, {"fuse_unk", true}}}});
  auto separate = toy_tokenizer(vocab, json::array(), {{"model", {{"unk_token", "<unk>"}, {"fuse_unk", false}}}});
  auto dropped = toy_tokenizer(vocab, json::array());
  ASSERT_TRUE(fused && separate && dropped);
  EXPECT_EQ(tokens_of(*fused, "xya"), (Tokens{"<unk>", "a"}));
  EXPECT_EQ(tokens_of(*separate, "xya"), (Tokens{"<unk>", "<unk>", "a"}));
  EXPECT_EQ(tokens_of(*dropped, "xya"), Tokens{"a"});  // no unk token: HF drops the character
}

TEST(Bpe, ByteFallbackAndItsDecoder) {
  const json vocab = vocab_of({"a", "<0xC3>", "<0xA9>", "<0x41>", "<unk>"});
  auto tokenizer = toy_tokenizer(
      vocab, json::array(),
      {{"model", {{"unk_token", "<unk>"}, {"byte_fallback", true}}},
       {"decoder",
        {{"type", "Sequence"}, {"decoders", json::array({{{"type", "ByteFallback"}}, {{"type", "Fuse"}}})}}}});
  ASSERT_TRUE(tokenizer);
  EXPECT_EQ(tokens_of(*tokenizer, "aé"), (Tokens{"a", "<0xC3>", "<0xA9>"}));
  EXPECT_EQ(tokens_of(*tokenizer, "a€"), (Tokens{"a", "<unk>"}));  // E2 82 AC have no byte tokens
  const int32_t a = 0, c3 = 1, a9 = 2, x41 = 3;
  EXPECT_EQ(*tokenizer->decode(std::vector<int32_t>{a, c3, a9}), "aé");
  // HF: a byte run that is not valid UTF-8 becomes one U+FFFD per byte, whole run included
  EXPECT_EQ(*tokenizer->decode(std::vector<int32_t>{c3, a}),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(*tokenizer->decode(std::vector<int32_t>{x41, c3}), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(*tokenizer->decode(std::vector<int32_t>{x41, a, c3, a9}), "Aaé");
}

TEST(AddedTokens, LeftmostLongestMatchBeforeTheModel) {
  auto tokenizer = piece_tokenizer(
      {"x", "y", "xy"},
      {{"added_tokens", json::array({
                            {{"id", 10}, {"content", "<a>"}, {"special", true}, {"normalized", false}},
                            {{"id", 11}, {"content", "<a><b>"}, {"special", false}, {"normalized", false}},
                        })}});
  ASSERT_TRUE(tokenizer);
  EXPECT_EQ(tokens_of(*tokenizer, "x<a><b>y<a>xy"), (Tokens{"x", "<a><b>", "y", "<a>", "xy"}));
  // decode with skip_special_tokens drops <a> (special) but keeps <a><b>
  auto ids = tokenizer->encode("x<a><b>y<a>");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*tokenizer->decode(*ids, true), "x <a><b> y");  // no decoder: HF joins with spaces
}

TEST(AddedTokens, LstripAndRstripSwallowWhitespace) {
  auto tokenizer =
      piece_tokenizer({"x", "y", " ", "x ", " y"},
                      {{"added_tokens", json::array({
                                            {{"id", 10}, {"content", "<l>"}, {"lstrip", true}, {"normalized", false}},
                                            {{"id", 11}, {"content", "<r>"}, {"rstrip", true}, {"normalized", false}},
                                        })}});
  ASSERT_TRUE(tokenizer);
  EXPECT_EQ(tokens_of(*tokenizer, "x  <l> y"), (Tokens{"x", "<l>", " y"}));
  EXPECT_EQ(tokens_of(*tokenizer, "x <r>  y"), (Tokens{"x ", "<r>", "y"}));
}

TEST(AddedTokens, SingleWordOnlyMatchesWholeWords) {
  auto tokenizer = piece_tokenizer(
      {" cab ", "ab_", " "},
      {{"added_tokens", json::array({
                            {{"id", 10}, {"content", "ab"}, {"single_word", true}, {"normalized", false}},
                        })}});
  ASSERT_TRUE(tokenizer);
  EXPECT_EQ(tokens_of(*tokenizer, "ab cab ab"), (Tokens{"ab", " cab ", "ab"}));
  EXPECT_EQ(tokens_of(*tokenizer, "ab_"), Tokens{"ab_"});  // '_' is a word character (regex \w)
}

TEST(AddedTokens, NormalizedTokensMatchNormalizedText) {
  auto tokenizer = piece_tokenizer({" world", " yes"},
                                   {{"normalizer", {{"type", "Lowercase"}}},
                                    {"added_tokens", json::array({
                                                         {{"id", 10}, {"content", "HELLO"}, {"normalized", true}},
                                                         {{"id", 11}, {"content", "Yes"}, {"normalized", false}},
                                                     })}});
  ASSERT_TRUE(tokenizer);
  // the normalized token's matching form is its lowercased content
  EXPECT_EQ(tokenizer->encode("Hello world").value(), (std::vector<int32_t>{10, 0}));
  EXPECT_EQ(tokenizer->encode("Yes yes").value(), (std::vector<int32_t>{11, 1}));
  // no match either way: every character is unknown (<unk> is id 2)
  EXPECT_EQ(tokenizer->encode("YES yes").value(), std::vector<int32_t>(7, 2));
}

TEST(Normalizers, UnicodeFormsCaseStripPrependReplace) {
  auto nfkc = piece_tokenizer({"fi", "Å"}, {{"normalizer", {{"type", "NFKC"}}}});
  auto nfc = piece_tokenizer({"é", "Å"}, {{"normalizer", {{"type", "NFC"}}}});
  auto strip =
      piece_tokenizer({"ab"}, {{"normalizer", {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}}});
  auto sentencepiece = piece_tokenizer(
      {"▁a▁b"}, {{"normalizer",
                  {{"type", "Sequence"},
                   {"normalizers", json::array({
                                       {{"type", "Prepend"}, {"prepend", "▁"}},
                                       {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}},
                                   })}}}});
  auto collapse = piece_tokenizer(
      {"a b"}, {{"normalizer", {{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", " "}}}});
  ASSERT_TRUE(nfkc && nfc && strip && sentencepiece && collapse);
  EXPECT_EQ(tokens_of(*nfkc, "ﬁ"), Tokens{"fi"});
  EXPECT_EQ(tokens_of(*nfc, "e\u0301"), Tokens{"é"});
  EXPECT_EQ(tokens_of(*nfc, "\u212b"), Tokens{"Å"});  // Angstrom sign -> A with ring
  EXPECT_EQ(tokens_of(*strip, " \t ab \u3000"), Tokens{"ab"});
  EXPECT_EQ(tokens_of(*sentencepiece, "a b"), Tokens{"▁a▁b"});
  EXPECT_EQ(tokens_of(*collapse, "a \t\n\u00a0b"), Tokens{"a b"});
}

// HF's NormalizedString::split behaviors on "a-b--c" split at "-".
TEST(PreTokenizers, SplitBehaviors) {
  const std::vector<std::string> pieces = {"a", "b", "c", "-", "--", "a-", "b-", "-b", "-c"};
  auto split = [&](const std::string& behavior, bool invert) {
    return piece_tokenizer(
        pieces, {{"pre_tokenizer",
                  {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}}}});
  };
  EXPECT_EQ(tokens_of(*split("Removed", false), "a-b--c"), (Tokens{"a", "b", "c"}));
  EXPECT_EQ(tokens_of(*split("Isolated", false), "a-b--c"), (Tokens{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(tokens_of(*split("MergedWithPrevious", false), "a-b--c"), (Tokens{"a-", "b-", "-", "c"}));
  EXPECT_EQ(tokens_of(*split("MergedWithNext", false), "a-b--c"), (Tokens{"a", "-b", "-", "-c"}));
  EXPECT_EQ(tokens_of(*split("Contiguous", false), "a-b--c"), (Tokens{"a", "-", "b", "--", "c"}));
  EXPECT_EQ(tokens_of(*split("Removed", true), "a-b--c"), (Tokens{"-", "-", "-"}));
}

TEST(PreTokenizers, DigitsMetaspaceWhitespace) {
  auto individual = piece_tokenizer({"ab", "12", "345", "1", "2", "3", "4", "5", "c"},
                                    {{"pre_tokenizer", {{"type", "Digits"}, {"individual_digits", true}}}});
  auto grouped = piece_tokenizer({"ab", "12", "345", "c"},
                                 {{"pre_tokenizer", {{"type", "Digits"}, {"individual_digits", false}}}});
  auto metaspace =
      piece_tokenizer({"▁hello", "▁world", "hello"},
                      {{"pre_tokenizer",
                        {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}, {"split", true}}}});
  auto metaspace_first = piece_tokenizer(
      {"▁a", "<x>", "b"},
      {{"pre_tokenizer", {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "first"}, {"split", false}}},
       {"added_tokens", json::array({{{"id", 20}, {"content", "<x>"}, {"normalized", false}}})}});
  auto whitespace = piece_tokenizer({"hello", "world!?"}, {{"pre_tokenizer", {{"type", "WhitespaceSplit"}}}});
  auto words = piece_tokenizer({"hello", "world", "!?", "it", "'", "s"}, {{"pre_tokenizer", {{"type", "Whitespace"}}}});
  ASSERT_TRUE(individual && grouped && metaspace && metaspace_first && whitespace && words);
  EXPECT_EQ(tokens_of(*individual, "ab12c345"), (Tokens{"ab", "1", "2", "c", "3", "4", "5"}));
  EXPECT_EQ(tokens_of(*grouped, "ab12c345"), (Tokens{"ab", "12", "c", "345"}));
  EXPECT_EQ(tokens_of(*metaspace, "hello world"), (Tokens{"▁hello", "▁world"}));
  // "first": only the piece at the start of the text gets the prefix
  EXPECT_EQ(tokens_of(*metaspace_first, "a<x>b"), (Tokens{"▁a", "<x>", "b"}));
  EXPECT_EQ(tokens_of(*whitespace, " hello\t world!? "), (Tokens{"hello", "world!?"}));
  EXPECT_EQ(tokens_of(*words, "hello world!? it's"), (Tokens{"hello", "world", "!?", "it", "'", "s"}));
}

TEST(PreTokenizers, ByteLevelWithGpt2RegexAndPrefixSpace) {
  // byte-level alphabet: ' ' is 'Ġ'; with use_regex the GPT-2 pattern splits words off
  auto tokenizer =
      piece_tokenizer({"Ġhello", "Ġworld", "!"},
                      {{"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}}},
                       {"decoder", {{"type", "ByteLevel"}}}});
  ASSERT_TRUE(tokenizer);
  EXPECT_EQ(tokens_of(*tokenizer, "hello world!"), (Tokens{"Ġhello", "Ġworld", "!"}));
  auto ids = tokenizer->encode("hello world!");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*tokenizer->decode(*ids), " hello world!");
}

TEST(Decoders, NoDecoderStripReplace) {
  auto plain = piece_tokenizer({"a", "b"}, {});
  auto strip =
      piece_tokenizer({"_a", "_b"}, {{"decoder", {{"type", "Strip"}, {"content", "_"}, {"start", 1}, {"stop", 0}}}});
  auto replace = piece_tokenizer(
      {"▁a", "▁b"},
      {{"decoder",
        {{"type", "Sequence"},
         {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                                   {{"type", "Fuse"}}})}}}});
  ASSERT_TRUE(plain && strip && replace);
  EXPECT_EQ(*plain->decode(std::vector<int32_t>{0, 1, 0}), "a b a");
  EXPECT_EQ(*strip->decode(std::vector<int32_t>{0, 1}), "ab");
  EXPECT_EQ(*replace->decode(std::vector<int32_t>{0, 1}), " a b");
}

TEST(PostProcessors, TemplateBertAndConfigFallback) {
  const json added = json::array(
      {{{"id", 10}, {"content", "<s>"}, {"special", true}}, {{"id", 11}, {"content", "</s>"}, {"special", true}}});
  auto templated =
      piece_tokenizer({"a"}, {{"added_tokens", added},
                              {"post_processor",
                               {{"type", "TemplateProcessing"},
                                {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                                        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                                        {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}})},
                                {"pair", json::array()},
                                {"special_tokens",
                                 {{"<s>", {{"id", "<s>"}, {"ids", {10}}, {"tokens", {"<s>"}}}},
                                  {"</s>", {{"id", "</s>"}, {"ids", {11}}, {"tokens", {"</s>"}}}}}}}}});
  auto bert = piece_tokenizer(
      {"a"}, {{"added_tokens", added},
              {"post_processor", {{"type", "BertProcessing"}, {"cls", {"<s>", 10}}, {"sep", {"</s>", 11}}}}});
  ASSERT_TRUE(templated && bert);
  EXPECT_EQ(templated->encode("a", true).value(), (std::vector<int32_t>{10, 0, 11}));
  EXPECT_EQ(templated->encode("a", false).value(), (std::vector<int32_t>{0}));
  EXPECT_EQ(bert->encode("a", true).value(), (std::vector<int32_t>{10, 0, 11}));

  // without a post-processor, tokenizer_config.json's add_bos_token applies
  json document = {{"added_tokens", added},
                   {"model", {{"type", "BPE"}, {"vocab", vocab_of({"a"})}, {"merges", json::array()}}}};
  TokenizerFiles files;
  files.tokenizer_json = document.dump();
  files.tokenizer_config_json = R"({"bos_token": {"content": "<s>"}, "eos_token": "</s>", "add_bos_token": true})";
  files.generation_config_json = R"({"eos_token_id": [11, 12]})";
  auto configured = Tokenizer::from_files(files);
  ASSERT_TRUE(configured.ok()) << configured.error().message;
  EXPECT_EQ((*configured)->encode("a", true).value(), (std::vector<int32_t>{10, 0}));
  EXPECT_EQ((*configured)->bos_id(), 10);
  EXPECT_EQ((*configured)->eos_ids(), (std::vector<int32_t>{11, 12}));

  // without generation_config.json, config.json's ids as transformers' GenerationConfig reads them
  // (from_model_config): a wrapper's top-level eos_token_id, else its text_config's
  files.generation_config_json.clear();
  files.tokenizer_config_json.clear();
  const std::vector<std::pair<std::string, std::vector<int32_t>>> configs = {
      {R"({"eos_token_id": 12, "text_config": {"eos_token_id": 11}})", {12}},
      {R"({"text_config": {"eos_token_id": [11, 12]}})", {11, 12}},
      {R"({"eos_token_id": null, "text_config": {"eos_token_id": 11}})", {11}},
      {R"({"eos_token_id": 11})", {11}},
      {R"({"model_type": "qwen3_5"})", {}},
  };
  for (const auto& [config, want] : configs) {
    files.config_json = config;
    auto from_config = Tokenizer::from_files(files);
    ASSERT_TRUE(from_config.ok()) << from_config.error().message;
    EXPECT_EQ((*from_config)->eos_ids(), want) << config;
  }
}

TEST(Components, UnsupportedTypesAreRefusedByName) {
  const json vocab = vocab_of({"a"});
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"model", {{"type", "WordPiece"}}}}, "unsupported model type 'WordPiece'"},
      {{{"normalizer", {{"type", "BertNormalizer"}}}}, "unsupported normalizer type 'BertNormalizer'"},
      {{{"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", json::array({{{"type", "Punctuation"}}})}}}},
       "unsupported pre_tokenizer type 'Punctuation'"},
      {{{"decoder", {{"type", "CTC"}}}}, "unsupported decoder type 'CTC'"},
      {{{"post_processor", {{"type", "Mystery"}}}}, "unsupported post_processor type 'Mystery'"},
      {{{"model", {{"dropout", 0.1}}}}, "dropout"},
  };
  for (const auto& [overrides, message] : cases) {
    std::string error;
    EXPECT_FALSE(toy_tokenizer(vocab, json::array(), overrides, &error)) << overrides.dump();
    EXPECT_NE(error.find(message), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
    EXPECT_TRUE(error.starts_with("toy/tokenizer.json: ")) << error;
  }
}

}  // namespace
}  // namespace kiln::test
