// memory/frame_allocator.cc
#include "memory/frame_allocator.h"

#include <bit>
#include <cassert>
#include <cstdint>

namespace tierkv {

FrameAllocator::FrameAllocator(uint32_t n_frames) : n_frames_(n_frames), n_free_(n_frames) {
  size_t words = (static_cast<size_t>(n_frames) + 63) / 64;
  levels_.emplace_back(words, ~uint64_t{0});
  if (n_frames % 64 != 0 && words > 0) levels_[0].back() = (uint64_t{1} << (n_frames % 64)) - 1;
  while (levels_.back().size() > 1) {
    const auto& below = levels_.back();
    std::vector<uint64_t> level((below.size() + 63) / 64, 0);
    for (size_t i = 0; i < below.size(); ++i) {
      if (below[i] != 0) level[i / 64] |= uint64_t{1} << (i % 64);
    }
    levels_.push_back(std::move(level));
  }
}

std::optional<FrameId> FrameAllocator::Allocate() {
  if (n_free_ == 0) return std::nullopt;
  // Descend from the top: at each level the first set bit names the child word.
  size_t index = 0;
  for (size_t k = levels_.size(); k-- > 0;) {
    const uint64_t word = levels_[k][index];
    assert(word != 0);
    index = index * 64 + static_cast<size_t>(std::countr_zero(word));
  }
  const auto frame = static_cast<uint32_t>(index);
  SetRange(frame, 1, /*free=*/false);
  return FrameId(frame);
}

template <typename Fn>
void FrameAllocator::ForEachFreeRun(Fn&& fn) const {
  const auto& bits = levels_[0];
  uint32_t run_start = 0, run_len = 0;
  for (size_t w = 0; w < bits.size(); ++w) {
    uint64_t word = bits[w];
    const uint32_t base = static_cast<uint32_t>(w * 64);
    if (word == ~uint64_t{0}) {  // all free: extend the run
      if (run_len == 0) run_start = base;
      run_len += 64;
      continue;
    }
    uint32_t pos = 0;
    while (pos < 64) {
      const uint64_t rest = word >> pos;
      if (rest == 0) {  // no more free bits in this word: close the run
        if (run_len) { if (!fn(run_start, run_len)) return; run_len = 0; }
        break;
      }
      const int zeros = std::countr_zero(rest);  // used frames first
      if (zeros > 0) {
        if (run_len) { if (!fn(run_start, run_len)) return; run_len = 0; }
        pos += static_cast<uint32_t>(zeros);
        continue;
      }
      const int ones = std::countr_one(rest);
      if (run_len == 0) run_start = base + pos;
      run_len += static_cast<uint32_t>(ones);
      pos += static_cast<uint32_t>(ones);
    }
  }
  if (run_len) fn(run_start, run_len);
}

// Smallest j >= i whose bit is set on level k (k >= 1: bit j <=> word j of level k-1 is
// non-zero), or SIZE_MAX. O(levels): climbs while the rest of a word is empty.
size_t FrameAllocator::NextSet(size_t k, size_t i) const {
  const auto& level = levels_[k];
  size_t w = i / 64;
  if (w >= level.size()) return SIZE_MAX;
  const uint64_t m = level[w] & (~uint64_t{0} << (i % 64));
  if (m != 0) return w * 64 + static_cast<size_t>(std::countr_zero(m));
  if (k + 1 >= levels_.size()) return SIZE_MAX;  // the top level is a single word
  w = NextSet(k + 1, w + 1);
  return w == SIZE_MAX ? SIZE_MAX : w * 64 + static_cast<size_t>(std::countr_zero(level[w]));
}

std::optional<FrameId> FrameAllocator::AllocateRun(uint32_t n) {
  assert(n >= 1);
  if (n == 1) return Allocate();
  if (n > n_free_) return std::nullopt;
  uint32_t& hint = RunHint(n);
  const auto& bits = levels_[0];
  const size_t words = bits.size();
  uint32_t run_start = 0, run_len = 0;  // free run ending at the current word's start
  std::optional<FrameId> found;
  size_t w = hint / 64;  // no run of >= n frames starts below the hint
  while (w < words) {
    const uint64_t word = bits[w];
    const uint32_t base = static_cast<uint32_t>(w * 64);
    if (word == 0) {  // all used: jump to the next word with a free frame (level 1)
      run_len = 0;
      w = levels_.size() > 1 ? NextSet(1, w + 1) : w + 1;
      continue;
    }
    if (run_len > 0) {  // extend the run carried from the words below
      const uint32_t lead = static_cast<uint32_t>(std::countr_one(word));
      if (run_len + lead >= n) { found = FrameId(run_start); break; }
      if (lead == 64) { run_len += 64; ++w; continue; }
      run_len = 0;
    }
    if (n <= 64) {  // y bit i set <=> frames [base + i, base + i + n) are free
      uint64_t y = word;
      uint32_t have = 1;
      while (have < n && y != 0) {
        const uint32_t s = std::min(have, n - have);
        y &= y >> s;
        have += s;
      }
      if (y != 0) { found = FrameId(base + static_cast<uint32_t>(std::countr_zero(y))); break; }
    }
    const uint32_t top = static_cast<uint32_t>(std::countl_one(word));  // free run to the word's end
    run_len = top;
    run_start = base + 64 - top;
    ++w;
  }
  if (found && found->value + n > n_frames_) found.reset();  // bits past the end are never set
  if (found) {
    SetRange(found->value, n, /*free=*/false);
    hint = found->value + n;  // nothing below was long enough, and [found, found + n) is taken
  } else {
    hint = n_frames_;
  }
  return found;
}

void FrameAllocator::Free(FrameId first, uint32_t n) {
  assert(first.valid() && first.value + n <= n_frames_);
  SetRange(first.value, n, /*free=*/true);
  // A run of >= m frames that includes a freed frame starts at or after first - m + 1
  // (or at or after the old hint, if it already existed): lower the hints accordingly.
  for (auto& [m, hint] : run_hints_) {
    const uint32_t lowest = first.value + 1 >= m ? first.value + 1 - m : 0;
    hint = std::min(hint, lowest);
  }
}

uint32_t& FrameAllocator::RunHint(uint32_t n) {
  for (auto& [m, hint] : run_hints_) if (m == n) return hint;
  run_hints_.push_back({n, 0});
  return run_hints_.back().second;
}

bool FrameAllocator::IsFree(FrameId f) const {
  assert(f.value < n_frames_);
  return (levels_[0][f.value / 64] >> (f.value % 64)) & 1;
}

void FrameAllocator::SetRange(uint32_t first, uint32_t n, bool free) {
  uint32_t pos = first;
  const uint32_t end = first + n;
  while (pos < end) {
    const uint32_t w = pos / 64, bit = pos % 64;
    const uint32_t take = std::min<uint32_t>(64 - bit, end - pos);
    const uint64_t mask = (take == 64 ? ~uint64_t{0} : ((uint64_t{1} << take) - 1)) << bit;
    uint64_t& word = levels_[0][w];
    const bool was_empty = word == 0;
    if (free) {
      assert((word & mask) == 0 && "double free of a frame");
      word |= mask;
      n_free_ += take;
    } else {
      assert((word & mask) == mask && "allocating a used frame");
      word &= ~mask;
      n_free_ -= take;
    }
    if (was_empty != (word == 0)) UpdateParents(w);
    pos += take;
  }
}

void FrameAllocator::UpdateParents(uint32_t word_index) {
  size_t index = word_index;
  for (size_t k = 1; k < levels_.size(); ++k) {
    const bool child_nonzero = levels_[k - 1][index] != 0;
    uint64_t& parent = levels_[k][index / 64];
    const bool was_nonzero = parent != 0;
    const uint64_t bit = uint64_t{1} << (index % 64);
    parent = child_nonzero ? (parent | bit) : (parent & ~bit);
    if (was_nonzero == (parent != 0)) break;  // summary above is unchanged
    index /= 64;
  }
}

uint32_t FrameAllocator::LargestFreeRun() const {
  uint32_t best = 0;
  ForEachFreeRun([&](uint32_t, uint32_t len) { best = std::max(best, len); return true; });
  return best;
}

uint32_t FrameAllocator::FreeFramesUnusableFor(uint32_t n) const {
  uint32_t unusable = 0;
  ForEachFreeRun([&](uint32_t, uint32_t len) { if (len < n) unusable += len; return true; });
  return unusable;
}

bool FrameAllocator::CheckInvariants() const {
  uint64_t count = 0;
  for (uint64_t w : levels_[0]) count += static_cast<uint64_t>(std::popcount(w));
  bool ok = count == n_free_;
  if (!levels_[0].empty() && n_frames_ % 64 != 0) {
    ok = ok && (levels_[0].back() >> (n_frames_ % 64)) == 0;  // no bits past the end
  }
  for (size_t k = 1; k < levels_.size(); ++k) {
    for (size_t i = 0; i < levels_[k - 1].size(); ++i) {
      const bool bit = (levels_[k][i / 64] >> (i % 64)) & 1;
      ok = ok && bit == (levels_[k - 1][i] != 0);
    }
  }
  return ok;
}

}  // namespace tierkv
