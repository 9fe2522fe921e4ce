// kernels/attention.h
//
// Paged attention for one query token (or, in the *Multi forms at the end, the queries
// of a prefill chunk, each with the bits it has alone) over one layer's KV blocks,
// reading the stored (encoded) K and V directly through a codec's operations: never a
// dequantized copy of the cache. Causal, grouped-query (query head h reads KV head h / (n_heads / n_kv_heads)),
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
// With `sums` (two-pass form, f16 codec) Q.K and P.V also sum in llama.cpp's orders, one
// token's or a batch's (kernels/attention_sums.h): then the bits are llama.cpp's.
//
// Block layout (kvcache/kv_cache.h, HND): K [n_kv_heads][block_tokens][vector_bytes],
// then V [n_kv_heads][block_tokens][vector_bytes]; with key_tiles in the view, each K run
// is tiles of 16 keys stored dimension by dimension, read by the codec's
// DotManyGroupTiled (TiledKeyCodec).
//
// The codec type is a template parameter so that kernels/ does not depend on kvcache/:
// anything with the members of AttentionCodec works (kvcache's VectorCodec does). A codec
// that also has the grouped members of GroupedAttentionCodec serves all query heads of a
// KV head from one read of each K/V vector; otherwise each query head calls DotMany /
// AccumulateMany on its own (the same bits either way: the grouped forms must equal the
// per-head ones).
//
// Parallel tasks are KV heads (each with all its query heads; pairs of KV heads in pass 2
// when there are two per thread, through a RunsValueCodec), and in pass 1 also ranges of
// blocks (scores are independent of each other). Every head's arithmetic runs in the
// same order as with one thread and one batch; no sum crosses a task boundary.
//
// Thread-safety: an AttentionState belongs to one caller; tasks run in parallel on the
// pool, each writing only its own part of the state.
#pragma once

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TIERKV_ATTENTION_X86 1
#endif

#include "kernels/activation.h"
#include "kernels/attention_sums.h"
#include "kernels/attention_types.h"
#include "kernels/cpu_features.h"
#include "kernels/expf.h"
#include "kernels/fp16.h"
#include "kernels/thread_pool.h"
#include "memory/prefetch.h"

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

// Optional: `heads` queries ([heads][head_dim]) against the same n vectors, scores
// [heads][stride]; weights [heads][stride] into acc [heads][head_dim]. Per head
// bit-identical to DotMany / AccumulateMany.
template <typename C>
concept GroupedAttentionCodec =
    requires(const C& c, const float* f, float* out, const void* enc, size_t n, int heads) {
      c.DotManyGroup(f, heads, enc, n, out, n);
      c.AccumulateManyGroup(f, n, heads, enc, n, out);
    };

// Optional: AccumulateManyGroup over `runs` KV heads at once (run r's vectors at enc + r
// * run_stride bytes, its query heads' rows after run r - 1's), per head bit-identical.
template <typename C>
concept RunsValueCodec = requires(const C& c, const float* f, float* out, const void* enc, size_t n, int heads) {
  c.AccumulateManyGroupRuns(f, n, heads, heads, enc, n, n, out);
};

// Optional: scores of keys stored as tiles (kvcache's key tiles), per (head, key)
// bit-identical to DotManyGroup over the same keys stored vector by vector.
template <typename C>
concept TiledKeyCodec = requires(const C& c, const float* f, float* out, const void* enc, size_t n, int heads) {
  c.DotManyGroupTiled(f, heads, enc, n, out, n);
};

// Optional: a block's K or V run decoded once and read by many queries (the decoded
// runs of kernels/kv_vector_kernels.h), the same bits as reading the run.
template <typename C>
concept DecodedRunCodec =
    requires(const C& c, const float* f, float* out, const void* enc, void* dec, size_t n, int heads) {
      { c.DecodedRunBytes(n, true) } -> std::convertible_to<size_t>;
      c.DecodeRun(enc, n, true, dec);
      c.DotManyGroupDecoded(f, heads, enc, n, n, out, n);
      c.AccumulateManyGroupDecoded(f, n, heads, enc, n, n, out);
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
  // Each residue starts at its first key: no clearing needed, only the size.
  if (p.sums != AttentionSums::kOwn) {
    st->part.resize(static_cast<size_t>(p.n_heads) * static_cast<size_t>(AttentionResidues(p.sums)) * hd);
  }
}

namespace attention_internal {

// A KV head's K (or V) in a block is one run of block_tokens vectors, and the next
// block's run is in another frame. The kernels prefetch ahead within a run; the first
// kRunPrefetchBytes of the next run are asked for when a run starts, so the hardware
// prefetchers' restart at each run is not a stall (fused attention at 64K tokens: 1600
// -> 1350 us in attention_bench).
inline constexpr size_t kRunPrefetchBytes = 4096;

// Below this many multiply-adds a fork-join costs more than it saves.
inline constexpr int64_t kMinParallelWork = int64_t{1} << 16;

// Runs fn(i) for i in [0, n), on the pool when there is one and the work (multiply-adds
// over all tasks) is worth it.
template <typename F>
void ForTasks(int64_t n, int64_t work, ThreadPool* pool, F&& fn) {
  if (pool != nullptr && work >= kMinParallelWork && n > 1) {
    pool->ParallelFor(n, fn);
  } else {
    for (int64_t i = 0; i < n; ++i) fn(i);
  }
}

// Runs fn(h) for every query head.
template <typename F>
void ForHeads(const AttentionParams& p, int64_t work, ThreadPool* pool, F&& fn) {
  ForTasks(p.n_heads, work, pool, std::forward<F>(fn));
}

// scores[h * stride + j] = Dot(q[h], k_j) for the `heads` query heads of one KV head;
// k is a K run, of key tiles when `tiled`.
template <AttentionCodec Codec>
void DotGroup(const Codec& codec, const float* q, int heads, size_t hd, const std::byte* k, size_t n,
              float* scores, size_t stride, bool tiled) {
  if constexpr (TiledKeyCodec<Codec>) {
    if (tiled) return codec.DotManyGroupTiled(q, heads, k, n, scores, stride);
  }
  assert(!tiled && "key tiles need a TiledKeyCodec");
  if constexpr (GroupedAttentionCodec<Codec>) {
    codec.DotManyGroup(q, heads, k, n, scores, stride);
  } else {
    for (int h = 0; h < heads; ++h) {
      codec.DotMany(q + static_cast<size_t>(h) * hd, k, n, scores + static_cast<size_t>(h) * stride);
    }
  }
}

// acc[h] += sum_j w[h * stride + j] * V_j for the `heads` query heads of one KV head.
template <AttentionCodec Codec>
void AccumulateGroup(const Codec& codec, const float* w, size_t stride, int heads, size_t hd, const std::byte* v,
                     size_t n, float* acc) {
  if constexpr (GroupedAttentionCodec<Codec>) {
    codec.AccumulateManyGroup(w, stride, heads, v, n, acc);
  } else {
    for (int h = 0; h < heads; ++h) {
      codec.AccumulateMany(w + static_cast<size_t>(h) * stride, v, n, acc + static_cast<size_t>(h) * hd);
    }
  }
}

// ---- exp and the softmax row ------------------------------------------------------------
//
// The exponentials are ExpGgml (kernels/expf.h): llama.cpp's AVX-512 expf, so the weights
// keep its bits. ExpGgml16 / ExpGgml8 give the scalar definition's bits; the row functions
// below differ only in how many lanes they compute at once.

#if defined(TIERKV_ATTENTION_X86)
#define TIERKV_ATTENTION_AVX512 __attribute__((target("avx512f,avx512dq,avx2,fma,f16c")))
#define TIERKV_ATTENTION_AVX2 __attribute__((target("avx2,fma,f16c")))

// GCC 12's AVX-512 intrinsics fill "don't care" lanes with _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports (as in kernels/quant_avx512.cc).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

inline __mmask16 TailMask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
}

// out[j] = ExpGgml(x[j] - sub); out may equal x.
TIERKV_ATTENTION_AVX512 inline void ExpShiftedAvx512(const float* x, float sub, int64_t n, float* out) {
  const __m512 vs = _mm512_set1_ps(sub);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = TailMask(n - j);
    _mm512_mask_storeu_ps(out + j, m, ExpGgml16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + j), vs)));
  }
}

TIERKV_ATTENTION_AVX2 inline void ExpShiftedAvx2(const float* x, float sub, int64_t n, float* out) {
  const __m256 vs = _mm256_set1_ps(sub);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(out + j, ExpGgml8(_mm256_sub_ps(_mm256_loadu_ps(x + j), vs)));
  for (; j < n; ++j) out[j] = ExpGgml(x[j] - sub);
}

// The f32 sum of one 16-value chunk held as two 8-lane halves, in SumLikeGgml's order.
TIERKV_ATTENTION_AVX2 inline float ChunkSum(__m256 lo, __m256 hi) {
  const __m256 t8 = _mm256_add_ps(lo, hi);
  const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));  // t4[0] + t4[2], t4[1] + t4[3]
  return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
}

// row[j] *= scale for n values; returns their max (NaN values skipped, -inf for none), as
// std::max(m, x) over the scaled row finds it: the scores pass of the two-pass form
// scales each block's scores and finds the max while they are in cache, so the softmax
// need not read the row for it again.
TIERKV_ATTENTION_AVX512 inline float ScaleRowMaxAvx512(float* row, int64_t n, float scale) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const __m512 vs = _mm512_set1_ps(scale);
  __m512 vmax = _mm512_set1_ps(neg_inf);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = TailMask(n - j);
    const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), vs);
    _mm512_mask_storeu_ps(row + j, m, x);
    // max(x, m) keeps m when x is NaN, as std::max(m, x) does.
    vmax = _mm512_mask_max_ps(vmax, m, x, vmax);
  }
  return _mm512_reduce_max_ps(vmax);
}

// std::max(m, lane) over the 8 lanes of v, in lane order (NaN lanes skipped).
TIERKV_ATTENTION_AVX2 inline float MaxLanesAvx2(__m256 v, float m) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  for (float x : lanes) m = std::max(m, x);
  return m;
}

TIERKV_ATTENTION_AVX2 inline float ScaleRowMaxAvx2(float* row, int64_t n, float scale) {
  const __m256 vs = _mm256_set1_ps(scale);
  __m256 vmax = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(row + j), vs);
    _mm256_storeu_ps(row + j, x);
    vmax = _mm256_max_ps(x, vmax);
  }
  float max = MaxLanesAvx2(vmax, -std::numeric_limits<float>::infinity());
  for (; j < n; ++j) {
    row[j] *= scale;
    max = std::max(max, row[j]);
  }
  return max;
}

// The two-pass softmax of one row, as the scalar AttentionSoftmax does it: the max (or
// *known_max, the row's max found earlier); e_j; their sum in SumLikeGgml's order;
// e_j * (float)(1 / sum), optionally f16-rounded.
TIERKV_ATTENTION_AVX512 inline float SoftmaxRowAvx512(float* row, int64_t n, bool round_f16,
                                                      const float* known_max = nullptr) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float max = neg_inf;
  if (known_max != nullptr) {
    max = *known_max;
  } else {
    __m512 vmax = _mm512_set1_ps(neg_inf);
    for (int64_t j = 0; j < n; j += 16) {
      // max(x, m) keeps m when x is NaN, as std::max(m, x) does.
      vmax = _mm512_max_ps(_mm512_mask_loadu_ps(_mm512_set1_ps(neg_inf), TailMask(n - j), row + j), vmax);
    }
    max = _mm512_reduce_max_ps(vmax);
  }
  const __m512 vm = _mm512_set1_ps(max);
  double sum = 0.0;
  int64_t j = 0;
  // 64 values at a time: the four 16-lane sums are formed together (the same adds as
  // ChunkSum, by the shuffle tree of kvcache's f16 scores), then added to the double sum
  // in order.
  for (; j + 64 <= n; j += 64) {
    __m512 e[4];
    for (int k = 0; k < 4; ++k) {
      e[k] = ExpGgml16(_mm512_sub_ps(_mm512_loadu_ps(row + j + 16 * k), vm));
      _mm512_storeu_ps(row + j + 16 * k, e[k]);
    }
    // [t8(e0) | t8(e1)], t8[i] = e[i] + e[i + 8]; then t4[i] = t8[i] + t8[i + 4] per lane.
    const __m512 u01 = _mm512_add_ps(_mm512_shuffle_f32x4(e[0], e[1], 0x44), _mm512_shuffle_f32x4(e[0], e[1], 0xee));
    const __m512 u23 = _mm512_add_ps(_mm512_shuffle_f32x4(e[2], e[3], 0x44), _mm512_shuffle_f32x4(e[2], e[3], 0xee));
    const __m512 t4 = _mm512_add_ps(_mm512_shuffle_f32x4(u01, u23, 0x88), _mm512_shuffle_f32x4(u01, u23, 0xdd));
    const __m512 t2 = _mm512_add_ps(t4, _mm512_shuffle_ps(t4, t4, 0xee));  // t4[0] + t4[2], t4[1] + t4[3]
    const __m512 t1 = _mm512_add_ps(t2, _mm512_shuffle_ps(t2, t2, 0x55));  // t2[0] + t2[1]
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, t1);
    for (int k = 0; k < 4; ++k) sum += static_cast<double>(lanes[4 * k]);
  }
  for (; j < n; j += 16) {
    const __mmask16 m = TailMask(n - j);
    // Lanes past n are 0, as in SumLikeGgml.
    const __m512 e = _mm512_maskz_mov_ps(m, ExpGgml16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + j), vm)));
    _mm512_mask_storeu_ps(row + j, m, e);
    sum += static_cast<double>(ChunkSum(_mm512_castps512_ps256(e), _mm512_extractf32x8_ps(e, 1)));
  }
  const __m512 inv = _mm512_set1_ps(n > 0 ? static_cast<float>(1.0 / sum) : 0.0f);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = TailMask(n - j);
    __m512 w = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), inv);
    if (round_f16) w = _mm512_cvtph_ps(_mm512_cvtps_ph(w, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm512_mask_storeu_ps(row + j, m, w);
  }
  return max;
}

// The same row with 8-lane vectors (AVX2 + FMA + F16C).
TIERKV_ATTENTION_AVX2 inline float SoftmaxRowAvx2(float* row, int64_t n, bool round_f16,
                                                  const float* known_max = nullptr) {
  float max = -std::numeric_limits<float>::infinity();
  if (known_max != nullptr) {
    max = *known_max;
  } else {
    // As std::max(m, x) over the row: max(x, m) keeps m when x is NaN; a max does not
    // depend on its order (a +0 / -0 tie can only change the sign of a zero max, and
    // x - max, so every e_j, is the same either way).
    __m256 vmax = _mm256_set1_ps(max);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(_mm256_loadu_ps(row + i), vmax);
    max = MaxLanesAvx2(vmax, max);
    for (; i < n; ++i) max = std::max(max, row[i]);
  }
  const __m256 vm = _mm256_set1_ps(max);
  double sum = 0.0;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m256 lo = ExpGgml8(_mm256_sub_ps(_mm256_loadu_ps(row + j), vm));
    const __m256 hi = ExpGgml8(_mm256_sub_ps(_mm256_loadu_ps(row + j + 8), vm));
    _mm256_storeu_ps(row + j, lo);
    _mm256_storeu_ps(row + j + 8, hi);
    sum += static_cast<double>(ChunkSum(lo, hi));
  }
  if (j < n) {
    alignas(32) float l[16] = {};
    for (int64_t i = j; i < n; ++i) row[i] = l[i - j] = ExpGgml(row[i] - max);
    sum += static_cast<double>(ChunkSum(_mm256_load_ps(l), _mm256_load_ps(l + 8)));
  }
  const __m256 inv = _mm256_set1_ps(n > 0 ? static_cast<float>(1.0 / sum) : 0.0f);
  j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 w = _mm256_mul_ps(_mm256_loadu_ps(row + j), inv);
    if (round_f16) w = _mm256_cvtph_ps(_mm256_cvtps_ph(w, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm256_storeu_ps(row + j, w);
  }
  for (; j < n; ++j) {
    const float w = row[j] * _mm256_cvtss_f32(inv);
    row[j] = round_f16 ? RoundToF16(w) : w;
  }
  return max;
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // TIERKV_ATTENTION_X86

// out[j] = ExpGgml(x[j] - sub), in the widest vectors the active level allows (the same
// bits at every level); out may equal x.
inline void ExpShifted(const float* x, float sub, int64_t n, float* out) {
#if defined(TIERKV_ATTENTION_X86)
  if (ActiveSimdLevel() >= SimdLevel::kAvx512) return ExpShiftedAvx512(x, sub, n, out);
  if (ActiveSimdLevel() >= SimdLevel::kAvx2) return ExpShiftedAvx2(x, sub, n, out);
#endif
  for (int64_t j = 0; j < n; ++j) out[j] = ExpGgml(x[j] - sub);
}

// One block of the online form for the query heads [h0, h0 + heads) of one KV head:
// their scores, then per head the running max / sum update and the weights, then one
// grouped accumulation. Per head the order of operations is that of a head on its own.
template <AttentionCodec Codec>
void GroupBlock(const Codec& codec, const AttentionParams& p, AttentionState* st, int h0, int heads,
                const std::byte* k, const std::byte* v, int64_t n, float* scratch, size_t per_head,
                size_t block_tokens, bool tiled) {
  const size_t hd = static_cast<size_t>(p.head_dim);
  DotGroup(codec, st->q.data() + static_cast<size_t>(h0) * hd, heads, hd, k, static_cast<size_t>(n), scratch,
           per_head, tiled);
  for (int i = 0; i < heads; ++i) {
    const size_t h = static_cast<size_t>(h0 + i);
    float* scores = scratch + per_head * static_cast<size_t>(i);
    float* weights = scores + block_tokens;
    float* acc = st->acc.data() + h * hd;
    float m = st->m[h];
    double l = st->l[h];
    float bmax = -std::numeric_limits<float>::infinity();
    const float scale = p.scale;  // a local, as in AttentionScores
    for (int64_t j = 0; j < n; ++j) {
      scores[j] *= scale;
      bmax = std::max(bmax, scores[j]);
    }
    const float m_new = std::max(m, bmax);
    if (m_new > m && l > 0.0) {
      const float alpha = std::exp(m - m_new);
      for (size_t d = 0; d < hd; ++d) acc[d] *= alpha;
      l *= static_cast<double>(alpha);
    }
    m = m_new;
    ExpShifted(scores, m, n, weights);
    for (int64_t j = 0; j < n; ++j) {
      const float w = weights[j];
      l += static_cast<double>(w);
      weights[j] = p.round_weights_f16 ? RoundToF16(w) : w;
    }
    st->m[h] = m;
    st->l[h] = l;
  }
  AccumulateGroup(codec, scratch + block_tokens, per_head, heads, hd, v, static_cast<size_t>(n),
                  st->acc.data() + static_cast<size_t>(h0) * hd);
}

}  // namespace attention_internal

// Folds a batch of blocks (in sequence order, after those of earlier calls) into the
// state. pool may be null.
template <AttentionCodec Codec>
void AttentionBlocks(const Codec& codec, const AttentionParams& p, const PagedKvView& kv, AttentionState* st,
                     ThreadPool* pool) {
  assert(p.sums == AttentionSums::kOwn && "llama.cpp's sums are the two-pass form's");
  const size_t per_head = 2 * static_cast<size_t>(kv.block_tokens);
  if (st->scratch.size() < per_head * static_cast<size_t>(p.n_heads)) {
    st->scratch.resize(per_head * static_cast<size_t>(p.n_heads));
  }
  const int group = p.n_heads / p.n_kv_heads;
  const size_t vb = kv.vector_bytes;
  const size_t half = static_cast<size_t>(kv.n_kv_heads) * static_cast<size_t>(kv.block_tokens) * vb;
  const int64_t limit = std::min<int64_t>(kv.n_tokens, p.query_pos + 1);  // causal
  const int64_t work = static_cast<int64_t>(kv.n_blocks) * kv.block_tokens * p.n_heads * p.head_dim * 2;
  // One task per KV head: its query heads' running max, sum and accumulator go through
  // the blocks in order.
  attention_internal::ForTasks(p.n_kv_heads, work, pool, [&](int64_t g) {
    const int h0 = static_cast<int>(g) * group;
    float* scratch = st->scratch.data() + per_head * static_cast<size_t>(h0);
    const size_t head_run = static_cast<size_t>(g) * static_cast<size_t>(kv.block_tokens) * vb;
    for (int b = 0; b < kv.n_blocks; ++b) {
      const int64_t start = static_cast<int64_t>(kv.first_block + b) * kv.block_tokens;
      const int64_t n = std::min<int64_t>(kv.block_tokens, limit - start);
      if (n <= 0) continue;
      const std::byte* k = kv.blocks[b] + head_run;
      if (b + 1 < kv.n_blocks) {
        PrefetchLines(kv.blocks[b + 1] + head_run, attention_internal::kRunPrefetchBytes);
        PrefetchLines(kv.blocks[b + 1] + half + head_run, attention_internal::kRunPrefetchBytes);
      }
      attention_internal::GroupBlock(codec, p, st, h0, group, k, k + half, n, scratch, per_head,
                                     static_cast<size_t>(kv.block_tokens), kv.key_tiles);
    }
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
    sum += static_cast<double>(ChunkSumGgml(l));
  }
  return sum;
}

// Keys of block b of the view that the query sees: [start, start + n).
inline int64_t BlockKeys(const AttentionParams& p, const PagedKvView& kv, int b, int64_t* start) {
  *start = static_cast<int64_t>(kv.first_block + b) * kv.block_tokens;
  const int64_t limit = std::min<int64_t>(kv.n_tokens, p.query_pos + 1);
  return std::max<int64_t>(0, std::min<int64_t>(kv.block_tokens, limit - *start));
}

// The scalar softmax of one row (the reference for SoftmaxRowAvx512); returns the max.
inline float SoftmaxRowScalar(float* row, int64_t n, bool round_f16, const float* known_max = nullptr) {
  float max = -std::numeric_limits<float>::infinity();
  if (known_max != nullptr) {
    max = *known_max;
  } else {
    for (int64_t j = 0; j < n; ++j) max = std::max(max, row[j]);
  }
  for (int64_t j = 0; j < n; ++j) row[j] = ExpGgml(row[j] - max);
  const double sum = SumLikeGgml(row, n);
  const float inv = n > 0 ? static_cast<float>(1.0 / sum) : 0.0f;
  for (int64_t j = 0; j < n; ++j) row[j] *= inv;
  if (round_f16) RoundToF16Array(row, static_cast<size_t>(n));
  return max;
}

// The softmax of one row, vectorised for the active level (the same bits); known_max as
// in SoftmaxRowAvx512.
inline float SoftmaxRow(float* row, int64_t n, bool round_f16, const float* known_max = nullptr) {
#if defined(TIERKV_ATTENTION_X86)
  if (ActiveSimdLevel() >= SimdLevel::kAvx512) return SoftmaxRowAvx512(row, n, round_f16, known_max);
  if (ActiveSimdLevel() >= SimdLevel::kAvx2) return SoftmaxRowAvx2(row, n, round_f16, known_max);
#endif
  return SoftmaxRowScalar(row, n, round_f16, known_max);
}

// row[j] *= scale; returns the max of the scaled row (ScaleRowMaxAvx512's rule), at the
// widest level available (the same bits: one rounding per product, an exact max).
inline float ScaleRowMax(float* row, int64_t n, float scale) {
#if defined(TIERKV_ATTENTION_X86)
  if (ActiveSimdLevel() >= SimdLevel::kAvx512) return ScaleRowMaxAvx512(row, n, scale);
  if (ActiveSimdLevel() >= SimdLevel::kAvx2) return ScaleRowMaxAvx2(row, n, scale);
#endif
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    row[j] *= scale;
    max = std::max(max, row[j]);
  }
  return max;
}

}  // namespace attention_internal

namespace attention_internal {

// Grows the per-head score rows ([n_heads][stride]) to hold every key up to the end of
// this batch; returns that end.
inline int64_t GrowScoreRows(const AttentionParams& p, const PagedKvView& kv, AttentionState* st) {
  int64_t end = st->n_keys;
  for (int b = 0; b < kv.n_blocks; ++b) {
    int64_t start;
    const int64_t n = BlockKeys(p, kv, b, &start);
    if (n > 0) end = std::max(end, start + n);
  }
  const int64_t old_stride = static_cast<int64_t>(st->probs.size()) / std::max(p.n_heads, 1);
  if (end > old_stride) {
    // Re-lay the rows out with room to spare.
    const int64_t stride = std::max<int64_t>(end, 2 * old_stride);
    std::vector<float> grown(static_cast<size_t>(stride) * static_cast<size_t>(p.n_heads));
    for (int h = 0; h < p.n_heads && old_stride > 0; ++h) {
      std::copy_n(st->probs.data() + static_cast<size_t>(h) * old_stride, st->n_keys,
                  grown.data() + static_cast<size_t>(h) * stride);
    }
    st->probs.swap(grown);
  }
  return end;
}

// Pass 1 of KV head g over blocks [b0, b1) of the batch: scaled scores into its query
// heads' rows. With track_max, st->m of those heads becomes the max of their scores so
// far (only for a task that owns the heads' whole rows).
template <AttentionCodec Codec>
void ScoreBlocks(const Codec& codec, const AttentionParams& p, const PagedKvView& kv, AttentionState* st, int g,
                 int b0, int b1, bool track_max = false) {
  const size_t stride = st->probs.size() / static_cast<size_t>(p.n_heads);
  const size_t hd = static_cast<size_t>(p.head_dim);
  const int group = p.n_heads / p.n_kv_heads;
  const size_t vb = kv.vector_bytes;
  const int h0 = g * group;
  const float* q = st->q.data() + static_cast<size_t>(h0) * hd;
  float* rows = st->probs.data() + static_cast<size_t>(h0) * stride;
  const float scale = p.scale;  // a local: the rows could alias p.scale, which would stop vectorisation
  const size_t head_run = static_cast<size_t>(g) * static_cast<size_t>(kv.block_tokens) * vb;
  for (int b = b0; b < b1; ++b) {
    int64_t start;
    const int64_t n = BlockKeys(p, kv, b, &start);
    if (n <= 0) continue;
    const std::byte* k = kv.blocks[b] + head_run;
    if (b + 1 < b1) PrefetchLines(kv.blocks[b + 1] + head_run, kRunPrefetchBytes);
    // A batch's order is the codec's own for head_dim % 16 == 0; llama.cpp's batched
    // product refuses other widths and sums them as one token's.
    if (p.sums == AttentionSums::kOneToken || (p.sums == AttentionSums::kBatch && hd % 16 != 0)) {
      OneTokenScoresF16(q, group, hd, reinterpret_cast<const uint16_t*>(k), kv.key_tiles, static_cast<size_t>(n),
                        rows + start, stride);
    } else {
      DotGroup(codec, q, group, hd, k, static_cast<size_t>(n), rows + start, stride, kv.key_tiles);
    }
    for (int i = 0; i < group; ++i) {
      const float block_max = ScaleRowMax(rows + static_cast<size_t>(i) * stride + start, n, scale);
      float& m = st->m[static_cast<size_t>(h0 + i)];
      if (track_max) m = std::max(m, block_max);
    }
  }
}

// The softmax of query heads [h0, h1): scores -> weights over the st->n_keys keys. With
// known_max, st->m holds each row's max already (ScoreBlocks' track_max).
inline void SoftmaxHeads(const AttentionParams& p, AttentionState* st, int h0, int h1, bool known_max = false) {
  const size_t stride = st->probs.size() / static_cast<size_t>(p.n_heads);
  for (int h = h0; h < h1; ++h) {
    float* row = st->probs.data() + static_cast<size_t>(h) * stride;
    float* m = &st->m[static_cast<size_t>(h)];
    *m = SoftmaxRow(row, st->n_keys, p.round_weights_f16, known_max ? m : nullptr);
    st->l[static_cast<size_t>(h)] = 1.0;  // the weights are normalised already
  }
}

// Pass 2 of KV heads [g, g + runs) over every block of the batch, in order. A block's V
// runs of consecutive KV heads are run_bytes apart, so a RunsValueCodec takes them in one
// call (more independent sums in flight); the bits are those of one KV head at a time.
template <AttentionCodec Codec>
void ValueBlocks(const Codec& codec, const AttentionParams& p, const PagedKvView& kv, AttentionState* st, int g,
                 int runs = 1) {
  const size_t stride = st->probs.size() / static_cast<size_t>(p.n_heads);
  const size_t hd = static_cast<size_t>(p.head_dim);
  const int group = p.n_heads / p.n_kv_heads;
  const size_t vb = kv.vector_bytes;
  const size_t run_bytes = static_cast<size_t>(kv.block_tokens) * vb;
  const size_t half = static_cast<size_t>(kv.n_kv_heads) * run_bytes;
  const size_t h0 = static_cast<size_t>(g) * static_cast<size_t>(group);
  const float* rows = st->probs.data() + h0 * stride;
  float* acc = st->acc.data() + h0 * hd;
  const size_t head_run = static_cast<size_t>(g) * run_bytes;
  for (int b = 0; b < kv.n_blocks; ++b) {
    int64_t start;
    const int64_t n = BlockKeys(p, kv, b, &start);
    if (n <= 0) continue;
    const std::byte* v = kv.blocks[b] + half + head_run;
    if (b + 1 < kv.n_blocks) {
      const std::byte* next = kv.blocks[b + 1] + half + head_run;
      for (int r = 0; r < runs; ++r) PrefetchLines(next + r * run_bytes, kRunPrefetchBytes);
    }
    if (p.sums != AttentionSums::kOwn) {
      const int residues = AttentionResidues(p.sums);
      const size_t part_stride = static_cast<size_t>(residues) * hd;
      for (int r = 0; r < runs; ++r) {
        const size_t hr = static_cast<size_t>(r) * static_cast<size_t>(group);
        AccumulateResiduesF16(rows + hr * stride, stride, group, hd,
                              reinterpret_cast<const uint16_t*>(v + r * run_bytes), static_cast<size_t>(n), start,
                              residues, st->part.data() + (h0 + hr) * part_stride, part_stride);
      }
      continue;
    }
    if constexpr (RunsValueCodec<Codec>) {
      if (runs > 1) {
        codec.AccumulateManyGroupRuns(rows + start, stride, group, runs, v, run_bytes, static_cast<size_t>(n), acc);
        continue;
      }
    }
    for (int r = 0; r < runs; ++r) {
      const size_t hr = static_cast<size_t>(r) * static_cast<size_t>(group);
      AccumulateGroup(codec, rows + start + hr * stride, stride, group, hd, v + r * run_bytes,
                      static_cast<size_t>(n), acc + hr * hd);
    }
  }
}

// KV heads per pass-2 task: two when there are at least two per thread (an even count),
// so each task has twice the independent sums; else one.
inline int ValueRuns(const AttentionParams& p, int threads) {
  return p.n_kv_heads % 2 == 0 && p.n_kv_heads >= 2 * threads ? 2 : 1;
}

}  // namespace attention_internal

// Pass 1: the scaled scores of a batch of blocks (in sequence order, after those of
// earlier calls), kept in the state. REQUIRES: AttentionBegin; no AttentionBlocks.
template <AttentionCodec Codec>
void AttentionScores(const Codec& codec, const AttentionParams& p, const PagedKvView& kv, AttentionState* st,
                     ThreadPool* pool) {
  const int64_t end = attention_internal::GrowScoreRows(p, kv, st);
  const int64_t work = (end - st->n_keys) * p.n_heads * p.head_dim;
  // Tasks: (KV head, range of blocks). Scores do not depend on each other, so the split
  // (about 4 tasks per thread) cannot change a bit.
  const int threads = pool != nullptr ? pool->size() : 1;
  const int per_head_tasks = std::max(1, std::min(kv.n_blocks, (4 * threads + p.n_kv_heads - 1) / p.n_kv_heads));
  const int blocks_per_task = (kv.n_blocks + per_head_tasks - 1) / std::max(per_head_tasks, 1);
  const int ranges = blocks_per_task > 0 ? (kv.n_blocks + blocks_per_task - 1) / blocks_per_task : 0;
  attention_internal::ForTasks(static_cast<int64_t>(p.n_kv_heads) * ranges, work, pool, [&](int64_t task) {
    const int b0 = static_cast<int>(task % ranges) * blocks_per_task;
    attention_internal::ScoreBlocks(codec, p, kv, st, static_cast<int>(task / ranges), b0,
                                    std::min(kv.n_blocks, b0 + blocks_per_task));
  });
  st->n_keys = end;
}

// Between the passes: scores -> weights, per head: e_j = expf(s_j - max) in f32, their
// sum in double, p_j = e_j * (float)(1 / sum), rounded to f16 if round_weights_f16.
inline void AttentionSoftmax(const AttentionParams& p, AttentionState* st, ThreadPool* pool) {
  attention_internal::ForHeads(p, st->n_keys * p.n_heads * 8, pool, [&](int64_t h) {
    attention_internal::SoftmaxHeads(p, st, static_cast<int>(h), static_cast<int>(h) + 1);
  });
}

// Pass 2: acc += p_j * V_j over a batch of blocks (in sequence order).
template <AttentionCodec Codec>
void AttentionValues(const Codec& codec, const AttentionParams& p, const PagedKvView& kv, AttentionState* st,
                     ThreadPool* pool) {
  const int64_t work = static_cast<int64_t>(kv.n_blocks) * kv.block_tokens * p.n_heads * p.head_dim;
  // A task per KV head (or pair of them): each accumulator sums its tokens in order.
  const int runs = attention_internal::ValueRuns(p, pool != nullptr ? pool->size() : 1);
  attention_internal::ForTasks(p.n_kv_heads / runs, work, pool, [&](int64_t task) {
    attention_internal::ValueBlocks(codec, p, kv, st, static_cast<int>(task) * runs, runs);
  });
}

// The whole two-pass form over one batch that holds every block of the sequence (the
// usual case: the layer's KV fits the compute tier), with the arithmetic of
// AttentionScores + AttentionSoftmax + AttentionValues, bit for bit, in fewer fork-joins:
// a KV head's scores, softmax and values are one task, its rows still in that thread's
// cache and their max kept by the scores pass, when there are at least as many KV heads
// as threads (ref-qwen3moe's two on two threads included: splitting its pass 1 into
// block ranges leaves each thread the other's score rows to read;
// docs/decisions/2026-12-01-one-task-per-kv-head.md); with fewer KV heads than threads (a wide pool), the
// three calls, whose pass 1 splits into block ranges and softmax into query heads.
// REQUIRES: AttentionBegin; kv covers the sequence's first block onwards.
template <AttentionCodec Codec>
void AttentionTwoPass(const Codec& codec, const AttentionParams& p, const PagedKvView& kv, AttentionState* st,
                      ThreadPool* pool) {
  const int threads = pool != nullptr ? pool->size() : 1;
  const int group = p.n_heads / p.n_kv_heads;
  const int64_t work = static_cast<int64_t>(kv.n_blocks) * kv.block_tokens * p.n_heads * p.head_dim * 2;
  if (p.n_kv_heads >= threads) {
    const int64_t end = attention_internal::GrowScoreRows(p, kv, st);
    st->n_keys = end;  // the rows' length, for SoftmaxHeads; filled before they are read
    const int runs = attention_internal::ValueRuns(p, threads);
    attention_internal::ForTasks(p.n_kv_heads / runs, work, pool, [&](int64_t task) {
      const int g0 = static_cast<int>(task) * runs;
      for (int g = g0; g < g0 + runs; ++g) {
        attention_internal::ScoreBlocks(codec, p, kv, st, g, 0, kv.n_blocks, /*track_max=*/true);
        attention_internal::SoftmaxHeads(p, st, g * group, (g + 1) * group, /*known_max=*/true);
      }
      attention_internal::ValueBlocks(codec, p, kv, st, g0, runs);
    });
    return;
  }
  AttentionScores(codec, p, kv, st, pool);
  AttentionSoftmax(p, st, pool);
  AttentionValues(codec, p, kv, st, pool);
}

// ---- several queries: a prefill chunk --------------------------------------------------
//
// The queries of consecutive tokens (each with its own AttentionParams, query_pos their
// positions, and its own AttentionState) over the same blocks. Per query these make
// exactly the calls of the one-query functions above, block by block in sequence order,
// so each query's result is bit-identical to running it alone; what changes is the loop
// order: a block's K (or V) run is read by every query of the chunk while it is in
// cache, instead of once per query from memory. Tasks are (KV head, range of queries).

namespace attention_internal {

// The view of block b of kv alone.
inline PagedKvView OneBlock(const PagedKvView& kv, int b) {
  PagedKvView one = kv;
  one.blocks = kv.blocks + b;
  one.n_blocks = 1;
  one.first_block = kv.first_block + b;
  return one;
}

// One KV head's K or V run of one block, decoded once (DecodedRunCodec) for the queries of
// a task, and read by ScoreBlocks / ValueBlocks through the members they call; `run` is
// the only run it answers for.
template <typename Codec>
class DecodedRunReader {
 public:
  DecodedRunReader(const Codec& codec, const std::byte* run, size_t n, bool keys, std::vector<std::byte>* buf)
      : codec_(codec), run_(run), n_(n) {
    buf->resize(codec.DecodedRunBytes(n, keys));
    codec.DecodeRun(run, n, keys, buf->data());
    data_ = buf->data();
  }
  int head_dim() const { return codec_.head_dim(); }
  size_t vector_bytes() const { return codec_.vector_bytes(); }
  void PrepareQuery(const float* q, float* q_prep) const { codec_.PrepareQuery(q, q_prep); }
  void FinishOutput(const float* acc, float* out) const { codec_.FinishOutput(acc, out); }
  void DotMany(const float* q, const void* enc, size_t n, float* scores) const { DotManyGroup(q, 1, enc, n, scores, n); }
  void AccumulateMany(const float* w, const void* enc, size_t n, float* acc) const {
    AccumulateManyGroup(w, n, 1, enc, n, acc);
  }
  void DotManyGroup(const float* q, int heads, const void* enc, size_t n, float* scores, size_t stride) const {
    assert(enc == run_ && n <= n_);
    codec_.DotManyGroupDecoded(q, heads, data_, n_, n, scores, stride);
  }
  void AccumulateManyGroup(const float* w, size_t w_stride, int heads, const void* enc, size_t n, float* acc) const {
    assert(enc == run_ && n <= n_);
    codec_.AccumulateManyGroupDecoded(w, w_stride, heads, data_, n_, n, acc);
  }

 private:
  const Codec& codec_;
  const std::byte* run_;
  size_t n_;
  const std::byte* data_ = nullptr;
};

// fn(c) with c = the codec, or, for a DecodedRunCodec read by several queries, a
// DecodedRunReader of KV head g's K (keys) or V run of block b of the one-block view
// `one` decoded up to the most keys any of queries [t0, t1) sees in it.
template <AttentionCodec Codec, typename F>
void WithBlockRun(const Codec& codec, const AttentionParams* ps, const PagedKvView& one, int g, int64_t t0,
                  int64_t t1, bool keys, F&& fn) {
  if constexpr (DecodedRunCodec<Codec>) {
    int64_t most = 0;  // stays 0 for a single query: it reads the run once anyway
    if (t1 - t0 > 1) {
      for (int64_t t = t0; t < t1; ++t) {
        int64_t start;
        most = std::max(most, BlockKeys(ps[t], one, 0, &start));
      }
    }
    if (most > 0 && codec.DecodedRunBytes(static_cast<size_t>(most), keys) > 0) {
      thread_local std::vector<std::byte> buffers[2];  // K and V: a task decodes one at a time
      const size_t run_bytes = static_cast<size_t>(one.block_tokens) * one.vector_bytes;
      const std::byte* run = one.blocks[0] + (keys ? 0 : static_cast<size_t>(one.n_kv_heads) * run_bytes) +
                             static_cast<size_t>(g) * run_bytes;
      const DecodedRunReader<Codec> reader(codec, run, static_cast<size_t>(most), keys, &buffers[keys ? 0 : 1]);
      return fn(reader);
    }
  }
  fn(codec);
}

// Runs fn(g, t0, t1) for every KV head g and a split of the n queries into ranges:
// enough tasks for the pool's threads, one range per KV head when there are at least as
// many KV heads as threads.
template <typename F>
void ForQueryTasks(const AttentionParams& p, int64_t n, int64_t work, ThreadPool* pool, F&& fn) {
  const int threads = pool != nullptr ? pool->size() : 1;
  const int64_t per_head = (threads + p.n_kv_heads - 1) / p.n_kv_heads;
  const int64_t ranges = std::clamp<int64_t>(per_head, 1, std::max<int64_t>(n, 1));
  const int64_t per = (n + ranges - 1) / ranges;
  ForTasks(static_cast<int64_t>(p.n_kv_heads) * ranges, work, pool, [&](int64_t task) {
    const int64_t t0 = (task % ranges) * per;
    fn(static_cast<int>(task / ranges), t0, std::min(n, t0 + per));
  });
}

// Multiply-adds of n queries over the view's blocks, per_key of them per key and head
// dimension (for the fork-join threshold).
inline int64_t MultiWork(const AttentionParams* ps, int64_t n, const PagedKvView& kv, int64_t per_key) {
  return n * static_cast<int64_t>(kv.n_blocks) * kv.block_tokens * ps[0].n_heads * ps[0].head_dim * per_key;
}

}  // namespace attention_internal

// AttentionBlocks for queries [0, n): ps[t] and sts[t] (AttentionBegin'd) per query.
template <AttentionCodec Codec>
void AttentionBlocksMulti(const Codec& codec, const AttentionParams* ps, AttentionState* const* sts, int64_t n,
                          const PagedKvView& kv, ThreadPool* pool) {
  if (n <= 0) return;
  const AttentionParams& p0 = ps[0];
  assert(p0.sums == AttentionSums::kOwn && "llama.cpp's sums are the two-pass form's");
  const size_t per_head = 2 * static_cast<size_t>(kv.block_tokens);
  for (int64_t t = 0; t < n; ++t) {
    if (sts[t]->scratch.size() < per_head * static_cast<size_t>(p0.n_heads)) {
      sts[t]->scratch.resize(per_head * static_cast<size_t>(p0.n_heads));
    }
  }
  const int group = p0.n_heads / p0.n_kv_heads;
  const size_t vb = kv.vector_bytes;
  const size_t half = static_cast<size_t>(kv.n_kv_heads) * static_cast<size_t>(kv.block_tokens) * vb;
  attention_internal::ForQueryTasks(
      p0, n, attention_internal::MultiWork(ps, n, kv, 2), pool, [&](int g, int64_t t0, int64_t t1) {
        const int h0 = g * group;
        const size_t head_run = static_cast<size_t>(g) * static_cast<size_t>(kv.block_tokens) * vb;
        for (int b = 0; b < kv.n_blocks; ++b) {
          const std::byte* k = kv.blocks[b] + head_run;
          if (b + 1 < kv.n_blocks) {
            PrefetchLines(kv.blocks[b + 1] + head_run, attention_internal::kRunPrefetchBytes);
            PrefetchLines(kv.blocks[b + 1] + half + head_run, attention_internal::kRunPrefetchBytes);
          }
          for (int64_t t = t0; t < t1; ++t) {
            int64_t start;
            const int64_t keys = attention_internal::BlockKeys(ps[t], kv, b, &start);
            if (keys <= 0) continue;
            attention_internal::GroupBlock(codec, ps[t], sts[t], h0, group, k, k + half, keys,
                                           sts[t]->scratch.data() + per_head * static_cast<size_t>(h0), per_head,
                                           static_cast<size_t>(kv.block_tokens), kv.key_tiles);
          }
        }
      });
}

// AttentionScores for queries [0, n).
template <AttentionCodec Codec>
void AttentionScoresMulti(const Codec& codec, const AttentionParams* ps, AttentionState* const* sts, int64_t n,
                          const PagedKvView& kv, ThreadPool* pool) {
  if (n <= 0) return;
  std::vector<int64_t> ends(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) ends[static_cast<size_t>(t)] = attention_internal::GrowScoreRows(ps[t], kv, sts[t]);
  attention_internal::ForQueryTasks(ps[0], n, attention_internal::MultiWork(ps, n, kv, 1), pool,
                                    [&](int g, int64_t t0, int64_t t1) {
                                      for (int b = 0; b < kv.n_blocks; ++b) {
                                        const PagedKvView one = attention_internal::OneBlock(kv, b);
                                        attention_internal::WithBlockRun(
                                            codec, ps, one, g, t0, t1, true, [&](const auto& c) {
                                              for (int64_t t = t0; t < t1; ++t) {
                                                attention_internal::ScoreBlocks(c, ps[t], one, sts[t], g, 0, 1);
                                              }
                                            });
                                      }
                                    });
  for (int64_t t = 0; t < n; ++t) sts[t]->n_keys = ends[static_cast<size_t>(t)];
}

// AttentionSoftmax for queries [0, n).
inline void AttentionSoftmaxMulti(const AttentionParams* ps, AttentionState* const* sts, int64_t n,
                                  ThreadPool* pool) {
  if (n <= 0) return;
  const int heads = ps[0].n_heads;
  attention_internal::ForTasks(n * heads, sts[n - 1]->n_keys * n * heads * 8, pool, [&](int64_t task) {
    const int64_t t = task / heads;
    const int h = static_cast<int>(task % heads);
    attention_internal::SoftmaxHeads(ps[t], sts[t], h, h + 1);
  });
}

// AttentionValues for queries [0, n).
template <AttentionCodec Codec>
void AttentionValuesMulti(const Codec& codec, const AttentionParams* ps, AttentionState* const* sts, int64_t n,
                          const PagedKvView& kv, ThreadPool* pool) {
  if (n <= 0) return;
  attention_internal::ForQueryTasks(ps[0], n, attention_internal::MultiWork(ps, n, kv, 1), pool,
                                    [&](int g, int64_t t0, int64_t t1) {
                                      for (int b = 0; b < kv.n_blocks; ++b) {
                                        const PagedKvView one = attention_internal::OneBlock(kv, b);
                                        attention_internal::WithBlockRun(
                                            codec, ps, one, g, t0, t1, false, [&](const auto& c) {
                                              for (int64_t t = t0; t < t1; ++t) {
                                                attention_internal::ValueBlocks(c, ps[t], one, sts[t], g);
                                              }
                                            });
                                      }
                                    });
}

// AttentionTwoPass for queries [0, n): a task's KV head and queries go through pass 1,
// the softmax and pass 2 together.
template <AttentionCodec Codec>
void AttentionTwoPassMulti(const Codec& codec, const AttentionParams* ps, AttentionState* const* sts, int64_t n,
                           const PagedKvView& kv, ThreadPool* pool) {
  if (n <= 0) return;
  for (int64_t t = 0; t < n; ++t) {
    sts[t]->n_keys = attention_internal::GrowScoreRows(ps[t], kv, sts[t]);  // filled before they are read
  }
  const int group = ps[0].n_heads / ps[0].n_kv_heads;
  attention_internal::ForQueryTasks(
      ps[0], n, attention_internal::MultiWork(ps, n, kv, 2), pool, [&](int g, int64_t t0, int64_t t1) {
        for (int b = 0; b < kv.n_blocks; ++b) {
          const PagedKvView one = attention_internal::OneBlock(kv, b);
          attention_internal::WithBlockRun(codec, ps, one, g, t0, t1, true, [&](const auto& c) {
            for (int64_t t = t0; t < t1; ++t) {
              attention_internal::ScoreBlocks(c, ps[t], one, sts[t], g, 0, 1, /*track_max=*/true);
            }
          });
        }
        for (int64_t t = t0; t < t1; ++t) {
          attention_internal::SoftmaxHeads(ps[t], sts[t], g * group, (g + 1) * group, /*known_max=*/true);
        }
        for (int b = 0; b < kv.n_blocks; ++b) {
          const PagedKvView one = attention_internal::OneBlock(kv, b);
          attention_internal::WithBlockRun(codec, ps, one, g, t0, t1, false, [&](const auto& c) {
            for (int64_t t = t0; t < t1; ++t) attention_internal::ValueBlocks(c, ps[t], one, sts[t], g);
          });
        }
      });
}

// out[n_heads * head_dim]: the attention output of every head (either form). A head
// that saw no token (impossible for a causal query over its own token) gives zeros.
template <AttentionCodec Codec>
void AttentionEnd(const Codec& codec, const AttentionParams& p, AttentionState* st, float* out) {
  const size_t hd = static_cast<size_t>(p.head_dim);
  for (int h = 0; h < p.n_heads && p.sums != AttentionSums::kOwn; ++h) {
    const size_t part_stride = static_cast<size_t>(AttentionResidues(p.sums)) * hd;
    ReduceResidues(st->part.data() + static_cast<size_t>(h) * part_stride, hd, AttentionResidues(p.sums), st->n_keys,
                   st->acc.data() + static_cast<size_t>(h) * hd);
  }
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
