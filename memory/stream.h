// memory/stream.h
//
// Streams and tickets: ordered queues of work and the markers that order one stream
// after another (DESIGN.md). In CPU builds a Stream is one worker thread running its
// tasks in FIFO order; CUDA copies run inside those tasks on a CUDA stream, so the
// semantics are the same in both builds.
//
// A Ticket is the handle of an asynchronous operation. States: pending -> ready, or
// pending -> failed (with a Status). Wait() blocks until it is not pending and returns
// the status; WaitOn(stream) makes the stream's later tasks wait for it. A Ticket may be
// copied and waited on from any thread; it must not be completed twice.
//
// Waiting spins briefly (kSpinWait) before it blocks, on both sides: the worker for new
// tasks and Wait() for completion. Blocking costs a futex wake-up, which on a VM whose
// idle vCPU has halted takes tens of microseconds: more than many page copies. (GPU
// runtimes spin on events for the same reason.)
//
// Thread-safety: Stream and Ticket are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "memory/status.h"

namespace tierkv {

enum class TicketState { kPending, kReady, kFailed };

// How long waiters spin before they block (see above).
inline constexpr std::chrono::microseconds kSpinWait{50};

// Spins until pred() or kSpinWait has passed; returns pred().
template <typename Pred>
bool SpinFor(Pred pred) {
  const auto until = std::chrono::steady_clock::now() + kSpinWait;
  for (;;) {
    if (pred()) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
}

class Stream;

class Ticket {
 public:
  // A ticket that is already ready (nothing to wait for).
  Ticket();
  // A pending ticket; the producer completes it with Complete().
  static Ticket Pending();

  TicketState state() const;
  bool done() const { return state() != TicketState::kPending; }
  // Blocks until done; returns Ok when ready, the failure otherwise.
  Status Wait() const;
  // Tasks enqueued on `stream` after this call run only once this ticket is done.
  void WaitOn(Stream& stream) const;

  // Producer side. REQUIRES: state() == kPending.
  void Complete(Status status) const;

 private:
  struct Shared {
    mutable std::mutex mu;
    std::condition_variable cv;
    TicketState state = TicketState::kPending;  // GUARDED_BY(mu)
    Status status;                              // GUARDED_BY(mu)
    std::atomic<bool> done{false};              // state != kPending, for spinning waiters
  };
  explicit Ticket(std::shared_ptr<Shared> s) : s_(std::move(s)) {}
  std::shared_ptr<Shared> s_;
};

class Stream {
 public:
  explicit Stream(std::string name);
  ~Stream();  // runs what is queued, then joins
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  const std::string& name() const { return name_; }
  // Urgent tasks run before every normal task still queued (FIFO among themselves):
  // demand copies someone is blocked on overtake speculative prefetches. Record()
  // orders normal tasks only.
  void Enqueue(std::function<void()> task, bool urgent = false);
  // A ticket that becomes ready when every task enqueued before it has run (an event).
  Ticket Record();
  // Blocks until every task enqueued so far has run.
  void Synchronize() { (void)Record().Wait(); }
  // True when called from this stream's worker (tasks must not Synchronize themselves).
  bool OnWorker() const { return std::this_thread::get_id() == worker_.get_id(); }

  // The stream's own counter: seconds its worker spent running tasks (busy, not
  // waiting for work) since construction. Callers take differences.
  double busy_seconds() const { return static_cast<double>(busy_ns_.load(std::memory_order_relaxed)) * 1e-9; }

 private:
  void Run();

  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;   // GUARDED_BY(mu_)
  std::deque<std::function<void()>> urgent_;  // GUARDED_BY(mu_)
  std::atomic<size_t> queued_{0};             // tasks in both, for the spinning worker
  bool stop_ = false;                        // GUARDED_BY(mu_)
  std::atomic<uint64_t> busy_ns_{0};
  std::thread worker_;
};

}  // namespace tierkv
