// runtime/model_forward.cc
//
// One decode step. The order of operations and the places where activations are
// rounded follow llama.cpp's graph for these architectures (docs/kernels.md).
#include <algorithm>
#include <cmath>

#include "kernels/activation.h"
#include "kernels/moe.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "runtime/model.h"
#include "runtime/model_internal.h"

namespace tierkv {
namespace {

using kernels::MatrixView;
using kernels::MatVecJob;

void AddInPlace(float* y, const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += x[i];
}

// Expert e's rows of a stacked [n_expert][rows][cols] tensor.
MatrixView Expert(const MatrixView& stacked, int e) {
  MatrixView m = stacked;
  m.data = static_cast<const uint8_t*>(stacked.data) + static_cast<size_t>(e) * stacked.rows * stacked.row_bytes;
  return m;
}

}  // namespace

Status Model::Forward(KvCache& cache, SeqId seq, int32_t token, int pos, std::span<float> logits) {
  const KvGeometry& g = cache.geometry();
  if (g.n_layers != cfg_.n_layer || g.n_kv_heads != cfg_.n_head_kv || g.head_dim != cfg_.head_dim) {
    return Status::InvalidArgument("model: KV cache geometry (" + g.ToString() + ") does not fit the model (" +
                                   cfg_.ToString() + ")");
  }
  if (token < 0 || token >= cfg_.n_vocab) {
    return Status::InvalidArgument("model: token id " + std::to_string(token) + " outside the vocabulary of " +
                                   std::to_string(cfg_.n_vocab));
  }
  if (!logits.empty() && logits.size() != static_cast<size_t>(cfg_.n_vocab)) {
    return Status::InvalidArgument("model: logits span has " + std::to_string(logits.size()) + " entries, vocab is " +
                                   std::to_string(cfg_.n_vocab));
  }
  const int length = cache.Length(seq);
  if (length < 0) return Status::NotFound("model: unknown sequence " + std::to_string(seq.value));
  if (pos != length) {
    return Status::InvalidArgument("model: position " + std::to_string(pos) + " is not the next position (" +
                                   std::to_string(length) + ") of the sequence");
  }
  TIERKV_ASSIGN_OR_RETURN(const int appended, cache.AppendToken(seq));
  if (appended != pos) return Status::Internal("model: KV cache appended at an unexpected position");
  Status st = ForwardLayers(cache, seq, token, pos, logits);
  s_->pins.clear();
  if (!st.ok()) (void)cache.Truncate(seq, pos);
  return st;
}

Status Model::ForwardLayers(KvCache& cache, SeqId seq, int32_t token, int pos, std::span<float> logits) {
  const ModelConfig& c = cfg_;
  Scratch& s = *s_;
  kernels::ThreadPool* pool = pool_.get();
  const size_t n_embd = static_cast<size_t>(c.n_embd);

  kernels::GetRow(w_->token_embd, token, s.x.data());
  kernels::RopeAngles(rope_, pos, s.cos_sin.data());

  for (int l = 0; l < c.n_layer; ++l) {
    const Layer& L = w_->layers[static_cast<size_t>(l)];

    // Attention block.
    kernels::RmsNorm(s.x.data(), L.attn_norm, c.n_embd, c.rms_eps, s.xn.data());
    s.act.Set(s.xn.data(), c.n_embd);
    const MatVecJob qkv[] = {{&L.wq, &s.act, s.q.data()}, {&L.wk, &s.act, s.k.data()}, {&L.wv, &s.act, s.v.data()}};
    kernels::MatVecMany(qkv, pool);
    if (L.bq != nullptr) {
      AddInPlace(s.q.data(), L.bq, s.q.size());
      AddInPlace(s.k.data(), L.bk, s.k.size());
      AddInPlace(s.v.data(), L.bv, s.v.size());
    }
    if (c.qk_norm) {
      kernels::RmsNormRows(s.q.data(), L.q_norm, c.n_head, c.head_dim, c.rms_eps, s.q.data());
      kernels::RmsNormRows(s.k.data(), L.k_norm, c.n_head_kv, c.head_dim, c.rms_eps, s.k.data());
    }
    kernels::ApplyRope(rope_, s.cos_sin.data(), s.q.data(), c.n_head, c.head_dim);
    kernels::ApplyRope(rope_, s.cos_sin.data(), s.k.data(), c.n_head_kv, c.head_dim);
    TIERKV_RETURN_IF_ERROR(cache.Write(seq, l, pos, s.k.data(), s.v.data()));
    TIERKV_RETURN_IF_ERROR(Attention(cache, seq, l, pos, s.q.data(), s.attn.data()));
    s.act2.Set(s.attn.data(), static_cast<int64_t>(s.attn.size()));
    kernels::MatVec(L.wo, s.act2, s.proj.data(), pool);
    AddInPlace(s.x.data(), s.proj.data(), n_embd);

    // Feed-forward block.
    kernels::RmsNorm(s.x.data(), L.ffn_norm, c.n_embd, c.rms_eps, s.xn.data());
    if (c.is_moe()) {
      Moe(L);
      AddInPlace(s.x.data(), s.moe_out.data(), n_embd);
    } else {
      Ffn(L);
      AddInPlace(s.x.data(), s.proj.data(), n_embd);
    }
  }

  if (!logits.empty()) {
    kernels::RmsNorm(s.x.data(), w_->output_norm, c.n_embd, c.rms_eps, s.xn.data());
    s.act.Set(s.xn.data(), c.n_embd);
    kernels::MatVec(w_->output, s.act, logits.data(), pool);
  }
  return Status::Ok();
}

// proj = down(SiLU(gate(xn)) * up(xn)).
void Model::Ffn(const Layer& L) {
  Scratch& s = *s_;
  s.act.Set(s.xn.data(), cfg_.n_embd);
  const MatVecJob gu[] = {{&L.gate, &s.act, s.gate.data()}, {&L.up, &s.act, s.up.data()}};
  kernels::MatVecMany(gu, pool_.get());
  kernels::SwiGlu(s.gate.data(), s.up.data(), s.gate.data(), cfg_.n_ff);
  s.act2.Set(s.gate.data(), cfg_.n_ff);
  kernels::MatVec(L.down, s.act2, s.proj.data(), pool_.get());
}

// moe_out = sum over the selected experts, in router order, of weight * expert(xn).
void Model::Moe(const Layer& L) {
  const ModelConfig& c = cfg_;
  Scratch& s = *s_;
  s.act.Set(s.xn.data(), c.n_embd);
  kernels::MatVec(L.gate_inp, s.act, s.router.data(), pool_.get());
  s.expert_ids.resize(static_cast<size_t>(c.n_expert_used));
  s.expert_weights.resize(static_cast<size_t>(c.n_expert_used));
  kernels::RouteTopK(s.router.data(), c.n_expert, c.n_expert_used, c.norm_topk_prob, s.expert_ids.data(),
                     s.expert_weights.data());
  std::fill(s.moe_out.begin(), s.moe_out.end(), 0.0f);
  for (int i = 0; i < c.n_expert_used; ++i) {
    const int e = s.expert_ids[static_cast<size_t>(i)];
    const float w = s.expert_weights[static_cast<size_t>(i)];
    const MatrixView gate = Expert(L.gate_exps, e), up = Expert(L.up_exps, e), down = Expert(L.down_exps, e);
    const MatVecJob gu[] = {{&gate, &s.act, s.gate.data()}, {&up, &s.act, s.up.data()}};
    kernels::MatVecMany(gu, pool_.get());
    kernels::SwiGlu(s.gate.data(), s.up.data(), s.gate.data(), c.n_ff_exp);
    s.act2.Set(s.gate.data(), c.n_ff_exp);
    kernels::MatVec(down, s.act2, s.proj.data(), pool_.get());
    for (int d = 0; d < c.n_embd; ++d) s.moe_out[static_cast<size_t>(d)] += w * s.proj[static_cast<size_t>(d)];
  }
}

// Attention of the query at `pos` over the sequence's blocks of `layer`, each pinned on
// the compute tier (batches of kv_batch_blocks) and read in its codec's encoding.
Status Model::Attention(KvCache& cache, SeqId seq, int layer, int pos, const float* q, float* out) {
  const ModelConfig& c = cfg_;
  Scratch& s = *s_;
  MemoryManager& mm = cache.memory();
  const Tier tier = mm.host_addressable(mm.compute_tier()) ? mm.compute_tier() : Tier::kHost;
  const VectorCodec& codec = cache.codec();
  const KvGeometry& g = cache.geometry();

  kernels::AttentionParams p;
  p.n_heads = c.n_head;
  p.n_kv_heads = c.n_head_kv;
  p.head_dim = c.head_dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  p.query_pos = pos;
  p.round_query_f16 = p.round_weights_f16 = options_.llama_attention_rounding && codec.codec() == KvCodec::kF16;
  kernels::AttentionBegin(codec, p, q, &s.attention);

  // Two passes (llama.cpp's exact softmax weights) with an f16 cache and llama rounding;
  // otherwise one online pass. Either way blocks are pinned `batch` at a time.
  const bool two_pass = p.round_weights_f16;
  const int n_blocks = cache.NumBlocks(seq);
  const int batch = options_.kv_batch_blocks > 0 ? options_.kv_batch_blocks : std::max(n_blocks, 1);
  for (int pass = 0; pass < (two_pass ? 2 : 1); ++pass) {
    for (int b0 = 0; b0 < n_blocks; b0 += batch) {
      const int count = std::min(batch, n_blocks - b0);
      s.pins.clear();
      s.blocks.clear();
      for (int b = b0; b < b0 + count; ++b) {
        auto pin = mm.Acquire(cache.BlockPage(seq, layer, b), tier, Access::kRead);
        if (!pin.ok()) {
          return pin.status().Annotate("attention, layer " + std::to_string(layer) + " block " + std::to_string(b));
        }
        s.blocks.push_back(pin->data());
        s.pins.push_back(std::move(pin).value());
      }
      kernels::PagedKvView view;
      view.blocks = s.blocks.data();
      view.n_blocks = count;
      view.first_block = b0;
      view.n_tokens = cache.Length(seq);
      view.block_tokens = g.block_tokens;
      view.n_kv_heads = g.n_kv_heads;
      view.vector_bytes = codec.vector_bytes();
      if (!two_pass) {
        kernels::AttentionBlocks(codec, p, view, &s.attention, pool_.get());
      } else if (pass == 0) {
        kernels::AttentionScores(codec, p, view, &s.attention, pool_.get());
      } else {
        kernels::AttentionValues(codec, p, view, &s.attention, pool_.get());
      }
    }
    if (two_pass && pass == 0) kernels::AttentionSoftmax(p, &s.attention, pool_.get());
  }
  s.pins.clear();
  kernels::AttentionEnd(codec, p, &s.attention, out);
  return Status::Ok();
}

}  // namespace tierkv
