// kernels/attention_sums.h
//
// The sums of f16 attention in the orders of llama.cpp's CPU backend (AVX-512 build, flash
// attention off, f16 KV cache), for kernels/attention.h's two-pass form. llama.cpp
// computes Q.K^T and P.V as matrix products with f16 operands (Q and the softmax weights
// rounded to f16), so they sum the way its F16 matrix products do (kernels/quant.h,
// TokenSums): a query of a one-token batch with ggml's vec_dot, the queries of a larger
// batch with tinyBLAS. The softmax in between is the same in both.
//
//   scores, one token: per key, 4 accumulators x 16 lanes over 64-dimension steps
//     (dimension x in lane x % 16 of accumulator (x % 64) / 16), (s0 + s2) + (s1 + s3),
//     reduced as _mm512_reduce_add_ps; the dimensions past the last whole step added
//     one at a time in double (head_dim 32: all of them).
//   scores, a batch: one 16-lane accumulator over 16-dimension steps, reduced: the bits
//     the f16 codec's own kernels already give (docs/kernels.md, "Key tiles"), so only
//     the one-token order is here.
//   values, one token: per output dimension, key j into residue j % 64 (lane j % 16 of
//     accumulator (j % 64) / 16), residues combined as the scores' lanes are. llama.cpp's
//     KV length is padded (to 256 cells) with cells of weight 0, which add nothing and
//     leave no tail.
//   values, a batch: key j into residue j % 16, the 16 residues reduced.
//
// Each residue's sum runs over its keys in sequence order, so the blocks may come in any
// number of batches and the bits stay the same. The residue sums live in the caller's
// state, [residues][head_dim] floats per query head; a residue's first key (j < residues)
// starts it, so the state needs no clearing, and residues no key reached count as 0.
//
// The products are exact in f32 (f16 x f16), so an FMA into a sum rounds as ggml's does.
// Each function is bit-identical at every SIMD level (tests/kernels/attention_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tierkv::kernels {

enum class AttentionSums : uint8_t {
  kOwn,       // the codec's kernels (the order tierkv chose; online or two-pass)
  kOneToken,  // llama.cpp's vec_dot order (a decode step)
  kBatch,     // llama.cpp's tinyBLAS order (a prefill chunk)
};

// Residues of the value sums: 64 one token, 16 a batch.
constexpr int AttentionResidues(AttentionSums sums) { return sums == AttentionSums::kOneToken ? 64 : 16; }

// Scores of n keys for `heads` query heads (q [heads][hd], f16 values), in the one-token
// order: scores[h * stride + t]. k: the keys as f16, either n vectors of hd values or,
// with tiled, tiles of 16 keys stored dimension by dimension ([hd][16], the last tile
// whole). Any hd (the AVX2 form takes up to 256, a larger one the portable form).
void OneTokenScoresF16(const float* q, int heads, size_t hd, const uint16_t* k, bool tiled, size_t n,
                       float* scores, size_t stride);

// part[h * part_stride + r * hd + d] += w[h * w_stride + j] * v[t][d] for keys j = first
// + t, t < n, r = j % residues (the sum started at the residue's first key). v: n vectors
// of hd f16 values. REQUIRES: residues 16 or 64.
void AccumulateResiduesF16(const float* w, size_t w_stride, int heads, size_t hd, const uint16_t* v, size_t n,
                           int64_t first, int residues, float* part, size_t part_stride);

// out[hd]: one head's residue sums combined (n_keys keys seen).
void ReduceResidues(const float* part, size_t hd, int residues, int64_t n_keys, float* out);

}  // namespace tierkv::kernels
