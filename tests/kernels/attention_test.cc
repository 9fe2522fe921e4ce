// tests/kernels/attention_test.cc
//
// Paged attention against a double-precision reference (causal, GQA), with test codecs
// defined here (kernels/ may not use kvcache's): results must not depend on how blocks
// are batched or on the thread count, bit for bit; a codec working in another domain
// (FinishOutput) must give the same answer. And the f16 sums in llama.cpp's orders
// (kernels/attention_sums.h) against those orders written out value by value.
#include "kernels/attention.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <atomic>
#include <random>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu_features.h"
#include "kernels/fp16.h"
#include "kernels/thread_pool.h"
#include "tests/kernels/sum_orders.h"

namespace tierkv::kernels {
namespace {

// Stores f32 values; sign = -1 stores negated values, with the query negated in
// PrepareQuery and the accumulator negated back in FinishOutput (a codec with its own
// accumulation domain, like tq's rotation).
class F32Codec {
 public:
  explicit F32Codec(int head_dim, float sign = 1.0f) : hd_(head_dim), sign_(sign) {}
  int head_dim() const { return hd_; }
  size_t vector_bytes() const { return static_cast<size_t>(hd_) * 4; }
  void Encode(const float* x, void* out) const {
    auto* o = static_cast<float*>(out);
    for (int i = 0; i < hd_; ++i) o[i] = sign_ * x[i];
  }
  void PrepareQuery(const float* q, float* out) const {
    for (int i = 0; i < hd_; ++i) out[i] = sign_ * q[i];
  }
  void DotMany(const float* q, const void* k, size_t n, float* s) const {
    const auto* kf = static_cast<const float*>(k);
    for (size_t j = 0; j < n; ++j) {
      float acc = 0;
      for (int i = 0; i < hd_; ++i) acc += q[i] * kf[j * hd_ + i];
      s[j] = acc;
    }
  }
  void AccumulateMany(const float* w, const void* v, size_t n, float* acc) const {
    const auto* vf = static_cast<const float*>(v);
    for (size_t j = 0; j < n; ++j) {
      for (int i = 0; i < hd_; ++i) acc[i] += w[j] * vf[j * hd_ + i];
    }
  }
  void FinishOutput(const float* acc, float* out) const {
    for (int i = 0; i < hd_; ++i) out[i] = sign_ * acc[i];
  }

 private:
  int hd_;
  float sign_;
};
static_assert(AttentionCodec<F32Codec>);

// F32Codec with the grouped members (GroupedAttentionCodec), computed per head and token
// in the same order as its DotMany / AccumulateMany; counts the heads of each call.
class GroupedF32Codec : public F32Codec {
 public:
  using F32Codec::F32Codec;
  void DotManyGroup(const float* q, int heads, const void* k, size_t n, float* s, size_t stride) const {
    last_heads = heads;
    ++group_calls;
    for (int h = 0; h < heads; ++h) DotMany(q + h * head_dim(), k, n, s + h * stride);
  }
  void AccumulateManyGroup(const float* w, size_t stride, int heads, const void* v, size_t n, float* acc) const {
    last_heads = heads;
    ++group_calls;
    // Token-major, like a kernel that reads each V vector once for every head.
    const auto* vf = static_cast<const float*>(v);
    for (size_t j = 0; j < n; ++j) {
      for (int h = 0; h < heads; ++h) {
        for (int i = 0; i < head_dim(); ++i) acc[h * head_dim() + i] += w[h * stride + j] * vf[j * head_dim() + i];
      }
    }
  }
  mutable std::atomic<int> group_calls{0};
  mutable std::atomic<int> last_heads{0};
};
static_assert(GroupedAttentionCodec<GroupedF32Codec>);
static_assert(!GroupedAttentionCodec<F32Codec>);

struct Fixture {
  int n_heads = 8, n_kv = 2, hd = 32, block_tokens = 16, n_tokens = 75;
  std::vector<float> k, v, q;  // k, v: [n_tokens][n_kv][hd]; q: [n_heads][hd]
  std::vector<std::vector<std::byte>> blocks;
  std::vector<const std::byte*> ptrs;

  void Build(const F32Codec& codec, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    k.resize(static_cast<size_t>(n_tokens) * n_kv * hd);
    v.resize(k.size());
    q.resize(static_cast<size_t>(n_heads) * hd);
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    for (float& x : q) x = 2.0f * normal(rng);  // peaky softmax
    const size_t vb = codec.vector_bytes();
    const int n_blocks = (n_tokens + block_tokens - 1) / block_tokens;
    blocks.assign(static_cast<size_t>(n_blocks), std::vector<std::byte>(2 * n_kv * block_tokens * vb));
    for (int t = 0; t < n_tokens; ++t) {
      auto& blk = blocks[static_cast<size_t>(t / block_tokens)];
      for (int g = 0; g < n_kv; ++g) {
        const size_t off = (static_cast<size_t>(g) * block_tokens + t % block_tokens) * vb;
        codec.Encode(&k[(static_cast<size_t>(t) * n_kv + g) * hd], blk.data() + off);
        codec.Encode(&v[(static_cast<size_t>(t) * n_kv + g) * hd], blk.data() + n_kv * block_tokens * vb + off);
      }
    }
    ptrs.clear();
    for (auto& b : blocks) ptrs.push_back(b.data());
  }

  AttentionParams Params(int64_t query_pos) const {
    AttentionParams p;
    p.n_heads = n_heads;
    p.n_kv_heads = n_kv;
    p.head_dim = hd;
    p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    p.query_pos = query_pos;
    return p;
  }

  PagedKvView View(int first, int count, size_t vb) const {
    PagedKvView view;
    view.blocks = ptrs.data() + first;
    view.n_blocks = count;
    view.first_block = first;
    view.n_tokens = n_tokens;
    view.block_tokens = block_tokens;
    view.n_kv_heads = n_kv;
    view.vector_bytes = vb;
    return view;
  }

  std::vector<double> Reference(int64_t query_pos) const {
    std::vector<double> out(static_cast<size_t>(n_heads) * hd, 0.0);
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    for (int h = 0; h < n_heads; ++h) {
      const int g = h / (n_heads / n_kv);
      std::vector<double> s;
      for (int t = 0; t <= query_pos && t < n_tokens; ++t) {
        double d = 0;
        for (int i = 0; i < hd; ++i) d += static_cast<double>(q[h * hd + i]) * k[(t * n_kv + g) * hd + i];
        s.push_back(d * scale);
      }
      double m = -1e300, sum = 0;
      for (double x : s) m = std::max(m, x);
      for (double& x : s) sum += (x = std::exp(x - m));
      for (size_t t = 0; t < s.size(); ++t) {
        for (int i = 0; i < hd; ++i) out[h * hd + i] += s[t] / sum * v[(t * n_kv + g) * hd + i];
      }
    }
    return out;
  }
};

template <typename Codec>
std::vector<float> RunAttention(const Codec& codec, const Fixture& f, const AttentionParams& p,
                                const std::vector<int>& batch_sizes, ThreadPool* pool) {
  AttentionState st;
  AttentionBegin(codec, p, f.q.data(), &st);
  int b = 0;
  for (int n : batch_sizes) {
    AttentionBlocks(codec, p, f.View(b, n, codec.vector_bytes()), &st, pool);
    b += n;
  }
  std::vector<float> out(f.q.size());
  AttentionEnd(codec, p, &st, out.data());
  return out;
}

template <typename Codec>
std::vector<float> RunTwoPass(const Codec& codec, const Fixture& f, const AttentionParams& p,
                              const std::vector<int>& batch_sizes, ThreadPool* pool) {
  AttentionState st;
  AttentionBegin(codec, p, f.q.data(), &st);
  int b = 0;
  for (int n : batch_sizes) {
    AttentionScores(codec, p, f.View(b, n, codec.vector_bytes()), &st, pool);
    b += n;
  }
  AttentionSoftmax(p, &st, pool);
  b = 0;
  for (int n : batch_sizes) {
    AttentionValues(codec, p, f.View(b, n, codec.vector_bytes()), &st, pool);
    b += n;
  }
  std::vector<float> out(f.q.size());
  AttentionEnd(codec, p, &st, out.data());
  return out;
}

TEST(AttentionTest, MatchesDoubleReference) {
  F32Codec codec(32);
  Fixture f;
  f.Build(codec, 1);
  for (int64_t qp : {0, 1, 15, 16, 40, 74}) {
    SCOPED_TRACE("query_pos " + std::to_string(qp));
    const std::vector<float> got = RunAttention(codec, f, f.Params(qp), {5}, nullptr);
    const std::vector<double> ref = f.Reference(qp);
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 1e-5) << i;
  }
}

TEST(AttentionTest, BatchingAndThreadsAreBitIdentical) {
  F32Codec codec(32);
  Fixture f;
  f.Build(codec, 2);
  ThreadPool pool(3);
  const AttentionParams p = f.Params(74);
  const std::vector<float> all = RunAttention(codec, f, p, {5}, nullptr);
  EXPECT_EQ(RunAttention(codec, f, p, {1, 1, 1, 1, 1}, nullptr), all);
  EXPECT_EQ(RunAttention(codec, f, p, {2, 3}, &pool), all);
  EXPECT_EQ(RunAttention(codec, f, p, {4, 1}, &pool), all);
}

TEST(AttentionTest, CodecDomainIsHonoured) {
  F32Codec plain(32), negated(32, -1.0f);
  Fixture a, b;
  a.Build(plain, 3);
  b.Build(negated, 3);
  EXPECT_EQ(RunAttention(plain, a, a.Params(60), {5}, nullptr), RunAttention(negated, b, b.Params(60), {5}, nullptr));
}

TEST(AttentionTest, F16RoundingStaysClose) {
  F32Codec codec(32);
  Fixture f;
  f.Build(codec, 4);
  AttentionParams p = f.Params(74);
  p.round_query_f16 = true;
  p.round_weights_f16 = true;
  const std::vector<float> got = RunAttention(codec, f, p, {5}, nullptr);
  const std::vector<double> ref = f.Reference(74);
  double max_err = 0;
  for (size_t i = 0; i < ref.size(); ++i) max_err = std::max(max_err, std::fabs(got[i] - ref[i]));
  EXPECT_LT(max_err, 5e-3);
  EXPECT_GT(max_err, 0.0);  // the options do round
}

TEST(AttentionTest, TwoPassMatchesReferenceAndOnline) {
  F32Codec codec(32);
  Fixture f;
  f.Build(codec, 6);
  for (int64_t qp : {0, 9, 16, 74}) {
    SCOPED_TRACE("query_pos " + std::to_string(qp));
    const std::vector<float> two = RunTwoPass(codec, f, f.Params(qp), {5}, nullptr);
    const std::vector<float> online = RunAttention(codec, f, f.Params(qp), {5}, nullptr);
    const std::vector<double> ref = f.Reference(qp);
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_NEAR(two[i], ref[i], 1e-5) << i;
      ASSERT_NEAR(two[i], online[i], 1e-5) << i;
    }
  }
}

TEST(AttentionTest, TwoPassBatchingAndThreadsAreBitIdentical) {
  F32Codec codec(32);
  Fixture f;
  f.n_tokens = 200;  // enough work for the pool to fork
  f.Build(codec, 7);
  ThreadPool pool(3);
  AttentionParams p = f.Params(199);
  p.round_query_f16 = p.round_weights_f16 = true;
  const std::vector<float> all = RunTwoPass(codec, f, p, {13}, nullptr);
  EXPECT_EQ(RunTwoPass(codec, f, p, std::vector<int>(13, 1), &pool), all);
  EXPECT_EQ(RunTwoPass(codec, f, p, {4, 9}, &pool), all);
  EXPECT_EQ(RunTwoPass(codec, f, p, {12, 1}, nullptr), all);
}

// The two-pass weights are llama.cpp's: p_j = fp16(e_j * (float)(1 / sum)).
TEST(AttentionTest, TwoPassWeightsAreRoundedNormalisedWeights) {
  F32Codec codec(32);
  Fixture f;
  f.n_tokens = 40;
  f.Build(codec, 8);
  AttentionParams p = f.Params(39);
  p.round_query_f16 = p.round_weights_f16 = true;
  AttentionState st;
  AttentionBegin(codec, p, f.q.data(), &st);
  AttentionScores(codec, p, f.View(0, 3, codec.vector_bytes()), &st, nullptr);
  std::vector<float> scores(st.probs.begin(), st.probs.begin() + 40);  // head 0
  AttentionSoftmax(p, &st, nullptr);
  float max = scores[0];
  for (float s : scores) max = std::max(max, s);
  double sum = 0;
  for (float s : scores) sum += std::exp(static_cast<double>(s) - max);
  for (int j = 0; j < 40; ++j) {
    const double want = std::exp(static_cast<double>(scores[j]) - max) / sum;
    EXPECT_EQ(st.probs[j], RoundToF16(st.probs[j]));  // an f16 value
    EXPECT_NEAR(st.probs[j], want, want * 1e-3 + 1e-7);
  }
}

TEST(AttentionTest, SoftmaxSumFollowsGgmlOrder) {
  // 16-lane chunks reduced in f32: 1 + 2^-24 (lanes 0 and 8) rounds to 1 in f32, which a
  // plain double sum would keep.
  std::vector<float> x(20, 0.0f);
  x[0] = 1.0f;
  x[8] = 0x1p-24f;
  x[16] = 0x1p-24f;  // next chunk: added in double
  EXPECT_EQ(attention_internal::SumLikeGgml(x.data(), 20), 1.0 + 0x1p-24);
  EXPECT_EQ(attention_internal::SumLikeGgml(x.data(), 16), 1.0);
}

// A codec with grouped members gets one call per KV head and block with all the query
// heads of the group, and the same bits as per-head calls, in both forms.
TEST(AttentionTest, GroupedCodecGivesPerHeadBits) {
  F32Codec plain(32);
  GroupedF32Codec grouped(32);
  Fixture f;
  f.n_tokens = 300;
  f.Build(plain, 11);
  ThreadPool pool(2);
  for (bool two_pass : {false, true}) {
    AttentionParams p = f.Params(299);
    p.round_query_f16 = p.round_weights_f16 = two_pass;
    const std::vector<float> want = two_pass ? RunTwoPass(plain, f, p, {19}, nullptr) : RunAttention(plain, f, p, {19}, nullptr);
    grouped.group_calls = 0;
    const std::vector<float> got =
        two_pass ? RunTwoPass(grouped, f, p, {7, 12}, &pool) : RunAttention(grouped, f, p, {7, 12}, &pool);
    EXPECT_EQ(got, want) << (two_pass ? "two-pass" : "online");
    EXPECT_EQ(grouped.last_heads.load(), f.n_heads / f.n_kv);
    EXPECT_EQ(grouped.group_calls.load(), 2 * f.n_kv * 19);  // K and V, per KV head and block
  }
}

// Enough work for every pass to fork (the smaller fixtures stay below the threshold):
// any thread count, any batching, the same bits; GQA groups of 1, 2 and 4.
TEST(AttentionTest, LargeBatchingAndThreadsAreBitIdentical) {
  for (int n_kv : {8, 4, 2}) {
    F32Codec codec(64);
    Fixture f;
    f.n_kv = n_kv;
    f.hd = 64;
    f.n_tokens = 1500;
    f.block_tokens = 32;
    f.Build(codec, 12 + n_kv);
    const int blocks = (f.n_tokens + f.block_tokens - 1) / f.block_tokens;  // 47
    ThreadPool two(2), five(5);
    for (bool two_pass : {false, true}) {
      SCOPED_TRACE(std::to_string(n_kv) + (two_pass ? " kv heads, two-pass" : " kv heads, online"));
      AttentionParams p = f.Params(1400);
      p.round_query_f16 = p.round_weights_f16 = two_pass;
      auto run = [&](const std::vector<int>& batches, ThreadPool* pool) {
        return two_pass ? RunTwoPass(codec, f, p, batches, pool) : RunAttention(codec, f, p, batches, pool);
      };
      const std::vector<float> all = run({blocks}, nullptr);
      EXPECT_EQ(run({blocks}, &two), all);
      EXPECT_EQ(run({blocks}, &five), all);
      EXPECT_EQ(run({3, 40, 4}, &five), all);
      EXPECT_EQ(run(std::vector<int>(blocks, 1), &two), all);
    }
  }
}

// AttentionTwoPass (one batch, the passes fused per KV head) is the three separate calls,
// bit for bit: with at least as many KV heads as threads (one task per head) and with
// fewer (the three calls), with and without a pool, and with a causal cut.
TEST(AttentionTest, FusedTwoPassIsTheThreeCalls) {
  for (int n_kv : {8, 4, 2, 1}) {
    F32Codec codec(32);
    Fixture f;
    f.n_kv = n_kv;
    f.n_tokens = 700;
    f.block_tokens = 32;
    f.Build(codec, 40 + n_kv);
    const int blocks = (f.n_tokens + f.block_tokens - 1) / f.block_tokens;
    ThreadPool two(2), three(3);
    for (int64_t qp : {int64_t{699}, int64_t{650}}) {
      SCOPED_TRACE(std::to_string(n_kv) + " kv heads, query at " + std::to_string(qp));
      AttentionParams p = f.Params(qp);
      p.round_query_f16 = p.round_weights_f16 = true;
      const std::vector<float> want = RunTwoPass(codec, f, p, {blocks}, nullptr);
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &two, &three}) {
        AttentionState st;
        AttentionBegin(codec, p, f.q.data(), &st);
        AttentionTwoPass(codec, p, f.View(0, blocks, codec.vector_bytes()), &st, pool);
        std::vector<float> out(f.q.size());
        AttentionEnd(codec, p, &st, out.data());
        EXPECT_EQ(out, want) << (pool != nullptr ? pool->size() : 1) << " threads";
      }
    }
  }
}

// The softmax's exp (every level) is ExpGgml's bits, with the shift as the softmax
// applies it (x - max in f32 first).
TEST(AttentionTest, ExpShiftedIsExpGgml) {
  std::vector<float> x;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 40009) x.push_back(std::bit_cast<float>(static_cast<uint32_t>(b)));
  for (SimdLevel level : {SimdLevel::kAvx512, SimdLevel::kAvx2, SimdLevel::kScalar}) {
    ForceSimdLevel(level);
    for (float sub : {0.0f, 7.0f}) {
      std::vector<float> got(x.size());
      attention_internal::ExpShifted(x.data(), sub, static_cast<int64_t>(x.size()), got.data());
      for (size_t i = 0; i < x.size(); ++i) {
        const float want = ExpGgml(x[i] - sub);
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(got[i]));
        } else {
          ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want)) << std::hexfloat << x[i];
        }
      }
    }
  }
  ForceSimdLevel(SimdLevel::kAvx512);
}

// The AVX-512 and AVX2 softmax rows (max, exp, ggml-order sum, normalise, f16 rounding)
// are the scalar one, bit for bit: every length up to 140 (tails of the 16-lane chunks
// and of the 64-value sums) and long rows, peaky and flat scores, with and without f16
// rounding. A CPU without AVX-512 checks the AVX2 row alone.
TEST(AttentionTest, VectorSoftmaxRowIsScalarBitForBit) {
  if (DetectedSimdLevel() < SimdLevel::kAvx2) GTEST_SKIP() << "no AVX2";
  const bool avx512 = DetectedSimdLevel() >= SimdLevel::kAvx512;
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<int64_t> lengths;
  for (int64_t n = 0; n <= 140; ++n) lengths.push_back(n);
  for (int64_t n : {1000, 4097, 65537}) lengths.push_back(n);
  for (int64_t n : lengths) {
    for (float spread : {0.1f, 8.0f, 60.0f}) {
      std::vector<float> row(static_cast<size_t>(n));
      for (float& v : row) v = spread * normal(rng);
      for (bool round : {false, true}) {
        std::vector<float> a = row, b = row, c = row;
        const float mb = attention_internal::SoftmaxRowScalar(b.data(), n, round);
        const float mc = attention_internal::SoftmaxRowAvx2(c.data(), n, round);
        ASSERT_EQ(mc, mb) << n;
        if (avx512) {
          ASSERT_EQ(attention_internal::SoftmaxRowAvx512(a.data(), n, round), mb) << n;
        }
        for (int64_t j = 0; j < n; ++j) {
          if (avx512) {
            ASSERT_EQ(std::bit_cast<uint32_t>(a[j]), std::bit_cast<uint32_t>(b[j]))
                << "n " << n << " spread " << spread << " round " << round << " j " << j;
          }
          ASSERT_EQ(std::bit_cast<uint32_t>(c[j]), std::bit_cast<uint32_t>(b[j]))
              << "avx2 n " << n << " spread " << spread << " round " << round << " j " << j;
        }
      }
    }
  }
}

// The scores pass's scale-and-max (ScaleRowMax) at every level: the scaled values and the
// max are the scalar ones, bit for bit, NaN scores are skipped by the max, and the
// softmax given that max is the softmax that finds it itself.
TEST(AttentionTest, ScaleRowMaxIsScalarBitForBit) {
  if (DetectedSimdLevel() < SimdLevel::kAvx2) GTEST_SKIP() << "no AVX2";
  const bool avx512 = DetectedSimdLevel() >= SimdLevel::kAvx512;
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const float scale = 1.0f / std::sqrt(32.0f);
  std::vector<int64_t> lengths;
  for (int64_t n = 0; n <= 40; ++n) lengths.push_back(n);
  for (int64_t n : {1000, 4097}) lengths.push_back(n);
  for (int64_t n : lengths) {
    for (bool with_nan : {false, true}) {
      std::vector<float> row(static_cast<size_t>(n));
      for (float& v : row) v = normal(rng);
      if (with_nan && n > 0) row[static_cast<size_t>(n) / 2] = std::numeric_limits<float>::quiet_NaN();
      float want_max = -std::numeric_limits<float>::infinity();
      std::vector<float> want = row;
      for (float& v : want) {
        v *= scale;
        want_max = std::max(want_max, v);
      }
      std::vector<float> a = row, b = row;
      const float mb = attention_internal::ScaleRowMaxAvx2(b.data(), n, scale);
      ASSERT_EQ(std::bit_cast<uint32_t>(mb), std::bit_cast<uint32_t>(want_max)) << n;
      for (int64_t j = 0; j < n; ++j) {
        ASSERT_EQ(std::bit_cast<uint32_t>(b[j]), std::bit_cast<uint32_t>(want[j])) << n << " " << j;
      }
      if (avx512) {
        const float ma = attention_internal::ScaleRowMaxAvx512(a.data(), n, scale);
        ASSERT_EQ(std::bit_cast<uint32_t>(ma), std::bit_cast<uint32_t>(want_max)) << n;
        for (int64_t j = 0; j < n; ++j) {
          ASSERT_EQ(std::bit_cast<uint32_t>(a[j]), std::bit_cast<uint32_t>(want[j])) << n << " " << j;
        }
      }
      if (with_nan) continue;
      // Given the max, each level's softmax is the one that finds it itself.
      std::vector<float> c = want, d = want;
      attention_internal::SoftmaxRowAvx2(c.data(), n, true, &mb);
      attention_internal::SoftmaxRowAvx2(d.data(), n, true);
      for (int64_t j = 0; j < n; ++j) ASSERT_EQ(std::bit_cast<uint32_t>(c[j]), std::bit_cast<uint32_t>(d[j])) << n;
      if (avx512) {
        c = want;
        d = want;
        attention_internal::SoftmaxRowAvx512(c.data(), n, true, &mb);
        attention_internal::SoftmaxRowAvx512(d.data(), n, true);
        for (int64_t j = 0; j < n; ++j) ASSERT_EQ(std::bit_cast<uint32_t>(c[j]), std::bit_cast<uint32_t>(d[j])) << n;
      }
    }
  }
}

// Whole attention with the AVX-512 softmax and exp against the AVX2 ones (level capped).
TEST(AttentionTest, SimdLevelDoesNotChangeBits) {
  if (DetectedSimdLevel() < SimdLevel::kAvx512) GTEST_SKIP() << "no AVX-512";
  F32Codec codec(32);
  Fixture f;
  f.n_tokens = 700;
  f.Build(codec, 14);
  for (bool two_pass : {false, true}) {
    AttentionParams p = f.Params(650);
    p.round_query_f16 = p.round_weights_f16 = two_pass;
    const int blocks = (f.n_tokens + f.block_tokens - 1) / f.block_tokens;
    const std::vector<float> fast = two_pass ? RunTwoPass(codec, f, p, {blocks}, nullptr)
                                             : RunAttention(codec, f, p, {blocks}, nullptr);
    ForceSimdLevel(SimdLevel::kAvx2);
    const std::vector<float> scalar = two_pass ? RunTwoPass(codec, f, p, {blocks}, nullptr)
                                               : RunAttention(codec, f, p, {blocks}, nullptr);
    ForceSimdLevel(SimdLevel::kAvx512);
    EXPECT_EQ(fast, scalar) << (two_pass ? "two-pass" : "online");
  }
}

TEST(AttentionTest, SingleTokenReturnsItsValue) {
  F32Codec codec(32);
  Fixture f;
  f.n_tokens = 1;
  f.Build(codec, 5);
  const std::vector<float> got = RunAttention(codec, f, f.Params(0), {1}, nullptr);
  for (int h = 0; h < f.n_heads; ++h) {
    const int g = h / (f.n_heads / f.n_kv);
    for (int i = 0; i < f.hd; ++i) EXPECT_FLOAT_EQ(got[h * f.hd + i], f.v[g * f.hd + i]);
  }
}

// Several queries of a prefill chunk (each at its own position, with its own q) through
// the *Multi forms give each query the bits of running it alone: online, two-pass over
// batches, and fused two-pass; plain and grouped codecs; any batching; 1 or 2 threads;
// queries whose last block is partial and queries that see fewer blocks than the view.
template <typename Codec>
void CheckMultiQueries(const Codec& codec, const Fixture& f, ThreadPool* pool) {
  const std::vector<int64_t> positions = {20, 31, 32, 47, 60, 61, 74};
  const size_t n = positions.size();
  std::vector<std::vector<float>> qs(n);
  for (size_t t = 0; t < n; ++t) {
    qs[t] = f.q;
    for (size_t i = 0; i < qs[t].size(); ++i) qs[t][i] *= 1.0f + 0.1f * static_cast<float>((t + i) % 5);
  }
  const int n_blocks = static_cast<int>(f.blocks.size());
  const std::vector<std::vector<int>> splits = {
      {n_blocks}, {2, n_blocks - 2}, std::vector<int>(static_cast<size_t>(n_blocks), 1)};
  for (int form = 0; form < 3; ++form) {  // online, two-pass in batches, fused two-pass
    for (const auto& batches : splits) {
      if (form == 2 && batches.size() > 1) continue;  // fused: one batch of every block
      SCOPED_TRACE("form " + std::to_string(form) + ", " + std::to_string(batches.size()) + " batches");
      std::vector<AttentionParams> ps(n);
      std::vector<AttentionState> alone(n), together(n);
      std::vector<AttentionState*> ptrs;
      for (size_t t = 0; t < n; ++t) {
        ps[t] = f.Params(positions[t]);
        ps[t].round_query_f16 = ps[t].round_weights_f16 = form > 0;
        AttentionBegin(codec, ps[t], qs[t].data(), &alone[t]);
        AttentionBegin(codec, ps[t], qs[t].data(), &together[t]);
        ptrs.push_back(&together[t]);
      }
      const int64_t m = static_cast<int64_t>(n);
      const int passes = form == 1 ? 2 : 1;
      for (int pass = 0; pass < passes; ++pass) {
        int b = 0;
        for (size_t k = 0; k < batches.size(); ++k) {
          const PagedKvView view = f.View(b, batches[k], codec.vector_bytes());
          b += batches[k];
          for (size_t t = 0; t < n; ++t) {
            if (form == 0) AttentionBlocks(codec, ps[t], view, &alone[t], pool);
            if (form == 1 && pass == 0) AttentionScores(codec, ps[t], view, &alone[t], pool);
            if (form == 1 && pass == 1) AttentionValues(codec, ps[t], view, &alone[t], pool);
            if (form == 2) AttentionTwoPass(codec, ps[t], view, &alone[t], pool);
          }
          if (form == 0) AttentionBlocksMulti(codec, ps.data(), ptrs.data(), m, view, pool);
          if (form == 1 && pass == 0) AttentionScoresMulti(codec, ps.data(), ptrs.data(), m, view, pool);
          if (form == 1 && pass == 1) AttentionValuesMulti(codec, ps.data(), ptrs.data(), m, view, pool);
          if (form == 2) AttentionTwoPassMulti(codec, ps.data(), ptrs.data(), m, view, pool);
        }
        if (form == 1 && pass == 0) {
          for (size_t t = 0; t < n; ++t) AttentionSoftmax(ps[t], &alone[t], pool);
          AttentionSoftmaxMulti(ps.data(), ptrs.data(), m, pool);
        }
      }
      for (size_t t = 0; t < n; ++t) {
        std::vector<float> want(f.q.size()), got(f.q.size());
        AttentionEnd(codec, ps[t], &alone[t], want.data());
        AttentionEnd(codec, ps[t], &together[t], got.data());
        EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0) << "query at " << positions[t];
      }
    }
  }
}

TEST(AttentionTest, MultiQueryFormsGiveEachQueryItsOwnBits) {
  F32Codec plain(32);
  GroupedF32Codec grouped(32);
  Fixture f;
  f.Build(plain, 23);
  ThreadPool pool(2);
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    CheckMultiQueries(plain, f, p);
    CheckMultiQueries(grouped, f, p);
  }
}

// ---- llama.cpp's summation orders (kernels/attention_sums.h) ----

std::vector<SimdLevel> SumLevels() {
  std::vector<SimdLevel> v = {SimdLevel::kScalar};
  if (DetectedSimdLevel() >= SimdLevel::kAvx2) v.push_back(SimdLevel::kAvx2);
  if (DetectedSimdLevel() >= SimdLevel::kAvx512) v.push_back(SimdLevel::kAvx512);
  return v;
}

// Every SIMD level with each way of feeding n keys: blocks of 24, of 150, all at once.
std::vector<std::pair<SimdLevel, size_t>> LevelsAndBlocks(size_t n) {
  std::vector<std::pair<SimdLevel, size_t>> v;
  for (SimdLevel level : SumLevels()) {
    for (size_t block : {size_t{24}, size_t{150}, n}) v.emplace_back(level, block);
  }
  return v;
}

std::vector<uint16_t> RandomHalves(size_t n, std::mt19937& rng, float std_dev = 1.0f) {
  std::normal_distribution<float> normal(0.0f, std_dev);
  std::vector<uint16_t> h(n);
  for (uint16_t& x : h) x = F32ToF16(normal(rng));
  return h;
}

// One-token scores: per (head, key) ggml's vec_dot order (testing::VecDotOrder) over the
// f16 query and key, for keys stored as vectors and as tiles of 16 (the last one partial),
// at every SIMD level; head_dim 32 sums all in double, 96 has a 32-value tail. The last
// tile holds 5 keys (37) or 13 (45, past the first 8 lanes); 5 heads are a group of 4
// and one more, 2 heads take a tile's two halves together in the AVX2 tail.
TEST(AttentionSumsTest, OneTokenScoresSumAsGgmlVecDot) {
  std::mt19937 rng(71);
  const SimdLevel before = ActiveSimdLevel();
  for (size_t hd : {size_t{32}, size_t{64}, size_t{96}, size_t{128}, size_t{264}}) {  // 264: past the AVX2 tile
    for (const auto& [n_keys, n_heads] : {std::pair{size_t{37}, 5}, std::pair{size_t{45}, 5}, std::pair{size_t{45}, 2}}) {
      const std::vector<uint16_t> qh = RandomHalves(n_heads * hd, rng), keys = RandomHalves(n_keys * hd, rng);
      std::vector<uint16_t> tiles(((n_keys + 15) / 16) * 16 * hd);
      for (size_t t = 0; t < n_keys; ++t) {
        for (size_t d = 0; d < hd; ++d) tiles[(t / 16) * 16 * hd + d * 16 + t % 16] = keys[t * hd + d];
      }
      std::vector<float> q(qh.size());
      for (size_t i = 0; i < q.size(); ++i) q[i] = F16ToF32(qh[i]);
      for (SimdLevel level : SumLevels()) {
        ForceSimdLevel(level);
        for (bool tiled : {false, true}) {
          SCOPED_TRACE("hd " + std::to_string(hd) + (tiled ? " tiled " : " ") + SimdLevelName(level));
          std::vector<float> scores(n_heads * 48, -7.0f);
          OneTokenScoresF16(q.data(), n_heads, hd, tiled ? tiles.data() : keys.data(), tiled, n_keys, scores.data(), 48);
          for (int h = 0; h < n_heads; ++h) {
            const std::vector<float> qv(q.begin() + static_cast<ptrdiff_t>(h * hd),
                                        q.begin() + static_cast<ptrdiff_t>((h + 1) * hd));
            for (size_t t = 0; t < n_keys; ++t) {
              std::vector<float> kv(hd);
              for (size_t d = 0; d < hd; ++d) kv[d] = F16ToF32(keys[t * hd + d]);
              const float want = testing::VecDotOrder(WeightType::kF16, qv, kv);
              ASSERT_EQ(std::bit_cast<uint32_t>(scores[static_cast<size_t>(h) * 48 + t]), std::bit_cast<uint32_t>(want))
                  << "head " << h << " key " << t;
            }
            EXPECT_EQ(scores[static_cast<size_t>(h) * 48 + n_keys], -7.0f) << "wrote past the keys";
          }
        }
      }
    }
  }
  ForceSimdLevel(before);
}

// Value sums by residue: fed block by block (any split), then reduced, they are
// per output dimension llama.cpp's product of the f16 weights with V's column:
// vec_dot over the keys padded with zero weights to 256 (one token), tinyBLAS
// over them padded to 16 (a batch); at every SIMD level, for fewer keys than
// residues too. Five heads are past the AVX2 loop's kResidueL1Bytes at every head_dim
// here with 64 residues (passes over groups of two heads, and of residues too at 40 and
// 128), and at 128 with 16; fed in blocks of 24 keys (a residue's keys one at a time),
// of 150 (unaligned firsts; two or three keys of a residue a load) and whole (up to four
// a load, over several rounds at 600 keys).
TEST(AttentionSumsTest, ValueResiduesSumAsLlamaCpp) {
  std::mt19937 rng(73);
  const SimdLevel before = ActiveSimdLevel();
  constexpr int kHeads = 5;
  for (AttentionSums sums : {AttentionSums::kOneToken, AttentionSums::kBatch}) {
    for (size_t hd : {size_t{32}, size_t{128}, size_t{40}}) {
      for (size_t n_keys : {size_t{5}, size_t{40}, size_t{300}, size_t{600}}) {
        const std::vector<uint16_t> v = RandomHalves(n_keys * hd, rng);
        const std::vector<uint16_t> wh = RandomHalves(kHeads * n_keys, rng, 0.05f);
        std::vector<float> w(wh.size());
        for (size_t i = 0; i < w.size(); ++i) w[i] = F16ToF32(wh[i]);
        const int residues = AttentionResidues(sums);
        for (const auto& [level, block] : LevelsAndBlocks(n_keys)) {
          ForceSimdLevel(level);
          SCOPED_TRACE(std::string(sums == AttentionSums::kOneToken ? "one token" : "batch") + " hd " +
                       std::to_string(hd) + " keys " + std::to_string(n_keys) + " blocks of " +
                       std::to_string(block) + " " + SimdLevelName(level));
          const size_t part_stride = static_cast<size_t>(residues) * hd;
          std::vector<float> part(kHeads * part_stride, std::nanf(""));  // never read before it is written
          for (size_t t0 = 0; t0 < n_keys; t0 += block) {  // residues straddle the blocks
            const size_t n = std::min<size_t>(block, n_keys - t0);
            AccumulateResiduesF16(w.data(), n_keys, kHeads, hd, v.data() + t0 * hd, n, static_cast<int64_t>(t0),
                                  residues, part.data(), part_stride);
          }
          for (int h = 0; h < kHeads; ++h) {
            std::vector<float> out(hd);
            ReduceResidues(part.data() + static_cast<size_t>(h) * part_stride, hd, residues,
                           static_cast<int64_t>(n_keys), out.data());
            const size_t pad = sums == AttentionSums::kOneToken ? 256 : 16;
            const size_t padded = (n_keys + pad - 1) / pad * pad;
            std::vector<float> wcol(padded, 0.0f), vcol(padded, 0.0f);
            for (size_t j = 0; j < n_keys; ++j) wcol[j] = w[static_cast<size_t>(h) * n_keys + j];
            for (size_t d = 0; d < hd; ++d) {
              for (size_t j = 0; j < n_keys; ++j) vcol[j] = F16ToF32(v[j * hd + d]);
              const float want = sums == AttentionSums::kOneToken ? testing::VecDotOrder(WeightType::kF16, wcol, vcol)
                                                                   : testing::TinyBlasOrder(WeightType::kF16, wcol, vcol);
              ASSERT_EQ(std::bit_cast<uint32_t>(out[d]), std::bit_cast<uint32_t>(want)) << "head " << h << " dim " << d;
            }
          }
        }
      }
    }
  }
  ForceSimdLevel(before);
}

}  // namespace
}  // namespace tierkv::kernels
