// tests/memory/simd_env_test.cc
#include "memory/simd_env.h"

#include <gtest/gtest.h>

namespace tierkv {
namespace {

TEST(SimdEnvTest, ParsesEveryNamedCap) {
  struct Case {
    const char* value;
    int level;
    bool avx_vnni;
    bool avx512_vbmi = true;
  };
  for (const Case& c : {Case{"", 2, true}, Case{"avx512", 2, true}, Case{"avx2", 1, true},
                        Case{"avx2-novnni", 1, false}, Case{"avx512-novbmi", 2, true, false},
                        Case{"scalar", 0, true}}) {
    SCOPED_TRACE(c.value);
    const std::optional<SimdEnvCap> cap = ParseSimdCap(c.value);
    ASSERT_TRUE(cap.has_value());
    EXPECT_EQ(cap->level, c.level);
    EXPECT_EQ(cap->avx_vnni, c.avx_vnni);
    EXPECT_EQ(cap->avx512_vbmi, c.avx512_vbmi);
  }
}

TEST(SimdEnvTest, RefusesOtherValues) {
  for (const char* v : {"AVX2", "avx2 ", "avx", "sse4", "avx512f", "avx512-vbmi", "1", "none"}) {
    EXPECT_FALSE(ParseSimdCap(v).has_value()) << v;
  }
}

}  // namespace
}  // namespace tierkv
