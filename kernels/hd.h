// kernels/hd.h
//
// Host/device helpers: the few float operations whose rounding the exact kernels spell
// out, written once for the CPU (g++) and for CUDA (nvcc), so that a function marked
// TIERKV_HD is the same arithmetic on both. The CPU tests compile and run these helpers
// against the CPU kernels; the CUDA executor (kernels/cuda_executor.cu) calls them from
// its kernels. Device code is built with --fmad=false as well, but the helpers do not
// rely on it: every product and sum whose rounding matters is one call here.
//
//   HdMul, HdAdd, HdDiv       one rounding each (never fused into an FMA);
//   HdFma(a, b, c)            a * b + c rounded once;
//   HdHalfToFloat, HdFloatToHalf  fp16 conversions, round to nearest even (memory/half.h
//                              on the host, the hardware's on the device: the same bits).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define TIERKV_HD __host__ __device__ __forceinline__
#else
#define TIERKV_HD inline
#endif

#if !defined(__CUDA_ARCH__)
#include <cmath>

#include "memory/half.h"
#endif

namespace tierkv::kernels {

TIERKV_HD float HdMul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

TIERKV_HD float HdAdd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

TIERKV_HD float HdDiv(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

TIERKV_HD float HdFma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

TIERKV_HD float HdHalfToFloat(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  return HalfToFloat(h);
#endif
}

TIERKV_HD uint16_t HdFloatToHalf(float f) {
#if defined(__CUDA_ARCH__)
  return __half_as_ushort(__float2half_rn(f));
#else
  return FloatToHalf(f);
#endif
}

TIERKV_HD float HdBf16ToFloat(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
#else
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
#endif
}

// Round half to even, as the CPU's activation quantizers round (std::nearbyint in the
// default rounding mode).
TIERKV_HD int HdRoundHalfEven(float v) {
#if defined(__CUDA_ARCH__)
  return __float2int_rn(v);
#else
  return static_cast<int>(std::nearbyint(v));
#endif
}

// Round half away from zero (std::round), as the q8_0 KV codec rounds.
TIERKV_HD int HdRoundHalfAway(float v) {
#if defined(__CUDA_ARCH__)
  return static_cast<int>(roundf(v));
#else
  return static_cast<int>(std::round(v));
#endif
}

TIERKV_HD float HdAbs(float v) { return v < 0.0f ? -v : (v == 0.0f ? 0.0f : v); }

}  // namespace tierkv::kernels
