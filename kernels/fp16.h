// kernels/fp16.h
//
// fp16 (IEEE binary16) and bf16 (the top 16 bits of a binary32) <-> f32 conversions for
// the kernels: weight rows stored as F16/BF16, fp16 block scales of Q8_0/Q4_0/K-quants,
// and the rounding of activations that llama.cpp's CPU backend applies before F16/BF16
// dot products.
//
//   F32ToF16: round to nearest, ties to even (as x86 F16C vcvtps2ph with imm 0, which is
//             what ggml's CPU conversion uses); overflow gives inf; NaN stays NaN.
//   F16ToF32: exact.
//   F32ToBf16: round to nearest, ties to even; NaN becomes a quiet NaN (as ggml does).
//   Bf16ToF32: exact (shift into the high half).
//
// The scalar fp16 conversion is memory/half.h's, shared with the KV codecs; it uses
// integer operations only, so it is exact in any floating-point environment.
//
// Thread-safety: pure functions.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "memory/half.h"

namespace tierkv::kernels {

// The scalar conversions are memory/half.h's (one implementation for the KV codecs and
// the kernels): round to nearest even, exact in any floating-point environment.
inline float F16ToF32(uint16_t h) { return HalfToFloat(h); }
inline uint16_t F32ToF16(float f) { return FloatToHalf(f); }

// The value f16 rounding gives back as a float (q and softmax weights in attention).
inline float RoundToF16(float f) { return F16ToF32(F32ToF16(f)); }

inline float Bf16ToF32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t F32ToBf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((x + (0x7fffu + ((x >> 16) & 1u))) >> 16);
}

// An unaligned little-endian fp16 at p.
inline float LoadF16(const void* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return F16ToF32(h);
}

// Array forms; F16C is used when the CPU has it (identical bits).
void F16ToF32Array(const uint16_t* in, float* out, size_t n);
void F32ToF16Array(const float* in, uint16_t* out, size_t n);
void Bf16ToF32Array(const uint16_t* in, float* out, size_t n);
void F32ToBf16Array(const float* in, uint16_t* out, size_t n);
// x[i] = RoundToF16(x[i]) in place.
void RoundToF16Array(float* x, size_t n);

}  // namespace tierkv::kernels
