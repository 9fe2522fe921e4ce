// memory/stats.h
//
// Per-tier statistics from one list (X-macros): counters only grow, gauges have a
// current value and a peak. Reports iterate the lists, so a new stat is one line.
//
// Thread-safety: plain values; MemoryManager fills them under its mutex and hands out
// copies.
#pragma once

#include <cstdint>
#include <string>

#include "memory/types.h"

namespace tierkv {

// name, meaning
#define TIERKV_TIER_COUNTERS(X)                                                        \
  X(hits, "accesses this tier served: the page was used, read or copied up from here") \
  X(misses, "accesses that wanted the page on this tier or above and found it below")  \
  X(bytes_read, "bytes compute read from this tier where they lay (in place or read through)") \
  X(bytes_in, "bytes copied into this tier")                                         \
  X(bytes_out, "bytes copied out of this tier")                                      \
  X(migrations_in, "pages copied into this tier")                                    \
  X(migrations_out, "pages copied out of this tier")                                 \
  X(evictions, "pages demoted from this tier to make room")                          \
  X(drops, "copies discarded without a copy because a valid copy remained")          \
  X(copy_batches, "gathered copy batches into or out of this tier")                  \
  X(failed_copies, "copy batches that failed (the pages stayed valid where they were)")

#define TIERKV_TIER_GAUGES(X)                                                          \
  X(used_bytes, "frame bytes held by page copies")                                   \
  X(requested_bytes, "bytes the page copies asked for (used - requested = internal waste)") \
  X(pages, "page copies on this tier")

struct Gauge {
  uint64_t current = 0;
  uint64_t peak = 0;
  void Add(uint64_t v) { current += v; if (current > peak) peak = current; }
  void Sub(uint64_t v) { current -= v; }
};

struct TierStats {
  Tier tier = Tier::kHost;
  bool present = false;
  std::string backend;        // TierBackend::Describe()
  uint64_t budget_bytes = 0;  // arena bytes (frames * frame_bytes)
  uint64_t frame_bytes = 0;
  uint64_t frames = 0;
  uint64_t free_frames = 0;
  uint64_t largest_free_run = 0;  // frames
  double warmup_s = 0;
#define TIERKV_DECLARE_COUNTER(name, doc) uint64_t name = 0;
  TIERKV_TIER_COUNTERS(TIERKV_DECLARE_COUNTER)
#undef TIERKV_DECLARE_COUNTER
#define TIERKV_DECLARE_GAUGE(name, doc) Gauge name;
  TIERKV_TIER_GAUGES(TIERKV_DECLARE_GAUGE)
#undef TIERKV_DECLARE_GAUGE

  // 1 - requested / used: share of held frame bytes no page asked for.
  double internal_fragmentation() const;
  // Free frames that cannot serve a request of n contiguous frames, as a share of the
  // free frames (filled by MemoryManager::Stats for n = the largest page it has seen).
  uint64_t external_unusable_frames = 0;
  double external_fragmentation() const;
  double hit_rate() const;
};

}  // namespace tierkv
