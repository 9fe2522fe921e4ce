// bench/tools/fragbench_replay.cc
#include "bench/tools/fragbench_replay.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>

#include "bench/tools/fragbench_heaps.h"
#include "memory/frame_allocator.h"
#include "memory/size.h"

namespace tierkv::fragbench {
namespace {

constexpr uint32_t kNoFrame = UINT32_MAX;

uint64_t CeilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// What one allocator does with the events; the driver applies events and samples.
class Model {
 public:
  explicit Model(const Workload& w) : tokens_(w.sessions.size(), 0), dead_(w.sessions.size(), 0) {}
  virtual ~Model() = default;

  void Apply(const Event& e) {
    const uint32_t s = e.session;
    if (dead_[s]) return;  // failed earlier: the rest of its events are ignored
    if (e.op == Op::kFree) {
      Release(s);
      Forget(s);
    } else {
      if (e.op == Op::kAlloc) ++sessions_;
      tokens_[s] += e.tokens;
      live_tokens_ += e.tokens;
      if (!Reserve(s, e)) {
        Release(s);
        Forget(s);
        dead_[s] = 1;
        ++failed_;
      }
    }
    // Peaks over every event, not only at the samples.
    const Sample now = Measure(e.time_s);
    if (now.held_bytes > peaks_.peak_held_bytes) {
      peaks_.peak_held_bytes = now.held_bytes;
      peaks_.peak_held_time_s = e.time_s;
    }
    peaks_.peak_allocated_bytes = std::max(peaks_.peak_allocated_bytes, now.allocated_bytes);
    peaks_.peak_live_bytes = std::max(peaks_.peak_live_bytes, now.live_bytes);
  }
  // The state now. Allocates nothing (the real-allocator replays call it per event).
  virtual Sample Measure(double time_s) = 0;
  uint32_t failed() const { return failed_; }
  const Summary& peaks() const { return peaks_; }

 protected:
  // Makes room for tokens_[s] (already counted); false when the allocator is out of memory.
  virtual bool Reserve(uint32_t s, const Event& e) = 0;
  // Returns everything session s holds.
  virtual void Release(uint32_t s) = 0;

  std::vector<uint32_t> tokens_;  // [sessions] tokens each session holds now
  uint64_t live_tokens_ = 0;
  uint32_t sessions_ = 0;

 private:
  void Forget(uint32_t s) {
    live_tokens_ -= tokens_[s];
    tokens_[s] = 0;
    --sessions_;
  }
  std::vector<uint8_t> dead_;  // [sessions]
  uint32_t failed_ = 0;
  Summary peaks_;  // only the peak_* fields
};

// A FrameAllocator plus its extent (one past the highest used frame), so that free runs
// between allocations can be told from the free space above them.
// Invariant: extent_ == 0 || !IsFree(extent_ - 1); every frame >= extent_ is free.
class ExtentArena {
 public:
  explicit ExtentArena(uint32_t frames) : frames_(frames) {}
  std::optional<uint32_t> Take(uint32_t n) {
    const auto f = n == 1 ? frames_.Allocate() : frames_.AllocateRun(n);
    if (!f) return std::nullopt;
    extent_ = std::max(extent_, f->value + n);
    return f->value;
  }
  void Give(uint32_t first, uint32_t n) {
    frames_.Free(FrameId(first), n);
    // Amortised O(1): the extent only rises by allocations at its edge.
    while (extent_ > 0 && frames_.IsFree(FrameId(extent_ - 1))) --extent_;
  }
  uint32_t used() const { return frames_.used_frames(); }
  uint32_t size() const { return frames_.frames(); }
  // Free frames between allocations in runs shorter than `request` frames: space a
  // request of that size cannot use (external fragmentation).
  uint32_t UnusableFor(uint32_t request) const {
    if (request == 1) return 0;  // any free frame serves a one-frame request
    uint32_t unusable = frames_.FreeFramesUnusableFor(request);
    const uint32_t tail = frames_.frames() - extent_;  // the free run above the extent
    if (tail > 0 && tail < request) unusable -= tail;
    return unusable;
  }

 private:
  FrameAllocator frames_;
  uint32_t extent_ = 0;
};

// paged (one frame per block, allocated as the session grows) and contiguous (one run
// of max_tokens per session at arrival), on the same kind of arena. A free frame goes
// back to the tier's shared arena (KV and expert pages share one budget), so the arena
// holds for this workload the allocated frames plus the free ones nobody can use.
class SimModel : public Model {
 public:
  SimModel(const Workload& w, const ReplayOptions& o, bool paged, uint32_t arena_frames)
      : Model(w),
        paged_(paged),
        block_tokens_(o.block_tokens),
        bytes_per_token_(o.bytes_per_token),
        frame_bytes_(uint64_t{o.block_tokens} * o.bytes_per_token),
        request_frames_(paged ? 1 : static_cast<uint32_t>(CeilDiv(o.max_tokens, o.block_tokens))),
        arena_(arena_frames),
        frames_(paged ? w.sessions.size() : 0),
        first_(paged ? 0 : w.sessions.size(), kNoFrame) {}

  Sample Measure(double time_s) override {
    if (layout_changed_) {  // the O(frames / 64) scan only when frames moved
      external_frames_ = arena_.UnusableFor(request_frames_);
      layout_changed_ = false;
    }
    Sample s;
    s.time_s = time_s;
    s.sessions = sessions_;
    s.live_bytes = live_tokens_ * bytes_per_token_;
    s.allocated_bytes = uint64_t{arena_.used()} * frame_bytes_;
    s.external_bytes = uint64_t{external_frames_} * frame_bytes_;
    s.held_bytes = s.allocated_bytes + s.external_bytes;
    return s;
  }
  uint64_t unit_bytes() const { return request_frames_ * frame_bytes_; }
  uint64_t arena_bytes() const { return uint64_t{arena_.size()} * frame_bytes_; }

 protected:
  bool Reserve(uint32_t s, const Event& e) override {
    if (!paged_) {
      if (e.op != Op::kAlloc) return true;  // validated: never beyond max_tokens
      const auto first = arena_.Take(request_frames_);
      if (!first) return false;
      first_[s] = *first;
      layout_changed_ = true;
      return true;
    }
    std::vector<uint32_t>& frames = frames_[s];
    const uint64_t need = CeilDiv(tokens_[s], block_tokens_);
    while (frames.size() < need) {
      const auto f = arena_.Take(1);
      if (!f) return false;
      frames.push_back(*f);
      layout_changed_ = true;
    }
    return true;
  }
  void Release(uint32_t s) override {
    layout_changed_ = true;
    if (!paged_) {
      if (first_[s] != kNoFrame) arena_.Give(first_[s], request_frames_);
      first_[s] = kNoFrame;
      return;
    }
    std::vector<uint32_t>& frames = frames_[s];
    // Frames taken together are often consecutive: free them as runs.
    for (size_t i = 0; i < frames.size();) {
      size_t j = i + 1;
      while (j < frames.size() && frames[j] == frames[j - 1] + 1) ++j;
      arena_.Give(frames[i], static_cast<uint32_t>(j - i));
      i = j;
    }
    std::vector<uint32_t>().swap(frames);
  }

 private:
  const bool paged_;
  const uint32_t block_tokens_;
  const uint64_t bytes_per_token_;
  const uint64_t frame_bytes_;
  const uint32_t request_frames_;
  ExtentArena arena_;
  std::vector<std::vector<uint32_t>> frames_;  // paged: [sessions] frames of each session
  std::vector<uint32_t> first_;                // contiguous: [sessions] first frame or kNoFrame
  bool layout_changed_ = true;
  uint32_t external_frames_ = 0;
};

// malloc / mimalloc: one allocation of exactly tokens * bytes per event. All bookkeeping
// is allocated before the heap's baseline is taken, so the replay itself allocates
// nothing but the workload's chunks from the heap it measures.
class RealModel : public Model {
 public:
  RealModel(const Workload& w, Heap* heap, uint64_t bytes_per_token, uint64_t scale)
      : Model(w),
        heap_(heap),
        bytes_per_token_(bytes_per_token),
        scale_(scale),
        offset_(w.sessions.size() + 1, 0),
        count_(w.sessions.size(), 0) {
    for (size_t s = 0; s < w.sessions.size(); ++s) offset_[s + 1] = offset_[s] + w.sessions[s].chunks;
    chunks_.assign(offset_.back(), nullptr);
  }
  ~RealModel() override {
    for (uint32_t s = 0; s < count_.size(); ++s) Release(s);
  }

  Sample Measure(double time_s) override {
    Sample s;
    s.time_s = time_s;
    s.sessions = sessions_;
    s.live_bytes = live_tokens_ * bytes_per_token_;
    s.allocated_bytes = usable_ * scale_;
    // A footprint below the usable bytes is measurement noise (the heap reused memory
    // that was free before the baseline): clamp, so held >= allocated.
    s.held_bytes = std::max(heap_->HeldSinceBaseline(), usable_) * scale_;
    // Free bytes the heap keeps. Which of them a later request could reuse cannot be
    // seen from outside, so all count: an upper bound of external fragmentation.
    s.external_bytes = s.held_bytes - s.allocated_bytes;
    return s;
  }

 protected:
  bool Reserve(uint32_t s, const Event& e) override {
    void* p = heap_->Allocate(uint64_t{e.tokens} * (bytes_per_token_ / scale_));
    if (p == nullptr) return false;
    chunks_[offset_[s] + count_[s]++] = p;
    usable_ += heap_->UsableSize(p);
    return true;
  }
  void Release(uint32_t s) override {
    for (uint32_t i = 0; i < count_[s]; ++i) {
      void*& p = chunks_[offset_[s] + i];
      usable_ -= heap_->UsableSize(p);
      heap_->Deallocate(p);
      p = nullptr;
    }
    count_[s] = 0;
  }

 private:
  Heap* heap_;
  const uint64_t bytes_per_token_;  // full scale
  const uint64_t scale_;
  std::vector<uint64_t> offset_;  // [sessions + 1] first slot of each session in chunks_
  std::vector<uint32_t> count_;   // [sessions] chunks held
  std::vector<void*> chunks_;     // [sum of chunks]
  uint64_t usable_ = 0;           // replay-scale bytes
};

// Applies every event at or before each sample time, then samples.
void Drive(const Workload& w, const std::vector<double>& times, Model& model, std::vector<Sample>* out) {
  size_t next = 0;
  for (double t : times) {
    while (next < w.events.size() && w.events[next].time_s <= t) model.Apply(w.events[next++]);
    out->push_back(model.Measure(t));
  }
}

// Frames of the simulated arenas: --arena, or the workload's peak demand. Lowest-first
// single frames never reach above the peak number of used frames, and first-fit runs of
// one size from frame 0 only leave holes that are whole runs, so the peak demand is
// enough for both.
uint64_t ArenaFrames(const ReplayOptions& o, const WorkloadStats& st, bool paged) {
  const uint64_t frame_bytes = uint64_t{o.block_tokens} * o.bytes_per_token;
  if (o.arena_bytes != 0) return o.arena_bytes / frame_bytes;
  if (paged) return std::max<uint64_t>(st.peak_blocks, 1);
  return uint64_t{std::max<uint32_t>(st.peak_live_sessions, 1)} * CeilDiv(o.max_tokens, o.block_tokens);
}

void CopyPeaks(const Summary& peaks, Summary* summary) {
  summary->peak_held_bytes = peaks.peak_held_bytes;
  summary->peak_held_time_s = peaks.peak_held_time_s;
  summary->peak_allocated_bytes = peaks.peak_allocated_bytes;
  summary->peak_live_bytes = peaks.peak_live_bytes;
}

bool Has(const ReplayOptions& o, AllocatorKind k) {
  return std::find(o.allocators.begin(), o.allocators.end(), k) != o.allocators.end();
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

const char* AllocatorName(AllocatorKind kind) {
  switch (kind) {
    case AllocatorKind::kPaged:
      return "paged";
    case AllocatorKind::kContiguous:
      return "contiguous";
    case AllocatorKind::kMalloc:
      return "malloc";
    case AllocatorKind::kMimalloc:
      return "mimalloc";
  }
  return "?";
}

Result<std::vector<AllocatorKind>> ParseAllocatorList(std::string_view list) {
  const std::vector<AllocatorKind> all = {AllocatorKind::kPaged, AllocatorKind::kContiguous, AllocatorKind::kMalloc,
                                          AllocatorKind::kMimalloc};
  if (list == "all") return all;
  std::vector<AllocatorKind> kinds;
  while (true) {
    const size_t comma = list.find(',');
    const std::string_view name = list.substr(0, comma);
    auto it = std::find_if(all.begin(), all.end(), [&](AllocatorKind k) { return name == AllocatorName(k); });
    if (it == all.end()) {
      return Status::InvalidArgument("unknown allocator '" + std::string(name) +
                                     "' (expected paged, contiguous, malloc, mimalloc or all)");
    }
    if (std::find(kinds.begin(), kinds.end(), *it) == kinds.end()) kinds.push_back(*it);
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return kinds;
}

std::vector<double> SampleTimes(double duration_s, uint32_t samples) {
  std::vector<double> times(samples + 1);
  for (uint32_t k = 0; k <= samples; ++k) times[k] = k == samples ? duration_s : duration_s * k / samples;
  return times;
}

Summary Summarize(const std::vector<Sample>& samples) {
  Summary out;
  double live = 0, allocated = 0, held = 0, internal = 0, external = 0;
  for (const Sample& s : samples) {
    live += static_cast<double>(s.live_bytes);
    allocated += static_cast<double>(s.allocated_bytes);
    held += static_cast<double>(s.held_bytes);
    internal += static_cast<double>(s.internal_bytes());
    external += static_cast<double>(s.external_bytes);
    if (s.held_bytes > out.peak_held_bytes) {
      out.peak_held_bytes = s.held_bytes;
      out.peak_held_time_s = s.time_s;
    }
    out.peak_allocated_bytes = std::max(out.peak_allocated_bytes, s.allocated_bytes);
    out.peak_live_bytes = std::max(out.peak_live_bytes, s.live_bytes);
  }
  if (allocated > 0) {
    out.internal_pct = 100 * internal / allocated;
    out.external_pct = 100 * external / allocated;
    out.waste_pct = 100 * (internal + external) / allocated;
  }
  if (held > 0) out.utilisation_pct = 100 * live / held;
  if (!samples.empty()) out.mean_held_bytes = held / static_cast<double>(samples.size());
  return out;
}

Status ValidateReplayOptions(const Workload& w, const ReplayOptions& o) {
  if (o.allocators.empty()) return Status::InvalidArgument("--allocators names no allocator");
  if (o.bytes_per_token == 0 || o.bytes_per_token > kGiB) {
    return Status::InvalidArgument("--bytes-per-token must be between 1 B and 1 GiB, got " +
                                   std::to_string(o.bytes_per_token));
  }
  if (o.block_tokens == 0 || o.block_tokens > (1u << 20)) {
    return Status::InvalidArgument("--block-tokens must be between 1 and 1048576");
  }
  if (o.max_tokens == 0) return Status::InvalidArgument("--max-tokens must be at least 1");
  if (o.samples == 0 || o.samples > 1000000) return Status::InvalidArgument("--samples must be between 1 and 1000000");
  if (o.real_scale == 0 || o.bytes_per_token % o.real_scale != 0) {
    return Status::InvalidArgument("--real-scale " + std::to_string(o.real_scale) +
                                   " must be at least 1 and divide --bytes-per-token " +
                                   std::to_string(o.bytes_per_token));
  }
  if (w.events.empty()) return Status::InvalidArgument("the workload has no events");

  const WorkloadStats st = ComputeWorkloadStats(w, o.block_tokens);
  if (st.peak_live_tokens > (uint64_t{1} << 62) / o.bytes_per_token) {
    return Status::InvalidArgument("the workload's peak of " + std::to_string(st.peak_live_tokens) +
                                   " live tokens times --bytes-per-token does not fit in 64 bits");
  }
  const uint64_t frame_bytes = uint64_t{o.block_tokens} * o.bytes_per_token;
  const uint64_t run_frames = CeilDiv(o.max_tokens, o.block_tokens);
  if (Has(o, AllocatorKind::kContiguous)) {
    for (const SessionInfo& s : w.sessions) {
      if (s.final_tokens <= o.max_tokens) continue;
      const std::string where = s.line ? " (trace line " + std::to_string(s.line) + ")" : "";
      return Status::InvalidArgument("session " + std::to_string(s.id) + where + " reaches " +
                                     std::to_string(s.final_tokens) + " tokens, more than --max-tokens " +
                                     std::to_string(o.max_tokens) +
                                     " that the contiguous baseline reserves; raise --max-tokens");
    }
  }
  if (o.arena_bytes != 0) {
    const uint64_t frames = o.arena_bytes / frame_bytes;
    if (frames == 0) {
      return Status::InvalidArgument("--arena " + FormatBytes(o.arena_bytes) + " is smaller than one frame (" +
                                     FormatBytes(frame_bytes) + " = --block-tokens x --bytes-per-token)");
    }
    if (Has(o, AllocatorKind::kContiguous) && frames < run_frames) {
      return Status::InvalidArgument(
          "--arena " + FormatBytes(o.arena_bytes) + " cannot hold one contiguous reservation of --max-tokens " +
          std::to_string(o.max_tokens) + " tokens (" + FormatBytes(run_frames * frame_bytes) + ")");
    }
  }
  for (bool paged : {true, false}) {
    if (!Has(o, paged ? AllocatorKind::kPaged : AllocatorKind::kContiguous)) continue;
    const uint64_t frames = ArenaFrames(o, st, paged);
    if (frames > UINT32_MAX || frames > (uint64_t{1} << 62) / frame_bytes) {
      return Status::InvalidArgument(
          std::string("the ") + (paged ? "paged" : "contiguous") +
          " arena would need more than 2^32-1 frames; raise --block-tokens or lower --arena");
    }
  }
  return Status::Ok();
}

Result<ReplayResult> Replay(const Workload& w, const ReplayOptions& o) {
  TIERKV_RETURN_IF_ERROR(ValidateReplayOptions(w, o));
  ReplayResult result;
  result.stats = ComputeWorkloadStats(w, o.block_tokens);
  const std::vector<double> times = SampleTimes(w.duration_s(), o.samples);

  for (AllocatorKind kind : o.allocators) {
    AllocatorResult r;
    r.kind = kind;
    const auto start = std::chrono::steady_clock::now();
    if (kind == AllocatorKind::kPaged || kind == AllocatorKind::kContiguous) {
      const bool paged = kind == AllocatorKind::kPaged;
      SimModel model(w, o, paged, static_cast<uint32_t>(ArenaFrames(o, result.stats, paged)));
      r.samples.reserve(times.size());
      Drive(w, times, model, &r.samples);
      r.summary = Summarize(r.samples);
      CopyPeaks(model.peaks(), &r.summary);
      r.failed_sessions = model.failed();
      r.unit_bytes = model.unit_bytes();
      r.arena_bytes = model.arena_bytes();
      r.note = paged ? "simulated: tierkv::FrameAllocator, one frame per block, lowest free frame first"
                     : "simulated: one run of max_tokens per session, first fit";
    } else {
      std::unique_ptr<Heap> heap = kind == AllocatorKind::kMalloc ? NewGlibcHeap() : NewMimallocHeap();
      const Status usable = heap->Probe();
      if (!usable.ok()) {
        r.available = false;
        r.note = usable.message();
        result.allocators.push_back(std::move(r));
        continue;
      }
      r.byte_scale = o.real_scale;
      r.note = heap->Describe() + "; one allocation per alloc/grow event" +
               (r.byte_scale == 1
                    ? std::string()
                    : "; bytes divided by " + std::to_string(r.byte_scale) + " in the replay, results multiplied back");
      r.samples.reserve(times.size());
      {
        RealModel model(w, heap.get(), o.bytes_per_token, r.byte_scale);
        heap->TakeBaseline();
        Drive(w, times, model, &r.samples);
        r.failed_sessions = model.failed();
        r.summary = Summarize(r.samples);
        CopyPeaks(model.peaks(), &r.summary);
      }  // frees what is still live
      heap->ReturnMemory();
    }
    r.replay_s = SecondsSince(start);
    result.allocators.push_back(std::move(r));
  }
  return result;
}

}  // namespace tierkv::fragbench
