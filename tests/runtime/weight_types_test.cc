// tests/runtime/weight_types_test.cc
//
// Weight types that no file in ../shared/reference uses (Q4_1, Q5_0, Q5_1, IQ4_NL, BF16,
// and Q8_0 as a control), end to end: ref-llama-f16's weights are re-quantized here to
// type T (a plain round-to-nearest, not llama-quantize's search), and the model is run
// twice on the same tokens: once with the T tensors, once with the same values written as
// F32. The two differ only in how the activations are rounded before each product
// (Q8_0 / Q8_1 / BF16 against f32), so the logits must agree closely; a wrong block
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

namespace tierkv {
namespace {

namespace fs = std::filesystem;
using kernels::WeightType;

const fs::path kRefModel = fs::path(TIERKV_SHARED_DIR) / "reference" / "models" / "ref-llama-f16.gguf";

uint16_t Half(float v) { return kernels::F32ToF16(v); }
float Round(float v) { return std::nearbyint(v); }

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
        const float v = d > 0.0f ? x[i] / d : 0.0f;
        int best = 0;
        for (int k = 1; k < 16; ++k) {
          if (std::fabs(v - kernels::kIq4nlValues[k]) < std::fabs(v - kernels::kIq4nlValues[best])) best = k;
        }
        qs[i % 16] |= static_cast<uint8_t>(best << (i < 16 ? 0 : 4));
      }
      return;
    }
    case WeightType::kQ8_0: kernels::QuantizeActivation(WeightType::kQ8_0, x, out, 32); return;
    default: break;
  }
  ADD_FAILURE() << "no test quantizer for " << kernels::WeightTypeName(type);
}

// A row of n values as `type` (F32, BF16 or a 32-value block type).
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
    const size_t bb = kernels::GetWeightTypeInfo(type).block_bytes;
    for (int64_t b = 0; b < n / 32; ++b) QuantizeBlock(type, x + 32 * b, out.data() + b * bb);
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
  auto opened = GgufFile::Open(kRefModel.string());
  if (!opened.ok()) GTEST_SKIP() << "reference model not found: " << kRefModel;
  const std::shared_ptr<const GgufFile> src = std::move(opened).value();
  // Token ids of P1 of the reference set, then a few more.
  const std::vector<int> tokens = {1, 450, 4996, 17354, 1701, 29916, 432, 17204, 975, 278, 17366, 11203,
                                   29889, 9038, 2501, 263, 931, 100, 2000, 31000};
  // Largest |logit difference| allowed, and of the mean over all logits (logits here
  // have a standard deviation of about 4). Measured (2026-12-02): Q8_0 0.39 / 0.055, Q4_1
  // 0.59 / 0.079, Q5_0 0.54 / 0.080, Q5_1 0.58 / 0.077, IQ4_NL 0.42 / 0.060, BF16 0.19 /
  // 0.022: the activation rounding alone, the same size for the new types as for Q8_0,
  // whose path matches llama.cpp's reference vectors. A decoding error in a weight type
  // moves logits by whole units.
  struct Case {
    WeightType type;
    double max_abs, mean_abs;
  };
  for (const Case& c : {Case{WeightType::kQ8_0, 1.0, 0.15}, Case{WeightType::kQ4_1, 1.0, 0.15},
                        Case{WeightType::kQ5_0, 1.0, 0.15}, Case{WeightType::kQ5_1, 1.0, 0.15},
                        Case{WeightType::kIQ4_NL, 1.0, 0.15}, Case{WeightType::kBF16, 0.5, 0.05}}) {
    SCOPED_TRACE(kernels::WeightTypeName(c.type));
    const ModelPair p = Requantize(*src, c.type);
    ASSERT_NE(p.typed, nullptr);
    ASSERT_NE(p.f32, nullptr);
    // Two threads: parallel matvecs and attention.
    const auto a = testing::LogitsAfterEachToken(p.typed, tokens, 2);
    const auto b = testing::LogitsAfterEachToken(p.f32, tokens, 2);
    ASSERT_EQ(a.size(), tokens.size());
    ASSERT_EQ(b.size(), tokens.size());
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

// A type the GGUF reader knows but the kernels cannot read (here Q2_K, zero bytes) is
// refused when the model loads, with one line naming the tensor, its type and the types
// that are read.
TEST(WeightTypesTest, UnreadableTypeIsRefusedNamingTheTensor) {
  auto opened = GgufFile::Open(kRefModel.string());
  if (!opened.ok()) GTEST_SKIP() << "reference model not found: " << kRefModel;
  const std::unique_ptr<GgufFile> src = std::move(opened).value();
  GgufWriter w;
  CopyScalarMetadata(*src, w);
  for (const GgufTensor& t : src->tensors()) {
    const std::vector<uint64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
    if (t.name == "blk.1.ffn_up.weight") {
      w.Tensor(std::string(t.name), GgmlType::kQ2_K, ne, std::vector<uint8_t>(static_cast<size_t>(t.ne[1]) * 84));
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
  EXPECT_NE(msg.find("Q2_K"), std::string::npos) << msg;
  EXPECT_NE(msg.find("IQ4_NL"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

}  // namespace
}  // namespace tierkv
