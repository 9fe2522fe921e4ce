// tests/memory/mm_test_util.h
//
// Helpers for MemoryManager tests: small three-tier managers built from real backends
// (optionally wrapped in FaultyBackend), deterministic page contents, and a temp dir.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "memory/faulty_backend.h"
#include "memory/memory_manager.h"

namespace tierkv::testing {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/tierkv-test-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct SmallTiers {
  uint32_t device_frames = 4;  // 0 = no Device tier
  uint32_t host_frames = 6;
  uint32_t disk_frames = 16;   // 0 = no Disk tier
  uint64_t frame_bytes = 4096;
  PolicyKind policy = PolicyKind::kDecayedLfu;
  bool cuda_device = false;    // the Device tier in VRAM (a CUDA executor's tests), else simulated
};

// Injectors are optional: when given, that tier's backend is wrapped in a FaultyBackend.
inline std::unique_ptr<MemoryManager> MakeManager(const SmallTiers& s, const std::string& disk_dir,
                                                  std::shared_ptr<FaultInjector> device_faults = nullptr,
                                                  std::shared_ptr<FaultInjector> disk_faults = nullptr) {
  MemoryManager::Backends b;
  auto wrap = [](Result<std::unique_ptr<TierBackend>> r, std::shared_ptr<FaultInjector> inj) {
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    std::unique_ptr<TierBackend> be = std::move(r).value();
    if (inj) be = std::make_unique<FaultyBackend>(std::move(be), inj);
    return be;
  };
  HostBackendOptions host;
  host.bytes = s.host_frames * s.frame_bytes;
  host.mlock = MlockMode::kOff;
  b[TierIndex(Tier::kHost)] = wrap(CreateHostBackend(host), nullptr);
  if (s.device_frames) {
    const uint64_t bytes = s.device_frames * s.frame_bytes;
    b[TierIndex(Tier::kDevice)] =
        wrap(s.cuda_device ? CreateCudaDeviceBackend(bytes, true) : CreateSimDeviceBackend({bytes, 0, true}), device_faults);
  }
  if (s.disk_frames) {
    b[TierIndex(Tier::kDisk)] = wrap(CreateDiskBackend({disk_dir, s.disk_frames * s.frame_bytes, true, true}), disk_faults);
  }
  auto mm = MemoryManager::CreateWithBackends(std::move(b), s.frame_bytes, s.policy);
  EXPECT_TRUE(mm.ok()) << mm.status().ToString();
  return std::move(mm).value();
}

// Deterministic contents of (page, version).
inline std::vector<std::byte> Pattern(uint64_t bytes, uint64_t seed) {
  std::vector<std::byte> v(bytes);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : v) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    b = static_cast<std::byte>(x);
  }
  return v;
}

// Writes `data` into the page through a write pin on `tier`.
inline Status WritePage(MemoryManager& mm, PageId p, Tier tier, const std::vector<std::byte>& data) {
  auto pin = mm.Acquire(p, tier, Access::kWrite);
  if (!pin.ok()) return pin.status();
  std::memcpy(pin->data(), data.data(), data.size());
  return Status::Ok();
}

// Every copy of the page holds `expected`.
inline ::testing::AssertionResult AllCopiesEqual(MemoryManager& mm, PageId p, const std::vector<std::byte>& expected) {
  int copies = 0;
  for (int t = 0; t < kNumTiers; ++t) {
    if (!mm.HasCopy(p, TierAt(t))) continue;
    ++copies;
    std::vector<std::byte> got(expected.size());
    Status st = mm.ReadCopy(p, TierAt(t), got);
    if (!st.ok()) return ::testing::AssertionFailure() << "ReadCopy page " << p.value << " on " << TierName(TierAt(t)) << ": " << st.ToString();
    if (got != expected) return ::testing::AssertionFailure() << "page " << p.value << " differs on the " << TierName(TierAt(t)) << " tier";
  }
  if (copies == 0) return ::testing::AssertionFailure() << "page " << p.value << " has no copy";
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult Invariants(const MemoryManager& mm) {
  std::string why;
  if (mm.CheckInvariants(&why)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << why;
}

}  // namespace tierkv::testing
