// runtime/sampler.cc
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

namespace tierkv {

int32_t Argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  }
  return best;
}

std::vector<std::pair<int32_t, float>> TopLogits(std::span<const float> logits, int n) {
  std::vector<std::pair<int32_t, float>> all;
  all.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) all.push_back({static_cast<int32_t>(i), logits[i]});
  const size_t k = std::min(all.size(), static_cast<size_t>(std::max(n, 0)));
  auto better = [](const auto& a, const auto& b) { return a.second > b.second || (a.second == b.second && a.first < b.first); };
  std::partial_sort(all.begin(), all.begin() + static_cast<long>(k), all.end(), better);
  all.resize(k);
  return all;
}

double LogSumExp(std::span<const float> logits) {
  double m = -INFINITY;
  for (float v : logits) m = std::max(m, static_cast<double>(v));
  if (!std::isfinite(m)) return m;
  double s = 0;
  for (float v : logits) s += std::exp(static_cast<double>(v) - m);
  return m + std::log(s);
}

int32_t Sampler::Sample(std::span<const float> logits) {
  if (options_.temperature <= 0.0f) return Argmax(logits);
  candidates_.clear();
  for (size_t i = 0; i < logits.size(); ++i) candidates_.push_back({logits[i], static_cast<int32_t>(i)});
  auto better = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t n = candidates_.size();
  if (options_.top_k > 0 && static_cast<size_t>(options_.top_k) < n) {
    n = static_cast<size_t>(options_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<long>(n), candidates_.end(), better);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), better);
  }
  // Softmax at temperature over the kept candidates (sorted descending).
  std::vector<double> p(n);
  const double top = candidates_[0].first;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    p[i] = std::exp((candidates_[i].first - top) / options_.temperature);
    sum += p[i];
  }
  size_t keep = n;
  if (options_.top_p < 1.0f) {
    double acc = 0;
    for (size_t i = 0; i < n; ++i) {
      acc += p[i] / sum;
      if (acc >= options_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += p[i];
  std::uniform_real_distribution<double> u(0.0, kept);
  double r = u(rng_);
  for (size_t i = 0; i < keep; ++i) {
    r -= p[i];
    if (r <= 0) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;
}

}  // namespace tierkv
