// memory/host_backend.cc
//
// Host tier: one anonymous mmap, MADV_HUGEPAGE, optionally mlocked, touched at start-up.
#include <sys/mman.h>
#include <sys/resource.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include <spdlog/spdlog.h>

#include "memory/size.h"
#include "memory/tier_backend.h"

namespace tierkv {

Result<MlockMode> ParseMlockMode(std::string_view text) {
  if (text == "off") return MlockMode::kOff;
  if (text == "try") return MlockMode::kTry;
  if (text == "require") return MlockMode::kRequire;
  return Status::InvalidArgument("--mlock must be off, try or require, not '" + std::string(text) + "'");
}

uint64_t MemlockLimitBytes() {
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return UINT64_MAX;
  return rl.rlim_cur;
}

namespace {

// Writes one byte per OS page so the kernel backs the arena now, not mid-decode.
void TouchPages(std::byte* base, uint64_t bytes) {
  constexpr size_t kStride = 4096;
  for (uint64_t off = 0; off < bytes; off += kStride) base[off] = std::byte{0};
}

class HostBackend final : public TierBackend {
 public:
  HostBackend(std::byte* base, uint64_t bytes, bool locked, bool huge, double warmup_s)
      : base_(base), bytes_(bytes), locked_(locked), huge_(huge), warmup_s_(warmup_s) {}
  ~HostBackend() override {
    if (locked_) munlock(base_, bytes_);
    munmap(base_, bytes_);
  }

  Tier tier() const override { return Tier::kHost; }
  std::string Describe() const override {
    return "host: mmap " + FormatBytes(bytes_) + (locked_ ? ", mlocked" : ", not locked") +
           (huge_ ? ", THP advised" : "");
  }
  uint64_t capacity() const override { return bytes_; }
  std::byte* base() override { return base_; }
  double warmup_seconds() const override { return warmup_s_; }

  // The Host tier is the staging side of every copy; nobody copies "into" it through
  // the seam, but the contract is honoured for completeness (and for tests).
  Status Write(std::span<const CopyOp> ops) override {
    for (const CopyOp& op : ops) {
      if (op.offset > bytes_ || op.bytes > bytes_ - op.offset) return Status::InvalidArgument("host write past the arena end");
      std::memcpy(base_ + op.offset, op.host, op.bytes);
    }
    return Status::Ok();
  }
  Status Read(std::span<const CopyOp> ops) override {
    for (const CopyOp& op : ops) {
      if (op.offset > bytes_ || op.bytes > bytes_ - op.offset) return Status::InvalidArgument("host read past the arena end");
      std::memcpy(op.host, base_ + op.offset, op.bytes);
    }
    return Status::Ok();
  }

 private:
  std::byte* base_;
  uint64_t bytes_;
  bool locked_;
  bool huge_;
  double warmup_s_;
};

}  // namespace

Result<std::unique_ptr<TierBackend>> CreateHostBackend(const HostBackendOptions& options) {
  if (options.bytes == 0) return Status::InvalidArgument("host tier budget is zero");
  const auto t0 = std::chrono::steady_clock::now();
  void* p = mmap(nullptr, options.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return Status::FromErrno(errno, "host tier: cannot reserve " + FormatBytes(options.bytes));
  }
  auto* base = static_cast<std::byte*>(p);
  bool huge = false;
#ifdef MADV_HUGEPAGE
  if (options.huge_pages) huge = madvise(p, options.bytes, MADV_HUGEPAGE) == 0;
#endif
  bool locked = false;
  if (options.mlock != MlockMode::kOff) {
    auto* lock_fn = options.mlock_fn != nullptr ? options.mlock_fn : &::mlock;
    if (lock_fn(p, options.bytes) == 0) {
      locked = true;  // mlock also faults every OS page in
    } else {
      const int err = errno;
      const uint64_t limit = MemlockLimitBytes();
      const std::string limit_text = limit == UINT64_MAX ? "unlimited" : FormatBytes(limit);
      const std::string msg = "host tier: mlock of " + FormatBytes(options.bytes) + " failed: " +
                              std::strerror(err) + " (RLIMIT_MEMLOCK soft limit " + limit_text +
                              "; raise it with `ulimit -l` or run with --mlock off)";
      if (options.mlock == MlockMode::kRequire) {
        munmap(p, options.bytes);
        return Status::PermissionDenied(msg + " [--mlock require]");
      }
      spdlog::warn("{}; continuing unpinned [--mlock try]", msg);
    }
  }
  if (options.warmup && !locked) TouchPages(base, options.bytes);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return std::unique_ptr<TierBackend>(new HostBackend(base, options.bytes, locked, huge, secs));
}

}  // namespace tierkv
