// kvcache/codec_tq.cc
//
// tq4 / tq3: TurboQuant-style codecs (DESIGN.md, "Codecs"; docs/codecs.md).
// Per group g of G = min(head_dim, 64) coordinates:
//
//   Encode:     z = sqrt(G) * R_g x_g / |x_g|        (R_g orthogonal; z_i ~ unit variance)
//               for each codebook b: idx = nearest centroids of z / a, a = <z, c> / |c|^2,
//               alternated a few times; keep the (b, a) with the least |z - a c|^2
//               (searched on a histogram of |z|; one exact pass then sets idx and a)
//               header = fp16(scale = |x_g| / sqrt(G) * a) with book b in its 3 low bits
//   Decode:     x_g = scale * R_g^T c_b[idx]
//   Dot:        sum_g scale_g * <R_g q_g, c_b[idx]>     (R q computed once: PrepareQuery)
//   Accumulate: acc_g += w * scale_g * c_b[idx]       (rotated; FinishOutput: R^T acc)
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "kvcache/codec.h"
#include "memory/half.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TIERKV_CODEC_X86 1
#endif

namespace tierkv {
namespace {

constexpr int kMaxLevels = 16;

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// In-place unnormalised Walsh-Hadamard transform of x[0..n), n a power of two.
void Fwht(float* x, int n) {
  for (int h = 1; h < n; h *= 2) {
    for (int i = 0; i < n; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const float a = x[j];
        const float b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
}

bool IsPowerOfTwo(int v) { return v > 0 && (v & (v - 1)) == 0; }

}  // namespace

// ---- TqRotation -----------------------------------------------------------------------

TqRotation::TqRotation(int d, uint64_t seed, int rounds, int block)
    : d_(d), block_(std::min(block, d)), rounds_(rounds), signs_(static_cast<size_t>(d) * rounds) {
  assert(IsPowerOfTwo(d) && IsPowerOfTwo(block_) && d <= kMaxCodecHeadDim && rounds >= 1);
  // A stream of its own per (seed, d): a different head_dim never reuses a prefix.
  uint64_t state = seed ^ (0x74712d726f74ull << 12) ^ static_cast<uint64_t>(d);
  uint64_t bits = 0;
  for (size_t i = 0; i < signs_.size(); ++i) {
    if (i % 64 == 0) bits = SplitMix64(state);
    signs_[i] = ((bits >> (i % 64)) & 1) != 0 ? -1.0f : 1.0f;
  }
}

void TqRotation::Forward(const float* x, float* y) const {
  if (y != x) std::memcpy(y, x, sizeof(float) * d_);
  for (int r = 0; r < rounds_; ++r) {
    const float* s = signs(r);
    for (int i = 0; i < d_; ++i) y[i] *= s[i];
    for (int b = 0; b < d_; b += block_) Fwht(y + b, block_);
  }
  const float norm = static_cast<float>(std::pow(static_cast<double>(block_), -0.5 * rounds_));
  for (int i = 0; i < d_; ++i) y[i] *= norm;
}

void TqRotation::Inverse(const float* y, float* x) const {
  if (x != y) std::memcpy(x, y, sizeof(float) * d_);
  for (int r = rounds_ - 1; r >= 0; --r) {
    for (int b = 0; b < d_; b += block_) Fwht(x + b, block_);
    const float* s = signs(r);
    for (int i = 0; i < d_; ++i) x[i] *= s[i];
  }
  const float norm = static_cast<float>(std::pow(static_cast<double>(block_), -0.5 * rounds_));
  for (int i = 0; i < d_; ++i) x[i] *= norm;
}

// ---- TqCodebooks ----------------------------------------------------------------------

namespace {

struct BookShape {
  enum Kind { kSphere, kGenGauss, kBimodal } kind;
  double param;  // kGenGauss: exponent; kBimodal: mode offset m (variance 1 - m^2 each)
};
constexpr BookShape kBookShapes[kTqBooks] = {
    {BookShape::kSphere, 0},     {BookShape::kGenGauss, 4},  {BookShape::kGenGauss, 12},
    {BookShape::kBimodal, 0.6},  {BookShape::kBimodal, 0.75}, {BookShape::kBimodal, 0.85},
    {BookShape::kBimodal, 0.92}, {BookShape::kBimodal, 0.97}};

struct Book {
  std::vector<double> centroids;
  double mse = 0;
};

// Lloyd iteration on the exact piecewise-constant density of a fine grid: cell j spans
// [lo + j h, lo + (j + 1) h] with mass p[j] spread uniformly, so the mass and moments
// below any point are exact (a cell cut by a threshold is split linearly). The result
// is scaled to unit variance.
Book DesignBook(int dim, int levels, BookShape shape) {
  constexpr int kCells = 1 << 14;  // exact integration of a piecewise-constant density
  double half_width = 0;
  switch (shape.kind) {
    case BookShape::kSphere: half_width = std::min(std::sqrt(static_cast<double>(dim)), 12.0); break;
    case BookShape::kGenGauss: half_width = std::pow(40.0, 1.0 / shape.param); break;
    case BookShape::kBimodal: half_width = shape.param + 9.0 * std::sqrt(1 - shape.param * shape.param); break;
  }
  const double lo = -half_width;
  const double h = 2 * half_width / kCells;
  std::vector<double> p(kCells);
  double total = 0;
  for (int j = 0; j < kCells; ++j) {
    const double z = lo + (j + 0.5) * h;
    switch (shape.kind) {
      case BookShape::kSphere: {
        const double u = 1.0 - z * z / dim;
        p[j] = u > 0 ? std::exp((dim - 3) / 2.0 * std::log(u)) : 0.0;
        break;
      }
      case BookShape::kGenGauss:
        p[j] = std::exp(-std::pow(std::fabs(z), shape.param));
        break;
      case BookShape::kBimodal: {
        const double m = shape.param;
        const double v2 = 2 * (1 - m * m);
        p[j] = std::exp(-(z - m) * (z - m) / v2) + std::exp(-(z + m) * (z + m) / v2);
        break;
      }
    }
    total += p[j];
  }
  // Prefix sums of mass, first and second moment at cell starts.
  std::vector<double> m0(kCells + 1, 0), m1(kCells + 1, 0), m2(kCells + 1, 0);
  for (int j = 0; j < kCells; ++j) {
    p[j] /= total;
    const double a = lo + j * h;
    const double b = a + h;
    m0[j + 1] = m0[j] + p[j];
    m1[j + 1] = m1[j] + p[j] * (a + b) / 2;
    m2[j + 1] = m2[j] + p[j] * (a * a + a * b + b * b) / 3;
  }
  struct Moments { double m0, m1, m2; };
  auto below = [&](double t) -> Moments {
    if (t <= lo) return {0, 0, 0};
    if (t >= -lo) return {m0[kCells], m1[kCells], m2[kCells]};
    const int j = std::min(kCells - 1, static_cast<int>((t - lo) / h));
    const double a = lo + j * h;
    const double dens = p[j] / h;
    return {m0[j] + dens * (t - a), m1[j] + dens * (t * t - a * a) / 2,
            m2[j] + dens * (t * t * t - a * a * a) / 3};
  };
  auto threshold = [&](const std::vector<double>& c, int k) {  // lower edge of cell k
    return k == 0 ? lo : k == levels ? -lo : (c[k - 1] + c[k]) / 2;
  };

  // Start from equal-mass cells (centroids at the mid-quantiles).
  std::vector<double> c(levels);
  for (int k = 0, j = 0; k < levels; ++k) {
    const double target = (k + 0.5) / levels;
    while (j < kCells - 1 && m0[j + 1] < target) ++j;
    c[k] = lo + (j + 0.5) * h;
  }
  std::vector<double> next(levels);
  for (int iter = 0; iter < 20000; ++iter) {
    for (int k = 0; k < levels; ++k) {
      const Moments a = below(threshold(c, k));
      const Moments b = below(threshold(c, k + 1));
      const double mass = b.m0 - a.m0;
      next[k] = mass > 0 ? (b.m1 - a.m1) / mass : c[k];
    }
    double change = 0;
    for (int k = 0; k < levels; ++k) {  // exact symmetry, whatever the rounding did
      const double sym = (next[k] - next[levels - 1 - k]) / 2;
      change = std::max(change, std::fabs(sym - c[k]));
      c[k] = sym;
    }
    if (change < 1e-13) break;
  }

  const double var = m2[kCells];  // E[z^2] (the mean is 0)
  Book book;
  book.centroids.resize(levels);
  for (int k = 0; k < levels; ++k) {
    const Moments a = below(threshold(c, k));
    const Moments b = below(threshold(c, k + 1));
    book.mse += (b.m2 - a.m2) - 2 * c[k] * (b.m1 - a.m1) + c[k] * c[k] * (b.m0 - a.m0);
    book.centroids[k] = c[k] / std::sqrt(var);
  }
  book.mse /= var;
  return book;
}

TqCodebooks DesignCodebooks(int dim, int levels) {
  TqCodebooks cb;
  cb.dim = dim;
  cb.levels = levels;
  cb.centroids.resize(static_cast<size_t>(kTqBooks) * levels);
  cb.thresholds.resize(static_cast<size_t>(kTqBooks) * (levels - 1));
  cb.mse.resize(kTqBooks);
  for (int b = 0; b < kTqBooks; ++b) {
    const Book book = DesignBook(dim, levels, kBookShapes[b]);
    for (int k = 0; k < levels; ++k) {
      cb.centroids[b * levels + k] = static_cast<float>(book.centroids[k]);
    }
    for (int k = 0; k + 1 < levels; ++k) {
      cb.thresholds[b * (levels - 1) + k] =
          static_cast<float>((book.centroids[k] + book.centroids[k + 1]) / 2);
    }
    cb.mse[b] = book.mse;
  }
  return cb;
}

}  // namespace

Result<std::shared_ptr<const TqCodebooks>> GetTqCodebooks(int dim, int levels) {
  if (dim < 4 || dim > (1 << 20) || levels < 2 || levels > kMaxLevels) {
    return Status::InvalidArgument("tq codebooks: need 4 <= dim <= 2^20 and 2 <= levels <= 16 (got dim " +
                                   std::to_string(dim) + ", levels " + std::to_string(levels) + ")");
  }
  static std::mutex mu;
  static std::map<std::pair<int, int>, std::shared_ptr<const TqCodebooks>> cache;  // GUARDED_BY(mu)
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[{dim, levels}];
  if (!slot) slot = std::make_shared<const TqCodebooks>(DesignCodebooks(dim, levels));
  return slot;
}

// ---- kernels --------------------------------------------------------------------------

namespace {

inline float SumLanes8(const float* l) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

// What the kernels need to read one encoded vector.
struct TqView {
  const float* books;   // [kTqBooks][kMaxLevels], padded with 0
  int groups;           // head_dim / group
  int group;            // coordinates per group (multiple of 8)
  int bits;             // 3 or 4
  int group_bytes;      // 2 + group * bits / 8
  uint16_t book_mask;   // header bits holding the book (7, or 0 with a single book)
};

struct Header {
  float scale;
  const float* centroids;  // [kMaxLevels]
};
inline Header ReadHeader(const TqView& v, const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return {HalfToFloat(static_cast<uint16_t>(h & ~v.book_mask)), v.books + (h & v.book_mask) * kMaxLevels};
}

// The little-endian word holding indices 8w..8w+7 of a group (bits bytes).
inline uint32_t LoadWord(const uint8_t* idx, int w, int bits) {
  const uint8_t* p = idx + static_cast<size_t>(w) * bits;
  if (bits == 4) {
    uint32_t word;
    std::memcpy(&word, p, 4);
    return word;
  }
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16);
}

struct TqKernels {
  float (*dot)(const TqView& v, const float* q, const uint8_t* p);
  void (*accumulate)(const TqView& v, float w, const uint8_t* p, float* acc);
  // The same over n vectors of `stride` bytes, looped inside (one call per batch).
  void (*dot_many)(const TqView& v, const float* q, const uint8_t* p, size_t n, size_t stride, float* scores);
  void (*accumulate_many)(const TqView& v, const float* w, const uint8_t* p, size_t n, size_t stride, float* acc);
};

template <int kBits>
float DotTqGeneric(const TqView& v, const float* q, const uint8_t* p) {
  constexpr uint32_t mask = (1u << kBits) - 1;
  float total = 0;
  for (int g = 0; g < v.groups; ++g, p += v.group_bytes, q += v.group) {
    const Header h = ReadHeader(v, p);
    float lanes[8] = {};
    for (int w = 0; w < v.group / 8; ++w) {
      const uint32_t word = LoadWord(p + 2, w, kBits);
      for (int j = 0; j < 8; ++j) lanes[j] += q[8 * w + j] * h.centroids[(word >> (kBits * j)) & mask];
    }
    total += h.scale * SumLanes8(lanes);
  }
  return total;
}

template <int kBits>
void AccumulateTqGeneric(const TqView& v, float w, const uint8_t* p, float* acc) {
  constexpr uint32_t mask = (1u << kBits) - 1;
  for (int g = 0; g < v.groups; ++g, p += v.group_bytes, acc += v.group) {
    const Header h = ReadHeader(v, p);
    const float ws = w * h.scale;
    for (int i = 0; i < v.group / 8; ++i) {
      const uint32_t word = LoadWord(p + 2, i, kBits);
      for (int j = 0; j < 8; ++j) acc[8 * i + j] += ws * h.centroids[(word >> (kBits * j)) & mask];
    }
  }
}

// The per-vector kernel inlined into a loop over the vectors: the same code per vector,
// so the same bits, without a call per vector.
template <float (*kDot)(const TqView&, const float*, const uint8_t*)>
void DotManyLoop(const TqView& v, const float* q, const uint8_t* p, size_t n, size_t stride, float* scores) {
  for (size_t i = 0; i < n; ++i) scores[i] = kDot(v, q, p + i * stride);
}
template <void (*kAcc)(const TqView&, float, const uint8_t*, float*)>
void AccumulateManyLoop(const TqView& v, const float* w, const uint8_t* p, size_t n, size_t stride, float* acc) {
  for (size_t i = 0; i < n; ++i) kAcc(v, w[i], p + i * stride, acc);
}

#if defined(TIERKV_CODEC_X86)
#define TIERKV_AVX2 __attribute__((target("avx2,fma,f16c")))

TIERKV_AVX2 inline float HorizontalSum(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

// The 8 centroids for the 8 indices in `word`: 3-bit indices look up one 8-entry table
// (vpermps), 4-bit ones two tables blended on the index's top bit.
template <int kBits>
TIERKV_AVX2 inline __m256 Lookup8(uint32_t word, __m256 cb_lo, __m256 cb_hi) {
  const __m256i shifts = kBits == 4 ? _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)
                                    : _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21);
  const __m256i idx = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(word)), shifts);
  if constexpr (kBits == 3) {
    return _mm256_permutevar8x32_ps(cb_lo, idx);  // uses the low 3 bits of each lane
  } else {
    const __m256 lo = _mm256_permutevar8x32_ps(cb_lo, idx);
    const __m256 hi = _mm256_permutevar8x32_ps(cb_hi, idx);
    return _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
  }
}

template <int kBits>
TIERKV_AVX2 float DotTqAvx2(const TqView& v, const float* q, const uint8_t* p) {
  __m256 total = _mm256_setzero_ps();
  const int words = v.group / 8;
  for (int g = 0; g < v.groups; ++g, p += v.group_bytes, q += v.group) {
    const Header h = ReadHeader(v, p);
    const __m256 cb_lo = _mm256_loadu_ps(h.centroids);
    const __m256 cb_hi = _mm256_loadu_ps(h.centroids + 8);
    const uint8_t* idx = p + 2;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int w = 0;
    for (; w + 2 <= words; w += 2) {
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * w), Lookup8<kBits>(LoadWord(idx, w, kBits), cb_lo, cb_hi), a0);
      a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * w + 8),
                           Lookup8<kBits>(LoadWord(idx, w + 1, kBits), cb_lo, cb_hi), a1);
    }
    if (w < words) {
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * w), Lookup8<kBits>(LoadWord(idx, w, kBits), cb_lo, cb_hi), a0);
    }
    total = _mm256_fmadd_ps(_mm256_add_ps(a0, a1), _mm256_set1_ps(h.scale), total);
  }
  return HorizontalSum(total);
}

template <int kBits>
TIERKV_AVX2 void AccumulateTqAvx2(const TqView& v, float w, const uint8_t* p, float* acc) {
  for (int g = 0; g < v.groups; ++g, p += v.group_bytes, acc += v.group) {
    const Header h = ReadHeader(v, p);
    const __m256 cb_lo = _mm256_loadu_ps(h.centroids);
    const __m256 cb_hi = _mm256_loadu_ps(h.centroids + 8);
    const __m256 ws = _mm256_set1_ps(w * h.scale);
    for (int i = 0; i < v.group / 8; ++i) {
      const __m256 c = Lookup8<kBits>(LoadWord(p + 2, i, kBits), cb_lo, cb_hi);
      _mm256_storeu_ps(acc + 8 * i, _mm256_fmadd_ps(ws, c, _mm256_loadu_ps(acc + 8 * i)));
    }
  }
}
template <float (*kDot)(const TqView&, const float*, const uint8_t*)>
TIERKV_AVX2 void DotManyLoopAvx2(const TqView& v, const float* q, const uint8_t* p, size_t n, size_t stride,
                                 float* scores) {
  for (size_t i = 0; i < n; ++i) scores[i] = kDot(v, q, p + i * stride);
}
template <void (*kAcc)(const TqView&, float, const uint8_t*, float*)>
TIERKV_AVX2 void AccumulateManyLoopAvx2(const TqView& v, const float* w, const uint8_t* p, size_t n, size_t stride,
                                        float* acc) {
  for (size_t i = 0; i < n; ++i) kAcc(v, w[i], p + i * stride, acc);
}
#endif  // TIERKV_CODEC_X86

// ---- the codec ------------------------------------------------------------------------

class TqCodec final : public VectorCodec {
 public:
  TqCodec(KvCodec codec, int head_dim, uint64_t seed, int bits, int group,
          std::shared_ptr<const TqCodebooks> codebooks, const codec_internal::TqOptions& opt)
      : VectorCodec(codec, head_dim, seed,
                    static_cast<size_t>(head_dim / group) * (2 + group * bits / 8)),
        levels_(1 << bits),
        opt_(opt),
        rotation_(head_dim, seed, opt.rounds, group),
        codebooks_(std::move(codebooks)),
        sqrt_group_(std::sqrt(static_cast<double>(group))) {
    for (int b = 0; b < kTqBooks; ++b) {
      for (int k = 0; k < kMaxLevels; ++k) {
        books_[b][k] = k < levels_ ? codebooks_->centroids[b * levels_ + k] : 0.0f;
        thresholds_[b][k] = k < levels_ - 1 ? codebooks_->thresholds[b * (levels_ - 1) + k] : INFINITY;
      }
    }
    view_ = {&books_[0][0], head_dim / group, group, bits, 2 + group * bits / 8,
             static_cast<uint16_t>(opt.books > 1 ? kTqBooks - 1 : 0)};
#if defined(TIERKV_CODEC_X86)
    if (codec_internal::UseAvx2Kernels()) {
      avx2_ = true;
      k_ = bits == 4 ? TqKernels{DotTqAvx2<4>, AccumulateTqAvx2<4>, DotManyLoopAvx2<DotTqAvx2<4>>,
                                 AccumulateManyLoopAvx2<AccumulateTqAvx2<4>>}
                     : TqKernels{DotTqAvx2<3>, AccumulateTqAvx2<3>, DotManyLoopAvx2<DotTqAvx2<3>>,
                                 AccumulateManyLoopAvx2<AccumulateTqAvx2<3>>};
      return;
    }
#endif
    k_ = bits == 4 ? TqKernels{DotTqGeneric<4>, AccumulateTqGeneric<4>, DotManyLoop<DotTqGeneric<4>>,
                               AccumulateManyLoop<AccumulateTqGeneric<4>>}
                   : TqKernels{DotTqGeneric<3>, AccumulateTqGeneric<3>, DotManyLoop<DotTqGeneric<3>>,
                               AccumulateManyLoop<AccumulateTqGeneric<3>>};
  }

  void Encode(const float* x, void* out) const override;

  void Decode(const void* in, float* out) const override {
    std::fill(out, out + head_dim(), 0.0f);
    k_.accumulate(view_, 1.0f, static_cast<const uint8_t*>(in), out);
    rotation_.Inverse(out, out);
  }
  void PrepareQuery(const float* q, float* q_prep) const override {
    rotation_.Forward(q, q_prep);
  }
  float Dot(const float* q_prep, const void* k_enc) const override {
    return k_.dot(view_, q_prep, static_cast<const uint8_t*>(k_enc));
  }
  void Accumulate(float w, const void* v_enc, float* acc) const override {
    k_.accumulate(view_, w, static_cast<const uint8_t*>(v_enc), acc);
  }
  void FinishOutput(const float* acc, float* out) const override { rotation_.Inverse(acc, out); }
  void DotMany(const float* q_prep, const void* k_enc, size_t n, float* scores) const override {
    k_.dot_many(view_, q_prep, static_cast<const uint8_t*>(k_enc), n, vector_bytes(), scores);
  }
  void AccumulateMany(const float* w, const void* v_enc, size_t n, float* acc) const override {
    k_.accumulate_many(view_, w, static_cast<const uint8_t*>(v_enc), n, vector_bytes(), acc);
  }
  const char* kernel_name() const override { return avx2_ ? "avx2" : "generic"; }

 private:
  // One pass over a group with book b: idx[i] = the nearest centroid to z[i] * inv_a
  // (the number of thresholds below it); returns <z, c[idx]> and |c[idx]|^2.
  void Quantize(const float* z, float inv_a, int b, uint8_t* idx, double* zc, double* cc) const {
    if (levels_ == 8) return QuantizeLevels<8>(z, inv_a, b, idx, zc, cc);
    return QuantizeLevels<16>(z, inv_a, b, idx, zc, cc);
  }
  // Compare-and-select chains with no reductions in the first loop, fixed lanes in the
  // second, so the compiler vectorises both at the baseline ISA and the result does not
  // depend on the CPU (encoded bytes are the same with either kernel family).
  template <int kLevels>
  void QuantizeLevels(const float* z, float inv_a, int b, uint8_t* idx, double* zc, double* cc) const {
    const int n = view_.group;
    const float* th = thresholds_[b];
    const float* cb = books_[b];
    float v[kMaxCodecHeadDim], c[kMaxCodecHeadDim];
    int32_t k[kMaxCodecHeadDim];
    for (int i = 0; i < n; ++i) {
      v[i] = z[i] * inv_a;
      k[i] = 0;
      c[i] = cb[0];
    }
    for (int t = 0; t < kLevels - 1; ++t) {  // thresholds ascending: the last one passed wins
      const float thr = th[t];
      const float next = cb[t + 1];
      for (int i = 0; i < n; ++i) {
        const bool above = v[i] > thr;
        k[i] += above ? 1 : 0;
        c[i] = above ? next : c[i];
      }
    }
    for (int i = 0; i < n; ++i) idx[i] = static_cast<uint8_t>(k[i]);
    float lz[8] = {}, lc[8] = {};
    for (int i = 0; i < n; i += 8) {
      for (int j = 0; j < 8; ++j) {
        lz[j] += z[i + j] * c[i + j];
        lc[j] += c[i + j] * c[i + j];
      }
    }
    *zc = SumLanes8(lz);
    *cc = SumLanes8(lc);
  }
  // Picks book, alpha and indices for one group's unit-variance coordinates z.
  void FitGroup(const float* z, uint8_t* idx, int* book, double* alpha) const;
  uint16_t MakeHeader(float scale, int book) const;

  int levels_;
  codec_internal::TqOptions opt_;
  TqRotation rotation_;
  std::shared_ptr<const TqCodebooks> codebooks_;
  double sqrt_group_;
  alignas(32) float books_[kTqBooks][kMaxLevels];  // centroids, padded with 0
  float thresholds_[kTqBooks][kMaxLevels];         // padded with +inf
  TqView view_;
  TqKernels k_;
  bool avx2_ = false;
};

void TqCodec::FitGroup(const float* z, uint8_t* idx, int* book, double* alpha) const {
  const int n = view_.group;
  double zc, cc;
  *book = 0;
  *alpha = 1.0;
  if (opt_.scale_mode != codec_internal::TqScaleMode::kLeastSquares) {
    Quantize(z, 1.0f, 0, idx, &zc, &cc);
    if (opt_.scale_mode == codec_internal::TqScaleMode::kPreserve) {
      double z2 = 0;
      for (int i = 0; i < n; ++i) z2 += static_cast<double>(z[i]) * z[i];
      *alpha = std::sqrt(z2 / cc);
    }
    return;
  }
  // Least squares: |z - a c|^2 = |z|^2 - zc^2 / cc at the best a = zc / cc, so search
  // for the book and indices with the largest gain zc^2 / cc. Per book, alternate the
  // best a for the indices and the nearest indices for a (never lowers the gain).
  // The books are symmetric, so the search works on a fine histogram of |z| (counts and
  // sums per bin, prefix-summed): a pass costs levels/2 lookups instead of a sweep over
  // the group. Cell edges snap to bin edges; the exact pass at the end fixes the result.
  constexpr int kBins = 128;
  float zmax = 0;
  for (int i = 0; i < n; ++i) zmax = std::max(zmax, std::fabs(z[i]));
  if (!(zmax > 0)) {
    Quantize(z, 1.0f, 0, idx, &zc, &cc);
    return;
  }
  const double bin_per_z = kBins / static_cast<double>(zmax);
  int count[kBins + 1] = {};
  double sum[kBins + 1] = {};
  for (int i = 0; i < n; ++i) {
    const double v = std::fabs(z[i]);
    const int bin = std::min(kBins - 1, static_cast<int>(v * bin_per_z));
    count[bin + 1] += 1;
    sum[bin + 1] += v;
  }
  for (int i = 0; i < kBins; ++i) {  // prefix: count[e], sum[e] = below bin edge e
    count[i + 1] += count[i];
    sum[i + 1] += sum[i];
  }
  const int half = levels_ / 2;
  auto gain_at = [&](int b, double a, double* out_zc, double* out_cc) {
    const float* cp = books_[b] + half;       // positive centroids
    const float* tp = thresholds_[b] + half;  // positive thresholds (the middle one is 0)
    const float edge_per_t = static_cast<float>(a * bin_per_z);
    double sz = 0, sc = 0;
    int lo = 0;
    for (int j = 0; j < half; ++j) {
      int hi = kBins;
      if (j + 1 < half) {
        hi = static_cast<int>(std::min(static_cast<float>(kBins), tp[j] * edge_per_t + 0.5f));
      }
      hi = std::max(lo, hi);
      sz += cp[j] * (sum[hi] - sum[lo]);
      sc += cp[j] * cp[j] * static_cast<float>(count[hi] - count[lo]);
      lo = hi;
    }
    *out_zc = sz;
    *out_cc = sc;
    return sc > 0 && sz > 0 ? sz * sz / sc : 0.0;
  };
  // First the least-squares fit at a = 1 for every book; then refits only for books
  // whose error |z|^2 - gain is within 25 % of the best (a refit gains a few percent).
  const int books = std::max(1, std::min(opt_.books, kTqBooks));
  double z2 = 0;
  for (int i = 0; i < n; ++i) z2 += static_cast<double>(z[i]) * z[i];
  double gain[kTqBooks], next_a[kTqBooks];
  double best_gain = -1;
  for (int b = 0; b < books; ++b) {
    gain[b] = gain_at(b, 1.0, &zc, &cc);
    next_a[b] = cc > 0 ? zc / cc : 1.0;
    if (gain[b] > best_gain) {
      best_gain = gain[b];
      *book = b;
      *alpha = 1.0;
    }
  }
  const double refit_error = 1.25 * (z2 - best_gain);
  for (int b = 0; b < books; ++b) {
    if (!(gain[b] > 0) || z2 - gain[b] > refit_error) continue;
    double g = gain[b];
    double a = next_a[b];
    for (int it = 0; it < opt_.refine_iterations; ++it) {
      const double ga = gain_at(b, a, &zc, &cc);
      if (!(ga > g)) break;
      g = ga;
      if (g > best_gain) {
        best_gain = g;
        *book = b;
        *alpha = a;
      }
      a = zc / cc;
    }
  }
  // The exact indices for the chosen book and scale, and the least-squares scale for them.
  Quantize(z, static_cast<float>(1.0 / *alpha), *book, idx, &zc, &cc);
  if (cc > 0 && zc > 0) *alpha = zc / cc;
}

uint16_t TqCodec::MakeHeader(float scale, int book) const {
  uint16_t h = FloatToHalf(std::min(scale, 65504.0f));  // saturate, never inf
  if (view_.book_mask == 0) return h;
  if ((h & 0x7c00u) != 0x7c00u) {
    // Round the mantissa to 7 bits, to make room for the book id.
    h = static_cast<uint16_t>((h + 4u) & ~7u);
    if ((h & 0x7fffu) >= 0x7c00u) h = static_cast<uint16_t>((h & 0x8000u) | 0x7bf8u);
  }
  return static_cast<uint16_t>((h & ~view_.book_mask) | book);
}

void TqCodec::Encode(const float* x, void* out) const {
  const int n = view_.group;
  auto* p = static_cast<uint8_t*>(out);
  // Each group is scaled to |x_g| = sqrt(G) before the rotation (in double, so tiny and
  // huge finite inputs stay finite), which makes the rotated coordinates unit-variance.
  double norm[kMaxCodecHeadDim / 8];  // per group; 0 for a zero group, NaN if non-finite
  float scaled[kMaxCodecHeadDim], z[kMaxCodecHeadDim];
  for (int g = 0; g < view_.groups; ++g) {
    const float* xg = x + g * n;
    double norm2 = 0;
    for (int i = 0; i < n; ++i) norm2 += static_cast<double>(xg[i]) * xg[i];
    const bool usable = norm2 > 0 && std::isfinite(norm2);
    norm[g] = usable ? std::sqrt(norm2) : (norm2 == 0 ? 0.0 : NAN);
    const double to_unit = usable ? sqrt_group_ / norm[g] : 0.0;
    for (int i = 0; i < n; ++i) scaled[g * n + i] = usable ? static_cast<float>(xg[i] * to_unit) : 0.0f;
  }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push  // every group above wrote its part of `scaled`
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
  rotation_.Forward(scaled, z);
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
  uint8_t idx[kMaxCodecHeadDim];
  for (int g = 0; g < view_.groups; ++g, p += view_.group_bytes) {
    float scale;
    int book = 0;
    if (norm[g] > 0) {
      double alpha;
      FitGroup(z + g * n, idx, &book, &alpha);
      scale = static_cast<float>(norm[g] / sqrt_group_ * alpha);
    } else {
      // Zero group: scale 0. Non-finite input: a NaN scale, so its decode is NaN too.
      scale = norm[g] == 0 ? 0.0f : NAN;
      std::fill(idx, idx + n, static_cast<uint8_t>(levels_ / 2));
    }
    const uint16_t h = MakeHeader(scale, book);
    std::memcpy(p, &h, 2);
    for (int w = 0; w < n / 8; ++w) {
      uint32_t word = 0;
      for (int j = 0; j < 8; ++j) word |= static_cast<uint32_t>(idx[8 * w + j]) << (view_.bits * j);
      std::memcpy(p + 2 + static_cast<size_t>(w) * view_.bits, &word, view_.bits);
    }
  }
}

}  // namespace

namespace codec_internal {

Result<std::unique_ptr<VectorCodec>> CreateTqCodec(KvCodec codec, int head_dim, uint64_t seed,
                                                   const TqOptions& options) {
  const int bits = codec == KvCodec::kTq4 ? 4 : codec == KvCodec::kTq3 ? 3 : 0;
  const std::string what = std::string("codec ") + KvCodecName(codec) + ", head_dim " +
                           std::to_string(head_dim);
  if (bits == 0) return Status::InvalidArgument(what + ": not a tq codec");
  if (!IsPowerOfTwo(head_dim) || head_dim < 8 || head_dim > kMaxCodecHeadDim) {
    return Status::InvalidArgument(what + ": head_dim must be a power of two in [8, " +
                                   std::to_string(kMaxCodecHeadDim) +
                                   "] (the Walsh-Hadamard rotation needs it)");
  }
  if (options.rounds < 1 || options.refine_iterations < 0 || options.books < 1 ||
      options.books > kTqBooks || !IsPowerOfTwo(options.group) || options.group < 8) {
    return Status::InvalidArgument(what + ": bad tq options");
  }
  const int group = std::min(head_dim, options.group);
  TIERKV_ASSIGN_OR_RETURN(std::shared_ptr<const TqCodebooks> cb, GetTqCodebooks(group, 1 << bits));
  return std::unique_ptr<VectorCodec>(
      new TqCodec(codec, head_dim, seed, bits, group, std::move(cb), options));
}

}  // namespace codec_internal
}  // namespace tierkv
