// kernels/attention_sums.cc
#include "kernels/attention_sums.h"

#include <algorithm>
#include <bit>
#include <cassert>

#include "kernels/cpu_features.h"
#include "kernels/fp16.h"
#include "memory/prefetch.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
// GCC 12's AVX-512 intrinsics fill "don't care" lanes with _mm512_undefined_*(), which it
// then reports as uninitialised where they are inlined (as in kernels/quant_avx512.cc).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define TIERKV_SUMS_X86 1
#endif

namespace tierkv::kernels {
namespace {

// _mm512_reduce_add_ps of 16 lanes: halves, quarters, then (0 + 2) + (1 + 3).
float Reduce16(const float* v) {
  float a[8], b[4];
  for (int l = 0; l < 8; ++l) a[l] = v[l] + v[l + 8];
  for (int l = 0; l < 4; ++l) b[l] = a[l] + a[l + 4];
  return (b[0] + b[2]) + (b[1] + b[3]);
}

float KeyAt(const uint16_t* k, bool tiled, size_t hd, size_t t, size_t d) {
  return F16ToF32(tiled ? k[(t / 16) * 16 * hd + d * 16 + t % 16] : k[t * hd + d]);
}

void OneTokenScoresScalar(const float* q, int heads, size_t hd, const uint16_t* k, bool tiled, size_t n,
                          float* scores, size_t stride) {
  const size_t np = hd / 64 * 64;
  for (size_t t = 0; t < n; ++t) {
    for (int h = 0; h < heads; ++h) {
      const float* qh = q + static_cast<size_t>(h) * hd;
      float acc[4][16] = {};
      for (size_t i = 0; i < np; i += 64) {
        for (int j = 0; j < 4; ++j) {
          for (int l = 0; l < 16; ++l) {
            const size_t x = i + 16 * static_cast<size_t>(j) + static_cast<size_t>(l);
            acc[j][l] = __builtin_fmaf(qh[x], KeyAt(k, tiled, hd, t, x), acc[j][l]);
          }
        }
      }
      float v[16];
      for (int l = 0; l < 16; ++l) v[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
      double s = Reduce16(v);
      for (size_t x = np; x < hd; ++x) s += static_cast<double>(qh[x] * KeyAt(k, tiled, hd, t, x));
      scores[static_cast<size_t>(h) * stride + t] = static_cast<float>(s);
    }
  }
}

void AccumulateResiduesScalar(const float* w, size_t w_stride, int heads, size_t hd, const uint16_t* v, size_t n,
                              int64_t first, int residues, float* part, size_t part_stride) {
  for (size_t t = 0; t < n; ++t) {
    const int64_t j = first + static_cast<int64_t>(t);
    const bool start = j < residues;
    const size_t r = static_cast<size_t>(j % residues);
    for (int h = 0; h < heads; ++h) {
      const float wj = w[static_cast<size_t>(h) * w_stride + static_cast<size_t>(j)];
      float* p = part + static_cast<size_t>(h) * part_stride + r * hd;
      for (size_t d = 0; d < hd; ++d) p[d] = __builtin_fmaf(wj, F16ToF32(v[t * hd + d]), start ? 0.0f : p[d]);
    }
  }
}

#if defined(TIERKV_SUMS_X86)
#define TIERKV_SUMS_AVX512 __attribute__((target("avx512f,avx512dq,avx2,fma,f16c")))

TIERKV_SUMS_AVX512 inline __m512 Row16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// A tile's 16 keys as lanes, one head: the 64-dimension steps' lanes and their tree
// (REQUIRES hd >= 64), the scalar form's operations lane by lane.
TIERKV_SUMS_AVX512 __m512 OneTokenTileTree(const float* q, size_t np, const uint16_t* tile) {
  __m512 v[16];
  for (int l = 0; l < 16; ++l) {
    __m512 t[4];
    for (int j = 0; j < 4; ++j) {
      const size_t x = 16 * static_cast<size_t>(j) + static_cast<size_t>(l);
      t[j] = _mm512_fmadd_ps(_mm512_set1_ps(q[x]), Row16(tile + x * 16), _mm512_setzero_ps());
      for (size_t i = 64; i < np; i += 64) {
        t[j] = _mm512_fmadd_ps(_mm512_set1_ps(q[i + x]), Row16(tile + (i + x) * 16), t[j]);
      }
    }
    v[l] = _mm512_add_ps(_mm512_add_ps(t[0], t[2]), _mm512_add_ps(t[1], t[3]));
  }
  __m512 a[8], b[4];
  for (int l = 0; l < 8; ++l) a[l] = _mm512_add_ps(v[l], v[l + 8]);
  for (int l = 0; l < 4; ++l) b[l] = _mm512_add_ps(a[l], a[l + 4]);
  return _mm512_add_ps(_mm512_add_ps(b[0], b[2]), _mm512_add_ps(b[1], b[3]));
}

// Up to kTailHeads heads of one tile: the dimensions [np, hd) added to start[h] in
// double. The products of f16 values are exact, so fma in double rounds as the scalar
// form's add of the product does; the tile's dimension rows are converted once for all
// the heads.
constexpr int kTailHeads = 4;
TIERKV_SUMS_AVX512 void OneTokenTileTail(const float* q, size_t hd, size_t np, int heads, const uint16_t* tile,
                                         const __m512* start, __m512* out) {
  __m512d lo[kTailHeads], hi[kTailHeads];
  for (int h = 0; h < heads; ++h) {
    lo[h] = _mm512_cvtps_pd(_mm512_castps512_ps256(start[h]));
    hi[h] = _mm512_cvtps_pd(_mm512_extractf32x8_ps(start[h], 1));
  }
  for (size_t x = np; x < hd; ++x) {
    const __m512 k = Row16(tile + x * 16);
    const __m512d klo = _mm512_cvtps_pd(_mm512_castps512_ps256(k)), khi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(k, 1));
    for (int h = 0; h < heads; ++h) {
      const __m512d qx = _mm512_set1_pd(static_cast<double>(q[static_cast<size_t>(h) * hd + x]));
      lo[h] = _mm512_fmadd_pd(qx, klo, lo[h]);
      hi[h] = _mm512_fmadd_pd(qx, khi, hi[h]);
    }
  }
  for (int h = 0; h < heads; ++h) {
    out[h] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(lo[h])), _mm512_cvtpd_ps(hi[h]), 1);
  }
}

TIERKV_SUMS_AVX512 void OneTokenScoresTiledAvx512(const float* q, int heads, size_t hd, const uint16_t* k, size_t n,
                                                  float* scores, size_t stride) {
  const size_t np = hd / 64 * 64;
  for (size_t t0 = 0; t0 < n; t0 += 16) {
    const uint16_t* tile = k + t0 * hd;
    const __mmask16 keep = n - t0 >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << (n - t0)) - 1);
    for (int h0 = 0; h0 < heads; h0 += kTailHeads) {
      const int hn = std::min(kTailHeads, heads - h0);
      __m512 s[kTailHeads];
      for (int h = 0; h < hn; ++h) {
        s[h] = np > 0 ? OneTokenTileTree(q + static_cast<size_t>(h0 + h) * hd, np, tile) : _mm512_setzero_ps();
      }
      if (np < hd) OneTokenTileTail(q + static_cast<size_t>(h0) * hd, hd, np, hn, tile, s, s);
      for (int h = 0; h < hn; ++h) {
        _mm512_mask_storeu_ps(scores + static_cast<size_t>(h0 + h) * stride + t0, keep, s[h]);
      }
    }
  }
}

// The value vectors stream from memory; the hardware prefetchers alone left the loop
// waiting on them (as the codec's own value kernels found: they prefetch 4 KiB ahead).
constexpr size_t kValuePrefetchBytes = 4096;

// Key by key (in sequence order), each into its residue's sums, which stay in L1
// (residues x head_dim floats a head). (A residue-by-residue loop that kept each sum in a
// register over the block's keys measured slower: its keys are `residues` vectors apart.)
TIERKV_SUMS_AVX512 void AccumulateResiduesAvx512(const float* w, size_t w_stride, int heads, size_t hd,
                                                 const uint16_t* v, size_t n, int64_t first, int residues, float* part,
                                                 size_t part_stride) {
  const size_t mask = static_cast<size_t>(residues) - 1;  // residues is a power of two
  for (size_t t = 0; t < n; ++t) {
    const size_t j = static_cast<size_t>(first) + t;
    const bool start = j < static_cast<size_t>(residues);
    const size_t off = (j & mask) * hd;
    const uint16_t* vt = v + t * hd;
    PrefetchLines(vt + kValuePrefetchBytes / 2, hd * 2);
    for (size_t d = 0; d < hd; d += 16) {
      const __m512 x = Row16(vt + d);
      for (int h = 0; h < heads; ++h) {
        float* p = part + static_cast<size_t>(h) * part_stride + off + d;
        const __m512 acc = start ? _mm512_setzero_ps() : _mm512_loadu_ps(p);
        _mm512_storeu_ps(p, _mm512_fmadd_ps(_mm512_set1_ps(w[static_cast<size_t>(h) * w_stride + j]), x, acc));
      }
    }
  }
}

// The AVX2 forms: each 16-lane vector of the AVX-512 forms as two 8-lane halves, every
// lane through the same operations in the same order, so the same bits.
#define TIERKV_SUMS_AVX2 __attribute__((target("avx2,fma,f16c")))

TIERKV_SUMS_AVX2 inline __m256 Row8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Eight lanes of OneTokenTileTree (`half`: the tile's keys 0 - 7 or 8 - 15, converted to
// f32 once for all the heads, as [hd][16]): one 64-dimension lane group's four chains,
// combined as (0 + 2) + (1 + 3).
TIERKV_SUMS_AVX2 inline __m256 OneTokenLaneAvx2(const float* q, size_t np, const float* half, int l) {
  __m256 t[4];
  for (int j = 0; j < 4; ++j) {
    const size_t x = 16 * static_cast<size_t>(j) + static_cast<size_t>(l);
    t[j] = _mm256_fmadd_ps(_mm256_set1_ps(q[x]), _mm256_loadu_ps(half + x * 16), _mm256_setzero_ps());
    for (size_t i = 64; i < np; i += 64) {
      t[j] = _mm256_fmadd_ps(_mm256_set1_ps(q[i + x]), _mm256_loadu_ps(half + (i + x) * 16), t[j]);
    }
  }
  return _mm256_add_ps(_mm256_add_ps(t[0], t[2]), _mm256_add_ps(t[1], t[3]));
}

// OneTokenTileTree on eight of the tile's keys: v[l] + v[l + 8] formed pair by pair, so
// eight sums are live rather than sixteen.
TIERKV_SUMS_AVX2 __m256 OneTokenTileTreeAvx2(const float* q, size_t np, const float* half) {
  __m256 a[8], b[4];
  for (int l = 0; l < 8; ++l) a[l] = _mm256_add_ps(OneTokenLaneAvx2(q, np, half, l), OneTokenLaneAvx2(q, np, half, l + 8));
  for (int l = 0; l < 4; ++l) b[l] = _mm256_add_ps(a[l], a[l + 4]);
  return _mm256_add_ps(_mm256_add_ps(b[0], b[2]), _mm256_add_ps(b[1], b[3]));
}

// OneTokenTileTail on NH halves of a tile (keys: the first half's eight keys in the f32
// tile) for H heads: [np, hd) added to s[half][h] in double. Each head and four keys is
// one chain of dependent FMAs, so one or two heads take both halves at once (eight chains
// rather than four: the chains' latency, not the FMA pipes, bounded them).
template <int H, int NH>
TIERKV_SUMS_AVX2 void OneTokenTileTailAvx2(const float* q, size_t hd, size_t np, const float* keys,
                                          __m256 (*s)[kTailHeads]) {
  __m256d acc[H][2 * NH];
  for (int h = 0; h < H; ++h) {
    for (int b = 0; b < NH; ++b) {
      acc[h][2 * b] = _mm256_cvtps_pd(_mm256_castps256_ps128(s[b][h]));
      acc[h][2 * b + 1] = _mm256_cvtps_pd(_mm256_extractf128_ps(s[b][h], 1));
    }
  }
  for (size_t x = np; x < hd; ++x) {
    __m256d kq[2 * NH];
    for (int b = 0; b < NH; ++b) {
      const __m256 k = _mm256_loadu_ps(keys + x * 16 + 8 * static_cast<size_t>(b));
      kq[2 * b] = _mm256_cvtps_pd(_mm256_castps256_ps128(k));
      kq[2 * b + 1] = _mm256_cvtps_pd(_mm256_extractf128_ps(k, 1));
    }
    for (int h = 0; h < H; ++h) {
      const __m256d qx = _mm256_set1_pd(static_cast<double>(q[static_cast<size_t>(h) * hd + x]));
      for (int c = 0; c < 2 * NH; ++c) acc[h][c] = _mm256_fmadd_pd(qx, kq[c], acc[h][c]);
    }
  }
  for (int h = 0; h < H; ++h) {
    for (int b = 0; b < NH; ++b) {
      s[b][h] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm256_cvtpd_ps(acc[h][2 * b])),
                                     _mm256_cvtpd_ps(acc[h][2 * b + 1]), 1);
    }
  }
}

// The tail of hn heads (1 .. kTailHeads) over the tile's first `halves` halves.
TIERKV_SUMS_AVX2 void OneTokenTailAvx2(const float* q, size_t hd, size_t np, int hn, const float* tile, size_t halves,
                                      __m256 (*s)[kTailHeads]) {
  static_assert(kTailHeads == 4, "one case per head count");
  if (halves == 2 && hn <= 2) {
    if (hn == 2) return OneTokenTileTailAvx2<2, 2>(q, hd, np, tile, s);
    return OneTokenTileTailAvx2<1, 2>(q, hd, np, tile, s);
  }
  for (size_t b = 0; b < halves; ++b) {
    switch (hn) {
      case 4: OneTokenTileTailAvx2<4, 1>(q, hd, np, tile + b * 8, s + b); break;
      case 3: OneTokenTileTailAvx2<3, 1>(q, hd, np, tile + b * 8, s + b); break;
      case 2: OneTokenTileTailAvx2<2, 1>(q, hd, np, tile + b * 8, s + b); break;
      default: OneTokenTileTailAvx2<1, 1>(q, hd, np, tile + b * 8, s + b); break;
    }
  }
}

// The head_dim up to which OneTokenScoresTiledAvx2 takes a tile on its stack (16 KiB);
// a larger one goes the portable way.
constexpr size_t kMaxAvx2TileDim = 256;

TIERKV_SUMS_AVX2 void OneTokenScoresTiledAvx2(const float* q, int heads, size_t hd, const uint16_t* k, size_t n,
                                              float* scores, size_t stride) {
  const size_t np = hd / 64 * 64;
  alignas(32) float tile[kMaxAvx2TileDim * 16];  // one tile in f32, converted once for all heads
  for (size_t t0 = 0; t0 < n; t0 += 16) {
    for (size_t i = 0; i < hd * 16; i += 8) _mm256_store_ps(tile + i, Row8(k + t0 * hd + i));
    const size_t keep = std::min<size_t>(16, n - t0);
    const size_t halves = keep > 8 ? 2 : 1;
    for (int h0 = 0; h0 < heads; h0 += kTailHeads) {
      const int hn = std::min(kTailHeads, heads - h0);
      __m256 s[2][kTailHeads];
      for (size_t half = 0; half < halves; ++half) {
        for (int h = 0; h < hn; ++h) {
          s[half][h] = np > 0 ? OneTokenTileTreeAvx2(q + static_cast<size_t>(h0 + h) * hd, np, tile + half * 8)
                              : _mm256_setzero_ps();
        }
      }
      if (np < hd) OneTokenTailAvx2(q + static_cast<size_t>(h0) * hd, hd, np, hn, tile, halves, s);
      for (size_t half = 0; half < halves; ++half) {
        const size_t lanes = std::min<size_t>(8, keep - half * 8);
        for (int h = 0; h < hn; ++h) {
          float* dst = scores + static_cast<size_t>(h0 + h) * stride + t0 + half * 8;
          if (lanes == 8) {
            _mm256_storeu_ps(dst, s[half][h]);
          } else {
            alignas(32) float tmp[8];
            _mm256_store_ps(tmp, s[half][h]);
            std::copy(tmp, tmp + lanes, dst);
          }
        }
      }
    }
  }
}

// The residue sums the AVX2 loop keeps in L1 at once (heads x residues x head_dim
// floats). Past it, e.g. eight query heads a KV head at head_dim 128 (256 KiB), the keys
// go in passes, each over two heads and as many residues as fit, converting V again per
// pass. Within a pass a residue takes up to kRounds of its keys (`residues` apart) per
// load and store of its sums: their FMAs in sequence order, as one at a time would.
// Each residue takes its keys in sequence order, so the bits are the same in any grouping.
constexpr size_t kResidueL1Bytes = 16 * 1024;
constexpr size_t kRounds = 4;  // AccumulateResidueGroupAvx2 instantiates 1 .. 4

// K keys of one residue (`residues` apart; vt: the first one's V, wj: its weight in head
// h0's row) into that residue's sums pr of heads [h0, h0 + hn).
template <size_t K>
TIERKV_SUMS_AVX2 inline void AccumulateRoundsAvx2(const float* wj, size_t w_stride, size_t h0, size_t hn, size_t hd,
                                                  const uint16_t* vt, size_t residues, bool start, float* pr,
                                                  size_t part_stride) {
  for (size_t d = 0; d < hd; d += 8) {
    __m256 x[K];
    for (size_t k = 0; k < K; ++k) x[k] = Row8(vt + k * residues * hd + d);
    for (size_t h = h0; h < h0 + hn; ++h) {
      float* p = pr + h * part_stride + d;
      const float* wh = wj + h * w_stride;
      __m256 acc = start ? _mm256_setzero_ps() : _mm256_loadu_ps(p);
      for (size_t k = 0; k < K; ++k) acc = _mm256_fmadd_ps(_mm256_set1_ps(wh[k * residues]), x[k], acc);
      _mm256_storeu_ps(p, acc);
    }
  }
}

// Keys t < n whose residue (first + t) % residues lies in [r0, r0 + rg), into heads
// [h0, h0 + hn).
TIERKV_SUMS_AVX2 void AccumulateResidueGroupAvx2(const float* w, size_t w_stride, size_t h0, size_t hn, size_t hd,
                                                 const uint16_t* v, size_t n, size_t first, size_t residues,
                                                 size_t r0, size_t rg, float* part, size_t part_stride) {
  const size_t mask = residues - 1;  // residues is a power of two
  const int shift = std::countr_zero(residues);
  for (size_t round = 0;; round += kRounds) {
    bool any = false;
    for (size_t r = r0; r < r0 + rg; ++r) {
      const size_t t = ((r - first) & mask) + round * residues;  // the residue's key of this round
      if (t >= n) continue;
      any = true;
      const size_t j = first + t;
      const uint16_t* vt = v + t * hd;
      PrefetchLines(vt + kRounds * residues * hd, hd * 2);  // this residue's next rounds
      const bool start = j < residues;
      const float* wj = w + j;
      float* pr = part + r * hd;
      switch (std::min(kRounds, ((n - t - 1) >> shift) + 1)) {  // keys of this residue left, at most kRounds
        case 4: AccumulateRoundsAvx2<4>(wj, w_stride, h0, hn, hd, vt, residues, start, pr, part_stride); break;
        case 3: AccumulateRoundsAvx2<3>(wj, w_stride, h0, hn, hd, vt, residues, start, pr, part_stride); break;
        case 2: AccumulateRoundsAvx2<2>(wj, w_stride, h0, hn, hd, vt, residues, start, pr, part_stride); break;
        default: AccumulateRoundsAvx2<1>(wj, w_stride, h0, hn, hd, vt, residues, start, pr, part_stride); break;
      }
    }
    if (!any) break;
  }
}

TIERKV_SUMS_AVX2 void AccumulateResiduesAvx2(const float* w, size_t w_stride, int heads, size_t hd, const uint16_t* v,
                                             size_t n, int64_t first, int residues, float* part, size_t part_stride) {
  const size_t nh = static_cast<size_t>(heads), nr = static_cast<size_t>(residues);
  size_t hg = nh, rg = nr;
  if (nh * nr * hd * sizeof(float) > kResidueL1Bytes) {
    hg = std::min<size_t>(nh, 2);
    while (rg > 8 && hg * rg * hd * sizeof(float) > kResidueL1Bytes) rg /= 2;
  }
  for (size_t h0 = 0; h0 < nh; h0 += hg) {
    for (size_t r0 = 0; r0 < nr; r0 += rg) {
      AccumulateResidueGroupAvx2(w, w_stride, h0, std::min(hg, nh - h0), hd, v, n, static_cast<size_t>(first), nr, r0,
                                 rg, part, part_stride);
    }
  }
}
#endif  // TIERKV_SUMS_X86

}  // namespace

void OneTokenScoresF16(const float* q, int heads, size_t hd, const uint16_t* k, bool tiled, size_t n,
                       float* scores, size_t stride) {
#if defined(TIERKV_SUMS_X86)
  if (tiled && ActiveSimdLevel() >= SimdLevel::kAvx512) {
    return OneTokenScoresTiledAvx512(q, heads, hd, k, n, scores, stride);
  }
  if (tiled && hd <= kMaxAvx2TileDim && ActiveSimdLevel() >= SimdLevel::kAvx2) {
    return OneTokenScoresTiledAvx2(q, heads, hd, k, n, scores, stride);
  }
#endif
  OneTokenScoresScalar(q, heads, hd, k, tiled, n, scores, stride);
}

void AccumulateResiduesF16(const float* w, size_t w_stride, int heads, size_t hd, const uint16_t* v, size_t n,
                           int64_t first, int residues, float* part, size_t part_stride) {
  assert(residues == 16 || residues == 64);
#if defined(TIERKV_SUMS_X86)
  if (hd % 16 == 0 && ActiveSimdLevel() >= SimdLevel::kAvx512) {
    return AccumulateResiduesAvx512(w, w_stride, heads, hd, v, n, first, residues, part, part_stride);
  }
  if (hd % 8 == 0 && ActiveSimdLevel() >= SimdLevel::kAvx2) {
    return AccumulateResiduesAvx2(w, w_stride, heads, hd, v, n, first, residues, part, part_stride);
  }
#endif
  AccumulateResiduesScalar(w, w_stride, heads, hd, v, n, first, residues, part, part_stride);
}

void ReduceResidues(const float* part, size_t hd, int residues, int64_t n_keys, float* out) {
  const int seen = static_cast<int>(std::min<int64_t>(n_keys, residues));
  for (size_t d = 0; d < hd; ++d) {
    auto at = [&](int r) { return r < seen ? part[static_cast<size_t>(r) * hd + d] : 0.0f; };
    float v[16];
    for (int l = 0; l < 16; ++l) v[l] = residues == 64 ? (at(l) + at(32 + l)) + (at(16 + l) + at(48 + l)) : at(l);
    out[d] = Reduce16(v);
  }
}

}  // namespace tierkv::kernels
