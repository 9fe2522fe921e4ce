// kernels/kv_codec_simd.h
//
// The SIMD inner loops of the f16, q8_0 and q4_0 KV codecs (layouts: kvcache/codec.h),
// which kvcache's codecs pick at construction after a run-time CPU check (AVX2 + FMA +
// F16C; AVX-512F for the f16 batched and grouped forms). The generic loops and the
// scalar references stay with the codecs in kvcache/: these must give their bits (the
// codec tests compare them). The loops are x86 only; the layout constants are not.
//
// Naming: q query [head_dim] (or [heads][head_dim]), k / v encoded vectors, n vectors,
// nb 32-value blocks per vector, vb bytes per vector, nv 8- or 16-lane chunks per vector,
// scores [heads][stride], acc [heads][head_dim].
#pragma once

#include <cstddef>
#include <cstdint>

namespace tierkv::kernels::kv_simd {

inline constexpr int kQBlock = 32;   // values per q8_0 / q4_0 block
inline constexpr int kQ8Bytes = 34;  // fp16 d + 32 x int8
inline constexpr int kQ4Bytes = 18;  // fp16 d + 16 bytes of nibbles

// Fixed-order sum of 8 lanes (pairwise, like an 8-wide vector reduction): the generic
// loops' and the AVX2 horizontal sum's order.
inline float SumLanes8(const float* l) { return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])); }

}  // namespace tierkv::kernels::kv_simd

#if defined(__x86_64__) || defined(__i386__)
#define TIERKV_KV_SIMD_X86 1
#define TIERKV_KV_SIMD_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace tierkv::kernels::kv_simd {

// f16: one vector of n values.
TIERKV_KV_SIMD_AVX2 float DotF16Avx2(const float* q, const uint8_t* k, int n);
TIERKV_KV_SIMD_AVX2 void AccumulateF16Avx2(float w, const uint8_t* v, int n, float* acc);
// f16, grouped query heads over n vectors (AVX2: per head DotF16Avx2 / AccumulateF16Avx2's bits).
void AccumulateF16GroupAvx2(const float* w, size_t w_stride, int heads, const uint8_t* v, size_t n, size_t vb,
                            int nv, float* acc);
void DotF16TiledAvx2(const float* q, int heads, const uint8_t* k, size_t n, size_t hd, float* scores, size_t stride);
// f16, AVX-512F (head_dim % 16 == 0 for the group forms): the same bits as AVX2.
void DotF16GroupAvx512Any(const float* q, int heads, const uint8_t* k, size_t n, size_t vb, int nv, float* scores,
                          size_t stride);
void AccumulateF16GroupAvx512(const float* w, size_t w_stride, int heads, const uint8_t* v, size_t n, size_t vb,
                              int nv, float* acc);
// Two runs of KV heads at once; false (nothing done) when a pair's accumulators do not
// fit the registers.
bool AccumulateF16PairAvx512(const float* w, size_t w_stride, int heads, const uint8_t* v, size_t run_stride,
                             size_t n, size_t vb, int nv, float* acc);
void DotF16TiledAvx512(const float* q, int heads, const uint8_t* k, size_t n, size_t hd, float* scores,
                       size_t stride);

// q8_0 / q4_0: nb blocks per vector; the *Many forms over n vectors of `stride` bytes.
TIERKV_KV_SIMD_AVX2 void EncodeQ8BlockAvx2(const float* x, uint8_t* out);
TIERKV_KV_SIMD_AVX2 void DecodeQ8Avx2(const uint8_t* in, int nb, float* out);
TIERKV_KV_SIMD_AVX2 float DotQ8Avx2(const float* q, const uint8_t* k, int nb);
TIERKV_KV_SIMD_AVX2 void AccumulateQ8Avx2(float w, const uint8_t* v, int nb, float* acc);
TIERKV_KV_SIMD_AVX2 void DecodeQ4Avx2(const uint8_t* in, int nb, float* out);
TIERKV_KV_SIMD_AVX2 float DotQ4Avx2(const float* q, const uint8_t* k, int nb);
TIERKV_KV_SIMD_AVX2 void AccumulateQ4Avx2(float w, const uint8_t* v, int nb, float* acc);
void DotManyQ8Avx2(const float* q, const uint8_t* k, size_t n, size_t stride, int nb, float* scores);
void AccumulateManyQ8Avx2(const float* w, const uint8_t* v, size_t n, size_t stride, int nb, float* acc);
void DotManyQ4Avx2(const float* q, const uint8_t* k, size_t n, size_t stride, int nb, float* scores);
void AccumulateManyQ4Avx2(const float* w, const uint8_t* v, size_t n, size_t stride, int nb, float* acc);

}  // namespace tierkv::kernels::kv_simd

#endif  // x86
