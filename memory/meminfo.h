// memory/meminfo.h
//
// How much RAM this machine has and how much is free to take: /proc/meminfo's MemTotal
// and MemAvailable (MemFree on kernels before 3.14, which lack it). Used by `tierkv
// probe` and by `tierkv run`'s automatic host budget. Thread-safety: pure functions
// (ReadMeminfo reads the file each call).
#pragma once

#include <cstdint>
#include <string_view>

#include "memory/status.h"

namespace tierkv {

struct MemInfo {
  uint64_t total_bytes = 0;
  uint64_t available_bytes = 0;
};

// Parses /proc/meminfo text; kCorruption when MemTotal, or both MemAvailable and
// MemFree, are missing.
Result<MemInfo> ParseMeminfo(std::string_view text);
// This machine's /proc/meminfo.
Result<MemInfo> ReadMeminfo();

}  // namespace tierkv
