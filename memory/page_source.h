// memory/page_source.h
//
// Read-only backing for pages that live outside the arenas, such as the blocks of a
// saved session file. Registering a backed page costs O(1) and reads nothing; the bytes
// are read, and verified, the first time the page is promoted. A source that finds its
// bytes corrupt returns kCorruption naming the block, and the page stays unpromoted:
// a corrupt block never becomes data.
//
// Thread-safety: ReadPage is called from the copy stream only (one thread at a time).
#pragma once

#include <cstdint>
#include <span>

#include "memory/status.h"

namespace tierkv {

class PageSource {
 public:
  virtual ~PageSource() = default;
  // Fills `out` (the page's frames; out.size() >= the page's bytes) with the page's
  // bytes and verifies them. `key` is what the page was registered with.
  virtual Status ReadPage(uint64_t key, std::span<std::byte> out) = 0;
  // Whether a page evicted from the last tier above the Disk tier is worth a copy there
  // (when the Disk tier has free frames) rather than dropped for a later read of this
  // source: true for a source slower than the disk tier (a session file, each block
  // verified on read), false for one as fast (a mapped model file).
  virtual bool KeepBelow() const { return false; }
};

}  // namespace tierkv
