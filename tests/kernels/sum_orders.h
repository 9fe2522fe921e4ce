// tests/kernels/sum_orders.h
//
// The two orders in which llama.cpp's AVX-512 CPU backend sums a dot product of F32, F16
// or BF16 values (kernels/quant.h, TokenSums; docs/kernels.md), written out one value at
// a time from their description, for the kernels' tests to compare bits with. w and x
// are the exact values (the f16 / bf16 ones widened to f32).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/quant.h"

namespace tierkv::kernels::testing {

// _mm512_reduce_add_ps of 16 lanes: halves, quarters, then (0 + 2) + (1 + 3).
inline float Reduce16(const float* v) {
  float a[8], b[4];
  for (int l = 0; l < 8; ++l) a[l] = v[l] + v[l + 8];
  for (int l = 0; l < 4; ++l) b[l] = a[l] + a[l + 4];
  return (b[0] + b[2]) + (b[1] + b[3]);
}

// vdpbf16ps on one 32-value step starting at i: lane j adds the product of values 2j + 1
// and then that of values 2j, each rounded once.
inline void DpBf16Step(float* acc, const float* w, const float* x, int64_t i) {
  for (int j = 0; j < 16; ++j) {
    acc[j] = __builtin_fmaf(w[i + 2 * j + 1], x[i + 2 * j + 1], acc[j]);
    acc[j] = __builtin_fmaf(w[i + 2 * j], x[i + 2 * j], acc[j]);
  }
}

// ggml's vec_dot (one token).
inline float VecDotOrder(WeightType type, const std::vector<float>& w, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(w.size()), np = n / 64 * 64;
  if (type == WeightType::kBF16) {
    float c1[16] = {}, c2[16] = {};
    for (int64_t i = 0; i < np; i += 64) {
      DpBf16Step(c1, w.data(), x.data(), i);
      DpBf16Step(c2, w.data(), x.data(), i + 32);
    }
    double s = static_cast<double>(Reduce16(c1)) + static_cast<double>(Reduce16(c2));
    for (int64_t i = np; i < n; ++i) s += static_cast<double>(w[i] * x[i]);
    return static_cast<float>(s);
  }
  float acc[4][16] = {};
  for (int64_t i = 0; i < np; i += 64) {
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < 16; ++l) acc[j][l] = __builtin_fmaf(w[i + 16 * j + l], x[i + 16 * j + l], acc[j][l]);
    }
  }
  float v[16];
  for (int l = 0; l < 16; ++l) v[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
  float r = Reduce16(v);
  if (type == WeightType::kF32) {
    for (int64_t i = np; i < n; ++i) r = __builtin_fmaf(w[i], x[i], r);
    return r;
  }
  double s = r;
  for (int64_t i = np; i < n; ++i) s += static_cast<double>(w[i] * x[i]);
  return static_cast<float>(s);
}

// tinyBLAS (several tokens): one 16-lane accumulator over 16-value (F32, F16) or 32-value
// (BF16) steps. REQUIRES: n a multiple of the step.
inline float TinyBlasOrder(WeightType type, const std::vector<float>& w, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(w.size());
  float acc[16] = {};
  if (type == WeightType::kBF16) {
    for (int64_t i = 0; i < n; i += 32) DpBf16Step(acc, w.data(), x.data(), i);
  } else {
    for (int64_t i = 0; i < n; i += 16) {
      for (int l = 0; l < 16; ++l) acc[l] = __builtin_fmaf(w[i + l], x[i + l], acc[l]);
    }
  }
  return Reduce16(acc);
}

}  // namespace tierkv::kernels::testing
