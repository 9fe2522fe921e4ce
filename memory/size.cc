// memory/size.cc
#include "memory/size.h"

#include <cctype>
#include <cmath>
#include <cstdio>

#include "memory/types.h"

namespace tierkv {

const char* TierName(Tier t) {
  switch (t) {
    case Tier::kDevice: return "device";
    case Tier::kHost: return "host";
    case Tier::kDisk: return "disk";
  }
  return "?";
}

Result<uint64_t> ParseSize(std::string_view text) {
  const std::string original(text);
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return Status::InvalidArgument("size '" + original + "' does not start with a number");
  double number = 0;
  size_t used = 0;
  try {
    number = std::stod(std::string(text.substr(0, i)), &used);
  } catch (...) {
    used = 0;
  }
  if (used != i) return Status::InvalidArgument("size '" + original + "' has a malformed number");
  std::string unit;
  for (char c : text.substr(i)) {
    if (c != ' ') unit.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  double mult = 0;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kib") mult = 1024.0;
  else if (unit == "m" || unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib") mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb") mult = 1e3;
  else if (unit == "mb") mult = 1e6;
  else if (unit == "gb") mult = 1e9;
  else if (unit == "tb") mult = 1e12;
  else return Status::InvalidArgument("size '" + original + "' has unknown unit '" + unit + "' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  // Fractions of a larger unit round to whole bytes; a fraction of a byte is a mistake.
  if (mult == 1 && number != std::floor(number)) {
    return Status::InvalidArgument("size '" + original + "' is not a whole number of bytes");
  }
  const double bytes = number * mult;
  // 2^64 is exactly representable; anything below it converts to uint64_t exactly
  // (llround would go through a signed type and overflow above 2^63).
  if (!std::isfinite(bytes) || bytes >= 18446744073709551616.0) return Status::InvalidArgument("size '" + original + "' is too large");
  return static_cast<uint64_t>(std::round(bytes));
}

std::string FormatBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) { v /= 1024.0; ++u; }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof buf, v < 10 ? "%.2f %s" : (v < 100 ? "%.1f %s" : "%.0f %s"), v, kUnits[u]);
  return buf;
}

}  // namespace tierkv
