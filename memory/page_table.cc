// memory/page_table.cc
#include "memory/page_table.h"

#include <cassert>

namespace tierkv {

PageId PageTable::Insert(uint64_t bytes, uint32_t n_frames, uint32_t tag) {
  assert(n_frames > 0);
  uint32_t id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    id = static_cast<uint32_t>(entries_.size());
    entries_.emplace_back();
  }
  PageEntry& e = entries_[id];
  e = PageEntry{};
  e.bytes = bytes;
  e.n_frames = n_frames;
  e.tag = tag;
  ++live_;
  return PageId(id);
}

void PageTable::Erase(PageId p) {
  assert(Contains(p));
  entries_[p.value] = PageEntry{};
  free_ids_.push_back(p.value);
  --live_;
}

bool PageTable::CheckInvariants(std::string* why) const {
  size_t live = 0;
  for (uint32_t i = 0; i < entries_.size(); ++i) {
    const PageEntry& e = entries_[i];
    if (!e.live()) continue;
    ++live;
    const std::string name = "page " + std::to_string(i);
    bool any = e.backed();
    for (const FrameId& f : e.frame) any = any || f.valid();
    if (!any) { *why = name + " is live but has no copy"; return false; }
    if (e.pins > 0 && (!e.has_copy(e.pin_tier) || e.pin_tier != e.top())) {
      *why = name + " is pinned on " + TierName(e.pin_tier) + " but its top copy is on " + TierName(e.top());
      return false;
    }
  }
  if (live != live_) { *why = "live page count " + std::to_string(live_) + " != " + std::to_string(live); return false; }
  return true;
}

}  // namespace tierkv
