// memory/stats.cc
#include "memory/stats.h"

namespace tierkv {

double TierStats::internal_fragmentation() const {
  if (used_bytes.current == 0) return 0;
  return 1.0 - static_cast<double>(requested_bytes.current) / static_cast<double>(used_bytes.current);
}

double TierStats::external_fragmentation() const {
  if (free_frames == 0) return 0;
  return static_cast<double>(external_unusable_frames) / static_cast<double>(free_frames);
}

double TierStats::hit_rate() const {
  const uint64_t n = hits + misses;
  return n == 0 ? 0 : static_cast<double>(hits) / static_cast<double>(n);
}

}  // namespace tierkv
