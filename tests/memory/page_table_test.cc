// tests/memory/page_table_test.cc
//
// PageTable and PageEntry (memory/page_table.h): id issue and reuse, the derived
// state (top, dirty, has_copy_below) and the per-entry invariant checker.
#include "memory/page_table.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace tierkv {
namespace {

TEST(PageTableTest, InsertIssuesDenseIdsWithFields) {
  PageTable t;
  EXPECT_EQ(t.live_pages(), 0u);
  EXPECT_EQ(t.capacity(), 0u);
  const PageId a = t.Insert(4096, 1, 7);
  const PageId b = t.Insert(10000, 3, 8);
  const PageId c = t.Insert(1, 1, 9);
  EXPECT_EQ(a, PageId(0));
  EXPECT_EQ(b, PageId(1));
  EXPECT_EQ(c, PageId(2));
  EXPECT_EQ(t.live_pages(), 3u);
  EXPECT_EQ(t.capacity(), 3u);
  EXPECT_EQ(t.at(b).bytes, 10000u);
  EXPECT_EQ(t.at(b).n_frames, 3u);
  EXPECT_EQ(t.at(b).tag, 8u);
  EXPECT_EQ(t.at(b).pins, 0u);
  EXPECT_EQ(t.at(b).accesses, 0u);
  EXPECT_EQ(t.at(b).state, PageState::kResident);
  for (int i = 0; i < kNumTiers; ++i) EXPECT_FALSE(t.at(b).frame[i].valid());
  EXPECT_TRUE(t.Contains(a));
  EXPECT_TRUE(t.Contains(c));
  EXPECT_FALSE(t.Contains(PageId(3)));
  EXPECT_FALSE(t.Contains(PageId(1000)));
  EXPECT_FALSE(t.Contains(PageId()));
}

TEST(PageTableTest, EraseFreesTheIdAndReuseIsLifoWithAFreshEntry) {
  PageTable t;
  for (int i = 0; i < 4; ++i) (void)t.Insert(4096, 1, 0);
  PageEntry& e2 = t.at(PageId(2));
  e2.frame[TierIndex(Tier::kHost)] = FrameId(5);
  e2.pins = 2;
  e2.accesses = 17;
  e2.state = PageState::kInFlight;
  t.Erase(PageId(0));
  t.Erase(PageId(2));
  EXPECT_FALSE(t.Contains(PageId(0)));
  EXPECT_FALSE(t.Contains(PageId(2)));
  EXPECT_TRUE(t.Contains(PageId(1)));
  EXPECT_EQ(t.live_pages(), 2u);
  EXPECT_EQ(t.capacity(), 4u);

  // Most recently freed first, then the older one, then a new id.
  const PageId r1 = t.Insert(123, 2, 42);
  EXPECT_EQ(r1, PageId(2));
  const PageEntry& e = t.at(r1);
  EXPECT_EQ(e.bytes, 123u);
  EXPECT_EQ(e.n_frames, 2u);
  EXPECT_EQ(e.tag, 42u);
  EXPECT_EQ(e.pins, 0u);  // nothing of the old page survives
  EXPECT_EQ(e.accesses, 0u);
  EXPECT_EQ(e.state, PageState::kResident);
  EXPECT_FALSE(e.has_copy(Tier::kHost));
  EXPECT_EQ(t.Insert(1, 1, 0), PageId(0));
  EXPECT_EQ(t.Insert(1, 1, 0), PageId(4));
  EXPECT_EQ(t.live_pages(), 5u);
  EXPECT_EQ(t.capacity(), 5u);
}

TEST(PageTableTest, ForEachLiveVisitsLivePagesInIdOrder) {
  PageTable t;
  for (uint32_t i = 0; i < 6; ++i) (void)t.Insert(100 + i, 1, i);
  t.Erase(PageId(1));
  t.Erase(PageId(4));
  std::vector<uint32_t> seen;
  std::vector<uint64_t> bytes;
  t.ForEachLive([&](PageId p, const PageEntry& e) {
    seen.push_back(p.value);
    bytes.push_back(e.bytes);
  });
  EXPECT_EQ(seen, (std::vector<uint32_t>{0, 2, 3, 5}));
  EXPECT_EQ(bytes, (std::vector<uint64_t>{100, 102, 103, 105}));
}

// ---------------------------------------------------------------------------------
// Derived state

PageEntry WithCopies(bool device, bool host, bool disk) {
  PageEntry e;
  e.n_frames = 1;
  if (device) e.frame[TierIndex(Tier::kDevice)] = FrameId(1);
  if (host) e.frame[TierIndex(Tier::kHost)] = FrameId(2);
  if (disk) e.frame[TierIndex(Tier::kDisk)] = FrameId(3);
  return e;
}

TEST(PageEntryTest, LiveAndInFlight) {
  PageEntry e;
  EXPECT_FALSE(e.live());
  e.n_frames = 2;
  EXPECT_TRUE(e.live());
  EXPECT_FALSE(e.in_flight());
  e.state = PageState::kInFlight;
  EXPECT_TRUE(e.in_flight());
}

TEST(PageEntryTest, TopDirtyAndCopyBelowForEveryCombination) {
  struct Case {
    bool device, host, disk;
    Tier top;
    bool dirty;
  };
  // dirty := no copy below top and top != Disk
  const Case cases[] = {
      {true, false, false, Tier::kDevice, true},  {false, true, false, Tier::kHost, true},
      {false, false, true, Tier::kDisk, false},   {true, true, false, Tier::kDevice, false},
      {true, false, true, Tier::kDevice, false},  {false, true, true, Tier::kHost, false},
      {true, true, true, Tier::kDevice, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.device) + std::to_string(c.host) + std::to_string(c.disk));
    const PageEntry e = WithCopies(c.device, c.host, c.disk);
    EXPECT_EQ(e.has_copy(Tier::kDevice), c.device);
    EXPECT_EQ(e.has_copy(Tier::kHost), c.host);
    EXPECT_EQ(e.has_copy(Tier::kDisk), c.disk);
    EXPECT_EQ(e.top(), c.top);
    EXPECT_EQ(e.dirty(), c.dirty);
    EXPECT_EQ(e.has_copy_below(Tier::kDevice), c.host || c.disk);
    EXPECT_EQ(e.has_copy_below(Tier::kHost), c.disk);
    EXPECT_FALSE(e.has_copy_below(Tier::kDisk));
  }
}

TEST(PageEntryTest, WriteThatDropsLowerCopiesMakesThePageDirty) {
  PageEntry e = WithCopies(true, true, true);
  EXPECT_FALSE(e.dirty());
  e.frame[TierIndex(Tier::kDisk)] = FrameId();
  EXPECT_FALSE(e.dirty());  // the host copy still backs the device one
  e.frame[TierIndex(Tier::kHost)] = FrameId();
  EXPECT_TRUE(e.dirty());
  // Demotion to disk: now clean again.
  e.frame[TierIndex(Tier::kDisk)] = FrameId(9);
  EXPECT_FALSE(e.dirty());
}

// A page backed by a PageSource (a session file block) has Disk data without a Disk frame.
TEST(PageEntryTest, BackingCountsAsDiskDataButNotAsADiskFrame) {
  PageEntry e;
  e.n_frames = 1;
  EXPECT_FALSE(e.backed());
  e.source = 0;
  e.source_key = 77;
  EXPECT_TRUE(e.backed());
  EXPECT_FALSE(e.has_copy(Tier::kDisk));
  EXPECT_TRUE(e.has_data(Tier::kDisk));
  EXPECT_FALSE(e.has_data(Tier::kHost));
  EXPECT_EQ(e.top(), Tier::kDisk);
  EXPECT_FALSE(e.dirty());

  e.frame[TierIndex(Tier::kHost)] = FrameId(4);  // promoted: the backing stays below
  EXPECT_EQ(e.top(), Tier::kHost);
  EXPECT_TRUE(e.has_copy_below(Tier::kHost));
  EXPECT_FALSE(e.dirty());
  e.source = -1;  // written: the backing is stale and forgotten
  EXPECT_TRUE(e.dirty());
}

// ---------------------------------------------------------------------------------
// CheckInvariants

TEST(PageTableTest, CheckInvariantsAcceptsAConsistentTable) {
  PageTable t;
  const PageId a = t.Insert(4096, 1, 0);
  const PageId b = t.Insert(4096, 1, 0);
  const PageId c = t.Insert(4096, 1, 0);
  t.at(a).frame[TierIndex(Tier::kDisk)] = FrameId(0);
  t.at(b).frame[TierIndex(Tier::kDevice)] = FrameId(0);
  t.at(b).frame[TierIndex(Tier::kHost)] = FrameId(3);
  t.at(b).pins = 2;
  t.at(b).pin_tier = Tier::kDevice;  // pinned on its top copy: fine
  t.at(c).frame[TierIndex(Tier::kHost)] = FrameId(1);
  t.Erase(c);
  std::string why = "untouched";
  EXPECT_TRUE(t.CheckInvariants(&why));
  EXPECT_EQ(why, "untouched");
  EXPECT_TRUE(PageTable().CheckInvariants(&why));
}

TEST(PageTableTest, CheckInvariantsCatchesALivePageWithoutCopies) {
  PageTable t;
  const PageId a = t.Insert(4096, 1, 0);
  t.at(a).frame[TierIndex(Tier::kHost)] = FrameId(0);
  (void)t.Insert(4096, 1, 0);  // page 1: no copy anywhere
  std::string why;
  EXPECT_FALSE(t.CheckInvariants(&why));
  EXPECT_EQ(why, "page 1 is live but has no copy");
}

TEST(PageTableTest, CheckInvariantsAcceptsABackedPageWithoutFrames) {
  PageTable t;
  const PageId a = t.Insert(4096, 1, 0);
  std::string why;
  EXPECT_FALSE(t.CheckInvariants(&why));
  EXPECT_EQ(why, "page 0 is live but has no copy");
  t.at(a).source = 2;  // data lives in the source
  EXPECT_TRUE(t.CheckInvariants(&why));
}

TEST(PageTableTest, CheckInvariantsCatchesAPinBelowTheTop) {
  PageTable t;
  const PageId a = t.Insert(4096, 1, 0);
  t.at(a).frame[TierIndex(Tier::kDevice)] = FrameId(0);
  t.at(a).frame[TierIndex(Tier::kHost)] = FrameId(0);
  t.at(a).pins = 1;
  t.at(a).pin_tier = Tier::kHost;  // has a copy there, but it is not the top one
  std::string why;
  EXPECT_FALSE(t.CheckInvariants(&why));
  EXPECT_EQ(why, "page 0 is pinned on host but its top copy is on device");

  t.at(a).pin_tier = Tier::kDevice;
  EXPECT_TRUE(t.CheckInvariants(&why));
  t.at(a).pins = 0;
  t.at(a).pin_tier = Tier::kHost;  // unpinned: pin_tier does not matter
  EXPECT_TRUE(t.CheckInvariants(&why));
}

TEST(PageTableTest, CheckInvariantsCatchesAPinOnATierWithoutACopy) {
  PageTable t;
  const PageId a = t.Insert(4096, 1, 0);
  t.at(a).frame[TierIndex(Tier::kHost)] = FrameId(2);
  t.at(a).pins = 1;
  t.at(a).pin_tier = Tier::kDevice;
  std::string why;
  EXPECT_FALSE(t.CheckInvariants(&why));
  EXPECT_EQ(why, "page 0 is pinned on device but its top copy is on host");
}

}  // namespace
}  // namespace tierkv
