// kvcache/codec_quality.cc
//
// Measures a codec on synthetic K/V (SyntheticKvOptions in codec.h): error of attention
// outputs against f16, and reconstruction error of K and V. Used by the codec tests, by
// `codec_bench --quality`, and for the tables in docs/codecs.md.
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "kvcache/codec.h"
#include "memory/half.h"
#include "memory/rng.h"

namespace tierkv {
namespace {

using Rng = SplitMix64;

struct SyntheticKv {
  std::vector<float> k, v, q;  // [tokens][d], [tokens][d], [queries][d]
};

// Per-channel scales: 1, except n_out distinct channels with a scale in [lo, hi].
std::vector<float> OutlierScales(Rng& rng, int d, int n_out, float lo, float hi) {
  std::vector<int> perm(d);
  std::iota(perm.begin(), perm.end(), 0);
  std::vector<float> scale(d, 1.0f);
  for (int i = 0; i < n_out; ++i) {
    const int j = i + static_cast<int>(rng.Next() % static_cast<uint64_t>(d - i));
    std::swap(perm[i], perm[j]);
    scale[perm[i]] = static_cast<float>(lo + (hi - lo) * rng.Uniform());
  }
  return scale;
}

SyntheticKv MakeSyntheticKv(const SyntheticKvOptions& o) {
  const int d = o.head_dim;
  const int n_out = o.outlier_channels < 0 ? std::max(1, d / 32) : o.outlier_channels;
  Rng rng(o.seed);
  const std::vector<float> k_scale =
      OutlierScales(rng, d, n_out, o.outlier_scale_min, o.outlier_scale_max);
  std::vector<float> v_scale =
      OutlierScales(rng, d, n_out, o.outlier_scale_min, o.outlier_scale_max);
  if (!o.outliers_in_v) v_scale.assign(d, 1.0f);
  SyntheticKv kv;
  kv.k.resize(static_cast<size_t>(o.tokens) * d);
  kv.v.resize(static_cast<size_t>(o.tokens) * d);
  kv.q.resize(static_cast<size_t>(o.queries) * d);
  for (size_t i = 0; i < kv.k.size(); ++i) kv.k[i] = static_cast<float>(rng.Normal()) * k_scale[i % d];
  for (size_t i = 0; i < kv.v.size(); ++i) kv.v[i] = static_cast<float>(rng.Normal()) * v_scale[i % d];
  for (float& x : kv.q) x = static_cast<float>(rng.Normal());
  return kv;
}

double RelMse(const std::vector<float>& truth, const std::vector<float>& approx) {
  double e = 0, n = 0;
  for (size_t i = 0; i < truth.size(); ++i) {
    const double diff = static_cast<double>(approx[i]) - truth[i];
    e += diff * diff;
    n += static_cast<double>(truth[i]) * truth[i];
  }
  return n > 0 ? e / n : 0.0;
}

Result<CodecQuality> Measure(const VectorCodec& codec, const SyntheticKvOptions& o) {
  if (o.tokens < 1 || o.queries < 1 || o.outlier_channels > o.head_dim ||
      !(o.outlier_scale_min <= o.outlier_scale_max)) {
    return Status::InvalidArgument("synthetic KV: need tokens >= 1, queries >= 1, "
                                   "outlier_channels <= head_dim, scale_min <= scale_max");
  }
  const int d = o.head_dim;
  const size_t t_count = static_cast<size_t>(o.tokens);
  const SyntheticKv kv = MakeSyntheticKv(o);

  // The reference: f16-encoded K and V (the f16 codec is measured against f32 instead).
  std::vector<float> k_ref = kv.k, v_ref = kv.v;
  if (codec.codec() != KvCodec::kF16) {
    for (float& x : k_ref) x = HalfToFloat(FloatToHalf(x));
    for (float& x : v_ref) x = HalfToFloat(FloatToHalf(x));
  }

  const size_t vb = codec.vector_bytes();
  std::vector<uint8_t> k_enc(t_count * vb), v_enc(t_count * vb);
  codec.EncodeMany(kv.k.data(), t_count, k_enc.data());
  codec.EncodeMany(kv.v.data(), t_count, v_enc.data());

  CodecQuality r;
  r.codec = codec.codec();
  r.head_dim = d;
  r.bits_per_value = codec.bits_per_value();
  {
    std::vector<float> dec(t_count * d);
    codec.DecodeMany(k_enc.data(), t_count, dec.data());
    r.k_rel_mse = RelMse(kv.k, dec);
    codec.DecodeMany(v_enc.data(), t_count, dec.data());
    r.v_rel_mse = RelMse(kv.v, dec);
  }

  const double inv_sqrt_d = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> ref_w(t_count), ref_out(d);
  std::vector<float> qp(d), scores(t_count), w(t_count), acc(d), out(d);
  double err2 = 0, ref2 = 0;
  for (int qi = 0; qi < o.queries; ++qi) {
    const float* q = kv.q.data() + static_cast<size_t>(qi) * d;
    // Reference attention, in double.
    double mx = -INFINITY;
    for (size_t t = 0; t < t_count; ++t) {
      double s = 0;
      for (int i = 0; i < d; ++i) s += static_cast<double>(q[i]) * k_ref[t * d + i];
      ref_w[t] = s * inv_sqrt_d;
      mx = std::max(mx, ref_w[t]);
    }
    double sum = 0;
    for (double& x : ref_w) sum += (x = std::exp(x - mx));
    std::fill(ref_out.begin(), ref_out.end(), 0.0);
    for (size_t t = 0; t < t_count; ++t) {
      for (int i = 0; i < d; ++i) ref_out[i] += ref_w[t] / sum * v_ref[t * d + i];
    }
    // The codec's attention, on the encoded bytes, in float as a kernel would do it.
    codec.PrepareQuery(q, qp.data());
    codec.DotMany(qp.data(), k_enc.data(), t_count, scores.data());
    float fmx = -INFINITY;
    for (float& s : scores) fmx = std::max(fmx, s *= static_cast<float>(inv_sqrt_d));
    float fsum = 0;
    for (size_t t = 0; t < t_count; ++t) fsum += (w[t] = std::exp(scores[t] - fmx));
    for (float& x : w) x /= fsum;
    std::fill(acc.begin(), acc.end(), 0.0f);
    codec.AccumulateMany(w.data(), v_enc.data(), t_count, acc.data());
    codec.FinishOutput(acc.data(), out.data());
    for (int i = 0; i < d; ++i) {
      const double diff = out[i] - ref_out[i];
      err2 += diff * diff;
      ref2 += ref_out[i] * ref_out[i];
    }
  }
  r.attention_rel_error = ref2 > 0 ? std::sqrt(err2 / ref2) : 0.0;
  return r;
}

}  // namespace

Result<CodecQuality> MeasureCodecQuality(KvCodec codec, const SyntheticKvOptions& options,
                                         uint64_t codec_seed) {
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<VectorCodec> c,
                          VectorCodec::Create(codec, options.head_dim, codec_seed));
  return Measure(*c, options);
}

Result<CodecQuality> MeasureCodecQuality(const VectorCodec& codec,
                                         const SyntheticKvOptions& options) {
  if (codec.head_dim() != options.head_dim) {
    return Status::InvalidArgument("codec head_dim " + std::to_string(codec.head_dim()) +
                                   " != synthetic head_dim " + std::to_string(options.head_dim));
  }
  return Measure(codec, options);
}

}  // namespace tierkv
