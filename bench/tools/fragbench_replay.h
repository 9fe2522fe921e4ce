// bench/tools/fragbench_replay.h
//
// Replays a fragbench workload against four allocators and measures, at evenly spaced
// sample times, the bytes each holds and how much of that is fragmentation:
//   paged       tierkv::FrameAllocator, one frame per block of block_tokens tokens,
//               frames allocated as a session grows (simulated: no memory touched)
//   contiguous  one run of frames per session reserving max_tokens tokens at arrival,
//               first-fit (simulated), the pre-PagedAttention way
//   malloc      glibc malloc, one exact-size allocation per alloc/grow event (real)
//   mimalloc    the same through mi_malloc, loaded with dlopen (real; "unavailable"
//               when libmimalloc.so.2 cannot be loaded)
// Definitions of every number are in docs/fragbench.md.
//
// Thread-safety: Replay() is not reentrant: the malloc and mimalloc replays measure
// process-wide allocator statistics, so nothing else may allocate from those heaps while
// they run (fragbench is single-threaded). Everything else is pure.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "bench/tools/fragbench_workload.h"
#include "memory/status.h"

namespace tierkv::fragbench {

enum class AllocatorKind : uint8_t { kPaged, kContiguous, kMalloc, kMimalloc };
const char* AllocatorName(AllocatorKind kind);  // "paged", "contiguous", "malloc", "mimalloc"
// "paged,contiguous,malloc" -> kinds; "all" -> the four.
Result<std::vector<AllocatorKind>> ParseAllocatorList(std::string_view list);

struct ReplayOptions {
  // KV bytes of one token over all layers. Default: Qwen3-30B-A3B with an f16 cache,
  // 48 layers * 4 KV heads * 128 dims * 2 (K and V) * 2 bytes = 96 KiB.
  uint64_t bytes_per_token = 48 * 4 * 128 * 2 * 2;
  // Tokens per block; a block of all layers fills one frame. Larger blocks waste more
  // in each session's last block, smaller ones mean more frames to track.
  uint32_t block_tokens = 16;
  // Tokens the contiguous baseline reserves per session (192 Ki: above the 190K tail).
  uint32_t max_tokens = 196608;
  // Arena of each simulated allocator, bytes. 0: sized to the workload's peak demand so
  // nothing fails; a smaller arena makes sessions fail (counted, then dropped).
  uint64_t arena_bytes = 0;
  // Sample times: samples + 1, evenly spaced over [0, duration]. More = finer charts.
  uint32_t samples = 500;
  // The real-allocator replays divide bytes by this (it must divide bytes_per_token) and
  // multiply the results back. 1: the workload's own sizes. The replay never touches the
  // memory it allocates, so only address space is taken (about the peak held bytes);
  // where that is refused (vm.overcommit_memory=2, ulimit -v) sessions fail, and a scale
  // of 4 or 16 helps. Results change with the scale: allocators treat sizes differently.
  uint64_t real_scale = 1;
  std::vector<AllocatorKind> allocators = {AllocatorKind::kPaged, AllocatorKind::kContiguous, AllocatorKind::kMalloc,
                                           AllocatorKind::kMimalloc};
};

// One allocator at one sample time, in full-scale bytes.
// Invariants: live <= allocated <= held == allocated + external.
struct Sample {
  double time_s = 0;
  uint32_t sessions = 0;         // live sessions
  uint64_t live_bytes = 0;       // tokens of live sessions * bytes_per_token
  uint64_t allocated_bytes = 0;  // handed to sessions: frames, reservations, usable sizes
  // Held from the system for this workload. Simulated: allocated + external (a free
  // frame that can serve a request goes back to the shared arena). Real: the heap's
  // footprint beyond its baseline.
  uint64_t held_bytes = 0;
  // Held but free, and not usable by the allocator's next request. Real allocators: all
  // their free held bytes (an upper bound; usable ones cannot be told apart).
  uint64_t external_bytes = 0;

  uint64_t internal_bytes() const { return allocated_bytes - live_bytes; }
  uint64_t waste_bytes() const { return internal_bytes() + external_bytes; }
};

// Time averages are ratios of sums over the (evenly spaced) samples.
struct Summary {
  double waste_pct = 0;        // 100 * sum(internal + external) / sum(allocated)
  double internal_pct = 0;     // 100 * sum(internal) / sum(allocated)
  double external_pct = 0;     // 100 * sum(external) / sum(allocated)
  double utilisation_pct = 0;  // 100 * sum(live) / sum(held)
  uint64_t peak_live_bytes = 0;
  uint64_t peak_allocated_bytes = 0;
  uint64_t peak_held_bytes = 0;
  double peak_held_time_s = 0;  // first time the held peak is reached
  double mean_held_bytes = 0;
};
Summary Summarize(const std::vector<Sample>& samples);

struct AllocatorResult {
  AllocatorKind kind = AllocatorKind::kPaged;
  bool available = true;
  std::string note;              // how it was measured, or why it is unavailable
  uint64_t unit_bytes = 0;       // paged: one frame; contiguous: one reservation; real: 0
  uint64_t arena_bytes = 0;      // simulated: the arena's size
  uint64_t byte_scale = 1;       // real: the replay divided bytes by this
  uint32_t failed_sessions = 0;  // an allocation failed: the session was dropped
  double replay_s = 0;
  std::vector<Sample> samples;
  Summary summary;  // averages over the samples; peaks over every event
};

struct ReplayResult {
  WorkloadStats stats;
  std::vector<AllocatorResult> allocators;  // in ReplayOptions::allocators order
};

// Checks the options against the workload: a clear message for each impossible choice.
Status ValidateReplayOptions(const Workload& workload, const ReplayOptions& options);
Result<ReplayResult> Replay(const Workload& workload, const ReplayOptions& options);

// The sample times: samples + 1 points from 0 to duration_s inclusive.
std::vector<double> SampleTimes(double duration_s, uint32_t samples);

}  // namespace tierkv::fragbench
