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

// q8_0 / q4_0 scores are integer dot products against the query quantized as llama.cpp
// quantizes it for these K types (q8_0 blocks of 32: d = fp16(amax / 127), q = round(x /
// d)): per block in order, score = fma(d_k * d_q, float(sum_i q_i * k_i), score). A
// prepared query keeps, in the 32 floats' room of each block (kQPrepBlockBytes), d_q as
// a float, sum_i q_i, the 32 int8 q_i and the same plus 128 as uint8.
inline constexpr int kQPrepBlockBytes = 128;
inline constexpr int kQPrepScale = 0;   // float
inline constexpr int kQPrepSum = 4;     // int32
inline constexpr int kQPrepInt8 = 8;    // int8[32]
inline constexpr int kQPrepUint8 = 40;  // uint8[32], q_i + 128

// Key tiles of q8_0 / q4_0 (kvcache/codec.h): 16 keys in the bytes of 16 vectors, block
// by block ([nb] of kQ8TileBlockBytes / kQ4TileBlockBytes): the 16 fp16 scales, then the
// block's payload bytes (32 int8 for q8_0, 16 nibble pairs for q4_0) in groups of 4:
// payload byte m of lane L at kQTileScaleBytes + (m / 4) * 64 + 4 * L + m % 4. A group is
// one 64-byte vector holding 4 bytes of each of the 16 keys: vpdpbusd's operand.
inline constexpr int kQTileLanes = 16;
inline constexpr int kQTileScaleBytes = 2 * kQTileLanes;
inline constexpr int kQ8TileBlockBytes = kQTileLanes * kQ8Bytes;  // 544
inline constexpr int kQ4TileBlockBytes = kQTileLanes * kQ4Bytes;  // 288
inline constexpr size_t QTilePayloadOffset(int m, int lane) {
  return static_cast<size_t>(kQTileScaleBytes + (m / 4) * 64 + 4 * lane + m % 4);
}

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
TIERKV_KV_SIMD_AVX2 void AccumulateQ8Avx2(float w, const uint8_t* v, int nb, float* acc);
TIERKV_KV_SIMD_AVX2 void DecodeQ4Avx2(const uint8_t* in, int nb, float* out);
TIERKV_KV_SIMD_AVX2 void AccumulateQ4Avx2(float w, const uint8_t* v, int nb, float* acc);
void AccumulateManyQ8Avx2(const float* w, const uint8_t* v, size_t n, size_t stride, int nb, float* acc);
void AccumulateManyQ4Avx2(const float* w, const uint8_t* v, size_t n, size_t stride, int nb, float* acc);

// q8_0 / q4_0 key tiles (kernels/kv_quant_tiles.cc), AVX-512F/BW + AVX512-VNNI: the scores
// of n keys stored as tiles from k, for `heads` prepared queries (q_prep [heads][nb * 32]
// floats' room, the layout above); scores [heads][stride]. The same bits as the integer
// scalar definition above.
void DotQ8TiledAvx512Vnni(const float* q_prep, int heads, int nb, const uint8_t* k, size_t n, float* scores,
                          size_t stride);
void DotQ4TiledAvx512Vnni(const float* q_prep, int heads, int nb, const uint8_t* k, size_t n, float* scores,
                          size_t stride);
// The same with AVX2 (vpmaddubsw), the same bits.
void DotQ8TiledAvx2(const float* q_prep, int heads, int nb, const uint8_t* k, size_t n, float* scores,
                    size_t stride);
void DotQ4TiledAvx2(const float* q_prep, int heads, int nb, const uint8_t* k, size_t n, float* scores,
                    size_t stride);
// q8_0 / q4_0 values, grouped query heads over n vectors of vb bytes, AVX-512F: per head
// the bits of AccumulateQ8Avx2 / AccumulateQ4Avx2 called vector after vector.
void AccumulateQ8GroupAvx512(const float* w, size_t w_stride, int heads, const uint8_t* v, size_t n, size_t vb,
                             int nb, float* acc);
void AccumulateQ4GroupAvx512(const float* w, size_t w_stride, int heads, const uint8_t* v, size_t n, size_t vb,
                             int nb, float* acc);
// Two runs of KV heads at once (as AccumulateF16PairAvx512); false (nothing done) when
// their accumulators do not fit the registers.
bool AccumulatePairAvx512(bool q8, const float* w, size_t w_stride, int heads, const uint8_t* v, size_t run_stride,
                          size_t n, size_t vb, int nb, float* acc);
// The same with AVX2, the same bits.
void AccumulateQ8GroupAvx2(const float* w, size_t w_stride, int heads, const uint8_t* v, size_t n, size_t vb, int nb,
                           float* acc);
void AccumulateQ4GroupAvx2(const float* w, size_t w_stride, int heads, const uint8_t* v, size_t n, size_t vb, int nb,
                           float* acc);

}  // namespace tierkv::kernels::kv_simd

#endif  // x86
