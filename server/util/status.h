// Status / StatusOr: the engine's one error type. Converted to grpc::Status in server/api only.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace qpool {

// Codes mirror the gRPC codes the API layer maps them to (ToGrpc in api/proto_convert.h).
enum class StatusCode {
  kOk = 0,
  kCancelled,
  kInvalidArgument,
  kNotFound,
  kAlreadyExists,
  kPermissionDenied,
  kResourceExhausted,
  kFailedPrecondition,
  kUnavailable,
  kInternal,
  kUnauthenticated,
  kDeadlineExceeded,
};

// Name of a code, e.g. "INVALID_ARGUMENT".
const char* StatusCodeName(StatusCode code);

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: steps must be ..." for logs.
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }

// Either a value or a non-OK Status. Made from an OK Status it holds no value, so it is not ok:
// it holds INTERNAL saying so, and value() is never reached through a successful ok().
template <typename T>
class StatusOr {
 public:
  StatusOr(const Status& status) : status_(NotOk(status)) {}  // NOLINT: implicit by design
  StatusOr(Status&& status) : status_(NotOk(std::move(status))) {}  // NOLINT
  StatusOr(const T& value) : value_(value) {}  // NOLINT
  StatusOr(T&& value) : value_(std::move(value)) {}  // NOLINT

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  static Status NotOk(Status status) {
    if (!status.ok()) return status;
    return Status(StatusCode::kInternal, "StatusOr made from an OK status, without a value");
  }

  Status status_;
  std::optional<T> value_;
};

}  // namespace qpool

#define QPOOL_CONCAT_INNER(a, b) a##b
#define QPOOL_CONCAT(a, b) QPOOL_CONCAT_INNER(a, b)

// Returns the status from the enclosing function when it is not OK.
#define RETURN_IF_ERROR(expr)                    \
  do {                                           \
    ::qpool::Status _qpool_status = (expr);      \
    if (!_qpool_status.ok()) return _qpool_status; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, Foo());` declares x from a StatusOr or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(QPOOL_CONCAT(_qpool_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
