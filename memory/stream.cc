// memory/stream.cc
#include "memory/stream.h"

#include <cassert>
#include <chrono>

namespace tierkv {

Ticket::Ticket() : s_(std::make_shared<Shared>()) {
  s_->state = TicketState::kReady;
  s_->done.store(true);
}

Ticket Ticket::Pending() { return Ticket(std::make_shared<Shared>()); }

TicketState Ticket::state() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->state;
}

Status Ticket::Wait() const {
  SpinFor([&] { return s_->done.load(std::memory_order_acquire); });
  std::unique_lock<std::mutex> lock(s_->mu);
  s_->cv.wait(lock, [&] { return s_->state != TicketState::kPending; });
  return s_->status;
}

void Ticket::WaitOn(Stream& stream) const {
  Ticket self = *this;
  stream.Enqueue([self] { (void)self.Wait(); });
}

void Ticket::Complete(Status status) const {
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    assert(s_->state == TicketState::kPending && "ticket completed twice");
    s_->state = status.ok() ? TicketState::kReady : TicketState::kFailed;
    s_->status = std::move(status);
    s_->done.store(true, std::memory_order_release);
  }
  s_->cv.notify_all();
}

Stream::Stream(std::string name) : name_(std::move(name)), worker_([this] { Run(); }) {}

Stream::~Stream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void Stream::Enqueue(std::function<void()> task, bool urgent) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    (urgent ? urgent_ : queue_).push_back(std::move(task));
    queued_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_one();
}

Ticket Stream::Record() {
  Ticket t = Ticket::Pending();
  Enqueue([t] { t.Complete(Status::Ok()); });
  return t;
}

void Stream::Run() {
  for (;;) {
    std::function<void()> task;
    SpinFor([&] { return queued_.load(std::memory_order_acquire) > 0; });
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty() || !urgent_.empty(); });
      std::deque<std::function<void()>>& from = urgent_.empty() ? queue_ : urgent_;
      if (from.empty()) return;  // stop_ and drained
      task = std::move(from.front());
      from.pop_front();
      queued_.fetch_sub(1, std::memory_order_relaxed);
    }
    const auto t0 = std::chrono::steady_clock::now();
    task();
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    busy_ns_.fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
  }
}

}  // namespace tierkv
