// kernels/thread_pool.cc
#include "kernels/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TIERKV_PAUSE() _mm_pause()
#else
#define TIERKV_PAUSE() std::this_thread::yield()
#endif

namespace tierkv::kernels {
namespace {

// Spin iterations (each a pause, ~10-150 cycles) before a thread blocks: long enough to
// bridge the gap between the short jobs of one decode step, short enough not to burn a
// shared core between steps.
constexpr int kSpin = 1 << 13;

// The pool whose job this thread is running (nested ParallelFor runs inline).
thread_local const ThreadPool* tl_pool = nullptr;

}  // namespace

ThreadPool::ThreadPool(int threads)
    : n_threads_(threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))) {
  workers_.reserve(static_cast<size_t>(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::Work() {
  const int64_t n = n_;
  for (;;) {
    const int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= n) break;
    call_(ctx_, i);
  }
}

void ThreadPool::Run(int64_t n, Call call, void* ctx) {
  if (n <= 0) return;
  if (n == 1 || workers_.empty() || tl_pool == this) {
    for (int64_t i = 0; i < n; ++i) call(ctx, i);
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mu_);
  call_ = call;
  ctx_ = ctx;
  n_ = n;
  next_.store(0, std::memory_order_relaxed);
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_cv_.notify_all();

  const ThreadPool* saved = tl_pool;
  tl_pool = this;
  Work();
  tl_pool = saved;

  for (int s = 0; s < kSpin && pending_.load(std::memory_order_acquire) != 0; ++s) TIERKV_PAUSE();
  if (pending_.load(std::memory_order_acquire) != 0) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
  }
}

void ThreadPool::WorkerLoop() {
  tl_pool = this;
  uint64_t seen = 0;
  for (;;) {
    bool ready = false;
    for (int s = 0; s < kSpin; ++s) {
      if (generation_.load(std::memory_order_acquire) != seen) {
        ready = true;
        break;
      }
      TIERKV_PAUSE();
    }
    if (!ready) {
      std::unique_lock<std::mutex> lock(mu_);
      wake_cv_.wait(lock, [&] { return stop_ || generation_.load(std::memory_order_acquire) != seen; });
      if (stop_) return;
    }
    seen = generation_.load(std::memory_order_acquire);
    Work();
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

}  // namespace tierkv::kernels
