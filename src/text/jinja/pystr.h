// Python's str semantics over UTF-8 std::string: what jinja2 templates see when they call string
// methods or filters. Indices and lengths count code points, as Python's do. Case mapping and
// character classes cover Latin, Greek, Cyrillic, Armenian and fullwidth forms; other scripts have
// no case and count as letters (docs/chat-templates.md lists the differences).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::jinja::py {

// --- UTF-8 ---------------------------------------------------------------------------------------
// Invalid bytes decode to U+FFFD (Python could not have read such text in the first place).
std::u32string decode_utf8(std::string_view text);
void append_utf8(std::string& out, char32_t c);
std::string encode_utf8(std::u32string_view text);
size_t code_point_count(std::string_view text);

// --- character classes (str.isspace() etc.) ------------------------------------------------------
bool is_space(char32_t c);
bool is_line_break(char32_t c);  // what str.splitlines() splits on
bool is_printable(char32_t c);   // str.isprintable(), which repr() uses to decide on escapes
bool is_cased(char32_t c);
bool is_alpha(char32_t c);
bool is_decimal(char32_t c);
bool is_digit(char32_t c);
bool is_numeric(char32_t c);
bool is_word_char(char32_t c);  // regex \w

// --- case ----------------------------------------------------------------------------------------
std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string casefold(std::string_view s);
std::string swapcase(std::string_view s);
std::string title(std::string_view s);       // str.title()
std::string capitalize(std::string_view s);  // str.capitalize()
bool is_upper(std::string_view s);
bool is_lower(std::string_view s);
bool is_title(std::string_view s);

// --- algorithms ----------------------------------------------------------------------------------
enum class StripSide { both, left, right };
// chars: the set of code points to strip; nullopt strips whitespace.
std::string strip(std::string_view s, const std::optional<std::string>& chars, StripSide side = StripSide::both);
// sep nullopt splits on runs of whitespace. maxsplit < 0 is unlimited. sep must not be empty.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
// Stops early once the result is longer than max_bytes (the caller reports the limit).
std::string replace(std::string_view s, std::string_view old_text, std::string_view new_text, int64_t count,
                    size_t max_bytes = SIZE_MAX);

// Python's slice-style adjustment of optional start/end against a length.
void adjust_range(std::optional<int64_t> start, std::optional<int64_t> end, int64_t length, int64_t& lo, int64_t& hi);
// Code point index of `sub` within s[start:end], or -1.
int64_t find(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end,
             bool reverse);
int64_t count(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end);
bool starts_with(std::string_view s, std::string_view prefix, std::optional<int64_t> start, std::optional<int64_t> end,
                 bool at_end);

std::string pad(std::string_view s, int64_t width, char32_t fill, char align);  // align: '<', '>', '^'
std::string center(std::string_view s, int64_t width, char32_t fill);           // str.center's split
std::string zfill(std::string_view s, int64_t width);

// --- reprs ---------------------------------------------------------------------------------------
std::string repr(std::string_view s);         // Python's repr() of a str
std::string float_repr(double x);             // Python's repr() of a float (shortest round trip)
std::string escape_html(std::string_view s);  // markupsafe.escape

}  // namespace kiln::jinja::py
