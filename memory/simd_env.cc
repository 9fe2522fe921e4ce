// memory/simd_env.cc
#include "memory/simd_env.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tierkv {
namespace {

SimdEnvCap Read() {
  SimdEnvCap cap;
  const char* v = std::getenv("TIERKV_SIMD");
  if (v == nullptr || *v == '\0') return cap;
  if (std::strcmp(v, "scalar") == 0) {
    cap.level = 0;
  } else if (std::strcmp(v, "avx2") == 0) {
    cap.level = 1;
  } else if (std::strcmp(v, "avx2-novnni") == 0) {
    cap.level = 1;
    cap.avx_vnni = false;
  } else if (std::strcmp(v, "avx512") != 0) {
    std::fprintf(stderr, "tierkv: ignoring TIERKV_SIMD=%s (expected scalar, avx2, avx2-novnni or avx512)\n", v);
  }
  return cap;
}

}  // namespace

const SimdEnvCap& SimdCapFromEnv() {
  static const SimdEnvCap cap = Read();
  return cap;
}

}  // namespace tierkv
