// kernels/quant_avx512.cc
//
// AVX-512 (F, BW, VL, DQ) dot products for F32, F16 and BF16, chosen at run time, and
// for the quantized types multi-row kernels with AVX512-VNNI (vpdpbusd, vpdpwssd) and BW,
// used only when the CPU reports avx512vnni (else the AVX2 kernels serve this level).
// They are bit-identical to the AVX2 kernels: see the block comment above them. (An
// earlier try at 512-bit one-row Q8_0/Q4_0 kernels that paired blocks measured 1.3-1.4x
// slower than AVX2; the gain here comes from sharing the activation between rows.) No
// AMX instruction is emitted: the target lists name none.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/fp16.h"
#include "kernels/quant.h"
#include "kernels/quant_simd.h"
#include "memory/prefetch.h"

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

// Software prefetch for the multi-row kernels. They read R rows side by side, block by
// block: R short interleaved streams that the hardware prefetchers follow poorly (a
// 32000 x 256 Q8_0 matrix read from memory ran at a quarter of a plain read's speed).
// Each group of short rows (under kShortRowBytes), before it is computed, asks for the
// group kMatPrefetchBytes ahead; long rows are prefetched inside the block loops
// (simd::PrefetchRowsAhead). The rule is on the row, not the group: a group of 16 Q8_0
// rows of 256 columns is 4352 bytes, and while it went unprefetched (the rule was once
// "groups of at most 4 KiB") the 32000 x 256 output projection read from memory took
// 190 us instead of 130.
constexpr size_t kMatPrefetchBytes = 4096;
constexpr size_t kShortRowBytes = kLongRowBytes;

inline void PrefetchGroup(const uint8_t* group, int rows, size_t row_bytes) {
  if (row_bytes < kShortRowBytes) PrefetchLines(group + kMatPrefetchBytes, static_cast<size_t>(rows) * row_bytes);
}

// HsumPs256 of 16 rows' 8-lane sums at once, with the same adds in the same order (a
// short row, such as a 64-wide output projection, spends as much on its horizontal sum
// as on its two blocks). acc[j] holds rows 2j (lanes 0-7) and 2j + 1 (lanes 8-15).
//   level 1: per row, lanes i + (i + 4)             -> 4 rows per vector, a row per 128-bit lane
//   level 2: per row, s[0] + s[2] and s[1] + s[3]   -> 8 rows per vector
//   level 3: per row, the two halves                 -> 16 rows; a permutation puts them in order
TIERKV_AVX512_FN inline void HsumRows16(const __m512* acc, float* out) {
  __m512 s4[4], s2[2];
  for (int i = 0; i < 4; ++i) {
    const __m512 x = acc[2 * i], y = acc[2 * i + 1];
    s4[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
  }
  for (int i = 0; i < 2; ++i) {
    const __m512 c = s4[2 * i], d = s4[2 * i + 1];
    s2[i] = _mm512_add_ps(_mm512_shuffle_ps(c, d, 0x44), _mm512_shuffle_ps(c, d, 0xee));
  }
  const __m512 s1 = _mm512_add_ps(_mm512_shuffle_ps(s2[0], s2[1], 0x88), _mm512_shuffle_ps(s2[0], s2[1], 0xdd));
  // 128-bit lane j, element k holds row j + 4k.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, s1));
}

// ---- F32, F16, BF16: the two summation orders of llama.cpp's CPU backend ----
//
// llama.cpp sums these types one way in a matrix product of one token and another in a
// product of several (docs/kernels.md, "Matmuls"); both are reproduced here, as its
// AVX-512 build (the reference vectors' build, with AVX512-BF16) computes them:
//
// * One token (ggml's vec_dot). F32 and F16: four 16-lane FMA accumulators over 64-value
//   steps, added (s0 + s2) + (s1 + s3) and reduced as _mm512_reduce_add_ps reduces
//   (HsumPs512: the same adds); the values past the last whole step one at a time (F32:
//   an FMA into the f32 sum; F16: each exact product added in double). BF16: two
//   accumulators of vdpbf16ps over the 64-value steps (values 0-31 and 32-63), each
//   reduced, the two sums and then the tail's products added in double.
// * Several tokens (tinyBLAS): one accumulator per (row, token) over 16-value steps (F32,
//   F16: FMA; BF16: 32-value steps of vdpbf16ps), reduced. Only when the width is a
//   multiple of the step; otherwise llama.cpp (and this) takes the one-token order.
//
// vdpbf16ps adds, per 32-bit lane, the product of the two high bf16 halves and then that
// of the two low halves, each rounded once; a product of two bf16 is exact in f32, so two
// FMAs on the halves widened to f32 give its bits (DpBf16). The instruction also flushes
// denormal inputs and results to zero, which DpBf16 does not: bf16 weights and activations
// below 1e-38 do not occur in models. tests/kernels/quant_test.cc checks DpBf16 against
// the instruction where the CPU has it.

// 16 values of a row as f32 (all three conversions are exact).
template <WeightType kType>
TIERKV_AVX512_FN inline __m512 Load16(const void* p) {
  if constexpr (kType == WeightType::kF32) {
    return _mm512_loadu_ps(p);
  } else if constexpr (kType == WeightType::kF16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
  } else {
    const __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
  }
}

TIERKV_AVX512_FN inline __m512 DpBf16(__m512 acc, const void* w, const void* x) {
  const __m512i a = _mm512_loadu_si512(w), b = _mm512_loadu_si512(x);
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __m512 a_hi = _mm512_castsi512_ps(_mm512_and_si512(a, hi)), b_hi = _mm512_castsi512_ps(_mm512_and_si512(b, hi));
  const __m512 a_lo = _mm512_castsi512_ps(_mm512_slli_epi32(a, 16)), b_lo = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
  return _mm512_fmadd_ps(a_lo, b_lo, _mm512_fmadd_ps(a_hi, b_hi, acc));
}

template <WeightType kType>
constexpr size_t kValueBytes = kType == WeightType::kF32 ? 4 : 2;

template <WeightType kType>
inline float ValueAt(const void* p, int64_t i) {
  if constexpr (kType == WeightType::kF32) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (kType == WeightType::kF16) {
    return F16ToF32(static_cast<const uint16_t*>(p)[i]);
  } else {
    return Bf16ToF32(static_cast<const uint16_t*>(p)[i]);
  }
}

template <WeightType kType>
TIERKV_AVX512_FN inline const void* At(const void* p, int64_t i) {
  return static_cast<const uint8_t*>(p) + static_cast<size_t>(i) * kValueBytes<kType>;
}

// F32 / F16, one token: the 16 lanes of (s0 + s2) + (s1 + s3) over the first n / 64 * 64
// values (what HsumPs512 then reduces). kAct: the activation's type, kType or (already
// widened, the same values) F32.
template <WeightType kType, WeightType kAct = kType>
TIERKV_AVX512_FN inline __m512 VecDotLanes(const void* w, const void* x, int64_t n) {
  __m512 s[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t i = 0; i + 64 <= n; i += 64) {
    for (int j = 0; j < 4; ++j) {
      s[j] = _mm512_fmadd_ps(Load16<kType>(At<kType>(w, i + 16 * j)), Load16<kAct>(At<kAct>(x, i + 16 * j)), s[j]);
    }
  }
  return _mm512_add_ps(_mm512_add_ps(s[0], s[2]), _mm512_add_ps(s[1], s[3]));
}

// The one-token tail after the lanes' reduction `sum`.
template <WeightType kType>
TIERKV_AVX512_FN inline float VecDotTail(float sum, const void* w, const void* x, int64_t n) {
  if constexpr (kType == WeightType::kF32) {
    for (int64_t i = n / 64 * 64; i < n; ++i) sum = __builtin_fmaf(ValueAt<kType>(w, i), ValueAt<kType>(x, i), sum);
    return sum;
  } else {
    double s = sum;
    for (int64_t i = n / 64 * 64; i < n; ++i) s += static_cast<double>(ValueAt<kType>(w, i) * ValueAt<kType>(x, i));
    return static_cast<float>(s);
  }
}

template <WeightType kType>
TIERKV_AVX512_FN float VecDotAvx512(const void* row, const void* act, int64_t n) {
  if constexpr (kType == WeightType::kBF16) {
    __m512 c1 = _mm512_setzero_ps(), c2 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
      c1 = DpBf16(c1, At<kType>(row, i), At<kType>(act, i));
      c2 = DpBf16(c2, At<kType>(row, i + 32), At<kType>(act, i + 32));
    }
    double s = static_cast<double>(HsumPs512(c1)) + static_cast<double>(HsumPs512(c2));
    for (; i < n; ++i) s += static_cast<double>(ValueAt<kType>(row, i) * ValueAt<kType>(act, i));
    return static_cast<float>(s);
  } else {
    return VecDotTail<kType>(HsumPs512(VecDotLanes<kType>(row, act, n)), row, act, n);
  }
}

// One token, n_rows rows. Short F16 / F32 rows (such as the 64-wide output projection of
// qwen3moe, 151936 rows of 128 bytes) 16 at a time: one at a time, such a row costs as
// much in its horizontal sum as in its products. Per row the lanes are VecDotLanes' and
// HsumRows16 makes HsumPs512's adds, so the bits are the same.
template <WeightType kType>
TIERKV_AVX512_FN void VecDotRowsAvx512(const void* rows, size_t row_bytes, int64_t n_rows, const void* act, int64_t n,
                                      float* out) {
  const auto* base = static_cast<const uint8_t*>(rows);
  int64_t r = 0;
  if (kType != WeightType::kBF16 && n % 64 == 0 && row_bytes < kShortRowBytes && n_rows >= 16) {
    // F16: the activation widened once for all rows, not once per row (vcvtph2ps is one
    // 16-value conversion a cycle on the Zen 5 this was measured on, and a row converted
    // as many activation values as weights).
    constexpr WeightType kAct = kType == WeightType::kF16 ? WeightType::kF32 : kType;
    alignas(64) float widened[kType == WeightType::kF16 ? kShortRowBytes / 2 : 1];
    const void* x = act;
    if constexpr (kType == WeightType::kF16) {
      for (int64_t i = 0; i < n; i += 16) _mm512_store_ps(widened + i, Load16<kType>(At<kType>(act, i)));
      x = widened;
    }
    for (; r + 16 <= n_rows; r += 16) {
      PrefetchGroup(base + r * row_bytes, 16, row_bytes);
      __m512 acc[8];
      for (int j = 0; j < 8; ++j) {
        const __m512 t0 = VecDotLanes<kType, kAct>(base + static_cast<size_t>(r + 2 * j) * row_bytes, x, n);
        const __m512 t1 = VecDotLanes<kType, kAct>(base + static_cast<size_t>(r + 2 * j + 1) * row_bytes, x, n);
        // Rows 2j and 2j + 1, each as the 8 lanes lo + hi (HsumPs512's first add).
        acc[j] = _mm512_add_ps(_mm512_shuffle_f32x4(t0, t1, 0x44), _mm512_shuffle_f32x4(t0, t1, 0xee));
      }
      HsumRows16(acc, out + r);
    }
  }
  for (; r < n_rows; ++r) out[r] = VecDotAvx512<kType>(base + static_cast<size_t>(r) * row_bytes, act, n);
}

// The several-token step: 16 values (F32, F16) or 32 (BF16).
template <WeightType kType>
constexpr int64_t kBatchStep = kType == WeightType::kBF16 ? 32 : 16;

template <WeightType kType>
TIERKV_AVX512_FN inline __m512 BatchStep(__m512 acc, __m512 w16, const void* w, const void* x, int64_t i) {
  if constexpr (kType == WeightType::kBF16) {
    (void)w16;
    return DpBf16(acc, At<kType>(w, i), At<kType>(x, i));
  } else {
    (void)w;
    return _mm512_fmadd_ps(w16, Load16<kType>(At<kType>(x, i)), acc);
  }
}

// Several tokens, 2 rows x T tokens (T <= 4): per (row, token) tinyBLAS's one accumulator,
// each weight step loaded (and for F16 converted) once for the T tokens. nb is n here
// (kBlock 1); REQUIRES n % kBatchStep == 0. (Converting the activations to f32 once per
// call instead measured slower for F16, 20 - 29 GMAC/s against 33 - 35: four tokens' f32
// rows outgrow L1.)
template <WeightType kType, int T>
TIERKV_AVX512_FN inline void BatchDotRows2Tokens(const uint8_t* rows, size_t row_bytes, const void* const* acts,
                                                int64_t n, float* out, size_t out_stride) {
  const void* w[2] = {rows, rows + row_bytes};
  __m512 a[2][T];
  for (int r = 0; r < 2; ++r) {
    for (int t = 0; t < T; ++t) a[r][t] = _mm512_setzero_ps();
  }
  const bool stream = row_bytes >= kShortRowBytes;
  constexpr int64_t kStep = kBatchStep<kType>;
  for (int64_t i = 0; i < n; i += kStep) {
    if (stream && (i * static_cast<int64_t>(kValueBytes<kType>)) % 1024 == 0) {
      simd::PrefetchRowsAhead(At<kType>(w[0], i), 2 * row_bytes, 1024);
      simd::PrefetchRowsAhead(At<kType>(w[1], i), 2 * row_bytes, 1024);
    }
    __m512 u[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    if constexpr (kType != WeightType::kBF16) {
      for (int r = 0; r < 2; ++r) u[r] = Load16<kType>(At<kType>(w[r], i));
    }
    for (int t = 0; t < T; ++t) {
      for (int r = 0; r < 2; ++r) a[r][t] = BatchStep<kType>(a[r][t], u[r], w[r], acts[t], i);
    }
  }
  for (int t = 0; t < T; ++t) {
    float* o = out + static_cast<size_t>(t) * out_stride;
    for (int r = 0; r < 2; ++r) o[r] = HsumPs512(a[r][t]);
  }
}


// ---- Quantized types: AVX512-VNNI (and BW) kernels over several rows at once ----
//
// Each kernel reproduces the float arithmetic of its AVX2 counterpart in
// quant_avx2.cc operation for operation, per row (same lanes, same order, same
// rounding), so the results are bit-identical to it. Only the integer block sums change
// how they are computed (vpdpbusd / vpdpwssd, 512-bit K-quant sums, vector scale
// unpacking), and integer sums are exact in any order: no partial sum can overflow
// (|w| <= 128, |x| <= 127, 6-bit scales). Rows are handled 4 or 8 at a time: the
// activation loads and the per-block activation setup are shared, and that many independent
// accumulation chains hide the FMA latency that bounds the one-row loop.

#define TIERKV_VNNI_FN \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

// Rows per step, measured on the output projections (32000 x 256, one thread): Q8_0
// 444 us at 4 rows, 585 us at 8 (its 8 ymm chains spill; it now takes 4 rows in two zmm,
// DotQ8_0Rows4Zmm);
// Q6_K 424 us at 4, 387 us at 8.
constexpr int kRowsK = 8;

TIERKV_VNNI_FN inline float HalfV(uint16_t h) { return _cvtsh_ss(h); }
TIERKV_VNNI_FN inline __m256i Load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
TIERKV_VNNI_FN inline __m512i Load512(const void* p) { return _mm512_loadu_si512(p); }

template <typename Block>
inline const Block* RowBlocks(const void* rows, size_t row_bytes, int r) {
  return reinterpret_cast<const Block*>(static_cast<const uint8_t*>(rows) + static_cast<size_t>(r) * row_bytes);
}

// Sum of w[i] * x[i] over 32 int8 pairs as 8 int32 lanes (lane j: bytes 4j..4j+3, the
// same partition as maddubs + madd in the AVX2 kernel, so even the lanes agree).
TIERKV_VNNI_FN inline __m256i DotI8x32Vnni(__m256i w, __m256i x) {
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

TIERKV_VNNI_FN inline int HsumEpi32x8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// Q8_0, one row: 8 f32 lanes acc = fma(d_w * d_x, (float)p, acc) over the blocks, then
// HsumPs256 (DotQ8_0Avx2's order).
TIERKV_VNNI_FN inline float DotQ8_0Row1Vnni(const BlockQ8_0* w, const BlockQ8_0* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i p = DotI8x32Vnni(Load256(w[i].qs), Load256(x[i].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(HalfV(w[i].d) * HalfV(x[i].d)), _mm256_cvtepi32_ps(p), acc);
  }
  return HsumPs256(acc);
}

// The same for four rows in two 512-bit vectors: rows 2k and 2k + 1 share one (lanes 0-7
// and 8-15), and every lane does exactly what its row's lane does in DotQ8_0Row1Vnni, so
// the bits are the same; half the instructions per row (short rows, such as a 64-wide
// output projection, are mostly per-block overhead). vpdpbusd multiplies unsigned by
// signed bytes, so w is biased to w + 128 (an xor with 0x80) and each lane starts from
// -128 times its four x bytes' sum (NegBiasSums): the same integer, exactly.
// Per 32-bit lane, -b * (the sum of its four signed x bytes), b the unsigned byte in
// every byte of `bias`: the start value that turns vpdpbusd(w + b, x) = sum (w + b) * x
// into sum w * x (b = 128 for Q8_0's w ^ 0x80, 8 for Q4_0's raw nibbles).
TIERKV_VNNI_FN inline __m512i NegBiasSums(__m512i xx, __m512i bias) {
  return _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, xx));
}

// The f16 at p, p + stride, ... (16 or 8 rows' block scales) as f32. Scalar loads: as
// fast as a gather here, and gathers are slow on CPUs with the GDS microcode mitigation.
TIERKV_VNNI_FN inline __m512 StridedHalves16(const uint8_t* p, size_t stride) {
  alignas(32) uint16_t h[16];
  for (int r = 0; r < 16; ++r) std::memcpy(&h[r], p + static_cast<size_t>(r) * stride, 2);
  return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(h)));
}

TIERKV_VNNI_FN inline __m256 StridedHalves8(const void* p, size_t stride) {
  alignas(16) uint16_t h[8];
  for (int r = 0; r < 8; ++r) std::memcpy(&h[r], static_cast<const uint8_t*>(p) + static_cast<size_t>(r) * stride, 2);
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h)));
}

// Blocks per row under kShortRowBytes, at most (Q4_0's 18-byte blocks are the smallest).
constexpr int64_t kShortRowMaxBlocks = kShortRowBytes / sizeof(BlockQ4_0) + 1;

// d_w * d_x of 16 short rows for every block of theirs, block i's 16 products at
// out + 16 * i (the one mul each that the block loops did). Formed before the group's
// integer work: the 16 scalar loads of a block's scales are a latency that the block
// loop otherwise waits on (151936 x 64 Q8_0 in cache: 118 -> 107 us on two threads).
template <typename Block>
TIERKV_VNNI_FN inline void GroupScales16(const uint8_t* rows, size_t row_bytes, const BlockQ8_0* x, int64_t nb,
                                         float* out) {
  for (int64_t i = 0; i < nb; ++i) {
    const __m512 dw = StridedHalves16(rows + static_cast<size_t>(i) * sizeof(Block), row_bytes);
    _mm512_store_ps(out + 16 * i, _mm512_mul_ps(dw, _mm512_set1_ps(HalfV(x[i].d))));
  }
}

TIERKV_VNNI_FN inline void AccQ8_0Rows4Zmm(const void* rows, size_t row_bytes, const BlockQ8_0* x, int64_t nb,
                                           __m512* acc) {
  const BlockQ8_0* w[4];
  for (int r = 0; r < 4; ++r) w[r] = RowBlocks<BlockQ8_0>(rows, row_bytes, r);
  const __m512i lo_half = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i hi_half = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  acc[0] = acc[1] = _mm512_setzero_ps();
  const bool stream = row_bytes >= kShortRowBytes;
  for (int64_t i = 0; i < nb; ++i) {
    if (stream && i % 4 == 0) {
      for (int r = 0; r < 4; ++r) simd::PrefetchRowsAhead(&w[r][i], 4 * row_bytes, 4 * sizeof(BlockQ8_0));
    }
    const __m256i xq = Load256(x[i].qs);
    const __m512i xx = _mm512_inserti64x4(_mm512_castsi256_si512(xq), xq, 1);
    const __m512i neg = NegBiasSums(xx, bias);
    // d_w * d_x of the four rows, as the one-row kernel forms each (f16 -> f32, one mul).
    const __m128 dw = _mm_cvtph_ps(_mm_setr_epi16(static_cast<short>(w[0][i].d), static_cast<short>(w[1][i].d),
                                                  static_cast<short>(w[2][i].d), static_cast<short>(w[3][i].d), 0, 0,
                                                  0, 0));
    const __m512 d4 = _mm512_castps128_ps512(_mm_mul_ps(dw, _mm_set1_ps(HalfV(x[i].d))));
    for (int k = 0; k < 2; ++k) {
      const __m512i wq =
          _mm512_inserti64x4(_mm512_castsi256_si512(Load256(w[2 * k][i].qs)), Load256(w[2 * k + 1][i].qs), 1);
      const __m512i p = _mm512_dpbusd_epi32(neg, _mm512_xor_si512(wq, bias), xx);
      const __m512 d = _mm512_permutexvar_ps(k == 0 ? lo_half : hi_half, d4);
      acc[k] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc[k]);
    }
  }
}

TIERKV_VNNI_FN inline void DotQ8_0Rows4Zmm(const void* rows, size_t row_bytes, const BlockQ8_0* x, int64_t nb,
                                           float* out) {
  __m512 acc[2];
  AccQ8_0Rows4Zmm(rows, row_bytes, x, nb, acc);
  for (int k = 0; k < 2; ++k) {
    out[2 * k] = HsumPs256(_mm512_castps512_ps256(acc[k]));
    out[2 * k + 1] = HsumPs256(_mm512_extractf32x8_ps(acc[k], 1));
  }
}

// Sixteen short rows block by block (the rows of a group are read side by side, so only
// for rows under kShortRowBytes): the activation block is set up once for all 16 rows
// rather than once per 4, and the 16 rows' scales are converted and multiplied in one
// vector. Each acc[k] does exactly what AccQ8_0Rows4Zmm's does for rows 2k and 2k + 1,
// block by block, so the bits are the same.
TIERKV_VNNI_FN inline void AccQ8_0Rows16Short(const uint8_t* rows, size_t row_bytes, const BlockQ8_0* x, int64_t nb,
                                              __m512* acc) {
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  alignas(64) float scales[16 * kShortRowMaxBlocks];
  GroupScales16<BlockQ8_0>(rows, row_bytes, x, nb, scales);
  for (int k = 0; k < 8; ++k) acc[k] = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* col = rows + static_cast<size_t>(i) * sizeof(BlockQ8_0);
    const __m512i xx = _mm512_broadcast_i64x4(Load256(x[i].qs));
    const __m512i neg = NegBiasSums(xx, bias);
    const __m512 d16 = _mm512_load_ps(scales + 16 * i);
    for (int k = 0; k < 8; ++k) {
      const uint8_t* w0 = col + static_cast<size_t>(2 * k) * row_bytes + offsetof(BlockQ8_0, qs);
      const __m512i wq = _mm512_inserti64x4(_mm512_castsi256_si512(Load256(w0)), Load256(w0 + row_bytes), 1);
      const __m512i p = _mm512_dpbusd_epi32(neg, _mm512_xor_si512(wq, bias), xx);
      const __m512i sel = _mm512_setr_epi32(2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k + 1, 2 * k + 1,
                                            2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1);
      acc[k] = _mm512_fmadd_ps(_mm512_permutexvar_ps(sel, d16), _mm512_cvtepi32_ps(p), acc[k]);
    }
  }
}

TIERKV_VNNI_FN void DotQ8_0RowsVnni(const void* rows, size_t row_bytes, int64_t n_rows, const void* act, int64_t n,
                                   float* out) {
  const auto* x = static_cast<const BlockQ8_0*>(act);
  const auto* base = static_cast<const uint8_t*>(rows);
  int64_t r = 0;
  for (; r + 16 <= n_rows; r += 16) {
    PrefetchGroup(base + r * row_bytes, 16, row_bytes);
    __m512 acc[8];
    if (row_bytes < kShortRowBytes) {
      AccQ8_0Rows16Short(base + r * row_bytes, row_bytes, x, n / kQk0, acc);
    } else {
      for (int g = 0; g < 4; ++g) AccQ8_0Rows4Zmm(base + (r + 4 * g) * row_bytes, row_bytes, x, n / kQk0, acc + 2 * g);
    }
    HsumRows16(acc, out + r);
  }
  for (; r + 4 <= n_rows; r += 4) {
    PrefetchGroup(base + r * row_bytes, 4, row_bytes);
    DotQ8_0Rows4Zmm(base + r * row_bytes, row_bytes, x, n / kQk0, out + r);
  }
  for (; r < n_rows; ++r) out[r] = DotQ8_0Row1Vnni(RowBlocks<BlockQ8_0>(base + r * row_bytes, row_bytes, 0), x, n / kQk0);
}

// ---- Several tokens against the same rows (a prefill chunk): DotRowsTokensFn ----
//
// Q8_0, 8 rows x T tokens (T <= 4) block by block: each row pair's weight block is
// loaded, biased and its scales converted once for the T tokens, and each token's
// activation block set up once for the 8 rows. Per (row pair, token) the lanes do what
// AccQ8_0Rows4Zmm's do, in the same order: vpdpbusd from -128 x the x bytes' sums, then
// acc = fma(d_w * d_x, (float)p, acc), d_w * d_x one f32 multiply per lane. So every
// (row, token) is bit-identical to that row's DotQ8_0RowsVnni with that token alone.
template <int T>
TIERKV_VNNI_FN inline void DotQ8_0Rows8Tokens(const uint8_t* rows, size_t row_bytes, const void* const* acts,
                                             int64_t nb, float* out, size_t out_stride) {
  const BlockQ8_0* x[T];
  for (int t = 0; t < T; ++t) x[t] = static_cast<const BlockQ8_0*>(acts[t]);
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[4][T];
  for (int k = 0; k < 4; ++k) {
    for (int t = 0; t < T; ++t) acc[k][t] = _mm512_setzero_ps();
  }
  const bool stream = row_bytes >= kShortRowBytes;
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* col = rows + static_cast<size_t>(i) * sizeof(BlockQ8_0);
    if (stream && i % 4 == 0) {
      for (int r = 0; r < 8; ++r) {
        simd::PrefetchRowsAhead(col + static_cast<size_t>(r) * row_bytes, 8 * row_bytes, 4 * sizeof(BlockQ8_0));
      }
    }
    // Rows 2k and 2k + 1: their codes + 128 and their d_w, in the low and high halves.
    const __m512 dw8 = _mm512_castps256_ps512(StridedHalves8(col, row_bytes));
    __m512i wq[4];
    __m512 dw[4];
    for (int k = 0; k < 4; ++k) {
      const uint8_t* w0 = col + static_cast<size_t>(2 * k) * row_bytes + offsetof(BlockQ8_0, qs);
      wq[k] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(Load256(w0)), Load256(w0 + row_bytes), 1), bias);
      const __m512i sel = _mm512_setr_epi32(2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k + 1, 2 * k + 1,
                                            2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1);
      dw[k] = _mm512_permutexvar_ps(sel, dw8);
    }
    for (int t = 0; t < T; ++t) {
      const __m512i xx = _mm512_broadcast_i64x4(Load256(x[t][i].qs));
      const __m512i neg = NegBiasSums(xx, bias);
      const __m512 dx = _mm512_set1_ps(HalfV(x[t][i].d));
      for (int k = 0; k < 4; ++k) {
        const __m512i p = _mm512_dpbusd_epi32(neg, wq[k], xx);
        acc[k][t] = _mm512_fmadd_ps(_mm512_mul_ps(dw[k], dx), _mm512_cvtepi32_ps(p), acc[k][t]);
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    float* o = out + static_cast<size_t>(t) * out_stride;
    for (int k = 0; k < 4; ++k) {
      o[2 * k] = HsumPs256(_mm512_castps512_ps256(acc[k][t]));
      o[2 * k + 1] = HsumPs256(_mm512_extractf32x8_ps(acc[k][t], 1));
    }
  }
}

TIERKV_VNNI_FN inline __m256i UnpackQ4_0V(const uint8_t* qs) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(b, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
  return _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8));
}

// Q4_0: per row one f32 sum, acc = fma((float)isum, d_w * d_x, acc) over the blocks
// (DotQ4_0Avx2's order). Four rows keep their sums in the four lanes of one vector: a
// lane-wise vfmadd rounds exactly as the scalar fmaf.
TIERKV_VNNI_FN void DotQ4_0Rows4Vnni(const void* rows, size_t row_bytes, const BlockQ8_0* x, int64_t nb,
                                    float* out) {
  const BlockQ4_0* w[4];
  for (int r = 0; r < 4; ++r) w[r] = RowBlocks<BlockQ4_0>(rows, row_bytes, r);
  __m128 acc = _mm_setzero_ps();
  const bool stream = row_bytes >= kShortRowBytes;
  for (int64_t i = 0; i < nb; ++i) {
    if (stream && i % 8 == 0) {
      // Each row 1 KiB ahead into L1 only: with simd::PrefetchRowsAhead (the next 4 rows, a
      // short distance for this fast kernel) one thread read 32768 x 4096 from memory 8%
      // slower (5247 -> 5724 us), two 4% faster.
      for (int r = 0; r < 4; ++r) {
        PrefetchLines(reinterpret_cast<const uint8_t*>(&w[r][i]) + 1024, 8 * sizeof(BlockQ4_0));
      }
    }
    const __m256i xq = Load256(x[i].qs);
    __m256i p[4];
    for (int r = 0; r < 4; ++r) p[r] = DotI8x32Vnni(UnpackQ4_0V(w[r][i].qs), xq);
    // Integer horizontal sums of the four rows at once: [r0 r1 r2 r3].
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    const __m128 wd = _mm_cvtph_ps(_mm_setr_epi16(static_cast<short>(w[0][i].d), static_cast<short>(w[1][i].d),
                                                  static_cast<short>(w[2][i].d), static_cast<short>(w[3][i].d), 0, 0,
                                                  0, 0));
    const __m128 d = _mm_mul_ps(wd, _mm_set1_ps(HalfV(x[i].d)));
    acc = _mm_fmadd_ps(_mm_cvtepi32_ps(s), d, acc);
  }
  _mm_storeu_ps(out, acc);
}

TIERKV_VNNI_FN inline float DotQ4_0Row1Vnni(const BlockQ4_0* w, const BlockQ8_0* x, int64_t nb) {
  float acc = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i p = DotI8x32Vnni(UnpackQ4_0V(w[i].qs), Load256(x[i].qs));
    acc = __builtin_fmaf(static_cast<float>(HsumEpi32x8(p)), HalfV(w[i].d) * HalfV(x[i].d), acc);
  }
  return acc;
}

// vshufps on 32-bit integer lanes.
template <int kImm>
TIERKV_VNNI_FN inline __m512i ShufflePsEpi32(__m512i a, __m512i b) {
  return _mm512_castps_si512(_mm512_shuffle_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b), kImm));
}

// The 16 integer sums of 8 vectors that hold rows 2j (lanes 0-7) and 2j + 1 (lanes 8-15),
// row r in lane r: HsumRows16's shuffles with integer adds (exact in any order).
TIERKV_VNNI_FN inline __m512i ReduceEpi32Rows16(const __m512i* p) {
  __m512i s4[4], s2[2];
  for (int i = 0; i < 4; ++i) {
    const __m512i x = p[2 * i], y = p[2 * i + 1];
    s4[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(x, y, 0x88), _mm512_shuffle_i32x4(x, y, 0xdd));
  }
  for (int i = 0; i < 2; ++i) {
    s2[i] = _mm512_add_epi32(ShufflePsEpi32<0x44>(s4[2 * i], s4[2 * i + 1]), ShufflePsEpi32<0xee>(s4[2 * i], s4[2 * i + 1]));
  }
  const __m512i s1 = _mm512_add_epi32(ShufflePsEpi32<0x88>(s2[0], s2[1]), ShufflePsEpi32<0xdd>(s2[0], s2[1]));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_epi32(order, s1);
}

// The 32 nibbles (0..15, in element order) of the Q4_0-layout blocks at `block` and
// `block + row_bytes` (two rows' blocks i): each row's 16 bytes in two 128-bit lanes,
// [row 2k | row 2k | row 2k + 1 | row 2k + 1], shifted by 0 and 4 and masked.
TIERKV_VNNI_FN inline __m512i NibblePair(const uint8_t* block, size_t row_bytes) {
  const uint8_t* q0 = block + offsetof(BlockQ4_0, qs);
  const __m256i two =
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q0))),
                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(q0 + row_bytes)), 1);
  const __m512i qq = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), _mm512_castsi256_si512(two));
  return _mm512_and_si512(_mm512_srlv_epi64(qq, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)), _mm512_set1_epi8(0x0f));
}

// Sixteen short Q4_0 rows block by block (as AccQ8_0Rows16Short): a zmm holds two rows'
// 32 values (each row's 16 bytes in two 128-bit lanes, shifted by 0 and 4), taken as
// unsigned nibbles by vpdpbusd from a start of -8 * (x's four-byte sums), so the -8
// offset costs nothing per row; the 16 block sums come out of one integer tree, and
// acc[r] = fma((float)isum_r, d_w * d_x, acc[r]) runs for the 16 rows in one vector:
// lane r does what DotQ4_0Rows4Vnni's lane does for row r, so the bits are the same.
TIERKV_VNNI_FN inline void DotQ4_0Rows16Short(const uint8_t* rows, size_t row_bytes, const BlockQ8_0* x, int64_t nb,
                                              float* out) {
  const __m512i eight = _mm512_set1_epi8(8);
  alignas(64) float scales[16 * kShortRowMaxBlocks];
  GroupScales16<BlockQ4_0>(rows, row_bytes, x, nb, scales);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* col = rows + static_cast<size_t>(i) * sizeof(BlockQ4_0);
    const __m512i xx = _mm512_broadcast_i64x4(Load256(x[i].qs));
    const __m512i neg = NegBiasSums(xx, eight);
    __m512i p[8];
    for (int k = 0; k < 8; ++k) {
      p[k] = _mm512_dpbusd_epi32(neg, NibblePair(col + static_cast<size_t>(2 * k) * row_bytes, row_bytes), xx);
    }
    const __m512 isum = _mm512_cvtepi32_ps(ReduceEpi32Rows16(p));
    acc = _mm512_fmadd_ps(isum, _mm512_load_ps(scales + 16 * i), acc);
  }
  _mm512_storeu_ps(out, acc);
}

// Q4_K / Q5_K: the 8 six-bit scales in bytes 0-7 and the 8 mins in bytes 8-15 (ggml's
// unpacking of the 12 packed bytes; equal to ScaleMinK4 for j = 0..7).
inline void UnpackScalesMinsK4(const uint8_t* packed, uint32_t out[4]) {
  constexpr uint32_t kMask1 = 0x3f3f3f3f, kMask2 = 0x0f0f0f0f, kMask3 = 0x03030303;
  uint32_t u[3];
  std::memcpy(u, packed, 12);
  out[0] = u[0] & kMask1;
  out[1] = (u[2] & kMask2) | (((u[0] >> 6) & kMask3) << 4);
  out[2] = u[1] & kMask1;
  out[3] = ((u[2] >> 4) & kMask2) | (((u[1] >> 6) & kMask3) << 4);
}

TIERKV_VNNI_FN inline int ReduceEpi32x16(__m512i v) {
  const __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
  return HsumEpi32x8(s8);
}

// The eight 16-lane integer sums of acc[0..7] as one vector of 8 (row r in lane r):
// integer adds, exact in any order, in a shuffle tree instead of eight horizontal sums.
TIERKV_VNNI_FN inline __m256i ReduceEpi32x16Rows8(const __m512i* acc) {
  __m512i v[4], w[2];
  for (int j = 0; j < 4; ++j) {  // rows 2j, 2j + 1: 8 lanes each
    const __m512i a = acc[2 * j], b = acc[2 * j + 1];
    v[j] = _mm512_add_epi32(_mm512_shuffle_i32x4(a, b, 0x44), _mm512_shuffle_i32x4(a, b, 0xee));
  }
  for (int j = 0; j < 2; ++j) {  // rows 4j .. 4j + 3: one 128-bit lane each
    const __m512i a = v[2 * j], b = v[2 * j + 1];
    w[j] = _mm512_add_epi32(_mm512_shuffle_i32x4(a, b, 0x88), _mm512_shuffle_i32x4(a, b, 0xdd));
  }
  // 128-bit lane k: [row k, row k, row 4 + k, row 4 + k] after two in-lane levels.
  __m512i t = _mm512_add_epi32(_mm512_unpacklo_epi64(w[0], w[1]), _mm512_unpackhi_epi64(w[0], w[1]));
  t = _mm512_add_epi32(t, _mm512_shuffle_epi32(t, _MM_PERM_CDAB));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, t));
}

// sum += d * isum - dmin * summ with d = d_x * d_w and dmin = d_x * dmin_w: the float
// step of the AVX2 kernels of the K-quants with mins (Q2_K, Q4_K, Q5_K). For 8 rows
// lane-wise (row r's d and dmin at d_w + r * stride), contracted as GCC contracts the
// scalar form, fma(isum, d, -(dmin * summ)) then the add (the bit tests confirm it);
// for one row, that scalar form itself.
TIERKV_VNNI_FN inline __m256 AddScaledLessMins8(__m256 sum8, float d_x, const uint16_t* d_w, const uint16_t* dmin_w,
                                                size_t stride, __m256i isum, const int32_t* summs) {
  const __m256 xd = _mm256_set1_ps(d_x);
  const __m256 d8 = _mm256_mul_ps(xd, StridedHalves8(d_w, stride));
  const __m256 m8 = _mm256_mul_ps(xd, StridedHalves8(dmin_w, stride));
  const __m256 summ = _mm256_cvtepi32_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(summs)));
  return _mm256_add_ps(_mm256_fmsub_ps(_mm256_cvtepi32_ps(isum), d8, _mm256_mul_ps(m8, summ)), sum8);
}

// Q4_K's two chains for 8 rows lane-wise: a8 = fma(isum, d_x * d_w, a8) and
// m8 = fma(summ, d_x * dmin_w, m8) (K45Avx2's Step with kFive = false).
TIERKV_VNNI_FN inline void AddSplit8(__m256* a8, __m256* m8, float d_x, const uint16_t* d_w, const uint16_t* dmin_w,
                                     size_t stride, __m256i isum, const int32_t* summs) {
  const __m256 xd = _mm256_set1_ps(d_x);
  const __m256 d8 = _mm256_mul_ps(xd, StridedHalves8(d_w, stride));
  const __m256 dm8 = _mm256_mul_ps(xd, StridedHalves8(dmin_w, stride));
  const __m256 summ = _mm256_cvtepi32_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(summs)));
  *a8 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), d8, *a8);
  *m8 = _mm256_fmadd_ps(summ, dm8, *m8);
}

// The float state of 8 rows (one per lane) over their super-blocks: one chain, or Q4_K's
// two (Result8: a - m).
struct Chain8 {
  __m256 s;
};
struct Chains8 {
  __m256 a, m;
};
TIERKV_VNNI_FN inline __m256 Result8(const Chain8& c) { return c.s; }
TIERKV_VNNI_FN inline __m256 Result8(const Chains8& c) { return _mm256_sub_ps(c.a, c.m); }

TIERKV_VNNI_FN inline float AddScaledLessMins1(float sum1, float d_x, uint16_t d_w, uint16_t dmin_w, int isum,
                                               int summ) {
  const float d = d_x * HalfV(d_w);
  const float dmin = d_x * HalfV(dmin_w);
  sum1 += d * static_cast<float>(isum) - dmin * static_cast<float>(summ);
  return sum1;
}

// sum += d_x * d_w * (float)isum for 8 rows lane-wise: the float step of Q6_K and Q3_K
// (the product contracted into an FMA as GCC contracts the scalar form).
TIERKV_VNNI_FN inline __m256 AddScaled8(__m256 sum8, float d_x, const uint16_t* d_w, size_t stride, __m256i isum) {
  const __m256 d8 = _mm256_mul_ps(_mm256_set1_ps(d_x), StridedHalves8(d_w, stride));
  return _mm256_fmadd_ps(d8, _mm256_cvtepi32_ps(isum), sum8);
}

// The K-quant multi-row kernels over n_rows rows: groups of kRowsK rows through Group
// (a group's rows read side by side), the rows left over one by one through One.
using KGroupFn = void (*)(const void* rows, size_t row_bytes, const BlockQ8_K* x, int64_t nb, float* out);
template <KGroupFn Group, KGroupFn One>
TIERKV_VNNI_FN void DotRowsK(const void* rows, size_t row_bytes, int64_t n_rows, const void* act, int64_t n,
                            float* out) {
  const auto* x = static_cast<const BlockQ8_K*>(act);
  const auto* base = static_cast<const uint8_t*>(rows);
  int64_t r = 0;
  for (; r + kRowsK <= n_rows; r += kRowsK) {
    PrefetchGroup(base + r * row_bytes, kRowsK, row_bytes);
    Group(base + r * row_bytes, row_bytes, x, n / kQkK, out + r);
  }
  for (; r < n_rows; ++r) One(base + r * row_bytes, row_bytes, x, n / kQkK, out + r);
}

// The activation's 16 bsums added in pairs (|.| <= 32 * 127) as 8 int16: sub-block j's
// sum of codes, for the K-quants with 32-value sub-blocks.
TIERKV_VNNI_FN inline __m128i BsumPairs(const BlockQ8_K& x) {
  const __m256i bs = Load256(x.bsums);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(
      _mm256_packs_epi32(_mm256_madd_epi16(bs, _mm256_set1_epi16(1)), _mm256_setzero_si256()), _MM_SHUFFLE(3, 1, 2, 0)));
}

// Sum over the 8 sub-blocks of min_j * (activation sum of sub-block j), exactly.
TIERKV_VNNI_FN inline int32_t MinsTimesSums(__m128i mn16, __m128i bpair) {
  const __m128i mprod = _mm_madd_epi16(mn16, bpair);
  __m128i ms = _mm_add_epi32(mprod, _mm_shuffle_epi32(mprod, _MM_SHUFFLE(1, 0, 3, 2)));
  ms = _mm_add_epi32(ms, _mm_shuffle_epi32(ms, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(ms);
}

// ggml's lanes (DotQ6_KScalar, DotQ5_KScalar): a zmm lane L < 8 holds values 4L .. 4L + 3
// of the first 32 of its 64 activation values and lane L + 8 those of the second 32, so
// lane L of the ymm fold is ggml's integer lane L (Q6_K's offset, Q6KOffset, is in
// lanes 0-7).
TIERKV_VNNI_FN inline __m256i FoldLanes8(__m512i acc) {
  return _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
}
TIERKV_VNNI_FN inline __m256 AddLanes8(__m256 lanes, float d_x, uint16_t d_w, __m512i acc) {
  return _mm256_fmadd_ps(_mm256_set1_ps(d_x * HalfV(d_w)), _mm256_cvtepi32_ps(FoldLanes8(acc)), lanes);
}
// Q5_K's mins chain for R rows (row r in lane r; R = 1 uses lane 0):
// m = fma(-(d_x * dmin_w), (float)summ, m), ggml's `summs += dmin * summ` as GCC contracts it.
template <int R>
TIERKV_VNNI_FN inline __m256 AddMins8(__m256 m8, float d_x, const uint16_t* dmin_w, size_t stride,
                                      const int32_t* summs) {
  if constexpr (R == 1) {
    const float dmin = -(d_x * HalfV(dmin_w[0]));
    return _mm256_set_m128(_mm_setzero_ps(), _mm_set_ss(__builtin_fmaf(dmin, static_cast<float>(summs[0]),
                                                                        _mm256_cvtss_f32(m8))));
  } else {
    const __m256 dmin8 =
        _mm256_xor_ps(_mm256_mul_ps(_mm256_set1_ps(d_x), StridedHalves8(dmin_w, stride)), _mm256_set1_ps(-0.0f));
    const __m256 summ = _mm256_cvtepi32_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(summs)));
    return _mm256_fmadd_ps(dmin8, summ, m8);
  }
}
TIERKV_VNNI_FN inline float FinishLanes8(__m256 lanes) { return simd::HsumLanes8(lanes); }
// AddLanes8 for the 8 rows of a group (row r's block at w0 + r * row_bytes).
template <typename Block>
TIERKV_VNNI_FN inline void AddLanesRows8(__m256 lanes[8], float d_x, const Block* w0, size_t row_bytes,
                                         const __m512i accs[8]) {
  for (int r = 0; r < 8; ++r) {
    const Block* w = reinterpret_cast<const Block*>(reinterpret_cast<const uint8_t*>(w0) + r * row_bytes);
    lanes[r] = AddLanes8(lanes[r], d_x, w->d, accs[r]);
  }
}

// One Q4_K (kFive = false) or Q5_K super-block of a row, unpacked for vpmaddubsw +
// vpdpwssd against the activation's four 64-byte vectors: u[c] holds the codes of
// sub-blocks 2c and 2c+1 (the 32 bytes of qs go to both halves of a zmm; a per-half
// shift 0 | 4 picks the low or high nibbles; Q5_K adds its 5th bits), sc[c] their
// scales as words. Returns the 8 mins as int16.
template <bool kFive>
TIERKV_VNNI_FN inline __m128i UnpackK4Row(const std::conditional_t<kFive, BlockQ5_K, BlockQ4_K>& b, __m512i u[4],
                                          __m512i sc[4]) {
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i nibble_shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);  // [0 | 4]
  alignas(16) uint32_t sm[4];
  UnpackScalesMinsK4(b.scales, sm);
  const __m128i scmn = _mm_load_si128(reinterpret_cast<const __m128i*>(sm));
  const __m512i scz = _mm512_castsi128_si512(_mm_cvtepu8_epi16(scmn));  // 8 scales
  __m512i qh = _mm512_setzero_si512();
  if constexpr (kFive) qh = _mm512_broadcast_i64x4(Load256(b.qh));
  for (int c = 0; c < 4; ++c) {
    const __m512i q = _mm512_broadcast_i64x4(Load256(b.qs + 32 * c));
    u[c] = _mm512_and_si512(_mm512_srlv_epi16(q, nibble_shift), m4);
    if constexpr (kFive) {
      // Bit 2c of qh[l] is the 5th bit of sub-block 2c, bit 2c+1 that of 2c+1.
      const __m512i hshift = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(static_cast<short>(2 * c))),
                                                _mm256_set1_epi16(static_cast<short>(2 * c + 1)), 1);
      u[c] = _mm512_or_si512(
          u[c], _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, hshift), _mm512_set1_epi8(1)), 4));
    }
    // Words 0-15 take scale 2c, words 16-31 scale 2c+1.
    const __m512i idx = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(static_cast<short>(2 * c))),
                                           _mm256_set1_epi16(static_cast<short>(2 * c + 1)), 1);
    sc[c] = _mm512_permutexvar_epi16(idx, scz);
  }
  return _mm_cvtepu8_epi16(_mm_srli_si128(scmn, 8));  // 8 mins
}

// Q4_K (kFive = false) and Q5_K (kFive = true). Per super-block: the activation's 256
// codes as four 64-byte vectors (sub-blocks 2c and 2c+1 are x[64c .. 64c + 63]) and the
// pair sums of its bsums are shared by the rows. Per row and chunk c, the 32 bytes of qs
// go to both halves of a zmm; a per-half shift (0 | 4) picks the low or high nibbles,
// so one vector holds sub-blocks 2c and 2c+1 in the activation's order. The float part
// is K45Avx2's: Q5_K sum += d * (float)isum - dmin * (float)summ; Q4_K two chains,
// a = fma(isum, d, a) and m = fma(summ, dmin, m), a - m at the end (AddSplit8).
template <bool kFive, int R>
TIERKV_VNNI_FN inline void DotK4RowsVnniT(const void* rows, size_t row_bytes, const BlockQ8_K* x, int64_t nb,
                                         float* out) {
  static_assert(R == 1 || R == 8);
  using Block = std::conditional_t<kFive, BlockQ5_K, BlockQ4_K>;
  // Row pointers as offsets of row 0 and the row loops unrolled (as DotQ6_KRowsVnniT).
  const auto* base = static_cast<const uint8_t*>(rows);
  float sum1 = 0.0f, mins1 = 0.0f;  // Q4_K, R == 1
  Chains8 st8{};                     // Q4_K, R == 8: one row per lane
  __m256 lanes[R];                   // Q5_K: per row, ggml's 8 float lanes
  __m256 mins8 = _mm256_setzero_ps();  // Q5_K: the rows' mins chains, one per lane
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) lanes[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    __m512i xq[4];
    for (int c = 0; c < 4; ++c) xq[c] = Load512(x[i].qs + 64 * c);
    const __m128i bpair = BsumPairs(x[i]);
    __m512i accs[R];
    alignas(32) int32_t summs[R];
    const Block* w0 = reinterpret_cast<const Block*>(base) + i;
    auto row = [&](int r) { return RowBlocks<Block>(w0, row_bytes, r); };
    if (R > 1 && row_bytes >= kShortRowBytes) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) simd::PrefetchRowsAhead(row(r), R * row_bytes, sizeof(Block));
    }
    auto one_row = [&](int r) TIERKV_VNNI_FN {
      __m512i u[4], sc[4];
      const __m128i mn16 = UnpackK4Row<kFive>(*row(r), u, sc);
      summs[r] = MinsTimesSums(mn16, bpair);
      __m512i acc = _mm512_setzero_si512();
      for (int c = 0; c < 4; ++c) acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(u[c], xq[c]), sc[c]);
      accs[r] = acc;
    };
    if constexpr (kFive) {
      // Rolled: unrolled, GCC 12 spilled Q5_K's eight lane vectors (8192 x 4096 on two
      // threads 6 - 8% slower), while Q4_K's one vector per row gained.
      for (int r = 0; r < R; ++r) one_row(r);
      for (int r = 0; r < R; ++r) lanes[r] = AddLanes8(lanes[r], x[i].d, row(r)->d, accs[r]);
    } else {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) one_row(r);
    }
    if constexpr (kFive) {
      mins8 = AddMins8<R>(mins8, x[i].d, &w0->dmin, row_bytes, summs);
    } else if constexpr (R == 8) {
      AddSplit8(&st8.a, &st8.m, x[i].d, &w0->d, &w0->dmin, row_bytes, ReduceEpi32x16Rows8(accs), summs);
    } else {
      sum1 = __builtin_fmaf(static_cast<float>(ReduceEpi32x16(accs[0])), x[i].d * HalfV(w0->d), sum1);
      mins1 = __builtin_fmaf(static_cast<float>(summs[0]), x[i].d * HalfV(w0->dmin), mins1);
    }
  }
  if constexpr (kFive && R == 8) {
    _mm256_storeu_ps(out, _mm256_add_ps(simd::HsumLanesRows8(lanes), mins8));
  } else if constexpr (kFive) {
    out[0] = FinishLanes8(lanes[0]) + _mm256_cvtss_f32(mins8);
  } else if constexpr (R == 8) {
    _mm256_storeu_ps(out, Result8(st8));
  } else {
    out[0] = sum1 - mins1;
  }
}

template <bool kFive>
constexpr DotRowsFn DotK4RowsVnni = DotRowsK<DotK4RowsVnniT<kFive, kRowsK>, DotK4RowsVnniT<kFive, 1>>;

// Q6_K. Per half h of a super-block: ql[64h .. 64h + 63] as one zmm holds the low
// nibbles of chunks 0 and 1 (values 0-63 of the half) and, shifted, the high nibbles of
// chunks 2 and 3 (values 64-127), each matching 64 contiguous activation codes; qh is
// broadcast to both halves, its bits masked per half and moved to bits 4,5 (left 4 | 2
// for chunks 0 | 1, right 0 | 2 for chunks 2 | 3), then merged with the nibbles by one
// bitwise select. Each 128-bit lane is one 16-value group, so the scale vector is a
// word broadcast per lane of the 16 scales.
// The -32 offset goes through the bsums (as in DotQ6_KAvx2). Float part:
// sum += d_x * d_w * (float)sumi.
//
// UnpackQ6KRow: one row's super-block as u[k] (the codes matching the activation's
// 64-byte vector k) and sc[k] (their scales as words); returns the 16 scales as int16.
// Word k of the scale vector of (half h, part p) is scale 8h + 4p + k / 8 = 4m + k / 8
// (m = 2h + p). One word permutation per row puts scales L, 4 + L, 8 + L, 12 + L in
// 128-bit lane L; an in-lane byte shuffle then broadcasts word m of every lane (one
// vpermw and four vpshufb per row instead of four vpermw). With the high-bit select
// below and two integer chains per row: 32000 x 256 in cache, two threads, medians of
// 7 alternated runs, 93.4 -> 84.8 us (72 with no scales at all: the per-row
// dependency chain is the limit).
TIERKV_VNNI_FN inline __m256i UnpackQ6KRow(const BlockQ6_K& b, __m512i u[4], __m512i sc[4]) {
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  // Half h's qh bits: 0,1 (chunk 0) and 4,5 (chunk 2) for h = 0 in the low 256 bits, 2,3
  // and 6,7 for h = 1 in the high ones (each half's qh is broadcast to both).
  const __m512i qh_keep =
      _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi8(0x33)), _mm256_set1_epi8(static_cast<char>(0xcc)), 1);
  const __m512i shift_a =
      _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(4)), _mm256_set1_epi16(2), 1);  // left [4 | 2]
  const __m512i shift_b = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);   // right [0 | 2]
  const __m512i lane_idx = _mm512_set_epi16(15, 11, 7, 3, 15, 11, 7, 3, 14, 10, 6, 2, 14, 10, 6, 2,  //
                                            13, 9, 5, 1, 13, 9, 5, 1, 12, 8, 4, 0, 12, 8, 4, 0);
  const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
  const __m512i s4 = _mm512_permutexvar_epi16(lane_idx, _mm512_castsi256_si512(sc16));
  for (int h = 0; h < 2; ++h) {
    const __m512i ql = Load512(b.ql + 64 * h);
    // The two high bits of every value moved to bits 4,5 of its byte; the other bits
    // that land in bits 4-7 are the zeros qh_keep left (bits a 16-bit shift carries
    // across bytes fall in bits 0-3, which the select below takes from ql).
    const __m512i qh = _mm512_and_si512(_mm512_broadcast_i64x4(Load256(b.qh + 32 * h)), qh_keep);
    // m4 ? low nibbles : high bits (vpternlog 0xe4 is "c ? a : b").
    u[2 * h] = _mm512_ternarylogic_epi32(ql, _mm512_sllv_epi16(qh, shift_a), m4, 0xe4);
    u[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), _mm512_srlv_epi16(qh, shift_b), m4, 0xe4);
  }
  for (int m = 0; m < 4; ++m) {
    sc[m] = _mm512_shuffle_epi8(s4, _mm512_set1_epi16(static_cast<short>(((2 * m + 1) << 8) | (2 * m))));
  }
  return sc16;
}

// -32 * sum_g sc_g * bsums_g: Q6_K's offset, folded into the integer sum.
TIERKV_VNNI_FN inline __m512i Q6KOffset(__m256i sc16, __m256i bsums) {
  return _mm512_zextsi256_si512(simd::Q6KOffsetLanes(sc16, bsums));
}

template <int R>
TIERKV_VNNI_FN inline void DotQ6_KRowsVnniT(const void* rows, size_t row_bytes, const BlockQ8_K* x, int64_t nb,
                                           float* out) {
  static_assert(R == 1 || R == 8);
  // The row loops unrolled, so each row's lanes stay in a register (rolled, GCC 12 kept
  // lanes[] on the stack and formed the row pointers with 64-bit vector multiplies).
  const auto* base = static_cast<const uint8_t*>(rows);
  __m256 lanes[R];  // per row, ggml's 8 float lanes
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) lanes[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    __m512i xq[4];
    for (int k = 0; k < 4; ++k) xq[k] = Load512(x[i].qs + 64 * k);
    const __m256i bs = Load256(x[i].bsums);
    const auto* w0 = reinterpret_cast<const BlockQ6_K*>(base) + i;
    auto row = [&](int r) { return RowBlocks<BlockQ6_K>(w0, row_bytes, r); };
    if (R > 1 && row_bytes >= kShortRowBytes) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) simd::PrefetchRowsAhead(row(r), R * row_bytes, sizeof(BlockQ6_K));
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const BlockQ6_K& b = *row(r);
      __m512i u[4], sc[4];
      const __m256i sc16 = UnpackQ6KRow(b, u, sc);
      // Two integer chains (exact in any order) and the offset last: the row's
      // dependency chain is what bounds this loop, not its width.
      __m512i acc_a = _mm512_setzero_si512(), acc_b = _mm512_setzero_si512();
      for (int h = 0; h < 2; ++h) {
        acc_a = _mm512_dpwssd_epi32(acc_a, _mm512_maddubs_epi16(u[2 * h], xq[2 * h]), sc[2 * h]);
        acc_b = _mm512_dpwssd_epi32(acc_b, _mm512_maddubs_epi16(u[2 * h + 1], xq[2 * h + 1]), sc[2 * h + 1]);
      }
      lanes[r] = AddLanes8(lanes[r], x[i].d, b.d, _mm512_sub_epi32(_mm512_add_epi32(acc_a, acc_b), Q6KOffset(sc16, bs)));
    }
  }
  if constexpr (R == 8) {
    _mm256_storeu_ps(out, simd::HsumLanesRows8(lanes));
  } else {
    out[0] = FinishLanes8(lanes[0]);
  }
}

constexpr DotRowsFn DotQ6_KRowsVnni = DotRowsK<DotQ6_KRowsVnniT<kRowsK>, DotQ6_KRowsVnniT<1>>;

// Q2_K (kThree = false) and Q3_K (kThree = true). DotQ23_KAvx2 sums, per super-block, the
// 16-value groups' 2-bit (Q2_K) or 3-bit (Q3_K: low 2 bits + 4 * hmask bit) unsigned
// values times the activation, times the group's scale, exactly in integers; then
//   Q2_K: sum += d * isum - dmin * summ (mins through the activation's 16-value sums),
//   Q3_K: sum += d_x * d_w * (isum - 4 * corr) (the -4 offset through those sums).
// Here zmm k of a super-block covers activation values 64k .. 64k + 63, whose 128-bit
// lane L is group 4k + L: the 32 bytes of qs of half k / 2 go to both 256-bit halves,
// shifted per half to chunk 2 (k % 2) and 2 (k % 2) + 1 (and Q3_K's hmask the same way
// to its bits 4h + j), multiplied by vpmaddubsw and weighted per lane by vpdpwssd. The
// scales are unpacked with vector shifts (no per-group scalar work, which bounds the
// AVX2 kernel), Q3_K's correction is folded into the integer sum as Q6_K's is, and the
// float part per row is DotQ23_KAvx2's, lane-wise for 8 rows (the contractions are
// GCC's of the scalar forms, as for Q4_K and Q6_K; the bit tests confirm them).
// One Q2_K (kThree = false) or Q3_K super-block of a row, unpacked: u[k] the values that
// match the activation's 64-byte vector k, sc[k] their group scales as words. Returns
// Q3_K's 16 scales, or Q2_K's 16 mins, as int16 (for the bsums terms).
// Word w of row k: 4k + w / 8, the group whose scale multiplies it.
alignas(64) constexpr int16_t kQ23GroupIdx[4][32] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
    {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9, 10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
    {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13,
     14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15}};

template <bool kThree>
TIERKV_VNNI_FN inline __m256i UnpackQ23KRow(const std::conditional_t<kThree, BlockQ3_K, BlockQ2_K>& b, __m512i u[4],
                                            __m512i sc[4]) {
  const __m512i m2 = _mm512_set1_epi8(3);
  __m256i sc16, ret;  // the 16 group scales as int16
  if constexpr (kThree) {
    sc16 = simd::ScalesQ3K(b.scales);
    ret = sc16;
  } else {
    const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
    const __m128i mask4 = _mm_set1_epi8(0x0f);
    sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(s, mask4));
    ret = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), mask4));
  }
  const __m512i scz = _mm512_castsi256_si512(sc16);
  [[maybe_unused]] __m512i hm;
  if constexpr (kThree) hm = _mm512_broadcast_i64x4(Load256(b.hmask));
  for (int k = 0; k < 4; ++k) {
    const int h = k / 2, c = k % 2;
    // Chunks 2c, 2c + 1 (2 bits each) in the two halves.
    const __m512i chunk_shift = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(static_cast<short>(4 * c))),
                                                   _mm256_set1_epi16(static_cast<short>(4 * c + 2)), 1);
    const __m512i q = _mm512_broadcast_i64x4(Load256(b.qs + 32 * h));
    u[k] = _mm512_and_si512(_mm512_srlv_epi16(q, chunk_shift), m2);
    if constexpr (kThree) {
      // Bit 4h + j of hmask[l] for chunk j = 2c (low half) and 2c + 1 (high half).
      const __m512i hshift =
          _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(static_cast<short>(4 * h + 2 * c))),
                             _mm256_set1_epi16(static_cast<short>(4 * h + 2 * c + 1)), 1);
      u[k] = _mm512_or_si512(u[k],
                             _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hm, hshift), _mm512_set1_epi8(1)), 2));
    }
    // Word w of zmm k takes the scale of group 4k + w / 8.
    const __m512i group_idx = _mm512_load_si512(kQ23GroupIdx[k]);
    sc[k] = _mm512_permutexvar_epi16(group_idx, scz);
  }
  return ret;
}

// The activation's bsums as the Q2_K / Q3_K terms want them: Q3_K's times -4 (its
// offset, |.| <= 8128), Q2_K's as they are (its mins).
template <bool kThree>
TIERKV_VNNI_FN inline __m256i Q23KBsums(const BlockQ8_K& x) {
  const __m256i bs = Load256(x.bsums);
  if constexpr (kThree) return _mm256_mullo_epi16(bs, _mm256_set1_epi16(-4));
  return bs;
}

// The integer start of a Q2_K / Q3_K row's sum for one activation block (bs from
// Q23KBsums): Q3_K folds its offset in (-4 * sum_g sc_g * bsums_g, exact); Q2_K starts
// at 0 and reports its mins term (sum_g min_g * bsums_g) in *summ.
template <bool kThree>
TIERKV_VNNI_FN inline __m512i Q23KStart(__m256i sc_or_mins, __m256i bs, int32_t* summ) {
  if constexpr (kThree) {
    (void)summ;
    return _mm512_zextsi256_si512(_mm256_madd_epi16(sc_or_mins, bs));
  } else {
    *summ = HsumEpi32x8(_mm256_madd_epi16(sc_or_mins, bs));
    return _mm512_setzero_si512();
  }
}

template <bool kThree, int R>
TIERKV_VNNI_FN inline void DotQ23_KRowsVnniT(const void* rows, size_t row_bytes, const BlockQ8_K* x, int64_t nb,
                                            float* out) {
  static_assert(R == 1 || R == 8);
  using Block = std::conditional_t<kThree, BlockQ3_K, BlockQ2_K>;
  const auto* base = static_cast<const uint8_t*>(rows);  // rows as offsets of row 0 (DotQ6_KRowsVnniT)
  float sum1 = 0.0f;                  // R == 1
  __m256 sum8 = _mm256_setzero_ps();  // R == 8: the eight rows' sums, one per lane
  for (int64_t i = 0; i < nb; ++i) {
    __m512i xq[4];
    for (int k = 0; k < 4; ++k) xq[k] = Load512(x[i].qs + 64 * k);
    const __m256i bs = Q23KBsums<kThree>(x[i]);
    const Block* w0 = reinterpret_cast<const Block*>(base) + i;
    auto row = [&](int r) { return RowBlocks<Block>(w0, row_bytes, r); };
    if (R > 1 && row_bytes >= kShortRowBytes) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) simd::PrefetchRowsAhead(row(r), R * row_bytes, sizeof(Block));
    }
    __m512i accs[R];
    alignas(32) int32_t summs[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m512i u[4], sc[4];
      const __m256i s16 = UnpackQ23KRow<kThree>(*row(r), u, sc);
      __m512i acc = Q23KStart<kThree>(s16, bs, &summs[r]);
      for (int k = 0; k < 4; ++k) acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(u[k], xq[k]), sc[k]);
      accs[r] = acc;
    }
    if constexpr (kThree && R == 8) {  // sum += d_x * d_w * isum, as Q6_K
      sum8 = AddScaled8(sum8, x[i].d, &w0->d, row_bytes, ReduceEpi32x16Rows8(accs));
    } else if constexpr (kThree) {
      sum1 += x[i].d * HalfV(w0->d) * static_cast<float>(ReduceEpi32x16(accs[0]));
    } else if constexpr (R == 8) {
      sum8 = AddScaledLessMins8(sum8, x[i].d, &w0->d, &w0->dmin, row_bytes, ReduceEpi32x16Rows8(accs), summs);
    } else {
      sum1 = AddScaledLessMins1(sum1, x[i].d, w0->d, w0->dmin, ReduceEpi32x16(accs[0]), summs[0]);
    }
  }
  if constexpr (R == 8) {
    _mm256_storeu_ps(out, sum8);
  } else {
    out[0] = sum1;
  }
}

template <bool kThree>
constexpr DotRowsFn DotQ23_KRowsVnni = DotRowsK<DotQ23_KRowsVnniT<kThree, kRowsK>, DotQ23_KRowsVnniT<kThree, 1>>;

// Rows one at a time through the AVX2 kernel of kType (the rows a several-token kernel
// leaves, for types without a multi-row kernel).
template <WeightType kType>
void DotRowsAvx2(const void* rows, size_t row_bytes, int64_t n_rows, const void* act, int64_t n, float* out) {
  const DotFn one = quant_internal::Avx2Dot(kType);
  const auto* base = static_cast<const uint8_t*>(rows);
  for (int64_t r = 0; r < n_rows; ++r) out[r] = one(base + static_cast<size_t>(r) * row_bytes, act, n);
}

// IQ4_XS. DotIq4XsAvx2 keeps, per row and super-block, 8 int32 lanes (lane L: values
// 4L .. 4L+3 of every sub-block, times that sub-block's scale code - 32), then fma's them
// by d_w * d_x into 8 f32 lanes; one HsumPs256 at the end. Here a zmm takes sub-blocks
// 2k (lanes 0-7) and 2k + 1 (lanes 8-15): each one's 16 bytes of nibbles in two 128-bit
// lanes (shifted by 0 and 4), looked up as level + 128 (unsigned, for vpdpbusd, from a
// start of -128 times the activation's four-byte sums), times the scales lane-wise; the
// two halves of the sum over k are the AVX2 lanes, exactly. Four rows share each
// activation vector and its start sums; rows 2m and 2m + 1 share a float accumulator
// (lanes 0-7 and 8-15), each lane doing its row's AVX2 lane's fma, so the bits are the
// same. Rows left over (fewer than four) take the AVX2 kernel itself.

// One IQ4_XS super-block of a row for vpdpbusd: lv[k] its sub-blocks 2k and 2k + 1 as
// level + 128 (the nibbles of each in two 128-bit lanes, shifted by 0 and 4, looked up),
// sp[k] their scale codes - 32 in lanes 0-7 and 8-15.
TIERKV_VNNI_FN inline void UnpackIq4XsRow(const BlockIq4Xs& b, __m512i lv[4], __m512i sp[4]) {
  const __m128i signed_levels = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues));
  const __m512i levels = _mm512_broadcast_i32x4(_mm_xor_si128(signed_levels, _mm_set1_epi8(static_cast<char>(0x80))));
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i nibble_shift = _mm512_maskz_set1_epi16(0xff00ff00u, 4);  // 128-bit lanes 1 and 3: high nibbles
  const __m256i shift_l = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i shift_h = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  uint32_t sl;
  std::memcpy(&sl, b.scales_l, 4);
  // Code j: nibble j of the little-endian scales_l word, 2 bits of scales_h at 2j.
  const __m256i codes = _mm256_or_si256(
      _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(sl)), shift_l), _mm256_set1_epi32(15)),
      _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b.scales_h), shift_h), _mm256_set1_epi32(3)),
                        4));
  const __m512i scales = _mm512_castsi256_si512(_mm256_sub_epi32(codes, _mm256_set1_epi32(32)));
  for (int k = 0; k < 4; ++k) {
    const __m512i q = _mm512_castsi256_si512(Load256(b.qs + 32 * k));
    const __m512i u = _mm512_and_si512(_mm512_srlv_epi16(_mm512_shuffle_i64x2(q, q, 0x50), nibble_shift), m4);
    lv[k] = _mm512_shuffle_epi8(levels, u);
    const __m512i pair = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(2 * k)), _mm256_set1_epi32(2 * k + 1), 1);
    sp[k] = _mm512_permutexvar_epi32(pair, scales);
  }
}

// A row's super-block sum as DotIq4XsAvx2's 8 int32 lanes: sub-block pair k's products
// (from the start sums), times their scales, over k, the two halves added.
TIERKV_VNNI_FN inline __m256i Iq4XsRowSum(const __m512i lv[4], const __m512i sp[4], const __m512i start[4],
                                         const int8_t* xqs) {
  __m512i sum = _mm512_setzero_si512();
  for (int k = 0; k < 4; ++k) {
    const __m512i p = _mm512_dpbusd_epi32(start[k], lv[k], Load512(xqs + 64 * k));
    sum = _mm512_add_epi32(sum, _mm512_mullo_epi32(p, sp[k]));
  }
  return _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64(sum, 1));
}

// Rows 2m and 2m + 1's float step for one activation block: acc = fma(d_w * d_x,
// (float)isum, acc) lane-wise, the two rows in lanes 0-7 and 8-15.
TIERKV_VNNI_FN inline __m512 Iq4XsStep(__m512 acc, const BlockIq4Xs& b0, const BlockIq4Xs& b1, float d_x, __m256i isum0,
                                      __m256i isum1) {
  const __m512 d = _mm512_insertf32x8(_mm512_set1_ps(HalfV(b0.d) * d_x), _mm256_set1_ps(HalfV(b1.d) * d_x), 1);
  const __m512i s = _mm512_inserti64x4(_mm512_castsi256_si512(isum0), isum1, 1);
  return _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), acc);
}

TIERKV_VNNI_FN inline void DotIq4XsRows4Vnni(const void* rows, size_t row_bytes, const BlockQ8_K* x, int64_t nb,
                                            float* out) {
  const BlockIq4Xs* w[4];
  for (int r = 0; r < 4; ++r) w[r] = RowBlocks<BlockIq4Xs>(rows, row_bytes, r);
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t i = 0; i < nb; ++i) {
    __m512i start[4];
    for (int k = 0; k < 4; ++k) start[k] = NegBiasSums(Load512(x[i].qs + 64 * k), bias);
    __m256i isum[4];
    if (row_bytes >= kShortRowBytes) {
      for (int r = 0; r < 4; ++r) simd::PrefetchRowsAhead(&w[r][i], 4 * row_bytes, sizeof(BlockIq4Xs));
    }
    for (int r = 0; r < 4; ++r) {
      __m512i lv[4], sp[4];
      UnpackIq4XsRow(w[r][i], lv, sp);
      isum[r] = Iq4XsRowSum(lv, sp, start, x[i].qs);
    }
    for (int m = 0; m < 2; ++m) acc[m] = Iq4XsStep(acc[m], w[2 * m][i], w[2 * m + 1][i], x[i].d, isum[2 * m], isum[2 * m + 1]);
  }
  for (int m = 0; m < 2; ++m) {
    out[2 * m] = HsumPs256(_mm512_castps512_ps256(acc[m]));
    out[2 * m + 1] = HsumPs256(_mm512_extractf32x8_ps(acc[m], 1));
  }
}

// IQ4_XS, 4 rows x T tokens (T <= 4): each row's super-block unpacked once
// (UnpackIq4XsRow) for the T tokens, each token's start sums once for the 4 rows; per
// (row, token) the integer sum and the float step are DotIq4XsRows4Vnni's.
template <int T>
TIERKV_VNNI_FN inline void DotIq4XsRows4Tokens(const uint8_t* rows, size_t row_bytes, const void* const* acts,
                                              int64_t nb, float* out, size_t out_stride) {
  const BlockQ8_K* x[T];
  for (int t = 0; t < T; ++t) x[t] = static_cast<const BlockQ8_K*>(acts[t]);
  const BlockIq4Xs* w[4];
  for (int r = 0; r < 4; ++r) w[r] = RowBlocks<BlockIq4Xs>(rows, row_bytes, r);
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[T][2];
  for (int t = 0; t < T; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    __m512i start[T][4];
    for (int t = 0; t < T; ++t) {
      for (int k = 0; k < 4; ++k) start[t][k] = NegBiasSums(Load512(x[t][i].qs + 64 * k), bias);
    }
    if (row_bytes >= kShortRowBytes) {
      for (int r = 0; r < 4; ++r) simd::PrefetchRowsAhead(&w[r][i], 4 * row_bytes, sizeof(BlockIq4Xs));
    }
    __m256i isum[T][4];
    for (int r = 0; r < 4; ++r) {
      __m512i lv[4], sp[4];
      UnpackIq4XsRow(w[r][i], lv, sp);
      for (int t = 0; t < T; ++t) isum[t][r] = Iq4XsRowSum(lv, sp, start[t], x[t][i].qs);
    }
    for (int t = 0; t < T; ++t) {
      for (int m = 0; m < 2; ++m) {
        acc[t][m] = Iq4XsStep(acc[t][m], w[2 * m][i], w[2 * m + 1][i], x[t][i].d, isum[t][2 * m], isum[t][2 * m + 1]);
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    float* o = out + static_cast<size_t>(t) * out_stride;
    for (int m = 0; m < 2; ++m) {
      o[2 * m] = HsumPs256(_mm512_castps512_ps256(acc[t][m]));
      o[2 * m + 1] = HsumPs256(_mm512_extractf32x8_ps(acc[t][m], 1));
    }
  }
}

TIERKV_VNNI_FN void DotIq4XsRowsVnni(const void* rows, size_t row_bytes, int64_t n_rows, const void* act, int64_t n,
                                    float* out) {
  const auto* x = static_cast<const BlockQ8_K*>(act);
  const auto* base = static_cast<const uint8_t*>(rows);
  int64_t r = 0;
  for (; r + 4 <= n_rows; r += 4) {
    PrefetchGroup(base + r * row_bytes, 4, row_bytes);
    DotIq4XsRows4Vnni(base + r * row_bytes, row_bytes, x, n / kQkK, out + r);
  }
  DotRowsAvx2<WeightType::kIQ4_XS>(base + r * row_bytes, row_bytes, n_rows - r, act, n, out + r);
}

// One row through a multi-row kernel: the DotFn of the same level, so DotRow and MatVec
// agree.
template <DotRowsFn kRowsFn>
float OneRow(const void* row, const void* act, int64_t n) {
  float out;
  kRowsFn(row, 0, 1, act, n, &out);
  return out;
}

// ---- The K-quants, 8 rows x T tokens (T <= 4): DotKRows8Tokens<Family, T> ----
//
// Each row's super-block is unpacked once (Family::Unpack: u[k] the codes matching the
// activation's 64-byte vector k, sc[k] their scales as words, and the row's scales or
// mins for the bsums terms) for the T tokens; per token the integer sums and the float
// step are the one-token 8-row kernel's (Family::Start, the integer start and the mins
// term; Family::Step, the float step on a Family::State, or Family::StepRows, given the
// rows' 16-lane sums, for the orders that keep ggml's 8 lanes per row), so each
// (row, token) has its bits.
// Q4_K and Q5_K: the unpacking and the integer start (the mins through the bsums pair
// sums) they share.
template <bool kFive>
struct K45Base {
  using Block = std::conditional_t<kFive, BlockQ5_K, BlockQ4_K>;
  TIERKV_VNNI_FN static __m256i Unpack(const Block& b, __m512i u[4], __m512i sc[4]) {
    return _mm256_castsi128_si256(UnpackK4Row<kFive>(b, u, sc));
  }
  TIERKV_VNNI_FN static __m256i Bsums(const BlockQ8_K& x) { return _mm256_castsi128_si256(BsumPairs(x)); }
  TIERKV_VNNI_FN static __m512i Start(__m256i mins, __m256i bs, int32_t* summ) {
    *summ = MinsTimesSums(_mm256_castsi256_si128(mins), _mm256_castsi256_si128(bs));
    return _mm512_setzero_si512();
  }
};
struct Q4KFamily : K45Base<false> {  // two chains, a - m (AddSplit8)
  using State = Chains8;
  TIERKV_VNNI_FN static void Step(State* st, const BlockQ8_K& x, const Block* w0, size_t row_bytes, __m256i isum,
                                  const int32_t* summs) {
    AddSplit8(&st->a, &st->m, x.d, &w0->d, &w0->dmin, row_bytes, isum, summs);
  }
};
// ggml's lanes per row (DotQ6_KRowsVnniT).
struct Lanes8Rows8 {
  __m256 r[8];
};
TIERKV_VNNI_FN inline __m256 Result8(const Lanes8Rows8& c) { return simd::HsumLanesRows8(c.r); }
struct Q6KFamily {  // the -32 offset folded into the integer start
  using Block = BlockQ6_K;
  using State = Lanes8Rows8;
  TIERKV_VNNI_FN static __m256i Unpack(const Block& b, __m512i u[4], __m512i sc[4]) { return UnpackQ6KRow(b, u, sc); }
  TIERKV_VNNI_FN static __m256i Bsums(const BlockQ8_K& x) { return Load256(x.bsums); }
  TIERKV_VNNI_FN static __m512i Start(__m256i sc16, __m256i bs, int32_t*) {
    return _mm512_sub_epi32(_mm512_setzero_si512(), Q6KOffset(sc16, bs));
  }
  TIERKV_VNNI_FN static void StepRows(State* st, const BlockQ8_K& x, const Block* w0, size_t row_bytes,
                                      const __m512i accs[8], const int32_t*) {
    AddLanesRows8(st->r, x.d, w0, row_bytes, accs);
  }
};
struct Q5Rows8 {  // Q5_K: ggml's lanes per row and the rows' mins chains (row r in lane r)
  __m256 r[8];
  __m256 m;
};
TIERKV_VNNI_FN inline __m256 Result8(const Q5Rows8& c) { return _mm256_add_ps(simd::HsumLanesRows8(c.r), c.m); }
struct Q5KFamily : K45Base<true> {  // Q5_K in ggml's vec_dot order (DotK4RowsVnniT)
  using State = Q5Rows8;
  TIERKV_VNNI_FN static void StepRows(State* st, const BlockQ8_K& x, const Block* w0, size_t row_bytes,
                                      const __m512i accs[8], const int32_t* summs) {
    AddLanesRows8(st->r, x.d, w0, row_bytes, accs);
    st->m = AddMins8<8>(st->m, x.d, &w0->dmin, row_bytes, summs);
  }
};
template <bool kThree>
struct Q23KFamily {  // Q2_K (mins) and Q3_K (the -4 offset)
  using Block = std::conditional_t<kThree, BlockQ3_K, BlockQ2_K>;
  using State = Chain8;
  TIERKV_VNNI_FN static __m256i Unpack(const Block& b, __m512i u[4], __m512i sc[4]) {
    return UnpackQ23KRow<kThree>(b, u, sc);
  }
  TIERKV_VNNI_FN static __m256i Bsums(const BlockQ8_K& x) { return Q23KBsums<kThree>(x); }
  TIERKV_VNNI_FN static __m512i Start(__m256i s16, __m256i bs, int32_t* summ) { return Q23KStart<kThree>(s16, bs, summ); }
  TIERKV_VNNI_FN static void Step(State* st, const BlockQ8_K& x, const Block* w0, size_t row_bytes, __m256i isum,
                                  const int32_t* summs) {
    if constexpr (kThree) {
      st->s = AddScaled8(st->s, x.d, &w0->d, row_bytes, isum);
    } else {
      st->s = AddScaledLessMins8(st->s, x.d, &w0->d, &w0->dmin, row_bytes, isum, summs);
    }
  }
};

template <typename Family, int T>
TIERKV_VNNI_FN inline void DotKRows8Tokens(const uint8_t* rows, size_t row_bytes, const void* const* acts, int64_t nb,
                                          float* out, size_t out_stride) {
  using Block = typename Family::Block;
  const BlockQ8_K* x[T];
  for (int t = 0; t < T; ++t) x[t] = static_cast<const BlockQ8_K*>(acts[t]);
  const Block* w[8];
  for (int r = 0; r < 8; ++r) w[r] = RowBlocks<Block>(rows, row_bytes, r);
  typename Family::State st[T] = {};
  for (int64_t i = 0; i < nb; ++i) {
    if (row_bytes >= kShortRowBytes) {
      for (int r = 0; r < 8; ++r) simd::PrefetchRowsAhead(&w[r][i], 8 * row_bytes, sizeof(Block));
    }
    __m256i bs[T];
    for (int t = 0; t < T; ++t) bs[t] = Family::Bsums(x[t][i]);
    __m512i accs[T][8];
    alignas(32) int32_t summs[T][8];
    for (int r = 0; r < 8; ++r) {
      __m512i u[4], sc[4];
      const __m256i extra = Family::Unpack(w[r][i], u, sc);
      for (int t = 0; t < T; ++t) {
        __m512i acc = Family::Start(extra, bs[t], &summs[t][r]);
        for (int k = 0; k < 4; ++k) {
          acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(u[k], Load512(x[t][i].qs + 64 * k)), sc[k]);
        }
        accs[t][r] = acc;
      }
    }
    for (int t = 0; t < T; ++t) {
      if constexpr (requires { &Family::StepRows; }) {
        Family::StepRows(&st[t], x[t][i], &w[0][i], row_bytes, accs[t], summs[t]);
      } else {
        Family::Step(&st[t], x[t][i], &w[0][i], row_bytes, ReduceEpi32x16Rows8(accs[t]), summs[t]);
      }
    }
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(out + static_cast<size_t>(t) * out_stride, Result8(st[t]));
}

// Q4_K, 8 rows x 4 tokens in the order of llama.cpp's repacked gemm
// (ggml_gemm_q4_K_8x8_q8_K, which takes the tokens of a batch four at a time): the two
// chains of the one-token order (Q4KFamily), but stepped once per 64-value part
// of a super-block (sub-blocks 2k and 2k + 1: zmm k here) instead of once per
// super-block: a = fma(isum_k, d_w * d_x, a), m = fma(m_2k bsum_2k + m_2k+1 bsum_2k+1,
// dmin_w * d_x, m); a - m at the end. Served by GetLlamaGemmRowsTokensFn.
TIERKV_VNNI_FN void DotQ4KGemmRows8Tokens4(const uint8_t* rows, size_t row_bytes, const void* const* acts, int64_t nb,
                                          float* out, size_t out_stride) {
  constexpr int T = 4;
  const BlockQ8_K* x[T];
  for (int t = 0; t < T; ++t) x[t] = static_cast<const BlockQ8_K*>(acts[t]);
  const BlockQ4_K* w[8];
  for (int r = 0; r < 8; ++r) w[r] = RowBlocks<BlockQ4_K>(rows, row_bytes, r);
  Chains8 st[T] = {};
  for (int64_t i = 0; i < nb; ++i) {
    __m128i bp[T];
    for (int t = 0; t < T; ++t) bp[t] = BsumPairs(x[t][i]);
    alignas(32) int32_t isum[T][4][8], summ[T][4][8];
    for (int r = 0; r < 8; ++r) {
      __m512i u[4], sc[4];
      const __m128i mn16 = UnpackK4Row<false>(w[r][i], u, sc);
      for (int t = 0; t < T; ++t) {
        alignas(16) int32_t mp[4];  // per part k: m_2k bsum_2k + m_2k+1 bsum_2k+1
        _mm_store_si128(reinterpret_cast<__m128i*>(mp), _mm_madd_epi16(mn16, bp[t]));
        for (int k = 0; k < 4; ++k) {
          const __m512i acc = _mm512_dpwssd_epi32(_mm512_setzero_si512(),
                                                  _mm512_maddubs_epi16(u[k], Load512(x[t][i].qs + 64 * k)), sc[k]);
          isum[t][k][r] = ReduceEpi32x16(acc);
          summ[t][k][r] = mp[k];
        }
      }
    }
    for (int t = 0; t < T; ++t) {
      for (int k = 0; k < 4; ++k) {
        AddSplit8(&st[t].a, &st[t].m, x[t][i].d, &w[0][i].d, &w[0][i].dmin, row_bytes,
                  _mm256_load_si256(reinterpret_cast<const __m256i*>(isum[t][k])), summ[t][k]);
      }
    }
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(out + static_cast<size_t>(t) * out_stride, Result8(st[t]));
}

// The several-token kernels' driver: groups of kGroupRows rows through Group<T> for
// tokens four at a time (then the 1 - 3 left), the rows left over through the one-token
// kernel Rows. (AVX-512 F only: it serves the F16 and BF16 kernels on CPUs without VNNI;
// a group call per four tokens costs nothing next to the group's work.)
using RowsTokensGroupFn = void (*)(const uint8_t* rows, size_t row_bytes, const void* const* acts, int64_t nb,
                                   float* out, size_t out_stride);
template <RowsTokensGroupFn G4, RowsTokensGroupFn G3, RowsTokensGroupFn G2, RowsTokensGroupFn G1, DotRowsFn Rows,
          int64_t kBlock, int kGroupRows>
TIERKV_AVX512_FN void DotRowsTokensGroups(const void* rows, size_t row_bytes, int64_t n_rows, const void* const* acts,
                                          int n_tokens, int64_t n, float* out, size_t out_stride) {
  const auto* base = static_cast<const uint8_t*>(rows);
  const int64_t nb = n / kBlock;
  int64_t r = 0;
  for (; r + kGroupRows <= n_rows; r += kGroupRows) {
    const uint8_t* g = base + r * row_bytes;
    PrefetchGroup(g, kGroupRows, row_bytes);
    int t = 0;
    for (; t + 4 <= n_tokens; t += 4) G4(g, row_bytes, acts + t, nb, out + t * out_stride + r, out_stride);
    float* o = out + static_cast<size_t>(t) * out_stride + r;
    switch (n_tokens - t) {
      case 3: G3(g, row_bytes, acts + t, nb, o, out_stride); break;
      case 2: G2(g, row_bytes, acts + t, nb, o, out_stride); break;
      case 1: G1(g, row_bytes, acts + t, nb, o, out_stride); break;
      default: break;
    }
  }
  if (r == n_rows) return;
  for (int t = 0; t < n_tokens; ++t) {
    Rows(base + r * row_bytes, row_bytes, n_rows - r, acts[t], n, out + static_cast<size_t>(t) * out_stride + r);
  }
}

// Q4_0 and IQ4_NL (same block layout and float step), 16 rows x T tokens (T <= 4):
// DotQ4_0Rows16Short's block step with each row pair's nibbles unpacked (IQ4_NL: looked
// up as level + 128) and the 16 d_w converted once for the T tokens. The nibbles (or
// levels + 128) are unsigned for vpdpbusd, from a start of -8 (-128) times the
// activation's four-byte sums; per token the 16 block sums are the same integers as
// the one-token kernels', and acc[r] = fma((float)isum_r, d_w * d_x, acc[r]) is their
// float step (DotQ4_0Avx2, DotIq4NlAvx2) lane-wise, so each (row, token) has its bits.
template <bool kNl, int T>
TIERKV_VNNI_FN inline void DotNibbleRows16Tokens(const uint8_t* rows, size_t row_bytes, const void* const* acts,
                                                int64_t nb, float* out, size_t out_stride) {
  static_assert(sizeof(BlockQ4_0) == sizeof(BlockIq4Nl) && offsetof(BlockIq4Nl, qs) == offsetof(BlockQ4_0, qs));
  const BlockQ8_0* x[T];
  for (int t = 0; t < T; ++t) x[t] = static_cast<const BlockQ8_0*>(acts[t]);
  const __m512i offset = _mm512_set1_epi8(kNl ? static_cast<char>(0x80) : 8);
  const __m512i levels = _mm512_broadcast_i32x4(
      _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)), _mm_set1_epi8(static_cast<char>(0x80))));
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  const bool stream = row_bytes >= kShortRowBytes;
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* col = rows + static_cast<size_t>(i) * sizeof(BlockQ4_0);
    if (stream && i % 8 == 0) {
      for (int r = 0; r < 16; ++r) {
        simd::PrefetchRowsAhead(col + static_cast<size_t>(r) * row_bytes, 16 * row_bytes, 8 * sizeof(BlockQ4_0));
      }
    }
    const __m512 dw = StridedHalves16(col, row_bytes);
    __m512i nib[8];
    for (int k = 0; k < 8; ++k) {
      nib[k] = NibblePair(col + static_cast<size_t>(2 * k) * row_bytes, row_bytes);
      if constexpr (kNl) nib[k] = _mm512_shuffle_epi8(levels, nib[k]);
    }
    for (int t = 0; t < T; ++t) {
      const __m512i xx = _mm512_broadcast_i64x4(Load256(x[t][i].qs));
      const __m512i neg = NegBiasSums(xx, offset);
      __m512i p[8];
      for (int k = 0; k < 8; ++k) p[k] = _mm512_dpbusd_epi32(neg, nib[k], xx);
      const __m512 isum = _mm512_cvtepi32_ps(ReduceEpi32Rows16(p));
      acc[t] = _mm512_fmadd_ps(isum, _mm512_mul_ps(dw, _mm512_set1_ps(HalfV(x[t][i].d))), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) _mm512_storeu_ps(out + static_cast<size_t>(t) * out_stride, acc[t]);
}

// Q5_0, Q4_1 and Q5_1, 8 rows x T tokens (T <= 4): DotQ8_0Rows8Tokens's shape. Their
// AVX2 kernels (DotQ5_0Avx2, DotQx_1Avx2) keep ggml's 8 f32 lanes per row, acc =
// fma(d_w * d_x, (float)p, acc) per block, one HsumPs at the end, Q4_1 and Q5_1 plus a
// scalar sum of m_w * s_x (which GCC contracts to fma(m_w, s_x, summs)) added last. Here
// the codes (nibbles, with the fifth bits) are unsigned for vpdpbusd, Q5_0's from a
// start of -16 times the activation's four-byte sums (its values are code - 16), the
// others from 0 (their values are the codes); the lanes are the AVX2 lanes, the float
// steps theirs lane-wise, and the m_w * s_x sums run for the 8 rows in one vector: each
// (row, token) has the AVX2 kernel's bits.
template <WeightType kType>
struct Q5xTraits {
  static constexpr bool kMins = kType != WeightType::kQ5_0;   // Q4_1, Q5_1: d * q + m
  static constexpr bool kFifth = kType != WeightType::kQ4_1;  // Q5_0, Q5_1: qh
  using Block = std::conditional_t<kType == WeightType::kQ5_0, BlockQ5_0,
                                   std::conditional_t<kType == WeightType::kQ4_1, BlockQ4_1, BlockQ5_1>>;
  using Act = std::conditional_t<kMins, BlockQ8_1, BlockQ8_0>;
};

// A block's 32 codes in element order (low nibbles are values 0..15), with 16 added
// where the fifth bit (bit i of the little-endian qh) is set.
template <WeightType kType>
TIERKV_VNNI_FN inline __m256i Q5xCodes(const typename Q5xTraits<kType>::Block& b) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
  const __m128i m4 = _mm_set1_epi8(0x0f);
  __m256i u = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
  if constexpr (Q5xTraits<kType>::kFifth) {
    uint32_t h;
    std::memcpy(&h, b.qh, 4);
    u = _mm256_or_si256(u, _mm256_maskz_set1_epi8(h, 0x10));
  }
  return u;
}

template <WeightType kType, int T>
TIERKV_VNNI_FN inline void DotQ5xRows8Tokens(const uint8_t* rows, size_t row_bytes, const void* const* acts,
                                            int64_t nb, float* out, size_t out_stride) {
  using Tr = Q5xTraits<kType>;
  using Block = typename Tr::Block;
  const typename Tr::Act* x[T];
  for (int t = 0; t < T; ++t) x[t] = static_cast<const typename Tr::Act*>(acts[t]);
  const __m512i offset = _mm512_set1_epi8(16);
  __m512 acc[4][T];
  __m256 summs[T];
  for (int t = 0; t < T; ++t) {
    for (int k = 0; k < 4; ++k) acc[k][t] = _mm512_setzero_ps();
    summs[t] = _mm256_setzero_ps();
  }
  const bool stream = row_bytes >= kShortRowBytes;
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* col = rows + static_cast<size_t>(i) * sizeof(Block);
    if (stream && i % 4 == 0) {
      for (int r = 0; r < 8; ++r) {
        simd::PrefetchRowsAhead(col + static_cast<size_t>(r) * row_bytes, 8 * row_bytes, 4 * sizeof(Block));
      }
    }
    const __m512 dw8 = _mm512_castps256_ps512(StridedHalves8(col + offsetof(Block, d), row_bytes));
    __m256 m8 = _mm256_setzero_ps();
    if constexpr (Tr::kMins) m8 = StridedHalves8(col + offsetof(Block, m), row_bytes);
    __m512i wq[4];
    __m512 dw[4];
    for (int k = 0; k < 4; ++k) {
      const auto& b0 = *reinterpret_cast<const Block*>(col + static_cast<size_t>(2 * k) * row_bytes);
      const auto& b1 = *reinterpret_cast<const Block*>(col + static_cast<size_t>(2 * k + 1) * row_bytes);
      wq[k] = _mm512_inserti64x4(_mm512_castsi256_si512(Q5xCodes<kType>(b0)), Q5xCodes<kType>(b1), 1);
      const __m512i sel = _mm512_setr_epi32(2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k + 1, 2 * k + 1,
                                            2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1);
      dw[k] = _mm512_permutexvar_ps(sel, dw8);
    }
    for (int t = 0; t < T; ++t) {
      const __m512i xx = _mm512_broadcast_i64x4(Load256(x[t][i].qs));
      const __m512i start = Tr::kMins ? _mm512_setzero_si512() : NegBiasSums(xx, offset);
      const __m512 dx = _mm512_set1_ps(HalfV(x[t][i].d));
      for (int k = 0; k < 4; ++k) {
        const __m512i p = _mm512_dpbusd_epi32(start, wq[k], xx);
        acc[k][t] = _mm512_fmadd_ps(_mm512_mul_ps(dw[k], dx), _mm512_cvtepi32_ps(p), acc[k][t]);
      }
      if constexpr (Tr::kMins) summs[t] = _mm256_fmadd_ps(m8, _mm256_set1_ps(HalfV(x[t][i].s)), summs[t]);
    }
  }
  for (int t = 0; t < T; ++t) {
    float* o = out + static_cast<size_t>(t) * out_stride;
    alignas(32) float sm[8];
    _mm256_store_ps(sm, summs[t]);
    for (int k = 0; k < 4; ++k) {
      o[2 * k] = HsumPs256(_mm512_castps512_ps256(acc[k][t]));
      o[2 * k + 1] = HsumPs256(_mm512_extractf32x8_ps(acc[k][t], 1));
      if constexpr (Tr::kMins) {
        o[2 * k] += sm[2 * k];
        o[2 * k + 1] += sm[2 * k + 1];
      }
    }
  }
}

// One token: DotQ5xRows8Tokens<kType, 1> over groups of 8 rows, the AVX2 kernel for the
// rows left over.
template <WeightType kType>
TIERKV_VNNI_FN void DotQ5xRowsVnni(const void* rows, size_t row_bytes, int64_t n_rows, const void* act, int64_t n,
                                  float* out) {
  const auto* base = static_cast<const uint8_t*>(rows);
  const void* const acts[1] = {act};
  int64_t r = 0;
  for (; r + 8 <= n_rows; r += 8) {
    PrefetchGroup(base + r * row_bytes, 8, row_bytes);
    DotQ5xRows8Tokens<kType, 1>(base + r * row_bytes, row_bytes, acts, n / kQk0, out + r, 0);
  }
  DotRowsAvx2<kType>(base + r * row_bytes, row_bytes, n_rows - r, act, n, out + r);
}

template <WeightType kType>
constexpr DotRowsTokensFn DotQ5xRowsTokensVnni =
    DotRowsTokensGroups<DotQ5xRows8Tokens<kType, 4>, DotQ5xRows8Tokens<kType, 3>, DotQ5xRows8Tokens<kType, 2>,
                        DotQ5xRows8Tokens<kType, 1>, DotQ5xRowsVnni<kType>, kQk0, 8>;

constexpr DotRowsTokensFn DotQ8_0RowsTokensVnni =
    DotRowsTokensGroups<DotQ8_0Rows8Tokens<4>, DotQ8_0Rows8Tokens<3>, DotQ8_0Rows8Tokens<2>, DotQ8_0Rows8Tokens<1>,
                        DotQ8_0RowsVnni, kQk0, 8>;
// IQ4_NL for one token: DotNibbleRows16Tokens<true, 1> over groups of 16 rows (each
// row the bits of DotIq4NlAvx2, which takes the rows left over).
// Short rows sixteen at a time with the group's scales formed first. Long rows: on CPUs
// that also have AVX-VNNI (Zen 5; Intel since Sapphire Rapids), the AVX2 level's 8-row
// kernel in its AVX-VNNI form (same bits), which read 32768 x 4096 from memory 1.2 -
// 1.35x faster than the 512-bit kernels on a Zen 5 and as fast in cache; else sixteen
// at a time through the several-token kernel's one-token form, whose block step unpacks
// two rows a vector and keeps the sixteen rows' sums in one (the four-row kernel it
// replaced there, with a latency chain per block for every four rows, ran at 0.74x the
// AVX2 8-row kernel from memory and 0.67x in cache on that Zen 5). docs/benchmarks.md.
TIERKV_VNNI_FN void DotQ4_0RowsVnni(const void* rows, size_t row_bytes, int64_t n_rows, const void* act, int64_t n,
                                   float* out) {
  const auto* x = static_cast<const BlockQ8_0*>(act);
  const auto* base = static_cast<const uint8_t*>(rows);
  int64_t r = 0;
  if (row_bytes < kShortRowBytes) {
    for (; r + 16 <= n_rows; r += 16) {
      PrefetchGroup(base + r * row_bytes, 16, row_bytes);
      DotQ4_0Rows16Short(base + r * row_bytes, row_bytes, x, n / kQk0, out + r);
    }
  } else if (AvxVnniActive()) {
    static const DotRowsFn rows8 = quant_internal::Avx2DotRows(WeightType::kQ4_0, /*avx_vnni=*/true);
    return rows8(rows, row_bytes, n_rows, act, n, out);
  } else {
    const void* const acts[1] = {act};
    for (; r + 16 <= n_rows; r += 16) {
      DotNibbleRows16Tokens<false, 1>(base + r * row_bytes, row_bytes, acts, n / kQk0, out + r, 0);
    }
  }
  for (; r + 4 <= n_rows; r += 4) {
    PrefetchGroup(base + r * row_bytes, 4, row_bytes);
    DotQ4_0Rows4Vnni(base + r * row_bytes, row_bytes, x, n / kQk0, out + r);
  }
  for (; r < n_rows; ++r) out[r] = DotQ4_0Row1Vnni(RowBlocks<BlockQ4_0>(base + r * row_bytes, row_bytes, 0), x, n / kQk0);
}

TIERKV_VNNI_FN void DotIq4NlRowsVnni(const void* rows, size_t row_bytes, int64_t n_rows, const void* act, int64_t n,
                                    float* out) {
  const auto* base = static_cast<const uint8_t*>(rows);
  const void* const acts[1] = {act};
  int64_t r = 0;
  for (; r + 16 <= n_rows; r += 16) {
    PrefetchGroup(base + r * row_bytes, 16, row_bytes);
    DotNibbleRows16Tokens<true, 1>(base + r * row_bytes, row_bytes, acts, n / kQk0, out + r, 0);
  }
  DotRowsAvx2<WeightType::kIQ4_NL>(base + r * row_bytes, row_bytes, n_rows - r, act, n, out + r);
}

template <bool kNl, DotRowsFn Rows>
constexpr DotRowsTokensFn DotNibbleRowsTokensVnni =
    DotRowsTokensGroups<DotNibbleRows16Tokens<kNl, 4>, DotNibbleRows16Tokens<kNl, 3>, DotNibbleRows16Tokens<kNl, 2>,
                        DotNibbleRows16Tokens<kNl, 1>, Rows, kQk0, 16>;
constexpr DotRowsTokensFn DotIq4XsRowsTokensVnni =
    DotRowsTokensGroups<DotIq4XsRows4Tokens<4>, DotIq4XsRows4Tokens<3>, DotIq4XsRows4Tokens<2>,
                        DotIq4XsRows4Tokens<1>, DotIq4XsRowsVnni, kQkK, 4>;
template <typename Family, DotRowsFn Rows>
constexpr DotRowsTokensFn DotKRowsTokensVnni =
    DotRowsTokensGroups<DotKRows8Tokens<Family, 4>, DotKRows8Tokens<Family, 3>, DotKRows8Tokens<Family, 2>,
                        DotKRows8Tokens<Family, 1>, Rows, kQkK, 8>;
// Q4_K as llama.cpp's repacked mul_mat: whole groups of four tokens in its gemm order,
// the 1 - 3 tokens left in its gemv order (the one-token kernels' order).
constexpr DotRowsTokensFn DotQ4KLlamaGemmVnni =
    DotRowsTokensGroups<DotQ4KGemmRows8Tokens4, DotKRows8Tokens<Q4KFamily, 3>,
                        DotKRows8Tokens<Q4KFamily, 2>, DotKRows8Tokens<Q4KFamily, 1>,
                        DotK4RowsVnni<false>, kQkK, 8>;

// F32, F16, BF16 several tokens, in tinyBLAS's order where n is a multiple of its step,
// else in the one-token order (as llama.cpp falls back to vec_dot).
// Rows past the last pair of DotRowsTokensGroups, one token: the several-token order.
template <WeightType kType>
TIERKV_AVX512_FN void BatchDotRowsLeftover(const void* rows, size_t row_bytes, int64_t n_rows, const void* act,
                                           int64_t n, float* out) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const void* w = static_cast<const uint8_t*>(rows) + static_cast<size_t>(r) * row_bytes;
    __m512 a = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += kBatchStep<kType>) {
      const __m512 u = kType == WeightType::kBF16 ? _mm512_setzero_ps() : Load16<kType>(At<kType>(w, i));
      a = BatchStep<kType>(a, u, w, act, i);
    }
    out[r] = HsumPs512(a);
  }
}

template <WeightType kType>
TIERKV_AVX512_FN void BatchDotRowsTokens(const void* rows, size_t row_bytes, int64_t n_rows, const void* const* acts,
                                         int n_tokens, int64_t n, float* out, size_t out_stride) {
  if (n % kBatchStep<kType> != 0) {
    for (int t = 0; t < n_tokens; ++t) {
      VecDotRowsAvx512<kType>(rows, row_bytes, n_rows, acts[t], n, out + static_cast<size_t>(t) * out_stride);
    }
    return;
  }
  DotRowsTokensGroups<BatchDotRows2Tokens<kType, 4>, BatchDotRows2Tokens<kType, 3>, BatchDotRows2Tokens<kType, 2>,
                      BatchDotRows2Tokens<kType, 1>, BatchDotRowsLeftover<kType>, 1, 2>(rows, row_bytes, n_rows, acts,
                                                                                        n_tokens, n, out, out_stride);
}

#undef TIERKV_VNNI_FN

#undef TIERKV_AVX512_FN

}  // namespace

namespace quant_internal {
bool HasAvx512Vnni() {
  static const bool has = DetectedSimdLevel() >= SimdLevel::kAvx512 && CpuHas().avx512vnni;
  return has;
}

DotFn Avx512Dot(WeightType weight) {
  switch (weight) {
    case WeightType::kF32: return VecDotAvx512<WeightType::kF32>;
    case WeightType::kF16: return VecDotAvx512<WeightType::kF16>;
    case WeightType::kBF16: return VecDotAvx512<WeightType::kBF16>;
    default: break;
  }
  // The quantized types: the VNNI kernels where the CPU has them, else the AVX2 ones.
  if (Avx512DotRows(weight) != nullptr) {
    switch (weight) {
      case WeightType::kQ8_0: return OneRow<DotQ8_0RowsVnni>;
      case WeightType::kQ4_0: return OneRow<DotQ4_0RowsVnni>;
      case WeightType::kQ4_K: return OneRow<DotK4RowsVnni<false>>;
      case WeightType::kQ5_K: return OneRow<DotK4RowsVnni<true>>;
      case WeightType::kQ6_K: return OneRow<DotQ6_KRowsVnni>;
      case WeightType::kIQ4_XS: return OneRow<DotIq4XsRowsVnni>;
      case WeightType::kIQ4_NL: return OneRow<DotIq4NlRowsVnni>;
      case WeightType::kQ5_0: return OneRow<DotQ5xRowsVnni<WeightType::kQ5_0>>;
      case WeightType::kQ4_1: return OneRow<DotQ5xRowsVnni<WeightType::kQ4_1>>;
      case WeightType::kQ5_1: return OneRow<DotQ5xRowsVnni<WeightType::kQ5_1>>;
      case WeightType::kQ2_K: return OneRow<DotQ23_KRowsVnni<false>>;
      case WeightType::kQ3_K: return OneRow<DotQ23_KRowsVnni<true>>;
      default: break;
    }
  }
  return nullptr;
}

DotRowsTokensFn Avx512DotRowsTokens(WeightType weight) {
  if (!HasAvx512Vnni()) return nullptr;
  switch (weight) {
    case WeightType::kQ8_0: return DotQ8_0RowsTokensVnni;
    case WeightType::kQ4_0: return DotNibbleRowsTokensVnni<false, DotQ4_0RowsVnni>;
    case WeightType::kIQ4_NL: return DotNibbleRowsTokensVnni<true, DotIq4NlRowsVnni>;
    case WeightType::kIQ4_XS: return DotIq4XsRowsTokensVnni;
    case WeightType::kQ5_0: return DotQ5xRowsTokensVnni<WeightType::kQ5_0>;
    case WeightType::kQ4_1: return DotQ5xRowsTokensVnni<WeightType::kQ4_1>;
    case WeightType::kQ5_1: return DotQ5xRowsTokensVnni<WeightType::kQ5_1>;
    case WeightType::kQ4_K: return DotKRowsTokensVnni<Q4KFamily, DotK4RowsVnni<false>>;
    case WeightType::kQ5_K: return DotKRowsTokensVnni<Q5KFamily, DotK4RowsVnni<true>>;
    case WeightType::kQ6_K: return DotKRowsTokensVnni<Q6KFamily, DotQ6_KRowsVnni>;
    case WeightType::kQ2_K: return DotKRowsTokensVnni<Q23KFamily<false>, DotQ23_KRowsVnni<false>>;
    case WeightType::kQ3_K: return DotKRowsTokensVnni<Q23KFamily<true>, DotQ23_KRowsVnni<true>>;
    default: return nullptr;
  }
}

DotRowsTokensFn Avx512BatchDotRowsTokens(WeightType weight) {
  switch (weight) {
    case WeightType::kF32: return BatchDotRowsTokens<WeightType::kF32>;
    case WeightType::kF16: return BatchDotRowsTokens<WeightType::kF16>;
    case WeightType::kBF16: return BatchDotRowsTokens<WeightType::kBF16>;
    default: return nullptr;
  }
}

DotRowsFn Avx512DotRows(WeightType weight) {
  switch (weight) {
    case WeightType::kF32: return VecDotRowsAvx512<WeightType::kF32>;
    case WeightType::kF16: return VecDotRowsAvx512<WeightType::kF16>;
    case WeightType::kBF16: return VecDotRowsAvx512<WeightType::kBF16>;
    default: break;
  }
  if (!HasAvx512Vnni()) return nullptr;
  switch (weight) {
    case WeightType::kQ8_0: return DotQ8_0RowsVnni;
    case WeightType::kQ4_0: return DotQ4_0RowsVnni;
    case WeightType::kQ4_K: return DotK4RowsVnni<false>;
    case WeightType::kQ5_K: return DotK4RowsVnni<true>;
    case WeightType::kQ6_K: return DotQ6_KRowsVnni;
    case WeightType::kIQ4_XS: return DotIq4XsRowsVnni;
    case WeightType::kIQ4_NL: return DotIq4NlRowsVnni;
    case WeightType::kQ5_0: return DotQ5xRowsVnni<WeightType::kQ5_0>;
    case WeightType::kQ4_1: return DotQ5xRowsVnni<WeightType::kQ4_1>;
    case WeightType::kQ5_1: return DotQ5xRowsVnni<WeightType::kQ5_1>;
    case WeightType::kQ2_K: return DotQ23_KRowsVnni<false>;
    case WeightType::kQ3_K: return DotQ23_KRowsVnni<true>;
    default: return nullptr;
  }
}
DotRowsTokensFn Avx512LlamaGemmRowsTokens(WeightType weight) {
  return weight == WeightType::kQ4_K && HasAvx512Vnni() ? DotQ4KLlamaGemmVnni : nullptr;
}
}  // namespace quant_internal

}  // namespace tierkv::kernels

#else  // not x86

namespace tierkv::kernels::quant_internal {
DotFn Avx512Dot(WeightType) { return nullptr; }
DotRowsFn Avx512DotRows(WeightType) { return nullptr; }
DotRowsTokensFn Avx512DotRowsTokens(WeightType) { return nullptr; }
DotRowsTokensFn Avx512BatchDotRowsTokens(WeightType) { return nullptr; }
DotRowsTokensFn Avx512LlamaGemmRowsTokens(WeightType) { return nullptr; }
bool HasAvx512Vnni() { return false; }
}  // namespace tierkv::kernels::quant_internal

#endif
