// Errors as values (kiln/status.h, shared with the public API), and helpers for their messages.
#pragma once

#include <string>
#include <string_view>

#include "kiln/status.h"

namespace kiln {

// A message as one line: line breaks and other control characters from elsewhere (a token, a
// template's raise_exception) shown escaped.
inline std::string one_line(std::string_view message) {
  std::string out;
  for (char c : message) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (static_cast<unsigned char>(c) < 0x20)
      out += fmt::format("\\x{:02X}", static_cast<unsigned char>(c));
    else
      out += c;
  }
  return out;
}

}  // namespace kiln
