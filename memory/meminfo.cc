// memory/meminfo.cc
#include "memory/meminfo.h"

#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "memory/types.h"

namespace tierkv {

Result<MemInfo> ParseMeminfo(std::string_view text) {
  std::optional<uint64_t> total, available, mem_free;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string line(text.substr(pos, end - pos));
    pos = end + 1;
    char key[64] = {};
    unsigned long long kib = 0;
    // Lines look like "MemTotal:       24731708 kB" (the kernel's kB are KiB).
    if (std::sscanf(line.c_str(), "%63[^:]: %llu", key, &kib) != 2) continue;
    const std::string k(key);
    if (k == "MemTotal") total = kib * kKiB;
    else if (k == "MemAvailable") available = kib * kKiB;
    else if (k == "MemFree") mem_free = kib * kKiB;
  }
  if (!total) return Status::Corruption("/proc/meminfo has no MemTotal line");
  // Kernels before 3.14 have no MemAvailable; MemFree underestimates but is honest.
  if (!available && !mem_free) return Status::Corruption("/proc/meminfo has neither MemAvailable nor MemFree");
  return MemInfo{*total, available ? *available : *mem_free};
}

Result<MemInfo> ReadMeminfo() {
  std::ifstream in("/proc/meminfo");
  if (!in) return Status::NotFound("/proc/meminfo: cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ParseMeminfo(ss.str());
}

}  // namespace tierkv
