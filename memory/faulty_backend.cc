// memory/faulty_backend.cc
#include "memory/faulty_backend.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace tierkv {

const char* FaultName(Fault f) {
  switch (f) {
    case Fault::kNone: return "none";
    case Fault::kEioOnRead: return "EIO on read";
    case Fault::kEioOnWrite: return "EIO on write";
    case Fault::kNoSpace: return "ENOSPC";
    case Fault::kShortWrite: return "short write";
    case Fault::kFailMidway: return "copy failed midway";
  }
  return "?";
}

void FaultInjector::Arm(Fault fault, int skip_calls, bool sticky) {
  std::lock_guard<std::mutex> lock(mu_);
  fault_ = fault;
  skip_ = skip_calls;
  sticky_ = sticky;
}

void FaultInjector::SetDelay(std::chrono::microseconds delay_per_call) {
  std::lock_guard<std::mutex> lock(mu_);
  delay_ = delay_per_call;
}

int FaultInjector::fired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fired_;
}

std::chrono::microseconds FaultInjector::delay() const {
  std::lock_guard<std::mutex> lock(mu_);
  return delay_;
}

Fault FaultInjector::Take(bool is_write) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool applies = fault_ == Fault::kFailMidway || (fault_ == Fault::kEioOnRead && !is_write) ||
                       (is_write && (fault_ == Fault::kEioOnWrite || fault_ == Fault::kNoSpace ||
                                     fault_ == Fault::kShortWrite));
  if (!applies) return Fault::kNone;
  if (skip_ > 0) {
    --skip_;
    return Fault::kNone;
  }
  const Fault f = fault_;
  ++fired_;
  if (!sticky_) fault_ = Fault::kNone;
  return f;
}

namespace {

// What a torn transfer leaves behind: a recognisable garbage pattern.
void Scribble(TierBackend& inner, std::span<const CopyOp> ops, bool is_write) {
  for (const CopyOp& op : ops) {
    if (!is_write) {
      std::memset(op.host, 0xEE, op.bytes);
    } else {
      // 4 KiB-aligned so an O_DIRECT disk accepts it.
      const size_t len = (op.bytes + 4095) / 4096 * 4096;
      auto* junk = static_cast<std::byte*>(std::aligned_alloc(4096, len));
      std::memset(junk, 0xEE, len);
      CopyOp j = op;
      j.host = junk;
      (void)inner.Write(std::span<const CopyOp>(&j, 1));
      std::free(junk);
    }
  }
}

}  // namespace

Status FaultyBackend::Inject(Fault fault, std::span<const CopyOp> ops, bool is_write) {
  const std::string where = std::string(TierName(inner_->tier())) + " tier " + (is_write ? "write" : "read");
  switch (fault) {
    case Fault::kEioOnRead:
    case Fault::kEioOnWrite:
      Scribble(*inner_, ops, is_write);
      return Status::FromErrno(EIO, where + " [injected]");
    case Fault::kNoSpace:
      Scribble(*inner_, ops, is_write);
      return Status::FromErrno(ENOSPC, where + " [injected]");
    case Fault::kShortWrite: {
      Scribble(*inner_, ops, is_write);
      if (!ops.empty()) {
        CopyOp half = ops[0];
        half.bytes /= 2;
        (void)inner_->Write(std::span<const CopyOp>(&half, 1));
      }
      return Status::IoError("short write on " + where + ": " + std::to_string(ops.empty() ? 0 : ops[0].bytes / 2) +
                             " of " + std::to_string(ops.empty() ? 0 : ops[0].bytes) + " bytes [injected]");
    }
    case Fault::kFailMidway: {
      Scribble(*inner_, ops, is_write);
      const auto done = ops.subspan(0, ops.size() / 2);
      (void)(is_write ? inner_->Write(done) : inner_->Read(done));
      return Status::IoError(where + " failed midway after " + std::to_string(done.size()) + " of " +
                             std::to_string(ops.size()) + " copies [injected]");
    }
    case Fault::kNone:
      break;
  }
  return Status::Ok();
}

Status FaultyBackend::Write(std::span<const CopyOp> ops) {
  if (auto d = injector_->delay(); d.count() > 0) std::this_thread::sleep_for(d);
  if (Fault f = injector_->Take(/*is_write=*/true); f != Fault::kNone) return Inject(f, ops, true);
  return inner_->Write(ops);
}

Status FaultyBackend::Read(std::span<const CopyOp> ops) {
  if (auto d = injector_->delay(); d.count() > 0) std::this_thread::sleep_for(d);
  if (Fault f = injector_->Take(/*is_write=*/false); f != Fault::kNone) return Inject(f, ops, false);
  return inner_->Read(ops);
}

}  // namespace tierkv
