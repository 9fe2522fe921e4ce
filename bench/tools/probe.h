// bench/tools/probe.h
//
// `tierkv probe`: reports the tiers this machine offers (host RAM and pinning, disk tier
// candidates, CUDA device) and measures their bandwidths through the same TierBackend
// implementations tierkv runs on, so the numbers are what a decode will see.
// docs/probe.md describes every row and JSON key.
//
// Thread-safety: the functions are reentrant, but RunProbe saturates memory and disk
// bandwidth, so concurrent probes (or probes beside a decode) measure each other.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memory/meminfo.h"
#include "memory/status.h"
#include "memory/tier_backend.h"

namespace CLI {
class App;
}  // namespace CLI

namespace tierkv::tools {

struct ProbeOptions {
  // The user's disk tier candidate (`--disk-dir`). An error here (missing, not a
  // directory, no space) fails the probe: the user asked for it by name.
  std::string disk_dir = "/tmp";
  // Also probe /dev/shm (the usual RAM-disk) when it exists. Problems with it are
  // reported in its row, never fatal: nobody asked for it.
  bool probe_shm = true;
  // Bytes moved per timed repetition. 256 MiB is well past CPU caches and finishes in a
  // few seconds on a 2-core VM; smaller is faster but flatters memcpy. Multiple of 4 KiB
  // (O_DIRECT alignment), at least 64 KiB.
  uint64_t buffer_bytes = 256ull << 20;
  // Size of one CopyOp inside a batch (a page); ops are contiguous, so the backends
  // merge them the way they merge a gathered batch of pages.
  uint64_t op_bytes = 1ull << 20;
  // Timed repetitions per measurement; the report is their median.
  int repetitions = 3;
  // A measurement stops repeating once it has used this many seconds (at least one
  // timed repetition always runs); slow disks also get a shorter repetition, see
  // target_rep_seconds.
  double max_seconds_per_measurement = 2.0;
  // When the untimed warm-up shows that one full buffer would take longer than this,
  // the repetition moves only as many bytes as fit in it (at least 16 MiB).
  double target_rep_seconds = 1.0;
  // Measure host<->device copies when a CUDA device is visible.
  bool probe_device = true;
};

// One measured bandwidth: median over `reps` timed repetitions of `bytes_per_rep`.
struct Bandwidth {
  double gbps = 0;  // 1e9 bytes per second
  int reps = 0;
  uint64_t bytes_per_rep = 0;
};

struct HostReport {
  uint64_t total_bytes = 0;      // /proc/meminfo MemTotal
  uint64_t available_bytes = 0;  // /proc/meminfo MemAvailable
  std::optional<uint64_t> memlock_limit_bytes;  // RLIMIT_MEMLOCK soft; nullopt = unlimited
  bool cap_ipc_lock = false;     // may lock past RLIMIT_MEMLOCK
  bool mlock_works = false;      // a 64 KiB mlock succeeded
  bool arena_locked = false;     // the buffer_bytes probe arena could be mlocked
  std::string mlock_note;        // why not, when it did not
  std::optional<Bandwidth> memcpy;  // host arena -> host arena
};

struct DiskReport {
  std::string dir;
  bool available = false;   // false: skipped, `note` says why
  std::string fs_type;      // from statfs(2) f_type ("ext4", "tmpfs", "xfs", ...)
  bool tmpfs = false;       // RAM-backed: "disk" bandwidth is memory bandwidth
  uint64_t free_bytes = 0;  // f_bavail * f_bsize: what an unprivileged user may use
  bool direct_io = false;   // O_DIRECT accepted (the disk backend's Describe says so)
  std::optional<Bandwidth> direct_write, direct_read;      // O_DIRECT: the device
  std::optional<Bandwidth> buffered_write, buffered_read;  // page cache, see docs
  std::string note;
};

struct DeviceReport {
  bool present = false;
  std::string name;        // GPU model from the driver, else "CUDA device 0"
  std::string why_not;     // when !present
  std::string pinning;     // how the host side of the copies is pinned
  std::string note;        // why a present device was not measured
  std::optional<Bandwidth> h2d, d2h;
  // VRAM, pageable vs pinned, one copy vs gathered 64 KiB / 1 MiB pages (MeasureCudaCopies).
  std::optional<CudaCopyRates> copies;
  std::string copies_note;  // why they were not measured
};

struct ProbeReport {
  uint64_t buffer_bytes = 0;
  uint64_t op_bytes = 0;
  int repetitions = 0;
  double seconds = 0;  // wall time of the whole probe
  HostReport host;
  std::vector<DiskReport> disks;  // /dev/shm first (when probed), then disk_dir
  DeviceReport device;
};

// Measures everything. Fails (with the path in the message) when options.disk_dir is
// missing, not a directory, not writable or too full for buffer_bytes, or when the
// options are malformed; problems with optional tiers become notes in the report.
Result<ProbeReport> RunProbe(const ProbeOptions& options);

// One row of the table: tier, what, value, note.
struct ProbeRow {
  std::string tier;
  std::string what;
  std::string value;
  std::string note;
};
std::vector<ProbeRow> ProbeRows(const ProbeReport& report);
// The human-readable table (with a header line), newline-terminated.
std::string FormatProbeTable(const ProbeReport& report);
// One JSON object (keys in docs/probe.md), newline-terminated.
std::string FormatProbeJson(const ProbeReport& report);

// Name of a statfs f_type magic number: "ext2/3/4", "tmpfs", "xfs", ... or "0x1234abcd".
std::string FilesystemTypeName(int64_t magic);

// Registers `tierkv probe [--disk-dir DIR] [--size SIZE] [--json]` on app; its callback
// sets exit_code (0, or 1 after one error line on stderr).
void AddProbeCommand(CLI::App& app, int& exit_code);

}  // namespace tierkv::tools
