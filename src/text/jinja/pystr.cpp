// Python str semantics over UTF-8. See pystr.h.
#include "text/jinja/pystr.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

namespace kiln::jinja::py {

// --- UTF-8 ---------------------------------------------------------------------------------------

std::u32string decode_utf8(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      out.push_back(c);
      ++i;
      continue;
    }
    int extra = 0;
    char32_t cp = 0;
    char32_t min = 0;
    if ((c & 0xE0) == 0xC0) {
      extra = 1, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3, cp = c & 0x07, min = 0x10000;
    } else {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    bool valid = i + static_cast<size_t>(extra) < n;  // the continuation bytes are all there
    for (int k = 1; valid && k <= extra; ++k) {
      unsigned char cc = static_cast<unsigned char>(text[i + k]);
      if ((cc & 0xC0) != 0x80) {
        valid = false;
        break;
      }
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (!valid || cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += 1 + extra;
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string encode_utf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text) append_utf8(out, c);
  return out;
}

size_t code_point_count(std::string_view text) {
  bool ascii = std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
  return ascii ? text.size() : decode_utf8(text).size();
}

// --- character classes ---------------------------------------------------------------------------

bool is_space(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_line_break(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
         c == 0x2028 || c == 0x2029;
}

bool is_printable(char32_t c) {
  if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) return false;
  if (c < 0x300) return true;
  if ((c >= 0x600 && c <= 0x605) || c == 0x61C || c == 0x6DD || c == 0x70F || c == 0x180E || c == 0x1680) return false;
  if ((c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x206F)) return false;
  if (c == 0x3000 || c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFB) || c == 0xFFFE || c == 0xFFFF) return false;
  if (c >= 0xD800 && c <= 0xF8FF) return false;  // surrogates and the private use area
  if (c == 0x110BD || c == 0x110CD || (c >= 0x1BCA0 && c <= 0x1BCA3) || (c >= 0x1D173 && c <= 0x1D17A)) return false;
  if (c == 0xE0001 || (c >= 0xE0020 && c <= 0xE007F) || c >= 0xF0000) return false;
  return true;
}

namespace {

// Simple (one to one) case mappings for the scripts kiln covers.
char32_t simple_lower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 0x20;
  if (c >= 0x100 && c <= 0x137 && c != 0x130 && !(c & 1)) return c + 1;
  if (c >= 0x139 && c <= 0x148 && (c & 1)) return c + 1;
  if (c >= 0x14A && c <= 0x177 && !(c & 1)) return c + 1;
  if (c == 0x178) return 0xFF;
  if (c >= 0x179 && c <= 0x17E && (c & 1)) return c + 1;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 63;
  if (c >= 0x391 && c <= 0x3AB && c != 0x3A2) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x460 && c <= 0x481 && !(c & 1)) return c + 1;
  if (c >= 0x48A && c <= 0x4BF && !(c & 1)) return c + 1;
  if (c == 0x4C0) return 0x4CF;
  if (c >= 0x4C1 && c <= 0x4CE && (c & 1)) return c + 1;
  if (c >= 0x4D0 && c <= 0x52F && !(c & 1)) return c + 1;
  if (c >= 0x531 && c <= 0x556) return c + 48;
  if (((c >= 0x1E00 && c <= 0x1E95) || (c >= 0x1EA0 && c <= 0x1EFF)) && !(c & 1)) return c + 1;
  if (c >= 0xFF21 && c <= 0xFF3A) return c + 32;
  return c;
}

char32_t simple_upper(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 0x20;
  if (c == 0xFF) return 0x178;
  if (c == 0xB5) return 0x39C;
  if (c >= 0x101 && c <= 0x137 && c != 0x131 && (c & 1)) return c - 1;
  if (c == 0x131) return 'I';
  if (c >= 0x13A && c <= 0x148 && !(c & 1)) return c - 1;
  if (c >= 0x14B && c <= 0x177 && (c & 1)) return c - 1;
  if (c >= 0x17A && c <= 0x17E && !(c & 1)) return c - 1;
  if (c == 0x17F) return 'S';
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 37;
  if (c == 0x3C2) return 0x3A3;
  if (c >= 0x3B1 && c <= 0x3CB) return c - 32;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 63;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  if (c >= 0x461 && c <= 0x481 && (c & 1)) return c - 1;
  if (c >= 0x48B && c <= 0x4BF && (c & 1)) return c - 1;
  if (c == 0x4CF) return 0x4C0;
  if (c >= 0x4C2 && c <= 0x4CE && !(c & 1)) return c - 1;
  if (c >= 0x4D1 && c <= 0x52F && (c & 1)) return c - 1;
  if (c >= 0x561 && c <= 0x586) return c - 48;
  if (((c >= 0x1E01 && c <= 0x1E95) || (c >= 0x1EA1 && c <= 0x1EFF)) && (c & 1)) return c - 1;
  if (c >= 0xFF41 && c <= 0xFF5A) return c - 32;
  return c;
}

// Full upper-case mapping: a few characters expand (German sharp s becomes "SS").
void append_upper(std::u32string& out, char32_t c) {
  if (c == 0xDF) {
    out += U"SS";
  } else if (c == 0x149) {
    out += U"\u02BCN";
  } else {
    out.push_back(simple_upper(c));
  }
}

void append_lower(std::u32string& out, char32_t c) {
  if (c == 0x130) {
    out += U"i\u0307";
  } else {
    out.push_back(simple_lower(c));
  }
}

// Title case of one character: upper case for everything kiln maps, except that "ß" stays one
// character pair "Ss" as in Python.
void append_title(std::u32string& out, char32_t c) {
  if (c == 0xDF) {
    out += U"Ss";
  } else {
    append_upper(out, c);
  }
}

bool is_upper_char(char32_t c) {
  return simple_lower(c) != c || c == 0x130;
}
bool is_lower_char(char32_t c) {
  return simple_upper(c) != c || c == 0xDF || c == 0x149;
}

// Python lowers a capital sigma at the end of a word to the final form.
bool final_sigma(const std::u32string& s, size_t i) {
  bool cased_before = false;
  for (size_t j = i; j-- > 0;) {
    if (is_cased(s[j])) {
      cased_before = true;
      break;
    }
    if (s[j] != '\'' && s[j] != 0x2019 && s[j] != '.') break;
  }
  if (!cased_before) return false;
  for (size_t j = i + 1; j < s.size(); ++j) {
    if (is_cased(s[j])) return false;
    if (s[j] != '\'' && s[j] != 0x2019 && s[j] != '.') break;
  }
  return true;
}

}  // namespace

bool is_cased(char32_t c) {
  return is_upper_char(c) || is_lower_char(c);
}

bool is_decimal(char32_t c) {
  return (c >= '0' && c <= '9') || (c >= 0x660 && c <= 0x669) || (c >= 0x6F0 && c <= 0x6F9) ||
         (c >= 0x966 && c <= 0x96F) || (c >= 0xFF10 && c <= 0xFF19);
}

bool is_digit(char32_t c) {
  return is_decimal(c) || c == 0xB2 || c == 0xB3 || c == 0xB9 || c == 0x2070 || (c >= 0x2074 && c <= 0x2079) ||
         (c >= 0x2080 && c <= 0x2089) || (c >= 0x2460 && c <= 0x2468);
}

bool is_numeric(char32_t c) {
  return is_digit(c) || (c >= 0xBC && c <= 0xBE) || (c >= 0x2150 && c <= 0x2182) || c == 0x3007 ||
         (c >= 0x3021 && c <= 0x3029) || c == 0x4E00 || c == 0x4E8C || c == 0x4E09 || c == 0x56DB || c == 0x4E94 ||
         c == 0x516D || c == 0x4E03 || c == 0x516B || c == 0x4E5D || c == 0x5341;
}

bool is_alpha(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  if (is_cased(c) || c == 0xAA || c == 0xBA) return true;
  if (c < 0x300) return false;
  // Scripts without case: letters of the common ones.
  return (c >= 0x5D0 && c <= 0x5EA) || (c >= 0x620 && c <= 0x64A) || (c >= 0x904 && c <= 0x939) ||
         (c >= 0xE01 && c <= 0xE30) || (c >= 0x3041 && c <= 0x3096) || (c >= 0x30A1 && c <= 0x30FA) ||
         (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0xAC00 && c <= 0xD7A3) ||
         (c >= 0x20000 && c <= 0x2FA1F);
}

bool is_word_char(char32_t c) {
  return c == '_' || is_alpha(c) || is_numeric(c);
}

// --- case ----------------------------------------------------------------------------------------

std::string upper(std::string_view s) {
  std::u32string in = decode_utf8(s), out;
  for (char32_t c : in) append_upper(out, c);
  return encode_utf8(out);
}

std::string lower(std::string_view s) {
  std::u32string in = decode_utf8(s), out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == 0x3A3 && final_sigma(in, i)) {
      out.push_back(0x3C2);
    } else {
      append_lower(out, in[i]);
    }
  }
  return encode_utf8(out);
}

std::string casefold(std::string_view s) {
  std::u32string in = decode_utf8(s), out;
  for (char32_t c : in) {
    if (c == 0xDF) {
      out += U"ss";
    } else if (c == 0x3C2) {
      out.push_back(0x3C3);
    } else {
      append_lower(out, c);
    }
  }
  return encode_utf8(out);
}

std::string swapcase(std::string_view s) {
  std::u32string in = decode_utf8(s), out;
  for (size_t i = 0; i < in.size(); ++i) {
    char32_t c = in[i];
    if (is_upper_char(c)) {
      if (c == 0x3A3 && final_sigma(in, i)) {
        out.push_back(0x3C2);
      } else {
        append_lower(out, c);
      }
    } else if (is_lower_char(c)) {
      append_upper(out, c);
    } else {
      out.push_back(c);
    }
  }
  return encode_utf8(out);
}

std::string title(std::string_view s) {
  std::u32string in = decode_utf8(s), out;
  bool previous_cased = false;
  for (size_t i = 0; i < in.size(); ++i) {
    char32_t c = in[i];
    if (previous_cased) {
      if (c == 0x3A3 && final_sigma(in, i)) {
        out.push_back(0x3C2);
      } else {
        append_lower(out, c);
      }
    } else {
      append_title(out, c);
    }
    previous_cased = is_cased(c);
  }
  return encode_utf8(out);
}

std::string capitalize(std::string_view s) {
  std::u32string in = decode_utf8(s), out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (i == 0) {
      append_title(out, in[i]);
    } else if (in[i] == 0x3A3 && final_sigma(in, i)) {
      out.push_back(0x3C2);
    } else {
      append_lower(out, in[i]);
    }
  }
  return encode_utf8(out);
}

bool is_upper(std::string_view s) {
  bool cased = false;
  for (char32_t c : decode_utf8(s)) {
    if (is_lower_char(c)) return false;
    if (is_upper_char(c)) cased = true;
  }
  return cased;
}

bool is_lower(std::string_view s) {
  bool cased = false;
  for (char32_t c : decode_utf8(s)) {
    if (is_upper_char(c)) return false;
    if (is_lower_char(c)) cased = true;
  }
  return cased;
}

bool is_title(std::string_view s) {
  bool cased = false, previous_cased = false;
  for (char32_t c : decode_utf8(s)) {
    if (is_upper_char(c)) {
      if (previous_cased) return false;
      previous_cased = cased = true;
    } else if (is_lower_char(c)) {
      if (!previous_cased) return false;
      previous_cased = cased = true;
    } else {
      previous_cased = false;
    }
  }
  return cased;
}

// --- algorithms ----------------------------------------------------------------------------------

std::string strip(std::string_view s, const std::optional<std::string>& chars, StripSide side) {
  std::u32string text = decode_utf8(s);
  std::u32string set = chars ? decode_utf8(*chars) : std::u32string();
  auto strippable = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : is_space(c); };
  size_t begin = 0, end = text.size();
  if (side != StripSide::right)
    while (begin < end && strippable(text[begin])) ++begin;
  if (side != StripSide::left)
    while (end > begin && strippable(text[end - 1])) --end;
  return encode_utf8(std::u32string_view(text).substr(begin, end - begin));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> parts;
  if (maxsplit < 0) maxsplit = INT64_MAX;
  if (sep) {
    size_t pos = 0;
    while (maxsplit-- > 0) {
      size_t hit = s.find(*sep, pos);
      if (hit == std::string_view::npos) break;
      parts.emplace_back(s.substr(pos, hit - pos));
      pos = hit + sep->size();
    }
    parts.emplace_back(s.substr(pos));
    return parts;
  }
  std::u32string text = decode_utf8(s);
  size_t i = 0, n = text.size();
  while (true) {
    while (i < n && is_space(text[i])) ++i;
    if (i == n) break;
    if (maxsplit-- <= 0) {
      parts.push_back(encode_utf8(std::u32string_view(text).substr(i)));
      break;
    }
    size_t start = i;
    while (i < n && !is_space(text[i])) ++i;
    parts.push_back(encode_utf8(std::u32string_view(text).substr(start, i - start)));
  }
  return parts;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> parts;
  if (maxsplit < 0) maxsplit = INT64_MAX;
  if (sep) {
    size_t end = s.size();
    while (maxsplit-- > 0) {
      if (end < sep->size()) break;
      size_t hit = s.rfind(*sep, end - sep->size());
      if (hit == std::string_view::npos) break;
      parts.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    parts.emplace_back(s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
    return parts;
  }
  std::u32string text = decode_utf8(s);
  size_t i = text.size();
  while (true) {
    while (i > 0 && is_space(text[i - 1])) --i;
    if (i == 0) break;
    if (maxsplit-- <= 0) {
      parts.push_back(encode_utf8(std::u32string_view(text).substr(0, i)));
      break;
    }
    size_t end = i;
    while (i > 0 && !is_space(text[i - 1])) --i;
    parts.push_back(encode_utf8(std::u32string_view(text).substr(i, end - i)));
  }
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::u32string text = decode_utf8(s);
  std::vector<std::string> lines;
  size_t start = 0, i = 0, n = text.size();
  while (i < n) {
    if (!is_line_break(text[i])) {
      ++i;
      continue;
    }
    size_t eol = i;
    i += (text[i] == '\r' && i + 1 < n && text[i + 1] == '\n') ? 2 : 1;
    lines.push_back(encode_utf8(std::u32string_view(text).substr(start, (keepends ? i : eol) - start)));
    start = i;
  }
  if (start < n) lines.push_back(encode_utf8(std::u32string_view(text).substr(start)));
  return lines;
}

std::string replace(std::string_view s, std::string_view old_text, std::string_view new_text, int64_t count,
                    size_t max_bytes) {
  if (count < 0) count = INT64_MAX;
  std::string out;
  if (old_text.empty()) {
    // Python inserts the replacement before every code point and at the end.
    std::u32string text = decode_utf8(s);
    size_t i = 0;
    for (; i <= text.size() && count > 0; ++i, --count) {
      out += new_text;
      if (i < text.size()) append_utf8(out, text[i]);
      if (out.size() > max_bytes) return out;
    }
    if (i < text.size()) out += encode_utf8(std::u32string_view(text).substr(i));
    return out;
  }
  size_t pos = 0;
  while (count-- > 0) {
    size_t hit = s.find(old_text, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(new_text);
    pos = hit + old_text.size();
    if (out.size() > max_bytes) return out;
  }
  out.append(s.substr(pos));
  return out;
}

void adjust_range(std::optional<int64_t> start, std::optional<int64_t> end, int64_t length, int64_t& lo, int64_t& hi) {
  lo = start.value_or(0);
  hi = end.value_or(length);
  if (lo < 0) lo = std::max<int64_t>(0, lo + length);
  if (hi < 0) hi = std::max<int64_t>(0, hi + length);
  hi = std::min(hi, length);
}

int64_t find(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end,
             bool reverse) {
  std::u32string text = decode_utf8(s), needle = decode_utf8(sub);
  int64_t lo, hi;
  adjust_range(start, end, int64_t(text.size()), lo, hi);
  if (lo > int64_t(text.size()) || hi - lo < int64_t(needle.size())) return -1;
  std::u32string_view window = std::u32string_view(text).substr(lo, hi - lo);
  size_t hit = reverse ? window.rfind(needle) : window.find(needle);
  return hit == std::u32string_view::npos ? -1 : lo + int64_t(hit);
}

int64_t count(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end) {
  std::u32string text = decode_utf8(s), needle = decode_utf8(sub);
  int64_t lo, hi;
  adjust_range(start, end, int64_t(text.size()), lo, hi);
  if (lo > int64_t(text.size()) || hi < lo) return 0;
  if (needle.empty()) return hi - lo + 1;
  std::u32string_view window = std::u32string_view(text).substr(lo, hi - lo);
  int64_t n = 0;
  for (size_t pos = window.find(needle); pos != std::u32string_view::npos;
       pos = window.find(needle, pos + needle.size()))
    ++n;
  return n;
}

bool starts_with(std::string_view s, std::string_view prefix, std::optional<int64_t> start, std::optional<int64_t> end,
                 bool at_end) {
  std::u32string text = decode_utf8(s), affix = decode_utf8(prefix);
  int64_t lo, hi;
  adjust_range(start, end, int64_t(text.size()), lo, hi);
  if (lo > int64_t(text.size())) return false;
  if (hi - lo < int64_t(affix.size())) return false;
  std::u32string_view window = std::u32string_view(text).substr(lo, hi - lo);
  return at_end ? window.substr(window.size() - affix.size()) == affix : window.substr(0, affix.size()) == affix;
}

std::string pad(std::string_view s, int64_t width, char32_t fill, char align) {
  int64_t length = int64_t(code_point_count(s));
  if (width <= length) return std::string(s);
  int64_t margin = width - length;
  int64_t left = align == '>' ? margin : align == '^' ? margin / 2 : 0;
  std::string fill_text;
  append_utf8(fill_text, fill);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill_text;
  out += s;
  for (int64_t i = 0; i < margin - left; ++i) out += fill_text;
  return out;
}

std::string center(std::string_view s, int64_t width, char32_t fill) {
  int64_t length = int64_t(code_point_count(s));
  if (width <= length) return std::string(s);
  int64_t margin = width - length;
  int64_t left = margin / 2 + (margin & width & 1);  // CPython's str.center split
  std::string fill_text;
  append_utf8(fill_text, fill);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill_text;
  out += s;
  for (int64_t i = 0; i < margin - left; ++i) out += fill_text;
  return out;
}

std::string zfill(std::string_view s, int64_t width) {
  int64_t length = int64_t(code_point_count(s));
  if (width <= length) return std::string(s);
  std::string out(s);
  size_t at = (!out.empty() && (out[0] == '+' || out[0] == '-')) ? 1 : 0;
  out.insert(at, std::string(size_t(width - length), '0'));
  return out;
}

// --- reprs ---------------------------------------------------------------------------------------

std::string repr(std::string_view s) {
  std::u32string text = decode_utf8(s);
  bool has_single = text.find(U'\'') != std::u32string::npos;
  bool has_double = text.find(U'"') != std::u32string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : text) {
    if (c == char32_t(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02x}", uint32_t(c));
    } else if (c < 0x7F || is_printable(c)) {
      append_utf8(out, c);
    } else if (c <= 0xFF) {
      out += fmt::format("\\x{:02x}", uint32_t(c));
    } else if (c <= 0xFFFF) {
      out += fmt::format("\\u{:04x}", uint32_t(c));
    } else {
      out += fmt::format("\\U{:08x}", uint32_t(c));
    }
  }
  out.push_back(quote);
  return out;
}

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: fixed notation for decimal exponents in
  // [-4, 16), scientific (with a two-digit exponent at least) otherwise.
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof buffer, x, std::chars_format::scientific);
  std::string_view sci(buffer, size_t(result.ptr - buffer));
  bool negative = sci.front() == '-';
  if (negative) sci.remove_prefix(1);
  size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos))
    if (c != '.') digits.push_back(c);
  int exponent = 0;
  std::from_chars(sci.data() + e_pos + 1 + (sci[e_pos + 1] == '+' ? 1 : 0), sci.data() + sci.size(), exponent);
  int decimal_point = exponent + 1;  // value = 0.DIGITS * 10^decimal_point
  int n = int(digits.size());
  std::string out = negative ? "-" : "";
  if (decimal_point > -4 && decimal_point <= 16) {
    if (decimal_point <= 0) {
      out += "0." + std::string(size_t(-decimal_point), '0') + digits;
    } else if (decimal_point >= n) {
      out += digits + std::string(size_t(decimal_point - n), '0') + ".0";
    } else {
      out += fmt::format("{}.{}", digits.substr(0, size_t(decimal_point)), digits.substr(size_t(decimal_point)));
    }
  } else {
    out += digits.substr(0, 1);
    if (n > 1) out += fmt::format(".{}", digits.substr(1));
    out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  }
  return out;
}

std::string escape_html(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '\'':
        out += "&#39;";
        break;
      case '"':
        out += "&#34;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

}  // namespace kiln::jinja::py
