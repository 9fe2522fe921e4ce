// kvcache/session_lock.h
//
// One writer at a time per session file. A run (or a repair) that may write a session
// holds its SessionLock from before it reads the file until after its last save, so two
// runs on one session take turns: the second sees the first one's save, and no save is
// lost or torn. Readers (`session inspect`, `verify`) take no lock: a save commits
// through a synced manifest and a checksummed slot, so they see one whole save.
//
// The lock is an flock(2) on a lock file beside the session's file (the end of its
// links: SessionFile::SaveTarget), named FILE.lock (or .tierkv-lock.<hash> where that
// name would be too long). The file holds the holder's pid and command for the message
// of a run that has to wait; it is created with O_EXCL | O_NOFOLLOW, opened again only
// as a regular file of this user with no other links, and removed by the holder on
// release. A waiter that wakes on a lock file since removed takes the new one.
// Taking the lock also removes what crashed saves of the session left
// (SessionFile::RemoveLeftovers): with the lock held, no save of it is under way.
//
// Thread-safety: a SessionLock is one owner's; locks of one session taken in two threads
// of one process exclude each other as two processes do (flock is per open file).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "memory/fd.h"
#include "memory/status.h"

namespace tierkv {

class SessionLock {
 public:
  struct Options {
    // false: a session another process holds is refused at once (the error names the
    // holder) instead of waited for.
    bool wait = true;
    // Called once, with the holder's description ("pid 1234: tierkv run ..."), when the
    // lock is held by someone else and this call waits.
    std::function<void(const std::string& holder)> on_wait;
    // Polled while waiting (every 50 ms); true gives up with an error.
    std::function<bool()> cancelled;
    // What this holder writes into the lock file for others' messages.
    std::string command = "tierkv";
  };

  // Locks the session at `session_path` (which need not exist yet).
  static Result<std::unique_ptr<SessionLock>> Acquire(const std::string& session_path, const Options& options);
  static Result<std::unique_ptr<SessionLock>> Acquire(const std::string& session_path) {
    return Acquire(session_path, Options{});
  }
  ~SessionLock();  // removes the lock file, then releases the lock

  SessionLock(const SessionLock&) = delete;
  SessionLock& operator=(const SessionLock&) = delete;

  const std::string& lock_path() const { return lock_path_; }
  // Files of crashed saves removed when the lock was taken.
  int leftovers_removed() const { return leftovers_removed_; }

  // The lock file's name for the session at `session_path`.
  static std::string LockPathFor(const std::string& session_path);

 private:
  SessionLock(std::string lock_path, UniqueFd fd) : lock_path_(std::move(lock_path)), fd_(std::move(fd)) {}

  std::string lock_path_;
  UniqueFd fd_;
  int leftovers_removed_ = 0;
};

}  // namespace tierkv
