// runtime/expert_split.h
//
// Where the experts a device tier does not hold compute (hybrid experts, docs/gpu.md):
// copied to the device and computed there, or computed by the host CPU from host memory
// while the device computes the hits. A cost model over four rates, each in bytes of
// expert weights per second:
//
//   copy    host -> device copies (the copy engine: PCIe, or --device sim's throttle)
//   device  the device computing one token through an expert it holds
//   host    the host CPU computing one token through an expert in host memory
//   *_token each further token of a prefill chunk through the same expert (compute
//           bound where one token is bandwidth bound)
//
// Decode (one token, H hits on the device, M misses, each E bytes): with c misses on
// the host, the step's expert time is
//   T(c) = max(c E / host, (M - c) E / copy + (H + M - c) E / device)
// (the host's share runs while the device copies and computes the rest); HostMisses
// returns the c in [0, M] that minimises it. Prefill: an expert missing from the device
// that t tokens of a chunk use costs
//   host:   E / host + (t - 1) E / host_token
//   device: E / copy + E / device + (t - 1) E / device_token
// and is copied when the device's cost is lower (CopyForTokens).
//
// The rates start from priors (ExpertSplitRates) and follow measurements: Observe*
// fold each measured (bytes, seconds) into an exponential moving average, so the split
// follows the machine (a busy CPU, a slower link) step by step. A rate of 0 means
// "free" (an unthrottled --device sim copy engine): that path costs nothing.
//
// The split never changes results: an expert's products are the same bits on either
// side (docs/gpu.md, "Numerics"), and the rows are combined in router order.
#pragma once

#include <cstdint>

namespace tierkv {

struct ExpertSplitRates {
  double copy = 12e9;           // PCIe 4.0 x8, pinned
  double device = 250e9;        // an 8 GB card's memory bandwidth, at ~80%
  double host = 20e9;           // replaced by the first measurement
  double host_token = 4e9;      // likewise
  double device_token = 4e12;   // far above the host's: tensor throughput
};

class ExpertSplitModel {
 public:
  ExpertSplitModel() = default;
  explicit ExpertSplitModel(const ExpertSplitRates& priors) : r_(priors) {}

  const ExpertSplitRates& rates() const { return r_; }

  // Of `misses` experts of `bytes` each, how many the host computes (the others are
  // copied and computed on the device after its `hits`); the smallest minimiser of T(c).
  int HostMisses(int hits, int misses, uint64_t bytes) const;
  // The step time T(c) of HostMisses, in seconds.
  double DecodeSeconds(int hits, int misses, int on_host, uint64_t bytes) const;
  // Prefill: whether an expert missing from the device that `tokens` tokens use is
  // copied (true) or computed on the host (false).
  bool CopyForTokens(int tokens, uint64_t bytes) const;

  // Measurements: `bytes` of experts through which `tokens` tokens each went in
  // `seconds` (host or device compute), or `bytes` copied host -> device.
  void ObserveHost(uint64_t bytes, int tokens, double seconds);
  void ObserveDevice(uint64_t bytes, int tokens, double seconds);
  void ObserveCopy(uint64_t bytes, double seconds);

 private:
  // Folds a measured rate into *rate.
  static void Fold(double measured, double* rate);
  // The one-token rate and the further-token rate from one measurement.
  static void ObserveCompute(uint64_t bytes, int tokens, double seconds, double* rate, double* token_rate);

  ExpertSplitRates r_;
};

}  // namespace tierkv
