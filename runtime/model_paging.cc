// runtime/model_paging.cc
//
// Weights as pages (Model::UseMemory): one page per layer (its attention and dense FFN
// matrices), one per expert (its gate, up and down rows), one for the output matrix,
// all backed by the GGUF mapping through a PageSource, so they are read on first use
// and dropped without a copy when evicted. The forward step pins them on the compute
// tier and reads them through views rebased onto the pin; the bytes are the file's, so
// the arithmetic is the same as reading the mapping in place.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>

#include "memory/fd.h"
#include "memory/size.h"
#include "runtime/model.h"
#include "runtime/model_internal.h"

namespace tierkv {
namespace {

constexpr size_t kPartAlign = 64;  // each matrix starts on a cache line of the page

size_t AlignUp(size_t x) { return (x + kPartAlign - 1) / kPartAlign * kPartAlign; }


// Pages of weights: key -> the parts to copy out of the mapping.
class WeightSource : public PageSource {
 public:
  explicit WeightSource(std::shared_ptr<const GgufFile> file) : file_(std::move(file)) {}

  uint64_t Add(std::vector<Model::WeightPart> parts) {
    pages_.push_back(std::move(parts));
    return pages_.size() - 1;
  }

  // A file's parts are read with pread rather than copied from the mapping: the same
  // bytes, but no mapped page is touched, so paged weights stay out of the process's
  // RSS (a 17 GiB model under a 6 GiB host budget peaked at 11 GiB RSS reading the
  // mapping; docs/history/2026-12-05-weights-rss.md). Images in memory are copied.
  Status ReadPage(uint64_t key, std::span<std::byte> out) override {
    if (key >= pages_.size()) return Status::Internal("weight page key " + std::to_string(key) + " out of range");
    size_t end = 0;
    for (const Model::WeightPart& p : pages_[key]) {
      if (p.offset < end || p.offset + p.bytes > out.size()) {
        return Status::Internal("weight page part out of order or past the page's end");
      }
      std::memset(out.data() + end, 0, p.offset - end);  // deterministic padding
      if (file_->fd() >= 0) {
        TIERKV_RETURN_IF_ERROR(ReadAt(out.data() + p.offset, p.bytes, static_cast<uint64_t>(p.src - file_->base())));
      } else {
        std::memcpy(out.data() + p.offset, p.src, p.bytes);
      }
      end = p.offset + p.bytes;
    }
    std::memset(out.data() + end, 0, out.size() - end);
    return Status::Ok();
  }

 private:
  Status ReadAt(std::byte* dst, size_t n, uint64_t at) const {
    return PreadFully(file_->fd(), dst, n, at, "weights from " + file_->path());
  }

  std::shared_ptr<const GgufFile> file_;  // keeps the mapping (and its descriptor) alive
  std::vector<std::vector<Model::WeightPart>> pages_;
};

size_t MatrixBytes(const kernels::MatrixView& m) { return static_cast<size_t>(m.rows) * m.row_bytes; }

}  // namespace

std::span<kernels::MatrixView Model::Layer::* const> Model::Layer::PagedMatrices() {
  static constexpr kernels::MatrixView Layer::*kMatrices[] = {&Layer::wq, &Layer::wk, &Layer::wv, &Layer::wo,
                                                             &Layer::gate, &Layer::up, &Layer::down};
  return kMatrices;
}

// The weight pages in key order: layers (0 .. n_layer-1), the output matrix
// (n_layer), then each layer's experts in id order. A layer page's parts are in
// Layer::PagedMatrices order; an expert's are gate, up, down. Experts smaller than half
// a frame share pages, as many consecutive ones as a frame holds (builtin:tiny-moe's
// 209 KiB experts: four to a 1 MiB frame, where one each left three quarters of every
// frame empty and a 64 MiB tier held a quarter of the experts it could).
std::vector<Model::WeightPage> Model::PlanWeightPages(uint64_t frame_bytes) const {
  const ModelConfig& c = cfg_;
  std::vector<WeightPage> pages;
  for (int l = 0; l < c.n_layer; ++l) {
    const Layer& L = w_->layers[static_cast<size_t>(l)];
    WeightPage page{"layer " + std::to_string(l) + "'s weights", {}, 0};
    for (auto member : Layer::PagedMatrices()) {
      const kernels::MatrixView& m = L.*member;
      if (m.data == nullptr) continue;
      page.parts.push_back({static_cast<const uint8_t*>(m.data), MatrixBytes(m), page.bytes});
      page.bytes = AlignUp(page.bytes + MatrixBytes(m));
    }
    pages.push_back(std::move(page));
  }
  const size_t out_bytes = MatrixBytes(w_->output);
  pages.push_back({"the output matrix", {{static_cast<const uint8_t*>(w_->output.data), out_bytes, 0}}, out_bytes});
  if (c.is_moe()) {
    // Types may differ between layers (Q4_K_M keeps some in Q6_K): offsets per layer.
    for (int l = 0; l < c.n_layer; ++l) {
      const Layer& L = w_->layers[static_cast<size_t>(l)];
      const kernels::MatrixView* stacked[3] = {&L.gate_exps, &L.up_exps, &L.down_exps};
      const size_t sizes[3] = {MatrixBytes(L.gate_exps), MatrixBytes(L.up_exps), MatrixBytes(L.down_exps)};
      const size_t off[3] = {0, AlignUp(sizes[0]), AlignUp(sizes[0]) + AlignUp(sizes[1])};
      const size_t stride = AlignUp(off[2] + sizes[2]);
      const int per_page = frame_bytes >= 2 * stride
                               ? static_cast<int>(std::min<uint64_t>(frame_bytes / stride, static_cast<uint64_t>(c.n_expert)))
                               : 1;
      for (int first = 0; first < c.n_expert; first += per_page) {
        const int n = std::min(per_page, c.n_expert - first);
        WeightPage page{n == 1 ? "expert " + std::to_string(first) + " of layer " + std::to_string(l)
                               : "experts " + std::to_string(first) + "-" + std::to_string(first + n - 1) + " of layer " +
                                     std::to_string(l),
                        {}, 0, l, first, n, stride};
        for (int e = first; e < first + n; ++e) {
          const size_t base = static_cast<size_t>(e - first) * stride;
          for (int i = 0; i < 3; ++i) {
            const auto* src = static_cast<const uint8_t*>(stacked[i]->data) + static_cast<size_t>(e) * sizes[i];
            page.parts.push_back({src, sizes[i], base + off[i]});
          }
        }
        page.bytes = static_cast<size_t>(n - 1) * stride + off[2] + sizes[2];
        pages.push_back(std::move(page));
      }
    }
  }
  return pages;
}

uint64_t Model::LargestWeightPage(uint64_t frame_bytes) const {
  uint64_t max = 0;
  for (const WeightPage& p : PlanWeightPages(frame_bytes)) max = std::max<uint64_t>(max, p.bytes);
  return max;
}

uint64_t Model::WeightPageBytes(uint64_t frame_bytes) const {
  uint64_t sum = 0;
  for (const WeightPage& p : PlanWeightPages(frame_bytes)) sum += (p.bytes + frame_bytes - 1) / frame_bytes * frame_bytes;
  return sum;
}

Status Model::UseMemory(MemoryManager* mm) {
  if (mm == nullptr) return Status::InvalidArgument("model: no memory manager");
  if (mm_ != nullptr) return Status::FailedPrecondition("model: weights are already placed in a memory manager");
  const Tier tier = exec_->tier_for(*mm);
  const uint64_t budget = mm->Stats(tier).budget_bytes;
  std::vector<WeightPage> plan = PlanWeightPages(mm->frame_bytes());
  for (const WeightPage& p : plan) {
    const uint64_t frames = (p.bytes + mm->frame_bytes() - 1) / mm->frame_bytes();
    if (frames * mm->frame_bytes() > budget) {
      return Status::InvalidArgument("model: the " + std::string(TierName(tier)) + " budget (" + FormatBytes(budget) +
                                     ") cannot hold " + p.what + " (" + FormatBytes(p.bytes) + "); raise it");
    }
  }
  // The views the forward step rebases onto a pin: each part's offset in its page.
  const size_t n_layer = static_cast<size_t>(cfg_.n_layer);
  layer_offsets_.assign(n_layer, {});
  expert_offsets_.assign(cfg_.is_moe() ? n_layer : 0, {});
  for (size_t l = 0; l < n_layer; ++l) {
    for (const WeightPart& part : plan[l].parts) layer_offsets_[l].push_back(part.offset);
  }
  for (size_t key = n_layer + 1; key < plan.size(); ++key) {
    const WeightPage& p = plan[key];
    if (p.first_expert == 0) {
      for (size_t i = 0; i < 3; ++i) expert_offsets_[static_cast<size_t>(p.layer)][i] = p.parts[i].offset;
    }
  }
  auto source = std::make_shared<WeightSource>(file_);
  for (WeightPage& p : plan) source->Add(std::move(p.parts));
  const int32_t src = mm->AddSource(source);
  std::vector<PageId> pages;
  pages.reserve(plan.size());
  for (uint64_t key = 0; key < plan.size(); ++key) {
    auto page = mm->RegisterBacked(plan[key].bytes, src, key, /*tag=*/1);
    if (!page.ok()) {
      for (PageId p : pages) (void)mm->Free(p);
      return page.status().Annotate("model: placing " + plan[key].what);
    }
    pages.push_back(*page);
  }
  layer_pages_.assign(pages.begin(), pages.begin() + static_cast<ptrdiff_t>(n_layer));
  output_page_ = pages[n_layer];
  const size_t n_expert = static_cast<size_t>(cfg_.n_expert);
  expert_pages_.assign(cfg_.is_moe() ? n_layer * n_expert : 0, PageId{});
  expert_base_.assign(expert_pages_.size(), 0);
  for (size_t key = n_layer + 1; key < plan.size(); ++key) {
    const WeightPage& p = plan[key];
    for (int i = 0; i < p.experts; ++i) {
      const size_t at = static_cast<size_t>(p.layer) * n_expert + static_cast<size_t>(p.first_expert + i);
      expert_pages_[at] = pages[key];
      expert_base_[at] = static_cast<size_t>(i) * p.expert_stride;
    }
  }
  mm_ = mm;
  weight_tier_ = tier;
  // Hybrid experts: misses computed on the host need the experts on a host tier of
  // their own, apart from the device's.
  hybrid_ = cfg_.is_moe() && options_.expert_split != ModelOptions::ExpertSplit::kDevice && tier == Tier::kDevice &&
            mm->has_tier(Tier::kHost);
  if (hybrid_) {
    host_exec_ = options_.host_executor != nullptr ? options_.host_executor
                 : exec_->host_memory()             ? exec_
                                                    : kernels::MakeCpuExecutor(options_.threads);
    h_ = std::make_unique<HostExperts>(host_exec_.get());
    split_ = ExpertSplitModel(options_.expert_rates);
  }
  return Status::Ok();
}

Result<Pin> Model::AcquireCounted(MemoryManager& mm, PageId page, Tier tier, double* wait, uint64_t* acquires,
                                  uint64_t* hits) {
  if (acquires != nullptr) ++*acquires;
  // A hit costs no clock reads (a step acquires hundreds of pages).
  if (Pin hit = mm.TryAcquire(page, tier, Access::kRead); hit.valid()) {
    if (hits != nullptr) ++*hits;
    return hit;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto pin = mm.Acquire(page, tier, Access::kRead);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  counters_.wait_s += waited;
  *wait += waited;
  if (hits != nullptr && pin.ok() && pin->hit()) ++*hits;
  return pin;
}

Status Model::AcquireLayer(int layer, Layer* out) {
  *out = w_->layers[static_cast<size_t>(layer)];
  if (mm_ == nullptr) return Status::Ok();
  auto pin = AcquireCounted(*mm_, layer_pages_[static_cast<size_t>(layer)], weight_tier_, &counters_.weight_wait_s,
                            &counters_.weight_acquires, &counters_.weight_hits);
  if (!pin.ok()) return pin.status().Annotate("weights of layer " + std::to_string(layer));
  size_t i = 0;
  for (auto member : Layer::PagedMatrices()) {
    kernels::MatrixView& m = out->*member;
    if (m.data == nullptr) continue;
    m.data = pin->data() + layer_offsets_[static_cast<size_t>(layer)][i++];
  }
  // The previous layer's page goes through Retire: a device executor may still be
  // reading it (the CPU executor releases it at once).
  if (s_->layer_pin.valid()) exec_->Retire(std::move(s_->layer_pin));
  s_->layer_pin = std::move(pin).value();
  return Status::Ok();
}

int Model::KvBatchBlocks(KvCache& cache, int n_blocks) const {
  if (options_.kv_batch_blocks > 0) return options_.kv_batch_blocks;
  const MemoryManager& mm = cache.memory();
  const Tier tier = exec_->tier_for(mm);
  const uint64_t block_frames = (cache.block_bytes() + mm.frame_bytes() - 1) / mm.frame_bytes();
  const uint64_t budget_frames = mm.Stats(tier).frames;
  return static_cast<int>(std::clamp<uint64_t>(budget_frames / 8 / std::max<uint64_t>(block_frames, 1), 1,
                                               static_cast<uint64_t>(std::max(n_blocks, 1))));
}

int Model::PrefillChunk(const KvCache& cache, SeqId seq, int batch) const {
  // 4096 tokens read the spilled blocks 64 times less often than the default chunk of
  // 64 (2048 read 10.4x the KV from the disk tier in a 131K prefill of builtin:tiny-moe
  // under the long-context budgets); 128 MiB keeps a chunk's arrays a small part of any
  // budget that spills.
  constexpr int kSpillChunkTokens = 4096;
  constexpr uint64_t kSpillChunkBytes = uint64_t{128} << 20;
  if (batch >= kSpillChunkTokens || cache.NumBlocks(seq) == 0) return batch;
  const MemoryManager& mm = cache.memory();
  bool spilled = false;
  for (int l = 0; l < cfg_.n_layer && !spilled; ++l) {
    for (int b = 0; b < cache.NumBlocks(seq) && !spilled; ++b) spilled = mm.TopTier(cache.BlockPage(seq, l, b)) == Tier::kDisk;
  }
  if (!spilled) return batch;
  // A chunk token's float arrays (SizeChunk, ChunkMoe), doubled for what else scales.
  const ModelConfig& c = cfg_;
  const uint64_t qd = static_cast<uint64_t>(c.n_head) * c.head_dim, kd = static_cast<uint64_t>(c.n_head_kv) * c.head_dim;
  const uint64_t ffn = c.is_moe() ? static_cast<uint64_t>(c.n_expert) +
                                        static_cast<uint64_t>(c.n_expert_used) * (static_cast<uint64_t>(c.n_embd) + 2 * c.n_ff_exp)
                                  : 2 * static_cast<uint64_t>(c.n_ff);
  const uint64_t per_token = 2 * 4 * (3 * static_cast<uint64_t>(c.n_embd) + 2 * qd + 2 * kd + ffn);
  const int cap = static_cast<int>(std::min<uint64_t>(kSpillChunkTokens, kSpillChunkBytes / per_token));
  return std::max(batch, cap);
}

std::vector<PageId> Model::PlanPrefetch(KvCache& cache, SeqId seq, int next) const {
  std::vector<PageId> pages;
  if (mm_ != nullptr) {
    pages.push_back(layer_pages_[static_cast<size_t>(next)]);
    if (next == 0) pages.push_back(output_page_);  // the last layer is computing: logits next
  }
  // The next layer's first KV batches (unless attention reads them where they lie), and
  // its last block (written before attention).
  const int n_blocks = cache.NumBlocks(seq);
  const int ahead = KvInPlace() ? 0 : std::min(kKvLookahead * KvBatchBlocks(cache, n_blocks), n_blocks);
  for (int b = 0; b < ahead; ++b) pages.push_back(cache.BlockPage(seq, next, b));
  if (n_blocks > ahead) pages.push_back(cache.BlockPage(seq, next, n_blocks - 1));
  return pages;
}

void Model::PrefetchLayer(KvCache& cache, SeqId seq, int next) {
  std::vector<PageId> pages = PlanPrefetch(cache, seq, next);
  // Fire and forget: a failed prefetch is retried, and reported, by the Acquire that
  // needs the page.
  counters_.prefetched_pages += pages.size();
  MemoryManager& mm = cache.memory();
  (void)mm.Prefetch(std::move(pages), exec_->tier_for(mm));
  // Layer 0's experts are predicted when the next token's embedding is known, at the
  // start of its step (ForwardLayers).
  if (next > 0) PredictExperts(next);
}

void Model::PredictExperts(int layer) {
  const ModelConfig& c = cfg_;
  predicted_.resize(static_cast<size_t>(c.n_layer));
  std::vector<int32_t>& predicted = predicted_[static_cast<size_t>(layer)];
  predicted.clear();
  // Predicted only where it is used: paged experts to fetch, or a routing trace.
  if (!c.is_moe() || (mm_ == nullptr && route_trace_ == nullptr)) return;
  // The layer's router on the current hidden state (normed as its input will be).
  Scratch& s = *s_;
  const Layer& N = w_->layers[static_cast<size_t>(layer)];
  exec_->RmsNorm(s.x.data(), N.ffn_norm, 1, c.n_embd, c.rms_eps, s.pred_xn.data());
  exec_->SetActivation(s.pred_act, s.pred_xn.data(), c.n_embd);
  exec_->MatVecOne(N.gate_inp, s.pred_act, s.router.data());
  const int extra = options_.predict_extra >= 0 ? options_.predict_extra : c.n_expert_used / 2;
  const int k = std::min(c.n_expert, c.n_expert_used + extra);
  predicted.resize(static_cast<size_t>(k));
  std::vector<float> weights(predicted.size());
  exec_->RouteTopK(s.router.data(), c.n_expert, k, c.norm_topk_prob, predicted.data(), weights.data());
  // One expert per task, so that a demand miss (urgent) waits for at most one expert's
  // copy in progress, not for the whole prediction.
  if (mm_ == nullptr) return;
  // Hybrid: a predicted expert the device lacks is fetched to the host, which computes
  // it on a miss (copies to the device are admissions, AdmitExperts).
  for (int32_t e : predicted) {
    const PageId page = expert_pages_[static_cast<size_t>(layer * c.n_expert + e)];
    if (hybrid_ && ExpertOnDevice(page)) continue;
    ++counters_.prefetched_pages;
    QueueExpert(layer, e, /*urgent=*/false, hybrid_ ? Tier::kHost : weight_tier_);
  }
}

}  // namespace tierkv
