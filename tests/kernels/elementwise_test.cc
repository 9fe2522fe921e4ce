// tests/kernels/elementwise_test.cc
//
// RMSNorm, RoPE (norm and neox layouts, YaRN), activations and MoE routing against
// double-precision references.
#include <cmath>
#include <limits>
#include <numbers>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/activation.h"
#include "kernels/cpu_features.h"
#include "kernels/expf.h"
#include "kernels/moe.h"
#include "kernels/norm.h"
#include "kernels/rope.h"

namespace tierkv::kernels {
namespace {

std::vector<float> RandomVector(int n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = normal(rng);
  return x;
}

TEST(NormTest, RmsNormMatchesDouble) {
  const std::vector<float> x = RandomVector(256, 1, 3.0f);
  const std::vector<float> w = RandomVector(256, 2);
  std::vector<float> out(256), out_nw(256);
  RmsNorm(x.data(), w.data(), 256, 1e-5f, out.data());
  RmsNorm(x.data(), nullptr, 256, 1e-5f, out_nw.data());
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double scale = 1.0 / std::sqrt(ss / 256 + 1e-5);
  for (int i = 0; i < 256; ++i) {
    EXPECT_NEAR(out[i], x[i] * scale * w[i], 1e-5 * std::fabs(x[i] * scale * w[i]) + 1e-7);
    EXPECT_NEAR(out_nw[i], x[i] * scale, 1e-5 * std::fabs(x[i] * scale) + 1e-7);
  }
  // In place, per row.
  std::vector<float> rows = x;
  RmsNormRows(rows.data(), nullptr, 8, 32, 1e-6f, rows.data());
  for (int r = 0; r < 8; ++r) {
    double s = 0;
    for (int i = 0; i < 32; ++i) s += static_cast<double>(rows[r * 32 + i]) * rows[r * 32 + i];
    EXPECT_NEAR(s / 32, 1.0, 1e-4);
  }
}

// Double reference rotation; pairs per the layout.
std::vector<double> RefRope(const std::vector<float>& x, int head_dim, int n_dims, RopeMode mode, double base,
                            int64_t pos) {
  std::vector<double> y(x.begin(), x.end());
  for (int i = 0; i < n_dims / 2; ++i) {
    const double theta = static_cast<double>(pos) * std::pow(base, -2.0 * i / n_dims);
    const int a = mode == RopeMode::kNorm ? 2 * i : i;
    const int b = mode == RopeMode::kNorm ? 2 * i + 1 : i + n_dims / 2;
    y[a] = x[a] * std::cos(theta) - x[b] * std::sin(theta);
    y[b] = x[a] * std::sin(theta) + x[b] * std::cos(theta);
  }
  (void)head_dim;
  return y;
}

TEST(RopeTest, NormAndNeoxMatchDouble) {
  for (RopeMode mode : {RopeMode::kNorm, RopeMode::kNeox}) {
    for (int64_t pos : {0, 1, 17, 3000}) {
      RopeParams p;
      p.n_dims = 32;
      p.mode = mode;
      p.freq_base = mode == RopeMode::kNorm ? 10000.0f : 1000000.0f;
      std::vector<float> cs(32);
      RopeAngles(p, pos, cs.data());
      std::vector<float> x = RandomVector(32, 3);
      const std::vector<double> ref = RefRope(x, 32, 32, mode, p.freq_base, pos);
      ApplyRope(p, cs.data(), x.data(), 1, 32);
      // f32 angles of large positions carry ~pos * 1e-7 rad of error.
      const double tol = 2e-5 + 4e-7 * static_cast<double>(pos);
      for (int i = 0; i < 32; ++i) EXPECT_NEAR(x[i], ref[i], tol) << "mode " << static_cast<int>(mode) << " pos " << pos;
    }
  }
}

TEST(RopeTest, PartialRotationAndHeads) {
  RopeParams p;
  p.n_dims = 16;
  p.mode = RopeMode::kNeox;
  std::vector<float> cs(16);
  RopeAngles(p, 5, cs.data());
  std::vector<float> x = RandomVector(64, 4);  // 2 heads of 32
  const std::vector<float> orig = x;
  ApplyRope(p, cs.data(), x.data(), 2, 32);
  for (int h = 0; h < 2; ++h) {
    for (int i = 16; i < 32; ++i) EXPECT_EQ(x[h * 32 + i], orig[h * 32 + i]);  // untouched
    const std::vector<float> head(orig.begin() + h * 32, orig.begin() + h * 32 + 32);
    const std::vector<double> ref = RefRope(head, 32, 16, RopeMode::kNeox, 10000.0, 5);
    for (int i = 0; i < 16; ++i) EXPECT_NEAR(x[h * 32 + i], ref[i], 1e-5);
  }
  // Position 0 is the identity; the norm of every pair is kept.
  RopeAngles(p, 0, cs.data());
  std::vector<float> y = orig;
  ApplyRope(p, cs.data(), y.data(), 2, 32);
  EXPECT_EQ(y, orig);
}

TEST(RopeTest, LinearScalingAndYarn) {
  RopeParams p;
  p.n_dims = 64;
  p.mode = RopeMode::kNeox;
  p.freq_base = 10000.0f;
  std::vector<float> plain(64), linear(64), yarn(64);
  RopeAngles(p, 4000, plain.data());
  p.freq_scale = 0.25f;
  RopeAngles(p, 4000, linear.data());
  std::vector<float> quarter(64);
  RopeParams p1 = p;
  p1.freq_scale = 1.0f;
  RopeAngles(p1, 1000, quarter.data());
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(linear[i], quarter[i], 2e-3) << i;  // pos/4

  // YaRN: high-frequency pairs (below the ramp) keep the extrapolated angle, low ones
  // (above) the interpolated one; magnitudes scaled by 1 + 0.1 ln(4).
  p.ext_factor = 1.0f;
  p.n_ctx_orig = 2048;
  float dims[2];
  RopeYarnCorrDims(64, 2048, 10000.0f, 32.0f, 1.0f, dims);
  EXPECT_GE(dims[0], 0.0f);
  EXPECT_LE(dims[1], 63.0f);
  EXPECT_LT(dims[0], dims[1]);
  RopeAngles(p, 4000, yarn.data());
  const double mscale = 1.0 + 0.1 * std::log(4.0);
  // Pair 0: extrapolated (= plain) angle.
  EXPECT_NEAR(yarn[0], plain[0] * mscale, 1e-4);
  EXPECT_NEAR(yarn[1], plain[1] * mscale, 1e-4);
  // Last pair: interpolated (= linear) angle.
  EXPECT_NEAR(yarn[62], linear[62] * mscale, 1e-4);
  EXPECT_NEAR(yarn[63], linear[63] * mscale, 1e-4);
}

TEST(ActivationTest, SiluSwigluSoftmax) {
  EXPECT_FLOAT_EQ(Silu(0.0f), 0.0f);
  EXPECT_NEAR(Silu(2.0f), 2.0 / (1.0 + std::exp(-2.0)), 1e-6);
  EXPECT_NEAR(Silu(-30.0f), 0.0f, 1e-10);
  const std::vector<float> g = RandomVector(64, 5), u = RandomVector(64, 6);
  std::vector<float> out(64);
  SwiGlu(g.data(), u.data(), out.data(), 64);
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(out[i], g[i] / (1.0 + std::exp(-g[i])) * u[i], 1e-6);

  std::vector<float> x = RandomVector(1000, 7, 5.0f);
  const double lse = LogSumExp(x.data(), 1000);
  double ref = 0, mx = -1e300;
  for (float v : x) mx = std::max<double>(mx, v);
  for (float v : x) ref += std::exp(v - mx);
  EXPECT_NEAR(lse, mx + std::log(ref), 1e-9);
  const std::vector<float> orig = x;
  EXPECT_NEAR(SoftmaxInPlace(x.data(), 1000), lse, 1e-6);
  double sum = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sum += x[i];
    EXPECT_NEAR(x[i], std::exp(orig[i] - lse), 1e-6);
  }
  EXPECT_NEAR(sum, 1.0, 1e-5);
  const float ties[] = {1.0f, 3.0f, 3.0f, 2.0f};
  EXPECT_EQ(ArgMax(ties, 4), 1);
}

// llama.cpp's row layout: 16-value chunks from the start use its vector exp (ExpGgml),
// the last n % 16 values the C library's; the same bits at every SIMD level.
TEST(ActivationTest, SwiGluChunksUseGgmlExpAtEveryLevel) {
  const int64_t n = 16 * 5 + 7;
  std::vector<float> g = RandomVector(n, 21, 6.0f), u = RandomVector(n, 22);
  std::vector<float> want(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    want[i] = (i < 80 ? g[i] / (1.0f + ExpGgml(0.0f - g[i])) : g[i] / (1.0f + std::exp(-g[i]))) * u[i];
  }
  for (SimdLevel level : {SimdLevel::kAvx512, SimdLevel::kAvx2, SimdLevel::kScalar}) {
    ForceSimdLevel(level);
    std::vector<float> out(static_cast<size_t>(n));
    SwiGlu(g.data(), u.data(), out.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(out[i], want[i]) << SimdLevelName(level) << " " << i;
  }
  ForceSimdLevel(SimdLevel::kAvx512);
}

TEST(ActivationTest, SoftmaxSumsChunksInF32ThenTheTailInDouble) {
  // Chunk 0: 1 + 2^-24 (lanes 0 and 8) rounds to 1 in f32; in the tail the same 2^-24
  // survives the double sum. Inputs are logs, so the exponentials are these values.
  std::vector<float> x(18, -std::numeric_limits<float>::infinity());
  x[0] = 0.0f;
  x[8] = std::log(0x1p-24f);
  x[17] = std::log(0x1p-24f);
  std::vector<float> y = x;
  const double lse = SoftmaxInPlace(y.data(), 18);
  const double sum = 1.0 + static_cast<double>(std::exp(x[17]));  // chunk sum 1.0f, then the tail
  EXPECT_DOUBLE_EQ(lse, std::log(sum));
  EXPECT_EQ(y[0], static_cast<float>(1.0 / sum));
  EXPECT_EQ(y[8], ExpGgml(x[8]) * static_cast<float>(1.0 / sum));
  EXPECT_EQ(y[17], std::exp(x[17]) * static_cast<float>(1.0 / sum));
}

TEST(MoeTest, TopKSoftmaxRenormalised) {
  const float logits[] = {0.5f, 2.0f, -1.0f, 1.5f, 2.0f, 0.0f, -3.0f, 1.0f};
  int ids[2];
  float w[2];
  RouteTopK(logits, 8, 2, true, ids, w);
  EXPECT_EQ(ids[0], 1);  // tie between 1 and 4: smaller id first
  EXPECT_EQ(ids[1], 4);
  EXPECT_FLOAT_EQ(w[0], 0.5f);
  EXPECT_FLOAT_EQ(w[1], 0.5f);

  int ids3[3];
  float w3[3];
  RouteTopK(logits, 8, 3, false, ids3, w3);
  EXPECT_EQ(ids3[2], 3);
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  EXPECT_NEAR(w3[0], std::exp(2.0) / z, 1e-6);
  EXPECT_NEAR(w3[2], std::exp(1.5) / z, 1e-6);
  RouteTopK(logits, 8, 3, true, ids3, w3);
  EXPECT_NEAR(w3[0] + w3[1] + w3[2], 1.0f, 1e-6);
  EXPECT_NEAR(w3[2] / w3[0], std::exp(-0.5), 1e-6);

  EXPECT_FLOAT_EQ(RouterGap(logits, 8, 2), 0.5f);
  EXPECT_FLOAT_EQ(RouterGap(logits, 8, 1), 0.0f);
}

}  // namespace
}  // namespace tierkv::kernels
