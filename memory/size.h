// memory/size.h
//
// Byte sizes as users write them: "512MiB", "8GiB", "64KiB", "1.5GB", "4096".
// Binary suffixes (KiB, MiB, GiB, TiB, and the short K, M, G, T) are powers of 1024;
// decimal ones (KB, MB, GB, TB) powers of 1000. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "memory/status.h"

namespace tierkv {

Result<uint64_t> ParseSize(std::string_view text);
std::string FormatBytes(uint64_t bytes);  // "1.50 GiB", "64.0 KiB", "512 B"

}  // namespace tierkv
