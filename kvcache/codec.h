// kvcache/codec.h
//
// KV codecs: how one K or V vector of head_dim values is stored in a block, and how
// attention works on the stored bytes directly (no dequantized copy of the cache):
//
//   q' = PrepareQuery(q);  score = Dot(q', k_enc)       == dot(q, Decode(k_enc))
//   acc[head_dim] = 0;  Accumulate(w, v_enc, acc) ...;  FinishOutput(acc, out)
//                                                         == sum_j w_j * Decode(v_j)
// (equal up to float rounding). For tq4/tq3 q' and acc live in the rotated domain and
// FinishOutput applies the inverse rotation once per output, not once per token. For
// q8_0/q4_0, q' is the query quantized to q8_0 (bytes in the floats' room, as llama.cpp
// quantizes the query for these K types) and scores are integer dot products per block
// (kernels/kv_codec_simd.h): equal up to the query's rounding as well.
//
// Encoded layouts (all little-endian; docs/codecs.md has the details and measurements):
//   f16   head_dim x fp16.                                          16 bits per value
//   q8_0  head_dim/32 blocks {fp16 d; int8 qs[32]}, llama.cpp's.    8.5 bits per value
//   q4_0  head_dim/32 blocks {fp16 d; uint8 qs[16]}, llama.cpp's:   4.5 bits per value
//         element j in the low nibble of qs[j], element j+16 in the high nibble,
//         value = (nibble - 8) * d.
//   tq4, tq3  head_dim/G groups (G = min(head_dim, kTqGroup) = 64 coordinates), each
//         {uint16 header; G indices of b bits (b = 4 or 3)}:      b + 16/G bits per value
//         header = fp16 scale with its 3 low mantissa bits replaced by a codebook id;
//         indices in words of 8: index 8w+i at bits [b*i, b*i+b) of the b-byte
//         little-endian word w (tq4: element 2i in the low nibble of byte i).
//         Decoded group = scale * R_g^T c_book[idx]; R_g: TqRotation's block g;
//         c_book: TqCodebooks (Lloyd-Max for one coordinate of a random unit vector,
//         and 7 other shapes, chosen per group by the encoder).
//
// Thread-safety: a VectorCodec is immutable after Create; every method is const and may
// be called from many threads at once. Create itself is thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "kernels/kv_vector_kernels.h"
#include "memory/status.h"

namespace tierkv {

enum class KvCodec : uint8_t { kF16 = 0, kQ8_0 = 1, kQ4_0 = 2, kTq4 = 3, kTq3 = 4 };

inline constexpr KvCodec kAllKvCodecs[] = {KvCodec::kF16, KvCodec::kQ8_0, KvCodec::kQ4_0,
                                           KvCodec::kTq4, KvCodec::kTq3};

// "f16" "q8_0" "q4_0" "tq4" "tq3" (exact, lower case); the error lists the valid names.
Result<KvCodec> ParseKvCodec(std::string_view text);
// The name ParseKvCodec accepts; "unknown" for a value outside the enum.
const char* KvCodecName(KvCodec c);

// Largest head_dim any codec accepts (bounds the stack scratch of Encode).
inline constexpr int kMaxCodecHeadDim = 1024;
// tq: coordinates per {scale, codebook id} header, and rotation block size.
inline constexpr int kTqGroup = 64;
// tq: codebooks per (group size, levels); the header's 3 low bits pick one.
inline constexpr int kTqBooks = 8;

// The kernels' interface (kernels/kv_vector_kernels.h) with kvcache's codec id and
// factory: every virtual member below overrides one of KvVectorKernels.
class VectorCodec : public kernels::KvVectorKernels {
 public:
  // REQUIRES (else InvalidArgument): 1 <= head_dim <= kMaxCodecHeadDim;
  //   q8_0, q4_0: head_dim % 32 == 0;  tq4, tq3: head_dim a power of two >= 8.
  // seed: picks the tq rotation (ignored, but kept, by the other codecs). The session
  // header stores it: the same (codec, head_dim, seed) decodes the same bytes.
  static Result<std::unique_ptr<VectorCodec>> Create(KvCodec codec, int head_dim,
                                                     uint64_t seed);
  ~VectorCodec() override;

  VectorCodec(const VectorCodec&) = delete;
  VectorCodec& operator=(const VectorCodec&) = delete;

  KvCodec codec() const { return codec_; }
  // head_dim() and vector_bytes() (encoded bytes of one vector): KvVectorKernels's.
  uint64_t seed() const { return desc().seed; }
  double bits_per_value() const {
    return static_cast<double>(vector_bytes()) * 8.0 / static_cast<double>(head_dim());
  }

  // x: [head_dim] -> out: [vector_bytes()]. Deterministic: same input, same bytes.
  // Non-finite inputs give non-finite decodes for f16 and tq; q8_0/q4_0 follow
  // llama.cpp (a non-finite value makes its block's scale inf or NaN).
  void Encode(const float* x, void* out) const override = 0;
  // in: [vector_bytes()] -> out: [head_dim].
  void Decode(const void* in, float* out) const override = 0;
  // q, q_prep: [head_dim]; q_prep may equal q.
  void PrepareQuery(const float* q, float* q_prep) const override = 0;
  float Dot(const float* q_prep, const void* k_enc) const override = 0;
  // acc[head_dim] += w * (decoded v, in the codec's accumulation domain).
  void Accumulate(float w, const void* v_enc, float* acc) const override = 0;
  // acc, out: [head_dim]; out may equal acc.
  void FinishOutput(const float* acc, float* out) const override = 0;

  // Batched forms over n consecutive encoded vectors (stride vector_bytes()), one
  // virtual call per batch; bit-identical to the single-vector calls.
  // scores: [n]; w: [n]; x, out (Encode/DecodeMany): [n][head_dim].
  void DotMany(const float* q_prep, const void* k_enc, size_t n, float* scores) const override;
  void AccumulateMany(const float* w, const void* v_enc, size_t n, float* acc) const override;
  void EncodeMany(const float* x, size_t n, void* out) const override;
  void DecodeMany(const void* in, size_t n, float* out) const override;

  // Grouped forms, for grouped-query attention: `heads` query heads against the same n
  // consecutive encoded vectors, each vector read once for all of them. Per head,
  // bit-identical to DotMany / AccumulateMany (so to the single-vector calls).
  // q_prep: [heads][head_dim]; scores: [heads][scores_stride], the first n of each row.
  void DotManyGroup(const float* q_prep, int heads, const void* k_enc, size_t n,
                            float* scores, size_t scores_stride) const override;
  // w: [heads][w_stride], the first n of each row; acc: [heads][head_dim].
  void AccumulateManyGroup(const float* w, size_t w_stride, int heads,
                                   const void* v_enc, size_t n, float* acc) const override;
  // AccumulateManyGroup for `runs` KV heads at once: run r's n vectors start at v_enc +
  // r * run_stride bytes and feed query heads [r * heads, (r + 1) * heads) of w and acc.
  // Each head's sum is a chain of dependent multiply-adds in token order, so a few heads
  // of head_dim 32 leave the FMA units waiting on latency; two runs side by side give
  // them twice the independent chains. Per head bit-identical to AccumulateMany.
  void AccumulateManyGroupRuns(const float* w, size_t w_stride, int heads, int runs,
                                       const void* v_enc, size_t run_stride, size_t n,
                                       float* acc) const override;

  // Key tiles. A cache whose blocks hold a multiple of kKeyTileTokens tokens may store
  // each KV head's keys as tiles of kKeyTileTokens consecutive keys, dimension by
  // dimension ([head_dim][kKeyTileTokens] values, the same bytes as kKeyTileTokens
  // vectors): the scores of a tile's keys are then kKeyTileTokens-lane vectors with no
  // horizontal sums. Only codecs that say so here (f16 with head_dim % 8 == 0, q8_0 and
  // q4_0, whose tiles are laid out as kernels/kv_codec_simd.h says); the values stay
  // vector by vector.
  // (kKeyTileTokens: KvVectorKernels's, 16.)
  bool KeyTiles(int block_tokens) const override { return false; }
  // x: [head_dim] -> key `lane` (0 .. kKeyTileTokens - 1) of the tile at `tile`, and
  // back. REQUIRES: KeyTiles (of the cache's block_tokens).
  void EncodeKeyInTile(const float* x, void* tile, int lane) const override;
  void DecodeKeyInTile(const void* tile, int lane, float* out) const override;
  // DotManyGroup over n keys stored as consecutive tiles from `k_tiles` (the last tile
  // may be partly filled; its other lanes are read but not reported), bit-identical per
  // (head, key) to DotManyGroup over the same keys stored vector by vector.
  void DotManyGroupTiled(const float* q_prep, int heads, const void* k_tiles, size_t n,
                                 float* scores, size_t scores_stride) const override;

  // Which inner loops run: "avx512" (f16 only: its batched and grouped forms use
  // AVX-512F, the single-vector calls AVX2), "avx2" (AVX2+FMA+F16C, chosen at run time)
  // or "generic".
  const char* kernel_name() const override = 0;

 protected:
  VectorCodec(KvCodec codec, int head_dim, uint64_t seed, size_t vector_bytes)
      : KvVectorKernels({static_cast<int>(codec), head_dim, seed, vector_bytes}), codec_(codec) {}

 private:
  const KvCodec codec_;
};

// The tq rotation, block-diagonal: each block of `block` coordinates is rotated by
// R_g = prod over rounds of (1/sqrt(block)) H D_{r,g}, with H the block x block
// Walsh-Hadamard matrix (fast transform, O(block log block)) and D diagonal random
// signs drawn from the seed (splitmix64). R is orthogonal: Inverse(Forward(x)) == x.
class TqRotation {
 public:
  // One round: a single outlier channel becomes a flat +-1/sqrt(block) pattern that the
  // codebooks (with a fitted scale) represent well; measured better than two rounds on
  // K with outlier channels and equal on Gaussian data (docs/codecs.md).
  static constexpr int kDefaultRounds = 1;
  // REQUIRES: d and block powers of two, block <= d <= kMaxCodecHeadDim; rounds >= 1.
  TqRotation(int d, uint64_t seed, int rounds = kDefaultRounds, int block = kTqGroup);

  int dim() const { return d_; }
  int block() const { return block_; }
  int rounds() const { return rounds_; }
  // y = R x; x, y: [d]; y may equal x.
  void Forward(const float* x, float* y) const;
  // x = R^T y; may be in place.
  void Inverse(const float* y, float* x) const;
  // Signs of round r: [d] of +1.0f / -1.0f, applied before that round's H (for other
  // kernels, e.g. CUDA).
  const float* signs(int r) const { return signs_.data() + static_cast<size_t>(r) * d_; }

 private:
  int d_;
  int block_;
  int rounds_;
  std::vector<float> signs_;  // [rounds][d]
};

// The tq codebooks for one (dim, levels): kTqBooks scalar quantizers, each designed by
// Lloyd iteration on a fine grid of a density (deterministic, cached per (dim, levels)):
//   book 0: z = sqrt(dim) * (one coordinate of a uniformly random unit vector in dim
//           dimensions), density (1 - z^2/dim)^((dim-3)/2): the TurboQuant quantizer;
//   books 1-2: exp(-|z|^4), exp(-|z|^12) (lighter tails);
//   books 3-7: +-m + N(0, 1 - m^2), m = 0.6, 0.75, 0.85, 0.92, 0.97 (bimodal: what one
//           Hadamard round makes of a vector dominated by one or two outlier channels).
// All scaled to unit variance; the encoder picks, per group, the book and scale with the
// least squared error.
struct TqCodebooks {
  int dim = 0;
  int levels = 0;
  std::vector<float> centroids;   // [kTqBooks][levels], increasing, symmetric around 0
  std::vector<float> thresholds;  // [kTqBooks][levels - 1], midpoints of neighbours
  std::vector<double> mse;        // [kTqBooks]: E[(z - Q(z))^2] under each design density
};
// REQUIRES (else InvalidArgument): 4 <= dim <= 2^20; 2 <= levels <= 16.
Result<std::shared_ptr<const TqCodebooks>> GetTqCodebooks(int dim, int levels);

// --- Quality measurement (tests, benches, docs/codecs.md) ---------------------------

// Synthetic K/V, like real K caches: i.i.d. N(0, 1) entries, except a few "outlier
// channels" per head whose entries are N(0, s_c^2) with s_c uniform in
// [outlier_scale_min, outlier_scale_max]; K and V draw their own channel sets. Queries
// are i.i.d. N(0, 1). All from `seed` (splitmix64 + Box-Muller, platform independent).
struct SyntheticKvOptions {
  int head_dim = 128;
  int tokens = 1024;
  int queries = 64;
  int outlier_channels = -1;       // per head, for K and for V; -1: max(1, head_dim / 32)
  float outlier_scale_min = 10.0f;
  float outlier_scale_max = 20.0f;
  bool outliers_in_v = true;       // false: V is plain N(0, 1)
  uint64_t seed = 1;
};

struct CodecQuality {
  KvCodec codec = KvCodec::kF16;
  int head_dim = 0;
  double bits_per_value = 0;
  // Attention output out_q = softmax(q.K / sqrt(d)) V computed on the encoded bytes
  // with PrepareQuery/Dot/Accumulate/FinishOutput, against the same attention computed
  // in double from f16-encoded K and V: sqrt(sum_q |out_q - ref_q|^2 / sum_q |ref_q|^2).
  // For the f16 codec the reference is the f32 data instead (f16's own error).
  double attention_rel_error = 0;
  double k_rel_mse = 0;  // sum |k - Decode(Encode(k))|^2 / sum |k|^2 (vs the f32 data)
  double v_rel_mse = 0;
};

// REQUIRES: options valid for the codec (else the Create error is returned).
Result<CodecQuality> MeasureCodecQuality(KvCodec codec, const SyntheticKvOptions& options,
                                         uint64_t codec_seed);
// The same for a codec instance; REQUIRES codec.head_dim() == options.head_dim.
Result<CodecQuality> MeasureCodecQuality(const VectorCodec& codec,
                                         const SyntheticKvOptions& options);

// --- Implementation seams (not for callers) -----------------------------------------
namespace codec_internal {

// tq design variants, for the ablations in docs/codecs.md. Only the defaults are a
// stored format; other values make codecs whose bytes no session file may hold.
enum class TqScaleMode : uint8_t {
  kNorm,          // |x_g| / sqrt(G): the plain TurboQuant norm
  kPreserve,      // the decoded group has |x_g| exactly
  kLeastSquares,  // the scale minimising |x_g - decoded|^2 for the chosen indices
};
struct TqOptions {
  int rounds = TqRotation::kDefaultRounds;
  TqScaleMode scale_mode = TqScaleMode::kLeastSquares;
  int refine_iterations = 2;  // kLeastSquares: refits of the scale per book
  int books = kTqBooks;       // 1..kTqBooks; 1 keeps the full fp16 scale in the header
  int group = kTqGroup;       // coordinates per header (power of two, clipped to head_dim)
};
Result<std::unique_ptr<VectorCodec>> CreateTqCodec(KvCodec codec, int head_dim,
                                                   uint64_t seed, const TqOptions& options);

// Forces the generic (non-AVX2) kernels in codecs created afterwards (tests compare).
void ForceGenericKernels(bool force);
// True when codecs created now get the AVX2+FMA+F16C kernels.
bool UseAvx2Kernels();
// Keeps AVX-512 out of codecs created afterwards (tests compare with the AVX2 kernels).
void ForceNoAvx512Kernels(bool force);
// True when codecs created now may use AVX-512F (and the AVX2 kernels).
bool UseAvx512Kernels();
// Keeps AVX-512 VBMI out of codecs created afterwards (tq's fused kernels then unpack
// indices without vpermb; tests compare the two, which give the same bits).
void ForceNoAvx512Vbmi(bool force);
// True when codecs created now may use AVX-512 VBMI (with AVX-512F/BW).
bool UseAvx512Vbmi();

}  // namespace codec_internal
}  // namespace tierkv
