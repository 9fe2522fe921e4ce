// kernels/rope.cc
#include "kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace tierkv::kernels {
namespace {

float CorrDim(int n_dims, int n_ctx_orig, float n_rot, float base) {
  return static_cast<float>(n_dims) *
         std::log(static_cast<float>(n_ctx_orig) / (n_rot * 2.0f * std::numbers::pi_v<float>)) /
         (2.0f * std::log(base));
}

float YarnRamp(float lo, float hi, int i0) {
  const float y = (static_cast<float>(i0 / 2) - lo) / std::max(0.001f, hi - lo);
  return 1.0f - std::min(1.0f, std::max(0.0f, y));
}

}  // namespace

void RopeYarnCorrDims(int n_dims, int n_ctx_orig, float freq_base, float beta_fast, float beta_slow, float dims[2]) {
  const float start = std::floor(CorrDim(n_dims, n_ctx_orig, beta_fast, freq_base));
  const float end = std::ceil(CorrDim(n_dims, n_ctx_orig, beta_slow, freq_base));
  dims[0] = std::max(0.0f, start);
  dims[1] = std::min(static_cast<float>(n_dims - 1), end);
}

void RopeAngles(const RopeParams& p, int64_t pos, float* cos_sin) {
  const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(p.n_dims));
  float corr[2] = {0.0f, 0.0f};
  float mscale = p.attn_factor;
  if (p.ext_factor != 0.0f) {
    RopeYarnCorrDims(p.n_dims, p.n_ctx_orig, p.freq_base, p.beta_fast, p.beta_slow, corr);
    mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
  }
  float theta_base = static_cast<float>(pos);
  for (int i0 = 0; i0 < p.n_dims; i0 += 2) {
    const float ff = p.freq_factors != nullptr ? p.freq_factors[i0 / 2] : 1.0f;
    const float theta_extrap = theta_base / ff;
    float theta = p.freq_scale * theta_extrap;
    if (p.ext_factor != 0.0f) {
      const float mix = YarnRamp(corr[0], corr[1], i0) * p.ext_factor;
      // ggml contracts this blend as fma(interp, 1 - mix, extrap * mix): the same here,
      // or long YaRN contexts drift by an ulp of theta (~1e-3 in the logits at 2.7K).
      theta = std::fma(theta, 1.0f - mix, theta_extrap * mix);
    }
    cos_sin[i0] = std::cos(theta) * mscale;
    cos_sin[i0 + 1] = std::sin(theta) * mscale;
    theta_base *= theta_scale;
  }
}

void ApplyRope(const RopeParams& p, const float* cos_sin, float* x, int n_heads, int head_dim) {
  const int half = p.n_dims / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    for (int i0 = 0; i0 < p.n_dims; i0 += 2) {
      const float c = cos_sin[i0], s = cos_sin[i0 + 1];
      const int a = p.mode == RopeMode::kNorm ? i0 : i0 / 2;
      const int b = p.mode == RopeMode::kNorm ? i0 + 1 : i0 / 2 + half;
      const float x0 = v[a], x1 = v[b];
      // llama.cpp's build (GNU mode, FMA targets) contracts x0*c - x1*s into
      // fma(x0, c, -(x1*s)); doing the same keeps Q and K bit-identical to its more
      // often (measured against the reference vectors, docs/kernels.md).
      v[a] = std::fma(x0, c, -(x1 * s));
      v[b] = std::fma(x0, s, x1 * c);
    }
  }
}

}  // namespace tierkv::kernels
