// kernels/quant.h
//
// Weight element types of llama.cpp GGUF files that the CPU kernels read, their block
// layouts (byte-compatible with ggml's), dequantization, and the dot products that
// llama.cpp's CPU backend uses for y = W x:
//
//   weight type   activation row converted to   dot product
//   F32           F32                           f32 products, f32 accumulation
//   F16           F16 (round to nearest even)   f16 x f16 products in f32, f32 accumulation
//   BF16          BF16 (round to nearest even)  as F16
//   Q8_0, Q4_0,   Q8_0 (32-value blocks)        integer block sums scaled by d_w * d_x in f32
//   Q5_0, IQ4_NL
//   Q4_1, Q5_1    Q8_1 (Q8_0 plus s = d * sum)  as Q8_0, plus m_w * s_x per block
//   Q2_K, Q3_K,   Q8_K (256-value blocks,       integer sums with the 4/6/8-bit sub-block
//   Q4_K, Q5_K,   f32 scale, 16-value sums)     scales, scaled by d_x * d_w in f32
//   Q6_K, IQ4_XS
//
// Rounding the activation row is what makes quantized matmuls a discontinuous function
// of their input; doing it exactly as llama.cpp does is what keeps our logits within
// the reference tolerances (see docs/kernels.md).
//
// Block layouts (little-endian; "d" fields are fp16 unless noted):
//   Q8_0  {d; int8 qs[32]}                       x[i] = d * qs[i]
//   Q4_0  {d; uint8 qs[16]}                      x[i] = d * ((qs[i] & 15) - 8),
//                                                x[i+16] = d * ((qs[i] >> 4) - 8)
//   Q4_1  {d; m; uint8 qs[16]}                   x[i] = d * (qs[i] & 15) + m, x[i+16] = d * (qs[i] >> 4) + m
//   Q5_0  {d; uint8 qh[4]; uint8 qs[16]}         as Q4_0 with bit i of the 32-bit qh as 5th bit of
//                                                value i: x = d * (q5 - 16)
//   Q5_1  {d; m; uint8 qh[4]; uint8 qs[16]}      x = d * q5 + m
//   IQ4_NL {d; uint8 qs[16]}                     as Q4_0, x = d * kIq4nlValues[nibble] (a fixed
//                                                non-uniform table of 16 int8 levels)
//   IQ4_XS {d; uint16 scales_h; uint8 scales_l[4]; uint8 qs[128]}: 8 sub-blocks of 32
//         with a 6-bit scale code (see ScaleIq4Xs; the scale is code - 32); sub-block j
//         keeps its values l and l + 16 in the low and high nibble of qs[16j + l], each
//         an index into kIq4nlValues: x = (d * (code_j - 32)) * kIq4nlValues[nibble]
//   Q8_1  {d; s; int8 qs[32]} (activations only): s = fp16(d * sum of qs), d the f32 scale
//   Q2_K  {uint8 scales[16]; uint8 qs[64]; d; dmin}: 16 groups of 16 values, group g
//         with 4-bit scale scales[g] & 15 and min scales[g] >> 4; value v = 128h + 32j +
//         l (h < 2, j < 4, l < 32) is bits 2j..2j+1 of qs[32h + l]:
//         x = d * sc_g * q - dmin * m_g
//   Q3_K  {uint8 hmask[32]; uint8 qs[64]; uint8 scales[12]; d}: 16 groups with 6-bit
//         scales stored +32 (packed, see ScaleQ3K); value v as Q2_K for its 2 low bits,
//         its 3rd bit is bit v / 32 of hmask[v % 32], and q = low + 4 * bit - 4:
//         x = d * (sc_g - 32) * q
//   Q4_K  {d; dmin; uint8 scales[12]; uint8 qs[128]}: 8 sub-blocks of 32 with 6-bit
//         scale sc_j and min m_j (packed, see ScaleMinK4); chunk c (64 values) holds
//         sub-block 2c in the low nibbles of qs[32c..32c+31] and 2c+1 in the high ones;
//         x = d * sc_j * q - dmin * m_j
//   Q5_K  Q4_K plus uint8 qh[32] (before qs): bit 2c of qh[l] is the 5th bit of value l
//         of sub-block 2c, bit 2c+1 that of sub-block 2c+1
//   Q6_K  {uint8 ql[128]; uint8 qh[64]; int8 scales[16]; d}: two halves of 128 values;
//         in half h, for l < 32: values l, l+32, l+64, l+96 take low nibble of ql[l],
//         low of ql[l+32], high of ql[l], high of ql[l+32] and bits 0-1, 2-3, 4-5, 6-7
//         of qh[l]; x = d * scales[16-value group] * (q - 32)
//   Q8_K  {f32 d; int8 qs[256]; int16 bsums[16]} (activations only): bsums are sums of
//         16 consecutive qs.
//
// Thread-safety: pure functions over caller memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu_features.h"
#include "kernels/ggml_types.h"
#include "kernels/hd.h"

namespace tierkv::kernels {

// The ggml type of a weight matrix or an activation row: the one ggml type enum
// (kernels/ggml_types.h, ids as written in GGUF tensor infos). The kernels read the
// types FindWeightType knows; Q8_1 and Q8_K only as converted activations.
using WeightType = ::tierkv::GgmlType;

inline constexpr int kQk0 = 32;    // values per Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL block
inline constexpr int kQkK = 256;   // values per K-quant super-block

struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQk0];
};
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQk0 / 2];
};
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQk0 / 2];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQk0 / 2];
};
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQk0 / 2];
};
struct BlockQ8_1 {
  uint16_t d;
  uint16_t s;
  int8_t qs[kQk0];
};
struct BlockIq4Nl {
  uint16_t d;
  uint8_t qs[kQk0 / 2];
};
// The 16 levels of IQ4_NL (ggml's kvalues_iq4nl).
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
struct BlockQ2_K {
  uint8_t scales[kQkK / 16];
  uint8_t qs[kQkK / 4];
  uint16_t d;
  uint16_t dmin;
};
struct BlockQ3_K {
  uint8_t hmask[kQkK / 8];
  uint8_t qs[kQkK / 4];
  uint8_t scales[12];
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[kQkK / 2];
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQkK / 8];
  uint8_t qs[kQkK / 2];
};
struct BlockQ6_K {
  uint8_t ql[kQkK / 2];
  uint8_t qh[kQkK / 4];
  int8_t scales[kQkK / 16];
  uint16_t d;
};
struct BlockIq4Xs {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQkK / 64];
  uint8_t qs[kQkK / 2];
};
struct BlockQ8_K {
  float d;
  int8_t qs[kQkK];
  int16_t bsums[kQkK / 16];
};
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockIq4Nl) == 18);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockIq4Xs) == 136);
static_assert(sizeof(BlockQ8_K) == 292);

struct WeightTypeInfo {
  WeightType type;
  const char* name;         // ggml's spelling: "Q4_K"
  int block_size;           // values per block
  int block_bytes;          // bytes per block
  WeightType vec_dot_type;  // what the activation row is converted to
};

// The info of a supported ggml type id, or nullptr (the kernels cannot read it).
const WeightTypeInfo* FindWeightType(uint32_t ggml_id);
const WeightTypeInfo& GetWeightTypeInfo(WeightType type);  // REQUIRES: supported
inline const char* WeightTypeName(WeightType type) { return GetWeightTypeInfo(type).name; }
inline WeightType ActivationType(WeightType weight) { return GetWeightTypeInfo(weight).vec_dot_type; }
// Q8_1 and Q8_K exist only as converted activations: no dot product takes them as weights.
inline bool IsActivationOnly(WeightType type) { return type == WeightType::kQ8_1 || type == WeightType::kQ8_K; }
// Bytes of a row of n values. REQUIRES: n % block_size == 0.
size_t RowBytes(WeightType type, int64_t n);

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block.
TIERKV_HD void ScaleMinK4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// The 6-bit scale code (0..63; the scale is code - 32) of group g (0..15) of a Q3_K
// super-block: low 4 bits in nibble g / 8 of byte g % 8, high 2 bits at bit 2 * (g / 4)
// of byte 8 + g % 4.
TIERKV_HD int ScaleQ3K(const uint8_t* scales, int g) {
  return ((scales[g % 8] >> (4 * (g / 8))) & 15) | (((scales[8 + g % 4] >> (2 * (g / 4))) & 3) << 4);
}

// The 6-bit scale code (0..63; the scale is code - 32) of sub-block j (0..7) of an
// IQ4_XS super-block: low 4 bits in nibble j % 2 of scales_l[j / 2], high 2 bits at bit
// 2j of scales_h.
inline int ScaleIq4Xs(const BlockIq4Xs& b, int j) {
  return ((b.scales_l[j / 2] >> (4 * (j % 2))) & 15) | (((b.scales_h >> (2 * j)) & 3) << 4);
}

// out[n] = the values of one row. REQUIRES: n % block_size == 0. Q8_1 and Q8_K are
// accepted too.
void DequantizeRow(WeightType type, const void* row, float* out, int64_t n);

// Converts x[n] to the activation type `act` (F32, F16, BF16, Q8_0, Q8_1 or Q8_K) as
// llama.cpp's CPU backend does:
//   Q8_0: amax = max |x|, d = fp16(amax / 127), q = round_half_even(x * (127 / amax))
//   Q8_1: as Q8_0, and s = fp16((amax / 127) * sum of the block's q)
//   Q8_K: max = the value of largest magnitude (first one on ties), s = -127 / max,
//         q = min(127, round_half_even(s * x)), d = 1 / s (f32), bsums.
// out: RowBytes(act, n) bytes. REQUIRES: n % block_size(act) == 0.
void QuantizeActivation(WeightType act, const float* x, void* out, int64_t n);
// Q8_K as ggml's quantize_mat_q8_K_4x8 rounds it (the activations of the tokens that
// llama.cpp's repacked Q4_K gemm takes four at a time): the same d, codes rounded half
// away from zero instead of half to even (found against ggml itself, docs/kernels.md).
void QuantizeQ8KTiesAway(const float* x, void* out, int64_t n);

// The 8 float lanes of a Q5_K / Q6_K dot product (DotQ5_KScalar) summed as ggml's x86
// hsum_float_8 sums them: lanes (L, L + 4) pairwise, then (0, 2) and (1, 3), then the two.
TIERKV_HD float HsumLanes8(const float a[8]) {
  const float b0 = a[4] + a[0], b1 = a[5] + a[1], b2 = a[6] + a[2], b3 = a[7] + a[3];
  return (b0 + b2) + (b1 + b3);
}

// One row of a weight matrix times an activation row already in ActivationType(weight).
using DotFn = float (*)(const void* row, const void* act, int64_t n);
// The kernel for `weight` at SIMD level `level` (falls back to lower levels where no
// faster one exists). REQUIRES: supported type other than Q8_1 and Q8_K.
DotFn GetDotFn(WeightType weight, SimdLevel level);
inline float DotRow(WeightType weight, const void* row, const void* act, int64_t n) {
  return GetDotFn(weight, ActiveSimdLevel())(row, act, n);
}

// Which level GetDotFn really serves for this type (AVX-512 falls back to AVX2 for the
// quantized types on CPUs without AVX512-VNNI): for benchmarks and reports.
SimdLevel DotFnLevel(WeightType weight, SimdLevel level);
// The CPU kernels this process runs now, for reports: "avx512-vnni" (the AVX-512 level
// with the VNNI multi-row kernels), "avx512", "avx2+avx-vnni", "avx2" or "scalar".
const char* ActiveKernelsName();

// Dots of n_rows consecutive rows of a weight matrix (row r at rows + r * row_bytes) with
// one activation row: out[r] for r < n_rows. Each out[r] is bit-identical to
// GetDotFn(weight, level) on that row; the kernel shares the activation loads and the
// per-block setup between rows and keeps several independent sums in flight.
using DotRowsFn = void (*)(const void* rows, size_t row_bytes, int64_t n_rows, const void* act, int64_t n,
                           float* out);
// The multi-row kernel for `weight` at `level`, or nullptr where there is none (call the
// DotFn per row). Today: the quantized types at the AVX-512 level when the CPU also has
// AVX512-VNNI; Q8_0, Q4_0 and Q6_K at the AVX2 level (and at the AVX-512 level without
// VNNI, where the AVX2 one-row kernels serve).
DotRowsFn GetDotRowsFn(WeightType weight, SimdLevel level);
// Dots of n_rows consecutive rows with each of n_tokens activation rows (a prefill
// chunk): out[t * out_stride + r] for r < n_rows, t < n_tokens, each bit-identical to
// GetDotRowsFn's (and so GetDotFn's) result for row r and acts[t] alone. The kernel
// loads and unpacks each weight block once for several tokens, where the one-token
// kernels repeat that work per token.
using DotRowsTokensFn = void (*)(const void* rows, size_t row_bytes, int64_t n_rows, const void* const* acts,
                                 int n_tokens, int64_t n, float* out, size_t out_stride);
//
// How a product of several tokens sums the float weight types (F32, F16, BF16).
// llama.cpp's CPU backend multiplies one token with ggml's vec_dot and several with
// tinyBLAS (llamafile_sgemm), which sum these types in different orders; tierkv follows
// it at the AVX-512 level, the reference vectors' (docs/kernels.md): kBatched is
// tinyBLAS's order, kPerToken is the one-token kernels' order for each token. The
// quantized types, and the float types at the other levels, sum alike either way.
enum class TokenSums : uint8_t { kBatched, kPerToken };
// The several-token kernel for `weight` at `level` with `sums` (kPerToken: each result
// bit-identical to GetDotRowsFn's / GetDotFn's for its row and token), or nullptr where
// there is none (take the one-token kernels per token). Today, kPerToken: every
// quantized type at the AVX-512 level with AVX512-VNNI; Q4_K and Q5_K at the AVX2 level
// (and at the AVX-512 level without VNNI, where the AVX2 kernels serve). kBatched: those,
// and F32, F16, BF16 at the AVX-512 level.
DotRowsTokensFn GetDotRowsTokensFn(WeightType weight, SimdLevel level, TokenSums sums = TokenSums::kPerToken);
// llama.cpp's repacked mul_mat of several tokens (MatMulJob::llama_gemm): for Q4_K, at
// the AVX-512 level with VNNI, tokens four at a time in its gemm's order (the float step
// per 64-value part of a super-block) and the 1 - 3 left in its gemv's (= kPerToken);
// nullptr for the other types and levels (use GetDotRowsTokensFn).
DotRowsTokensFn GetLlamaGemmRowsTokensFn(WeightType weight, SimdLevel level);
// Whether kBatched sums `weight` differently from kPerToken at `level` (then a batch of
// one token takes the several-token kernel too, as a llama.cpp batch of several would).
bool BatchedSumsDiffer(WeightType weight, SimdLevel level);
// Rows of at least this many bytes are "long": the multi-row kernels prefetch each of
// their rows ahead (they read R interleaved streams, which the hardware prefetchers
// follow poorly), and for one activation row MatVec may read them one at a time
// (DotRowsFnStreams).
inline constexpr size_t kLongRowBytes = 1024;
// Whether the multi-row kernel of `weight` at `level` reads long rows from memory at
// least as fast as its one-row kernel does (bench/matvec_bench.cc, docs/benchmarks.md:
// all but the AVX2 level's Q8_0, which measured the same or slower; the AVX512-VNNI
// Q8_0 one was at 0.75x until its long rows were prefetched a group ahead, and is 1.1 -
// 1.25x since). Where it does not, a matrix-vector product over long rows (a decode
// step: weights come from memory) takes the one-row kernel; with several activation rows
// (a prefill chunk: the rows are in cache for all but the first) the multi-row kernel is
// faster and stays. Either way the bits are the same.
bool DotRowsFnStreams(WeightType weight, SimdLevel level);

namespace quant_internal {
// Per-level kernel tables (quant.cc, quant_avx2.cc, quant_avx512.cc); nullptr = none.
DotFn ScalarDot(WeightType weight);
DotFn Avx2Dot(WeightType weight);
DotFn Avx512Dot(WeightType weight);
DotRowsFn Avx512DotRows(WeightType weight);
DotRowsTokensFn Avx512DotRowsTokens(WeightType weight);
DotRowsTokensFn Avx512BatchDotRowsTokens(WeightType weight);  // F32, F16, BF16 (kBatched)
DotRowsTokensFn Avx512LlamaGemmRowsTokens(WeightType weight);  // Q4_K (GetLlamaGemmRowsTokensFn)
// Q8_0, Q4_0, Q6_K; with avx_vnni (only where AvxVnniActive()) Q8_0 and Q4_0 take the
// AVX-VNNI forms, which give the same bits.
DotRowsFn Avx2DotRows(WeightType weight, bool avx_vnni);
DotRowsTokensFn Avx2DotRowsTokens(WeightType weight);
// Activation quantizers of nb blocks with the scalar ones' bytes (Q8_0, Q8_1, Q8_K;
// Q8_K's ties-away form stays scalar); nullptr for the other types.
using QuantizeFn = void (*)(const float* x, void* out, int64_t nb);
QuantizeFn Avx2Quantize(WeightType act);
// Whether the AVX512-VNNI kernels run (the CPU has AVX512_VNNI and AVX-512 is
// detected); tests use this to know which kernels they compare.
bool HasAvx512Vnni();
}  // namespace quant_internal

}  // namespace tierkv::kernels
