// tests/kernels/matvec_test.cc
//
// MatVec against per-row dots, independence from the thread count, MatVecMany and the
// shared activation conversions (the thread pool's own tests: thread_pool_test.cc).
#include "kernels/matvec.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu_features.h"
#include "kernels/fp16.h"
#include "kernels/thread_pool.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/sum_orders.h"

namespace tierkv::kernels {
namespace {

TEST(MatVecTest, EqualsRowDotsAndIgnoresThreadCount) {
  ThreadPool pool1(1), pool3(3);
  for (WeightType t : {WeightType::kF32, WeightType::kF16, WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kQ4_1,
                       WeightType::kQ5_0, WeightType::kQ5_1, WeightType::kIQ4_NL, WeightType::kQ2_K, WeightType::kQ3_K,
                       WeightType::kQ4_K, WeightType::kQ5_K, WeightType::kQ6_K, WeightType::kIQ4_XS}) {
    SCOPED_TRACE(WeightTypeName(t));
    const OwnedMatrix m = RandomMatrix(t, 300, 512, 1);
    const std::vector<float> x = RandomVector(512, 2);
    std::vector<float> y0(300), y1(300), y3(300);
    MatVec(m.view, x.data(), y0.data(), nullptr);
    MatVec(m.view, x.data(), y1.data(), &pool1);
    MatVec(m.view, x.data(), y3.data(), &pool3);
    ActivationRow row;
    row.Set(x.data(), 512);
    const void* act = row.For(t);
    for (int r = 0; r < 300; ++r) {
      EXPECT_EQ(y0[r], DotRow(t, m.view.Row(r), act, 512)) << r;
      EXPECT_EQ(y0[r], y1[r]);
      EXPECT_EQ(y0[r], y3[r]);
    }
  }
}

// MatVec at the best level this CPU has (the multi-row kernels: AVX512-VNNI 4 rows per
// step, or AVX2 8 rows, with one-row tails) gives the bits of the AVX2 one-row dot
// product on every row: odd row counts so that chunks end in tails, rows of two blocks
// (a 64-wide output projection) and of one, three and four, of many, and long rows
// (kLongRowBytes and more: prefetched a group ahead, and for Q8_0 below the AVX512-VNNI
// level read one row at a time by MatVec).
TEST(MatVecTest, MultiRowKernelsEqualAvx2Rows) {
  if (DetectedSimdLevel() < SimdLevel::kAvx2) GTEST_SKIP() << "no AVX2 here";
  ThreadPool pool(2);
  for (WeightType t : {WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kQ4_K, WeightType::kQ5_K, WeightType::kQ6_K,
                       WeightType::kIQ4_XS, WeightType::kQ2_K, WeightType::kQ3_K}) {
    for (int64_t cols : {32, 64, 96, 128, 256, 768, 4096}) {
      if (GetWeightTypeInfo(t).block_size == 256 && cols % 256 != 0) continue;  // 256-value super-blocks
      if (cols == 4096) {
        EXPECT_GE(RowBytes(t, cols), kLongRowBytes);
      }
      SCOPED_TRACE(std::string(WeightTypeName(t)) + " cols=" + std::to_string(cols));
      const OwnedMatrix m = RandomMatrix(t, 301, cols, 7);
      const std::vector<float> x = RandomVector(cols, 8);
      std::vector<float> fast(301);
      MatVec(m.view, x.data(), fast.data(), &pool);
      const WeightType at = ActivationType(t);
      std::vector<uint8_t> act(RowBytes(at, cols));
      QuantizeActivation(at, x.data(), act.data(), cols);
      const DotFn one_row = GetDotFn(t, SimdLevel::kAvx2);
      for (int r = 0; r < 301; ++r) {
        EXPECT_EQ(std::bit_cast<uint32_t>(fast[r]), std::bit_cast<uint32_t>(one_row(m.view.Row(r), act.data(), cols)))
            << r;
      }
    }
  }
}

TEST(MatVecTest, ManyEqualsSingle) {
  ThreadPool pool(2);
  const OwnedMatrix a = RandomMatrix(WeightType::kQ8_0, 256, 256, 3);
  const OwnedMatrix b = RandomMatrix(WeightType::kQ4_K, 128, 256, 4);
  const OwnedMatrix c = RandomMatrix(WeightType::kF16, 64, 256, 5);
  const OwnedMatrix d = RandomMatrix(WeightType::kQ5_1, 96, 256, 9);  // Q8_1 activations
  const std::vector<float> x = RandomVector(256, 6);
  ActivationRow row;
  row.Set(x.data(), 256);
  std::vector<float> ya(256), yb(128), yc(64), yd(96);
  const MatVecJob jobs[] = {
      {&a.view, &row, ya.data()}, {&b.view, &row, yb.data()}, {&c.view, &row, yc.data()}, {&d.view, &row, yd.data()}};
  MatVecMany(jobs, &pool);
  std::vector<float> sa(256), sb(128), sc(64), sd(96);
  MatVec(a.view, x.data(), sa.data(), nullptr);
  MatVec(b.view, x.data(), sb.data(), nullptr);
  MatVec(c.view, x.data(), sc.data(), nullptr);
  MatVec(d.view, x.data(), sd.data(), nullptr);
  EXPECT_EQ(ya, sa);
  EXPECT_EQ(yb, sb);
  EXPECT_EQ(yc, sc);
  EXPECT_EQ(yd, sd);
}

// MatMulMany (a prefill chunk's tokens against the same rows) gives every token the bits
// of its own MatVec, for every weight type, with several jobs, thread counts, and row
// counts that leave partial row groups.
TEST(MatVecTest, MatMulEqualsMatVecPerToken) {
  ThreadPool pool(2);
  for (WeightType t : {WeightType::kF32, WeightType::kF16, WeightType::kBF16, WeightType::kQ8_0, WeightType::kQ4_0,
                       WeightType::kQ4_1, WeightType::kQ5_0, WeightType::kQ5_1, WeightType::kIQ4_NL,
                       WeightType::kQ2_K, WeightType::kQ3_K, WeightType::kQ4_K, WeightType::kQ5_K, WeightType::kQ6_K,
                       WeightType::kIQ4_XS}) {
    SCOPED_TRACE(WeightTypeName(t));
    constexpr int kTokens = 7;  // a group of four and one of three, where kernels take tokens four at a time
    const OwnedMatrix a = RandomMatrix(t, 301, 512, 11);
    const OwnedMatrix b = RandomMatrix(WeightType::kQ8_0, 37, 512, 12);
    std::vector<ActivationRow> rows(kTokens);
    std::vector<ActivationRow*> ptrs;
    std::vector<std::vector<float>> xs;
    for (int i = 0; i < kTokens; ++i) {
      xs.push_back(RandomVector(512, 20 + static_cast<uint32_t>(i)));
      rows[static_cast<size_t>(i)].Set(xs.back().data(), 512);
      ptrs.push_back(&rows[static_cast<size_t>(i)]);
    }
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      std::vector<float> ya(kTokens * 310, -1.0f), yb(kTokens * 37);
      const MatMulJob jobs[] = {{&a.view, ptrs.data(), kTokens, ya.data(), 310, TokenSums::kPerToken},
                                {&b.view, ptrs.data(), kTokens, yb.data(), 37, TokenSums::kPerToken}};
      MatMulMany(jobs, p);
      for (int i = 0; i < kTokens; ++i) {
        std::vector<float> wa(301), wb(37);
        MatVec(a.view, xs[static_cast<size_t>(i)].data(), wa.data(), nullptr);
        MatVec(b.view, xs[static_cast<size_t>(i)].data(), wb.data(), nullptr);
        for (int r = 0; r < 301; ++r) {
          ASSERT_EQ(std::bit_cast<uint32_t>(ya[static_cast<size_t>(i) * 310 + r]), std::bit_cast<uint32_t>(wa[r]))
              << "token " << i << " row " << r;
        }
        EXPECT_EQ(ya[static_cast<size_t>(i) * 310 + 305], -1.0f) << "wrote past the rows";
        EXPECT_EQ(std::vector<float>(yb.begin() + i * 37, yb.begin() + (i + 1) * 37), wb);
      }
    }
  }
}

// MatMulMany of `a` against n_tokens random activations (seeds from `seed`) gives, for
// every token, that token's MatVec, bit for bit.
void ExpectMatMulIsMatVecPerToken(const OwnedMatrix& a, int n_tokens, uint32_t seed, ThreadPool* pool) {
  const int64_t n_rows = a.view.rows, cols = a.view.cols;
  std::vector<ActivationRow> rows(static_cast<size_t>(n_tokens));
  std::vector<ActivationRow*> ptrs;
  std::vector<std::vector<float>> xs;
  for (int i = 0; i < n_tokens; ++i) {
    xs.push_back(RandomVector(cols, seed + static_cast<uint32_t>(i)));
    rows[static_cast<size_t>(i)].Set(xs.back().data(), cols);
    ptrs.push_back(&rows[static_cast<size_t>(i)]);
  }
  std::vector<float> y(static_cast<size_t>(n_tokens * n_rows));
  const MatMulJob job{&a.view, ptrs.data(), n_tokens, y.data(), static_cast<size_t>(n_rows), TokenSums::kPerToken};
  MatMulMany({&job, 1}, pool);
  for (int i = 0; i < n_tokens; ++i) {
    std::vector<float> want(static_cast<size_t>(n_rows));
    MatVec(a.view, xs[static_cast<size_t>(i)].data(), want.data(), nullptr);
    for (int64_t r = 0; r < n_rows; ++r) {
      ASSERT_EQ(std::bit_cast<uint32_t>(y[static_cast<size_t>(i * n_rows + r)]),
                std::bit_cast<uint32_t>(want[static_cast<size_t>(r)]))
          << n_tokens << " tokens: token " << i << " row " << r;
    }
  }
}

// The same over long rows (prefetched inside the kernels), token counts of every
// remainder, and widths the F16/BF16 kernel leaves to the one-token path (n % 16 != 0),
// with the thread pool's row split.
TEST(MatVecTest, MatMulEqualsMatVecPerTokenLongRows) {
  ThreadPool pool(2);
  const std::pair<WeightType, int> cases[] = {
      {WeightType::kQ8_0, 2048}, {WeightType::kQ2_K, 2048}, {WeightType::kQ3_K, 2048}, {WeightType::kQ4_K, 2048},
      {WeightType::kQ5_K, 2048}, {WeightType::kQ6_K, 2048}, {WeightType::kQ4_0, 2048}, {WeightType::kF16, 2048},
      {WeightType::kBF16, 2048}, {WeightType::kF16, 200},   {WeightType::kBF16, 200},  {WeightType::kIQ4_NL, 2048},
      {WeightType::kIQ4_XS, 2048}, {WeightType::kQ5_0, 2048}, {WeightType::kQ4_1, 2048}, {WeightType::kQ5_1, 2048}};
  for (const auto& [t, cols] : cases) {
    SCOPED_TRACE(std::string(WeightTypeName(t)) + " x " + std::to_string(cols));
    const OwnedMatrix a = RandomMatrix(t, 77, cols, 31);
    for (int n_tokens : {2, 4, 9}) ExpectMatMulIsMatVecPerToken(a, n_tokens, 40, &pool);
  }
}

// With batched sums (the default of a MatMulJob) F32, F16 and BF16 weights at the
// AVX-512 level sum each (row, token) as tinyBLAS does (testing::TinyBlasOrder), for any
// token count including one, and with the pool's row split; widths that are not a
// multiple of its step (16 values; BF16: 32) sum per token as MatVec does.
TEST(MatVecTest, MatMulBatchedSumsAsTinyBlas) {
  if (!BatchedSumsDiffer(WeightType::kF16, ActiveSimdLevel())) GTEST_SKIP() << "below AVX-512: one order";
  ThreadPool pool(2);
  for (WeightType t : {WeightType::kF32, WeightType::kF16, WeightType::kBF16}) {
    for (int64_t cols : {64, 512, 2048, 200, 48}) {
      SCOPED_TRACE(std::string(WeightTypeName(t)) + " x " + std::to_string(cols));
      const OwnedMatrix a = RandomMatrix(t, 35, cols, 71);
      const int64_t step = t == WeightType::kBF16 ? 32 : 16;
      for (int n_tokens : {1, 2, 4, 9}) {
        std::vector<ActivationRow> rows(static_cast<size_t>(n_tokens));
        std::vector<ActivationRow*> ptrs;
        for (int i = 0; i < n_tokens; ++i) {
          const std::vector<float> x = RandomVector(cols, 80 + static_cast<uint32_t>(i));
          rows[static_cast<size_t>(i)].Set(x.data(), cols);
          ptrs.push_back(&rows[static_cast<size_t>(i)]);
        }
        std::vector<float> y(static_cast<size_t>(n_tokens * 35));
        const MatMulJob job{&a.view, ptrs.data(), n_tokens, y.data(), 35};
        MatMulMany({&job, 1}, &pool);
        std::vector<float> wf(static_cast<size_t>(cols)), xf(static_cast<size_t>(cols)), one(35);
        for (int i = 0; i < n_tokens; ++i) {
          const void* act = ptrs[static_cast<size_t>(i)]->For(t);
          DequantizeRow(t, act, xf.data(), cols);
          MatVec(a.view, *ptrs[static_cast<size_t>(i)], one.data(), nullptr);
          for (int64_t r = 0; r < 35; ++r) {
            DequantizeRow(t, a.view.Row(r), wf.data(), cols);
            const float want = cols % step == 0 ? testing::TinyBlasOrder(t, wf, xf) : one[static_cast<size_t>(r)];
            ASSERT_EQ(std::bit_cast<uint32_t>(y[static_cast<size_t>(i * 35 + r)]), std::bit_cast<uint32_t>(want))
                << n_tokens << " tokens: token " << i << " row " << r;
          }
        }
      }
    }
  }
}

// llama.cpp's repacked Q4_K mul_mat (MatMulJob::llama_gemm): tokens in whole groups of
// four get Q8_K activations rounded ties-away and the gemm's order, one float step per
// 64-value part of a super-block (two chains, a - m); the 1 - 3 tokens left, the
// one-token rounding and order (= MatVec). The reference is written out here from the
// block layout; rows 40 (a multiple of 8) and 36 (not: llama.cpp does not repack it, so
// every token is MatVec's).
float Q4KGemmOrder(const BlockQ4_K* w, const BlockQ8_K* x, int64_t nb) {
  float a = 0.0f, m = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = F16ToF32(w[i].d) * x[i].d, dmin = F16ToF32(w[i].dmin) * x[i].d;
    for (int k = 0; k < 4; ++k) {
      int isum = 0, summ = 0;
      for (int j = 2 * k; j < 2 * k + 2; ++j) {  // sub-block j: nibbles of qs[32 (j / 2) ..]
        uint8_t sc, mn;
        ScaleMinK4(j, w[i].scales, &sc, &mn);
        int s = 0;
        for (int l = 0; l < 32; ++l) {
          const uint8_t q = w[i].qs[32 * (j / 2) + l];
          s += (j % 2 == 0 ? q & 15 : q >> 4) * x[i].qs[32 * j + l];
        }
        isum += sc * s;
        summ += mn * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
      }
      a = std::fma(static_cast<float>(isum), d, a);
      m = std::fma(static_cast<float>(summ), dmin, m);
    }
  }
  return a - m;
}

TEST(MatVecTest, LlamaGemmQ4KGroupsOfFourTokens) {
  if (GetLlamaGemmRowsTokensFn(WeightType::kQ4_K, ActiveSimdLevel()) == nullptr) {
    GTEST_SKIP() << "llama.cpp's gemm order is served at the AVX-512 VNNI level only";
  }
  ThreadPool pool(2);
  for (int64_t n_rows : {40, 36}) {
    const int64_t cols = 512;
    const OwnedMatrix a = RandomMatrix(WeightType::kQ4_K, n_rows, cols, 91);
    for (int n_tokens : {1, 3, 4, 6, 9}) {
      SCOPED_TRACE(std::to_string(n_rows) + " rows, " + std::to_string(n_tokens) + " tokens");
      std::vector<ActivationRow> rows(static_cast<size_t>(n_tokens));
      std::vector<ActivationRow*> ptrs;
      for (int i = 0; i < n_tokens; ++i) {
        std::vector<float> x = RandomVector(cols, 120 + static_cast<uint32_t>(i));
        x[3] = 127.0f;  // amax 127: iscale -1, so the x.5 values below are exact ties
        for (int64_t c = 8; c < cols; c += 16) x[static_cast<size_t>(c)] = -2.5f + static_cast<float>(c % 5);
        rows[static_cast<size_t>(i)].Set(x.data(), cols);
        ptrs.push_back(&rows[static_cast<size_t>(i)]);
      }
      std::vector<float> y(static_cast<size_t>(n_tokens * n_rows));
      MatMulJob job{&a.view, ptrs.data(), n_tokens, y.data(), static_cast<size_t>(n_rows)};
      job.llama_gemm = true;
      MatMulMany({&job, 1}, &pool);
      const int grouped = n_rows % 8 == 0 ? n_tokens - n_tokens % 4 : 0;
      std::vector<float> one(static_cast<size_t>(n_rows));
      std::vector<uint8_t> away(RowBytes(WeightType::kQ8_K, cols));
      for (int i = 0; i < n_tokens; ++i) {
        MatVec(a.view, *ptrs[static_cast<size_t>(i)], one.data(), nullptr);
        QuantizeQ8KTiesAway(ptrs[static_cast<size_t>(i)]->values(), away.data(), cols);
        for (int64_t r = 0; r < n_rows; ++r) {
          const float want = i < grouped ? Q4KGemmOrder(static_cast<const BlockQ4_K*>(a.view.Row(r)),
                                                        reinterpret_cast<const BlockQ8_K*>(away.data()), cols / 256)
                                         : one[static_cast<size_t>(r)];
          ASSERT_EQ(std::bit_cast<uint32_t>(y[static_cast<size_t>(i * n_rows + r)]), std::bit_cast<uint32_t>(want))
              << "token " << i << " row " << r;
        }
      }
    }
  }
}

// Ties: ggml's quantize_mat_q8_K rounds them away from zero, quantize_row_q8_K to even.
TEST(MatVecTest, Q8KTiesAwayRoundsHalvesAwayFromZero) {
  std::vector<float> x(256, 0.0f);
  x[0] = -127.0f;  // iscale = 1
  x[1] = 2.5f;
  x[2] = -3.5f;
  x[3] = 0.5f;
  std::vector<uint8_t> even(RowBytes(WeightType::kQ8_K, 256)), away(even.size());
  QuantizeActivation(WeightType::kQ8_K, x.data(), even.data(), 256);
  QuantizeQ8KTiesAway(x.data(), away.data(), 256);
  const auto* e = reinterpret_cast<const BlockQ8_K*>(even.data());
  const auto* w = reinterpret_cast<const BlockQ8_K*>(away.data());
  EXPECT_EQ(e->d, w->d);
  EXPECT_EQ(e->qs[1], 2);
  EXPECT_EQ(w->qs[1], 3);
  EXPECT_EQ(e->qs[2], -4);
  EXPECT_EQ(w->qs[2], -4);
  EXPECT_EQ(e->qs[3], 0);
  EXPECT_EQ(w->qs[3], 1);
  EXPECT_EQ(w->bsums[0], -127 + 3 - 4 + 1);
}

// The AVX2 level (CPUs without AVX-512, and AVX-512 ones without VNNI) has several-token
// kernels for Q4_K and Q5_K (one row against four tokens at a time): the same bits as
// that level's MatVec, for every token count up to 9.
TEST(MatVecTest, MatMulEqualsMatVecPerTokenAtAvx2) {
  if (DetectedSimdLevel() < SimdLevel::kAvx2) GTEST_SKIP() << "no AVX2 on this CPU";
  const SimdLevel before = ActiveSimdLevel();
  ForceSimdLevel(SimdLevel::kAvx2);
  for (WeightType t : {WeightType::kQ4_K, WeightType::kQ5_K}) {
    SCOPED_TRACE(WeightTypeName(t));
    EXPECT_NE(GetDotRowsTokensFn(t, SimdLevel::kAvx2), nullptr);
    const OwnedMatrix a = RandomMatrix(t, 37, 1024, 51);
    for (int n_tokens = 2; n_tokens <= 9; ++n_tokens) ExpectMatMulIsMatVecPerToken(a, n_tokens, 60, nullptr);
  }
  ForceSimdLevel(before);
}

// Q8_0 at the extremes of its codes: weights -128 and 127 (-128 is no code llama.cpp's
// quantizer writes, but a file may hold it), activations all +-127 (scale 1), so every
// int16 pair sum of the maddubs-based kernels is at its largest (2 * 127 * 128) and the
// f32 sums are exact integers in any order. Every level and row path (the 8-row AVX2
// kernel, the one-row tails, rows long enough to be read one at a time) must give the
// exact sum: a saturated pair would be off by thousands.
TEST(MatVecTest, Q8_0ExtremeCodesSumExactly) {
  const SimdLevel before = ActiveSimdLevel();
  std::mt19937 rng(61);
  for (int64_t cols : {64, 512, 1024}) {  // 1024: long rows; every partial sum < 2^24
    SCOPED_TRACE("cols=" + std::to_string(cols));
    const int64_t rows = 37, nb = cols / 32;
    const size_t rb = RowBytes(WeightType::kQ8_0, cols);
    std::vector<uint8_t> bytes(rb * rows);
    std::vector<float> x(static_cast<size_t>(cols));
    for (float& v : x) v = rng() % 2 ? 127.0f : -127.0f;
    std::vector<int64_t> want(rows, 0);
    const int8_t pool[] = {-128, 127, -127, -128, 0, 1, -1, 127};
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < nb; ++b) {
        BlockQ8_0 blk;
        blk.d = F32ToF16(1.0f);
        for (int j = 0; j < 32; ++j) {
          // Mostly -128 and 127 against a same-sign / opposite-sign activation.
          blk.qs[j] = pool[rng() % 8];
          want[static_cast<size_t>(r)] += int64_t{blk.qs[j]} * static_cast<int64_t>(x[static_cast<size_t>(b * 32 + j)]);
        }
        std::memcpy(bytes.data() + r * rb + b * sizeof(BlockQ8_0), &blk, sizeof(blk));
      }
    }
    const MatrixView view{WeightType::kQ8_0, bytes.data(), cols, rows, rb};
    ThreadPool pool2(2);
    for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
      if (level > DetectedSimdLevel()) continue;
      ForceSimdLevel(level);
      for (bool vnni : {false, true}) {  // the AVX2 level's AVX-VNNI kernels, where the CPU has them
        AllowAvxVnni(vnni);
        if (vnni && (level != SimdLevel::kAvx2 || !AvxVnniActive())) continue;
        std::vector<float> y(rows);
        MatVec(view, x.data(), y.data(), &pool2);
        for (int64_t r = 0; r < rows; ++r) {
          EXPECT_EQ(y[static_cast<size_t>(r)], static_cast<float>(want[static_cast<size_t>(r)]))
              << "level " << static_cast<int>(level) << " avx-vnni " << vnni << " row " << r;
        }
      }
    }
  }
  AllowAvxVnni(true);
  ForceSimdLevel(before);
}

TEST(MatVecTest, GetRowDequantizes) {
  const OwnedMatrix m = RandomMatrix(WeightType::kQ6_K, 4, 256, 9);
  std::vector<float> got(256), want(256);
  GetRow(m.view, 2, got.data());
  DequantizeRow(WeightType::kQ6_K, m.view.Row(2), want.data(), 256);
  EXPECT_EQ(got, want);
}

TEST(MatVecTest, ActivationRowConvertsOncePerType) {
  const std::vector<float> x = RandomVector(256, 8);
  ActivationRow row;
  row.Set(x.data(), 256);
  const void* p1 = row.For(WeightType::kQ4_0);
  const void* p2 = row.For(WeightType::kQ8_0);  // same activation type
  EXPECT_EQ(p1, p2);
  EXPECT_NE(row.For(WeightType::kQ6_K), p1);
  EXPECT_EQ(row.For(WeightType::kF32), row.values());
  std::vector<BlockQ8_0> want(8);
  QuantizeActivation(WeightType::kQ8_0, x.data(), want.data(), 256);
  EXPECT_EQ(std::memcmp(p1, want.data(), sizeof(BlockQ8_0) * 8), 0);
}

}  // namespace
}  // namespace tierkv::kernels
