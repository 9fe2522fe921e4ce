// tests/runtime/expert_split_test.cc
//
// The hybrid experts' cost model (runtime/expert_split.h): the decode split minimises
// the step's expert time, the prefill choice follows the token count, and the rates
// follow what is measured.
#include "runtime/expert_split.h"

#include <gtest/gtest.h>

namespace tierkv {
namespace {

constexpr uint64_t kExpert = 2'850'816;  // a Qwen3-30B-A3B Q4_K_M expert (docs/gpu.md)

ExpertSplitRates Rates(double copy, double device, double host) {
  ExpertSplitRates r;
  r.copy = copy;
  r.device = device;
  r.host = host;
  return r;
}

// The smallest minimiser of T(c), by brute force over the definition.
int BestByDefinition(const ExpertSplitModel& m, int hits, int misses) {
  int best = 0;
  for (int c = 1; c <= misses; ++c) {
    if (m.DecodeSeconds(hits, misses, c, kExpert) < m.DecodeSeconds(hits, misses, best, kExpert)) best = c;
  }
  return best;
}

TEST(ExpertSplitTest, DecodeSecondsIsTheSlowerSide) {
  const ExpertSplitModel m(Rates(10e9, 100e9, 40e9));
  const double e = static_cast<double>(kExpert);
  // 2 hits, 6 misses, 2 on the host: host 2E/40G; device 4E/10G + 6E/100G.
  EXPECT_DOUBLE_EQ(m.DecodeSeconds(2, 6, 2, kExpert), 4 * e / 10e9 + 6 * e / 100e9);
  // All 6 on the host: 6E/40G against the hits' 2E/100G.
  EXPECT_DOUBLE_EQ(m.DecodeSeconds(2, 6, 6, kExpert), 6 * e / 40e9);
}

TEST(ExpertSplitTest, DecodeSplitMinimisesTheStepAndFollowsTheRates) {
  // A PCIe 4.0 x8 card beside a desktop CPU (docs/gpu.md 4.2): copying a miss costs
  // more than computing it on the host, so every miss but the few the host cannot
  // finish while the device works goes to the host.
  const ExpertSplitModel x8(Rates(12.5e9, 250e9, 65e9));
  for (int hits = 0; hits <= 8; ++hits) {
    for (int misses = 0; misses + hits <= 8; ++misses) {
      EXPECT_EQ(x8.HostMisses(hits, misses, kExpert), BestByDefinition(x8, hits, misses)) << hits << " " << misses;
    }
  }
  // 8 misses: one copied and computed (228 + 11 us) hides under 7 on the host (307 us).
  EXPECT_EQ(x8.HostMisses(0, 8, kExpert), 7);
  // A link much faster than the host (PCIe 5.0 x16, a slow CPU): copies win.
  const ExpertSplitModel fast_link(Rates(50e9, 1000e9, 5e9));
  EXPECT_LE(fast_link.HostMisses(0, 8, kExpert), 1);
  // A free link: the host takes only what it finishes while the device computes the
  // rest (1 expert: 44 us against 7 on the device, 80 us; 2 would take 88 us).
  const ExpertSplitModel free_link(Rates(0, 250e9, 65e9));
  EXPECT_EQ(free_link.HostMisses(2, 6, kExpert), 1);
  // A free link and a free device: nothing on the host.
  EXPECT_EQ(ExpertSplitModel(Rates(0, 0, 65e9)).HostMisses(2, 6, kExpert), 0);
  // No misses: nothing to split.
  EXPECT_EQ(x8.HostMisses(8, 0, kExpert), 0);
  // More misses never put fewer on the host.
  for (int misses = 1; misses <= 8; ++misses) {
    EXPECT_GE(x8.HostMisses(0, misses, kExpert), x8.HostMisses(0, misses - 1, kExpert));
  }
}

TEST(ExpertSplitTest, PrefillCopiesTheExpertsManyTokensUse) {
  ExpertSplitRates r = Rates(12.5e9, 250e9, 65e9);
  r.host_token = 2e9;      // the CPU's compute for each further token
  r.device_token = 2e12;
  const ExpertSplitModel m(r);
  EXPECT_FALSE(m.CopyForTokens(1, kExpert));  // one token: the host reads it faster than the link moves it
  EXPECT_TRUE(m.CopyForTokens(64, kExpert));  // a chunk's popular expert: the device's compute wins
  // A threshold: once copying pays it pays for every larger count.
  int first = 0;
  for (int t = 1; t <= 256; ++t) {
    if (m.CopyForTokens(t, kExpert) && first == 0) first = t;
    if (first != 0) {
      EXPECT_TRUE(m.CopyForTokens(t, kExpert)) << t;
    }
  }
  // E/12.5G + E/250G + (t-1)E/2T < E/65G + (t-1)E/2G  <=>  t - 1 > 0.0686 / 0.4995: t >= 2.
  EXPECT_EQ(first, 2);
}

TEST(ExpertSplitTest, RatesFollowMeasurements) {
  ExpertSplitModel m(Rates(12.5e9, 250e9, 65e9));
  // The host measured at 20 GB/s: the average moves towards it and settles there.
  for (int i = 0; i < 100; ++i) m.ObserveHost(kExpert, 1, static_cast<double>(kExpert) / 20e9);
  EXPECT_NEAR(m.rates().host, 20e9, 1e6);
  // Chunks of 9 tokens taking the first token's time plus 8 at 4 GB/s.
  const double e = static_cast<double>(kExpert);
  for (int i = 0; i < 100; ++i) m.ObserveHost(kExpert, 9, e / 20e9 + 8 * e / 4e9);
  EXPECT_NEAR(m.rates().host_token, 4e9, 1e6);
  EXPECT_NEAR(m.rates().host, 20e9, 1e6);  // not disturbed by the chunks
  // A slower host shifts the split towards copies.
  const int before = m.HostMisses(0, 8, kExpert);
  for (int i = 0; i < 100; ++i) m.ObserveHost(kExpert, 1, e / 2e9);
  EXPECT_LT(m.HostMisses(0, 8, kExpert), before);
  // Copies measured slower than the prior.
  for (int i = 0; i < 100; ++i) m.ObserveCopy(kExpert, e / 3e9);
  EXPECT_NEAR(m.rates().copy, 3e9, 1e6);
  // Nonsense is ignored.
  const ExpertSplitRates kept = m.rates();
  m.ObserveHost(0, 1, 1.0);
  m.ObserveHost(kExpert, 1, 0.0);
  m.ObserveHost(kExpert, 0, 1.0);
  m.ObserveDevice(kExpert, 1, -1.0);
  m.ObserveCopy(kExpert, 0.0);
  EXPECT_EQ(m.rates().host, kept.host);
  EXPECT_EQ(m.rates().device, kept.device);
  EXPECT_EQ(m.rates().copy, kept.copy);
}

}  // namespace
}  // namespace tierkv
