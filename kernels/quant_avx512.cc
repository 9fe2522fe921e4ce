// kernels/quant_avx512.cc
//
// AVX-512 (F, BW, VL, DQ) dot products for F32, F16 and BF16, chosen at run time. The
// quantized types use the AVX2 kernels at this level: their 32-value blocks carry one
// scale each, and 512-bit versions that pair blocks (lane joins, per-half scale vectors,
// masked negation for the signed products) measured 1.3-1.4x slower than the AVX2 ones
// for Q8_0 and Q4_0 (docs/kernels.md). No AMX instruction is emitted: the target list
// names none.
#include <cstdint>

#include "kernels/fp16.h"
#include "kernels/quant.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

// GCC 12's AVX-512 intrinsics fill "don't care" lanes with _mm512_undefined_*(), which
// it then reports as uninitialised where they are inlined (a known false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace tierkv::kernels {
namespace {

#define TIERKV_AVX512_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))


TIERKV_AVX512_FN inline float HsumPs256(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
  return _mm_cvtss_f32(s1);
}

TIERKV_AVX512_FN inline float HsumPs512(__m512 v) {
  return HsumPs256(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

TIERKV_AVX512_FN float DotF32Avx512(const void* row, const void* act, int64_t n) {
  const auto* w = static_cast<const float*>(row);
  const auto* x = static_cast<const float*>(act);
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
    a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
  }
  for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
  float s = HsumPs512(_mm512_add_ps(a0, a1));
  for (; i < n; ++i) s += w[i] * x[i];
  return s;
}

TIERKV_AVX512_FN inline __m512 LoadF16x16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

TIERKV_AVX512_FN float DotF16Avx512(const void* row, const void* act, int64_t n) {
  const auto* w = static_cast<const uint16_t*>(row);
  const auto* x = static_cast<const uint16_t*>(act);
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm512_fmadd_ps(LoadF16x16(w + i), LoadF16x16(x + i), a0);
    a1 = _mm512_fmadd_ps(LoadF16x16(w + i + 16), LoadF16x16(x + i + 16), a1);
  }
  for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(LoadF16x16(w + i), LoadF16x16(x + i), a0);
  float s = HsumPs512(_mm512_add_ps(a0, a1));
  for (; i < n; ++i) s += F16ToF32(w[i]) * F16ToF32(x[i]);
  return s;
}

TIERKV_AVX512_FN inline __m512 LoadBf16x16(const uint16_t* p) {
  const __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}

TIERKV_AVX512_FN float DotBf16Avx512(const void* row, const void* act, int64_t n) {
  const auto* w = static_cast<const uint16_t*>(row);
  const auto* x = static_cast<const uint16_t*>(act);
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm512_fmadd_ps(LoadBf16x16(w + i), LoadBf16x16(x + i), a0);
    a1 = _mm512_fmadd_ps(LoadBf16x16(w + i + 16), LoadBf16x16(x + i + 16), a1);
  }
  for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(LoadBf16x16(w + i), LoadBf16x16(x + i), a0);
  float s = HsumPs512(_mm512_add_ps(a0, a1));
  for (; i < n; ++i) s += Bf16ToF32(w[i]) * Bf16ToF32(x[i]);
  return s;
}

#undef TIERKV_AVX512_FN

}  // namespace

namespace quant_internal {
DotFn Avx512Dot(WeightType weight) {
  switch (weight) {
    case WeightType::kF32: return DotF32Avx512;
    case WeightType::kF16: return DotF16Avx512;
    case WeightType::kBF16: return DotBf16Avx512;
    default: return nullptr;  // the quantized types: the AVX2 kernels
  }
}
}  // namespace quant_internal

}  // namespace tierkv::kernels

#else  // not x86

namespace tierkv::kernels::quant_internal {
DotFn Avx512Dot(WeightType) { return nullptr; }
}  // namespace tierkv::kernels::quant_internal

#endif
