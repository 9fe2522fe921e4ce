// tests/kernels/quant_test.cc
//
// Block layouts, dequantization, activation quantization and the dot products of every
// weight type, at every SIMD level the CPU has, against scalar double references written
// here independently (element-wise formulas rather than the kernels' block loops).
#include "kernels/quant.h"
#include "memory/simd_env.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu_features.h"
#include "kernels/fp16.h"
#include "kernels/quant_simd.h"
#include "tests/kernels/sum_orders.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tierkv::kernels {
namespace {

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("f16c"))) uint16_t HardwareF16(float x) { return static_cast<uint16_t>(_cvtss_sh(x, 0)); }
#endif

constexpr WeightType kWeightTypes[] = {WeightType::kF32,  WeightType::kF16,  WeightType::kBF16, WeightType::kQ8_0,
                                       WeightType::kQ4_0, WeightType::kQ4_1, WeightType::kQ5_0, WeightType::kQ5_1,
                                       WeightType::kQ2_K, WeightType::kQ3_K, WeightType::kQ4_K, WeightType::kQ5_K,
                                       WeightType::kQ6_K, WeightType::kIQ4_NL, WeightType::kIQ4_XS};

std::vector<SimdLevel> Levels() {
  std::vector<SimdLevel> v = {SimdLevel::kScalar};
  if (DetectedSimdLevel() >= SimdLevel::kAvx2) v.push_back(SimdLevel::kAvx2);
  if (DetectedSimdLevel() >= SimdLevel::kAvx512) v.push_back(SimdLevel::kAvx512);
  return v;
}

uint16_t RandomScale(std::mt19937& rng, float lo, float hi) {
  return F32ToF16(std::uniform_real_distribution<float>(lo, hi)(rng));
}

// A random row of n values of `type` (raw bytes; quantized types with random codes and
// plausible fp16 scales).
std::vector<uint8_t> RandomRow(WeightType type, int64_t n, std::mt19937& rng) {
  std::vector<uint8_t> row(RowBytes(type, n));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : row) b = static_cast<uint8_t>(byte(rng));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  switch (type) {
    case WeightType::kF32: {
      auto* f = reinterpret_cast<float*>(row.data());
      for (int64_t i = 0; i < n; ++i) f[i] = normal(rng);
      break;
    }
    case WeightType::kF16: {
      auto* h = reinterpret_cast<uint16_t*>(row.data());
      for (int64_t i = 0; i < n; ++i) h[i] = F32ToF16(normal(rng));
      break;
    }
    case WeightType::kBF16: {
      auto* h = reinterpret_cast<uint16_t*>(row.data());
      for (int64_t i = 0; i < n; ++i) h[i] = F32ToBf16(normal(rng));
      break;
    }
    case WeightType::kQ8_0: {
      auto* b = reinterpret_cast<BlockQ8_0*>(row.data());
      for (int64_t i = 0; i < n / kQk0; ++i) {
        b[i].d = RandomScale(rng, 0.001f, 0.02f);
        for (int8_t& q : b[i].qs) q = static_cast<int8_t>(std::uniform_int_distribution<int>(-127, 127)(rng));
      }
      break;
    }
    case WeightType::kQ4_0:
    case WeightType::kQ5_0:
    case WeightType::kIQ4_NL: {
      // d first; the codes (and Q5_0's qh) keep their random bytes.
      const size_t bytes = GetWeightTypeInfo(type).block_bytes;
      for (int64_t i = 0; i < n / kQk0; ++i) {
        const uint16_t d = RandomScale(rng, 0.01f, 0.2f);
        std::memcpy(row.data() + i * bytes, &d, 2);
      }
      break;
    }
    case WeightType::kQ4_1:
    case WeightType::kQ5_1: {
      // d, then a min m of either sign.
      const size_t bytes = GetWeightTypeInfo(type).block_bytes;
      for (int64_t i = 0; i < n / kQk0; ++i) {
        const uint16_t d = RandomScale(rng, 0.005f, 0.1f), m = RandomScale(rng, -1.0f, 1.0f);
        std::memcpy(row.data() + i * bytes, &d, 2);
        std::memcpy(row.data() + i * bytes + 2, &m, 2);
      }
      break;
    }
    case WeightType::kQ4_K:
    case WeightType::kQ5_K: {
      const size_t bytes = GetWeightTypeInfo(type).block_bytes;
      for (int64_t i = 0; i < n / kQkK; ++i) {
        uint16_t d = RandomScale(rng, 0.0005f, 0.005f), dmin = RandomScale(rng, 0.0005f, 0.005f);
        std::memcpy(row.data() + i * bytes, &d, 2);
        std::memcpy(row.data() + i * bytes + 2, &dmin, 2);
      }
      break;
    }
    case WeightType::kQ6_K: {
      auto* b = reinterpret_cast<BlockQ6_K*>(row.data());
      for (int64_t i = 0; i < n / kQkK; ++i) b[i].d = RandomScale(rng, 0.0002f, 0.002f);
      break;
    }
    case WeightType::kIQ4_XS: {  // d at byte 0; scale codes and nibbles keep their random bytes
      for (int64_t i = 0; i < n / kQkK; ++i) {
        const uint16_t d = RandomScale(rng, 0.0002f, 0.002f);
        std::memcpy(row.data() + i * 136, &d, 2);
      }
      break;
    }
    case WeightType::kQ2_K: {  // d and dmin at bytes 80 and 82
      for (int64_t i = 0; i < n / kQkK; ++i) {
        const uint16_t d = RandomScale(rng, 0.001f, 0.01f), dmin = RandomScale(rng, 0.001f, 0.01f);
        std::memcpy(row.data() + i * 84 + 80, &d, 2);
        std::memcpy(row.data() + i * 84 + 82, &dmin, 2);
      }
      break;
    }
    case WeightType::kQ3_K: {  // d at byte 108
      for (int64_t i = 0; i < n / kQkK; ++i) {
        const uint16_t d = RandomScale(rng, 0.0005f, 0.005f);
        std::memcpy(row.data() + i * 110 + 108, &d, 2);
      }
      break;
    }
    default: break;
  }
  return row;
}

// ---- independent element-wise dequantization ----

void UnpackScaleMin(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

double RefValue(WeightType type, const uint8_t* row, int64_t i) {
  switch (type) {
    case WeightType::kF32: {
      float f;
      std::memcpy(&f, row + 4 * i, 4);
      return f;
    }
    case WeightType::kF16: return F16ToF32(reinterpret_cast<const uint16_t*>(row)[i]);
    case WeightType::kBF16: return Bf16ToF32(reinterpret_cast<const uint16_t*>(row)[i]);
    case WeightType::kQ8_0: {
      const uint8_t* b = row + (i / 32) * 34;
      return LoadF16(b) * static_cast<int8_t>(b[2 + i % 32]);
    }
    case WeightType::kQ4_0: {
      const uint8_t* b = row + (i / 32) * 18;
      const int r = static_cast<int>(i % 32);
      const int nib = r < 16 ? (b[2 + r] & 15) : (b[2 + r - 16] >> 4);
      return LoadF16(b) * (nib - 8);
    }
    case WeightType::kQ4_1: {
      const uint8_t* b = row + (i / 32) * 20;
      const int r = static_cast<int>(i % 32);
      const int nib = r < 16 ? (b[4 + r] & 15) : (b[4 + r - 16] >> 4);
      return LoadF16(b) * nib + LoadF16(b + 2);
    }
    case WeightType::kQ5_0:
    case WeightType::kQ5_1: {
      // {d, [m,] qh[4], qs[16]}: bit r of the little-endian qh is the 5th bit of value r.
      const bool one = type == WeightType::kQ5_1;
      const uint8_t* b = row + (i / 32) * (one ? 24 : 22);
      const uint8_t* qh = b + (one ? 4 : 2);
      const uint8_t* qs = qh + 4;
      const int r = static_cast<int>(i % 32);
      const int nib = r < 16 ? (qs[r] & 15) : (qs[r - 16] >> 4);
      const int q = nib + 16 * ((qh[r / 8] >> (r % 8)) & 1);
      return one ? LoadF16(b) * q + LoadF16(b + 2) : LoadF16(b) * (q - 16);
    }
    case WeightType::kIQ4_NL: {
      static constexpr int kLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
      const uint8_t* b = row + (i / 32) * 18;
      const int r = static_cast<int>(i % 32);
      const int nib = r < 16 ? (b[2 + r] & 15) : (b[2 + r - 16] >> 4);
      return LoadF16(b) * kLevels[nib];
    }
    case WeightType::kIQ4_XS: {
      // {d, scales_h (u16), scales_l[4], qs[128]}: sub-block j = r / 32 has the 6-bit
      // code (nibble j % 2 of scales_l[j / 2]) | (bits 2j, 2j+1 of scales_h) << 4, scale
      // code - 32; value r % 32 = l (< 16) is the low nibble of qs[16j + l], l + 16 the
      // high one; each nibble indexes the IQ4_NL levels.
      static constexpr int kLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
      const uint8_t* b = row + (i / 256) * 136;
      const int r = static_cast<int>(i % 256), j = r / 32, l = r % 32;
      const int scales_h = b[2] | (b[3] << 8);
      const int code = ((b[4 + j / 2] >> (4 * (j % 2))) & 15) | (((scales_h >> (2 * j)) & 3) << 4);
      const uint8_t q = b[8 + 16 * j + l % 16];
      const int nib = l < 16 ? (q & 15) : (q >> 4);
      return static_cast<double>(static_cast<float>(LoadF16(b) * (code - 32))) * kLevels[nib];
    }
    case WeightType::kQ4_K:
    case WeightType::kQ5_K: {
      const bool five = type == WeightType::kQ5_K;
      const uint8_t* b = row + (i / 256) * (five ? 176 : 144);
      const int r = static_cast<int>(i % 256);
      const int c = r / 64, within = r % 64, l = within % 32;
      const int j = 2 * c + (within >= 32 ? 1 : 0);
      const uint8_t* qs = b + (five ? 48 : 16);
      int q = within < 32 ? (qs[32 * c + l] & 15) : (qs[32 * c + l] >> 4);
      if (five) q += ((b[16 + l] >> j) & 1) * 16;
      int sc, m;
      UnpackScaleMin(b + 4, j, &sc, &m);
      return LoadF16(b) * sc * q - LoadF16(b + 2) * m;
    }
    case WeightType::kQ2_K: {
      // {scales[16], qs[64], d, dmin}: value r = 128h + 32j + l has bits 2j..2j+1 of
      // qs[32h + l]; group r / 16 has scale (low nibble) and min (high nibble).
      const uint8_t* b = row + (i / 256) * 84;
      const int r = static_cast<int>(i % 256);
      const int h = r / 128, j = (r % 128) / 32, l = r % 32;
      const int q = (b[16 + 32 * h + l] >> (2 * j)) & 3;
      const uint8_t sc = b[r / 16];
      return LoadF16(b + 80) * (sc & 15) * q - LoadF16(b + 82) * (sc >> 4);
    }
    case WeightType::kQ3_K: {
      // {hmask[32], qs[64], scales[12], d}: the 2 low bits as Q2_K; the 3rd is bit r / 32
      // of hmask[r % 32], set meaning +4 over the -4 offset; the group's 6-bit scale code
      // is 4 bits of byte (g % 8) (nibble g / 8) and 2 bits of byte 8 + g % 4 (at 2 * (g / 4)).
      const uint8_t* b = row + (i / 256) * 110;
      const int r = static_cast<int>(i % 256);
      const int h = r / 128, j = (r % 128) / 32, l = r % 32, g = r / 16;
      const int low = (b[32 + 32 * h + l] >> (2 * j)) & 3;
      const int hi = (b[r % 32] >> (r / 32)) & 1;
      const uint8_t* s = b + 96;
      const int code = ((s[g % 8] >> (4 * (g / 8))) & 15) | (((s[8 + g % 4] >> (2 * (g / 4))) & 3) << 4);
      return LoadF16(b + 108) * (code - 32) * (low + 4 * hi - 4);
    }
    case WeightType::kQ6_K: {
      const uint8_t* b = row + (i / 256) * 210;
      const int r = static_cast<int>(i % 256);
      const int h = r / 128, k = (r % 128) / 32, l = r % 32;
      const uint8_t qlb = b[64 * h + l + 32 * (k & 1)];
      const int nib = k < 2 ? (qlb & 15) : (qlb >> 4);
      const int hi = (b[128 + 32 * h + l] >> (2 * k)) & 3;
      const int q = (nib | (hi << 4)) - 32;
      const int8_t sc = static_cast<int8_t>(b[192 + 8 * h + l / 16 + 2 * k]);
      return LoadF16(b + 208) * sc * q;
    }
    default: break;
  }
  ADD_FAILURE() << "no reference for type";
  return 0;
}

TEST(QuantTest, TypeTableMatchesGgml) {
  EXPECT_EQ(GetWeightTypeInfo(WeightType::kQ4_K).block_bytes, 144);
  EXPECT_EQ(GetWeightTypeInfo(WeightType::kQ6_K).block_bytes, 210);
  EXPECT_EQ(FindWeightType(12)->type, WeightType::kQ4_K);
  EXPECT_EQ(FindWeightType(3)->type, WeightType::kQ4_1);
  EXPECT_EQ(FindWeightType(20)->type, WeightType::kIQ4_NL);
  EXPECT_EQ(FindWeightType(10)->type, WeightType::kQ2_K);
  EXPECT_EQ(FindWeightType(11)->type, WeightType::kQ3_K);
  EXPECT_EQ(GetWeightTypeInfo(WeightType::kQ2_K).block_bytes, 84);
  EXPECT_EQ(GetWeightTypeInfo(WeightType::kQ3_K).block_bytes, 110);
  EXPECT_EQ(ActivationType(WeightType::kQ3_K), WeightType::kQ8_K);
  EXPECT_EQ(FindWeightType(16), nullptr);  // IQ2_XXS: not supported
  EXPECT_EQ(FindWeightType(39), nullptr);  // MXFP4: not supported
  EXPECT_EQ(GetWeightTypeInfo(WeightType::kQ4_1).block_bytes, 20);
  EXPECT_EQ(GetWeightTypeInfo(WeightType::kQ5_0).block_bytes, 22);
  EXPECT_EQ(GetWeightTypeInfo(WeightType::kQ5_1).block_bytes, 24);
  EXPECT_EQ(GetWeightTypeInfo(WeightType::kIQ4_NL).block_bytes, 18);
  EXPECT_EQ(FindWeightType(23)->type, WeightType::kIQ4_XS);
  EXPECT_EQ(GetWeightTypeInfo(WeightType::kIQ4_XS).block_bytes, 136);
  EXPECT_EQ(GetWeightTypeInfo(WeightType::kIQ4_XS).block_size, 256);
  EXPECT_EQ(ActivationType(WeightType::kIQ4_XS), WeightType::kQ8_K);
  EXPECT_EQ(ActivationType(WeightType::kQ4_0), WeightType::kQ8_0);
  EXPECT_EQ(ActivationType(WeightType::kQ5_0), WeightType::kQ8_0);
  EXPECT_EQ(ActivationType(WeightType::kIQ4_NL), WeightType::kQ8_0);
  EXPECT_EQ(ActivationType(WeightType::kQ4_1), WeightType::kQ8_1);
  EXPECT_EQ(ActivationType(WeightType::kQ5_1), WeightType::kQ8_1);
  EXPECT_TRUE(IsActivationOnly(WeightType::kQ8_1));
  EXPECT_TRUE(IsActivationOnly(WeightType::kQ8_K));
  EXPECT_FALSE(IsActivationOnly(WeightType::kQ8_0));
  EXPECT_EQ(ActivationType(WeightType::kQ6_K), WeightType::kQ8_K);
  EXPECT_EQ(ActivationType(WeightType::kF16), WeightType::kF16);
  EXPECT_EQ(RowBytes(WeightType::kQ5_K, 512), 352u);
  EXPECT_STREQ(WeightTypeName(WeightType::kBF16), "BF16");
}

TEST(QuantTest, DequantizeMatchesElementwiseReference) {
  std::mt19937 rng(7);
  const int64_t n = 512;
  for (WeightType t : kWeightTypes) {
    SCOPED_TRACE(WeightTypeName(t));
    const std::vector<uint8_t> row = RandomRow(t, n, rng);
    std::vector<float> out(n);
    DequantizeRow(t, row.data(), out.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double ref = RefValue(t, row.data(), i);
      ASSERT_NEAR(out[i], ref, 1e-6 * std::fabs(ref) + 1e-9) << "element " << i;
    }
  }
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2"))) void VectorScalesQ3K(const uint8_t* scales, int16_t* out) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), simd::ScalesQ3K(scales));
}

// The vector unpacking of Q3_K's packed 6-bit scales (AVX2 and AVX-512 kernels) against
// the scalar ScaleQ3K, over random scale bytes and the extremes.
TEST(QuantTest, VectorQ3KScalesEqualScalar) {
  if (DetectedSimdLevel() < SimdLevel::kAvx2) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(31);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int trial = 0; trial < 1000; ++trial) {
    uint8_t scales[12];
    for (uint8_t& b : scales) b = static_cast<uint8_t>(trial == 0 ? 0 : trial == 1 ? 255 : byte(rng));
    int16_t got[16];
    VectorScalesQ3K(scales, got);
    for (int g = 0; g < 16; ++g) ASSERT_EQ(got[g], ScaleQ3K(scales, g) - 32) << "trial " << trial << " group " << g;
  }
}
#endif

TEST(QuantTest, Q8_0ActivationRounding) {
  // amax 127 -> id 1: values round half to even (2.5 -> 2, 3.5 -> 4, -2.5 -> -2).
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;
  x[1] = 2.5f;
  x[2] = 3.5f;
  x[3] = -2.5f;
  x[4] = 0.49f;
  BlockQ8_0 b;
  QuantizeActivation(WeightType::kQ8_0, x.data(), &b, 32);
  EXPECT_EQ(F16ToF32(b.d), 1.0f);
  EXPECT_EQ(b.qs[0], 127);
  EXPECT_EQ(b.qs[1], 2);
  EXPECT_EQ(b.qs[2], 4);
  EXPECT_EQ(b.qs[3], -2);
  EXPECT_EQ(b.qs[4], 0);
  // All zero: d = 0, codes 0.
  std::vector<float> z(32, 0.0f);
  QuantizeActivation(WeightType::kQ8_0, z.data(), &b, 32);
  EXPECT_EQ(b.d, 0);
  for (int8_t q : b.qs) EXPECT_EQ(q, 0);
}

TEST(QuantTest, Q8_1ActivationIsQ8_0PlusScaledSum) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(128);
  for (float& v : x) v = normal(rng);
  std::fill(x.begin() + 96, x.end(), 0.0f);  // an all-zero block: d = s = 0
  std::vector<BlockQ8_0> q0(4);
  std::vector<BlockQ8_1> q1(4);
  QuantizeActivation(WeightType::kQ8_0, x.data(), q0.data(), 128);
  QuantizeActivation(WeightType::kQ8_1, x.data(), q1.data(), 128);
  for (int b = 0; b < 4; ++b) {
    EXPECT_EQ(q1[b].d, q0[b].d);
    int sum = 0;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) {
      EXPECT_EQ(q1[b].qs[j], q0[b].qs[j]);
      sum += q1[b].qs[j];
      amax = std::max(amax, std::fabs(x[32 * b + j]));
    }
    // d * sum with the f32 d, rounded once to fp16.
    EXPECT_EQ(q1[b].s, F32ToF16(amax / 127.0f * static_cast<float>(sum))) << "block " << b;
  }
  EXPECT_EQ(q1[3].s, 0);
  std::vector<float> back(128);
  DequantizeRow(WeightType::kQ8_1, q1.data(), back.data(), 128);
  for (int i = 0; i < 128; ++i) EXPECT_EQ(back[i], F16ToF32(q1[i / 32].d) * q1[i / 32].qs[i % 32]);
}

TEST(QuantTest, Q8_KActivation) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> x(512);
  for (float& v : x) v = normal(rng);
  x[17] = 9.0f;     // largest magnitude of block 0: maps to -127 (s = -127/max)
  x[300] = -11.0f;  // block 1, negative: also -127 (d < 0 then)
  std::vector<BlockQ8_K> b(2);
  QuantizeActivation(WeightType::kQ8_K, x.data(), b.data(), 512);
  EXPECT_EQ(b[0].qs[17], -127);
  EXPECT_EQ(b[1].qs[300 - 256], -127);
  EXPECT_GT(b[1].d, 0.0f);
  EXPECT_LT(b[0].d, 0.0f);
  EXPECT_FLOAT_EQ(b[0].d, 1.0f / (-127.0f / 9.0f));
  for (int i = 0; i < 2; ++i) {
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += b[i].qs[16 * g + l];
      EXPECT_EQ(b[i].bsums[g], s);
    }
    for (int j = 0; j < 256; ++j) {
      EXPECT_NEAR(b[i].d * b[i].qs[j], x[256 * i + j], std::fabs(b[i].d) * 0.5f + 1e-6f);
    }
  }
}

// The AVX2 activation quantizers give the scalar ones' bytes: random rows with outliers,
// values on rounding ties (k + 0.5 after scaling: amax 127 makes the scale 1), zero and
// NaN-free blocks, and Q8_K blocks whose largest magnitude appears with both signs (the
// first one's sign sets the scale).
TEST(QuantTest, ActivationQuantizersSameBytesAtEveryLevel) {
  if (DetectedSimdLevel() < SimdLevel::kAvx2) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(41);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::uniform_int_distribution<int> pick(0, 255);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = 1024;
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng);
    switch (trial % 5) {
      case 1:  // ties: amax 127 in every 32-value block, the rest k + 0.5
        for (int64_t j = 0; j < n; ++j) x[j] = j % 32 == 0 ? 127.0f : static_cast<float>(pick(rng) - 128) + 0.5f;
        break;
      case 2:  // a zero block of each size
        std::fill(x.begin(), x.begin() + 256, 0.0f);
        break;
      case 3: {  // the largest magnitude twice, opposite signs, in random order
        const int a = pick(rng), b = (a + 1 + pick(rng) % 255) % 256;
        x[static_cast<size_t>(a)] = 40.0f;
        x[static_cast<size_t>(b)] = -40.0f;
        x[256 + static_cast<size_t>(b)] = 40.0f;
        x[256 + static_cast<size_t>(a)] = -40.0f;
        break;
      }
      case 4:  // tiny and huge values
        for (float& v : x) v *= trial % 2 == 0 ? 1e-30f : 1e20f;
        break;
      default: break;
    }
    for (WeightType act : {WeightType::kQ8_0, WeightType::kQ8_1, WeightType::kQ8_K}) {
      SCOPED_TRACE(std::string(WeightTypeName(act)) + " trial " + std::to_string(trial));
      std::vector<uint8_t> want(RowBytes(act, n)), got(RowBytes(act, n), 0xAA);
      ForceSimdLevel(SimdLevel::kScalar);
      QuantizeActivation(act, x.data(), want.data(), n);
      ForceSimdLevel(SimdLevel::kAvx2);
      ASSERT_NE(quant_internal::Avx2Quantize(act), nullptr);
      QuantizeActivation(act, x.data(), got.data(), n);
      ForceSimdLevel(SimdLevel::kAvx512);
      EXPECT_EQ(got, want);
    }
  }
}

// Dot products: every level against the double dot of the dequantized weight row and
// the dequantized (already rounded) activation row.
TEST(QuantTest, DotProductsAllLevels) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t n : {256, 512, 4096}) {
    for (WeightType t : kWeightTypes) {
      SCOPED_TRACE(std::string(WeightTypeName(t)) + " n=" + std::to_string(n));
      const std::vector<uint8_t> row = RandomRow(t, n, rng);
      std::vector<float> x(n);
      for (float& v : x) v = normal(rng);
      x[5] = 7.0f;  // an outlier, as real activations have
      const WeightType at = ActivationType(t);
      std::vector<uint8_t> act(RowBytes(at, n));
      QuantizeActivation(at, x.data(), act.data(), n);
      std::vector<float> wf(n), xf(n);
      DequantizeRow(t, row.data(), wf.data(), n);
      DequantizeRow(at, act.data(), xf.data(), n);
      double ref = 0, mag = 0;
      if (at == WeightType::kQ8_1) {
        // Q4_1 / Q5_1: the min m of each weight block multiplies the activation block's
        // stored sum s = fp16(d * sum q) (not the sum of its rounded values).
        const auto* xb = reinterpret_cast<const BlockQ8_1*>(act.data());
        const size_t bb = GetWeightTypeInfo(t).block_bytes;
        for (int64_t i = 0; i < n; ++i) {
          const double m = LoadF16(row.data() + (i / 32) * bb + 2);
          ref += (RefValue(t, row.data(), i) - m) * xf[i];
          mag += std::fabs(RefValue(t, row.data(), i) * xf[i]);
        }
        for (int64_t b = 0; b < n / 32; ++b) ref += LoadF16(row.data() + b * bb + 2) * F16ToF32(xb[b].s);
      } else {
        for (int64_t i = 0; i < n; ++i) {
          ref += static_cast<double>(wf[i]) * xf[i];
          mag += std::fabs(static_cast<double>(wf[i]) * xf[i]);
        }
      }
      float scalar = 0;
      for (SimdLevel level : Levels()) {
        SCOPED_TRACE(SimdLevelName(level));
        const float got = GetDotFn(t, level)(row.data(), act.data(), n);
        EXPECT_NEAR(got, ref, 2e-6 * mag + 1e-7);
        if (level == SimdLevel::kScalar) scalar = got;
        EXPECT_NEAR(got, scalar, 2e-6 * mag + 1e-7);
      }
    }
  }
}

// A quantized row whose activation equals an exactly representable Q8 row: the dot is
// an exact integer combination, identical at every level.
TEST(QuantTest, IntegerPartsExact) {
  std::mt19937 rng(5);
  for (WeightType t : {WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kQ5_0, WeightType::kIQ4_NL}) {
    std::vector<uint8_t> row = RandomRow(t, 1024, rng);
    std::vector<BlockQ8_0> act(1024 / 32);
    for (auto& b : act) {
      b.d = F32ToF16(1.0f);
      for (int8_t& q : b.qs) q = static_cast<int8_t>(std::uniform_int_distribution<int>(-127, 127)(rng));
    }
    // Make every weight scale 1 too: the dot is then an integer, exact in f32.
    const size_t bb = GetWeightTypeInfo(t).block_bytes;
    for (size_t i = 0; i < 1024 / 32; ++i) {
      const uint16_t one = F32ToF16(1.0f);
      std::memcpy(row.data() + i * bb, &one, 2);
    }
    std::vector<float> wf(1024), xf(1024);
    DequantizeRow(t, row.data(), wf.data(), 1024);
    DequantizeRow(WeightType::kQ8_0, act.data(), xf.data(), 1024);
    double ref = 0;
    for (int i = 0; i < 1024; ++i) ref += static_cast<double>(wf[i]) * xf[i];
    for (SimdLevel level : Levels()) {
      EXPECT_EQ(GetDotFn(t, level)(row.data(), act.data(), 1024), static_cast<float>(ref)) << SimdLevelName(level);
    }
  }
}

TEST(QuantTest, WorstCaseCodesDoNotSaturate) {
  // Largest codes everywhere: maddubs pair sums reach their maximum.
  std::vector<BlockQ8_0> w(4), x(4);
  for (int i = 0; i < 4; ++i) {
    w[i].d = x[i].d = F32ToF16(1.0f);
    for (int j = 0; j < 32; ++j) {
      w[i].qs[j] = -128;
      x[i].qs[j] = (j & 1) ? 127 : -127;
    }
    x[i].qs[0] = -127;
    x[i].qs[1] = -127;
  }
  int64_t ref = 0;
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 32; ++j) ref += w[i].qs[j] * x[i].qs[j];
  }
  for (SimdLevel level : Levels()) {
    EXPECT_EQ(GetDotFn(WeightType::kQ8_0, level)(w.data(), x.data(), 128), static_cast<float>(ref))
        << SimdLevelName(level);
  }
}

// The AVX512-VNNI multi-row kernels (quant_avx512.cc) against the AVX2 kernels, bit for
// bit: their float arithmetic is the AVX2 kernels' per row, and integer sums are exact.
// Row counts 1 - 35 cover the 16-row (Q8_0) and 4- or 8-row groups and the one-row tails;
// random codes and scales (fixed seeds), plus worst-case codes (largest magnitudes, 6-bit
// scales and mins at 63) for the saturation bounds.
constexpr WeightType kQuantTypes[] = {WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kQ4_K, WeightType::kQ5_K,
                                      WeightType::kQ6_K, WeightType::kIQ4_XS, WeightType::kIQ4_NL, WeightType::kQ5_0,
                                      WeightType::kQ4_1, WeightType::kQ5_1, WeightType::kQ2_K, WeightType::kQ3_K};

// n_rows random rows of type t, back to back.
std::vector<uint8_t> RandomRows(WeightType t, int64_t n, int64_t n_rows, std::mt19937& rng) {
  std::vector<uint8_t> rows;
  for (int64_t r = 0; r < n_rows; ++r) {
    const std::vector<uint8_t> row = RandomRow(t, n, rng);
    rows.insert(rows.end(), row.begin(), row.end());
  }
  return rows;
}

// An N(0, 1) activation row with x[at] = outlier (as real activations have), converted to
// t's activation type.
std::vector<uint8_t> RandomActivation(WeightType t, int64_t n, std::mt19937& rng, int64_t at, float outlier) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  x[at] = outlier;
  const WeightType type = ActivationType(t);
  std::vector<uint8_t> act(RowBytes(type, n));
  QuantizeActivation(type, x.data(), act.data(), n);
  return act;
}

void ExpectRowsBitIdenticalToAvx2(WeightType t, const std::vector<uint8_t>& rows, int64_t n_rows, int64_t n,
                                  const std::vector<uint8_t>& act) {
  const size_t rb = RowBytes(t, n);
  const DotFn avx2 = quant_internal::Avx2Dot(t);
  const DotFn one = GetDotFn(t, SimdLevel::kAvx512);
  const DotRowsFn many = GetDotRowsFn(t, SimdLevel::kAvx512);
  ASSERT_NE(many, nullptr);
  EXPECT_EQ(DotFnLevel(t, SimdLevel::kAvx512), SimdLevel::kAvx512);
  std::vector<float> out(static_cast<size_t>(n_rows) + 1, -1.0f);
  many(rows.data(), rb, n_rows, act.data(), n, out.data());
  EXPECT_EQ(out[static_cast<size_t>(n_rows)], -1.0f) << "wrote past n_rows";
  for (int64_t r = 0; r < n_rows; ++r) {
    const void* row = rows.data() + static_cast<size_t>(r) * rb;
    const float want = avx2(row, act.data(), n);
    // Compare the bits: equal floats of different sign or NaN payload would pass ==.
    EXPECT_EQ(std::bit_cast<uint32_t>(out[static_cast<size_t>(r)]), std::bit_cast<uint32_t>(want))
        << "row " << r << ": " << out[static_cast<size_t>(r)] << " vs " << want;
    EXPECT_EQ(std::bit_cast<uint32_t>(one(row, act.data(), n)), std::bit_cast<uint32_t>(want)) << "row " << r;
  }
}

// With AVX-VNNI allowed and not: Q4_0's long rows take the AVX-VNNI 8-row kernel where
// the CPU has it and the 16-row AVX-512 one where it does not.
TEST(QuantTest, VnniKernelsBitIdenticalToAvx2) {
  if (!quant_internal::HasAvx512Vnni()) GTEST_SKIP() << "no AVX512-VNNI on this CPU";
  std::mt19937 rng(23);
  for (bool avx_vnni : {true, false}) {
    AllowAvxVnni(avx_vnni);
    for (WeightType t : kQuantTypes) {
      // 960 and 1792: the widest short rows (under 1 KiB) of Q8_0 and Q4_0, whose 16-row
      // kernels keep every block's scales of a group on the stack.
      for (int64_t n : {64, 256, 512, 960, 1024, 1792, 4096}) {
        if (n % GetWeightTypeInfo(t).block_size != 0) continue;
        for (int64_t n_rows : {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 21, 35}) {
          SCOPED_TRACE(std::string(WeightTypeName(t)) + " n=" + std::to_string(n) + " rows=" + std::to_string(n_rows) +
                       (AvxVnniActive() ? " avx-vnni" : ""));
          const std::vector<uint8_t> rows = RandomRows(t, n, n_rows, rng);
          const std::vector<uint8_t> act = RandomActivation(t, n, rng, 3, -9.0f);
          ExpectRowsBitIdenticalToAvx2(t, rows, n_rows, n, act);
        }
      }
    }
  }
  AllowAvxVnni(true);
}

// The AVX2 K-quant kernels sum in the scalar kernels' float order (their integer sums
// are exact however they are formed: Q4_K / Q5_K unpack the 6-bit scales and mins four
// at a time and take the mins' sum with one madd), so the bits are the scalar ones:
// random rows, and rows whose scale bytes are all 0xff (every 6-bit code 63, the high
// bits of the packed codes set) or all 0x00.
TEST(QuantTest, Avx2KQuantDotsBitIdenticalToScalar) {
  if (DetectedSimdLevel() < SimdLevel::kAvx2) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(37);
  for (WeightType t : {WeightType::kQ4_K, WeightType::kQ5_K, WeightType::kQ6_K}) {
    for (int64_t n : {256, 1024}) {
      for (int fill : {-1, 0x00, 0xff}) {
        SCOPED_TRACE(std::string(WeightTypeName(t)) + " n=" + std::to_string(n) + " fill=" + std::to_string(fill));
        std::vector<uint8_t> row = RandomRow(t, n, rng);
        if (fill >= 0 && t != WeightType::kQ6_K) {
          const size_t bb = GetWeightTypeInfo(t).block_bytes;
          for (int64_t b = 0; b < n / 256; ++b) std::memset(row.data() + b * bb + 4, fill, 12);  // after d, dmin
        }
        const std::vector<uint8_t> act = RandomActivation(t, n, rng, 9, -13.0f);
        const float want = quant_internal::ScalarDot(t)(row.data(), act.data(), n);
        const float got = quant_internal::Avx2Dot(t)(row.data(), act.data(), n);
        EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << got << " vs " << want;
      }
    }
  }
}

// The AVX2 multi-row kernels (Q8_0, Q4_0, Q6_K: 8 rows at a time, one horizontal sum
// for the 8) against the AVX2 one-row kernels, bit for bit: short rows (a 64-wide output
// projection) and long ones (prefetched row by row), row counts around the 8-row groups;
// Q8_0's and Q4_0's AVX-VNNI forms as well where the CPU has AVX-VNNI.
TEST(QuantTest, Avx2RowsBitIdenticalToAvx2OneRow) {
  if (DetectedSimdLevel() < SimdLevel::kAvx2) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(31);
  for (WeightType t : {WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kQ6_K}) {
    for (bool vnni : {false, true}) {  // the AVX-VNNI forms (Q8_0, Q4_0), where the CPU has AVX-VNNI
      if (vnni && !AvxVnniActive()) continue;
      const DotRowsFn many = quant_internal::Avx2DotRows(t, vnni);
      const DotFn one = quant_internal::Avx2Dot(t);
      ASSERT_NE(many, nullptr) << WeightTypeName(t);
      if (vnni == AvxVnniActive()) {
        EXPECT_EQ(GetDotRowsFn(t, SimdLevel::kAvx2), many);
      }
      for (int64_t n : {64, 256, 512, 4096}) {
        if (n % GetWeightTypeInfo(t).block_size != 0) continue;
        for (int64_t n_rows : {1, 7, 8, 9, 16, 23}) {
          SCOPED_TRACE(std::string(WeightTypeName(t)) + " n=" + std::to_string(n) + " rows=" + std::to_string(n_rows) +
                       (vnni ? " avx-vnni" : ""));
          const std::vector<uint8_t> rows = RandomRows(t, n, n_rows, rng);
          const std::vector<uint8_t> act = RandomActivation(t, n, rng, 5, 11.0f);
          const size_t rb = RowBytes(t, n);
          std::vector<float> out(static_cast<size_t>(n_rows) + 1, -1.0f);
          many(rows.data(), rb, n_rows, act.data(), n, out.data());
          EXPECT_EQ(out[static_cast<size_t>(n_rows)], -1.0f) << "wrote past n_rows";
          for (int64_t r = 0; r < n_rows; ++r) {
            const float want = one(rows.data() + static_cast<size_t>(r) * rb, act.data(), n);
            EXPECT_EQ(std::bit_cast<uint32_t>(out[static_cast<size_t>(r)]), std::bit_cast<uint32_t>(want))
                << "row " << r;
          }
        }
      }
    }
  }
}

// ActiveKernelsName follows the capped level and the AVX-VNNI switch.
// TIERKV_SIMD (memory/simd_env.h) caps the detected level and AVX-VNNI.
TEST(QuantTest, DetectedLevelHonoursTheEnvironmentCap) {
  const SimdEnvCap& cap = SimdCapFromEnv();
  EXPECT_LE(static_cast<int>(DetectedSimdLevel()), cap.level);
  if (!cap.avx_vnni) {
    EXPECT_FALSE(AvxVnniActive());
  }
}

TEST(QuantTest, ActiveKernelsNameFollowsTheLevel) {
  const SimdLevel before = ActiveSimdLevel();
  ForceSimdLevel(SimdLevel::kScalar);
  EXPECT_STREQ(ActiveKernelsName(), "scalar");
  if (DetectedSimdLevel() >= SimdLevel::kAvx2) {
    ForceSimdLevel(SimdLevel::kAvx2);
    AllowAvxVnni(false);
    EXPECT_STREQ(ActiveKernelsName(), "avx2");
    AllowAvxVnni(true);
    EXPECT_STREQ(ActiveKernelsName(), AvxVnniActive() ? "avx2+avx-vnni" : "avx2");
  }
  if (DetectedSimdLevel() >= SimdLevel::kAvx512) {
    ForceSimdLevel(SimdLevel::kAvx512);
    EXPECT_STREQ(ActiveKernelsName(), quant_internal::HasAvx512Vnni() ? "avx512-vnni" : "avx512");
  }
  ForceSimdLevel(before);
}

// The multi-row F32 / F16 / BF16 kernels (short F32 and F16 rows 16 at a time) against
// the AVX-512 one-row dot, bit for bit: widths with and without a tail past the 64-value
// steps (which send the rows one at a time), row counts around the 16-row groups.
TEST(QuantTest, FloatRowsBitIdenticalToOneRow) {
  if (DetectedSimdLevel() < SimdLevel::kAvx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(29);
  for (WeightType t : {WeightType::kF32, WeightType::kF16, WeightType::kBF16}) {
    const DotRowsFn many = GetDotRowsFn(t, SimdLevel::kAvx512);
    const DotFn one = GetDotFn(t, SimdLevel::kAvx512);
    ASSERT_NE(many, nullptr);
    for (int64_t n : {16, 48, 64, 72, 192, 256, 496, 512, 1024}) {
      for (int64_t n_rows : {1, 15, 16, 17, 33, 40}) {
        SCOPED_TRACE(std::string(WeightTypeName(t)) + " n=" + std::to_string(n) + " rows=" + std::to_string(n_rows));
        const std::vector<uint8_t> rows = RandomRows(t, n, n_rows, rng);
        const std::vector<uint8_t> x = RandomRow(t, n, rng);
        const size_t rb = RowBytes(t, n);
        std::vector<float> out(static_cast<size_t>(n_rows) + 1, -1.0f);
        many(rows.data(), rb, n_rows, x.data(), n, out.data());
        EXPECT_EQ(out[static_cast<size_t>(n_rows)], -1.0f) << "wrote past n_rows";
        for (int64_t r = 0; r < n_rows; ++r) {
          const float want = one(rows.data() + static_cast<size_t>(r) * rb, x.data(), n);
          EXPECT_EQ(std::bit_cast<uint32_t>(out[static_cast<size_t>(r)]), std::bit_cast<uint32_t>(want)) << "row " << r;
        }
      }
    }
  }
}

// The AVX-512 one-token F32 / F16 / BF16 dots sum as ggml's vec_dot does, bit for bit
// (testing::VecDotOrder): widths under one 64-value step, with and without a tail.
TEST(QuantTest, FloatDotsSumAsGgmlVecDot) {
  if (DetectedSimdLevel() < SimdLevel::kAvx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(31);
  for (WeightType t : {WeightType::kF32, WeightType::kF16, WeightType::kBF16}) {
    for (int64_t n : {16, 32, 48, 64, 96, 128, 200, 256, 4096}) {
      SCOPED_TRACE(std::string(WeightTypeName(t)) + " n=" + std::to_string(n));
      for (int rep = 0; rep < 20; ++rep) {
        const std::vector<uint8_t> w = RandomRow(t, n, rng), x = RandomRow(t, n, rng);
        std::vector<float> wf(static_cast<size_t>(n)), xf(static_cast<size_t>(n));
        DequantizeRow(t, w.data(), wf.data(), n);
        DequantizeRow(t, x.data(), xf.data(), n);
        const float got = GetDotFn(t, SimdLevel::kAvx512)(w.data(), x.data(), n);
        ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(testing::VecDotOrder(t, wf, xf)));
      }
    }
  }
}

// Q6_K sums as ggml's x86 vec_dot does (llama.cpp does not repack Q6_K, so this is the
// order of every Q6_K matmul there), bit for bit at every level: per super-block 8
// integer lanes (lane L: values 4L .. 4L + 3 of each 32-value chunk, unsigned codes times
// their group's scale, less 32 * (sc[2L] bsums[2L] + sc[2L + 1] bsums[2L + 1])), each
// lane's float chain acc = fma(d_x * d_w, lane, acc), then the lanes added as
// hsum_float_8 does. The codes are decoded here from the block layout, independently of
// the kernels. (1200 of 1200 random rows bit-equal to ggml's own function, docs/testing.md.)
float GgmlQ6KOrder(const std::vector<uint8_t>& row, const std::vector<uint8_t>& act, int64_t n) {
  const auto* w = reinterpret_cast<const BlockQ6_K*>(row.data());
  const auto* x = reinterpret_cast<const BlockQ8_K*>(act.data());
  float acc[8] = {};
  for (int64_t i = 0; i < n / 256; ++i) {
    int64_t lane[8] = {};
    for (int e = 0; e < 256; ++e) {
      const int half = e / 128, chunk = (e % 128) / 32, pos = e % 32;
      const int low = chunk % 2 == 0 ? w[i].ql[64 * half + pos] : w[i].ql[64 * half + 32 + pos];
      const int nibble = chunk < 2 ? low & 15 : low >> 4;
      const int high = (w[i].qh[32 * half + pos] >> (2 * chunk)) & 3;
      lane[pos / 4] += static_cast<int64_t>(w[i].scales[e / 16]) * (nibble + 16 * high) * x[i].qs[e];
    }
    const float d = x[i].d * F16ToF32(w[i].d);
    for (int l = 0; l < 8; ++l) {
      lane[l] -= 32 * (w[i].scales[2 * l] * x[i].bsums[2 * l] + w[i].scales[2 * l + 1] * x[i].bsums[2 * l + 1]);
      acc[l] = std::fma(d, static_cast<float>(lane[l]), acc[l]);
    }
  }
  const float p0 = acc[4] + acc[0], p1 = acc[5] + acc[1], p2 = acc[6] + acc[2], p3 = acc[7] + acc[3];
  return (p0 + p2) + (p1 + p3);
}

// Q5_K the same way (llama.cpp does not repack Q5_K on x86 either): the integer lanes
// as Q6_K's, each chunk's 6-bit scale; per lane acc = fma(d_x * d_w, lane, acc); the
// mins in one chain m = fma(-(d_x * dmin_w), sum_j min_j * (activation sum of chunk j), m);
// result hsum_float_8(acc) + m. (1200 of 1200 random rows bit-equal to ggml's function.)
float GgmlQ5KOrder(const std::vector<uint8_t>& row, const std::vector<uint8_t>& act, int64_t n) {
  const auto* w = reinterpret_cast<const BlockQ5_K*>(row.data());
  const auto* x = reinterpret_cast<const BlockQ8_K*>(act.data());
  float acc[8] = {}, mins = 0.0f;
  for (int64_t i = 0; i < n / 256; ++i) {
    int64_t lane[8] = {}, summ = 0;
    for (int e = 0; e < 256; ++e) {
      const int chunk = e / 32, pos = e % 32;
      uint8_t sc, mn;
      ScaleMinK4(chunk, w[i].scales, &sc, &mn);
      const int byte = w[i].qs[32 * (chunk / 2) + pos];
      const int code = (chunk % 2 == 0 ? byte & 15 : byte >> 4) + 16 * ((w[i].qh[pos] >> chunk) & 1);
      lane[pos / 4] += static_cast<int64_t>(sc) * code * x[i].qs[e];
      if (pos == 0) summ += mn * (x[i].bsums[2 * chunk] + x[i].bsums[2 * chunk + 1]);
    }
    const float d = x[i].d * F16ToF32(w[i].d), dmin = x[i].d * F16ToF32(w[i].dmin);
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(d, static_cast<float>(lane[l]), acc[l]);
    mins = std::fma(-dmin, static_cast<float>(summ), mins);
  }
  const float p0 = acc[4] + acc[0], p1 = acc[5] + acc[1], p2 = acc[6] + acc[2], p3 = acc[7] + acc[3];
  return ((p0 + p2) + (p1 + p3)) + mins;
}

TEST(QuantTest, Q5KAndQ6KDotsSumAsGgmlVecDot) {
  using Order = float (*)(const std::vector<uint8_t>&, const std::vector<uint8_t>&, int64_t);
  const std::pair<WeightType, Order> kinds[] = {{WeightType::kQ5_K, GgmlQ5KOrder}, {WeightType::kQ6_K, GgmlQ6KOrder}};
  std::mt19937 rng(61);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const auto& [type, order] : kinds) {
    for (int64_t n : {256, 512, 2048}) {
      for (int rep = 0; rep < 30; ++rep) {
        const std::vector<uint8_t> row = RandomRow(type, n, rng);
        std::vector<float> x(static_cast<size_t>(n));
        for (float& v : x) v = normal(rng) * (rep % 3 == 0 ? 20.0f : 1.0f);
        std::vector<uint8_t> act(RowBytes(WeightType::kQ8_K, n));
        QuantizeActivation(WeightType::kQ8_K, x.data(), act.data(), n);
        const float want = order(row, act, n);
        for (SimdLevel level : Levels()) {
          SCOPED_TRACE(std::string(WeightTypeName(type)) + " " + SimdLevelName(level) + " n=" + std::to_string(n));
          const float got = GetDotFn(type, level)(row.data(), act.data(), n);
          ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << got << " vs " << want;
        }
      }
    }
  }
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512f,avx512bf16"))) void NativeDpBf16(float* acc, const uint16_t* w, const uint16_t* x) {
  const __m512 r = _mm512_dpbf16_ps(_mm512_loadu_ps(acc), reinterpret_cast<__m512bh>(_mm512_loadu_si512(w)),
                                    reinterpret_cast<__m512bh>(_mm512_loadu_si512(x)));
  _mm512_storeu_ps(acc, r);
}

// The model of vdpbf16ps the BF16 kernels follow (testing::DpBf16Step: per lane the high
// pair's product, then the low pair's, each rounded once) against the instruction, where
// the CPU has it: random values of mixed magnitudes, accumulators included.
TEST(QuantTest, Bf16StepMatchesVdpbf16ps) {
  if (!__builtin_cpu_supports("avx512bf16")) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  std::mt19937 rng(37);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  for (int rep = 0; rep < 2000; ++rep) {
    uint16_t w[32], x[32];
    float wf[32], xf[32], acc[16], want[16];
    for (int i = 0; i < 32; ++i) {
      w[i] = F32ToBf16(std::ldexp(normal(rng), exponent(rng)));
      x[i] = F32ToBf16(normal(rng));
      wf[i] = Bf16ToF32(w[i]);
      xf[i] = Bf16ToF32(x[i]);
    }
    for (int j = 0; j < 16; ++j) acc[j] = want[j] = std::ldexp(normal(rng), exponent(rng));
    NativeDpBf16(acc, w, x);
    testing::DpBf16Step(want, wf, xf, 0);
    for (int j = 0; j < 16; ++j) {
      ASSERT_EQ(std::bit_cast<uint32_t>(acc[j]), std::bit_cast<uint32_t>(want[j])) << "rep " << rep << " lane " << j;
    }
  }
}
#endif

TEST(QuantTest, VnniKernelsWorstCaseCodes) {
  if (!quant_internal::HasAvx512Vnni()) GTEST_SKIP() << "no AVX512-VNNI on this CPU";
  // 21 rows: a 16-row group (Q8_0's short-row kernel), a 4-row group and a tail.
  const int64_t n = 512, n_rows = 21;
  for (WeightType t : kQuantTypes) {
    SCOPED_TRACE(WeightTypeName(t));
    const size_t rb = RowBytes(t, n);
    // Every code byte 0xff except the scales: largest nibbles/5th/6th bits; Q8_0 -1.
    std::vector<uint8_t> rows(rb * n_rows, 0xff);
    const WeightTypeInfo& info = GetWeightTypeInfo(t);
    for (int64_t r = 0; r < n_rows; ++r) {
      for (int64_t b = 0; b < n / info.block_size; ++b) {
        uint8_t* blk = rows.data() + static_cast<size_t>(r) * rb + static_cast<size_t>(b) * info.block_bytes;
        const uint16_t one = F32ToF16(1.0f);
        switch (t) {
          case WeightType::kQ8_0: {
            std::memcpy(blk, &one, 2);
            std::memset(blk + 2, 0x80, 32);  // -128
            break;
          }
          case WeightType::kQ4_0: std::memcpy(blk, &one, 2); break;
          case WeightType::kQ4_K:
          case WeightType::kQ5_K: {
            std::memcpy(blk, &one, 2);
            std::memcpy(blk + 2, &one, 2);  // scales bytes stay 0xff: all 6-bit values 63
            break;
          }
          case WeightType::kQ6_K: {
            std::memset(blk + 192, 0x80, 16);  // scales -128
            std::memcpy(blk + 208, &one, 2);
            break;
          }
          case WeightType::kQ2_K: {  // scales 15, mins 15, values 3
            std::memcpy(blk + 80, &one, 2);
            std::memcpy(blk + 82, &one, 2);
            break;
          }
          case WeightType::kQ3_K: {
            // Odd rows: values 7 - 4 with scale codes 63 (31); even rows: codes 0 (-32).
            std::memcpy(blk + 108, &one, 2);
            if (r % 2 == 0) std::memset(blk + 96, 0, 12);
            break;
          }
          case WeightType::kIQ4_XS: {
            // Odd rows: all codes 0xff (scale 63 - 32, level 113); even rows: scale codes
            // 0 (scale -32) and nibbles 0 (level -127), the largest magnitudes.
            std::memcpy(blk, &one, 2);
            if (r % 2 == 0) std::memset(blk + 2, 0, 134);
            break;
          }
          case WeightType::kQ5_0: std::memcpy(blk, &one, 2); break;  // codes 31: value 15
          case WeightType::kQ4_1:
          case WeightType::kQ5_1: {  // codes 15 / 31, m = 1
            std::memcpy(blk, &one, 2);
            std::memcpy(blk + 2, &one, 2);
            break;
          }
          case WeightType::kIQ4_NL: {  // odd rows: level 113; even rows: nibbles 0, level -127
            std::memcpy(blk, &one, 2);
            if (r % 2 == 0) std::memset(blk + 2, 0, 16);
            break;
          }
          default: break;
        }
      }
    }
    // Activation codes of alternating sign at the largest magnitude.
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = (i % 3 == 0) ? 1.0f : -1.0f;
    const WeightType at = ActivationType(t);
    std::vector<uint8_t> act(RowBytes(at, n));
    QuantizeActivation(at, x.data(), act.data(), n);
    ExpectRowsBitIdenticalToAvx2(t, rows, n_rows, n, act);
    // And the exact integer value, from the element-wise reference.
    std::vector<float> wf(n), xf(n);
    DequantizeRow(t, rows.data(), wf.data(), n);
    DequantizeRow(at, act.data(), xf.data(), n);
    double ref = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) {
      ref += static_cast<double>(wf[i]) * xf[i];
      mag += std::fabs(static_cast<double>(wf[i]) * xf[i]);
    }
    EXPECT_NEAR(GetDotFn(t, SimdLevel::kAvx512)(rows.data(), act.data(), n), ref, 2e-6 * mag + 1e-7);
  }
}

TEST(Fp16Test, AllHalvesRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(f))));
      continue;
    }
    ASSERT_EQ(F32ToF16(f), h) << h;
  }
}

TEST(Fp16Test, MatchesF16cAndArrays) {
  std::mt19937 rng(1);
  std::vector<float> x(4099);
  std::uniform_int_distribution<uint32_t> bits;
  for (size_t i = 0; i < x.size(); ++i) {
    // Random floats over the whole range near the f16 range, plus exact ties.
    const float r = std::ldexp(std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng),
                               std::uniform_int_distribution<int>(-26, 17)(rng));
    x[i] = (i % 7 == 0) ? std::bit_cast<float>((bits(rng) & 0xffffe000u) | 0x1000u) : r;
  }
  std::vector<uint16_t> a(x.size());
  F32ToF16Array(x.data(), a.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(a[i], F32ToF16(x[i])) << x[i];
#if defined(__x86_64__) || defined(__i386__)
    if (DetectedSimdLevel() >= SimdLevel::kAvx2) {
      if (!std::isnan(x[i])) {
        ASSERT_EQ(a[i], HardwareF16(x[i])) << x[i];
      }
    }
#endif
  }
  std::vector<float> back(x.size());
  F16ToF32Array(a.data(), back.data(), a.size());
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isnan(back[i])) {
      ASSERT_EQ(back[i], F16ToF32(a[i]));
    }
  }
}

TEST(Fp16Test, Bf16RoundsToNearestEven) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(F32ToBf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(F32ToBf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(F32ToBf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::nanf("")))));
  EXPECT_EQ(Bf16ToF32(0xc040), -3.0f);
}

}  // namespace
}  // namespace tierkv::kernels
