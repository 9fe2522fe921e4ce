// kernels/thread_pool.h
//
// A small fork-join pool for the CPU kernels: `threads` threads in all, the calling
// thread being one of them (so ThreadPool(1) starts no thread and runs everything
// inline). ParallelFor hands out task indices from an atomic counter; it returns when
// every task has finished. Workers spin briefly after a job (a decode step issues
// thousands of short jobs back to back) and then sleep on a condition variable.
//
// Which thread runs which task is not fixed, so kernels that must be deterministic give
// each task its own output (rows of a matvec, heads of attention) and never reduce
// across tasks in completion order.
//
// Thread-safety: ParallelFor may be called from any thread; concurrent calls are
// serialised. A task that calls ParallelFor on the pool it runs on gets the nested
// loop inline on its own thread (no deadlock, no extra parallelism).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace tierkv::kernels {

class ThreadPool {
 public:
  // threads: total threads including the caller; <= 0 means the hardware concurrency.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // fn(i) for every i in [0, n).
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
  void Work();

  const int n_threads_;
  std::vector<std::thread> workers_;

  std::mutex run_mu_;  // serialises Run callers
  std::mutex mu_;      // with the condition variables below
  std::condition_variable wake_cv_;
  std::condition_variable done_cv_;
  bool stop_ = false;                      // GUARDED_BY(mu_)
  std::atomic<uint64_t> generation_{0};    // bumped per job (under mu_)
  std::atomic<int64_t> next_{0};           // next task index of the current job
  std::atomic<int> pending_{0};            // workers still on the current job
  Call call_ = nullptr;                    // the current job; written before generation_
  void* ctx_ = nullptr;
  int64_t n_ = 0;
};

}  // namespace tierkv::kernels
