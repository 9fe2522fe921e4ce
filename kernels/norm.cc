// kernels/norm.cc
#include "kernels/norm.h"

#include <cmath>

namespace tierkv::kernels {

void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  if (w == nullptr) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale;
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * scale) * w[i];
  }
}

void RmsNormRows(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* out) {
  for (int64_t r = 0; r < rows; ++r) RmsNorm(x + r * n, w, n, eps, out + r * n);
}

}  // namespace tierkv::kernels
