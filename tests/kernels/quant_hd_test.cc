// tests/kernels/quant_hd_test.cc
//
// The CUDA executor's exact class (kernels/quant_hd.h) run on the CPU: the activation
// quantizers, the row dot products (integer block parts + float chains) and the row
// values must give the bits of kernels/quant.cc's definitions on every row - 10^4
// random rows per type (random bytes: every code and sub-block scale occurs), with
// activations of several magnitudes, zero blocks and ties.
#include "kernels/quant_hd.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "tests/kernels/kernel_test_util.h"

namespace tierkv::kernels {
namespace {

constexpr WeightType kTypes[] = {WeightType::kF32,  WeightType::kF16,  WeightType::kBF16, WeightType::kQ8_0,
                                 WeightType::kQ4_0, WeightType::kQ4_K, WeightType::kQ5_K, WeightType::kQ6_K};

// Activations of several magnitudes, with an all-zero block, exact ties for the
// rounding (values k + 0.5 after scaling) and a repeated largest magnitude of both signs.
std::vector<float> Activation(int64_t n, uint32_t seed) {
  std::vector<float> x = RandomVector(n, seed);
  std::mt19937 rng(seed * 7 + 1);
  const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 16) - 8);
  for (float& v : x) v *= scale;
  switch (seed % 4) {
    case 0:
      for (int j = 0; j < 256 && j < n; ++j) x[static_cast<size_t>(j)] = 0.0f;
      break;
    case 1:  // amax 127: codes are the values themselves, halves tie
      for (int64_t j = 0; j < n; ++j) x[static_cast<size_t>(j)] = static_cast<float>(static_cast<int>(rng() % 255) - 127) + 0.5f * (j % 2);
      for (int64_t j = 0; j < n; j += 32) x[static_cast<size_t>(j)] = 127.0f;
      break;
    case 2:
      for (int64_t j = 0; j + 256 <= n; j += 256) {
        x[static_cast<size_t>(j + 3)] = 4.0f;
        x[static_cast<size_t>(j + 9)] = -4.0f;
      }
      break;
    default: break;
  }
  return x;
}

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

TEST(QuantHdTest, ActivationQuantizersGiveTheCpuBytes) {
  const int64_t n = 1024;
  for (uint32_t seed = 0; seed < 400; ++seed) {
    const std::vector<float> x = Activation(n, seed);
    std::vector<BlockQ8_0> q0(n / kQk0), want0(n / kQk0);
    for (int64_t b = 0; b < n / kQk0; ++b) hd::QuantizeBlockQ8_0(x.data() + b * kQk0, &q0[static_cast<size_t>(b)]);
    QuantizeActivation(WeightType::kQ8_0, x.data(), want0.data(), n);
    ASSERT_EQ(std::memcmp(q0.data(), want0.data(), sizeof(BlockQ8_0) * q0.size()), 0) << "Q8_0, seed " << seed;
    std::vector<BlockQ8_K> qk(n / kQkK), wantk(n / kQkK);
    for (int64_t b = 0; b < n / kQkK; ++b) {
      const float* xb = x.data() + b * kQkK;
      hd::QuantizeBlockQ8_K(xb, hd::MaxMagnitude(xb, kQkK), &qk[static_cast<size_t>(b)]);
    }
    QuantizeActivation(WeightType::kQ8_K, x.data(), wantk.data(), n);
    ASSERT_EQ(std::memcmp(qk.data(), wantk.data(), sizeof(BlockQ8_K) * qk.size()), 0) << "Q8_K, seed " << seed;
  }
}

TEST(QuantHdTest, RowDotsAreTheScalarDefinitionsBits) {
#if defined(TIERKV_SANITIZE)
  const int64_t n = 512, rows = 2000;  // the sanitizers' run: the same code, fewer rows
#else
  const int64_t n = 512, rows = 10000;
#endif
  const int kActs = 8;
  for (WeightType t : kTypes) {
    SCOPED_TRACE(WeightTypeName(t));
    const OwnedMatrix m = RandomMatrix(t, rows, n, 100 + static_cast<uint32_t>(t));
    std::vector<std::vector<uint8_t>> acts;
    for (int a = 0; a < kActs; ++a) {
      const std::vector<float> x = Activation(n, 1000 + a);
      acts.emplace_back(RowBytes(ActivationType(t), n));
      QuantizeActivation(ActivationType(t), x.data(), acts.back().data(), n);
    }
    // The quantized types: the AVX2 kernels' bits (the AVX-512 ones are the same), and the
    // scalar definitions' too but for Q8_0; the float types: the scalar definitions'.
    const bool quantized = t != WeightType::kF32 && t != WeightType::kF16 && t != WeightType::kBF16;
    const DotFn scalar = quant_internal::ScalarDot(t);
    const DotFn simd[2] = {GetDotFn(t, std::min(SimdLevel::kAvx2, DetectedSimdLevel())),
                           GetDotFn(t, DetectedSimdLevel())};
    for (int64_t r = 0; r < rows; ++r) {
      const void* act = acts[static_cast<size_t>(r % kActs)].data();
      float got = 0.0f;
      ASSERT_TRUE(hd::DotRow(t, m.view.Row(r), act, n, &got));
      if (quantized && DetectedSimdLevel() >= SimdLevel::kAvx2) {
        for (DotFn f : simd) ASSERT_EQ(Bits(got), Bits(f(m.view.Row(r), act, n))) << "row " << r;
      }
      if (t != WeightType::kQ8_0) {
        ASSERT_EQ(Bits(got), Bits(scalar(m.view.Row(r), act, n))) << "row " << r;
      }
    }
  }
}

TEST(QuantHdTest, RowValuesAreTheDequantization) {
  const int64_t n = 512;
  for (WeightType t : kTypes) {
    SCOPED_TRACE(WeightTypeName(t));
    const OwnedMatrix m = RandomMatrix(t, 200, n, 7 + static_cast<uint32_t>(t));
    std::vector<float> want(n);
    for (int64_t r = 0; r < 200; ++r) {
      DequantizeRow(t, m.view.Row(r), want.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        float got = 0.0f;
        ASSERT_TRUE(hd::RowValue(t, m.view.Row(r), i, &got));
        ASSERT_EQ(Bits(got), Bits(want[static_cast<size_t>(i)])) << "row " << r << " value " << i;
      }
    }
  }
}

TEST(QuantHdTest, OtherTypesAreRefused) {
  float out = 0.0f;
  const uint8_t bytes[256] = {};
  EXPECT_FALSE(hd::DotRow(WeightType::kQ2_K, bytes, bytes, 256, &out));
  EXPECT_FALSE(hd::RowValue(WeightType::kIQ4_XS, bytes, 0, &out));
}

}  // namespace
}  // namespace tierkv::kernels
