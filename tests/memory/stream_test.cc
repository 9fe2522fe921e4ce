// tests/memory/stream_test.cc
//
// Stream and Ticket (memory/stream.h): FIFO execution, Record() events, pending and
// failed tickets, WaitOn ordering across threads and streams, draining destructor.
// Order is checked through data, never through timing.
#include "memory/stream.h"

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace tierkv {
namespace {

// A one-shot gate a task can block on until the test opens it.
class Gate {
 public:
  void Open() { promise_.set_value(); }
  void Wait() const { future_.wait(); }

 private:
  std::promise<void> promise_;
  std::shared_future<void> future_ = promise_.get_future().share();
};

TEST(TicketTest, DefaultTicketIsReady) {
  const Ticket t;
  EXPECT_EQ(t.state(), TicketState::kReady);
  EXPECT_TRUE(t.done());
  EXPECT_TRUE(t.Wait().ok());
}

TEST(TicketTest, PendingThenReady) {
  const Ticket t = Ticket::Pending();
  EXPECT_EQ(t.state(), TicketState::kPending);
  EXPECT_FALSE(t.done());
  const Ticket copy = t;  // copies share the state
  t.Complete(Status::Ok());
  EXPECT_EQ(copy.state(), TicketState::kReady);
  EXPECT_TRUE(copy.done());
  EXPECT_TRUE(copy.Wait().ok());
}

TEST(TicketTest, FailureIsReturnedByWaitFromAnotherThread) {
  const Ticket t = Ticket::Pending();
  std::thread producer([t] { t.Complete(Status::IoError("pread disk tier at offset 4096")); });
  const Status s = t.Wait();  // blocks until the producer completes it
  producer.join();
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_EQ(s.message(), "pread disk tier at offset 4096");
  EXPECT_EQ(t.state(), TicketState::kFailed);
  EXPECT_TRUE(t.done());
  // Waiting again returns the same failure.
  EXPECT_EQ(t.Wait().code(), StatusCode::kIoError);
}

TEST(TicketTest, ManyWaitersAllSeeTheResult) {
  const Ticket t = Ticket::Pending();
  std::vector<std::thread> waiters;
  std::atomic<int> saw_no_space{0};
  for (int i = 0; i < 8; ++i) {
    waiters.emplace_back([t, &saw_no_space] {
      if (t.Wait().code() == StatusCode::kNoSpace) ++saw_no_space;
    });
  }
  t.Complete(Status::NoSpace("disk full"));
  for (auto& w : waiters) w.join();
  EXPECT_EQ(saw_no_space.load(), 8);
}

TEST(StreamTest, RunsTasksInFifoOrder) {
  std::vector<int> order;  // touched only by the worker until Synchronize returns
  {
    Stream s("fifo");
    EXPECT_EQ(s.name(), "fifo");
    for (int i = 0; i < 2000; ++i) s.Enqueue([&order, i] { order.push_back(i); });
    s.Synchronize();
    ASSERT_EQ(order.size(), 2000u);
    for (int i = 0; i < 2000; ++i) ASSERT_EQ(order[i], i);
  }
}

// Urgent tasks overtake queued normal ones, FIFO among themselves; a task already
// running is not interrupted.
TEST(StreamTest, UrgentTasksOvertakeQueuedNormalTasks) {
  std::vector<int> order;  // touched only by the worker until Synchronize returns
  Stream s("lanes");
  Ticket started = Ticket::Pending(), gate = Ticket::Pending();
  s.Enqueue([&order, started, gate] {
    started.Complete(Status::Ok());
    (void)gate.Wait();  // holds the worker while the rest is queued
    order.push_back(0);
  });
  ASSERT_TRUE(started.Wait().ok());
  s.Enqueue([&order] { order.push_back(1); });
  s.Enqueue([&order] { order.push_back(2); });
  s.Enqueue([&order] { order.push_back(10); }, /*urgent=*/true);
  s.Enqueue([&order] { order.push_back(11); }, /*urgent=*/true);
  gate.Complete(Status::Ok());
  s.Synchronize();
  EXPECT_EQ(order, (std::vector<int>{0, 10, 11, 1, 2}));
}

TEST(StreamTest, BusySecondsCountTimeInTasks) {
  Stream s("busy");
  const double before = s.busy_seconds();
  s.Enqueue([] { std::this_thread::sleep_for(std::chrono::milliseconds(5)); });
  s.Synchronize();
  EXPECT_GE(s.busy_seconds() - before, 0.004);
}

TEST(StreamTest, KeepsEachProducersOrder) {
  constexpr int kProducers = 4, kPerProducer = 500;
  std::vector<std::pair<int, int>> order;  // (producer, seq); worker only
  Stream s("multi");
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&s, &order, p] {
      for (int i = 0; i < kPerProducer; ++i) s.Enqueue([&order, p, i] { order.emplace_back(p, i); });
    });
  }
  for (auto& t : producers) t.join();
  s.Synchronize();
  ASSERT_EQ(order.size(), static_cast<size_t>(kProducers * kPerProducer));
  std::vector<int> next(kProducers, 0);
  for (auto [p, i] : order) {
    ASSERT_EQ(i, next[p]) << "producer " << p;
    ++next[p];
  }
}

TEST(StreamTest, RecordIsReadyOnlyAfterEarlierTasks) {
  Stream s("record");
  Gate gate;
  std::atomic<int> done{0};
  s.Enqueue([&] { gate.Wait(); ++done; });
  for (int i = 0; i < 99; ++i) s.Enqueue([&] { ++done; });
  const Ticket event = s.Record();
  s.Enqueue([&] { done += 1000; });  // after the event
  // The first task is blocked on the gate, so the event cannot be ready yet.
  EXPECT_EQ(event.state(), TicketState::kPending);
  gate.Open();
  EXPECT_TRUE(event.Wait().ok());
  EXPECT_EQ(event.state(), TicketState::kReady);
  const int at_event = done.load();
  EXPECT_GE(at_event, 100);  // all 100 earlier tasks ran
  s.Synchronize();
  EXPECT_EQ(done.load(), 1100);
}

TEST(StreamTest, OnWorkerIsTrueOnlyInsideTasks) {
  Stream s("worker");
  EXPECT_FALSE(s.OnWorker());
  std::atomic<int> inside{-1};
  s.Enqueue([&] { inside = s.OnWorker() ? 1 : 0; });
  s.Synchronize();
  EXPECT_EQ(inside.load(), 1);
}

TEST(StreamTest, WaitOnHoldsLaterTasksUntilATicketFromAnotherThread) {
  Stream s("waits");
  const Ticket t = Ticket::Pending();
  std::atomic<bool> before{false}, after{false};
  s.Enqueue([&] { before = true; });
  t.WaitOn(s);
  s.Enqueue([&] { after = true; });
  const Ticket event = s.Record();
  // Give the worker a chance to (wrongly) run past the wait; correctness does not
  // depend on this sleep, it only makes a broken WaitOn visible.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(after.load());
  EXPECT_EQ(event.state(), TicketState::kPending);
  std::thread producer([t] { t.Complete(Status::Ok()); });
  EXPECT_TRUE(event.Wait().ok());
  producer.join();
  EXPECT_TRUE(before.load());
  EXPECT_TRUE(after.load());
}

TEST(StreamTest, FailedTicketStillReleasesTheStream) {
  Stream s("fail");
  const Ticket t = Ticket::Pending();
  t.WaitOn(s);
  std::atomic<bool> ran{false};
  s.Enqueue([&] { ran = true; });
  t.Complete(Status::IoError("copy failed"));
  s.Synchronize();
  EXPECT_TRUE(ran.load());
  EXPECT_EQ(t.state(), TicketState::kFailed);
}

TEST(StreamTest, WaitOnOrdersOneStreamAfterAnother) {
  Stream copy("copy"), compute("compute");
  std::mutex mu;
  std::vector<std::string> events;
  auto log = [&](const char* e) {
    std::lock_guard<std::mutex> lock(mu);
    events.emplace_back(e);
  };
  Gate gate;
  copy.Enqueue([&] { gate.Wait(); log("copy"); });
  const Ticket copied = copy.Record();
  copied.WaitOn(compute);
  compute.Enqueue([&] { log("compute"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(10));  // see the note above
  gate.Open();
  compute.Synchronize();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0], "copy");
  EXPECT_EQ(events[1], "compute");
}

TEST(StreamTest, DestructorRunsEverythingQueued) {
  std::atomic<int> ran{0};
  {
    Stream s("drain");
    // The first task holds the worker so the rest are still queued at destruction.
    s.Enqueue([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ++ran;
    });
    for (int i = 0; i < 500; ++i) s.Enqueue([&] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 501);
}

}  // namespace
}  // namespace tierkv
