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
// kvcache/half.h holds the same fp16 conversion for the KV codecs; kernels/ may not
// include kvcache/, so the kernels carry their own (tests check both against the F16C
// instructions). Scalar functions use integer operations only, so they are exact in any
// floating-point environment.
//
// Thread-safety: pure functions.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace tierkv::kernels {

inline float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  const uint32_t normal = ((exp + (127 - 15)) << 23) | (man << 13);
  const uint32_t special = 0x7f800000u | (man << 13) | (man != 0 ? 0x00400000u : 0u);
  // A subnormal half is man * 2^-24: an exact int->float conversion times a power of two.
  const uint32_t subnormal = std::bit_cast<uint32_t>(static_cast<float>(man) * 0x1p-24f);
  const uint32_t mag = exp == 0 ? subnormal : (exp == 0x1f ? special : normal);
  return std::bit_cast<float>(sign | mag);
}

inline uint16_t F32ToF16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or NaN
    if (ax == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
    return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  }
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (ax >= 0x38800000u) {  // normal half
    uint32_t h = (ax - 0x38000000u) >> 13;
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  if (ax <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25: zero
  const uint32_t e = ax >> 23;
  const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - e;
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

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
