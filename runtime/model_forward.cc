// runtime/model_forward.cc
//
// One decode step. The order of operations and the places where activations are
// rounded follow llama.cpp's graph for these architectures (docs/kernels.md).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

#include "runtime/model.h"
#include "runtime/model_internal.h"

namespace tierkv {
namespace {

using kernels::MatrixView;
using kernels::MatVecJob;

// Expert e's rows of a stacked [n_expert][rows][cols] tensor.
MatrixView Expert(const MatrixView& stacked, int e) {
  MatrixView m = stacked;
  m.data = static_cast<const uint8_t*>(stacked.data) + static_cast<size_t>(e) * stacked.rows * stacked.row_bytes;
  return m;
}

}  // namespace

Status Model::CheckStep(KvCache& cache, SeqId seq, int pos) const {
  const KvGeometry& g = cache.geometry();
  if (g.n_layers != cfg_.n_layer || g.n_kv_heads != cfg_.n_head_kv || g.head_dim != cfg_.head_dim) {
    return Status::InvalidArgument("model: KV cache geometry (" + g.ToString() + ") does not fit the model (" +
                                   cfg_.ToString() + ")");
  }
  const int length = cache.Length(seq);
  if (length < 0) return Status::NotFound("model: unknown sequence " + std::to_string(seq.value));
  if (pos != length) {
    return Status::InvalidArgument("model: position " + std::to_string(pos) + " is not the next position (" +
                                   std::to_string(length) + ") of the sequence");
  }
  if (mm_ != nullptr && &cache.memory() != mm_) {
    return Status::InvalidArgument("model: the KV cache is on another memory manager than the model's weights");
  }
  return Status::Ok();
}

// Every pin the step holds, handed to the executor (released once the compute that
// reads them has completed): after a step, and on its error paths.
void Model::RetirePins() {
  Scratch& s = *s_;
  RetireKvPins();
  exec_->Retire(std::move(s.layer_pin));
  for (Pin& pin : s.experts.pins) exec_->Retire(std::move(pin));
}

// The KV blocks (or output matrix) pinned in s_->pins, handed to the executor.
void Model::RetireKvPins() {
  for (Pin& pin : s_->pins) exec_->Retire(std::move(pin));
  s_->pins.clear();
}

namespace {

Status CheckToken(int32_t token, int n_vocab) {
  if (token < 0 || token >= n_vocab) {
    return Status::InvalidArgument("model: token id " + std::to_string(token) + " outside the vocabulary of " +
                                   std::to_string(n_vocab));
  }
  return Status::Ok();
}

}  // namespace

Status Model::Forward(KvCache& cache, SeqId seq, int32_t token, int pos, std::span<float> logits) {
  TIERKV_RETURN_IF_ERROR(CheckStep(cache, seq, pos));
  TIERKV_RETURN_IF_ERROR(CheckToken(token, cfg_.n_vocab));
  if (!logits.empty() && logits.size() != static_cast<size_t>(cfg_.n_vocab)) {
    return Status::InvalidArgument("model: logits span has " + std::to_string(logits.size()) + " entries, vocab is " +
                                   std::to_string(cfg_.n_vocab));
  }
  const auto t0 = std::chrono::steady_clock::now();
  TIERKV_ASSIGN_OR_RETURN(const int appended, cache.AppendToken(seq));
  if (appended != pos) return Status::Internal("model: KV cache appended at an unexpected position");
  Status st = ForwardLayers(cache, seq, token, pos, logits);
  RetirePins();
  if (!st.ok()) (void)cache.Truncate(seq, pos);
  ++counters_.steps;
  counters_.step_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

Status Model::ForwardBatch(KvCache& cache, SeqId seq, std::span<const int32_t> tokens, int pos,
                           std::span<const int> logit_rows, std::span<float> logits) {
  TIERKV_RETURN_IF_ERROR(CheckStep(cache, seq, pos));
  for (int32_t token : tokens) TIERKV_RETURN_IF_ERROR(CheckToken(token, cfg_.n_vocab));
  const size_t n_vocab = static_cast<size_t>(cfg_.n_vocab);
  if (logits.size() != logit_rows.size() * n_vocab) {
    return Status::InvalidArgument("model: logits span has " + std::to_string(logits.size()) + " entries for " +
                                   std::to_string(logit_rows.size()) + " rows of " + std::to_string(n_vocab));
  }
  for (size_t r = 0; r < logit_rows.size(); ++r) {
    if (logit_rows[r] < 0 || static_cast<size_t>(logit_rows[r]) >= tokens.size() ||
        (r > 0 && logit_rows[r] <= logit_rows[r - 1])) {
      return Status::InvalidArgument("model: logit rows must be ascending entries of the " +
                                     std::to_string(tokens.size()) + "-token chunk");
    }
  }
  if (tokens.empty()) return Status::Ok();
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < tokens.size(); ++i) {
    auto appended = cache.AppendToken(seq);
    if (!appended.ok() || *appended != pos + static_cast<int>(i)) {
      (void)cache.Truncate(seq, pos);
      return appended.ok() ? Status::Internal("model: KV cache appended at an unexpected position")
                           : appended.status();
    }
  }
  Status st = ForwardChunk(cache, seq, tokens, pos, logit_rows, logits);
  RetirePins();
  if (!st.ok()) (void)cache.Truncate(seq, pos);
  counters_.steps += tokens.size();
  counters_.step_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

// One token through every layer. Per layer: first the plan of what the next layer
// needs (PlanPrefetch, no side effects) queued on the copy stream with the next layer's
// predicted experts, then this layer's weights pinned and its blocks applied.
Status Model::ForwardLayers(KvCache& cache, SeqId seq, int32_t token, int pos, std::span<float> logits) {
  Scratch& s = *s_;
  exec_->GetRow(w_->token_embd, token, s.x.data());
  // Layer 0's experts, predicted from the embedding, fetch while its attention computes.
  if (options_.prefetch) PredictExperts(0);
  for (int l = 0; l < cfg_.n_layer; ++l) {
    // What layer l + 1 needs (after the last layer: layer 0 of the next step) is queued
    // on the copy stream before layer l computes.
    if (options_.prefetch) PrefetchLayer(cache, seq, (l + 1) % cfg_.n_layer);
    Layer L;
    TIERKV_RETURN_IF_ERROR(AcquireLayer(l, &L));
    TIERKV_RETURN_IF_ERROR(AttentionInput(cache, seq, L, l, pos));
    TIERKV_RETURN_IF_ERROR(Attention(cache, seq, l, pos, 1, /*chunk=*/false, s.q.data(), s.attn.data()));
    AttentionOutputProjection(L);
    TIERKV_RETURN_IF_ERROR(FeedForward(L, l, pos));
  }
  exec_->Retire(std::move(s.layer_pin));
  return logits.empty() ? Status::Ok() : Logits(logits);
}

namespace {

// Row i of a chunk's [n][width] array.
float* Row(kernels::ExecArray<float>& a, size_t i, size_t width) { return a.data() + i * width; }

}  // namespace

// The chunk layer by layer: per token the arithmetic of ForwardLayers, with each matrix
// multiplied by all the chunk's tokens in one pass (MatMul: quantized weights give the
// bits of one MatVec per token, F32 / F16 / BF16 sum as a batch), attention once for
// all the chunk's queries, and each selected expert once for all its tokens (ChunkMoe).
// A MoE layer's weight page is released only after every token's output projection, as
// one token's step releases it.
Status Model::ForwardChunk(KvCache& cache, SeqId seq, std::span<const int32_t> tokens, int pos,
                           std::span<const int> logit_rows, std::span<float> logits) {
  const ModelConfig& c = cfg_;
  Scratch& s = *s_;
  const size_t n = tokens.size(), n_embd = static_cast<size_t>(c.n_embd);
  SizeChunk(n);
  float* const xs = s.chunk_x.data();
  for (size_t i = 0; i < n; ++i) exec_->GetRow(w_->token_embd, tokens[i], xs + i * n_embd);
  // The experts are predicted for the chunk's last token (its hidden state in s.x).
  const auto last_to_x = [&] { exec_->Copy(s.x.data(), xs + (n - 1) * n_embd, n_embd * sizeof(float)); };
  if (options_.prefetch) {
    last_to_x();
    PredictExperts(0);
  }
  for (int l = 0; l < c.n_layer; ++l) {
    if (options_.prefetch) {
      last_to_x();
      PrefetchLayer(cache, seq, (l + 1) % c.n_layer);
    }
    Layer L;
    TIERKV_RETURN_IF_ERROR(AcquireLayer(l, &L));
    TIERKV_RETURN_IF_ERROR(ChunkAttentionBlock(cache, seq, L, l, pos, static_cast<int>(n)));
    TIERKV_RETURN_IF_ERROR(ChunkFeedForwardBlock(L, l, pos, static_cast<int>(n)));
  }
  exec_->Retire(std::move(s.layer_pin));
  return logit_rows.empty() ? Status::Ok() : ChunkLogits(logit_rows, logits);
}

// The chunk's arrays for n tokens, and one activation row per token.
void Model::SizeChunk(size_t n) {
  const ModelConfig& c = cfg_;
  Scratch& s = *s_;
  const size_t n_embd = static_cast<size_t>(c.n_embd), qd = s.q.size(), kd = s.k.size();
  s.chunk_x.resize(n * n_embd);
  s.chunk_xn.resize(n * n_embd);
  s.chunk_q.resize(n * qd);
  s.chunk_k.resize(n * kd);
  s.chunk_v.resize(n * kd);
  s.chunk_attn.resize(n * qd);
  s.chunk_proj.resize(n * n_embd);
  if (!c.is_moe()) {
    s.chunk_gate.resize(n * static_cast<size_t>(c.n_ff));
    s.chunk_up.resize(n * static_cast<size_t>(c.n_ff));
  }
  if (s.chunk_acts.size() < n) s.chunk_acts.resize(n);
  s.chunk_act_ptrs.clear();
  for (size_t i = 0; i < n; ++i) s.chunk_act_ptrs.push_back(&s.chunk_acts[i]);
}

// The chunk's activations (s.chunk_act_ptrs) = its n rows of `in` ([n][width]); with
// `norm`, in = RMSNorm(chunk_x) * norm first.
void Model::SetChunkActivations(kernels::ExecArray<float>& in, size_t width, const float* norm, size_t n) {
  const ModelConfig& c = cfg_;
  Scratch& s = *s_;
  const size_t n_embd = static_cast<size_t>(c.n_embd);
  for (size_t i = 0; i < n; ++i) {
    float* r = Row(in, i, width);
    if (norm != nullptr) exec_->RmsNorm(s.chunk_x.data() + i * n_embd, norm, 1, c.n_embd, c.rms_eps, r);
    exec_->SetActivation(*s.chunk_act_ptrs[i], r, static_cast<int64_t>(width));
  }
}

// x += wo(attention(RoPE(q, k), v)) for the chunk's n tokens at pos .. pos + n - 1:
// Q/K/V in one pass per matrix, each token's K/V written to the cache, attention for
// all the queries.
Status Model::ChunkAttentionBlock(KvCache& cache, SeqId seq, const Layer& L, int layer, int pos, int n) {
  const ModelConfig& c = cfg_;
  Scratch& s = *s_;
  const size_t nt = static_cast<size_t>(n), n_embd = static_cast<size_t>(c.n_embd), qd = s.q.size(), kd = s.k.size();
  kernels::ActivationRow* const* acts = s.chunk_act_ptrs.data();
  // With llama.cpp's sums, its repacked Q4_K gemm's activation rounding too
  // (kernels::MatMulJob::llama_gemm).
  constexpr kernels::TokenSums kBatched = kernels::TokenSums::kBatched;
  const bool gemm = options_.llama_attention_sums;
  SetChunkActivations(s.chunk_xn, n_embd, L.attn_norm, nt);
  const kernels::MatMulJob qkv[] = {{&L.wq, acts, n, s.chunk_q.data(), qd, kBatched, gemm},
                                    {&L.wk, acts, n, s.chunk_k.data(), kd, kBatched, gemm},
                                    {&L.wv, acts, n, s.chunk_v.data(), kd, kBatched, gemm}};
  exec_->MatMul(qkv);
  for (size_t i = 0; i < nt; ++i) {
    TIERKV_RETURN_IF_ERROR(QkvToCache(cache, seq, L, layer, pos + static_cast<int>(i), Row(s.chunk_q, i, qd),
                                      Row(s.chunk_k, i, kd), Row(s.chunk_v, i, kd)));
  }
  TIERKV_RETURN_IF_ERROR(Attention(cache, seq, layer, pos, n, /*chunk=*/true, s.chunk_q.data(), s.chunk_attn.data()));
  SetChunkActivations(s.chunk_attn, qd, nullptr, nt);
  const kernels::MatMulJob wo[] = {{&L.wo, acts, n, s.chunk_proj.data(), n_embd, kBatched, gemm}};
  exec_->MatMul(wo);
  for (size_t i = 0; i < nt; ++i) exec_->Add(s.chunk_x.data() + i * n_embd, Row(s.chunk_proj, i, n_embd), n_embd);
  return Status::Ok();
}

// x += FFN or MoE of RMSNorm(x) for the chunk's n tokens.
Status Model::ChunkFeedForwardBlock(const Layer& L, int layer, int pos, int n) {
  const ModelConfig& c = cfg_;
  Scratch& s = *s_;
  const size_t nt = static_cast<size_t>(n), n_embd = static_cast<size_t>(c.n_embd), n_ff = static_cast<size_t>(c.n_ff);
  kernels::ActivationRow* const* acts = s.chunk_act_ptrs.data();
  SetChunkActivations(s.chunk_xn, n_embd, L.ffn_norm, nt);
  if (c.is_moe()) {
    exec_->Retire(std::move(s.layer_pin));  // the experts are separate pages: keep the working set small
    return ChunkMoe(L, layer, pos, n, acts, s.chunk_x.data());
  }
  constexpr kernels::TokenSums kBatched = kernels::TokenSums::kBatched;
  const bool gemm = options_.llama_attention_sums;
  const kernels::MatMulJob gu[] = {{&L.gate, acts, n, s.chunk_gate.data(), n_ff, kBatched, gemm},
                                   {&L.up, acts, n, s.chunk_up.data(), n_ff, kBatched, gemm}};
  exec_->MatMul(gu);
  for (size_t i = 0; i < nt; ++i) {
    float* g = Row(s.chunk_gate, i, n_ff);
    exec_->SwiGlu(g, Row(s.chunk_up, i, n_ff), g, c.n_ff);
  }
  SetChunkActivations(s.chunk_gate, n_ff, nullptr, nt);
  const kernels::MatMulJob down[] = {{&L.down, acts, n, s.chunk_proj.data(), n_embd, kBatched, gemm}};
  exec_->MatMul(down);
  for (size_t i = 0; i < nt; ++i) exec_->Add(s.chunk_x.data() + i * n_embd, Row(s.chunk_proj, i, n_embd), n_embd);
  return Status::Ok();
}

// The logits of the chunk entries in logit_rows: one product of the output matrix with
// all those rows, summed as a batch (F16 / BF16 / F32: kernels::TokenSums) however many
// there are, so that a row's logits do not depend on how the prompt was cut into
// chunks. (llama.cpp sums a batch of one output as one token; a run reads one row,
// where the orders differ in the last bits.)
Status Model::ChunkLogits(std::span<const int> logit_rows, std::span<float> logits) {
  const ModelConfig& c = cfg_;
  Scratch& s = *s_;
  const size_t n_embd = static_cast<size_t>(c.n_embd), nr = logit_rows.size();
  kernels::ActivationRow* const* acts = s.chunk_act_ptrs.data();
  kernels::MatrixView output;
  TIERKV_RETURN_IF_ERROR(AcquireOutput(&output));
  for (size_t r = 0; r < nr; ++r) {
    float* xn = Row(s.chunk_xn, r, n_embd);
    exec_->RmsNorm(s.chunk_x.data() + static_cast<size_t>(logit_rows[r]) * n_embd, w_->output_norm, 1, c.n_embd,
                   c.rms_eps, xn);
    exec_->SetActivation(*acts[r], xn, c.n_embd);
  }
  float* y = HostLogitsOr(logits);
  const kernels::MatMulJob out[] = {{&output, acts, static_cast<int>(nr), y, static_cast<size_t>(c.n_vocab),
                                     kernels::TokenSums::kBatched, options_.llama_attention_sums}};
  exec_->MatMul(out);
  exec_->ReadBack(logits.data(), y, logits.size_bytes());
  return Status::Ok();
}

Status Model::AttentionInput(KvCache& cache, SeqId seq, const Layer& L, int layer, int pos) {
  const ModelConfig& c = cfg_;
  Scratch& s = *s_;
  exec_->RmsNorm(s.x.data(), L.attn_norm, 1, c.n_embd, c.rms_eps, s.xn.data());
  exec_->SetActivation(s.act, s.xn.data(), c.n_embd);
  const MatVecJob qkv[] = {{&L.wq, &s.act, s.q.data()}, {&L.wk, &s.act, s.k.data()}, {&L.wv, &s.act, s.v.data()}};
  exec_->MatVec(qkv);
  return QkvToCache(cache, seq, L, layer, pos, s.q.data(), s.k.data(), s.v.data());
}

Status Model::QkvToCache(KvCache& cache, SeqId seq, const Layer& L, int layer, int pos, float* q, float* k, float* v) {
  const ModelConfig& c = cfg_;
  Scratch& s = *s_;
  const size_t qd = s.q.size(), kd = s.k.size();
  if (L.bq != nullptr) {
    exec_->Add(q, L.bq, qd);
    exec_->Add(k, L.bk, kd);
    exec_->Add(v, L.bv, kd);
  }
  if (c.qk_norm) {
    exec_->RmsNorm(q, L.q_norm, c.n_head, c.head_dim, c.rms_eps, q);
    exec_->RmsNorm(k, L.k_norm, c.n_head_kv, c.head_dim, c.rms_eps, k);
  }
  exec_->Rope(rope_, pos, q, c.n_head, c.head_dim);
  exec_->Rope(rope_, pos, k, c.n_head_kv, c.head_dim);
  TIERKV_ASSIGN_OR_RETURN(KvCache::WriteTarget t, cache.PrepareWrite(seq, layer, pos, exec_->tier_for(cache.memory())));
  exec_->AppendKv(cache.codec(), t.slot, k, v);
  // The block's key bounds are kept on the host: from k where it is host memory.
  cache.NoteKeys(t.block, exec_->host_memory() ? k : nullptr);
  exec_->Retire(std::move(t.pin));
  return Status::Ok();
}

// x += wo(attn).
void Model::AttentionOutputProjection(const Layer& L) {
  Scratch& s = *s_;
  exec_->SetActivation(s.act2, s.attn.data(), static_cast<int64_t>(s.attn.size()));
  exec_->MatVecOne(L.wo, s.act2, s.proj.data());
  exec_->Add(s.x.data(), s.proj.data(), s.x.size());
}

// x += FFN or MoE of RMSNorm(x).
Status Model::FeedForward(const Layer& L, int layer, int pos) {
  const ModelConfig& c = cfg_;
  Scratch& s = *s_;
  exec_->RmsNorm(s.x.data(), L.ffn_norm, 1, c.n_embd, c.rms_eps, s.xn.data());
  if (c.is_moe()) {
    exec_->Retire(std::move(s.layer_pin));  // the experts are separate pages: keep the working set small
    TIERKV_RETURN_IF_ERROR(Moe(L, layer, pos));
    exec_->Add(s.x.data(), s.moe_out.data(), s.x.size());
  } else {
    Ffn(L);
    exec_->Add(s.x.data(), s.proj.data(), s.x.size());
  }
  return Status::Ok();
}

// The output matrix, its page pinned (in s_->pins) for the step.
Status Model::AcquireOutput(kernels::MatrixView* output) {
  *output = w_->output;
  if (mm_ != nullptr) {
    auto pin = AcquireCounted(*mm_, output_page_, weight_tier_, &counters_.weight_wait_s, &counters_.weight_acquires,
                              &counters_.weight_hits);
    if (!pin.ok()) return pin.status().Annotate("output weights");
    output->data = pin->data();
    s_->pins.push_back(std::move(pin).value());
  }
  return Status::Ok();
}

// Where the output projection writes `logits` (the caller's host array): there, when
// the executor computes on host memory; else a scratch array read back after it.
float* Model::HostLogitsOr(std::span<float> logits) {
  if (exec_->host_memory()) return logits.data();
  s_->logits.resize(logits.size());
  return s_->logits.data();
}

// logits = output(RMSNorm(x)).
Status Model::Logits(std::span<float> logits) {
  Scratch& s = *s_;
  kernels::MatrixView output;
  TIERKV_RETURN_IF_ERROR(AcquireOutput(&output));
  exec_->RmsNorm(s.x.data(), w_->output_norm, 1, cfg_.n_embd, cfg_.rms_eps, s.xn.data());
  exec_->SetActivation(s.act, s.xn.data(), cfg_.n_embd);
  float* y = HostLogitsOr(logits);
  exec_->MatVecOne(output, s.act, y);
  exec_->ReadBack(logits.data(), y, logits.size_bytes());
  return Status::Ok();
}

// proj = down(SiLU(gate(xn)) * up(xn)).
void Model::Ffn(const Layer& L) {
  Scratch& s = *s_;
  exec_->SetActivation(s.act, s.xn.data(), cfg_.n_embd);
  const MatVecJob gu[] = {{&L.gate, &s.act, s.gate.data()}, {&L.up, &s.act, s.up.data()}};
  exec_->MatVec(gu);
  exec_->SwiGlu(s.gate.data(), s.up.data(), s.gate.data(), cfg_.n_ff);
  exec_->SetActivation(s.act2, s.gate.data(), cfg_.n_ff);
  exec_->MatVecOne(L.down, s.act2, s.proj.data());
}

// The experts of one token from its router logits: ids and weights [n_expert_used] in
// router order; counts the prediction's recall and records the routing trace. `predicted`:
// the layer's prediction was made for this token (in a chunk, only for the last one).
void Model::Route(int layer, int pos, const float* router, bool predicted_for_it, int* ids, float* weights) {
  const ModelConfig& c = cfg_;
  exec_->RouteTopK(router, c.n_expert, c.n_expert_used, c.norm_topk_prob, ids, weights);
  static const std::vector<int32_t> kNone;
  const bool have = predicted_for_it && options_.prefetch && static_cast<size_t>(layer) < predicted_.size();
  const std::vector<int32_t>& predicted = have ? predicted_[static_cast<size_t>(layer)] : kNone;
  if (!predicted.empty()) {
    counters_.experts_chosen_predicted += static_cast<uint64_t>(c.n_expert_used);
    for (int i = 0; i < c.n_expert_used; ++i) {
      counters_.experts_chosen_in_prediction += std::count(predicted.begin(), predicted.end(), ids[i]) > 0 ? 1 : 0;
    }
  }
  if (route_trace_ != nullptr) {
    route_trace_->push_back({pos, layer, std::vector<int32_t>(ids, ids + c.n_expert_used), predicted});
  }
}

// Paged: the compute order of `experts` (of one layer): those already on the compute
// tier (or arriving from the prediction made a layer earlier) first, counted as hits;
// then the misses, the first `window` of which are queued now as urgent copies (in
// order), to run while the hits compute; MissAhead queues each later one as the miss
// `window` places before it starts computing. So at most `window` expert copies are in
// flight: a chunk's misses can be more experts than the compute tier holds at once.
// Returns the number of hits. Unpaged: the given order, all hits.
int Model::ExpertOrder(int layer, std::span<const int> experts, int window, std::vector<int>* order) {
  order->clear();
  if (mm_ == nullptr) {
    for (size_t i = 0; i < experts.size(); ++i) order->push_back(static_cast<int>(i));
    return static_cast<int>(experts.size());
  }
  std::vector<int> misses;
  SplitHits(layer, experts, order, &misses);
  const int hits = static_cast<int>(order->size());
  order->insert(order->end(), misses.begin(), misses.end());
  for (int m = 0; m < window && m < static_cast<int>(misses.size()); ++m) {
    QueueExpert(layer, experts[static_cast<size_t>(misses[static_cast<size_t>(m)])], /*urgent=*/true, weight_tier_);
  }
  return hits;
}

// Paged: the indices of `experts` (of one layer) that are hits appended to *hits, the
// others to *misses, in order; each counted as an acquire. A hit is on the compute tier
// or arriving there; with hybrid experts only on it (ExpertOnDevice).
void Model::SplitHits(int layer, std::span<const int> experts, std::vector<int>* hits, std::vector<int>* misses) {
  for (size_t i = 0; i < experts.size(); ++i) {
    const PageId page = expert_pages_[static_cast<size_t>(layer * cfg_.n_expert + experts[i])];
    ++counters_.expert_acquires;
    const bool hit = hybrid_ ? ExpertOnDevice(page) : mm_->ResidentOrArriving(page, weight_tier_);
    counters_.expert_hits += hit ? 1 : 0;
    (hit ? hits : misses)->push_back(static_cast<int>(i));
  }
}

// Before order[p] computes: the copy of the miss `window` places ahead.
void Model::MissAhead(int layer, std::span<const int> experts, std::span<const int> order, int hits, size_t p,
                      int window) {
  const size_t ahead = p + static_cast<size_t>(window);
  if (p >= static_cast<size_t>(hits) && ahead < order.size()) {
    QueueExpert(layer, experts[static_cast<size_t>(order[ahead])], /*urgent=*/true, weight_tier_);
  }
}

// The copy of expert e of the layer to `tier`, queued (paged, prefetch on).
void Model::QueueExpert(int layer, int e, bool urgent, Tier tier) {
  if (mm_ == nullptr || !options_.prefetch) return;
  (void)mm_->Prefetch({expert_pages_[static_cast<size_t>(layer * cfg_.n_expert + e)]}, tier, urgent);
}

// Expert e of the layer: its gate, up and down matrices, pinned on `tier` when paged
// (the compute tier, or the host for hybrid experts' misses; the acquire was counted by
// ExpertOrder or HybridMoe).
Status Model::AcquireExpert(const Layer& L, int layer, int e, Tier tier, kernels::MatrixView out[3], Pin* pin) {
  out[0] = Expert(L.gate_exps, e);
  out[1] = Expert(L.up_exps, e);
  out[2] = Expert(L.down_exps, e);
  if (mm_ == nullptr) return Status::Ok();
  auto p = AcquireCounted(*mm_, expert_pages_[static_cast<size_t>(layer * cfg_.n_expert + e)], tier,
                          &counters_.expert_wait_s);
  if (!p.ok()) return p.status().Annotate("layer " + std::to_string(layer) + " expert " + std::to_string(e));
  *pin = std::move(p).value();
  const std::array<size_t, 3>& off = expert_offsets_[static_cast<size_t>(layer)];
  const size_t base = expert_base_[static_cast<size_t>(layer * cfg_.n_expert + e)];
  for (int m = 0; m < 3; ++m) out[m].data = pin->data() + base + off[static_cast<size_t>(m)];
  return Status::Ok();
}

// moe_out = sum over the selected experts, in router order, of weight * expert(xn).
// Each expert's output has its own row and the rows are summed in router order, so the
// result does not depend on the order the experts compute in, nor on which of them
// compute together: the hits (every expert, unpaged) as one group, whose gate and up
// products are one MatVecMany and whose down products another, then each miss alone as
// its copy arrives (the copies of the later ones overlapping its compute). One expert
// at a time would be three fork-joins an expert, and small experts (builtin:tiny-moe's:
// 65K multiply-adds a matrix, under kernels' parallel threshold) would run on one thread
// while the other idles.
Status Model::Moe(const Layer& L, int layer, int pos) {
  const ModelConfig& c = cfg_;
  Scratch& s = *s_;
  exec_->SetActivation(s.act, s.xn.data(), c.n_embd);
  exec_->MatVecOne(L.gate_inp, s.act, s.router.data());
  s.expert_ids.resize(static_cast<size_t>(c.n_expert_used));
  s.expert_weights.resize(static_cast<size_t>(c.n_expert_used));
  Route(layer, pos, s.router.data(), /*predicted_for_it=*/true, s.expert_ids.data(), s.expert_weights.data());
  if (hybrid_) return HybridMoe(L, layer);
  // A token's misses are all queued at once (window n_expert_used).
  const int hits = ExpertOrder(layer, s.expert_ids, c.n_expert_used, &s.expert_order);
  const size_t k = static_cast<size_t>(c.n_expert_used);
  s.expert_out.resize(k * static_cast<size_t>(c.n_embd));
  const std::span<const int> order(s.expert_order);
  for (size_t p = 0; p < order.size();) {
    const size_t n = p < static_cast<size_t>(hits) ? static_cast<size_t>(hits) - p : 1;
    TIERKV_RETURN_IF_ERROR(MoeGroup(L, layer, order.subspan(p, n)));
    p += n;
  }
  exec_->CombineExperts(s.expert_weights.data(), s.expert_out.data(), c.n_expert_used, c.n_embd, s.moe_out.data());
  return Status::Ok();
}

// The experts in `slots` (indices into s.expert_ids) on s.act, on the device side: their
// rows of s.expert_out.
Status Model::MoeGroup(const Layer& L, int layer, std::span<const int> slots) {
  Scratch& s = *s_;
  return ExpertGroup(L, layer, slots, *exec_, weight_tier_, s.experts, s.act, s.expert_out.data());
}

// The experts in `slots` (indices into s.expert_ids) for the token whose input is act:
// each pinned for the group, gate and up products in one pass, SwiGLU, down products in
// one pass into its row of out ([n_expert_used][n_embd]). Per expert the same products
// as one expert alone, bit for bit, on any executor.
Status Model::ExpertGroup(const Layer& L, int layer, std::span<const int> slots, kernels::Executor& e, Tier tier,
                          ExpertWork& w, kernels::ActivationRow& act, float* out, double* compute_s) {
  const ModelConfig& c = cfg_;
  Scratch& s = *s_;
  const size_t k = static_cast<size_t>(c.n_expert_used), n_embd = static_cast<size_t>(c.n_embd);
  const size_t n_ff = static_cast<size_t>(c.n_ff_exp);
  w.gate.resize(k * n_ff);
  w.up.resize(k * n_ff);
  if (w.hidden.size() < k) w.hidden.resize(k);
  w.views.resize(3 * k);
  w.pins.resize(k);
  const auto release = [&] {
    for (int i : slots) e.Retire(std::move(w.pins[static_cast<size_t>(i)]));
  };
  for (int i : slots) {
    const size_t u = static_cast<size_t>(i);
    const Status st = AcquireExpert(L, layer, s.expert_ids[u], tier, w.views.data() + 3 * u, &w.pins[u]);
    if (!st.ok()) {
      release();
      return st;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  w.jobs.clear();
  for (int i : slots) {
    const size_t u = static_cast<size_t>(i);
    w.jobs.push_back({&w.views[3 * u], &act, w.gate.data() + u * n_ff});
    w.jobs.push_back({&w.views[3 * u + 1], &act, w.up.data() + u * n_ff});
  }
  e.MatVec(w.jobs);
  w.jobs.clear();
  for (int i : slots) {
    const size_t u = static_cast<size_t>(i);
    float* g = w.gate.data() + u * n_ff;
    e.SwiGlu(g, w.up.data() + u * n_ff, g, c.n_ff_exp);
    e.SetActivation(w.hidden[u], g, c.n_ff_exp);
    w.jobs.push_back({&w.views[3 * u + 2], &w.hidden[u], out + u * n_embd});
  }
  e.MatVec(w.jobs);
  if (compute_s != nullptr) {
    e.Synchronize();
    *compute_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  release();
  return Status::Ok();
}

// Expert `expert` of the layer for the m tokens whose inputs are w.in_ptrs[0, m), one
// token at a time as llama.cpp multiplies experts (ggml's vec_dot, even in a batch):
// their outputs in rows [0, m) of w.out, on any executor the same bits.
Status Model::ChunkExpert(const Layer& L, int layer, int expert, kernels::Executor& e, Tier tier, ExpertWork& w,
                          double* compute_s) {
  const ModelConfig& c = cfg_;
  const size_t n_embd = static_cast<size_t>(c.n_embd), n_ff = static_cast<size_t>(c.n_ff_exp);
  const size_t m = w.in_ptrs.size();
  const int mi = static_cast<int>(m);
  kernels::MatrixView mats[3];
  Pin pin;
  TIERKV_RETURN_IF_ERROR(AcquireExpert(L, layer, expert, tier, mats, &pin));
  const auto t0 = std::chrono::steady_clock::now();
  w.gate.resize(m * n_ff);
  w.up.resize(m * n_ff);
  w.out.resize(m * n_embd);
  constexpr kernels::TokenSums kOne = kernels::TokenSums::kPerToken;
  const kernels::MatMulJob gu[] = {{&mats[0], w.in_ptrs.data(), mi, w.gate.data(), n_ff, kOne},
                                   {&mats[1], w.in_ptrs.data(), mi, w.up.data(), n_ff, kOne}};
  e.MatMul(gu);
  if (w.hidden.size() < m) w.hidden.resize(m);
  w.hidden_ptrs.clear();
  for (size_t r = 0; r < m; ++r) {
    float* g = w.gate.data() + r * n_ff;
    e.SwiGlu(g, w.up.data() + r * n_ff, g, c.n_ff_exp);
    e.SetActivation(w.hidden[r], g, c.n_ff_exp);
    w.hidden_ptrs.push_back(&w.hidden[r]);
  }
  const kernels::MatMulJob down[] = {{&mats[2], w.hidden_ptrs.data(), mi, w.out.data(), n_embd, kOne}};
  e.MatMul(down);
  if (compute_s != nullptr) {
    e.Synchronize();
    *compute_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  e.Retire(std::move(pin));
  return Status::Ok();
}

// Moe for the chunk's n tokens, whose normed inputs are converted in acts[n]: each
// expert the chunk selects is acquired once and multiplies all its tokens in one pass
// (MatMulMany); per token the same rows and the same sum as Moe. x[n][n_embd] += the
// tokens' outputs.
Status Model::ChunkMoe(const Layer& L, int layer, int pos, int n, kernels::ActivationRow* const* acts, float* x) {
  const ModelConfig& c = cfg_;
  Scratch& s = *s_;
  const size_t k = static_cast<size_t>(c.n_expert_used), n_embd = static_cast<size_t>(c.n_embd);
  const size_t ne = static_cast<size_t>(c.n_expert), nt = static_cast<size_t>(n);
  s.chunk_router.resize(nt * ne);
  const kernels::MatMulJob router[] = {{&L.gate_inp, acts, n, s.chunk_router.data(), ne}};
  exec_->MatMul(router);
  s.chunk_expert_ids.resize(nt * k);
  s.chunk_expert_weights.resize(nt * k);
  // users[e]: the (token, slot) pairs that chose expert e, in token order; experts in
  // order of first use.
  std::vector<std::vector<std::pair<int, int>>>& users = s.chunk_expert_users;
  users.resize(ne);
  for (auto& u : users) u.clear();
  std::vector<int>& used = s.chunk_experts;
  used.clear();
  for (size_t i = 0; i < nt; ++i) {
    int* ids = s.chunk_expert_ids.data() + i * k;
    Route(layer, pos + static_cast<int>(i), s.chunk_router.data() + i * ne, /*predicted_for_it=*/i + 1 == nt, ids,
          s.chunk_expert_weights.data() + i * k);
    for (size_t j = 0; j < k; ++j) {
      std::vector<std::pair<int, int>>& u = users[static_cast<size_t>(ids[j])];
      if (u.empty()) used.push_back(ids[j]);
      u.emplace_back(static_cast<int>(i), static_cast<int>(j));
    }
  }
  // As many expert copies in flight as one token's step has.
  const int window = c.n_expert_used;
  // Hybrid: the experts missing from the device that the cost model does not copy
  // compute on the host, after the device's hits are under way and before its misses.
  std::span<const int> on_device(used);
  if (hybrid_) {
    HostExperts& h = *h_;
    h.chunk_device.clear();
    h.chunk_host.clear();
    const uint64_t bytes = ExpertBytes(L);
    for (int e : used) {
      const PageId page = expert_pages_[static_cast<size_t>(layer * c.n_expert + e)];
      const int tokens = static_cast<int>(users[static_cast<size_t>(e)].size());
      const bool copy = options_.expert_split == ModelOptions::ExpertSplit::kAuto && split_.CopyForTokens(tokens, bytes);
      (ExpertOnDevice(page) || copy ? h.chunk_device : h.chunk_host).push_back(e);
    }
    on_device = h.chunk_device;
    counters_.expert_acquires += h.chunk_host.size();
    counters_.experts_on_host += h.chunk_host.size();
    counters_.experts_on_device += h.chunk_device.size();
  }
  // The host's inputs are read back before the device's work is queued (a read-back
  // waits for the device's queue).
  if (hybrid_ && !h_->chunk_host.empty()) {
    HostExperts& h = *h_;
    h.xn.resize(nt * n_embd);
    exec_->ReadBack(h.xn.data(), s.chunk_xn.data(), nt * n_embd * sizeof(float));
    if (h.acts.size() < nt) h.acts.resize(nt);
    h.act_set.assign(nt, 0);
  }
  const int hits = ExpertOrder(layer, on_device, window, &s.expert_order);
  if (hybrid_) counters_.experts_copied += on_device.size() - static_cast<size_t>(hits);
  s.chunk_expert_out.resize(nt * k * n_embd);
  for (size_t p = 0; p <= s.expert_order.size(); ++p) {  // p == size: only the host's turn
    if (hybrid_ && p == static_cast<size_t>(hits) && !h_->chunk_host.empty()) {
      HostExperts& h = *h_;
      for (int e : h.chunk_host) {
        TIERKV_RETURN_IF_ERROR(HostChunkExpert(L, layer, e, users[static_cast<size_t>(e)], nt));
      }
      AdmitExperts(layer, h.chunk_host);
    }
    if (p == s.expert_order.size()) break;
    MissAhead(layer, on_device, s.expert_order, hits, p, window);
    const int e = on_device[static_cast<size_t>(s.expert_order[p])];
    const std::vector<std::pair<int, int>>& who = users[static_cast<size_t>(e)];
    s.experts.in_ptrs.clear();
    for (const auto& [t, slot] : who) s.experts.in_ptrs.push_back(acts[t]);
    TIERKV_RETURN_IF_ERROR(ChunkExpert(L, layer, e, *exec_, weight_tier_, s.experts));
    for (size_t r = 0; r < who.size(); ++r) {
      const auto [t, slot] = who[r];
      exec_->Copy(s.chunk_expert_out.data() + (static_cast<size_t>(t) * k + static_cast<size_t>(slot)) * n_embd,
                  s.experts.out.data() + r * n_embd, n_embd * sizeof(float));
    }
  }
  for (size_t i = 0; i < nt; ++i) {
    exec_->CombineExperts(s.chunk_expert_weights.data() + i * k, s.chunk_expert_out.data() + i * k * n_embd,
                          c.n_expert_used, c.n_embd, s.moe_out.data());
    exec_->Add(x + i * n_embd, s.moe_out.data(), n_embd);
  }
  return Status::Ok();
}

// The attention plan of n queries at positions pos .. pos + n - 1 over the sequence's
// blocks of a layer, `batch` blocks at a time; no side effects. Two passes (with an f16
// cache and llama rounding: llama.cpp's exact softmax weights) but for an f16 cache
// without that rounding: one online pass. Either way the blocks are visited in order,
// `batch` at a time: visit v covers blocks [FirstBlock(v), FirstBlock(v) + BlockCount(v))
// of pass v / n_batches; a batch holding the whole layer does both passes in one visit
// (AttentionVisit::kTwoPass).
// Queries go in groups whose two-pass score rows fit kChunkScoreBytes (kDecodedScoreBytes
// for codecs read through decoded runs).
Model::AttentionPlan Model::PlanAttention(const KvCache& cache, SeqId seq, int pos, int n, bool chunk, int batch,
                                          int n_blocks) const {
  const ModelConfig& c = cfg_;
  AttentionPlan plan;
  kernels::AttentionParams& p = plan.params;
  p.n_heads = c.n_head;
  p.n_kv_heads = c.n_head_kv;
  p.head_dim = c.head_dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  p.query_pos = pos;
  p.round_query_f16 = p.round_weights_f16 = options_.llama_attention_rounding && cache.codec().codec() == KvCodec::kF16;
  // And llama.cpp's summation orders: a prefill chunk's (even of one token) as its batched
  // products, a decode step's as one token's.
  if (p.round_weights_f16 && options_.llama_attention_sums) {
    p.sums = chunk ? kernels::AttentionSums::kBatch : kernels::AttentionSums::kOneToken;
  }
  // Two passes also for every codec but f16 without llama.cpp's rounding: its scores pass
  // over key tiles and values pass with all weights known outrun the online form's
  // per-block rescaling (docs/benchmarks.md, "Quantized KV"), and the form never depends
  // on how the blocks come in batches, so the bits do not depend on residency.
  plan.two_pass = p.round_weights_f16 || cache.codec().codec() != KvCodec::kF16;
  plan.n_blocks = n_blocks;
  plan.batch = batch;
  plan.n_batches = (plan.n_blocks + batch - 1) / batch;
  plan.fused = plan.two_pass && plan.n_batches == 1;
  plan.n_visits = plan.fused ? 1 : plan.n_batches * (plan.two_pass ? 2 : 1);
  // 2 MiB: resident memory stays near llama.cpp's at 4K and 16K tokens, and prefill measured
  // the same as with 64 MiB (docs/decisions/2026-12-06-host-auto-sized-to-the-run.md).
  // 16 MiB for the codecs whose blocks are decoded once per group of queries (tq4, tq3):
  // each query more in a group is a decode of every block fewer (a 20K-token prefill
  // 1.2-1.4x faster than at 2 MiB; docs/decisions/2026-12-07-tq-prefill-query-groups.md).
  constexpr uint64_t kChunkScoreBytes = uint64_t{2} << 20, kDecodedScoreBytes = uint64_t{16} << 20;
  const uint64_t score_bytes = cache.codec().DecodedRunBytes(16, true) > 0 ? kDecodedScoreBytes : kChunkScoreBytes;
  const uint64_t row_bytes = static_cast<uint64_t>(c.n_head) * static_cast<uint64_t>(cache.Length(seq)) * 4;
  plan.group = plan.two_pass ? static_cast<int>(std::clamp<uint64_t>(score_bytes / row_bytes, 1, n)) : n;
  if (options_.attention_query_group > 0) plan.group = std::min(n, options_.attention_query_group);
  return plan;
}

kernels::AttentionVisit Model::AttentionPlan::Visit(int v) const {
  if (!two_pass) return kernels::AttentionVisit::kOnline;
  if (fused) return kernels::AttentionVisit::kTwoPass;
  return v < n_batches ? kernels::AttentionVisit::kScores : kernels::AttentionVisit::kValues;
}

// Pins the blocks of visit v in s_->pins (their pointers in s_->blocks) and, with
// prefetch on, queues the copies of the batch kKvLookahead visits ahead (PrefetchLayer
// queued the first ones before the layer started).
Status Model::PinVisit(KvCache& cache, SeqId seq, int layer, const AttentionPlan& plan, int v) {
  Scratch& s = *s_;
  MemoryManager& mm = cache.memory();
  const Tier tier = exec_->tier_for(mm);
  RetireKvPins();
  s.blocks.clear();
  const int b0 = plan.FirstBlock(v), count = plan.BlockCount(v);
  for (int b = b0; b < b0 + count; ++b) {
    auto pin = AcquireCounted(mm, cache.BlockPage(seq, layer, b), tier, &counters_.kv_wait_s, &counters_.kv_acquires,
                              &counters_.kv_hits);
    if (!pin.ok()) {
      return pin.status().Annotate("attention, layer " + std::to_string(layer) + " block " + std::to_string(b));
    }
    exec_->WaitFor(*pin);
    s.blocks.push_back(pin->data());
    s.pins.push_back(std::move(pin).value());
  }
  const int ahead = v + kKvLookahead;
  if (options_.prefetch && ahead < plan.n_visits && plan.n_batches > 1) {
    std::vector<PageId> next;
    for (int b = plan.FirstBlock(ahead); b < plan.FirstBlock(ahead) + plan.BlockCount(ahead); ++b) {
      next.push_back(cache.BlockPage(seq, layer, b));
    }
    counters_.prefetched_pages += next.size();
    (void)mm.Prefetch(std::move(next), tier);
  }
  return Status::Ok();
}

// Where every block of the layer is on the compute tier already, all of them pinned at
// once (under one lock) into s_->pins; false (nothing pinned) otherwise.
bool Model::PinWholeLayer(KvCache& cache, SeqId seq, int layer, int n_blocks) {
  Scratch& s = *s_;
  MemoryManager& mm = cache.memory();
  s.kv_pages.clear();
  for (int b = 0; b < n_blocks; ++b) s.kv_pages.push_back(cache.BlockPage(seq, layer, b));
  std::vector<Pin> all = mm.TryAcquireAll(s.kv_pages, exec_->tier_for(mm));
  if (all.empty()) return false;
  s.pins = std::move(all);
  s.blocks.clear();
  for (const Pin& pin : s.pins) s.blocks.push_back(pin.data());
  counters_.kv_acquires += static_cast<uint64_t>(n_blocks);
  counters_.kv_hits += static_cast<uint64_t>(n_blocks);
  return true;
}

// Whether attention reads KV blocks where they lie (PinInPlace): an executor that computes
// from host memory, unless the options force batches of Acquires (tests of that path).
bool Model::KvInPlace() const { return exec_->host_memory() && options_.kv_batch_blocks == 0; }

namespace {

// Staging for the blocks read through: two turns of at most this many bytes each
// (ModelOptions::read_through_turn_bytes).
constexpr uint64_t kReadThroughTurnBytes = uint64_t{8} << 20;
// A prefill chunk's attention may visit the blocks once per group of queries (the
// two-pass form bounds its score rows): it reads the layer's blocks that are read
// through once, into a staging area of up to this many bytes, instead of once per group.
constexpr uint64_t kChunkStageBytes = uint64_t{256} << 20;

// The most entries of sorted `missing` in one window [k * batch, (k + 1) * batch).
int MostPerBatch(const std::vector<int>& missing, int batch) {
  int most = 0;
  for (size_t i = 0; i < missing.size();) {
    const int window = missing[i] / batch;
    size_t j = i;
    while (j < missing.size() && missing[j] / batch == window) ++j;
    most = std::max(most, static_cast<int>(j - i));
    i = j;
  }
  return most;
}

}  // namespace

// The listed blocks of the layer (all of them, or selective attention's choice; entry i
// is the view's block i) pinned where they lie (MemoryManager::AcquireInPlace: host RAM,
// the sim device, a mapped disk arena) into s_->pins, their pointers in s_->blocks; the
// others (an O_DIRECT disk file, a backing not read yet) listed in kv_missing (entries
// of the list) with a null pointer, to be read through into staging (ReadStaged)
// without moving anything: a layer's scan larger than the fast tiers then reads each
// block once, where promoting would evict what it reads next. Returns the batch: the
// whole list when the missing ones fit the two staging turns, or for many queries (a
// prefill chunk, whose query groups would each read them again) kChunkStageBytes, all
// read once; else the largest halving of it whose visits each read at most one turn.
int Model::PinInPlace(KvCache& cache, SeqId seq, int layer, std::span<const int> blocks, bool many_queries) {
  Scratch& s = *s_;
  MemoryManager& mm = cache.memory();
  const int n = static_cast<int>(blocks.size());
  s.kv_pages.clear();
  for (int b : blocks) s.kv_pages.push_back(cache.BlockPage(seq, layer, b));
  const size_t pinned = mm.AcquireInPlace(s.kv_pages, &s.pins);
  s.blocks.assign(static_cast<size_t>(n), nullptr);
  s.kv_missing.clear();
  for (int i = 0; i < n; ++i) {
    const Pin& pin = s.pins[static_cast<size_t>(i)];
    if (pin.valid()) s.blocks[static_cast<size_t>(i)] = pin.data();
    else s.kv_missing.push_back(i);
  }
  counters_.kv_acquires += static_cast<uint64_t>(n);
  counters_.kv_hits += pinned;
  if (s.kv_missing.empty()) return n;
  const uint64_t slot = mm.FrameSpan(cache.block_bytes());
  const uint64_t turn_bytes = options_.read_through_turn_bytes > 0 ? options_.read_through_turn_bytes : kReadThroughTurnBytes;
  const int per_turn = static_cast<int>(std::max<uint64_t>(1, turn_bytes / slot));
  const uint64_t all_missing = static_cast<uint64_t>(s.kv_missing.size()) * slot;
  const bool at_once = static_cast<int>(s.kv_missing.size()) <= 2 * per_turn ||
                       (many_queries && all_missing <= (options_.read_through_turn_bytes > 0 ? 0 : kChunkStageBytes));
  const uint64_t want = at_once ? std::max(all_missing, 2 * static_cast<uint64_t>(per_turn) * slot)
                                : 2 * static_cast<uint64_t>(per_turn) * slot;
  if (s.kv_stage_bytes < want) {
    s.kv_stage.reset(static_cast<std::byte*>(std::aligned_alloc(4096, want)));
    s.kv_stage_bytes = s.kv_stage ? want : 0;
  }
  int batch = n;
  if (at_once) return batch;
  while (batch > per_turn && MostPerBatch(s.kv_missing, batch) > per_turn) batch = (batch + 1) / 2;
  return batch;
}

// Selective attention (ModelOptions::attn_topk): the first block, the last two, and per
// KV head the attn_topk blocks whose key bounds give the highest bound on a query head's
// score (sum over channels of max(q * min, q * max)), ascending in s_->kv_selected.
bool Model::SelectBlocks(const KvCache& cache, SeqId seq, int layer, const float* q) {
  Scratch& s = *s_;
  constexpr int kSinkBlocks = 1, kRecentBlocks = 2;
  const int n_blocks = cache.NumBlocks(seq);
  const int topk = options_.attn_topk;
  if (topk <= 0 || n_blocks <= kSinkBlocks + kRecentBlocks + topk) return false;
  const int hd = cfg_.head_dim, group = cfg_.n_head / cfg_.n_head_kv;
  s.kv_take.assign(static_cast<size_t>(n_blocks), 0);
  for (int b = 0; b < kSinkBlocks; ++b) s.kv_take[static_cast<size_t>(b)] = 1;
  for (int b = n_blocks - kRecentBlocks; b < n_blocks; ++b) s.kv_take[static_cast<size_t>(b)] = 1;
  s.kv_bound.resize(static_cast<size_t>(n_blocks));
  s.kv_selected.clear();
  for (int h = 0; h < cfg_.n_head_kv; ++h) {
    for (int b = 0; b < n_blocks; ++b) {
      const BlockId id = cache.Block(seq, layer, b);
      const float* lo = cache.KeyMin(id);
      const float* hi = cache.KeyMax(id);
      float best = -std::numeric_limits<float>::infinity();
      if (lo == nullptr) {
        best = std::numeric_limits<float>::infinity();  // no bounds: always taken
      } else {
        lo += static_cast<size_t>(h) * hd;
        hi += static_cast<size_t>(h) * hd;
        for (int j = 0; j < group; ++j) {
          const float* qh = q + static_cast<size_t>(h * group + j) * hd;
          float bound = 0;
          for (int c = 0; c < hd; ++c) bound += std::max(qh[c] * lo[c], qh[c] * hi[c]);
          best = std::max(best, bound);
        }
      }
      s.kv_bound[static_cast<size_t>(b)] = best;
    }
    // The topk best of the blocks not taken yet for this head (ties: the later block).
    s.kv_all.clear();
    for (int b = kSinkBlocks; b < n_blocks - kRecentBlocks; ++b) s.kv_all.push_back(b);
    const int k = std::min<int>(topk, static_cast<int>(s.kv_all.size()));
    std::partial_sort(s.kv_all.begin(), s.kv_all.begin() + k, s.kv_all.end(), [&](int a, int b) {
      const float x = s.kv_bound[static_cast<size_t>(a)], y = s.kv_bound[static_cast<size_t>(b)];
      return x != y ? x > y : a > b;
    });
    for (int i = 0; i < k; ++i) s.kv_take[static_cast<size_t>(s.kv_all[static_cast<size_t>(i)])] = 1;
  }
  for (int b = 0; b < n_blocks; ++b) {
    if (s.kv_take[static_cast<size_t>(b)]) s.kv_selected.push_back(b);
  }
  return static_cast<int>(s.kv_selected.size()) < n_blocks;
}

// Reads through the missing blocks of visit v (all of them when v < 0) into staging
// turn `turn`, asynchronously; UseStaged waits and points s_->blocks at them.
Status Model::ReadStaged(KvCache& cache, SeqId seq, int layer, const AttentionPlan& plan, int v, int turn,
                         Ticket* ticket) {
  Scratch& s = *s_;
  MemoryManager& mm = cache.memory();
  if (s.kv_stage == nullptr) return Status::Exhausted("attention: cannot allocate the staging area for KV blocks");
  const uint64_t slot = mm.FrameSpan(cache.block_bytes());
  const int b0 = v < 0 ? 0 : plan.FirstBlock(v), b1 = v < 0 ? plan.n_blocks : b0 + plan.BlockCount(v);
  std::byte* base = s.kv_stage.get() + (v < 0 ? 0 : static_cast<uint64_t>(turn) * (s.kv_stage_bytes / 2));
  std::vector<PageId> pages;
  std::vector<std::byte*> out;
  auto& placed = s.kv_staged[turn];
  placed.clear();
  auto first = std::lower_bound(s.kv_missing.begin(), s.kv_missing.end(), b0);
  for (auto it = first; it != s.kv_missing.end() && *it < b1; ++it) {
    std::byte* at = base + static_cast<uint64_t>(pages.size()) * slot;
    pages.push_back(cache.BlockPage(seq, layer, s.kv_list[static_cast<size_t>(*it)]));
    out.push_back(at);
    placed.emplace_back(*it, at);
  }
  counters_.kv_read_through += pages.size();
  counters_.kv_read_through_bytes += static_cast<uint64_t>(pages.size()) * cache.block_bytes();
  *ticket = pages.empty() ? Ticket() : mm.ReadThrough(std::move(pages), std::move(out));
  return Status::Ok();
}

Status Model::UseStaged(int turn, Ticket& ticket) {
  Scratch& s = *s_;
  const auto t0 = std::chrono::steady_clock::now();
  Status st = ticket.Wait();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  counters_.kv_wait_s += waited;
  counters_.wait_s += waited;
  TIERKV_RETURN_IF_ERROR(st.Annotate("attention: reading KV blocks through"));
  for (const auto& [b, at] : s.kv_staged[turn]) s.blocks[static_cast<size_t>(b)] = at;
  return Status::Ok();
}

// Attention of the n queries at positions pos .. pos + n - 1 (q and out [n][n_heads *
// head_dim]) over the sequence's blocks of `layer`, pinned on the executor's tier a
// batch at a time (all at once when they are all there) and read in their codec's
// encoding: plan (PlanAttention), then per query group begin, the plan's visits (one
// query: the single-query forms; several: the *Multi forms, each query with the bits it
// has alone), end.
Status Model::Attention(KvCache& cache, SeqId seq, int layer, int pos, int n, bool chunk, const float* q,
                        float* out) {
  Scratch& s = *s_;
  const VectorCodec& codec = cache.codec();
  const KvGeometry& g = cache.geometry();
  const size_t qd = static_cast<size_t>(cfg_.n_head) * cfg_.head_dim;
  const int n_all = cache.NumBlocks(seq);
  int n_blocks = n_all;  // the blocks read (selective attention: its choice, compacted)
  int batch = 0;
  bool pinned = false;  // s.blocks holds every block for the whole call (or staged: some per visit)
  bool staged = false;
  bool selective = false;
  if (KvInPlace()) {
    selective = n == 1 && !chunk && SelectBlocks(cache, seq, layer, q);
    if (selective) {
      s.kv_list = s.kv_selected;
    } else {
      s.kv_list.resize(static_cast<size_t>(n_all));
      std::iota(s.kv_list.begin(), s.kv_list.end(), 0);
    }
    n_blocks = static_cast<int>(s.kv_list.size());
    batch = PinInPlace(cache, seq, layer, s.kv_list, /*many_queries=*/n > 1);
    pinned = true;
  } else {
    // Batches bound what has to be brought to the compute tier; a layer already all
    // there is one batch.
    batch = KvBatchBlocks(cache, n_blocks);
    pinned = batch < n_blocks && PinWholeLayer(cache, seq, layer, n_blocks);
    if (pinned) batch = n_blocks;
  }
  AttentionPlan plan = PlanAttention(cache, seq, pos, n, chunk, batch, n_blocks);
  // Blocks read through: all at once when they fit the staging area, else per visit,
  // the next visit's read in flight while this one computes (turns alternate).
  Ticket tickets[2];
  int turn = 0;
  if (pinned && !s.kv_missing.empty()) {
    if (batch == n_blocks) {
      TIERKV_RETURN_IF_ERROR(ReadStaged(cache, seq, layer, plan, -1, 0, &tickets[0]));
      TIERKV_RETURN_IF_ERROR(UseStaged(0, tickets[0]));
    } else {
      staged = true;
      TIERKV_RETURN_IF_ERROR(ReadStaged(cache, seq, layer, plan, 0, 0, &tickets[0]));
    }
  }

  const int group = plan.group;
  if (n > 1) {
    if (s.chunk_states.size() < static_cast<size_t>(group)) s.chunk_states.resize(static_cast<size_t>(group));
    s.chunk_params.assign(static_cast<size_t>(group), plan.params);
    s.chunk_state_ptrs.clear();
    for (int i = 0; i < group; ++i) s.chunk_state_ptrs.push_back(&s.chunk_states[static_cast<size_t>(i)]);
  }
  kernels::AttentionParams& p = plan.params;
  for (int q0 = 0; q0 < n; q0 += group) {
    const int m = std::min(group, n - q0);
    kernels::AttentionParams* ps = n > 1 ? s.chunk_params.data() : &p;
    kernels::AttentionState* const* sts = n > 1 ? s.chunk_state_ptrs.data() : nullptr;
    for (int i = 0; i < m; ++i) {
      ps[i].query_pos = pos + q0 + i;
      exec_->AttentionBegin(codec, ps[i], q + static_cast<size_t>(q0 + i) * qd, n > 1 ? sts[i] : &s.attention);
    }
    for (int v = 0; v < plan.n_visits; ++v) {
      if (!pinned) TIERKV_RETURN_IF_ERROR(PinVisit(cache, seq, layer, plan, v));
      if (staged) {
        TIERKV_RETURN_IF_ERROR(UseStaged(turn, tickets[turn]));
        const int next = v + 1 < plan.n_visits ? v + 1 : (q0 + group < n ? 0 : -1);
        if (next >= 0) TIERKV_RETURN_IF_ERROR(ReadStaged(cache, seq, layer, plan, next, 1 - turn, &tickets[1 - turn]));
        turn = 1 - turn;
      }
      if (selective) {
        // Blocks read without key bounds (restored) get them now, as they are read.
        for (int i = plan.FirstBlock(v); i < plan.FirstBlock(v) + plan.BlockCount(v); ++i) {
          const int b = s.kv_list[static_cast<size_t>(i)];
          const BlockId id = cache.Block(seq, layer, b);
          if (cache.KeyMin(id) == nullptr) cache.SummarizeBlock(id, s.blocks[static_cast<size_t>(i)], cache.BlockFill(seq, b));
        }
      }
      kernels::PagedKvView view;
      view.blocks = s.blocks.data() + (pinned ? plan.FirstBlock(v) : 0);
      view.n_blocks = plan.BlockCount(v);
      view.first_block = plan.FirstBlock(v);
      // (Selective: the chosen blocks side by side; the single query sees all of them.)
      view.n_tokens = selective ? (n_blocks - 1) * g.block_tokens + cache.BlockFill(seq, n_all - 1) : cache.Length(seq);
      view.block_tokens = g.block_tokens;
      view.n_kv_heads = g.n_kv_heads;
      view.vector_bytes = codec.vector_bytes();
      view.key_tiles = cache.key_tiles();
      const kernels::AttentionVisit visit = plan.Visit(v);
      const bool softmax = visit == kernels::AttentionVisit::kScores && v + 1 == plan.n_batches;
      if (n == 1) {
        exec_->AttentionStep(codec, visit, p, view, &s.attention);
        if (softmax) exec_->AttentionSoftmax(p, &s.attention);
      } else {
        exec_->AttentionStepMulti(codec, visit, ps, sts, m, view);
        if (softmax) exec_->AttentionSoftmaxMulti(ps, sts, m);
      }
    }
    for (int i = 0; i < m; ++i) {
      exec_->AttentionEnd(codec, ps[i], n > 1 ? sts[i] : &s.attention, out + static_cast<size_t>(q0 + i) * qd);
    }
  }
  RetireKvPins();
  return Status::Ok();
}

}  // namespace tierkv
