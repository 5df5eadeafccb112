// Result<T>: a value or an Error, passed across module and thread boundaries instead of
// exceptions. An Error carries a kind (for callers that branch on it) and a message that already
// names the object it concerns, so it can be logged or returned to the kubelet as it is.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace vfio_dra {

enum class ErrorKind {
  kInvalidArgument,
  kNotFound,
  kAlreadyExists,
  kConflict,
  kGone,  // watch resourceVersion too old (HTTP 410)
  kUnavailable,
  kDeadlineExceeded,
  kPermissionDenied,
  kUnauthenticated,
  kUnimplemented,
  kFailedPrecondition,
  kDataLoss,  // stored state is corrupt or unreadable as written
  kInternal,
};

const char* ErrorKindName(ErrorKind kind);

struct Error {
  ErrorKind kind = ErrorKind::kInternal;
  std::string message;

  // Returns a copy whose message is prefixed with context ("what we were doing: ").
  Error Wrap(const std::string& context) const { return Error{kind, context + ": " + message}; }
};

inline Error MakeError(ErrorKind kind, std::string message) {
  return Error{kind, std::move(message)};
}

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}      // NOLINT(google-explicit-constructor)
  Result(Error error) : state_(std::move(error)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(state_); }
  explicit operator bool() const { return ok(); }

  const T& value() const& { return std::get<T>(state_); }
  T& value() & { return std::get<T>(state_); }
  T&& value() && { return std::get<T>(std::move(state_)); }
  T&& operator*() && { return std::move(*this).value(); }
  const T* operator->() const { return &std::get<T>(state_); }
  T* operator->() { return &std::get<T>(state_); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }

  const Error& error() const { return std::get<Error>(state_); }

 private:
  std::variant<T, Error> state_;
};

// Result for operations that produce no value.
class [[nodiscard]] Status {
 public:
  Status() = default;
  // NOLINTNEXTLINE(google-explicit-constructor): errors convert implicitly, as for Result<T>.
  Status(Error error) : error_(std::move(error)), ok_(false) {}

  static Status Ok() { return Status(); }
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return error_; }

 private:
  Error error_;
  bool ok_ = true;
};

}  // namespace vfio_dra
