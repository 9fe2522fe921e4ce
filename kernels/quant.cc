// kernels/quant.cc
//
// Type table, dequantization, activation quantization and the scalar (portable) dot
// products. The scalar dots are also the oracle the SIMD ones are tested against: the
// integer parts are exact in every path, so paths differ only in f32 summation order.
#include "kernels/quant.h"

#include <cassert>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/fp16.h"

namespace tierkv::kernels {
namespace {

constexpr WeightTypeInfo kTypes[] = {
    {WeightType::kF32, "F32", 1, 4, WeightType::kF32},
    {WeightType::kF16, "F16", 1, 2, WeightType::kF16},
    {WeightType::kQ4_0, "Q4_0", kQk0, sizeof(BlockQ4_0), WeightType::kQ8_0},
    {WeightType::kQ4_1, "Q4_1", kQk0, sizeof(BlockQ4_1), WeightType::kQ8_1},
    {WeightType::kQ5_0, "Q5_0", kQk0, sizeof(BlockQ5_0), WeightType::kQ8_0},
    {WeightType::kQ5_1, "Q5_1", kQk0, sizeof(BlockQ5_1), WeightType::kQ8_1},
    {WeightType::kQ8_0, "Q8_0", kQk0, sizeof(BlockQ8_0), WeightType::kQ8_0},
    {WeightType::kQ8_1, "Q8_1", kQk0, sizeof(BlockQ8_1), WeightType::kQ8_1},
    {WeightType::kQ2_K, "Q2_K", kQkK, sizeof(BlockQ2_K), WeightType::kQ8_K},
    {WeightType::kQ3_K, "Q3_K", kQkK, sizeof(BlockQ3_K), WeightType::kQ8_K},
    {WeightType::kQ4_K, "Q4_K", kQkK, sizeof(BlockQ4_K), WeightType::kQ8_K},
    {WeightType::kQ5_K, "Q5_K", kQkK, sizeof(BlockQ5_K), WeightType::kQ8_K},
    {WeightType::kQ6_K, "Q6_K", kQkK, sizeof(BlockQ6_K), WeightType::kQ8_K},
    {WeightType::kQ8_K, "Q8_K", kQkK, sizeof(BlockQ8_K), WeightType::kQ8_K},
    {WeightType::kIQ4_NL, "IQ4_NL", kQk0, sizeof(BlockIq4Nl), WeightType::kQ8_0},
    {WeightType::kIQ4_XS, "IQ4_XS", kQkK, sizeof(BlockIq4Xs), WeightType::kQ8_K},
    {WeightType::kBF16, "BF16", 1, 2, WeightType::kBF16},
};

// Round half to even, as ggml's nearest_int and _mm256_round_ps(_MM_ROUND_NEAREST) do
// (the default floating-point environment rounds to nearest even).
inline int RoundHalfEven(float v) { return static_cast<int>(std::nearbyint(v)); }

// ---- dequantization -------------------------------------------------------------------

// The 5th bits of a Q5_0 / Q5_1 block: bit i of the little-endian 32-bit qh is value i's.
inline uint32_t HighBits(const uint8_t* qh) {
  uint32_t h;
  std::memcpy(&h, qh, sizeof(h));
  return h;
}

// Nibble j of a 32-value block: low nibbles are values 0..15, high ones 16..31.
inline int Nibble(const uint8_t* qs, int j) { return j < kQk0 / 2 ? (qs[j] & 0xf) : (qs[j - kQk0 / 2] >> 4); }

// Value j (0..31) of a Q5_0 / Q5_1 block: nibble plus the 5th bit, 0..31.
inline int Q5Code(const uint8_t* qs, uint32_t qh, int j) {
  return Nibble(qs, j) | static_cast<int>(((qh >> j) & 1) << 4);
}

// The integer code of value j of each 32-value block type (already offset: -8..7 for
// Q4_0, a level for IQ4_NL), shared by dequantization and the scalar dots.
int CodeQ8(const BlockQ8_0& b, int j) { return b.qs[j]; }
int CodeQ8_1(const BlockQ8_1& b, int j) { return b.qs[j]; }
int CodeQ4_0(const BlockQ4_0& b, int j) { return Nibble(b.qs, j) - 8; }
int CodeIq4Nl(const BlockIq4Nl& b, int j) { return kIq4nlValues[Nibble(b.qs, j)]; }
int CodeQ5_0(const BlockQ5_0& b, int j) { return Q5Code(b.qs, HighBits(b.qh), j) - 16; }
int CodeQ4_1(const BlockQ4_1& b, int j) { return Nibble(b.qs, j); }
int CodeQ5_1(const BlockQ5_1& b, int j) { return Q5Code(b.qs, HighBits(b.qh), j); }

// x = code * d, or for the types with a min (Q4_1, Q5_1) d * code + m, which
// llama.cpp's compilers contract to one fused multiply-add.
template <typename Block>
void DequantBlocks32(const Block* b, float* y, int64_t nb, int (*code)(const Block&, int)) {
  for (int64_t i = 0; i < nb; ++i, y += kQk0) {
    const float d = F16ToF32(b[i].d);
    for (int j = 0; j < kQk0; ++j) {
      if constexpr (requires { b[i].m; }) {
        y[j] = std::fma(static_cast<float>(code(b[i], j)), d, F16ToF32(b[i].m));
      } else {
        y[j] = static_cast<float>(code(b[i], j)) * d;
      }
    }
  }
}

// Q2_K / Q3_K: the 2 low bits of value 128h + 32j + l are bits 2j..2j+1 of qs[32h + l].
inline int Low2(const uint8_t* qs, int v) { return (qs[32 * (v / 128) + v % 32] >> (2 * ((v % 128) / 32))) & 3; }

// Value v (0..255) of a Q3_K super-block: -4..3.
inline int Q3Code(const BlockQ3_K& b, int v) { return Low2(b.qs, v) + 4 * ((b.hmask[v % 32] >> (v / 32)) & 1) - 4; }

void DequantQ2_K(const BlockQ2_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQkK) {
    const float d = F16ToF32(b[i].d), dmin = F16ToF32(b[i].dmin);
    for (int v = 0; v < kQkK; ++v) {
      const uint8_t sc = b[i].scales[v / 16];
      const float dl = d * static_cast<float>(sc & 15), ml = dmin * static_cast<float>(sc >> 4);
      y[v] = dl * static_cast<float>(Low2(b[i].qs, v)) - ml;
    }
  }
}

void DequantQ3_K(const BlockQ3_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQkK) {
    const float d = F16ToF32(b[i].d);
    for (int v = 0; v < kQkK; ++v) {
      y[v] = d * static_cast<float>(ScaleQ3K(b[i].scales, v / 16) - 32) * static_cast<float>(Q3Code(b[i], v));
    }
  }
}

void DequantQ4_K(const BlockQ4_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = F16ToF32(b[i].d);
    const float dmin = F16ToF32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int c = 0; c < 4; ++c, q += 32) {
      uint8_t sc, m;
      ScaleMinK4(2 * c, b[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      ScaleMinK4(2 * c + 1, b[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xf) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void DequantQ5_K(const BlockQ5_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = F16ToF32(b[i].d);
    const float dmin = F16ToF32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    const uint8_t* qh = b[i].qh;
    uint8_t u1 = 1, u2 = 2;
    for (int c = 0; c < 4; ++c, q += 32, u1 <<= 2, u2 <<= 2) {
      uint8_t sc, m;
      ScaleMinK4(2 * c, b[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      ScaleMinK4(2 * c + 1, b[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((q[l] & 0xf) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((q[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
  }
}

void DequantQ6_K(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = F16ToF32(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        // (d * scale) * q, in this order, as llama.cpp's row lookup computes it.
        y[l + 0] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

// Sub-block j's scale (d * (code - 32), in f32, as ggml's row lookup computes it) times
// the level of each nibble.
void DequantIq4Xs(const BlockIq4Xs* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = F16ToF32(b[i].d);
    for (int j = 0; j < kQkK / 32; ++j, y += 32) {
      const float dl = d * static_cast<float>(ScaleIq4Xs(b[i], j) - 32);
      const uint8_t* qs = b[i].qs + 16 * j;
      for (int l = 0; l < 16; ++l) {
        y[l] = dl * static_cast<float>(kIq4nlValues[qs[l] & 0xf]);
        y[l + 16] = dl * static_cast<float>(kIq4nlValues[qs[l] >> 4]);
      }
    }
  }
}

void DequantQ8_K(const BlockQ8_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQkK) {
    for (int j = 0; j < kQkK; ++j) y[j] = b[i].d * static_cast<float>(b[i].qs[j]);
  }
}

// ---- activation quantization ----------------------------------------------------------

// One 32-value block to Q8_0 codes: qs and the fp16 d; returns the f32 scale amax / 127.
float QuantizeBlock32(const float* x, int8_t* qs, uint16_t* d16) {
  float amax = 0.0f;
  for (int j = 0; j < kQk0; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  *d16 = F32ToF16(d);
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  for (int j = 0; j < kQk0; ++j) qs[j] = static_cast<int8_t>(RoundHalfEven(x[j] * id));
  return d;
}

void QuantizeQ8_0(const float* x, BlockQ8_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQk0) QuantizeBlock32(x, y[i].qs, &y[i].d);
}

// Q8_0 plus s = fp16(d * sum of the codes), with d the f32 scale before rounding to fp16.
void QuantizeQ8_1(const float* x, BlockQ8_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQk0) {
    const float d = QuantizeBlock32(x, y[i].qs, &y[i].d);
    int sum = 0;
    for (int j = 0; j < kQk0; ++j) sum += y[i].qs[j];
    y[i].s = F32ToF16(d * static_cast<float>(sum));
  }
}

template <bool kTiesAway>
void QuantizeQ8_K(const float* x, BlockQ8_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQkK) {
    float max = 0.0f, amax = 0.0f;
    for (int j = 0; j < kQkK; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax == 0.0f) {
      std::memset(&y[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < kQkK; ++j) {
      const int v = kTiesAway ? static_cast<int>(std::round(iscale * x[j])) : RoundHalfEven(iscale * x[j]);
      y[i].qs[j] = static_cast<int8_t>(v < 127 ? v : 127);
    }
    for (int g = 0; g < kQkK / 16; ++g) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += y[i].qs[16 * g + l];
      y[i].bsums[g] = static_cast<int16_t>(sum);
    }
    y[i].d = 1.0f / iscale;
  }
}

// ---- scalar dot products --------------------------------------------------------------
// f32 sums use 8 interleaved partial sums, so the compiler can vectorise them and long
// rows lose less precision than with one running sum.

inline float Sum8(const float* l) { return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])); }

float DotF32Scalar(const void* row, const void* act, int64_t n) {
  const auto* w = static_cast<const float*>(row);
  const auto* x = static_cast<const float*>(act);
  float lanes[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lanes[j] += w[i + j] * x[i + j];
  }
  for (; i < n; ++i) lanes[i & 7] += w[i] * x[i];
  return Sum8(lanes);
}

float DotF16Scalar(const void* row, const void* act, int64_t n) {
  const auto* w = static_cast<const uint16_t*>(row);
  const auto* x = static_cast<const uint16_t*>(act);
  float lanes[8] = {};
  for (int64_t i = 0; i < n; ++i) lanes[i & 7] += F16ToF32(w[i]) * F16ToF32(x[i]);
  return Sum8(lanes);
}

float DotBf16Scalar(const void* row, const void* act, int64_t n) {
  const auto* w = static_cast<const uint16_t*>(row);
  const auto* x = static_cast<const uint16_t*>(act);
  float lanes[8] = {};
  for (int64_t i = 0; i < n; ++i) lanes[i & 7] += Bf16ToF32(w[i]) * Bf16ToF32(x[i]);
  return Sum8(lanes);
}

// The 32-value block types x Q8_0 / Q8_1, `code` as above. Per block the integer sum
// is scaled by d_w * d_x (f32 product of the two fp16 scales) and added:
//   kFused  false: sum += isum * scale (ggml's vec_dot for Q8_0, Q5_0, Q4_1, Q5_1);
//           true:  sum = fma(isum, scale, sum) (llama.cpp's repacked Q4_0 / IQ4_NL
//                  kernels, see quant_avx2.cc).
// Q4_1 / Q5_1 also sum m_w * s_x over the blocks apart, added at the end.
template <bool kFused, typename Block, typename Act, typename Code>
float DotBlocks32(const void* row, const void* act, int64_t n, Code code) {
  const auto* w = static_cast<const Block*>(row);
  const auto* x = static_cast<const Act*>(act);
  float sum = 0.0f, summs = 0.0f;
  for (int64_t i = 0; i < n / kQk0; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQk0; ++j) sumi += code(w[i], j) * x[i].qs[j];
    const float scale = F16ToF32(w[i].d) * F16ToF32(x[i].d);
    if constexpr (kFused) {
      sum = std::fma(static_cast<float>(sumi), scale, sum);
    } else {
      sum += static_cast<float>(sumi) * scale;
    }
    if constexpr (std::is_same_v<Act, BlockQ8_1>) summs += F16ToF32(w[i].m) * F16ToF32(x[i].s);
  }
  return sum + summs;
}

float DotQ8_0Scalar(const void* row, const void* act, int64_t n) {
  return DotBlocks32<false, BlockQ8_0, BlockQ8_0>(row, act, n, CodeQ8);
}
float DotQ4_0Scalar(const void* row, const void* act, int64_t n) {
  return DotBlocks32<true, BlockQ4_0, BlockQ8_0>(row, act, n, CodeQ4_0);
}
float DotIq4NlScalar(const void* row, const void* act, int64_t n) {
  return DotBlocks32<true, BlockIq4Nl, BlockQ8_0>(row, act, n, CodeIq4Nl);
}
float DotQ5_0Scalar(const void* row, const void* act, int64_t n) {
  return DotBlocks32<false, BlockQ5_0, BlockQ8_0>(row, act, n, CodeQ5_0);
}
float DotQ4_1Scalar(const void* row, const void* act, int64_t n) {
  return DotBlocks32<false, BlockQ4_1, BlockQ8_1>(row, act, n, CodeQ4_1);
}
float DotQ5_1Scalar(const void* row, const void* act, int64_t n) {
  return DotBlocks32<false, BlockQ5_1, BlockQ8_1>(row, act, n, CodeQ5_1);
}

// Q2_K / Q3_K: the 16-value group sums times the groups' scales. Q2_K (4-bit scales,
// its mins through the activation's 16-value sums): sum += d * isum - dmin * summ, as
// Q4_K. Q3_K (signed 6-bit scales): sum += d_x * d_w * isum, as Q6_K.
template <typename Block>
float DotQ23_KScalar(const void* row, const void* act, int64_t n) {
  constexpr bool kTwo = std::is_same_v<Block, BlockQ2_K>;
  const auto* w = static_cast<const Block*>(row);
  const auto* x = static_cast<const BlockQ8_K*>(act);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQkK; ++i) {
    int sumi = 0, summ = 0;
    for (int g = 0; g < 16; ++g) {
      int gs = 0;
      for (int v = 16 * g; v < 16 * g + 16; ++v) {
        if constexpr (kTwo) {
          gs += Low2(w[i].qs, v) * x[i].qs[v];
        } else {
          gs += Q3Code(w[i], v) * x[i].qs[v];
        }
      }
      if constexpr (kTwo) {
        sumi += (w[i].scales[g] & 15) * gs;
        summ += (w[i].scales[g] >> 4) * x[i].bsums[g];
      } else {
        sumi += (ScaleQ3K(w[i].scales, g) - 32) * gs;
      }
    }
    if constexpr (kTwo) {
      const float d = x[i].d * F16ToF32(w[i].d);
      const float dmin = x[i].d * F16ToF32(w[i].dmin);
      sum += d * static_cast<float>(sumi) - dmin * static_cast<float>(summ);
    } else {
      sum += x[i].d * F16ToF32(w[i].d) * static_cast<float>(sumi);
    }
  }
  return sum;
}

float DotQ4_KScalar(const void* row, const void* act, int64_t n) {
  const auto* w = static_cast<const BlockQ4_K*>(row);
  const auto* x = static_cast<const BlockQ8_K*>(act);
  float sum = 0.0f, mins = 0.0f;
  for (int64_t i = 0; i < n / kQkK; ++i) {
    int sumi = 0, summ = 0;
    const uint8_t* q = w[i].qs;
    const int8_t* a = x[i].qs;
    for (int c = 0; c < 4; ++c, q += 32, a += 64) {
      uint8_t sc0, m0, sc1, m1;
      ScaleMinK4(2 * c, w[i].scales, &sc0, &m0);
      ScaleMinK4(2 * c + 1, w[i].scales, &sc1, &m1);
      int lo = 0, hi = 0;
      for (int l = 0; l < 32; ++l) {
        lo += (q[l] & 0xf) * a[l];
        hi += (q[l] >> 4) * a[l + 32];
      }
      sumi += sc0 * lo + sc1 * hi;
      summ += m0 * (x[i].bsums[4 * c] + x[i].bsums[4 * c + 1]) + m1 * (x[i].bsums[4 * c + 2] + x[i].bsums[4 * c + 3]);
    }
    // Two chains, as ggml's repacked Q4_K gemv (the SIMD kernels do the same).
    sum = std::fma(static_cast<float>(sumi), x[i].d * F16ToF32(w[i].d), sum);
    mins = std::fma(static_cast<float>(summ), x[i].d * F16ToF32(w[i].dmin), mins);
  }
  return sum - mins;
}

// Q5_K in the order of ggml's x86 vec_dot (llama.cpp does not repack Q5_K on x86): the
// 8 integer lanes of DotQ6_KScalar (lane L: values 4L .. 4L + 3 of every 32-value chunk,
// times the chunk's scale), acc[L] = fma(d_x * d_w, lane L, acc[L]); the mins in a
// chain of their own, m = fma(-(d_x * dmin_w), summ, m); HsumLanes8(acc) + m.
float DotQ5_KScalar(const void* row, const void* act, int64_t n) {
  const auto* w = static_cast<const BlockQ5_K*>(row);
  const auto* x = static_cast<const BlockQ8_K*>(act);
  float acc[8] = {};
  float mins = 0.0f;
  for (int64_t i = 0; i < n / kQkK; ++i) {
    int lane[8] = {}, summ = 0;
    for (int c = 0; c < 8; ++c) {  // 32-value chunk c: nibbles of qs[32 (c / 2) ..], 5th bit c of qh
      uint8_t sc, m;
      ScaleMinK4(c, w[i].scales, &sc, &m);
      summ += m * (x[i].bsums[2 * c] + x[i].bsums[2 * c + 1]);
      const uint8_t* q = w[i].qs + 32 * (c / 2);
      for (int l = 0; l < 32; ++l) {
        const int code = (c % 2 == 0 ? q[l] & 0xf : q[l] >> 4) | (((w[i].qh[l] >> c) & 1) << 4);
        lane[l / 4] += sc * code * x[i].qs[32 * c + l];
      }
    }
    const float d = x[i].d * F16ToF32(w[i].d);
    const float dmin = x[i].d * F16ToF32(w[i].dmin);
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(d, static_cast<float>(lane[l]), acc[l]);
    mins = std::fma(-dmin, static_cast<float>(summ), mins);
  }
  return HsumLanes8(acc) + mins;
}

// Q6_K in the order of ggml's x86 vec_dot (which llama.cpp runs Q6_K matrices through:
// they are not repacked): per super-block 8 integer lanes, lane L summing values
// 4L .. 4L + 3 of every 32-value chunk (unsigned codes times their 16-group's scale) less
// 32 * (sc[2L] bsums[2L] + sc[2L + 1] bsums[2L + 1]), the -32 offset through the
// activation's group sums; then acc[L] = fma(d_x * d_w, lane L, acc[L]) and the 8 lanes
// added as (L, L + 4) pairs, then (0, 2) (1, 3), then the two (HsumLanes8).
float DotQ6_KScalar(const void* row, const void* act, int64_t n) {
  const auto* w = static_cast<const BlockQ6_K*>(row);
  const auto* x = static_cast<const BlockQ8_K*>(act);
  float acc[8] = {};
  for (int64_t i = 0; i < n / kQkK; ++i) {
    int lane[8] = {};
    const int8_t* sc = w[i].scales;
    for (int e = 0; e < kQkK; ++e) {
      const int h = e / 128, k = (e % 128) / 32, b = e % 32;
      const uint8_t ql = w[i].ql[64 * h + 32 * (k & 1) + b];
      const int q = ((k < 2 ? ql : ql >> 4) & 0xf) | (((w[i].qh[32 * h + b] >> (2 * k)) & 3) << 4);
      lane[b / 4] += sc[e / 16] * q * x[i].qs[e];
    }
    const float d = x[i].d * F16ToF32(w[i].d);
    for (int l = 0; l < 8; ++l) {
      lane[l] -= 32 * (sc[2 * l] * x[i].bsums[2 * l] + sc[2 * l + 1] * x[i].bsums[2 * l + 1]);
      acc[l] = std::fma(d, static_cast<float>(lane[l]), acc[l]);
    }
  }
  return HsumLanes8(acc);
}

// IQ4_XS x Q8_K: per super-block the integer sum over sub-blocks of (code - 32) times
// the sub-block's level x activation sum, scaled by d_w * d_x.
float DotIq4XsScalar(const void* row, const void* act, int64_t n) {
  const auto* w = static_cast<const BlockIq4Xs*>(row);
  const auto* x = static_cast<const BlockQ8_K*>(act);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQkK; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQkK / 32; ++j) {
      const uint8_t* qs = w[i].qs + 16 * j;
      const int8_t* a = x[i].qs + 32 * j;
      int s = 0;
      for (int l = 0; l < 16; ++l) s += kIq4nlValues[qs[l] & 0xf] * a[l] + kIq4nlValues[qs[l] >> 4] * a[l + 16];
      sumi += (ScaleIq4Xs(w[i], j) - 32) * s;
    }
    sum += F16ToF32(w[i].d) * x[i].d * static_cast<float>(sumi);
  }
  return sum;
}

}  // namespace

const WeightTypeInfo* FindWeightType(uint32_t ggml_id) {
  for (const WeightTypeInfo& t : kTypes) {
    if (static_cast<uint32_t>(t.type) == ggml_id) return &t;
  }
  return nullptr;
}

const WeightTypeInfo& GetWeightTypeInfo(WeightType type) {
  const WeightTypeInfo* t = FindWeightType(static_cast<uint32_t>(type));
  assert(t != nullptr);
  return *t;
}

size_t RowBytes(WeightType type, int64_t n) {
  const WeightTypeInfo& t = GetWeightTypeInfo(type);
  assert(n % t.block_size == 0);
  return static_cast<size_t>(n / t.block_size) * static_cast<size_t>(t.block_bytes);
}

void DequantizeRow(WeightType type, const void* row, float* out, int64_t n) {
  switch (type) {
    case WeightType::kF32: std::memcpy(out, row, sizeof(float) * static_cast<size_t>(n)); return;
    case WeightType::kF16: F16ToF32Array(static_cast<const uint16_t*>(row), out, static_cast<size_t>(n)); return;
    case WeightType::kBF16: Bf16ToF32Array(static_cast<const uint16_t*>(row), out, static_cast<size_t>(n)); return;
    case WeightType::kQ8_0: DequantBlocks32(static_cast<const BlockQ8_0*>(row), out, n / kQk0, CodeQ8); return;
    case WeightType::kQ4_0: DequantBlocks32(static_cast<const BlockQ4_0*>(row), out, n / kQk0, CodeQ4_0); return;
    case WeightType::kQ4_1: DequantBlocks32(static_cast<const BlockQ4_1*>(row), out, n / kQk0, CodeQ4_1); return;
    case WeightType::kQ5_0: DequantBlocks32(static_cast<const BlockQ5_0*>(row), out, n / kQk0, CodeQ5_0); return;
    case WeightType::kQ5_1: DequantBlocks32(static_cast<const BlockQ5_1*>(row), out, n / kQk0, CodeQ5_1); return;
    case WeightType::kIQ4_NL: DequantBlocks32(static_cast<const BlockIq4Nl*>(row), out, n / kQk0, CodeIq4Nl); return;
    case WeightType::kQ8_1: DequantBlocks32(static_cast<const BlockQ8_1*>(row), out, n / kQk0, CodeQ8_1); return;
    case WeightType::kQ2_K: DequantQ2_K(static_cast<const BlockQ2_K*>(row), out, n / kQkK); return;
    case WeightType::kQ3_K: DequantQ3_K(static_cast<const BlockQ3_K*>(row), out, n / kQkK); return;
    case WeightType::kQ4_K: DequantQ4_K(static_cast<const BlockQ4_K*>(row), out, n / kQkK); return;
    case WeightType::kQ5_K: DequantQ5_K(static_cast<const BlockQ5_K*>(row), out, n / kQkK); return;
    case WeightType::kQ6_K: DequantQ6_K(static_cast<const BlockQ6_K*>(row), out, n / kQkK); return;
    case WeightType::kIQ4_XS: DequantIq4Xs(static_cast<const BlockIq4Xs*>(row), out, n / kQkK); return;
    case WeightType::kQ8_K: DequantQ8_K(static_cast<const BlockQ8_K*>(row), out, n / kQkK); return;
    default: break;  // the ggml types the kernels do not read (FindWeightType refuses them)
  }
  assert(false && "unsupported weight type");
}

void QuantizeActivation(WeightType act, const float* x, void* out, int64_t n) {
  if (ActiveSimdLevel() >= SimdLevel::kAvx2) {
    if (quant_internal::QuantizeFn q = quant_internal::Avx2Quantize(act)) {
      return q(x, out, n / (act == WeightType::kQ8_K ? kQkK : kQk0));
    }
  }
  switch (act) {
    case WeightType::kF32: std::memcpy(out, x, sizeof(float) * static_cast<size_t>(n)); return;
    case WeightType::kF16: F32ToF16Array(x, static_cast<uint16_t*>(out), static_cast<size_t>(n)); return;
    case WeightType::kBF16: F32ToBf16Array(x, static_cast<uint16_t*>(out), static_cast<size_t>(n)); return;
    case WeightType::kQ8_0: QuantizeQ8_0(x, static_cast<BlockQ8_0*>(out), n / kQk0); return;
    case WeightType::kQ8_1: QuantizeQ8_1(x, static_cast<BlockQ8_1*>(out), n / kQk0); return;
    case WeightType::kQ8_K: QuantizeQ8_K<false>(x, static_cast<BlockQ8_K*>(out), n / kQkK); return;
    default: break;
  }
  assert(false && "not an activation type");
}

void QuantizeQ8KTiesAway(const float* x, void* out, int64_t n) {
  assert(n % kQkK == 0);
  QuantizeQ8_K<true>(x, static_cast<BlockQ8_K*>(out), n / kQkK);
}

namespace quant_internal {
DotFn ScalarDot(WeightType weight) {
  switch (weight) {
    case WeightType::kF32: return DotF32Scalar;
    case WeightType::kF16: return DotF16Scalar;
    case WeightType::kBF16: return DotBf16Scalar;
    case WeightType::kQ8_0: return DotQ8_0Scalar;
    case WeightType::kQ4_0: return DotQ4_0Scalar;
    case WeightType::kQ4_1: return DotQ4_1Scalar;
    case WeightType::kQ5_0: return DotQ5_0Scalar;
    case WeightType::kQ5_1: return DotQ5_1Scalar;
    case WeightType::kIQ4_NL: return DotIq4NlScalar;
    case WeightType::kQ2_K: return DotQ23_KScalar<BlockQ2_K>;
    case WeightType::kQ3_K: return DotQ23_KScalar<BlockQ3_K>;
    case WeightType::kQ4_K: return DotQ4_KScalar;
    case WeightType::kQ5_K: return DotQ5_KScalar;
    case WeightType::kQ6_K: return DotQ6_KScalar;
    case WeightType::kIQ4_XS: return DotIq4XsScalar;
    case WeightType::kQ8_1:
    case WeightType::kQ8_K: return nullptr;
    default: break;  // the ggml types the kernels do not read
  }
  return nullptr;
}
}  // namespace quant_internal

DotFn GetDotFn(WeightType weight, SimdLevel level) {
  if (level >= SimdLevel::kAvx512) {
    if (DotFn f = quant_internal::Avx512Dot(weight)) return f;
  }
  if (level >= SimdLevel::kAvx2) {
    if (DotFn f = quant_internal::Avx2Dot(weight)) return f;
  }
  return quant_internal::ScalarDot(weight);
}

bool DotRowsFnStreams(WeightType weight, SimdLevel level) {
  return weight != WeightType::kQ8_0 || (level >= SimdLevel::kAvx512 && quant_internal::HasAvx512Vnni());
}

DotRowsFn GetDotRowsFn(WeightType weight, SimdLevel level) {
  if (level >= SimdLevel::kAvx512) {
    if (DotRowsFn f = quant_internal::Avx512DotRows(weight)) return f;
    // Its one-row kernel is an AVX-512 one: no multi-row kernel has its bits.
    if (quant_internal::Avx512Dot(weight) != nullptr) return nullptr;
  }
  if (level >= SimdLevel::kAvx2 && quant_internal::Avx2Dot(weight) != nullptr) {
    return quant_internal::Avx2DotRows(weight, AvxVnniActive());
  }
  return nullptr;
}

bool BatchedSumsDiffer(WeightType weight, SimdLevel level) {
  return level >= SimdLevel::kAvx512 && quant_internal::Avx512BatchDotRowsTokens(weight) != nullptr;
}

DotRowsTokensFn GetDotRowsTokensFn(WeightType weight, SimdLevel level, TokenSums sums) {
  if (sums == TokenSums::kBatched && BatchedSumsDiffer(weight, level)) {
    return quant_internal::Avx512BatchDotRowsTokens(weight);
  }
  if (level >= SimdLevel::kAvx512) {
    if (DotRowsTokensFn f = quant_internal::Avx512DotRowsTokens(weight)) return f;
    // No VNNI: the one-token kernels at this level are the AVX2 ones, and so are these.
    if (quant_internal::HasAvx512Vnni()) return nullptr;
  }
  if (level >= SimdLevel::kAvx2) return quant_internal::Avx2DotRowsTokens(weight);
  return nullptr;
}

DotRowsTokensFn GetLlamaGemmRowsTokensFn(WeightType weight, SimdLevel level) {
  return level >= SimdLevel::kAvx512 ? quant_internal::Avx512LlamaGemmRowsTokens(weight) : nullptr;
}

const char* ActiveKernelsName() {
  switch (ActiveSimdLevel()) {
    case SimdLevel::kAvx512: return quant_internal::HasAvx512Vnni() ? "avx512-vnni" : "avx512";
    case SimdLevel::kAvx2: return AvxVnniActive() ? "avx2+avx-vnni" : "avx2";
    case SimdLevel::kScalar: return "scalar";
  }
  return "scalar";
}

SimdLevel DotFnLevel(WeightType weight, SimdLevel level) {
  if (level >= SimdLevel::kAvx512 && quant_internal::Avx512Dot(weight)) return SimdLevel::kAvx512;
  if (level >= SimdLevel::kAvx2 && quant_internal::Avx2Dot(weight)) return SimdLevel::kAvx2;
  return SimdLevel::kScalar;
}

}  // namespace tierkv::kernels
