// Result<T>: recoverable errors travel in return values (bpftrace's habit), written so it can
// become std::expected. Throw only at main.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <variant>

namespace strata {

struct Error {
  std::string message;  // what failed, on what, and what to do: one line
  int exit_code = 1;    // for the CLI: 1 bad input / usage, 2 environment (permissions, kernel)

  static Error from_errno(const std::string& what, int err) {
    return Error{what + ": " + std::strerror(err)};
  }
  // Adds context in front: "opening store x.db: <inner>"
  Error context(const std::string& ctx) const { return Error{ctx + ": " + message, exit_code}; }
  Error environment() const { return Error{message, 2}; }
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}            // NOLINT
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

// Result<void>
template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : err_(std::move(error)), ok_(false) {}  // NOLINT
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return err_; }

 private:
  Error err_;
  bool ok_ = true;
};

using Status = Result<void>;

}  // namespace strata
