// memory/memory_manager.h
//
// The tiered page memory: one arena per tier (Device, Host, Disk) cut into frames, the
// page table, the residency policy, and migration on a copy stream. KV blocks and
// expert weights are both pages here and share one budget per tier.
//
// Model. A page is `bytes` long and occupies a run of n = ceil(bytes / frame_bytes)
// contiguous frames wherever it has a copy. Copies move only between adjacent present
// tiers (Device <-> Host <-> Disk); the Host arena is the host side of every copy, so
// a page goes Disk -> Host -> Device and back. Promotion keeps the copy below (a later
// eviction of the clean page is then a drop); Acquire(..., kWrite) discards the copies
// below, since they are about to be stale. A full tier evicts the policy's victims:
// clean copies are dropped, dirty ones demoted one tier down (recursively making room
// there); the last tier can only drop copies that also exist above.
//
// Concurrency. Every operation that allocates frames or copies bytes runs on the copy
// stream (one worker), planned and applied under mu_ with the copies themselves done
// outside it; pages being moved are in flight and other threads wait for them.
// Acquire of a page already on the tier (a hit) never touches the stream.
// A failed copy leaves every page valid where it was and reports the error.
//
// Invariants (CheckInvariants):
//   for each tier t: used_frames(t) == sum of n_frames over copies on t + pending(t)
//   no frame is held by two copies; every held frame is allocated
//   pinned(p) => resident(p, pin_tier(p)) and pin_tier(p) == top(p)
//   policy.Size(t) == number of copies on t
//   gauges == sums over copies
//
// Thread-safety: all public methods are thread-safe. Pins must be released before the
// MemoryManager is destroyed.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "memory/frame_allocator.h"
#include "memory/page_source.h"
#include "memory/page_table.h"
#include "memory/policy.h"
#include "memory/stats.h"
#include "memory/status.h"
#include "memory/stream.h"
#include "memory/tier_backend.h"

namespace tierkv {

enum class DeviceKind { kNone, kSim, kCuda };
Result<DeviceKind> ParseDeviceKind(std::string_view text);  // "none" | "sim" | "cuda"

struct MemoryOptions {
  // Frame size: 64 KiB .. 4 MiB, a multiple of 4 KiB. Small frames waste less in the
  // last block of a sequence; large frames make fewer, larger copies.
  uint64_t frame_bytes = 256 * kKiB;
  DeviceKind device = DeviceKind::kNone;
  uint64_t device_bytes = 0;
  double sim_gbps = 0;                 // --device sim copy bandwidth; 0 = unthrottled
  uint64_t host_bytes = 256 * kMiB;    // the Host tier is always present
  uint64_t disk_bytes = 0;             // 0 = no Disk tier
  std::string disk_dir = "/tmp";
  bool direct_io = true;               // O_DIRECT where the filesystem accepts it
  MlockMode mlock = MlockMode::kTry;
  bool warmup = true;                  // reserve and touch every arena at start-up
  PolicyKind policy = PolicyKind::kDecayedLfu;
  PolicyOptions policy_options;
};

enum class Access { kRead, kWrite };

class MemoryManager;

// Keeps a page resident on one tier while it is used. Move-only; releases on
// destruction. data() is a pointer in the tier's compute address space (a device
// pointer for CUDA), valid until the pin is released.
class Pin {
 public:
  Pin() = default;
  Pin(Pin&& o) noexcept { *this = std::move(o); }
  Pin& operator=(Pin&& o) noexcept;
  Pin(const Pin&) = delete;
  Pin& operator=(const Pin&) = delete;
  ~Pin() { Release(); }

  bool valid() const { return mm_ != nullptr; }
  PageId page() const { return page_; }
  Tier tier() const { return tier_; }
  std::byte* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  // Whether the Acquire that made this pin found the page on its tier (a hit, possibly
  // after waiting for a prefetch in flight) rather than copying it there (a miss).
  bool hit() const { return hit_; }
  void Release();

 private:
  friend class MemoryManager;
  Pin(MemoryManager* mm, PageId page, Tier tier, std::byte* data, uint64_t bytes, bool hit)
      : mm_(mm), page_(page), tier_(tier), data_(data), bytes_(bytes), hit_(hit) {}
  MemoryManager* mm_ = nullptr;
  PageId page_;
  Tier tier_ = Tier::kHost;
  std::byte* data_ = nullptr;
  uint64_t bytes_ = 0;
  bool hit_ = false;
};

class MemoryManager {
 public:
  using Backends = std::array<std::unique_ptr<TierBackend>, kNumTiers>;

  // Builds the tiers the options ask for (warmup, mlock) and the policy.
  static Result<std::unique_ptr<MemoryManager>> Create(const MemoryOptions& options);
  // The frame sizes Create accepts: 64 KiB .. 4 MiB, a multiple of 4 KiB.
  static Status CheckFrameBytes(uint64_t frame_bytes);
  // Tests and tools: tiers from caller-made backends (for instance wrapped in a
  // FaultyBackend); a null entry is an absent tier. REQUIRES: a Host backend.
  static Result<std::unique_ptr<MemoryManager>> CreateWithBackends(Backends backends, uint64_t frame_bytes,
                                                                   PolicyKind policy,
                                                                   const PolicyOptions& policy_options = {});
  ~MemoryManager();
  MemoryManager(const MemoryManager&) = delete;
  MemoryManager& operator=(const MemoryManager&) = delete;

  bool has_tier(Tier t) const { return tiers_[TierIndex(t)].backend != nullptr; }
  // Where compute reads pages: Device when present, else Host.
  Tier compute_tier() const { return has_tier(Tier::kDevice) ? Tier::kDevice : Tier::kHost; }
  uint64_t frame_bytes() const { return frame_bytes_; }
  // True when pins on tier t hand out host pointers (Host, sim Device), so CPU code
  // can read and write the page in place.
  bool host_addressable(Tier t) const { return has_tier(t) && tiers_[TierIndex(t)].backend->base() != nullptr; }
  // Whether p lies in tier t's arena (host or device address space): pins on t hand out
  // pointers there. False for a tier without an arena address (a disk tier read through).
  bool InArena(Tier t, const void* p) const;
  PolicyKind policy_kind() const { return policy_->kind(); }

  // A new page of `bytes` with its only copy on `tier` (dirty; contents unspecified),
  // evicting other pages if the tier is full.
  Result<PageId> Allocate(uint64_t bytes, Tier tier, uint32_t tag = 0);
  // Backed pages (lazy restore): registers `source` once, then one page per block.
  // O(1) each, reads nothing; the page's data is the source's until it is written.
  int32_t AddSource(std::shared_ptr<PageSource> source);
  Result<PageId> RegisterBacked(uint64_t bytes, int32_t source, uint64_t key, uint32_t tag = 0);
  // `count` backed pages with keys first_key, first_key + 1, ... under one lock.
  Result<std::vector<PageId>> RegisterBackedRange(uint64_t bytes, int32_t source, uint64_t first_key, uint64_t count,
                                                  uint32_t tag = 0);
  // Releases every copy. REQUIRES: not pinned (else kFailedPrecondition).
  Status Free(PageId page);

  // Makes `tier` the page's top copy (promoting or demoting as needed) and pins it
  // there. kWrite also discards the copies below. Counts a hit or a miss on `tier`.
  Result<Pin> Acquire(PageId page, Tier tier, Access access = Access::kRead);
  // Acquire's hit path alone: pins the page if its top copy is on `tier` and no move of
  // it is in flight (counted as a hit), else returns an empty Pin and changes nothing
  // (the caller then calls Acquire, which copies it or says why it cannot). Never
  // waits, never touches the stream.
  Pin TryAcquire(PageId page, Tier tier, Access access = Access::kRead);
  // TryAcquire of a whole set under one lock, all or nothing: the pins in `pages` order
  // when every page is on `tier` and not in flight (each counted as a hit), else an
  // empty vector and no change.
  std::vector<Pin> TryAcquireAll(std::span<const PageId> pages, Tier tier, Access access = Access::kRead);
  // Compute where the pages are. For each page whose top copy lies on a tier that hands
  // out host pointers (Host, sim Device, a mapped Disk arena) and that is not in flight
  // or pinned on another tier, (*out)[i] pins it there: the CPU reads it in place and
  // nothing moves. (*out)[i] stays empty for the others (an O_DIRECT Disk file, only in
  // its backing, on a CUDA device); the caller reads those with ReadThrough. One lock
  // for the whole set. Counts a hit on the tier read and a miss on each present tier
  // above it; returns how many pages were pinned.
  size_t AcquireInPlace(std::span<const PageId> pages, std::vector<Pin>* out);
  // Asynchronous copies of the pages' top copies (any tier) into out[i], changing no
  // placement: for pages AcquireInPlace could not pin, read once per use instead of
  // promoted (a scan larger than the fast tiers would otherwise evict what it is about
  // to read). A page only in its backing (a lazily restored session) is first brought to
  // the Host tier, as Acquire would, so that its source is read once (read from the
  // source straight into out[i] when the Host tier has no room). The pages are in
  // flight meanwhile. Counted like AcquireInPlace. REQUIRES: each out[i] is 4 KiB-aligned
  // with room for the page's whole frames (FrameSpan).
  Ticket ReadThrough(std::vector<PageId> pages, std::vector<std::byte*> out);
  // Bytes a copy of a page of `bytes` occupies: whole frames.
  uint64_t FrameSpan(uint64_t bytes) const { return (bytes + frame_bytes_ - 1) / frame_bytes_ * frame_bytes_; }
  // Asynchronous promotion of a batch to `tier` (gathered copies per tier step).
  // Pages already on `tier` or above, and pinned pages, are left as they are; when that
  // is every page the call returns a ready ticket without waking the stream.
  // urgent: the caller is about to wait for these pages (a demand miss issued early),
  // so the copies overtake speculative prefetches still queued.
  Ticket Prefetch(std::vector<PageId> pages, Tier tier, bool urgent = false);
  // Asynchronous demotion: the pages' top copy ends on `tier` (copied down where no
  // valid copy exists below, upper copies dropped). Pinned pages are left alone.
  Ticket Demote(std::vector<PageId> pages, Tier tier);

  // Copies the page's copy on `tier` into out (for verification; changes no state).
  // REQUIRES: out.size() <= page bytes.
  Status ReadCopy(PageId page, Tier tier, std::span<std::byte> out);
  // A frame copy on `tier`, or for Disk also the backing.
  bool HasCopy(PageId page, Tier tier) const;
  std::optional<Tier> TopTier(PageId page) const;
  // The page's top copy is on `tier`, or a move of it to `tier` is in flight (a prefetch
  // that will land there): an Acquire now would not start a copy of its own. A page in
  // flight elsewhere (demoted from `tier`, or promoted to another) is not.
  bool ResidentOrArriving(PageId page, Tier tier) const;
  size_t live_pages() const;

  TierStats Stats(Tier tier) const;
  // Seconds the copy stream has spent on this manager's tasks (allocation that evicts,
  // eviction and copies), since creation: the copy side of the pipeline, for overlap
  // accounting. A task's time is added before its ticket completes, so whoever waited
  // for a task sees it counted.
  double copy_busy_seconds() const {
    return static_cast<double>(copy_busy_ns_.load(std::memory_order_acquire)) * 1e-9;
  }
  // Tasks ever queued on the copy stream (counted when queued).
  uint64_t copy_tasks() const { return copy_tasks_.load(std::memory_order_relaxed); }
  // Whole-structure validation (expensive: O(pages + frames)); false + why on failure.
  bool CheckInvariants(std::string* why = nullptr) const;

 private:
  struct TierState {
    std::unique_ptr<TierBackend> backend;
    std::unique_ptr<FrameAllocator> frames;
    TierStats stats;
    uint64_t pending_frames = 0;  // allocated for copies not yet applied
  };
  struct Move {
    PageId page;
    FrameId upper;  // frame on the upper tier of the pair
    FrameId lower;  // frame on the lower tier
  };
  using Lock = std::unique_lock<std::mutex>;

  MemoryManager(Backends backends, uint64_t frame_bytes, PolicyKind policy, const PolicyOptions& options);

  // Runs fn(lock) on the copy stream with mu_ held and waits for its status; the
  // caller is blocked, so the task is urgent (it overtakes queued prefetches).
  Status RunOnStream(std::function<Status(Lock&)> fn);
  // Prefetch (promote) or Demote: the batch, deduplicated, on the copy stream.
  Ticket MoveAsync(std::vector<PageId> pages, Tier tier, bool promote, bool urgent = false);
  Ticket RunOnStreamAsync(std::function<Status(Lock&)> fn, bool urgent = false);

  // --- copy-stream side; REQUIRE: on the stream, lock held (released during copies).
  Status PromoteLocked(Lock& lock, std::vector<PageId> pages, Tier to);
  Status DemoteLocked(Lock& lock, std::vector<PageId> pages, Tier to);
  Status AllocateFramesLocked(Lock& lock, Tier t, const std::vector<PageId>& pages, std::vector<FrameId>* out);
  Status EvictLocked(Lock& lock, Tier t, uint64_t want_frames);
  // Reads backed pages batch[which[i]] from their sources into their new frames on dst.
  Status ReadFromSourcesLocked(Lock& lock, Tier dst, const std::vector<PageId>& batch,
                               const std::vector<FrameId>& frames, const std::vector<size_t>& which,
                               std::vector<bool>* landed);
  // Copies between tier `upper` and the next present tier below; up = towards upper.
  Status CopyLocked(Lock& lock, Tier upper, bool up, const std::vector<Move>& moves);

  // --- bookkeeping; REQUIRE: mu_ held.
  std::optional<Tier> Below(Tier t) const;
  std::optional<Tier> Above(Tier t) const;
  void AddCopy(PageId p, Tier t, FrameId f);
  void DropCopy(PageId p, Tier t);
  // Marks pages in flight (the stream owns their frames) or landed. `to`: the tier each
  // page's top copy will be on when the move lands; none = where it is now (a read).
  void SetInFlight(const std::vector<PageId>& pages, bool in_flight, std::optional<Tier> to = std::nullopt);
  void WaitNotInFlight(Lock& lock, PageId p);
  std::byte* FrameAddress(Tier t, FrameId f) const;
  void ReleasePin(PageId p);
  // Pins page p where its top copy is. REQUIRES: mu_ held, e.top() == tier, not pinned
  // on another tier, not in flight.
  Pin PinHereLocked(PageId p, PageEntry& e, Tier tier, Access access, bool hit);
  // Whether an acquire of `page` on `tier` would be a hit: its top copy is there, no move
  // of it is in flight, and it is not pinned on another tier. REQUIRES: mu_ held.
  bool HitLocked(PageId page, Tier tier) const;
  // An access that wanted a page on `wanted` and found it on `served` (nullopt: only in
  // its backing): a miss on each present tier from `wanted` down to above `served`, a
  // hit and `bytes` read on `served`. REQUIRES: mu_ held.
  void CountAccessLocked(Tier wanted, std::optional<Tier> served, uint64_t bytes);
  // Prefetched pages that reached `tier` (or above) are spared by eviction until used
  // (EvictLocked). REQUIRES: mu_ held.
  void MarkPrefetchedLocked(const std::vector<PageId>& pages, Tier tier);

  friend class Pin;
  friend class MemoryManagerTestPeer;  // tests: breaks the accounting to show the check fails

  std::atomic<uint64_t> copy_busy_ns_{0};
  std::atomic<uint64_t> copy_tasks_{0};
  const uint64_t frame_bytes_;
  mutable std::mutex mu_;
  std::condition_variable in_flight_cv_;  // signalled when pages leave the in-flight state
  std::atomic<uint64_t> landed_{0};       // bumped with it, for spinning waiters
  std::array<TierState, kNumTiers> tiers_;  // GUARDED_BY(mu_) (backends: stream only)
  PageTable table_;                          // GUARDED_BY(mu_)
  std::unique_ptr<ResidencyPolicy> policy_;  // GUARDED_BY(mu_)
  std::vector<std::shared_ptr<PageSource>> sources_;  // GUARDED_BY(mu_)
  uint64_t access_tick_ = 0;                 // GUARDED_BY(mu_)
  uint32_t max_page_frames_ = 1;             // GUARDED_BY(mu_)
  bool host_registered_ = false;
  std::unique_ptr<Stream> stream_;  // last: destroyed (joined) first
};

}  // namespace tierkv
