// kernels/thread_pool.h
//
// A small fork-join pool for the CPU kernels: `threads` threads in all, the calling
// thread being one of them (so ThreadPool(1) starts no thread and runs everything
// inline). ParallelFor hands out task indices; it returns when every task has finished.
//
// Tasks are claimed from one atomic ticket that carries the job's generation, so the
// caller never waits for a worker that has not started: if the workers are asleep or
// descheduled (a machine shared with other processes), the caller runs every task itself
// and returns; a worker that wakes late finds the job gone. The caller waits only for
// tasks already running on other threads. Workers spin briefly between jobs (a decode
// step issues many short jobs back to back) and then sleep.
//
// Which thread runs which task is not fixed, so kernels that must be deterministic give
// each task its own output (rows of a matvec, heads of attention) and never reduce
// across tasks in completion order.
//
// Thread-safety: ParallelFor may be called from any thread; concurrent calls that use
// the workers are serialised (one runs at a time); a call of one task, or on a pool
// without workers, runs on its caller at once, beside any other. A task that calls ParallelFor on the pool it runs on gets the nested
// loop inline on its own thread (no deadlock, no extra parallelism).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace tierkv::kernels {

// CPUs the calling thread may run on (its affinity mask: for a program's first thread the
// one taskset and container CPU sets narrow), at least 1; the hardware concurrency where
// the mask cannot be read.
int AvailableCpus();

class ThreadPool {
 public:
  // threads: total threads including the caller; <= 0 means AvailableCpus().
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // fn(i) for every i in [0, n). REQUIRES: n < 2^32.
  template <typename F>
  void ParallelFor(int64_t n, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    Run(n, [](void* ctx, int64_t i) { (*static_cast<Fn*>(ctx))(i); }, const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // fn(begin, end) over contiguous ranges covering [0, n): about 4 ranges per thread,
  // none shorter than `grain` (except when n < grain). Ranges depend only on n, grain
  // and size(), never on timing.
  template <typename F>
  void ParallelRanges(int64_t n, int64_t grain, F&& fn) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int64_t chunks = static_cast<int64_t>(n_threads_) * 4;
    if (chunks > n / grain) chunks = n / grain;
    if (chunks <= 1 || n_threads_ == 1) {
      fn(int64_t{0}, n);
      return;
    }
    const int64_t step = (n + chunks - 1) / chunks;
    ParallelFor((n + step - 1) / step, [&](int64_t c) {
      const int64_t b = c * step;
      fn(b, b + step < n ? b + step : n);
    });
  }

 private:
  using Call = void (*)(void* ctx, int64_t i);
  void Run(int64_t n, Call call, void* ctx);
  void WorkerLoop();
  // Claims and runs tasks of job `gen` until none is left; `count` (workers) marks the
  // thread as in flight meanwhile.
  void Work(uint32_t gen, bool count);

  const int n_threads_;
  std::vector<std::thread> workers_;

  std::mutex run_mu_;  // serialises Run callers
  std::mutex mu_;      // with wake_cv_
  std::condition_variable wake_cv_;
  std::atomic<bool> stop_{false};        // set under mu_
  int sleepers_ = 0;                     // GUARDED_BY(mu_)
  std::atomic<uint32_t> generation_{0};  // the current job's generation
  // (generation << 32) | next task index: claiming a task is one compare-and-swap that
  // fails once the job is over or replaced.
  std::atomic<uint64_t> ticket_{0};
  std::atomic<int> in_flight_{0};        // workers inside Work() (claiming or running tasks)
  Call call_ = nullptr;                  // the current job; written before ticket_
  void* ctx_ = nullptr;
  std::atomic<int64_t> n_{0};
};

}  // namespace tierkv::kernels
