// memory/page_table.h
//
// PageId -> (copies per tier, state, pins, access statistics). A page may hold a copy
// on several tiers at once: promotion keeps the copy below (so a later eviction of a
// clean page is a drop, not a copy); a write discards every copy but the top one.
//
// A page may also be backed by a read-only PageSource (a session file's block): the
// backing counts as Disk-tier data without a Disk frame, is read (and verified) on
// promotion, and is forgotten when the page is written.
//
// Invariants (PageTable::CheckInvariants; MemoryManager adds the frame accounting):
//   live(p)                      => p has data somewhere (a frame copy, or its backing)
//   pinned(p)                    => p has a copy on pin_tier(p) and pin_tier(p) == top(p)
//   dirty(p) := no copy below top(p) and top(p) != Disk    (derived, never stored)
//   in_flight(p)                 => the migration stream owns p's frames until it is done
//
// Thread-safety: none; MemoryManager guards it with its mutex.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "memory/types.h"

namespace tierkv {

enum class PageState : uint8_t { kResident, kInFlight };

struct PageEntry {
  uint64_t bytes = 0;        // bytes asked for (<= n_frames * frame_bytes)
  uint32_t n_frames = 0;     // contiguous frames per copy; 0 = the id is free
  uint32_t tag = 0;          // caller's kind of page (KV block, expert), for reports
  std::array<FrameId, kNumTiers> frame{};  // valid => a copy on that tier
  uint32_t pins = 0;
  Tier pin_tier = Tier::kHost;
  PageState state = PageState::kResident;
  Tier flight_to = Tier::kHost;  // in flight: the tier its top copy will be on when the move lands
  int32_t source = -1;       // index of the backing PageSource, -1 = not backed
  uint64_t source_key = 0;   // the page's key within its source
  uint64_t accesses = 0;     // lifetime uses
  uint64_t last_access = 0;  // access tick of the last use
  // Access tick + 1 when a prefetch last brought or confirmed the page on its top tier;
  // 0 once used (or never prefetched). Eviction spares such pages for a while.
  uint64_t prefetched_at = 0;

  bool live() const { return n_frames != 0; }
  bool backed() const { return source >= 0; }
  // A frame copy on tier t (what the frame accounting counts).
  bool has_copy(Tier t) const { return frame[TierIndex(t)].valid(); }
  // Valid data on tier t: a frame copy, or for Disk the backing.
  bool has_data(Tier t) const { return has_copy(t) || (t == Tier::kDisk && backed()); }
  // Fastest tier holding data. REQUIRES: live().
  Tier top() const {
    for (int t = 0; t < kNumTiers; ++t) if (has_data(TierAt(t))) return TierAt(t);
    return Tier::kDisk;
  }
  bool has_copy_below(Tier t) const {
    for (int i = TierIndex(t) + 1; i < kNumTiers; ++i) if (has_data(TierAt(i))) return true;
    return false;
  }
  bool dirty() const { return top() != Tier::kDisk && !has_copy_below(top()); }
  bool in_flight() const { return state == PageState::kInFlight; }
};

class PageTable {
 public:
  PageId Insert(uint64_t bytes, uint32_t n_frames, uint32_t tag);  // reuses freed ids
  void Erase(PageId p);
  PageEntry& at(PageId p) { return entries_[p.value]; }
  const PageEntry& at(PageId p) const { return entries_[p.value]; }
  bool Contains(PageId p) const { return p.valid() && p.value < entries_.size() && entries_[p.value].live(); }
  size_t live_pages() const { return live_; }
  size_t capacity() const { return entries_.size(); }

  template <typename Fn>
  void ForEachLive(Fn&& fn) const {
    for (uint32_t i = 0; i < entries_.size(); ++i) if (entries_[i].live()) fn(PageId(i), entries_[i]);
  }

  // Checks the per-entry invariants above; on failure writes the first violation.
  bool CheckInvariants(std::string* why) const;

 private:
  std::vector<PageEntry> entries_;  // [ids ever issued]
  std::vector<uint32_t> free_ids_;  // LIFO: recently freed ids are warm in cache
  size_t live_ = 0;
};

}  // namespace tierkv
