// tests/bench/probe_test.cc
//
// `tierkv probe`: a real probe of a temporary directory with small buffers (fast, also
// under ASan), error paths for bad --disk-dir values, the table rows and the JSON keys
// documented in docs/probe.md, and the CLI wiring.
#include "bench/tools/probe.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

namespace tierkv::tools {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  explicit TempDir(const fs::path& base = fs::temp_directory_path()) {
    std::string tmpl = (base / "tierkv-probe-test-XXXXXX").string();
    const char* made = mkdtemp(tmpl.data());
    path_ = made ? made : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

ProbeOptions SmallOptions(const std::string& dir) {
  ProbeOptions o;
  o.disk_dir = dir;
  o.buffer_bytes = 4 << 20;
  o.op_bytes = 256 << 10;
  o.repetitions = 2;
  return o;
}

bool PositiveFinite(const std::optional<Bandwidth>& bw) {
  return bw && std::isfinite(bw->gbps) && bw->gbps > 0 && bw->reps >= 1 && bw->bytes_per_rep > 0;
}

bool HasRow(const std::vector<ProbeRow>& rows, const std::string& tier, const std::string& what) {
  for (const ProbeRow& r : rows) {
    if (r.tier == tier && r.what == what) return true;
  }
  return false;
}

// One real probe shared by the tests below (each probe moves a few tens of MiB).
class ProbeRunTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    ASSERT_FALSE(dir_->path().empty());
    auto r = RunProbe(SmallOptions(dir_->path()));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    report_ = new ProbeReport(std::move(r).value());
  }
  static void TearDownTestSuite() {
    delete report_;
    delete dir_;
    report_ = nullptr;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(report_, nullptr); }

  static TempDir* dir_;
  static ProbeReport* report_;
};
TempDir* ProbeRunTest::dir_ = nullptr;
ProbeReport* ProbeRunTest::report_ = nullptr;

TEST_F(ProbeRunTest, MeasuresPositiveFiniteBandwidths) {
  const ProbeReport& r = *report_;
  EXPECT_EQ(r.buffer_bytes, 4u << 20);
  EXPECT_GT(r.host.total_bytes, 0u);
  EXPECT_GT(r.host.available_bytes, 0u);
  EXPECT_LE(r.host.available_bytes, r.host.total_bytes);
  EXPECT_TRUE(PositiveFinite(r.host.memcpy));

  ASSERT_FALSE(r.disks.empty());
  const DiskReport& d = r.disks.back();  // the --disk-dir candidate comes last
  EXPECT_EQ(d.dir, dir_->path());
  EXPECT_TRUE(d.available) << d.note;
  EXPECT_FALSE(d.fs_type.empty());
  EXPECT_GT(d.free_bytes, 0u);
  EXPECT_TRUE(PositiveFinite(d.buffered_write));
  EXPECT_TRUE(PositiveFinite(d.buffered_read));
  EXPECT_EQ(d.direct_io, d.direct_write.has_value());
  if (d.direct_io) {
    EXPECT_TRUE(PositiveFinite(d.direct_write));
    EXPECT_TRUE(PositiveFinite(d.direct_read));
  }
  for (const DiskReport& other : r.disks) {
    if (other.available) {
      EXPECT_TRUE(PositiveFinite(other.buffered_read)) << other.dir;
    }
  }
  EXPECT_EQ(r.device.present, r.device.why_not.empty());
  if (r.device.present && r.device.note.empty()) {
    EXPECT_TRUE(PositiveFinite(r.device.h2d));
    EXPECT_TRUE(PositiveFinite(r.device.d2h));
  }
  EXPECT_GT(r.seconds, 0);
}

TEST_F(ProbeRunTest, TableHasTheExpectedRows) {
  const std::vector<ProbeRow> rows = ProbeRows(*report_);
  const std::string dir = dir_->path();
  for (const char* what : {"RAM total", "RAM available", "RLIMIT_MEMLOCK", "mlock", "memcpy"}) {
    EXPECT_TRUE(HasRow(rows, "host", what)) << what;
  }
  EXPECT_TRUE(HasRow(rows, "disk", dir));
  EXPECT_TRUE(HasRow(rows, "disk", dir + " write buffered"));
  EXPECT_TRUE(HasRow(rows, "disk", dir + " read buffered"));
  EXPECT_EQ(HasRow(rows, "disk", dir + " read O_DIRECT"), report_->disks.back().direct_io);
  EXPECT_TRUE(HasRow(rows, "device", "cuda"));

  const std::string table = FormatProbeTable(*report_);
  EXPECT_EQ(table.rfind("tierkv probe: 4.00 MiB buffers", 0), 0u) << table;
  EXPECT_NE(table.find("TIER"), std::string::npos);
  EXPECT_NE(table.find(dir + " read buffered"), std::string::npos);
  EXPECT_NE(table.find("GB/s"), std::string::npos);
  EXPECT_NE(table.find("page cache"), std::string::npos) << "buffered rows must say they may hit page cache";
  EXPECT_EQ(table.back(), '\n');
}

TEST_F(ProbeRunTest, JsonHasTheDocumentedKeys) {
  const auto j = nlohmann::json::parse(FormatProbeJson(*report_));
  for (const char* key : {"buffer_bytes", "op_bytes", "repetitions", "seconds", "host", "disks", "device"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["buffer_bytes"].get<uint64_t>(), 4u << 20);
  const auto& host = j["host"];
  for (const char* key : {"total_bytes", "available_bytes", "memlock_limit_bytes", "cap_ipc_lock", "mlock_works",
                          "arena_locked", "mlock_note", "memcpy"}) {
    EXPECT_TRUE(host.contains(key)) << "host." << key;
  }
  EXPECT_GT(host["memcpy"]["gbps"].get<double>(), 0);
  EXPECT_GE(host["memcpy"]["reps"].get<int>(), 1);
  EXPECT_GT(host["memcpy"]["bytes_per_rep"].get<uint64_t>(), 0u);

  ASSERT_TRUE(j["disks"].is_array());
  ASSERT_FALSE(j["disks"].empty());
  const auto& d = j["disks"].back();
  for (const char* key : {"dir", "available", "fs_type", "tmpfs", "free_bytes", "direct_io", "direct_write",
                          "direct_read", "buffered_write", "buffered_read", "note"}) {
    EXPECT_TRUE(d.contains(key)) << "disks[]." << key;
  }
  EXPECT_EQ(d["dir"].get<std::string>(), dir_->path());
  EXPECT_GT(d["buffered_read"]["gbps"].get<double>(), 0);
  EXPECT_EQ(d["direct_read"].is_null(), !d["direct_io"].get<bool>());

  const auto& dev = j["device"];
  for (const char* key : {"present", "name", "why_not", "pinning", "note", "h2d", "d2h"}) {
    EXPECT_TRUE(dev.contains(key)) << "device." << key;
  }
}

TEST(ProbeErrorTest, NonexistentDiskDirNamesThePath) {
  TempDir tmp;
  const std::string missing = tmp.path() + "/no-such-dir";
  auto r = RunProbe(SmallOptions(missing));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().ToString();
  EXPECT_NE(r.status().message().find(missing), std::string::npos) << r.status().message();
}

TEST(ProbeErrorTest, FileAsDiskDirIsRejected) {
  TempDir tmp;
  const std::string file = tmp.path() + "/plain-file";
  std::ofstream(file) << "x";
  auto r = RunProbe(SmallOptions(file));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);  // exit 1, as run's --disk-dir
  EXPECT_NE(r.status().message().find(file), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("not a directory"), std::string::npos) << r.status().message();
}

TEST(ProbeErrorTest, MalformedSizesAreRejected) {
  TempDir tmp;
  ProbeOptions o = SmallOptions(tmp.path());
  o.buffer_bytes = 1000;  // not a multiple of 4 KiB, below the minimum
  EXPECT_EQ(RunProbe(o).status().code(), StatusCode::kInvalidArgument);
  o = SmallOptions(tmp.path());
  o.op_bytes = 1000;
  EXPECT_EQ(RunProbe(o).status().code(), StatusCode::kInvalidArgument);
  o = SmallOptions(tmp.path());
  o.repetitions = 0;
  EXPECT_EQ(RunProbe(o).status().code(), StatusCode::kInvalidArgument);
}

// A slow path gets shortened repetitions (never below 16 MiB or above the buffer), and
// the per-measurement time cap stops repeating after the first timed repetition.
TEST(ProbeRepetitionTest, SlowPathsGetShorterAndFewerRepetitions) {
  TempDir tmp;
  ProbeOptions o = SmallOptions(tmp.path());
  o.probe_shm = false;
  o.buffer_bytes = 32 << 20;
  o.repetitions = 5;
  o.target_rep_seconds = 1e-6;           // "everything is slow"
  o.max_seconds_per_measurement = 1e-9;  // one timed repetition each
  auto r = RunProbe(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->host.memcpy.has_value());
  EXPECT_EQ(r->host.memcpy->bytes_per_rep, 16u << 20);
  EXPECT_EQ(r->host.memcpy->reps, 1);
  ASSERT_EQ(r->disks.size(), 1u);
  ASSERT_TRUE(r->disks[0].buffered_read.has_value());
  EXPECT_EQ(r->disks[0].buffered_read->bytes_per_rep, 16u << 20);
  EXPECT_EQ(r->disks[0].buffered_read->reps, 1);
  EXPECT_NE(FormatProbeTable(*r).find("reps of 16.0 MiB"), std::string::npos);
}

// --disk-dir on /dev/shm's filesystem is one candidate, not two.
TEST(ProbeRunOnShmTest, DiskDirOnShmIsProbedOnce) {
  std::error_code ec;
  if (!fs::is_directory("/dev/shm", ec)) GTEST_SKIP() << "no /dev/shm here";
  TempDir tmp("/dev/shm");
  ASSERT_FALSE(tmp.path().empty());
  auto r = RunProbe(SmallOptions(tmp.path()));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->disks.size(), 1u);
  EXPECT_EQ(r->disks[0].dir, tmp.path());
  if (r->disks[0].fs_type == "tmpfs") {
    EXPECT_TRUE(r->disks[0].tmpfs);
    EXPECT_NE(FormatProbeTable(*r).find("tmpfs: RAM"), std::string::npos);
  }
}

TEST(ProbeFormatTest, RowsOfAHandMadeReport) {
  ProbeReport r;
  r.buffer_bytes = 256ull << 20;
  r.op_bytes = 1 << 20;
  r.repetitions = 3;
  r.host.total_bytes = 8ull << 30;
  r.host.available_bytes = 6ull << 30;
  r.host.memlock_limit_bytes = 8ull << 20;
  r.host.mlock_works = true;
  r.host.memcpy = Bandwidth{12.5, 3, 256ull << 20};
  DiskReport shm;
  shm.dir = "/dev/shm";
  shm.note = "skipped: /dev/shm has 64.0 MiB free";
  DiskReport ssd;
  ssd.dir = "/mnt/nvme";
  ssd.available = true;
  ssd.fs_type = "xfs";
  ssd.free_bytes = 100ull << 30;
  ssd.direct_io = true;
  ssd.direct_write = Bandwidth{1.5, 3, 256ull << 20};
  ssd.direct_read = Bandwidth{0.25, 1, 64ull << 20};  // a shortened, slow repetition
  ssd.buffered_write = Bandwidth{3.0, 3, 256ull << 20};
  ssd.buffered_read = Bandwidth{8.0, 3, 256ull << 20};
  r.disks = {shm, ssd};
  r.device.why_not = "no CUDA device is visible";

  const std::vector<ProbeRow> rows = ProbeRows(r);
  auto find = [&](const std::string& what) -> const ProbeRow* {
    for (const ProbeRow& row : rows) {
      if (row.what == what) return &row;
    }
    return nullptr;
  };
  ASSERT_NE(find("RAM total"), nullptr);
  EXPECT_EQ(find("RAM total")->value, "8.00 GiB");
  EXPECT_EQ(find("RLIMIT_MEMLOCK")->value, "8.00 MiB");
  EXPECT_EQ(find("mlock")->value, "limited");
  EXPECT_EQ(find("memcpy")->value, "12.5 GB/s");
  ASSERT_NE(find("/dev/shm"), nullptr);
  EXPECT_EQ(find("/dev/shm")->value, "skipped");
  EXPECT_EQ(find("/dev/shm write buffered"), nullptr);
  EXPECT_EQ(find("/mnt/nvme")->value, "xfs, 100 GiB free");
  EXPECT_EQ(find("/mnt/nvme write O_DIRECT")->value, "1.50 GB/s");
  EXPECT_EQ(find("/mnt/nvme read O_DIRECT")->value, "0.25 GB/s");
  EXPECT_NE(find("/mnt/nvme read O_DIRECT")->note.find("reps of 64.0 MiB"), std::string::npos);
  EXPECT_NE(find("/mnt/nvme read buffered")->note.find("page cache"), std::string::npos);
  const ProbeRow* dev = find("cuda");
  ASSERT_NE(dev, nullptr);
  EXPECT_EQ(dev->tier, "device");
  EXPECT_EQ(dev->value, "none");
  EXPECT_EQ(dev->note, "no CUDA device is visible");

  r.host.memlock_limit_bytes.reset();
  const auto j = nlohmann::json::parse(FormatProbeJson(r));
  EXPECT_TRUE(j["host"]["memlock_limit_bytes"].is_null());  // null = unlimited
  EXPECT_EQ(j["disks"][0]["available"], false);
  EXPECT_TRUE(j["disks"][0]["buffered_read"].is_null());
  EXPECT_DOUBLE_EQ(j["disks"][1]["direct_read"]["gbps"].get<double>(), 0.25);
  EXPECT_EQ(j["device"]["present"], false);
}

TEST(ProbeParseTest, FilesystemTypeNames) {
  EXPECT_EQ(FilesystemTypeName(0x01021994), "tmpfs");
  EXPECT_EQ(FilesystemTypeName(0xEF53), "ext2/3/4");
  EXPECT_EQ(FilesystemTypeName(0x58465342), "xfs");
  EXPECT_EQ(FilesystemTypeName(0x9123683E), "btrfs");
  EXPECT_EQ(FilesystemTypeName(0x12345678), "0x12345678");
}

// The CLI path: a bad --disk-dir is one error line on stderr and exit code 1; a good
// one prints a JSON object on stdout.
int RunCli(const std::vector<std::string>& args) {
  CLI::App app{"tierkv"};
  int exit_code = -1;
  AddProbeCommand(app, exit_code);
  std::vector<const char*> argv{"tierkv"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), const_cast<char**>(argv.data()));
  return exit_code;
}

TEST(ProbeCliTest, MissingDiskDirIsOneErrorLine) {
  TempDir tmp;
  const std::string missing = tmp.path() + "/nope";
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  const int code = RunCli({"probe", "--disk-dir", missing});
  const std::string out = ::testing::internal::GetCapturedStdout();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, 1);
  EXPECT_TRUE(out.empty()) << out;
  EXPECT_EQ(err.rfind("error: ", 0), 0u) << err;
  EXPECT_NE(err.find(missing), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
}

// A file where a directory belongs is the machine's answer, not a malformed value: exit
// 1 as for a missing directory (and as `run --disk-dir`), not the usage-error 2.
TEST(ProbeCliTest, FileAsDiskDirExitsOne) {
  TempDir tmp;
  const std::string file = tmp.path() + "/plain-file";
  std::ofstream(file) << "x";
  ::testing::internal::CaptureStderr();
  const int code = RunCli({"probe", "--disk-dir", file});
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, 1);
  EXPECT_NE(err.find("not a directory"), std::string::npos) << err;
}

TEST(ProbeCliTest, BadSizeIsAnError) {
  TempDir tmp;
  ::testing::internal::CaptureStderr();
  const int code = RunCli({"probe", "--disk-dir", tmp.path(), "--size", "12 parsecs"});
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, 2) << "a bad flag value is a usage error";
  EXPECT_NE(err.find("--size"), std::string::npos) << err;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunCli({"probe", "--disk-dir", tmp.path(), "--size", "0"}), 2);
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("--size must be at least 64.0 KiB"), std::string::npos);
}

TEST(ProbeCliTest, JsonOnStdout) {
  TempDir tmp;
  // main() logs to stderr; the test binary's default logger writes stdout, so quiet it.
  const auto level = spdlog::get_level();
  spdlog::set_level(spdlog::level::warn);
  ::testing::internal::CaptureStdout();
  const int code = RunCli({"probe", "--disk-dir", tmp.path(), "--size", "1MiB", "--json"});
  const std::string out = ::testing::internal::GetCapturedStdout();
  spdlog::set_level(level);
  ASSERT_EQ(code, 0);
  const auto j = nlohmann::json::parse(out);  // throws (fails the test) unless one JSON object
  EXPECT_EQ(j["buffer_bytes"].get<uint64_t>(), 1u << 20);
  EXPECT_EQ(j["disks"].back()["dir"].get<std::string>(), tmp.path());
}

}  // namespace
}  // namespace tierkv::tools
