// runtime/sampler.cc
#include "runtime/sampler.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cpu_features.h"

namespace tierkv {

namespace {

// The first index in x[0, n) of the largest value that is not NaN (the first -inf when
// nothing is larger), or -1 when all are NaN or n == 0: the maximum, then the first value
// equal to it: two vectorisable passes over the (cache-resident) logits rather than one
// compare-and-branch chain (docs/decisions/2026-12-07-greedy-without-copying.md).
int64_t FirstMaxGeneric(const float* x, int64_t n) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] == m) return i;
  }
  return -1;
}

#if defined(__x86_64__)
// GCC 12's AVX-512 intrinsics fill "don't care" lanes with _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports (as in kernels/quant_avx512.cc).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
__attribute__((target("avx512f"))) int64_t FirstMaxAvx512(const float* x, int64_t n) {
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  __m512 m = neg_inf;
  int64_t i = 0;
  // _mm512_max_ps(a, b) returns b where a is NaN: NaN never becomes the maximum.
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(_mm512_loadu_ps(x + i), m);
  const __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1);
  m = _mm512_max_ps(_mm512_mask_loadu_ps(neg_inf, tail, x + i), m);
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(m));
  for (i = 0; i + 16 <= n; i += 16) {
    if (const __mmask16 k = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), top, _CMP_EQ_OQ)) {
      return i + __builtin_ctz(k);
    }
  }
  if (const __mmask16 k = _mm512_mask_cmp_ps_mask(tail, _mm512_maskz_loadu_ps(tail, x + i), top, _CMP_EQ_OQ)) {
    return i + __builtin_ctz(k);
  }
  return -1;
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

int64_t FirstMaxIndex(const float* x, int64_t begin, int64_t end) {
  if (end <= begin) return -1;
#if defined(__x86_64__)
  const bool avx512 = kernels::ActiveSimdLevel() >= kernels::SimdLevel::kAvx512;  // TIERKV_SIMD caps it
  const int64_t k = avx512 ? FirstMaxAvx512(x + begin, end - begin) : FirstMaxGeneric(x + begin, end - begin);
#else
  const int64_t k = FirstMaxGeneric(x + begin, end - begin);
#endif
  return k < 0 ? -1 : begin + k;
}

// Greedy: the id with the largest value, ties to the smaller id, where the ids in
// `overrides` (sorted, unique, in range) take the paired value instead of their logit.
// The same result as keeping id 0 and scanning the rest on strict > (so a NaN at id 0
// stays, as llama.cpp's greedy sampler keeps its first candidate).
int32_t GreedyPick(std::span<const float> logits, std::span<const std::pair<int32_t, float>> overrides) {
  const int64_t n = static_cast<int64_t>(logits.size());
  int64_t best = 0;
  float best_value = !overrides.empty() && overrides[0].first == 0 ? overrides[0].second : logits[0];
  const auto consider = [&](int64_t id, float v) {
    if (v > best_value) {
      best = id;
      best_value = v;
    }
  };
  const auto scan = [&](int64_t begin, int64_t end) {
    const int64_t k = FirstMaxIndex(logits.data(), begin, end);
    if (k >= 0) consider(k, logits[static_cast<size_t>(k)]);
  };
  int64_t next = 1;  // ids below it are considered
  for (const auto& [id, value] : overrides) {
    if (id < next) continue;  // id 0: the start
    scan(next, id);
    consider(id, value);
    next = static_cast<int64_t>(id) + 1;
  }
  scan(next, n);
  return static_cast<int32_t>(best);
}

}  // namespace

int32_t Argmax(std::span<const float> logits) {
  if (logits.empty()) return 0;
  return GreedyPick(logits, {});
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

// llama.cpp's penalties on one logit: divide a positive logit by the repeat penalty,
// multiply a negative one, then subtract the frequency and presence terms.
float Sampler::Penalized(float l, int count) const {
  l = l <= 0.0f ? l * options_.repeat_penalty : l / options_.repeat_penalty;
  return l - (static_cast<float>(count) * options_.frequency_penalty + options_.presence_penalty);
}

int32_t Sampler::Sample(std::span<const float> logits) {
  if (logits.empty()) return 0;
  const bool penalize = options_.penalizes() && !counts_.empty();
  if (options_.temperature <= 0.0f) {
    // Greedy without copying the vocabulary: only the banned and penalized ids differ
    // from their logits.
    overrides_.clear();
    for (const int32_t id : options_.banned_tokens) {
      if (id >= 0 && static_cast<size_t>(id) < logits.size()) overrides_.push_back({id, -INFINITY});
    }
    if (penalize) {
      for (const auto& [id, count] : counts_) {
        if (id >= 0 && static_cast<size_t>(id) < logits.size()) {
          overrides_.push_back({id, Penalized(logits[static_cast<size_t>(id)], count)});
        }
      }
    }
    // By id; a banned id (pushed first, the stable sort keeps it first) wins over its penalty.
    std::stable_sort(overrides_.begin(), overrides_.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    overrides_.erase(std::unique(overrides_.begin(), overrides_.end(),
                                 [](const auto& a, const auto& b) { return a.first == b.first; }),
                     overrides_.end());
    return GreedyPick(logits, overrides_);
  }
  candidates_.clear();
  for (size_t i = 0; i < logits.size(); ++i) candidates_.push_back({logits[i], static_cast<int32_t>(i)});
  for (const int32_t id : options_.banned_tokens) {
    if (id >= 0 && static_cast<size_t>(id) < candidates_.size()) candidates_[static_cast<size_t>(id)].first = -INFINITY;
  }
  if (penalize) {
    for (const auto& [id, count] : counts_) {
      if (id < 0 || static_cast<size_t>(id) >= candidates_.size()) continue;
      float& l = candidates_[static_cast<size_t>(id)].first;
      l = Penalized(l, count);
    }
  }
  auto better = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };

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
