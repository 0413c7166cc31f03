// UTF-8 and Unicode helpers for the tokenizer, on top of ICU: validation, code point iteration,
// character properties (as Rust's char methods and regex crate define them, since HF tokenizers
// is written in Rust), normalization forms, lowercasing, and the GPT-2 byte <-> char map.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace kiln::tokenization {

inline constexpr size_t kNoPosition = std::string_view::npos;

// Offset of the first byte that is not part of well-formed UTF-8, or kNoPosition.
size_t find_invalid_utf8(std::string_view text);
inline bool is_valid_utf8(std::string_view text) {
  return find_invalid_utf8(text) == kNoPosition;
}

// Number of bytes of the UTF-8 sequence that starts with `lead` (1 for ASCII and for bytes that
// cannot start a sequence).
inline size_t utf8_length(unsigned char lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return lead < 0xF8 ? 4 : 1;
}

// Decodes the code point at `offset` of valid UTF-8 text and moves `offset` past it.
char32_t next_code_point(std::string_view text, size_t& offset);
// Decodes the code point that ends at `end` of valid UTF-8 text and moves `end` to its start.
char32_t previous_code_point(std::string_view text, size_t& end);
void append_utf8(std::string& out, char32_t code_point);

// Appends `bytes` as UTF-8, replacing each maximal ill-formed subpart with U+FFFD (the WHATWG and
// Rust String::from_utf8_lossy behaviour).
void append_utf8_lossy(std::string& out, std::string_view bytes);
// Whether `bytes` ends with a truncated but so far well-formed multi-byte sequence, i.e. whether
// more bytes could still complete its last character.
bool ends_with_incomplete_utf8(std::string_view bytes);

// Unicode White_Space (Rust char::is_whitespace, regex \s, Oniguruma \s).
bool is_white_space(char32_t c);
// General category N* (Rust char::is_numeric).
bool is_numeric(char32_t c);
// Rust regex \w: Alphabetic, M, Nd, Pc, Join_Control.
bool is_word_character(char32_t c);

enum class NormalizationForm { nfc, nfd, nfkc, nfkd };
Status normalize_unicode(std::string_view text, NormalizationForm form, std::string& out);
Status lowercase(std::string_view text, std::string& out);

// GPT-2's reversible byte <-> printable char map used by the ByteLevel pre-tokenizer and decoder.
struct ByteLevelAlphabet {
  std::array<char32_t, 256> char_of_byte;
  std::array<std::string, 256> utf8_of_byte;  // char_of_byte in UTF-8, for the hot loop
  // Indexed by code point; -1 for chars that are not in the alphabet (all are below 0x144).
  std::array<int16_t, 0x144> byte_of_char;
};
const ByteLevelAlphabet& byte_level_alphabet();

}  // namespace kiln::tokenization
