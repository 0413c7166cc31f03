// jinja2's lexer (lexer.py) for the environment transformers builds. See lexer.h.
#include "text/jinja/lexer.h"

#include <cmath>
#include <cstdlib>
#include <optional>

#include "text/jinja/errors.h"
#include "text/jinja/pystr.h"

namespace kiln::jinja {

namespace {

bool is_ascii_digit(char c) {
  return c >= '0' && c <= '9';
}

// Length of the Python whitespace character at s[pos] (\s in jinja2's regexes), 0 if none.
size_t space_length(std::string_view s, size_t pos) {
  if (pos >= s.size()) return 0;
  unsigned char c = static_cast<unsigned char>(s[pos]);
  if (c < 0x80) return py::is_space(c) ? 1 : 0;
  size_t n = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
  if (pos + n > s.size()) return 0;
  std::u32string decoded = py::decode_utf8(s.substr(pos, n));
  return decoded.size() == 1 && py::is_space(decoded[0]) ? n : 0;
}

size_t skip_spaces(std::string_view s, size_t pos) {
  while (size_t n = space_length(s, pos)) pos += n;
  return pos;
}

// Decodes a string literal body the way jinja2 does: backslashreplace to ASCII, then Python's
// unicode-escape codec (so "\n", "\x41", "\u00e9", "\101" work and unknown escapes stay as written).
std::string unescape_string(std::string_view body, int line) {
  std::string ascii;
  for (char32_t c : py::decode_utf8(body)) {
    if (c < 0x80) {
      ascii.push_back(static_cast<char>(c));
    } else if (c <= 0xFF) {
      ascii += fmt::format("\\x{:02x}", uint32_t(c));
    } else if (c <= 0xFFFF) {
      ascii += fmt::format("\\u{:04x}", uint32_t(c));
    } else {
      ascii += fmt::format("\\U{:08x}", uint32_t(c));
    }
  }
  std::string out;
  auto hex_value = [&](size_t at, size_t digits, const char* what) -> char32_t {
    if (at + digits > ascii.size())
      throw TemplateException(FailureKind::syntax, fmt::format("truncated {} escape", what), line);
    char32_t v = 0;
    for (size_t k = 0; k < digits; ++k) {
      char h = ascii[at + k];
      int d = is_ascii_digit(h)        ? h - '0'
              : (h >= 'a' && h <= 'f') ? h - 'a' + 10
              : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                       : -1;
      if (d < 0) throw TemplateException(FailureKind::syntax, fmt::format("truncated {} escape", what), line);
      v = v * 16 + char32_t(d);
    }
    return v;
  };
  for (size_t i = 0; i < ascii.size(); ++i) {
    char c = ascii[i];
    if (c != '\\') {
      out.push_back(c);
      continue;
    }
    if (i + 1 >= ascii.size()) throw TemplateException(FailureKind::syntax, "\\ at end of string", line);
    char e = ascii[++i];
    switch (e) {
      case '\n':
        break;  // line continuation
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x':
        py::append_utf8(out, hex_value(i + 1, 2, "\\xXX")), i += 2;
        break;
      case 'u':
        py::append_utf8(out, hex_value(i + 1, 4, "\\uXXXX")), i += 4;
        break;
      case 'U': {
        char32_t v = hex_value(i + 1, 8, "\\UXXXXXXXX");
        if (v > 0x10FFFF) throw TemplateException(FailureKind::syntax, "illegal Unicode character", line);
        py::append_utf8(out, v);
        i += 8;
        break;
      }
      case 'N':
        throw TemplateException(FailureKind::syntax, "\\N{...} escapes are not supported", line);
      default:
        if (e >= '0' && e <= '7') {
          char32_t v = char32_t(e - '0');
          for (int k = 0; k < 2 && i + 1 < ascii.size() && ascii[i + 1] >= '0' && ascii[i + 1] <= '7'; ++k)
            v = v * 8 + char32_t(ascii[++i] - '0');
          py::append_utf8(out, v);
        } else {
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
  return out;
}

// (\d+_)*\d+ starting at pos; returns the end, or npos.
size_t match_digit_groups(std::string_view s, size_t pos) {
  if (pos >= s.size() || !is_ascii_digit(s[pos])) return std::string_view::npos;
  while (pos < s.size() && is_ascii_digit(s[pos])) ++pos;
  while (pos + 1 < s.size() && s[pos] == '_' && is_ascii_digit(s[pos + 1])) {
    ++pos;
    while (pos < s.size() && is_ascii_digit(s[pos])) ++pos;
  }
  return pos;
}

size_t match_exponent(std::string_view s, size_t pos) {
  if (pos >= s.size() || (s[pos] != 'e' && s[pos] != 'E')) return std::string_view::npos;
  ++pos;
  if (pos < s.size() && (s[pos] == '+' || s[pos] == '-')) ++pos;
  return match_digit_groups(s, pos);
}

// jinja2's float_re; returns the end or npos.
size_t match_float(std::string_view s, size_t pos) {
  if (pos > 0 && s[pos - 1] == '.') return std::string_view::npos;
  size_t p = match_digit_groups(s, pos);
  if (p == std::string_view::npos) return p;
  if (p < s.size() && s[p] == '.') {
    size_t q = match_digit_groups(s, p + 1);
    if (q != std::string_view::npos) {
      size_t e = match_exponent(s, q);
      return e != std::string_view::npos ? e : q;
    }
  }
  return match_exponent(s, p);
}

// jinja2's integer_re; returns the end or npos.
size_t match_integer(std::string_view s, size_t pos) {
  auto prefixed = [&](char letter, auto is_digit) -> size_t {
    if (pos + 1 >= s.size() || s[pos] != '0' || (s[pos + 1] | 0x20) != letter) return std::string_view::npos;
    size_t p = pos + 2, end = std::string_view::npos;
    while (true) {
      size_t q = p < s.size() && s[p] == '_' ? p + 1 : p;
      if (q < s.size() && is_digit(s[q])) {
        p = end = q + 1;
      } else {
        break;
      }
    }
    return end;
  };
  auto binary = [](char c) { return c == '0' || c == '1'; };
  auto octal = [](char c) { return c >= '0' && c <= '7'; };
  auto hex = [](char c) { return is_ascii_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); };
  for (size_t end : {prefixed('b', binary), prefixed('o', octal), prefixed('x', hex)})
    if (end != std::string_view::npos) return end;
  if (pos >= s.size() || !is_ascii_digit(s[pos])) return std::string_view::npos;
  char first = s[pos];
  size_t p = pos + 1;
  auto accept = [&](char c) { return first == '0' ? c == '0' : is_ascii_digit(c); };
  while (true) {
    size_t q = p < s.size() && s[p] == '_' ? p + 1 : p;
    if (q < s.size() && accept(s[q])) {
      p = q + 1;
    } else {
      break;
    }
  }
  return p;
}

size_t match_name(std::string_view s, size_t pos) {
  auto name_char = [&](size_t at, bool first, size_t& width) {
    unsigned char c = static_cast<unsigned char>(s[at]);
    width = 1;
    if (c < 0x80)
      return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && is_ascii_digit(char(c)));
    // Non-ASCII identifiers: letters (Python's str.isidentifier, approximately).
    size_t n = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    if (at + n > s.size()) return false;
    std::u32string decoded = py::decode_utf8(s.substr(at, n));
    width = n;
    return decoded.size() == 1 && decoded[0] != 0xFFFD &&
           (py::is_alpha(decoded[0]) || (!first && py::is_digit(decoded[0])));
  };
  size_t width = 0;
  if (pos >= s.size() || !name_char(pos, true, width)) return std::string_view::npos;
  size_t p = pos + width;
  while (p < s.size() && name_char(p, false, width)) p += width;
  return p;
}

size_t match_string(std::string_view s, size_t pos) {
  if (pos >= s.size() || (s[pos] != '\'' && s[pos] != '"')) return std::string_view::npos;
  char quote = s[pos];
  for (size_t p = pos + 1; p < s.size(); ++p) {
    if (s[p] == '\\') {
      ++p;
    } else if (s[p] == quote) {
      return p + 1;
    }
  }
  return std::string_view::npos;
}

size_t match_operator(std::string_view s, size_t pos) {
  static constexpr std::string_view two_char[] = {"//", "**", "==", "!=", ">=", "<="};
  for (std::string_view op : two_char)
    if (s.substr(pos, 2) == op) return pos + 2;
  static constexpr std::string_view one_char = "+-/*%~[](){}><=.:|,;";
  return one_char.find(s[pos]) != std::string_view::npos ? pos + 1 : std::string_view::npos;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : s_(std::move(source)) {}

  std::vector<Token> run() {
    while (pos_ < s_.size()) lex_root();
    Token eof;
    eof.type = TokenType::eof;
    eof.line = line_;
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  enum class Tag { variable, block, comment, raw };

  [[noreturn]] void error(const std::string& message) { throw TemplateException(FailureKind::syntax, message, line_); }

  void advance_to(size_t pos) {
    for (size_t i = pos_; i < pos; ++i) line_ += s_[i] == '\n';
    pos_ = pos;
  }

  void emit(TokenType type, std::string text, int line) {
    Token token;
    token.type = type;
    token.text = std::move(text);
    token.line = line;
    tokens_.push_back(std::move(token));
  }

  // Matches `{%[-+]?\s*raw\s*(-%}\s*|%})` at pos; returns the end or npos.
  size_t match_raw_begin(size_t pos) const {
    size_t p = pos + 2;
    if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) ++p;
    p = skip_spaces(s_, p);
    if (s_.compare(p, 3, "raw") != 0) return std::string_view::npos;
    p = skip_spaces(s_, p + 3);
    if (s_.compare(p, 3, "-%}") == 0) return skip_spaces(s_, p + 3);
    if (s_.compare(p, 2, "%}") == 0) return p + 2;
    return std::string_view::npos;
  }

  // The data before a tag, with jinja2's whitespace control applied (OptionalLStrip).
  std::string controlled_text(size_t begin, size_t end, char sign, bool lstrip_applies) const {
    std::string text = s_.substr(begin, end - begin);
    if (sign == '-') return py::strip(text, std::nullopt, py::StripSide::right);
    if (sign != '+' && lstrip_applies) {
      size_t l_pos = text.rfind('\n');
      l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
      if (l_pos > 0 || line_starting_) {
        bool only_blanks = text.find_first_not_of(" \t", l_pos) == std::string::npos;
        if (only_blanks) text.resize(l_pos);
      }
    }
    return text;
  }

  void lex_root() {
    size_t tag_pos = pos_;
    Tag tag = Tag::variable;
    while (true) {
      tag_pos = s_.find('{', tag_pos);
      if (tag_pos == std::string::npos || tag_pos + 1 >= s_.size()) {
        emit(TokenType::data, s_.substr(pos_), line_);
        advance_to(s_.size());
        return;
      }
      char next = s_[tag_pos + 1];
      if (next == '{' || next == '%' || next == '#') {
        tag = next == '{' ? Tag::variable : next == '%' ? Tag::block : Tag::comment;
        break;
      }
      ++tag_pos;
    }
    size_t raw_end = tag == Tag::block ? match_raw_begin(tag_pos) : std::string_view::npos;
    if (raw_end != std::string_view::npos) tag = Tag::raw;
    char sign = tag_pos + 2 < s_.size() ? s_[tag_pos + 2] : '\0';
    if (sign != '-' && sign != '+') sign = '\0';

    std::string text = controlled_text(pos_, tag_pos, sign, tag != Tag::variable);
    int text_line = line_;
    if (!text.empty()) emit(TokenType::data, std::move(text), text_line);
    advance_to(tag_pos);

    switch (tag) {
      case Tag::variable:
      case Tag::block: {
        size_t after = tag_pos + 2 + (sign ? 1 : 0);
        emit(tag == Tag::variable ? TokenType::variable_begin : TokenType::block_begin,
             s_.substr(tag_pos, after - tag_pos), line_);
        advance_to(after);
        line_starting_ = false;
        lex_tag(tag == Tag::block);
        return;
      }
      case Tag::comment:
        lex_comment(tag_pos + 2 + (sign ? 1 : 0));
        return;
      case Tag::raw:
        advance_to(raw_end);
        line_starting_ = raw_end > 0 && s_[raw_end - 1] == '\n';
        lex_raw();
        return;
    }
  }

  void lex_comment(size_t text_begin) {
    size_t close = s_.find("#}", text_begin);
    if (close == std::string::npos) error("Missing end of comment tag");
    size_t end;
    if (close > text_begin && s_[close - 1] == '-') {
      end = skip_spaces(s_, close + 2);
    } else if (close > text_begin && s_[close - 1] == '+') {
      end = close + 2;
    } else {
      end = close + 2 + (close + 2 < s_.size() && s_[close + 2] == '\n' ? 1 : 0);
    }
    advance_to(end);
    line_starting_ = s_[end - 1] == '\n';
  }

  void lex_raw() {
    // (.*?)({%[-+]?\s*endraw\s*(\+%}|-%}\s*|%}\n?))
    for (size_t at = s_.find("{%", pos_); at != std::string::npos; at = s_.find("{%", at + 1)) {
      size_t p = at + 2;
      char sign = (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) ? s_[p] : '\0';
      if (sign) ++p;
      p = skip_spaces(s_, p);
      if (s_.compare(p, 6, "endraw") != 0) continue;
      p = skip_spaces(s_, p + 6);
      size_t end;
      if (s_.compare(p, 3, "+%}") == 0) {
        end = p + 3;
      } else if (s_.compare(p, 3, "-%}") == 0) {
        end = skip_spaces(s_, p + 3);
      } else if (s_.compare(p, 2, "%}") == 0) {
        end = p + 2 + (p + 2 < s_.size() && s_[p + 2] == '\n' ? 1 : 0);
      } else {
        continue;
      }
      std::string text = controlled_text(pos_, at, sign, true);
      int text_line = line_;
      if (!text.empty()) emit(TokenType::data, std::move(text), text_line);
      advance_to(end);
      line_starting_ = s_[end - 1] == '\n';
      return;
    }
    error("Missing end of raw directive");
  }

  // Tokens inside {{ }} or {% %}, up to and including the closing delimiter.
  void lex_tag(bool block) {
    std::vector<char> balancing;
    while (pos_ < s_.size()) {
      if (balancing.empty()) {
        size_t end = std::string_view::npos;
        if (block) {
          if (s_.compare(pos_, 3, "+%}") == 0) {
            end = pos_ + 3;
          } else if (s_.compare(pos_, 3, "-%}") == 0) {
            end = skip_spaces(s_, pos_ + 3);
          } else if (s_.compare(pos_, 2, "%}") == 0) {
            end = pos_ + 2 + (pos_ + 2 < s_.size() && s_[pos_ + 2] == '\n' ? 1 : 0);
          }
        } else {
          if (s_.compare(pos_, 3, "-}}") == 0) {
            end = skip_spaces(s_, pos_ + 3);
          } else if (s_.compare(pos_, 2, "}}") == 0) {
            end = pos_ + 2;
          }
        }
        if (end != std::string_view::npos) {
          emit(block ? TokenType::block_end : TokenType::variable_end, s_.substr(pos_, end - pos_), line_);
          advance_to(end);
          line_starting_ = s_[end - 1] == '\n';
          return;
        }
      }
      if (size_t end = skip_spaces(s_, pos_); end != pos_) {
        advance_to(end);
        continue;
      }
      if (size_t end = match_float(s_, pos_); end != std::string_view::npos) {
        std::string digits;
        for (size_t i = pos_; i < end; ++i)
          if (s_[i] != '_') digits.push_back(s_[i]);
        Token token;
        token.type = TokenType::floating;
        token.text = s_.substr(pos_, end - pos_);
        token.floating = std::strtod(digits.c_str(), nullptr);
        token.line = line_;
        tokens_.push_back(std::move(token));
        advance_to(end);
        continue;
      }
      if (size_t end = match_integer(s_, pos_); end != std::string_view::npos) {
        std::string digits;
        for (size_t i = pos_; i < end; ++i)
          if (s_[i] != '_') digits.push_back(s_[i]);
        int base = 10;
        size_t skip = 0;
        if (digits.size() > 1 && digits[0] == '0' && digits[1] != '0') {
          char letter = char(digits[1] | 0x20);
          base = letter == 'b' ? 2 : letter == 'o' ? 8 : 16;
          skip = 2;
        }
        errno = 0;
        unsigned long long value = std::strtoull(digits.c_str() + skip, nullptr, base);
        if (errno == ERANGE || value > uint64_t(INT64_MAX))
          throw TemplateException(FailureKind::limit, "integer literal too large (kiln's integers are 64-bit)", line_);
        Token token;
        token.type = TokenType::integer;
        token.text = s_.substr(pos_, end - pos_);
        token.integer = int64_t(value);
        token.line = line_;
        tokens_.push_back(std::move(token));
        advance_to(end);
        continue;
      }
      if (size_t end = match_name(s_, pos_); end != std::string_view::npos) {
        emit(TokenType::name, s_.substr(pos_, end - pos_), line_);
        advance_to(end);
        continue;
      }
      if (size_t end = match_string(s_, pos_); end != std::string_view::npos) {
        emit(TokenType::string, unescape_string(std::string_view(s_).substr(pos_ + 1, end - pos_ - 2), line_), line_);
        advance_to(end);
        continue;
      }
      if (size_t end = match_operator(s_, pos_); end != std::string_view::npos) {
        std::string op = s_.substr(pos_, end - pos_);
        if (op == "(" || op == "[" || op == "{") {
          balancing.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        } else if (op == ")" || op == "]" || op == "}") {
          if (balancing.empty()) error(fmt::format("unexpected '{}'", op));
          char expected = balancing.back();
          balancing.pop_back();
          if (expected != op[0]) error(fmt::format("unexpected '{}', expected '{}'", op, expected));
        }
        emit(TokenType::op, std::move(op), line_);
        advance_to(end);
        continue;
      }
      error(fmt::format("unexpected char {} at {}", py::repr(s_.substr(pos_, 1)), pos_));
    }
  }

  std::string s_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

// jinja2 reads \r\n and \r as \n, and drops one trailing newline (keep_trailing_newline=False).
std::string normalize_source(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

std::vector<Token> tokenize(std::string_view source) {
  return Lexer(normalize_source(source)).run();
}

std::string describe_token(const Token& token) {
  switch (token.type) {
    case TokenType::data:
      return "template data / text";
    case TokenType::variable_begin:
      return "begin of print statement";
    case TokenType::variable_end:
      return "end of print statement";
    case TokenType::block_begin:
      return "begin of statement block";
    case TokenType::block_end:
      return "end of statement block";
    case TokenType::eof:
      return "end of template";
    case TokenType::string:
      return "string";
    case TokenType::integer:
      return "integer";
    case TokenType::floating:
      return "float";
    default:
      return token.text;
  }
}

}  // namespace kiln::jinja
