// Patterns of tokenizer.json (Split pre-tokenizer, Replace normalizer/decoder): either a literal
// string or an Oniguruma regex, which HF tokenizers runs with the onig crate. Regexes run on PCRE2
// (UTF + UCP, JIT) after a small translation of the escapes whose meaning differs between the
// two engines (see translate_oniguruma_pattern).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"

namespace kiln::tokenization {

// Rewrites an Oniguruma pattern into a PCRE2 pattern with the same meaning:
//   \s \S  -> \p{White_Space} \P{White_Space}   (PCRE2's \s also takes U+180E)
//   \w \W  -> Oniguruma's word class (Alphabetic, M, Nd, Pc and a few No), outside brackets
//   \h \H  -> hexadecimal digit (Oniguruma) rather than horizontal space (PCRE2)
//   \uHHHH -> \x{HHHH}
// Everything else (\p{..}, (?i:..), lookarounds, \x{..}) means the same in both.
Result<std::string> translate_oniguruma_pattern(std::string_view pattern);

class Pattern {
 public:
  static Pattern literal(std::string text);
  // `pattern` in Oniguruma syntax, as tokenizer.json's {"Regex": ...}.
  static Result<Pattern> regex(std::string_view pattern);

  // Calls on_match(begin, end) for each non-overlapping match, left to right, as onig's
  // find_iter does (empty matches included). `text` must be valid UTF-8.
  Status for_each_match(std::string_view text, const std::function<void(size_t, size_t)>& on_match) const;

  bool is_literal() const { return compiled_ == nullptr; }
  const std::string& source() const { return source_; }

 private:
  struct Compiled;
  std::string source_;                  // the literal, or the original regex
  std::shared_ptr<Compiled> compiled_;  // null for literals
};

}  // namespace kiln::tokenization
