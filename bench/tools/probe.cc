// bench/tools/probe.cc
//
// `tierkv probe`: every byte is moved through the TierBackend seam (Host, Disk, CUDA
// Device backends), in batches of contiguous page-sized CopyOps, so the bandwidths are
// those of the code paths a decode uses, including their merging of adjacent ops.
#include "bench/tools/probe.h"

#include "runtime/cli/cli_checks.h"

#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "memory/size.h"
#include "memory/tier_backend.h"

namespace tierkv::tools {
namespace {

constexpr uint64_t kDirectAlign = 4096;      // O_DIRECT buffer, offset and length alignment
constexpr uint64_t kMinBufferBytes = 64 * kKiB;
constexpr uint64_t kWarmupBytes = 16 * kMiB;  // also the smallest shortened repetition
constexpr uint64_t kMlockProbeBytes = 64 * kKiB;
constexpr int kCapIpcLockBit = 14;            // linux/capability.h CAP_IPC_LOCK
constexpr const char* kShmDir = "/dev/shm";

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A batch covering host[0, bytes) <-> arena[0, bytes), cut into op_bytes ops, the way
// a gathered batch of pages looks to a backend. REQUIRES: op_bytes > 0.
std::vector<CopyOp> MakeOps(std::byte* host, uint64_t bytes, uint64_t op_bytes) {
  std::vector<CopyOp> ops;
  ops.reserve(static_cast<size_t>((bytes + op_bytes - 1) / op_bytes));
  for (uint64_t off = 0; off < bytes; off += op_bytes) {
    ops.push_back({off, host + off, static_cast<size_t>(std::min(op_bytes, bytes - off))});
  }
  return ops;
}

// Incompressible, non-zero content: a filesystem that compresses or dedups (zfs,
// btrfs) cannot shortcut the writes.
void FillPattern(std::byte* p, uint64_t bytes) {
  uint64_t x = 0x9e3779b97f4a7c15ull;
  const uint64_t words = bytes / sizeof(uint64_t);
  auto* w = reinterpret_cast<uint64_t*>(p);
  for (uint64_t i = 0; i < words; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    w[i] = x;
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// transfer(bytes) moves the first `bytes` of the buffer once. An untimed warm-up of at
// most kWarmupBytes comes first (first-touch costs, cache and extent state); it also
// estimates the rate, so a slow disk gets repetitions that fit target_rep_seconds.
Result<Bandwidth> Measure(const ProbeOptions& options, const std::function<Status(uint64_t)>& transfer) {
  const uint64_t buffer = options.buffer_bytes;
  const uint64_t warm = std::min(buffer, kWarmupBytes);
  auto t0 = Clock::now();
  TIERKV_RETURN_IF_ERROR(transfer(warm));
  const double warm_s = std::max(SecondsSince(t0), 1e-9);
  uint64_t rep_bytes = buffer;
  const double rate = static_cast<double>(warm) / warm_s;  // bytes per second
  if (static_cast<double>(buffer) / rate > options.target_rep_seconds) {
    const auto fit = static_cast<uint64_t>(rate * options.target_rep_seconds);
    rep_bytes = std::clamp(fit / kDirectAlign * kDirectAlign, warm, buffer);
  }

  std::vector<double> gbps;
  const auto start = Clock::now();
  while (static_cast<int>(gbps.size()) < options.repetitions) {
    t0 = Clock::now();
    TIERKV_RETURN_IF_ERROR(transfer(rep_bytes));
    const double secs = std::max(SecondsSince(t0), 1e-9);
    gbps.push_back(static_cast<double>(rep_bytes) / secs / 1e9);
    if (SecondsSince(start) > options.max_seconds_per_measurement) break;
  }
  return Bandwidth{Median(gbps), static_cast<int>(gbps.size()), rep_bytes};
}

// The read measurement read back what the write measurement wrote: check the prefix
// both covered, so a broken path cannot report a fine bandwidth.
Status VerifyReadBack(const std::byte* written, const std::byte* read, uint64_t bytes, const std::string& what) {
  if (std::memcmp(written, read, bytes) != 0) {
    return Status::Corruption(what + ": data read back differs from the data written (first " +
                              FormatBytes(bytes) + ")");
  }
  return Status::Ok();
}

// ---- host ------------------------------------------------------------------------

bool HasCapIpcLock() {
  std::istringstream in(ReadSmallFile("/proc/self/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      const uint64_t caps = std::strtoull(line.c_str() + 7, nullptr, 16);
      return (caps >> kCapIpcLockBit) & 1;
    }
  }
  return false;
}

// A Host backend arena of `bytes`, mlocked when the OS allows (quietly unlocked
// otherwise: the probe reports pinning in its own row instead of warning).
Result<std::unique_ptr<TierBackend>> CreateProbeArena(uint64_t bytes, bool* locked, Status* lock_error) {
  HostBackendOptions o;
  o.bytes = bytes;
  o.mlock = MlockMode::kRequire;
  auto locked_arena = CreateHostBackend(o);
  if (locked_arena.ok()) {
    *locked = true;
    return std::move(locked_arena).value();
  }
  *locked = false;
  if (lock_error) *lock_error = locked_arena.status();
  o.mlock = MlockMode::kOff;
  return CreateHostBackend(o);
}

// ---- disk ------------------------------------------------------------------------

struct DirInfo {
  std::string fs_type;
  bool tmpfs = false;
  uint64_t free_bytes = 0;
};

// ext2, ext3 and ext4 share one magic number; /proc/self/mounts tells them apart.
std::string MountFsType(const std::string& dir) {
  std::error_code ec;
  const std::string real = std::filesystem::canonical(dir, ec).string();
  if (ec) return {};
  std::istringstream in(ReadSmallFile("/proc/self/mounts"));
  std::string line, best_fs;
  size_t best_len = 0;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string device, mount_point, fs;
    if (!(fields >> device >> mount_point >> fs)) continue;
    const bool covers = mount_point == "/" || real == mount_point ||
                        real.rfind(mount_point + "/", 0) == 0;
    if (covers && mount_point.size() >= best_len) {
      best_len = mount_point.size();
      best_fs = fs;
    }
  }
  return best_fs;
}

// label names the directory in messages ("--disk-dir /x" or "/dev/shm").
Result<DirInfo> InspectDir(const std::string& dir, const std::string& label, uint64_t need_bytes) {
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) return Status::FromErrno(errno, label);
  // FailedPrecondition, not InvalidArgument: the value is well formed and the machine
  // says no, exit 1 as for a missing directory and as `run --disk-dir` (docs/cli.md).
  if (!S_ISDIR(st.st_mode)) return Status::FailedPrecondition(label + " is not a directory");
  if (access(dir.c_str(), W_OK | X_OK) != 0) return Status::FromErrno(errno, label + " is not writable");
  struct statfs fs {};
  if (statfs(dir.c_str(), &fs) != 0) return Status::FromErrno(errno, "statfs " + label);
  DirInfo info;
  const auto magic = static_cast<int64_t>(static_cast<uint32_t>(fs.f_type));
  info.fs_type = FilesystemTypeName(magic);
  info.tmpfs = info.fs_type == "tmpfs" || info.fs_type == "ramfs";
  if (info.fs_type == "ext2/3/4") {
    const std::string mounted = MountFsType(dir);
    if (mounted.rfind("ext", 0) == 0) info.fs_type = mounted;
  }
  info.free_bytes = static_cast<uint64_t>(fs.f_bavail) * static_cast<uint64_t>(fs.f_bsize);
  if (info.free_bytes < need_bytes) {
    return Status::NoSpace(label + " has " + FormatBytes(info.free_bytes) + " free; the probe needs " +
                           FormatBytes(need_bytes) + " (use a smaller --size)");
  }
  return info;
}

// Write then read the disk backend's arena; fills write / read and checks the data.
Status MeasureDiskPair(const ProbeOptions& options, TierBackend& disk, TierBackend& src, TierBackend& dst,
                       std::optional<Bandwidth>* write, std::optional<Bandwidth>* read, const std::string& what) {
  TIERKV_ASSIGN_OR_RETURN(Bandwidth w, Measure(options, [&](uint64_t bytes) {
                            const auto ops = MakeOps(src.base(), bytes, options.op_bytes);
                            return disk.Write(ops);
                          }));
  std::memset(dst.base(), 0, options.buffer_bytes);
  TIERKV_ASSIGN_OR_RETURN(Bandwidth r, Measure(options, [&](uint64_t bytes) {
                            const auto ops = MakeOps(dst.base(), bytes, options.op_bytes);
                            return disk.Read(ops);
                          }));
  TIERKV_RETURN_IF_ERROR(VerifyReadBack(src.base(), dst.base(), std::min(w.bytes_per_rep, r.bytes_per_rep), what));
  *write = w;
  *read = r;
  return Status::Ok();
}

Result<DiskReport> ProbeDisk(const ProbeOptions& options, const std::string& dir, const std::string& label,
                             TierBackend& src, TierBackend& dst) {
  DiskReport report;
  report.dir = dir;
  TIERKV_ASSIGN_OR_RETURN(DirInfo info, InspectDir(dir, label, options.buffer_bytes));
  report.fs_type = info.fs_type;
  report.tmpfs = info.tmpfs;
  report.free_bytes = info.free_bytes;

  // O_DIRECT first, so the buffered run's dirty page cache cannot slow it down.
  DiskBackendOptions o;
  o.dir = dir;
  o.bytes = options.buffer_bytes;
  o.direct_io = true;
  auto first = CreateDiskBackend(o);
  if (!first.ok()) return first.status().Annotate(label);
  std::unique_ptr<TierBackend> disk = std::move(first).value();
  report.direct_io = disk->Describe().find("O_DIRECT") != std::string::npos;
  spdlog::debug("probe: {}", disk->Describe());
  if (report.direct_io) {
    TIERKV_RETURN_IF_ERROR(MeasureDiskPair(options, *disk, src, dst, &report.direct_write, &report.direct_read,
                                           label + " O_DIRECT"));
    disk.reset();  // free its space before the buffered file takes the same again
    o.direct_io = false;
    auto buffered = CreateDiskBackend(o);
    if (!buffered.ok()) return buffered.status().Annotate(label);
    disk = std::move(buffered).value();
  }
  TIERKV_RETURN_IF_ERROR(MeasureDiskPair(options, *disk, src, dst, &report.buffered_write, &report.buffered_read,
                                         label + " buffered"));
  report.available = true;
  return report;
}

// ---- device ----------------------------------------------------------------------

// The NVIDIA driver's /proc entry names the GPU without needing CUDA headers here.
std::string NvidiaGpuModel() {
  std::error_code ec;
  std::filesystem::directory_iterator it("/proc/driver/nvidia/gpus", ec);
  if (ec) return {};
  for (const auto& entry : it) {
    std::istringstream in(ReadSmallFile((entry.path() / "information").string()));
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("Model:", 0) == 0) {
        const size_t start = line.find_first_not_of(" \t", 6);
        return start == std::string::npos ? std::string() : line.substr(start);
      }
    }
  }
  return {};
}

DeviceReport ProbeDevice(const ProbeOptions& options, TierBackend& src, TierBackend& dst) {
  DeviceReport report;
  std::string why;
  if (!CudaDeviceAvailable(&why)) {
    report.why_not = why;
    return report;
  }
  report.present = true;
  const std::string model = NvidiaGpuModel();
  report.name = model.empty() ? "CUDA device 0" : model;
  if (!options.probe_device) {
    report.note = "not measured (disabled)";
    return report;
  }
  auto created = CreateCudaDeviceBackend(options.buffer_bytes, /*warmup=*/true);
  if (!created.ok()) {
    report.note = "not measured: " + created.status().message();
    return report;
  }
  std::unique_ptr<TierBackend> device = std::move(created).value();
  const Status reg_src = RegisterHostMemoryForDevice(src.base(), options.buffer_bytes);
  const Status reg_dst = RegisterHostMemoryForDevice(dst.base(), options.buffer_bytes);
  report.pinning = reg_src.ok() && reg_dst.ok()
                       ? "host arenas pinned with cudaHostRegister"
                       : "host arenas not registered (" + (reg_src.ok() ? reg_dst : reg_src).message() +
                             "): copies may be staged";
  auto h2d = Measure(options, [&](uint64_t bytes) {
    return device->Write(MakeOps(src.base(), bytes, options.op_bytes));
  });
  std::memset(dst.base(), 0, options.buffer_bytes);
  auto d2h = Measure(options, [&](uint64_t bytes) {
    return device->Read(MakeOps(dst.base(), bytes, options.op_bytes));
  });
  if (h2d.ok() && d2h.ok()) {
    const uint64_t both = std::min(h2d->bytes_per_rep, d2h->bytes_per_rep);
    const Status check = VerifyReadBack(src.base(), dst.base(), both, "device");
    if (check.ok()) {
      report.h2d = h2d.value();
      report.d2h = d2h.value();
    } else {
      report.note = check.message();
    }
  } else {
    report.note = "copy failed: " + (h2d.ok() ? d2h.status() : h2d.status()).message();
  }
  if (reg_src.ok()) UnregisterHostMemoryForDevice(src.base());
  if (reg_dst.ok()) UnregisterHostMemoryForDevice(dst.base());
  // At most 256 MiB, whole MiB: enough for the rates, little VRAM.
  const uint64_t copy_bytes = std::clamp<uint64_t>(options.buffer_bytes / kMiB * kMiB, kMiB, 256 * kMiB);
  auto copies = MeasureCudaCopies(copy_bytes, options.repetitions);
  if (copies.ok()) {
    report.copies = copies.value();
  } else {
    report.copies_note = copies.status().message();
  }
  return report;
}

Status ValidateOptions(const ProbeOptions& o) {
  if (o.buffer_bytes < kMinBufferBytes || o.buffer_bytes % kDirectAlign != 0) {
    return Status::InvalidArgument("--size must be at least " + FormatBytes(kMinBufferBytes) +
                                   " and a multiple of 4 KiB, not " + std::to_string(o.buffer_bytes) + " bytes");
  }
  if (o.op_bytes == 0 || o.op_bytes % kDirectAlign != 0) {
    return Status::InvalidArgument("probe op size must be a positive multiple of 4 KiB");
  }
  if (o.repetitions < 1) return Status::InvalidArgument("probe repetitions must be at least 1");
  if (!(o.max_seconds_per_measurement > 0) || !(o.target_rep_seconds > 0)) {
    return Status::InvalidArgument("probe time limits must be positive");
  }
  return Status::Ok();
}

// ---- formatting --------------------------------------------------------------------

std::string FormatGbps(double gbps) {
  char buf[32];
  std::snprintf(buf, sizeof buf, gbps >= 100 ? "%.0f GB/s" : (gbps >= 10 ? "%.1f GB/s" : "%.2f GB/s"), gbps);
  return buf;
}

std::string BandwidthValue(const std::optional<Bandwidth>& bw) { return bw ? FormatGbps(bw->gbps) : "-"; }

// Appends "; reps of 64 MiB" when a slow path was measured on less than the buffer.
std::string WithRepNote(std::string note, const std::optional<Bandwidth>& bw, uint64_t buffer_bytes) {
  if (bw && bw->bytes_per_rep != buffer_bytes) {
    note += (note.empty() ? "" : "; ") + std::string("reps of ") + FormatBytes(bw->bytes_per_rep) + " (slow)";
  }
  return note;
}

nlohmann::ordered_json BandwidthJson(const std::optional<Bandwidth>& bw) {
  if (!bw) return nullptr;
  return {{"gbps", bw->gbps}, {"reps", bw->reps}, {"bytes_per_rep", bw->bytes_per_rep}};
}

}  // namespace

// ---- public ------------------------------------------------------------------------

std::string FilesystemTypeName(int64_t magic) {
  // statfs(2) f_type values (linux/magic.h and the filesystems' own headers).
  struct Entry {
    uint32_t magic;
    const char* name;
  };
  static constexpr Entry kTable[] = {
      {0xEF53, "ext2/3/4"},      {0x01021994, "tmpfs"},   {0x858458F6, "ramfs"},
      {0x58465342, "xfs"},       {0x9123683E, "btrfs"},   {0x794C7630, "overlay"},
      {0x6969, "nfs"},           {0xFF534D42, "cifs"},    {0xFE534D42, "smb2"},
      {0x2FC12FC1, "zfs"},       {0xF2F52010, "f2fs"},    {0x65735546, "fuse"},
      {0x01021997, "9p"},        {0x73717368, "squashfs"}, {0x4D44, "vfat"},
      {0x5346544E, "ntfs"},      {0x2011BAB0, "exfat"},   {0xCA451A4E, "bcachefs"},
      {0x3153464A, "jfs"},       {0x52654973, "reiserfs"}, {0x62656572, "sysfs"},
  };
  const auto m = static_cast<uint32_t>(magic);
  for (const Entry& e : kTable) {
    if (e.magic == m) return e.name;
  }
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%08x", m);
  return buf;
}

Result<ProbeReport> RunProbe(const ProbeOptions& options) {
  TIERKV_RETURN_IF_ERROR(ValidateOptions(options));
  const auto t0 = Clock::now();
  ProbeReport report;
  report.buffer_bytes = options.buffer_bytes;
  report.op_bytes = options.op_bytes;
  report.repetitions = options.repetitions;

  // The user's directory is checked before anything slow happens.
  const std::string disk_label = "--disk-dir " + options.disk_dir;
  TIERKV_RETURN_IF_ERROR(InspectDir(options.disk_dir, disk_label, options.buffer_bytes).status());

  // Host RAM. Two host arenas plus a tmpfs file of the buffer size are alive at once.
  HostReport& host = report.host;
  auto meminfo = ReadMeminfo();
  if (meminfo.ok()) {
    host.total_bytes = meminfo->total_bytes;
    host.available_bytes = meminfo->available_bytes;
    const uint64_t need = 3 * options.buffer_bytes;
    if (host.available_bytes < need) {
      return Status::Exhausted("the probe needs about " + FormatBytes(need) + " of RAM but only " +
                               FormatBytes(host.available_bytes) + " is available (use a smaller --size)");
    }
  } else {
    spdlog::warn("probe: {}", meminfo.status().message());
  }
  const uint64_t limit = MemlockLimitBytes();
  if (limit != UINT64_MAX) host.memlock_limit_bytes = limit;
  host.cap_ipc_lock = HasCapIpcLock();

  spdlog::info("probe: host memory ({} buffers)", FormatBytes(options.buffer_bytes));
  {
    HostBackendOptions small;
    small.bytes = kMlockProbeBytes;
    small.mlock = MlockMode::kRequire;
    small.huge_pages = false;
    host.mlock_works = CreateHostBackend(small).ok();
  }
  Status lock_error;
  bool src_locked = false, dst_locked = false;
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<TierBackend> src,
                          CreateProbeArena(options.buffer_bytes, &src_locked, &lock_error));
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<TierBackend> dst,
                          CreateProbeArena(options.buffer_bytes, &dst_locked, nullptr));
  host.arena_locked = src_locked && dst_locked;
  const std::string arena = FormatBytes(options.buffer_bytes) + " probe arena";
  if (!host.mlock_works) {
    host.mlock_note = "even 64 KiB: raise `ulimit -l`; until then --mlock try runs unpinned, --mlock require fails";
  } else if (!host.arena_locked) {
    host.mlock_note = "works up to RLIMIT_MEMLOCK; the " + arena + " was refused (raise `ulimit -l`)";
  } else if (host.memlock_limit_bytes && *host.memlock_limit_bytes < options.buffer_bytes) {
    host.mlock_note = "the " + arena + " was locked past RLIMIT_MEMLOCK (CAP_IPC_LOCK)";
  } else {
    host.mlock_note = "the " + arena + " was locked";
  }
  if (!lock_error.ok()) spdlog::debug("probe: {}", lock_error.message());
  FillPattern(src->base(), options.buffer_bytes);
  TIERKV_ASSIGN_OR_RETURN(host.memcpy, Measure(options, [&](uint64_t bytes) {
                            return dst->Write(MakeOps(src->base(), bytes, options.op_bytes));
                          }));

  // Disk tier candidates: /dev/shm (optional) then the user's directory.
  // Skipped when --disk-dir is on the same filesystem (it is /dev/shm or below it).
  struct stat user_st {}, shm_st {};
  const bool shm_exists = stat(kShmDir, &shm_st) == 0 && S_ISDIR(shm_st.st_mode);
  const bool same_fs = stat(options.disk_dir.c_str(), &user_st) == 0 && shm_exists && user_st.st_dev == shm_st.st_dev;
  if (options.probe_shm && shm_exists && !same_fs) {
    spdlog::info("probe: disk tier candidate {}", kShmDir);
    auto shm = ProbeDisk(options, kShmDir, kShmDir, *src, *dst);
    if (shm.ok()) {
      report.disks.push_back(std::move(shm).value());
    } else {
      DiskReport skipped;
      skipped.dir = kShmDir;
      skipped.note = "skipped: " + shm.status().message();
      report.disks.push_back(std::move(skipped));
    }
  }
  spdlog::info("probe: disk tier candidate {}", options.disk_dir);
  TIERKV_ASSIGN_OR_RETURN(DiskReport user_disk, ProbeDisk(options, options.disk_dir, disk_label, *src, *dst));
  report.disks.push_back(std::move(user_disk));

  spdlog::info("probe: device");
  report.device = ProbeDevice(options, *src, *dst);
  report.seconds = SecondsSince(t0);
  return report;
}

std::vector<ProbeRow> ProbeRows(const ProbeReport& r) {
  std::vector<ProbeRow> rows;
  const HostReport& h = r.host;
  const bool have_meminfo = h.total_bytes > 0;
  rows.push_back({"host", "RAM total", have_meminfo ? FormatBytes(h.total_bytes) : "unknown",
                  "/proc/meminfo MemTotal"});
  rows.push_back({"host", "RAM available", have_meminfo ? FormatBytes(h.available_bytes) : "unknown",
                  "/proc/meminfo MemAvailable"});
  rows.push_back({"host", "RLIMIT_MEMLOCK", h.memlock_limit_bytes ? FormatBytes(*h.memlock_limit_bytes) : "unlimited",
                  std::string("soft limit (ulimit -l)") + (h.cap_ipc_lock ? "; CAP_IPC_LOCK: may exceed it" : "")});
  rows.push_back({"host", "mlock", h.mlock_works ? (h.arena_locked ? "works" : "limited") : "refused", h.mlock_note});
  const std::string memcpy_note =
      std::string("host arena -> host arena (") + (h.arena_locked ? "mlocked" : "not locked") + ")";
  rows.push_back({"host", "memcpy", BandwidthValue(h.memcpy), WithRepNote(memcpy_note, h.memcpy, r.buffer_bytes)});

  for (const DiskReport& d : r.disks) {
    if (!d.available) {
      rows.push_back({"disk", d.dir, "skipped", d.note});
      continue;
    }
    rows.push_back({"disk", d.dir, d.fs_type + ", " + FormatBytes(d.free_bytes) + " free",
                    d.direct_io ? "O_DIRECT accepted" : "O_DIRECT refused: buffered only"});
    const std::string ram = "tmpfs: RAM, no device behind it";
    if (d.direct_io) {
      rows.push_back({"disk", d.dir + " write O_DIRECT", BandwidthValue(d.direct_write),
                      WithRepNote(d.tmpfs ? ram : "to the device", d.direct_write, r.buffer_bytes)});
      rows.push_back({"disk", d.dir + " read O_DIRECT", BandwidthValue(d.direct_read),
                      WithRepNote(d.tmpfs ? ram : "from the device", d.direct_read, r.buffer_bytes)});
    }
    rows.push_back({"disk", d.dir + " write buffered", BandwidthValue(d.buffered_write),
                    WithRepNote(d.tmpfs ? ram : "into the page cache (not yet on the device)", d.buffered_write,
                                r.buffer_bytes)});
    rows.push_back({"disk", d.dir + " read buffered", BandwidthValue(d.buffered_read),
                    WithRepNote(d.tmpfs ? ram : "page cache hit (just written), not the device", d.buffered_read,
                                r.buffer_bytes)});
  }

  const DeviceReport& dev = r.device;
  if (!dev.present) {
    rows.push_back({"device", "cuda", "none", dev.why_not});
  } else {
    rows.push_back({"device", "cuda", dev.name, dev.note.empty() ? dev.pinning : dev.note});
    if (dev.h2d || dev.d2h) {
      rows.push_back({"device", "H2D", BandwidthValue(dev.h2d),
                      WithRepNote("host arena -> cudaMalloc arena", dev.h2d, r.buffer_bytes)});
      rows.push_back({"device", "D2H", BandwidthValue(dev.d2h),
                      WithRepNote("cudaMalloc arena -> host arena", dev.d2h, r.buffer_bytes)});
    }
    if (const auto& c = dev.copies) {
      const auto of_one = [&](double gbps) {
        char buf[64];
        std::snprintf(buf, sizeof(buf), "%.2f of one pinned copy", c->h2d_pinned > 0 ? gbps / c->h2d_pinned : 0.0);
        return std::string(buf);
      };
      rows.push_back({"device", "VRAM", FormatBytes(c->vram_total_bytes), FormatBytes(c->vram_free_bytes) + " free"});
      rows.push_back({"device", "H2D pageable, one copy", FormatGbps(c->h2d_pageable), of_one(c->h2d_pageable)});
      rows.push_back({"device", "H2D pinned, one copy", FormatGbps(c->h2d_pinned), "cudaMallocHost -> cudaMalloc"});
      rows.push_back({"device", "D2H pinned, one copy", FormatGbps(c->d2h_pinned), "cudaMalloc -> cudaMallocHost"});
      rows.push_back({"device", "H2D pinned, 64 KiB pages", FormatGbps(c->h2d_pages_64k), of_one(c->h2d_pages_64k)});
      rows.push_back({"device", "H2D pinned, 1 MiB pages", FormatGbps(c->h2d_pages_1m), of_one(c->h2d_pages_1m)});
    } else if (!dev.copies_note.empty()) {
      rows.push_back({"device", "copies", "-", "not measured: " + dev.copies_note});
    }
  }
  return rows;
}

std::string FormatProbeTable(const ProbeReport& report) {
  const std::vector<ProbeRow> rows = ProbeRows(report);
  size_t w_tier = 4, w_what = 4, w_value = 5;
  for (const ProbeRow& row : rows) {
    w_tier = std::max(w_tier, row.tier.size());
    w_what = std::max(w_what, row.what.size());
    w_value = std::max(w_value, row.value.size());
  }
  auto line = [&](const std::string& a, const std::string& b, const std::string& c, const std::string& d) {
    std::string s = a + std::string(w_tier - a.size() + 2, ' ') + b + std::string(w_what - b.size() + 2, ' ') + c;
    if (!d.empty()) s += std::string(w_value - c.size() + 2, ' ') + d;
    return s + "\n";
  };
  char head[160];
  std::snprintf(head, sizeof head, "tierkv probe: %s buffers in %s ops, median of up to %d, GB/s = 1e9 B/s, %.1f s\n",
                FormatBytes(report.buffer_bytes).c_str(), FormatBytes(report.op_bytes).c_str(), report.repetitions,
                report.seconds);
  std::string out = head;
  out += line("TIER", "WHAT", "VALUE", "NOTE");
  for (const ProbeRow& row : rows) out += line(row.tier, row.what, row.value, row.note);
  return out;
}

std::string FormatProbeJson(const ProbeReport& r) {
  using nlohmann::ordered_json;
  const HostReport& h = r.host;
  ordered_json host = {
      {"total_bytes", h.total_bytes},
      {"available_bytes", h.available_bytes},
      {"memlock_limit_bytes", h.memlock_limit_bytes ? ordered_json(*h.memlock_limit_bytes) : ordered_json(nullptr)},
      {"cap_ipc_lock", h.cap_ipc_lock},
      {"mlock_works", h.mlock_works},
      {"arena_locked", h.arena_locked},
      {"mlock_note", h.mlock_note},
      {"memcpy", BandwidthJson(h.memcpy)},
  };
  ordered_json disks = ordered_json::array();
  for (const DiskReport& d : r.disks) {
    disks.push_back({
        {"dir", d.dir},
        {"available", d.available},
        {"fs_type", d.fs_type},
        {"tmpfs", d.tmpfs},
        {"free_bytes", d.free_bytes},
        {"direct_io", d.direct_io},
        {"direct_write", BandwidthJson(d.direct_write)},
        {"direct_read", BandwidthJson(d.direct_read)},
        {"buffered_write", BandwidthJson(d.buffered_write)},
        {"buffered_read", BandwidthJson(d.buffered_read)},
        {"note", d.note},
    });
  }
  const DeviceReport& dev = r.device;
  ordered_json device = {
      {"present", dev.present}, {"name", dev.name},         {"why_not", dev.why_not}, {"pinning", dev.pinning},
      {"note", dev.note},       {"h2d", BandwidthJson(dev.h2d)}, {"d2h", BandwidthJson(dev.d2h)},
  };
  if (const auto& c = dev.copies) {
    device["copies"] = {{"vram_total_bytes", c->vram_total_bytes}, {"vram_free_bytes", c->vram_free_bytes},
                        {"h2d_pageable_gbps", c->h2d_pageable},   {"h2d_pinned_gbps", c->h2d_pinned},
                        {"d2h_pinned_gbps", c->d2h_pinned},       {"h2d_pages_64k_gbps", c->h2d_pages_64k},
                        {"h2d_pages_1m_gbps", c->h2d_pages_1m}};
  } else {
    device["copies"] = nullptr;
    device["copies_note"] = dev.copies_note;
  }
  ordered_json out = {
      {"buffer_bytes", r.buffer_bytes}, {"op_bytes", r.op_bytes}, {"repetitions", r.repetitions},
      {"seconds", r.seconds},           {"host", host},           {"disks", disks},
      {"device", device},
  };
  return out.dump(2) + "\n";
}

void AddProbeCommand(CLI::App& app, int& exit_code) {
  struct Args {
    ProbeOptions options;
    std::string size = "256MiB";
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "probe", "Report this machine's tiers (RAM, pinning, disk dirs, GPU) and measure their bandwidths");
  sub->add_option("--disk-dir", args->options.disk_dir, "Disk tier directory to probe besides /dev/shm")
      ->capture_default_str();
  sub->add_option("--size", args->size, "Bytes moved per repetition (multiple of 4KiB)")->capture_default_str();
  sub->add_flag("--json", args->json, "Print one JSON object on stdout instead of the table");
  sub->callback([args, &exit_code] {
    auto size = ParseSize(args->size);
    if (!size.ok()) {
      std::fprintf(stderr, "error: --size: %s\n", size.status().message().c_str());
      exit_code = 2;
      return;
    }
    args->options.buffer_bytes = *size;
    auto report = RunProbe(args->options);
    if (!report.ok()) {
      std::fprintf(stderr, "error: probe: %s\n", report.status().message().c_str());
      exit_code = FailureExitCode(report.status());
      return;
    }
    const std::string out = args->json ? FormatProbeJson(*report) : FormatProbeTable(*report);
    std::fwrite(out.data(), 1, out.size(), stdout);
    exit_code = 0;
  });
}

}  // namespace tierkv::tools
