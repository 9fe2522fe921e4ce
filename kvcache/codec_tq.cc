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
//   Decode:     x_g = scale * R_g^T c_b[idx]               (c_b: the designed centroids in fp16)
//   Dot:        sum_g scale_g * <R_g q_g, c_b[idx]>     (R q computed once: PrepareQuery)
//   Accumulate: acc_g += (w * scale_g) * c_b[idx]     (rotated; FinishOutput: R^T acc)
// The dot products and sums run in the f16 codec's kernels over decoded centroids, or in
// fused AVX-512 kernels with the same arithmetic (see "kernels" below).
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/kv_dot_tree.h"
#include "kernels/kv_gather.h"
#include "kvcache/codec.h"
#include "memory/half.h"
#include "memory/prefetch.h"

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

namespace {

inline float SumLanes8(const float* l) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

// ---- kernels --------------------------------------------------------------------------
//
// Attention reads tq vectors through the f16 codec's kernels: a batch of vectors is
// decoded, one group at a time, into the *unscaled* centroids c_b[idx] as fp16 (the
// codec's centroids are fp16 values, so this is exact), the f16 kernels take the dot
// products or weighted sums over them, and each group's scale is applied outside:
//   score      = scale_0 * <q_0, c_0>  (+ scale_g * <q_g, c_g> for further groups, in order)
//   acc_g     += (w * scale_g) * c_g
// Every form (one vector, many, grouped) goes this way, so their bits agree with each
// other and do not depend on the kernel family: the decode only looks values up. With
// AVX-512 the decode steps' forms take fused kernels instead (below): the same operations
// in the same order, without the scratch in between.

struct TqView {
  int groups;           // head_dim / group
  int group;            // coordinates per group (8 .. 64, a power of two)
  int bits;             // 3 or 4
  int group_bytes;      // 2 + group * bits / 8
  uint16_t book_mask;   // header bits holding the book (7, or 0 with a single book)
};

// Each book's centroids as fp16, repeated with period `levels` to 32 entries (so an
// index's bits above its own select the same value), and the same as floats.
struct TqTables {
  alignas(64) uint16_t halves[kTqBooks][32];
  alignas(32) float floats[kTqBooks][16];
};

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

// Group g of n vectors (vb bytes apart): centroids into out [n][group] fp16, scales [n].
using DecodeGroupFn = void (*)(const TqView& v, const TqTables& t, const uint8_t* p, size_t n, size_t vb, int g,
                               uint16_t* out, float* scales);

void DecodeGroupGeneric(const TqView& v, const TqTables& t, const uint8_t* p, size_t n, size_t vb, int g,
                        uint16_t* out, float* scales) {
  const uint32_t mask = (1u << v.bits) - 1;
  p += static_cast<size_t>(g) * v.group_bytes;
  for (size_t i = 0; i < n; ++i, p += vb, out += v.group) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    scales[i] = HalfToFloat(static_cast<uint16_t>(h & ~v.book_mask));
    const uint16_t* book = t.halves[h & v.book_mask];
    for (int w = 0; w < v.group / 8; ++w) {
      const uint32_t word = LoadWord(p + 2, w, v.bits);
      for (int j = 0; j < 8; ++j) out[8 * w + j] = book[(word >> (v.bits * j)) & mask];
    }
  }
}

// 16 decoded keys (rows[16][group]) as an f16 key tile (tile[group][16]).
void TileKeysGeneric(const uint16_t* rows, size_t group, uint16_t* tile) {
  for (size_t d = 0; d < group; ++d) {
    for (size_t l = 0; l < 16; ++l) tile[d * 16 + l] = rows[l * group + d];
  }
}

#if defined(TIERKV_CODEC_X86)
#define TIERKV_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TIERKV_AVX512BW __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define TIERKV_AVX512F __attribute__((target("avx512f,avx2,fma,f16c")))
#define TIERKV_AVX512F_INLINE TIERKV_AVX512F __attribute__((always_inline)) inline


// 8 centroids for the 8 indices in `word`, as fp16: 3-bit indices look up one 8-entry
// table (vpermps), 4-bit ones two tables blended on the index's top bit.
template <int kBits>
TIERKV_AVX2 inline __m128i Lookup8(uint32_t word, const float* book) {
  const __m256i shifts = kBits == 4 ? _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)
                                    : _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21);
  const __m256i idx = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(word)), shifts);
  const __m256 lo = _mm256_permutevar8x32_ps(_mm256_load_ps(book), idx);  // the low 3 bits of each lane
  __m256 c = lo;
  if constexpr (kBits == 4) {
    const __m256 hi = _mm256_permutevar8x32_ps(_mm256_load_ps(book + 8), idx);
    c = _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
  }
  return _mm256_cvtps_ph(c, _MM_FROUND_TO_NEAREST_INT);  // exact: the table holds fp16 values
}

template <int kBits>
TIERKV_AVX2 void DecodeGroupAvx2(const TqView& v, const TqTables& t, const uint8_t* p, size_t n, size_t vb, int g,
                                 uint16_t* out, float* scales) {
  p += static_cast<size_t>(g) * v.group_bytes;
  const int words = v.group / 8;
  for (size_t i = 0; i < n; ++i, p += vb, out += v.group) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    scales[i] = _cvtsh_ss(static_cast<uint16_t>(h & ~v.book_mask));
    const float* book = t.floats[h & v.book_mask];
    for (int w = 0; w < words; ++w) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 8 * w), Lookup8<kBits>(LoadWord(p + 2, w, kBits), book));
    }
  }
}

// The scales of vectors [0, m), m <= 16 (vector 0's header at p; `at`: the vectors'
// offsets, kv_gather::StrideOffsets(vb); lanes from m on: zeros): the headers gathered
// (each vector has index bytes after its 2-byte header, so the reads stay inside it), the
// book bits masked off. (16 two-byte stores read back as one vector wait for the stores
// to drain: there is no store-to-load forwarding from several stores.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
TIERKV_AVX512F_INLINE __m512 GatherScales(const uint8_t* p, __m512i at, size_t m, uint16_t book_mask) {
  const __m256i keep = _mm256_set1_epi16(static_cast<int16_t>(~book_mask));
  return _mm512_cvtph_ps(_mm256_and_si256(kernels::kv_gather::GatherWords(p, at, m), keep));
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// Index j of a run of 32 (bits 3j or 4j of the run's bytes, which are broadcast to every
// 128-bit lane) lands in 16-bit lane j: a byte shuffle brings the two bytes that hold it,
// a shift by the bit offset within them puts it at the bottom, and vpermw, which reads
// the low 5 bits, looks it up in the 32-entry table whose period is the levels.
struct UnpackControl {
  alignas(64) int8_t shuffle[64];
  alignas(64) int16_t shift[32];
};
constexpr UnpackControl MakeUnpackControl(int bits, int bytes) {
  UnpackControl c{};
  for (int j = 0; j < 32; ++j) {
    const int bit = bits * j;
    const int lo = bit / 8;
    c.shuffle[2 * j] = static_cast<int8_t>(lo);
    c.shuffle[2 * j + 1] = static_cast<int8_t>(lo + 1 < bytes ? lo + 1 : 0x80);  // 0x80: a zero byte
    c.shift[j] = static_cast<int16_t>(bit % 8);
  }
  return c;
}
constexpr UnpackControl kUnpack4 = MakeUnpackControl(4, 16);
constexpr UnpackControl kUnpack3 = MakeUnpackControl(3, 12);

// AVX-512BW: 16-bit lookups (vpermw) straight from the fp16 table, 32 values per step
// (16 for a group of 16); the group size a template constant so that the loops unroll.
template <int kBits, int kGroup>
TIERKV_AVX512BW void DecodeGroupAvx512(const TqView& v, const TqTables& t, const uint8_t* p, size_t n, size_t vb,
                                       int g, uint16_t* out, float* scales) {
  static_assert(kGroup == 16 || kGroup % 32 == 0);
  constexpr int kRunBytes = 32 * kBits / 8;  // the index bytes of 32 values
  constexpr const UnpackControl& c = kBits == 4 ? kUnpack4 : kUnpack3;
  const __m512i shuffle = _mm512_load_si512(c.shuffle);
  const __m512i shift = _mm512_load_si512(c.shift);
  const uint32_t book_mask = v.book_mask;
  const __m512i at = kernels::kv_gather::StrideOffsets(vb);
  p += static_cast<size_t>(g) * v.group_bytes;
  for (size_t i = 0; i < n; ++i, p += vb, out += kGroup) {
    if (i % 16 == 0) {
      const size_t m = std::min<size_t>(16, n - i);
      _mm512_mask_storeu_ps(scales + i, static_cast<__mmask16>((1u << m) - 1), GatherScales(p, at, m, v.book_mask));
    }
    uint16_t h;
    std::memcpy(&h, p, 2);
    const uint16_t* book = t.halves[h & book_mask];
    const uint8_t* idx = p + 2;
    if constexpr (kGroup == 16) {
      // the index bytes of 16 values (8 or 6), read without touching the bytes after them
      const __m128i b = _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << (kRunBytes / 2)) - 1), idx);
      const __m256i ix = _mm256_srlv_epi16(
          _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(b),
                              _mm256_load_si256(reinterpret_cast<const __m256i*>(c.shuffle))),
          _mm256_load_si256(reinterpret_cast<const __m256i*>(c.shift)));
      const __m256i table = _mm256_load_si256(reinterpret_cast<const __m256i*>(book));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permutexvar_epi16(ix, table));
    } else {
      const __m512i table = _mm512_load_si512(book);
      for (int j = 0; j < kGroup; j += 32) {
        const uint8_t* run = idx + j / 32 * kRunBytes;
        const __m128i b = kRunBytes == 16 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(run))
                                          : _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << kRunBytes) - 1), run);
        const __m512i ix = _mm512_srlv_epi16(_mm512_shuffle_epi8(_mm512_maskz_broadcast_i32x4(0xffff, b), shuffle), shift);
        _mm512_storeu_si512(out + j, _mm512_permutexvar_epi16(ix, table));
      }
    }
  }
}

// 16 decoded keys (rows[16][group]) as an f16 key tile (tile[group][16]): per pair of
// dimensions one 32-bit gather down the rows, split into its low and high halves.
// (GCC 12's gather and narrowing intrinsics start from _mm512_undefined_*: see below.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
TIERKV_AVX512BW void TileKeysAvx512(const uint16_t* rows, size_t group, uint16_t* tile) {
  const __m512i down = kernels::kv_gather::StrideOffsets(group / 2);
  const auto* words = reinterpret_cast<const int*>(rows);
  for (size_t d = 0; d < group; d += 2) {
    const __m512i pair = _mm512_i32gather_epi32(_mm512_add_epi32(down, _mm512_set1_epi32(static_cast<int>(d / 2))),
                                                words, 4);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(tile + d * 16), _mm512_cvtepi32_epi16(pair));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(tile + (d + 1) * 16),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(pair, 16)));
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// The AVX-512 decoder for a group size (16, 32 or 64).
DecodeGroupFn DecodeGroupAvx512For(int bits, int group) {
  switch (group) {
    case 16: return bits == 4 ? DecodeGroupAvx512<4, 16> : DecodeGroupAvx512<3, 16>;
    case 32: return bits == 4 ? DecodeGroupAvx512<4, 32> : DecodeGroupAvx512<3, 32>;
    default: return bits == 4 ? DecodeGroupAvx512<4, 64> : DecodeGroupAvx512<3, 64>;
  }
}

// ---- fused AVX-512 kernels: scores and weighted sums straight from the indices ---------
// The decode-then-f16 path above writes each batch's centroids to scratch, reads them back
// in the f16 kernels and scales in separate passes. These do the same arithmetic in one
// pass, so they give its bits: per key a group's centroids become the same floats as the
// f16 kernels' LoadHalf16 of them (a 32-bit lookup, vpermps, from the book's float table,
// whose entries are the fp16 values), the scores take kernels/kv_dot_tree.h's reduction
// (DotF16GroupAvx512Any's), then scale_0 * s_0 (+ scale_g * s_g, a product then a sum);
// the sums take acc = fma(w * scale_g, c, acc) key by key, as AccumulateF16TileAvx512 over
// the scaled weights. Groups of 32 or 64 values.
//
// Per block of 16 vectors a lookup function writes the group's centroids as floats (and
// the 16 scales) to a small buffer that the arithmetic then reads as FMA operands, so the
// lookup's target can differ from the arithmetic's: AVX-512BW (a byte shuffle and a shift
// per 16 indices) or, where the CPU has it, AVX-512 VBMI (one vpmultishiftqb
// per 16 indices puts each index at the bottom of its 32-bit lane). The arithmetic is
// AVX-512F + AVX2 (the tree's target) and identical for both.

#define TIERKV_AVX512VBMI __attribute__((target("avx512f,avx512bw,avx512vbmi,avx2,fma,f16c")))

// GCC 12's AVX-512 intrinsics fill "don't care" lanes with _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports (as in kernels/kv_codec_simd.cc).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// A block's lookup: vectors [0, m), m <= 16, of one group (vector 0's header at p, vb
// bytes apart): vector i's 16 * kV centroids as floats at x + 16 * kV * i, its scale at
// scales[i] (scales[m..16) = 0).
using LookupBlockFn = void (*)(const TqView& v, const TqTables& t, const uint8_t* p, size_t vb, size_t m, float* x,
                               float* scales);

// Without VBMI (AVX-512BW): the 32 values of runs 2i and 2i + 1 have their index bytes
// (16 for tq4, 12 for tq3) in one 16-byte window, broadcast to every 128-bit lane by the
// load; a byte shuffle brings value k's two bytes to the bottom of 32-bit lane k and a
// shift by its bit offset puts the index there. Window i starts at the run pair's first
// byte, or earlier where 16 bytes from there would pass the group's index bytes; tq3's 12
// bytes of a 32-value group are read alone (a masked load).
struct ShuffleControl {
  alignas(64) int8_t bytes[4][64];
  alignas(64) int32_t shift[4][16];
  int window[2];
};
constexpr ShuffleControl MakeShuffleControl(int bits, int v) {
  ShuffleControl c{};
  const int index_bytes = 2 * bits * v;
  for (int j = 0; j < v; ++j) {
    const int start = 4 * bits * (j / 2);
    const int window = index_bytes <= 16 ? 0 : (start + 16 <= index_bytes ? start : index_bytes - 16);
    c.window[j / 2] = window;
    for (int k = 0; k < 16; ++k) {
      const int bit = bits * (16 * j + k);
      const int byte = bit / 8 - window;
      c.bytes[j][4 * k] = static_cast<int8_t>(byte);
      c.bytes[j][4 * k + 1] = static_cast<int8_t>(byte + 1 < 16 ? byte + 1 : 0x80);  // 0x80: a zero byte
      c.bytes[j][4 * k + 2] = c.bytes[j][4 * k + 3] = static_cast<int8_t>(0x80);
      c.shift[j][k] = bit % 8;
    }
  }
  return c;
}
template <int kBits, int kV>
constexpr ShuffleControl kShuffleControl = MakeShuffleControl(kBits, kV);

template <int kBits, int kV>
TIERKV_AVX512BW void LookupBlockAvx512(const TqView& v, const TqTables& t, const uint8_t* p, size_t vb, size_t m,
                                       float* x, float* scales) {
  constexpr const ShuffleControl& c = kShuffleControl<kBits, kV>;
  constexpr int kIndexBytes = 2 * kV * kBits;
  __m512i ctl[kV], shift[kV];
  for (int j = 0; j < kV; ++j) {
    ctl[j] = _mm512_load_si512(c.bytes[j]);
    shift[j] = _mm512_load_si512(c.shift[j]);
  }
  _mm512_store_ps(scales, GatherScales(p, kernels::kv_gather::StrideOffsets(vb), m, v.book_mask));
  const uint16_t book_mask = v.book_mask;  // a local: the stores to x could alias v
#pragma GCC unroll 4
  for (size_t i = 0; i < m; ++i, p += vb, x += 16 * kV) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    const __m512 book = _mm512_loadu_ps(t.floats[h & book_mask]);
    for (int w = 0; w < kV / 2; ++w) {
      const __m128i window = kIndexBytes < 16
                                 ? _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << kIndexBytes) - 1), p + 2)
                                 : _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 + c.window[w]));
      const __m512i bytes = _mm512_broadcast_i32x4(window);
      for (int j = 2 * w; j < 2 * w + 2; ++j) {
        const __m512i ix = _mm512_srlv_epi32(_mm512_shuffle_epi8(bytes, ctl[j]), shift[j]);
        _mm512_store_ps(x + 16 * j, _mm512_permutexvar_ps(ix, book));
      }
    }
  }
}

// For vpmultishiftqb: run j of a group's indices (values [16j, 16j + 16), bits * 16 bits
// from index byte 2 * bits * j) comes in as the 8 bytes at offset[j] (never past the
// group's index bytes) broadcast to every 64-bit lane, and value k's bits start at bit
// bytes[j][4k] of its lane, the low byte of 32-bit lane k. The 8 bits taken from there
// hold the index at the bottom; vpermps reads the low 4 (tq3's table repeats with period
// 8, so a fourth bit from the next index does not matter).
struct VbmiControl {
  alignas(64) uint8_t bytes[4][64];
  int offset[4];
};
constexpr VbmiControl MakeVbmiControl(int bits, int v) {
  VbmiControl c{};
  const int index_bytes = 2 * bits * v;
  for (int j = 0; j < v; ++j) {
    const int start = 2 * bits * j;
    c.offset[j] = start + 8 <= index_bytes ? start : index_bytes - 8;
    for (int k = 0; k < 16; ++k) c.bytes[j][4 * k] = static_cast<uint8_t>(8 * (start - c.offset[j]) + bits * k);
  }
  return c;
}
template <int kBits, int kV>
constexpr VbmiControl kVbmiControl = MakeVbmiControl(kBits, kV);

template <int kBits, int kV>
TIERKV_AVX512VBMI void LookupBlockVbmi(const TqView& v, const TqTables& t, const uint8_t* p, size_t vb, size_t m,
                                       float* x, float* scales) {
  constexpr const VbmiControl& c = kVbmiControl<kBits, kV>;
  __m512i ctl[kV];
  for (int j = 0; j < kV; ++j) ctl[j] = _mm512_load_si512(c.bytes[j]);
  _mm512_store_ps(scales, GatherScales(p, kernels::kv_gather::StrideOffsets(vb), m, v.book_mask));
  const uint16_t book_mask = v.book_mask;  // a local: the stores to x could alias v
#pragma GCC unroll 4
  for (size_t i = 0; i < m; ++i, p += vb, x += 16 * kV) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    const __m512 book = _mm512_loadu_ps(t.floats[h & book_mask]);
    for (int j = 0; j < kV; ++j) {
      int64_t run;
      std::memcpy(&run, p + 2 + c.offset[j], 8);
      const __m512i ix = _mm512_multishift_epi64_epi8(ctl[j], _mm512_set1_epi64(run));
      _mm512_store_ps(x + 16 * j, _mm512_permutexvar_ps(ix, book));
    }
  }
}

// The tree's leaf: key t's product sums over one group for kG heads (head h's slice of the
// group at q + h * hd), as the f16 kernels' F16KeyLeaf forms them, from a looked-up block.
template <int kV, int kG>
struct TqBlockLeaf {
  const float* q;
  size_t hd;
  const float* x;  // the block's centroids, 16 * kV floats a key
  TIERKV_AVX512F_INLINE void operator()(size_t t, __m512* out) const {
    const float* xt = x + t * 16 * kV;
    for (int h = 0; h < kG; ++h) {
      const float* qh = q + static_cast<size_t>(h) * hd;
      __m512 acc = _mm512_setzero_ps();
      for (int i = 0; i < kV; ++i) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * i), _mm512_load_ps(xt + 16 * i), acc);
      out[h] = acc;
    }
  }
};

constexpr size_t kFusedPrefetchBytes = 2048;

// One looked-up block of group g for kG heads (queries hd floats apart, the group's slice
// at q): scores[h * stride + t] = scale_t * s_t (g == 0) or += it (later groups), 16 keys.
template <int kV, int kG>
TIERKV_AVX512F void TqScoreBlock(const float* q, size_t hd, const float* x, const float* sc, int g, float* scores,
                                 size_t stride) {
  __m512 r[kG];
  kernels::kv_tree::DotTree<16, kG>(TqBlockLeaf<kV, kG>{q, hd, x}, 0, r);
  const __m512i order = kernels::kv_tree::TreeKeyOrder();
  const __m512 scv = _mm512_load_ps(sc);
  for (int h = 0; h < kG; ++h) {
    float* out = scores + static_cast<size_t>(h) * stride;
    // The masked forms: GCC never contracts them into an FMA.
    const __m512 p = _mm512_maskz_mul_ps(0xffff, scv, _mm512_permutexvar_ps(order, r[h]));
    _mm512_storeu_ps(out, g == 0 ? p : _mm512_maskz_add_ps(0xffff, _mm512_loadu_ps(out), p));
  }
}

// scores[h * stride + t] for `heads` heads (queries hd floats apart) and n keys, n % 16
// == 0: each block of 16 keys' group looked up once for all heads, then reduced for groups
// of up to 4 heads (ForTreeHeadGroups).
template <int kV, LookupBlockFn kLookup>
TIERKV_AVX512F void TqScoresFusedHeads(const TqView& v, const TqTables& t, const float* q, int heads, size_t hd,
                                       const uint8_t* k, size_t n, size_t vb, float* scores, size_t stride) {
  constexpr int kGroup = 16 * kV;
  alignas(64) float x[16 * kGroup];
  alignas(64) float sc[16];
  for (size_t t0 = 0; t0 < n; t0 += 16) {
    const uint8_t* kt = k + t0 * vb;
    PrefetchLines(kt + kFusedPrefetchBytes, 16 * vb);
    for (int g = 0; g < v.groups; ++g) {
      kLookup(v, t, kt + static_cast<size_t>(g) * static_cast<size_t>(v.group_bytes), vb, 16, x, sc);
      kernels::kv_tree::ForTreeHeadGroups(heads, [&](auto group, int h) {
        TqScoreBlock<kV, decltype(group)::value>(q + static_cast<size_t>(h) * hd + g * kGroup, hd, x, sc, g,
                                                 scores + static_cast<size_t>(h) * stride + t0, stride);
      });
    }
  }
}

// acc[h][...] += sum_t w[h * w_stride + t] * V_t for kH heads of each of kR runs (run r at
// v + r * run_stride, its heads rows r * kH .. of w and acc, rows hd floats apart), kGroups
// groups of 16 * kV values a vector, every accumulator in registers over the n keys.
template <int kV, int kGroups, int kH, int kR, LookupBlockFn kLookup>
TIERKV_AVX512F void TqSumsFused(const TqView& v, const TqTables& t, const float* w, size_t w_stride,
                                const uint8_t* vp, size_t run_stride, size_t n, size_t vb, float* acc, size_t hd) {
  constexpr int kA = kGroups * kV;  // accumulators a head
  constexpr int kGroup = 16 * kV;
  static_assert(kR * kH * kA <= 16);
  __m512 a[kR * kH][kA];
#pragma GCC unroll 16
  for (int h = 0; h < kR * kH; ++h) {
#pragma GCC unroll 16
    for (int i = 0; i < kA; ++i) a[h][i] = _mm512_loadu_ps(acc + static_cast<size_t>(h) * hd + 16 * i);
  }
  alignas(64) float x[kR][kGroups][16 * kGroup];
  alignas(64) float ws[kR * kH][kGroups][16];  // the block's weights times its scales
  alignas(64) float sc[16];
  for (size_t t0 = 0; t0 < n; t0 += 16) {
    const size_t m = std::min<size_t>(16, n - t0);
    const __mmask16 live = static_cast<__mmask16>((1u << m) - 1);
    for (int r = 0; r < kR; ++r) {
      const uint8_t* vt = vp + static_cast<size_t>(r) * run_stride + t0 * vb;
      PrefetchLines(vt + kFusedPrefetchBytes, 16 * vb);
      for (int g = 0; g < kGroups; ++g) {
        kLookup(v, t, vt + static_cast<size_t>(g) * static_cast<size_t>(v.group_bytes), vb, m, x[r][g], sc);
        for (int h = r * kH; h < (r + 1) * kH; ++h) {
          const __m512 wv = _mm512_maskz_loadu_ps(live, w + static_cast<size_t>(h) * w_stride + t0);
          _mm512_store_ps(ws[h][g], _mm512_mul_ps(wv, _mm512_load_ps(sc)));
        }
      }
    }
    for (size_t i = 0; i < m; ++i) {
#pragma GCC unroll 4
      for (int r = 0; r < kR; ++r) {
#pragma GCC unroll 4
        for (int g = 0; g < kGroups; ++g) {
          const float* xi = x[r][g] + i * kGroup;
#pragma GCC unroll 16
          for (int h = r * kH; h < (r + 1) * kH; ++h) {
            const __m512 wv = _mm512_set1_ps(ws[h][g][i]);
#pragma GCC unroll 16
            for (int j = 0; j < kV; ++j) {
              a[h][g * kV + j] = _mm512_fmadd_ps(wv, _mm512_load_ps(xi + 16 * j), a[h][g * kV + j]);
            }
          }
        }
      }
    }
  }
#pragma GCC unroll 16
  for (int h = 0; h < kR * kH; ++h) {
#pragma GCC unroll 16
    for (int i = 0; i < kA; ++i) _mm512_storeu_ps(acc + static_cast<size_t>(h) * hd + 16 * i, a[h][i]);
  }
}

// The fused sums for `heads` heads of `runs` runs, two runs a pass where their
// accumulators fit the registers; false (nothing done) when one run's heads do not.
template <int kV, int kGroups, LookupBlockFn kLookup>
bool TqSumsFusedRuns(const TqView& v, const TqTables& t, const float* w, size_t w_stride, int heads, int runs,
                     const uint8_t* vp, size_t run_stride, size_t n, size_t vb, float* acc, size_t hd) {
  constexpr int kA = kGroups * kV;
  if (heads * kA > 16 || (heads != 1 && heads != 2 && heads != 4)) return false;
  const auto pass = [&](auto h_c, auto r_c, int r0) {
    constexpr int kH = decltype(h_c)::value, kR = decltype(r_c)::value;
    if constexpr (kR * kH * kA <= 16) {
      const size_t row0 = static_cast<size_t>(r0) * static_cast<size_t>(kH);
      TqSumsFused<kV, kGroups, kH, kR, kLookup>(v, t, w + row0 * w_stride, w_stride, vp + r0 * run_stride, run_stride,
                                                n, vb, acc + row0 * hd, hd);
    }
  };
  const auto with_heads = [&](auto r_c, int r0) {
    switch (heads) {
      case 1: return pass(std::integral_constant<int, 1>{}, r_c, r0);
      case 2: return pass(std::integral_constant<int, 2>{}, r_c, r0);
      default: return pass(std::integral_constant<int, 4>{}, r_c, r0);
    }
  };
  int r = 0;
  if (2 * heads * kA <= 16) {
    for (; r + 2 <= runs; r += 2) with_heads(std::integral_constant<int, 2>{}, r);
  }
  for (; r < runs; ++r) with_heads(std::integral_constant<int, 1>{}, r);
  return true;
}

// The fused kernels of one (bits, group, groups a vector).
struct TqFused {
  void (*scores)(const TqView&, const TqTables&, const float*, int, size_t, const uint8_t*, size_t, size_t, float*,
                 size_t) = nullptr;
  bool (*sums)(const TqView&, const TqTables&, const float*, size_t, int, int, const uint8_t*, size_t, size_t, size_t,
               float*, size_t) = nullptr;
};

template <int kV, LookupBlockFn kLookup>
TqFused MakeTqFused(int groups) {
  TqFused f;
  f.scores = TqScoresFusedHeads<kV, kLookup>;
  if (groups == 1) f.sums = TqSumsFusedRuns<kV, 1, kLookup>;
  if constexpr (kV == 4) {
    if (groups == 2) f.sums = TqSumsFusedRuns<kV, 2, kLookup>;
  }
  return f;
}

template <int kBits, int kV>
TqFused MakeTqFused(int groups, bool vbmi) {
  return vbmi ? MakeTqFused<kV, LookupBlockVbmi<kBits, kV>>(groups)
              : MakeTqFused<kV, LookupBlockAvx512<kBits, kV>>(groups);
}

// The fused kernels for a codec's shape; empty for groups other than 32 or 64 values.
TqFused TqFusedFor(int bits, int group, int groups, bool vbmi) {
  if (group == 32) return bits == 4 ? MakeTqFused<4, 2>(groups, vbmi) : MakeTqFused<3, 2>(groups, vbmi);
  if (group == 64) return bits == 4 ? MakeTqFused<4, 4>(groups, vbmi) : MakeTqFused<3, 4>(groups, vbmi);
  return {};
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // TIERKV_CODEC_X86

// The row loops around the f16 kernels: out = a * b, or acc = acc + a * b (a product,
// then a sum: never fused, so every kernel family gives the same bits).
using RowFn = void (*)(const float* a, const float* b, size_t m, float* out);
void MulRowGeneric(const float* a, const float* b, size_t m, float* out) {
  for (size_t t = 0; t < m; ++t) out[t] = a[t] * b[t];
}
void MulAddRowGeneric(const float* a, const float* b, size_t m, float* acc) {
  for (size_t t = 0; t < m; ++t) acc[t] = acc[t] + a[t] * b[t];
}
#if defined(TIERKV_CODEC_X86)
// (The masked forms are builtins: GCC never contracts them into an FMA.)
TIERKV_AVX512BW void MulRowAvx512(const float* a, const float* b, size_t m, float* out) {
  for (size_t t = 0; t < m; t += 16) {
    const __mmask16 k = m - t >= 16 ? 0xffff : static_cast<__mmask16>((1u << (m - t)) - 1);
    _mm512_mask_storeu_ps(out + t, k,
                          _mm512_maskz_mul_ps(k, _mm512_maskz_loadu_ps(k, a + t), _mm512_maskz_loadu_ps(k, b + t)));
  }
}
TIERKV_AVX512BW void MulAddRowAvx512(const float* a, const float* b, size_t m, float* acc) {
  for (size_t t = 0; t < m; t += 16) {
    const __mmask16 k = m - t >= 16 ? 0xffff : static_cast<__mmask16>((1u << (m - t)) - 1);
    const __m512 p = _mm512_maskz_mul_ps(k, _mm512_maskz_loadu_ps(k, a + t), _mm512_maskz_loadu_ps(k, b + t));
    _mm512_mask_storeu_ps(acc + t, k, _mm512_maskz_add_ps(k, _mm512_maskz_loadu_ps(k, acc + t), p));
  }
}
#endif

// Per-thread room for a batch's decoded centroids and the per-vector numbers around them.
struct TqScratch {
  static constexpr size_t kHalves = 8192;  // 16 KiB of fp16: stays in L1 while the f16 kernels read it
  alignas(64) uint16_t halves[kHalves];
  std::vector<float> scales;  // [runs][vectors]
  std::vector<float> temp;    // scores of a later group, or scaled weights: [heads][vectors]
  std::vector<float> q;       // one group's slice of the queries, or of the accumulators
};
TqScratch& Scratch() {
  thread_local TqScratch s;
  return s;
}
void Fit(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// ---- the codec ------------------------------------------------------------------------

class TqCodec final : public VectorCodec {
 public:
  TqCodec(KvCodec codec, int head_dim, uint64_t seed, int bits, int group,
          std::shared_ptr<const TqCodebooks> codebooks, const codec_internal::TqOptions& opt,
          std::unique_ptr<VectorCodec> f16)
      : VectorCodec(codec, head_dim, seed,
                    static_cast<size_t>(head_dim / group) * (2 + group * bits / 8)),
        levels_(1 << bits),
        opt_(opt),
        rotation_(head_dim, seed, opt.rounds, group),
        codebooks_(std::move(codebooks)),
        sqrt_group_(std::sqrt(static_cast<double>(group))),
        f16_(std::move(f16)) {
    // The codec's centroids are the designed ones rounded to fp16 (attention reads them
    // through the f16 kernels); the encoder fits against the same values.
    for (int b = 0; b < kTqBooks; ++b) {
      for (int k = 0; k < kMaxLevels; ++k) {
        books_[b][k] = k < levels_ ? HalfToFloat(FloatToHalf(codebooks_->centroids[b * levels_ + k])) : 0.0f;
      }
      for (int k = 0; k < kMaxLevels; ++k) {
        thresholds_[b][k] = INFINITY;
        tables_.floats[b][k] = books_[b][k % levels_];
      }
      for (int k = 0; k + 1 < levels_; ++k) thresholds_[b][k] = (books_[b][k] + books_[b][k + 1]) / 2;
      for (int k = 0; k < 32; ++k) tables_.halves[b][k] = FloatToHalf(books_[b][k % levels_]);
    }
    view_ = {head_dim / group, group, bits, 2 + group * bits / 8,
             static_cast<uint16_t>(opt.books > 1 ? kTqBooks - 1 : 0)};
    decode_ = DecodeGroupGeneric;
#if defined(TIERKV_CODEC_X86)
    if (codec_internal::UseAvx2Kernels()) {
      const kernels::CpuFeatures& cpu = kernels::CpuHas();
      if (codec_internal::UseAvx512Kernels() && cpu.avx512bw && cpu.avx512vl && group >= 16) {
        decode_ = DecodeGroupAvx512For(bits, group);
        tile_keys_ = TileKeysAvx512;
        fused_ = TqFusedFor(bits, group, head_dim / group, codec_internal::UseAvx512Vbmi());
        mul_row_ = MulRowAvx512;
        mul_add_row_ = MulAddRowAvx512;
        kernel_ = "avx512";
      } else {
        decode_ = bits == 4 ? DecodeGroupAvx2<4> : DecodeGroupAvx2<3>;
        kernel_ = "avx2";
      }
    }
#endif
  }

  void Encode(const float* x, void* out) const override;

  void Decode(const void* in, float* out) const override {
    std::fill(out, out + head_dim(), 0.0f);
    Accumulate(1.0f, in, out);
    rotation_.Inverse(out, out);
  }
  void PrepareQuery(const float* q, float* q_prep) const override {
    rotation_.Forward(q, q_prep);
  }
  float Dot(const float* q_prep, const void* k_enc) const override {
    float score;
    DotManyGroup(q_prep, 1, k_enc, 1, &score, 1);
    return score;
  }
  void Accumulate(float w, const void* v_enc, float* acc) const override {
    AccumulateManyGroup(&w, 1, 1, v_enc, 1, acc);
  }
  void FinishOutput(const float* acc, float* out) const override { rotation_.Inverse(acc, out); }
  void DotMany(const float* q_prep, const void* k_enc, size_t n, float* scores) const override {
    DotManyGroup(q_prep, 1, k_enc, n, scores, n);
  }
  void AccumulateMany(const float* w, const void* v_enc, size_t n, float* acc) const override {
    AccumulateManyGroup(w, n, 1, v_enc, n, acc);
  }
  void DotManyGroup(const float* q_prep, int heads, const void* k_enc, size_t n, float* scores,
                    size_t scores_stride) const override;
  void AccumulateManyGroup(const float* w, size_t w_stride, int heads, const void* v_enc, size_t n,
                           float* acc) const override;
  void AccumulateManyGroupRuns(const float* w, size_t w_stride, int heads, int runs, const void* v_enc,
                               size_t run_stride, size_t n, float* acc) const override;
  // Decoded runs: per group, the scales of the run's vectors and their centroids as fp16,
  // keys as f16 key tiles (the f16 tiled scores), values vector by vector.
  size_t DecodedRunBytes(size_t n, bool keys) const override {
    return static_cast<size_t>(view_.groups) * RoundUp16(n) * (sizeof(float) + 2 * static_cast<size_t>(view_.group));
  }
  void DecodeRun(const void* enc, size_t n, bool keys, void* decoded) const override;
  void DotManyGroupDecoded(const float* q_prep, int heads, const void* decoded, size_t run_n, size_t n,
                           float* scores, size_t scores_stride) const override;
  void AccumulateManyGroupDecoded(const float* w, size_t w_stride, int heads, const void* decoded, size_t run_n,
                                  size_t n, float* acc) const override;
  const char* kernel_name() const override { return kernel_; }


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
  static size_t RoundUp16(size_t n) { return (n + 15) / 16 * 16; }
  // A decoded run of run_n vectors: group g's scales, and its fp16 centroids.
  const float* RunScales(const void* decoded, size_t run_n, int g) const {
    return static_cast<const float*>(decoded) + static_cast<size_t>(g) * RoundUp16(run_n);
  }
  const uint16_t* RunHalves(const void* decoded, size_t run_n, int g) const {
    const size_t n16 = RoundUp16(run_n);
    const auto* halves = reinterpret_cast<const uint16_t*>(static_cast<const float*>(decoded) +
                                                           static_cast<size_t>(view_.groups) * n16);
    return halves + static_cast<size_t>(g) * n16 * static_cast<size_t>(view_.group);
  }
  // fn(s0, m, g, halves, scales) for each chunk of vectors [s0, s0 + m) of the n at enc
  // and each group g, with that group's centroids ([m][group] fp16) and scales decoded
  // into the thread's scratch.
  template <typename F>
  void ForEachDecodedChunk(const void* enc, size_t n, F&& fn) const;
  // The per-group steps around the f16 kernels, shared by the encoded and decoded forms.
  void SliceGroups(const float* rows, size_t heads, float* slices) const;  // [heads][hd] -> [groups][heads][group]
  void JoinGroups(const float* slices, size_t heads, float* rows) const;   // the inverse
  // Scores of group g from the f16 kernel's dot products `part` ([heads][part_stride]):
  // g == 0 sets them, a later group adds to them (the rows may be `part` itself for g == 0).
  void ScaleScores(int g, const float* scales, size_t m, size_t heads, const float* part, size_t part_stride,
                   float* scores, size_t stride) const;
  void ScaleWeights(const float* w, size_t w_stride, size_t heads, const float* scales, size_t m, float* out) const;

  int levels_;
  codec_internal::TqOptions opt_;
  TqRotation rotation_;
  std::shared_ptr<const TqCodebooks> codebooks_;
  double sqrt_group_;
  alignas(32) float books_[kTqBooks][kMaxLevels];  // centroids, padded with 0
  float thresholds_[kTqBooks][kMaxLevels];         // padded with +inf
  TqView view_;
  TqTables tables_;
  DecodeGroupFn decode_;
  void (*tile_keys_)(const uint16_t* rows, size_t group, uint16_t* tile) = TileKeysGeneric;
#if defined(TIERKV_CODEC_X86)
  TqFused fused_;  // empty: the decode-then-f16 path only
#endif
  RowFn mul_row_ = MulRowGeneric;
  RowFn mul_add_row_ = MulAddRowGeneric;
  const char* kernel_ = "generic";
  std::unique_ptr<VectorCodec> f16_;  // head_dim = group: the kernels attention runs on
};

void TqCodec::SliceGroups(const float* rows, size_t heads, float* slices) const {
  const size_t group = static_cast<size_t>(view_.group);
  const size_t hd = static_cast<size_t>(head_dim());
  for (int g = 0; g < view_.groups; ++g) {
    for (size_t h = 0; h < heads; ++h) {
      std::memcpy(slices + (g * heads + h) * group, rows + h * hd + g * group, sizeof(float) * group);
    }
  }
}

void TqCodec::JoinGroups(const float* slices, size_t heads, float* rows) const {
  const size_t group = static_cast<size_t>(view_.group);
  const size_t hd = static_cast<size_t>(head_dim());
  for (int g = 0; g < view_.groups; ++g) {
    for (size_t h = 0; h < heads; ++h) {
      std::memcpy(rows + h * hd + g * group, slices + (g * heads + h) * group, sizeof(float) * group);
    }
  }
}

void TqCodec::ScaleScores(int g, const float* scales, size_t m, size_t heads, const float* part, size_t part_stride,
                          float* scores, size_t stride) const {
  for (size_t h = 0; h < heads; ++h) {
    (g == 0 ? mul_row_ : mul_add_row_)(scales, part + h * part_stride, m, scores + h * stride);
  }
}

void TqCodec::ScaleWeights(const float* w, size_t w_stride, size_t heads, const float* scales, size_t m,
                           float* out) const {
  for (size_t h = 0; h < heads; ++h) mul_row_(w + h * w_stride, scales, m, out + h * m);
}

template <typename F>
void TqCodec::ForEachDecodedChunk(const void* enc, size_t n, F&& fn) const {
  const auto* p = static_cast<const uint8_t*>(enc);
  TqScratch& s = Scratch();
  const size_t chunk = std::max<size_t>(1, TqScratch::kHalves / static_cast<size_t>(view_.group));
  Fit(s.scales, chunk);
  for (size_t s0 = 0; s0 < n; s0 += chunk) {
    const size_t m = std::min(chunk, n - s0);
    for (int g = 0; g < view_.groups; ++g) {
      decode_(view_, tables_, p + s0 * vector_bytes(), m, vector_bytes(), g, s.halves, s.scales.data());
      fn(s0, m, g, s.halves, s.scales.data());
    }
  }
}

void TqCodec::DotManyGroup(const float* q_prep, int heads, const void* k_enc, size_t n, float* scores,
                           size_t scores_stride) const {
#if defined(TIERKV_CODEC_X86)
  // Whole tiles of 16 keys fused; the rest (and other shapes) through the f16 kernels.
  if (const size_t whole = fused_.scores != nullptr ? n / 16 * 16 : 0; whole > 0) {
    fused_.scores(view_, tables_, q_prep, heads, static_cast<size_t>(head_dim()), static_cast<const uint8_t*>(k_enc),
                  whole, vector_bytes(), scores, scores_stride);
    if (whole == n) return;
    k_enc = static_cast<const uint8_t*>(k_enc) + whole * vector_bytes();
    scores += whole;
    n -= whole;
  }
#endif
  const size_t group = static_cast<size_t>(view_.group);
  const size_t nh = static_cast<size_t>(heads);
  TqScratch& s = Scratch();
  if (view_.groups > 1) {  // each group's slice of the queries, contiguous
    Fit(s.temp, nh * (TqScratch::kHalves / group));
    Fit(s.q, nh * static_cast<size_t>(head_dim()));
    SliceGroups(q_prep, nh, s.q.data());
  }
  ForEachDecodedChunk(k_enc, n, [&](size_t s0, size_t m, int g, const uint16_t* halves, const float* scales) {
    const float* qg = view_.groups == 1 ? q_prep : &s.q[g * nh * group];
    float* part = g == 0 ? scores + s0 : s.temp.data();
    const size_t part_stride = g == 0 ? scores_stride : m;
    f16_->DotManyGroup(qg, heads, halves, m, part, part_stride);
    ScaleScores(g, scales, m, nh, part, part_stride, scores + s0, scores_stride);
  });
}

void TqCodec::AccumulateManyGroup(const float* w, size_t w_stride, int heads, const void* v_enc, size_t n,
                                  float* acc) const {
#if defined(TIERKV_CODEC_X86)
  if (fused_.sums != nullptr && fused_.sums(view_, tables_, w, w_stride, heads, 1, static_cast<const uint8_t*>(v_enc),
                                            0, n, vector_bytes(), acc, static_cast<size_t>(head_dim()))) {
    return;
  }
#endif
  const size_t group = static_cast<size_t>(view_.group);
  const size_t nh = static_cast<size_t>(heads);
  TqScratch& s = Scratch();
  Fit(s.temp, nh * std::max<size_t>(1, TqScratch::kHalves / group));
  const bool split = view_.groups > 1;  // then each group's accumulators, contiguous
  if (split) {
    Fit(s.q, nh * static_cast<size_t>(head_dim()));
    SliceGroups(acc, nh, s.q.data());
  }
  ForEachDecodedChunk(v_enc, n, [&](size_t s0, size_t m, int g, const uint16_t* halves, const float* scales) {
    ScaleWeights(w + s0, w_stride, nh, scales, m, s.temp.data());
    f16_->AccumulateManyGroup(s.temp.data(), m, heads, halves, m, split ? &s.q[g * nh * group] : acc);
  });
  if (split) JoinGroups(s.q.data(), nh, acc);
}

void TqCodec::DecodeRun(const void* enc, size_t n, bool keys, void* decoded) const {
  const auto* p = static_cast<const uint8_t*>(enc);
  const size_t group = static_cast<size_t>(view_.group);
  for (int g = 0; g < view_.groups; ++g) {
    auto* scales = const_cast<float*>(RunScales(decoded, n, g));
    auto* halves = const_cast<uint16_t*>(RunHalves(decoded, n, g));
    if (!keys) {
      decode_(view_, tables_, p, n, vector_bytes(), g, halves, scales);
      continue;
    }
    // Keys: 16 vectors at a time, decoded, then laid out as an f16 key tile (dimension by
    // dimension; a last tile's missing lanes are zeros).
    alignas(64) uint16_t rows[16 * kTqGroup];
    for (size_t i0 = 0; i0 < n; i0 += 16) {
      const size_t m = std::min<size_t>(16, n - i0);
      decode_(view_, tables_, p + i0 * vector_bytes(), m, vector_bytes(), g, rows, scales + i0);
      std::fill(rows + m * group, rows + 16 * group, uint16_t{0});
      tile_keys_(rows, group, halves + i0 * group);
    }
  }
}

void TqCodec::DotManyGroupDecoded(const float* q_prep, int heads, const void* decoded, size_t run_n, size_t n,
                                  float* scores, size_t scores_stride) const {
  const size_t group = static_cast<size_t>(view_.group);
  const size_t nh = static_cast<size_t>(heads);
  TqScratch& s = Scratch();
  if (view_.groups > 1) {
    Fit(s.temp, nh * n);
    Fit(s.q, nh * static_cast<size_t>(head_dim()));
    SliceGroups(q_prep, nh, s.q.data());
  }
  for (int g = 0; g < view_.groups; ++g) {
    const float* qg = view_.groups == 1 ? q_prep : &s.q[g * nh * group];
    float* part = g == 0 ? scores : s.temp.data();
    const size_t part_stride = g == 0 ? scores_stride : n;
    f16_->DotManyGroupTiled(qg, heads, RunHalves(decoded, run_n, g), n, part, part_stride);
    ScaleScores(g, RunScales(decoded, run_n, g), n, nh, part, part_stride, scores, scores_stride);
  }
}

void TqCodec::AccumulateManyGroupDecoded(const float* w, size_t w_stride, int heads, const void* decoded,
                                         size_t run_n, size_t n, float* acc) const {
  const size_t group = static_cast<size_t>(view_.group);
  const size_t nh = static_cast<size_t>(heads);
  TqScratch& s = Scratch();
  Fit(s.temp, nh * n);
  const bool split = view_.groups > 1;
  if (split) {
    Fit(s.q, nh * static_cast<size_t>(head_dim()));
    SliceGroups(acc, nh, s.q.data());
  }
  for (int g = 0; g < view_.groups; ++g) {
    ScaleWeights(w, w_stride, nh, RunScales(decoded, run_n, g), n, s.temp.data());
    f16_->AccumulateManyGroup(s.temp.data(), n, heads, RunHalves(decoded, run_n, g), n,
                              split ? &s.q[g * nh * group] : acc);
  }
  if (split) JoinGroups(s.q.data(), nh, acc);
}

// One group per vector: the runs go to the f16 kernels together (pairs of KV heads side by
// side where they fit the registers); per head the same bits as one run at a time.
void TqCodec::AccumulateManyGroupRuns(const float* w, size_t w_stride, int heads, int runs, const void* v_enc,
                                      size_t run_stride, size_t n, float* acc) const {
#if defined(TIERKV_CODEC_X86)
  if (fused_.sums != nullptr && fused_.sums(view_, tables_, w, w_stride, heads, runs,
                                            static_cast<const uint8_t*>(v_enc), run_stride, n, vector_bytes(), acc,
                                            static_cast<size_t>(head_dim()))) {
    return;
  }
#endif
  const size_t group = static_cast<size_t>(view_.group);
  const size_t nr = static_cast<size_t>(runs);
  if (view_.groups > 1 || runs < 2 || nr * group > TqScratch::kHalves) {
    return VectorCodec::AccumulateManyGroupRuns(w, w_stride, heads, runs, v_enc, run_stride, n, acc);
  }
  const auto* p = static_cast<const uint8_t*>(v_enc);
  const size_t nh = static_cast<size_t>(heads);
  TqScratch& s = Scratch();
  const size_t chunk = TqScratch::kHalves / (nr * group);
  Fit(s.scales, nr * chunk);
  Fit(s.temp, nr * nh * chunk);
  for (size_t s0 = 0; s0 < n; s0 += chunk) {
    const size_t m = std::min(chunk, n - s0);
    for (size_t r = 0; r < nr; ++r) {
      decode_(view_, tables_, p + r * run_stride + s0 * vector_bytes(), m, vector_bytes(), 0,
              s.halves + r * m * group, &s.scales[r * m]);
      for (size_t h = 0; h < nh; ++h) {
        const float* wh = w + (r * nh + h) * w_stride + s0;
        float* scaled = &s.temp[(r * nh + h) * m];
        for (size_t t = 0; t < m; ++t) scaled[t] = wh[t] * s.scales[r * m + t];
      }
    }
    f16_->AccumulateManyGroupRuns(s.temp.data(), m, heads, runs, s.halves, m * group * 2, m, acc);
  }
}

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
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<VectorCodec> f16, VectorCodec::Create(KvCodec::kF16, group, seed));
  return std::unique_ptr<VectorCodec>(
      new TqCodec(codec, head_dim, seed, bits, group, std::move(cb), options, std::move(f16)));
}

}  // namespace codec_internal
}  // namespace tierkv
