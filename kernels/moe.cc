// kernels/moe.cc
#include "kernels/moe.h"

#include <algorithm>
#include <cassert>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/activation.h"

namespace tierkv::kernels {
namespace {

// Expert ids ordered by value, descending; equal values by id.
std::vector<int> Ranked(const float* v, int n) {
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return v[a] > v[b]; });
  return order;
}

}  // namespace

void RouteTopK(const float* logits, int n_expert, int k, bool normalize, int* ids, float* weights) {
  assert(k >= 1 && k <= n_expert);
  std::vector<float> probs(logits, logits + n_expert);
  SoftmaxInPlace(probs.data(), n_expert);
  const std::vector<int> order = Ranked(probs.data(), n_expert);
  float sum = 0.0f;
  for (int i = 0; i < k; ++i) {
    ids[i] = order[static_cast<size_t>(i)];
    weights[i] = probs[static_cast<size_t>(ids[i])];
    sum += weights[i];
  }
  if (normalize) {
    // llama.cpp clamps the sum away from zero (the smallest normal fp16) before dividing.
    sum = std::max(sum, 6.103515625e-5f);
    for (int i = 0; i < k; ++i) weights[i] /= sum;
  }
}

float RouterGap(const float* logits, int n_expert, int k) {
  if (k >= n_expert) return std::numeric_limits<float>::infinity();
  const std::vector<int> order = Ranked(logits, n_expert);
  return logits[order[static_cast<size_t>(k - 1)]] - logits[order[static_cast<size_t>(k)]];
}

}  // namespace tierkv::kernels
