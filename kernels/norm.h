// kernels/norm.h
//
// RMSNorm as llama.cpp computes it: the mean of squares is summed in double (each square
// formed in f32), scale = 1 / sqrtf(mean + eps) in f32, out = (x * scale) * w.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

namespace tierkv::kernels {

// out[n] = x / sqrt(mean(x^2) + eps) * w; w may be null (all ones). out may equal x.
void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out);

// The same over `rows` consecutive vectors of n values each (per-head Q/K norm); w is
// shared by all rows.
void RmsNormRows(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* out);

}  // namespace tierkv::kernels
