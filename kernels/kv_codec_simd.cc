// kernels/kv_codec_simd.cc
//
// The SIMD kernels of the f16, q8_0 and q4_0 KV codecs (kernels/kv_codec_simd.h).
#include "kernels/kv_codec_simd.h"

#if defined(TIERKV_KV_SIMD_X86)

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/kv_dot_tree.h"
#include "kernels/kv_vector_kernels.h"
#include "memory/half.h"
#include "memory/prefetch.h"

namespace tierkv::kernels::kv_simd {

#define TIERKV_AVX2 TIERKV_KV_SIMD_AVX2

TIERKV_AVX2 inline float HorizontalSum(__m256 v) {
  // Same order as SumLanes8: (l0+l4, l1+l5, l2+l6, l3+l7), then pairs.
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));   // (l0+l4)+(l2+l6), (l1+l5)+(l3+l7)
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

// Eight f16 values at p as f32.
TIERKV_AVX2 inline __m256 LoadHalf8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

TIERKV_AVX2 inline __m256 LoadI8AsF32(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

TIERKV_AVX2 float DotF16Avx2(const float* q, const uint8_t* k, int n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), LoadHalf8(k + 2 * i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), LoadHalf8(k + 2 * i + 16), a1);
  }
  for (; i + 8 <= n; i += 8) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), LoadHalf8(k + 2 * i), a0);
  }
  float s = HorizontalSum(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) s += q[i] * LoadHalf(k + 2 * i);
  return s;
}

TIERKV_AVX2 void AccumulateF16Avx2(float w, const uint8_t* v, int n, float* acc) {
  const __m256 wv = _mm256_set1_ps(w);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = LoadHalf8(v + 2 * i);
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(wv, x, _mm256_loadu_ps(acc + i)));
  }
  for (; i < n; ++i) acc[i] += w * LoadHalf(v + 2 * i);
}

// Software prefetch distance in the token loops. A layer's K (or V) of one KV head is a
// run of block_tokens vectors, and runs are a block apart: the hardware prefetchers
// restart at each run and each 4 KiB page, the prefetch keeps loads in flight.
constexpr size_t kPrefetchBytes = 4096;
// The AVX2 kernels also ask for the lines kL2PrefetchBytes ahead into L2: with K and V
// from memory (fused attention of ref-llama's shape at 64K tokens, two threads, three
// alternated runs of each build) that took 2.0 - 2.3x the time of a plain read of the
// same bytes without and 1.6 - 1.95x with it.
constexpr size_t kL2PrefetchBytes = 4 * kPrefetchBytes;

// ---- f16 key tiles ----------------------------------------------------------------------
// A tile holds kTile keys dimension by dimension: dimension d of key `lane` at byte
// 2 * (d * kTile + lane). Per (head, key) the tiled kernels do DotF16Avx2's arithmetic
// (head_dim % 8 == 0): a0[j] and a1[j] are its two 8-lane chains, here each one vector
// over keys (dimension 16c + j into a0[j], 16c + 8 + j into a1[j], a last 8 into a0),
// l[j] = a0[j] + a1[j], then HorizontalSum's adds across j instead of across lanes:
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)). No horizontal sums, no shuffles.

constexpr int kTile = KvVectorKernels::kKeyTileTokens;

// A tiled AVX-512 kernel's heads, at most kTileGroup at a time (their chains stay in
// registers).
constexpr int kTileGroup = 4;

// The scores of one or two heads for the 16 keys of one tile, each query broadcast
// feeding both 8-key halves: per lane j, the chains a0 and a1 of both heads and halves
// stay in registers over the head dimensions (with a step's four key vectors and two
// broadcasts, 14 registers for two heads), and each lane's l = a0 + a1 goes through a
// stack scratch to the tree above. The same operations per (head, key), so the same
// bits. Per 16 keys and 16 dimensions: 4 conversions, 2 kG broadcasts and 4 kG FMAs; the
// 8-key form this replaced issued a broadcast per FMA and was bound by its loads on a
// Zen 4 without AVX-512 (docs/benchmarks.md). With three or more heads the chains would
// not fit the registers. kHd > 0: head_dim known at compile time (the loops unroll).
template <int kG, int kHd>
TIERKV_AVX2 __attribute__((always_inline)) inline void TileScoresAvx2(const float* q, size_t hd_arg,
                                                                      const uint8_t* keys, float* scores,
                                                                      size_t stride) {
  static_assert(kG >= 1 && kG <= 2);
  const size_t hd = kHd > 0 ? static_cast<size_t>(kHd) : hd_arg;
  constexpr size_t kHalf = 2 * 8;  // from a dimension's first 8 keys to its last 8
  alignas(32) float l[kG][2][8][8];  // [head][half][lane j][key]
  for (size_t j = 0; j < 8; ++j) {
    __m256 a0[kG][2], a1[kG][2];
    for (int h = 0; h < kG; ++h) a0[h][0] = a0[h][1] = a1[h][0] = a1[h][1] = _mm256_setzero_ps();
    size_t i = 0;
#pragma GCC unroll 8
    for (; i + 16 <= hd; i += 16) {
      const uint8_t* d0 = keys + 2 * kTile * (i + j);
      const uint8_t* d1 = keys + 2 * kTile * (i + 8 + j);
      const __m256 k00 = LoadHalf8(d0), k01 = LoadHalf8(d0 + kHalf);
      const __m256 k10 = LoadHalf8(d1), k11 = LoadHalf8(d1 + kHalf);
      for (int h = 0; h < kG; ++h) {
        const __m256 qa = _mm256_set1_ps(q[h * hd + i + j]);
        const __m256 qb = _mm256_set1_ps(q[h * hd + i + 8 + j]);
        a0[h][0] = _mm256_fmadd_ps(qa, k00, a0[h][0]);
        a0[h][1] = _mm256_fmadd_ps(qa, k01, a0[h][1]);
        a1[h][0] = _mm256_fmadd_ps(qb, k10, a1[h][0]);
        a1[h][1] = _mm256_fmadd_ps(qb, k11, a1[h][1]);
      }
    }
    if (i < hd) {  // head_dim % 16 == 8: a last 8 into a0
      const uint8_t* d0 = keys + 2 * kTile * (i + j);
      const __m256 k00 = LoadHalf8(d0), k01 = LoadHalf8(d0 + kHalf);
      for (int h = 0; h < kG; ++h) {
        const __m256 qa = _mm256_set1_ps(q[h * hd + i + j]);
        a0[h][0] = _mm256_fmadd_ps(qa, k00, a0[h][0]);
        a0[h][1] = _mm256_fmadd_ps(qa, k01, a0[h][1]);
      }
    }
    for (int h = 0; h < kG; ++h) {
      for (int o = 0; o < 2; ++o) _mm256_store_ps(l[h][o][j], _mm256_add_ps(a0[h][o], a1[h][o]));
    }
  }
  for (int h = 0; h < kG; ++h) {
    for (int o = 0; o < 2; ++o) {
      __m256 x[8];
      for (int j = 0; j < 8; ++j) x[j] = _mm256_load_ps(l[h][o][j]);
      const __m256 u02 = _mm256_add_ps(_mm256_add_ps(x[0], x[4]), _mm256_add_ps(x[2], x[6]));
      const __m256 u13 = _mm256_add_ps(_mm256_add_ps(x[1], x[5]), _mm256_add_ps(x[3], x[7]));
      _mm256_storeu_ps(scores + static_cast<size_t>(h) * stride + 8 * static_cast<size_t>(o), _mm256_add_ps(u02, u13));
    }
  }
}

// All heads over n keys, tile by tile: the heads in pairs (and a last one alone) while
// the tile is in L1, so the keys are read from memory once whatever the head count. A
// last, partly filled tile is scored whole (its other lanes are readable, DotManyGroupTiled)
// into a scratch, and its n % kTile scores copied out.
template <int kHd>
TIERKV_AVX2 void DotF16TilesAvx2(const float* q, int heads, size_t hd_arg, const uint8_t* k, size_t n,
                                 float* scores, size_t stride) {
  const size_t hd = kHd > 0 ? static_cast<size_t>(kHd) : hd_arg;
  const size_t tile_bytes = 2 * kTile * hd;
  // Tiles of head_dim 128 and up are prefetched a share before each pair of heads (a
  // whole tile at once, 64 lines or more, stalls on the fill buffers); smaller ones at
  // once, before the first pair (measured faster at head_dim 32).
  constexpr bool kSpread = kHd == 0 || kHd >= 128;
  const size_t pairs = kSpread && tile_bytes >= 4096 ? static_cast<size_t>(heads + 1) / 2 : 1;
  const size_t part_bytes = (tile_bytes / pairs + 63) / 64 * 64;
  alignas(32) float part[2][kTile];
  for (size_t t0 = 0; t0 < n; t0 += kTile) {
    const uint8_t* keys = k + t0 / kTile * tile_bytes;
    if constexpr (!kSpread) {
      PrefetchLines(keys + kPrefetchBytes, tile_bytes);
      PrefetchLinesL2(keys + kL2PrefetchBytes, tile_bytes);
    }
    const size_t keep = std::min<size_t>(kTile, n - t0);
    for (int h = 0; h < heads; h += 2) {
      if constexpr (kSpread) {
        const size_t from = part_bytes * static_cast<size_t>(h / 2);
        if (from < tile_bytes) {
          const size_t len = std::min(part_bytes, tile_bytes - from);
          PrefetchLines(keys + kPrefetchBytes + from, len);
          PrefetchLinesL2(keys + kL2PrefetchBytes + from, len);
        }
      }
      const int g = std::min(2, heads - h);
      const float* qh = q + static_cast<size_t>(h) * hd;
      float* out = scores + static_cast<size_t>(h) * stride + t0;
      float* dst = keep == kTile ? out : part[0];
      const size_t dst_stride = keep == kTile ? stride : kTile;
      if (g == 2) {
        TileScoresAvx2<2, kHd>(qh, hd, keys, dst, dst_stride);
      } else {
        TileScoresAvx2<1, kHd>(qh, hd, keys, dst, dst_stride);
      }
      if (keep < kTile) {
        for (int i = 0; i < g; ++i) std::memcpy(out + static_cast<size_t>(i) * stride, part[i], sizeof(float) * keep);
      }
    }
  }
}

// fn(std::integral_constant<int, v>{}) where v is one of kCases, else with kDefault: a
// run-time count or size as a compile-time constant, so the kernels' loops unroll.
template <int kDefault, int... kCases, typename F>
void WithConstant(int64_t v, F&& fn) {
  const bool matched = ((v == kCases ? (fn(std::integral_constant<int, kCases>{}), true) : false) || ...);
  if (!matched) fn(std::integral_constant<int, kDefault>{});
}

// fn(group size as an integral_constant, its queries, its score rows) for the heads in
// groups of up to kTileGroup.
template <typename F>
void ForTileHeadGroups(const float* q, int heads, size_t hd, float* scores, size_t stride, F&& fn) {
  static_assert(kTileGroup == 4);  // kv_tree::ForTreeHeadGroups' group
  kv_tree::ForTreeHeadGroups(heads, [&](auto group, int h) {
    fn(group, q + static_cast<size_t>(h) * hd, scores + static_cast<size_t>(h) * stride);
  });
}

// fn(std::integral_constant<int, hd>{}) for the usual head_dims (their loops unroll), and
// with 0 for the rest (hd at run time).
template <typename F>
void WithHeadDim(size_t hd, F&& fn) {
  WithConstant<0, 32, 64, 128>(static_cast<int64_t>(hd), fn);
}

// Pairs over tiles took less time per head than the groups of four over half tiles
// they replaced, at head_dim 32, 64 and 128 (0.99 / 1.75 / 3.38 against 1.23 / 2.10 /
// 3.92 ns a key and head, one thread, keys in L2, a Zen 4 without AVX-512;
// docs/benchmarks.md).
void DotF16TiledAvx2(const float* q, int heads, const uint8_t* k, size_t n, size_t hd, float* scores,
                     size_t stride) {
  WithHeadDim(hd, [&](auto dim) { DotF16TilesAvx2<decltype(dim)::value>(q, heads, hd, k, n, scores, stride); });
}

// fn(std::integral_constant<int, k>{}) for k in 1..8 (more as 8): the value-sum kernels'
// vectors per accumulator as a compile-time count.
template <typename F>
void WithVectorCount(int k, F&& fn) {
  WithConstant<8, 1, 2, 3, 4, 5, 6, 7>(k, fn);
}

// ---- f16 value sums, AVX2 ---------------------------------------------------------------
// acc[h][8i ..] += w[h * w_stride + t] * v_t for kH heads over dims [0, 8 kV) of v and
// acc (the caller offsets both), tokens in order, the kH x kV accumulators in registers
// over all n tokens. Per element AccumulateF16Avx2's one fma a token, so the same bits;
// what changes is that the sums no longer go through memory on every token (a store and
// a reload in each multiply-add's chain: about five times the time, measured on a Zen 4
// without AVX-512, ref-qwen3moe at 16K).
template <int kV, int kH>
TIERKV_AVX2 void AccumulateF16TileAvx2(const float* w, size_t w_stride, const uint8_t* v, size_t n, size_t vb,
                                       float* acc, size_t hd) {
  __m256 a[kH][kV];
#pragma GCC unroll 8
  for (int h = 0; h < kH; ++h) {
#pragma GCC unroll 8
    for (int i = 0; i < kV; ++i) a[h][i] = _mm256_loadu_ps(acc + static_cast<size_t>(h) * hd + 8 * i);
  }
  for (size_t t = 0; t < n; ++t) {
    const uint8_t* vt = v + t * vb;
    PrefetchLines(vt + kPrefetchBytes, 16 * kV);
    PrefetchLinesL2(vt + kL2PrefetchBytes, 16 * kV);
    __m256 x[kV];
#pragma GCC unroll 8
    for (int i = 0; i < kV; ++i) x[i] = LoadHalf8(vt + 16 * i);
#pragma GCC unroll 8
    for (int h = 0; h < kH; ++h) {
      const __m256 wv = _mm256_set1_ps(w[static_cast<size_t>(h) * w_stride + t]);
#pragma GCC unroll 8
      for (int i = 0; i < kV; ++i) a[h][i] = _mm256_fmadd_ps(wv, x[i], a[h][i]);
    }
  }
#pragma GCC unroll 8
  for (int h = 0; h < kH; ++h) {
#pragma GCC unroll 8
    for (int i = 0; i < kV; ++i) _mm256_storeu_ps(acc + static_cast<size_t>(h) * hd + 8 * i, a[h][i]);
  }
}

// All heads over one chunk of kV vectors: heads in pairs (2 kV accumulators and kV
// values fit the 16 registers for kV <= 4), then one; one head alone takes twice the
// vectors (kV up to 8, the caller's chunks), which keeps 8 chains in flight.
template <int kV>
void AccumulateF16ChunkAvx2(const float* w, size_t w_stride, int heads, const uint8_t* v, size_t n, size_t vb,
                            float* acc, size_t hd) {
  int h = 0;
  if constexpr (kV <= 4) {
    for (; h + 2 <= heads; h += 2) {
      AccumulateF16TileAvx2<kV, 2>(w + static_cast<size_t>(h) * w_stride, w_stride, v, n, vb,
                                   acc + static_cast<size_t>(h) * hd, hd);
    }
  }
  for (; h < heads; ++h) {
    AccumulateF16TileAvx2<kV, 1>(w + static_cast<size_t>(h) * w_stride, w_stride, v, n, vb,
                                 acc + static_cast<size_t>(h) * hd, hd);
  }
}

// REQUIRES: head_dim % 8 == 0 (nv = head_dim / 8). Dims are independent, so chunks of
// them run one after the other: 32 dims (one 64-byte line of each vector) per pass when
// heads pair up, 64 for a single head.
void AccumulateF16GroupAvx2(const float* w, size_t w_stride, int heads, const uint8_t* v, size_t n, size_t vb,
                            int nv, float* acc) {
  const size_t hd = 8 * static_cast<size_t>(nv);
  const int chunk = heads == 1 ? 8 : 4;
  for (int d0 = 0; d0 < nv; d0 += chunk) {
    const uint8_t* vc = v + 16 * static_cast<size_t>(d0);
    float* ac = acc + 8 * static_cast<size_t>(d0);
    WithVectorCount(std::min(chunk, nv - d0), [&](auto k) {
      AccumulateF16ChunkAvx2<decltype(k)::value>(w, w_stride, heads, vc, n, vb, ac, hd);
    });
  }
}

// ---- f16, AVX-512: many tokens and heads per call ------------------------------------
// The same arithmetic per (head, token) as DotF16Avx2 / AccumulateF16Avx2 for
// head_dim % 16 == 0, so the bits are the same: a 512-bit product sum holds DotF16Avx2's
// a0 in lanes 0-7 and its a1 in lanes 8-15; accumulation is elementwise. What changes is
// that tokens and the query heads of a group are looped inside one function, each K/V
// vector is converted once for every head, and the accumulators stay in registers.

#define TIERKV_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))

// GCC 12's AVX-512 intrinsics fill "don't care" lanes with _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports (as in kernels/quant_avx512.cc).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

TIERKV_AVX512 inline void PrefetchVector(const uint8_t* p, size_t vb) { PrefetchLines(p + kPrefetchBytes, vb); }

TIERKV_AVX512 inline __m512 LoadHalf16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// a0 + a1 of a 512-bit product sum: the vector DotF16Avx2 reduces.
TIERKV_AVX512 inline void StoreHalves(__m512 p, float* out) {
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(p), 1));
  _mm256_store_ps(out, _mm256_add_ps(_mm512_castps512_ps256(p), hi));
}

// x[t][8] for 8 tokens -> their 8 HorizontalSums, in token order (the same adds:
// u_i = l_i + l_(i+4), then (u_0 + u_2) + (u_1 + u_3)), transposed across tokens.
TIERKV_AVX512 inline __m256 ReduceTile8(const float (*x)[8]) {
  __m256 y[4];
  for (int i = 0; i < 4; ++i) {
    const __m256 a = _mm256_load_ps(x[2 * i]), b = _mm256_load_ps(x[2 * i + 1]);
    y[i] = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  }
  // Lane 0: tokens 0, 2 (then 4, 6); lane 1: tokens 1, 3 (5, 7): [v0 v1 v0 v1] each.
  const __m256 z0 = _mm256_add_ps(_mm256_shuffle_ps(y[0], y[1], 0x44), _mm256_shuffle_ps(y[0], y[1], 0xee));
  const __m256 z1 = _mm256_add_ps(_mm256_shuffle_ps(y[2], y[3], 0x44), _mm256_shuffle_ps(y[2], y[3], 0xee));
  const __m256 r = _mm256_add_ps(_mm256_shuffle_ps(z0, z1, 0x88), _mm256_shuffle_ps(z0, z1, 0xdd));
  return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// scores[h * stride + t] = Dot(q[h], k_t) for `heads` heads and n tokens (stride vb),
// head_dim = 16 * nv. kV = nv keeps each K vector in registers for all heads; kV = 0
// (nv > 8) converts it again per head.
template <int kV>
TIERKV_AVX512 void DotF16GroupAvx512(const float* q, int heads, const uint8_t* k, size_t n, size_t vb, int nv,
                                     float* scores, size_t stride) {
  constexpr int kTileHeads = 8;
  const size_t hd = 16 * static_cast<size_t>(nv);
  alignas(32) float tile[kTileHeads][8][8];  // [head][token][a0 + a1 lanes]
  for (size_t t0 = 0; t0 < n; t0 += 8) {
    const int tn = static_cast<int>(std::min<size_t>(8, n - t0));
    for (int h0 = 0; h0 < heads; h0 += kTileHeads) {
      const int hn = std::min(kTileHeads, heads - h0);
      if (tn < 8) std::memset(tile, 0, sizeof(tile));
      for (int t = 0; t < tn; ++t) {
        const uint8_t* kt = k + (t0 + static_cast<size_t>(t)) * vb;
        if (h0 == 0) PrefetchVector(kt, vb);
        if constexpr (kV > 0) {
          __m512 kx[kV];
          for (int i = 0; i < kV; ++i) kx[i] = LoadHalf16(kt + 32 * i);
          for (int h = 0; h < hn; ++h) {
            const float* qh = q + static_cast<size_t>(h0 + h) * hd;
            __m512 p = _mm512_setzero_ps();
            for (int i = 0; i < kV; ++i) p = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * i), kx[i], p);
            StoreHalves(p, tile[h][t]);
          }
        } else {
          for (int h = 0; h < hn; ++h) {
            const float* qh = q + static_cast<size_t>(h0 + h) * hd;
            __m512 p = _mm512_setzero_ps();
            for (int i = 0; i < nv; ++i) p = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * i), LoadHalf16(kt + 32 * i), p);
            StoreHalves(p, tile[h][t]);
          }
        }
      }
      for (int h = 0; h < hn; ++h) {
        const __m256 r = ReduceTile8(tile[h]);
        float* out = scores + static_cast<size_t>(h0 + h) * stride + t0;
        if (tn == 8) {
          _mm256_storeu_ps(out, r);
        } else {
          alignas(32) float tmp[8];
          _mm256_store_ps(tmp, r);
          std::memcpy(out, tmp, sizeof(float) * static_cast<size_t>(tn));
        }
      }
    }
  }
}

// ---- the same dot products, 16 tokens at a time, reduced in registers ----------------
// kernels/kv_dot_tree.h has the tree (the same adds, in the same order, as the one-token
// reduction); the leaf here reads the f16 bytes.

#define TIERKV_AVX512_INLINE TIERKV_AVX512 __attribute__((always_inline)) inline

// p[h] for token t of k, kG heads; head h's query is q + h * hd.
template <int kV, int kG>
struct F16KeyLeaf {
  const float* q;
  size_t hd;
  const uint8_t* k;
  size_t vb;
  TIERKV_AVX512_INLINE void operator()(size_t t, __m512* p) const {
    const uint8_t* kt = k + t * vb;
    PrefetchVector(kt, vb);
    __m512 kx[kV];
    for (int i = 0; i < kV; ++i) kx[i] = LoadHalf16(kt + 32 * i);
    for (int h = 0; h < kG; ++h) {
      const float* qh = q + static_cast<size_t>(h) * hd;
      __m512 acc = _mm512_setzero_ps();  // fma onto +0, as DotF16Avx2 (the sign of a zero product)
      for (int i = 0; i < kV; ++i) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * i), kx[i], acc);
      p[h] = acc;
    }
  }
};

// scores[h * stride + t] for kG heads and the first n - n % 16 tokens.
template <int kV, int kG>
TIERKV_AVX512 void DotF16Tiles16(const float* q, size_t hd, const uint8_t* k, size_t n, size_t vb, float* scores,
                                 size_t stride) {
  const __m512i order = kv_tree::TreeKeyOrder();
  for (size_t t0 = 0; t0 + 16 <= n; t0 += 16) {
    __m512 r[kG];
    kv_tree::DotTree<16, kG>(F16KeyLeaf<kV, kG>{q, hd, k + t0 * vb, vb}, 0, r);
    for (int h = 0; h < kG; ++h) {
      _mm512_storeu_ps(scores + static_cast<size_t>(h) * stride + t0, _mm512_permutexvar_ps(order, r[h]));
    }
  }
}

template <int kV>
void DotF16Tiles16Heads(const float* q, int heads, const uint8_t* k, size_t n, size_t vb, float* scores,
                        size_t stride) {
  const size_t hd = 16 * static_cast<size_t>(kV);
  ForTileHeadGroups(q, heads, hd, scores, stride, [&](auto group, const float* qh, float* sh) {
    DotF16Tiles16<kV, decltype(group)::value>(qh, hd, k, n, vb, sh, stride);
  });
}

void DotF16GroupAvx512Any(const float* q, int heads, const uint8_t* k, size_t n, size_t vb, int nv,
                          float* scores, size_t stride) {
  // Whole tiles of 16 tokens in registers (head_dim 32, 64, 128), the rest below.
  const size_t whole = nv == 2 || nv == 4 || nv == 8 ? n / 16 * 16 : 0;
  if (whole > 0) {
    switch (nv) {
      case 2: DotF16Tiles16Heads<2>(q, heads, k, whole, vb, scores, stride); break;
      case 4: DotF16Tiles16Heads<4>(q, heads, k, whole, vb, scores, stride); break;
      default: DotF16Tiles16Heads<8>(q, heads, k, whole, vb, scores, stride); break;
    }
    if (whole == n) return;
    k += whole * vb;
    scores += whole;
    n -= whole;
  }
  switch (nv) {
    case 1: return DotF16GroupAvx512<1>(q, heads, k, n, vb, nv, scores, stride);
    case 2: return DotF16GroupAvx512<2>(q, heads, k, n, vb, nv, scores, stride);
    case 3: return DotF16GroupAvx512<3>(q, heads, k, n, vb, nv, scores, stride);
    case 4: return DotF16GroupAvx512<4>(q, heads, k, n, vb, nv, scores, stride);
    case 5: return DotF16GroupAvx512<5>(q, heads, k, n, vb, nv, scores, stride);
    case 6: return DotF16GroupAvx512<6>(q, heads, k, n, vb, nv, scores, stride);
    case 7: return DotF16GroupAvx512<7>(q, heads, k, n, vb, nv, scores, stride);
    case 8: return DotF16GroupAvx512<8>(q, heads, k, n, vb, nv, scores, stride);
    default: return DotF16GroupAvx512<0>(q, heads, k, n, vb, nv, scores, stride);
  }
}

// acc[h][16 * i ...] += w[h * w_stride + t] * v_t for kH heads of each of kR runs of V
// (run r at v + r * run_stride, its heads rows r * kH .. of w and acc), kV 16-float
// vectors per accumulator (held in registers over all n tokens), tokens in order. More
// runs, more independent chains in flight; each head's multiply-adds are the same.
template <int kV, int kH, int kR = 1>
TIERKV_AVX512 void AccumulateF16TileAvx512(const float* w, size_t w_stride, const uint8_t* v, size_t run_stride,
                                           size_t n, size_t vb, float* acc, size_t hd) {
  // Every loop over heads and vectors unrolled: otherwise GCC 12 (-O3) keeps a[][] in
  // memory once there are four or more vectors and stores all of it on every token (16
  // stores a token for head_dim 128).
  __m512 a[kR * kH][kV];
#pragma GCC unroll 16
  for (int h = 0; h < kR * kH; ++h) {
#pragma GCC unroll 16
    for (int i = 0; i < kV; ++i) a[h][i] = _mm512_loadu_ps(acc + static_cast<size_t>(h) * hd + 16 * i);
  }
  for (size_t t = 0; t < n; ++t) {
#pragma GCC unroll 4
    for (int r = 0; r < kR; ++r) {
      const uint8_t* vt = v + static_cast<size_t>(r) * run_stride + t * vb;
      PrefetchVector(vt, 32 * kV);
      __m512 x[kV];
#pragma GCC unroll 16
      for (int i = 0; i < kV; ++i) x[i] = LoadHalf16(vt + 32 * i);
#pragma GCC unroll 16
      for (int h = r * kH; h < (r + 1) * kH; ++h) {
        const __m512 wv = _mm512_set1_ps(w[static_cast<size_t>(h) * w_stride + t]);
#pragma GCC unroll 16
        for (int i = 0; i < kV; ++i) a[h][i] = _mm512_fmadd_ps(wv, x[i], a[h][i]);
      }
    }
  }
#pragma GCC unroll 16
  for (int h = 0; h < kR * kH; ++h) {
#pragma GCC unroll 16
    for (int i = 0; i < kV; ++i) _mm512_storeu_ps(acc + static_cast<size_t>(h) * hd + 16 * i, a[h][i]);
  }
}

// Two runs at once when their accumulators fit 16 registers (2 x heads x head_dim / 16
// <= 16, for 1, 2 or 4 heads a run); false if it did not run.
bool AccumulateF16PairAvx512(const float* w, size_t w_stride, int heads, const uint8_t* v, size_t run_stride,
                             size_t n, size_t vb, int nv, float* acc) {
  const size_t hd = 16 * static_cast<size_t>(nv);
  switch (nv * 8 + heads) {
    case 1 * 8 + 1: AccumulateF16TileAvx512<1, 1, 2>(w, w_stride, v, run_stride, n, vb, acc, hd); return true;
    case 1 * 8 + 2: AccumulateF16TileAvx512<1, 2, 2>(w, w_stride, v, run_stride, n, vb, acc, hd); return true;
    case 1 * 8 + 4: AccumulateF16TileAvx512<1, 4, 2>(w, w_stride, v, run_stride, n, vb, acc, hd); return true;
    case 2 * 8 + 1: AccumulateF16TileAvx512<2, 1, 2>(w, w_stride, v, run_stride, n, vb, acc, hd); return true;
    case 2 * 8 + 2: AccumulateF16TileAvx512<2, 2, 2>(w, w_stride, v, run_stride, n, vb, acc, hd); return true;
    case 2 * 8 + 4: AccumulateF16TileAvx512<2, 4, 2>(w, w_stride, v, run_stride, n, vb, acc, hd); return true;
    case 4 * 8 + 1: AccumulateF16TileAvx512<4, 1, 2>(w, w_stride, v, run_stride, n, vb, acc, hd); return true;
    case 4 * 8 + 2: AccumulateF16TileAvx512<4, 2, 2>(w, w_stride, v, run_stride, n, vb, acc, hd); return true;
    default: return false;
  }
}

// The first 16 * kV values of m vectors (vb bytes apart) as floats, 16 * kV a vector.
template <int kV>
TIERKV_AVX512 void ConvertHalves(const uint8_t* v, size_t m, size_t vb, float* x) {
  for (size_t t = 0; t < m; ++t, v += vb, x += 16 * kV) {
    PrefetchVector(v, 32 * kV);
#pragma GCC unroll 16
    for (int i = 0; i < kV; ++i) _mm512_store_ps(x + 16 * i, LoadHalf16(v + 32 * i));
  }
}

// acc[h][16 * i ...] += w[h * w_stride + t] * x_t for kH heads, x_t = x + t * 16 * kV
// (floats), tokens in order: AccumulateF16TileAvx512's multiply-adds over values already
// converted, read as FMA operands.
template <int kV, int kH>
TIERKV_AVX512 void AccumulateF32TileAvx512(const float* w, size_t w_stride, const float* x, size_t n, float* acc,
                                           size_t hd) {
  __m512 a[kH][kV];
#pragma GCC unroll 16
  for (int h = 0; h < kH; ++h) {
#pragma GCC unroll 16
    for (int i = 0; i < kV; ++i) a[h][i] = _mm512_loadu_ps(acc + static_cast<size_t>(h) * hd + 16 * i);
  }
  for (size_t t = 0; t < n; ++t, x += 16 * kV) {
#pragma GCC unroll 16
    for (int h = 0; h < kH; ++h) {
      const __m512 wv = _mm512_set1_ps(w[static_cast<size_t>(h) * w_stride + t]);
#pragma GCC unroll 16
      for (int i = 0; i < kV; ++i) a[h][i] = _mm512_fmadd_ps(wv, _mm512_load_ps(x + 16 * i), a[h][i]);
    }
  }
#pragma GCC unroll 16
  for (int h = 0; h < kH; ++h) {
#pragma GCC unroll 16
    for (int i = 0; i < kV; ++i) _mm512_storeu_ps(acc + static_cast<size_t>(h) * hd + 16 * i, a[h][i]);
  }
}

// `heads` heads in groups of up to 16 / kV (their accumulators in registers): tile(kH, h)
// runs heads [h, h + kH).
template <int kV, typename Tile>
inline void ForAccumulatorGroups(int heads, Tile&& tile) {
  constexpr int kMaxHeads = 16 / kV;  // at most 16 accumulators in registers
  int h = 0;
  if constexpr (kMaxHeads >= 4) {
    for (; h + 4 <= heads; h += 4) tile(std::integral_constant<int, 4>{}, h);
  }
  for (; h + 2 <= heads; h += 2) tile(std::integral_constant<int, 2>{}, h);
  for (; h < heads; ++h) tile(std::integral_constant<int, 1>{}, h);
}

// All heads over dims [0, 16 * kV) of v and acc (the caller offsets both). When the
// heads take more than one pass (more than 16 accumulators), each chunk of keys is
// converted to floats once, into a buffer that stays in L1, and every pass reads that
// instead of converting each V vector again. The multiply-adds, and so the bits, are
// the same either way.
template <int kV>
void AccumulateF16ChunkAvx512(const float* w, size_t w_stride, int heads, const uint8_t* v, size_t n, size_t vb,
                              float* acc, size_t hd) {
  constexpr int kMaxHeads = 16 / kV;
  if (heads <= kMaxHeads) {
    ForAccumulatorGroups<kV>(heads, [&](auto group, int h) {
      AccumulateF16TileAvx512<kV, decltype(group)::value>(w + static_cast<size_t>(h) * w_stride, w_stride, v, 0, n,
                                                          vb, acc + static_cast<size_t>(h) * hd, hd);
    });
    return;
  }
  constexpr size_t kChunk = 256 / kV;  // keys a chunk: 16 KiB of floats
  alignas(64) float x[kChunk * 16 * kV];
  for (size_t t0 = 0; t0 < n; t0 += kChunk) {
    const size_t m = std::min(kChunk, n - t0);
    ConvertHalves<kV>(v + t0 * vb, m, vb, x);
    ForAccumulatorGroups<kV>(heads, [&](auto group, int h) {
      AccumulateF32TileAvx512<kV, decltype(group)::value>(w + static_cast<size_t>(h) * w_stride + t0, w_stride, x, m,
                                                          acc + static_cast<size_t>(h) * hd, hd);
    });
  }
}

// Dims are independent, so chunks of up to 128 of them run one after the other.
void AccumulateF16GroupAvx512(const float* w, size_t w_stride, int heads, const uint8_t* v, size_t n, size_t vb,
                              int nv, float* acc) {
  const size_t hd = 16 * static_cast<size_t>(nv);
  for (int d0 = 0; d0 < nv; d0 += 8) {
    const uint8_t* vc = v + 32 * static_cast<size_t>(d0);
    float* ac = acc + 16 * static_cast<size_t>(d0);
    WithVectorCount(std::min(8, nv - d0), [&](auto k) {
      AccumulateF16ChunkAvx512<decltype(k)::value>(w, w_stride, heads, vc, n, vb, ac, hd);
    });
  }
}
// The tiled kernels with 16-key vectors: one tile per step (the arithmetic of the tree
// above, a lane's two chains per head).
// kHd > 0: head_dim known at compile time (the loops unroll), else hd.
template <int kG, int kHd>
TIERKV_AVX512_INLINE void TileLaneSums16(const float* q, size_t hd_arg, const uint8_t* tile, size_t j, __m512* l) {
  const size_t hd = kHd > 0 ? static_cast<size_t>(kHd) : hd_arg;
  __m512 a0[kG], a1[kG];
  for (int h = 0; h < kG; ++h) a0[h] = a1[h] = _mm512_setzero_ps();
  size_t i = 0;
#pragma GCC unroll 16
  for (; i + 16 <= hd; i += 16) {
    const __m512 k0 = LoadHalf16(tile + 2 * kTile * (i + j));
    const __m512 k1 = LoadHalf16(tile + 2 * kTile * (i + 8 + j));
    for (int h = 0; h < kG; ++h) {
      a0[h] = _mm512_fmadd_ps(_mm512_set1_ps(q[h * hd + i + j]), k0, a0[h]);
      a1[h] = _mm512_fmadd_ps(_mm512_set1_ps(q[h * hd + i + 8 + j]), k1, a1[h]);
    }
  }
  if (i < hd) {
    const __m512 k0 = LoadHalf16(tile + 2 * kTile * (i + j));
    for (int h = 0; h < kG; ++h) a0[h] = _mm512_fmadd_ps(_mm512_set1_ps(q[h * hd + i + j]), k0, a0[h]);
  }
  for (int h = 0; h < kG; ++h) l[h] = _mm512_add_ps(a0[h], a1[h]);
}

template <int kG, int kHd>
TIERKV_AVX512 void DotF16TiledAvx512Heads(const float* q, size_t hd_arg, const uint8_t* k, size_t n, float* scores,
                                          size_t stride) {
  const size_t hd = kHd > 0 ? static_cast<size_t>(kHd) : hd_arg;
  const size_t tile_bytes = 2 * kTile * hd;
  // The tile kPrefetchBytes ahead is prefetched an eighth before each of the eight lane
  // sums: all of it at once (64 lines at head_dim 128) stalled on the fill buffers.
  const size_t eighth = tile_bytes / 8;
  for (size_t t0 = 0; t0 < n; t0 += kTile) {
    const uint8_t* tile = k + t0 / kTile * tile_bytes;
    const uint8_t* ahead = tile + kPrefetchBytes;
    __m512 x[kG], y[kG], u02[kG], u13[kG];
    PrefetchLines(ahead, eighth);
    TileLaneSums16<kG, kHd>(q, hd, tile, 0, x);
    PrefetchLines(ahead + eighth, eighth);
    TileLaneSums16<kG, kHd>(q, hd, tile, 4, y);
    for (int h = 0; h < kG; ++h) u02[h] = _mm512_add_ps(x[h], y[h]);
    PrefetchLines(ahead + 2 * eighth, eighth);
    TileLaneSums16<kG, kHd>(q, hd, tile, 2, x);
    PrefetchLines(ahead + 3 * eighth, eighth);
    TileLaneSums16<kG, kHd>(q, hd, tile, 6, y);
    for (int h = 0; h < kG; ++h) u02[h] = _mm512_add_ps(u02[h], _mm512_add_ps(x[h], y[h]));
    PrefetchLines(ahead + 4 * eighth, eighth);
    TileLaneSums16<kG, kHd>(q, hd, tile, 1, x);
    PrefetchLines(ahead + 5 * eighth, eighth);
    TileLaneSums16<kG, kHd>(q, hd, tile, 5, y);
    for (int h = 0; h < kG; ++h) u13[h] = _mm512_add_ps(x[h], y[h]);
    PrefetchLines(ahead + 6 * eighth, eighth);
    TileLaneSums16<kG, kHd>(q, hd, tile, 3, x);
    PrefetchLines(ahead + 7 * eighth, eighth);
    TileLaneSums16<kG, kHd>(q, hd, tile, 7, y);
    const __mmask16 keep = static_cast<__mmask16>(n - t0 >= kTile ? 0xffffu : (1u << (n - t0)) - 1u);
    for (int h = 0; h < kG; ++h) {
      const __m512 r = _mm512_add_ps(u02[h], _mm512_add_ps(u13[h], _mm512_add_ps(x[h], y[h])));
      _mm512_mask_storeu_ps(scores + static_cast<size_t>(h) * stride + t0, keep, r);
    }
  }
}

template <int kHd>
void DotF16TiledAvx512Dim(const float* q, int heads, const uint8_t* k, size_t n, size_t hd, float* scores,
                          size_t stride) {
  ForTileHeadGroups(q, heads, hd, scores, stride, [&](auto group, const float* qh, float* sh) {
    DotF16TiledAvx512Heads<decltype(group)::value, kHd>(qh, hd, k, n, sh, stride);
  });
}

void DotF16TiledAvx512(const float* q, int heads, const uint8_t* k, size_t n, size_t hd, float* scores,
                       size_t stride) {
  WithHeadDim(hd, [&](auto dim) {
    DotF16TiledAvx512Dim<decltype(dim)::value>(q, heads, k, n, hd, scores, stride);
  });
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

TIERKV_AVX2 void DecodeQ8Avx2(const uint8_t* in, int nb, float* out) {
  for (int b = 0; b < nb; ++b, in += kQ8Bytes, out += kQBlock) {
    const __m256 d = _mm256_set1_ps(LoadHalf(in));
    const auto* qs = reinterpret_cast<const int8_t*>(in + 2);
    for (int i = 0; i < kQBlock; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(LoadI8AsF32(qs + i), d));
  }
}

static TIERKV_AVX2 inline void AccumulateQ8Impl(float w, const uint8_t* v, int nb, float* acc) {
  for (int b = 0; b < nb; ++b, v += kQ8Bytes, acc += kQBlock) {
    const __m256 wd = _mm256_set1_ps(w * LoadHalf(v));
    const auto* qs = reinterpret_cast<const int8_t*>(v + 2);
    for (int i = 0; i < kQBlock; i += 8) {
      _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(wd, LoadI8AsF32(qs + i), _mm256_loadu_ps(acc + i)));
    }
  }
}
TIERKV_AVX2 void AccumulateQ8Avx2(float w, const uint8_t* v, int nb, float* acc) { AccumulateQ8Impl(w, v, nb, acc); }

// EncodeQ8Block, bit for bit: vmaxps(|x|, acc) ignores a NaN |x| as fmaxf does;
// round half away from zero as trunc + (|frac| >= 0.5), exact for |v| <= 127.
TIERKV_AVX2 void EncodeQ8BlockAvx2(const float* x, uint8_t* out) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 v[4];
  __m256 amax8 = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    amax8 = _mm256_max_ps(_mm256_and_ps(v[i], abs_mask), amax8);
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  const float amax = _mm_cvtss_f32(m4);
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t dh = FloatToHalf(d);
  std::memcpy(out, &dh, 2);
  const __m256 idv = _mm256_set1_ps(id);
  const __m256 one = _mm256_set1_ps(1.0f);
  __m256i q[4];
  for (int i = 0; i < 4; ++i) {
    __m256 t = _mm256_mul_ps(v[i], idv);
    t = _mm256_max_ps(t, _mm256_set1_ps(-127.0f));  // NaN -> -127 (second operand)
    t = _mm256_min_ps(t, _mm256_set1_ps(127.0f));
    const __m256 tr = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_sub_ps(t, tr);
    const __m256 up = _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ), one);
    const __m256 down = _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(-0.5f), _CMP_LE_OQ), one);
    q[i] = _mm256_cvttps_epi32(_mm256_sub_ps(_mm256_add_ps(tr, up), down));
  }
  // int32 -> int8 with the packs' lane interleave undone.
  const __m256i p16a = _mm256_packs_epi32(q[0], q[1]);
  const __m256i p16b = _mm256_packs_epi32(q[2], q[3]);
  const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
  const __m256i ordered = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2), ordered);
}

// The 32 values of a q4_0 block as (nibble - 8), in element order, as 4 x 8 floats.
struct Q4Unpacked { __m256 v[4]; };
TIERKV_AVX2 inline Q4Unpacked UnpackQ4(const uint8_t* qs) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i eight = _mm_set1_epi8(8);
  const __m128i lo = _mm_sub_epi8(_mm_and_si128(bytes, mask), eight);                      // 0..15
  const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask), eight);  // 16..31
  Q4Unpacked u;
  u.v[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
  u.v[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
  u.v[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
  u.v[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
  return u;
}

TIERKV_AVX2 void DecodeQ4Avx2(const uint8_t* in, int nb, float* out) {
  for (int b = 0; b < nb; ++b, in += kQ4Bytes, out += kQBlock) {
    const __m256 d = _mm256_set1_ps(LoadHalf(in));
    const Q4Unpacked u = UnpackQ4(in + 2);
    for (int i = 0; i < 4; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(u.v[i], d));
  }
}

static TIERKV_AVX2 inline void AccumulateQ4Impl(float w, const uint8_t* v, int nb, float* acc) {
  for (int b = 0; b < nb; ++b, v += kQ4Bytes, acc += kQBlock) {
    const __m256 wd = _mm256_set1_ps(w * LoadHalf(v));
    const Q4Unpacked u = UnpackQ4(v + 2);
    for (int i = 0; i < 4; ++i) {
      _mm256_storeu_ps(acc + 8 * i, _mm256_fmadd_ps(wd, u.v[i], _mm256_loadu_ps(acc + 8 * i)));
    }
  }
}
TIERKV_AVX2 void AccumulateQ4Avx2(float w, const uint8_t* v, int nb, float* acc) { AccumulateQ4Impl(w, v, nb, acc); }

// The per-vector kernel inlined into a loop over the vectors: the same code per vector,
// so the same bits, without a call per vector. (The *Impl functions have internal
// linkage so that the compiler inlines them here as it did when they lived with the
// codecs; the exported *Avx2 names are one-line wrappers for the single-vector calls.)
template <void (*kAcc)(float, const uint8_t*, int, float*)>
TIERKV_AVX2 void AccumulateManyLoopAvx2(const float* w, const uint8_t* v, size_t n, size_t stride, int nb,
                                        float* acc) {
  for (size_t i = 0; i < n; ++i) kAcc(w[i], v + i * stride, nb, acc);
}

void AccumulateManyQ8Avx2(const float* w, const uint8_t* v, size_t n, size_t stride, int nb, float* acc) {
  AccumulateManyLoopAvx2<AccumulateQ8Impl>(w, v, n, stride, nb, acc);
}
void AccumulateManyQ4Avx2(const float* w, const uint8_t* v, size_t n, size_t stride, int nb, float* acc) {
  AccumulateManyLoopAvx2<AccumulateQ4Impl>(w, v, n, stride, nb, acc);
}

}  // namespace tierkv::kernels::kv_simd

#endif  // TIERKV_KV_SIMD_X86
