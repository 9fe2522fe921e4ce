// kernels/rope.h
//
// Rotary position embedding, in the two layouts llama.cpp uses:
//   kNorm (llama): rotates adjacent pairs (x[2i], x[2i+1]);
//   kNeox (qwen2, qwen3, qwen3moe): rotates (x[i], x[i + n_dims/2]).
// Pair i turns by theta_i = pos * base^(-2i/n_dims) (divided by freq_factors[i] when a
// model has them, e.g. llama 3's rope_freqs). As in ggml, theta_i is formed by repeated
// f32 multiplication (theta_{i+1} = theta_i * base^(-2/n_dims)), which is what keeps
// long-context positions within the reference tolerances.
//
// Scaling beyond the trained context (freq_scale = 1 / factor):
//   linear: theta = freq_scale * theta_extrap;
//   YaRN (ext_factor > 0): theta = mix of the interpolated and extrapolated angle with a
//   linear ramp over the pair index between the "correction dims" of beta_fast and
//   beta_slow (dims whose wavelength fits ~beta rotations into n_ctx_orig), and cos/sin
//   scaled by attn_factor * (1 + 0.1 * ln(1 / freq_scale)).
//
// Dimensions past n_dims are left unchanged. Thread-safety: pure functions.
#pragma once

#include <cstdint>

namespace tierkv::kernels {

enum class RopeMode { kNorm, kNeox };

struct RopeParams {
  int n_dims = 0;              // rotated dimensions (<= head_dim, even)
  RopeMode mode = RopeMode::kNorm;
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;     // 1 / scaling factor (linear and YaRN)
  float ext_factor = 0.0f;     // YaRN extrapolation mix; 0 = off
  float attn_factor = 1.0f;    // magnitude scale of cos/sin
  float beta_fast = 32.0f;     // YaRN ramp ends, in rotations over n_ctx_orig
  float beta_slow = 1.0f;
  int n_ctx_orig = 0;          // trained context length (YaRN)
  const float* freq_factors = nullptr;  // [n_dims / 2] or null
};

// YaRN correction dims: the pair-index range [lo, hi] over which the ramp runs.
void RopeYarnCorrDims(int n_dims, int n_ctx_orig, float freq_base, float beta_fast, float beta_slow, float dims[2]);

// cos_sin[n_dims]: (cos, sin) of every pair at position pos.
void RopeAngles(const RopeParams& p, int64_t pos, float* cos_sin);

// Rotates n_heads vectors of head_dim values at x (head h at x + h * head_dim) with the
// angles from RopeAngles.
void ApplyRope(const RopeParams& p, const float* cos_sin, float* x, int n_heads, int head_dim);

}  // namespace tierkv::kernels
