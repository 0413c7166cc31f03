// Errors as values: kiln never exits or aborts on bad input. A Result<T> holds either a value or
// an Error whose message is one line naming what is wrong (file, tensor, field); Status is
// Result<void>. Part of the public API (kiln/engine.h returns them), and what the library's own
// code returns throughout.
#pragma once

#include <fmt/format.h>

#include <string>
#include <utility>
#include <variant>

namespace kiln {

struct Error {
  std::string message;
};

template <typename... Args>
Error make_error(fmt::format_string<Args...> format, Args&&... args) {
  return Error{fmt::format(format, std::forward<Args>(args)...)};
}

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}      // NOLINT: implicit by design
  Result(Error error) : state_(std::move(error)) {}  // NOLINT

  bool ok() const { return std::holds_alternative<T>(state_); }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<T>(state_); }
  const T& value() const& { return std::get<T>(state_); }
  T&& value() && { return std::get<T>(std::move(state_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const { return std::get<Error>(state_); }

 private:
  std::variant<T, Error> state_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT

  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return error_; }

 private:
  Error error_;
  bool ok_ = true;
};

using Status = Result<void>;

inline Status ok_status() {
  return {};
}

}  // namespace kiln

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)

// Returns the error of a failed Status/Result from the enclosing function.
#define KILN_TRY(expr)                                           \
  do {                                                           \
    auto&& kiln_try_result_ = (expr);                            \
    if (!kiln_try_result_.ok()) return kiln_try_result_.error(); \
  } while (0)

// Declares `lhs` from a Result, or returns its error from the enclosing function. It expands to
// several statements: give it braces under an if.
#define KILN_ASSIGN(lhs, expr) KILN_ASSIGN_IMPL(KILN_CONCAT(kiln_result_, __COUNTER__), lhs, expr)
#define KILN_ASSIGN_IMPL(tmp, lhs, expr)        \
  auto tmp = (expr);                            \
  if (!tmp.ok()) return std::move(tmp).error(); \
  lhs = std::move(tmp).value()
