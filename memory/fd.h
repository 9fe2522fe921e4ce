// memory/fd.h
//
// UniqueFd: sole owner of a POSIX file descriptor, closed when the owner goes (so that
// no error path needs a hand-written close). Move-only; -1 is "none". release() hands
// the descriptor to something else that closes it (fdopendir, a mapping's owner).
//
// Thread-safety: as an int; one owner.
#pragma once

#include <unistd.h>

#include <utility>

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

}  // namespace tierkv
