// memory/tier_backend.h
//
// The one narrow seam between tierkv and the OS / GPU (LevelDB's Env): a tier backend
// owns one arena and moves bytes between it and host memory in gathered batches.
// Real backends: Host (mmap'd, optionally mlocked), Disk (preallocated file, pread /
// pwrite, O_DIRECT where the filesystem allows), Device (CUDA cudaMalloc arena, or
// `sim`: host memory behind a copy engine throttled to a chosen bandwidth).
// FaultyBackend (memory/faulty_backend.h) wraps any of them and injects faults.
//
// Thread-safety: Read and Write may be called from one thread at a time per backend
// (the migration stream); the accessors are immutable after creation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "memory/status.h"
#include "memory/types.h"

namespace tierkv {

// One copy between the arena and host memory: arena bytes [offset, offset + bytes)
// and host bytes [host, host + bytes). Ops of one batch never overlap.
struct CopyOp {
  uint64_t offset = 0;
  std::byte* host = nullptr;
  size_t bytes = 0;
};

enum class MlockMode { kOff, kTry, kRequire };
Result<MlockMode> ParseMlockMode(std::string_view text);  // "off" | "try" | "require"

class TierBackend {
 public:
  virtual ~TierBackend() = default;

  virtual Tier tier() const = 0;
  // One line for logs and probe: "host: mmap 1.00 GiB, mlocked, THP advised".
  virtual std::string Describe() const = 0;
  // Arena size in bytes (a multiple of the frame size chosen by the caller).
  virtual uint64_t capacity() const = 0;
  // Host-addressable base of the arena (Host, sim Device, a Disk arena mapped on a
  // memory filesystem); nullptr for a Disk file read with pread and for CUDA.
  virtual std::byte* base() = 0;
  // Base of the arena in the address space its compute uses: base() for Host and sim,
  // the device pointer for CUDA, nullptr for Disk. Pins hand out pointers into it.
  virtual std::byte* arena_address() { return base(); }
  // Seconds spent reserving and touching the arena at creation (warmup).
  virtual double warmup_seconds() const = 0;

  // Gathered copies host -> arena (Write) and arena -> host (Read). Adjacent ops are
  // merged into one call. On error the status names the failing op; which ops of the
  // batch landed is unspecified, so the caller treats every destination as garbage.
  virtual Status Write(std::span<const CopyOp> ops) = 0;
  virtual Status Read(std::span<const CopyOp> ops) = 0;
};

struct HostBackendOptions {
  uint64_t bytes = 0;
  MlockMode mlock = MlockMode::kTry;  // try: warn and continue unpinned when refused
  bool warmup = true;                 // touch every OS page now, not on first use
  bool huge_pages = true;             // MADV_HUGEPAGE: fewer TLB misses on big arenas
  // Test seam replacing mlock(2) (fault injection: a refused mlock). nullptr = mlock.
  int (*mlock_fn)(const void*, size_t) = nullptr;
};
// The pinned-RAM tier. In CUDA builds the arena is also registered with
// cudaHostRegister when a GPU is present, so device copies are DMA, not staged.
Result<std::unique_ptr<TierBackend>> CreateHostBackend(const HostBackendOptions& options);

struct DiskBackendOptions {
  std::string dir = "/tmp";  // RAM-disk (/dev/shm) or an SSD mount
  uint64_t bytes = 0;
  bool direct_io = true;     // O_DIRECT when the filesystem accepts it (else buffered)
  bool warmup = true;        // preallocate with fallocate (ENOSPC now, not mid-decode)
  // On a memory filesystem (tmpfs, ramfs: a RAM-disk such as /dev/shm), when the file is
  // preallocated (warmup), it is also mapped and transfers are memcpy through the
  // mapping: ~3x the speed of the kernel's pread/pwrite copy on the machines measured
  // (docs/benchmarks.md, "Migration throughput"). Without preallocation a fault on a hole
  // of a full tmpfs would be SIGBUS instead of ENOSPC, so that case stays pread/pwrite.
  bool map_memory_fs = true;
};
// The disk tier: one preallocated file, unlinked right after creation so that a crash
// leaves nothing behind (session files are separate and named). Describe() ends with
// ", O_DIRECT", ", buffered" or ", mapped".
Result<std::unique_ptr<TierBackend>> CreateDiskBackend(const DiskBackendOptions& options);

struct SimDeviceOptions {
  uint64_t bytes = 0;
  double gbps = 0;     // copy engine bandwidth in GB/s (1e9 B/s); 0 = unthrottled
  bool warmup = true;
};
// CPU builds: a Device tier made of host memory and a throttled copy engine, so the
// three-tier logic runs and policies can be studied without a GPU.
Result<std::unique_ptr<TierBackend>> CreateSimDeviceBackend(const SimDeviceOptions& options);

// CUDA builds with a GPU: one cudaMalloc'd arena. Otherwise kUnsupported, with why.
Result<std::unique_ptr<TierBackend>> CreateCudaDeviceBackend(uint64_t bytes, bool warmup);
// True when this binary was built with CUDA and a device is visible.
bool CudaDeviceAvailable(std::string* why_not = nullptr);

// What `tierkv probe` measures of a CUDA device beyond the tier's own copies: its memory,
// and copies of `bytes` between host and device timed with CUDA events (the best of
// `reps`): host to device from pageable and from pinned memory in one copy, device to
// host into pinned memory, and host to device gathered as pages of 64 KiB and of 1 MiB
// (one cudaMemcpyAsync per page, sources and destinations in a shuffled order, one
// synchronize), as the page table moves them. Rates in GB/s (1e9 B/s).
struct CudaCopyRates {
  uint64_t vram_total_bytes = 0, vram_free_bytes = 0;
  double h2d_pageable = 0, h2d_pinned = 0, d2h_pinned = 0, h2d_pages_64k = 0, h2d_pages_1m = 0;
};
// kUnsupported without CUDA or a device; REQUIRES: bytes a multiple of 1 MiB.
Result<CudaCopyRates> MeasureCudaCopies(uint64_t bytes, int reps);

// CUDA builds: page-locks an existing host range (cudaHostRegister) so device copies
// from it are DMA. Returns kUnsupported in CPU builds or without a GPU.
Status RegisterHostMemoryForDevice(std::byte* base, uint64_t bytes);
void UnregisterHostMemoryForDevice(std::byte* base);

// mlock probe shared by the Host backend and `tierkv probe`: RLIMIT_MEMLOCK soft
// limit in bytes (UINT64_MAX = unlimited).
uint64_t MemlockLimitBytes();

}  // namespace tierkv
