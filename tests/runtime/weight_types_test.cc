// tests/runtime/weight_types_test.cc
//
// Weight types that no file in ../shared/reference uses (Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K,
// Q3_K, Q5_K, IQ4_XS, BF16; Q8_0, Q4_K and Q6_K as controls), end to end: ref-llama-f16's weights are re-quantized here to
// type T (a plain round-to-nearest, not llama-quantize's search), and the model is run
// twice on the same tokens: once with the T tensors, once with the same values written as
// F32. The two differ only in how the activations are rounded before each product
// (Q8_0 / Q8_1 / Q8_K / BF16 against f32), so the logits must agree closely; a wrong block
// layout, a wrong activation type or a loader that mislabels a tensor would not.
// The kernels' own bit-level checks are in tests/kernels/quant_test.cc.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/fp16.h"
#include "kernels/quant.h"
#include "runtime/gguf.h"
#include "runtime/gguf_writer.h"
#include "runtime/model.h"
#include "tests/runtime/model_test_util.h"
#include "tests/runtime/reference_util.h"

namespace tierkv {
namespace {

namespace fs = std::filesystem;
using kernels::WeightType;

const fs::path kRefModel = fs::path(TIERKV_SHARED_DIR) / "reference" / "models" / "ref-llama-f16.gguf";

uint16_t Half(float v) { return kernels::F32ToF16(v); }
float Round(float v) { return std::nearbyint(v); }

// The nearest of the 16 IQ4_NL levels to v.
int NearestLevel(float v) {
  int best = 0;
  for (int k = 1; k < 16; ++k) {
    if (std::fabs(v - kernels::kIq4nlValues[k]) < std::fabs(v - kernels::kIq4nlValues[best])) best = k;
  }
  return best;
}

// One block of 32 values of `type`, round-to-nearest; `out` gets block_bytes bytes.
void QuantizeBlock(WeightType type, const float* x, uint8_t* out) {
  float lo = x[0], hi = x[0], amax = 0.0f;
  for (int i = 0; i < 32; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    amax = std::max(amax, std::fabs(x[i]));
  }
  switch (type) {
    case WeightType::kQ4_1:
    case WeightType::kQ5_1: {
      const bool five = type == WeightType::kQ5_1;
      const int top = five ? 31 : 15;
      const float d = (hi - lo) / static_cast<float>(top);
      const float id = d > 0.0f ? 1.0f / d : 0.0f;
      const uint16_t dh = Half(d), mh = Half(lo);
      std::memcpy(out, &dh, 2);
      std::memcpy(out + 2, &mh, 2);
      uint8_t* qh = out + 4;
      uint8_t* qs = out + (five ? 8 : 4);
      if (five) std::memset(qh, 0, 4);
      std::memset(qs, 0, 16);
      for (int i = 0; i < 32; ++i) {
        const int q = std::clamp(static_cast<int>(Round((x[i] - lo) * id)), 0, top);
        qs[i % 16] |= static_cast<uint8_t>((q & 15) << (i < 16 ? 0 : 4));
        if (five && (q & 16)) qh[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
      }
      return;
    }
    case WeightType::kQ5_0: {
      const float d = amax / 15.0f;
      const float id = d > 0.0f ? 1.0f / d : 0.0f;
      const uint16_t dh = Half(d);
      std::memcpy(out, &dh, 2);
      uint8_t* qh = out + 2;
      uint8_t* qs = out + 6;
      std::memset(qh, 0, 4);
      std::memset(qs, 0, 16);
      for (int i = 0; i < 32; ++i) {
        const int q = std::clamp(static_cast<int>(Round(x[i] * id)) + 16, 0, 31);
        qs[i % 16] |= static_cast<uint8_t>((q & 15) << (i < 16 ? 0 : 4));
        if (q & 16) qh[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
      }
      return;
    }
    case WeightType::kIQ4_NL: {
      const float d = amax / 127.0f;
      const uint16_t dh = Half(d);
      std::memcpy(out, &dh, 2);
      uint8_t* qs = out + 2;
      std::memset(qs, 0, 16);
      for (int i = 0; i < 32; ++i) {
        qs[i % 16] |= static_cast<uint8_t>(NearestLevel(d > 0.0f ? x[i] / d : 0.0f) << (i < 16 ? 0 : 4));
      }
      return;
    }
    case WeightType::kQ8_0: kernels::QuantizeActivation(WeightType::kQ8_0, x, out, 32); return;
    default: break;
  }
  ADD_FAILURE() << "no test quantizer for " << kernels::WeightTypeName(type);
}

// One super-block of 256 values as Q2_K or Q3_K, round-to-nearest in two levels: a
// scale (and for Q2_K a min) per 16-value group, then those quantized against the
// super-block's d (and dmin); `out` gets block_bytes bytes.
void QuantizeSuperBlock(WeightType type, const float* x, uint8_t* out) {
  const bool two = type == WeightType::kQ2_K;
  float a[16], b[16];  // per group: step and (Q2_K) offset: x ~ a * q - b
  float amax = 0.0f, bmax = 0.0f;
  for (int g = 0; g < 16; ++g) {
    float lo = 0.0f, hi = 0.0f, mag = 0.0f;
    for (int i = 16 * g; i < 16 * g + 16; ++i) {
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
      mag = std::max(mag, std::fabs(x[i]));
    }
    a[g] = two ? (hi - lo) / 3.0f : mag / 4.0f;  // Q2_K: q in 0..3 from lo; Q3_K: -4..3
    b[g] = two ? -lo : 0.0f;
    amax = std::max(amax, a[g]);
    bmax = std::max(bmax, b[g]);
  }
  const float d = two ? amax / 15.0f : amax / 31.0f, dmin = bmax / 15.0f;
  int sc[16], mn[16];
  for (int g = 0; g < 16; ++g) {
    sc[g] = d > 0.0f ? static_cast<int>(Round(a[g] / d)) : 0;
    mn[g] = two && dmin > 0.0f ? std::clamp(static_cast<int>(Round(b[g] / dmin)), 0, 15) : 0;
    sc[g] = std::clamp(sc[g], 0, two ? 15 : 31);
  }
  const size_t bytes = kernels::GetWeightTypeInfo(type).block_bytes;
  std::memset(out, 0, bytes);
  uint8_t* qs = out + (two ? 16 : 32);
  for (int v = 0; v < 256; ++v) {
    const int g = v / 16;
    const float step = d * static_cast<float>(sc[g]);
    int q = 0;
    if (two) {
      q = step > 0.0f ? std::clamp(static_cast<int>(Round((x[v] + dmin * mn[g]) / step)), 0, 3) : 0;
    } else {
      q = (step > 0.0f ? std::clamp(static_cast<int>(Round(x[v] / step)), -4, 3) : 0) + 4;  // 0..7
      if (q & 4) out[v % 32] |= static_cast<uint8_t>(1u << (v / 32));                       // hmask
    }
    qs[32 * (v / 128) + v % 32] |= static_cast<uint8_t>((q & 3) << (2 * ((v % 128) / 32)));
  }
  if (two) {
    for (int g = 0; g < 16; ++g) out[g] = static_cast<uint8_t>(sc[g] | (mn[g] << 4));
    const uint16_t dh = Half(d), mh = Half(dmin);
    std::memcpy(out + 80, &dh, 2);
    std::memcpy(out + 82, &mh, 2);
  } else {
    uint8_t* scales = out + 96;
    for (int g = 0; g < 16; ++g) {
      const int code = sc[g] + 32;  // scale sc[g] >= 0, stored + 32
      scales[g % 8] |= static_cast<uint8_t>((code & 15) << (4 * (g / 8)));
      scales[8 + g % 4] |= static_cast<uint8_t>((code >> 4) << (2 * (g / 4)));
    }
    const uint16_t dh = Half(d);
    std::memcpy(out + 108, &dh, 2);
  }
}

// For each of `groups` groups of `size` values: the step max |x| / top into step[g];
// returns the largest step.
float GroupSteps(const float* x, int groups, int size, float top, float* step) {
  float largest = 0.0f;
  for (int g = 0; g < groups; ++g) {
    float mag = 0.0f;
    for (int i = size * g; i < size * g + size; ++i) mag = std::max(mag, std::fabs(x[i]));
    step[g] = mag / top;
    largest = std::max(largest, step[g]);
  }
  return largest;
}

// One super-block as Q6_K (the control for the Q8_K activation path: ref-llama-q4_k_m
// uses Q6_K): a signed 8-bit scale per 16-value group against d, 6-bit values stored +32;
// value v = 128h + 32k + l keeps its low 4 bits in ql[64h + l + 32 (k & 1)] (nibble k / 2)
// and its high 2 in bits 2k of qh[32h + l].
void QuantizeQ6K(const float* x, uint8_t* out) {
  float s[16];
  const float d = GroupSteps(x, 16, 16, 31.0f, s) / 127.0f;
  std::memset(out, 0, 210);
  uint8_t* ql = out;
  uint8_t* qh = out + 128;
  auto* scales = reinterpret_cast<int8_t*>(out + 192);
  for (int v = 0; v < 256; ++v) {
    const int h = v / 128, k = (v % 128) / 32, l = v % 32, g = v / 16;
    const int sc = d > 0.0f ? std::clamp(static_cast<int>(Round(s[g] / d)), 0, 127) : 0;
    const float step = d * static_cast<float>(sc);
    const int q = (step > 0.0f ? std::clamp(static_cast<int>(Round(x[v] / step)), -32, 31) : 0) + 32;
    ql[64 * h + l + 32 * (k & 1)] |= static_cast<uint8_t>((q & 15) << (4 * (k / 2)));
    qh[32 * h + l] |= static_cast<uint8_t>((q >> 4) << (2 * k));
    scales[8 * h + l / 16 + 2 * k] = static_cast<int8_t>(sc);
  }
  const uint16_t dh = Half(d);
  std::memcpy(out + 208, &dh, 2);
}

// One super-block as Q4_K or Q5_K: per 32-value sub-block j a step a_j and offset b_j
// (x ~ a_j * q - b_j, q in 0..15 or 0..31), both quantized to 6 bits against d and dmin;
// the 6-bit pairs packed as ScaleMinK4 reads them; sub-block j keeps value l in nibble
// j % 2 of qs[32 (j / 2) + l] and (Q5_K) its 5th bit at bit j of qh[l].
void QuantizeK4(WeightType type, const float* x, uint8_t* out) {
  const bool five = type == WeightType::kQ5_K;
  const int top = five ? 31 : 15;
  float a[8], b[8], amax = 0.0f, bmax = 0.0f;
  for (int j = 0; j < 8; ++j) {
    float lo = 0.0f, hi = 0.0f;
    for (int i = 32 * j; i < 32 * j + 32; ++i) {
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
    }
    a[j] = (hi - lo) / static_cast<float>(top);
    b[j] = -lo;
    amax = std::max(amax, a[j]);
    bmax = std::max(bmax, b[j]);
  }
  const float d = amax / 63.0f, dmin = bmax / 63.0f;
  int sc[8], mn[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = d > 0.0f ? std::clamp(static_cast<int>(Round(a[j] / d)), 0, 63) : 0;
    mn[j] = dmin > 0.0f ? std::clamp(static_cast<int>(Round(b[j] / dmin)), 0, 63) : 0;
  }
  std::memset(out, 0, kernels::GetWeightTypeInfo(type).block_bytes);
  const uint16_t dh = Half(d), mh = Half(dmin);
  std::memcpy(out, &dh, 2);
  std::memcpy(out + 2, &mh, 2);
  uint8_t* scales = out + 4;
  for (int j = 0; j < 4; ++j) {
    scales[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    scales[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
  uint8_t* qh = out + 16;
  uint8_t* qs = out + (five ? 48 : 16);
  for (int v = 0; v < 256; ++v) {
    const int j = v / 32, l = v % 32;
    const float step = d * static_cast<float>(sc[j]);
    const int q = step > 0.0f ? std::clamp(static_cast<int>(Round((x[v] + dmin * mn[j]) / step)), 0, top) : 0;
    qs[32 * (j / 2) + l] |= static_cast<uint8_t>((q & 15) << (4 * (j % 2)));
    if (five && (q & 16)) qh[l] |= static_cast<uint8_t>(1u << j);
  }
}

// One super-block as IQ4_XS: per 32-value sub-block a positive scale (code 33..63 over
// the 32 offset) against d, then each value's nearest IQ4_NL level; codes packed as
// ScaleIq4Xs reads them.
void QuantizeIq4Xs(const float* x, uint8_t* out) {
  float s[8];
  const float d = GroupSteps(x, 8, 32, 127.0f, s) / 31.0f;
  std::memset(out, 0, 136);
  const uint16_t dh = Half(d);
  std::memcpy(out, &dh, 2);
  uint16_t scales_h = 0;
  for (int j = 0; j < 8; ++j) {
    const int sc = d > 0.0f ? std::clamp(static_cast<int>(Round(s[j] / d)), 0, 31) : 0;
    const int code = sc + 32;
    out[4 + j / 2] |= static_cast<uint8_t>((code & 15) << (4 * (j % 2)));
    scales_h = static_cast<uint16_t>(scales_h | ((code >> 4) << (2 * j)));
    const float step = kernels::F16ToF32(dh) * static_cast<float>(sc);
    for (int l = 0; l < 32; ++l) {
      const int nib = NearestLevel(step > 0.0f ? x[32 * j + l] / step : 0.0f);
      out[8 + 16 * j + l % 16] |= static_cast<uint8_t>(nib << (l < 16 ? 0 : 4));
    }
  }
  std::memcpy(out + 2, &scales_h, 2);
}

// A row of n values as `type` (F32, BF16, a 32-value block type, Q2_K .. Q6_K or IQ4_XS).
std::vector<uint8_t> QuantizeRow(WeightType type, const float* x, int64_t n) {
  std::vector<uint8_t> out(kernels::RowBytes(type, n));
  if (type == WeightType::kF32) {
    std::memcpy(out.data(), x, out.size());
  } else if (type == WeightType::kBF16) {
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t b = kernels::F32ToBf16(x[i]);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  } else {
    const kernels::WeightTypeInfo& info = kernels::GetWeightTypeInfo(type);
    for (int64_t b = 0; b < n / info.block_size; ++b) {
      uint8_t* o = out.data() + b * info.block_bytes;
      if (type == WeightType::kQ6_K) {
        QuantizeQ6K(x + 256 * b, o);
      } else if (type == WeightType::kQ4_K || type == WeightType::kQ5_K) {
        QuantizeK4(type, x + 256 * b, o);
      } else if (type == WeightType::kIQ4_XS) {
        QuantizeIq4Xs(x + 256 * b, o);
      } else if (info.block_size == 256) {
        QuantizeSuperBlock(type, x + 256 * b, o);
      } else {
        QuantizeBlock(type, x + 32 * b, o);
      }
    }
  }
  return out;
}

// The scalar (non-array) metadata of `src`: enough for Model, which does not read the
// tokenizer arrays.
void CopyScalarMetadata(const GgufFile& src, GgufWriter& w) {
  for (const GgufKv& kv : src.metadata()) {
    const std::string key(kv.key);
    const GgufValue& v = kv.value;
    if (v.is_array()) continue;
    if (auto s = v.AsString(); s.ok()) {
      w.String(key, *s);
    } else if (v.type() == GgufValueType::kF32) {
      w.F32(key, *v.As<float>());
    } else if (v.type() == GgufValueType::kBool) {
      w.Bool(key, *v.As<bool>());
    } else if (auto u = v.As<uint32_t>(); u.ok()) {
      w.U32(key, *u);
    }
  }
}

struct ModelPair {
  std::shared_ptr<const GgufFile> typed;  // matrices in T
  std::shared_ptr<const GgufFile> f32;    // the same values as F32
};

// ref-llama-f16 with every F16 matrix turned into `type` (and, in the second image, into
// the F32 values that type decodes to).
ModelPair Requantize(const GgufFile& src, WeightType type) {
  GgufWriter typed, f32;
  CopyScalarMetadata(src, typed);
  CopyScalarMetadata(src, f32);
  for (const GgufTensor& t : src.tensors()) {
    const std::string name(t.name);
    const std::vector<uint64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
    if (t.type != GgmlType::kF16 || t.n_dims != 2) {
      std::vector<uint8_t> data(t.data, t.data + t.n_bytes);
      typed.Tensor(name, t.type, ne, data);
      f32.Tensor(name, t.type, ne, std::move(data));
      continue;
    }
    const int64_t cols = t.ne[0], rows = t.ne[1];
    std::vector<uint8_t> q, back;
    std::vector<float> row(static_cast<size_t>(cols)), decoded(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      kernels::DequantizeRow(WeightType::kF16, t.data + r * cols * 2, row.data(), cols);
      const std::vector<uint8_t> qr = QuantizeRow(type, row.data(), cols);
      kernels::DequantizeRow(type, qr.data(), decoded.data(), cols);
      q.insert(q.end(), qr.begin(), qr.end());
      const auto* fb = reinterpret_cast<const uint8_t*>(decoded.data());
      back.insert(back.end(), fb, fb + cols * 4);
    }
    typed.Tensor(name, static_cast<GgmlType>(static_cast<uint32_t>(type)), ne, std::move(q));
    f32.Tensor(name, GgmlType::kF32, ne, std::move(back));
  }
  ModelPair p;
  auto a = GgufFile::ParseOwned(typed.Finish(), "typed");
  auto b = GgufFile::ParseOwned(f32.Finish(), "f32");
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  if (a.ok()) p.typed = std::move(a).value();
  if (b.ok()) p.f32 = std::move(b).value();
  return p;
}

TEST(WeightTypesTest, RequantizedModelsMatchTheirF32Values) {
  TIERKV_NEED_REFERENCE(kRefModel);
  auto opened = GgufFile::Open(kRefModel.string());
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  const std::shared_ptr<const GgufFile> src = std::move(opened).value();
  // Token ids of P1 of the reference set, then a few more.
  const std::vector<int> tokens = {1, 450, 4996, 17354, 1701, 29916, 432, 17204, 975, 278, 17366, 11203,
                                   29889, 9038, 2501, 263, 931, 100, 2000, 31000};
  // Largest |logit difference| allowed, and of the mean over all logits (logits here
  // have a standard deviation of about 4). Measured, 32-value types against
  // their Q8_0 / Q8_1 activations: Q8_0 0.39 / 0.055, Q4_1 0.59 / 0.079, Q5_0 0.54 /
  // 0.080, Q5_1 0.58 / 0.077, IQ4_NL 0.42 / 0.060; K-quants against Q8_K (one scale per
  // 256 values, so coarser): Q6_K 0.79 / 0.10, Q3_K 0.75 / 0.093, Q2_K 0.99 / 0.11,
  // Q4_K 0.83 / 0.10, Q5_K 0.94 / 0.11, IQ4_XS 0.89 / 0.10;
  // BF16 0.19 / 0.022. In each family the new types are as close as the control (Q8_0,
  // Q4_K, Q6_K), whose paths match llama.cpp's reference vectors. A decoding error in a weight
  // type moves logits by whole units.
  struct Case {
    WeightType type;
    double max_abs, mean_abs;
  };
  for (const Case& c : {Case{WeightType::kQ8_0, 1.0, 0.15}, Case{WeightType::kQ4_1, 1.0, 0.15},
                        Case{WeightType::kQ5_0, 1.0, 0.15}, Case{WeightType::kQ5_1, 1.0, 0.15},
                        Case{WeightType::kIQ4_NL, 1.0, 0.15}, Case{WeightType::kQ6_K, 2.0, 0.25},
                        Case{WeightType::kQ3_K, 2.0, 0.25}, Case{WeightType::kQ2_K, 2.0, 0.25},
                        Case{WeightType::kQ4_K, 2.0, 0.25}, Case{WeightType::kQ5_K, 2.0, 0.25},
                        Case{WeightType::kIQ4_XS, 2.0, 0.25}, Case{WeightType::kBF16, 0.5, 0.05}}) {
    SCOPED_TRACE(kernels::WeightTypeName(c.type));
    const ModelPair p = Requantize(*src, c.type);
    ASSERT_NE(p.typed, nullptr);
    ASSERT_NE(p.f32, nullptr);
    // Two threads: parallel matvecs and attention.
    const auto a = testing::LogitsAfterEachToken(p.typed, tokens, 2);
    const auto b = testing::LogitsAfterEachToken(p.f32, tokens, 2);
    ASSERT_EQ(a.size(), tokens.size());
    ASSERT_EQ(b.size(), tokens.size());
    // A prefill in chunks reads these weights through MatMulMany.
    testing::ExpectChunkedPrefill(p.typed, tokens, 2, /*block_tokens=*/0, c.type, a, c.max_abs);
    double max_abs = 0, sum_abs = 0, n = 0;
    int same_top1 = 0;
    for (size_t t = 0; t < tokens.size(); ++t) {
      for (size_t i = 0; i < a[t].size(); ++i) {
        const double d = std::fabs(static_cast<double>(a[t][i]) - b[t][i]);
        max_abs = std::max(max_abs, d);
        sum_abs += d;
        n += 1;
      }
      same_top1 += std::max_element(a[t].begin(), a[t].end()) - a[t].begin() ==
                   std::max_element(b[t].begin(), b[t].end()) - b[t].begin();
    }
    const double mean_abs = sum_abs / n;
    std::printf("%-6s max |diff| %.4f, mean %.5f, same top-1 %d/%zu\n", kernels::WeightTypeName(c.type), max_abs,
                mean_abs, same_top1, tokens.size());
    EXPECT_LT(max_abs, c.max_abs);
    EXPECT_LT(mean_abs, c.mean_abs);
    EXPECT_GE(same_top1, static_cast<int>(tokens.size()) - 3);
    // And the typed model is not the F32 one in disguise: its weights are really read
    // as T (the rounding of the activations leaves a trace).
    EXPECT_GT(max_abs, 0.0);
  }
}

// A type the GGUF reader knows but the kernels cannot read (here IQ2_XXS, zero bytes) is
// refused when the model loads, with one line naming the tensor, its type and the types
// that are read.
TEST(WeightTypesTest, UnreadableTypeIsRefusedNamingTheTensor) {
  TIERKV_NEED_REFERENCE(kRefModel);
  auto opened = GgufFile::Open(kRefModel.string());
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  const std::unique_ptr<GgufFile> src = std::move(opened).value();
  GgufWriter w;
  CopyScalarMetadata(*src, w);
  for (const GgufTensor& t : src->tensors()) {
    const std::vector<uint64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
    if (t.name == "blk.1.ffn_up.weight") {
      w.Tensor(std::string(t.name), GgmlType::kIQ2_XXS, ne, std::vector<uint8_t>(static_cast<size_t>(t.ne[1]) * 66));
    } else {
      w.Tensor(std::string(t.name), t.type, ne, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
    }
  }
  auto file = GgufFile::ParseOwned(w.Finish(), "q2k");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto model = Model::Load(std::shared_ptr<const GgufFile>(std::move(file).value()));
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::kUnsupported);
  const std::string msg = model.status().ToString();
  EXPECT_NE(msg.find("blk.1.ffn_up.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("IQ2_XXS"), std::string::npos) << msg;
  EXPECT_NE(msg.find("IQ4_NL"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

}  // namespace
}  // namespace tierkv
