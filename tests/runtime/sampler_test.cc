// tests/runtime/sampler_test.cc
#include "runtime/sampler.h"

#include <cmath>
#include <map>

#include <gtest/gtest.h>

namespace tierkv {
namespace {

TEST(SamplerTest, GreedyIsArgmaxWithTiesToTheSmallerId) {
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f};
  Sampler s({0.0f, 40, 0.95f, 1});
  EXPECT_EQ(s.Sample(logits), 1);
  EXPECT_EQ(Argmax(logits), 1);
}

TEST(SamplerTest, TopLogitsSortedWithTieBreak) {
  const std::vector<float> logits = {0.5f, 2.0f, 2.0f, -1.0f, 1.0f};
  const auto top = TopLogits(logits, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0], (std::pair<int32_t, float>{1, 2.0f}));
  EXPECT_EQ(top[1], (std::pair<int32_t, float>{2, 2.0f}));
  EXPECT_EQ(top[2], (std::pair<int32_t, float>{4, 1.0f}));
}

TEST(SamplerTest, LogSumExpIsStable) {
  const std::vector<float> logits = {1000.0f, 1000.0f};
  EXPECT_NEAR(LogSumExp(logits), 1000.0 + std::log(2.0), 1e-9);
}

TEST(SamplerTest, SameSeedSameTokensAndTopKLimitsTheChoice) {
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[static_cast<size_t>(i)] = static_cast<float>(i % 7) * 0.3f;
  Sampler a({0.8f, 5, 1.0f, 42}), b({0.8f, 5, 1.0f, 42}), c({0.8f, 5, 1.0f, 43});
  std::map<int32_t, int> seen;
  bool differs = false;
  for (int i = 0; i < 500; ++i) {
    const int32_t x = a.Sample(logits);
    EXPECT_EQ(x, b.Sample(logits));
    differs = differs || x != c.Sample(logits);
    ++seen[x];
  }
  EXPECT_TRUE(differs);
  EXPECT_LE(seen.size(), 5u);  // top-k = 5
  for (const auto& [id, n] : seen) EXPECT_EQ(id % 7, 6) << "only the largest logits (6 * 0.3) are in the top 5";
}

TEST(SamplerTest, TopPKeepsTheSmallestSufficientSetAndTemperatureShapesFrequencies) {
  // p = softmax([2, 1, 0, -5]) ~ [0.665, 0.245, 0.090, 0.0006]: top-p 0.8 keeps {0, 1}.
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f, -5.0f};
  Sampler s({1.0f, 0, 0.8f, 7});
  std::map<int32_t, int> seen;
  for (int i = 0; i < 4000; ++i) ++seen[s.Sample(logits)];
  EXPECT_EQ(seen.size(), 2u);
  const double p0 = seen[0] / 4000.0;
  EXPECT_NEAR(p0, 0.665 / (0.665 + 0.245), 0.03);
}

}  // namespace
}  // namespace tierkv
