// tests/kernels/cuda_executor_test.cc
//
// The CUDA executor against the CPU (kernels/cuda_executor.h), beyond the conformance
// suite's tolerances: the exact class bit for bit (the quantized matrix products on 10^4
// random rows per type at Qwen3-30B-A3B's width, RoPE, CombineExperts), and attention's
// error against a float64 reference within twice the CPU executor's, for every KV codec
// the executor takes and contexts up to 196,608 tokens. Skipped, with the reason, where
// this build or machine has no CUDA executor (every CI run: the GPU check runs them).
#include "kernels/cuda_executor.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/attention.h"
#include "kernels/cpu_executor.h"
#include "kernels/quant_hd.h"
#include "kvcache/kv_cache.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/memory/mm_test_util.h"

namespace tierkv::kernels {
namespace {

class CudaExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    gpu_ = MakeCudaExecutor(&why);
    if (gpu_ == nullptr) GTEST_SKIP() << "no CUDA executor: " << why;
    cpu_ = MakeCpuExecutor(2);
  }
  template <typename T>
  ExecArray<T> Put(const std::vector<T>& host) {
    return PutArray(*gpu_, host);
  }
  template <typename T>
  std::vector<T> Get(const ExecArray<T>& a) {
    return GetArray(*gpu_, a);
  }
  std::unique_ptr<Executor> gpu_, cpu_;
};

std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = std::bit_cast<uint32_t>(v[i]);
  return b;
}

TEST_F(CudaExecutorTest, MatrixProductsAreTheCpuBits) {
  const int64_t rows = 10000, cols = 2048;
  for (WeightType t : {WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kQ4_K, WeightType::kQ5_K, WeightType::kQ6_K,
                       WeightType::kF32, WeightType::kF16, WeightType::kBF16}) {
    SCOPED_TRACE(WeightTypeName(t));
    const OwnedMatrix m = RandomMatrix(t, rows, cols, 40 + static_cast<uint32_t>(t));
    ExecArray<uint8_t> wd = Put(m.bytes);
    MatrixView view = m.view;
    view.data = wd.data();
    for (uint32_t seed : {1u, 2u, 3u}) {
      std::vector<float> x = RandomVector(cols, seed);
      if (seed == 3) std::fill(x.begin(), x.begin() + 256, 0.0f);  // a zero block / super-block
      ExecArray<float> xd = Put(x), yd(gpu_.get(), rows);
      ActivationRow act;
      gpu_->SetActivation(act, xd.data(), cols);
      gpu_->MatVecOne(view, act, yd.data());
      // The quantized types: the CPU kernels' bits (any SIMD level with AVX2); the float
      // types: the scalar definitions' order (quant_hd.h).
      std::vector<float> want(static_cast<size_t>(rows));
      if (t == WeightType::kF32 || t == WeightType::kF16 || t == WeightType::kBF16) {
        std::vector<uint8_t> xa(RowBytes(t, cols));
        QuantizeActivation(t, x.data(), xa.data(), cols);
        for (int64_t r = 0; r < rows; ++r) ASSERT_TRUE(hd::DotRow(t, m.view.Row(r), xa.data(), cols, &want[r]));
      } else {
        MatVec(m.view, x.data(), want.data(), nullptr);
      }
      EXPECT_EQ(Bits(Get(yd)), Bits(want)) << "activation " << seed;
    }
  }
}

TEST_F(CudaExecutorTest, RopeAndCombineAreTheCpuBits) {
  const int n_heads = 32, head_dim = 128;
  const std::vector<float> x = RandomVector(n_heads * head_dim, 5);
  for (RopeMode mode : {RopeMode::kNorm, RopeMode::kNeox}) {
    RopeParams p;
    p.n_dims = head_dim;
    p.mode = mode;
    p.freq_base = 1e6f;
    p.ext_factor = mode == RopeMode::kNeox ? 1.0f : 0.0f;  // YaRN on one of them
    p.freq_scale = mode == RopeMode::kNeox ? 0.25f : 1.0f;
    p.n_ctx_orig = 32768;
    for (int64_t pos : {0, 7, 131071}) {
      std::vector<float> want = x;
      cpu_->Rope(p, pos, want.data(), n_heads, head_dim);
      ExecArray<float> xd = Put(x);
      gpu_->Rope(p, pos, xd.data(), n_heads, head_dim);
      EXPECT_EQ(Bits(Get(xd)), Bits(want)) << "position " << pos;
    }
  }
  const int k = 8, n = 2048;
  const std::vector<float> rows = RandomVector(k * n, 6), w = RandomVector(k, 7);
  std::vector<float> want(n);
  cpu_->CombineExperts(w.data(), rows.data(), k, n, want.data());
  ExecArray<float> rd = Put(rows), out(gpu_.get(), n);
  gpu_->CombineExperts(w.data(), rd.data(), k, n, out.data());
  EXPECT_EQ(Bits(Get(out)), Bits(want));
}

// One query over a KV cache of n tokens (one layer, 4 KV heads of 128, 8 query heads),
// online form, blocks visited 8 at a time; the blocks pinned on `tier`.
std::vector<float> Attend(Executor& e, MemoryManager& mm, KvCache& cache, SeqId seq, const std::vector<float>& q,
                          const AttentionParams& p) {
  const Tier tier = e.tier_for(mm);
  const int n_blocks = cache.NumBlocks(seq);
  ExecArray<float> qd(&e, q.size()), out(&e, q.size());
  e.Upload(qd.data(), q.data(), q.size() * sizeof(float));
  AttentionState st;
  e.AttentionBegin(cache.codec(), p, qd.data(), &st);
  for (int b0 = 0; b0 < n_blocks; b0 += 8) {
    std::vector<Pin> pins;
    std::vector<const std::byte*> blocks;
    for (int b = b0; b < std::min(n_blocks, b0 + 8); ++b) {
      auto pin = mm.Acquire(cache.BlockPage(seq, 0, b), tier, Access::kRead);
      EXPECT_TRUE(pin.ok()) << pin.status().ToString();
      e.WaitFor(*pin);
      blocks.push_back(pin->data());
      pins.push_back(std::move(pin).value());
    }
    PagedKvView view;
    view.blocks = blocks.data();
    view.n_blocks = static_cast<int>(blocks.size());
    view.first_block = b0;
    view.n_tokens = cache.Length(seq);
    view.block_tokens = cache.geometry().block_tokens;
    view.n_kv_heads = cache.geometry().n_kv_heads;
    view.vector_bytes = cache.vector_bytes();
    view.key_tiles = cache.key_tiles();
    e.AttentionStep(cache.codec(), AttentionVisit::kOnline, p, view, &st);
    for (Pin& pin : pins) e.Retire(std::move(pin));
  }
  e.AttentionEnd(cache.codec(), p, &st, out.data());
  std::vector<float> host(q.size());
  e.ReadBack(host.data(), out.data(), host.size() * sizeof(float));
  e.Synchronize();
  return host;
}

TEST_F(CudaExecutorTest, AttentionErrorIsWithinTwiceTheCpus) {
  const int n_kv = 4, hd = 128, n_heads = 8;
  for (KvCodec codec : {KvCodec::kF16, KvCodec::kQ8_0, KvCodec::kQ4_0}) {
    for (int n : {1, 1000, 65536, 196608}) {
      SCOPED_TRACE(std::string(KvCodecName(codec)) + ", " + std::to_string(n) + " tokens");
      testing::TempDir dir;
      testing::SmallTiers tiers;
      tiers.frame_bytes = 1 << 20;
      KvGeometry g;
      g.n_layers = 1;
      g.n_kv_heads = n_kv;
      g.head_dim = hd;
      g.codec = codec;
      g.block_tokens = KvCache::BlockTokensFor(g, tiers.frame_bytes).value();
      const uint32_t blocks = static_cast<uint32_t>((n + g.block_tokens - 1) / g.block_tokens);
      tiers.device_frames = blocks + 2;
      tiers.cuda_device = true;
      tiers.host_frames = blocks + 2;
      tiers.disk_frames = 0;
      auto mm = testing::MakeManager(tiers, dir.path());
      auto cache = KvCache::Create(mm.get(), g).value();
      const SeqId seq = cache->NewSequence();
      std::mt19937 rng(9);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> k(n_kv * hd), v(n_kv * hd);
      for (int pos = 0; pos < n; ++pos) {
        ASSERT_TRUE(cache->AppendToken(seq).ok());
        for (float& x : k) x = nd(rng);
        for (float& x : v) x = nd(rng);
        ASSERT_TRUE(cache->Write(seq, 0, pos, k.data(), v.data()).ok());
      }
      std::vector<float> q(n_heads * hd);
      for (float& x : q) x = nd(rng);
      AttentionParams p;
      p.n_heads = n_heads;
      p.n_kv_heads = n_kv;
      p.head_dim = hd;
      p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
      p.query_pos = n - 1;
      // The float64 reference over the stored (decoded) K/V and the query as the codec
      // rounds it (q8_0 for q8_0 / q4_0 keys).
      std::vector<float> qr = q;
      if (codec != KvCodec::kF16) {
        auto q8 = VectorCodec::Create(KvCodec::kQ8_0, hd, 0).value();
        std::vector<uint8_t> enc(q8->vector_bytes());
        for (int h = 0; h < n_heads; ++h) {
          q8->Encode(&qr[h * hd], enc.data());
          q8->Decode(enc.data(), &qr[h * hd]);
        }
      }
      std::vector<double> ref(n_heads * hd, 0.0), s(n);
      std::vector<std::vector<float>> ks(n, std::vector<float>(n_kv * hd)), vs = ks;
      for (int t = 0; t < n; ++t) ASSERT_TRUE(cache->Read(seq, 0, t, ks[t].data(), vs[t].data()).ok());
      for (int h = 0; h < n_heads; ++h) {
        const int kvh = h / (n_heads / n_kv);
        for (int t = 0; t < n; ++t) {
          double d = 0;
          for (int i = 0; i < hd; ++i) d += double(qr[h * hd + i]) * ks[t][kvh * hd + i];
          s[t] = d * p.scale;
        }
        const double mx = *std::max_element(s.begin(), s.end());
        double z = 0;
        for (double& x : s) z += x = std::exp(x - mx);
        for (int t = 0; t < n; ++t) {
          for (int i = 0; i < hd; ++i) ref[h * hd + i] += s[t] / z * vs[t][kvh * hd + i];
        }
      }
      const auto error = [&](const std::vector<float>& got) {
        double num = 0, den = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
          num = std::max(num, std::fabs(got[i] - ref[i]));
          den = std::max(den, std::fabs(ref[i]));
        }
        return num / den;
      };
      const double cpu_err = error(Attend(*cpu_, *mm, *cache, seq, q, p));
      const double gpu_err = error(Attend(*gpu_, *mm, *cache, seq, q, p));
      std::printf("attention %s %d tokens: error cpu %.3g, cuda %.3g\n", KvCodecName(codec), n, cpu_err, gpu_err);
      EXPECT_LE(gpu_err, 2 * cpu_err + 1e-6);
    }
  }
}

}  // namespace
}  // namespace tierkv::kernels
