// memory/faulty_backend.h
//
// A TierBackend decorator that injects faults for tests and fault drills: EIO on read,
// EIO on write, ENOSPC, short writes, a batch that fails midway, and delays. Faults are
// armed through a shared FaultInjector so a test can keep control after handing the
// backend to a MemoryManager. A faulted call scribbles on the destinations it was
// given (what a real partial transfer leaves), so a caller that trusted them would be
// caught by the data checks.
//
// Thread-safety: FaultInjector is thread-safe (one mutex); FaultyBackend as TierBackend.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>

#include "memory/tier_backend.h"

namespace tierkv {

enum class Fault {
  kNone,
  kEioOnRead,      // Read fails with EIO; host destinations hold garbage
  kEioOnWrite,     // Write fails with EIO; arena destinations hold garbage
  kNoSpace,        // Write fails with ENOSPC
  kShortWrite,     // Write stores half of the first op, then reports a short write
  kFailMidway,     // Read or Write performs the first half of the ops, then fails
};
const char* FaultName(Fault f);

class FaultInjector {
 public:
  // Fires `fault` on the call that is `skip_calls` matching calls from now (0 = next),
  // then disarms (one-shot) unless `sticky`.
  void Arm(Fault fault, int skip_calls = 0, bool sticky = false);
  void Disarm() { Arm(Fault::kNone); }
  void SetDelay(std::chrono::microseconds delay_per_call);
  int fired() const;

  // Used by FaultyBackend: the fault this call must take (kNone most of the time).
  Fault Take(bool is_write);
  std::chrono::microseconds delay() const;

 private:
  mutable std::mutex mu_;
  Fault fault_ = Fault::kNone;   // GUARDED_BY(mu_)
  int skip_ = 0;                 // GUARDED_BY(mu_)
  bool sticky_ = false;          // GUARDED_BY(mu_)
  int fired_ = 0;                // GUARDED_BY(mu_)
  std::chrono::microseconds delay_{0};  // GUARDED_BY(mu_)
};

class FaultyBackend final : public TierBackend {
 public:
  FaultyBackend(std::unique_ptr<TierBackend> inner, std::shared_ptr<FaultInjector> injector)
      : inner_(std::move(inner)), injector_(std::move(injector)) {}

  Tier tier() const override { return inner_->tier(); }
  std::string Describe() const override { return inner_->Describe() + " [fault injection]"; }
  uint64_t capacity() const override { return inner_->capacity(); }
  std::byte* base() override { return inner_->base(); }
  std::byte* arena_address() override { return inner_->arena_address(); }
  double warmup_seconds() const override { return inner_->warmup_seconds(); }

  Status Write(std::span<const CopyOp> ops) override;
  Status Read(std::span<const CopyOp> ops) override;

 private:
  Status Inject(Fault fault, std::span<const CopyOp> ops, bool is_write);
  std::unique_ptr<TierBackend> inner_;
  std::shared_ptr<FaultInjector> injector_;
};

}  // namespace tierkv
