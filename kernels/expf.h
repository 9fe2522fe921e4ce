// kernels/expf.h
//
// e^x in f32 as llama.cpp's AVX-512 CPU build computes it in its softmax and SiLU (ggml's
// vectorised expf, itself after Arm's optimized-routines): not the C library's expf, and
// not correctly rounded (up to ~2 ulp off), but these exact bits are what the reference
// logits were made with, so the attention weights, router probabilities and SwiGLU
// activations that feed re-quantized matmuls keep llama.cpp's roundings.
//
// The algorithm, in f32 with fused multiply-adds throughout:
//   n = round(x * log2(e))                    by the 1.5 * 2^23 shift: z = fma(x, log2e, S), n = z - S
//   b = x - n * ln2_hi - n * ln2_lo            two fused negative multiply-adds
//   p = 1 + c1 b + c2 b^2 + ... + c5 b^5       as fma(fma(fma(c5,b,c4), b^2, fma(c3,b,c2)), b^2, fma(c1,b,1))
//   e^x = p * 2^n                              one rounding (vscalef; subnormal results too)
// and where |n| > 192: 0 for n <= 0, +inf otherwise. NaN in gives NaN.
//
// ExpGgml is the portable definition; ExpGgml16 (AVX-512) and ExpGgml8 (AVX2 + FMA) give
// the same bits (tests sweep every 4099th float). Callers pick the vector forms through
// ActiveSimdLevel().
//
// Thread-safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TIERKV_EXPF_X86 1
#endif

namespace tierkv::kernels {

namespace expf_internal {
inline constexpr float kShift = 0x1.8p23f;
inline constexpr float kLog2e = 0x1.715476p+0f;
inline constexpr float kLn2Hi = 0x1.62e4p-1f;
inline constexpr float kLn2Lo = 0x1.7f7d1cp-20f;
inline constexpr float kC1 = 0x1.ffffecp-1f;
inline constexpr float kC2 = 0x1.fffdb6p-2f;
inline constexpr float kC3 = 0x1.555e66p-3f;
inline constexpr float kC4 = 0x1.573e2ep-5f;
inline constexpr float kC5 = 0x1.0e4020p-7f;
inline constexpr float kSpecial = 192.0f;  // |n| above this: 0 or inf
}  // namespace expf_internal

// The reference definition (std::fma is correctly rounded, as the vector FMAs are).
inline float ExpGgml(float x) {
  using namespace expf_internal;
  const float z = std::fma(x, kLog2e, kShift);
  const float n = z - kShift;
  if (std::isnan(n)) return x + x;
  if (std::fabs(n) > kSpecial) return n <= 0.0f ? 0.0f : std::numeric_limits<float>::infinity();
  const float b = std::fma(-n, kLn2Lo, std::fma(-n, kLn2Hi, x));
  const float u = b * b;
  const float p = std::fma(std::fma(std::fma(kC5, b, kC4), u, std::fma(kC3, b, kC2)), u, std::fma(kC1, b, 1.0f));
  return std::ldexp(p, static_cast<int>(n));  // p * 2^n, rounded once
}

#if defined(TIERKV_EXPF_X86)

#define TIERKV_EXPF_AVX512 __attribute__((target("avx512f,avx512dq,avx2,fma"), always_inline)) inline
#define TIERKV_EXPF_AVX2 __attribute__((target("avx2,fma"), always_inline)) inline

// GCC 12's AVX-512 intrinsics fill "don't care" lanes with _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports (as in kernels/quant_avx512.cc).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// ExpGgml on 16 lanes.
TIERKV_EXPF_AVX512 __m512 ExpGgml16(__m512 x) {
  using namespace expf_internal;
  const __m512 shift = _mm512_set1_ps(kShift);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(kLog2e), shift), shift);
  const __m512 b =
      _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x));
  const __m512 u = _mm512_mul_ps(b, b);
  const __m512 hi = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(kC5), b, _mm512_set1_ps(kC4)), u,
                                    _mm512_fmadd_ps(_mm512_set1_ps(kC3), b, _mm512_set1_ps(kC2)));
  const __m512 p = _mm512_fmadd_ps(hi, u, _mm512_fmadd_ps(_mm512_set1_ps(kC1), b, _mm512_set1_ps(1.0f)));
  const __m512 e = _mm512_scalef_ps(p, n);
  const __mmask16 special = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(kSpecial), _CMP_GT_OQ);
  if (special == 0) return e;
  const __mmask16 big = _mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_GT_OQ);
  return _mm512_mask_mov_ps(e, special,
                            _mm512_maskz_mov_ps(big, _mm512_set1_ps(std::numeric_limits<float>::infinity())));
}

// ExpGgml on 8 lanes without vscalef: p * 2^n as one multiply by a power of two, which is
// exact-then-rounded-once while 2^n is a normal float (n in [-126, 127]). Lanes outside
// (x below about -87.3: a softmax's scores far under the row's max; above about 88: a
// SiLU of a large negative gate) take (p * 2^(n -+ 96)) * 2^(+-96), whose first product is
// exact, so one rounding still (subnormal results and overflow to inf included), and 0
// below -192, inf above 192; vectors with a NaN go through the scalar definition lane by
// lane.
TIERKV_EXPF_AVX2 __m256 ExpGgml8(__m256 x) {
  using namespace expf_internal;
  const __m256 shift = _mm256_set1_ps(kShift);
  const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(kLog2e), shift), shift);
  // Outside [-126, 127], or NaN.
  const __m256 outside = _mm256_or_ps(_mm256_cmp_ps(n, _mm256_set1_ps(-126.0f), _CMP_NGE_UQ),
                                      _mm256_cmp_ps(n, _mm256_set1_ps(127.0f), _CMP_NLE_UQ));
  const bool all_inside = _mm256_movemask_ps(outside) == 0;
  if (!all_inside && _mm256_movemask_ps(_mm256_cmp_ps(n, n, _CMP_UNORD_Q)) != 0) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, x);
    for (float& v : lanes) v = ExpGgml(v);
    return _mm256_load_ps(lanes);
  }
  const __m256 b =
      _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x));
  const __m256 u = _mm256_mul_ps(b, b);
  const __m256 hi = _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(kC5), b, _mm256_set1_ps(kC4)), u,
                                    _mm256_fmadd_ps(_mm256_set1_ps(kC3), b, _mm256_set1_ps(kC2)));
  const __m256 p = _mm256_fmadd_ps(hi, u, _mm256_fmadd_ps(_mm256_set1_ps(kC1), b, _mm256_set1_ps(1.0f)));
  if (all_inside) {
    // 2^n: (n + 127) << 23, n an integer in [-126, 127].
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  }
  const __m256 low = _mm256_cmp_ps(n, _mm256_set1_ps(-126.0f), _CMP_LT_OQ);
  const __m256 high = _mm256_cmp_ps(n, _mm256_set1_ps(127.0f), _CMP_GT_OQ);
  // n clamped to [-192, 192] (the lanes past it are set below), moved by +-96 into the
  // normal range, then the product scaled back by 2^(-+96).
  const __m256 nc = _mm256_min_ps(_mm256_max_ps(n, _mm256_set1_ps(-kSpecial)), _mm256_set1_ps(kSpecial));
  const __m256 move = _mm256_or_ps(_mm256_and_ps(low, _mm256_set1_ps(96.0f)), _mm256_and_ps(high, _mm256_set1_ps(-96.0f)));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(_mm256_add_ps(nc, move)), _mm256_set1_epi32(127)), 23);
  const __m256 back = _mm256_blendv_ps(_mm256_blendv_ps(_mm256_set1_ps(1.0f), _mm256_set1_ps(0x1p-96f), low),
                                       _mm256_set1_ps(0x1p96f), high);
  const __m256 e = _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), back);
  const __m256 zero = _mm256_cmp_ps(n, _mm256_set1_ps(-kSpecial), _CMP_LT_OQ);
  const __m256 inf = _mm256_cmp_ps(n, _mm256_set1_ps(kSpecial), _CMP_GT_OQ);
  return _mm256_blendv_ps(_mm256_andnot_ps(zero, e), _mm256_set1_ps(std::numeric_limits<float>::infinity()), inf);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // TIERKV_EXPF_X86

}  // namespace tierkv::kernels
