// tests/kernels/executor_test.cc
//
// The executor conformance suite: one test per op of kernels/executor.h, run against
// every executor name MakeExecutor knows (ExecutorNames) and skipped, with the reason,
// for those this build or machine lacks. Inputs go in through Upload into the
// executor's memory and results come out through ReadBack, so a device executor runs
// the same tests. Each op is compared with a scalar reference computed here (in double
// where the op sums), or with the format's reference (DequantizeRow, the codec's host
// Encode / Decode); the ops whose contract is "the same bits as another form" (MatMul
// per token vs MatVec, batched vs unbatched attention, the *Multi forms vs one query)
// are compared bit for bit.
#include "kernels/executor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/attention.h"
#include "kvcache/kv_cache.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kvcache/kv_test_util.h"
#include "tests/memory/mm_test_util.h"

namespace tierkv::kernels {
namespace {

class ExecutorConformance : public ::testing::TestWithParam<std::string_view> {
 protected:
  void SetUp() override {
    std::string why;
    exec_ = MakeExecutor(GetParam(), 2, &why);
    if (exec_ == nullptr) GTEST_SKIP() << "executor \"" << GetParam() << "\" not present: " << why;
  }

  // host -> a new array in the executor's memory.
  template <typename T>
  ExecArray<T> Put(const std::vector<T>& host) {
    return PutArray(*exec_, host);
  }
  template <typename T>
  std::vector<T> Get(const ExecArray<T>& a) {
    return GetArray(*exec_, a);
  }
  // A matrix whose rows live in the executor's memory.
  struct ExecMatrix {
    ExecArray<uint8_t> bytes;
    MatrixView view;
  };
  ExecMatrix PutMatrix(const OwnedMatrix& m) {
    ExecMatrix e{Put(m.bytes), m.view};
    e.view.data = e.bytes.data();
    return e;
  }

  std::unique_ptr<Executor> exec_;
};

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::vector<float> v = RandomVector(static_cast<int64_t>(n), seed);
  for (float& x : v) x *= scale;
  return v;
}

// Whether the executor takes the KV codec (Executor::SupportsKv); one that does not is
// skipped in the KV tests, with a line saying so.
bool TakesKv(const Executor& e, KvCodec codec) {
  auto c = VectorCodec::Create(codec, 64, 0);
  EXPECT_TRUE(c.ok());
  if (e.SupportsKv((*c)->desc())) return true;
  std::printf("[ SKIPPED  ] %s KV: not taken by the %s executor\n", KvCodecName(codec), e.name());
  return false;
}

// |a - b| <= tol * (1 + |b|) for every element.
void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * (1.0 + std::fabs(want[i]))) << "element " << i;
  }
}

TEST_P(ExecutorConformance, NamesItselfAndItsTier) {
  EXPECT_EQ(std::string_view(exec_->name()), GetParam());
  EXPECT_GE(exec_->threads(), 1);
  testing::TempDir dir;
  testing::SmallTiers host_only;
  host_only.device_frames = 0;
  host_only.disk_frames = 0;
  auto mm = testing::MakeManager(host_only, dir.path());
  // Every executor takes the f16 KV codec; the CPU executor takes them all.
  for (KvCodec codec : kAllKvCodecs) {
    if (codec == KvCodec::kF16 || exec_->host_memory()) {
      EXPECT_TRUE(TakesKv(*exec_, codec)) << KvCodecName(codec);
    }
  }
  if (exec_->host_memory()) {
    EXPECT_EQ(exec_->tier_for(*mm), Tier::kHost);
    auto with_sim = testing::MakeManager(testing::SmallTiers{}, dir.path());
    EXPECT_EQ(exec_->tier_for(*with_sim), Tier::kDevice);  // the simulated device is host memory
  } else {
    EXPECT_EQ(exec_->tier_for(*mm), Tier::kDevice) << "a device executor computes on the device tier";
  }
}

TEST_P(ExecutorConformance, UploadCopyReadBackRoundTrip) {
  const std::vector<float> host = Random(1000, 1);
  ExecArray<float> a = Put(host);
  ExecArray<float> b(exec_.get(), host.size());
  exec_->Copy(b.data(), a.data(), host.size() * sizeof(float));
  exec_->Synchronize();
  EXPECT_EQ(Get(b), host);
  ExecArray<float> empty(exec_.get(), 0);
  exec_->ReadBack(nullptr, empty.data(), 0);  // nothing to move is no error
}

TEST_P(ExecutorConformance, RetiredPinIsReleasedOnceComputeCompletes) {
  testing::TempDir dir;
  auto mm = testing::MakeManager(testing::SmallTiers{}, dir.path());
  const Tier tier = exec_->tier_for(*mm);
  auto page = mm->Allocate(mm->frame_bytes(), tier, 1);
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  auto pin = mm->Acquire(*page, tier, Access::kRead);
  ASSERT_TRUE(pin.ok()) << pin.status().ToString();
  exec_->WaitFor(*pin);
  EXPECT_EQ(mm->Free(*page).code(), StatusCode::kFailedPrecondition) << "a pinned page cannot be freed";
  exec_->Retire(std::move(pin).value());
  exec_->Synchronize();
  EXPECT_TRUE(mm->Free(*page).ok()) << "the retired pin was released after Synchronize";
}

TEST_P(ExecutorConformance, GetRowIsTheFormatsDequantization) {
  for (WeightType t : {WeightType::kF32, WeightType::kF16, WeightType::kBF16, WeightType::kQ8_0, WeightType::kQ4_0,
                       WeightType::kQ4_K, WeightType::kQ5_K, WeightType::kQ6_K}) {
    SCOPED_TRACE(WeightTypeName(t));
    const OwnedMatrix m = RandomMatrix(t, 5, 256, 2);
    ExecMatrix e = PutMatrix(m);
    ExecArray<float> out(exec_.get(), 256);
    exec_->GetRow(e.view, 3, out.data());
    std::vector<float> want(256);
    DequantizeRow(t, m.view.Row(3), want.data(), 256);
    EXPECT_EQ(Get(out), want);
  }
}

TEST_P(ExecutorConformance, RmsNormMatchesDoubleReference) {
  for (int rows : {1, 4}) {
    const int n = 96;
    const std::vector<float> x = Random(static_cast<size_t>(rows) * n, 3, 3.0f), w = Random(n, 4);
    ExecArray<float> ex = Put(x), ew = Put(w), out(exec_.get(), x.size());
    exec_->RmsNorm(ex.data(), ew.data(), rows, n, 1e-6f, out.data());
    std::vector<double> want(x.size());
    for (int r = 0; r < rows; ++r) {
      double ss = 0;
      for (int i = 0; i < n; ++i) ss += double(x[r * n + i]) * x[r * n + i];
      const double scale = 1.0 / std::sqrt(ss / n + 1e-6);
      for (int i = 0; i < n; ++i) want[r * n + i] = x[r * n + i] * scale * w[i];
    }
    ExpectClose(Get(out), want, 1e-5);
  }
}

// llama.cpp's rotation (no YaRN): pair (i, i + 1) (norm) or (i, i + n_dims / 2) (neox)
// turned by pos * freq_scale * base^(-2j / n_dims), j the pair's index.
std::vector<double> RopeReference(const std::vector<float>& x, const RopeParams& p, int64_t pos, int heads, int hd) {
  std::vector<double> out(x.begin(), x.end());
  for (int h = 0; h < heads; ++h) {
    for (int j = 0; j < p.n_dims / 2; ++j) {
      const double theta = double(pos) * p.freq_scale * std::pow(double(p.freq_base), -2.0 * j / p.n_dims);
      const int a = p.mode == RopeMode::kNeox ? j : 2 * j;
      const int b = p.mode == RopeMode::kNeox ? j + p.n_dims / 2 : 2 * j + 1;
      const double x0 = x[h * hd + a], x1 = x[h * hd + b];
      out[h * hd + a] = x0 * std::cos(theta) - x1 * std::sin(theta);
      out[h * hd + b] = x0 * std::sin(theta) + x1 * std::cos(theta);
    }
  }
  return out;
}

TEST_P(ExecutorConformance, RopeMatchesReferenceAndNeverReusesOtherAngles) {
  const int heads = 3, hd = 64;
  const std::vector<float> x = Random(heads * hd, 5);
  RopeParams norm;
  norm.n_dims = hd;
  norm.freq_base = 10000.0f;
  RopeParams neox = norm;
  neox.mode = RopeMode::kNeox;
  neox.n_dims = 32;  // partial rotation: the rest passes through
  neox.freq_base = 1000000.0f;
  neox.freq_scale = 0.25f;
  // Same position, other parameters, then another position: each call its own angles.
  for (const auto& [p, pos] : {std::pair{norm, int64_t{17}}, std::pair{neox, int64_t{17}},
                               std::pair{neox, int64_t{4000}}, std::pair{norm, int64_t{4000}}}) {
    ExecArray<float> ex = Put(x);
    exec_->Rope(p, pos, ex.data(), heads, hd);
    ExpectClose(Get(ex), RopeReference(x, p, pos, heads, hd), 2e-4);
  }
}

TEST_P(ExecutorConformance, AddAndSwiGlu) {
  const std::vector<float> y = Random(300, 6), x = Random(300, 7), g = Random(300, 8, 4.0f), u = Random(300, 9);
  ExecArray<float> ey = Put(y), ex = Put(x);
  exec_->Add(ey.data(), ex.data(), y.size());
  std::vector<float> sum(y.size());
  for (size_t i = 0; i < y.size(); ++i) sum[i] = y[i] + x[i];
  EXPECT_EQ(Get(ey), sum);

  ExecArray<float> eg = Put(g), eu = Put(u);
  exec_->SwiGlu(eg.data(), eu.data(), eg.data(), static_cast<int64_t>(g.size()));  // in place, as the model does
  std::vector<double> want(g.size());
  for (size_t i = 0; i < g.size(); ++i) want[i] = g[i] / (1.0 + std::exp(-double(g[i]))) * u[i];
  ExpectClose(Get(eg), want, 1e-5);
}

// The types of real GGUF files (Q4_K_M, Q5_K_M, Q8_0 mixes) and the float ones.
constexpr WeightType kModelTypes[] = {WeightType::kF32,  WeightType::kF16,  WeightType::kBF16,
                                      WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kQ4_K,
                                      WeightType::kQ5_K, WeightType::kQ6_K};

// y = W x in double over the dequantized rows; tolerance: the activation's rounding to
// the weight type's dot-product type (Q8_0 / Q8_K: ~1/127 of a block's largest value;
// F16 / BF16 activations for those weights) against sum |w_i x_i|.
void ExpectProductClose(const std::vector<float>& y, const OwnedMatrix& m, const std::vector<float>& x, WeightType t) {
  const int64_t cols = m.view.cols;
  std::vector<float> w(static_cast<size_t>(cols));
  const double rel = t == WeightType::kF32 ? 1e-5 : t == WeightType::kBF16 ? 1e-2 : t == WeightType::kF16 ? 2e-3 : 2e-2;
  for (int64_t r = 0; r < m.view.rows; ++r) {
    DequantizeRow(t, m.view.Row(r), w.data(), cols);
    double dot = 0, mag = 0;
    for (int64_t i = 0; i < cols; ++i) {
      dot += double(w[i]) * x[i];
      mag += std::fabs(double(w[i]) * x[i]);
    }
    ASSERT_NEAR(y[r], dot, rel * mag + 1e-6) << "row " << r;
  }
}

TEST_P(ExecutorConformance, MatVecOverEveryModelWeightType) {
  for (WeightType t : kModelTypes) {
    SCOPED_TRACE(WeightTypeName(t));
    const OwnedMatrix m = RandomMatrix(t, 70, 512, 10);
    const std::vector<float> x = Random(512, 11);
    ExecMatrix e = PutMatrix(m);
    ExecArray<float> ex = Put(x), y(exec_.get(), 70);
    ActivationRow act;
    exec_->SetActivation(act, ex.data(), 512);
    exec_->MatVecOne(e.view, act, y.data());
    ExpectProductClose(Get(y), m, x, t);
  }
}

TEST_P(ExecutorConformance, MatMulPerTokenIsMatVecAndBatchedIsClose) {
  const int n = 5;
  for (WeightType t : kModelTypes) {
    SCOPED_TRACE(WeightTypeName(t));
    const OwnedMatrix m = RandomMatrix(t, 37, 256, 12);
    ExecMatrix e = PutMatrix(m);
    std::vector<std::vector<float>> xs;
    std::vector<ExecArray<float>> exs;
    std::vector<ActivationRow> acts(n);
    std::vector<ActivationRow*> ptrs;
    for (int i = 0; i < n; ++i) {
      xs.push_back(Random(256, 20 + i));
      exs.push_back(Put(xs.back()));
      exec_->SetActivation(acts[i], exs.back().data(), 256);
      ptrs.push_back(&acts[i]);
    }
    for (TokenSums sums : {TokenSums::kPerToken, TokenSums::kBatched}) {
      ExecArray<float> y(exec_.get(), n * 40);
      const MatMulJob job{&e.view, ptrs.data(), n, y.data(), 40, sums};
      exec_->MatMul({&job, 1});
      const std::vector<float> got = Get(y);
      for (int i = 0; i < n; ++i) {
        const std::vector<float> row(got.begin() + i * 40, got.begin() + i * 40 + 37);
        if (sums == TokenSums::kPerToken) {
          ExecArray<float> one(exec_.get(), 37);
          exec_->MatVecOne(e.view, acts[i], one.data());
          EXPECT_EQ(row, Get(one)) << "token " << i << ": per-token sums are MatVec's bits";
        }
        ExpectProductClose(row, m, xs[i], t);
      }
    }
  }
}

TEST_P(ExecutorConformance, RouteTopKAndCombineMatchReference) {
  const int n_expert = 64, k = 8;
  const std::vector<float> logits = Random(n_expert, 13, 2.0f);
  ExecArray<float> el = Put(logits);
  // Reference: softmax in double, descending, ties to the smaller id.
  std::vector<double> prob(n_expert);
  const double mx = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (int i = 0; i < n_expert; ++i) z += prob[i] = std::exp(logits[i] - mx);
  for (double& p : prob) p /= z;
  std::vector<int> order(n_expert);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return prob[a] > prob[b]; });
  for (bool normalize : {false, true}) {
    std::vector<int> ids(k);
    std::vector<float> weights(k);
    exec_->RouteTopK(el.data(), n_expert, k, normalize, ids.data(), weights.data());
    double top = 0;
    for (int i = 0; i < k; ++i) top += prob[order[i]];
    for (int i = 0; i < k; ++i) {
      EXPECT_EQ(ids[i], order[i]);
      EXPECT_NEAR(weights[i], prob[order[i]] / (normalize ? top : 1.0), 1e-6);
    }
    // out = sum in order of weights[i] * rows[i].
    const int64_t n = 200;
    const std::vector<float> rows = Random(k * n, 14);
    ExecArray<float> er = Put(rows), out(exec_.get(), n);
    exec_->CombineExperts(weights.data(), er.data(), k, n, out.data());
    std::vector<double> want(n, 0.0);
    for (int i = 0; i < k; ++i) {
      for (int64_t d = 0; d < n; ++d) want[d] += double(weights[i]) * rows[i * n + d];
    }
    ExpectClose(Get(out), want, 1e-5);
  }
}

// A KV cache on a host-only manager (whatever the executor: a device executor's tier
// comes from tier_for), filled through the executor's AppendKv.
struct KvFixture {
  testing::TempDir dir;
  std::unique_ptr<MemoryManager> mm;
  std::unique_ptr<KvCache> cache;
  SeqId seq;
};

std::unique_ptr<KvFixture> MakeKv(Executor& exec, KvCodec codec, int block_tokens, int n_tokens, uint32_t seed) {
  auto f = std::make_unique<KvFixture>();
  testing::SmallTiers tiers;
  // A device executor computes on the Device tier: in VRAM for it, none for the CPU.
  tiers.device_frames = exec.host_memory() ? 0 : 64;
  tiers.cuda_device = !exec.host_memory();
  tiers.disk_frames = 0;
  tiers.host_frames = 64;
  tiers.frame_bytes = 64 << 10;
  f->mm = testing::MakeManager(tiers, f->dir.path());
  KvGeometry g;
  g.n_layers = 1;
  g.n_kv_heads = 2;
  g.head_dim = 64;
  g.block_tokens = block_tokens;
  g.codec = codec;
  auto cache = KvCache::Create(f->mm.get(), g);
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
  f->cache = std::move(cache).value();
  f->seq = f->cache->NewSequence();
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> k(128), v(128);
  for (int pos = 0; pos < n_tokens; ++pos) {
    EXPECT_TRUE(f->cache->AppendToken(f->seq).ok());
    for (float& x : k) x = nd(rng);
    for (float& x : v) x = nd(rng);
    ExecArray<float> ek(&exec, k.size()), ev(&exec, v.size());
    exec.Upload(ek.data(), k.data(), k.size() * sizeof(float));
    exec.Upload(ev.data(), v.data(), v.size() * sizeof(float));
    auto t = f->cache->PrepareWrite(f->seq, 0, pos, exec.tier_for(*f->mm));
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    exec.AppendKv(f->cache->codec(), t->slot, ek.data(), ev.data());
    exec.Retire(std::move(t->pin));
  }
  exec.Synchronize();
  return f;
}

TEST_P(ExecutorConformance, AppendKvWritesTheCodecsBytes) {
  for (KvCodec codec : kAllKvCodecs) {
    if (!TakesKv(*exec_, codec)) continue;
    for (int block_tokens : {16, 24}) {  // 16: f16, q8_0 and q4_0 keys in tiles
      SCOPED_TRACE(std::string(KvCodecName(codec)) + ", block of " + std::to_string(block_tokens));
      auto f = MakeKv(*exec_, codec, block_tokens, 40, 15);
      // The same tokens written by KvCache::Write: the codec's host encoding.
      auto ref = MakeKv(*exec_, codec, block_tokens, 0, 15);
      std::mt19937 rng(15);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> k(128), v(128);
      for (int pos = 0; pos < 40; ++pos) {
        for (float& x : k) x = nd(rng);
        for (float& x : v) x = nd(rng);
        ASSERT_TRUE(ref->cache->AppendToken(ref->seq).ok());
        ASSERT_TRUE(ref->cache->Write(ref->seq, 0, pos, k.data(), v.data()).ok());
      }
      EXPECT_EQ(f->cache->key_tiles(), codec != KvCodec::kTq4 && codec != KvCodec::kTq3 && block_tokens == 16);
      EXPECT_EQ(testing::BlockBytes(*f->cache, f->seq), testing::BlockBytes(*ref->cache, ref->seq));
    }
  }
}

// Attention of one query (q [n_heads][head_dim], at position query_pos) over the
// decoded K/V of the fixture's sequence, in double: grouped-query, causal. For q8_0 and
// q4_0 keys the query is first rounded as their scores round it (to q8_0, as llama.cpp
// does for these K types), so what is left is float rounding.
std::vector<double> AttentionReference(KvFixture& f, const std::vector<float>& q_in, const AttentionParams& p) {
  const int hd = p.head_dim, group = p.n_heads / p.n_kv_heads;
  std::vector<float> q = q_in;
  const KvCodec codec = f.cache->codec().codec();
  if (codec == KvCodec::kQ8_0 || codec == KvCodec::kQ4_0) {
    auto q8 = VectorCodec::Create(KvCodec::kQ8_0, hd, 0).value();
    std::vector<uint8_t> enc(q8->vector_bytes());
    for (int h = 0; h < p.n_heads; ++h) {
      q8->Encode(&q[h * hd], enc.data());
      q8->Decode(enc.data(), &q[h * hd]);
    }
  }
  const int n = static_cast<int>(p.query_pos) + 1;
  std::vector<std::vector<float>> ks(n, std::vector<float>(p.n_kv_heads * hd)), vs = ks;
  for (int t = 0; t < n; ++t) EXPECT_TRUE(f.cache->Read(f.seq, 0, t, ks[t].data(), vs[t].data()).ok());
  std::vector<double> out(static_cast<size_t>(p.n_heads) * hd, 0.0);
  for (int h = 0; h < p.n_heads; ++h) {
    const int kvh = h / group;
    std::vector<double> s(n);
    for (int t = 0; t < n; ++t) {
      double d = 0;
      for (int i = 0; i < hd; ++i) d += double(q[h * hd + i]) * ks[t][kvh * hd + i];
      s[t] = d * p.scale;
    }
    const double mx = *std::max_element(s.begin(), s.end());
    double z = 0;
    for (double& x : s) z += x = std::exp(x - mx);
    for (int t = 0; t < n; ++t) {
      for (int i = 0; i < hd; ++i) out[h * hd + i] += s[t] / z * vs[t][kvh * hd + i];
    }
  }
  return out;
}

// Runs queries qs (each [n_heads][head_dim], at p.query_pos + its index) through
// begin / visits of `batch` blocks / end; one query alone uses the single forms.
std::vector<std::vector<float>> RunAttention(Executor& exec, KvFixture& f, const std::vector<std::vector<float>>& qs,
                                             AttentionParams p, bool two_pass, int batch) {
  const KvCache& cache = *f.cache;
  const int n_blocks = cache.NumBlocks(f.seq);
  std::vector<Pin> pins;
  std::vector<const std::byte*> blocks;
  for (int b = 0; b < n_blocks; ++b) {
    auto pin = f.mm->Acquire(cache.BlockPage(f.seq, 0, b), exec.tier_for(*f.mm));
    EXPECT_TRUE(pin.ok()) << pin.status().ToString();
    exec.WaitFor(*pin);
    blocks.push_back(pin->data());
    pins.push_back(std::move(pin).value());
  }
  const int m = static_cast<int>(qs.size());
  const int n_batches = (n_blocks + batch - 1) / batch;
  std::vector<AttentionParams> ps(m, p);
  std::vector<AttentionState> states(m);
  std::vector<AttentionState*> sts;
  std::vector<ExecArray<float>> eqs;
  for (int i = 0; i < m; ++i) {
    ps[i].query_pos = p.query_pos + i;
    sts.push_back(&states[i]);
    eqs.emplace_back(&exec, qs[i].size());
    exec.Upload(eqs.back().data(), qs[i].data(), qs[i].size() * sizeof(float));
    exec.AttentionBegin(cache.codec(), ps[i], eqs.back().data(), sts[i]);
  }
  const bool fused = two_pass && n_batches == 1;
  const int n_visits = fused ? 1 : n_batches * (two_pass ? 2 : 1);
  for (int v = 0; v < n_visits; ++v) {
    const int b0 = (v % n_batches) * batch;
    PagedKvView view;
    view.blocks = blocks.data() + b0;
    view.n_blocks = std::min(batch, n_blocks - b0);
    view.first_block = b0;
    view.n_tokens = cache.Length(f.seq);
    view.block_tokens = cache.geometry().block_tokens;
    view.n_kv_heads = cache.geometry().n_kv_heads;
    view.vector_bytes = cache.vector_bytes();
    view.key_tiles = cache.key_tiles();
    const AttentionVisit visit = !two_pass ? AttentionVisit::kOnline
                                 : fused   ? AttentionVisit::kTwoPass
                                 : v < n_batches ? AttentionVisit::kScores
                                                 : AttentionVisit::kValues;
    const bool softmax = visit == AttentionVisit::kScores && v + 1 == n_batches;
    if (m == 1) {
      exec.AttentionStep(cache.codec(), visit, ps[0], view, sts[0]);
      if (softmax) exec.AttentionSoftmax(ps[0], sts[0]);
    } else {
      exec.AttentionStepMulti(cache.codec(), visit, ps.data(), sts.data(), m, view);
      if (softmax) exec.AttentionSoftmaxMulti(ps.data(), sts.data(), m);
    }
  }
  std::vector<std::vector<float>> outs;
  for (int i = 0; i < m; ++i) {
    ExecArray<float> out(&exec, qs[i].size());
    exec.AttentionEnd(cache.codec(), ps[i], sts[i], out.data());
    outs.emplace_back(qs[i].size());
    exec.ReadBack(outs.back().data(), out.data(), qs[i].size() * sizeof(float));
  }
  for (Pin& pin : pins) exec.Retire(std::move(pin));
  exec.Synchronize();
  return outs;
}

TEST_P(ExecutorConformance, AttentionMatchesReferenceInEveryFormAndBatching) {
  for (KvCodec codec : kAllKvCodecs) {
    if (!TakesKv(*exec_, codec)) continue;
    SCOPED_TRACE(KvCodecName(codec));
    auto f = MakeKv(*exec_, codec, 16, 70, 16);  // 5 blocks, the last partly filled
    AttentionParams p;
    p.n_heads = 4;
    p.n_kv_heads = 2;
    p.head_dim = 64;
    p.scale = 0.125f;
    p.query_pos = 67;
    const std::vector<std::vector<float>> qs = {Random(256, 17), Random(256, 18), Random(256, 19)};
    // Quantized codecs decode to what they stored: the reference reads the same decode,
    // so the tolerance is float rounding (tq works in a rotated domain: a little more).
    const double tol = codec == KvCodec::kTq4 || codec == KvCodec::kTq3 ? 2e-4 : 5e-5;
    for (bool two_pass : {false, true}) {
      SCOPED_TRACE(two_pass ? "two-pass" : "online");
      const std::vector<float> whole = RunAttention(*exec_, *f, {qs[0]}, p, two_pass, 5)[0];
      ExpectClose(whole, AttentionReference(*f, qs[0], p), tol);
      for (int batch : {1, 2, 3}) {
        EXPECT_EQ(RunAttention(*exec_, *f, {qs[0]}, p, two_pass, batch)[0], whole)
            << "batches of " << batch << " blocks: other bits";
      }
      // Three queries together: each with the bits it has alone.
      const std::vector<std::vector<float>> many = RunAttention(*exec_, *f, qs, p, two_pass, 2);
      for (int i = 0; i < 3; ++i) {
        AttentionParams pi = p;
        pi.query_pos = p.query_pos + i;
        EXPECT_EQ(many[i], RunAttention(*exec_, *f, {qs[i]}, pi, two_pass, 5)[0]) << "query " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Executors, ExecutorConformance, ::testing::ValuesIn(ExecutorNames()),
                         [](const ::testing::TestParamInfo<std::string_view>& info) {
                           return std::string(info.param);
                         });

}  // namespace
}  // namespace tierkv::kernels
