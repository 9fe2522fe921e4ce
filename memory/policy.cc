// memory/policy.cc
#include "memory/policy.h"

#include <cassert>
#include <cmath>
#include <iterator>
#include <list>
#include <unordered_map>

namespace tierkv {

Result<PolicyKind> ParsePolicyKind(std::string_view text) {
  if (text == "lfu" || text == "decayed-lfu") return PolicyKind::kDecayedLfu;
  if (text == "lru") return PolicyKind::kLru;
  if (text == "2q") return PolicyKind::kTwoQ;
  return Status::InvalidArgument("unknown residency policy '" + std::string(text) + "' (lfu, lru, 2q)");
}

const char* PolicyName(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kDecayedLfu: return "lfu";
    case PolicyKind::kLru: return "lru";
    case PolicyKind::kTwoQ: return "2q";
  }
  return "?";
}

namespace {

constexpr int32_t kAbsent = -1;

template <typename T>
void GrowTo(std::vector<T>& v, size_t n, T fill) {
  if (v.size() < n) v.resize(std::max(n, v.size() * 2), fill);
}

// ---------------------------------------------------------------------------------
// Intrusive doubly linked list of pages, one per (tier, queue). Head = most recent.
class PageList {
 public:
  bool Contains(PageId p) const { return p.value < prev_.size() && in_[p.value]; }
  void PushFront(PageId p) {
    Grow(p);
    assert(!in_[p.value]);
    in_[p.value] = 1;
    prev_[p.value] = kAbsent;
    next_[p.value] = head_;
    if (head_ != kAbsent) prev_[head_] = static_cast<int32_t>(p.value);
    head_ = static_cast<int32_t>(p.value);
    if (tail_ == kAbsent) tail_ = head_;
    ++size_;
  }
  void Remove(PageId p) {
    assert(Contains(p));
    const int32_t pr = prev_[p.value], nx = next_[p.value];
    if (pr != kAbsent) next_[pr] = nx; else head_ = nx;
    if (nx != kAbsent) prev_[nx] = pr; else tail_ = pr;
    in_[p.value] = 0;
    --size_;
  }
  void MoveToFront(PageId p) { Remove(p); PushFront(p); }
  size_t size() const { return size_; }
  // Walks from the tail (least recent) towards the head.
  template <typename Fn>
  void WalkFromTail(Fn&& fn) const {
    for (int32_t i = tail_; i != kAbsent; i = prev_[i]) {
      if (!fn(PageId(static_cast<uint32_t>(i)))) return;
    }
  }

 private:
  void Grow(PageId p) {
    const size_t n = static_cast<size_t>(p.value) + 1;
    GrowTo(prev_, n, kAbsent);
    GrowTo(next_, n, kAbsent);
    GrowTo<uint8_t>(in_, n, 0);
  }
  std::vector<int32_t> prev_, next_;  // [pages]
  std::vector<uint8_t> in_;           // [pages]
  int32_t head_ = kAbsent, tail_ = kAbsent;
  size_t size_ = 0;
};

// ---------------------------------------------------------------------------------
class LruPolicy final : public ResidencyPolicy {
 public:
  PolicyKind kind() const override { return PolicyKind::kLru; }
  void OnInsert(Tier t, PageId p) override { lists_[TierIndex(t)].PushFront(p); }
  void OnRemove(Tier t, PageId p) override { lists_[TierIndex(t)].Remove(p); }
  void OnAccess(PageId p) override {
    for (auto& l : lists_) if (l.Contains(p)) l.MoveToFront(p);
  }
  void PickVictims(Tier t, size_t max, const std::function<bool(PageId)>& accept,
                   std::vector<PageId>* out) override {
    size_t n = 0;
    lists_[TierIndex(t)].WalkFromTail([&](PageId p) {
      if (n < max && accept(p)) { out->push_back(p); ++n; }
      return n < max;
    });
  }
  size_t Size(Tier t) const override { return lists_[TierIndex(t)].size(); }

 private:
  PageList lists_[kNumTiers];
};

// ---------------------------------------------------------------------------------
class DecayedLfuPolicy final : public ResidencyPolicy {
 public:
  explicit DecayedLfuPolicy(double half_life) : inv_half_life_(1.0 / half_life) {}

  PolicyKind kind() const override { return PolicyKind::kDecayedLfu; }

  void OnInsert(Tier t, PageId p) override {
    GrowTo(key_, static_cast<size_t>(p.value) + 1, 0.0);
    GrowTo<uint8_t>(tiers_, static_cast<size_t>(p.value) + 1, 0);
    // A page arriving from outside the arenas counts as accessed once now, on top of
    // what it earned before it was dropped (0 for a new page).
    if (tiers_[p.value] == 0) key_[p.value] += Weight();
    tiers_[p.value] |= static_cast<uint8_t>(1u << TierIndex(t));
    heaps_[TierIndex(t)].Push(p, key_);
  }
  void OnRemove(Tier t, PageId p) override {
    heaps_[TierIndex(t)].Erase(p, key_);
    tiers_[p.value] &= static_cast<uint8_t>(~(1u << TierIndex(t)));
  }
  void OnFree(PageId p) override {
    if (p.value < key_.size()) key_[p.value] = 0.0;
  }
  void OnAccess(PageId p) override {
    if (p.value >= tiers_.size() || tiers_[p.value] == 0) return;
    key_[p.value] += Weight();
    ++now_;
    for (int t = 0; t < kNumTiers; ++t) {
      if (tiers_[p.value] & (1u << t)) heaps_[t].Increased(p, key_);
    }
    // Exponent relative to the last rescale (keys are stored divided by 2^base_exponent_).
    if (static_cast<double>(now_) * inv_half_life_ - base_exponent_ > kRescaleExponent) Rescale();
  }
  void PickVictims(Tier t, size_t max, const std::function<bool(PageId)>& accept,
                   std::vector<PageId>* out) override {
    // Pop in key order, keep the accepted ones, push everything back: the heap is
    // unchanged afterwards. Rejected (pinned) pages are few, so this stays cheap.
    Heap& h = heaps_[TierIndex(t)];
    if (max == 1 && h.size() > 0 && accept(h.Top())) {  // the common case: nothing pinned on top
      out->push_back(h.Top());
      return;
    }
    std::vector<PageId> popped;
    size_t n = 0;
    while (n < max && h.size() > 0) {
      const PageId p = h.Top();
      h.Erase(p, key_);
      popped.push_back(p);
      if (accept(p)) { out->push_back(p); ++n; }
    }
    for (PageId p : popped) h.Push(p, key_);
  }
  size_t Size(Tier t) const override { return heaps_[TierIndex(t)].size(); }

 private:
  static constexpr double kRescaleExponent = 512;  // 2^512 is far from double overflow

  double Weight() const { return std::exp2(static_cast<double>(now_) * inv_half_life_ - base_exponent_); }

  // Subtract the elapsed exponent from every key: a monotone rescale, the order and
  // hence the heaps are unchanged.
  void Rescale() {
    const double shift = static_cast<double>(now_) * inv_half_life_ - base_exponent_;
    const double factor = std::exp2(-shift);
    for (double& k : key_) k *= factor;
    base_exponent_ += shift;
  }

  // Indexed binary min-heap of pages by key_.
  class Heap {
   public:
    size_t size() const { return heap_.size(); }
    PageId Top() const { return heap_.front(); }
    void Push(PageId p, const std::vector<double>& key) {
      GrowTo(pos_, static_cast<size_t>(p.value) + 1, kAbsent);
      assert(pos_[p.value] == kAbsent);
      heap_.push_back(p);
      pos_[p.value] = static_cast<int32_t>(heap_.size() - 1);
      Up(heap_.size() - 1, key);
    }
    void Erase(PageId p, const std::vector<double>& key) {
      const int32_t i = pos_[p.value];
      assert(i != kAbsent);
      const PageId last = heap_.back();
      heap_.pop_back();
      pos_[p.value] = kAbsent;
      if (static_cast<size_t>(i) < heap_.size()) {
        heap_[i] = last;
        pos_[last.value] = i;
        Down(static_cast<size_t>(i), key);
        Up(static_cast<size_t>(pos_[last.value]), key);
      }
    }
    void Increased(PageId p, const std::vector<double>& key) { Down(static_cast<size_t>(pos_[p.value]), key); }

   private:
    bool Less(size_t a, size_t b, const std::vector<double>& key) const {
      const double ka = key[heap_[a].value], kb = key[heap_[b].value];
      return ka < kb || (ka == kb && heap_[a].value < heap_[b].value);
    }
    void Swap(size_t a, size_t b) {
      std::swap(heap_[a], heap_[b]);
      pos_[heap_[a].value] = static_cast<int32_t>(a);
      pos_[heap_[b].value] = static_cast<int32_t>(b);
    }
    void Up(size_t i, const std::vector<double>& key) {
      while (i > 0 && Less(i, (i - 1) / 2, key)) { Swap(i, (i - 1) / 2); i = (i - 1) / 2; }
    }
    void Down(size_t i, const std::vector<double>& key) {
      for (;;) {
        size_t m = i;
        const size_t l = 2 * i + 1, r = l + 1;
        if (l < heap_.size() && Less(l, m, key)) m = l;
        if (r < heap_.size() && Less(r, m, key)) m = r;
        if (m == i) return;
        Swap(i, m);
        i = m;
      }
    }
    std::vector<PageId> heap_;
    std::vector<int32_t> pos_;  // [pages]: index in heap_, or kAbsent
  };

  double inv_half_life_;
  uint64_t now_ = 0;           // accesses so far
  double base_exponent_ = 0;   // keys are stored divided by 2^base_exponent_
  std::vector<double> key_;    // [pages]
  std::vector<uint8_t> tiers_; // [pages]: bit t = has a copy on tier t
  Heap heaps_[kNumTiers];
};

// ---------------------------------------------------------------------------------
class TwoQPolicy final : public ResidencyPolicy {
 public:
  explicit TwoQPolicy(const PolicyOptions& o) : in_share_(o.twoq_in_share), ghost_factor_(o.twoq_ghost_factor) {}
  PolicyKind kind() const override { return PolicyKind::kTwoQ; }

  void OnInsert(Tier t, PageId p) override {
    Queues& q = q_[TierIndex(t)];
    if (auto it = q.ghost_index.find(p.value); it != q.ghost_index.end()) {
      q.ghost.erase(it->second);
      q.ghost_index.erase(it);
      q.am.PushFront(p);  // seen recently enough to be remembered: hot
    } else {
      q.a1in.PushFront(p);
    }
  }
  void OnRemove(Tier t, PageId p) override {
    Queues& q = q_[TierIndex(t)];
    if (q.a1in.Contains(p)) {
      q.a1in.Remove(p);
      Remember(q, p);
    } else {
      q.am.Remove(p);
    }
  }
  void OnAccess(PageId p) override {
    for (Queues& q : q_) {
      if (q.am.Contains(p)) q.am.MoveToFront(p);
      else if (q.a1in.Contains(p)) { q.a1in.Remove(p); q.am.PushFront(p); }
    }
  }
  void PickVictims(Tier t, size_t max, const std::function<bool(PageId)>& accept,
                   std::vector<PageId>* out) override {
    Queues& q = q_[TierIndex(t)];
    size_t n = 0;
    auto take = [&](PageId p) {
      if (n < max && accept(p)) { out->push_back(p); ++n; }
      return n < max;
    };
    const size_t total = q.a1in.size() + q.am.size();
    const bool in_first = static_cast<double>(q.a1in.size()) >= in_share_ * static_cast<double>(total);
    if (in_first) { q.a1in.WalkFromTail(take); q.am.WalkFromTail(take); }
    else { q.am.WalkFromTail(take); q.a1in.WalkFromTail(take); }
  }
  size_t Size(Tier t) const override { return q_[TierIndex(t)].a1in.size() + q_[TierIndex(t)].am.size(); }

 private:
  struct Queues {
    PageList a1in, am;
    std::list<uint32_t> ghost;  // A1out, oldest first; one entry per remembered page
    std::unordered_map<uint32_t, std::list<uint32_t>::iterator> ghost_index;
  };
  void Remember(Queues& q, PageId p) {
    if (auto it = q.ghost_index.find(p.value); it != q.ghost_index.end()) q.ghost.erase(it->second);
    q.ghost.push_back(p.value);
    q.ghost_index[p.value] = std::prev(q.ghost.end());
    const size_t limit = std::max<size_t>(16, static_cast<size_t>(ghost_factor_ * static_cast<double>(q.a1in.size() + q.am.size() + 1)));
    while (q.ghost.size() > limit) {
      q.ghost_index.erase(q.ghost.front());
      q.ghost.pop_front();
    }
  }
  double in_share_, ghost_factor_;
  Queues q_[kNumTiers];
};

}  // namespace

std::unique_ptr<ResidencyPolicy> CreatePolicy(PolicyKind kind, const PolicyOptions& options) {
  switch (kind) {
    case PolicyKind::kDecayedLfu: return std::make_unique<DecayedLfuPolicy>(options.half_life);
    case PolicyKind::kLru: return std::make_unique<LruPolicy>();
    case PolicyKind::kTwoQ: return std::make_unique<TwoQPolicy>(options);
  }
  return nullptr;
}

}  // namespace tierkv
