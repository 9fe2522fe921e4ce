// tests/memory/stress_test.cc
//
// Randomized stress: thousands of alloc / pin / access / write / prefetch / demote /
// free operations over three tiers with budgets of a few frames. After every step the
// manager's invariants hold; every so often, and at the end, every copy of every page
// holds exactly the bytes last written to it.
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "tests/memory/mm_test_util.h"

namespace tierkv {
namespace {

using testing::AllCopiesEqual;
using testing::Invariants;
using testing::MakeManager;
using testing::Pattern;
using testing::SmallTiers;
using testing::TempDir;

#ifdef TIERKV_SANITIZE
constexpr int kSteps = 1500;  // shrunk under sanitizers
#else
constexpr int kSteps = 5000;
#endif

struct Model {
  std::map<uint32_t, std::vector<std::byte>> contents;  // page -> bytes last written
  std::vector<Pin> pins;
};

// Only "tier full" is an acceptable failure in this workload (budgets are tiny and
// pins can fill a tier); anything else is a bug.
void ExpectOkOrExhausted(const Status& st, const char* op) {
  EXPECT_TRUE(st.ok() || st.code() == StatusCode::kExhausted) << op << ": " << st.ToString();
}

void RunStress(PolicyKind policy, uint64_t seed) {
  TempDir dir;
  SmallTiers s;
  s.device_frames = 4;
  s.host_frames = 6;
  s.disk_frames = 24;
  s.policy = policy;
  auto mm = MakeManager(s, dir.path());
  std::mt19937_64 rng(seed);
  Model m;
  uint64_t version = 0;
  auto pick_page = [&]() -> std::optional<PageId> {
    if (m.contents.empty()) return std::nullopt;
    auto it = m.contents.begin();
    std::advance(it, static_cast<long>(rng() % m.contents.size()));
    return PageId(it->first);
  };
  auto random_tier = [&](bool allow_disk) {
    const int n = allow_disk ? 3 : 2;
    return TierAt(static_cast<int>(rng() % n));
  };

  for (int step = 0; step < kSteps; ++step) {
    const int op = static_cast<int>(rng() % 100);
    if (op < 15 && m.contents.size() < 14) {  // allocate 1 or 2 frames and fill it
      const uint64_t bytes = 1 + rng() % (2 * s.frame_bytes);
      const Tier t = random_tier(/*allow_disk=*/false);
      auto p = mm->Allocate(bytes, t);
      ExpectOkOrExhausted(p.status(), "allocate");
      if (p.ok()) {
        auto data = Pattern(bytes, ++version);
        auto pin = mm->Acquire(*p, t, Access::kWrite);
        ExpectOkOrExhausted(pin.status(), "acquire for first write");
        if (pin.ok()) {
          std::memcpy(pin->data(), data.data(), bytes);
          m.contents[p->value] = std::move(data);
        } else {
          ASSERT_TRUE(mm->Free(*p).ok());
        }
      }
    } else if (op < 25) {  // free an unpinned page
      if (auto p = pick_page()) {
        Status st = mm->Free(*p);
        if (st.ok()) m.contents.erase(p->value);
        else EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
      }
    } else if (op < 50) {  // read access: acquire, check bytes, maybe keep the pin
      if (auto p = pick_page()) {
        const Tier t = random_tier(false);
        auto pin = mm->Acquire(*p, t);
        if (pin.ok()) {
          const auto& want = m.contents[p->value];
          if (t == Tier::kHost || t == Tier::kDevice) {
            ASSERT_EQ(std::memcmp(pin->data(), want.data(), want.size()), 0) << "step " << step;
          }
          if (m.pins.size() < 2 && rng() % 4 == 0) m.pins.push_back(std::move(pin).value());
        } else if (pin.status().code() != StatusCode::kFailedPrecondition) {
          ExpectOkOrExhausted(pin.status(), "acquire");
        }
      }
    } else if (op < 62) {  // write access: new contents
      if (auto p = pick_page()) {
        const Tier t = random_tier(false);
        auto pin = mm->Acquire(*p, t, Access::kWrite);
        if (pin.ok()) {
          auto data = Pattern(m.contents[p->value].size(), ++version);
          std::memcpy(pin->data(), data.data(), data.size());
          m.contents[p->value] = std::move(data);
        } else if (pin.status().code() != StatusCode::kFailedPrecondition) {
          ExpectOkOrExhausted(pin.status(), "acquire for write");
        }
      }
    } else if (op < 74) {  // prefetch a batch
      std::vector<PageId> batch;
      for (int i = 0; i < 3; ++i) if (auto p = pick_page()) batch.push_back(*p);
      ExpectOkOrExhausted(mm->Prefetch(batch, random_tier(false)).Wait(), "prefetch");
    } else if (op < 86) {  // demote a batch
      std::vector<PageId> batch;
      for (int i = 0; i < 3; ++i) if (auto p = pick_page()) batch.push_back(*p);
      ExpectOkOrExhausted(mm->Demote(batch, TierAt(1 + static_cast<int>(rng() % 2))).Wait(), "demote");
    } else {  // release a held pin
      if (!m.pins.empty()) {
        const size_t i = rng() % m.pins.size();
        m.pins.erase(m.pins.begin() + static_cast<long>(i));
      }
    }
    ASSERT_TRUE(Invariants(*mm)) << "after step " << step << " (op " << op << ")";
    if (step % 97 == 0) {
      for (const auto& [id, data] : m.contents) ASSERT_TRUE(AllCopiesEqual(*mm, PageId(id), data)) << "step " << step;
    }
  }
  m.pins.clear();
  for (const auto& [id, data] : m.contents) EXPECT_TRUE(AllCopiesEqual(*mm, PageId(id), data));
  // The workload really moved pages through every tier.
  EXPECT_GT(mm->Stats(Tier::kDisk).bytes_in, 0u);
  EXPECT_GT(mm->Stats(Tier::kDisk).bytes_out, 0u);
  EXPECT_GT(mm->Stats(Tier::kDevice).bytes_in, 0u);
  EXPECT_GT(mm->Stats(Tier::kDevice).evictions + mm->Stats(Tier::kDevice).drops, 0u);
  EXPECT_GT(mm->Stats(Tier::kHost).evictions, 0u);
}

TEST(StressTest, DecayedLfu) { RunStress(PolicyKind::kDecayedLfu, 0x5eed0001); }
TEST(StressTest, Lru) { RunStress(PolicyKind::kLru, 0x5eed0002); }
TEST(StressTest, TwoQ) { RunStress(PolicyKind::kTwoQ, 0x5eed0003); }

}  // namespace
}  // namespace tierkv
