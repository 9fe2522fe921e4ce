// kernels/kv_quant_tiles.cc
//
// The q8_0 / q4_0 KV kernels of AVX-512 and AVX2 machines (declared in
// kernels/kv_codec_simd.h): integer scores over key tiles, and grouped value sums.
//
// Scores: one 64-byte load holds 4 payload bytes of each of a tile's 16 keys, so one
// vpdpbusd per query head adds 4 products into each key's lane: no horizontal sums, and
// a K byte is read once for all the query heads of its KV head. vpdpbusd multiplies an
// unsigned operand by a signed one; q8_0 keys are signed, so the query goes in as q + 128
// and 128 * sum(k) (one more vpdpbusd per group, shared by the heads) comes off; q4_0
// nibbles are unsigned (k + 8), so 8 * sum(q) (kept with the prepared query) comes off.
// The integer sums are exact; the float steps are the scalar definition's, lane by lane.
#include "kernels/kv_codec_simd.h"

#if defined(TIERKV_KV_SIMD_X86)

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/kv_gather.h"
#include "memory/half.h"

namespace tierkv::kernels::kv_simd {

#define TIERKV_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni,avx2,fma,f16c")))
#define TIERKV_AVX512F __attribute__((target("avx512f,avx2,fma,f16c")))
#define TIERKV_AVX2_TILES __attribute__((target("avx2,fma,f16c")))

namespace {

// GCC 12's AVX-512 intrinsics fill "don't care" lanes with _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports (as in kernels/quant_avx512.cc).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

inline int32_t LoadI32(const uint8_t* p) {
  int32_t x;
  std::memcpy(&x, p, 4);
  return x;
}
inline float LoadF32(const uint8_t* p) {
  float x;
  std::memcpy(&x, p, 4);
  return x;
}

inline __mmask16 KeepLanes(size_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1);
}

// kHeads prepared queries (q_stride bytes apart) over the tiles of n keys.
template <bool kQ8, int kHeads>
TIERKV_VNNI void DotTilesHeads(const uint8_t* qp, size_t q_stride, int nb, const uint8_t* k, size_t n, float* scores,
                               size_t stride) {
  constexpr int kBlockBytes = kQ8 ? kQ8TileBlockBytes : kQ4TileBlockBytes;
  const size_t tile_bytes = static_cast<size_t>(nb) * kBlockBytes;
  const __m512i ones = _mm512_set1_epi8(1);
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  for (size_t t0 = 0; t0 < n; t0 += kQTileLanes, k += tile_bytes) {
    __m512 s[kHeads];
    for (int h = 0; h < kHeads; ++h) s[h] = _mm512_setzero_ps();
    const uint8_t* blk = k;
    for (int b = 0; b < nb; ++b, blk += kBlockBytes) {
      const uint8_t* qb = qp + static_cast<size_t>(b) * kQPrepBlockBytes;
      __m512i a[kHeads];
      for (int h = 0; h < kHeads; ++h) a[h] = _mm512_setzero_si512();
      __m512i correction;
      if constexpr (kQ8) {
        __m512i sk = _mm512_setzero_si512();
        for (int g = 0; g < 8; ++g) {
          const __m512i kv = _mm512_loadu_si512(blk + kQTileScaleBytes + 64 * g);
          sk = _mm512_dpbusd_epi32(sk, ones, kv);
          for (int h = 0; h < kHeads; ++h) {
            const __m512i qv = _mm512_set1_epi32(LoadI32(qb + h * q_stride + kQPrepUint8 + 4 * g));
            a[h] = _mm512_dpbusd_epi32(a[h], qv, kv);
          }
        }
        correction = _mm512_slli_epi32(sk, 7);  // 128 * sum(k), the same for every head
      } else {
        for (int g = 0; g < 4; ++g) {
          const __m512i kv = _mm512_loadu_si512(blk + kQTileScaleBytes + 64 * g);
          const __m512i lo = _mm512_and_si512(kv, low4);                         // elements 4g..4g+3
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(kv, 4), low4);  // 16 + the same
          for (int h = 0; h < kHeads; ++h) {
            const uint8_t* qh = qb + h * q_stride + kQPrepInt8;
            a[h] = _mm512_dpbusd_epi32(a[h], lo, _mm512_set1_epi32(LoadI32(qh + 4 * g)));
            a[h] = _mm512_dpbusd_epi32(a[h], hi, _mm512_set1_epi32(LoadI32(qh + 16 + 4 * g)));
          }
        }
        correction = _mm512_setzero_si512();
      }
      const __m512 dk = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
      for (int h = 0; h < kHeads; ++h) {
        const uint8_t* qh = qb + h * q_stride;
        __m512i isum = _mm512_sub_epi32(a[h], correction);
        if constexpr (!kQ8) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(8 * LoadI32(qh + kQPrepSum)));
        const __m512 t = _mm512_mul_ps(dk, _mm512_set1_ps(LoadF32(qh + kQPrepScale)));
        s[h] = _mm512_fmadd_ps(t, _mm512_cvtepi32_ps(isum), s[h]);
      }
    }
    const __mmask16 keep = KeepLanes(n - t0);
    for (int h = 0; h < kHeads; ++h) _mm512_mask_storeu_ps(scores + h * stride + t0, keep, s[h]);
  }
}

// AVX2 (no VNNI needed): 8 keys per vector, each tile in two halves. vpmaddubsw takes an
// unsigned and a signed operand and sums pairs into int16, so q8_0 goes in as |k| and q
// with k's sign (|products| <= 127 * 127, two of them fit int16), q4_0 as its unsigned
// nibbles and q (15 * 127 * 2); vpmaddwd by ones then sums pairs of those into int32.
template <bool kQ8, int kHeads>
TIERKV_AVX2_TILES void DotTilesHeadsAvx2(const uint8_t* qp, size_t q_stride, int nb, const uint8_t* k, size_t n,
                                         float* scores, size_t stride) {
  constexpr int kBlockBytes = kQ8 ? kQ8TileBlockBytes : kQ4TileBlockBytes;
  const size_t tile_bytes = static_cast<size_t>(nb) * kBlockBytes;
  const __m256i ones16 = _mm256_set1_epi16(1);
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  for (size_t t0 = 0; t0 < n; t0 += kQTileLanes, k += tile_bytes) {
    for (int half = 0; half < 2 && t0 + 8 * half < n; ++half) {
      __m256 s[kHeads];
      for (int h = 0; h < kHeads; ++h) s[h] = _mm256_setzero_ps();
      const uint8_t* blk = k;
      for (int b = 0; b < nb; ++b, blk += kBlockBytes) {
        const uint8_t* qb = qp + static_cast<size_t>(b) * kQPrepBlockBytes;
        __m256i a[kHeads];
        for (int h = 0; h < kHeads; ++h) a[h] = _mm256_setzero_si256();
        for (int g = 0; g < (kQ8 ? 8 : 4); ++g) {
          const __m256i kv =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQTileScaleBytes + 64 * g + 32 * half));
          if constexpr (kQ8) {
            const __m256i abs_k = _mm256_abs_epi8(kv);
            for (int h = 0; h < kHeads; ++h) {
              const __m256i qv = _mm256_set1_epi32(LoadI32(qb + h * q_stride + kQPrepInt8 + 4 * g));
              const __m256i p = _mm256_maddubs_epi16(abs_k, _mm256_sign_epi8(qv, kv));
              a[h] = _mm256_add_epi32(a[h], _mm256_madd_epi16(p, ones16));
            }
          } else {
            const __m256i lo = _mm256_and_si256(kv, low4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(kv, 4), low4);
            for (int h = 0; h < kHeads; ++h) {
              const uint8_t* qh = qb + h * q_stride + kQPrepInt8;
              const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(LoadI32(qh + 4 * g))),
                                                 _mm256_maddubs_epi16(hi, _mm256_set1_epi32(LoadI32(qh + 16 + 4 * g))));
              a[h] = _mm256_add_epi32(a[h], _mm256_madd_epi16(p, ones16));
            }
          }
        }
        const __m256 dk = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * half)));
        for (int h = 0; h < kHeads; ++h) {
          const uint8_t* qh = qb + h * q_stride;
          __m256i isum = a[h];
          if constexpr (!kQ8) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(8 * LoadI32(qh + kQPrepSum)));
          const __m256 t = _mm256_mul_ps(dk, _mm256_set1_ps(LoadF32(qh + kQPrepScale)));
          s[h] = _mm256_fmadd_ps(t, _mm256_cvtepi32_ps(isum), s[h]);
        }
      }
      const size_t left = n - t0 - 8 * half;
      for (int h = 0; h < kHeads; ++h) {
        float* row = scores + h * stride + t0 + 8 * half;
        if (left >= 8) {
          _mm256_storeu_ps(row, s[h]);
        } else {
          alignas(32) float lanes[8];
          _mm256_store_ps(lanes, s[h]);
          std::memcpy(row, lanes, left * sizeof(float));
        }
      }
    }
  }
}

// The tiled scores of `heads` prepared queries, in chunks of as many heads as the
// level's registers hold (AVX-512: 2 x 8 accumulators of 32; AVX2: 2 x 4 of 16), each
// chunk by the instantiation for its head count.
template <bool kQ8, bool kAvx512, int kHeads>
void DotTilesDispatch(int heads, const uint8_t* qp, size_t q_stride, int nb, const uint8_t* k, size_t n,
                      float* scores, size_t stride) {
  if constexpr (kHeads > 1) {
    if (heads < kHeads) {
      return DotTilesDispatch<kQ8, kAvx512, kHeads - 1>(heads, qp, q_stride, nb, k, n, scores, stride);
    }
  }
  if constexpr (kAvx512) {
    DotTilesHeads<kQ8, kHeads>(qp, q_stride, nb, k, n, scores, stride);
  } else {
    DotTilesHeadsAvx2<kQ8, kHeads>(qp, q_stride, nb, k, n, scores, stride);
  }
}

template <bool kQ8, bool kAvx512>
void DotTiles(const float* q_prep, int heads, int nb, const uint8_t* k, size_t n, float* scores, size_t stride) {
  constexpr int kMaxHeads = kAvx512 ? 8 : 4;
  const size_t q_stride = static_cast<size_t>(nb) * kQPrepBlockBytes;
  const auto* qp = reinterpret_cast<const uint8_t*>(q_prep);
  for (int h0 = 0; h0 < heads; h0 += kMaxHeads) {
    DotTilesDispatch<kQ8, kAvx512, kMaxHeads>(std::min(kMaxHeads, heads - h0), qp + h0 * q_stride, q_stride, nb, k,
                                              n, scores + h0 * stride, stride);
  }
}

// AVX2 value sums: one block (4 x 8 lanes) of kHeads heads in registers at a time.
template <bool kQ8>
TIERKV_AVX2_TILES inline void LoadBlockValuesAvx2(const uint8_t* payload, __m256* x) {
  if constexpr (kQ8) {
    for (int i = 0; i < 4; ++i) {
      x[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(payload + 8 * i))));
    }
  } else {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(payload));
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m128i eight = _mm_set1_epi8(8);
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(bytes, mask), eight);                      // 0..15
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask), eight);  // 16..31
    x[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    x[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    x[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    x[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
  }
}

template <bool kQ8, int kHeads>
TIERKV_AVX2_TILES void AccumulateBlockAvx2(const float* w, size_t w_stride, const uint8_t* v, size_t n, size_t vb,
                                           float* acc, size_t hd) {
  __m256 a[kHeads][4];
  for (int h = 0; h < kHeads; ++h) {
    for (int i = 0; i < 4; ++i) a[h][i] = _mm256_loadu_ps(acc + h * hd + 8 * i);
  }
  for (size_t j = 0; j < n; ++j) {
    const uint8_t* blk = v + j * vb;
    const float d = LoadHalf(blk);
    __m256 x[4];
    LoadBlockValuesAvx2<kQ8>(blk + 2, x);
    for (int h = 0; h < kHeads; ++h) {
      const __m256 wd = _mm256_set1_ps(w[h * w_stride + j] * d);
      for (int i = 0; i < 4; ++i) a[h][i] = _mm256_fmadd_ps(wd, x[i], a[h][i]);
    }
  }
  for (int h = 0; h < kHeads; ++h) {
    for (int i = 0; i < 4; ++i) _mm256_storeu_ps(acc + h * hd + 8 * i, a[h][i]);
  }
}

template <bool kQ8>
void AccumulateGroupAvx2(const float* w, size_t w_stride, int heads, const uint8_t* v, size_t n, size_t vb, int nb,
                         float* acc) {
  constexpr int kBlockBytes = kQ8 ? kQ8Bytes : kQ4Bytes;
  const size_t hd = static_cast<size_t>(nb) * kQBlock;
  for (int b = 0; b < nb; ++b) {
    const uint8_t* vb0 = v + static_cast<size_t>(b) * kBlockBytes;
    float* ab0 = acc + static_cast<size_t>(b) * kQBlock;
    int h0 = 0;
    for (; h0 + 2 <= heads; h0 += 2) {
      AccumulateBlockAvx2<kQ8, 2>(w + h0 * w_stride, w_stride, vb0, n, vb, ab0 + h0 * hd, hd);
    }
    if (h0 < heads) AccumulateBlockAvx2<kQ8, 1>(w + h0 * w_stride, w_stride, vb0, n, vb, ab0 + h0 * hd, hd);
  }
}

// The 32 values of block c of a stored vector as two 16-lane vectors (elements 0-15,
// 16-31), unscaled: int8 for q8_0, nibble - 8 for q4_0.
template <bool kQ8>
TIERKV_AVX512F inline void LoadBlockValues(const uint8_t* payload, __m512* x0, __m512* x1) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(payload));
  if constexpr (kQ8) {
    const __m128i bytes1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(payload + 16));
    *x0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
    *x1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes1));
  } else {
    const __m512i u = _mm512_cvtepu8_epi32(bytes);
    const __m512i eight = _mm512_set1_epi32(8);
    *x0 = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(u, _mm512_set1_epi32(0x0f)), eight));
    *x1 = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(u, 4), eight));
  }
}

// AccumulateRuns' products w * d of keys [j0, j0 + 16) (those below n; the rest zero),
// the block scales gathered (`at`: the vectors' offsets, kv_gather::StrideOffsets(vb)).
template <bool kQ8, int kBlocks, int kHeads, int kRuns>
TIERKV_AVX512F inline void ScaleWeights(const float* w, size_t w_stride, const uint8_t* v, size_t run_stride, size_t n,
                                        size_t vb, __m512i at, size_t j0, float (*out)[kHeads][kBlocks][16]) {
  constexpr int kBlockBytes = kQ8 ? kQ8Bytes : kQ4Bytes;
  const size_t m = std::min<size_t>(16, n - j0);
  for (int r = 0; r < kRuns; ++r) {
    for (int c = 0; c < kBlocks; ++c) {
      const __m512 d = _mm512_cvtph_ps(kv_gather::GatherWords(v + r * run_stride + j0 * vb + c * kBlockBytes, at, m));
      for (int h = 0; h < kHeads; ++h) {
        const __m512 wv = _mm512_maskz_loadu_ps(KeepLanes(m), w + (r * kHeads + h) * w_stride + j0);
        _mm512_store_ps(out[r][h][c], _mm512_mul_ps(wv, d));
      }
    }
  }
}

// acc[h][32 * kBlocks] (rows hd floats apart) += w[h][j] * d_j * value j, j in key order,
// for kHeads heads of each of kRuns runs of vectors (run r at v + r * run_stride, its heads
// rows r * kHeads .. of w and acc; vectors vb bytes apart), kBlocks blocks a vector. Per 16
// keys the products w * d come first, as vectors (the scalar product's bits), so that the
// FMAs broadcast them from memory; two runs give twice the independent FMA chains of one.
template <bool kQ8, int kBlocks, int kHeads, int kRuns>
TIERKV_AVX512F void AccumulateRuns(const float* w, size_t w_stride, const uint8_t* v, size_t run_stride, size_t n,
                                   size_t vb, float* acc, size_t hd) {
  constexpr int kBlockBytes = kQ8 ? kQ8Bytes : kQ4Bytes;
  __m512 a[kRuns][kHeads][2 * kBlocks];
  for (int r = 0; r < kRuns; ++r) {
    for (int h = 0; h < kHeads; ++h) {
      for (int i = 0; i < 2 * kBlocks; ++i) a[r][h][i] = _mm512_loadu_ps(acc + (r * kHeads + h) * hd + 16 * i);
    }
  }
  // wd[b] holds the products of one chunk of 16 keys; the next chunk's are formed before
  // this chunk's FMAs, so the gather's latency hides behind them.
  alignas(64) float wd[2][kRuns][kHeads][kBlocks][16];
  const __m512i at = kv_gather::StrideOffsets(vb);
  if (n > 0) ScaleWeights<kQ8, kBlocks, kHeads, kRuns>(w, w_stride, v, run_stride, n, vb, at, 0, wd[0]);
  for (size_t j0 = 0, b = 0; j0 < n; j0 += 16, b ^= 1) {
    const size_t m = std::min<size_t>(16, n - j0);
    if (j0 + 16 < n) {
      ScaleWeights<kQ8, kBlocks, kHeads, kRuns>(w, w_stride, v, run_stride, n, vb, at, j0 + 16, wd[b ^ 1]);
    }
    for (size_t i = 0; i < m; ++i) {
      for (int r = 0; r < kRuns; ++r) {
        const uint8_t* vj = v + r * run_stride + (j0 + i) * vb;
        for (int c = 0; c < kBlocks; ++c) {
          __m512 x0, x1;
          LoadBlockValues<kQ8>(vj + c * kBlockBytes + 2, &x0, &x1);
          for (int h = 0; h < kHeads; ++h) {
            const __m512 wdv = _mm512_set1_ps(wd[b][r][h][c][i]);
            a[r][h][2 * c] = _mm512_fmadd_ps(wdv, x0, a[r][h][2 * c]);
            a[r][h][2 * c + 1] = _mm512_fmadd_ps(wdv, x1, a[r][h][2 * c + 1]);
          }
        }
      }
    }
  }
  for (int r = 0; r < kRuns; ++r) {
    for (int h = 0; h < kHeads; ++h) {
      for (int i = 0; i < 2 * kBlocks; ++i) _mm512_storeu_ps(acc + (r * kHeads + h) * hd + 16 * i, a[r][h][i]);
    }
  }
}

template <bool kQ8, int kBlocks, int kHeads>
void AccumulateDispatch(int heads, const float* w, size_t w_stride, const uint8_t* v, size_t n, size_t vb,
                        float* acc, size_t hd) {
  if constexpr (kHeads > 1) {
    if (heads < kHeads) return AccumulateDispatch<kQ8, kBlocks, kHeads - 1>(heads, w, w_stride, v, n, vb, acc, hd);
  }
  AccumulateRuns<kQ8, kBlocks, kHeads, 1>(w, w_stride, v, 0, n, vb, acc, hd);
}

// Up to 16 accumulators: heads x blocks in chunks of kBlocks blocks and 8 / kBlocks heads.
template <bool kQ8, int kBlocks>
void AccumulateBlocks(const float* w, size_t w_stride, int heads, const uint8_t* v, size_t n, size_t vb, float* acc,
                      size_t hd) {
  constexpr int kMaxHeads = 8 / kBlocks;
  for (int h0 = 0; h0 < heads; h0 += kMaxHeads) {
    AccumulateDispatch<kQ8, kBlocks, kMaxHeads>(std::min(kMaxHeads, heads - h0), w + h0 * w_stride, w_stride, v, n,
                                                vb, acc + h0 * hd, hd);
  }
}

template <bool kQ8>
void AccumulateGroup(const float* w, size_t w_stride, int heads, const uint8_t* v, size_t n, size_t vb, int nb,
                     float* acc) {
  constexpr int kBlockBytes = kQ8 ? kQ8Bytes : kQ4Bytes;
  const size_t hd = static_cast<size_t>(nb) * kQBlock;
  // Each pass over the keys converts the blocks it covers once for the heads it holds:
  // many heads take fewer blocks per pass (16 accumulators either way).
  const int max_blocks = heads <= 2 ? 4 : heads <= 4 ? 2 : 1;
  for (int b0 = 0; b0 < nb;) {
    const int left = std::min(nb - b0, max_blocks);
    const uint8_t* vb0 = v + static_cast<size_t>(b0) * kBlockBytes;
    float* ab0 = acc + static_cast<size_t>(b0) * kQBlock;
    if (left >= 4) {
      AccumulateBlocks<kQ8, 4>(w, w_stride, heads, vb0, n, vb, ab0, hd);
      b0 += 4;
    } else if (left >= 2) {
      AccumulateBlocks<kQ8, 2>(w, w_stride, heads, vb0, n, vb, ab0, hd);
      b0 += 2;
    } else {
      AccumulateBlocks<kQ8, 1>(w, w_stride, heads, vb0, n, vb, ab0, hd);
      b0 += 1;
    }
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace

bool AccumulatePairAvx512(bool q8, const float* w, size_t w_stride, int heads, const uint8_t* v, size_t run_stride,
                          size_t n, size_t vb, int nb, float* acc) {
  // Two runs' accumulators (2 x heads x 2 per block of 32) must fit 16 registers.
  const size_t hd = static_cast<size_t>(nb) * kQBlock;
  auto run = [&](auto blocks, auto heads_c) {
    constexpr int kB = decltype(blocks)::value, kH = decltype(heads_c)::value;
    if (q8) return AccumulateRuns<true, kB, kH, 2>(w, w_stride, v, run_stride, n, vb, acc, hd);
    AccumulateRuns<false, kB, kH, 2>(w, w_stride, v, run_stride, n, vb, acc, hd);
  };
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  using Four = std::integral_constant<int, 4>;
  if (nb == 1 && heads == 1) return run(One{}, One{}), true;
  if (nb == 1 && heads == 2) return run(One{}, Two{}), true;
  if (nb == 1 && heads == 4) return run(One{}, Four{}), true;
  if (nb == 2 && heads == 1) return run(Two{}, One{}), true;
  if (nb == 2 && heads == 2) return run(Two{}, Two{}), true;
  if (nb == 4 && heads == 1) return run(Four{}, One{}), true;
  return false;
}

void DotQ8TiledAvx512Vnni(const float* q_prep, int heads, int nb, const uint8_t* k, size_t n, float* scores,
                          size_t stride) {
  DotTiles<true, true>(q_prep, heads, nb, k, n, scores, stride);
}
void DotQ4TiledAvx512Vnni(const float* q_prep, int heads, int nb, const uint8_t* k, size_t n, float* scores,
                          size_t stride) {
  DotTiles<false, true>(q_prep, heads, nb, k, n, scores, stride);
}
void DotQ8TiledAvx2(const float* q_prep, int heads, int nb, const uint8_t* k, size_t n, float* scores,
                    size_t stride) {
  DotTiles<true, false>(q_prep, heads, nb, k, n, scores, stride);
}
void DotQ4TiledAvx2(const float* q_prep, int heads, int nb, const uint8_t* k, size_t n, float* scores,
                    size_t stride) {
  DotTiles<false, false>(q_prep, heads, nb, k, n, scores, stride);
}
void AccumulateQ8GroupAvx2(const float* w, size_t w_stride, int heads, const uint8_t* v, size_t n, size_t vb, int nb,
                           float* acc) {
  AccumulateGroupAvx2<true>(w, w_stride, heads, v, n, vb, nb, acc);
}
void AccumulateQ4GroupAvx2(const float* w, size_t w_stride, int heads, const uint8_t* v, size_t n, size_t vb, int nb,
                           float* acc) {
  AccumulateGroupAvx2<false>(w, w_stride, heads, v, n, vb, nb, acc);
}
void AccumulateQ8GroupAvx512(const float* w, size_t w_stride, int heads, const uint8_t* v, size_t n, size_t vb,
                             int nb, float* acc) {
  AccumulateGroup<true>(w, w_stride, heads, v, n, vb, nb, acc);
}
void AccumulateQ4GroupAvx512(const float* w, size_t w_stride, int heads, const uint8_t* v, size_t n, size_t vb,
                             int nb, float* acc) {
  AccumulateGroup<false>(w, w_stride, heads, v, n, vb, nb, acc);
}

}  // namespace tierkv::kernels::kv_simd

#endif  // TIERKV_KV_SIMD_X86
