// memory/sim_device_backend.cc
//
// `--device sim`: host memory standing in for VRAM, behind a copy engine throttled to a
// chosen bandwidth. A batch of B bytes takes max(memcpy time, B / bandwidth): the
// engine copies, then sleeps out the rest, so tests and policy studies see realistic
// copy/compute ratios without a GPU.
#include <sys/mman.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "memory/size.h"
#include "memory/tier_backend.h"

namespace tierkv {
namespace {

class SimDeviceBackend final : public TierBackend {
 public:
  SimDeviceBackend(std::byte* base, uint64_t bytes, double gbps, double warmup_s)
      : base_(base), bytes_(bytes), gbps_(gbps), warmup_s_(warmup_s) {}
  ~SimDeviceBackend() override { munmap(base_, bytes_); }

  Tier tier() const override { return Tier::kDevice; }
  std::string Describe() const override {
    char bw[48];
    std::snprintf(bw, sizeof bw, gbps_ > 0 ? "%.2f GB/s copy engine" : "unthrottled copy engine", gbps_);
    return "device (sim): " + FormatBytes(bytes_) + " host memory, " + bw;
  }
  uint64_t capacity() const override { return bytes_; }
  std::byte* base() override { return base_; }
  double warmup_seconds() const override { return warmup_s_; }

  Status Write(std::span<const CopyOp> ops) override { return Copy(ops, /*to_device=*/true); }
  Status Read(std::span<const CopyOp> ops) override { return Copy(ops, /*to_device=*/false); }

 private:
  Status Copy(std::span<const CopyOp> ops, bool to_device) {
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t total = 0;
    for (const CopyOp& op : ops) {
      if (op.offset > bytes_ || op.bytes > bytes_ - op.offset) return Status::InvalidArgument("sim device copy past the arena end");
      if (to_device) std::memcpy(base_ + op.offset, op.host, op.bytes);
      else std::memcpy(op.host, base_ + op.offset, op.bytes);
      total += op.bytes;
    }
    if (gbps_ > 0) {
      // Sleep for the bulk, spin for the last stretch: a timed sleep overshoots by tens
      // of microseconds (timer slack, VM timers), which would stretch every small batch
      // far past bytes / bandwidth. The spinning thread is the copy engine's own.
      const auto budget = std::chrono::duration<double>(static_cast<double>(total) / (gbps_ * 1e9));
      const auto deadline = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(budget);
      const auto margin = std::chrono::microseconds(100);
      if (deadline - std::chrono::steady_clock::now() > margin) std::this_thread::sleep_until(deadline - margin);
      while (std::chrono::steady_clock::now() < deadline) {
      }
    }
    return Status::Ok();
  }

  std::byte* base_;
  uint64_t bytes_;
  double gbps_;
  double warmup_s_;
};

}  // namespace

Result<std::unique_ptr<TierBackend>> CreateSimDeviceBackend(const SimDeviceOptions& options) {
  if (options.bytes == 0) return Status::InvalidArgument("device tier budget is zero");
  if (options.gbps < 0) return Status::InvalidArgument("sim device bandwidth must not be negative");
  const auto t0 = std::chrono::steady_clock::now();
  void* p = mmap(nullptr, options.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return Status::FromErrno(errno, "sim device: cannot reserve " + FormatBytes(options.bytes));
  auto* base = static_cast<std::byte*>(p);
  if (options.warmup) {
    for (uint64_t off = 0; off < options.bytes; off += 4096) base[off] = std::byte{0};
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return std::unique_ptr<TierBackend>(new SimDeviceBackend(base, options.bytes, options.gbps, secs));
}

}  // namespace tierkv
