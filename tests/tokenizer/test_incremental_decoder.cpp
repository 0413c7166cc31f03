// The incremental decoder against whole-sequence decode: for random id sequences (byte tokens,
// split characters, special tokens, unknown ids) and the corpus' encodings, at every prefix the
// pieces emitted so far plus a flush must equal decode(prefix), every piece must be valid UTF-8,
// and what was emitted must stay a prefix of every later decode.
#include <gtest/gtest.h>

#include <random>

#include "text/tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace kiln::test {
namespace {

// Streams `ids` and checks every prefix; returns the number of failures reported.
int check_stream(const std::shared_ptr<const Tokenizer>& tokenizer, const std::vector<int32_t>& ids,
                 bool skip_special) {
  IncrementalDecoder decoder(tokenizer, skip_special);
  std::string emitted;
  int failures = 0;
  auto fail = [&](const std::string& message) {
    if (failures++ < 3) ADD_FAILURE() << message << "\n  ids " << nlohmann::json(ids).dump();
  };
  for (size_t k = 0; k < ids.size(); ++k) {
    const std::string piece = decoder.push(ids[k]);
    if (!tokenization::is_valid_utf8(piece)) fail("piece is not valid UTF-8: " + escaped(piece));
    emitted += piece;
    const std::span<const int32_t> prefix(ids.data(), k + 1);
    auto whole = tokenizer->decode(prefix, skip_special);
    if (!whole.ok()) {
      fail("decode failed: " + whole.error().message);
      continue;
    }
    if (!whole->starts_with(emitted))
      fail("emitted text is not a prefix of decode(prefix): " + escaped(emitted) + " vs " + escaped(*whole));
    IncrementalDecoder finished = decoder;  // flush a copy: the stream goes on
    const std::string rest = finished.flush();
    if (!tokenization::is_valid_utf8(rest)) fail("flush is not valid UTF-8: " + escaped(rest));
    if (emitted + rest != *whole)
      fail("pieces + flush != decode at prefix " + std::to_string(k + 1) + ": " + escaped(emitted + rest) + " vs " +
           escaped(*whole));
  }
  return failures;
}

// Random sequences drawn from a mix of sources that stress the held-back cases.
std::vector<int32_t> random_ids(std::mt19937& rng, const Tokenizer& tokenizer, const std::vector<int32_t>& pool,
                                const std::vector<int32_t>& byte_ids, const std::vector<int32_t>& special_ids) {
  std::uniform_int_distribution<int> length(1, 48);
  std::uniform_int_distribution<int> source(0, 9);
  std::uniform_int_distribution<int32_t> any(-3, int32_t(tokenizer.vocab_size()) + 50);
  std::vector<int32_t> ids(size_t(length(rng)));
  for (int32_t& id : ids) {
    const int s = source(rng);
    if (s < 3) {
      id = byte_ids[rng() % byte_ids.size()];
    } else if (s < 6) {
      id = pool[rng() % pool.size()];
    } else if (s < 7) {
      id = special_ids[rng() % special_ids.size()];
    } else {
      id = any(rng);
    }
  }
  return ids;
}

void check_real_tokenizer(const std::string& name, const std::vector<int32_t>& byte_ids) {
  KILN_REQUIRE_NPM_ASSETS();
  auto tokenizer = real_tokenizer(name);
  ASSERT_TRUE(tokenizer);
  const nlohmann::json corpus = read_json_file(source_dir() + "/tests/tokenizer/corpus.json");
  std::vector<int32_t> pool;  // ids of real text: multi-byte characters split over tokens, spaces
  int failures = 0;
  size_t streams = 0;
  for (const auto& item : corpus["cases"]) {
    auto ids = tokenizer->encode(item["text"].get<std::string>(), true);
    ASSERT_TRUE(ids.ok());
    if (ids->size() > 64) ids->resize(64);  // every prefix is checked: keep it quadratic in small n
    pool.insert(pool.end(), ids->begin(), ids->end());
    failures += check_stream(tokenizer, *ids, false);
    failures += check_stream(tokenizer, *ids, true);
    streams += 2;
    if (failures > 10) break;
  }
  std::vector<int32_t> special_ids;
  for (int32_t id = 0; id < tokenizer->vocab_size(); ++id)
    if (tokenizer->is_special(id)) special_ids.push_back(id);
  std::mt19937 rng(1234);
  for (int i = 0; i < 300 && failures <= 10; ++i) {
    const auto ids = random_ids(rng, *tokenizer, pool, byte_ids, special_ids);
    failures += check_stream(tokenizer, ids, i % 2 == 0);
    ++streams;
  }
  EXPECT_EQ(failures, 0);
  std::printf("%s: %zu streams checked at every prefix\n", name.c_str(), streams);
}

TEST(IncrementalDecoder, Qwen3ByteLevel) {
  // ids 0..255 of Qwen's vocabulary are the 256 single-byte tokens
  std::vector<int32_t> byte_ids(256);
  for (int i = 0; i < 256; ++i) byte_ids[size_t(i)] = i;
  check_real_tokenizer("qwen3", byte_ids);
}

TEST(IncrementalDecoder, Gemma3ByteFallback) {
  KILN_REQUIRE_NPM_ASSETS();
  auto tokenizer = real_tokenizer("gemma3");
  ASSERT_TRUE(tokenizer);
  std::vector<int32_t> byte_ids;
  for (int b = 0; b < 256; ++b) byte_ids.push_back(*tokenizer->token_to_id(fmt::format("<0x{:02X}>", b)));
  check_real_tokenizer("gemma3", byte_ids);
}

TEST(IncrementalDecoder, HoldsIncompleteCharacters) {
  KILN_REQUIRE_NPM_ASSETS();
  auto gemma = real_tokenizer("gemma3");
  ASSERT_TRUE(gemma);
  // "é" as byte tokens: nothing until the second byte, then the character
  IncrementalDecoder decoder(gemma);
  EXPECT_EQ(decoder.push(*gemma->token_to_id("<0xC3>")), "");
  EXPECT_EQ(decoder.push(*gemma->token_to_id("<0xA9>")), "");  // the byte run may still grow
  EXPECT_EQ(decoder.push(*gemma->token_to_id("▁the")), "é the");
  EXPECT_EQ(decoder.flush(), "");
  // a dangling byte decodes to U+FFFD on flush, as decode does
  EXPECT_EQ(decoder.push(*gemma->token_to_id("<0xE4>")), "");
  EXPECT_EQ(decoder.flush(), "\xEF\xBF\xBD");
}

// Metaspace drops the replacement character in the stream's first token only.
TEST(IncrementalDecoder, MetaspaceFirstTokenRule) {
  nlohmann::json vocab = {{"▁a", 0}, {"b", 1}, {"▁", 2}, {"a", 3}};
  auto tokenizer =
      toy_tokenizer(vocab, nlohmann::json::array(),
                    {{"decoder", {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}}}});
  ASSERT_TRUE(tokenizer);
  EXPECT_EQ(*tokenizer->decode(std::vector<int32_t>{0, 1, 0, 2, 3}), "ab a a");
  IncrementalDecoder decoder(tokenizer);
  std::string text;
  for (int32_t id : {0, 1, 0, 2, 3}) text += decoder.push(id);
  text += decoder.flush();
  EXPECT_EQ(text, "ab a a");
  EXPECT_EQ(check_stream(tokenizer, {2, 0, 1, 2, 2, 3, 0}, false), 0);
}

}  // namespace
}  // namespace kiln::test
