// kernels/attention_types.h
//
// The plain structs of paged attention (kernels/attention.h): the view of a layer's KV
// blocks, a query's parameters and its running state. Free of SIMD and CUDA headers, so
// that the executor interface (kernels/executor.h) can name them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/attention_sums.h"

namespace tierkv::kernels {

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
  bool key_tiles = false;  // K runs are key tiles (REQUIRES: a TiledKeyCodec)
};

struct AttentionParams {
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float scale = 1.0f;
  int64_t query_pos = 0;           // keys at positions > query_pos are masked
  bool round_query_f16 = false;
  bool round_weights_f16 = false;
  // kOneToken / kBatch: the two-pass form sums as llama.cpp (REQUIRES the f16 codec and
  // round_query_f16 / round_weights_f16); kOwn: the codec's kernels.
  AttentionSums sums = AttentionSums::kOwn;
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
  std::vector<float> part;     // [n_heads][residues][head_dim]: value sums by residue (sums != kOwn)
};

}  // namespace tierkv::kernels
