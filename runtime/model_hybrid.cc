// runtime/model_hybrid.cc
//
// Hybrid experts (ModelOptions::expert_split kHost / kAuto; docs/gpu.md): with the
// weights paged onto a device tier, the experts a token picks that the device holds
// (hits) compute there, while the host CPU computes the others (misses) from the host
// tier, instead of copying each miss over the link first. The host's outputs are
// uploaded into the device's rows of the token's experts and all rows are combined in
// router order, so the logits are the bits of an all-device run: an expert's products
// are the same bits on either executor (the exact class of docs/gpu.md; on --device sim
// both are the CPU kernels), whichever side computed it.
//
// Order within a layer: the hits are queued on the device first (a GPU computes them
// while the host thread goes on), then the host computes its share, then the misses the
// cost model chose to copy compute on the device as their copies arrive. Afterwards at
// most expert_admit of the host's misses are copied to the device in the background
// (admissions), for the frequency policy to keep or evict.
#include "runtime/model.h"
#include "runtime/model_internal.h"

namespace tierkv {

// The bytes of one expert's gate, up and down rows (the cost model's unit).
uint64_t Model::ExpertBytes(const Layer& L) const {
  const auto bytes = [](const kernels::MatrixView& m) { return static_cast<uint64_t>(m.rows) * m.row_bytes; };
  return bytes(L.gate_exps) + bytes(L.up_exps) + bytes(L.down_exps);
}

// Moe once the token is routed (s.expert_ids, s.expert_weights), hybrid.
Status Model::HybridMoe(const Layer& L, int layer) {
  const ModelConfig& c = cfg_;
  Scratch& s = *s_;
  HostExperts& h = *h_;
  const size_t n_embd = static_cast<size_t>(c.n_embd);
  s.expert_out.resize(static_cast<size_t>(c.n_expert_used) * n_embd);
  h.device.clear();
  h.misses.clear();
  SplitHits(layer, s.expert_ids, &h.device, &h.misses);
  const int hits = static_cast<int>(h.device.size()), misses = static_cast<int>(h.misses.size());
  const int on_host = options_.expert_split == ModelOptions::ExpertSplit::kHost
                          ? misses
                          : split_.HostMisses(hits, misses, ExpertBytes(L));
  // The first misses in router order are copied (queued now, computed after the hits);
  // the host computes the rest.
  const size_t copied = static_cast<size_t>(misses - on_host);
  const std::span<const int> to_copy(h.misses.data(), copied);
  h.host.assign(h.misses.begin() + static_cast<std::ptrdiff_t>(copied), h.misses.end());
  for (int i : to_copy) QueueExpert(layer, s.expert_ids[static_cast<size_t>(i)], /*urgent=*/true, weight_tier_);
  counters_.experts_on_device += static_cast<uint64_t>(hits) + copied;
  counters_.experts_copied += copied;
  counters_.experts_on_host += h.host.size();
  // The host's input is read back before the hits are queued: a read-back waits for
  // the device's queue, and the hits are to run while the host computes.
  if (!h.host.empty()) {
    h.xn.resize(n_embd);
    exec_->ReadBack(h.xn.data(), s.xn.data(), n_embd * sizeof(float));
  }
  if (hits > 0) TIERKV_RETURN_IF_ERROR(MoeGroup(L, layer, h.device));
  if (!h.host.empty()) TIERKV_RETURN_IF_ERROR(HostMoeGroup(L, layer, h.host));
  for (size_t m = 0; m < copied; ++m) TIERKV_RETURN_IF_ERROR(MoeGroup(L, layer, to_copy.subspan(m, 1)));
  // Admissions: the host's experts (ids; h.misses is free again).
  h.misses.clear();
  for (int i : h.host) h.misses.push_back(s.expert_ids[static_cast<size_t>(i)]);
  AdmitExperts(layer, h.misses);
  exec_->CombineExperts(s.expert_weights.data(), s.expert_out.data(), c.n_expert_used, c.n_embd, s.moe_out.data());
  return Status::Ok();
}

// The token's experts in `slots` on the host executor, each pinned on the host tier, as
// the device computes them (ExpertGroup), from the token's input in h.xn (read back by
// HybridMoe); their outputs uploaded into their rows of s.expert_out.
Status Model::HostMoeGroup(const Layer& L, int layer, std::span<const int> slots) {
  const ModelConfig& c = cfg_;
  Scratch& s = *s_;
  HostExperts& h = *h_;
  const size_t n_embd = static_cast<size_t>(c.n_embd);
  host_exec_->SetActivation(h.act, h.xn.data(), c.n_embd);
  h.out.resize(static_cast<size_t>(c.n_expert_used) * n_embd);
  double seconds = 0;
  TIERKV_RETURN_IF_ERROR(ExpertGroup(L, layer, slots, *host_exec_, Tier::kHost, h.work, h.act, h.out.data(), &seconds));
  split_.ObserveHost(ExpertBytes(L) * slots.size(), 1, seconds);
  for (int i : slots) {
    const size_t u = static_cast<size_t>(i);
    exec_->Upload(s.expert_out.data() + u * n_embd, h.out.data() + u * n_embd, n_embd * sizeof(float));
  }
  return Status::Ok();
}

// Expert e of a prefill chunk on the host executor for its users `who` ((token, slot)
// pairs), as the device computes a chunk's expert (ChunkExpert); each token's output
// uploaded into its row of s.chunk_expert_out. The chunk's inputs are in h.xn (read back
// by ChunkMoe), converted here on first use.
Status Model::HostChunkExpert(const Layer& L, int layer, int e, std::span<const std::pair<int, int>> who,
                              size_t n_tokens) {
  const ModelConfig& c = cfg_;
  Scratch& s = *s_;
  HostExperts& h = *h_;
  const size_t k = static_cast<size_t>(c.n_expert_used), n_embd = static_cast<size_t>(c.n_embd);
  h.work.in_ptrs.clear();
  for (const auto& [t, slot] : who) {
    const size_t tu = static_cast<size_t>(t);
    if (tu >= n_tokens) return Status::Internal("hybrid experts: a user outside the chunk");
    if (h.act_set[tu] == 0) {
      host_exec_->SetActivation(h.acts[tu], h.xn.data() + tu * n_embd, c.n_embd);
      h.act_set[tu] = 1;
    }
    h.work.in_ptrs.push_back(&h.acts[tu]);
  }
  double seconds = 0;
  TIERKV_RETURN_IF_ERROR(ChunkExpert(L, layer, e, *host_exec_, Tier::kHost, h.work, &seconds));
  split_.ObserveHost(ExpertBytes(L), static_cast<int>(who.size()), seconds);
  for (size_t r = 0; r < who.size(); ++r) {
    const auto [t, slot] = who[r];
    exec_->Upload(s.chunk_expert_out.data() + (static_cast<size_t>(t) * k + static_cast<size_t>(slot)) * n_embd,
                  h.work.out.data() + r * n_embd, n_embd * sizeof(float));
  }
  return Status::Ok();
}

// Whether the page's top copy is on the device. Not "or arriving": a page in flight may
// be moving to the host (a predicted expert), and a device acquire of it would copy it
// up, unbudgeted; a page still arriving at the device is computed on the host this time.
bool Model::ExpertOnDevice(PageId page) const { return mm_->TopTier(page) == weight_tier_; }

// Background copies to the device of at most expert_admit of `experts` (ids of the
// layer's host-computed misses, most wanted first) that it neither holds nor receives.
void Model::AdmitExperts(int layer, std::span<const int> experts) {
  int admitted = 0;
  for (int e : experts) {
    if (admitted >= options_.expert_admit) break;
    const PageId page = expert_pages_[static_cast<size_t>(layer * cfg_.n_expert + e)];
    if (ExpertOnDevice(page)) continue;
    (void)mm_->Prefetch({page}, weight_tier_, /*urgent=*/false);
    ++counters_.experts_admitted;
    ++admitted;
  }
}

}  // namespace tierkv
