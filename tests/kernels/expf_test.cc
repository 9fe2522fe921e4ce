// tests/kernels/expf_test.cc
#include "kernels/expf.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu_features.h"

namespace tierkv::kernels {
namespace {

// Every 4099th float (all exponents, both signs, NaN and inf) plus the edges where the
// reduction's n crosses the special-case bound and the power-of-two ranges.
std::vector<float> SweepInputs() {
  std::vector<float> x;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 4099) x.push_back(std::bit_cast<float>(static_cast<uint32_t>(b)));
  for (float n : {-192.5f, -192.0f, -150.0f, -149.0f, -127.0f, -126.0f, -125.0f, 127.0f, 128.0f, 192.0f, 192.5f}) {
    const float edge = n * 0.693147180559945f;
    for (int i = -40; i <= 40; ++i) x.push_back(std::bit_cast<float>(std::bit_cast<uint32_t>(edge) + i));
  }
  for (float v : {0.0f, -0.0f, 88.0f, 88.72f, 89.0f, -87.3f, -103.9f, -104.0f, -133.0f}) x.push_back(v);
  x.push_back(std::numeric_limits<float>::infinity());
  x.push_back(-std::numeric_limits<float>::infinity());
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  return x;
}

void ExpectSameBits(float got, float want, float x) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << std::hexfloat << x;
  } else {
    EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << std::hexfloat << x;
  }
}

TEST(ExpfTest, SpecialValues) {
  EXPECT_EQ(ExpGgml(0.0f), 1.0f);
  EXPECT_EQ(ExpGgml(-0.0f), 1.0f);
  EXPECT_EQ(ExpGgml(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(ExpGgml(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_EQ(ExpGgml(-200.0f), 0.0f);
  EXPECT_EQ(ExpGgml(100.0f), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(ExpGgml(std::numeric_limits<float>::quiet_NaN())));
  // Subnormal results are rounded once: e^-100 ~ 3.72e-44 is 27 * 2^-149 after rounding.
  EXPECT_NEAR(ExpGgml(-100.0f), std::exp(-100.0f), 0x1p-149f);
}

// Within 2 ulp of the correctly rounded e^x where the result is a normal float (the
// algorithm's documented bound is 1.45 + 0.5 ulp): a wrong constant fails this.
TEST(ExpfTest, CloseToTheTrueExponential) {
  int exact = 0, total = 0;
  for (float x = -87.0f; x < 88.5f; x += 0.0137f) {
    const float got = ExpGgml(x);
    const float want = static_cast<float>(std::exp(static_cast<double>(x)));
    const int64_t ulps = std::llabs(static_cast<int64_t>(std::bit_cast<uint32_t>(got)) -
                                    static_cast<int64_t>(std::bit_cast<uint32_t>(want)));
    ASSERT_LE(ulps, 2) << std::hexfloat << x;
    exact += ulps == 0;
    ++total;
  }
  EXPECT_GT(exact, total / 4);  // many correctly rounded (42% on this sweep)
}

#if defined(TIERKV_EXPF_X86)
__attribute__((target("avx512f,avx512dq,avx2,fma"))) void Exp16Array(const float* x, float* out, size_t n) {
  for (size_t i = 0; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, ExpGgml16(_mm512_loadu_ps(x + i)));
}
__attribute__((target("avx2,fma"))) void Exp8Array(const float* x, float* out, size_t n) {
  for (size_t i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, ExpGgml8(_mm256_loadu_ps(x + i)));
}

// The vector forms give ExpGgml's bits, lane by lane. Skipped, not passed, where the CPU
// (or TIERKV_SIMD) cannot run them.
TEST(ExpfTest, Avx2FormIsTheScalarDefinition) {
  if (DetectedSimdLevel() < SimdLevel::kAvx2) GTEST_SKIP() << "no AVX2+FMA: ExpGgml8 cannot run here";
  const std::vector<float> x = SweepInputs();
  std::vector<float> got(x.size());
  Exp8Array(x.data(), got.data(), x.size());
  for (size_t i = 0; i < x.size() / 8 * 8; ++i) ExpectSameBits(got[i], ExpGgml(x[i]), x[i]);
}

TEST(ExpfTest, Avx512FormIsTheScalarDefinition) {
  if (DetectedSimdLevel() < SimdLevel::kAvx512) GTEST_SKIP() << "no AVX-512: ExpGgml16 cannot run here";
  const std::vector<float> x = SweepInputs();
  std::vector<float> got(x.size());
  Exp16Array(x.data(), got.data(), x.size());
  for (size_t i = 0; i < x.size() / 16 * 16; ++i) ExpectSameBits(got[i], ExpGgml(x[i]), x[i]);
}
#endif

}  // namespace
}  // namespace tierkv::kernels
