// kernels/attention.h
//
// Paged attention for one query token over one layer's KV blocks, reading the stored
// (encoded) K and V directly through a codec's operations: never a dequantized copy of
// the cache. Causal, grouped-query (query head h reads KV head h / (n_heads / n_kv_heads)),
// scores scaled by `scale` (1/sqrt(head_dim) for the supported models).
//
// Two ways to form the softmax; in both, blocks may be fed in any number of batches (a
// layer whose KV does not fit the compute tier streams through a few blocks at a time)
// and the result is the same, bit for bit: the arithmetic depends only on block order,
// never on batching or page residency.
//
// Online (one pass; AttentionBlocks): running max m and sum l per head, updated block by
// block:
//     s_j = scale * Dot(q', K_j);  m' = max(m, max_j s_j);  acc *= e^(m - m'); l *= e^(m - m')
//     w_j = e^(s_j - m');  l += w_j;  acc += w_j * V_j  (codec Accumulate)
//     out = FinishOutput(acc / l)
//
// Two-pass (AttentionScores, AttentionSoftmax, AttentionValues): pass 1 reads only the K
// half of each block and keeps the scores (n_heads x n_tokens floats); the softmax is
// then formed exactly as llama.cpp's CPU backend does (f32 exponentials, double sum,
// p_j = e_j * (float)(1 / sum)); pass 2 reads the V halves. This reproduces llama.cpp's
// weights bit for bit, which matters downstream: the attention output is re-quantized
// (Q8_0/Q8_K) for the next matmul, and weights that differ by one f16 rounding flip
// those roundings and move the logits by ~0.1 (docs/kernels.md).
//
// llama.cpp emulation (f16 KV cache, flash attention off): Q is converted to f16 before
// Q.K (round_query_f16) and the normalised softmax weights are rounded to f16 before the
// product with V (round_weights_f16). In the online form the weights are rounded
// relative to the running max instead: the same relative rounding, not the same bits.
//
// Block layout (kvcache/kv_cache.h, HND): K [n_kv_heads][block_tokens][vector_bytes],
// then V [n_kv_heads][block_tokens][vector_bytes].
//
// The codec type is a template parameter so that kernels/ does not depend on kvcache/:
// anything with the members of AttentionCodec works (kvcache's VectorCodec does).
//
// Thread-safety: an AttentionState belongs to one caller; heads run in parallel on the
// pool, each writing only its own part of the state.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/fp16.h"
#include "kernels/thread_pool.h"

namespace tierkv::kernels {

template <typename C>
concept AttentionCodec = requires(const C& c, const float* f, float* out, const void* enc, size_t n) {
  { c.head_dim() } -> std::convertible_to<int>;
  { c.vector_bytes() } -> std::convertible_to<size_t>;
  c.PrepareQuery(f, out);
  c.DotMany(f, enc, n, out);
  c.AccumulateMany(f, enc, n, out);
  c.FinishOutput(f, out);
};

// One layer's blocks of one sequence (a batch of consecutive blocks of it).
struct PagedKvView {
  const std::byte* const* blocks = nullptr;  // [n_blocks] block base addresses
  int n_blocks = 0;
  int first_block = 0;     // sequence index of blocks[0]; its first token is at
                           // position first_block * block_tokens
  int n_tokens = 0;        // tokens in the sequence; later slots are ignored
  int block_tokens = 0;
  int n_kv_heads = 0;
  size_t vector_bytes = 0;
};

struct AttentionParams {
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float scale = 1.0f;
  int64_t query_pos = 0;           // keys at positions > query_pos are masked
  bool round_query_f16 = false;
  bool round_weights_f16 = false;
};

// Per query head: prepared query, running max, running sum, accumulator.
struct AttentionState {
  std::vector<float> q;        // [n_heads][head_dim], prepared
  std::vector<float> m;        // [n_heads]
  std::vector<double> l;       // [n_heads]
  std::vector<float> acc;      // [n_heads][head_dim]
  std::vector<float> scratch;  // [n_heads][2 * block_tokens]: scores, weights (online)
  std::vector<float> probs;    // [n_heads][n_keys]: scores, then weights (two-pass)
  int64_t n_keys = 0;          // keys the query sees (two-pass)
};

// Starts a query: q[n_heads * head_dim] (after RoPE).
template <AttentionCodec Codec>
void AttentionBegin(const Codec& codec, const AttentionParams& p, const float* q, AttentionState* st) {
  const size_t hd = static_cast<size_t>(p.head_dim);
  st->q.resize(static_cast<size_t>(p.n_heads) * hd);
  std::vector<float> tmp(hd);
  for (int h = 0; h < p.n_heads; ++h) {
    const float* qh = q + static_cast<size_t>(h) * hd;
    for (size_t i = 0; i < hd; ++i) tmp[i] = p.round_query_f16 ? RoundToF16(qh[i]) : qh[i];
    codec.PrepareQuery(tmp.data(), st->q.data() + static_cast<size_t>(h) * hd);
  }
  st->m.assign(static_cast<size_t>(p.n_heads), -std::numeric_limits<float>::infinity());
  st->l.assign(static_cast<size_t>(p.n_heads), 0.0);
  st->acc.assign(static_cast<size_t>(p.n_heads) * hd, 0.0f);
  st->n_keys = 0;
}

namespace attention_internal {

// Below this many multiply-adds a fork-join costs more than it saves.
inline constexpr int64_t kMinParallelWork = int64_t{1} << 16;

// Runs fn(h) for every head, on the pool when there is one and the work (multiply-adds
// over all heads) is worth it.
template <typename F>
void ForHeads(const AttentionParams& p, int64_t work, ThreadPool* pool, F&& fn) {
  if (pool != nullptr && work >= kMinParallelWork) {
    pool->ParallelFor(p.n_heads, fn);
  } else {
    for (int h = 0; h < p.n_heads; ++h) fn(h);
  }
}

template <AttentionCodec Codec>
void HeadBlocks(const Codec& codec, const AttentionParams& p, const PagedKvView& kv, AttentionState* st, int h,
                float* scores, float* weights) {
  const size_t hd = static_cast<size_t>(p.head_dim);
  const int group = p.n_heads / p.n_kv_heads;
  const int g = h / group;
  const size_t vb = kv.vector_bytes;
  const size_t half = static_cast<size_t>(kv.n_kv_heads) * static_cast<size_t>(kv.block_tokens) * vb;
  const float* q = st->q.data() + static_cast<size_t>(h) * hd;
  float* acc = st->acc.data() + static_cast<size_t>(h) * hd;
  float m = st->m[static_cast<size_t>(h)];
  double l = st->l[static_cast<size_t>(h)];
  const int64_t limit = std::min<int64_t>(kv.n_tokens, p.query_pos + 1);  // causal
  for (int b = 0; b < kv.n_blocks; ++b) {
    const int64_t start = static_cast<int64_t>(kv.first_block + b) * kv.block_tokens;
    const int64_t n = std::min<int64_t>(kv.block_tokens, limit - start);
    if (n <= 0) continue;
    const std::byte* k = kv.blocks[b] + static_cast<size_t>(g) * static_cast<size_t>(kv.block_tokens) * vb;
    const std::byte* v = k + half;
    codec.DotMany(q, k, static_cast<size_t>(n), scores);
    float bmax = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; ++j) {
      scores[j] *= p.scale;
      bmax = std::max(bmax, scores[j]);
    }
    const float m_new = std::max(m, bmax);
    if (m_new > m && l > 0.0) {
      const float alpha = std::exp(m - m_new);
      for (size_t i = 0; i < hd; ++i) acc[i] *= alpha;
      l *= static_cast<double>(alpha);
    }
    m = m_new;
    for (int64_t j = 0; j < n; ++j) {
      const float w = std::exp(scores[j] - m);
      l += static_cast<double>(w);
      weights[j] = p.round_weights_f16 ? RoundToF16(w) : w;
    }
    codec.AccumulateMany(weights, v, static_cast<size_t>(n), acc);
  }
  st->m[static_cast<size_t>(h)] = m;
  st->l[static_cast<size_t>(h)] = l;
}

}  // namespace attention_internal

// Folds a batch of blocks (in sequence order, after those of earlier calls) into the
// state. pool may be null.
template <AttentionCodec Codec>
void AttentionBlocks(const Codec& codec, const AttentionParams& p, const PagedKvView& kv, AttentionState* st,
                     ThreadPool* pool) {
  const size_t per_head = 2 * static_cast<size_t>(kv.block_tokens);
  if (st->scratch.size() < per_head * static_cast<size_t>(p.n_heads)) {
    st->scratch.resize(per_head * static_cast<size_t>(p.n_heads));
  }
  const int64_t work = static_cast<int64_t>(kv.n_blocks) * kv.block_tokens * p.n_heads * p.head_dim * 2;
  attention_internal::ForHeads(p, work, pool, [&](int64_t h) {
    float* s = st->scratch.data() + per_head * static_cast<size_t>(h);
    attention_internal::HeadBlocks(codec, p, kv, st, static_cast<int>(h), s, s + kv.block_tokens);
  });
}


// ---- two-pass form ----------------------------------------------------------------------

namespace attention_internal {

// The sum of x[n] in the order of llama.cpp's AVX-512 softmax: 16-value chunks, each
// reduced in f32 by a fixed tree (8 + 8, 4 + 4, 2 + 2, 1 + 1 lanes; lanes past n are
// zero, as masked keys are), the chunk sums added in double. Matching the order keeps
// 1 / sum, and so the f16-rounded weights, bit-identical to llama.cpp's more often.
inline double SumLikeGgml(const float* x, int64_t n) {
  double sum = 0.0;
  for (int64_t c = 0; c < n; c += 16) {
    float l[16];
    for (int64_t i = 0; i < 16; ++i) l[i] = c + i < n ? x[c + i] : 0.0f;
    float t8[8], t4[4];
    for (int i = 0; i < 8; ++i) t8[i] = l[i] + l[i + 8];
    for (int i = 0; i < 4; ++i) t4[i] = t8[i] + t8[i + 4];
    sum += static_cast<double>((t4[0] + t4[2]) + (t4[1] + t4[3]));
  }
  return sum;
}

// Keys of block b of the view that the query sees: [start, start + n).
inline int64_t BlockKeys(const AttentionParams& p, const PagedKvView& kv, int b, int64_t* start) {
  *start = static_cast<int64_t>(kv.first_block + b) * kv.block_tokens;
  const int64_t limit = std::min<int64_t>(kv.n_tokens, p.query_pos + 1);
  return std::max<int64_t>(0, std::min<int64_t>(kv.block_tokens, limit - *start));
}

}  // namespace attention_internal

// Pass 1: the scaled scores of a batch of blocks (in sequence order, after those of
// earlier calls), kept in the state. REQUIRES: AttentionBegin; no AttentionBlocks.
template <AttentionCodec Codec>
void AttentionScores(const Codec& codec, const AttentionParams& p, const PagedKvView& kv, AttentionState* st,
                     ThreadPool* pool) {
  using attention_internal::BlockKeys;
  // Grow the per-head rows to hold every key up to the end of this batch.
  int64_t end = st->n_keys;
  for (int b = 0; b < kv.n_blocks; ++b) {
    int64_t start;
    const int64_t n = BlockKeys(p, kv, b, &start);
    if (n > 0) end = std::max(end, start + n);
  }
  const int64_t old_stride = static_cast<int64_t>(st->probs.size()) / std::max(p.n_heads, 1);
  if (end > old_stride) {
    // Rows are [n_heads][stride]; re-lay them out with room to spare.
    const int64_t stride = std::max<int64_t>(end, 2 * old_stride);
    std::vector<float> grown(static_cast<size_t>(stride) * static_cast<size_t>(p.n_heads));
    for (int h = 0; h < p.n_heads && old_stride > 0; ++h) {
      std::copy_n(st->probs.data() + static_cast<size_t>(h) * old_stride, st->n_keys,
                  grown.data() + static_cast<size_t>(h) * stride);
    }
    st->probs.swap(grown);
  }
  const int64_t stride = static_cast<int64_t>(st->probs.size()) / p.n_heads;
  const size_t hd = static_cast<size_t>(p.head_dim);
  const int group = p.n_heads / p.n_kv_heads;
  const size_t vb = kv.vector_bytes;
  const int64_t work = (end - st->n_keys) * p.n_heads * p.head_dim;
  attention_internal::ForHeads(p, work, pool, [&](int64_t h) {
    const int g = static_cast<int>(h) / group;
    const float* q = st->q.data() + static_cast<size_t>(h) * hd;
    float* row = st->probs.data() + static_cast<size_t>(h) * stride;
    for (int b = 0; b < kv.n_blocks; ++b) {
      int64_t start;
      const int64_t n = BlockKeys(p, kv, b, &start);
      if (n <= 0) continue;
      const std::byte* k = kv.blocks[b] + static_cast<size_t>(g) * static_cast<size_t>(kv.block_tokens) * vb;
      codec.DotMany(q, k, static_cast<size_t>(n), row + start);
      for (int64_t j = start; j < start + n; ++j) row[j] *= p.scale;
    }
  });
  st->n_keys = end;
}

// Between the passes: scores -> weights, per head: e_j = expf(s_j - max) in f32, their
// sum in double, p_j = e_j * (float)(1 / sum), rounded to f16 if round_weights_f16.
inline void AttentionSoftmax(const AttentionParams& p, AttentionState* st, ThreadPool* pool) {
  const int64_t stride = p.n_heads > 0 ? static_cast<int64_t>(st->probs.size()) / p.n_heads : 0;
  const int64_t n = st->n_keys;
  attention_internal::ForHeads(p, n * p.n_heads * 8, pool, [&](int64_t h) {
    float* row = st->probs.data() + static_cast<size_t>(h) * stride;
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; ++j) max = std::max(max, row[j]);
    for (int64_t j = 0; j < n; ++j) row[j] = std::exp(row[j] - max);
    const double sum = attention_internal::SumLikeGgml(row, n);
    const float inv = n > 0 ? static_cast<float>(1.0 / sum) : 0.0f;
    for (int64_t j = 0; j < n; ++j) row[j] *= inv;
    if (p.round_weights_f16) RoundToF16Array(row, static_cast<size_t>(n));
    st->m[static_cast<size_t>(h)] = max;
    st->l[static_cast<size_t>(h)] = 1.0;  // the weights are normalised already
  });
}

// Pass 2: acc += p_j * V_j over a batch of blocks (in sequence order).
template <AttentionCodec Codec>
void AttentionValues(const Codec& codec, const AttentionParams& p, const PagedKvView& kv, AttentionState* st,
                     ThreadPool* pool) {
  using attention_internal::BlockKeys;
  const int64_t stride = static_cast<int64_t>(st->probs.size()) / p.n_heads;
  const size_t hd = static_cast<size_t>(p.head_dim);
  const int group = p.n_heads / p.n_kv_heads;
  const size_t vb = kv.vector_bytes;
  const size_t half = static_cast<size_t>(kv.n_kv_heads) * static_cast<size_t>(kv.block_tokens) * vb;
  const int64_t work = static_cast<int64_t>(kv.n_blocks) * kv.block_tokens * p.n_heads * p.head_dim;
  attention_internal::ForHeads(p, work, pool, [&](int64_t h) {
    const int g = static_cast<int>(h) / group;
    const float* row = st->probs.data() + static_cast<size_t>(h) * stride;
    float* acc = st->acc.data() + static_cast<size_t>(h) * hd;
    for (int b = 0; b < kv.n_blocks; ++b) {
      int64_t start;
      const int64_t n = BlockKeys(p, kv, b, &start);
      if (n <= 0) continue;
      const std::byte* v =
          kv.blocks[b] + half + static_cast<size_t>(g) * static_cast<size_t>(kv.block_tokens) * vb;
      codec.AccumulateMany(row + start, v, static_cast<size_t>(n), acc);
    }
  });
}

// out[n_heads * head_dim]: the attention output of every head (either form). A head
// that saw no token (impossible for a causal query over its own token) gives zeros.
template <AttentionCodec Codec>
void AttentionEnd(const Codec& codec, const AttentionParams& p, AttentionState* st, float* out) {
  const size_t hd = static_cast<size_t>(p.head_dim);
  for (int h = 0; h < p.n_heads; ++h) {
    float* acc = st->acc.data() + static_cast<size_t>(h) * hd;
    const double l = st->l[static_cast<size_t>(h)];
    if (l != 1.0) {
      const float inv = l > 0.0 ? static_cast<float>(1.0 / l) : 0.0f;
      for (size_t i = 0; i < hd; ++i) acc[i] *= inv;
    }
    codec.FinishOutput(acc, out + static_cast<size_t>(h) * hd);
  }
}

}  // namespace tierkv::kernels
