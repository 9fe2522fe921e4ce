// tests/runtime/tiering_test.cc
//
// Tiering does not change the math: a decode whose budgets force the KV blocks (and,
// with paged weights, the layer weights and experts) through Device -> Host -> Disk at
// every step gives logits bit-identical to an all-resident run, for every KV codec,
// builtin:tiny-moe and every reference model.
#include <cstring>
#include <filesystem>

#include <gtest/gtest.h>

#include "runtime/builtin_model.h"
#include "runtime/model.h"
#include "tests/memory/mm_test_util.h"

namespace tierkv {
namespace {

const std::string kModels = std::string(TIERKV_SHARED_DIR) + "/reference/models";

#ifdef TIERKV_SANITIZE
constexpr int kTokens = 100;
#else
constexpr int kTokens = 400;
#endif

struct Budget {
  uint32_t device_frames, host_frames, disk_frames;
  int kv_batch_blocks;
};

// Logits of every position of a fixed token stream, concatenated.
std::vector<float> Decode(std::shared_ptr<const GgufFile> file, KvCodec codec, const Budget& b, MemoryManager** mm_out,
                          std::unique_ptr<MemoryManager>* keep) {
  testing::TempDir dir;
  testing::SmallTiers s;
  s.frame_bytes = 16 * 1024;
  s.device_frames = b.device_frames;
  s.host_frames = b.host_frames;
  s.disk_frames = b.disk_frames;
  *keep = testing::MakeManager(s, dir.path());
  *mm_out = keep->get();
  ModelOptions mo;
  mo.threads = 2;
  mo.kv_batch_blocks = b.kv_batch_blocks;
  auto model = Model::Load(file, mo);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  auto cache = KvCache::Create(keep->get(), (*model)->KvGeometryFor(codec, /*block_tokens=*/16));
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
  const SeqId seq = (*cache)->NewSequence();
  const int n_vocab = (*model)->config().n_vocab;
  std::vector<float> all, logits(static_cast<size_t>(n_vocab));
  for (int pos = 0; pos < kTokens; ++pos) {
    const int32_t token = static_cast<int32_t>((pos * 7919 + 13) % n_vocab);
    Status st = (*model)->Forward(**cache, seq, token, pos, logits);
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (!st.ok()) break;
    if (pos % 10 == 9) all.insert(all.end(), logits.begin(), logits.end());
  }
  std::string why;
  EXPECT_TRUE((*cache)->CheckInvariants(&why)) << why;
  return all;
}

TEST(TieringTest, ForcedEvictionEveryStepGivesBitIdenticalLogits) {
  if (!std::filesystem::exists(kModels)) GTEST_SKIP() << "no reference models at " << kModels;
  auto file = GgufFile::Open(kModels + "/ref-llama-q8_0.gguf");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  std::shared_ptr<const GgufFile> shared = std::move(file).value();
  for (KvCodec codec : kAllKvCodecs) {
    SCOPED_TRACE(KvCodecName(codec));
    MemoryManager* mm = nullptr;
    std::unique_ptr<MemoryManager> keep_a, keep_b;
    const auto resident = Decode(shared, codec, {0, 4096, 0, 0}, &mm, &keep_a);
    // 2 device frames, 3 host frames: a layer's blocks stream through one at a time and
    // live on disk in between.
    const auto tiered = Decode(shared, codec, {2, 3, 512, 1}, &mm, &keep_b);
    const TierStats disk = mm->Stats(Tier::kDisk), dev = mm->Stats(Tier::kDevice);
    EXPECT_GT(disk.bytes_in, 0u);
    EXPECT_GT(disk.bytes_out, 0u) << "blocks were read back from disk";
    EXPECT_GT(dev.evictions + dev.drops, static_cast<uint64_t>(kTokens)) << "eviction at (about) every step";
    ASSERT_EQ(resident.size(), tiered.size());
    EXPECT_EQ(std::memcmp(resident.data(), tiered.data(), resident.size() * sizeof(float)), 0)
        << "tiering changed the logits";
  }
}

// Paged weights and the prefetch pipeline under budgets that hold little more than the
// largest weight page: every step evicts experts, layer weights and KV blocks.
struct PagedRun {
  std::vector<float> logits;  // every 4th position's, concatenated
  DecodeCounters counters;
  TierStats device;
};

PagedRun DecodePaged(std::shared_ptr<const GgufFile> file, KvCodec codec, bool paged, int tokens) {
  PagedRun run;
  testing::TempDir dir;
  ModelOptions mo;
  mo.threads = 2;
  auto model = Model::Load(file, mo);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  if (!model.ok()) return run;
  testing::SmallTiers s;
  s.frame_bytes = 16 * 1024;
  const uint64_t largest = (*model)->LargestWeightPage();
  const auto frames = [&](uint64_t bytes) { return static_cast<uint32_t>((bytes + s.frame_bytes - 1) / s.frame_bytes); };
  if (paged) {
    s.device_frames = frames(largest) + 8;  // the largest page plus a few KV blocks
    s.host_frames = frames(largest) + 8;
    s.disk_frames = 4096;
  } else {
    s.device_frames = 0;
    s.host_frames = frames(256ull << 20);
    s.disk_frames = 0;
  }
  std::unique_ptr<MemoryManager> mm = testing::MakeManager(s, dir.path());
  if (paged) {
    Status st = (*model)->UseMemory(mm.get());
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  auto cache = KvCache::Create(mm.get(), (*model)->KvGeometryFor(codec, /*block_tokens=*/16));
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
  const SeqId seq = (*cache)->NewSequence();
  const int n_vocab = (*model)->config().n_vocab;
  std::vector<float> logits(static_cast<size_t>(n_vocab));
  for (int pos = 0; pos < tokens; ++pos) {
    const int32_t token = static_cast<int32_t>((pos * 7919 + 13) % n_vocab);
    Status st = (*model)->Forward(**cache, seq, token, pos, logits);
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (!st.ok()) break;
    if (pos % 4 == 3) run.logits.insert(run.logits.end(), logits.begin(), logits.end());
  }
  std::string why;
  EXPECT_TRUE(mm->CheckInvariants(&why)) << why;
  run.counters = (*model)->counters();
  run.device = mm->Stats(Tier::kDevice);
  cache->reset();
  model->reset();  // before the memory manager
  return run;
}

TEST(TieringTest, PagedWeightsAndKvUnderTinyBudgetsGiveBitIdenticalLogits) {
  std::vector<std::pair<std::string, std::shared_ptr<const GgufFile>>> models;
  auto tiny = BuildBuiltinModel("tiny-moe");
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  models.emplace_back("builtin:tiny-moe", std::move(tiny).value());
  if (std::filesystem::exists(kModels)) {
    for (const auto& entry : std::filesystem::directory_iterator(kModels)) {
      if (entry.path().extension() != ".gguf") continue;
      auto f = GgufFile::Open(entry.path().string());
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      models.emplace_back(entry.path().filename().string(), std::move(f).value());
    }
  } else {
    std::printf("no reference models at %s: builtin:tiny-moe only\n", kModels.c_str());
  }
#ifdef TIERKV_SANITIZE
  const int tokens = 24;
#else
  const int tokens = 40;
#endif
  for (const auto& [name, file] : models) {
    for (KvCodec codec : kAllKvCodecs) {
      SCOPED_TRACE(name + " " + KvCodecName(codec));
      const PagedRun resident = DecodePaged(file, codec, /*paged=*/false, tokens);
      const PagedRun tiered = DecodePaged(file, codec, /*paged=*/true, tokens);
      ASSERT_EQ(resident.logits.size(), tiered.logits.size());
      ASSERT_FALSE(resident.logits.empty());
      EXPECT_EQ(std::memcmp(resident.logits.data(), tiered.logits.data(), resident.logits.size() * sizeof(float)), 0)
          << "paging changed the logits";
      // The budget forced traffic at every step: weights and KV were evicted and
      // fetched again (misses), experts too for MoE models.
      EXPECT_GT(tiered.device.evictions + tiered.device.drops, static_cast<uint64_t>(tokens));
      EXPECT_LT(tiered.counters.weight_hits, tiered.counters.weight_acquires);
      EXPECT_LT(tiered.counters.kv_hits, tiered.counters.kv_acquires);
      if (file->Has(std::string(file->architecture()) + ".expert_count")) {
        EXPECT_GT(tiered.counters.expert_acquires, 0u);
        EXPECT_LT(tiered.counters.expert_hits, tiered.counters.expert_acquires);
      }
      EXPECT_GT(tiered.counters.prefetched_pages, 0u);
    }
  }
}

}  // namespace
}  // namespace tierkv
