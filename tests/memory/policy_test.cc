// tests/memory/policy_test.cc
//
// Residency policies (memory/policy.h): properties shared by all three kinds, then the
// ordering each kind promises (LRU recency, decayed-LFU frequency with decay, 2Q scan
// resistance and ghost list), with randomized model checks for LRU and decayed LFU.
#include "memory/policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <list>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tierkv {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAreArray;

const auto kAcceptAll = [](PageId) { return true; };

std::vector<PageId> Ids(std::initializer_list<uint32_t> ids) {
  std::vector<PageId> out;
  for (uint32_t i : ids) out.emplace_back(i);
  return out;
}

std::vector<PageId> Victims(ResidencyPolicy& p, Tier t, size_t max = 1000,
                            const std::function<bool(PageId)>& accept = kAcceptAll) {
  std::vector<PageId> out;
  p.PickVictims(t, max, accept, &out);
  return out;
}

std::vector<uint32_t> Values(const std::vector<PageId>& v) {
  std::vector<uint32_t> out;
  for (PageId p : v) out.push_back(p.value);
  return out;
}

TEST(PolicyKindTest, ParseAndName) {
  EXPECT_EQ(ParsePolicyKind("lfu").value(), PolicyKind::kDecayedLfu);
  EXPECT_EQ(ParsePolicyKind("decayed-lfu").value(), PolicyKind::kDecayedLfu);
  EXPECT_EQ(ParsePolicyKind("lru").value(), PolicyKind::kLru);
  EXPECT_EQ(ParsePolicyKind("2q").value(), PolicyKind::kTwoQ);
  const Result<PolicyKind> bad = ParsePolicyKind("arc");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("'arc'"));
  EXPECT_STREQ(PolicyName(PolicyKind::kDecayedLfu), "lfu");
  EXPECT_STREQ(PolicyName(PolicyKind::kLru), "lru");
  EXPECT_STREQ(PolicyName(PolicyKind::kTwoQ), "2q");
}

// ---------------------------------------------------------------------------------
// Properties every policy has.

class AnyPolicyTest : public ::testing::TestWithParam<PolicyKind> {
 protected:
  std::unique_ptr<ResidencyPolicy> policy_ = CreatePolicy(GetParam());
};

TEST_P(AnyPolicyTest, KindAndSize) {
  ASSERT_NE(policy_, nullptr);
  EXPECT_EQ(policy_->kind(), GetParam());
  for (uint32_t i = 0; i < 10; ++i) policy_->OnInsert(Tier::kHost, PageId(i));
  for (uint32_t i = 20; i < 23; ++i) policy_->OnInsert(Tier::kDevice, PageId(i));
  EXPECT_EQ(policy_->Size(Tier::kHost), 10u);
  EXPECT_EQ(policy_->Size(Tier::kDevice), 3u);
  EXPECT_EQ(policy_->Size(Tier::kDisk), 0u);
  policy_->OnRemove(Tier::kHost, PageId(4));
  EXPECT_EQ(policy_->Size(Tier::kHost), 9u);
}

TEST_P(AnyPolicyTest, PickVictimsReturnsEveryPageOnceAndAppends) {
  for (uint32_t i = 0; i < 10; ++i) policy_->OnInsert(Tier::kHost, PageId(i));
  policy_->OnAccess(PageId(3));
  policy_->OnAccess(PageId(7));
  std::vector<PageId> out = {PageId(999)};  // existing content is kept
  policy_->PickVictims(Tier::kHost, 100, kAcceptAll, &out);
  ASSERT_EQ(out.size(), 11u);
  EXPECT_EQ(out[0], PageId(999));
  EXPECT_THAT(std::vector<PageId>(out.begin() + 1, out.end()),
              UnorderedElementsAreArray(Ids({0, 1, 2, 3, 4, 5, 6, 7, 8, 9})));
  EXPECT_TRUE(Victims(*policy_, Tier::kHost, 0).empty());
  EXPECT_TRUE(Victims(*policy_, Tier::kDisk).empty());
}

TEST_P(AnyPolicyTest, MaxTruncatesTheSameOrder) {
  for (uint32_t i = 0; i < 12; ++i) policy_->OnInsert(Tier::kHost, PageId(i));
  for (uint32_t i : {5u, 2u, 5u, 9u, 11u, 2u}) policy_->OnAccess(PageId(i));
  const std::vector<PageId> all = Victims(*policy_, Tier::kHost);
  ASSERT_EQ(all.size(), 12u);
  for (size_t k = 0; k <= 12; ++k) {
    const std::vector<PageId> some = Victims(*policy_, Tier::kHost, k);
    EXPECT_EQ(some, std::vector<PageId>(all.begin(), all.begin() + static_cast<long>(k))) << "max " << k;
  }
}

TEST_P(AnyPolicyTest, AcceptFilterIsRespectedAndOrderIsUnchanged) {
  for (uint32_t i = 0; i < 16; ++i) policy_->OnInsert(Tier::kHost, PageId(i));
  for (uint32_t i : {1u, 4u, 9u, 4u, 15u, 0u, 9u, 9u}) policy_->OnAccess(PageId(i));
  const std::vector<PageId> before = Victims(*policy_, Tier::kHost);
  ASSERT_EQ(before.size(), 16u);

  const auto odd_only = [](PageId p) { return p.value % 2 == 1; };
  const std::vector<PageId> first = Victims(*policy_, Tier::kHost, 5, odd_only);
  const std::vector<PageId> second = Victims(*policy_, Tier::kHost, 5, odd_only);
  ASSERT_EQ(first.size(), 5u);
  EXPECT_EQ(first, second);  // picking does not consume or reorder
  std::vector<PageId> expected;
  for (PageId p : before) if (odd_only(p) && expected.size() < 5) expected.push_back(p);
  EXPECT_EQ(first, expected);  // the filtered answer is the unfiltered order, filtered
  EXPECT_EQ(Victims(*policy_, Tier::kHost), before);

  // A filter that rejects everything yields nothing and changes nothing.
  EXPECT_TRUE(Victims(*policy_, Tier::kHost, 4, [](PageId) { return false; }).empty());
  EXPECT_EQ(Victims(*policy_, Tier::kHost), before);
  EXPECT_EQ(policy_->Size(Tier::kHost), 16u);
}

TEST_P(AnyPolicyTest, TiersAreSeparate) {
  for (uint32_t i = 0; i < 4; ++i) policy_->OnInsert(Tier::kDevice, PageId(i));
  for (uint32_t i = 4; i < 9; ++i) policy_->OnInsert(Tier::kHost, PageId(i));
  policy_->OnInsert(Tier::kHost, PageId(2));  // page 2 has a copy on both
  policy_->OnInsert(Tier::kDisk, PageId(20));
  EXPECT_THAT(Victims(*policy_, Tier::kDevice), UnorderedElementsAreArray(Ids({0, 1, 2, 3})));
  EXPECT_THAT(Victims(*policy_, Tier::kHost), UnorderedElementsAreArray(Ids({2, 4, 5, 6, 7, 8})));
  EXPECT_THAT(Victims(*policy_, Tier::kDisk), ElementsAre(PageId(20)));

  // Dropping the device copy of page 2 keeps its host copy.
  policy_->OnRemove(Tier::kDevice, PageId(2));
  EXPECT_THAT(Victims(*policy_, Tier::kDevice), UnorderedElementsAreArray(Ids({0, 1, 3})));
  EXPECT_THAT(Victims(*policy_, Tier::kHost), UnorderedElementsAreArray(Ids({2, 4, 5, 6, 7, 8})));
  EXPECT_EQ(policy_->Size(Tier::kDevice), 3u);
  EXPECT_EQ(policy_->Size(Tier::kHost), 6u);
}

TEST_P(AnyPolicyTest, RemovedPagesAreNeverPickedAndCanReturn) {
  for (uint32_t i = 0; i < 8; ++i) policy_->OnInsert(Tier::kHost, PageId(i));
  policy_->OnRemove(Tier::kHost, PageId(0));
  policy_->OnRemove(Tier::kHost, PageId(5));
  policy_->OnAccess(PageId(5));  // an access to a page without copies is harmless
  EXPECT_THAT(Victims(*policy_, Tier::kHost), UnorderedElementsAreArray(Ids({1, 2, 3, 4, 6, 7})));
  policy_->OnInsert(Tier::kHost, PageId(5));
  EXPECT_THAT(Victims(*policy_, Tier::kHost), UnorderedElementsAreArray(Ids({1, 2, 3, 4, 5, 6, 7})));
  for (uint32_t i = 1; i < 8; ++i) policy_->OnRemove(Tier::kHost, PageId(i));
  EXPECT_EQ(policy_->Size(Tier::kHost), 0u);
  EXPECT_TRUE(Victims(*policy_, Tier::kHost).empty());
}

TEST_P(AnyPolicyTest, UntouchedPagesGoBeforeARepeatedlyUsedOne) {
  // Page 0 is inserted first but used many times; all kinds must keep it longest.
  for (uint32_t i = 0; i < 5; ++i) policy_->OnInsert(Tier::kHost, PageId(i));
  for (int k = 0; k < 6; ++k) policy_->OnAccess(PageId(0));
  const std::vector<PageId> v = Victims(*policy_, Tier::kHost);
  ASSERT_EQ(v.size(), 5u);
  EXPECT_EQ(v.back(), PageId(0));
}

INSTANTIATE_TEST_SUITE_P(AllKinds, AnyPolicyTest,
                         ::testing::Values(PolicyKind::kDecayedLfu, PolicyKind::kLru, PolicyKind::kTwoQ),
                         [](const ::testing::TestParamInfo<PolicyKind>& info) {
                           switch (info.param) {
                             case PolicyKind::kDecayedLfu: return std::string("DecayedLfu");
                             case PolicyKind::kLru: return std::string("Lru");
                             case PolicyKind::kTwoQ: return std::string("TwoQ");
                           }
                           return std::string("Unknown");
                         });

// ---------------------------------------------------------------------------------
// LRU

TEST(LruPolicyTest, EvictsLeastRecentlyAccessed) {
  auto lru = CreatePolicy(PolicyKind::kLru);
  for (uint32_t i = 0; i < 5; ++i) lru->OnInsert(Tier::kHost, PageId(i));  // insertion counts as use
  EXPECT_EQ(Values(Victims(*lru, Tier::kHost)), (std::vector<uint32_t>{0, 1, 2, 3, 4}));
  lru->OnAccess(PageId(2));
  lru->OnAccess(PageId(0));
  EXPECT_EQ(Values(Victims(*lru, Tier::kHost)), (std::vector<uint32_t>{1, 3, 4, 2, 0}));
  lru->OnAccess(PageId(1));
  lru->OnAccess(PageId(1));
  lru->OnAccess(PageId(1));  // frequency does not matter, only the last use
  lru->OnAccess(PageId(3));
  EXPECT_EQ(Values(Victims(*lru, Tier::kHost)), (std::vector<uint32_t>{4, 2, 0, 1, 3}));
  EXPECT_EQ(Values(Victims(*lru, Tier::kHost, 2)), (std::vector<uint32_t>{4, 2}));
}

TEST(LruPolicyTest, AccessReordersEveryTierThePageIsOn) {
  auto lru = CreatePolicy(PolicyKind::kLru);
  for (uint32_t i = 0; i < 3; ++i) {
    lru->OnInsert(Tier::kDevice, PageId(i));
    lru->OnInsert(Tier::kHost, PageId(i));
  }
  lru->OnAccess(PageId(0));
  EXPECT_EQ(Values(Victims(*lru, Tier::kDevice)), (std::vector<uint32_t>{1, 2, 0}));
  EXPECT_EQ(Values(Victims(*lru, Tier::kHost)), (std::vector<uint32_t>{1, 2, 0}));
}

// Reference: one std::list per tier, front = most recent.
TEST(LruPolicyTest, RandomizedAgainstReferenceList) {
  std::mt19937_64 rng(0x1e0c0ffee);
  auto lru = CreatePolicy(PolicyKind::kLru);
  std::list<uint32_t> ref[kNumTiers];
  constexpr uint32_t kPages = 64;
  auto contains = [&](int t, uint32_t p) { return std::find(ref[t].begin(), ref[t].end(), p) != ref[t].end(); };
  for (int op = 0; op < 2000; ++op) {
    SCOPED_TRACE(op);
    const uint32_t p = static_cast<uint32_t>(rng() % kPages);
    const int t = static_cast<int>(rng() % kNumTiers);
    switch (rng() % 4) {
      case 0:
        if (!contains(t, p)) {
          lru->OnInsert(TierAt(t), PageId(p));
          ref[t].push_front(p);
        }
        break;
      case 1:
        if (contains(t, p)) {
          lru->OnRemove(TierAt(t), PageId(p));
          ref[t].remove(p);
        }
        break;
      default:
        lru->OnAccess(PageId(p));
        for (auto& l : ref) {
          if (std::find(l.begin(), l.end(), p) != l.end()) {
            l.remove(p);
            l.push_front(p);
          }
        }
        break;
    }
    for (int tier = 0; tier < kNumTiers; ++tier) {
      ASSERT_EQ(lru->Size(TierAt(tier)), ref[tier].size());
      const std::vector<uint32_t> want(ref[tier].rbegin(), ref[tier].rend());
      ASSERT_EQ(Values(Victims(*lru, TierAt(tier))), want) << "tier " << tier;
    }
    if (op % 50 == 0) {  // the filter skips pages without ending the walk
      const auto even = [](PageId q) { return q.value % 2 == 0; };
      std::vector<uint32_t> want;
      for (auto it = ref[1].rbegin(); it != ref[1].rend() && want.size() < 3; ++it) {
        if (*it % 2 == 0) want.push_back(*it);
      }
      ASSERT_EQ(Values(Victims(*lru, Tier::kHost, 3, even)), want);
    }
  }
}

// ---------------------------------------------------------------------------------
// Decayed LFU

TEST(DecayedLfuPolicyTest, EvictsLeastFrequentlyAccessedWithoutDecay) {
  PolicyOptions o;
  o.half_life = 1e9;  // effectively no decay: a plain frequency count
  auto lfu = CreatePolicy(PolicyKind::kDecayedLfu, o);
  for (uint32_t i = 0; i < 4; ++i) lfu->OnInsert(Tier::kHost, PageId(i));
  // Interleaved: page 0 x5, page 1 x1, page 2 x3, page 3 x0.
  for (uint32_t p : {0u, 2u, 0u, 1u, 2u, 0u, 0u, 2u, 0u}) lfu->OnAccess(PageId(p));
  EXPECT_EQ(Values(Victims(*lfu, Tier::kHost)), (std::vector<uint32_t>{3, 1, 2, 0}));
  // Recency alone does not save a page: 1 is now the most recent but still rarer.
  lfu->OnAccess(PageId(1));
  EXPECT_EQ(Values(Victims(*lfu, Tier::kHost)), (std::vector<uint32_t>{3, 1, 2, 0}));
}

TEST(DecayedLfuPolicyTest, FrequencyBeatsRecencyUnlikeLru) {
  PolicyOptions o;
  o.half_life = 1e9;
  for (PolicyKind kind : {PolicyKind::kDecayedLfu, PolicyKind::kLru}) {
    auto p = CreatePolicy(kind, o);
    p->OnInsert(Tier::kHost, PageId(0));
    p->OnInsert(Tier::kHost, PageId(1));
    for (int i = 0; i < 5; ++i) p->OnAccess(PageId(0));
    p->OnAccess(PageId(1));
    const std::vector<uint32_t> first = Values(Victims(*p, Tier::kHost, 1));
    EXPECT_EQ(first, (std::vector<uint32_t>{kind == PolicyKind::kLru ? 0u : 1u})) << PolicyName(kind);
  }
}

// Page A (0) is hit 3 times long ago, page B (1) twice recently; page C (2, on another
// tier) takes the accesses in between. With half_life 2 the old hits have decayed:
// score(A) ~ 2^-5.5 * 5.4 << score(B), so A goes first. Without decay B (fewer hits)
// goes first.
TEST(DecayedLfuPolicyTest, RecentAccessesOutweighOldOnesWithShortHalfLife) {
  for (double half_life : {2.0, 1e9}) {
    SCOPED_TRACE(half_life);
    PolicyOptions o;
    o.half_life = half_life;
    auto lfu = CreatePolicy(PolicyKind::kDecayedLfu, o);
    lfu->OnInsert(Tier::kHost, PageId(0));
    lfu->OnInsert(Tier::kHost, PageId(1));
    lfu->OnInsert(Tier::kDevice, PageId(2));
    for (int i = 0; i < 3; ++i) lfu->OnAccess(PageId(0));
    for (int i = 0; i < 10; ++i) lfu->OnAccess(PageId(2));
    for (int i = 0; i < 2; ++i) lfu->OnAccess(PageId(1));
    const std::vector<uint32_t> want = half_life < 10 ? std::vector<uint32_t>{0, 1} : std::vector<uint32_t>{1, 0};
    EXPECT_EQ(Values(Victims(*lfu, Tier::kHost)), want);
    EXPECT_EQ(Values(Victims(*lfu, Tier::kDevice)), (std::vector<uint32_t>{2}));
  }
}

TEST(DecayedLfuPolicyTest, NewPageStartsAsOneAccessNowAndKeepsHistoryUntilFreed) {
  PolicyOptions o;
  o.half_life = 1;
  auto lfu = CreatePolicy(PolicyKind::kDecayedLfu, o);
  lfu->OnInsert(Tier::kHost, PageId(0));
  lfu->OnInsert(Tier::kDevice, PageId(9));
  for (int i = 0; i < 4; ++i) lfu->OnAccess(PageId(0));  // key 1 + 1 + 2 + 4 + 8 = 16
  for (int i = 0; i < 6; ++i) lfu->OnAccess(PageId(9));  // time moves on to 10
  lfu->OnInsert(Tier::kHost, PageId(1));                 // key 2^10
  EXPECT_EQ(Values(Victims(*lfu, Tier::kHost)), (std::vector<uint32_t>{0, 1}));

  // A page that keeps a copy on another tier keeps its history when it gains one here:
  // 9 (hot) moves onto the host tier and ranks above the fresh page 1.
  lfu->OnAccess(PageId(9));  // t = 10: 9's key becomes 1009 + 1024 = 2033
  lfu->OnInsert(Tier::kHost, PageId(9));
  EXPECT_EQ(Values(Victims(*lfu, Tier::kHost)), (std::vector<uint32_t>{0, 1, 9}));

  // A page that lost every copy keeps its history when it returns: 0 comes back with
  // 16 + 2^14, 1 has 2^10 + 2^11 + 2^12 + 2^13 = 15360.
  lfu->OnRemove(Tier::kHost, PageId(0));
  for (int i = 0; i < 3; ++i) lfu->OnAccess(PageId(1));  // t = 11..13
  lfu->OnInsert(Tier::kHost, PageId(0));                 // key 16400
  EXPECT_EQ(Values(Victims(*lfu, Tier::kHost)), (std::vector<uint32_t>{9, 1, 0}));
  // Dropped and back: 1 has 15360 + 2^14 = 31744, above 0.
  lfu->OnRemove(Tier::kHost, PageId(1));
  lfu->OnInsert(Tier::kHost, PageId(1));
  EXPECT_EQ(Values(Victims(*lfu, Tier::kHost)), (std::vector<uint32_t>{9, 0, 1}));
  // Freed: the id's history is forgotten; it returns as new (2^14, below 0's 16400).
  lfu->OnRemove(Tier::kHost, PageId(1));
  lfu->OnFree(PageId(1));
  lfu->OnInsert(Tier::kHost, PageId(1));
  EXPECT_EQ(Values(Victims(*lfu, Tier::kHost)), (std::vector<uint32_t>{9, 1, 0}));
}

// Reference in the log domain: log2 key(p) = log2(sum over uses 2^(t_i / H)), a page
// arriving on its first tier gaining one use at the current time (on top of its history:
// nothing is freed here). Long enough (H = 4, 3762
// uses, exponent 940) that the stored keys are rescaled on the way (at
// exponent 512). Victims must come in non-decreasing score.
TEST(DecayedLfuPolicyTest, RandomizedAgainstLogDomainReference) {
  std::mt19937_64 rng(0xdecafbadull);
  constexpr double kHalfLife = 4;
  PolicyOptions o;
  o.half_life = kHalfLife;
  auto lfu = CreatePolicy(PolicyKind::kDecayedLfu, o);
  constexpr uint32_t kPages = 48;
  std::vector<double> log_key(kPages, -std::numeric_limits<double>::infinity());
  std::vector<uint8_t> tiers(kPages, 0);
  uint64_t now = 0;
  auto add = [](double a, double b) {  // log2(2^a + 2^b)
    const double hi = std::max(a, b), lo = std::min(a, b);
    return hi + std::log2(1 + std::exp2(lo - hi));
  };
  int uses = 0;
  for (int op = 0; op < 6000; ++op) {
    SCOPED_TRACE(op);
    const uint32_t p = static_cast<uint32_t>(rng() % kPages);
    const int t = static_cast<int>(rng() % kNumTiers);
    const uint8_t bit = static_cast<uint8_t>(1u << t);
    const int kind = static_cast<int>(rng() % 8);
    if (kind == 0 && !(tiers[p] & bit)) {
      if (tiers[p] == 0) log_key[p] = add(log_key[p], static_cast<double>(now) / kHalfLife);
      tiers[p] |= bit;
      lfu->OnInsert(TierAt(t), PageId(p));
    } else if (kind == 1 && (tiers[p] & bit)) {
      tiers[p] &= static_cast<uint8_t>(~bit);
      lfu->OnRemove(TierAt(t), PageId(p));
    } else if (kind >= 2) {
      // Skew: low ids are hot.
      const uint32_t q = static_cast<uint32_t>(std::min<uint64_t>(rng() % kPages, rng() % kPages));
      if (tiers[q] != 0) {
        log_key[q] = add(log_key[q], static_cast<double>(now) / kHalfLife);
        ++now;
        ++uses;
      }
      lfu->OnAccess(PageId(q));
    }
    if (op % 10 != 0) continue;
    for (int tier = 0; tier < kNumTiers; ++tier) {
      std::vector<uint32_t> members;
      for (uint32_t i = 0; i < kPages; ++i) if (tiers[i] & (1u << tier)) members.push_back(i);
      ASSERT_EQ(lfu->Size(TierAt(tier)), members.size());
      const std::vector<uint32_t> got = Values(Victims(*lfu, TierAt(tier)));
      ASSERT_THAT(got, UnorderedElementsAreArray(members));
      for (size_t i = 1; i < got.size(); ++i) {
        ASSERT_LE(log_key[got[i - 1]], log_key[got[i]] + 1e-9)
            << "tier " << tier << ": " << got[i - 1] << " picked before " << got[i];
      }
    }
  }
  EXPECT_GT(static_cast<double>(now) / kHalfLife, 512.0 + 50);  // past the first rescale
  EXPECT_EQ(static_cast<uint64_t>(uses), now);
}

// ---------------------------------------------------------------------------------
// 2Q

// Inserting a page is its first reference; OnAccess is every later one.
struct CacheSim {
  CacheSim(PolicyKind kind, size_t capacity) : policy(CreatePolicy(kind)), capacity(capacity) {}
  void Reference(uint32_t id) {
    const PageId p(id);
    if (resident.count(id)) {
      policy->OnAccess(p);
      return;
    }
    if (resident.size() == capacity) {
      const std::vector<PageId> v = Victims(*policy, Tier::kDevice, 1);
      ASSERT_EQ(v.size(), 1u);
      policy->OnRemove(Tier::kDevice, v[0]);
      resident.erase(v[0].value);
    }
    policy->OnInsert(Tier::kDevice, p);
    resident.insert(id);
  }
  std::unique_ptr<ResidencyPolicy> policy;
  size_t capacity;
  std::set<uint32_t> resident;
};

size_t HotPagesLeftAfterScan(PolicyKind kind) {
  CacheSim sim(kind, 8);
  for (uint32_t h = 0; h < 4; ++h) {
    sim.Reference(h);
    sim.Reference(h);  // hot: used twice
  }
  for (uint32_t s = 100; s < 200; ++s) sim.Reference(s);  // a one-time scan of 100 pages
  EXPECT_EQ(sim.policy->Size(Tier::kDevice), 8u);
  size_t left = 0;
  for (uint32_t h = 0; h < 4; ++h) left += sim.resident.count(h);
  return left;
}

TEST(TwoQPolicyTest, OneTimeScanDoesNotEvictPagesUsedTwice) {
  EXPECT_EQ(HotPagesLeftAfterScan(PolicyKind::kTwoQ), 4u);
  EXPECT_EQ(HotPagesLeftAfterScan(PolicyKind::kLru), 0u);  // LRU is flushed by the scan
}

TEST(TwoQPolicyTest, SecondReferencePromotesOutOfTheFifo) {
  auto q = CreatePolicy(PolicyKind::kTwoQ);
  for (uint32_t i = 0; i < 4; ++i) q->OnInsert(Tier::kHost, PageId(i));
  // All in A1in, FIFO order.
  EXPECT_EQ(Values(Victims(*q, Tier::kHost)), (std::vector<uint32_t>{0, 1, 2, 3}));
  q->OnAccess(PageId(0));  // -> Am
  q->OnAccess(PageId(1));  // -> Am
  q->OnAccess(PageId(0));  // most recent in Am
  // A1in {2, 3} is 50% >= 25% of the tier: it is drained first, then Am by recency.
  EXPECT_EQ(Values(Victims(*q, Tier::kHost)), (std::vector<uint32_t>{2, 3, 1, 0}));
}

TEST(TwoQPolicyTest, SmallFifoYieldsToAmFirst) {
  auto q = CreatePolicy(PolicyKind::kTwoQ);
  for (uint32_t i = 10; i < 18; ++i) {
    q->OnInsert(Tier::kHost, PageId(i));
    q->OnAccess(PageId(i));  // Am, 10 least recent
  }
  q->OnInsert(Tier::kHost, PageId(1));  // A1in {1}: 1 of 9 < 25%
  EXPECT_EQ(Values(Victims(*q, Tier::kHost)), (std::vector<uint32_t>{10, 11, 12, 13, 14, 15, 16, 17, 1}));
  q->OnInsert(Tier::kHost, PageId(2));
  q->OnInsert(Tier::kHost, PageId(3));  // A1in {1,2,3}: 3 of 11 >= 25%
  EXPECT_EQ(Values(Victims(*q, Tier::kHost, 4)), (std::vector<uint32_t>{1, 2, 3, 10}));
}

TEST(TwoQPolicyTest, PageEvictedFromFifoReturnsStraightToAm) {
  auto q = CreatePolicy(PolicyKind::kTwoQ);
  for (uint32_t i = 10; i < 18; ++i) {
    q->OnInsert(Tier::kHost, PageId(i));
    q->OnAccess(PageId(i));
  }
  q->OnInsert(Tier::kHost, PageId(0));
  q->OnRemove(Tier::kHost, PageId(0));  // evicted from A1in: remembered in A1out
  q->OnInsert(Tier::kHost, PageId(1));  // fresh: A1in
  q->OnInsert(Tier::kHost, PageId(0));  // ghost hit: Am, most recent
  // A1in {1} is 1 of 10 < 25%: Am first (10..17, then 0), then A1in.
  EXPECT_EQ(Values(Victims(*q, Tier::kHost)), (std::vector<uint32_t>{10, 11, 12, 13, 14, 15, 16, 17, 0, 1}));
}

// The ghost list holds max(16, 0.5 * (pages + 1)) ids. A page evicted from A1in and
// followed by 15 other evictions is among the 16 most recent, so it returns to Am.
void EvictFifteenOthers(ResidencyPolicy& q) {
  for (uint32_t o = 0; o < 15; ++o) {
    q.OnInsert(Tier::kHost, PageId(o));
    q.OnRemove(Tier::kHost, PageId(o));
  }
}

TEST(TwoQPolicyTest, GhostRemembersTheLastSixteenEvictions) {
  auto q = CreatePolicy(PolicyKind::kTwoQ);
  q->OnInsert(Tier::kHost, PageId(100));
  q->OnRemove(Tier::kHost, PageId(100));
  EvictFifteenOthers(*q);
  q->OnInsert(Tier::kHost, PageId(100));  // ghost hit: Am
  q->OnInsert(Tier::kHost, PageId(200));  // A1in
  EXPECT_EQ(Values(Victims(*q, Tier::kHost)), (std::vector<uint32_t>{200, 100}));

  // One more eviction in between and 100 is forgotten: it lands in A1in, oldest.
  auto q2 = CreatePolicy(PolicyKind::kTwoQ);
  q2->OnInsert(Tier::kHost, PageId(100));
  q2->OnRemove(Tier::kHost, PageId(100));
  EvictFifteenOthers(*q2);
  q2->OnInsert(Tier::kHost, PageId(50));
  q2->OnRemove(Tier::kHost, PageId(50));
  q2->OnInsert(Tier::kHost, PageId(100));
  q2->OnInsert(Tier::kHost, PageId(200));
  EXPECT_EQ(Values(Victims(*q2, Tier::kHost)), (std::vector<uint32_t>{100, 200}));
}

// Regression: a ghost hit once erased the id from the ghost set but left it in the ghost
// queue; after a later eviction of the same page the stale, older entry aged out first
// and erased the id, so page 100 below (followed by only 15 evictions, limit 16)
// returned to A1in instead of Am.
TEST(TwoQPolicyTest, GhostHitDoesNotLeaveAStaleEntryThatForgetsALaterEviction) {
  auto q = CreatePolicy(PolicyKind::kTwoQ);
  q->OnInsert(Tier::kHost, PageId(100));
  q->OnRemove(Tier::kHost, PageId(100));  // A1out: [100]
  q->OnInsert(Tier::kHost, PageId(100));  // ghost hit: Am
  q->OnRemove(Tier::kHost, PageId(100));  // evicted from Am: not remembered
  q->OnInsert(Tier::kHost, PageId(100));  // fresh: A1in
  q->OnRemove(Tier::kHost, PageId(100));  // A1out: 100 remembered again
  EvictFifteenOthers(*q);                 // 15 newer evictions: 100 is still within 16
  q->OnInsert(Tier::kHost, PageId(100));  // should be a ghost hit: Am
  q->OnInsert(Tier::kHost, PageId(200));  // A1in
  EXPECT_EQ(Values(Victims(*q, Tier::kHost)), (std::vector<uint32_t>{200, 100}));
}

TEST(TwoQPolicyTest, GhostsArePerTier) {
  auto q = CreatePolicy(PolicyKind::kTwoQ);
  q->OnInsert(Tier::kHost, PageId(5));
  q->OnRemove(Tier::kHost, PageId(5));  // remembered on the host tier only
  q->OnInsert(Tier::kDisk, PageId(5));  // not a ghost hit on disk: A1in
  q->OnInsert(Tier::kDisk, PageId(6));
  EXPECT_EQ(Values(Victims(*q, Tier::kDisk)), (std::vector<uint32_t>{5, 6}));
  q->OnInsert(Tier::kHost, PageId(7));
  q->OnInsert(Tier::kHost, PageId(5));  // ghost hit on host: Am
  EXPECT_EQ(Values(Victims(*q, Tier::kHost)), (std::vector<uint32_t>{7, 5}));
}

}  // namespace
}  // namespace tierkv
