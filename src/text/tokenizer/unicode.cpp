#include "text/tokenizer/unicode.h"

#include <unicode/bytestream.h>
#include <unicode/casemap.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>
#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include <cstring>

namespace kiln::tokenization {

size_t find_invalid_utf8(std::string_view text) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  const int64_t length = int64_t(text.size());
  int64_t i = 0;
  while (i < length) {
    // ASCII runs are most of most text: skip them eight bytes at a time
    if (i + 8 <= length) {
      uint64_t word;
      std::memcpy(&word, bytes + i, 8);
      if ((word & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    const int64_t start = i;
    UChar32 c;
    U8_NEXT(bytes, i, length, c);
    if (c < 0) return size_t(start);
  }
  return kNoPosition;
}

char32_t next_code_point(std::string_view text, size_t& offset) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  UChar32 c;
  U8_NEXT_UNSAFE(bytes, offset, c);
  return char32_t(c);
}

char32_t previous_code_point(std::string_view text, size_t& end) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  UChar32 c;
  U8_PREV_UNSAFE(bytes, end, c);
  return char32_t(c);
}

void append_utf8(std::string& out, char32_t code_point) {
  uint8_t buffer[4];
  int32_t length = 0;
  U8_APPEND_UNSAFE(buffer, length, UChar32(code_point));
  out.append(reinterpret_cast<const char*>(buffer), size_t(length));
}

void append_utf8_lossy(std::string& out, std::string_view text) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  const int64_t length = int64_t(text.size());
  int64_t i = 0;
  while (i < length) {
    const int64_t start = i;
    UChar32 c;
    // ICU (since 60) advances past the maximal ill-formed subpart, as WHATWG and Rust do
    U8_NEXT(bytes, i, length, c);
    if (c < 0) {
      out.append("\xEF\xBF\xBD");
    } else {
      out.append(text.data() + start, size_t(i - start));
    }
  }
}

bool ends_with_incomplete_utf8(std::string_view text) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  const int64_t length = int64_t(text.size());
  // the last byte that is not a continuation byte, at most three bytes back
  int64_t lead = length - 1;
  while (lead >= 0 && lead > length - 4 && U8_IS_TRAIL(bytes[lead])) --lead;
  if (lead < 0 || U8_IS_TRAIL(bytes[lead])) return false;
  const int64_t expected = bytes[lead] >= 0xC2 && bytes[lead] <= 0xF4 ? int64_t(utf8_length(bytes[lead])) : 1;
  if (length - lead >= expected) return false;
  // truncated: incomplete only if what is there is a well-formed prefix (U8_NEXT then consumes
  // everything up to the end before giving up)
  int64_t i = lead;
  UChar32 c;
  U8_NEXT(bytes, i, length, c);
  return c < 0 && i == length;
}

bool is_white_space(char32_t c) {
  return u_hasBinaryProperty(UChar32(c), UCHAR_WHITE_SPACE);
}

bool is_numeric(char32_t c) {
  const int8_t type = u_charType(UChar32(c));
  return type == U_DECIMAL_DIGIT_NUMBER || type == U_LETTER_NUMBER || type == U_OTHER_NUMBER;
}

bool is_word_character(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  const int8_t type = u_charType(UChar32(c));
  return u_hasBinaryProperty(UChar32(c), UCHAR_ALPHABETIC) || type == U_NON_SPACING_MARK ||
         type == U_COMBINING_SPACING_MARK || type == U_ENCLOSING_MARK || type == U_DECIMAL_DIGIT_NUMBER ||
         type == U_CONNECTOR_PUNCTUATION || u_hasBinaryProperty(UChar32(c), UCHAR_JOIN_CONTROL);
}

Status normalize_unicode(std::string_view text, NormalizationForm form, std::string& out) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = nullptr;
  switch (form) {
    case NormalizationForm::nfc:
      normalizer = icu::Normalizer2::getNFCInstance(status);
      break;
    case NormalizationForm::nfd:
      normalizer = icu::Normalizer2::getNFDInstance(status);
      break;
    case NormalizationForm::nfkc:
      normalizer = icu::Normalizer2::getNFKCInstance(status);
      break;
    case NormalizationForm::nfkd:
      normalizer = icu::Normalizer2::getNFKDInstance(status);
      break;
  }
  if (U_FAILURE(status)) return make_error("ICU normalizer unavailable: {}", u_errorName(status));
  const icu::StringPiece piece(text.data(), int32_t(text.size()));
  // most text is already normalized: check first, which does not copy
  if (normalizer->isNormalizedUTF8(piece, status) && U_SUCCESS(status)) {
    out.assign(text);
    return ok_status();
  }
  status = U_ZERO_ERROR;
  out.clear();
  icu::StringByteSink<std::string> sink(&out, int32_t(text.size()));
  normalizer->normalizeUTF8(0, piece, sink, nullptr, status);
  if (U_FAILURE(status)) return make_error("ICU normalization failed: {}", u_errorName(status));
  return ok_status();
}

Status lowercase(std::string_view text, std::string& out) {
  UErrorCode status = U_ZERO_ERROR;
  out.clear();
  icu::StringByteSink<std::string> sink(&out, int32_t(text.size()));
  // the root locale: full case mapping with the final-sigma rule, as Rust's str::to_lowercase
  icu::CaseMap::utf8ToLower("", 0, icu::StringPiece(text.data(), int32_t(text.size())), sink, nullptr, status);
  if (U_FAILURE(status)) return make_error("ICU lowercasing failed: {}", u_errorName(status));
  return ok_status();
}

namespace {

ByteLevelAlphabet make_byte_level_alphabet() {
  ByteLevelAlphabet alphabet{};
  alphabet.byte_of_char.fill(-1);
  // printable Latin-1 bytes stand for themselves; the others are shifted to 256 + n, in byte order
  auto is_printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); };
  char32_t next_shifted = 256;
  for (int b = 0; b < 256; ++b) {
    const char32_t c = is_printable(b) ? char32_t(b) : next_shifted++;
    alphabet.char_of_byte[size_t(b)] = c;
    append_utf8(alphabet.utf8_of_byte[size_t(b)], c);
    alphabet.byte_of_char[c] = int16_t(b);
  }
  return alphabet;
}

}  // namespace

const ByteLevelAlphabet& byte_level_alphabet() {
  static const ByteLevelAlphabet alphabet = make_byte_level_alphabet();
  return alphabet;
}

}  // namespace kiln::tokenization
