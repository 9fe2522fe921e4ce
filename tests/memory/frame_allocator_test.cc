// tests/memory/frame_allocator_test.cc
//
// FrameAllocator (memory/frame_allocator.h): lowest-first single frames, first-fit runs
// across 64-bit word boundaries, fragmentation measures, and a randomized comparison
// against a plain one-flag-per-frame model.
#include "memory/frame_allocator.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace tierkv {

// Reaches into the bitmap so that the tests can show CheckInvariants catching each kind
// of damage (a check that cannot fail would make the stress tests' calls of it vacuous).
class FrameAllocatorTestPeer {
 public:
  static std::vector<std::vector<uint64_t>>& Levels(FrameAllocator& a) { return a.levels_; }
  static uint32_t& FreeCount(FrameAllocator& a) { return a.n_free_; }
};

namespace {

// Allocates [first, first + n) with AllocateRun and checks where it landed.
void ExpectRunAt(FrameAllocator& a, uint32_t n, uint32_t first) {
  const std::optional<FrameId> f = a.AllocateRun(n);
  ASSERT_TRUE(f.has_value()) << "run of " << n;
  EXPECT_EQ(f->value, first) << "run of " << n;
}

TEST(FrameAllocatorTest, EmptyArena) {
  FrameAllocator a(0);
  EXPECT_EQ(a.frames(), 0u);
  EXPECT_EQ(a.free_frames(), 0u);
  EXPECT_FALSE(a.Allocate().has_value());
  EXPECT_FALSE(a.AllocateRun(2).has_value());
  EXPECT_EQ(a.LargestFreeRun(), 0u);
  EXPECT_EQ(a.FreeFramesUnusableFor(4), 0u);
  EXPECT_TRUE(a.CheckInvariants());
}

TEST(FrameAllocatorTest, AllocatesLowestFirstUntilExhausted) {
  FrameAllocator a(10);
  EXPECT_EQ(a.frames(), 10u);
  for (uint32_t i = 0; i < 10; ++i) {
    const std::optional<FrameId> f = a.Allocate();
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->value, i);
    EXPECT_FALSE(a.IsFree(*f));
    EXPECT_EQ(a.used_frames(), i + 1);
  }
  EXPECT_EQ(a.free_frames(), 0u);
  EXPECT_FALSE(a.Allocate().has_value());
  EXPECT_FALSE(a.AllocateRun(2).has_value());
  EXPECT_TRUE(a.CheckInvariants());
}

TEST(FrameAllocatorTest, FreedFramesAreReusedLowestFirst) {
  FrameAllocator a(200);
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(a.Allocate().has_value());
  a.Free(FrameId(130));
  a.Free(FrameId(7));
  a.Free(FrameId(64));
  EXPECT_EQ(a.free_frames(), 3u);
  EXPECT_TRUE(a.IsFree(FrameId(7)));
  EXPECT_TRUE(a.IsFree(FrameId(64)));
  EXPECT_TRUE(a.IsFree(FrameId(130)));
  EXPECT_FALSE(a.IsFree(FrameId(8)));
  EXPECT_TRUE(a.CheckInvariants());
  EXPECT_EQ(a.Allocate()->value, 7u);
  EXPECT_EQ(a.Allocate()->value, 64u);
  EXPECT_EQ(a.Allocate()->value, 130u);
  EXPECT_FALSE(a.Allocate().has_value());
  EXPECT_TRUE(a.CheckInvariants());
}

// Sizes around word (64) and summary-level (64^2, 64^3) boundaries: every frame can
// be handed out exactly once, in order, and none past the end.
TEST(FrameAllocatorTest, OddSizesAllocateEveryFrameExactlyOnce) {
  for (uint32_t n : {1u, 2u, 63u, 64u, 65u, 127u, 128u, 4095u, 4096u, 4097u, 262143u, 262144u, 262145u}) {
    SCOPED_TRACE(n);
    FrameAllocator a(n);
    EXPECT_EQ(a.free_frames(), n);
    EXPECT_EQ(a.LargestFreeRun(), n);
    ASSERT_TRUE(a.CheckInvariants());
    for (uint32_t i = 0; i < n; ++i) {
      const std::optional<FrameId> f = a.Allocate();
      ASSERT_TRUE(f.has_value()) << "frame " << i;
      ASSERT_EQ(f->value, i);
    }
    EXPECT_FALSE(a.Allocate().has_value());
    EXPECT_FALSE(a.AllocateRun(1).has_value());
    EXPECT_EQ(a.free_frames(), 0u);
    EXPECT_EQ(a.LargestFreeRun(), 0u);
    ASSERT_TRUE(a.CheckInvariants());

    // Give everything back as one run; the whole arena is one run again.
    a.Free(FrameId(0), n);
    EXPECT_EQ(a.free_frames(), n);
    EXPECT_EQ(a.LargestFreeRun(), n);
    ASSERT_TRUE(a.CheckInvariants());
    ExpectRunAt(a, n, 0);
    EXPECT_EQ(a.free_frames(), 0u);
    if (n > 1) {
      // The last frame alone comes back as the only free one.
      a.Free(FrameId(n - 1));
      EXPECT_EQ(a.Allocate()->value, n - 1);
    }
    ASSERT_TRUE(a.CheckInvariants());
  }
}

TEST(FrameAllocatorTest, RunsAreFirstFitAndCrossWordBoundaries) {
  FrameAllocator a(256);
  ExpectRunAt(a, 3, 0);     // [0, 3)
  ExpectRunAt(a, 64, 3);    // [3, 67): crosses the 63/64 boundary
  ExpectRunAt(a, 100, 67);  // [67, 167): spans words 1 and 2
  EXPECT_EQ(a.free_frames(), 256u - 167u);
  EXPECT_TRUE(a.CheckInvariants());

  a.Free(FrameId(3), 64);   // hole [3, 67)
  ExpectRunAt(a, 50, 3);    // first fit: the hole, not the tail
  ExpectRunAt(a, 20, 167);  // 14 frames left in the hole: too small, go to the tail
  ExpectRunAt(a, 14, 53);   // fills the hole exactly
  EXPECT_FALSE(a.IsFree(FrameId(66)));
  EXPECT_TRUE(a.IsFree(FrameId(187)));
  EXPECT_EQ(a.free_frames(), 256u - 187u);
  EXPECT_EQ(a.LargestFreeRun(), 69u);
  EXPECT_TRUE(a.CheckInvariants());
}

TEST(FrameAllocatorTest, RunStartingMidWordSpansThreeWords) {
  FrameAllocator a(256);
  for (int i = 0; i < 60; ++i) ASSERT_TRUE(a.Allocate().has_value());
  ExpectRunAt(a, 10, 60);    // [60, 70) crosses into word 1
  ExpectRunAt(a, 130, 70);   // [70, 200) spans words 1, 2, 3
  ExpectRunAt(a, 56, 200);   // the rest, exactly
  EXPECT_EQ(a.free_frames(), 0u);
  EXPECT_FALSE(a.Allocate().has_value());
  a.Free(FrameId(70), 130);
  EXPECT_EQ(a.LargestFreeRun(), 130u);
  EXPECT_FALSE(a.AllocateRun(131).has_value());
  ExpectRunAt(a, 130, 70);
  EXPECT_TRUE(a.CheckInvariants());
}

TEST(FrameAllocatorTest, FragmentedArenaRefusesRunThoughEnoughFramesAreFree) {
  FrameAllocator a(128);
  ExpectRunAt(a, 128, 0);
  for (uint32_t f = 0; f < 128; f += 2) a.Free(FrameId(f));  // every other frame free
  EXPECT_EQ(a.free_frames(), 64u);
  EXPECT_EQ(a.LargestFreeRun(), 1u);
  EXPECT_FALSE(a.AllocateRun(2).has_value());
  EXPECT_EQ(a.free_frames(), 64u);  // a refused run changes nothing
  EXPECT_EQ(a.FreeFramesUnusableFor(2), 64u);
  EXPECT_EQ(a.FreeFramesUnusableFor(1), 0u);
  EXPECT_EQ(a.AllocateRun(1)->value, 0u);
  EXPECT_TRUE(a.CheckInvariants());
}

// Hand-built pattern in a 300-frame arena (5 words, the last one partial):
//   free runs [0,5) len 5, [10,11) len 1, [60,70) len 10 (crosses word 0/1),
//   [100,228) len 128 (words 1..3), [290,300) len 10 (ends at the arena end).
TEST(FrameAllocatorTest, LargestFreeRunAndUnusableFramesOnHandBuiltPattern) {
  FrameAllocator a(300);
  ExpectRunAt(a, 300, 0);
  a.Free(FrameId(0), 5);
  a.Free(FrameId(10), 1);
  a.Free(FrameId(60), 10);
  a.Free(FrameId(100), 128);
  a.Free(FrameId(290), 10);
  ASSERT_TRUE(a.CheckInvariants());
  EXPECT_EQ(a.free_frames(), 154u);
  EXPECT_EQ(a.LargestFreeRun(), 128u);
  EXPECT_EQ(a.FreeFramesUnusableFor(1), 0u);
  EXPECT_EQ(a.FreeFramesUnusableFor(2), 1u);
  EXPECT_EQ(a.FreeFramesUnusableFor(5), 1u);
  EXPECT_EQ(a.FreeFramesUnusableFor(6), 6u);
  EXPECT_EQ(a.FreeFramesUnusableFor(10), 6u);
  EXPECT_EQ(a.FreeFramesUnusableFor(11), 26u);
  EXPECT_EQ(a.FreeFramesUnusableFor(128), 26u);
  EXPECT_EQ(a.FreeFramesUnusableFor(129), 154u);

  ExpectRunAt(a, 2, 0);     // first fit in [0, 5)
  ExpectRunAt(a, 4, 60);    // [2,5) and [10,11) are too short
  ExpectRunAt(a, 7, 100);   // [64,70) has only 6
  ExpectRunAt(a, 10, 107);  // the rest of the big run comes before [290,300)
  EXPECT_EQ(a.free_frames(), 154u - 23u);
  EXPECT_EQ(a.LargestFreeRun(), 111u);          // [117, 228)
  EXPECT_EQ(a.FreeFramesUnusableFor(11), 20u);  // 3 + 1 + 6 + 10
  EXPECT_TRUE(a.CheckInvariants());
}

TEST(FrameAllocatorTest, FirstFitPrefersEarliestRunOverBestFit) {
  FrameAllocator a(300);
  ExpectRunAt(a, 300, 0);
  a.Free(FrameId(100), 128);  // large run first
  a.Free(FrameId(290), 10);   // exact fit later
  ExpectRunAt(a, 10, 100);    // first fit, not best fit
  EXPECT_EQ(a.LargestFreeRun(), 118u);
  EXPECT_EQ(a.FreeFramesUnusableFor(11), 10u);
  EXPECT_TRUE(a.CheckInvariants());
}

// Runs of up to 64 frames inside one word: free [2,5) len 3, [10,15) len 5, [20,27)
// len 7, [60,64) len 4 (touching the word's top).
TEST(FrameAllocatorTest, ShortRunsInsideOneWordAreFirstFit) {
  FrameAllocator a(64);
  ExpectRunAt(a, 64, 0);
  a.Free(FrameId(2), 3);
  a.Free(FrameId(10), 5);
  a.Free(FrameId(20), 7);
  a.Free(FrameId(60), 4);
  EXPECT_EQ(a.LargestFreeRun(), 7u);
  EXPECT_FALSE(a.AllocateRun(8).has_value());
  ExpectRunAt(a, 6, 20);
  ExpectRunAt(a, 4, 10);
  ExpectRunAt(a, 4, 60);
  ExpectRunAt(a, 3, 2);
  EXPECT_EQ(a.free_frames(), 2u);  // frames 14 and 26
  EXPECT_TRUE(a.IsFree(FrameId(14)));
  EXPECT_TRUE(a.IsFree(FrameId(26)));
  EXPECT_EQ(a.LargestFreeRun(), 1u);
  EXPECT_FALSE(a.AllocateRun(2).has_value());
  EXPECT_TRUE(a.CheckInvariants());
}

// A run that starts in the top bits of one word and ends in the low bits of the next.
TEST(FrameAllocatorTest, ShortRunAcrossAWordBoundary) {
  FrameAllocator a(192);
  ExpectRunAt(a, 192, 0);
  a.Free(FrameId(61), 3);   // top of word 0: too short alone for 5
  a.Free(FrameId(64), 2);   // bottom of word 1: [61, 66) is 5 long
  a.Free(FrameId(100), 5);  // inside word 1, later
  ExpectRunAt(a, 5, 61);
  ExpectRunAt(a, 5, 100);
  EXPECT_EQ(a.free_frames(), 0u);
  EXPECT_TRUE(a.CheckInvariants());
}

// 262145 frames: four bitmap levels. The only free frames are far apart, so finding a
// run must skip thousands of full words through the summary levels.
TEST(FrameAllocatorTest, RunSearchSkipsFullWordsInALargeArena) {
  constexpr uint32_t kFrames = 262145;
  FrameAllocator a(kFrames);
  ExpectRunAt(a, kFrames, 0);
  a.Free(FrameId(5));
  a.Free(FrameId(70000), 2);
  a.Free(FrameId(262142), 3);  // crosses into the last, one-frame word
  ASSERT_TRUE(a.CheckInvariants());
  EXPECT_EQ(a.LargestFreeRun(), 3u);
  ExpectRunAt(a, 3, 262142);
  ExpectRunAt(a, 2, 70000);
  EXPECT_FALSE(a.AllocateRun(2).has_value());
  EXPECT_EQ(a.Allocate()->value, 5u);
  EXPECT_FALSE(a.Allocate().has_value());
  EXPECT_TRUE(a.CheckInvariants());
}

// ---------------------------------------------------------------------------------
// Randomized comparison with a one-flag-per-frame model (bytes rather than
// vector<bool>: the same model, faster under ASan).

struct Model {
  explicit Model(uint32_t n) : free(n, 1), free_count(n) {}
  std::vector<uint8_t> free;  // [frames]: 1 = free
  uint32_t free_count;

  std::optional<uint32_t> FirstFit(uint32_t n) const {
    uint32_t run = 0;
    for (uint32_t i = 0; i < free.size(); ++i) {
      run = free[i] ? run + 1 : 0;
      if (run == n) return i + 1 - n;
    }
    return std::nullopt;
  }
  void Set(uint32_t first, uint32_t n, bool v) {
    for (uint32_t i = first; i < first + n; ++i) {
      ASSERT_NE(free[i] != 0, v) << "model: frame " << i << " already " << (v ? "free" : "used");
      free[i] = v;
    }
    free_count = v ? free_count + n : free_count - n;
  }
  std::vector<uint32_t> Runs() const {
    std::vector<uint32_t> runs;
    uint32_t run = 0;
    for (uint8_t f : free) {
      if (f) { ++run; continue; }
      if (run) runs.push_back(run);
      run = 0;
    }
    if (run) runs.push_back(run);
    return runs;
  }
};

void RunRandomized(uint32_t n_frames, int ops, uint64_t seed, uint32_t max_run) {
  std::mt19937_64 rng(seed);
  FrameAllocator a(n_frames);
  Model m(n_frames);
  std::vector<std::pair<uint32_t, uint32_t>> live;  // (first, n)
  int exhausted = 0, freed = 0, runs = 0;
  for (int op = 0; op < ops; ++op) {
    SCOPED_TRACE(op);
    // Free more often once the arena is mostly used, so it hovers around 60% full and
    // runs succeed as well as fail.
    const bool fuller = a.used_frames() * 10 > n_frames * 6;
    const int roll = static_cast<int>(rng() % 10);
    const int kind = live.empty() ? (roll < 4 ? 0 : 9) : (roll < (fuller ? 7 : 2) ? 4 : (roll % 2 == 0 ? 0 : 9));
    if (kind < 3) {
      // Single frame: lowest free.
      const std::optional<uint32_t> want = m.FirstFit(1);
      const std::optional<FrameId> got = a.Allocate();
      ASSERT_EQ(got.has_value(), want.has_value());
      if (got) {
        ASSERT_EQ(got->value, *want);
        m.Set(*want, 1, false);
        live.emplace_back(*want, 1);
      } else {
        ++exhausted;
      }
    } else if (kind < 6) {
      // Free a random live allocation, or a random part of it.
      const size_t i = rng() % live.size();
      auto [first, n] = live[i];
      live[i] = live.back();
      live.pop_back();
      if (n > 2 && rng() % 2 == 0) {  // free the middle, keep both ends allocated
        const uint32_t cut = 1 + static_cast<uint32_t>(rng() % (n - 2));
        a.Free(FrameId(first + cut), 1);
        m.Set(first + cut, 1, true);
        live.emplace_back(first, cut);
        live.emplace_back(first + cut + 1, n - cut - 1);
      } else {
        a.Free(FrameId(first), n);
        m.Set(first, n, true);
      }
      ++freed;
    } else {
      const uint32_t n = 1 + static_cast<uint32_t>(rng() % max_run);
      const std::optional<uint32_t> want = m.FirstFit(n);
      const std::optional<FrameId> got = a.AllocateRun(n);
      ASSERT_EQ(got.has_value(), want.has_value()) << "run of " << n;
      if (got) {
        ASSERT_EQ(got->value, *want) << "run of " << n;
        m.Set(*want, n, false);
        live.emplace_back(*want, n);
        ++runs;
      } else {
        ++exhausted;
      }
    }
    ASSERT_TRUE(a.CheckInvariants());
    ASSERT_EQ(a.free_frames(), m.free_count);
    ASSERT_EQ(a.used_frames(), n_frames - m.free_count);
    if (op % 16 == 0) {
      const std::vector<uint32_t> model_runs = m.Runs();
      const uint32_t largest = model_runs.empty() ? 0 : *std::max_element(model_runs.begin(), model_runs.end());
      ASSERT_EQ(a.LargestFreeRun(), largest);
      for (uint32_t k : {2u, 8u, 33u, 100u}) {
        uint32_t unusable = 0;
        for (uint32_t r : model_runs) if (r < k) unusable += r;
        ASSERT_EQ(a.FreeFramesUnusableFor(k), unusable) << "k=" << k;
      }
    }
    if (op % 256 == 0) {
      for (uint32_t f = 0; f < n_frames; ++f) ASSERT_EQ(a.IsFree(FrameId(f)), m.free[f] != 0) << "frame " << f;
    }
  }
  // The walk exercised every branch: exhaustion, frees and runs all happened.
  EXPECT_GT(exhausted, ops / 50);
  EXPECT_GT(freed, ops / 5);
  EXPECT_GT(runs, ops / 10);
}

// 4200 frames: 66 words, three levels (4200 > 64 * 64), a partial last word.
TEST(FrameAllocatorTest, RandomizedAgainstBitVectorModelThreeLevels) {
  RunRandomized(4200, 3000, 0x5eedf4a3e0001ull, 200);
}

// A small arena that is full most of the time.
TEST(FrameAllocatorTest, RandomizedAgainstBitVectorModelSmallArena) {
  RunRandomized(130, 4000, 0x5eedf4a3e0002ull, 20);
}

// ---- CheckInvariants fails on damage --------------------------------------------------

// 200 frames: four level-0 words (the last with 8 frames) under one level-1 word.
TEST(FrameAllocatorTest, CheckInvariantsCatchesAFreeCountThatDisagreesWithTheBitmap) {
  FrameAllocator a(200);
  ASSERT_TRUE(a.Allocate().has_value());
  ASSERT_TRUE(a.CheckInvariants());
  FrameAllocatorTestPeer::Levels(a)[0][1] &= ~uint64_t{1};  // frame 64 marked used behind the count
  EXPECT_FALSE(a.CheckInvariants());
  FrameAllocatorTestPeer::Levels(a)[0][1] |= 1;
  EXPECT_TRUE(a.CheckInvariants());
}

TEST(FrameAllocatorTest, CheckInvariantsCatchesAFreeBitPastTheEnd) {
  FrameAllocator a(200);
  FrameAllocatorTestPeer::Levels(a)[0][3] |= uint64_t{1} << 8;  // "frame 200"
  ++FrameAllocatorTestPeer::FreeCount(a);                       // so that the count agrees
  EXPECT_FALSE(a.CheckInvariants());
}

TEST(FrameAllocatorTest, CheckInvariantsCatchesASummaryBitThatDisagrees) {
  FrameAllocator a(200);
  ASSERT_GE(FrameAllocatorTestPeer::Levels(a).size(), 2u);
  ASSERT_TRUE(a.AllocateRun(128).has_value());  // words 0 and 1 full: their summary bits clear
  ASSERT_TRUE(a.CheckInvariants());
  FrameAllocatorTestPeer::Levels(a)[1][0] |= 2;  // word 1 claimed to have a free frame
  EXPECT_FALSE(a.CheckInvariants());
  FrameAllocatorTestPeer::Levels(a)[1][0] &= ~uint64_t{2};
  FrameAllocatorTestPeer::Levels(a)[1][0] &= ~uint64_t{4};  // word 2 (free frames) claimed full
  EXPECT_FALSE(a.CheckInvariants());
}

}  // namespace
}  // namespace tierkv
