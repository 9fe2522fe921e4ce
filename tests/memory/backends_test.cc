// tests/memory/backends_test.cc
//
// Tier backends (memory/tier_backend.h): Host, Disk (in /tmp and /dev/shm), sim Device,
// the CUDA entry points in CPU builds, and the FaultyBackend decorator
// (memory/faulty_backend.h). Every round trip is checked byte for byte.
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "memory/faulty_backend.h"
#include "memory/tier_backend.h"
#include "memory/types.h"

namespace tierkv {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// 'text', as error messages quote user input. (Built with += rather than "'" + s + "'",
// which trips a GCC 12 -Wrestrict false positive at -O3.)
std::string Quoted(const char* text) {
  std::string q = "'";
  q += text;
  q += '\'';
  return q;
}

constexpr size_t k4K = 4096;

// A 4 KiB-aligned heap buffer (what O_DIRECT needs), zero-filled.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t bytes)
      : bytes_(bytes), p_(static_cast<std::byte*>(std::aligned_alloc(k4K, (bytes + k4K - 1) / k4K * k4K))) {
    std::memset(p_.get(), 0, bytes_);
  }
  std::byte* data() { return p_.get(); }
  std::byte* operator+(size_t off) { return p_.get() + off; }
  size_t size() const { return bytes_; }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  size_t bytes_;
  std::unique_ptr<std::byte, Free> p_;
};

void FillRandom(std::byte* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<std::byte>(rng());
}

bool AllBytesAre(const std::byte* p, size_t n, uint8_t v) {
  for (size_t i = 0; i < n; ++i) if (p[i] != std::byte{v}) return false;
  return true;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

class TempDir {
 public:
  explicit TempDir(const std::string& parent = "/tmp") {
    std::string tmpl = parent + "/tierkv-backends-test-XXXXXX";
    if (mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    if (!path_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(path_, ec);
    }
  }
  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  // Entries other than . and ..
  int Entries() const {
    int n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(path_)) ++n;
    return n;
  }

 private:
  std::string path_;
};

// ---------------------------------------------------------------------------------
// MlockMode

TEST(MlockModeTest, Parse) {
  EXPECT_EQ(ParseMlockMode("off").value(), MlockMode::kOff);
  EXPECT_EQ(ParseMlockMode("try").value(), MlockMode::kTry);
  EXPECT_EQ(ParseMlockMode("require").value(), MlockMode::kRequire);
  for (const char* bad : {"", "on", "yes", "OFF"}) {
    const Result<MlockMode> r = ParseMlockMode(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr(Quoted(bad)));
  }
}

// ---------------------------------------------------------------------------------
// Host

std::unique_ptr<TierBackend> MakeHost(uint64_t bytes, MlockMode mlock = MlockMode::kOff) {
  HostBackendOptions o;
  o.bytes = bytes;
  o.mlock = mlock;
  o.huge_pages = false;
  Result<std::unique_ptr<TierBackend>> r = CreateHostBackend(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

TEST(HostBackendTest, CreateDescribeAndRoundTrip) {
  auto host = MakeHost(1 * kMiB);
  ASSERT_NE(host, nullptr);
  EXPECT_EQ(host->tier(), Tier::kHost);
  EXPECT_EQ(host->capacity(), 1 * kMiB);
  ASSERT_NE(host->base(), nullptr);
  EXPECT_EQ(host->arena_address(), host->base());
  EXPECT_GT(host->warmup_seconds(), 0.0) << "the warm-up touched 1 MiB: it took time";
  EXPECT_EQ(host->Describe(), "host: mmap 1.00 MiB, not locked");
  EXPECT_TRUE(AllBytesAre(host->base(), 1 * kMiB, 0));  // fresh anonymous memory

  std::vector<std::byte> src(3 * k4K), dst(3 * k4K);
  FillRandom(src.data(), src.size(), 1);
  const CopyOp w[] = {{5 * k4K, src.data() + k4K, 2 * k4K}, {0, src.data(), k4K}};
  ASSERT_TRUE(host->Write(w).ok());
  EXPECT_EQ(std::memcmp(host->base(), src.data(), k4K), 0);
  EXPECT_EQ(std::memcmp(host->base() + 5 * k4K, src.data() + k4K, 2 * k4K), 0);
  const CopyOp r[] = {{0, dst.data(), k4K}, {5 * k4K, dst.data() + k4K, 2 * k4K}};
  ASSERT_TRUE(host->Read(r).ok());
  EXPECT_EQ(dst, src);
}

TEST(HostBackendTest, RejectsZeroBytesAndCopiesPastTheEnd) {
  HostBackendOptions o;
  o.bytes = 0;
  o.mlock = MlockMode::kOff;
  const auto zero = CreateHostBackend(o);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);

  auto host = MakeHost(64 * kKiB);
  ASSERT_NE(host, nullptr);
  std::vector<std::byte> buf(2 * k4K);
  const CopyOp past[] = {{64 * kKiB - k4K, buf.data(), 2 * k4K}};
  EXPECT_EQ(host->Write(past).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(host->Read(past).code(), StatusCode::kInvalidArgument);
}

int RefuseMlock(const void*, size_t) {
  errno = EPERM;
  return -1;
}
int AcceptMlock(const void*, size_t) { return 0; }

TEST(HostBackendTest, RefusedMlockFailsUnderRequire) {
  HostBackendOptions o;
  o.bytes = 64 * kKiB;
  o.mlock = MlockMode::kRequire;
  o.mlock_fn = &RefuseMlock;
  const auto r = CreateHostBackend(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(r.status().message(), HasSubstr(std::strerror(EPERM)));
  EXPECT_THAT(r.status().message(), HasSubstr("ulimit -l"));
  EXPECT_THAT(r.status().message(), HasSubstr("[--mlock require]"));
  EXPECT_THAT(r.status().message(), HasSubstr("64.0 KiB"));
}

TEST(HostBackendTest, RefusedMlockContinuesUnpinnedUnderTry) {
  HostBackendOptions o;
  o.bytes = 64 * kKiB;
  o.mlock = MlockMode::kTry;
  o.huge_pages = false;
  o.mlock_fn = &RefuseMlock;
  auto r = CreateHostBackend(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r.value()->Describe(), "host: mmap 64.0 KiB, not locked");
}

TEST(HostBackendTest, GrantedMlockIsReported) {
  HostBackendOptions o;
  o.bytes = 64 * kKiB;
  o.mlock = MlockMode::kRequire;
  o.huge_pages = false;
  o.mlock_fn = &AcceptMlock;
  auto r = CreateHostBackend(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r.value()->Describe(), "host: mmap 64.0 KiB, mlocked");
}

TEST(HostBackendTest, MlockOffNeverCallsMlock) {
  HostBackendOptions o;
  o.bytes = 64 * kKiB;
  o.mlock = MlockMode::kOff;
  o.mlock_fn = &RefuseMlock;  // would fail if it were called
  o.warmup = false;
  auto r = CreateHostBackend(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_THAT(r.value()->Describe(), HasSubstr("not locked"));
}

// ---------------------------------------------------------------------------------
// Disk, in /tmp and (where it exists) /dev/shm, with and without O_DIRECT, with and
// without the mapping of a memory filesystem.

struct DiskCase {
  const char* parent;
  bool direct_io;
  bool map = false;  // DiskBackendOptions::map_memory_fs
};
void PrintTo(const DiskCase& c, std::ostream* os) {
  *os << c.parent << (c.direct_io ? " O_DIRECT" : " buffered") << (c.map ? " map" : "");
}

bool IsMemoryFilesystem(const std::string& dir) {
  struct statfs s {};
  return statfs(dir.c_str(), &s) == 0 && (s.f_type == TMPFS_MAGIC || s.f_type == RAMFS_MAGIC);
}

class DiskBackendTest : public ::testing::TestWithParam<DiskCase> {
 protected:
  void SetUp() override {
    struct stat st {};
    if (stat(GetParam().parent, &st) != 0) GTEST_SKIP() << GetParam().parent << " does not exist";
    dir_ = std::make_unique<TempDir>(GetParam().parent);
    ASSERT_TRUE(dir_->ok()) << "mkdtemp in " << GetParam().parent << ": " << std::strerror(errno);
  }

  std::unique_ptr<TierBackend> Make(uint64_t bytes, bool warmup = true) {
    DiskBackendOptions o;
    o.dir = dir_->path();
    o.bytes = bytes;
    o.direct_io = GetParam().direct_io;
    o.warmup = warmup;
    o.map_memory_fs = GetParam().map;
    Result<std::unique_ptr<TierBackend>> r = CreateDiskBackend(o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }

  std::unique_ptr<TempDir> dir_;
};

TEST_P(DiskBackendTest, CreateDescribeAndUnlinkedFile) {
  auto disk = Make(1 * kMiB);
  ASSERT_NE(disk, nullptr);
  EXPECT_EQ(disk->tier(), Tier::kDisk);
  EXPECT_EQ(disk->capacity(), 1 * kMiB);
  EXPECT_GT(disk->warmup_seconds(), 0.0) << "the warm-up preallocated the file: it took time";
  const std::string d = disk->Describe();
  EXPECT_THAT(d, StartsWith("disk: 1.00 MiB file in " + dir_->path() + ", "));
  // A mapped arena is host-addressable (the CPU reads pages there in place); a file is not.
  const bool mapped = GetParam().map && IsMemoryFilesystem(dir_->path());
  EXPECT_EQ(disk->base() != nullptr, mapped);
  EXPECT_EQ(disk->arena_address(), disk->base());
  if (mapped) {
    EXPECT_EQ(d, "disk: 1.00 MiB file in " + dir_->path() + ", mapped");
  } else if (!GetParam().direct_io) {
    EXPECT_EQ(d, "disk: 1.00 MiB file in " + dir_->path() + ", buffered");
  } else {
    EXPECT_TRUE(d.ends_with(", O_DIRECT") || d.ends_with(", buffered")) << d;
  }
  // The arena file is unlinked at once: nothing is left in the directory.
  EXPECT_EQ(dir_->Entries(), 0);
}

// Without preallocation the file is sparse, and a fault on a hole of a full tmpfs would
// be SIGBUS: such a tier is never mapped.
TEST_P(DiskBackendTest, SparseFileIsNotMapped) {
  auto disk = Make(1 * kMiB, /*warmup=*/false);
  ASSERT_NE(disk, nullptr);
  EXPECT_FALSE(disk->Describe().ends_with(", mapped")) << disk->Describe();
}

TEST_P(DiskBackendTest, UnalignedSizeStaysBuffered) {
  auto disk = Make(10000);
  ASSERT_NE(disk, nullptr);
  const bool mapped = GetParam().map && IsMemoryFilesystem(dir_->path());
  EXPECT_EQ(disk->Describe(), "disk: 9.77 KiB file in " + dir_->path() + (mapped ? ", mapped" : ", buffered"));
}

// Ops given out of order, some file-adjacent (merged into one vectored call), one
// leaving a gap, one at the very end of the arena.
TEST_P(DiskBackendTest, GatheredWriteAndReadRoundTrip) {
  auto disk = Make(1 * kMiB);
  ASSERT_NE(disk, nullptr);
  AlignedBuffer src(16 * k4K);
  FillRandom(src.data(), src.size(), 0xd15c);
  const CopyOp a{16 * k4K, src + 0, k4K};
  const CopyOp b{0, src + 1 * k4K, 2 * k4K};
  const CopyOp c{2 * k4K, src + 3 * k4K, k4K};  // adjacent after b
  const CopyOp d{3 * k4K, src + 4 * k4K, k4K};  // adjacent after c
  const CopyOp e{5 * k4K, src + 5 * k4K, 3 * k4K};  // gap [4K*4, 4K*5) before it
  const CopyOp f{1 * kMiB - k4K, src + 8 * k4K, k4K};  // last 4 KiB of the arena
  const CopyOp writes[] = {d, a, f, b, e, c};
  ASSERT_TRUE(disk->Write(writes).ok());

  // Read back the same ranges into a fresh buffer, in yet another order.
  AlignedBuffer dst(16 * k4K);
  std::memset(dst.data(), 0x5a, dst.size());
  auto into_dst = [&](CopyOp op) {
    op.host = dst.data() + (op.host - src.data());
    return op;
  };
  const CopyOp reads[] = {into_dst(c), into_dst(f), into_dst(e), into_dst(a), into_dst(d), into_dst(b)};
  ASSERT_TRUE(disk->Read(reads).ok());
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 9 * k4K), 0);
  EXPECT_TRUE(AllBytesAre(dst + 9 * k4K, 7 * k4K, 0x5a));  // untouched

  // One op across b, c, d sees them back to back; the gap reads as zeros.
  AlignedBuffer whole(6 * k4K);
  const CopyOp span[] = {{0, whole.data(), 6 * k4K}};
  ASSERT_TRUE(disk->Read(span).ok());
  EXPECT_EQ(std::memcmp(whole.data(), src + 1 * k4K, 4 * k4K), 0);
  EXPECT_TRUE(AllBytesAre(whole + 4 * k4K, k4K, 0));
  EXPECT_EQ(std::memcmp(whole + 5 * k4K, src + 5 * k4K, k4K), 0);
}

// More contiguous ops than IOV_MAX (1024 on Linux): the run is split across calls.
TEST_P(DiskBackendTest, ManyAdjacentOpsBeyondIovMax) {
  constexpr size_t kOps = 1100;
  auto disk = Make(8 * kMiB, /*warmup=*/false);
  ASSERT_NE(disk, nullptr);
  AlignedBuffer src(kOps * k4K);
  FillRandom(src.data(), src.size(), 0x10f);
  // File block i comes from host block (kOps - 1 - i): reversed, then shuffled.
  std::vector<CopyOp> ops;
  for (size_t i = 0; i < kOps; ++i) ops.push_back({k4K + i * k4K, src + (kOps - 1 - i) * k4K, k4K});
  std::mt19937_64 rng(0x5eed10f);
  std::shuffle(ops.begin(), ops.end(), rng);
  ASSERT_TRUE(disk->Write(ops).ok());

  AlignedBuffer back(kOps * k4K);
  const CopyOp one[] = {{k4K, back.data(), kOps * k4K}};
  ASSERT_TRUE(disk->Read(one).ok());
  for (size_t i = 0; i < kOps; ++i) {
    ASSERT_EQ(std::memcmp(back + i * k4K, src + (kOps - 1 - i) * k4K, k4K), 0) << "block " << i;
  }
  // And gathered the same way.
  AlignedBuffer again(kOps * k4K);
  for (CopyOp& op : ops) op.host = again.data() + (op.host - src.data());
  ASSERT_TRUE(disk->Read(ops).ok());
  EXPECT_EQ(std::memcmp(again.data(), src.data(), kOps * k4K), 0);
}

TEST_P(DiskBackendTest, UnalignedOpsWorkWhenBuffered) {
  if (GetParam().direct_io) GTEST_SKIP() << "O_DIRECT needs aligned ops";
  auto disk = Make(64 * kKiB);
  ASSERT_NE(disk, nullptr);
  std::vector<std::byte> src(1000), dst(1000);
  FillRandom(src.data(), src.size(), 7);
  const CopyOp w[] = {{777, src.data() + 333, 667}, {100, src.data(), 333}};
  ASSERT_TRUE(disk->Write(w).ok());
  const CopyOp r[] = {{100, dst.data(), 1000}};  // ops were not adjacent: 433..777 is zero
  ASSERT_TRUE(disk->Read(r).ok());
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 333), 0);
  EXPECT_TRUE(AllBytesAre(dst.data() + 333, 777 - 433, 0));
  EXPECT_EQ(std::memcmp(dst.data() + 677, src.data() + 333, 323), 0);
}

TEST_P(DiskBackendTest, CopyPastTheEndIsRejected) {
  auto disk = Make(64 * kKiB);
  ASSERT_NE(disk, nullptr);
  AlignedBuffer buf(2 * k4K);
  const CopyOp past[] = {{64 * kKiB - k4K, buf.data(), 2 * k4K}};
  EXPECT_EQ(disk->Write(past).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(disk->Read(past).code(), StatusCode::kInvalidArgument);
}

TEST_P(DiskBackendTest, RejectsZeroBytesMissingDirAndFile) {
  DiskBackendOptions o;
  o.dir = dir_->path();
  o.direct_io = GetParam().direct_io;
  o.bytes = 0;
  const auto zero = CreateDiskBackend(o);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);

  o.bytes = 64 * kKiB;
  o.dir = dir_->path() + "/no-such-dir";
  const auto missing = CreateDiskBackend(o);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(o.dir));
  EXPECT_THAT(missing.status().message(), HasSubstr(std::strerror(ENOENT)));

  const std::string file = dir_->path() + "/plain-file";
  const int fd = open(file.c_str(), O_CREAT | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  o.dir = file;
  const auto not_dir = CreateDiskBackend(o);
  ASSERT_FALSE(not_dir.ok());
  EXPECT_EQ(not_dir.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(not_dir.status().message(), HasSubstr(file + " is not a directory"));
}

INSTANTIATE_TEST_SUITE_P(Dirs, DiskBackendTest,
                         ::testing::Values(DiskCase{"/tmp", true}, DiskCase{"/tmp", false},
                                           DiskCase{"/dev/shm", true}, DiskCase{"/dev/shm", false},
                                           DiskCase{"/dev/shm", false, true}, DiskCase{"/tmp", false, true}),
                         [](const ::testing::TestParamInfo<DiskCase>& info) {
                           return std::string(std::string(info.param.parent) == "/tmp" ? "Tmp" : "DevShm") +
                                  (info.param.direct_io ? "Direct" : "Buffered") + (info.param.map ? "Map" : "");
                         });

// ---------------------------------------------------------------------------------
// sim Device

std::unique_ptr<TierBackend> MakeSim(uint64_t bytes, double gbps = 0) {
  SimDeviceOptions o;
  o.bytes = bytes;
  o.gbps = gbps;
  Result<std::unique_ptr<TierBackend>> r = CreateSimDeviceBackend(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

TEST(SimDeviceBackendTest, CreateDescribeAndRoundTrip) {
  auto dev = MakeSim(1 * kMiB);
  ASSERT_NE(dev, nullptr);
  EXPECT_EQ(dev->tier(), Tier::kDevice);
  EXPECT_EQ(dev->capacity(), 1 * kMiB);
  ASSERT_NE(dev->base(), nullptr);
  EXPECT_EQ(dev->arena_address(), dev->base());
  EXPECT_EQ(dev->Describe(), "device (sim): 1.00 MiB host memory, unthrottled copy engine");

  std::vector<std::byte> src(10000), dst(10000);
  FillRandom(src.data(), src.size(), 0x51);
  const CopyOp w[] = {{500000, src.data() + 4000, 6000}, {17, src.data(), 4000}};
  ASSERT_TRUE(dev->Write(w).ok());
  EXPECT_EQ(std::memcmp(dev->base() + 17, src.data(), 4000), 0);
  EXPECT_EQ(std::memcmp(dev->base() + 500000, src.data() + 4000, 6000), 0);
  const CopyOp r[] = {{17, dst.data(), 4000}, {500000, dst.data() + 4000, 6000}};
  ASSERT_TRUE(dev->Read(r).ok());
  EXPECT_EQ(dst, src);
}

TEST(SimDeviceBackendTest, DescribesThrottle) {
  auto dev = MakeSim(1 * kMiB, 2.5);
  ASSERT_NE(dev, nullptr);
  EXPECT_EQ(dev->Describe(), "device (sim): 1.00 MiB host memory, 2.50 GB/s copy engine");
}

TEST(SimDeviceBackendTest, RejectsBadOptionsAndCopiesPastTheEnd) {
  SimDeviceOptions o;
  o.bytes = 0;
  EXPECT_EQ(CreateSimDeviceBackend(o).status().code(), StatusCode::kInvalidArgument);
  o.bytes = 64 * kKiB;
  o.gbps = -1;
  const auto neg = CreateSimDeviceBackend(o);
  ASSERT_FALSE(neg.ok());
  EXPECT_EQ(neg.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(neg.status().message(), HasSubstr("negative"));

  auto dev = MakeSim(64 * kKiB);
  ASSERT_NE(dev, nullptr);
  std::vector<std::byte> buf(100);
  const CopyOp past[] = {{64 * kKiB - 99, buf.data(), 100}};
  EXPECT_EQ(dev->Write(past).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(dev->Read(past).code(), StatusCode::kInvalidArgument);
}

// 64 MiB at 1 GB/s is 67.1 ms; only the lower bound is checked (60 ms).
TEST(SimDeviceBackendTest, ThrottleTakesAtLeastBytesOverBandwidth) {
  constexpr size_t kBytes = 64 * kMiB;
  SimDeviceOptions o;
  o.bytes = kBytes;
  o.gbps = 1.0;
  o.warmup = false;
  auto r = CreateSimDeviceBackend(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto dev = std::move(r).value();
  std::vector<std::byte> src(kBytes, std::byte{0x42});
  const CopyOp op[] = {{0, src.data(), kBytes}};
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(dev->Write(op).ok());
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(ms, 60.0);
  EXPECT_EQ(dev->base()[kBytes - 1], std::byte{0x42});
}

// ---------------------------------------------------------------------------------
// Bounds checks must not wrap around. Run in a child process (a death-test) because the
// unchecked copy touches memory outside the arena: the child exits 0 only when the
// backend answers InvalidArgument; a crash or an Ok both fail the test.

void ReadWithWrappingOffsetAndExit(TierBackend* backend) {
  std::vector<std::byte> buf(k4K);
  // offset + bytes == 2^64 == 0 (mod 2^64): "past the end" unless the check is wrap-safe.
  const CopyOp op[] = {{~uint64_t{0} - k4K + 1, buf.data(), k4K}};
  const Status s = backend->Read(op);
  std::_Exit(s.code() == StatusCode::kInvalidArgument ? 0 : 1);
}

// Regression: the backends once checked `op.offset + op.bytes > bytes_`, which wraps:
// offset 2^64 - 4096 with 4096 bytes sums to 0, passed, and memcpy then read (or wrote)
// the 4 KiB just below the arena (SIGSEGV in this child).
TEST(BackendBoundsDeathTest, HostRejectsAnOffsetThatWrapsAround) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        auto host = MakeHost(64 * kKiB);
        ReadWithWrappingOffsetAndExit(host.get());
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(BackendBoundsDeathTest, SimDeviceRejectsAnOffsetThatWrapsAround) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        auto dev = MakeSim(64 * kKiB);
        ReadWithWrappingOffsetAndExit(dev.get());
      },
      ::testing::ExitedWithCode(0), "");
}

// On Disk a wrapped offset would reach the kernel as a negative file offset; either way
// the answer must be InvalidArgument.
TEST(BackendBoundsTest, DiskRejectsAnOffsetThatWrapsAround) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  DiskBackendOptions o;
  o.dir = dir.path();
  o.bytes = 64 * kKiB;
  auto r = CreateDiskBackend(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  AlignedBuffer buf(k4K);
  const CopyOp op[] = {{~uint64_t{0} - k4K + 1, buf.data(), k4K}};
  EXPECT_EQ(r.value()->Read(op).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.value()->Write(op).code(), StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------
// CUDA entry points

TEST(CudaDeviceBackendTest, UnsupportedWithoutAGpu) {
  std::string why;
  if (CudaDeviceAvailable(&why)) GTEST_SKIP() << "a CUDA device is visible";
  EXPECT_FALSE(why.empty());
  const auto r = CreateCudaDeviceBackend(1 * kMiB, /*warmup=*/false);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  EXPECT_THAT(Lower(r.status().message()), HasSubstr("cuda"));
  std::byte b[16];
  EXPECT_EQ(RegisterHostMemoryForDevice(b, sizeof b).code(), StatusCode::kUnsupported);
}

TEST(CudaDeviceBackendTest, RoundTripWhenAGpuIsVisible) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  auto r = CreateCudaDeviceBackend(1 * kMiB, /*warmup=*/true);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto dev = std::move(r).value();
  EXPECT_EQ(dev->tier(), Tier::kDevice);
  EXPECT_EQ(dev->base(), nullptr);
  EXPECT_NE(dev->arena_address(), nullptr);
  std::vector<std::byte> src(3 * k4K), dst(3 * k4K);
  FillRandom(src.data(), src.size(), 0xc0da);
  // Host- and device-adjacent ops (merged) plus a separate one.
  const CopyOp w[] = {{k4K, src.data() + k4K, k4K}, {0, src.data(), k4K}, {100 * k4K, src.data() + 2 * k4K, k4K}};
  ASSERT_TRUE(dev->Write(w).ok());
  const CopyOp rd[] = {{100 * k4K, dst.data() + 2 * k4K, k4K}, {0, dst.data(), 2 * k4K}};
  ASSERT_TRUE(dev->Read(rd).ok());
  EXPECT_EQ(dst, src);
}

// ---------------------------------------------------------------------------------
// FaultyBackend over a Host backend (its arena is directly visible).

constexpr size_t kOps = 4;

class BackendFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    injector_ = std::make_shared<FaultInjector>();
    auto host = MakeHost(64 * kKiB);
    ASSERT_NE(host, nullptr);
    arena_ = host->base();
    faulty_ = std::make_unique<FaultyBackend>(std::move(host), injector_);
    src_.resize(kOps * k4K);
    dst_.resize(kOps * k4K);
    FillRandom(src_.data(), src_.size(), 0xfa17);
  }
  // Op i: arena block 2i <-> host block i (not adjacent in the arena).
  std::vector<CopyOp> Ops(std::vector<std::byte>& host, size_t n = kOps) {
    std::vector<CopyOp> ops;
    for (size_t i = 0; i < n; ++i) ops.push_back({2 * i * k4K, host.data() + i * k4K, k4K});
    return ops;
  }
  bool ArenaBlockIsSrc(size_t i) { return std::memcmp(arena_ + 2 * i * k4K, src_.data() + i * k4K, k4K) == 0; }
  bool ArenaBlockIsJunk(size_t i) { return AllBytesAre(arena_ + 2 * i * k4K, k4K, 0xEE); }
  bool DstBlockIsSrc(size_t i) { return std::memcmp(dst_.data() + i * k4K, src_.data() + i * k4K, k4K) == 0; }
  bool DstBlockIsJunk(size_t i) { return AllBytesAre(dst_.data() + i * k4K, k4K, 0xEE); }
  Status Write() { return faulty_->Write(Ops(src_)); }
  Status Read() {
    std::fill(dst_.begin(), dst_.end(), std::byte{0});
    return faulty_->Read(Ops(dst_));
  }

  std::shared_ptr<FaultInjector> injector_;
  std::unique_ptr<FaultyBackend> faulty_;
  std::byte* arena_ = nullptr;
  std::vector<std::byte> src_, dst_;
};

TEST_F(BackendFaultTest, ForwardsAccessorsAndPassesThroughWhenDisarmed) {
  EXPECT_EQ(faulty_->tier(), Tier::kHost);
  EXPECT_EQ(faulty_->capacity(), 64 * kKiB);
  EXPECT_EQ(faulty_->base(), arena_);
  EXPECT_EQ(faulty_->arena_address(), arena_);
  EXPECT_EQ(faulty_->Describe(), "host: mmap 64.0 KiB, not locked [fault injection]");
  ASSERT_TRUE(Write().ok());
  ASSERT_TRUE(Read().ok());
  EXPECT_EQ(dst_, src_);
  EXPECT_EQ(injector_->fired(), 0);
}

TEST_F(BackendFaultTest, FaultNames) {
  EXPECT_STREQ(FaultName(Fault::kNone), "none");
  EXPECT_STREQ(FaultName(Fault::kEioOnRead), "EIO on read");
  EXPECT_STREQ(FaultName(Fault::kEioOnWrite), "EIO on write");
  EXPECT_STREQ(FaultName(Fault::kNoSpace), "ENOSPC");
  EXPECT_STREQ(FaultName(Fault::kShortWrite), "short write");
  EXPECT_STREQ(FaultName(Fault::kFailMidway), "copy failed midway");
}

TEST_F(BackendFaultTest, EioOnReadFiresOnceOnReadOnly) {
  injector_->Arm(Fault::kEioOnRead);
  ASSERT_TRUE(Write().ok());  // writes are not affected and do not disarm it
  EXPECT_EQ(injector_->fired(), 0);
  for (size_t i = 0; i < kOps; ++i) EXPECT_TRUE(ArenaBlockIsSrc(i)) << i;
  const Status s = Read();
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_THAT(s.message(), HasSubstr(std::strerror(EIO)));
  EXPECT_THAT(s.message(), HasSubstr("host tier read [injected]"));
  EXPECT_EQ(injector_->fired(), 1);
  for (size_t i = 0; i < kOps; ++i) EXPECT_TRUE(DstBlockIsJunk(i)) << i;  // destinations scribbled
  for (size_t i = 0; i < kOps; ++i) EXPECT_TRUE(ArenaBlockIsSrc(i)) << i;  // source untouched
  ASSERT_TRUE(Read().ok());  // one-shot
  EXPECT_EQ(dst_, src_);
  EXPECT_EQ(injector_->fired(), 1);
}

TEST_F(BackendFaultTest, EioOnWriteFiresOnceOnWriteOnly) {
  ASSERT_TRUE(Write().ok());  // good data in the arena first
  injector_->Arm(Fault::kEioOnWrite);
  ASSERT_TRUE(Read().ok());
  EXPECT_EQ(injector_->fired(), 0);
  const Status s = Write();
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_THAT(s.message(), HasSubstr("host tier write [injected]"));
  EXPECT_EQ(injector_->fired(), 1);
  for (size_t i = 0; i < kOps; ++i) EXPECT_TRUE(ArenaBlockIsJunk(i)) << i;
  ASSERT_TRUE(Write().ok());
  for (size_t i = 0; i < kOps; ++i) EXPECT_TRUE(ArenaBlockIsSrc(i)) << i;
}

TEST_F(BackendFaultTest, NoSpaceIsKNoSpaceOnWriteOnly) {
  injector_->Arm(Fault::kNoSpace);
  ASSERT_TRUE(Read().ok());
  const Status s = Write();
  EXPECT_EQ(s.code(), StatusCode::kNoSpace);
  EXPECT_THAT(s.message(), HasSubstr(std::strerror(ENOSPC)));
  EXPECT_EQ(injector_->fired(), 1);
  EXPECT_TRUE(Write().ok());
  EXPECT_EQ(injector_->fired(), 1);
}

TEST_F(BackendFaultTest, ShortWriteStoresHalfOfTheFirstOp) {
  injector_->Arm(Fault::kShortWrite);
  ASSERT_TRUE(Read().ok());
  const Status s = Write();
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_EQ(s.message(), "short write on host tier write: 2048 of 4096 bytes [injected]");
  EXPECT_EQ(std::memcmp(arena_, src_.data(), k4K / 2), 0);
  EXPECT_TRUE(AllBytesAre(arena_ + k4K / 2, k4K / 2, 0xEE));
  for (size_t i = 1; i < kOps; ++i) EXPECT_TRUE(ArenaBlockIsJunk(i)) << i;
  EXPECT_EQ(injector_->fired(), 1);
}

TEST_F(BackendFaultTest, FailMidwayWriteLandsTheFirstHalf) {
  injector_->Arm(Fault::kFailMidway);
  const Status s = Write();
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_EQ(s.message(), "host tier write failed midway after 2 of 4 copies [injected]");
  EXPECT_TRUE(ArenaBlockIsSrc(0));
  EXPECT_TRUE(ArenaBlockIsSrc(1));
  EXPECT_TRUE(ArenaBlockIsJunk(2));
  EXPECT_TRUE(ArenaBlockIsJunk(3));
  EXPECT_EQ(injector_->fired(), 1);
}

TEST_F(BackendFaultTest, FailMidwayReadLandsTheFirstHalf) {
  ASSERT_TRUE(Write().ok());
  injector_->Arm(Fault::kFailMidway);
  const Status s = Read();
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_EQ(s.message(), "host tier read failed midway after 2 of 4 copies [injected]");
  EXPECT_TRUE(DstBlockIsSrc(0));
  EXPECT_TRUE(DstBlockIsSrc(1));
  EXPECT_TRUE(DstBlockIsJunk(2));
  EXPECT_TRUE(DstBlockIsJunk(3));
}

TEST_F(BackendFaultTest, FailMidwayWithOddCountRoundsDown) {
  injector_->Arm(Fault::kFailMidway);
  std::vector<std::byte> src5(5 * k4K);
  FillRandom(src5.data(), src5.size(), 5);
  const Status s = faulty_->Write(Ops(src5, 5));
  EXPECT_EQ(s.message(), "host tier write failed midway after 2 of 5 copies [injected]");
  EXPECT_EQ(std::memcmp(arena_ + 2 * k4K, src5.data() + k4K, k4K), 0);
  EXPECT_TRUE(AllBytesAre(arena_ + 4 * k4K, k4K, 0xEE));
}

TEST_F(BackendFaultTest, SkipCallsCountsOnlyMatchingCalls) {
  injector_->Arm(Fault::kEioOnWrite, /*skip_calls=*/2);
  EXPECT_TRUE(Write().ok());
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(Read().ok());  // reads do not consume the skip
  EXPECT_TRUE(Write().ok());
  EXPECT_EQ(injector_->fired(), 0);
  EXPECT_EQ(Write().code(), StatusCode::kIoError);  // the third write
  EXPECT_EQ(injector_->fired(), 1);
  EXPECT_TRUE(Write().ok());
}

TEST_F(BackendFaultTest, StickyFiresUntilDisarmed) {
  injector_->Arm(Fault::kEioOnRead, /*skip_calls=*/1, /*sticky=*/true);
  EXPECT_TRUE(Read().ok());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Read().code(), StatusCode::kIoError);
  EXPECT_TRUE(Write().ok());
  EXPECT_EQ(injector_->fired(), 3);
  injector_->Disarm();
  EXPECT_TRUE(Read().ok());
  EXPECT_EQ(injector_->fired(), 3);  // fired() counts over the injector's life
  injector_->Arm(Fault::kNoSpace);
  EXPECT_EQ(Write().code(), StatusCode::kNoSpace);
  EXPECT_EQ(injector_->fired(), 4);
}

TEST_F(BackendFaultTest, FailMidwayAppliesToReadsAndWrites) {
  injector_->Arm(Fault::kFailMidway, 0, /*sticky=*/true);
  EXPECT_EQ(Write().code(), StatusCode::kIoError);
  EXPECT_EQ(Read().code(), StatusCode::kIoError);
  EXPECT_EQ(injector_->fired(), 2);
}

TEST_F(BackendFaultTest, DelaySetting) {
  EXPECT_EQ(injector_->delay().count(), 0);
  injector_->SetDelay(std::chrono::microseconds(250));
  EXPECT_EQ(injector_->delay().count(), 250);
  EXPECT_TRUE(Write().ok());  // a delayed call still succeeds
  injector_->SetDelay(std::chrono::microseconds(0));
}

// Over an O_DIRECT disk the scribble and the partial transfer must still be accepted
// (4 KiB-aligned junk), so the first half lands and the rest reads back as junk.
TEST(BackendFaultDiskTest, FailMidwayOnDiskLandsTheFirstHalf) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  DiskBackendOptions o;
  o.dir = dir.path();
  o.bytes = 64 * kKiB;
  auto r = CreateDiskBackend(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto injector = std::make_shared<FaultInjector>();
  FaultyBackend faulty(std::move(r).value(), injector);
  AlignedBuffer src(4 * k4K), dst(4 * k4K);
  FillRandom(src.data(), src.size(), 0xd1);
  std::vector<CopyOp> ops;
  for (size_t i = 0; i < 4; ++i) ops.push_back({2 * i * k4K, src + i * k4K, k4K});
  injector->Arm(Fault::kFailMidway);
  EXPECT_EQ(faulty.Write(ops).code(), StatusCode::kIoError);
  for (CopyOp& op : ops) op.host = dst.data() + (op.host - src.data());
  ASSERT_TRUE(faulty.Read(ops).ok());
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 2 * k4K), 0);
  EXPECT_TRUE(AllBytesAre(dst + 2 * k4K, 2 * k4K, 0xEE));
}

// kShortWrite promises "half of the first op" lands, also on a disk running with
// O_DIRECT (here 2048 bytes from a 4 KiB-aligned buffer: a whole number of 512-byte
// logical blocks, which O_DIRECT accepts).
TEST(BackendFaultDiskTest, ShortWriteOnDiskStoresHalfOfTheFirstOp) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  DiskBackendOptions o;
  o.dir = dir.path();
  o.bytes = 64 * kKiB;
  auto r = CreateDiskBackend(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::string describe = r.value()->Describe();
  auto injector = std::make_shared<FaultInjector>();
  FaultyBackend faulty(std::move(r).value(), injector);
  AlignedBuffer src(2 * k4K), dst(2 * k4K);
  FillRandom(src.data(), src.size(), 0xd2);
  const CopyOp w[] = {{0, src.data(), k4K}, {2 * k4K, src + k4K, k4K}};
  injector->Arm(Fault::kShortWrite);
  const Status s = faulty.Write(w);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_EQ(s.message(), "short write on disk tier write: 2048 of 4096 bytes [injected]");
  const CopyOp rd[] = {{0, dst.data(), k4K}, {2 * k4K, dst + k4K, k4K}};
  ASSERT_TRUE(faulty.Read(rd).ok());
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), k4K / 2), 0) << describe;
  EXPECT_TRUE(AllBytesAre(dst + k4K / 2, k4K / 2, 0xEE));
  EXPECT_TRUE(AllBytesAre(dst + k4K, k4K, 0xEE));
}

}  // namespace
}  // namespace tierkv
