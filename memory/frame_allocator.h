// memory/frame_allocator.h
//
// Hands out the frames of one arena. A hierarchical bitmap (bit = frame is free; each
// level summarises 64 words of the level below) makes single-frame Allocate and Free
// O(levels) = O(log64 frames), at most 5 steps for 2^30 frames. Runs of n contiguous
// frames (objects of several frames) are first-fit, O(frames / 64) word steps.
//
// Invariant (CheckInvariants): free_frames() == popcount(level 0), and for every level
// k > 0, bit i of level k is set  <=>  word i of level k-1 is non-zero.
//
// Thread-safety: none; the owner (MemoryManager) serialises access.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "memory/types.h"

namespace tierkv {

class FrameAllocator {
 public:
  explicit FrameAllocator(uint32_t n_frames);

  // One frame, the lowest free index. nullopt when the arena is exhausted.
  std::optional<FrameId> Allocate();
  // n contiguous frames [first, first + n), first-fit. REQUIRES: n >= 1.
  std::optional<FrameId> AllocateRun(uint32_t n);
  // REQUIRES: every frame of [first, first + n) is allocated.
  void Free(FrameId first, uint32_t n = 1);

  bool IsFree(FrameId f) const;
  uint32_t frames() const { return n_frames_; }
  uint32_t free_frames() const { return n_free_; }
  uint32_t used_frames() const { return n_frames_ - n_free_; }

  // Longest run of contiguous free frames. O(frames / 64).
  uint32_t LargestFreeRun() const;
  // Free frames lying in runs shorter than n: the free space a request for n
  // contiguous frames cannot use (external fragmentation). O(frames / 64).
  uint32_t FreeFramesUnusableFor(uint32_t n) const;

  // Whole-structure validation; false on a violation.
  bool CheckInvariants() const;

 private:
  friend class FrameAllocatorTestPeer;  // tests: breaks the bitmap to show the check fails

  // Calls fn(start, length) for every maximal run of free frames, ascending.
  template <typename Fn>
  void ForEachFreeRun(Fn&& fn) const;
  void SetRange(uint32_t first, uint32_t n, bool free);
  void UpdateParents(uint32_t word_index);
  size_t NextSet(size_t k, size_t i) const;

  // First-fit hint per requested run length: no free run of >= n frames starts below
  // hint(n). AllocateRun scans from it and moves it past what it takes; Free lowers it.
  // Without it, an arena fragmented by single frames is rescanned from frame 0.
  uint32_t& RunHint(uint32_t n);
  std::vector<std::pair<uint32_t, uint32_t>> run_hints_;  // (n, hint); a few lengths in practice

  uint32_t n_frames_;
  uint32_t n_free_;
  std::vector<std::vector<uint64_t>> levels_;  // levels_[0]: [ceil(n_frames / 64)]
};

}  // namespace tierkv
