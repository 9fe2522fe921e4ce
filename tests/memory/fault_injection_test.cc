// tests/memory/fault_injection_test.cc
//
// For each fault (EIO on read, EIO on write, ENOSPC, short write, a copy that fails
// midway) the operation returns a clear error, and every page's data stays intact and
// readable where it was; once the fault clears, the same operation succeeds.
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
using testing::WritePage;

struct Fixture {
  TempDir dir;
  std::shared_ptr<FaultInjector> device_faults = std::make_shared<FaultInjector>();
  std::shared_ptr<FaultInjector> disk_faults = std::make_shared<FaultInjector>();
  std::unique_ptr<MemoryManager> mm;
  std::vector<PageId> pages;
  std::vector<std::vector<std::byte>> data;

  explicit Fixture(SmallTiers s = {}) { mm = MakeManager(s, dir.path(), device_faults, disk_faults); }

  void AddPages(int n, Tier t) {
    for (int i = 0; i < n; ++i) {
      auto p = mm->Allocate(4096, t);
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      pages.push_back(*p);
      data.push_back(Pattern(4096, 1000 + pages.size()));
      ASSERT_TRUE(WritePage(*mm, *p, t, data.back()).ok());
    }
  }
  void ExpectIntact() {
    for (size_t i = 0; i < pages.size(); ++i) EXPECT_TRUE(AllCopiesEqual(*mm, pages[i], data[i]));
    EXPECT_TRUE(Invariants(*mm));
  }
};

void ExpectClearError(const Status& st, StatusCode code, const std::string& must_mention) {
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), code) << st.ToString();
  EXPECT_NE(st.message().find(must_mention), std::string::npos) << st.message();
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << "one line: " << st.message();
}

TEST(FaultInjectionTest, EioOnReadDuringPromotionLeavesPageOnDisk) {
  Fixture f;
  f.AddPages(2, Tier::kHost);
  ASSERT_TRUE(f.mm->Demote(f.pages, Tier::kDisk).Wait().ok());
  f.disk_faults->Arm(Fault::kEioOnRead);
  auto pin = f.mm->Acquire(f.pages[0], Tier::kHost);
  ExpectClearError(pin.status(), StatusCode::kIoError, "Input/output error");
  EXPECT_EQ(f.mm->TopTier(f.pages[0]), Tier::kDisk);
  EXPECT_FALSE(f.mm->HasCopy(f.pages[0], Tier::kHost));
  EXPECT_EQ(f.mm->Stats(Tier::kDisk).failed_copies, 1u);
  f.ExpectIntact();
  auto again = f.mm->Acquire(f.pages[0], Tier::kHost);  // fault cleared: works
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(std::memcmp(again->data(), f.data[0].data(), 4096), 0);
}

TEST(FaultInjectionTest, EioOnWriteDuringDemotionKeepsPageAbove) {
  Fixture f;
  f.AddPages(3, Tier::kHost);
  f.disk_faults->Arm(Fault::kEioOnWrite);
  ExpectClearError(f.mm->Demote(f.pages, Tier::kDisk).Wait(), StatusCode::kIoError, "disk tier write");
  for (PageId p : f.pages) {
    EXPECT_EQ(f.mm->TopTier(p), Tier::kHost);
    EXPECT_FALSE(f.mm->HasCopy(p, Tier::kDisk));
  }
  f.ExpectIntact();
  ASSERT_TRUE(f.mm->Demote(f.pages, Tier::kDisk).Wait().ok());
  f.ExpectIntact();
}

TEST(FaultInjectionTest, NoSpaceDuringEvictionFailsTheAllocationOnly) {
  SmallTiers s;
  s.device_frames = 0;
  s.host_frames = 2;
  Fixture f(s);
  f.AddPages(2, Tier::kHost);  // host full of dirty pages
  f.disk_faults->Arm(Fault::kNoSpace);
  auto p = f.mm->Allocate(4096, Tier::kHost);  // must evict a dirty page to disk
  ExpectClearError(p.status(), StatusCode::kNoSpace, "No space left");
  EXPECT_EQ(f.mm->live_pages(), 2u);
  for (PageId q : f.pages) EXPECT_EQ(f.mm->TopTier(q), Tier::kHost);
  f.ExpectIntact();
  auto retry = f.mm->Allocate(4096, Tier::kHost);
  ASSERT_TRUE(retry.ok()) << retry.status().ToString();
  f.ExpectIntact();
}

TEST(FaultInjectionTest, ShortWriteIsAnErrorNotAHalfPage) {
  Fixture f;
  f.AddPages(1, Tier::kHost);
  f.disk_faults->Arm(Fault::kShortWrite);
  ExpectClearError(f.mm->Demote(f.pages, Tier::kDisk).Wait(), StatusCode::kIoError, "short write");
  EXPECT_FALSE(f.mm->HasCopy(f.pages[0], Tier::kDisk));
  f.ExpectIntact();
}

TEST(FaultInjectionTest, DiskCopyFailingMidwayKeepsEveryPage) {
  Fixture f;
  f.AddPages(4, Tier::kHost);
  f.disk_faults->Arm(Fault::kFailMidway);
  ExpectClearError(f.mm->Demote(f.pages, Tier::kDisk).Wait(), StatusCode::kIoError, "failed midway");
  for (PageId p : f.pages) EXPECT_FALSE(f.mm->HasCopy(p, Tier::kDisk));
  f.ExpectIntact();
}

TEST(FaultInjectionTest, DeviceCopyFailingMidwayLeavesPagesOnHost) {
  Fixture f;
  f.AddPages(4, Tier::kHost);
  f.device_faults->Arm(Fault::kFailMidway);
  ExpectClearError(f.mm->Prefetch(f.pages, Tier::kDevice).Wait(), StatusCode::kIoError, "device tier write");
  for (PageId p : f.pages) {
    EXPECT_FALSE(f.mm->HasCopy(p, Tier::kDevice));
    EXPECT_EQ(f.mm->TopTier(p), Tier::kHost);
  }
  EXPECT_EQ(f.mm->Stats(Tier::kDevice).used_bytes.current, 0u);
  f.ExpectIntact();
  ASSERT_TRUE(f.mm->Prefetch(f.pages, Tier::kDevice).Wait().ok());
  f.ExpectIntact();
}

TEST(FaultInjectionTest, DeviceEvictionReadFailureKeepsDirtyPageOnDevice) {
  SmallTiers s;
  s.device_frames = 1;
  Fixture f(s);
  f.AddPages(1, Tier::kDevice);  // dirty on device
  f.device_faults->Arm(Fault::kFailMidway);  // the device -> host copy of the eviction
  auto p = f.mm->Allocate(4096, Tier::kDevice);
  ExpectClearError(p.status(), StatusCode::kIoError, "evicting from the device tier");
  EXPECT_EQ(f.mm->TopTier(f.pages[0]), Tier::kDevice);
  f.ExpectIntact();
}

TEST(FaultInjectionTest, EveryFaultOnEveryStepOfATwoStepPromotion) {
  // Disk -> Host -> Device: inject each fault at each copy call; after every failure
  // the pages are intact and the next attempt (fault gone) succeeds.
  for (Fault fault : {Fault::kEioOnRead, Fault::kEioOnWrite, Fault::kNoSpace, Fault::kShortWrite, Fault::kFailMidway}) {
    int fired_somewhere = 0;  // the fault must reach one of the two copies, or nothing was tested
    for (int on_device : {0, 1}) {
      Fixture f;
      f.AddPages(3, Tier::kHost);
      ASSERT_TRUE(f.mm->Demote(f.pages, Tier::kDisk).Wait().ok());
      (on_device ? f.device_faults : f.disk_faults)->Arm(fault);
      Status st = f.mm->Prefetch(f.pages, Tier::kDevice).Wait();
      const int fired = (on_device ? f.device_faults : f.disk_faults)->fired();
      fired_somewhere += fired;
      if (fired > 0) {
        EXPECT_FALSE(st.ok()) << FaultName(fault);
      } else {
        EXPECT_TRUE(st.ok()) << FaultName(fault) << ": " << st.ToString();
      }
      f.ExpectIntact();
      (on_device ? f.device_faults : f.disk_faults)->Disarm();
      ASSERT_TRUE(f.mm->Prefetch(f.pages, Tier::kDevice).Wait().ok()) << FaultName(fault);
      for (PageId p : f.pages) EXPECT_EQ(f.mm->TopTier(p), Tier::kDevice);
      f.ExpectIntact();
    }
    EXPECT_GT(fired_somewhere, 0) << FaultName(fault);
  }
}

}  // namespace
}  // namespace tierkv

namespace tierkv {
namespace {

TEST(FaultInjectionTest, EioOnReadThroughFailsTheReadAndMovesNothing) {
  Fixture f;
  f.AddPages(2, Tier::kHost);
  ASSERT_TRUE(f.mm->Demote(f.pages, Tier::kDisk).Wait().ok());
  f.disk_faults->Arm(Fault::kEioOnRead);
  std::unique_ptr<std::byte, decltype(&std::free)> buf(static_cast<std::byte*>(std::aligned_alloc(4096, 2 * 4096)),
                                                      &std::free);
  ExpectClearError(f.mm->ReadThrough(f.pages, {buf.get(), buf.get() + 4096}).Wait(), StatusCode::kIoError,
                   "Input/output error");
  for (PageId p : f.pages) EXPECT_EQ(f.mm->TopTier(p), Tier::kDisk);
  f.ExpectIntact();
  ASSERT_TRUE(f.mm->ReadThrough(f.pages, {buf.get(), buf.get() + 4096}).Wait().ok());  // fault cleared
  EXPECT_EQ(std::memcmp(buf.get() + 4096, f.data[1].data(), 4096), 0);
}

}  // namespace
}  // namespace tierkv
