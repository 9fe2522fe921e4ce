// runtime/model_internal.h
//
// The Model's private parts shared by model.cc (loading) and model_forward.cc (the
// forward step): per-layer weight views and the scratch buffers of one step.
// Not for other callers.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "kernels/attention_types.h"
#include "kernels/matvec.h"
#include "memory/memory_manager.h"
#include "runtime/model.h"

namespace tierkv {

struct Model::Layer {
  const float* attn_norm = nullptr;  // [n_embd]
  kernels::MatrixView wq, wk, wv, wo;
  const float* bq = nullptr;  // qwen2 biases, or null
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* q_norm = nullptr;  // [head_dim], qwen3
  const float* k_norm = nullptr;
  const float* ffn_norm = nullptr;
  kernels::MatrixView gate, up, down;                    // dense FFN
  kernels::MatrixView gate_inp;                          // MoE router [n_embd -> n_expert]
  kernels::MatrixView gate_exps, up_exps, down_exps;     // one expert's rows; stacked

  // The matrices a layer page holds, in page order (absent ones, data == null, are
  // skipped): attention and dense FFN. Routers, norms and experts are not in it.
  static std::span<kernels::MatrixView Layer::* const> PagedMatrices();
};

// Attention of a layer for n queries, planned without side effects (PlanAttention).
struct Model::AttentionPlan {
  kernels::AttentionParams params;  // query_pos: the first query's
  int n_blocks = 0;   // the sequence's blocks in the layer
  int batch = 0;      // blocks a visit covers
  int n_batches = 0;
  bool two_pass = false;  // scores, softmax, values (all but f16 without llama.cpp's rounding)
  bool fused = false;     // two-pass over one batch holding the layer: one visit
  int n_visits = 0;
  int group = 0;          // queries through the visits together
  int FirstBlock(int v) const { return (v % n_batches) * batch; }
  int BlockCount(int v) const { return std::min(batch, n_blocks - FirstBlock(v)); }
  kernels::AttentionVisit Visit(int v) const;
};

// The scratch of computing experts on one executor (ExpertGroup, ChunkExpert): the
// device's (Scratch::experts) or the host CPU's (HostExperts::work, hybrid experts). The
// arrays are that executor's memory.
struct Model::ExpertWork {
  explicit ExpertWork(kernels::Executor* e) : gate(e, 0), up(e, 0), out(e, 0) {}
  kernels::ExecArray<float> gate, up;  // per slot (a token's experts) or per token (a chunk's expert)
  kernels::ExecArray<float> out;       // a chunk's expert: its tokens' output rows
  std::vector<kernels::ActivationRow> hidden;
  std::vector<kernels::ActivationRow*> in_ptrs, hidden_ptrs;  // a chunk's expert: its tokens'
  std::vector<kernels::MatrixView> views;  // a token's experts: three per slot
  std::vector<Pin> pins;                   // a token's experts: one per slot
  std::vector<kernels::MatVecJob> jobs;
};

// Hybrid experts: the host CPU's side (HybridMoe, HostMoeGroup, HostChunkExpert). The
// arrays are the host executor's memory; the device's rows are read back into xn and
// the host's outputs uploaded into the device's expert rows.
struct Model::HostExperts {
  explicit HostExperts(kernels::Executor* e) : xn(e, 0), out(e, 0), work(e) {}
  kernels::ExecArray<float> xn;   // a token's (a chunk's) normed FFN input, read back
  kernels::ExecArray<float> out;  // a token's experts' output rows
  ExpertWork work;
  kernels::ActivationRow act;                     // decode: the token's input
  std::vector<kernels::ActivationRow> acts;       // prefill: per token of the chunk
  std::vector<uint8_t> act_set;                   // prefill: acts[t] converted
  std::vector<int> device, misses, host;  // decode: slots by where they compute
  std::vector<int> chunk_device, chunk_host;  // prefill: experts by where they compute
};

struct Model::Weights {
  kernels::MatrixView token_embd;
  kernels::MatrixView output;  // token_embd when tied
  const float* output_norm = nullptr;
  std::vector<Layer> layers;
  std::vector<std::vector<float>> owned;  // vectors converted from F16/BF16
};

// Sized from the config only after ReadModelConfig matched every size against the
// tensors and BindWeights bound them, so no buffer is larger than the weights it serves.
// The float arrays are the executor's memory (ExecArray): the host reads them only
// through it. Expert choices and their weights are host memory (RouteTopK's outputs).
struct Model::Scratch {
  using Array = kernels::ExecArray<float>;
  Scratch(const ModelConfig& c, kernels::Executor* e)
      : x(e, static_cast<size_t>(c.n_embd)),
        xn(e, static_cast<size_t>(c.n_embd)),
        q(e, static_cast<size_t>(c.n_head) * c.head_dim),
        k(e, static_cast<size_t>(c.n_head_kv) * c.head_dim),
        v(e, static_cast<size_t>(c.n_head_kv) * c.head_dim),
        attn(e, static_cast<size_t>(c.n_head) * c.head_dim),
        proj(e, static_cast<size_t>(c.n_embd)),
        // The FFN hidden width: a MoE layer's experts', else the dense FFN's (a MoE
        // model's feed_forward_length sizes nothing: ReadModelConfig).
        gate(e, static_cast<size_t>(c.is_moe() ? c.n_ff_exp : c.n_ff)),
        up(e, gate.size()),
        router(e, static_cast<size_t>(c.n_expert)),
        pred_xn(e, static_cast<size_t>(c.n_embd)),
        moe_out(e, static_cast<size_t>(c.n_embd)),
        logits(e, 0),
        chunk_x(e, 0), chunk_xn(e, 0), chunk_q(e, 0), chunk_k(e, 0), chunk_v(e, 0), chunk_attn(e, 0),
        chunk_proj(e, 0), chunk_gate(e, 0), chunk_up(e, 0), chunk_router(e, 0), chunk_expert_out(e, 0),
        expert_out(e, 0), experts(e) {}

  Array x;      // residual stream [n_embd]
  Array xn;     // normed input of a block
  Array q, k, v;
  Array attn;   // attention output [n_head * head_dim]
  Array proj;   // output of attn_output / ffn_down [n_embd]
  Array gate, up;
  Array router;
  Array pred_xn;         // the next layer's router input, predicted
  kernels::ActivationRow pred_act;
  Array moe_out;
  Array logits;  // [n_vocab] where the executor cannot write the caller's host array
  kernels::ActivationRow act;   // the current matvec input, converted per weight type
  kernels::ActivationRow act2;  // the FFN's hidden activation
  kernels::AttentionState attention;
  // A prefill chunk (ForwardBatch): per token residual streams and queries, attention
  // outputs, and one attention state per query of a group.
  Array chunk_x, chunk_xn, chunk_q, chunk_k, chunk_v, chunk_attn, chunk_proj, chunk_gate, chunk_up;
  std::vector<kernels::ActivationRow> chunk_acts;  // per token, the current matmul input
  std::vector<kernels::ActivationRow*> chunk_act_ptrs;
  // ChunkMoe: router logits, choices and outputs per (token, slot); per expert its users
  // and, while it computes, its tokens' inputs and hidden activations.
  Array chunk_router, chunk_expert_out;
  std::vector<float> chunk_expert_weights;  // host
  std::vector<int> chunk_expert_ids, chunk_experts;
  std::vector<std::vector<std::pair<int, int>>> chunk_expert_users;
  std::vector<kernels::AttentionState> chunk_states;
  std::vector<kernels::AttentionParams> chunk_params;
  std::vector<kernels::AttentionState*> chunk_state_ptrs;
  std::vector<Pin> pins;  // KV blocks of the current batch, or the output matrix
  Pin layer_pin;          // the current layer's weight page (paged weights)
  std::vector<const std::byte*> blocks;
  std::vector<PageId> kv_pages;  // a layer's KV block pages (the all-resident check)
  // Blocks AcquireInPlace could not pin (model_forward.cc, ReadVisit): their indices and
  // two halves of a 4 KiB-aligned staging area they are read through into, in turns.
  std::vector<int> kv_missing;
  std::vector<int> kv_list;               // the blocks attention reads (sequence indices)
  std::vector<int> kv_all, kv_selected;  // selective attention: candidates, choice
  std::vector<float> kv_bound;           // per block, a KV head's best score bound
  std::vector<uint8_t> kv_take;          // per block: selected
  std::unique_ptr<std::byte, decltype(&std::free)> kv_stage{nullptr, &std::free};
  uint64_t kv_stage_bytes = 0;
  std::vector<std::pair<int, std::byte*>> kv_staged[2];  // per turn: (block, where it was read)
  std::vector<int> expert_ids;     // host
  std::vector<int> expert_order;   // the order the selected experts compute in
  Array expert_out;                // [n_expert_used][n_embd]: each expert's output
  ExpertWork experts;  // the experts' scratch on this executor (ExpertGroup, ChunkExpert)
  std::vector<float> expert_weights;  // host
};

}  // namespace tierkv
