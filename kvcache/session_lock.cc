// kvcache/session_lock.cc
#include "kvcache/session_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "kvcache/session_file.h"

namespace tierkv {
namespace {

// Opens the lock file: created exclusively, or an existing one only if it is a regular
// file of this user with no other name (so a planted link or file is never written).
Result<UniqueFd> OpenLockFile(const std::string& path) {
  UniqueFd fd(open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (fd.valid()) return fd;
  if (errno != EEXIST) return Status::FromErrno(errno, "creating the session lock " + path);
  fd.reset(open(path.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return Status::NotFound("");  // removed in between: try again
    if (errno == ELOOP) {
      return Status::PermissionDenied("the session lock " + path +
                                      " is a symbolic link, not a lock tierkv made; refusing to use it");
    }
    return Status::FromErrno(errno, "opening the session lock " + path);
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || st.st_nlink != 1) {
    return Status::PermissionDenied("the session lock " + path +
                                    " is not a lock file tierkv made (another owner, type or link count); "
                                    "refusing to use it");
  }
  return fd;
}

std::string ReadHolder(int fd) {
  char buf[512];
  const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  std::string s = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s.empty() ? "another process" : s;
}

// Whether `path` still names the file open at fd (a holder removes it on release).
bool StillNamed(const std::string& path, int fd) {
  struct stat a {}, b {};
  return fstat(fd, &a) == 0 && lstat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

}  // namespace

std::string SessionLock::LockPathFor(const std::string& session_path) {
  return SessionSiblingPath(SessionFile::SaveTarget(session_path), ".lock", "tierkv-lock");
}

Result<std::unique_ptr<SessionLock>> SessionLock::Acquire(const std::string& session_path, const Options& options) {
  const std::string path = LockPathFor(session_path);
  bool told = false;
  for (;;) {
    auto fd = OpenLockFile(path);
    if (!fd.ok() && fd.status().code() == StatusCode::kNotFound) continue;
    if (!fd.ok()) return fd.status();
    bool waited_out = false;
    while (flock(fd->get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EINTR) continue;
      if (errno != EWOULDBLOCK) {
        const int err = errno;
        return Status::FromErrno(err, "locking the session " + session_path);
      }
      const std::string holder = ReadHolder(fd->get());
      if (!options.wait) {
        return Status::FailedPrecondition("session " + session_path + " is in use by " + holder + " (lock " + path + ")");
      }
      if (!told) {
        if (options.on_wait) options.on_wait(holder);
        told = true;
      }
      if (options.cancelled && options.cancelled()) {
        return Status::FailedPrecondition("gave up waiting for session " + session_path + ", in use by " + holder);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (!StillNamed(path, fd->get())) {  // released and removed: take the new one
        waited_out = true;
        break;
      }
    }
    if (waited_out || !StillNamed(path, fd->get())) continue;
    // Ours. Say who holds it, for the message of whoever waits.
    const std::string who = "pid " + std::to_string(getpid()) + ": " + options.command + "\n";
    if (ftruncate(fd->get(), 0) != 0 || pwrite(fd->get(), who.data(), who.size(), 0) != static_cast<ssize_t>(who.size())) {
      // The lock holds without the note; a full disk must not stop a run that may
      // still save into blocks already allocated.
    }
    std::unique_ptr<SessionLock> lock(new SessionLock(path, std::move(fd).value()));
    lock->leftovers_removed_ = SessionFile::RemoveLeftovers(SessionFile::SaveTarget(session_path));
    return lock;
  }
}

SessionLock::~SessionLock() {
  // Removed while still held, so that a waiter that then gets this (unnamed) file sees
  // it is gone and takes a new one.
  unlink(lock_path_.c_str());
}  // fd_ closes after the unlink

}  // namespace tierkv
