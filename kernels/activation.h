// kernels/activation.h
//
// Element-wise activations and softmax, computed as llama.cpp's CPU backend (its AVX-512
// build) does:
//   SiLU(x) = x / (1 + exp(-x));  SwiGLU(g, u) = SiLU(g) * u;
//   softmax: max subtracted, exponentials in f32, their sum in double, then each
//   exponential times (float)(1 / sum).
// A row is taken in 16-value chunks from its start: there exp is ExpGgml (kernels/expf.h)
// and, in the softmax, each chunk is summed in f32 by a fixed tree (8 + 8, 4 + 4, 2 + 2,
// 1 + 1 lanes) before the double sum; the last n % 16 values use the C library's expf
// and go into the double sum one by one. Vectorised where the CPU allows (same bits).
//
// Thread-safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/expf.h"

namespace tierkv::kernels {

// The f32 sum of one 16-value chunk by llama.cpp's fixed tree (_mm512_reduce_add_ps):
// t8[i] = l[i] + l[i + 8], t4[i] = t8[i] + t8[i + 4], then (t4[0] + t4[2]) + (t4[1] + t4[3]).
inline float ChunkSumGgml(const float* l) {
  float t8[8], t4[4];
  for (int i = 0; i < 8; ++i) t8[i] = l[i] + l[i + 8];
  for (int i = 0; i < 4; ++i) t4[i] = t8[i] + t8[i + 4];
  return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

// SiLU of a value in a row's last n % 16 (the C library's expf) and in its 16-value
// chunks (ExpGgml).
inline float Silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float SiluGgml(float x) { return x / (1.0f + ExpGgml(0.0f - x)); }

// out[i] = SiLU(gate[i]) * up[i] over one row; out may equal gate or up.
void SwiGlu(const float* gate, const float* up, float* out, int64_t n);

// In place; returns the log of the sum of exponentials (log-sum-exp of the input).
double SoftmaxInPlace(float* x, int64_t n);

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
