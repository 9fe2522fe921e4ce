// kernels/quant_avx512.cc
//
// AVX-512 (F, BW, VL, DQ) dot products for F32, F16, BF16, Q8_0 and Q4_0, chosen at run
// time. The K-quants use the AVX2 kernels at this level (their 32-value sub-blocks with
// per-sub-block scales map naturally onto 256-bit registers; measured in
// docs/kernels.md). No AMX instruction is emitted: the target list names none.
#include <cstdint>

#include "kernels/fp16.h"
#include "kernels/quant.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

namespace tierkv::kernels {
namespace {

#define TIERKV_AVX512_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

TIERKV_AVX512_FN inline __m256i LoadU256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

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

// Sum of w[i] * x[i] over 64 int8 pairs (two 32-value blocks), as 16 int32 lanes: lanes
// 0..7 from the first block, 8..15 from the second.
TIERKV_AVX512_FN inline __m512i DotI8x64(__m512i w, __m512i x) {
  const __m512i aw = _mm512_abs_epi8(w);  // -128 -> 0x80, read as unsigned 128
  const __m512i sx = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
  return _mm512_madd_epi16(_mm512_maddubs_epi16(aw, sx), _mm512_set1_epi16(1));
}

TIERKV_AVX512_FN inline __m512i Join(__m256i lo, __m256i hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

TIERKV_AVX512_FN inline __m512 Scales2(float d0, float d1) {
  return _mm512_insertf32x8(_mm512_set1_ps(d0), _mm256_set1_ps(d1), 1);
}

TIERKV_AVX512_FN inline __m256i DotI8x32(__m256i w, __m256i x) {
  const __m256i aw = _mm256_sign_epi8(w, w);
  const __m256i sx = _mm256_sign_epi8(x, w);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1));
}

TIERKV_AVX512_FN float DotQ8_0Avx512(const void* row, const void* act, int64_t n) {
  const auto* w = static_cast<const BlockQ8_0*>(row);
  const auto* x = static_cast<const BlockQ8_0*>(act);
  const int64_t nb = n / kQk0;
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    const __m512i p = DotI8x64(Join(LoadU256(w[i].qs), LoadU256(w[i + 1].qs)),
                               Join(LoadU256(x[i].qs), LoadU256(x[i + 1].qs)));
    const __m512 d = Scales2(F16ToF32(w[i].d) * F16ToF32(x[i].d), F16ToF32(w[i + 1].d) * F16ToF32(x[i + 1].d));
    acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc);
  }
  __m256 acc8 = _mm256_setzero_ps();
  for (; i < nb; ++i) {
    const __m256i p = DotI8x32(LoadU256(w[i].qs), LoadU256(x[i].qs));
    acc8 = _mm256_fmadd_ps(_mm256_set1_ps(F16ToF32(w[i].d) * F16ToF32(x[i].d)), _mm256_cvtepi32_ps(p), acc8);
  }
  return HsumPs512(acc) + HsumPs256(acc8);
}

TIERKV_AVX512_FN inline __m256i UnpackQ4_0(const uint8_t* qs) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(b, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
  return _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8));
}

TIERKV_AVX512_FN float DotQ4_0Avx512(const void* row, const void* act, int64_t n) {
  const auto* w = static_cast<const BlockQ4_0*>(row);
  const auto* x = static_cast<const BlockQ8_0*>(act);
  const int64_t nb = n / kQk0;
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    const __m512i p = DotI8x64(Join(UnpackQ4_0(w[i].qs), UnpackQ4_0(w[i + 1].qs)),
                               Join(LoadU256(x[i].qs), LoadU256(x[i + 1].qs)));
    const __m512 d = Scales2(F16ToF32(w[i].d) * F16ToF32(x[i].d), F16ToF32(w[i + 1].d) * F16ToF32(x[i + 1].d));
    acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc);
  }
  __m256 acc8 = _mm256_setzero_ps();
  for (; i < nb; ++i) {
    const __m256i p = DotI8x32(UnpackQ4_0(w[i].qs), LoadU256(x[i].qs));
    acc8 = _mm256_fmadd_ps(_mm256_set1_ps(F16ToF32(w[i].d) * F16ToF32(x[i].d)), _mm256_cvtepi32_ps(p), acc8);
  }
  return HsumPs512(acc) + HsumPs256(acc8);
}

#undef TIERKV_AVX512_FN

}  // namespace

namespace quant_internal {
DotFn Avx512Dot(WeightType weight) {
  switch (weight) {
    case WeightType::kF32: return DotF32Avx512;
    case WeightType::kF16: return DotF16Avx512;
    case WeightType::kBF16: return DotBf16Avx512;
    case WeightType::kQ8_0: return DotQ8_0Avx512;
    case WeightType::kQ4_0: return DotQ4_0Avx512;
    default: return nullptr;  // K-quants: the AVX2 kernels
  }
}
}  // namespace quant_internal

}  // namespace tierkv::kernels

#else  // not x86

namespace tierkv::kernels::quant_internal {
DotFn Avx512Dot(WeightType) { return nullptr; }
}  // namespace tierkv::kernels::quant_internal

#endif
