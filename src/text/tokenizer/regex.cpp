#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/tokenizer/regex.h"

#include <pcre2.h>

#include "text/tokenizer/unicode.h"

namespace kiln::tokenization {

namespace {

// Oniguruma's \w, as transformers.js measured it against HF tokenizers.
constexpr std::string_view kWordClassBody = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{B2}\x{B3}\x{B9}\x{BC}-\x{BE})";
constexpr std::string_view kHexDigitBody = "0-9A-Fa-f";

std::string pcre2_error_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

}  // namespace

Result<std::string> translate_oniguruma_pattern(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // a ']' right after '[' or '[^' is a literal member, not the end of the class
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == '[' && in_class && pattern.substr(i, 2) == "[:") {
      // POSIX class such as [:alpha:]: copy through its closing ":]"
      const size_t close = pattern.find(":]", i + 2);
      if (close == std::string_view::npos) return make_error("unterminated POSIX class in regex '{}'", pattern);
      out.append(pattern.substr(i, close + 2 - i));
      i = close + 1;
      continue;
    }
    if (c == '[' && in_class) return make_error("nested character classes are not supported in regex '{}'", pattern);
    if (c == ']' && in_class) {
      in_class = false;
      out += c;
      continue;
    }
    if (c != '\\') {
      out += c;
      continue;
    }
    if (i + 1 >= pattern.size()) return make_error("regex '{}' ends with a lone backslash", pattern);
    const char escape = pattern[++i];
    switch (escape) {
      case 's':
        out += R"(\p{White_Space})";
        break;
      case 'S':
        out += R"(\P{White_Space})";
        break;
      case 'w':
        if (in_class) {
          out += kWordClassBody;
        } else {
          out += '[';
          out += kWordClassBody;
          out += ']';
        }
        break;
      case 'W':
        if (in_class) return make_error("\\W inside a character class is not supported in regex '{}'", pattern);
        out += "[^";
        out += kWordClassBody;
        out += ']';
        break;
      case 'h':
        if (in_class) {
          out += kHexDigitBody;
        } else {
          out += '[';
          out += kHexDigitBody;
          out += ']';
        }
        break;
      case 'H':
        if (in_class) return make_error("\\H inside a character class is not supported in regex '{}'", pattern);
        out += "[^";
        out += kHexDigitBody;
        out += ']';
        break;
      case 'u':
        if (i + 4 < pattern.size() && is_hex(pattern[i + 1]) && is_hex(pattern[i + 2]) && is_hex(pattern[i + 3]) &&
            is_hex(pattern[i + 4])) {
          out += "\\x{";
          out.append(pattern.substr(i + 1, 4));
          out += '}';
          i += 4;
        } else {
          return make_error("malformed \\u escape in regex '{}'", pattern);
        }
        break;
      default:
        out += '\\';
        out += escape;
    }
  }
  return out;
}

struct Pattern::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() { pcre2_code_free(code); }
};

Pattern Pattern::literal(std::string text) {
  Pattern pattern;
  pattern.source_ = std::move(text);
  return pattern;
}

Result<Pattern> Pattern::regex(std::string_view source) {
  KILN_ASSIGN(std::string translated, translate_oniguruma_pattern(source));
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // MULTILINE: Oniguruma's ^ and $ are line anchors
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error_code, &error_offset, nullptr);
  if (code == nullptr)
    return make_error("cannot compile regex '{}': {} at offset {}", source, pcre2_error_message(error_code),
                      error_offset);
  auto compiled = std::make_shared<Compiled>();
  compiled->code = code;
  // the JIT is an optimization only: fall back to the interpreter where it is unavailable
  compiled->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  Pattern pattern;
  pattern.source_ = std::string(source);
  pattern.compiled_ = std::move(compiled);
  return pattern;
}

Status Pattern::for_each_match(std::string_view text, const std::function<void(size_t, size_t)>& on_match) const {
  if (is_literal()) {
    if (source_.empty()) return ok_status();  // an empty literal matches nothing (as HF's Pattern for "")
    for (size_t at = text.find(source_); at != std::string_view::npos; at = text.find(source_, at + source_.size()))
      on_match(at, at + source_.size());
    return ok_status();
  }
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match_data(
      pcre2_match_data_create_from_pattern(compiled_->code, nullptr), &pcre2_match_data_free);
  if (!match_data) return make_error("out of memory for regex match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    // the caller validated the text once: skip PCRE2's per-call UTF-8 check
    int rc = PCRE2_ERROR_JIT_STACKLIMIT;
    if (compiled_->jit)
      rc = pcre2_jit_match(compiled_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, match_data.get(), nullptr);
    // the interpreter keeps its backtracking state on the heap: it takes over when the JIT's
    // fixed stack is too small for a pathological input
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(compiled_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       match_data.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return make_error("regex '{}' failed on the input: {}", source_, pcre2_error_message(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data.get());
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    on_match(begin, end);
    if (end > begin) {
      start = end;
    } else {
      // an empty match: move on by one character, as onig's find_iter does
      if (end >= text.size()) break;
      start = end + utf8_length(static_cast<unsigned char>(text[end]));
    }
  }
  return ok_status();
}

}  // namespace kiln::tokenization
