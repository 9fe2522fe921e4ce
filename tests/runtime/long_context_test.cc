// tests/runtime/long_context_test.cc
//
// 131072 and 196608 tokens at CI size: a micro qwen3moe (2 layers, one KV head of 32)
// whose KV is filled to the depth with deterministic vectors (written through the cache
// as the decoder writes them), then a prefill chunk and decode steps through the model,
// all-resident and under budgets that spread the KV over the device, host and disk
// tiers. Tiering at that length changes no bit of the logits, and the tiers' counters
// say where the blocks were read.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/builtin_model.h"
#include "runtime/model.h"
#include "tests/memory/mm_test_util.h"

namespace tierkv {
namespace {

std::shared_ptr<const GgufFile> MicroModel() {
  SyntheticMoeShape shape;
  shape.n_embd = 64;
  shape.n_layer = 2;
  shape.n_head = 2;
  shape.n_head_kv = 1;
  shape.head_dim = 32;
  shape.n_expert = 4;
  shape.n_expert_used = 2;
  shape.n_ff_exp = 64;
  auto file = BuildSyntheticMoe(shape);
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  return file.ok() ? std::shared_ptr<const GgufFile>(std::move(file).value()) : nullptr;
}

#ifdef TIERKV_SANITIZE
constexpr int kChunk = 24, kSteps = 3;
#else
constexpr int kChunk = 64, kSteps = 8;
#endif

struct LongRun {
  std::vector<float> logits;  // the chunk's last row, then each step's
  TierStats tiers[kNumTiers];
  DecodeCounters counters;
};

// Fills [0, depth - kChunk) with vectors of a fixed stream, then runs the last kChunk
// prompt tokens as one chunk and kSteps decode steps. tiered: frames of 64 KiB, a device
// tier of 8, a host tier of 16 (the KV is 24-48 MiB), the rest on a disk file.
LongRun RunAtDepth(const std::shared_ptr<const GgufFile>& file, int depth, bool tiered) {
  LongRun run;
  testing::TempDir dir;
  testing::SmallTiers s;
  s.frame_bytes = 64 * 1024;
  s.device_frames = tiered ? 8 : 0;
  s.host_frames = tiered ? 16 : 1024;
  s.disk_frames = tiered ? 1024 : 0;
  std::unique_ptr<MemoryManager> mm = testing::MakeManager(s, dir.path());
  ModelOptions mo;
  mo.threads = 2;
  auto model = Model::Load(file, mo);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  if (!model.ok()) return run;
  const ModelConfig& c = (*model)->config();
  auto cache = KvCache::Create(mm.get(), (*model)->KvGeometryFor(KvCodec::kF16));
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
  if (!cache.ok()) return run;
  const SeqId seq = (*cache)->NewSequence();
  const size_t kd = static_cast<size_t>(c.n_head_kv) * c.head_dim;
  std::vector<float> k(kd), v(kd);
  uint64_t x = 0x5eed'0000'0001ull;
  auto next = [&x] {  // xorshift, uniform in [-1, 1)
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return static_cast<float>(static_cast<int64_t>(x >> 11) - (int64_t{1} << 52)) / static_cast<float>(int64_t{1} << 52);
  };
  for (int pos = 0; pos < depth - kChunk; ++pos) {
    auto p = (*cache)->AppendToken(seq);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (!p.ok()) return run;
    for (int l = 0; l < c.n_layer; ++l) {
      for (size_t i = 0; i < kd; ++i) {
        k[i] = 2.0f * next();
        v[i] = next();
      }
      const Status st = (*cache)->Write(seq, l, *p, k.data(), v.data());
      EXPECT_TRUE(st.ok()) << st.ToString();
      if (!st.ok()) return run;
    }
  }
  const int n_vocab = c.n_vocab;
  std::vector<int32_t> chunk;
  for (int i = 0; i < kChunk; ++i) chunk.push_back((i * 37 + 11) % n_vocab);
  std::vector<float> logits(static_cast<size_t>(n_vocab));
  const int last[] = {kChunk - 1};
  Status st = (*model)->ForwardBatch(**cache, seq, chunk, depth - kChunk, last, logits);
  EXPECT_TRUE(st.ok()) << st.ToString();
  run.logits = logits;
  for (int i = 0; i < kSteps && st.ok(); ++i) {
    const auto top = std::max_element(logits.begin(), logits.end()) - logits.begin();
    st = (*model)->Forward(**cache, seq, static_cast<int32_t>(top), depth + i, logits);
    EXPECT_TRUE(st.ok()) << st.ToString();
    run.logits.insert(run.logits.end(), logits.begin(), logits.end());
  }
  std::string why;
  EXPECT_TRUE((*cache)->CheckInvariants(&why)) << why;
  EXPECT_TRUE(mm->CheckInvariants(&why)) << why;
  for (int t = 0; t < kNumTiers; ++t) run.tiers[t] = mm->Stats(TierAt(t));
  run.counters = (*model)->counters();
  cache->reset();
  model->reset();
  return run;
}

class LongContextTest : public ::testing::TestWithParam<int> {};

TEST_P(LongContextTest, TieredEqualsResidentAtDepth) {
  const int depth = GetParam();
  auto file = MicroModel();
  ASSERT_NE(file, nullptr);
  const LongRun resident = RunAtDepth(file, depth, /*tiered=*/false);
  const LongRun tiered = RunAtDepth(file, depth, /*tiered=*/true);
  ASSERT_EQ(resident.logits.size(), static_cast<size_t>(kSteps + 1) * 258);
  ASSERT_EQ(tiered.logits.size(), resident.logits.size());
  for (float f : resident.logits) ASSERT_TRUE(std::isfinite(f));
  EXPECT_EQ(std::memcmp(tiered.logits.data(), resident.logits.data(), resident.logits.size() * sizeof(float)), 0)
      << "tiering changed the logits at " << depth << " tokens";
  // The KV lay on all three tiers, and every tier served blocks.
  for (Tier t : {Tier::kDevice, Tier::kHost, Tier::kDisk}) {
    const TierStats& st = tiered.tiers[TierIndex(t)];
    EXPECT_GT(st.pages.current, 0u) << TierName(t);
    EXPECT_GT(st.hits, 0u) << TierName(t);
    EXPECT_GT(st.bytes_read, 0u) << TierName(t);
  }
  EXPECT_GT(tiered.tiers[TierIndex(Tier::kDisk)].pages.current, tiered.tiers[TierIndex(Tier::kHost)].pages.current)
      << "most of the KV lives on disk";
  EXPECT_EQ(tiered.counters.kv_acquires, resident.counters.kv_acquires);
}

// Selective attention (attn_topk): a block whose keys are far larger than the others'
// (a needle) has the highest score bound for any query, so a step that reads only the
// first block, the last two and that one gives full attention's logits but for the
// weight of the blocks left out (e^-60 of the needle's: nothing in float), and reads
// 4 blocks of the 64 per layer. With a topk that covers every block, the bits of full
// attention.
TEST(SelectiveAttentionTest, FindsTheNeedleAndReadsFewBlocks) {
  auto file = MicroModel();
  ASSERT_NE(file, nullptr);
  constexpr int kBlock = 64, kBlocks = 64, kNeedle = 30;
  struct Out {
    std::vector<float> logits;
    uint64_t acquires_per_step = 0;
  };
  auto run = [&](int topk) {
    Out out;
    testing::TempDir dir;
    testing::SmallTiers s;
    s.frame_bytes = 64 * 1024;
    s.device_frames = 0;
    s.host_frames = 512;
    s.disk_frames = 0;
    std::unique_ptr<MemoryManager> mm = testing::MakeManager(s, dir.path());
    ModelOptions mo;
    mo.threads = 2;
    mo.attn_topk = topk;
    auto model = std::move(Model::Load(file, mo)).value();
    const ModelConfig& c = model->config();
    auto cache = std::move(KvCache::Create(mm.get(), model->KvGeometryFor(KvCodec::kF16, kBlock))).value();
    const SeqId seq = cache->NewSequence();
    const size_t kd = static_cast<size_t>(c.n_head_kv) * c.head_dim;
    std::vector<float> k(kd), v(kd);
    uint64_t x = 99;
    auto next = [&x] {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<float>(static_cast<int32_t>(x >> 32)) / 2147483648.0f;
    };
    const int depth = kBlocks * kBlock - 8;
    for (int pos = 0; pos < depth; ++pos) {
      EXPECT_TRUE(cache->AppendToken(seq).ok());
      const bool needle = pos / kBlock == kNeedle;
      for (int l = 0; l < c.n_layer; ++l) {
        for (size_t i = 0; i < kd; ++i) {
          k[i] = needle ? (next() < 0 ? -60.0f : 60.0f) : 0.01f * next();
          v[i] = next();
        }
        EXPECT_TRUE(cache->Write(seq, l, pos, k.data(), v.data()).ok());
      }
    }
    std::vector<float> logits(static_cast<size_t>(c.n_vocab));
    const uint64_t before = model->counters().kv_acquires;
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(model->Forward(*cache, seq, 65 + i, depth + i, logits).ok());
      out.logits.insert(out.logits.end(), logits.begin(), logits.end());
    }
    out.acquires_per_step = (model->counters().kv_acquires - before) / 3;
    return out;
  };
  const Out full = run(0), needle = run(1), all = run(kBlocks);
  ASSERT_EQ(full.logits.size(), needle.logits.size());
  EXPECT_EQ(full.acquires_per_step, 2u * kBlocks);
  EXPECT_EQ(needle.acquires_per_step, 2u * 4) << "the first, the last two and the needle, per layer";
  float most = 0;
  for (size_t i = 0; i < full.logits.size(); ++i) most = std::max(most, std::fabs(full.logits[i] - needle.logits[i]));
  EXPECT_LT(most, 1e-4f) << "the needle block carries the attention";
  EXPECT_EQ(std::memcmp(full.logits.data(), all.logits.data(), full.logits.size() * sizeof(float)), 0)
      << "a topk that covers every block is full attention";
}

INSTANTIATE_TEST_SUITE_P(Depths, LongContextTest, ::testing::Values(131072, 196608),
                         [](const ::testing::TestParamInfo<int>& info) { return std::to_string(info.param); });

}  // namespace
}  // namespace tierkv
