// runtime/sampler.h
//
// Picks the next token from a logits vector: greedy (temperature 0: argmax, ties to the
// smaller id, as llama.cpp's reference vectors do), or temperature + top-k + top-p
// sampling from a seeded generator, so a run is reproducible with --seed.
//
// Order for sampling: top-k (k <= 0: all), then softmax at temperature T, then top-p
// (the smallest set of most likely tokens whose probability reaches p), then a draw.
//
// Thread-safety: a Sampler is used by one thread.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace tierkv {

struct SamplerOptions {
  float temperature = 0.0f;  // 0 = greedy
  int top_k = 40;            // <= 0: no top-k cut
  float top_p = 0.95f;       // >= 1: no top-p cut
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options) : options_(options), rng_(options.seed) {}
  int32_t Sample(std::span<const float> logits);

 private:
  SamplerOptions options_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // scratch
};

// argmax, ties to the smaller id.
int32_t Argmax(std::span<const float> logits);
// The n largest logits as (id, logit), by logit descending, ties by smaller id.
std::vector<std::pair<int32_t, float>> TopLogits(std::span<const float> logits, int n);
// log(sum(exp(logits))) computed in double.
double LogSumExp(std::span<const float> logits);

}  // namespace tierkv
