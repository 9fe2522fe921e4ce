// memory/status.cc
#include "memory/status.h"

#include <cerrno>
#include <cstring>

namespace tierkv {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kExhausted: return "exhausted";
    case StatusCode::kIoError: return "io error";
    case StatusCode::kNoSpace: return "no space";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kCorruption: return "corruption";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kPermissionDenied: return "permission denied";
    case StatusCode::kFailedPrecondition: return "failed precondition";
    case StatusCode::kInternal: return "internal";
  }
  return "unknown";
}

Status Status::FromErrno(int err, const std::string& what) {
  std::string m = what + ": " + std::strerror(err) + " (errno " + std::to_string(err) + ")";
  switch (err) {
    case ENOSPC: case EDQUOT: return NoSpace(std::move(m));
    case ENOMEM: return Exhausted(std::move(m));
    case EPERM: case EACCES: return PermissionDenied(std::move(m));
    case ENOENT: return NotFound(std::move(m));
    case EINVAL: return InvalidArgument(std::move(m));
    default: return IoError(std::move(m));
  }
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

}  // namespace tierkv
