// Internal error signalling of the engine. A template error unwinds through arbitrarily deep
// evaluation (a filter inside a macro inside a loop), exactly as a Python exception unwinds through
// jinja2's generated code, so inside the engine it is a C++ exception; Template::parse and
// Template::render catch it and hand a Result to the caller. Nothing throws past that boundary.
#pragma once

#include <fmt/format.h>

#include <exception>
#include <string>
#include <utility>

#include "text/jinja/jinja.h"

namespace kiln::jinja {

class TemplateException : public std::exception {
 public:
  TemplateException(FailureKind kind, std::string message, int line = 0)
      : kind_(kind), message_(std::move(message)), line_(line) {}
  const char* what() const noexcept override { return message_.c_str(); }
  FailureKind kind() const { return kind_; }
  const std::string& message() const { return message_; }
  int line() const { return line_; }

 private:
  FailureKind kind_;
  std::string message_;
  int line_;
};

template <typename... Args>
[[noreturn]] void fail(FailureKind kind, fmt::format_string<Args...> format, Args&&... args) {
  throw TemplateException(kind, fmt::format(format, std::forward<Args>(args)...));
}

// The Python exception most errors correspond to.
template <typename... Args>
[[noreturn]] void type_error(fmt::format_string<Args...> format, Args&&... args) {
  throw TemplateException(FailureKind::runtime, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace kiln::jinja
