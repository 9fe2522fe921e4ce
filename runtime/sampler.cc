// runtime/sampler.cc
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

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

Status SamplerOptions::Validate() const {
  // As permissive as llama.cpp where a value still means something: a temperature <= 0
  // is greedy, top-p >= 1 and min-p <= 0 cut nothing, top-p <= 0 and min-p >= 1 keep
  // the most likely token only.
  auto bad = [](const std::string& m) { return Status::InvalidArgument(m); };
  if (!std::isfinite(temperature)) return bad("--temp must be a number");
  if (!std::isfinite(top_p)) return bad("--top-p must be a number");
  if (!std::isfinite(min_p)) return bad("--min-p must be a number");
  if (!(repeat_penalty > 0.0f) || !std::isfinite(repeat_penalty)) return bad("--repeat-penalty must be positive");
  if (repeat_last_n < -1) return bad("--repeat-last-n must be -1 (all), 0 (off) or positive");
  if (!std::isfinite(frequency_penalty) || !std::isfinite(presence_penalty)) {
    return bad("--frequency-penalty and --presence-penalty must be finite");
  }
  return Status::Ok();
}

void Sampler::Accept(int32_t token) {
  if (options_.repeat_last_n == 0) return;
  history_.push_back(token);
  ++counts_[token];
  if (options_.repeat_last_n > 0 && history_.size() > static_cast<size_t>(options_.repeat_last_n)) {
    const int32_t old = history_.front();
    history_.pop_front();
    if (--counts_[old] == 0) counts_.erase(old);
  }
}

int32_t Sampler::Sample(std::span<const float> logits) {
  if (logits.empty()) return 0;
  const bool penalize = options_.penalizes() && !counts_.empty();
  if (!penalize && options_.banned_tokens.empty() && options_.temperature <= 0.0f) return Argmax(logits);
  candidates_.clear();
  for (size_t i = 0; i < logits.size(); ++i) candidates_.push_back({logits[i], static_cast<int32_t>(i)});
  for (const int32_t id : options_.banned_tokens) {
    if (id >= 0 && static_cast<size_t>(id) < candidates_.size()) candidates_[static_cast<size_t>(id)].first = -INFINITY;
  }
  if (penalize) {
    // llama.cpp's penalties: divide a positive logit by the repeat penalty, multiply a
    // negative one, then subtract the frequency and presence terms.
    for (const auto& [id, count] : counts_) {
      if (id < 0 || static_cast<size_t>(id) >= candidates_.size()) continue;
      float& l = candidates_[static_cast<size_t>(id)].first;
      l = l <= 0.0f ? l * options_.repeat_penalty : l / options_.repeat_penalty;
      l -= static_cast<float>(count) * options_.frequency_penalty + options_.presence_penalty;
    }
  }
  auto better = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  if (options_.temperature <= 0.0f) return std::min_element(candidates_.begin(), candidates_.end(), better)->second;

  size_t n = candidates_.size();
  if (options_.top_k > 0 && static_cast<size_t>(options_.top_k) < n) {
    n = static_cast<size_t>(options_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<long>(n), candidates_.end(), better);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), better);
  }
  // Tokens that cannot be drawn (-inf: banned, or penalized down to it) leave first.
  while (n > 1 && !(candidates_[n - 1].first > -INFINITY)) --n;
  const double top = candidates_[0].first;
  if (!std::isfinite(top)) return candidates_[0].second;  // nothing finite to weigh
  // top-p and min-p on the distribution at temperature 1 (sorted descending).
  if (options_.top_p < 1.0f) {
    probs_.resize(n);
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += probs_[i] = std::exp(candidates_[i].first - top);
    double acc = 0;
    for (size_t i = 0; i < n; ++i) {
      acc += probs_[i] / sum;
      if (acc >= options_.top_p) {
        n = i + 1;
        break;
      }
    }
  }
  if (options_.min_p > 0.0f) {
    // p_i >= min_p * p_max  <=>  l_i >= l_max + log(min_p).
    const double floor = top + std::log(static_cast<double>(options_.min_p));
    size_t keep = 1;
    while (keep < n && candidates_[keep].first >= floor) ++keep;
    n = keep;
  }
  // The draw, at the temperature.
  probs_.resize(n);
  double kept = 0;
  for (size_t i = 0; i < n; ++i) kept += probs_[i] = std::exp((candidates_[i].first - top) / options_.temperature);
  std::uniform_real_distribution<double> u(0.0, kept);
  double r = u(rng_);
  size_t last = 0;  // the last token with a weight: where rounding leftovers of r land
  for (size_t i = 0; i < n; ++i) {
    if (probs_[i] <= 0) continue;
    last = i;
    r -= probs_[i];
    if (r <= 0) return candidates_[i].second;
  }
  return candidates_[last].second;
}

}  // namespace tierkv
