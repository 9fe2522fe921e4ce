// tests/kernels/thread_pool_test.cc
//
// ThreadPool (kernels/thread_pool.h): every task runs once at every size, ranges cover
// [0, n) exactly, nested and concurrent calls, and the CPU count a pool of 0 threads takes.
#include "kernels/thread_pool.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#if defined(__linux__)
#include <sched.h>
#endif

namespace tierkv::kernels {
namespace {

TEST(ThreadPoolTest, RunsEveryTaskOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      for (int rep = 0; rep < 50; ++rep) {
        pool.ParallelFor(n, [&](int64_t i) { hits[static_cast<size_t>(i)].fetch_add(1); });
      }
      for (auto& h : hits) EXPECT_EQ(h.load(), 50);
    }
  }
}

TEST(ThreadPoolTest, RangesCoverExactly) {
  ThreadPool pool(3);
  for (int64_t n : {1, 5, 100, 12345}) {
    for (int64_t grain : {1, 16, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.ParallelRanges(n, grain, [&](int64_t b, int64_t e) {
        EXPECT_LT(b, e);
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    }
  }
}

TEST(ThreadPoolTest, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int> total{0};
  pool.ParallelFor(4, [&](int64_t) { pool.ParallelFor(10, [&](int64_t) { total.fetch_add(1); }); });
  EXPECT_EQ(total.load(), 40);
}

// "Concurrent calls are serialised": one caller's job at a time, so tasks of two callers
// never run at once (tasks of one job do). Each running task adds 1 to its caller's
// 16-bit field of `running`; the fetch_add sees every field at once, so an overlap with
// another caller's task is seen by whichever task starts second. Tasks spin a little
// (~2 us) so that overlaps, if the pool allowed them, would be long.
TEST(ThreadPoolTest, ConcurrentCallersAreSerialised) {
  constexpr int kCallers = 3;
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  std::atomic<uint64_t> running{0};  // [kCallers] 16-bit counts of running tasks
  std::atomic<int> overlaps{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      const uint64_t mine = uint64_t{1} << (16 * c), mine_mask = uint64_t{0xffff} << (16 * c);
      for (int rep = 0; rep < 200; ++rep) {
        pool.ParallelFor(17, [&](int64_t i) {
          const uint64_t now = running.fetch_add(mine) + mine;
          if ((now & ~mine_mask) != 0) overlaps.fetch_add(1);
          const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(2);
          while (std::chrono::steady_clock::now() < until) {
          }
          total.fetch_add(i);
          running.fetch_sub(mine);
        });
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), kCallers * 200 * (16 * 17 / 2));
  EXPECT_EQ(overlaps.load(), 0) << "tasks of two callers ran at the same time";
}

// AvailableCpus follows the affinity mask (taskset, container CPU sets), and a pool of 0
// threads takes that many.
TEST(ThreadPoolTest, ZeroThreadsMeansTheAvailableCpus) {
  EXPECT_GE(AvailableCpus(), 1);
  EXPECT_EQ(ThreadPool(0).size(), AvailableCpus());
#if defined(__linux__)
  std::thread([] {  // narrows this thread's mask only
    cpu_set_t all;
    CPU_ZERO(&all);
    ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
    EXPECT_EQ(AvailableCpus(), CPU_COUNT(&all));
    int first = 0;
    while (!CPU_ISSET(first, &all)) ++first;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    EXPECT_EQ(AvailableCpus(), 1);
    EXPECT_EQ(ThreadPool(0).size(), 1);
  }).join();
#endif
}

}  // namespace
}  // namespace tierkv::kernels
