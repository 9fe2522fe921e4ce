// memory/status.h
//
// Errors as values: Status and Result<T>. No exception crosses a module boundary;
// programming errors are asserts. Thread-safety: plain values.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace tierkv {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // bad input from the user (size string, option value)
  kExhausted,         // a tier is full: a signal, the caller may evict and retry
  kIoError,           // EIO, short read/write, failed copy
  kNoSpace,           // ENOSPC
  kNotFound,
  kCorruption,        // checksum mismatch, malformed file
  kUnsupported,       // no such device, feature not built
  kPermissionDenied,  // mlock refused, open refused
  kFailedPrecondition,
  kInternal,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status Exhausted(std::string m) { return {StatusCode::kExhausted, std::move(m)}; }
  static Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
  static Status NoSpace(std::string m) { return {StatusCode::kNoSpace, std::move(m)}; }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status Corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
  static Status Unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
  static Status PermissionDenied(std::string m) { return {StatusCode::kPermissionDenied, std::move(m)}; }
  static Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  // An errno-based error: "<what>: <strerror> (errno N)"; ENOSPC maps to kNoSpace.
  static Status FromErrno(int err, const std::string& what);

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "io error: pwrite disk frame 3: Input/output error (errno 5)"
  std::string ToString() const;

  // Prefixes the message with context, keeping the code.
  Status Annotate(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, context + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {    // NOLINT
    assert(!std::get<Status>(v_).ok() && "Result from an ok Status carries no value");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }
  T& value() & { assert(ok()); return std::get<T>(v_); }
  const T& value() const& { assert(ok()); return std::get<T>(v_); }
  T&& value() && { assert(ok()); return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

#define TIERKV_RETURN_IF_ERROR(expr)          \
  do {                                        \
    ::tierkv::Status _st = (expr);            \
    if (!_st.ok()) return _st;                \
  } while (0)

#define TIERKV_CONCAT_INNER_(a, b) a##b
#define TIERKV_CONCAT_(a, b) TIERKV_CONCAT_INNER_(a, b)
#define TIERKV_ASSIGN_OR_RETURN(lhs, expr) \
  TIERKV_ASSIGN_OR_RETURN_IMPL_(TIERKV_CONCAT_(_res_, __LINE__), lhs, expr)
#define TIERKV_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

}  // namespace tierkv
