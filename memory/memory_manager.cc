// memory/memory_manager.cc
#include "memory/memory_manager.h"

#include <algorithm>
#include <chrono>
#include <cassert>
#include <cstring>

#include <spdlog/spdlog.h>

#include "memory/size.h"

namespace tierkv {

Result<DeviceKind> ParseDeviceKind(std::string_view text) {
  if (text == "none") return DeviceKind::kNone;
  if (text == "sim") return DeviceKind::kSim;
  if (text == "cuda") return DeviceKind::kCuda;
  return Status::InvalidArgument("--device must be cuda, sim or none, not '" + std::string(text) + "'");
}

// ------------------------------------------------------------------------------ Pin
Pin& Pin::operator=(Pin&& o) noexcept {
  if (this != &o) {
    Release();
    mm_ = std::exchange(o.mm_, nullptr);
    page_ = o.page_;
    tier_ = o.tier_;
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = o.bytes_;
    hit_ = o.hit_;
  }
  return *this;
}

void Pin::Release() {
  if (mm_ != nullptr) {
    mm_->ReleasePin(page_);
    mm_ = nullptr;
    data_ = nullptr;
  }
}

// ------------------------------------------------------------------------ creation
namespace {

// The batch without repeats, in first-seen order (copies are gathered per batch, so
// the order only decides which pages fit when a tier fills up). O(n log n).
std::vector<PageId> UniquePages(const std::vector<PageId>& pages) {
  std::vector<std::pair<uint32_t, size_t>> keyed;
  keyed.reserve(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) keyed.push_back({pages[i].value, i});
  std::sort(keyed.begin(), keyed.end());
  std::vector<size_t> keep;
  for (size_t i = 0; i < keyed.size(); ++i) {
    if (i == 0 || keyed[i].first != keyed[i - 1].first) keep.push_back(keyed[i].second);
  }
  std::sort(keep.begin(), keep.end());
  std::vector<PageId> out;
  out.reserve(keep.size());
  for (size_t i : keep) out.push_back(pages[i]);
  return out;
}

uint64_t RoundDownToFrames(uint64_t bytes, uint64_t frame_bytes) { return bytes / frame_bytes * frame_bytes; }

Status CheckBudget(const char* flag, uint64_t bytes, uint64_t frame_bytes) {
  if (bytes != 0 && bytes < frame_bytes) {
    return Status::InvalidArgument(std::string("impossible budget: ") + flag + " " + FormatBytes(bytes) +
                                   " is smaller than one frame (" + FormatBytes(frame_bytes) + ")");
  }
  return Status::Ok();
}

}  // namespace

Status MemoryManager::CheckFrameBytes(uint64_t fb) {
  if (fb < 64 * kKiB || fb > 4 * kMiB || fb % (4 * kKiB) != 0) {
    return Status::InvalidArgument("frame size " + FormatBytes(fb) + " must be 64 KiB .. 4 MiB and a multiple of 4 KiB");
  }
  return Status::Ok();
}

Result<std::unique_ptr<MemoryManager>> MemoryManager::Create(const MemoryOptions& o) {
  const uint64_t fb = o.frame_bytes;
  TIERKV_RETURN_IF_ERROR(CheckFrameBytes(fb));
  if (o.host_bytes == 0) return Status::InvalidArgument("impossible budget: --host is zero; the Host tier is required");
  TIERKV_RETURN_IF_ERROR(CheckBudget("--host", o.host_bytes, fb));
  TIERKV_RETURN_IF_ERROR(CheckBudget("--disk", o.disk_bytes, fb));
  if (o.device != DeviceKind::kNone) {
    if (o.device_bytes == 0) return Status::InvalidArgument("impossible budget: --device needs --vram larger than zero");
    TIERKV_RETURN_IF_ERROR(CheckBudget("--vram", o.device_bytes, fb));
  }

  Backends b;
  {
    TIERKV_ASSIGN_OR_RETURN(b[TierIndex(Tier::kHost)],
                            CreateHostBackend({RoundDownToFrames(o.host_bytes, fb), o.mlock, o.warmup, true}));
  }
  if (o.device == DeviceKind::kSim) {
    TIERKV_ASSIGN_OR_RETURN(b[TierIndex(Tier::kDevice)],
                            CreateSimDeviceBackend({RoundDownToFrames(o.device_bytes, fb), o.sim_gbps, o.warmup}));
  } else if (o.device == DeviceKind::kCuda) {
    TIERKV_ASSIGN_OR_RETURN(b[TierIndex(Tier::kDevice)],
                            CreateCudaDeviceBackend(RoundDownToFrames(o.device_bytes, fb), o.warmup));
  }
  if (o.disk_bytes > 0) {
    TIERKV_ASSIGN_OR_RETURN(b[TierIndex(Tier::kDisk)],
                            CreateDiskBackend({o.disk_dir, RoundDownToFrames(o.disk_bytes, fb), o.direct_io, o.warmup}));
  }
  auto mm = CreateWithBackends(std::move(b), fb, o.policy, o.policy_options);
  if (!mm.ok()) return mm.status();
  if (o.device == DeviceKind::kCuda) {
    MemoryManager& m = **mm;
    TierState& host = m.tiers_[TierIndex(Tier::kHost)];
    Status st = RegisterHostMemoryForDevice(host.backend->base(), host.backend->capacity());
    if (st.ok()) m.host_registered_ = true;
    else spdlog::warn("host tier not registered with CUDA, device copies will be staged: {}", st.message());
  }
  return mm;
}

Result<std::unique_ptr<MemoryManager>> MemoryManager::CreateWithBackends(Backends backends, uint64_t frame_bytes,
                                                                         PolicyKind policy,
                                                                         const PolicyOptions& policy_options) {
  if (!backends[TierIndex(Tier::kHost)]) return Status::InvalidArgument("the Host tier is required");
  if (frame_bytes == 0) return Status::InvalidArgument("frame size is zero");
  for (int t = 0; t < kNumTiers; ++t) {
    if (backends[t] && backends[t]->capacity() < frame_bytes) {
      return Status::InvalidArgument(std::string("impossible budget: the ") + TierName(TierAt(t)) +
                                     " tier is smaller than one frame");
    }
  }
  return std::unique_ptr<MemoryManager>(new MemoryManager(std::move(backends), frame_bytes, policy, policy_options));
}

MemoryManager::MemoryManager(Backends backends, uint64_t frame_bytes, PolicyKind policy, const PolicyOptions& options)
    : frame_bytes_(frame_bytes), policy_(CreatePolicy(policy, options)) {
  for (int t = 0; t < kNumTiers; ++t) {
    TierState& ts = tiers_[t];
    ts.stats.tier = TierAt(t);
    if (!backends[t]) continue;
    ts.backend = std::move(backends[t]);
    const auto frames = static_cast<uint32_t>(ts.backend->capacity() / frame_bytes);
    ts.frames = std::make_unique<FrameAllocator>(frames);
    ts.stats.present = true;
    ts.stats.backend = ts.backend->Describe();
    ts.stats.frames = frames;
    ts.stats.frame_bytes = frame_bytes;
    ts.stats.budget_bytes = static_cast<uint64_t>(frames) * frame_bytes;
    ts.stats.warmup_s = ts.backend->warmup_seconds();
  }
  stream_ = std::make_unique<Stream>("tierkv-copy");
}

MemoryManager::~MemoryManager() {
  stream_.reset();  // finish queued migrations before the tiers go away
  if (host_registered_) UnregisterHostMemoryForDevice(tiers_[TierIndex(Tier::kHost)].backend->base());
}

// ------------------------------------------------------------------- stream plumbing
Ticket MemoryManager::RunOnStreamAsync(std::function<Status(Lock&)> fn, bool urgent) {
  Ticket ticket = Ticket::Pending();
  copy_tasks_.fetch_add(1, std::memory_order_relaxed);
  stream_->Enqueue([this, fn = std::move(fn), ticket] {
    const auto t0 = std::chrono::steady_clock::now();
    Lock lock(mu_);
    Status st = fn(lock);
    lock.unlock();
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    copy_busy_ns_.fetch_add(static_cast<uint64_t>(std::max<int64_t>(ns, 1)), std::memory_order_release);
    ticket.Complete(std::move(st));
  }, urgent);
  return ticket;
}

Status MemoryManager::RunOnStream(std::function<Status(Lock&)> fn) {
  assert(!stream_->OnWorker() && "copy-stream tasks must not wait on the copy stream");
  return RunOnStreamAsync(std::move(fn), /*urgent=*/true).Wait();
}

// ---------------------------------------------------------------------- bookkeeping
std::optional<Tier> MemoryManager::Below(Tier t) const {
  for (int i = TierIndex(t) + 1; i < kNumTiers; ++i) if (tiers_[i].backend) return TierAt(i);
  return std::nullopt;
}

std::optional<Tier> MemoryManager::Above(Tier t) const {
  for (int i = TierIndex(t) - 1; i >= 0; --i) if (tiers_[i].backend) return TierAt(i);
  return std::nullopt;
}

bool MemoryManager::InArena(Tier t, const void* p) const {
  if (!has_tier(t)) return false;
  TierBackend& b = *tiers_[TierIndex(t)].backend;
  const auto* base = b.arena_address();
  const auto* q = static_cast<const std::byte*>(p);
  return base != nullptr && q >= base && q < base + b.capacity();
}

std::byte* MemoryManager::FrameAddress(Tier t, FrameId f) const {
  std::byte* base = tiers_[TierIndex(t)].backend->arena_address();
  return base == nullptr ? nullptr : base + static_cast<uint64_t>(f.value) * frame_bytes_;
}

void MemoryManager::AddCopy(PageId p, Tier t, FrameId f) {
  PageEntry& e = table_.at(p);
  assert(!e.has_copy(t));
  e.frame[TierIndex(t)] = f;
  TierStats& s = tiers_[TierIndex(t)].stats;
  s.used_bytes.Add(static_cast<uint64_t>(e.n_frames) * frame_bytes_);
  s.requested_bytes.Add(e.bytes);
  s.pages.Add(1);
  policy_->OnInsert(t, p);
}

void MemoryManager::DropCopy(PageId p, Tier t) {
  PageEntry& e = table_.at(p);
  assert(e.has_copy(t));
  TierState& ts = tiers_[TierIndex(t)];
  ts.frames->Free(e.frame[TierIndex(t)], e.n_frames);
  e.frame[TierIndex(t)] = FrameId();
  ts.stats.used_bytes.Sub(static_cast<uint64_t>(e.n_frames) * frame_bytes_);
  ts.stats.requested_bytes.Sub(e.bytes);
  ts.stats.pages.Sub(1);
  policy_->OnRemove(t, p);
}

void MemoryManager::SetInFlight(const std::vector<PageId>& pages, bool in_flight, std::optional<Tier> to) {
  for (PageId p : pages) {
    PageEntry& e = table_.at(p);
    e.state = in_flight ? PageState::kInFlight : PageState::kResident;
    if (in_flight) e.flight_to = to ? *to : e.top();
  }
  if (!in_flight) {
    landed_.fetch_add(1, std::memory_order_release);
    in_flight_cv_.notify_all();
  }
}

void MemoryManager::WaitNotInFlight(Lock& lock, PageId p) {
  auto done = [&] { return !table_.Contains(p) || !table_.at(p).in_flight(); };
  if (done()) return;
  // Spin (lock released) until some batch lands, then re-check; block after that.
  const uint64_t seen = landed_.load(std::memory_order_acquire);
  lock.unlock();
  SpinFor([&] { return landed_.load(std::memory_order_acquire) != seen; });
  lock.lock();
  in_flight_cv_.wait(lock, done);
}

// ------------------------------------------------------------------------- copies
Status MemoryManager::CopyLocked(Lock& lock, Tier upper, bool up, const std::vector<Move>& moves) {
  if (moves.empty()) return Status::Ok();
  const Tier lower = *Below(upper);
  // The Host arena is the host side of every pair; the other tier's backend copies.
  const bool device_pair = upper == Tier::kDevice;  // (Device, Host); else (Host, Disk)
  TierState& worker = tiers_[TierIndex(device_pair ? upper : lower)];
  std::vector<CopyOp> ops;
  ops.reserve(moves.size());
  uint64_t bytes = 0;
  for (const Move& m : moves) {
    const PageEntry& e = table_.at(m.page);
    const uint64_t len = static_cast<uint64_t>(e.n_frames) * frame_bytes_;
    const FrameId arena_frame = device_pair ? m.upper : m.lower;
    const FrameId host_frame = device_pair ? m.lower : m.upper;
    ops.push_back({static_cast<uint64_t>(arena_frame.value) * frame_bytes_, FrameAddress(Tier::kHost, host_frame), len});
    bytes += len;
  }
  // Into the arena (Write) when: up into Device, or down into Disk.
  const bool arena_write = device_pair ? up : !up;
  lock.unlock();
  Status st = arena_write ? worker.backend->Write(ops) : worker.backend->Read(ops);
  lock.lock();
  TierStats& dst = tiers_[TierIndex(up ? upper : lower)].stats;
  TierStats& src = tiers_[TierIndex(up ? lower : upper)].stats;
  ++dst.copy_batches;
  ++src.copy_batches;
  if (!st.ok()) {
    ++dst.failed_copies;
    ++src.failed_copies;
    return st.Annotate(std::string("copying ") + std::to_string(moves.size()) + " page(s) " + TierName(up ? lower : upper) +
                       " -> " + TierName(up ? upper : lower));
  }
  dst.bytes_in += bytes;
  src.bytes_out += bytes;
  dst.migrations_in += moves.size();
  src.migrations_out += moves.size();
  return Status::Ok();
}

Status MemoryManager::AllocateFramesLocked(Lock& lock, Tier t, const std::vector<PageId>& pages,
                                           std::vector<FrameId>* out) {
  TierState& ts = tiers_[TierIndex(t)];
  out->assign(pages.size(), FrameId());
  auto release = [&] {
    for (size_t i = 0; i < pages.size(); ++i) {
      if ((*out)[i].valid()) {
        ts.frames->Free((*out)[i], table_.at(pages[i]).n_frames);
        ts.pending_frames -= table_.at(pages[i]).n_frames;
        (*out)[i] = FrameId();
      }
    }
  };
  for (;;) {
    uint64_t missing = 0;
    for (size_t i = 0; i < pages.size(); ++i) {
      if ((*out)[i].valid()) continue;
      const uint32_t n = table_.at(pages[i]).n_frames;
      if (auto f = ts.frames->AllocateRun(n)) {
        (*out)[i] = *f;
        ts.pending_frames += n;
      } else {
        missing += n;
      }
    }
    if (missing == 0) return Status::Ok();
    Status st = EvictLocked(lock, t, missing);
    if (!st.ok()) {
      release();
      return st;
    }
  }
}

Status MemoryManager::EvictLocked(Lock& lock, Tier t, uint64_t want_frames) {
  const std::optional<Tier> below = Below(t);
  // A page a prefetch brought here and nobody has used yet is about to be used: evicting
  // it would throw away the copy the prefetch paid for. Such pages are spared while
  // fewer accesses than the tier has frames have happened since (a stale prediction
  // then becomes an ordinary victim), unless nothing else can make room.
  const uint64_t window = tiers_[TierIndex(t)].stats.frames;
  bool spare_prefetched = true;
  auto accept = [&](PageId p) {
    const PageEntry& e = table_.at(p);
    if (e.in_flight()) return false;
    if (e.top() != t) return true;           // a redundant lower copy: drop it
    if (e.pins > 0) return false;            // pinned pages are never evicted
    if (spare_prefetched && e.prefetched_at != 0 && access_tick_ + 1 - e.prefetched_at < window) return false;
    return below.has_value() || e.has_copy_below(t);  // the last copy on the last tier stays
  };
  std::vector<PageId> picked;
  policy_->PickVictims(t, static_cast<size_t>(want_frames), accept, &picked);
  uint64_t found = 0;
  for (PageId p : picked) found += table_.at(p).n_frames;
  if (found < want_frames) {
    spare_prefetched = false;
    std::vector<PageId> more;
    policy_->PickVictims(t, static_cast<size_t>(want_frames), accept, &more);
    for (PageId p : more) {
      if (std::find(picked.begin(), picked.end(), p) == picked.end()) picked.push_back(p);
    }
  }
  // A page whose only copy below is its backing goes to the Disk tier instead when its
  // source asks for it and the Disk tier has free frames (no eviction there for it).
  uint64_t disk_room = 0;
  if (below == Tier::kDisk) {
    const TierState& d = tiers_[TierIndex(Tier::kDisk)];
    disk_room = d.frames->free_frames();
  }
  auto keep_below = [&](const PageEntry& e) {
    if (e.top() != t || !e.backed() || e.n_frames > disk_room) return false;
    for (int i = TierIndex(t) + 1; i < kNumTiers; ++i) if (e.has_copy(TierAt(i))) return false;
    if (!sources_[static_cast<size_t>(e.source)]->KeepBelow()) return false;
    disk_room -= e.n_frames;
    return true;
  };
  std::vector<PageId> demote;
  uint64_t freed = 0;
  for (PageId p : picked) {
    if (freed >= want_frames) break;
    const PageEntry& e = table_.at(p);
    freed += e.n_frames;
    if (keep_below(e)) {
      demote.push_back(p);
    } else if (e.top() != t || e.has_copy_below(t)) {
      DropCopy(p, t);  // clean: a valid copy remains elsewhere
      ++tiers_[TierIndex(t)].stats.drops;
    } else {
      demote.push_back(p);
    }
  }
  if (freed == 0) {
    return Status::Exhausted(std::string(TierName(t)) + " tier full: " + std::to_string(tiers_[TierIndex(t)].stats.frames) +
                             " frames, every page on it pinned, in flight or holding its only copy (a larger budget, or a tier "
                             "below it, would make room)");
  }
  if (demote.empty()) return Status::Ok();
  SetInFlight(demote, true, *below);
  std::vector<FrameId> dst;
  Status st = AllocateFramesLocked(lock, *below, demote, &dst);
  if (st.ok()) {
    std::vector<Move> moves;
    for (size_t i = 0; i < demote.size(); ++i) moves.push_back({demote[i], table_.at(demote[i]).frame[TierIndex(t)], dst[i]});
    st = CopyLocked(lock, t, /*up=*/false, moves);
    TierState& lower = tiers_[TierIndex(*below)];
    for (size_t i = 0; i < demote.size(); ++i) {
      lower.pending_frames -= table_.at(demote[i]).n_frames;
      if (st.ok()) {
        AddCopy(demote[i], *below, dst[i]);
        DropCopy(demote[i], t);
        ++tiers_[TierIndex(t)].stats.evictions;
      } else {
        lower.frames->Free(dst[i], table_.at(demote[i]).n_frames);
      }
    }
  }
  SetInFlight(demote, false);
  return st.Annotate(std::string("evicting from the ") + TierName(t) + " tier");
}

Status MemoryManager::ReadFromSourcesLocked(Lock& lock, Tier dst, const std::vector<PageId>& batch,
                                            const std::vector<FrameId>& frames, const std::vector<size_t>& which,
                                            std::vector<bool>* landed) {
  // Sources are read into the Host arena only (promotion always passes through Host).
  assert(dst == Tier::kHost);
  struct Read {
    size_t index;
    PageSource* source;
    uint64_t key;
    std::span<std::byte> out;
  };
  std::vector<Read> reads;
  for (size_t i : which) {
    const PageEntry& e = table_.at(batch[i]);
    reads.push_back({i, sources_[static_cast<size_t>(e.source)].get(), e.source_key,
                     std::span<std::byte>(FrameAddress(dst, frames[i]), static_cast<uint64_t>(e.n_frames) * frame_bytes_)});
  }
  lock.unlock();
  Status first;
  uint64_t bytes = 0;
  for (Read& r : reads) {
    Status st = r.source->ReadPage(r.key, r.out);
    (*landed)[r.index] = st.ok();
    if (st.ok()) bytes += r.out.size();
    else if (first.ok()) first = st;
  }
  lock.lock();
  TierStats& s = tiers_[TierIndex(dst)].stats;
  s.bytes_in += bytes;
  ++s.copy_batches;
  if (!first.ok()) ++s.failed_copies;
  return first;
}

// ------------------------------------------------------------ promotion / demotion
Status MemoryManager::PromoteLocked(Lock& lock, std::vector<PageId> pages, Tier to) {
  // One gathered batch per tier step: Disk -> Host, then Host -> Device.
  for (int d = kNumTiers - 1; d >= TierIndex(to); --d) {
    const Tier dst = TierAt(d);
    if (!has_tier(dst)) continue;
    // A backing counts as Disk data even when there is no Disk arena.
    const std::optional<Tier> src = dst == Tier::kHost ? Below(dst).value_or(Tier::kDisk) : Below(dst);
    if (!src) continue;
    std::vector<PageId> batch;
    for (PageId p : pages) if (table_.at(p).top() == *src) batch.push_back(p);
    if (batch.empty()) continue;
    std::vector<FrameId> frames;
    TIERKV_RETURN_IF_ERROR(AllocateFramesLocked(lock, dst, batch, &frames));
    std::vector<Move> moves;
    std::vector<size_t> from_source;  // indices into batch: backed pages with no Disk frame
    for (size_t i = 0; i < batch.size(); ++i) {
      const PageEntry& e = table_.at(batch[i]);
      if (e.has_copy(*src)) moves.push_back({batch[i], frames[i], e.frame[TierIndex(*src)]});
      else from_source.push_back(i);
    }
    Status st = CopyLocked(lock, dst, /*up=*/true, moves);
    std::vector<bool> landed(batch.size(), st.ok());
    if (!from_source.empty()) {
      Status sst = ReadFromSourcesLocked(lock, dst, batch, frames, from_source, &landed);
      if (st.ok()) st = sst;
    }
    TierState& ts = tiers_[d];
    for (size_t i = 0; i < batch.size(); ++i) {
      ts.pending_frames -= table_.at(batch[i]).n_frames;
      if (landed[i]) AddCopy(batch[i], dst, frames[i]);  // the copy below stays: clean
      else ts.frames->Free(frames[i], table_.at(batch[i]).n_frames);
    }
    TIERKV_RETURN_IF_ERROR(st);
  }
  return Status::Ok();
}

Status MemoryManager::DemoteLocked(Lock& lock, std::vector<PageId> pages, Tier to) {
  for (int u = 0; u < TierIndex(to); ++u) {
    const Tier upper = TierAt(u);
    if (!has_tier(upper)) continue;
    const Tier lower = *Below(upper);
    std::vector<PageId> batch, need_copy;
    for (PageId p : pages) {
      const PageEntry& e = table_.at(p);
      if (e.top() != upper) continue;
      batch.push_back(p);
      // Copy down unless the data is already there, or the copy is clean and this is
      // only a step on the way further down.
      if (!e.has_data(lower) && (lower == to || !e.has_copy_below(upper))) need_copy.push_back(p);
    }
    if (!need_copy.empty()) {
      std::vector<FrameId> frames;
      TIERKV_RETURN_IF_ERROR(AllocateFramesLocked(lock, lower, need_copy, &frames));
      std::vector<Move> moves;
      for (size_t i = 0; i < need_copy.size(); ++i) moves.push_back({need_copy[i], table_.at(need_copy[i]).frame[u], frames[i]});
      Status st = CopyLocked(lock, upper, /*up=*/false, moves);
      TierState& ts = tiers_[TierIndex(lower)];
      for (size_t i = 0; i < need_copy.size(); ++i) {
        ts.pending_frames -= table_.at(need_copy[i]).n_frames;
        if (st.ok()) AddCopy(need_copy[i], lower, frames[i]);
        else ts.frames->Free(frames[i], table_.at(need_copy[i]).n_frames);
      }
      TIERKV_RETURN_IF_ERROR(st);
    }
    for (PageId p : batch) DropCopy(p, upper);
  }
  return Status::Ok();
}

// --------------------------------------------------------------------- public ops
Result<PageId> MemoryManager::Allocate(uint64_t bytes, Tier tier, uint32_t tag) {
  if (!has_tier(tier)) return Status::InvalidArgument(std::string("no ") + TierName(tier) + " tier configured");
  if (bytes == 0) return Status::InvalidArgument("a page of zero bytes");
  const uint64_t n = (bytes + frame_bytes_ - 1) / frame_bytes_;
  if (n > tiers_[TierIndex(tier)].stats.frames) {
    return Status::InvalidArgument("a page of " + FormatBytes(bytes) + " does not fit the " + TierName(tier) + " tier (" +
                                   FormatBytes(tiers_[TierIndex(tier)].stats.budget_bytes) + ")");
  }
  {
    // A free run on the tier needs no eviction, hence no copy: no trip to the stream
    // (a decoder allocates a KV block per layer every block_tokens steps).
    Lock lock(mu_);
    if (auto f = tiers_[TierIndex(tier)].frames->AllocateRun(static_cast<uint32_t>(n))) {
      const PageId page = table_.Insert(bytes, static_cast<uint32_t>(n), tag);
      max_page_frames_ = std::max(max_page_frames_, static_cast<uint32_t>(n));
      AddCopy(page, tier, *f);
      return page;
    }
  }
  PageId page;
  Status st = RunOnStream([&](Lock& lock) {
    page = table_.Insert(bytes, static_cast<uint32_t>(n), tag);
    max_page_frames_ = std::max(max_page_frames_, static_cast<uint32_t>(n));
    SetInFlight({page}, true, tier);
    std::vector<FrameId> frames;
    Status s = AllocateFramesLocked(lock, tier, {page}, &frames);
    if (!s.ok()) {
      table_.Erase(page);
      in_flight_cv_.notify_all();
      return s;
    }
    tiers_[TierIndex(tier)].pending_frames -= n;
    AddCopy(page, tier, frames[0]);
    SetInFlight({page}, false);
    return Status::Ok();
  });
  if (!st.ok()) return st;
  return page;
}

int32_t MemoryManager::AddSource(std::shared_ptr<PageSource> source) {
  std::lock_guard<std::mutex> lock(mu_);
  sources_.push_back(std::move(source));
  return static_cast<int32_t>(sources_.size() - 1);
}

Result<PageId> MemoryManager::RegisterBacked(uint64_t bytes, int32_t source, uint64_t key, uint32_t tag) {
  TIERKV_ASSIGN_OR_RETURN(std::vector<PageId> pages, RegisterBackedRange(bytes, source, key, 1, tag));
  return pages[0];
}

Result<std::vector<PageId>> MemoryManager::RegisterBackedRange(uint64_t bytes, int32_t source, uint64_t first_key,
                                                               uint64_t count, uint32_t tag) {
  if (bytes == 0) return Status::InvalidArgument("a page of zero bytes");
  const uint64_t n = (bytes + frame_bytes_ - 1) / frame_bytes_;
  if (n > tiers_[TierIndex(Tier::kHost)].stats.frames) {
    return Status::InvalidArgument("a backed page of " + FormatBytes(bytes) + " does not fit the host tier");
  }
  std::vector<PageId> pages;
  pages.reserve(count);
  std::lock_guard<std::mutex> lock(mu_);
  if (source < 0 || static_cast<size_t>(source) >= sources_.size()) return Status::InvalidArgument("unknown page source");
  for (uint64_t i = 0; i < count; ++i) {
    const PageId page = table_.Insert(bytes, static_cast<uint32_t>(n), tag);
    PageEntry& e = table_.at(page);
    e.source = source;
    e.source_key = first_key + i;
    pages.push_back(page);
  }
  max_page_frames_ = std::max(max_page_frames_, static_cast<uint32_t>(n));
  return pages;
}

Status MemoryManager::Free(PageId page) {
  Lock lock(mu_);
  if (!table_.Contains(page)) return Status::NotFound("free of unknown page " + std::to_string(page.value));
  WaitNotInFlight(lock, page);
  if (!table_.Contains(page)) return Status::NotFound("page " + std::to_string(page.value) + " was freed concurrently");
  PageEntry& e = table_.at(page);
  if (e.pins > 0) return Status::FailedPrecondition("free of page " + std::to_string(page.value) + " while pinned");
  for (int t = 0; t < kNumTiers; ++t) if (e.has_copy(TierAt(t))) DropCopy(page, TierAt(t));
  policy_->OnFree(page);
  table_.Erase(page);
  return Status::Ok();
}

Pin MemoryManager::PinHereLocked(PageId page, PageEntry& e, Tier tier, Access access, bool hit) {
  e.prefetched_at = 0;
  ++e.pins;
  e.pin_tier = tier;
  ++e.accesses;
  e.last_access = ++access_tick_;
  // After a miss the promotion inserted the page, and the insertion is this use's
  // reference: counting it again would make every page look used twice (2Q would lose
  // its scan resistance, LFU would double-count misses).
  if (hit) policy_->OnAccess(page);
  if (access == Access::kWrite) {
    for (int t = TierIndex(tier) + 1; t < kNumTiers; ++t) if (e.has_copy(TierAt(t))) DropCopy(page, TierAt(t));
    e.source = -1;  // the backing is stale from now on
  }
  return Pin(this, page, tier, FrameAddress(tier, e.frame[TierIndex(tier)]), e.bytes, hit);
}

bool MemoryManager::HitLocked(PageId page, Tier tier) const {
  if (!table_.Contains(page)) return false;
  const PageEntry& e = table_.at(page);
  return !e.in_flight() && e.top() == tier && (e.pins == 0 || e.pin_tier == tier);
}

Pin MemoryManager::TryAcquire(PageId page, Tier tier, Access access) {
  if (!has_tier(tier) || tier == Tier::kDisk) return Pin();
  Lock lock(mu_);
  if (!HitLocked(page, tier)) return Pin();
  ++tiers_[TierIndex(tier)].stats.hits;
  return PinHereLocked(page, table_.at(page), tier, access, /*hit=*/true);
}

std::vector<Pin> MemoryManager::TryAcquireAll(std::span<const PageId> pages, Tier tier, Access access) {
  std::vector<Pin> pins;
  if (!has_tier(tier) || tier == Tier::kDisk) return pins;
  Lock lock(mu_);
  for (PageId page : pages) {
    if (!HitLocked(page, tier)) return pins;
  }
  pins.reserve(pages.size());
  for (PageId page : pages) {
    ++tiers_[TierIndex(tier)].stats.hits;
    pins.push_back(PinHereLocked(page, table_.at(page), tier, access, /*hit=*/true));
  }
  return pins;
}

Result<Pin> MemoryManager::Acquire(PageId page, Tier tier, Access access) {
  if (!has_tier(tier)) return Status::InvalidArgument(std::string("no ") + TierName(tier) + " tier configured");
  if (tier == Tier::kDisk) return Status::InvalidArgument("pages are pinned on Device or Host; Disk is not addressable");
  bool missed = false;
  for (int attempt = 0; attempt < 8; ++attempt) {
    Lock lock(mu_);
    if (!table_.Contains(page)) return Status::NotFound("acquire of unknown page " + std::to_string(page.value));
    WaitNotInFlight(lock, page);
    if (!table_.Contains(page)) return Status::NotFound("page " + std::to_string(page.value) + " was freed");
    PageEntry& e = table_.at(page);
    if (e.pins > 0 && e.pin_tier != tier) {
      return Status::FailedPrecondition("page " + std::to_string(page.value) + " is pinned on the " + TierName(e.pin_tier) +
                                        " tier");
    }
    if (e.top() == tier) {
      if (!missed) CountAccessLocked(tier, tier, 0);
      if (access == Access::kRead) tiers_[TierIndex(tier)].stats.bytes_read += e.bytes;
      return PinHereLocked(page, e, tier, access, !missed);
    }
    // Served from below (a promotion counts a hit where the data was found); a demotion
    // (the page is above `tier`) counts as a miss on `tier` alone.
    if (!missed) {
      if (TierIndex(e.top()) > TierIndex(tier)) CountAccessLocked(tier, e.top(), 0);
      else ++tiers_[TierIndex(tier)].stats.misses;
    }
    missed = true;
    const bool promote = TierIndex(e.top()) > TierIndex(tier);
    lock.unlock();
    // The move pins the page as it lands, on the stream: otherwise a queued prefetch
    // could evict it again before this thread takes the lock.
    Pin pinned;
    Status st = RunOnStream([&](Lock& l) {
      if (!table_.Contains(page)) return Status::NotFound("page freed during acquire");
      if (table_.at(page).pins > 0) return Status::Ok();  // someone pinned it meanwhile; re-check
      SetInFlight({page}, true, tier);
      Status r = promote ? PromoteLocked(l, {page}, tier) : DemoteLocked(l, {page}, tier);
      SetInFlight({page}, false);
      PageEntry& moved = table_.at(page);
      if (r.ok() && moved.top() == tier) pinned = PinHereLocked(page, moved, tier, access, /*hit=*/false);
      return r;
    });
    if (!st.ok()) return st.Annotate("acquire of page " + std::to_string(page.value) + " on the " + TierName(tier) + " tier");
    if (pinned.valid()) return pinned;
  }
  return Status::Internal("acquire of page " + std::to_string(page.value) + " kept losing races");
}

void MemoryManager::CountAccessLocked(Tier wanted, std::optional<Tier> served, uint64_t bytes) {
  const int last = served ? TierIndex(*served) : kNumTiers;
  for (int t = TierIndex(wanted); t < last; ++t) {
    if (tiers_[t].backend) ++tiers_[t].stats.misses;
  }
  if (served && has_tier(*served)) {
    TierStats& s = tiers_[TierIndex(*served)].stats;
    ++s.hits;
    s.bytes_read += bytes;
  }
}

size_t MemoryManager::AcquireInPlace(std::span<const PageId> pages, std::vector<Pin>* out) {
  out->clear();
  out->resize(pages.size());
  const Tier wanted = compute_tier();
  size_t pinned = 0;
  Lock lock(mu_);
  for (size_t i = 0; i < pages.size(); ++i) {
    if (!table_.Contains(pages[i])) continue;
    PageEntry& e = table_.at(pages[i]);
    const Tier top = e.top();
    if (e.in_flight() || !e.has_copy(top) || !host_addressable(top) || (e.pins > 0 && e.pin_tier != top)) continue;
    CountAccessLocked(wanted, top, e.bytes);
    (*out)[i] = PinHereLocked(pages[i], e, top, Access::kRead, /*hit=*/true);
    ++pinned;
  }
  return pinned;
}

Ticket MemoryManager::ReadThrough(std::vector<PageId> pages, std::vector<std::byte*> out) {
  assert(pages.size() == out.size());
  return RunOnStreamAsync([this, pages = std::move(pages), out = std::move(out)](Lock& lock) {
    std::vector<PageId> backing_only;
    for (PageId p : pages) {
      if (!table_.Contains(p)) return Status::NotFound("read of unknown page " + std::to_string(p.value));
      const PageEntry& e = table_.at(p);
      if (!e.has_copy(e.top())) backing_only.push_back(p);
    }
    // A page only in its backing (a restored session not read yet) comes up to the Host
    // tier first, as Acquire would bring it: read from its source once, then where it lies.
    // When the Host tier has no room (every page on it pinned), they are read from their
    // source into out[i] below instead, and stay where they were.
    if (!backing_only.empty()) {
      backing_only = UniquePages(backing_only);
      SetInFlight(backing_only, true, Tier::kHost);
      (void)PromoteLocked(lock, backing_only, Tier::kHost);
      SetInFlight(backing_only, false);
    }
    // Host-addressable copies are memcpy'd, other arenas' (an O_DIRECT Disk file, a CUDA
    // device) gathered into one backend read per tier, backings read page by page; the
    // pages stay in flight meanwhile.
    struct Span {
      const std::byte* from;
      std::byte* to;
      uint64_t bytes;
    };
    struct SourceRead {
      PageSource* source;
      uint64_t key;
      std::span<std::byte> out;
    };
    std::vector<Span> memcpys;
    std::array<std::vector<CopyOp>, kNumTiers> arena_reads;
    std::vector<SourceRead> backed;
    const Tier wanted = compute_tier();
    for (size_t i = 0; i < pages.size(); ++i) {
      PageEntry& e = table_.at(pages[i]);
      const Tier top = e.top();
      const uint64_t len = static_cast<uint64_t>(e.n_frames) * frame_bytes_;
      CountAccessLocked(wanted, top, e.bytes);
      ++e.accesses;
      e.last_access = ++access_tick_;
      policy_->OnAccess(pages[i]);
      if (!e.has_copy(top)) {
        backed.push_back({sources_[static_cast<size_t>(e.source)].get(), e.source_key, std::span<std::byte>(out[i], len)});
      } else if (host_addressable(top)) {
        memcpys.push_back({FrameAddress(top, e.frame[TierIndex(top)]), out[i], e.bytes});
      } else {
        arena_reads[TierIndex(top)].push_back({static_cast<uint64_t>(e.frame[TierIndex(top)].value) * frame_bytes_, out[i], len});
      }
    }
    SetInFlight(pages, true);
    lock.unlock();
    for (const Span& c : memcpys) std::memcpy(c.to, c.from, c.bytes);
    Status st;
    for (int t = 0; t < kNumTiers && st.ok(); ++t) {
      if (!arena_reads[t].empty()) st = tiers_[t].backend->Read(arena_reads[t]);
    }
    for (const SourceRead& r : backed) {
      if (!st.ok()) break;
      st = r.source->ReadPage(r.key, r.out);
    }
    lock.lock();
    SetInFlight(pages, false);
    return st.Annotate("reading " + std::to_string(pages.size()) + " page(s) where they lie");
  }, /*urgent=*/true);
}

void MemoryManager::ReleasePin(PageId p) {
  Lock lock(mu_);
  PageEntry& e = table_.at(p);
  assert(e.pins > 0);
  --e.pins;
}

Ticket MemoryManager::Prefetch(std::vector<PageId> pages, Tier tier, bool urgent) {
  return MoveAsync(std::move(pages), tier, /*promote=*/true, urgent);
}

Ticket MemoryManager::Demote(std::vector<PageId> pages, Tier tier) {
  return MoveAsync(std::move(pages), tier, /*promote=*/false);
}

void MemoryManager::MarkPrefetchedLocked(const std::vector<PageId>& pages, Tier tier) {
  for (PageId p : pages) {
    if (!table_.Contains(p)) continue;
    PageEntry& e = table_.at(p);
    if (TierIndex(e.top()) <= TierIndex(tier)) e.prefetched_at = access_tick_ + 1;
  }
}

Ticket MemoryManager::MoveAsync(std::vector<PageId> pages, Tier tier, bool promote, bool urgent) {
  if (!has_tier(tier)) {
    Ticket t = Ticket::Pending();
    t.Complete(Status::InvalidArgument(std::string("no ") + TierName(tier) + " tier configured"));
    return t;
  }
  if (promote) {
    // Nothing to move (the common case when the compute tier holds everything): mark
    // the pages as prefetched, as the stream task would, and leave the stream asleep.
    Lock lock(mu_);
    bool any = false;
    for (PageId p : pages) {
      if (!table_.Contains(p)) continue;
      const PageEntry& e = table_.at(p);
      if (e.in_flight() || (e.pins == 0 && TierIndex(e.top()) > TierIndex(tier))) {
        any = true;
        break;
      }
    }
    if (!any) {
      MarkPrefetchedLocked(pages, tier);
      return Ticket();
    }
  }
  return RunOnStreamAsync([this, pages = std::move(pages), tier, promote](Lock& lock) {
    // Pages already where they should be, and pinned pages, are left alone.
    const std::vector<PageId> unique = UniquePages(pages);
    std::vector<PageId> todo;
    for (PageId p : unique) {
      if (!table_.Contains(p)) continue;
      const PageEntry& e = table_.at(p);
      const int top = TierIndex(e.top()), to = TierIndex(tier);
      if (e.pins > 0 || (promote ? top <= to : top >= to)) continue;
      todo.push_back(p);
    }
    SetInFlight(todo, true, tier);
    Status st = promote ? PromoteLocked(lock, todo, tier) : DemoteLocked(lock, todo, tier);
    SetInFlight(todo, false);
    if (promote) MarkPrefetchedLocked(unique, tier);
    return st.Annotate(std::string(promote ? "prefetch" : "demotion") + " to the " + TierName(tier) + " tier");
  }, urgent);
}

Status MemoryManager::ReadCopy(PageId page, Tier tier, std::span<std::byte> out) {
  return RunOnStream([&](Lock& lock) {
    if (!table_.Contains(page)) return Status::NotFound("page " + std::to_string(page.value));
    const PageEntry& e = table_.at(page);
    if (!e.has_data(tier)) return Status::NotFound("page " + std::to_string(page.value) + " has no copy on the " + TierName(tier) + " tier");
    if (out.size() > e.bytes) return Status::InvalidArgument("read past the page end");
    const uint64_t len = static_cast<uint64_t>(e.n_frames) * frame_bytes_;
    std::unique_ptr<std::byte, decltype(&std::free)> bounce(static_cast<std::byte*>(std::aligned_alloc(4096, len)), &std::free);
    if (!e.has_copy(tier)) {  // backing only
      PageSource* src = sources_[static_cast<size_t>(e.source)].get();
      const uint64_t key = e.source_key;
      SetInFlight({page}, true);
      lock.unlock();
      Status st = src->ReadPage(key, std::span<std::byte>(bounce.get(), len));
      lock.lock();
      SetInFlight({page}, false);
      if (st.ok()) std::memcpy(out.data(), bounce.get(), out.size());
      return st;
    }
    TierState& ts = tiers_[TierIndex(tier)];
    const FrameId f = e.frame[TierIndex(tier)];
    if (std::byte* base = ts.backend->base()) {
      std::memcpy(out.data(), base + static_cast<uint64_t>(f.value) * frame_bytes_, out.size());
      return Status::Ok();
    }
    // Not host-addressable: read whole frames into the aligned bounce buffer.
    CopyOp op{static_cast<uint64_t>(f.value) * frame_bytes_, bounce.get(), len};
    SetInFlight({page}, true);
    lock.unlock();
    Status st = ts.backend->Read(std::span<const CopyOp>(&op, 1));
    lock.lock();
    SetInFlight({page}, false);
    if (st.ok()) std::memcpy(out.data(), bounce.get(), out.size());
    return st;
  });
}

bool MemoryManager::HasCopy(PageId page, Tier tier) const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.Contains(page) && table_.at(page).has_data(tier);
}

std::optional<Tier> MemoryManager::TopTier(PageId page) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!table_.Contains(page)) return std::nullopt;
  return table_.at(page).top();
}

bool MemoryManager::ResidentOrArriving(PageId page, Tier tier) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!table_.Contains(page)) return false;
  const PageEntry& e = table_.at(page);
  return e.in_flight() ? e.flight_to == tier : e.top() == tier;
}

size_t MemoryManager::live_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.live_pages();
}

TierStats MemoryManager::Stats(Tier tier) const {
  std::lock_guard<std::mutex> lock(mu_);
  const TierState& ts = tiers_[TierIndex(tier)];
  TierStats s = ts.stats;
  if (ts.frames) {
    s.free_frames = ts.frames->free_frames();
    s.largest_free_run = ts.frames->LargestFreeRun();
    s.external_unusable_frames = ts.frames->FreeFramesUnusableFor(max_page_frames_);
  }
  return s;
}

bool MemoryManager::CheckInvariants(std::string* why) const {
  std::string local;
  std::string& w = why ? *why : local;
  std::lock_guard<std::mutex> lock(mu_);
  if (!table_.CheckInvariants(&w)) return false;
  for (int t = 0; t < kNumTiers; ++t) {
    const TierState& ts = tiers_[t];
    const std::string tier = TierName(TierAt(t));
    if (!ts.backend) continue;
    if (!ts.frames->CheckInvariants()) { w = tier + ": frame allocator bitmap is inconsistent"; return false; }
    std::vector<uint8_t> owner(ts.frames->frames(), 0);
    uint64_t frames = 0, bytes = 0, pages = 0;
    bool ok = true;
    table_.ForEachLive([&](PageId p, const PageEntry& e) {
      if (!ok || !e.has_copy(TierAt(t))) return;
      const FrameId f = e.frame[t];
      for (uint32_t i = 0; i < e.n_frames; ++i) {
        const uint32_t fi = f.value + i;
        if (fi >= owner.size() || owner[fi] || ts.frames->IsFree(FrameId(fi))) {
          w = tier + ": frame " + std::to_string(fi) + " of page " + std::to_string(p.value) + " is free, out of range or shared";
          ok = false;
          return;
        }
        owner[fi] = 1;
      }
      frames += e.n_frames;
      bytes += e.bytes;
      ++pages;
    });
    if (!ok) return false;
    if (frames + ts.pending_frames != ts.frames->used_frames()) {
      w = tier + ": used frames " + std::to_string(ts.frames->used_frames()) + " != copies " + std::to_string(frames) +
          " + pending " + std::to_string(ts.pending_frames);
      return false;
    }
    if (policy_->Size(TierAt(t)) != pages) {
      w = tier + ": policy tracks " + std::to_string(policy_->Size(TierAt(t))) + " pages, table has " + std::to_string(pages);
      return false;
    }
    if (ts.stats.used_bytes.current != frames * frame_bytes_ || ts.stats.requested_bytes.current != bytes ||
        ts.stats.pages.current != pages) {
      w = tier + ": gauges disagree with the page table";
      return false;
    }
  }
  return true;
}

}  // namespace tierkv
