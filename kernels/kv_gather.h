// kernels/kv_gather.h
//
// Strided 32-bit gathers that the AVX-512 KV kernels share: the fp16 scale at the start
// of each of up to 16 records a fixed stride apart (q8_0 / q4_0 blocks in
// kernels/kv_quant_tiles.cc, tq headers in kvcache/codec_tq.cc), and the offsets such a
// gather takes. A record's 4 bytes from its start stay inside it (each scale is followed
// by at least 2 payload bytes).
//
// x86 only; the functions carry their own target attributes.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#define TIERKV_KV_GATHER_INLINE __attribute__((target("avx512f,avx2,fma,f16c"), always_inline)) inline

namespace tierkv::kernels::kv_gather {

// GCC 12's narrowing intrinsics start from _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports (as in kernels/kv_codec_simd.cc).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// Lane i's offset i * stride (in the gather's scale units; stride < 2^31 / 16).
TIERKV_KV_GATHER_INLINE __m512i StrideOffsets(size_t stride) {
  return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                            _mm512_set1_epi32(static_cast<int>(stride)));
}

// The 16-bit words at p + offsets[i] for the first m <= 16 lanes (lanes m.. zero): one
// 32-bit gather, narrowed.
TIERKV_KV_GATHER_INLINE __m256i GatherWords(const uint8_t* p, __m512i offsets, size_t m) {
  const __mmask16 live = m >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << m) - 1);
  return _mm512_cvtepi32_epi16(_mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, offsets, p, 1));
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace tierkv::kernels::kv_gather

#endif  // x86
