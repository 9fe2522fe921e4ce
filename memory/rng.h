// memory/rng.h
//
// SplitMix64 (Steele, Lea, Flood 2014): a small, fully specified, well-mixed generator.
// Workload generators, synthetic weights and test data use it instead of the standard
// library's engines and distributions, whose outputs differ between implementations:
// the same seed gives the same numbers on every platform.
//
// Thread-safety: one generator per thread.
#pragma once

#include <cmath>
#include <cstdint>

namespace tierkv {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1), 53 bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Uniform in [0, n) (multiply-shift). REQUIRES: n > 0.
  uint32_t Below(uint32_t n) { return static_cast<uint32_t>((Next() >> 32) * n >> 32); }
  // Standard normal (Box-Muller; the second value of each pair is kept for the next call).
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - Uniform();  // (0, 1]: log is finite
    const double u2 = Uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2.0 * M_PI * u2);
    has_spare_ = true;
    return r * std::cos(2.0 * M_PI * u2);
  }

 private:
  uint64_t state_;
  double spare_ = 0;
  bool has_spare_ = false;
};

}  // namespace tierkv
