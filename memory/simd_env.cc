// memory/simd_env.cc
#include "memory/simd_env.h"

#include <cstdio>
#include <cstdlib>

namespace tierkv {

std::optional<SimdEnvCap> ParseSimdCap(std::string_view value) {
  SimdEnvCap cap;
  if (value.empty() || value == "avx512") return cap;
  if (value == "scalar") {
    cap.level = 0;
  } else if (value == "avx2") {
    cap.level = 1;
  } else if (value == "avx2-novnni") {
    cap.level = 1;
    cap.avx_vnni = false;
  } else if (value == "avx512-novbmi") {
    cap.avx512_vbmi = false;
  } else {
    return std::nullopt;
  }
  return cap;
}

const SimdEnvCap& SimdCapFromEnv() {
  static const SimdEnvCap cap = [] {
    const char* v = std::getenv("TIERKV_SIMD");
    if (v == nullptr) return SimdEnvCap{};
    if (std::optional<SimdEnvCap> c = ParseSimdCap(v)) return *c;
    std::fprintf(stderr, "tierkv: ignoring TIERKV_SIMD=%s (expected scalar, avx2, avx2-novnni, avx512-novbmi or avx512)\n", v);
    return SimdEnvCap{};
  }();
  return cap;
}

}  // namespace tierkv
