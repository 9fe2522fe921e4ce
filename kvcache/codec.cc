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
}  // namespace

void ForceGenericKernels(bool force) { g_force_generic.store(force); }
void ForceNoAvx512Kernels(bool force) { g_force_no_avx512.store(force); }

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
  void AccumulateManyGroupRuns(const float* w, size_t w_stride, int heads, int runs, const void* v_enc,
                               size_t run_stride, size_t n, float* acc) const override {
    const auto* p = static_cast<const uint8_t*>(v_enc);
    int r = 0;
#if defined(TIERKV_CODEC_X86)
    // Pairs of runs while a pair's accumulators fit the registers (small groups of heads
    // of head_dim 16 to 64, where one run alone waits on FMA latency); the rest one by one.
    const size_t hd = static_cast<size_t>(head_dim());
    for (; avx512_ && r + 2 <= runs; r += 2) {
      const size_t h0 = static_cast<size_t>(r) * static_cast<size_t>(heads);
      if (!AccumulateF16PairAvx512(w + h0 * w_stride, w_stride, heads, p + static_cast<size_t>(r) * run_stride,
                                   run_stride, n, vector_bytes(), head_dim() / 16, acc + h0 * hd)) {
        break;
      }
    }
#endif
    const size_t h0 = static_cast<size_t>(r) * static_cast<size_t>(heads);
    VectorCodec::AccumulateManyGroupRuns(w + h0 * w_stride, w_stride, heads, runs - r,
                                         p + static_cast<size_t>(r) * run_stride, run_stride, n,
                                         acc + h0 * static_cast<size_t>(head_dim()));
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

float DotQ8Generic(const float* q, const uint8_t* k, int nb) {
  float total = 0.0f;
  for (int b = 0; b < nb; ++b, k += kQ8Bytes, q += kQBlock) {
    const auto* qs = reinterpret_cast<const int8_t*>(k + 2);
    float lanes[8] = {};
    for (int i = 0; i < kQBlock; i += 8) {
      for (int j = 0; j < 8; ++j) lanes[j] += q[i + j] * static_cast<float>(qs[i + j]);
    }
    total += SumLanes8(lanes) * LoadHalf(k);
  }
  return total;
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

float DotQ4Generic(const float* q, const uint8_t* k, int nb) {
  float total = 0.0f;
  for (int b = 0; b < nb; ++b, k += kQ4Bytes, q += kQBlock) {
    const uint8_t* qs = k + 2;
    float lanes[16] = {};
    for (int j = 0; j < 16; ++j) {
      lanes[j] += q[j] * static_cast<float>((qs[j] & 0x0f) - 8);
      lanes[j] += q[j + 16] * static_cast<float>((qs[j] >> 4) - 8);
    }
    float lanes8[8];
    for (int j = 0; j < 8; ++j) lanes8[j] = lanes[j] + lanes[j + 8];
    total += SumLanes8(lanes8) * LoadHalf(k);
  }
  return total;
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

struct BlockKernels {
  void (*encode_block)(const float* x, uint8_t* out);
  void (*decode)(const uint8_t* in, int nb, float* out);
  float (*dot)(const float* q, const uint8_t* k, int nb);
  void (*accumulate)(float w, const uint8_t* v, int nb, float* acc);
  // The same over n vectors of `stride` bytes, looped inside (one call per batch).
  void (*dot_many)(const float* q, const uint8_t* k, size_t n, size_t stride, int nb, float* scores);
  void (*accumulate_many)(const float* w, const uint8_t* v, size_t n, size_t stride, int nb, float* acc);
};

// The per-vector kernel inlined into a loop over the vectors: the same code per vector,
// so the same bits, without a call per vector.
template <float (*kDot)(const float*, const uint8_t*, int)>
void DotManyLoop(const float* q, const uint8_t* k, size_t n, size_t stride, int nb, float* scores) {
  for (size_t i = 0; i < n; ++i) scores[i] = kDot(q, k + i * stride, nb);
}
template <void (*kAcc)(float, const uint8_t*, int, float*)>
void AccumulateManyLoop(const float* w, const uint8_t* v, size_t n, size_t stride, int nb, float* acc) {
  for (size_t i = 0; i < n; ++i) kAcc(w[i], v + i * stride, nb, acc);
}

class BlockCodec final : public VectorCodec {
 public:
  BlockCodec(KvCodec codec, int head_dim, uint64_t seed)
      : VectorCodec(codec, head_dim, seed,
                    static_cast<size_t>(head_dim / kQBlock) *
                        (codec == KvCodec::kQ8_0 ? kQ8Bytes : kQ4Bytes)),
        nb_(head_dim / kQBlock),
        block_bytes_(codec == KvCodec::kQ8_0 ? kQ8Bytes : kQ4Bytes) {
    const bool q8 = codec == KvCodec::kQ8_0;
#if defined(TIERKV_CODEC_X86)
    if (UseAvx2Kernels()) {
      avx2_ = true;
      k_ = q8 ? BlockKernels{EncodeQ8BlockAvx2, DecodeQ8Avx2, DotQ8Avx2, AccumulateQ8Avx2,
                             DotManyQ8Avx2, AccumulateManyQ8Avx2}
              : BlockKernels{EncodeQ4Block, DecodeQ4Avx2, DotQ4Avx2, AccumulateQ4Avx2,
                             DotManyQ4Avx2, AccumulateManyQ4Avx2};
      return;
    }
#endif
    k_ = q8 ? BlockKernels{EncodeQ8Block, DecodeQ8Generic, DotQ8Generic, AccumulateQ8Generic,
                           DotManyLoop<DotQ8Generic>, AccumulateManyLoop<AccumulateQ8Generic>}
            : BlockKernels{EncodeQ4Block, DecodeQ4Generic, DotQ4Generic, AccumulateQ4Generic,
                           DotManyLoop<DotQ4Generic>, AccumulateManyLoop<AccumulateQ4Generic>};
  }

  void Encode(const float* x, void* out) const override {
    auto* p = static_cast<uint8_t*>(out);
    for (int b = 0; b < nb_; ++b) k_.encode_block(x + b * kQBlock, p + b * block_bytes_);
  }
  void Decode(const void* in, float* out) const override {
    k_.decode(static_cast<const uint8_t*>(in), nb_, out);
  }
  void PrepareQuery(const float* q, float* q_prep) const override {
    if (q_prep != q) std::memcpy(q_prep, q, sizeof(float) * head_dim());
  }
  float Dot(const float* q_prep, const void* k_enc) const override {
    return k_.dot(q_prep, static_cast<const uint8_t*>(k_enc), nb_);
  }
  void Accumulate(float w, const void* v_enc, float* acc) const override {
    k_.accumulate(w, static_cast<const uint8_t*>(v_enc), nb_, acc);
  }
  void FinishOutput(const float* acc, float* out) const override {
    if (out != acc) std::memcpy(out, acc, sizeof(float) * head_dim());
  }
  void DotMany(const float* q_prep, const void* k_enc, size_t n, float* scores) const override {
    k_.dot_many(q_prep, static_cast<const uint8_t*>(k_enc), n, vector_bytes(), nb_, scores);
  }
  void AccumulateMany(const float* w, const void* v_enc, size_t n, float* acc) const override {
    k_.accumulate_many(w, static_cast<const uint8_t*>(v_enc), n, vector_bytes(), nb_, acc);
  }
  void DecodeMany(const void* in, size_t n, float* out) const override {
    k_.decode(static_cast<const uint8_t*>(in), static_cast<int>(n) * nb_, out);
  }
  const char* kernel_name() const override { return avx2_ ? "avx2" : "generic"; }

 private:
  int nb_;           // blocks per vector
  int block_bytes_;  // 34 or 18
  BlockKernels k_;
  bool avx2_ = false;
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
