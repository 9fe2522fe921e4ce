// runtime/expert_split.cc
#include "runtime/expert_split.h"

#include <algorithm>

namespace tierkv {
namespace {

// Seconds for `bytes` at `rate` bytes/s; a rate of 0 is free.
double Sec(double bytes, double rate) { return rate > 0 ? bytes / rate : 0.0; }

// Weight of a new measurement in the moving averages: the rates settle within a few
// dozen observations (a decode step makes one per MoE layer).
constexpr double kAlpha = 0.25;

}  // namespace

double ExpertSplitModel::DecodeSeconds(int hits, int misses, int on_host, uint64_t bytes) const {
  const double e = static_cast<double>(bytes);
  const double host = Sec(on_host * e, r_.host);
  const double copied = misses - on_host;
  const double device = Sec(copied * e, r_.copy) + Sec((hits + copied) * e, r_.device);
  return std::max(host, device);
}

int ExpertSplitModel::HostMisses(int hits, int misses, uint64_t bytes) const {
  int best = 0;
  double best_s = DecodeSeconds(hits, misses, 0, bytes);
  for (int c = 1; c <= misses; ++c) {
    const double s = DecodeSeconds(hits, misses, c, bytes);
    if (s < best_s) best = c, best_s = s;
  }
  return best;
}

bool ExpertSplitModel::CopyForTokens(int tokens, uint64_t bytes) const {
  const double e = static_cast<double>(bytes), more = static_cast<double>(std::max(tokens, 1) - 1);
  const double host = Sec(e, r_.host) + Sec(more * e, r_.host_token);
  const double device = Sec(e, r_.copy) + Sec(e, r_.device) + Sec(more * e, r_.device_token);
  return device < host;
}

void ExpertSplitModel::Fold(double measured, double* rate) {
  if (!(measured > 0)) return;
  *rate = *rate > 0 ? (1 - kAlpha) * *rate + kAlpha * measured : measured;
}

void ExpertSplitModel::ObserveCompute(uint64_t bytes, int tokens, double seconds, double* rate, double* token_rate) {
  if (bytes == 0 || tokens < 1 || !(seconds > 0)) return;
  const double e = static_cast<double>(bytes);
  if (tokens == 1) {
    Fold(e / seconds, rate);
    return;
  }
  // The first token at the one-token rate; what is left of the time went to the others.
  const double rest = seconds - Sec(e, *rate);
  if (rest > 0) Fold(static_cast<double>(tokens - 1) * e / rest, token_rate);
}

void ExpertSplitModel::ObserveHost(uint64_t bytes, int tokens, double seconds) {
  ObserveCompute(bytes, tokens, seconds, &r_.host, &r_.host_token);
}

void ExpertSplitModel::ObserveDevice(uint64_t bytes, int tokens, double seconds) {
  ObserveCompute(bytes, tokens, seconds, &r_.device, &r_.device_token);
}

void ExpertSplitModel::ObserveCopy(uint64_t bytes, double seconds) {
  if (bytes > 0 && seconds > 0) Fold(static_cast<double>(bytes) / seconds, &r_.copy);
}

}  // namespace tierkv
