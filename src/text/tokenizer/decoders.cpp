#include "text/tokenizer/decoders.h"

#include <fmt/format.h>

#include "text/tokenizer/component_json.h"
#include "text/tokenizer/regex.h"
#include "text/tokenizer/unicode.h"

namespace kiln::tokenization {

namespace {

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  Status decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_) KILN_TRY(step->decode_chain(tokens));
    return ok_status();
  }
  Result<bool> is_final(const std::vector<std::string>& tokens) const override {
    // each step judges its own input: run the chain step by step
    std::vector<std::string> current = tokens;
    for (const auto& step : steps_) {
      KILN_ASSIGN(bool final, step->is_final(current));
      if (!final) return false;
      KILN_TRY(step->decode_chain(current));
    }
    return true;
  }
  std::string describe() const override {
    std::vector<std::string> names;
    for (const auto& step : steps_) names.push_back(step->describe());
    return fmt::format("Sequence[{}]", fmt::join(names, ", "));
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

// Byte-level alphabet characters back to bytes, then bytes to UTF-8 text (lossy).
class ByteLevelDecoder final : public Decoder {
 public:
  Status decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes = to_bytes(tokens);
    std::string text;
    text.reserve(bytes.size());
    append_utf8_lossy(text, bytes);
    tokens.assign(1, std::move(text));
    return ok_status();
  }
  Result<bool> is_final(const std::vector<std::string>& tokens) const override {
    return !ends_with_incomplete_utf8(to_bytes(tokens));
  }
  std::string describe() const override { return "ByteLevel"; }

 private:
  // A token whose characters are all in the alphabet becomes their bytes; any other token (an
  // added token such as "<|im_start|>" in a non-byte-level spelling) keeps its UTF-8 bytes.
  static std::string to_bytes(const std::vector<std::string>& tokens) {
    const ByteLevelAlphabet& alphabet = byte_level_alphabet();
    std::string bytes;
    for (const std::string& token : tokens) {
      const size_t start = bytes.size();
      bool in_alphabet = true;
      size_t offset = 0;
      while (offset < token.size()) {
        const char32_t c = next_code_point(token, offset);
        const int byte = c < alphabet.byte_of_char.size() ? alphabet.byte_of_char[c] : -1;
        if (byte < 0) {
          in_alphabet = false;
          break;
        }
        bytes.push_back(char(byte));
      }
      if (!in_alphabet) {
        bytes.resize(start);
        bytes.append(token);
      }
    }
    return bytes;
  }
};

// "<0xNN>" tokens: runs of them become the text of their bytes, or one U+FFFD per byte when the
// run is not valid UTF-8 (HF's rule; transformers.js instead replaces maximal subparts).
class ByteFallbackDecoder final : public Decoder {
 public:
  Status decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string run;
    size_t run_length = 0;
    auto end_run = [&] {
      if (run_length == 0) return;
      if (is_valid_utf8(run)) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run_length; ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      run.clear();
      run_length = 0;
    };
    for (std::string& token : tokens) {
      if (int byte = byte_of(token); byte >= 0) {
        run.push_back(char(byte));
        ++run_length;
        continue;
      }
      end_run();
      out.push_back(std::move(token));
    }
    end_run();
    tokens = std::move(out);
    return ok_status();
  }
  Result<bool> is_final(const std::vector<std::string>& tokens) const override {
    return tokens.empty() || byte_of(tokens.back()) < 0;
  }
  std::string describe() const override { return "ByteFallback"; }

 private:
  static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  // The byte of a "<0xNN>" token, or -1.
  static int byte_of(const std::string& token) {
    if (token.size() != 6 || !token.starts_with("<0x") || token[5] != '>') return -1;
    const int high = hex_value(token[3]);
    const int low = hex_value(token[4]);
    return high < 0 || low < 0 ? -1 : high * 16 + low;
  }
};

class FuseDecoder final : public Decoder {
 public:
  Status decode_chain(std::vector<std::string>& tokens) const override {
    std::string joined;
    for (const std::string& token : tokens) joined += token;
    tokens.assign(1, std::move(joined));
    return ok_status();
  }
  std::string describe() const override { return "Fuse"; }
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  Status decode_chain(std::vector<std::string>& tokens) const override {
    std::string replaced;
    for (std::string& token : tokens) {
      replaced.clear();
      size_t copied = 0;
      bool matched = false;
      KILN_TRY(pattern_.for_each_match(token, [&](size_t begin, size_t end) {
        replaced.append(token, copied, begin - copied);
        replaced.append(content_);
        copied = end;
        matched = true;
      }));
      if (!matched) continue;
      replaced.append(token, copied);
      token.swap(replaced);
    }
    return ok_status();
  }
  std::string describe() const override { return "Replace"; }

 private:
  Pattern pattern_;
  std::string content_;
};

// Removes up to `start` leading and `stop` trailing occurrences of a character from each token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  Status decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) {
      size_t begin = 0;
      for (size_t i = 0; i < start_ && begin < token.size(); ++i) {
        size_t next = begin;
        if (next_code_point(token, next) != content_) break;
        begin = next;
      }
      size_t end = token.size();
      for (size_t i = 0; i < stop_ && end > begin; ++i) {
        size_t previous = end;
        if (previous_code_point(token, previous) != content_) break;
        end = previous;
      }
      token = token.substr(begin, end - begin);
    }
    return ok_status();
  }
  std::string describe() const override { return "Strip"; }

 private:
  char32_t content_;
  size_t start_;
  size_t stop_;
};

// The replacement character back to spaces; HF drops it altogether in the first token (the
// space the pre-tokenizer prepended) unless prepend_scheme is "never".
class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool drop_in_first)
      : replacement_(std::move(replacement)), drop_in_first_(drop_in_first) {}
  Status decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& token = tokens[i];
      std::string out;
      const std::string_view space = i == 0 && drop_in_first_ ? "" : " ";
      for (size_t at = 0; at < token.size();) {
        if (token.compare(at, replacement_.size(), replacement_) == 0) {
          out += space;
          at += replacement_.size();
        } else {
          out += token[at++];
        }
      }
      token.swap(out);
    }
    return ok_status();
  }
  std::string describe() const override { return "Metaspace"; }

 private:
  std::string replacement_;
  bool drop_in_first_;
};

Result<char32_t> single_char(const std::string& text, const char* what) {
  size_t offset = 0;
  if (text.empty() || !is_valid_utf8(text)) return make_error("{} must be one character", what);
  const char32_t c = next_code_point(text, offset);
  if (offset != text.size()) return make_error("{} must be one character, not '{}'", what, text);
  return c;
}

}  // namespace

Result<std::unique_ptr<Decoder>> parse_decoder(const nlohmann::json& spec, int depth) {
  if (spec.is_null()) return std::unique_ptr<Decoder>();
  const std::string type = type_of(spec);
  if (type == "Sequence") {
    if (depth >= kMaxComponentNesting)
      return make_error("decoder Sequences nested deeper than {}", kMaxComponentNesting);
    auto it = spec.find("decoders");
    if (it == spec.end() || !it->is_array()) return make_error("decoder Sequence has no 'decoders' list");
    std::vector<std::unique_ptr<Decoder>> steps;
    for (const auto& step_spec : *it) {
      KILN_ASSIGN(auto step, parse_decoder(step_spec, depth + 1));
      if (step) steps.push_back(std::move(step));
    }
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(steps)));
  }
  if (type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (type == "Replace") {
    KILN_ASSIGN(Pattern pattern, parse_pattern(spec.value("pattern", nlohmann::json()), "decoder Replace"));
    return std::unique_ptr<Decoder>(new ReplaceDecoder(std::move(pattern), string_field(spec, "content")));
  }
  if (type == "Strip") {
    KILN_ASSIGN(char32_t content, single_char(string_field(spec, "content", " "), "decoder Strip content"));
    const auto start = spec.value("start", size_t{0});
    const auto stop = spec.value("stop", size_t{0});
    return std::unique_ptr<Decoder>(new StripDecoder(content, start, stop));
  }
  if (type == "Metaspace") {
    bool drop_in_first = bool_field(spec, "add_prefix_space", true);
    if (spec.contains("prepend_scheme")) drop_in_first = string_field(spec, "prepend_scheme") != "never";
    return std::unique_ptr<Decoder>(new MetaspaceDecoder(string_field(spec, "replacement", "\u2581"), drop_in_first));
  }
  return make_error("unsupported decoder type '{}'", type.empty() ? spec.dump() : type);
}

}  // namespace kiln::tokenization
