// kernels/cpu_features.cc
#include "kernels/cpu_features.h"

#include <algorithm>
#include <atomic>

#include "kernels/fp16.h"
#include "memory/simd_env.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TIERKV_KERNELS_X86 1
#endif

namespace tierkv::kernels {
namespace {

CpuFeatures DetectFeatures() {
  CpuFeatures f;
#if defined(TIERKV_KERNELS_X86)
  // libgcc's checks include the OS's support for the AVX and AVX-512 register state.
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.f16c = __builtin_cpu_supports("f16c");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx512vnni = __builtin_cpu_supports("avx512vnni");
  f.avx_vnni = __builtin_cpu_supports("avxvnni");
  f.avx512vbmi = __builtin_cpu_supports("avx512vbmi");
#endif
  return f;
}

SimdLevel DetectCpu() {
  const CpuFeatures& f = CpuHas();
  if (!(f.avx2 && f.fma && f.f16c)) return SimdLevel::kScalar;
  const bool avx512 = f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
  return avx512 ? SimdLevel::kAvx512 : SimdLevel::kAvx2;
}

SimdLevel Detect() { return std::min(DetectCpu(), static_cast<SimdLevel>(SimdCapFromEnv().level)); }

std::atomic<int> g_forced{static_cast<int>(SimdLevel::kAvx512)};
std::atomic<bool> g_avx_vnni_allowed{true};

bool DetectAvxVnni() { return SimdCapFromEnv().avx_vnni && CpuHas().avx_vnni; }

}  // namespace

const CpuFeatures& CpuHas() {
  static const CpuFeatures features = DetectFeatures();
  return features;
}

SimdLevel DetectedSimdLevel() {
  static const SimdLevel level = Detect();
  return level;
}

SimdLevel ActiveSimdLevel() {
  return static_cast<SimdLevel>(
      std::min(static_cast<int>(DetectedSimdLevel()), g_forced.load(std::memory_order_relaxed)));
}

void ForceSimdLevel(SimdLevel level) { g_forced.store(static_cast<int>(level), std::memory_order_relaxed); }

bool AvxVnniActive() {
  static const bool detected = DetectAvxVnni();
  return detected && ActiveSimdLevel() >= SimdLevel::kAvx2 && g_avx_vnni_allowed.load(std::memory_order_relaxed);
}

void AllowAvxVnni(bool allow) { g_avx_vnni_allowed.store(allow, std::memory_order_relaxed); }

const char* SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar: return "scalar";
    case SimdLevel::kAvx2: return "avx2";
    case SimdLevel::kAvx512: return "avx512";
  }
  return "unknown";
}

// ---- fp16 / bf16 arrays ---------------------------------------------------------------

#if defined(TIERKV_KERNELS_X86)
namespace {
__attribute__((target("avx2,fma,f16c"))) void F16ToF32F16c(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  }
  for (; i < n; ++i) out[i] = F16ToF32(in[i]);
}
__attribute__((target("avx2,fma,f16c"))) void F32ToF16F16c(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) out[i] = F32ToF16(in[i]);
}
__attribute__((target("avx2,fma,f16c"))) void RoundToF16F16c(float* x, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_ps(x + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) x[i] = RoundToF16(x[i]);
}
}  // namespace
#endif

void RoundToF16Array(float* x, size_t n) {
#if defined(TIERKV_KERNELS_X86)
  if (ActiveSimdLevel() >= SimdLevel::kAvx2) return RoundToF16F16c(x, n);
#endif
  for (size_t i = 0; i < n; ++i) x[i] = RoundToF16(x[i]);
}

void F16ToF32Array(const uint16_t* in, float* out, size_t n) {
#if defined(TIERKV_KERNELS_X86)
  if (ActiveSimdLevel() >= SimdLevel::kAvx2) return F16ToF32F16c(in, out, n);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = F16ToF32(in[i]);
}

void F32ToF16Array(const float* in, uint16_t* out, size_t n) {
#if defined(TIERKV_KERNELS_X86)
  if (ActiveSimdLevel() >= SimdLevel::kAvx2) return F32ToF16F16c(in, out, n);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = F32ToF16(in[i]);
}

void Bf16ToF32Array(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Bf16ToF32(in[i]);
}

void F32ToBf16Array(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = F32ToBf16(in[i]);
}

}  // namespace tierkv::kernels
