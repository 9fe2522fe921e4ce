// kvcache/codec.cc
//
// Codec names, the VectorCodec base, Create, and the llama.cpp-compatible codecs f16,
// q8_0 and q4_0. The tq codecs are in codec_tq.cc, the quality measurement in
// codec_quality.cc.
//
// Each codec picks its inner loops once, at construction: AVX2+FMA+F16C versions
// (target attributes, chosen with __builtin_cpu_supports; the build has no -march
// flags) or generic ones written so the compiler can vectorise them at the baseline ISA.
// Float sums use fixed lane counts, so results never depend on the compiler's choices.
#include "kvcache/codec.h"

#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TIERKV_CODEC_X86 1
#endif

#include "memory/half.h"

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
  for (size_t i = 0; i < n; ++i) scores[i] = Dot(q_prep, p + i * vector_bytes_);
}

void VectorCodec::AccumulateMany(const float* w, const void* v_enc, size_t n,
                                 float* acc) const {
  const auto* p = static_cast<const uint8_t*>(v_enc);
  for (size_t i = 0; i < n; ++i) Accumulate(w[i], p + i * vector_bytes_, acc);
}

void VectorCodec::EncodeMany(const float* x, size_t n, void* out) const {
  auto* p = static_cast<uint8_t*>(out);
  for (size_t i = 0; i < n; ++i) Encode(x + i * head_dim_, p + i * vector_bytes_);
}

void VectorCodec::DecodeMany(const void* in, size_t n, float* out) const {
  const auto* p = static_cast<const uint8_t*>(in);
  for (size_t i = 0; i < n; ++i) Decode(p + i * vector_bytes_, out + i * head_dim_);
}

namespace codec_internal {
namespace {
std::atomic<bool> g_force_generic{false};
}  // namespace

void ForceGenericKernels(bool force) { g_force_generic.store(force); }

bool UseAvx2Kernels() {
  if (g_force_generic.load()) return false;
#if defined(TIERKV_CODEC_X86)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          half_internal::CpuHasF16c();
  return has;
#else
  return false;
#endif
}

}  // namespace codec_internal

namespace {

using codec_internal::UseAvx2Kernels;

constexpr int kQBlock = 32;    // values per q8_0 / q4_0 block
constexpr int kQ8Bytes = 34;   // fp16 d + 32 x int8
constexpr int kQ4Bytes = 18;   // fp16 d + 16 bytes of nibbles

// Fixed-order sum of 8 lanes (pairwise, like an 8-wide vector reduction).
inline float SumLanes8(const float* l) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

#if defined(TIERKV_CODEC_X86)
#define TIERKV_AVX2 __attribute__((target("avx2,fma,f16c")))

TIERKV_AVX2 inline float HorizontalSum(__m256 v) {
  // Same order as SumLanes8: (l0+l4, l1+l5, l2+l6, l3+l7), then pairs.
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));   // (l0+l4)+(l2+l6), (l1+l5)+(l3+l7)
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

TIERKV_AVX2 inline __m256 LoadI8AsF32(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

TIERKV_AVX2 float DotF16Avx2(const float* q, const uint8_t* k, int n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i),
                         _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k + 2 * i))), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8),
                         _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k + 2 * i + 16))), a1);
  }
  for (; i + 8 <= n; i += 8) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i),
                         _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k + 2 * i))), a0);
  }
  float s = HorizontalSum(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) s += q[i] * LoadHalf(k + 2 * i);
  return s;
}

TIERKV_AVX2 void AccumulateF16Avx2(float w, const uint8_t* v, int n, float* acc) {
  const __m256 wv = _mm256_set1_ps(w);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + 2 * i)));
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(wv, x, _mm256_loadu_ps(acc + i)));
  }
  for (; i < n; ++i) acc[i] += w * LoadHalf(v + 2 * i);
}

TIERKV_AVX2 void DecodeQ8Avx2(const uint8_t* in, int nb, float* out) {
  for (int b = 0; b < nb; ++b, in += kQ8Bytes, out += kQBlock) {
    const __m256 d = _mm256_set1_ps(LoadHalf(in));
    const auto* qs = reinterpret_cast<const int8_t*>(in + 2);
    for (int i = 0; i < kQBlock; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(LoadI8AsF32(qs + i), d));
  }
}

TIERKV_AVX2 float DotQ8Avx2(const float* q, const uint8_t* k, int nb) {
  __m256 total = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b, k += kQ8Bytes, q += kQBlock) {
    const auto* qs = reinterpret_cast<const int8_t*>(k + 2);
    __m256 s0 = _mm256_mul_ps(_mm256_loadu_ps(q), LoadI8AsF32(qs));
    __m256 s1 = _mm256_mul_ps(_mm256_loadu_ps(q + 8), LoadI8AsF32(qs + 8));
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + 16), LoadI8AsF32(qs + 16), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + 24), LoadI8AsF32(qs + 24), s1);
    total = _mm256_fmadd_ps(_mm256_add_ps(s0, s1), _mm256_set1_ps(LoadHalf(k)), total);
  }
  return HorizontalSum(total);
}

TIERKV_AVX2 void AccumulateQ8Avx2(float w, const uint8_t* v, int nb, float* acc) {
  for (int b = 0; b < nb; ++b, v += kQ8Bytes, acc += kQBlock) {
    const __m256 wd = _mm256_set1_ps(w * LoadHalf(v));
    const auto* qs = reinterpret_cast<const int8_t*>(v + 2);
    for (int i = 0; i < kQBlock; i += 8) {
      _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(wd, LoadI8AsF32(qs + i), _mm256_loadu_ps(acc + i)));
    }
  }
}

// EncodeQ8Block, bit for bit: vmaxps(|x|, acc) ignores a NaN |x| as fmaxf does;
// round half away from zero as trunc + (|frac| >= 0.5), exact for |v| <= 127.
TIERKV_AVX2 void EncodeQ8BlockAvx2(const float* x, uint8_t* out) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 v[4];
  __m256 amax8 = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    amax8 = _mm256_max_ps(_mm256_and_ps(v[i], abs_mask), amax8);
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  const float amax = _mm_cvtss_f32(m4);
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t dh = FloatToHalf(d);
  std::memcpy(out, &dh, 2);
  const __m256 idv = _mm256_set1_ps(id);
  const __m256 one = _mm256_set1_ps(1.0f);
  __m256i q[4];
  for (int i = 0; i < 4; ++i) {
    __m256 t = _mm256_mul_ps(v[i], idv);
    t = _mm256_max_ps(t, _mm256_set1_ps(-127.0f));  // NaN -> -127 (second operand)
    t = _mm256_min_ps(t, _mm256_set1_ps(127.0f));
    const __m256 tr = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_sub_ps(t, tr);
    const __m256 up = _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ), one);
    const __m256 down = _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(-0.5f), _CMP_LE_OQ), one);
    q[i] = _mm256_cvttps_epi32(_mm256_sub_ps(_mm256_add_ps(tr, up), down));
  }
  // int32 -> int8 with the packs' lane interleave undone.
  const __m256i p16a = _mm256_packs_epi32(q[0], q[1]);
  const __m256i p16b = _mm256_packs_epi32(q[2], q[3]);
  const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
  const __m256i ordered = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2), ordered);
}

// The 32 values of a q4_0 block as (nibble - 8), in element order, as 4 x 8 floats.
struct Q4Unpacked { __m256 v[4]; };
TIERKV_AVX2 inline Q4Unpacked UnpackQ4(const uint8_t* qs) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i eight = _mm_set1_epi8(8);
  const __m128i lo = _mm_sub_epi8(_mm_and_si128(bytes, mask), eight);                      // 0..15
  const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask), eight);  // 16..31
  Q4Unpacked u;
  u.v[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
  u.v[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
  u.v[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
  u.v[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
  return u;
}

TIERKV_AVX2 void DecodeQ4Avx2(const uint8_t* in, int nb, float* out) {
  for (int b = 0; b < nb; ++b, in += kQ4Bytes, out += kQBlock) {
    const __m256 d = _mm256_set1_ps(LoadHalf(in));
    const Q4Unpacked u = UnpackQ4(in + 2);
    for (int i = 0; i < 4; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(u.v[i], d));
  }
}

TIERKV_AVX2 float DotQ4Avx2(const float* q, const uint8_t* k, int nb) {
  __m256 total = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b, k += kQ4Bytes, q += kQBlock) {
    const Q4Unpacked u = UnpackQ4(k + 2);
    __m256 s0 = _mm256_mul_ps(_mm256_loadu_ps(q), u.v[0]);
    __m256 s1 = _mm256_mul_ps(_mm256_loadu_ps(q + 8), u.v[1]);
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + 16), u.v[2], s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + 24), u.v[3], s1);
    total = _mm256_fmadd_ps(_mm256_add_ps(s0, s1), _mm256_set1_ps(LoadHalf(k)), total);
  }
  return HorizontalSum(total);
}

TIERKV_AVX2 void AccumulateQ4Avx2(float w, const uint8_t* v, int nb, float* acc) {
  for (int b = 0; b < nb; ++b, v += kQ4Bytes, acc += kQBlock) {
    const __m256 wd = _mm256_set1_ps(w * LoadHalf(v));
    const Q4Unpacked u = UnpackQ4(v + 2);
    for (int i = 0; i < 4; ++i) {
      _mm256_storeu_ps(acc + 8 * i, _mm256_fmadd_ps(wd, u.v[i], _mm256_loadu_ps(acc + 8 * i)));
    }
  }
}
#endif  // TIERKV_CODEC_X86

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
    const auto* p = static_cast<const uint8_t*>(k_enc);
    for (size_t i = 0; i < n; ++i) scores[i] = k_.dot(q_prep, p + i * vector_bytes(), head_dim());
  }
  void AccumulateMany(const float* w, const void* v_enc, size_t n, float* acc) const override {
    const auto* p = static_cast<const uint8_t*>(v_enc);
    for (size_t i = 0; i < n; ++i) k_.accumulate(w[i], p + i * vector_bytes(), head_dim(), acc);
  }
  const char* kernel_name() const override { return avx2_ ? "avx2" : "generic"; }

 private:
  F16Kernels k_;
  bool avx2_ = false;
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
};

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
      k_ = q8 ? BlockKernels{EncodeQ8BlockAvx2, DecodeQ8Avx2,
                             DotQ8Avx2, AccumulateQ8Avx2}
              : BlockKernels{EncodeQ4Block, DecodeQ4Avx2,
                             DotQ4Avx2, AccumulateQ4Avx2};
      return;
    }
#endif
    k_ = q8 ? BlockKernels{EncodeQ8Block, DecodeQ8Generic, DotQ8Generic, AccumulateQ8Generic}
            : BlockKernels{EncodeQ4Block, DecodeQ4Generic, DotQ4Generic, AccumulateQ4Generic};
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
    const auto* p = static_cast<const uint8_t*>(k_enc);
    for (size_t i = 0; i < n; ++i) scores[i] = k_.dot(q_prep, p + i * vector_bytes(), nb_);
  }
  void AccumulateMany(const float* w, const void* v_enc, size_t n, float* acc) const override {
    const auto* p = static_cast<const uint8_t*>(v_enc);
    for (size_t i = 0; i < n; ++i) k_.accumulate(w[i], p + i * vector_bytes(), nb_, acc);
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
