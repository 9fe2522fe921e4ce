// memory/simd_env.h
//
// The environment's cap on the SIMD kernels: TIERKV_SIMD=scalar|avx2|avx2-novnni|avx512-novbmi|avx512,
// read once. It lets a machine with AVX-512 time or check the kernels that a machine
// without it runs (docs/kernels.md); unset or empty means no cap. The kernels
// (kernels/cpu_features.h) and the KV codecs (kvcache/codec.h) both apply it, so a
// capped run computes with the capped level's kernels throughout (fp16 array
// conversions, checksums and the bench tools' reads still pick their own paths).
#pragma once

#include <optional>
#include <string_view>

namespace tierkv {

struct SimdEnvCap {
  int level = 2;          // 0 scalar, 1 AVX2 + FMA + F16C, 2 AVX-512 (no cap)
  bool avx_vnni = true;   // false for "avx2-novnni": the AVX2 kernels keep off AVX-VNNI
  bool avx512_vbmi = true;  // false for "avx512-novbmi": tq's fused kernels keep off VBMI
};

// The cap a value of TIERKV_SIMD names ("" is no cap); nullopt for an unknown value.
std::optional<SimdEnvCap> ParseSimdCap(std::string_view value);

// The cap; an unknown value is reported once on stderr and ignored.
const SimdEnvCap& SimdCapFromEnv();

}  // namespace tierkv
