// memory/half.h
//
// IEEE 754 binary16 ("fp16", "half") <-> binary32 conversion, shared by the KV codecs and the kernels (both may include memory/), for
// f16 values and for the fp16 scales of q8_0, q4_0, tq4 and tq3.
//
//   FloatToHalf: round to nearest, ties to even; overflow (|x| >= 65520) gives +-inf;
//                values below half the smallest subnormal (2^-25) give +-0; subnormal
//                results are rounded correctly; NaN stays NaN (quiet bit set, top payload
//                bits kept, sign kept), exactly as x86 F16C's vcvtps2ph does.
//   HalfToFloat: exact (every half is a float); NaN stays NaN with its payload and the
//                quiet bit set, as vcvtph2ps does.
//
// The scalar functions do the work with integer operations only, so they are exact
// whatever the floating-point environment (FTZ/DAZ) says. The array functions use F16C
// when the CPU has it (checked once at run time; the build has no -march flags) and
// otherwise the scalar functions; both give identical bits (tests/kvcache/half_test.cc
// checks all 65536 halves and boundary floats).
//
// Thread-safety: pure functions.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define TIERKV_HALF_X86 1
#endif

namespace tierkv {

// Branch-free (selects only), so loops over it vectorise; exact in any FP environment:
// a subnormal half is man * 2^-24 with man < 1024, computed as an exact int->float
// conversion times a power of two whose result is a normal float.
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  const uint32_t normal = ((exp + (127 - 15)) << 23) | (man << 13);
  // inf, or NaN with the quiet bit forced on (as the hardware does).
  const uint32_t special = 0x7f800000u | (man << 13) | (man != 0 ? 0x00400000u : 0u);
  const uint32_t subnormal = std::bit_cast<uint32_t>(static_cast<float>(man) * 0x1p-24f);
  const uint32_t mag = exp == 0 ? subnormal : (exp == 0x1f ? special : normal);
  return std::bit_cast<float>(sign | mag);
}

// The fp16 value stored (little-endian) at p, which need not be aligned.
inline float LoadHalf(const void* p) {
  uint16_t h;
  __builtin_memcpy(&h, p, 2);
  return HalfToFloat(h);
}

inline uint16_t FloatToHalf(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or NaN
    if (ax == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
    return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  }
  // 65520 is halfway between 65504 (largest half, odd mantissa) and 65536: ties go up.
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (ax >= 0x38800000u) {  // >= 2^-14: normal half
    uint32_t h = (ax - 0x38000000u) >> 13;  // rebias 127 -> 15, drop 13 mantissa bits
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent
    return static_cast<uint16_t>(sign | h);
  }
  if (ax <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25 rounds to 0
  // Subnormal half: q = round(value * 2^24) with value = m * 2^(e - 150).
  const uint32_t e = ax >> 23;                 // 102..112
  const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - e;              // 14..24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (q & 1u))) ++q;  // 0x400 is the smallest normal
  return static_cast<uint16_t>(sign | q);
}

namespace half_internal {

#if defined(TIERKV_HALF_X86)
__attribute__((target("avx,f16c"))) inline void HalfToFloatF16c(const uint16_t* in, float* out,
                                                                size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = HalfToFloat(in[i]);
}

__attribute__((target("avx,f16c"))) inline void FloatToHalfF16c(const float* in, uint16_t* out,
                                                                size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = FloatToHalf(in[i]);
}

// F16C from CPUID leaf 1 (ECX bit 29); "avx" also checks that the OS saves AVX state.
// (Not __builtin_cpu_supports("f16c"): older clang does not know that name.)
inline bool CpuHasF16c() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
    return (ecx & (1u << 29)) != 0 && __builtin_cpu_supports("avx");
  }();
  return has;
}
#else
inline bool CpuHasF16c() { return false; }
#endif

}  // namespace half_internal

// True when the array functions below use the F16C instructions.
inline bool HalfUsesF16c() { return half_internal::CpuHasF16c(); }

// out[i] = HalfToFloat(in[i]) for i < n (bit-identical to the scalar function).
inline void HalfToFloatArray(const uint16_t* in, float* out, size_t n) {
#if defined(TIERKV_HALF_X86)
  if (half_internal::CpuHasF16c()) return half_internal::HalfToFloatF16c(in, out, n);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = HalfToFloat(in[i]);
}

// out[i] = FloatToHalf(in[i]) for i < n (bit-identical to the scalar function).
inline void FloatToHalfArray(const float* in, uint16_t* out, size_t n) {
#if defined(TIERKV_HALF_X86)
  if (half_internal::CpuHasF16c()) return half_internal::FloatToHalfF16c(in, out, n);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = FloatToHalf(in[i]);
}

}  // namespace tierkv
