// kernels/moe.h
//
// Mixture-of-experts routing as llama.cpp does it for qwen3moe-style models: softmax
// over all router logits, the k largest probabilities (descending; ties to the smaller
// expert id), optionally renormalised to sum to 1 (norm_topk_prob), and the weighted sum
// of the selected experts' outputs in that order.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

namespace tierkv::kernels {

// logits: [n_expert] (unchanged); ids, weights: [k]. REQUIRES: 1 <= k <= n_expert.
void RouteTopK(const float* logits, int n_expert, int k, bool normalize, int* ids, float* weights);

// The smallest gap between the k-th and (k+1)-th largest logits (for diagnostics of
// near-ties; +inf when k == n_expert).
float RouterGap(const float* logits, int n_expert, int k);

}  // namespace tierkv::kernels
