// kernels/quant_avx2.cc
//
// AVX2 + FMA + F16C dot products (chosen at run time; see cpu_features.h). Integer parts
// are exact (the int8 x int8 and int8 x uint8 products never saturate: |w| <= 128 and
// |x| <= 127, pair sums <= 32512), so these agree with the scalar kernels up to the
// order of f32 additions. Every function carries the target attribute; no std templates
// are instantiated here, so no AVX2 code can leak into shared inline functions.
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

namespace tierkv::kernels {
namespace {

#define TIERKV_AVX2_FN __attribute__((target("avx2,fma,f16c")))

// An fp16 block scale as f32 (F16C: exact, one instruction).
TIERKV_AVX2_FN inline float Half(uint16_t h) { return _cvtsh_ss(h); }

TIERKV_AVX2_FN inline float HsumPs(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
  return _mm_cvtss_f32(s1);
}

TIERKV_AVX2_FN inline int HsumEpi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// The 8-row kernels read 8 interleaved streams, which the hardware prefetchers follow
// poorly. Groups of short rows are prefetched kGroupAheadBytes ahead as a whole; rows of
// at least kLongRowBytes go through simd::PrefetchRowsAhead, 8 rows a group (here Q4_0
// 32768 x 4096 from memory on two threads 3132 -> 2335 us, Q6_K unchanged).
constexpr size_t kGroupAheadBytes = 4096;

// Sum of w[i] * x[i] over 32 int8 pairs, as 8 int32 lanes.
TIERKV_AVX2_FN inline __m256i DotI8x32(__m256i w, __m256i x) {
  const __m256i aw = _mm256_sign_epi8(w, w);
  const __m256i sx = _mm256_sign_epi8(x, w);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1));
}

TIERKV_AVX2_FN inline __m256i LoadU256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

TIERKV_AVX2_FN float DotF32Avx2(const void* row, const void* act, int64_t n) {
  const auto* w = static_cast<const float*>(row);
  const auto* x = static_cast<const float*>(act);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
  float s = HsumPs(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; i < n; ++i) s += w[i] * x[i];
  return s;
}

TIERKV_AVX2_FN inline __m256 LoadF16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

TIERKV_AVX2_FN float DotF16Avx2(const void* row, const void* act, int64_t n) {
  const auto* w = static_cast<const uint16_t*>(row);
  const auto* x = static_cast<const uint16_t*>(act);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(LoadF16x8(w + i), LoadF16x8(x + i), a0);
    a1 = _mm256_fmadd_ps(LoadF16x8(w + i + 8), LoadF16x8(x + i + 8), a1);
    a2 = _mm256_fmadd_ps(LoadF16x8(w + i + 16), LoadF16x8(x + i + 16), a2);
    a3 = _mm256_fmadd_ps(LoadF16x8(w + i + 24), LoadF16x8(x + i + 24), a3);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(LoadF16x8(w + i), LoadF16x8(x + i), a0);
  float s = HsumPs(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; i < n; ++i) s += F16ToF32(w[i]) * F16ToF32(x[i]);
  return s;
}

TIERKV_AVX2_FN inline __m256 LoadBf16x8(const uint16_t* p) {
  const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

TIERKV_AVX2_FN float DotBf16Avx2(const void* row, const void* act, int64_t n) {
  const auto* w = static_cast<const uint16_t*>(row);
  const auto* x = static_cast<const uint16_t*>(act);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(LoadBf16x8(w + i), LoadBf16x8(x + i), a0);
    a1 = _mm256_fmadd_ps(LoadBf16x8(w + i + 8), LoadBf16x8(x + i + 8), a1);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(LoadBf16x8(w + i), LoadBf16x8(x + i), a0);
  float s = HsumPs(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) s += Bf16ToF32(w[i]) * Bf16ToF32(x[i]);
  return s;
}

// DotI8x32's eight lanes from the activation split by sign, xp = max(x, 0) and
// xn = max(-x, 0) (both unsigned, <= 127): per pair xp * w - xn * w = x * w, and each
// maddubs pair sum is at most 2 * 127 * 128 in magnitude, so nothing saturates and the
// lanes are the same integers. Two multiplies and a subtract instead of two sign ops and
// a multiply: the multiply pipes are this kernel's limit on AVX2 machines (vpsignb
// issues on the same two pipes as vpmaddubsw and the FMA on Zen 4); the split itself is
// plain byte ops (PositivePart, NegativePart), once per activation block for eight rows
// in the multi-row kernel.
TIERKV_AVX2_FN inline __m256i DotI8x32Split(__m256i w, __m256i xp, __m256i xn) {
  const __m256i d = _mm256_sub_epi16(_mm256_maddubs_epi16(xp, w), _mm256_maddubs_epi16(xn, w));
  return _mm256_madd_epi16(d, _mm256_set1_epi16(1));
}

// The activation codes split by sign, both as unsigned bytes: max(x, 0) and max(-x, 0)
// (x >= -127, so -x does not wrap). Plain byte ops: no multiply-pipe slot.
TIERKV_AVX2_FN inline __m256i PositivePart(__m256i x) { return _mm256_max_epi8(x, _mm256_setzero_si256()); }
TIERKV_AVX2_FN inline __m256i NegativePart(__m256i x) {
  return _mm256_max_epi8(_mm256_sub_epi8(_mm256_setzero_si256(), x), _mm256_setzero_si256());
}

TIERKV_AVX2_FN float DotQ8_0Avx2(const void* row, const void* act, int64_t n) {
  const auto* w = static_cast<const BlockQ8_0*>(row);
  const auto* x = static_cast<const BlockQ8_0*>(act);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQk0; ++i) {
    // The sign form here: one row's split per block measured slower (matvec Q8_0 256 x
    // 4096, one thread, 44 - 47 -> 50 - 63 us); its fma chain, not the pipes, is the limit.
    const __m256i p = DotI8x32(LoadU256(w[i].qs), LoadU256(x[i].qs));
    const __m256 d = _mm256_set1_ps(Half(w[i].d) * Half(x[i].d));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
  }
  return HsumPs(acc);
}

// The scales d_w * d_x of block i of eight rows (`col` points at row 0's block), row r in
// lane r, each lane Half(d_w) * d_x as the one-row kernels form it: the eight fp16 codes
// gathered through two 64-bit registers, one conversion, one multiply.
template <typename Block>
TIERKV_AVX2_FN inline __m256 RowScales8(const uint8_t* col, size_t row_bytes, float dx) {
  uint64_t h[2] = {0, 0};
  for (int r = 0; r < 8; ++r) {
    uint16_t d;
    std::memcpy(&d, col + static_cast<size_t>(r) * row_bytes + offsetof(Block, d), sizeof(d));
    h[r / 4] |= uint64_t{d} << (16 * (r % 4));
  }
  const __m128i codes = _mm_insert_epi64(_mm_cvtsi64_si128(static_cast<long long>(h[0])),
                                         static_cast<long long>(h[1]), 1);
  return _mm256_mul_ps(_mm256_cvtph_ps(codes), _mm256_set1_ps(dx));
}

// Eight rows of DotQ8_0Avx2 side by side: the activation block loaded (and split by
// sign) once for the eight, each row's lanes doing exactly what the one-row kernel's do,
// block by block (the same integers, DotI8x32Split; the same scale, taken from the
// eight-row vector by vpermps; the same fma), and the eight horizontal sums as one
// (simd::HsumLanesRows8: HsumPs's adds). Same bits per row. Against the sign ops and a
// scale broadcast per row: 1.37 -> 1.26 ns a block-row (8192 rows of 64, one thread).
TIERKV_AVX2_FN inline void DotQ8_0Rows8Avx2(const uint8_t* rows, size_t row_bytes, const BlockQ8_0* x, int64_t nb,
                                           float* out) {
  const bool long_rows = row_bytes >= kLongRowBytes;
  if (!long_rows) PrefetchLines(rows + kGroupAheadBytes, 8 * row_bytes);
  __m256 acc[8];
  for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i xq = LoadU256(x[i].qs);
    const __m256i xp = PositivePart(xq);
    const __m256i xn = NegativePart(xq);
    const uint8_t* col = rows + static_cast<size_t>(i) * sizeof(BlockQ8_0);
    const __m256 scales = RowScales8<BlockQ8_0>(col, row_bytes, Half(x[i].d));
    for (int r = 0; r < 8; ++r) {
      const auto* w = reinterpret_cast<const BlockQ8_0*>(col + static_cast<size_t>(r) * row_bytes);
      if (long_rows && i % 4 == 0) {
        simd::PrefetchRowsAhead(w, 8 * row_bytes, 4 * sizeof(BlockQ8_0));
      }
      const __m256i p = DotI8x32Split(LoadU256(w->qs), xp, xn);
      const __m256 d = _mm256_permutevar8x32_ps(scales, _mm256_set1_epi32(r));
      acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r]);
    }
  }
  _mm256_storeu_ps(out, simd::HsumLanesRows8(acc));
}

// A DotRowsFn from an 8-row kernel (kRows8: rows, row_bytes, activation blocks, blocks
// per row, out) and the one-row kernel for the last n_rows % 8 rows; kQk values a block.
template <typename Act, int64_t kQk, auto kRows8, auto kOne>
TIERKV_AVX2_FN void DotRowsBy8Avx2(const void* rows, size_t row_bytes, int64_t n_rows, const void* act, int64_t n,
                                  float* out) {
  const auto* base = static_cast<const uint8_t*>(rows);
  const auto* x = static_cast<const Act*>(act);
  int64_t r = 0;
  for (; r + 8 <= n_rows; r += 8) kRows8(base + static_cast<size_t>(r) * row_bytes, row_bytes, x, n / kQk, out + r);
  for (; r < n_rows; ++r) out[r] = kOne(base + static_cast<size_t>(r) * row_bytes, act, n);
}

// The 32 nibbles of a 32-value block (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL), 0..15, in
// element order: low nibbles are values 0..15, high nibbles 16..31.
TIERKV_AVX2_FN inline __m256i Nibbles32(const uint8_t* qs) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(b), _mm_srli_epi16(b, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

// The 32 values of a Q4_0 block minus 8, in element order.
TIERKV_AVX2_FN inline __m256i UnpackQ4_0(const uint8_t* qs) {
  return _mm256_sub_epi8(Nibbles32(qs), _mm256_set1_epi8(8));
}

// 0x10 in byte i where bit i of the little-endian 32-bit qh is set (the 5th bit of value
// i of a Q5_0 / Q5_1 block), else 0.
TIERKV_AVX2_FN inline __m256i FifthBits(const uint8_t* qh) {
  uint32_t h;
  __builtin_memcpy(&h, qh, sizeof(h));
  // Byte i takes qh byte i / 8, then keeps only its bit i % 8.
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(h)),
                                             _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                                              2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// Sum of u[i] * x[i] over 32 pairs, u unsigned (< 128), x signed, as 8 int32 lanes.
TIERKV_AVX2_FN inline __m256i DotU8I8x32(__m256i u, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}

// Q5_0 x Q8_0: ggml's vec_dot order (8 lanes, fma per block, one horizontal sum).
TIERKV_AVX2_FN float DotQ5_0Avx2(const void* row, const void* act, int64_t n) {
  const auto* w = static_cast<const BlockQ5_0*>(row);
  const auto* x = static_cast<const BlockQ8_0*>(act);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQk0; ++i) {
    const __m256i q = _mm256_sub_epi8(_mm256_or_si256(Nibbles32(w[i].qs), FifthBits(w[i].qh)), _mm256_set1_epi8(16));
    const __m256i p = DotI8x32(q, LoadU256(x[i].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(Half(w[i].d) * Half(x[i].d)), _mm256_cvtepi32_ps(p), acc);
  }
  return HsumPs(acc);
}

// Q4_1 / Q5_1 x Q8_1: as Q5_0, plus the m_w * s_x terms summed apart and added last.
template <bool kFive>
TIERKV_AVX2_FN float DotQx_1Avx2(const void* row, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockQ8_1*>(act);
  __m256 acc = _mm256_setzero_ps();
  float summs = 0.0f;
  for (int64_t i = 0; i < n / kQk0; ++i) {
    uint16_t d, m;
    __m256i q;
    if constexpr (kFive) {
      const BlockQ5_1& b = static_cast<const BlockQ5_1*>(row)[i];
      d = b.d, m = b.m;
      q = _mm256_or_si256(Nibbles32(b.qs), FifthBits(b.qh));
    } else {
      const BlockQ4_1& b = static_cast<const BlockQ4_1*>(row)[i];
      d = b.d, m = b.m;
      q = Nibbles32(b.qs);
    }
    summs += Half(m) * Half(x[i].s);
    const __m256i p = DotU8I8x32(q, LoadU256(x[i].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(Half(d) * Half(x[i].d)), _mm256_cvtepi32_ps(p), acc);
  }
  return HsumPs(acc) + summs;
}

// IQ4_NL x Q8_0: the nibbles index the 16 levels; one running sum as Q4_0 (llama.cpp
// repacks IQ4_NL rows for AVX2 like Q4_0's).
TIERKV_AVX2_FN float DotIq4NlAvx2(const void* row, const void* act, int64_t n) {
  const auto* w = static_cast<const BlockIq4Nl*>(row);
  const auto* x = static_cast<const BlockQ8_0*>(act);
  const __m128i levels = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues));
  const __m256i table = _mm256_set_m128i(levels, levels);
  float acc = 0.0f;
  for (int64_t i = 0; i < n / kQk0; ++i) {
    const __m256i q = _mm256_shuffle_epi8(table, Nibbles32(w[i].qs));
    const __m256i p = DotI8x32(q, LoadU256(x[i].qs));
    acc = __builtin_fmaf(static_cast<float>(HsumEpi32(p)), Half(w[i].d) * Half(x[i].d), acc);
  }
  return acc;
}

// One running f32 sum over the blocks, fma((float)isum, d_w * d_x, sum): the order of
// llama.cpp's repacked Q4_0 kernels (its CPU backend interleaves Q4_0 rows for AVX2 and
// runs a gemv/gemm over them). Measured: with the 8-lane order of ggml's plain
// vec_dot, ref-llama-q4_0 diverged from llama.cpp at prompt position 14 of P1 and 29 of
// P2; with this order P1 and P2 are bit-identical at every recorded position.
TIERKV_AVX2_FN float DotQ4_0Avx2(const void* row, const void* act, int64_t n) {
  const auto* w = static_cast<const BlockQ4_0*>(row);
  const auto* x = static_cast<const BlockQ8_0*>(act);
  float acc = 0.0f;
  for (int64_t i = 0; i < n / kQk0; ++i) {
    const __m256i p = DotI8x32(UnpackQ4_0(w[i].qs), LoadU256(x[i].qs));
    acc = __builtin_fmaf(static_cast<float>(HsumEpi32(p)), Half(w[i].d) * Half(x[i].d), acc);
  }
  return acc;
}

// Row r's eight int32 lanes summed, for r = 0..7, as one vector in row order (exact
// integers, so the order of the adds is free): three rounds of interleave-and-add
// instead of six vphaddd (two cycles each on Zen 4).
TIERKV_AVX2_FN inline __m256i LaneTotalsRows8(const __m256i p[8]) {
  __m256i s[4], t[2];
  for (int k = 0; k < 4; ++k) {  // [2k: l0+l2, 2k+1: l0+l2, 2k: l1+l3, 2k+1: l1+l3 | the same of l4..l7]
    s[k] = _mm256_add_epi32(_mm256_unpacklo_epi32(p[2 * k], p[2 * k + 1]), _mm256_unpackhi_epi32(p[2 * k], p[2 * k + 1]));
  }
  for (int k = 0; k < 2; ++k) {  // [rows 4k .. 4k+3: l0..l3 | rows 4k .. 4k+3: l4..l7]
    t[k] = _mm256_add_epi32(_mm256_unpacklo_epi64(s[2 * k], s[2 * k + 1]), _mm256_unpackhi_epi64(s[2 * k], s[2 * k + 1]));
  }
  return _mm256_add_epi32(_mm256_permute2x128_si256(t[0], t[1], 0x20), _mm256_permute2x128_si256(t[0], t[1], 0x31));
}

// Eight rows of DotQ4_0Avx2 side by side: per block, each row's integer sum (exact, so
// formed any way: the unsigned nibbles u times the activation by maddubs, the eight rows'
// lanes totalled at once, minus 8 * the activation block's sum for the codes' offset of
// 8), then the eight rows' running sums in one vector, lane r = fma((float)isum_r,
// d_w,r * d_x, lane r): the one-row kernel's chain, eight chains in flight instead of
// one (a block's horizontal sum and its fma were a latency chain).
TIERKV_AVX2_FN inline void DotQ4_0Rows8Avx2(const uint8_t* rows, size_t row_bytes, const BlockQ8_0* x, int64_t nb,
                                           float* out) {
  const bool long_rows = row_bytes >= kLongRowBytes;
  if (!long_rows) PrefetchLines(rows + kGroupAheadBytes, 8 * row_bytes);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i xq = LoadU256(x[i].qs);
    const __m256i offset = _mm256_set1_epi32(8 * HsumEpi32(DotU8I8x32(_mm256_set1_epi8(1), xq)));
    const uint8_t* col = rows + static_cast<size_t>(i) * sizeof(BlockQ4_0);
    __m256i p[8];
    for (int r = 0; r < 8; ++r) {
      const auto* w = reinterpret_cast<const BlockQ4_0*>(col + static_cast<size_t>(r) * row_bytes);
      if (long_rows && i % 4 == 0) simd::PrefetchRowsAhead(w, 8 * row_bytes, 128);
      p[r] = DotU8I8x32(Nibbles32(w->qs), xq);
    }
    const __m256i isum = _mm256_sub_epi32(LaneTotalsRows8(p), offset);
    const __m256 d = RowScales8<BlockQ4_0>(col, row_bytes, Half(x[i].d));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), d, acc);
  }
  _mm256_storeu_ps(out, acc);
}

// ---- AVX-VNNI forms (vpdpbusd on 256-bit vectors) of the 8-row Q8_0 and Q4_0 kernels ----
//
// The same kernels with each row's integer block sum as one vpdpbusd (unsigned x signed
// bytes, four products into each int32 lane) where the AVX2 forms take two or three
// multiplies (maddubs, and madd by ones to widen): on the CPUs that have it the
// multiplies share two pipes with the FMAs, and they are these kernels' limit. The
// lanes hold the same exact integers (each lane the sum of the same four products), so
// the scales, fmas and horizontal sums after them, unchanged, give the same bits.
#define TIERKV_AVXVNNI_FN __attribute__((target("avx2,fma,f16c,avxvnni")))

// Per lane, -b times the sum of its four x bytes (b the unsigned byte in every byte of
// `bias`): the start from which vpdpbusd of unsigned codes u = w + b sums w * x (Q8_0:
// w ^ 0x80 = w + 128; Q4_0: the raw nibbles, w + 8).
TIERKV_AVXVNNI_FN inline __m256i NegBiasSumsAvxVnni(__m256i xq, __m256i bias) {
  return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), bias, xq));
}

// DotQ8_0Rows8Avx2 with p = vpdpbusd(-128 sum x, w ^ 0x80, x) = DotI8x32Split's lanes.
TIERKV_AVXVNNI_FN inline void DotQ8_0Rows8AvxVnni(const uint8_t* rows, size_t row_bytes, const BlockQ8_0* x,
                                                 int64_t nb, float* out) {
  const bool long_rows = row_bytes >= kLongRowBytes;
  if (!long_rows) PrefetchLines(rows + kGroupAheadBytes, 8 * row_bytes);
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 acc[8];
  for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i xq = LoadU256(x[i].qs);
    const __m256i neg = NegBiasSumsAvxVnni(xq, bias);
    const uint8_t* col = rows + static_cast<size_t>(i) * sizeof(BlockQ8_0);
    const __m256 scales = RowScales8<BlockQ8_0>(col, row_bytes, Half(x[i].d));
    for (int r = 0; r < 8; ++r) {
      const auto* w = reinterpret_cast<const BlockQ8_0*>(col + static_cast<size_t>(r) * row_bytes);
      if (long_rows && i % 4 == 0) {
        simd::PrefetchRowsAhead(w, 8 * row_bytes, 4 * sizeof(BlockQ8_0));
      }
      const __m256i p = _mm256_dpbusd_avx_epi32(neg, _mm256_xor_si256(LoadU256(w->qs), bias), xq);
      const __m256 d = _mm256_permutevar8x32_ps(scales, _mm256_set1_epi32(r));
      acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r]);
    }
  }
  _mm256_storeu_ps(out, simd::HsumLanesRows8(acc));
}

// DotQ4_0Rows8Avx2 with each row's lanes as one vpdpbusd of the raw nibbles (w + 8) from
// a start of -8 x the lane's four x bytes, so the lanes total the row's integer sum
// itself (the AVX2 form subtracts 8 x the block's x sum from the totals).
TIERKV_AVXVNNI_FN inline void DotQ4_0Rows8AvxVnni(const uint8_t* rows, size_t row_bytes, const BlockQ8_0* x,
                                                 int64_t nb, float* out) {
  const bool long_rows = row_bytes >= kLongRowBytes;
  if (!long_rows) PrefetchLines(rows + kGroupAheadBytes, 8 * row_bytes);
  const __m256i eight = _mm256_set1_epi8(8);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i xq = LoadU256(x[i].qs);
    const __m256i neg = NegBiasSumsAvxVnni(xq, eight);
    const uint8_t* col = rows + static_cast<size_t>(i) * sizeof(BlockQ4_0);
    __m256i p[8];
    for (int r = 0; r < 8; ++r) {
      const auto* w = reinterpret_cast<const BlockQ4_0*>(col + static_cast<size_t>(r) * row_bytes);
      if (long_rows && i % 4 == 0) simd::PrefetchRowsAhead(w, 8 * row_bytes, 128);
      p[r] = _mm256_dpbusd_avx_epi32(neg, Nibbles32(w->qs), xq);
    }
    const __m256i isum = LaneTotalsRows8(p);
    const __m256 d = RowScales8<BlockQ4_0>(col, row_bytes, Half(x[i].d));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), d, acc);
  }
  _mm256_storeu_ps(out, acc);
}

// DotRowsBy8Avx2 for the AVX-VNNI 8-row kernels (the same tail: the AVX2 one-row kernel),
// with their target, so that they inline into it: a call per group of 8 short rows (two
// blocks each for a 64-wide output projection) would cost a sixth of the group.
template <int64_t kQk, auto kRows8, auto kOne>
TIERKV_AVXVNNI_FN void DotRowsBy8AvxVnni(const void* rows, size_t row_bytes, int64_t n_rows, const void* act,
                                        int64_t n, float* out) {
  const auto* base = static_cast<const uint8_t*>(rows);
  const auto* x = static_cast<const BlockQ8_0*>(act);
  int64_t r = 0;
  for (; r + 8 <= n_rows; r += 8) kRows8(base + static_cast<size_t>(r) * row_bytes, row_bytes, x, n / kQk, out + r);
  for (; r < n_rows; ++r) out[r] = kOne(base + static_cast<size_t>(r) * row_bytes, act, n);
}

#undef TIERKV_AVXVNNI_FN

// Sum over 32 pairs of unsigned u (< 64) times signed a, weighted by `scale`, as 8 int32.
TIERKV_AVX2_FN inline __m256i ScaledDotU8(__m256i u, __m256i a, __m256i scale16) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), scale16);
}

// Q4_K and Q5_K (and Q6_K below) as a super-block's unpacking, done once per row and
// super-block, and a per-token step, so that the several-token kernels
// (DotKRowTokensAvx2<F, T>) and the one-token kernels (the same with T = 1) run the same
// code: per token the integer sums and the float step are identical.
template <bool kFive>
struct K45Avx2 {
  using Block = std::conditional_t<kFive, BlockQ5_K, BlockQ4_K>;
  struct Unpacked {
    __m256i lo[4], hi[4];  // chunk c's low and high 32 values (0..15, Q5_K 0..31)
    __m256i scales;        // the 8 sub-block scales as int16, in both 128-bit lanes
    __m256i mins;          // the 8 mins as int16, min j at words 2j and 2j + 1 (against bsums)
    __m128 d_dmin;         // [d, dmin, 0, 0]
  };
  TIERKV_AVX2_FN static void Unpack(const Block& b, Unpacked* u) {
    // ScaleMinK4's 6-bit codes, four at a time in 32-bit words (w0..w2: bytes 0-3, 4-7,
    // 8-11 of b.scales): scales 0-3 = w0 & 63 per byte, mins 0-3 = w1 & 63, scales 4-7 =
    // low nibbles of w2 | top two bits of w0 << 4, mins 4-7 = high nibbles of w2 | top
    // two bits of w1 << 4. The shifts move bits across bytes; the masks drop them.
    uint32_t w[3];
    std::memcpy(w, b.scales, sizeof(w));
    const uint32_t m6 = 0x3f3f3f3fu, m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
    const __m128i codes = _mm_setr_epi32(
        static_cast<int>(w[0] & m6), static_cast<int>((w[2] & m4) | (((w[0] >> 6) & m2) << 4)),
        static_cast<int>(w[1] & m6), static_cast<int>(((w[2] >> 4) & m4) | (((w[1] >> 6) & m2) << 4)));
    const __m256i sm = _mm256_cvtepu8_epi16(codes);  // words 0-7 scales, 8-15 mins
    u->scales = _mm256_permute4x64_epi64(sm, 0x44);
    u->mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(codes, codes));
    const __m256i nib = _mm256_set1_epi8(0x0f);
    [[maybe_unused]] __m256i qh;
    if constexpr (kFive) qh = LoadU256(b.qh);
    for (int c = 0; c < 4; ++c) {
      const __m256i q = LoadU256(b.qs + 32 * c);
      u->lo[c] = _mm256_and_si256(q, nib);
      u->hi[c] = _mm256_and_si256(_mm256_srli_epi16(q, 4), nib);
      if constexpr (kFive) {
        // Bit 0 of each byte of qh is the 5th bit of the low nibbles, bit 1 of the high
        // ones; shifting 16-bit lanes right moves only same-byte bits into bit 0 and 1.
        const __m256i one = _mm256_set1_epi8(1);
        u->lo[c] = _mm256_or_si256(u->lo[c], _mm256_slli_epi16(_mm256_and_si256(qh, one), 4));
        u->hi[c] =
            _mm256_or_si256(u->hi[c], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4));
        qh = _mm256_srli_epi16(qh, 2);
      }
    }
    static_assert(offsetof(Block, dmin) == offsetof(Block, d) + 2);
    uint32_t d_dmin;
    std::memcpy(&d_dmin, &b.d, sizeof(d_dmin));
    u->d_dmin = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(d_dmin)));
  }
  // Q4_K: two chains, a = fma(isum, d, a) and m = fma(summ, dmin, m), a - m at the end
  // (ggml's repacked 8x8 gemv, which llama.cpp runs Q4_K matrices through). Q5_K (not
  // repacked there): ggml's x86 vec_dot, 8 float lanes (ScaledDotU8's lanes: values
  // 4L .. 4L + 3 of each 32-value chunk) lanes = fma(d, isum lanes, lanes), and a mins
  // chain m = fma(-dmin, summ, m); HsumLanes8(lanes) + m at the end.
  struct AccQ4 {
    __m128 am;  // [a, m, 0, 0]; zero by value-initialisation (Acc{})
  };
  struct AccQ5 {
    __m256 lanes;  // zero by value-initialisation (Acc{})
    float m;
  };
  using Acc = std::conditional_t<kFive, AccQ5, AccQ4>;
  TIERKV_AVX2_FN static float Finish(Acc acc) {
    if constexpr (kFive) {
      return simd::HsumLanes8(acc.lanes) + acc.m;
    } else {
      return _mm_cvtss_f32(acc.am) - _mm_cvtss_f32(_mm_movehdup_ps(acc.am));
    }
  }
  TIERKV_AVX2_FN static Acc Step(Acc sum, const Unpacked& u, const BlockQ8_K& x) {
    // sum_j m_j (bsums[2j] + bsums[2j + 1]) and the scaled chunk sums: exact integers,
    // whatever the order. Sub-block j's scale broadcast over a vector: word j of each lane.
    const __m256i msum = _mm256_madd_epi16(LoadU256(x.bsums), u.mins);
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i s0 = _mm256_shuffle_epi8(u.scales, _mm256_set1_epi16(static_cast<short>(0x0404 * c + 0x0100)));
      const __m256i s1 = _mm256_shuffle_epi8(u.scales, _mm256_set1_epi16(static_cast<short>(0x0404 * c + 0x0302)));
      acc = _mm256_add_epi32(acc, ScaledDotU8(u.lo[c], LoadU256(x.qs + 64 * c), s0));
      acc = _mm256_add_epi32(acc, ScaledDotU8(u.hi[c], LoadU256(x.qs + 64 * c + 32), s1));
    }
    // [d, dmin] = x.d * [d_w, dmin_w], each as the f32 product.
    const __m128 d_dmin = _mm_mul_ps(_mm_set1_ps(x.d), u.d_dmin);
    if constexpr (kFive) {
      const float fsumm = static_cast<float>(HsumEpi32(msum));
      return {_mm256_fmadd_ps(_mm256_broadcastss_ps(d_dmin), _mm256_cvtepi32_ps(acc), sum.lanes),
              __builtin_fmaf(-_mm_cvtss_f32(_mm_movehdup_ps(d_dmin)), fsumm, sum.m)};
    } else {
      // Both horizontal sums at once, [isum, summ] in lanes 0 and 1, then both chains in
      // one fma: lane by lane a = fma(isum, d, a) and m = fma(summ, dmin, m), as fmaf.
      const __m256i lanes = _mm256_add_epi32(_mm256_unpacklo_epi32(acc, msum), _mm256_unpackhi_epi32(acc, msum));
      const __m128i t = _mm_add_epi32(_mm256_castsi256_si128(lanes), _mm256_extracti128_si256(lanes, 1));
      const __m128i sums = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
      return {_mm_fmadd_ps(_mm_cvtepi32_ps(sums), d_dmin, sum.am)};
    }
  }
};

// Q2_K and Q3_K: in half h of a super-block, the 32 bytes qs[32h ..] hold four 32-value
// chunks (bits 2j..2j+1 for chunk j), each two 16-value groups with their own scale,
// multiplied against activation values 128h + 32j ... The group sums are scaled as 16-bit
// pairs (ScaledDotU8) and summed exactly; then, as the scalar kernels:
//   Q2_K: unsigned 2-bit values, 4-bit scales, the mins through the activation's 16-value
//         sums: sum += d * isum - dmin * summ.
//   Q3_K: u = low 2 bits + 4 * hmask bit (0..7) against signed scales (code - 32); the
//         value is u - 4, whose -4 goes through the 16-value sums (as Q6_K's -32):
//         sum += d_x * d_w * isum.
template <bool kThree>
TIERKV_AVX2_FN float DotQ23_KAvx2(const void* row, const void* act, int64_t n) {
  using Block = std::conditional_t<kThree, BlockQ3_K, BlockQ2_K>;
  const auto* w = static_cast<const Block*>(row);
  const auto* x = static_cast<const BlockQ8_K*>(act);
  const __m256i m2 = _mm256_set1_epi8(3);
  const __m256i one = _mm256_set1_epi8(1);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQkK; ++i) {
    // The 16 group scales as int16 (unpacked with vector shifts: one by one they were
    // most of this kernel's time), and corr = Q2_K: sum of mins x group sums; Q3_K: of
    // scales x group sums.
    __m256i sc16, weights16;
    if constexpr (kThree) {
      sc16 = weights16 = simd::ScalesQ3K(w[i].scales);
    } else {
      const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[i].scales));
      const __m128i mask4 = _mm_set1_epi8(0x0f);
      sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(s, mask4));
      weights16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), mask4));  // the mins
    }
    const int corr = HsumEpi32(_mm256_madd_epi16(weights16, LoadU256(x[i].bsums)));
    alignas(32) int16_t sc[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(sc), sc16);
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i q = LoadU256(w[i].qs + 32 * h);
      for (int j = 0; j < 4; ++j) {
        const int g = 8 * h + 2 * j;
        __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m2);
        if constexpr (kThree) {
          // Bit 4h + j of each hmask byte; 16-bit shifts move only same-byte bits to bit 0.
          const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(LoadU256(w[i].hmask), 4 * h + j), one);
          u = _mm256_or_si256(u, _mm256_slli_epi16(hb, 2));
        }
        const __m256i s16 = _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(sc[g + 1])),
                                             _mm_set1_epi16(static_cast<int16_t>(sc[g])));
        acc = _mm256_add_epi32(acc, ScaledDotU8(u, LoadU256(x[i].qs + 128 * h + 32 * j), s16));
      }
    }
    if constexpr (kThree) {
      sum += x[i].d * Half(w[i].d) * static_cast<float>(HsumEpi32(acc) - 4 * corr);
    } else {
      const float d = x[i].d * Half(w[i].d);
      const float dmin = x[i].d * Half(w[i].dmin);
      sum += d * static_cast<float>(HsumEpi32(acc)) - dmin * static_cast<float>(corr);
    }
  }
  return sum;
}

struct Q6KAvx2 {
  using Block = BlockQ6_K;
  struct Unpacked {
    __m256i q[8];  // 32-value chunk 4h + k: low 4 bits from ql, high 2 from qh (0..63)
    const int8_t* sc;
    float d;
  };
  // ggml's vec_dot order (DotQ6_KScalar): 8 float lanes, summed at the end.
  struct Acc {
    __m256 lanes;  // zero by value-initialisation (Acc{})
  };
  TIERKV_AVX2_FN static float Finish(Acc acc) { return simd::HsumLanes8(acc.lanes); }
  TIERKV_AVX2_FN static void Unpack(const Block& b, Unpacked* u) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    // The two high bits of chunk k sit at bits 2k, 2k + 1 of each qh byte; shifted (as
    // 16-bit lanes) to bits 4 and 5 and masked there, so bits that cross into the
    // neighbouring byte are masked off.
    const __m256i m30 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = LoadU256(b.ql + 64 * h);
      const __m256i ql1 = LoadU256(b.ql + 64 * h + 32);
      const __m256i qh = LoadU256(b.qh + 32 * h);
      __m256i* q = u->q + 4 * h;
      q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
      q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                             _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
    }
    u->sc = b.scales;
    u->d = Half(b.d);
  }
  TIERKV_AVX2_FN static Acc Step(Acc sum, const Unpacked& u, const BlockQ8_K& x) {
    const int8_t* sc = u.sc;
    // Lane L: values 4L .. 4L + 3 of every 32-value chunk (ScaledDotU8's lanes), less
    // 32 * (sc[2L] bsums[2L] + sc[2L + 1] bsums[2L + 1]), the -32 offset.
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc));
    const __m256i offset = simd::Q6KOffsetLanes(_mm256_cvtepi8_epi16(sc8), LoadU256(x.bsums));
    // Chunk p = 4h + k's two 16-value groups have scales sc[2p] (its low 16 values: the
    // low 128-bit lane) and sc[2p + 1]. Even scales widened into the low lane and odd
    // ones into the high lane, word p of each lane broadcast over it is that pair.
    const __m256i pairs = _mm256_cvtepi8_epi16(
        _mm_shuffle_epi8(sc8, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15)));
    __m256i acc = _mm256_setzero_si256();
    for (int p = 0; p < 8; ++p) {
      const __m256i s16 = _mm256_shuffle_epi8(pairs, _mm256_set1_epi16(static_cast<short>(0x0101 * (2 * p) + 0x0100)));
      acc = _mm256_add_epi32(acc, ScaledDotU8(u.q[p], LoadU256(x.qs + 32 * p), s16));
    }
    acc = _mm256_sub_epi32(acc, offset);
    return {_mm256_fmadd_ps(_mm256_set1_ps(x.d * u.d), _mm256_cvtepi32_ps(acc), sum.lanes)};
  }
};

// One row against T tokens (T <= 4), super-block by super-block: F::Unpack once, F::Step
// per token.
template <typename F, int T>
TIERKV_AVX2_FN inline void DotKRowTokensAvx2(const void* row, const void* const* acts, int64_t nb, float* out,
                                            size_t out_stride) {
  const auto* w = static_cast<const typename F::Block*>(row);
  const BlockQ8_K* x[T];
  for (int t = 0; t < T; ++t) x[t] = static_cast<const BlockQ8_K*>(acts[t]);
  typename F::Acc sum[T];
  for (int t = 0; t < T; ++t) sum[t] = typename F::Acc{};
  typename F::Unpacked u;
  for (int64_t i = 0; i < nb; ++i) {
    F::Unpack(w[i], &u);
    for (int t = 0; t < T; ++t) sum[t] = F::Step(sum[t], u, x[t][i]);
  }
  for (int t = 0; t < T; ++t) out[static_cast<size_t>(t) * out_stride] = F::Finish(sum[t]);
}

template <typename F>
TIERKV_AVX2_FN float DotKAvx2(const void* row, const void* act, int64_t n) {
  const void* const acts[1] = {act};
  float out;
  DotKRowTokensAvx2<F, 1>(row, acts, n / kQkK, &out, 0);
  return out;
}

// Eight rows of DotKAvx2<F> (F's Acc is 8 float lanes: Q6_K) side by side, row by
// row in registers, and their horizontal sums as one (simd::HsumLanesRows8's adds are
// HsumLanes8's): same bits per row, without a call and a horizontal sum per row (the
// 32000 x 256 Q6_K output projection is one super-block a row).
template <typename F>
TIERKV_AVX2_FN inline void DotKRows8Avx2(const uint8_t* rows, size_t row_bytes, const BlockQ8_K* x, int64_t nb,
                                        float* out) {
  const bool long_rows = row_bytes >= kLongRowBytes;
  if (!long_rows) PrefetchLines(rows + kGroupAheadBytes, 8 * row_bytes);
  __m256 acc[8];
  typename F::Unpacked u;
  for (int r = 0; r < 8; ++r) {
    const auto* w = reinterpret_cast<const typename F::Block*>(rows + static_cast<size_t>(r) * row_bytes);
    typename F::Acc sum{};
    for (int64_t i = 0; i < nb; ++i) {
      if (long_rows) simd::PrefetchRowsAhead(&w[i], 8 * row_bytes, sizeof(w[i]));
      F::Unpack(w[i], &u);
      sum = F::Step(sum, u, x[i]);
    }
    acc[r] = sum.lanes;
  }
  _mm256_storeu_ps(out, simd::HsumLanesRows8(acc));
}

// The several-token kernel: each row against the tokens four at a time (then the 1 - 3
// left); a row (a few KiB) stays in L1 while they pass.
template <typename F>
TIERKV_AVX2_FN void DotKRowsTokensAvx2(const void* rows, size_t row_bytes, int64_t n_rows, const void* const* acts,
                                      int n_tokens, int64_t n, float* out, size_t out_stride) {
  const auto* base = static_cast<const uint8_t*>(rows);
  const int64_t nb = n / kQkK;
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* row = base + static_cast<size_t>(r) * row_bytes;
    int t = 0;
    for (; t + 4 <= n_tokens; t += 4) DotKRowTokensAvx2<F, 4>(row, acts + t, nb, out + t * out_stride + r, out_stride);
    float* o = out + static_cast<size_t>(t) * out_stride + r;
    switch (n_tokens - t) {
      case 3: DotKRowTokensAvx2<F, 3>(row, acts + t, nb, o, out_stride); break;
      case 2: DotKRowTokensAvx2<F, 2>(row, acts + t, nb, o, out_stride); break;
      case 1: DotKRowTokensAvx2<F, 1>(row, acts + t, nb, o, out_stride); break;
      default: break;
    }
  }
}

// IQ4_XS x Q8_K: ggml's vec_dot order. Per super-block, 8 int32 lanes of the
// sub-blocks' level x activation pair sums times their scales (code - 32), then one fma
// of those lanes by d_w * d_x into 8 f32 lanes; one horizontal sum at the end.
TIERKV_AVX2_FN float DotIq4XsAvx2(const void* row, const void* act, int64_t n) {
  const auto* w = static_cast<const BlockIq4Xs*>(row);
  const auto* x = static_cast<const BlockQ8_K*>(act);
  const __m128i levels = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues));
  const __m256i table = _mm256_set_m128i(levels, levels);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQkK; ++i) {
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < kQkK / 32; ++j) {
      const __m256i q = _mm256_shuffle_epi8(table, Nibbles32(w[i].qs + 16 * j));
      const __m256i a = LoadU256(x[i].qs + 32 * j);
      // |level| <= 127 and |a| <= 127: the pair sums fit int16.
      const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(a, q));
      const __m256i scale = _mm256_set1_epi16(static_cast<int16_t>(ScaleIq4Xs(w[i], j) - 32));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(pairs, scale));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(Half(w[i].d) * x[i].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return HsumPs(acc);
}

// ---- activation quantization ----------------------------------------------------------
// quant.cc's QuantizeQ8_0, QuantizeQ8_1 and QuantizeQ8_K (round half to even) with 8-lane
// vectors, the same bytes: the max of |x| is exact in any order (vmaxps with the running
// max as its second operand keeps that max for a NaN lane, as fmax and the scalar '>'
// do); the scales are the scalar expressions; each code is the same f32 product rounded
// by vcvtps2dq, to nearest even in the default rounding mode as nearbyint does. They
// run on the thread that prepares a product's activations, before the product goes
// parallel: the scalar loops (a libm call for fmax and one for nearbyint a value) were
// a fifth of builtin:tiny-moe's prefill (docs/benchmarks.md).

TIERKV_AVX2_FN inline __m256 AbsPs(__m256 v) { return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }

// max |x[j]| over n values (n % 8 == 0), from 0, NaN values skipped.
TIERKV_AVX2_FN inline float MaxAbs(const float* x, int n) {
  __m256 m = _mm256_setzero_ps();
  for (int j = 0; j < n; j += 8) m = _mm256_max_ps(AbsPs(_mm256_loadu_ps(x + j)), m);
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

// The 32 codes of x[0..32) * s rounded to nearest even (at most 127 with kClamp), as
// int8 in element order.
template <bool kClamp>
TIERKV_AVX2_FN inline __m256i RoundCodes32(const float* x, __m256 s) {
  __m256i q[4];
  for (int k = 0; k < 4; ++k) {
    q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), s));
    if constexpr (kClamp) q[k] = _mm256_min_epi32(q[k], _mm256_set1_epi32(127));
  }
  // packs work per 128-bit lane: the bytes come out as dwords q0[0..3] q1[0..3] q2[0..3]
  // q3[0..3] | q0[4..7] q1[4..7] q2[4..7] q3[4..7]; the permute puts them in order.
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// One Q8_0 block (QuantizeBlock32): codes and fp16 d; returns the f32 d.
TIERKV_AVX2_FN inline float QuantizeBlock32Avx2(const float* x, int8_t* qs, uint16_t* d16) {
  const float amax = MaxAbs(x, kQk0);
  const float d = amax / 127.0f;
  *d16 = static_cast<uint16_t>(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), RoundCodes32<false>(x, _mm256_set1_ps(id)));
  return d;
}

TIERKV_AVX2_FN void QuantizeQ8_0Avx2(const float* x, void* out, int64_t nb) {
  auto* y = static_cast<BlockQ8_0*>(out);
  for (int64_t i = 0; i < nb; ++i, x += kQk0) QuantizeBlock32Avx2(x, y[i].qs, &y[i].d);
}

TIERKV_AVX2_FN void QuantizeQ8_1Avx2(const float* x, void* out, int64_t nb) {
  auto* y = static_cast<BlockQ8_1*>(out);
  for (int64_t i = 0; i < nb; ++i, x += kQk0) {
    const float d = QuantizeBlock32Avx2(x, y[i].qs, &y[i].d);
    int sum = 0;
    for (int j = 0; j < kQk0; ++j) sum += y[i].qs[j];
    y[i].s = static_cast<uint16_t>(_cvtss_sh(d * static_cast<float>(sum), _MM_FROUND_TO_NEAREST_INT));
  }
}

TIERKV_AVX2_FN void QuantizeQ8_KAvx2(const float* x, void* out, int64_t nb) {
  auto* y = static_cast<BlockQ8_K*>(out);
  for (int64_t i = 0; i < nb; ++i, x += kQkK) {
    const float amax = MaxAbs(x, kQkK);
    if (amax == 0.0f) {
      std::memset(&y[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    // The scale comes from the first value of that magnitude, with its sign.
    const __m256 va = _mm256_set1_ps(amax);
    int j = 0;
    for (;; j += 8) {
      const int eq = _mm256_movemask_ps(_mm256_cmp_ps(AbsPs(_mm256_loadu_ps(x + j)), va, _CMP_EQ_OQ));
      if (eq != 0) {
        j += __builtin_ctz(static_cast<unsigned>(eq));
        break;
      }
    }
    const float iscale = -127.0f / x[j];
    const __m256 s = _mm256_set1_ps(iscale);
    for (int c = 0; c < kQkK; c += 32) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs + c), RoundCodes32<true>(x + c, s));
    }
    for (int g = 0; g < kQkK / 16; ++g) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += y[i].qs[16 * g + l];
      y[i].bsums[g] = static_cast<int16_t>(sum);
    }
    y[i].d = 1.0f / iscale;
  }
}

#undef TIERKV_AVX2_FN

}  // namespace

namespace quant_internal {
DotFn Avx2Dot(WeightType weight) {
  switch (weight) {
    case WeightType::kF32: return DotF32Avx2;
    case WeightType::kF16: return DotF16Avx2;
    case WeightType::kBF16: return DotBf16Avx2;
    case WeightType::kQ8_0: return DotQ8_0Avx2;
    case WeightType::kQ4_0: return DotQ4_0Avx2;
    case WeightType::kQ4_1: return DotQx_1Avx2<false>;
    case WeightType::kQ5_0: return DotQ5_0Avx2;
    case WeightType::kQ5_1: return DotQx_1Avx2<true>;
    case WeightType::kIQ4_NL: return DotIq4NlAvx2;
    case WeightType::kQ2_K: return DotQ23_KAvx2<false>;
    case WeightType::kQ3_K: return DotQ23_KAvx2<true>;
    case WeightType::kQ4_K: return DotKAvx2<K45Avx2<false>>;
    case WeightType::kQ5_K: return DotKAvx2<K45Avx2<true>>;
    case WeightType::kQ6_K: return DotKAvx2<Q6KAvx2>;
    case WeightType::kIQ4_XS: return DotIq4XsAvx2;
    case WeightType::kQ8_1:
    case WeightType::kQ8_K: return nullptr;
    default: break;  // the ggml types the kernels do not read
  }
  return nullptr;
}

DotRowsFn Avx2DotRows(WeightType weight, bool avx_vnni) {
  if (avx_vnni && weight == WeightType::kQ8_0) return DotRowsBy8AvxVnni<kQk0, DotQ8_0Rows8AvxVnni, DotQ8_0Avx2>;
  if (avx_vnni && weight == WeightType::kQ4_0) return DotRowsBy8AvxVnni<kQk0, DotQ4_0Rows8AvxVnni, DotQ4_0Avx2>;
  switch (weight) {
    case WeightType::kQ8_0: return DotRowsBy8Avx2<BlockQ8_0, kQk0, DotQ8_0Rows8Avx2, DotQ8_0Avx2>;
    case WeightType::kQ4_0: return DotRowsBy8Avx2<BlockQ8_0, kQk0, DotQ4_0Rows8Avx2, DotQ4_0Avx2>;
    case WeightType::kQ6_K: return DotRowsBy8Avx2<BlockQ8_K, kQkK, DotKRows8Avx2<Q6KAvx2>, DotKAvx2<Q6KAvx2>>;
    default: return nullptr;
  }
}

QuantizeFn Avx2Quantize(WeightType act) {
  switch (act) {
    case WeightType::kQ8_0: return QuantizeQ8_0Avx2;
    case WeightType::kQ8_1: return QuantizeQ8_1Avx2;
    case WeightType::kQ8_K: return QuantizeQ8_KAvx2;
    default: return nullptr;
  }
}

DotRowsTokensFn Avx2DotRowsTokens(WeightType weight) {
  switch (weight) {
    case WeightType::kQ4_K: return DotKRowsTokensAvx2<K45Avx2<false>>;
    case WeightType::kQ5_K: return DotKRowsTokensAvx2<K45Avx2<true>>;
    // Q6_K's measured 0.98 - 1.20x its one-token kernel (1.0 at 64 tokens): its per-token
    // step is most of its work, so it keeps the one-token path.
    default: return nullptr;
  }
}
}  // namespace quant_internal

}  // namespace tierkv::kernels

#else  // not x86

namespace tierkv::kernels::quant_internal {
DotFn Avx2Dot(WeightType) { return nullptr; }
DotRowsFn Avx2DotRows(WeightType, bool) { return nullptr; }
DotRowsTokensFn Avx2DotRowsTokens(WeightType) { return nullptr; }
QuantizeFn Avx2Quantize(WeightType) { return nullptr; }
}  // namespace tierkv::kernels::quant_internal

#endif
