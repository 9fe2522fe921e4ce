// kernels/cpu_features.h
//
// Which SIMD level the CPU kernels use, chosen once at run time (the build has no -march
// flags; the fast paths are functions compiled with target attributes). AMX is never
// used. Tests may force a lower level to compare the paths with each other.
//
// Thread-safety: the level is read with an atomic load; ForceSimdLevel is for tests and
// must not race with running kernels.
#pragma once

namespace tierkv::kernels {

// What this CPU (with the OS's support for the register state) has, detected once, no
// cap applied: the one place tierkv asks the CPU. (memory/half.h's F16C check for the
// fp16 array conversions is the exception: the memory layer cannot include kernels/.)
struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avx_vnni = false;
  bool avx512vbmi = false;  // vpermb: tq's fused KV kernels unpack indices with it
};
const CpuFeatures& CpuHas();

enum class SimdLevel : int {
  kScalar = 0,  // portable C++
  kAvx2 = 1,    // AVX2 + FMA + F16C
  kAvx512 = 2,  // AVX2 level plus AVX-512 F/BW/VL/DQ
};

// The best level this CPU supports, capped by the environment variable TIERKV_SIMD
// (scalar, avx2, avx2-novnni, avx512; read once: docs/kernels.md).
SimdLevel DetectedSimdLevel();
// The level the kernels use now: min(detected, forced) (forced defaults to the highest).
SimdLevel ActiveSimdLevel();
// Caps the level (tests, benchmarks); a level above the detected one is capped to it.
void ForceSimdLevel(SimdLevel level);
const char* SimdLevelName(SimdLevel level);  // "scalar", "avx2", "avx512"

// Whether the AVX2-level kernels may use AVX-VNNI (vpdpbusd on 256-bit vectors, VEX
// encoded: Intel since Alder Lake, AMD since Zen 5): the CPU reports it, the active level
// is AVX2 or higher, and AllowAvxVnni(false) has not turned it off (tests and benchmarks
// compare the two paths; both give the same bits).
bool AvxVnniActive();
void AllowAvxVnni(bool allow);

}  // namespace tierkv::kernels
