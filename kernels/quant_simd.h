// kernels/quant_simd.h
//
// x86 helpers shared by the AVX2 and the AVX-512 quantized kernels (quant_avx2.cc,
// quant_avx512.cc); internal, include from those files only. Each function carries the
// AVX2 target attribute, so AVX2 and AVX-512 callers alike may inline it, and no caller
// without it can.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/quant.h"

namespace tierkv::kernels::simd {

// The 16 signed group scales of a Q3_K super-block (6-bit code - 32), as int16 in group
// order. Code g: low 4 bits in nibble g / 8 of scales[g % 8], high 2 bits at bit
// 2 (g / 4) of scales[8 + g % 4] (byte g of the replicated word, shifted per 32-bit
// lane); equal to ScaleQ3K(scales, g) - 32.
__attribute__((target("avx2"))) inline __m256i ScalesQ3K(const uint8_t* scales) {
  const __m128i mask4 = _mm_set1_epi8(0x0f);
  const __m128i s8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales));
  const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(s8, mask4), _mm_and_si128(_mm_srli_epi16(s8, 4), mask4));
  uint32_t h32;
  std::memcpy(&h32, scales + 8, 4);
  const __m128i shifted = _mm_srlv_epi32(_mm_set1_epi32(static_cast<int>(h32)), _mm_setr_epi32(0, 2, 4, 6));
  const __m128i hi = _mm_and_si128(shifted, _mm_set1_epi8(3));
  return _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_or_si128(lo, _mm_slli_epi16(hi, 4))), _mm256_set1_epi16(32));
}

// Q6_K's -32 offset per ggml lane L (values 4L .. 4L + 3 of every 32-value chunk):
// 32 * (sc[2L] bsums[2L] + sc[2L + 1] bsums[2L + 1]), from the 16 group scales as int16
// and the activation's 16 group sums.
__attribute__((target("avx2"))) inline __m256i Q6KOffsetLanes(__m256i sc16, __m256i bsums) {
  return _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsums), 5);
}

// The 8 float lanes of a Q5_K / Q6_K dot product summed as ggml's hsum_float_8 sums them
// (kernels::HsumLanes8, from a register).
__attribute__((target("avx2"))) inline float HsumLanes8(__m256 v) {
  alignas(32) float a[8];
  _mm256_store_ps(a, v);
  return kernels::HsumLanes8(a);
}

}  // namespace tierkv::kernels::simd

#endif
