// kernels/activation.cc
#include "kernels/activation.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu_features.h"
#include "kernels/expf.h"

namespace tierkv::kernels {
namespace {

#if defined(TIERKV_EXPF_X86)
__attribute__((target("avx512f,avx512dq,avx2,fma"))) void SwiGluChunksAvx512(const float* gate, const float* up,
                                                                            float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 e = ExpGgml16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), _mm512_loadu_ps(up + i)));
  }
}

__attribute__((target("avx2,fma"))) void SwiGluChunksAvx2(const float* gate, const float* up, float* out,
                                                        int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t i = 0; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = ExpGgml8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
}
#endif

}  // namespace

void SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  const int64_t chunks = n / 16 * 16;
  int64_t i = 0;
#if defined(TIERKV_EXPF_X86)
  if (ActiveSimdLevel() >= SimdLevel::kAvx512) {
    SwiGluChunksAvx512(gate, up, out, chunks);
    i = chunks;
  } else if (ActiveSimdLevel() >= SimdLevel::kAvx2) {
    SwiGluChunksAvx2(gate, up, out, chunks);
    i = chunks;
  }
#endif
  for (; i < chunks; ++i) out[i] = SiluGgml(gate[i]) * up[i];
  for (; i < n; ++i) out[i] = Silu(gate[i]) * up[i];
}

double SoftmaxInPlace(float* x, int64_t n) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max = x[i] > max ? x[i] : max;
  double sum = 0.0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int64_t k = i; k < i + 16; ++k) x[k] = ExpGgml(x[k] - max);
    sum += static_cast<double>(ChunkSumGgml(x + i));
  }
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += static_cast<double>(x[i]);
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t k = 0; k < n; ++k) x[k] *= inv;
  return static_cast<double>(max) + std::log(sum);
}

}  // namespace tierkv::kernels
