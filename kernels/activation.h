// kernels/activation.h
//
// Element-wise activations and softmax, computed as llama.cpp's CPU backend does:
//   SiLU(x) = x / (1 + exp(-x));  SwiGLU(g, u) = SiLU(g) * u;
//   softmax: max subtracted, exponentials in f32, their sum in double, then each
//   exponential times (float)(1 / sum).
//
// Thread-safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace tierkv::kernels {

inline float Silu(float x) { return x / (1.0f + std::exp(-x)); }

// out[i] = SiLU(gate[i]) * up[i]; out may equal gate or up.
inline void SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = Silu(gate[i]) * up[i];
}

// In place; returns the log of the sum of exponentials (log-sum-exp of the input).
inline double SoftmaxInPlace(float* x, int64_t n) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max = x[i] > max ? x[i] : max;
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float e = std::exp(x[i] - max);
    sum += static_cast<double>(e);
    x[i] = e;
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
  return static_cast<double>(max) + std::log(sum);
}

// log(sum(exp(x))) in double (no change to x).
inline double LogSumExp(const float* x, int64_t n) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max = x[i] > max ? x[i] : max;
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - max);
  return static_cast<double>(max) + std::log(sum);
}

// Index of the largest value; ties go to the smallest index. REQUIRES: n > 0.
inline int64_t ArgMax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

}  // namespace tierkv::kernels
