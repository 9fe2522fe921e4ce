// tests/memory/memory_manager_test.cc
#include "memory/memory_manager.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "tests/memory/mm_test_util.h"

namespace tierkv {

// Runs fn(tier state, page table, policy) under the manager's lock, so that a test can
// damage (and then repair) the accounting and show that CheckInvariants names it.
class MemoryManagerTestPeer {
 public:
  template <typename Fn>
  static void With(MemoryManager& mm, Tier t, Fn&& fn) {
    std::lock_guard<std::mutex> lock(mm.mu_);
    fn(mm.tiers_[TierIndex(t)], mm.table_, *mm.policy_);
  }
};

namespace {

using testing::AllCopiesEqual;
using testing::Invariants;
using testing::MakeManager;
using testing::Pattern;
using testing::SmallTiers;
using testing::TempDir;
using testing::WritePage;

TEST(MemoryManagerTest, AllocateWriteReadOnEachTier) {
  TempDir dir;
  auto mm = MakeManager({}, dir.path());
  for (Tier t : {Tier::kDevice, Tier::kHost}) {
    auto p = mm->Allocate(3000, t);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    const auto data = Pattern(3000, p->value + 7);
    ASSERT_TRUE(WritePage(*mm, *p, t, data).ok());
    EXPECT_EQ(mm->TopTier(*p), t);
    EXPECT_TRUE(AllCopiesEqual(*mm, *p, data));
  }
  EXPECT_TRUE(Invariants(*mm));
}

TEST(MemoryManagerTest, PromotionKeepsCleanCopyAndEvictionDropsIt) {
  TempDir dir;
  SmallTiers s;
  s.device_frames = 1;
  auto mm = MakeManager(s, dir.path());
  auto a = mm->Allocate(4096, Tier::kHost).value();
  const auto da = Pattern(4096, 1);
  ASSERT_TRUE(WritePage(*mm, a, Tier::kHost, da).ok());
  {
    auto pin = mm->Acquire(a, Tier::kDevice);  // promote Host -> Device
    ASSERT_TRUE(pin.ok()) << pin.status().ToString();
    EXPECT_EQ(std::memcmp(pin->data(), da.data(), da.size()), 0);
  }
  EXPECT_TRUE(mm->HasCopy(a, Tier::kDevice));
  EXPECT_TRUE(mm->HasCopy(a, Tier::kHost));  // clean copy kept below
  const uint64_t host_in_before = mm->Stats(Tier::kHost).bytes_in;
  // A second page needs the only device frame: a is clean, so it is dropped, not copied.
  auto b = mm->Allocate(4096, Tier::kDevice).value();
  EXPECT_FALSE(mm->HasCopy(a, Tier::kDevice));
  EXPECT_EQ(mm->Stats(Tier::kDevice).drops, 1u);
  EXPECT_EQ(mm->Stats(Tier::kDevice).evictions, 0u);
  EXPECT_EQ(mm->Stats(Tier::kHost).bytes_in, host_in_before);
  EXPECT_TRUE(AllCopiesEqual(*mm, a, da));
  EXPECT_TRUE(mm->HasCopy(b, Tier::kDevice));
  EXPECT_TRUE(Invariants(*mm));
}

TEST(MemoryManagerTest, DirtyPageIsDemotedNotDropped) {
  TempDir dir;
  SmallTiers s;
  s.device_frames = 1;
  auto mm = MakeManager(s, dir.path());
  auto a = mm->Allocate(4096, Tier::kDevice).value();
  const auto da = Pattern(4096, 2);
  ASSERT_TRUE(WritePage(*mm, a, Tier::kDevice, da).ok());
  auto b = mm->Allocate(4096, Tier::kDevice).value();  // evicts a: must copy it down
  (void)b;
  EXPECT_EQ(mm->TopTier(a), Tier::kHost);
  EXPECT_EQ(mm->Stats(Tier::kDevice).evictions, 1u);
  EXPECT_EQ(mm->Stats(Tier::kHost).bytes_in, 4096u);
  EXPECT_TRUE(AllCopiesEqual(*mm, a, da));
  EXPECT_TRUE(Invariants(*mm));
}

TEST(MemoryManagerTest, WriteDiscardsStaleLowerCopies) {
  TempDir dir;
  auto mm = MakeManager({}, dir.path());
  auto a = mm->Allocate(4096, Tier::kHost).value();
  ASSERT_TRUE(WritePage(*mm, a, Tier::kHost, Pattern(4096, 3)).ok());
  ASSERT_TRUE(mm->Demote({a}, Tier::kDisk).Wait().ok());
  ASSERT_TRUE(mm->Prefetch({a}, Tier::kHost).Wait().ok());
  EXPECT_TRUE(mm->HasCopy(a, Tier::kDisk));
  const auto v2 = Pattern(4096, 4);
  ASSERT_TRUE(WritePage(*mm, a, Tier::kHost, v2).ok());
  EXPECT_FALSE(mm->HasCopy(a, Tier::kDisk));
  EXPECT_TRUE(AllCopiesEqual(*mm, a, v2));
  EXPECT_TRUE(Invariants(*mm));
}

TEST(MemoryManagerTest, PinnedPagesAreNeverEvicted) {
  TempDir dir;
  SmallTiers s;
  s.device_frames = 2;
  auto mm = MakeManager(s, dir.path());
  auto a = mm->Allocate(4096, Tier::kDevice).value();
  auto b = mm->Allocate(4096, Tier::kDevice).value();
  auto pa = mm->Acquire(a, Tier::kDevice).value();
  auto pb = mm->Acquire(b, Tier::kDevice).value();
  auto c = mm->Allocate(4096, Tier::kDevice);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kExhausted);
  EXPECT_NE(c.status().message().find("device tier full"), std::string::npos) << c.status().message();
  pb.Release();
  auto d = mm->Allocate(4096, Tier::kDevice);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(mm->TopTier(a), Tier::kDevice);
  EXPECT_EQ(mm->TopTier(b), Tier::kHost);
  EXPECT_TRUE(Invariants(*mm));
}

TEST(MemoryManagerTest, MultiFramePagesUseContiguousRuns) {
  TempDir dir;
  SmallTiers s;
  s.host_frames = 8;
  auto mm = MakeManager(s, dir.path());
  auto big = mm->Allocate(3 * 4096, Tier::kHost).value();  // an expert of 3 frames
  const auto data = Pattern(3 * 4096, 9);
  ASSERT_TRUE(WritePage(*mm, big, Tier::kHost, data).ok());
  ASSERT_TRUE(mm->Demote({big}, Tier::kDisk).Wait().ok());
  ASSERT_TRUE(mm->Prefetch({big}, Tier::kDevice).Wait().ok());
  EXPECT_EQ(mm->TopTier(big), Tier::kDevice);
  EXPECT_TRUE(AllCopiesEqual(*mm, big, data));
  const TierStats host = mm->Stats(Tier::kHost);
  EXPECT_EQ(host.requested_bytes.current, 3u * 4096);
  EXPECT_EQ(host.used_bytes.current, 3u * 4096);
  EXPECT_TRUE(Invariants(*mm));
}

TEST(MemoryManagerTest, HitsMissesAndInternalFragmentation) {
  TempDir dir;
  auto mm = MakeManager({}, dir.path());
  auto a = mm->Allocate(1024, Tier::kHost).value();  // a quarter of a frame
  ASSERT_TRUE(mm->Acquire(a, Tier::kHost).ok());      // hit
  ASSERT_TRUE(mm->Acquire(a, Tier::kDevice).ok());    // miss on device, served by host
  ASSERT_TRUE(mm->Acquire(a, Tier::kDevice).ok());    // hit on device
  const TierStats dev = mm->Stats(Tier::kDevice);
  const TierStats host = mm->Stats(Tier::kHost);
  EXPECT_EQ(host.hits, 2u);
  EXPECT_EQ(host.misses, 0u);
  EXPECT_EQ(dev.misses, 1u);
  EXPECT_EQ(dev.hits, 1u);
  EXPECT_DOUBLE_EQ(dev.internal_fragmentation(), 0.75);
  EXPECT_DOUBLE_EQ(dev.hit_rate(), 0.5);
}

TEST(MemoryManagerTest, PinHitSaysWhetherTheAcquireCopied) {
  TempDir dir;
  auto mm = MakeManager({}, dir.path());
  auto a = mm->Allocate(4096, Tier::kHost).value();
  auto miss = mm->Acquire(a, Tier::kDevice);
  ASSERT_TRUE(miss.ok());
  EXPECT_FALSE(miss->hit());
  miss->Release();
  auto hit = mm->Acquire(a, Tier::kDevice);
  ASSERT_TRUE(hit.ok());
  EXPECT_TRUE(hit->hit());
  EXPECT_TRUE(mm->ResidentOrArriving(a, Tier::kDevice));
  EXPECT_FALSE(mm->ResidentOrArriving(a, Tier::kHost));  // its top copy is on Device
}

// ResidentOrArriving counts a page in flight only for the tier its move lands on: a page
// being demoted from Host to Disk is arriving on Disk, not resident on Host (an Acquire
// there would wait, then copy it back) and not arriving on Device.
TEST(MemoryManagerTest, ResidentOrArrivingNamesTheTierAMoveLandsOn) {
  TempDir dir;
  auto disk_faults = std::make_shared<FaultInjector>();
  auto mm = MakeManager({}, dir.path(), nullptr, disk_faults);
  auto a = mm->Allocate(4096, Tier::kHost).value();
  EXPECT_TRUE(mm->ResidentOrArriving(a, Tier::kHost));
  EXPECT_FALSE(mm->ResidentOrArriving(a, Tier::kDisk));
  disk_faults->SetDelay(std::chrono::milliseconds(300));  // the demotion's write
  Ticket t = mm->Demote({a}, Tier::kDisk);
  bool seen_in_flight = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!seen_in_flight && std::chrono::steady_clock::now() < deadline) {
    const bool to_disk = mm->ResidentOrArriving(a, Tier::kDisk);
    const bool host = mm->ResidentOrArriving(a, Tier::kHost);
    const bool device = mm->ResidentOrArriving(a, Tier::kDevice);
    if (to_disk && mm->TopTier(a) == Tier::kHost) {  // started and not landed: read in flight
      seen_in_flight = true;
      EXPECT_FALSE(host);
      EXPECT_FALSE(device);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  EXPECT_TRUE(seen_in_flight);
  ASSERT_TRUE(t.Wait().ok());
  EXPECT_EQ(mm->TopTier(a), Tier::kDisk);
  EXPECT_TRUE(mm->ResidentOrArriving(a, Tier::kDisk));
  EXPECT_FALSE(mm->ResidentOrArriving(a, Tier::kHost));
}

// TryAcquire is Acquire's hit path alone: it pins a page already on the tier (a hit)
// and otherwise changes nothing, so the caller can fall back to Acquire.
TEST(MemoryManagerTest, TryAcquirePinsOnlyResidentPages) {
  TempDir dir;
  auto mm = MakeManager({}, dir.path());
  auto a = mm->Allocate(4096, Tier::kHost).value();
  const TierStats before = mm->Stats(Tier::kDevice);
  EXPECT_FALSE(mm->TryAcquire(a, Tier::kDevice).valid());  // on Host: not a hit
  EXPECT_FALSE(mm->TryAcquire(PageId{a.value + 1000}, Tier::kDevice).valid());
  EXPECT_FALSE(mm->TryAcquire(a, Tier::kDisk).valid());
  EXPECT_EQ(mm->TopTier(a), Tier::kHost);
  EXPECT_EQ(mm->Stats(Tier::kDevice).hits, before.hits);
  EXPECT_EQ(mm->Stats(Tier::kDevice).misses, before.misses);
  {
    Pin host = mm->TryAcquire(a, Tier::kHost);
    ASSERT_TRUE(host.valid());
    EXPECT_TRUE(host.hit());
    // Pinned on Host: neither path may pin it on Device.
    EXPECT_FALSE(mm->TryAcquire(a, Tier::kDevice).valid());
    EXPECT_FALSE(mm->Acquire(a, Tier::kDevice).ok());
    EXPECT_FALSE(mm->Free(a).ok());
  }
  ASSERT_TRUE(mm->Acquire(a, Tier::kDevice).ok());
  const uint64_t hits = mm->Stats(Tier::kDevice).hits;
  Pin pin = mm->TryAcquire(a, Tier::kDevice);
  ASSERT_TRUE(pin.valid());
  EXPECT_EQ(mm->Stats(Tier::kDevice).hits, hits + 1);
  EXPECT_TRUE(Invariants(*mm));
}

// TryAcquireAll pins every page or none.
TEST(MemoryManagerTest, TryAcquireAllIsAllOrNothing) {
  TempDir dir;
  auto mm = MakeManager({}, dir.path());
  auto a = mm->Allocate(4096, Tier::kDevice).value();
  auto b = mm->Allocate(4096, Tier::kDevice).value();
  auto c = mm->Allocate(4096, Tier::kHost).value();
  const uint64_t hits = mm->Stats(Tier::kDevice).hits;
  const std::vector<PageId> with_host = {a, c, b};
  EXPECT_TRUE(mm->TryAcquireAll(with_host, Tier::kDevice).empty());
  EXPECT_EQ(mm->Stats(Tier::kDevice).hits, hits);
  EXPECT_TRUE(mm->Free(a).ok());  // nothing was left pinned
  a = mm->Allocate(4096, Tier::kDevice).value();
  const std::vector<PageId> resident = {b, a};
  {
    std::vector<Pin> pins = mm->TryAcquireAll(resident, Tier::kDevice);
    ASSERT_EQ(pins.size(), 2u);
    EXPECT_EQ(mm->Stats(Tier::kDevice).hits, hits + 2);
    EXPECT_TRUE(pins[0].hit());
    EXPECT_FALSE(mm->Free(b).ok());  // pinned
    EXPECT_TRUE(Invariants(*mm));
  }
  EXPECT_TRUE(mm->Free(b).ok());
  EXPECT_TRUE(Invariants(*mm));
}

// A prefetch of pages that are all where it would put them is answered at once, without
// a task on the copy stream.
TEST(MemoryManagerTest, PrefetchOfResidentPagesSkipsTheStream) {
  TempDir dir;
  auto mm = MakeManager({}, dir.path());
  auto a = mm->Allocate(4096, Tier::kDevice).value();
  auto b = mm->Allocate(4096, Tier::kDevice).value();
  const uint64_t tasks = mm->copy_tasks();
  const double busy = mm->copy_busy_seconds();
  Ticket t = mm->Prefetch({a, b, a}, Tier::kDevice);
  EXPECT_TRUE(t.done());
  EXPECT_TRUE(t.Wait().ok());
  EXPECT_TRUE(mm->Prefetch({a}, Tier::kHost).Wait().ok());  // above the target counts too
  EXPECT_EQ(mm->copy_tasks(), tasks);
  // One page below the target: the whole batch goes to the stream.
  auto c = mm->Allocate(4096, Tier::kHost).value();
  ASSERT_TRUE(mm->Prefetch({a, c}, Tier::kDevice).Wait().ok());
  EXPECT_EQ(mm->copy_tasks(), tasks + 1);
  EXPECT_GT(mm->copy_busy_seconds(), busy);
  EXPECT_EQ(mm->TopTier(c), Tier::kDevice);
  EXPECT_TRUE(Invariants(*mm));
}

// Allocation goes to the copy stream only when it must evict: a free frame is taken on
// the caller's thread.
TEST(MemoryManagerTest, AllocationUsesTheStreamOnlyToEvict) {
  TempDir dir;
  SmallTiers s;
  s.device_frames = 2;
  auto mm = MakeManager(s, dir.path());
  const uint64_t tasks = mm->copy_tasks();
  auto a = mm->Allocate(4096, Tier::kDevice).value();
  auto b = mm->Allocate(4096, Tier::kDevice).value();
  EXPECT_EQ(mm->copy_tasks(), tasks);
  ASSERT_TRUE(WritePage(*mm, a, Tier::kDevice, Pattern(4096, 3)).ok());
  auto c = mm->Allocate(4096, Tier::kDevice).value();  // evicts a or b (dirty: copied down)
  EXPECT_EQ(mm->copy_tasks(), tasks + 1);
  EXPECT_EQ(mm->TopTier(c), Tier::kDevice);
  EXPECT_TRUE(AllCopiesEqual(*mm, a, Pattern(4096, 3)));
  (void)b;
  EXPECT_TRUE(Invariants(*mm));
}

// A page a prefetch brought up and nobody used yet is spared by eviction while another
// page can make room; once used it is an ordinary page again.
TEST(MemoryManagerTest, EvictionSparesUnusedPrefetchedPages) {
  TempDir dir;
  SmallTiers s;
  s.device_frames = 2;
  auto mm = MakeManager(s, dir.path());
  auto hot = mm->Allocate(4096, Tier::kHost).value();
  auto fetched = mm->Allocate(4096, Tier::kHost).value();
  auto third = mm->Allocate(4096, Tier::kHost).value();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(mm->Acquire(hot, Tier::kDevice).ok());  // frequent: LFU keeps it
  ASSERT_TRUE(mm->Prefetch({fetched}, Tier::kDevice).Wait().ok());
  // `third` needs a frame: LFU would pick the new, rarely used `fetched`; it is spared.
  ASSERT_TRUE(mm->Acquire(third, Tier::kDevice).ok());
  EXPECT_TRUE(mm->HasCopy(fetched, Tier::kDevice));
  EXPECT_FALSE(mm->HasCopy(hot, Tier::kDevice));
  auto use = mm->Acquire(fetched, Tier::kDevice);
  ASSERT_TRUE(use.ok());
  EXPECT_TRUE(use->hit());
  use->Release();
  // Used: no longer spared. Bringing `hot` back evicts by frequency again.
  ASSERT_TRUE(mm->Acquire(hot, Tier::kDevice).ok());
  EXPECT_TRUE(mm->HasCopy(hot, Tier::kDevice));
  EXPECT_TRUE(Invariants(*mm));
}

// A miss pins the page as it lands on the stream, so prefetches queued behind it (which
// evict to make room) cannot take it away before the caller has it: under a tier that
// holds two pages and a flood of prefetches, every acquire succeeds.
TEST(MemoryManagerTest, AcquireWinsAgainstAFloodOfPrefetches) {
  TempDir dir;
  SmallTiers s;
  s.device_frames = 2;
  s.host_frames = 16;
  auto mm = MakeManager(s, dir.path());
  std::vector<PageId> pages;
  for (int i = 0; i < 12; ++i) pages.push_back(mm->Allocate(4096, Tier::kHost).value());
  std::atomic<bool> stop{false};
  std::thread flood([&] {
    for (uint32_t i = 0; !stop.load(); ++i) (void)mm->Prefetch({pages[i % pages.size()]}, Tier::kDevice);
  });
  for (int i = 0; i < 2000; ++i) {
    auto pin = mm->Acquire(pages[(i * 7) % pages.size()], Tier::kDevice);
    ASSERT_TRUE(pin.ok()) << pin.status().ToString();
  }
  stop.store(true);
  flood.join();
  EXPECT_TRUE(Invariants(*mm));
}

// The busy time of a task is counted before its ticket completes: a caller that waited
// for the copy sees it (no race with the stream's worker).
TEST(MemoryManagerTest, CopyStreamBusyTimeGrowsWithCopies) {
  TempDir dir;
  auto mm = MakeManager({}, dir.path());
  const double before = mm->copy_busy_seconds();
  auto a = mm->Allocate(4096, Tier::kHost).value();
  ASSERT_TRUE(mm->Acquire(a, Tier::kDevice).ok());
  EXPECT_GT(mm->copy_busy_seconds(), before);
}

TEST(MemoryManagerTest, DemoteAndPromoteThroughAllTiers) {
  TempDir dir;
  auto mm = MakeManager({}, dir.path());
  std::vector<PageId> pages;
  std::vector<std::vector<std::byte>> data;
  for (int i = 0; i < 4; ++i) {
    pages.push_back(mm->Allocate(4096, Tier::kDevice).value());
    data.push_back(Pattern(4096, 100 + i));
    ASSERT_TRUE(WritePage(*mm, pages.back(), Tier::kDevice, data.back()).ok());
  }
  ASSERT_TRUE(mm->Demote(pages, Tier::kDisk).Wait().ok());
  for (size_t i = 0; i < pages.size(); ++i) {
    EXPECT_EQ(mm->TopTier(pages[i]), Tier::kDisk);
    EXPECT_FALSE(mm->HasCopy(pages[i], Tier::kHost));
    EXPECT_TRUE(AllCopiesEqual(*mm, pages[i], data[i]));
  }
  // One gathered batch per step: Disk -> Host, then Host -> Device.
  const uint64_t batches_before = mm->Stats(Tier::kDisk).copy_batches;
  ASSERT_TRUE(mm->Prefetch(pages, Tier::kDevice).Wait().ok());
  EXPECT_EQ(mm->Stats(Tier::kDisk).copy_batches, batches_before + 1);
  for (size_t i = 0; i < pages.size(); ++i) {
    EXPECT_EQ(mm->TopTier(pages[i]), Tier::kDevice);
    EXPECT_TRUE(AllCopiesEqual(*mm, pages[i], data[i]));
  }
  EXPECT_TRUE(Invariants(*mm));
}

TEST(MemoryManagerTest, FreeReleasesEveryCopyAndRefusesPinned) {
  TempDir dir;
  auto mm = MakeManager({}, dir.path());
  auto a = mm->Allocate(4096, Tier::kHost).value();
  ASSERT_TRUE(mm->Prefetch({a}, Tier::kDevice).Wait().ok());
  {
    auto pin = mm->Acquire(a, Tier::kDevice).value();
    EXPECT_EQ(mm->Free(a).code(), StatusCode::kFailedPrecondition);
  }
  ASSERT_TRUE(mm->Free(a).ok());
  EXPECT_EQ(mm->live_pages(), 0u);
  for (Tier t : {Tier::kDevice, Tier::kHost, Tier::kDisk}) EXPECT_EQ(mm->Stats(t).used_bytes.current, 0u);
  EXPECT_EQ(mm->Free(a).code(), StatusCode::kNotFound);
  EXPECT_TRUE(Invariants(*mm));
}

TEST(MemoryManagerTest, LastTierFullIsExhaustedAndLosesNothing) {
  TempDir dir;
  SmallTiers s;
  s.device_frames = 0;
  s.host_frames = 2;
  s.disk_frames = 2;
  auto mm = MakeManager(s, dir.path());
  std::vector<PageId> pages;
  for (int i = 0; i < 4; ++i) {
    auto p = mm->Allocate(4096, Tier::kHost);
    ASSERT_TRUE(p.ok()) << i << ": " << p.status().ToString();
    pages.push_back(*p);
    ASSERT_TRUE(WritePage(*mm, *p, Tier::kHost, Pattern(4096, 50 + i)).ok());
  }
  auto fifth = mm->Allocate(4096, Tier::kHost);
  ASSERT_FALSE(fifth.ok());
  EXPECT_EQ(fifth.status().code(), StatusCode::kExhausted);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(AllCopiesEqual(*mm, pages[i], Pattern(4096, 50 + i)));
  EXPECT_TRUE(Invariants(*mm));
}

TEST(MemoryManagerTest, CreateRejectsImpossibleBudgets) {
  MemoryOptions o;
  o.host_bytes = 100 * kKiB;
  auto r = MemoryManager::Create(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("impossible budget: --host"), std::string::npos) << r.status().message();

  o.host_bytes = 1 * kMiB;
  o.frame_bytes = 1000;
  EXPECT_EQ(MemoryManager::Create(o).status().code(), StatusCode::kInvalidArgument);

  o.frame_bytes = 64 * kKiB;
  o.device = DeviceKind::kSim;
  o.device_bytes = 0;
  EXPECT_NE(MemoryManager::Create(o).status().message().find("--vram"), std::string::npos);

  o.device = DeviceKind::kNone;
  o.disk_bytes = 1 * kMiB;
  o.disk_dir = "/nonexistent/tierkv";
  auto d = MemoryManager::Create(o);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("/nonexistent/tierkv"), std::string::npos) << d.status().message();
}

TEST(MemoryManagerTest, CreateBuildsRequestedTiers) {
  TempDir dir;
  MemoryOptions o;
  o.frame_bytes = 64 * kKiB;
  o.host_bytes = 1 * kMiB;
  o.device = DeviceKind::kSim;
  o.device_bytes = 512 * kKiB + 1000;  // rounded down to whole frames
  o.disk_bytes = 2 * kMiB;
  o.disk_dir = dir.path();
  o.mlock = MlockMode::kOff;
  auto mm = MemoryManager::Create(o);
  ASSERT_TRUE(mm.ok()) << mm.status().ToString();
  EXPECT_EQ((*mm)->compute_tier(), Tier::kDevice);
  EXPECT_EQ((*mm)->Stats(Tier::kDevice).frames, 8u);
  EXPECT_EQ((*mm)->Stats(Tier::kHost).budget_bytes, 1 * kMiB);
  EXPECT_EQ((*mm)->Stats(Tier::kDisk).frames, 32u);
  EXPECT_GT((*mm)->Stats(Tier::kHost).warmup_s, 0.0) << "warm-up is on by default: the host arena was touched";
}

int RefuseMlock(const void*, size_t) {
  errno = EPERM;
  return -1;
}

TEST(MemoryManagerTest, FailedMlockWarnsUnderTryAndFailsUnderRequire) {
  HostBackendOptions h;
  h.bytes = 1 * kMiB;
  h.mlock_fn = &RefuseMlock;
  h.mlock = MlockMode::kTry;
  auto ok = CreateHostBackend(h);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_NE((*ok)->Describe().find("not locked"), std::string::npos);
  h.mlock = MlockMode::kRequire;
  auto bad = CreateHostBackend(h);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(bad.status().message().find("RLIMIT_MEMLOCK"), std::string::npos) << bad.status().message();
}

TEST(MemoryManagerTest, ConcurrentAcquireOfResidentPagesFromManyThreads) {
  TempDir dir;
  SmallTiers s;
  s.host_frames = 16;
  auto mm = MakeManager(s, dir.path());
  std::vector<PageId> pages;
  for (int i = 0; i < 8; ++i) {
    pages.push_back(mm->Allocate(4096, Tier::kHost).value());
    ASSERT_TRUE(WritePage(*mm, pages.back(), Tier::kHost, Pattern(4096, i)).ok());
  }
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const PageId p = pages[(i + t) % pages.size()];
        auto pin = mm->Acquire(p, Tier::kHost);
        if (!pin.ok()) { ++failures; continue; }
        const auto want = Pattern(4096, (i + t) % pages.size());
        if (std::memcmp(pin->data(), want.data(), 4096) != 0) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(mm->Stats(Tier::kHost).hits, 808u);  // 8 write pins + 800 reads
  EXPECT_TRUE(Invariants(*mm));
}

}  // namespace
}  // namespace tierkv

namespace tierkv {
namespace {

// A source that serves Pattern(bytes, key) and reports corruption for keys in `bad`.
class PatternSource : public PageSource {
 public:
  explicit PatternSource(uint64_t bytes) : bytes_(bytes) {}
  Status ReadPage(uint64_t key, std::span<std::byte> out) override {
    ++reads;
    if (bad.count(key)) {
      std::memset(out.data(), 0xEE, out.size());  // what a torn file would give
      return Status::Corruption("block " + std::to_string(key) + " checksum mismatch");
    }
    const auto data = testing::Pattern(bytes_, key);
    std::memcpy(out.data(), data.data(), data.size());
    return Status::Ok();
  }
  bool KeepBelow() const override { return keep_below; }
  std::set<uint64_t> bad;
  int reads = 0;
  bool keep_below = false;

 private:
  uint64_t bytes_;
};

TEST(MemoryManagerBackedTest, RegisterReadsNothingAndPromotionVerifies) {
  testing::TempDir dir;
  testing::SmallTiers s;
  s.disk_frames = 0;  // backing works without a Disk arena
  auto mm = testing::MakeManager(s, dir.path());
  auto src = std::make_shared<PatternSource>(3000);
  const int32_t id = mm->AddSource(src);
  std::vector<PageId> pages;
  for (uint64_t k = 0; k < 20; ++k) pages.push_back(mm->RegisterBacked(3000, id, k).value());
  EXPECT_EQ(src->reads, 0);
  EXPECT_EQ(mm->TopTier(pages[5]), Tier::kDisk);
  EXPECT_TRUE(testing::Invariants(*mm));
  {
    auto pin = mm->Acquire(pages[5], Tier::kDevice);
    ASSERT_TRUE(pin.ok()) << pin.status().ToString();
    const auto want = testing::Pattern(3000, 5);
    EXPECT_EQ(std::memcmp(pin->data(), want.data(), 3000), 0);
  }
  EXPECT_EQ(src->reads, 1);
  // Many more pages than the Host tier holds: clean backed pages are dropped, not copied.
  for (PageId p : pages) ASSERT_TRUE(mm->Acquire(p, Tier::kHost).ok());
  EXPECT_EQ(mm->Stats(Tier::kHost).evictions, 0u);
  EXPECT_GT(mm->Stats(Tier::kHost).drops, 0u);
  for (uint64_t k = 0; k < 20; ++k) EXPECT_TRUE(testing::AllCopiesEqual(*mm, pages[k], testing::Pattern(3000, k)));
  EXPECT_TRUE(testing::Invariants(*mm));
}

TEST(MemoryManagerBackedTest, CorruptBlockIsRefusedAtPageIn) {
  testing::TempDir dir;
  auto mm = testing::MakeManager({}, dir.path());
  auto src = std::make_shared<PatternSource>(4096);
  src->bad.insert(3);
  const int32_t id = mm->AddSource(src);
  auto good = mm->RegisterBacked(4096, id, 2).value();
  auto bad = mm->RegisterBacked(4096, id, 3).value();
  ASSERT_TRUE(mm->Prefetch({good}, Tier::kHost).Wait().ok());
  auto pin = mm->Acquire(bad, Tier::kHost);
  ASSERT_FALSE(pin.ok());
  EXPECT_EQ(pin.status().code(), StatusCode::kCorruption);
  EXPECT_NE(pin.status().message().find("block 3"), std::string::npos) << pin.status().message();
  EXPECT_FALSE(mm->HasCopy(bad, Tier::kHost));  // never became data
  EXPECT_TRUE(testing::Invariants(*mm));
}

TEST(MemoryManagerBackedTest, WriteForgetsTheBacking) {
  testing::TempDir dir;
  auto mm = testing::MakeManager({}, dir.path());
  auto src = std::make_shared<PatternSource>(4096);
  const int32_t id = mm->AddSource(src);
  auto p = mm->RegisterBacked(4096, id, 7).value();
  const auto v2 = testing::Pattern(4096, 99);
  ASSERT_TRUE(testing::WritePage(*mm, p, Tier::kHost, v2).ok());
  EXPECT_FALSE(mm->HasCopy(p, Tier::kDisk));
  // Dirty now: demotion must write it to the Disk arena.
  ASSERT_TRUE(mm->Demote({p}, Tier::kDisk).Wait().ok());
  EXPECT_TRUE(testing::AllCopiesEqual(*mm, p, v2));
  EXPECT_EQ(mm->Stats(Tier::kDisk).bytes_in, 4096u);
}

// Each kind of damage to the accounting, made under the manager's lock, is named by
// CheckInvariants, and the manager is whole again once it is undone (the stress tests
// call the check after every step; this shows it can fail).
TEST(MemoryManagerTest, CheckInvariantsNamesEachKindOfDamage) {
  TempDir dir;
  auto mm = MakeManager({}, dir.path());
  const PageId a = mm->Allocate(3000, Tier::kHost).value();
  const PageId b = mm->Allocate(3000, Tier::kHost).value();
  ASSERT_TRUE(Invariants(*mm));
  const int host = TierIndex(Tier::kHost);
  FrameId a_frame, b_frame;
  MemoryManagerTestPeer::With(*mm, Tier::kHost, [&](auto&, PageTable& table, ResidencyPolicy&) {
    a_frame = table.at(a).frame[host];
    b_frame = table.at(b).frame[host];
  });
  ASSERT_NE(a_frame, b_frame);

  // Damages, checks that the check fails naming `named`, undoes, checks it passes.
  auto expect_named = [&](const std::string& named, auto make, auto undo) {
    SCOPED_TRACE(named);
    MemoryManagerTestPeer::With(*mm, Tier::kHost, make);
    std::string why;
    EXPECT_FALSE(mm->CheckInvariants(&why));
    EXPECT_NE(why.find(named), std::string::npos) << why;
    MemoryManagerTestPeer::With(*mm, Tier::kHost, undo);
    EXPECT_TRUE(Invariants(*mm));
  };
  expect_named(
      "frame " + std::to_string(a_frame.value) + " of page " + std::to_string(a.value) + " is free",
      [&](auto& ts, PageTable&, ResidencyPolicy&) { ts.frames->Free(a_frame); },
      [&](auto& ts, PageTable&, ResidencyPolicy&) {
        const std::optional<FrameId> f = ts.frames->Allocate();  // the lowest free frame
        ASSERT_TRUE(f.has_value() && *f == a_frame);
      });
  expect_named(
      "of page " + std::to_string(b.value) + " is free, out of range or shared",  // b's entry names a's frame
      [&](auto&, PageTable& table, ResidencyPolicy&) { table.at(b).frame[host] = a_frame; },
      [&](auto&, PageTable& table, ResidencyPolicy&) { table.at(b).frame[host] = b_frame; });
  expect_named(
      "host: used frames 2 != copies 2 + pending 1",
      [&](auto& ts, PageTable&, ResidencyPolicy&) { ++ts.pending_frames; },
      [&](auto& ts, PageTable&, ResidencyPolicy&) { --ts.pending_frames; });
  expect_named(
      "host: policy tracks 1 pages, table has 2",
      [&](auto&, PageTable&, ResidencyPolicy& policy) { policy.OnRemove(Tier::kHost, a); },
      [&](auto&, PageTable&, ResidencyPolicy& policy) { policy.OnInsert(Tier::kHost, a); });
  expect_named(
      "host: gauges disagree with the page table",
      [&](auto& ts, PageTable&, ResidencyPolicy&) { ts.stats.requested_bytes.current += 1; },
      [&](auto& ts, PageTable&, ResidencyPolicy&) { ts.stats.requested_bytes.current -= 1; });
}

}  // namespace
}  // namespace tierkv

namespace tierkv {
namespace {  // the file's unnamed namespace again: its using-declarations above apply

// A 4 KiB-aligned buffer of whole frames.
struct Aligned {
  explicit Aligned(uint64_t bytes) : p(static_cast<std::byte*>(std::aligned_alloc(4096, bytes)), &std::free) {}
  std::unique_ptr<std::byte, decltype(&std::free)> p;
};

// Three pages, one top copy on each tier (Disk in a file under /tmp: not mapped).
struct ThreeTiers {
  TempDir dir;
  std::unique_ptr<MemoryManager> mm = MakeManager({}, dir.path());
  std::vector<PageId> pages;
  std::vector<std::vector<std::byte>> data;
  ThreeTiers() {
    for (Tier t : {Tier::kDevice, Tier::kHost, Tier::kHost}) {
      pages.push_back(mm->Allocate(3000, t).value());
      data.push_back(Pattern(3000, 40 + pages.size()));
      EXPECT_TRUE(WritePage(*mm, pages.back(), t, data.back()).ok());
    }
    EXPECT_TRUE(mm->Demote({pages[2]}, Tier::kDisk).Wait().ok());
  }
};

TEST(MemoryManagerInPlaceTest, PinsPagesWhereTheyLieAndMovesNothing) {
  ThreeTiers f;
  MemoryManager& mm = *f.mm;
  const TierStats dev0 = mm.Stats(Tier::kDevice), host0 = mm.Stats(Tier::kHost), disk0 = mm.Stats(Tier::kDisk);
  std::vector<Pin> pins;
  EXPECT_EQ(mm.AcquireInPlace(f.pages, &pins), 2u);
  ASSERT_EQ(pins.size(), 3u);
  ASSERT_TRUE(pins[0].valid() && pins[1].valid());
  EXPECT_FALSE(pins[2].valid()) << "a page in an O_DIRECT file cannot be read in place";
  EXPECT_EQ(pins[0].tier(), Tier::kDevice);
  EXPECT_EQ(pins[1].tier(), Tier::kHost);
  EXPECT_EQ(std::memcmp(pins[0].data(), f.data[0].data(), 3000), 0);
  EXPECT_EQ(std::memcmp(pins[1].data(), f.data[1].data(), 3000), 0);
  EXPECT_TRUE(Invariants(mm)) << "pinned where its top copy is";
  // Nothing moved, and the counts say where each page was served.
  EXPECT_EQ(mm.TopTier(f.pages[1]), Tier::kHost);
  EXPECT_FALSE(mm.HasCopy(f.pages[1], Tier::kDevice));
  const TierStats dev = mm.Stats(Tier::kDevice), host = mm.Stats(Tier::kHost);
  EXPECT_EQ(dev.hits - dev0.hits, 1u);
  EXPECT_EQ(dev.misses - dev0.misses, 1u);
  EXPECT_EQ(host.hits - host0.hits, 1u);
  EXPECT_EQ(dev.bytes_read - dev0.bytes_read, 3000u);
  EXPECT_EQ(host.bytes_read - host0.bytes_read, 3000u);
  EXPECT_EQ(dev.bytes_in, dev0.bytes_in);
  EXPECT_EQ(mm.Stats(Tier::kDisk).hits, disk0.hits) << "the page it could not pin is not counted";
  // A page pinned in place cannot be evicted: filling the host tier leaves it there.
  for (int i = 0; i < 8; ++i) (void)mm.Allocate(4096, Tier::kHost);
  EXPECT_EQ(mm.TopTier(f.pages[1]), Tier::kHost);
  pins.clear();
  EXPECT_TRUE(Invariants(mm));
}

TEST(MemoryManagerInPlaceTest, ReadThroughCopiesTopCopiesAndLeavesPlacement) {
  ThreeTiers f;
  MemoryManager& mm = *f.mm;
  const TierStats dev0 = mm.Stats(Tier::kDevice), host0 = mm.Stats(Tier::kHost), disk0 = mm.Stats(Tier::kDisk);
  const uint64_t span = mm.FrameSpan(3000);
  EXPECT_EQ(span, 4096u);
  Aligned buf(3 * span);
  std::vector<std::byte*> out;
  for (size_t i = 0; i < 3; ++i) out.push_back(buf.p.get() + i * span);
  ASSERT_TRUE(mm.ReadThrough(f.pages, out).Wait().ok());
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(std::memcmp(out[i], f.data[i].data(), 3000), 0) << i;
  EXPECT_EQ(mm.TopTier(f.pages[2]), Tier::kDisk);
  EXPECT_FALSE(mm.HasCopy(f.pages[2], Tier::kHost)) << "read through, not promoted";
  const TierStats disk = mm.Stats(Tier::kDisk), host = mm.Stats(Tier::kHost), dev = mm.Stats(Tier::kDevice);
  EXPECT_EQ(disk.hits - disk0.hits, 1u);
  EXPECT_EQ(disk.bytes_read - disk0.bytes_read, 3000u);
  EXPECT_EQ(host.misses - host0.misses, 1u);  // the disk page
  EXPECT_EQ(host.hits - host0.hits, 1u);
  EXPECT_EQ(dev.misses - dev0.misses, 2u);   // the host and the disk page
  EXPECT_EQ(disk.bytes_out, disk0.bytes_out) << "no copy between tiers";
  EXPECT_TRUE(Invariants(mm));
}

TEST(MemoryManagerInPlaceTest, MappedDiskArenaIsReadInPlace) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  MemoryManager::Backends b;
  HostBackendOptions host;
  host.bytes = 4 * 4096;
  host.mlock = MlockMode::kOff;
  b[TierIndex(Tier::kHost)] = CreateHostBackend(host).value();
  b[TierIndex(Tier::kDisk)] = CreateDiskBackend({"/dev/shm", 16 * 4096, true, true, true}).value();
  auto mm = MemoryManager::CreateWithBackends(std::move(b), 4096, PolicyKind::kLru).value();
  if (!mm->host_addressable(Tier::kDisk)) GTEST_SKIP() << "/dev/shm is not a memory filesystem here";
  const PageId p = mm->Allocate(4096, Tier::kHost).value();
  const auto data = Pattern(4096, 9);
  ASSERT_TRUE(WritePage(*mm, p, Tier::kHost, data).ok());
  ASSERT_TRUE(mm->Demote({p}, Tier::kDisk).Wait().ok());
  std::vector<Pin> pins;
  ASSERT_EQ(mm->AcquireInPlace(std::span<const PageId>(&p, 1), &pins), 1u);
  EXPECT_EQ(pins[0].tier(), Tier::kDisk);
  EXPECT_EQ(std::memcmp(pins[0].data(), data.data(), 4096), 0);
  EXPECT_EQ(mm->Stats(Tier::kDisk).hits, 1u);
  EXPECT_EQ(mm->Stats(Tier::kHost).misses, 1u);
  EXPECT_FALSE(mm->HasCopy(p, Tier::kHost));
  EXPECT_TRUE(Invariants(*mm));
  pins.clear();
  EXPECT_TRUE(AllCopiesEqual(*mm, p, data));
}

TEST(MemoryManagerInPlaceTest, BackedPagesComeUpOnceThenAreReadInPlace) {
  TempDir dir;
  auto mm = MakeManager({}, dir.path());
  auto source = std::make_shared<PatternSource>(4096);
  const int32_t src = mm->AddSource(source);
  const PageId p = mm->RegisterBacked(4096, src, 5).value();
  std::vector<Pin> pins;
  EXPECT_EQ(mm->AcquireInPlace(std::span<const PageId>(&p, 1), &pins), 0u) << "a backing is not host memory";
  Aligned buf(4096);
  ASSERT_TRUE(mm->ReadThrough({p}, {buf.p.get()}).Wait().ok());
  EXPECT_EQ(std::memcmp(buf.p.get(), Pattern(4096, 5).data(), 4096), 0);
  EXPECT_EQ(source->reads, 1);
  EXPECT_EQ(mm->TopTier(p), Tier::kHost) << "the source is read once";
  EXPECT_EQ(mm->AcquireInPlace(std::span<const PageId>(&p, 1), &pins), 1u);
  EXPECT_EQ(std::memcmp(pins[0].data(), Pattern(4096, 5).data(), 4096), 0);
  pins.clear();
  EXPECT_EQ(source->reads, 1);
  // A corrupt block is an error naming it, and nothing is placed.
  const PageId q = mm->RegisterBacked(4096, src, 6).value();
  source->bad.insert(6);
  const Status st = mm->ReadThrough({q}, {buf.p.get()}).Wait();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("checksum mismatch"), std::string::npos) << st.message();
  EXPECT_FALSE(mm->HasCopy(q, Tier::kHost));
  EXPECT_TRUE(Invariants(*mm));
}

}  // namespace
}  // namespace tierkv

namespace tierkv {
namespace {

// A backed page read through while every host frame is pinned: read from its source
// straight into the caller's buffer, left where it was.
TEST(MemoryManagerBackedTest, ReadThroughWithTheHostFullOfPinsReadsTheSource) {
  testing::TempDir dir;
  testing::SmallTiers s;
  s.device_frames = 0;
  s.host_frames = 2;
  auto mm = testing::MakeManager(s, dir.path());
  std::vector<PageId> held;
  for (int i = 0; i < 2; ++i) {
    held.push_back(mm->Allocate(4096, Tier::kHost).value());
    ASSERT_TRUE(testing::WritePage(*mm, held.back(), Tier::kHost, testing::Pattern(4096, 70 + i)).ok());
  }
  std::vector<Pin> pins;
  ASSERT_EQ(mm->AcquireInPlace(held, &pins), 2u);
  auto source = std::make_shared<PatternSource>(4096);
  const PageId p = mm->RegisterBacked(4096, mm->AddSource(source), 8).value();
  std::unique_ptr<std::byte, decltype(&std::free)> buf(static_cast<std::byte*>(std::aligned_alloc(4096, 4096)), &std::free);
  ASSERT_TRUE(mm->ReadThrough({p}, {buf.get()}).Wait().ok());
  EXPECT_EQ(std::memcmp(buf.get(), testing::Pattern(4096, 8).data(), 4096), 0);
  EXPECT_FALSE(mm->HasCopy(p, Tier::kHost));
  pins.clear();
  EXPECT_TRUE(testing::Invariants(*mm));
}

// Backed pages evicted from the host: dropped (their source is read again) unless the
// source asks to keep them below, then copied to the Disk tier while it has free frames,
// and read from there afterwards.
TEST(MemoryManagerBackedTest, EvictedPagesOfAKeepBelowSourceLandOnDisk) {
  for (bool keep : {false, true}) {
    SCOPED_TRACE(keep ? "keep below" : "drop");
    testing::TempDir dir;
    testing::SmallTiers s;
    s.device_frames = 0;
    s.host_frames = 4;
    auto mm = testing::MakeManager(s, dir.path());
    auto source = std::make_shared<PatternSource>(4096);
    source->keep_below = keep;
    const int32_t src = mm->AddSource(source);
    std::vector<PageId> pages;
    for (uint64_t key = 0; key < 10; ++key) pages.push_back(mm->RegisterBacked(4096, src, key).value());
    for (PageId p : pages) ASSERT_TRUE(mm->Acquire(p, Tier::kHost).ok());
    EXPECT_EQ(source->reads, 10);
    EXPECT_EQ(mm->Stats(Tier::kDisk).pages.current, keep ? 6u : 0u);
    // The evicted pages again: from the disk tier (kept) or from the source.
    for (int i = 0; i < 6; ++i) {
      auto pin = mm->Acquire(pages[static_cast<size_t>(i)], Tier::kHost);
      ASSERT_TRUE(pin.ok()) << pin.status().ToString();
      EXPECT_EQ(std::memcmp(pin->data(), testing::Pattern(4096, static_cast<uint64_t>(i)).data(), 4096), 0);
    }
    EXPECT_EQ(source->reads, keep ? 10 : 16);
    EXPECT_TRUE(testing::Invariants(*mm));
  }
}

}  // namespace
}  // namespace tierkv
