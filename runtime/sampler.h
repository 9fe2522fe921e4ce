// runtime/sampler.h
//
// Picks the next token from a logits vector the way llama.cpp's default sampler chain
// does, so that its flags mean the same here:
//
//   penalties (repeat / frequency / presence over the last repeat_last_n tokens, the
//   prompt included) -> top-k -> top-p -> min-p -> temperature -> a seeded draw.
//
// top-p and min-p act on the distribution at temperature 1, before the temperature is
// applied (llama.cpp's order). Temperature 0 is greedy: the argmax of the penalized
// logits, ties to the smaller id (as llama.cpp's reference vectors do); with no penalty
// set it is exactly Argmax(logits). A run is reproducible with its seed (the draws are
// not llama.cpp's: its generator and ours differ).
//
// Thread-safety: a Sampler is used by one thread.
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "memory/status.h"

namespace tierkv {

struct SamplerOptions {
  float temperature = 0.0f;      // <= 0: greedy
  int top_k = 40;                // <= 0: no top-k cut
  float top_p = 0.95f;           // >= 1: no top-p cut; <= 0: the top token only
  float min_p = 0.05f;           // <= 0: no min-p cut; >= 1: the top token only
  float repeat_penalty = 1.0f;   // 1: off. A repeated token's logit l becomes l / r (l > 0) or l * r
  int repeat_last_n = 64;        // tokens the penalties look back over; 0: none, -1: all
  float frequency_penalty = 0.0f;  // minus count * f
  float presence_penalty = 0.0f;   // minus p when the token occurs at all
  uint64_t seed = 0;
  std::vector<int32_t> banned_tokens;  // never drawn (llama.cpp's --ignore-eos bans the end-of-generation tokens)

  // kInvalidArgument naming the first value out of range (non-finite values, a
  // repeat penalty <= 0, repeat_last_n < -1).
  Status Validate() const;
  bool penalizes() const {
    return repeat_last_n != 0 && (repeat_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f);
  }
};

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options) : options_(options), rng_(options.seed) {}

  // Records a token of the context (prompt or generated) for the penalties.
  void Accept(int32_t token);
  int32_t Sample(std::span<const float> logits);

 private:
  SamplerOptions options_;
  std::mt19937_64 rng_;
  std::deque<int32_t> history_;                 // the last repeat_last_n accepted tokens
  std::unordered_map<int32_t, int> counts_;     // occurrences in history_
  float Penalized(float logit, int count) const;

  std::vector<std::pair<float, int32_t>> candidates_;  // scratch
  std::vector<std::pair<int32_t, float>> overrides_;   // scratch (greedy): ids whose value is not their logit
  std::vector<double> probs_;                   // scratch
};

// argmax, ties to the smaller id.
int32_t Argmax(std::span<const float> logits);
// The n largest logits as (id, logit), by logit descending, ties by smaller id.
std::vector<std::pair<int32_t, float>> TopLogits(std::span<const float> logits, int n);
// log(sum(exp(logits))) computed in double.
double LogSumExp(std::span<const float> logits);

}  // namespace tierkv
