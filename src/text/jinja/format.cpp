// Python's string formatting: printf-style `%` (used by the `%` operator and the `format` filter)
// and str.format with its format-spec mini-language.
#include <cmath>
#include <cstdio>

#include "text/jinja/operators.h"
#include "text/jinja/pystr.h"
#include "text/jinja/renderer.h"

namespace kiln::jinja {

namespace {

std::string c_format(const std::string& spec, double x) {
  char buffer[512];
  int n = std::snprintf(buffer, sizeof buffer, spec.c_str(), x);
  if (n < 0) return "";
  if (size_t(n) < sizeof buffer) return std::string(buffer, size_t(n));
  std::string out(size_t(n) + 1, '\0');
  std::snprintf(out.data(), out.size(), spec.c_str(), x);
  out.resize(size_t(n));
  return out;
}

std::string ascii_repr(const Value& v, size_t max_bytes) {
  std::string out;
  for (char32_t c : py::decode_utf8(to_repr(v, max_bytes))) {
    if (c < 0x80) {
      out.push_back(char(c));
    } else if (c <= 0xFF) {
      out += fmt::format("\\x{:02x}", uint32_t(c));
    } else if (c <= 0xFFFF) {
      out += fmt::format("\\u{:04x}", uint32_t(c));
    } else {
      out += fmt::format("\\U{:08x}", uint32_t(c));
    }
  }
  return out;
}

std::string truncate_code_points(const std::string& s, int64_t precision) {
  if (precision < 0) return s;
  std::u32string text = py::decode_utf8(s);
  if (int64_t(text.size()) <= precision) return s;
  return py::encode_utf8(std::u32string_view(text).substr(0, size_t(precision)));
}

// --- printf-style --------------------------------------------------------------------------------

struct PercentSpec {
  bool left = false, plus = false, space = false, alternate = false, zero = false;
  int64_t width = -1, precision = -1;
  char type = 's';
};

std::string pad_number(const PercentSpec& spec, std::string sign, std::string prefix, std::string digits) {
  std::string body = prefix + digits;
  int64_t length = int64_t(sign.size() + body.size());
  if (spec.width <= length) return sign + body;
  size_t fill = size_t(spec.width - length);
  if (spec.left) return sign + body + std::string(fill, ' ');
  if (spec.zero) return sign + prefix + std::string(fill, '0') + digits;
  return std::string(fill, ' ') + sign + body;
}

int64_t integer_for(const Value& v, char type) {
  if (v.is_int() || v.is_bool()) return v.as_int();
  if (v.is_float() && (type == 'd' || type == 'i' || type == 'u')) {
    double f = v.as_double();
    if (std::isnan(f)) fail(FailureKind::runtime, "cannot convert float NaN to integer");
    if (std::isinf(f)) fail(FailureKind::runtime, "cannot convert float infinity to integer");
    if (std::fabs(f) >= 9.2e18) fail(FailureKind::limit, "integer overflow (kiln's integers are 64-bit)");
    return int64_t(f);
  }
  if (type == 'd' || type == 'i' || type == 'u')
    type_error("%{} format: a real number is required, not {}", type, type_name(v));
  type_error("%{} format: an integer is required, not {}", type, type_name(v));
}

std::string format_percent_item(const PercentSpec& spec, const Value& v, size_t max_bytes) {
  switch (spec.type) {
    case 's':
    case 'r':
    case 'a': {
      std::string text = spec.type == 's'   ? to_str(v, max_bytes)
                         : spec.type == 'r' ? to_repr(v, max_bytes)
                                            : ascii_repr(v, max_bytes);
      text = truncate_code_points(text, spec.precision);
      return py::pad(text, spec.width, ' ', spec.left ? '<' : '>');
    }
    case 'd':
    case 'i':
    case 'u':
    case 'o':
    case 'x':
    case 'X': {
      int64_t i = integer_for(v, spec.type);
      uint64_t magnitude = i < 0 ? uint64_t(0) - uint64_t(i) : uint64_t(i);
      std::string digits = spec.type == 'o'   ? fmt::format("{:o}", magnitude)
                           : spec.type == 'x' ? fmt::format("{:x}", magnitude)
                           : spec.type == 'X' ? fmt::format("{:X}", magnitude)
                                              : fmt::format("{}", magnitude);
      if (spec.precision > int64_t(digits.size())) digits.insert(0, size_t(spec.precision) - digits.size(), '0');
      std::string sign = i < 0 ? "-" : spec.plus ? "+" : spec.space ? " " : "";
      const char* prefix = !spec.alternate    ? ""
                           : spec.type == 'o' ? "0o"
                           : spec.type == 'x' ? "0x"
                           : spec.type == 'X' ? "0X"
                                              : "";
      return pad_number(spec, sign, prefix, digits);
    }
    case 'e':
    case 'E':
    case 'f':
    case 'F':
    case 'g':
    case 'G': {
      if (!v.is_number()) type_error("must be real number, not {}", type_name(v));
      double x = v.as_double();
      if (std::isnan(x)) x = std::fabs(x);  // Python never prints "-nan"
      std::string c = "%";
      if (spec.left) c += '-';
      if (spec.plus) c += '+';
      if (spec.space) c += ' ';
      if (spec.alternate) c += '#';
      if (spec.zero) c += '0';
      if (spec.width >= 0) c += std::to_string(spec.width);
      c += fmt::format(".{}", spec.precision < 0 ? 6 : spec.precision);
      c += spec.type;
      return c_format(c, x);
    }
    case 'c': {
      std::string ch;
      if (v.is_int() || v.is_bool()) {
        int64_t cp = v.as_int();
        if (cp < 0 || cp > 0x10FFFF) fail(FailureKind::runtime, "%c arg not in range(0x110000)");
        py::append_utf8(ch, char32_t(cp));
      } else if (v.is_string() && py::code_point_count(v.as_string()) == 1) {
        ch = v.as_string();
      } else {
        type_error("%c requires int or char");
      }
      return py::pad(ch, spec.width, ' ', spec.left ? '<' : '>');
    }
    default:
      return "";
  }
}

}  // namespace

std::string percent_format(std::string_view format, const Value& args, size_t max_bytes) {
  const List* positional = args.is_tuple() ? &args.as_list() : nullptr;
  // Python's PyMapping_Check: anything with __getitem__ but a tuple or a str. Such an argument is
  // both the mapping for %(key)s and the value of a bare %s, and is never "not all converted".
  const bool mapping = args.is_dict() || args.is_list() || args.is_undefined();
  size_t next_arg = 0;
  bool single_used = false;
  auto take = [&]() -> Value {
    if (positional) {
      if (next_arg >= positional->size()) type_error("not enough arguments for format string");
      return (*positional)[next_arg++];
    }
    if (single_used) type_error("not enough arguments for format string");
    single_used = true;
    return args;
  };
  std::string out;
  std::u32string text = py::decode_utf8(format);
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] != '%') {
      py::append_utf8(out, text[i++]);
      continue;
    }
    size_t spec_start = i++;
    if (i >= text.size()) fail(FailureKind::runtime, "incomplete format");
    std::optional<Value> keyed;
    if (text[i] == '(') {
      if (!mapping) type_error("format requires a mapping");
      int depth = 1;
      size_t key_start = ++i;
      while (i < text.size() && depth > 0) {
        if (text[i] == '(') ++depth;
        if (text[i] == ')') --depth;
        ++i;
      }
      if (depth > 0) fail(FailureKind::runtime, "incomplete format key");
      std::string key = py::encode_utf8(std::u32string_view(text).substr(key_start, i - 1 - key_start));
      if (args.is_undefined()) fail_undefined(args);
      if (args.is_list()) type_error("list indices must be integers or slices, not str");
      const Value* found = args.as_dict().find(std::string_view(key));
      if (!found) fail(FailureKind::runtime, "{}", py::repr(key));
      keyed = *found;
    }
    PercentSpec spec;
    for (; i < text.size(); ++i) {
      char32_t c = text[i];
      if (c == '-')
        spec.left = true;
      else if (c == '+')
        spec.plus = true;
      else if (c == ' ')
        spec.space = true;
      else if (c == '#')
        spec.alternate = true;
      else if (c == '0')
        spec.zero = true;
      else
        break;
    }
    auto read_number = [&]() -> int64_t {
      if (i < text.size() && text[i] == '*') {
        ++i;
        Value w = take();
        if (!w.is_int() && !w.is_bool()) type_error("* wants int");
        return std::clamp<int64_t>(w.as_int(), -(1 << 24), 1 << 24);
      }
      int64_t n = 0;
      while (i < text.size() && text[i] >= '0' && text[i] <= '9')
        n = std::min<int64_t>(n * 10 + (text[i++] - '0'), 1 << 24);
      return n;
    };
    if (i < text.size() && (text[i] == '*' || (text[i] >= '0' && text[i] <= '9'))) {
      spec.width = read_number();
      if (spec.width < 0) spec.left = true, spec.width = -spec.width;
    }
    if (i < text.size() && text[i] == '.') {
      ++i;
      spec.precision = read_number();
    }
    while (i < text.size() && (text[i] == 'h' || text[i] == 'l' || text[i] == 'L')) ++i;
    if (i >= text.size()) fail(FailureKind::runtime, "incomplete format");
    char32_t type = text[i++];
    if (type == '%') {
      out.push_back('%');
      continue;
    }
    if (std::u32string_view(U"srauidoxXeEfFgGc").find(type) == std::u32string_view::npos)
      fail(FailureKind::runtime, "unsupported format character '{}' (0x{:x}) at index {}",
           py::encode_utf8(std::u32string(1, type)), uint32_t(type), i - 1);
    (void)spec_start;
    spec.type = char(type);
    if (spec.left) spec.zero = false;
    out += format_percent_item(spec, keyed ? *keyed : take(), max_bytes);
    if (out.size() > max_bytes) fail(FailureKind::limit, "formatted text exceeds kiln's output limit");
  }
  bool leftover = positional ? next_arg < positional->size() : (!single_used && !mapping);
  if (leftover) type_error("not all arguments converted during string formatting");
  return out;
}

// --- format spec mini-language -------------------------------------------------------------------

namespace {

struct FormatSpec {
  char32_t fill = ' ';
  char align = '\0';
  char sign = '-';
  bool alternate = false;
  int64_t width = -1;
  char grouping = '\0';
  int64_t precision = -1;
  char type = '\0';
};

FormatSpec parse_spec(std::string_view spec_text) {
  std::u32string s = py::decode_utf8(spec_text);
  FormatSpec spec;
  size_t i = 0;
  auto is_align = [](char32_t c) { return c == '<' || c == '>' || c == '=' || c == '^'; };
  if (s.size() >= 2 && is_align(s[1])) {
    spec.fill = s[0];
    spec.align = char(s[1]);
    i = 2;
  } else if (!s.empty() && is_align(s[0])) {
    spec.align = char(s[0]);
    i = 1;
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) spec.sign = char(s[i++]);
  if (i < s.size() && s[i] == 'z') ++i;
  if (i < s.size() && s[i] == '#') spec.alternate = true, ++i;
  if (i < s.size() && s[i] == '0') {
    if (!spec.align) spec.fill = '0', spec.align = '=';
    ++i;
  }
  if (i < s.size() && s[i] >= '0' && s[i] <= '9') {
    spec.width = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9')
      spec.width = std::min<int64_t>(spec.width * 10 + (s[i++] - '0'), 1 << 24);
  }
  if (i < s.size() && (s[i] == ',' || s[i] == '_')) spec.grouping = char(s[i++]);
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (i >= s.size() || s[i] < '0' || s[i] > '9') fail(FailureKind::runtime, "Format specifier missing precision");
    spec.precision = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9')
      spec.precision = std::min<int64_t>(spec.precision * 10 + (s[i++] - '0'), 1 << 24);
  }
  if (i < s.size()) spec.type = char(s[i++]);
  if (i < s.size()) fail(FailureKind::runtime, "Invalid format specifier");
  return spec;
}

std::string group_digits(const std::string& digits, char separator, int every) {
  if (!separator) return digits;
  std::string out;
  int count = 0;
  for (size_t i = digits.size(); i-- > 0;) {
    if (count && count % every == 0) out.push_back(separator);
    out.push_back(digits[i]);
    ++count;
  }
  return std::string(out.rbegin(), out.rend());
}

std::string align_field(const FormatSpec& spec, const std::string& sign, const std::string& body, char default_align) {
  char align = spec.align ? spec.align : default_align;
  int64_t length = int64_t(py::code_point_count(sign) + py::code_point_count(body));
  if (spec.width <= length) return sign + body;
  int64_t fill_count = spec.width - length;
  std::string fill;
  py::append_utf8(fill, spec.fill);
  auto repeat = [&](int64_t n) {
    std::string s;
    for (int64_t k = 0; k < n; ++k) s += fill;
    return s;
  };
  switch (align) {
    case '<':
      return sign + body + repeat(fill_count);
    case '^':
      return repeat(fill_count / 2) + sign + body + repeat(fill_count - fill_count / 2);
    case '=':
      return sign + repeat(fill_count) + body;
    default:
      return repeat(fill_count) + sign + body;
  }
}

std::string sign_of(bool negative, char sign) {
  return negative ? "-" : sign == '+' ? "+" : sign == ' ' ? " " : "";
}

// Python's float.__format__ for the types e, f, g, % and none.
std::string format_float(double x, const FormatSpec& spec) {
  bool negative = std::signbit(x) && !std::isnan(x);
  double magnitude = std::fabs(x);
  char type = spec.type;
  std::string body;
  if (std::isnan(x) || std::isinf(x)) {
    body = std::isnan(x) ? "nan" : "inf";
    if (type == 'E' || type == 'F' || type == 'G') body = py::upper(body);
    if (type == '%') body += "%";
  } else if (type == '\0' && spec.precision < 0) {
    body = py::float_repr(magnitude);
  } else {
    int64_t precision = spec.precision < 0 ? 6 : spec.precision;
    if (type == '%') {
      body = c_format(fmt::format("%{}.{}f", spec.alternate ? "#" : "", precision), magnitude * 100) + "%";
    } else if (type == '\0' || type == 'n') {
      // Like 'g', but switches to exponent notation at exp >= precision - 1 and keeps a fractional digit.
      int64_t p = precision == 0 ? 1 : precision;
      std::string e = c_format(fmt::format("%.{}e", p - 1), magnitude);
      int exponent = std::atoi(e.c_str() + e.find('e') + 1);
      if (type == 'n' ? (exponent >= -4 && exponent < p) : (exponent >= -4 && exponent < p - 1)) {
        body = c_format(fmt::format("%.{}f", std::max<int64_t>(0, p - 1 - exponent)), magnitude);
      } else {
        body = e;
      }
      if (!spec.alternate) {
        size_t e_at = body.find('e');
        std::string mantissa = body.substr(0, e_at), tail = e_at == std::string::npos ? "" : body.substr(e_at);
        if (mantissa.find('.') != std::string::npos) {
          while (mantissa.back() == '0') mantissa.pop_back();
          if (mantissa.back() == '.') mantissa.pop_back();
        }
        if (type == '\0' && tail.empty() && mantissa.find('.') == std::string::npos) mantissa += ".0";
        body = mantissa + tail;
      }
    } else {
      std::string c = "%";
      if (spec.alternate) c += "#";
      body = c_format(fmt::format("{}.{}{}", c, precision, type), magnitude);
    }
  }
  if (spec.grouping && !std::isnan(x) && !std::isinf(x)) {
    size_t end = body.find_first_not_of("0123456789");
    if (end == std::string::npos) end = body.size();
    body = group_digits(body.substr(0, end), spec.grouping, 3) + body.substr(end);
  }
  return align_field(spec, sign_of(negative, spec.sign), body, '>');
}

}  // namespace

std::string format_value(const Value& value, std::string_view spec_text, size_t max_bytes) {
  if (spec_text.empty()) return to_str(value, max_bytes);
  FormatSpec spec = parse_spec(spec_text);
  if (value.is_string()) {
    if (spec.type && spec.type != 's')
      fail(FailureKind::runtime, "Unknown format code '{}' for object of type 'str'", spec.type);
    if (spec.sign != '-') fail(FailureKind::runtime, "Sign not allowed in string format specifier");
    if (spec.align == '=') fail(FailureKind::runtime, "'=' alignment not allowed in string format specifier");
    return align_field(spec, "", truncate_code_points(value.as_string(), spec.precision), '<');
  }
  if (value.is_int() || value.is_bool()) {
    char type = spec.type;
    if (type == 'e' || type == 'E' || type == 'f' || type == 'F' || type == 'g' || type == 'G' || type == '%')
      return format_float(double(value.as_int()), spec);
    if (spec.precision >= 0) fail(FailureKind::runtime, "Precision not allowed in integer format specifier");
    int64_t i = value.as_int();
    uint64_t magnitude = i < 0 ? uint64_t(0) - uint64_t(i) : uint64_t(i);
    std::string digits, prefix;
    int every = 3;
    switch (type) {
      case '\0':
      case 'd':
      case 'n':
        digits = fmt::format("{}", magnitude);
        break;
      case 'b':
        digits = fmt::format("{:b}", magnitude), prefix = "0b", every = 4;
        break;
      case 'o':
        digits = fmt::format("{:o}", magnitude), prefix = "0o", every = 4;
        break;
      case 'x':
        digits = fmt::format("{:x}", magnitude), prefix = "0x", every = 4;
        break;
      case 'X':
        digits = fmt::format("{:X}", magnitude), prefix = "0X", every = 4;
        break;
      case 'c': {
        if (i < 0 || i > 0x10FFFF) fail(FailureKind::runtime, "%c arg not in range(0x110000)");
        std::string ch;
        py::append_utf8(ch, char32_t(i));
        return align_field(spec, "", ch, '<');
      }
      default:
        fail(FailureKind::runtime, "Unknown format code '{}' for object of type 'int'", type);
    }
    if (!spec.alternate) prefix.clear();
    std::string body = prefix + group_digits(digits, spec.grouping, every);
    FormatSpec aligned = spec;
    std::string sign = sign_of(i < 0, spec.sign);
    if ((spec.align ? spec.align : '>') == '=' && !prefix.empty()) {
      // Padding goes between the prefix and the digits.
      sign += prefix;
      body = group_digits(digits, spec.grouping, every);
    }
    return align_field(aligned, sign, body, '>');
  }
  if (value.is_float()) {
    if (spec.type && std::string_view("eEfFgGn%").find(spec.type) == std::string_view::npos)
      fail(FailureKind::runtime, "Unknown format code '{}' for object of type 'float'", spec.type);
    return format_float(value.as_double(), spec);
  }
  type_error("unsupported format string passed to {}.__format__", type_name(value));
}

std::string brace_format(Renderer& renderer, std::string_view format, const CallArgs& args) {
  std::u32string text = py::decode_utf8(format);
  std::string out;
  enum class Numbering { unknown, automatic, manual } numbering = Numbering::unknown;
  size_t auto_index = 0;

  auto lookup = [&](const std::string& field) -> Value {
    size_t end = field.find_first_of(".[");
    std::string first = field.substr(0, end);
    Value object;
    if (first.empty() || std::all_of(first.begin(), first.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      size_t index;
      if (first.empty()) {
        if (numbering == Numbering::manual)
          fail(FailureKind::runtime, "cannot switch from manual field specification to automatic field numbering");
        numbering = Numbering::automatic;
        index = auto_index++;
      } else {
        if (numbering == Numbering::automatic)
          fail(FailureKind::runtime, "cannot switch from automatic field numbering to manual field specification");
        numbering = Numbering::manual;
        index = first.size() > 9 ? SIZE_MAX : std::stoul(first);
      }
      if (index >= args.positional.size())
        fail(FailureKind::runtime, "Replacement index {} out of range for positional args tuple", index);
      object = args.positional[index];
    } else {
      const Value* found = nullptr;
      for (const auto& [name, v] : args.keyword)
        if (name == first) found = &v;
      if (!found) fail(FailureKind::runtime, "{}", py::repr(first));
      object = *found;
    }
    size_t pos = end;
    while (pos != std::string::npos && pos < field.size()) {
      if (field[pos] == '.') {
        size_t next = field.find_first_of(".[", pos + 1);
        std::string name = field.substr(pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1);
        if (name.empty()) fail(FailureKind::runtime, "Empty attribute in format string");
        object = renderer.get_attribute(object, name);
        pos = next;
      } else {
        size_t close = field.find(']', pos);
        if (close == std::string::npos) fail(FailureKind::runtime, "Missing ']' in format string");
        std::string key = field.substr(pos + 1, close - pos - 1);
        bool numeric = !key.empty() && std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
        object = renderer.get_item(object,
                                   numeric && key.size() < 18 ? Value::integer(std::stoll(key)) : Value::string(key));
        pos = close + 1;
        if (pos < field.size() && field[pos] != '.' && field[pos] != '[')
          fail(FailureKind::runtime, "Only '.' or '[' may follow ']' in format field specifier");
      }
    }
    return object;
  };

  // Formats one replacement field (text between the braces); nested fields in the spec allowed.
  std::function<std::string(const std::u32string&, int)> replace_field = [&](const std::u32string& field,
                                                                             int depth) -> std::string {
    if (depth > 2) fail(FailureKind::runtime, "Max string recursion exceeded");
    size_t i = 0;
    int brackets = 0;
    while (i < field.size()) {
      if (field[i] == '[') ++brackets;
      if (field[i] == ']') --brackets;
      if (brackets == 0 && (field[i] == '!' || field[i] == ':')) break;
      ++i;
    }
    std::string name = py::encode_utf8(std::u32string_view(field).substr(0, i));
    char conversion = '\0';
    if (i < field.size() && field[i] == '!') {
      if (i + 1 >= field.size()) fail(FailureKind::runtime, "end of string while looking for conversion specifier");
      conversion = char(field[i + 1]);
      i += 2;
      if (i < field.size() && field[i] != ':') fail(FailureKind::runtime, "expected ':' after conversion specifier");
    }
    std::u32string spec_raw = i < field.size() ? field.substr(i + 1) : std::u32string();
    Value value = lookup(name);
    const size_t max_bytes = renderer.limits().max_output_bytes;
    if (conversion == 'r') {
      value = Value::string(to_repr(value, max_bytes));
    } else if (conversion == 's') {
      value = Value::string(to_str(value, max_bytes));
    } else if (conversion == 'a') {
      value = Value::string(ascii_repr(value, max_bytes));
    } else if (conversion) {
      fail(FailureKind::runtime, "Unknown conversion specifier {}", conversion);
    }
    // Expand nested replacement fields inside the spec.
    std::string spec;
    for (size_t k = 0; k < spec_raw.size(); ++k) {
      if (spec_raw[k] == '{') {
        size_t close = spec_raw.find('}', k);
        if (close == std::u32string::npos) fail(FailureKind::runtime, "unmatched '{{' in format spec");
        spec += replace_field(spec_raw.substr(k + 1, close - k - 1), depth + 1);
        k = close;
      } else {
        py::append_utf8(spec, spec_raw[k]);
      }
    }
    return format_value(value, spec, max_bytes);
  };

  size_t i = 0;
  while (i < text.size()) {
    char32_t c = text[i];
    if (c == '{') {
      if (i + 1 < text.size() && text[i + 1] == '{') {
        out.push_back('{');
        i += 2;
        continue;
      }
      int depth = 1;
      size_t start = ++i;
      while (i < text.size() && depth > 0) {
        if (text[i] == '{') ++depth;
        if (text[i] == '}') --depth;
        ++i;
      }
      if (depth > 0) fail(FailureKind::runtime, "expected '}}' before end of string");
      out += replace_field(text.substr(start, i - 1 - start), 0);
      renderer.check_string(out.size());
    } else if (c == '}') {
      if (i + 1 < text.size() && text[i + 1] == '}') {
        out.push_back('}');
        i += 2;
        continue;
      }
      fail(FailureKind::runtime, "Single '}}' encountered in format string");
    } else {
      py::append_utf8(out, c);
      ++i;
    }
  }
  return out;
}

}  // namespace kiln::jinja
