// tests/kvcache/half_test.cc
//
// fp16 <-> f32 (memory/half.h): all 65536 halves against an independent decoding,
// round trips, hand-checked values, round-to-nearest-even against the neighbours in a
// sweep of the float range, and the array (F16C) paths bit-identical to the scalar ones.
#include "memory/half.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

namespace tierkv {
namespace {

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

// The value of a (non-NaN) half, computed in double from the definition.
double ReferenceValue(uint16_t h) {
  const int sign = (h >> 15) & 1;
  const int exp = (h >> 10) & 0x1f;
  const int man = h & 0x3ff;
  double v;
  if (exp == 0x1f) {
    v = std::numeric_limits<double>::infinity();
  } else if (exp == 0) {
    v = std::ldexp(static_cast<double>(man), -24);
  } else {
    v = std::ldexp(1.0 + man / 1024.0, exp - 15);
  }
  return sign ? -v : v;
}

bool IsHalfNan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }

TEST(HalfTest, AllHalvesDecodeExactlyAndRoundTrip) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = HalfToFloat(h);
    if (IsHalfNan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << i;
      // Payload kept, quiet bit set, sign kept (what vcvtph2ps does).
      EXPECT_EQ(Bits(f), (static_cast<uint32_t>(h & 0x8000) << 16) | 0x7fc00000u |
                             (static_cast<uint32_t>(h & 0x3ff) << 13))
          << std::hex << i;
      EXPECT_EQ(FloatToHalf(f), h | 0x200) << std::hex << i;  // quieted, else unchanged
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), ReferenceValue(h)) << std::hex << i;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << i;
    ASSERT_EQ(FloatToHalf(f), h) << std::hex << i;
  }
}

TEST(HalfTest, KnownValues) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(0.5f), 0x3800);
  EXPECT_EQ(FloatToHalf(1.0f / 3.0f), 0x3555);  // 0.333251953125
  EXPECT_EQ(FloatToHalf(0.1f), 0x2e66);         // 0.0999755859375
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);     // largest finite half
  EXPECT_EQ(FloatToHalf(65519.996f), 0x7bff);   // just below the tie
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);     // the tie rounds to even: inf
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::quiet_NaN()), 0x7e00);
  // Ties to even in the normal range: 1 + 2^-11 is halfway between 0x3c00 and 0x3c01.
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3c00);
  EXPECT_EQ(FloatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);  // above the tie
  // Subnormals: the smallest is 2^-24; 2^-25 is a tie that rounds to (even) zero.
  EXPECT_EQ(FloatToHalf(0x1p-24f), 0x0001);
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0x1p-25f), 0x8000);
  EXPECT_EQ(FloatToHalf(0x1.000002p-25f), 0x0001);
  EXPECT_EQ(FloatToHalf(3 * 0x1p-25f), 0x0002);  // 1.5 * 2^-24: tie to even (2)
  EXPECT_EQ(FloatToHalf(1023 * 0x1p-24f), 0x03ff);  // largest subnormal
  EXPECT_EQ(FloatToHalf(0x1p-14f), 0x0400);          // smallest normal
  EXPECT_EQ(FloatToHalf(0x1p-14f - 0x1p-26f), 0x0400);  // rounds up into the normals
  EXPECT_EQ(FloatToHalf(1e-10f), 0x0000);
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(HalfToFloat(0x03ff), 1023 * 0x1p-24f);
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7c00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7c01)));
  uint16_t stored = 0x3555;
  EXPECT_EQ(LoadHalf(&stored), HalfToFloat(0x3555));
}

// Floats across the whole range (a fixed stride through the bit patterns): the result
// is the nearest half, ties to the even mantissa; beyond 65520 it is inf.
TEST(HalfTest, RoundsToNearestEven) {
  for (uint64_t u = 0; u < 0x7f800000ull; u += 4093) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(u));
    const uint16_t h = FloatToHalf(f);
    const uint16_t neg = FloatToHalf(-f);
    ASSERT_EQ(neg, h | 0x8000) << std::hex << u;  // symmetric in the sign
    if (f >= 65520.0f) {
      ASSERT_EQ(h, 0x7c00) << f;
      continue;
    }
    ASSERT_LT(h, 0x7c00) << f;
    const double x = f;
    const double here = ReferenceValue(h);
    const double err = std::fabs(x - here);
    if (h > 0) {
      ASSERT_LE(err, std::fabs(x - ReferenceValue(h - 1))) << f;
    }
    if (h < 0x7bff) {
      ASSERT_LE(err, std::fabs(x - ReferenceValue(h + 1))) << f;
    }
    if (h < 0x7bff && err == std::fabs(x - ReferenceValue(h + 1))) {
      ASSERT_EQ(h & 1, 0) << "tie not to even: " << f;
    }
    if (h > 0 && err == std::fabs(x - ReferenceValue(h - 1))) {
      ASSERT_EQ(h & 1, 0) << "tie not to even: " << f;
    }
  }
}

TEST(HalfTest, ArrayFunctionsMatchScalar) {
  std::vector<uint16_t> halves(65536);
  for (uint32_t i = 0; i < 65536; ++i) halves[i] = static_cast<uint16_t>(i);
  std::vector<float> floats(65536);
  HalfToFloatArray(halves.data(), floats.data(), halves.size());
  for (uint32_t i = 0; i < 65536; ++i) {
    ASSERT_EQ(Bits(floats[i]), Bits(HalfToFloat(halves[i]))) << std::hex << i;
  }
  // Floats around every half boundary and tie, plus specials; odd count for the tail.
  std::vector<float> in;
  for (uint32_t u = 0; u < 0x48000000u; u += 997) {
    in.push_back(std::bit_cast<float>(u));
    in.push_back(-std::bit_cast<float>(u + 0x1000));
  }
  in.push_back(std::numeric_limits<float>::infinity());
  in.push_back(std::numeric_limits<float>::quiet_NaN());
  in.push_back(-std::numeric_limits<float>::signaling_NaN());
  std::vector<uint16_t> out(in.size());
  FloatToHalfArray(in.data(), out.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(out[i], FloatToHalf(in[i])) << std::hex << Bits(in[i]);
  }
  RecordProperty("f16c", HalfUsesF16c() ? "yes" : "no");
}

}  // namespace
}  // namespace tierkv
