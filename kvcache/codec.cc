// kvcache/codec.cc
//
// Codec names, the VectorCodec base, Create, and the llama.cpp-compatible codecs f16,
// q8_0 and q4_0. The tq codecs are in codec_tq.cc, the quality measurement in
// codec_quality.cc.
//
// Each codec picks its inner loops once, at construction: AVX2+FMA+F16C versions
// (kernels/kv_codec_simd.h: target attributes, chosen by kernels::CpuHas; the
// build has no -march flags) or the generic ones here, written so the compiler can
// vectorise them at the baseline ISA, which are also the scalar references.
// Float sums use fixed lane counts, so results never depend on the compiler's choices.
#include "kvcache/codec.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>

#include "kernels/cpu_features.h"
#include "kernels/kv_codec_simd.h"
#include "memory/half.h"
#include "memory/simd_env.h"

#if defined(TIERKV_KV_SIMD_X86)
#define TIERKV_CODEC_X86 1
#endif

namespace tierkv {

static_assert(std::endian::native == std::endian::little,
              "codec layouts are little-endian and loaded with memcpy");

Result<KvCodec> ParseKvCodec(std::string_view text) {
  for (KvCodec c : kAllKvCodecs) {
    if (text == KvCodecName(c)) return c;
  }
  return Status::InvalidArgument("unknown KV codec '" + std::string(text) +
                                 "' (valid: f16, q8_0, q4_0, tq4, tq3)");
}

const char* KvCodecName(KvCodec c) {
  switch (c) {
    case KvCodec::kF16: return "f16";
    case KvCodec::kQ8_0: return "q8_0";
    case KvCodec::kQ4_0: return "q4_0";
    case KvCodec::kTq4: return "tq4";
    case KvCodec::kTq3: return "tq3";
  }
  return "unknown";
}

VectorCodec::~VectorCodec() = default;

void VectorCodec::DotMany(const float* q_prep, const void* k_enc, size_t n,
                          float* scores) const {
  const auto* p = static_cast<const uint8_t*>(k_enc);
  for (size_t i = 0; i < n; ++i) scores[i] = Dot(q_prep, p + i * vector_bytes());
}

void VectorCodec::AccumulateMany(const float* w, const void* v_enc, size_t n,
                                 float* acc) const {
  const auto* p = static_cast<const uint8_t*>(v_enc);
  for (size_t i = 0; i < n; ++i) Accumulate(w[i], p + i * vector_bytes(), acc);
}

void VectorCodec::DotManyGroup(const float* q_prep, int heads, const void* k_enc, size_t n,
                               float* scores, size_t scores_stride) const {
  for (int h = 0; h < heads; ++h) {
    DotMany(q_prep + static_cast<size_t>(h) * head_dim(), k_enc, n,
            scores + static_cast<size_t>(h) * scores_stride);
  }
}

void VectorCodec::AccumulateManyGroup(const float* w, size_t w_stride, int heads,
                                      const void* v_enc, size_t n, float* acc) const {
  for (int h = 0; h < heads; ++h) {
    AccumulateMany(w + static_cast<size_t>(h) * w_stride, v_enc, n,
                   acc + static_cast<size_t>(h) * head_dim());
  }
}

void VectorCodec::AccumulateManyGroupRuns(const float* w, size_t w_stride, int heads, int runs,
                                          const void* v_enc, size_t run_stride, size_t n,
                                          float* acc) const {
  for (int r = 0; r < runs; ++r) {
    const size_t h0 = static_cast<size_t>(r) * static_cast<size_t>(heads);
    AccumulateManyGroup(w + h0 * w_stride, w_stride, heads,
                        static_cast<const uint8_t*>(v_enc) + static_cast<size_t>(r) * run_stride, n,
                        acc + h0 * static_cast<size_t>(head_dim()));
  }
}

// Codecs without key tiles never get these calls (KeyTiles is false for them); they
// leave their outputs untouched.
void VectorCodec::EncodeKeyInTile(const float*, void*, int) const { assert(false && "no key tiles"); }
void VectorCodec::DecodeKeyInTile(const void*, int, float*) const { assert(false && "no key tiles"); }
void VectorCodec::DotManyGroupTiled(const float*, int, const void*, size_t, float*, size_t) const {
  assert(false && "no key tiles");
}

void VectorCodec::EncodeMany(const float* x, size_t n, void* out) const {
  auto* p = static_cast<uint8_t*>(out);
  for (size_t i = 0; i < n; ++i) Encode(x + i * head_dim(), p + i * vector_bytes());
}

void VectorCodec::DecodeMany(const void* in, size_t n, float* out) const {
  const auto* p = static_cast<const uint8_t*>(in);
  for (size_t i = 0; i < n; ++i) Decode(p + i * vector_bytes(), out + i * head_dim());
}

namespace codec_internal {
namespace {
std::atomic<bool> g_force_generic{false};
std::atomic<bool> g_force_no_avx512{false};
std::atomic<bool> g_force_no_vbmi{false};
}  // namespace

void ForceGenericKernels(bool force) { g_force_generic.store(force); }
void ForceNoAvx512Kernels(bool force) { g_force_no_avx512.store(force); }
void ForceNoAvx512Vbmi(bool force) { g_force_no_vbmi.store(force); }

bool UseAvx512Vbmi() {
  if (g_force_no_vbmi.load() || !UseAvx512Kernels()) return false;
#if defined(TIERKV_CODEC_X86)
  const kernels::CpuFeatures& cpu = kernels::CpuHas();
  static const bool has = cpu.avx512bw && cpu.avx512vbmi && SimdCapFromEnv().avx512_vbmi;
  return has;
#else
  return false;
#endif
}

bool UseAvx512Kernels() {
  if (g_force_no_avx512.load() || !UseAvx2Kernels()) return false;
#if defined(TIERKV_CODEC_X86)
  static const bool has = kernels::CpuHas().avx512f && SimdCapFromEnv().level >= 2;
  return has;
#else
  return false;
#endif
}

bool UseAvx2Kernels() {
  if (g_force_generic.load()) return false;
#if defined(TIERKV_CODEC_X86)
  const kernels::CpuFeatures& cpu = kernels::CpuHas();
  static const bool has = cpu.avx2 && cpu.fma && cpu.f16c && SimdCapFromEnv().level >= 1;
  return has;
#else
  return false;
#endif
}

}  // namespace codec_internal

namespace {

using codec_internal::UseAvx2Kernels;

// The layouts' constants, SumLanes8 and (x86) the SIMD loops: kernels/kv_codec_simd.h.
using namespace kernels::kv_simd;  // NOLINT(build/namespaces): the codecs' own kernels


// ---- f16 ------------------------------------------------------------------------------

struct F16Kernels {
  // k, v: [n] fp16, any alignment (loaded with memcpy / loadu)
  float (*dot)(const float* q, const uint8_t* k, int n);
  void (*accumulate)(float w, const uint8_t* v, int n, float* acc);
};

float DotF16Generic(const float* q, const uint8_t* k, int n) {
  float lanes[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lanes[j] += q[i + j] * LoadHalf(k + 2 * (i + j));
  }
  for (; i < n; ++i) lanes[i & 7] += q[i] * LoadHalf(k + 2 * i);
  return SumLanes8(lanes);
}

void AccumulateF16Generic(float w, const uint8_t* v, int n, float* acc) {
  for (int i = 0; i < n; ++i) acc[i] += w * LoadHalf(v + 2 * i);
}

// AccumulateManyGroupRuns by pairs of runs while `pair(w, v, acc)` takes them (false:
// a pair's accumulators do not fit the registers, nothing done), the rest one run at a
// time through VectorCodec's loop. Per head the bits are those of one run at a time.
template <typename Pair>
void AccumulateRunsInPairs(const VectorCodec& c, bool pairs, Pair&& pair, const float* w, size_t w_stride, int heads,
                           int runs, const void* v_enc, size_t run_stride, size_t n, float* acc) {
  const auto* p = static_cast<const uint8_t*>(v_enc);
  const size_t hd = static_cast<size_t>(c.head_dim());
  int r = 0;
  for (; pairs && r + 2 <= runs; r += 2) {
    const size_t h0 = static_cast<size_t>(r) * static_cast<size_t>(heads);
    if (!pair(w + h0 * w_stride, p + static_cast<size_t>(r) * run_stride, acc + h0 * hd)) break;
  }
  const size_t h0 = static_cast<size_t>(r) * static_cast<size_t>(heads);
  c.VectorCodec::AccumulateManyGroupRuns(w + h0 * w_stride, w_stride, heads, runs - r,
                                         p + static_cast<size_t>(r) * run_stride, run_stride, n, acc + h0 * hd);
}

class F16Codec final : public VectorCodec {
 public:
  F16Codec(int head_dim, uint64_t seed)
      : VectorCodec(KvCodec::kF16, head_dim, seed, static_cast<size_t>(head_dim) * 2) {
#if defined(TIERKV_CODEC_X86)
    if (UseAvx2Kernels()) {
      k_ = {DotF16Avx2, AccumulateF16Avx2};
      avx2_ = true;
      tiles_avx512_ = codec_internal::UseAvx512Kernels();
      avx512_ = tiles_avx512_ && head_dim % 16 == 0;
      return;
    }
#endif
    k_ = {DotF16Generic, AccumulateF16Generic};
  }

  void Encode(const float* x, void* out) const override {
    uint16_t h[kMaxCodecHeadDim];
    FloatToHalfArray(x, h, head_dim());
    std::memcpy(out, h, vector_bytes());
  }
  void Decode(const void* in, float* out) const override {
    uint16_t h[kMaxCodecHeadDim];
    std::memcpy(h, in, vector_bytes());
    HalfToFloatArray(h, out, head_dim());
  }
  void PrepareQuery(const float* q, float* q_prep) const override {
    if (q_prep != q) std::memcpy(q_prep, q, sizeof(float) * head_dim());
  }
  float Dot(const float* q_prep, const void* k_enc) const override {
    return k_.dot(q_prep, static_cast<const uint8_t*>(k_enc), head_dim());
  }
  void Accumulate(float w, const void* v_enc, float* acc) const override {
    k_.accumulate(w, static_cast<const uint8_t*>(v_enc), head_dim(), acc);
  }
  void FinishOutput(const float* acc, float* out) const override {
    if (out != acc) std::memcpy(out, acc, sizeof(float) * head_dim());
  }
  void DotMany(const float* q_prep, const void* k_enc, size_t n, float* scores) const override {
    DotManyGroup(q_prep, 1, k_enc, n, scores, n);
  }
  void AccumulateMany(const float* w, const void* v_enc, size_t n, float* acc) const override {
    AccumulateManyGroup(w, n, 1, v_enc, n, acc);
  }
  void DotManyGroup(const float* q_prep, int heads, const void* k_enc, size_t n, float* scores,
                    size_t scores_stride) const override {
    const auto* p = static_cast<const uint8_t*>(k_enc);
#if defined(TIERKV_CODEC_X86)
    if (avx512_) {
      return DotF16GroupAvx512Any(q_prep, heads, p, n, vector_bytes(), head_dim() / 16, scores, scores_stride);
    }
#endif
    const size_t hd = static_cast<size_t>(head_dim());
    for (int h = 0; h < heads; ++h) {
      float* s = scores + static_cast<size_t>(h) * scores_stride;
      for (size_t i = 0; i < n; ++i) s[i] = k_.dot(q_prep + h * hd, p + i * vector_bytes(), head_dim());
    }
  }
  void AccumulateManyGroup(const float* w, size_t w_stride, int heads, const void* v_enc, size_t n,
                           float* acc) const override {
    const auto* p = static_cast<const uint8_t*>(v_enc);
#if defined(TIERKV_CODEC_X86)
    if (avx512_) {
      return AccumulateF16GroupAvx512(w, w_stride, heads, p, n, vector_bytes(), head_dim() / 16, acc);
    }
    if (avx2_ && head_dim() % 8 == 0) {
      return AccumulateF16GroupAvx2(w, w_stride, heads, p, n, vector_bytes(), head_dim() / 8, acc);
    }
#endif
    const size_t hd = static_cast<size_t>(head_dim());
    for (int h = 0; h < heads; ++h) {
      const float* wh = w + static_cast<size_t>(h) * w_stride;
      for (size_t i = 0; i < n; ++i) k_.accumulate(wh[i], p + i * vector_bytes(), head_dim(), acc + h * hd);
    }
  }
  // Pairs of runs (small groups of heads of head_dim 16 to 64, where one run alone waits
  // on FMA latency) with AVX-512.
  void AccumulateManyGroupRuns(const float* w, size_t w_stride, int heads, int runs, const void* v_enc,
                               size_t run_stride, size_t n, float* acc) const override {
#if defined(TIERKV_CODEC_X86)
    const auto pair = [&](const float* wp, const uint8_t* vp, float* ap) {
      return AccumulateF16PairAvx512(wp, w_stride, heads, vp, run_stride, n, vector_bytes(), head_dim() / 16, ap);
    };
    AccumulateRunsInPairs(*this, avx512_, pair, w, w_stride, heads, runs, v_enc, run_stride, n, acc);
#else
    VectorCodec::AccumulateManyGroupRuns(w, w_stride, heads, runs, v_enc, run_stride, n, acc);
#endif
  }
  bool KeyTiles(int block_tokens) const override {
    return head_dim() % 8 == 0 && block_tokens > 0 && block_tokens % kKeyTileTokens == 0;
  }
  void EncodeKeyInTile(const float* x, void* tile, int lane) const override {
    uint16_t h[kMaxCodecHeadDim];
    FloatToHalfArray(x, h, head_dim());
    auto* p = static_cast<uint8_t*>(tile) + 2 * static_cast<size_t>(lane);
    for (int d = 0; d < head_dim(); ++d) std::memcpy(p + 2 * static_cast<size_t>(kKeyTileTokens) * d, &h[d], 2);
  }
  void DecodeKeyInTile(const void* tile, int lane, float* out) const override {
    uint16_t h[kMaxCodecHeadDim];
    GatherTileKey(static_cast<const uint8_t*>(tile), lane, h);
    HalfToFloatArray(h, out, head_dim());
  }
  void DotManyGroupTiled(const float* q_prep, int heads, const void* k_tiles, size_t n, float* scores,
                         size_t scores_stride) const override {
    const auto* p = static_cast<const uint8_t*>(k_tiles);
    const size_t hd = static_cast<size_t>(head_dim());
#if defined(TIERKV_CODEC_X86)
    if (avx2_) {
      if (tiles_avx512_) return DotF16TiledAvx512(q_prep, heads, p, n, hd, scores, scores_stride);
      return DotF16TiledAvx2(q_prep, heads, p, n, hd, scores, scores_stride);
    }
#endif
    // Generic: each key gathered into a vector, then the one-vector dot.
    const size_t tile_bytes = 2 * static_cast<size_t>(kKeyTileTokens) * hd;
    uint16_t key[kMaxCodecHeadDim];
    for (size_t t = 0; t < n; ++t) {
      GatherTileKey(p + t / kKeyTileTokens * tile_bytes, static_cast<int>(t % kKeyTileTokens), key);
      for (int h = 0; h < heads; ++h) {
        scores[static_cast<size_t>(h) * scores_stride + t] =
            k_.dot(q_prep + static_cast<size_t>(h) * hd, reinterpret_cast<const uint8_t*>(key), head_dim());
      }
    }
  }
  const char* kernel_name() const override { return avx512_ ? "avx512" : avx2_ ? "avx2" : "generic"; }

 private:
  void GatherTileKey(const uint8_t* tile, int lane, uint16_t* h) const {
    const uint8_t* p = tile + 2 * static_cast<size_t>(lane);
    for (int d = 0; d < head_dim(); ++d) std::memcpy(&h[d], p + 2 * static_cast<size_t>(kKeyTileTokens) * d, 2);
  }

  F16Kernels k_;
  bool avx2_ = false;
  bool avx512_ = false;        // batched and grouped forms (head_dim % 16 == 0)
  bool tiles_avx512_ = false;  // the key-tile scores (any head_dim the tiles take)
};

// ---- q8_0 -----------------------------------------------------------------------------
// Block: {fp16 d; int8 qs[32]}, 34 bytes. As llama.cpp's quantize_row_q8_0_ref:
// d = amax / 127, qs = roundf(x / d) (round half away from zero; x * (1/d) exactly as
// llama.cpp computes it, so the bytes match).

void EncodeQ8Block(const float* x, uint8_t* out) {
  float amax = 0.0f;
  for (int j = 0; j < kQBlock; ++j) amax = std::fmax(amax, std::fabs(x[j]));  // NaN ignored
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t dh = FloatToHalf(d);
  std::memcpy(out, &dh, 2);
  for (int j = 0; j < kQBlock; ++j) {
    // Finite inputs give |x * id| <= 127; the clamp only keeps NaN/inf defined.
    float v = x[j] * id;
    v = v >= -127.0f ? v : -127.0f;  // also maps NaN to -127
    v = v <= 127.0f ? v : 127.0f;
    out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(v)));
  }
}

void DecodeQ8Generic(const uint8_t* in, int nb, float* out) {
  for (int b = 0; b < nb; ++b, in += kQ8Bytes, out += kQBlock) {
    const float d = LoadHalf(in);
    const auto* qs = reinterpret_cast<const int8_t*>(in + 2);
    for (int j = 0; j < kQBlock; ++j) out[j] = static_cast<float>(qs[j]) * d;
  }
}

void AccumulateQ8Generic(float w, const uint8_t* v, int nb, float* acc) {
  for (int b = 0; b < nb; ++b, v += kQ8Bytes, acc += kQBlock) {
    const float wd = w * LoadHalf(v);
    const auto* qs = reinterpret_cast<const int8_t*>(v + 2);
    for (int j = 0; j < kQBlock; ++j) acc[j] += wd * static_cast<float>(qs[j]);
  }
}

// ---- q4_0 -----------------------------------------------------------------------------
// Block: {fp16 d; uint8 qs[16]}, 18 bytes. As llama.cpp's quantize_row_q4_0_ref:
// d = max / -8 with max the signed value of largest magnitude (so it maps to nibble 0),
// nibble = min(15, (int)(x / d + 8.5)); element j in the low nibble of qs[j], element
// j + 16 in the high nibble; value = (nibble - 8) * d.

uint8_t Q4Nibble(float x_times_id) {
  float v = x_times_id + 8.5f;  // in [0.5, 16.5] for finite inputs
  v = v >= 0.0f ? v : 0.0f;     // also maps NaN to 0
  v = v <= 15.0f ? v : 15.0f;   // min(15, .) after truncation == truncation after this
  return static_cast<uint8_t>(static_cast<int>(v));
}

void EncodeQ4Block(const float* x, uint8_t* out) {
  float amax = 0.0f;
  float max = 0.0f;
  for (int j = 0; j < kQBlock; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t dh = FloatToHalf(d);
  std::memcpy(out, &dh, 2);
  for (int j = 0; j < kQBlock / 2; ++j) {
    out[2 + j] = static_cast<uint8_t>(Q4Nibble(x[j] * id) | (Q4Nibble(x[j + 16] * id) << 4));
  }
}

void DecodeQ4Generic(const uint8_t* in, int nb, float* out) {
  for (int b = 0; b < nb; ++b, in += kQ4Bytes, out += kQBlock) {
    const float d = LoadHalf(in);
    const uint8_t* qs = in + 2;
    for (int j = 0; j < 16; ++j) {
      out[j] = static_cast<float>((qs[j] & 0x0f) - 8) * d;
      out[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
}

void AccumulateQ4Generic(float w, const uint8_t* v, int nb, float* acc) {
  for (int b = 0; b < nb; ++b, v += kQ4Bytes, acc += kQBlock) {
    const float wd = w * LoadHalf(v);
    const uint8_t* qs = v + 2;
    for (int j = 0; j < 16; ++j) {
      acc[j] += wd * static_cast<float>((qs[j] & 0x0f) - 8);
      acc[j + 16] += wd * static_cast<float>((qs[j] >> 4) - 8);
    }
  }
}

// ---- q8_0 / q4_0 codec ----------------------------------------------------------------
//
// Scores are integer dot products against the query quantized to q8_0 (as llama.cpp
// quantizes it for these K types; kernels/kv_codec_simd.h has the prepared query's layout
// and the key tiles'): per block, isum = sum_i q_i * k_i exactly, then score = fma(d_k * d_q,
// float(isum), score), block after block. Every form (one vector, many, grouped,
// tiled, generic or SIMD) gives these bits.

using kernels::kv_simd::kQ4TileBlockBytes;
using kernels::kv_simd::kQ8TileBlockBytes;
using kernels::kv_simd::kQPrepBlockBytes;
using kernels::kv_simd::kQPrepInt8;
using kernels::kv_simd::kQPrepScale;
using kernels::kv_simd::kQPrepSum;
using kernels::kv_simd::kQPrepUint8;
using kernels::kv_simd::kQTileLanes;
using kernels::kv_simd::kQTileScaleBytes;
using kernels::kv_simd::QTilePayloadOffset;

struct BlockKernels {
  void (*encode_block)(const float* x, uint8_t* out);
  void (*encode_q8_block)(const float* x, uint8_t* out);  // the query's quantizer
  void (*decode)(const uint8_t* in, int nb, float* out);
  void (*accumulate)(float w, const uint8_t* v, int nb, float* acc);
  // The same over n vectors of `stride` bytes, looped inside (one call per batch).
  void (*accumulate_many)(const float* w, const uint8_t* v, size_t n, size_t stride, int nb, float* acc);
};

template <void (*kAcc)(float, const uint8_t*, int, float*)>
void AccumulateManyLoop(const float* w, const uint8_t* v, size_t n, size_t stride, int nb, float* acc) {
  for (size_t i = 0; i < n; ++i) kAcc(w[i], v + i * stride, nb, acc);
}

float LoadF32(const uint8_t* p) {
  float x;
  std::memcpy(&x, p, 4);
  return x;
}

// The score after one more block: fma(d_k * d_q, float(isum), score). One rounding
// (fma), explicitly: the SIMD kernels' multiply-add would otherwise be contracted or not
// at the compiler's choice.
inline float AddBlockTerm(float score, float d_k, const uint8_t* q_block, int32_t isum) {
  return std::fma(d_k * LoadF32(q_block + kQPrepScale), static_cast<float>(isum), score);
}

// Integer sums of a prepared query block against a stored block's payload.
int32_t Q8BlockSum(const uint8_t* q_block, const uint8_t* payload) {
  const auto* q = reinterpret_cast<const int8_t*>(q_block + kQPrepInt8);
  const auto* k = reinterpret_cast<const int8_t*>(payload);
  int32_t s = 0;
  for (int i = 0; i < kQBlock; ++i) s += static_cast<int32_t>(q[i]) * k[i];
  return s;
}
int32_t Q4BlockSum(const uint8_t* q_block, const uint8_t* payload) {
  const auto* q = reinterpret_cast<const int8_t*>(q_block + kQPrepInt8);
  int32_t s = 0;
  for (int i = 0; i < kQBlock / 2; ++i) {
    s += static_cast<int32_t>(q[i]) * ((payload[i] & 0x0f) - 8);
    s += static_cast<int32_t>(q[i + 16]) * ((payload[i] >> 4) - 8);
  }
  return s;
}

class BlockCodec final : public VectorCodec {
 public:
  BlockCodec(KvCodec codec, int head_dim, uint64_t seed)
      : VectorCodec(codec, head_dim, seed,
                    static_cast<size_t>(head_dim / kQBlock) *
                        (codec == KvCodec::kQ8_0 ? kQ8Bytes : kQ4Bytes)),
        nb_(head_dim / kQBlock),
        q8_(codec == KvCodec::kQ8_0),
        block_bytes_(q8_ ? kQ8Bytes : kQ4Bytes),
        tile_block_bytes_(q8_ ? kQ8TileBlockBytes : kQ4TileBlockBytes),
        payload_bytes_(block_bytes_ - 2) {
#if defined(TIERKV_CODEC_X86)
    if (UseAvx2Kernels()) {
      avx2_ = true;
      k_ = q8_ ? BlockKernels{EncodeQ8BlockAvx2, EncodeQ8BlockAvx2, DecodeQ8Avx2, AccumulateQ8Avx2,
                              AccumulateManyQ8Avx2}
               : BlockKernels{EncodeQ4Block, EncodeQ8BlockAvx2, DecodeQ4Avx2, AccumulateQ4Avx2,
                              AccumulateManyQ4Avx2};
      avx512_ = codec_internal::UseAvx512Kernels();
      const kernels::CpuFeatures& cpu = kernels::CpuHas();
      vnni_ = avx512_ && cpu.avx512bw && cpu.avx512vnni;
      return;
    }
#endif
    k_ = q8_ ? BlockKernels{EncodeQ8Block, EncodeQ8Block, DecodeQ8Generic, AccumulateQ8Generic,
                            AccumulateManyLoop<AccumulateQ8Generic>}
             : BlockKernels{EncodeQ4Block, EncodeQ8Block, DecodeQ4Generic, AccumulateQ4Generic,
                            AccumulateManyLoop<AccumulateQ4Generic>};
  }

  void Encode(const float* x, void* out) const override {
    auto* p = static_cast<uint8_t*>(out);
    for (int b = 0; b < nb_; ++b) k_.encode_block(x + b * kQBlock, p + b * block_bytes_);
  }
  void Decode(const void* in, float* out) const override {
    k_.decode(static_cast<const uint8_t*>(in), nb_, out);
  }
  // q8_0 blocks of the query, each in its own 32 floats' room (kQPrepBlockBytes): the
  // block is read whole before its room is written, so q_prep may equal q.
  void PrepareQuery(const float* q, float* q_prep) const override {
    auto* out = reinterpret_cast<uint8_t*>(q_prep);
    for (int b = 0; b < nb_; ++b) {
      uint8_t enc[kQ8Bytes];
      k_.encode_q8_block(q + b * kQBlock, enc);
      uint8_t slot[kQPrepBlockBytes] = {};
      const float d = LoadHalf(enc);
      std::memcpy(slot + kQPrepScale, &d, 4);
      int32_t sum = 0;
      for (int i = 0; i < kQBlock; ++i) {
        const auto v = static_cast<int8_t>(enc[2 + i]);
        sum += v;
        slot[kQPrepInt8 + i] = enc[2 + i];
        slot[kQPrepUint8 + i] = static_cast<uint8_t>(v + 128);
      }
      std::memcpy(slot + kQPrepSum, &sum, 4);
      std::memcpy(out + static_cast<size_t>(b) * kQPrepBlockBytes, slot, kQPrepBlockBytes);
    }
  }
  float Dot(const float* q_prep, const void* k_enc) const override {
    const auto* qp = reinterpret_cast<const uint8_t*>(q_prep);
    const auto* k = static_cast<const uint8_t*>(k_enc);
    float score = 0.0f;
    for (int b = 0; b < nb_; ++b, k += block_bytes_) {
      const uint8_t* qb = qp + static_cast<size_t>(b) * kQPrepBlockBytes;
      score = AddBlockTerm(score, LoadHalf(k), qb, q8_ ? Q8BlockSum(qb, k + 2) : Q4BlockSum(qb, k + 2));
    }
    return score;
  }
  void Accumulate(float w, const void* v_enc, float* acc) const override {
    k_.accumulate(w, static_cast<const uint8_t*>(v_enc), nb_, acc);
  }
  void FinishOutput(const float* acc, float* out) const override {
    if (out != acc) std::memcpy(out, acc, sizeof(float) * head_dim());
  }
  void DotMany(const float* q_prep, const void* k_enc, size_t n, float* scores) const override {
    const auto* k = static_cast<const uint8_t*>(k_enc);
    for (size_t i = 0; i < n; ++i) scores[i] = Dot(q_prep, k + i * vector_bytes());
  }
  void AccumulateMany(const float* w, const void* v_enc, size_t n, float* acc) const override {
    k_.accumulate_many(w, static_cast<const uint8_t*>(v_enc), n, vector_bytes(), nb_, acc);
  }
  void AccumulateManyGroup(const float* w, size_t w_stride, int heads, const void* v_enc, size_t n,
                           float* acc) const override {
#if defined(TIERKV_CODEC_X86)
    if (avx512_) {
      const auto* v = static_cast<const uint8_t*>(v_enc);
      if (q8_) return kernels::kv_simd::AccumulateQ8GroupAvx512(w, w_stride, heads, v, n, vector_bytes(), nb_, acc);
      return kernels::kv_simd::AccumulateQ4GroupAvx512(w, w_stride, heads, v, n, vector_bytes(), nb_, acc);
    }
    if (avx2_) {
      const auto* v = static_cast<const uint8_t*>(v_enc);
      if (q8_) return kernels::kv_simd::AccumulateQ8GroupAvx2(w, w_stride, heads, v, n, vector_bytes(), nb_, acc);
      return kernels::kv_simd::AccumulateQ4GroupAvx2(w, w_stride, heads, v, n, vector_bytes(), nb_, acc);
    }
#endif
    VectorCodec::AccumulateManyGroup(w, w_stride, heads, v_enc, n, acc);
  }
  void AccumulateManyGroupRuns(const float* w, size_t w_stride, int heads, int runs, const void* v_enc,
                               size_t run_stride, size_t n, float* acc) const override {
#if defined(TIERKV_CODEC_X86)
    const auto pair = [&](const float* wp, const uint8_t* vp, float* ap) {
      return kernels::kv_simd::AccumulatePairAvx512(q8_, wp, w_stride, heads, vp, run_stride, n, vector_bytes(), nb_,
                                                    ap);
    };
    AccumulateRunsInPairs(*this, avx512_, pair, w, w_stride, heads, runs, v_enc, run_stride, n, acc);
#else
    VectorCodec::AccumulateManyGroupRuns(w, w_stride, heads, runs, v_enc, run_stride, n, acc);
#endif
  }
  void DecodeMany(const void* in, size_t n, float* out) const override {
    k_.decode(static_cast<const uint8_t*>(in), static_cast<int>(n) * nb_, out);
  }

  // Key tiles (layout: kernels/kv_codec_simd.h): 16 keys in 16 vectors' bytes.
  bool KeyTiles(int block_tokens) const override {
    return block_tokens > 0 && block_tokens % kKeyTileTokens == 0;
  }
  void EncodeKeyInTile(const float* x, void* tile, int lane) const override {
    uint8_t enc[kMaxCodecHeadDim / kQBlock * kQ8Bytes];
    Encode(x, enc);
    auto* t = static_cast<uint8_t*>(tile);
    for (int b = 0; b < nb_; ++b) {
      uint8_t* blk = t + static_cast<size_t>(b) * tile_block_bytes_;
      const uint8_t* e = enc + static_cast<size_t>(b) * block_bytes_;
      std::memcpy(blk + 2 * lane, e, 2);
      for (int m = 0; m < payload_bytes_; ++m) blk[QTilePayloadOffset(m, lane)] = e[2 + m];
    }
  }
  void DecodeKeyInTile(const void* tile, int lane, float* out) const override {
    uint8_t enc[kMaxCodecHeadDim / kQBlock * kQ8Bytes];
    GatherTileKey(static_cast<const uint8_t*>(tile), lane, enc);
    Decode(enc, out);
  }
  void DotManyGroupTiled(const float* q_prep, int heads, const void* k_tiles, size_t n, float* scores,
                         size_t scores_stride) const override {
    const auto* p = static_cast<const uint8_t*>(k_tiles);
#if defined(TIERKV_CODEC_X86)
    if (vnni_) {
      if (q8_) return kernels::kv_simd::DotQ8TiledAvx512Vnni(q_prep, heads, nb_, p, n, scores, scores_stride);
      return kernels::kv_simd::DotQ4TiledAvx512Vnni(q_prep, heads, nb_, p, n, scores, scores_stride);
    }
    if (avx2_) {
      if (q8_) return kernels::kv_simd::DotQ8TiledAvx2(q_prep, heads, nb_, p, n, scores, scores_stride);
      return kernels::kv_simd::DotQ4TiledAvx2(q_prep, heads, nb_, p, n, scores, scores_stride);
    }
#endif
    // Generic: each key gathered into a vector, then the one-vector dot.
    const size_t tile_bytes = static_cast<size_t>(kQTileLanes) * vector_bytes();
    uint8_t key[kMaxCodecHeadDim / kQBlock * kQ8Bytes];
    const size_t hd = static_cast<size_t>(head_dim());
    for (size_t t = 0; t < n; ++t) {
      GatherTileKey(p + t / kQTileLanes * tile_bytes, static_cast<int>(t % kQTileLanes), key);
      for (int h = 0; h < heads; ++h) {
        scores[static_cast<size_t>(h) * scores_stride + t] = Dot(q_prep + static_cast<size_t>(h) * hd, key);
      }
    }
  }
  const char* kernel_name() const override { return vnni_ ? "avx512-vnni" : avx2_ ? "avx2" : "generic"; }

 private:
  // Key `lane` of the tile back into the vector layout.
  void GatherTileKey(const uint8_t* tile, int lane, uint8_t* enc) const {
    for (int b = 0; b < nb_; ++b) {
      const uint8_t* blk = tile + static_cast<size_t>(b) * tile_block_bytes_;
      uint8_t* e = enc + static_cast<size_t>(b) * block_bytes_;
      std::memcpy(e, blk + 2 * lane, 2);
      for (int m = 0; m < payload_bytes_; ++m) e[2 + m] = blk[QTilePayloadOffset(m, lane)];
    }
  }

  int nb_;                // blocks per vector
  bool q8_;               // q8_0, else q4_0
  int block_bytes_;       // 34 or 18
  int tile_block_bytes_;  // 16 blocks' bytes: 544 or 288
  int payload_bytes_;     // 32 or 16
  BlockKernels k_;
  bool avx2_ = false;
  bool avx512_ = false;  // grouped value sums
  bool vnni_ = false;    // tiled scores (AVX-512 BW + VNNI)
};

}  // namespace

Result<std::unique_ptr<VectorCodec>> VectorCodec::Create(KvCodec codec, int head_dim,
                                                         uint64_t seed) {
  const std::string what = std::string("codec ") + KvCodecName(codec) + ", head_dim " +
                           std::to_string(head_dim);
  if (head_dim < 1 || head_dim > kMaxCodecHeadDim) {
    return Status::InvalidArgument(what + ": head_dim must be in [1, " +
                                   std::to_string(kMaxCodecHeadDim) + "]");
  }
  switch (codec) {
    case KvCodec::kF16:
      return std::unique_ptr<VectorCodec>(new F16Codec(head_dim, seed));
    case KvCodec::kQ8_0:
    case KvCodec::kQ4_0:
      if (head_dim % kQBlock != 0) {
        return Status::InvalidArgument(what + ": head_dim must be a multiple of 32 (the " +
                                       KvCodecName(codec) + " block size)");
      }
      return std::unique_ptr<VectorCodec>(new BlockCodec(codec, head_dim, seed));
    case KvCodec::kTq4:
    case KvCodec::kTq3:
      return codec_internal::CreateTqCodec(codec, head_dim, seed, codec_internal::TqOptions{});
  }
  return Status::InvalidArgument("unknown KV codec value " +
                                 std::to_string(static_cast<int>(codec)));
}

}  // namespace tierkv
