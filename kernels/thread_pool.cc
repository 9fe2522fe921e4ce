// kernels/thread_pool.cc
#include "kernels/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__linux__)
#include <sched.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TIERKV_PAUSE() _mm_pause()
#else
#define TIERKV_PAUSE() std::this_thread::yield()
#endif

namespace tierkv::kernels {
namespace {

// How long a worker spins for the next job before it sleeps: enough to bridge the gaps
// between the jobs of one decode step (the serial stretches between two layers'
// attentions reach ~80 us on a 2-core Zen 4 VM), not enough to burn a shared core between
// steps. By the clock, not a count of pauses: a pause is 18 ns on the Zen 5 this was
// first tuned on and 32 ns on that Zen 4, where 2048 of them (65 us) let the worker fall
// asleep inside a step and the futex wake-up cost the step 10 - 30% (ref-llama-q8_0 at
// 64K: the step's matvecs 183 -> 123 us with a longer spin).
constexpr auto kWorkerSpinTime = std::chrono::microseconds(250);
constexpr int kPausesPerClockRead = 32;
// Pauses the caller spins for running tasks before it starts yielding its core.
constexpr int kCallerSpin = 1 << 10;

// The pool whose job this thread is running (nested ParallelFor runs inline).
thread_local const ThreadPool* tl_pool = nullptr;

}  // namespace

int AvailableCpus() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

ThreadPool::ThreadPool(int threads) : n_threads_(threads > 0 ? threads : AvailableCpus()) {
  workers_.reserve(static_cast<size_t>(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1);  // wakes spinners too
  }
  wake_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::Work(uint32_t gen, bool count) {
  // Counted once, before the first claim, so a caller that sees every task claimed also
  // sees this thread in flight (all seq_cst); one count per job rather than per task
  // keeps the shared counter out of the per-task path (with short tasks, two cores
  // trading that cache line cost as much as the tasks).
  if (count) in_flight_.fetch_add(1);
  for (;;) {
    uint64_t t = ticket_.load();
    bool claimed = false;
    while ((t >> 32) == gen && static_cast<int64_t>(t & 0xffffffffu) < n_.load()) {
      if (ticket_.compare_exchange_weak(t, t + 1)) {
        claimed = true;
        break;
      }
    }
    if (!claimed) break;
    call_(ctx_, static_cast<int64_t>(t & 0xffffffffu));
  }
  if (count) in_flight_.fetch_sub(1);
}

void ThreadPool::Run(int64_t n, Call call, void* ctx) {
  if (n <= 0) return;
  if (n == 1 || workers_.empty() || tl_pool == this) {
    for (int64_t i = 0; i < n; ++i) call(ctx, i);
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mu_);
  const uint32_t gen = generation_.load() + 1;
  call_ = call;
  ctx_ = ctx;
  n_.store(n);
  ticket_.store(static_cast<uint64_t>(gen) << 32);
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.store(gen);
    wake = sleepers_ > 0;
  }
  if (wake) wake_cv_.notify_all();

  const ThreadPool* saved = tl_pool;
  tl_pool = this;
  Work(gen, /*count=*/false);
  tl_pool = saved;

  // Every task is claimed; wait for those running elsewhere.
  for (int s = 0; in_flight_.load() != 0; ++s) {
    if (s < kCallerSpin) {
      TIERKV_PAUSE();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::WorkerLoop() {
  tl_pool = this;
  uint32_t seen = generation_.load();
  for (;;) {
    uint32_t g = generation_.load();
    if (g == seen) {
      const auto until = std::chrono::steady_clock::now() + kWorkerSpinTime;
      for (int s = 1; g == seen; ++s) {
        TIERKV_PAUSE();
        g = generation_.load();
        if (s % kPausesPerClockRead == 0 && std::chrono::steady_clock::now() >= until) break;
      }
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      ++sleepers_;
      wake_cv_.wait(lock, [&] { return stop_ || generation_.load() != seen; });
      --sleepers_;
      if (stop_) return;
      g = generation_.load();
    }
    if (stop_) return;  // the destructor bumps the generation to end the spin
    seen = g;
    Work(g, /*count=*/true);
  }
}

}  // namespace tierkv::kernels
