// memory/fd.h
//
// UniqueFd: sole owner of a POSIX file descriptor, closed when the owner goes (so that
// no error path needs a hand-written close). Move-only; -1 is "none". release() hands
// the descriptor to something else that closes it (fdopendir, a mapping's owner).
//
// PreadFully: n bytes at offset `off`, through short reads and EINTR.
//
// Thread-safety: as an int; one owner.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "memory/status.h"

namespace tierkv {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // The descriptor, no longer owned.
  int release() { return std::exchange(fd_, -1); }
  // Closes the one held (its close error ignored: callers that care sync first), then
  // holds fd.
  void reset(int fd = -1) {
    if (fd_ >= 0) (void)::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// Reads n bytes at `off` into buf. Errors name `what`: "reading WHAT: <errno>", or
// Corruption "truncated: WHAT ends past the end of the file" when the file is shorter.
inline Status PreadFully(int fd, void* buf, size_t n, uint64_t off, const std::string& what) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = pread(fd, static_cast<char*>(buf) + done, n - done, static_cast<off_t>(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::FromErrno(errno, "reading " + what);
    if (r == 0) return Status::Corruption("truncated: " + what + " ends past the end of the file");
    done += static_cast<size_t>(r);
  }
  return Status::Ok();
}

}  // namespace tierkv
