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
#include "memory/prefetch.h"

namespace tierkv::kernels::simd {

// Long rows (kLongRowBytes and more), in the AVX2 and AVX-512 multi-row kernels alike
// (no target attribute needed: prefetches only): a kernel that reads R rows side by
// side, block by block, asks for the same blocks of the next R rows (group_bytes = R *
// row_bytes ahead) into L2, so that the next group is in L2 by the time it starts, and
// for its own rows' blocks kRowAheadBytes ahead into L1 (docs/decisions/
// 2026-12-04-prefetch-next-row-group.md). The L1 prefetch alone leaves the first KiB of
// every row of every group to demand misses, and one thread read Q4_K or Q6_K from memory at a third of a
// plain read's speed. With the group ahead, on a Zen 5 (docs/benchmarks.md, "Matrix-vector
// kernels"), Q6_K 32768 x 4096 from memory 4876 -> 3820 us on one thread and 2516 ->
// 1940 on two; in cache as before (the L1 half: with the L2 half alone, Q6_K in L2 was
// 10 - 15% slower).
constexpr size_t kRowAheadBytes = 512;
inline void PrefetchRowsAhead(const void* p, size_t group_bytes, size_t bytes) {
  PrefetchLinesL2(static_cast<const char*>(p) + group_bytes, bytes);
  PrefetchLines(static_cast<const char*>(p) + kRowAheadBytes, bytes);
}

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

// HsumLanes8 of 8 rows at once, row r's sum in lane r: the same adds ((L, L + 4), then
// (0, 2) and (1, 3), then the two), as a transpose across the rows' registers instead of
// a store and reloads per row. The multi-row kernels' horizontal sums (a short row, such
// as a 256-wide output projection's, spent as long on them as on its blocks).
__attribute__((target("avx2"))) inline __m256 RowPairLanes4(__m256 x, __m256 y) {  // [x | y]: lanes L + (L + 4)
  return _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x20), _mm256_permute2f128_ps(x, y, 0x31));
}
__attribute__((target("avx2"))) inline __m256 HsumLanesRows8(const __m256 lanes[8]) {
  // Element by element, so that an unrolled caller's lanes[] need not live in memory.
  const __m256 b[4] = {RowPairLanes4(lanes[0], lanes[1]), RowPairLanes4(lanes[2], lanes[3]),
                       RowPairLanes4(lanes[4], lanes[5]), RowPairLanes4(lanes[6], lanes[7])};
  __m256 c[2];
  for (int i = 0; i < 2; ++i) {  // per 128-bit lane [row p: b0 + b2, b1 + b3, row p + 2: ...]
    const __m256 x = b[2 * i], y = b[2 * i + 1];
    c[i] = _mm256_add_ps(_mm256_shuffle_ps(x, y, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // [rows 0 2 4 6 | 1 3 5 7], then in row order.
  const __m256 s = _mm256_add_ps(_mm256_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm256_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm256_permutevar8x32_ps(s, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

}  // namespace tierkv::kernels::simd

#endif
