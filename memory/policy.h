// memory/policy.h
//
// Residency policies: which copy to evict from a full tier. Each tier's policy state
// holds the pages that have a copy on that tier; accesses are global to the page.
//   - decayed LFU (default): score(p) = sum over accesses i of 2^(-(now - t_i) / H),
//     H = half_life accesses. A page keeps its score while it has no copy anywhere in
//     the arenas (a backed page dropped to its source), so a returning page competes
//     with its history, not as a newcomer; the score is forgotten when it is freed. Kept as key(p) = sum 2^(t_i / H) (the same order, no
//     per-tick decay pass), in an indexed min-heap per tier; keys are rescaled when
//     the exponent grows large. Access O(log n), victim O(log n).
//   - LRU: an intrusive list per tier. Access O(1), victim O(1).
//   - 2Q (Johnson & Shasha): pages seen once sit in a FIFO (A1in, at most 25% of the
//     tier); pages seen again move to an LRU (Am); a ghost list of recently evicted ids
//     (A1out) sends a returning page straight to Am. Scan-resistant.
// PickVictims never returns a page the caller's filter rejects (pinned, in flight,
// or the last copy on the last tier), and leaves the policy's order unchanged.
//
// Thread-safety: none; MemoryManager calls it under its mutex.
#pragma once

#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "memory/status.h"
#include "memory/types.h"

namespace tierkv {

enum class PolicyKind { kDecayedLfu, kLru, kTwoQ };
Result<PolicyKind> ParsePolicyKind(std::string_view text);  // "lfu" | "lru" | "2q"
const char* PolicyName(PolicyKind kind);

struct PolicyOptions {
  // Decayed LFU half-life in accesses (all pages together). Short: reacts fast to a
  // change of working set; long: protects pages that are hot on average.
  double half_life = 4096;
  // 2Q: share of a tier's pages kept in the A1in FIFO, and ghost list length as a
  // multiple of the tier's page count.
  double twoq_in_share = 0.25;
  double twoq_ghost_factor = 0.5;
};

class ResidencyPolicy {
 public:
  virtual ~ResidencyPolicy() = default;
  virtual PolicyKind kind() const = 0;

  // p gained / lost its copy on tier t. REQUIRES: OnInsert only when absent, OnRemove
  // only when present.
  virtual void OnInsert(Tier t, PageId p) = 0;
  virtual void OnRemove(Tier t, PageId p) = 0;
  // p was freed (its id may be reused): forget its history.
  virtual void OnFree(PageId p) {}
  // p was used (counts for every tier p is on).
  virtual void OnAccess(PageId p) = 0;
  // Appends to *out up to `max` pages of tier t, best victim first, among those for
  // which accept(p) is true.
  virtual void PickVictims(Tier t, size_t max, const std::function<bool(PageId)>& accept,
                           std::vector<PageId>* out) = 0;
  // Number of pages the policy tracks on tier t (for invariant checks).
  virtual size_t Size(Tier t) const = 0;
};

std::unique_ptr<ResidencyPolicy> CreatePolicy(PolicyKind kind, const PolicyOptions& options = {});

}  // namespace tierkv
