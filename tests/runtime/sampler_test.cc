// tests/runtime/sampler_test.cc
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu_features.h"

namespace tierkv {
namespace {

SamplerOptions Opts(float temperature, int top_k, float top_p, uint64_t seed, float min_p = 0.0f) {
  SamplerOptions o;
  o.temperature = temperature;
  o.top_k = top_k;
  o.top_p = top_p;
  o.min_p = min_p;
  o.seed = seed;
  return o;
}

std::map<int32_t, int> Draws(Sampler& s, const std::vector<float>& logits, int n) {
  std::map<int32_t, int> seen;
  for (int i = 0; i < n; ++i) ++seen[s.Sample(logits)];
  return seen;
}

TEST(SamplerTest, GreedyIsArgmaxWithTiesToTheSmallerId) {
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f};
  Sampler s(Opts(0.0f, 40, 0.95f, 1, 0.05f));
  EXPECT_EQ(s.Sample(logits), 1);
  EXPECT_EQ(Argmax(logits), 1);
}

// Greedy picks without copying the vocabulary (runtime/sampler.cc, GreedyPick): the same
// token as the definition (bans to -inf, llama.cpp's penalties on the window's counts,
// then the first maximum on strict >) on vocabularies of every size around the 16-lane
// loop and its tail, with ties, infinities and NaN, bans and penalties at the ends, on
// each other and on the maximum.
void CheckGreedyAgainstTheDefinition() {
  std::mt19937 rng(20261207);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  int checked = 0;
  for (int n : {1, 2, 15, 16, 17, 31, 33, 64, 100, 1000, 151936}) {
    for (int trial = 0; trial < (n > 1000 ? 4 : 40); ++trial) {
      std::vector<float> logits(static_cast<size_t>(n));
      std::uniform_int_distribution<int> coarse(-4, 4);  // few distinct values: many ties
      for (float& l : logits) l = static_cast<float>(coarse(rng)) * 0.5f;
      std::uniform_int_distribution<int> pick(0, n - 1);
      const int specials = trial % 4;
      for (int k = 0; k < specials; ++k) {
        const float v[] = {inf, -inf, nan, 2.0f};
        logits[static_cast<size_t>(pick(rng))] = v[(trial + k) % 4];
      }
      if (trial % 5 == 1) logits[0] = nan;
      SamplerOptions o = Opts(0.0f, 40, 0.95f, 1);
      if (trial % 2 == 1) {
        o.repeat_penalty = 1.3f;
        o.frequency_penalty = 0.25f;
        o.presence_penalty = 0.5f;
      }
      std::vector<int32_t> history;
      for (int k = 0; k < trial % 7; ++k) history.push_back(pick(rng));
      if (trial % 3 == 0) history.push_back(n - 1);
      for (int k = 0; k < trial % 3; ++k) o.banned_tokens.push_back(pick(rng));
      if (trial % 4 == 2) o.banned_tokens.push_back(0);
      if (trial % 6 == 5 && !history.empty()) o.banned_tokens.push_back(history[0]);

      std::vector<float> want_logits = logits;
      std::map<int32_t, int> counts;
      for (int32_t id : history) ++counts[id];
      for (int32_t id : o.banned_tokens) want_logits[static_cast<size_t>(id)] = -inf;
      if (o.penalizes()) {
        for (const auto& [id, c] : counts) {
          float& l = want_logits[static_cast<size_t>(id)];
          l = l <= 0.0f ? l * o.repeat_penalty : l / o.repeat_penalty;
          l -= static_cast<float>(c) * o.frequency_penalty + o.presence_penalty;
        }
      }
      int32_t want = 0;
      for (int i = 1; i < n; ++i) {
        if (want_logits[static_cast<size_t>(i)] > want_logits[static_cast<size_t>(want)]) want = i;
      }
      Sampler s(o);
      for (int32_t id : history) s.Accept(id);
      ASSERT_EQ(s.Sample(logits), want) << "n " << n << " trial " << trial;
      if (o.banned_tokens.empty() && !o.penalizes()) {
        ASSERT_EQ(Argmax(logits), want);
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 300);
}

TEST(SamplerTest, GreedyMatchesTheDefinitionWithBansPenaltiesTiesAndNonFinite) {
  // Every SIMD level this CPU has (the AVX-512 search and the portable one).
  const kernels::SimdLevel detected = kernels::DetectedSimdLevel();
  for (kernels::SimdLevel level : {kernels::SimdLevel::kScalar, kernels::SimdLevel::kAvx2, kernels::SimdLevel::kAvx512}) {
    if (level > detected) continue;
    SCOPED_TRACE(kernels::SimdLevelName(level));
    kernels::ForceSimdLevel(level);
    CheckGreedyAgainstTheDefinition();
  }
  kernels::ForceSimdLevel(detected);
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
  Sampler a(Opts(0.8f, 5, 1.0f, 42)), b(Opts(0.8f, 5, 1.0f, 42)), c(Opts(0.8f, 5, 1.0f, 43));
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
  // p = softmax([2, 1, 0, -5]) ~ [0.665, 0.245, 0.090, 0.0006]: top-p 0.8 keeps {0, 1}
  // (at temperature 1, whatever the temperature). The draw between them is at the
  // temperature: P(0) = 1 / (1 + exp(-1 / T)) = 0.881, 0.731, 0.622 at T = 0.5, 1, 2.
  // 4000 draws: a standard deviation of 0.007 (<= 0.03 / 4); the three lie >= 0.1 apart,
  // so a sampler that ignored the temperature fails at T = 0.5 and 2.
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f, -5.0f};
  for (const float t : {0.5f, 1.0f, 2.0f}) {
    SCOPED_TRACE("T = " + std::to_string(t));
    Sampler s(Opts(t, 0, 0.8f, 7));
    std::map<int32_t, int> seen = Draws(s, logits, 4000);
    EXPECT_EQ(seen.size(), 2u);
    EXPECT_EQ(seen[0] + seen[1], 4000);
    const double p0 = seen[0] / 4000.0;
    EXPECT_NEAR(p0, 1.0 / (1.0 + std::exp(-1.0 / t)), 0.03);
  }
}

TEST(SamplerTest, TopPAndMinPActOnTheDistributionAtTemperatureOne) {
  // llama.cpp's order: top-p and min-p before the temperature. At T = 1, p0 = 0.665 >=
  // 0.6, so top-p keeps token 0 alone, however hot the draw (at T = 5 first, p0 would be
  // 0.37 and top-p would keep three tokens).
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f, -5.0f};
  Sampler hot(Opts(5.0f, 0, 0.6f, 3));
  EXPECT_EQ(Draws(hot, logits, 500), (std::map<int32_t, int>{{0, 500}}));

  // min-p 0.1 keeps p_i >= 0.1 p_max: exp(-1), exp(-2) stay, exp(-3.5) = 0.03 goes.
  const std::vector<float> steps = {0.0f, -1.0f, -2.0f, -3.5f};
  Sampler cut(Opts(1.0f, 0, 1.0f, 5, 0.1f)), open(Opts(1.0f, 0, 1.0f, 5, 0.0f));
  const auto with_cut = Draws(cut, steps, 4000), without = Draws(open, steps, 4000);
  EXPECT_EQ(with_cut.size(), 3u);
  EXPECT_EQ(with_cut.count(3), 0u);
  EXPECT_GT(without.count(3), 0u);  // p ~ 0.02: about 80 of 4000
  const double z = 1.0 + std::exp(-1.0) + std::exp(-2.0);
  EXPECT_NEAR(with_cut.at(0) / 4000.0, 1.0 / z, 0.03);
}

TEST(SamplerTest, RepeatPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplerOptions o = Opts(0.0f, 40, 0.95f, 1);
  o.repeat_penalty = 1.5f;
  {
    const std::vector<float> logits = {3.0f, 2.5f, -1.0f};
    Sampler s(o);
    EXPECT_EQ(s.Sample(logits), 0);
    s.Accept(0);  // 3 / 1.5 = 2 < 2.5
    EXPECT_EQ(s.Sample(logits), 1);
    s.Accept(1);  // 2.5 / 1.5 = 1.67 < 2
    EXPECT_EQ(s.Sample(logits), 0);
  }
  {
    const std::vector<float> logits = {-1.0f, -1.2f};
    Sampler s(o);
    s.Accept(0);  // -1 * 1.5 = -1.5 < -1.2 (dividing would have raised it)
    EXPECT_EQ(s.Sample(logits), 1);
  }
}

TEST(SamplerTest, FrequencyAndPresencePenaltiesCountOccurrencesInTheWindow) {
  const std::vector<float> logits = {1.0f, 0.5f};
  SamplerOptions o = Opts(0.0f, 40, 0.95f, 1);
  o.frequency_penalty = 0.2f;
  Sampler freq(o);
  freq.Accept(0);
  freq.Accept(0);
  EXPECT_EQ(freq.Sample(logits), 0);  // 1 - 2 x 0.2 = 0.6 > 0.5
  o.presence_penalty = 0.2f;
  Sampler both(o);
  both.Accept(0);
  both.Accept(0);
  EXPECT_EQ(both.Sample(logits), 1);  // 0.6 - 0.2 = 0.4 < 0.5

  // The window: with repeat_last_n 2, token 0 has left it after two more tokens.
  o.repeat_last_n = 2;
  Sampler window(o);
  for (const int32_t t : {0, 0, 5, 6}) window.Accept(t);
  EXPECT_EQ(window.Sample(logits), 0);
  o.repeat_last_n = -1;  // all of the context
  Sampler all(o);
  for (const int32_t t : {0, 0, 5, 6}) all.Accept(t);
  EXPECT_EQ(all.Sample(logits), 1);
  o.repeat_last_n = 0;  // off
  Sampler off(o);
  for (const int32_t t : {0, 0}) off.Accept(t);
  EXPECT_EQ(off.Sample(logits), 0);
}

TEST(SamplerTest, BannedTokensAreNeverDrawn) {
  const std::vector<float> logits = {5.0f, 1.0f, 0.5f};
  SamplerOptions o = Opts(0.0f, 40, 0.95f, 9);
  o.banned_tokens = {0};
  Sampler greedy(o);
  EXPECT_EQ(greedy.Sample(logits), 1);
  o.temperature = 2.0f;
  o.min_p = 0.0f;
  Sampler hot(o);
  const auto seen = Draws(hot, logits, 1000);
  EXPECT_EQ(seen.count(0), 0u);
  EXPECT_EQ(seen.size(), 2u);
}

TEST(SamplerTest, ValidateNamesTheValueOutOfRange) {
  const auto message = [](auto edit) {
    SamplerOptions o;
    edit(o);
    return o.Validate().message();
  };
  EXPECT_TRUE(SamplerOptions().Validate().ok());
  EXPECT_NE(message([](SamplerOptions& o) { o.temperature = NAN; }).find("--temp"), std::string::npos);
  EXPECT_NE(message([](SamplerOptions& o) { o.top_p = INFINITY; }).find("--top-p"), std::string::npos);
  EXPECT_NE(message([](SamplerOptions& o) { o.min_p = NAN; }).find("--min-p"), std::string::npos);
  EXPECT_NE(message([](SamplerOptions& o) { o.repeat_penalty = 0; }).find("--repeat-penalty"), std::string::npos);
  EXPECT_NE(message([](SamplerOptions& o) { o.repeat_last_n = -2; }).find("--repeat-last-n"), std::string::npos);
  // What llama.cpp accepts still means something here: a negative temperature is greedy,
  // top-p 0 and min-p above 1 keep the top token.
  const std::vector<float> logits = {0.5f, 2.0f, 1.9f};
  for (const SamplerOptions& o : {Opts(-1.0f, 0, 1.0f, 3), Opts(1.0f, 0, 0.0f, 3), Opts(1.0f, 0, 1.0f, 3, 2.0f)}) {
    ASSERT_TRUE(o.Validate().ok());
    Sampler s(o);
    EXPECT_EQ(Draws(s, logits, 200), (std::map<int32_t, int>{{1, 200}}));
  }
}

// Degenerate logits: none, or none finite; and banned tokens stay out of a draw over
// the whole vocabulary (no top-p or min-p cut) at any temperature.
TEST(SamplerTest, DegenerateLogitsAndBansWithoutCuts) {
  Sampler hot(Opts(1.0f, 0, 1.0f, 4));
  EXPECT_EQ(hot.Sample(std::vector<float>{}), 0);
  const std::vector<float> none = {-INFINITY, -INFINITY, -INFINITY};
  const int32_t pick = hot.Sample(none);
  EXPECT_GE(pick, 0);
  EXPECT_LT(pick, 3);
  SamplerOptions o = Opts(0.05f, 0, 1.0f, 6);  // cold: most weights underflow to 0
  o.banned_tokens = {0, 3};
  Sampler banned(o);
  const std::vector<float> logits = {9.0f, 1.0f, 0.5f, 8.0f, -2.0f};
  for (const auto& [id, n] : Draws(banned, logits, 300)) EXPECT_TRUE(id != 0 && id != 3) << id;
}

}  // namespace
}  // namespace tierkv
