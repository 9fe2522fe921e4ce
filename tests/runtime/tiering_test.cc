// tests/runtime/tiering_test.cc
//
// Tiering does not change the math: a decode whose budgets force the KV blocks through
// Device -> Host -> Disk at every step gives logits bit-identical to an all-resident run,
// for every KV codec.
#include <cstring>
#include <filesystem>

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace tierkv
