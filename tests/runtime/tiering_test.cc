// tests/runtime/tiering_test.cc
//
// Tiering does not change the math: a decode whose budgets force the KV blocks (and,
// with paged weights, the layer weights and experts) through Device -> Host -> Disk at
// every step gives logits bit-identical to an all-resident run, for every KV codec,
// builtin:tiny-moe and every reference model; and so does a prefill in chunks
// (ForwardBatch), resident or tiered.
#include <algorithm>
#include <cstring>
#include <utility>
#include <filesystem>

#include <gtest/gtest.h>

#include "runtime/builtin_model.h"
#include "runtime/model.h"
#include "tests/memory/mm_test_util.h"
#include "tests/runtime/reference_util.h"

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

// Chunk sizes of a prefill split (0: one Forward per token); the split cycles through them.
using Chunks = std::vector<int>;

int32_t TokenAt(int pos, int n_vocab) { return static_cast<int32_t>((pos * 7919 + 13) % n_vocab); }

// Runs positions [0, tokens) of the fixed token stream through Forward (chunks empty) or
// ForwardBatch in chunks, appending the logits of every position p with p % every ==
// every - 1 to *all.
Status Run(Model& model, KvCache& cache, SeqId seq, int tokens, int every, const Chunks& chunks,
           std::vector<float>* all) {
  const int n_vocab = model.config().n_vocab;
  std::vector<float> logits(static_cast<size_t>(n_vocab));
  if (chunks.empty()) {
    for (int pos = 0; pos < tokens; ++pos) {
      TIERKV_RETURN_IF_ERROR(model.Forward(cache, seq, TokenAt(pos, n_vocab), pos, logits));
      if (pos % every == every - 1) all->insert(all->end(), logits.begin(), logits.end());
    }
    return Status::Ok();
  }
  size_t c = 0;
  for (int pos = 0; pos < tokens;) {
    const int n = std::min(chunks[c++ % chunks.size()], tokens - pos);
    std::vector<int32_t> ids;
    std::vector<int> rows;
    for (int i = 0; i < n; ++i) {
      ids.push_back(TokenAt(pos + i, n_vocab));
      if ((pos + i) % every == every - 1) rows.push_back(i);
    }
    logits.resize(rows.size() * static_cast<size_t>(n_vocab));
    TIERKV_RETURN_IF_ERROR(model.ForwardBatch(cache, seq, ids, pos, rows, logits));
    all->insert(all->end(), logits.begin(), logits.end());
    pos += n;
  }
  return Status::Ok();
}

// Logits of every position of a fixed token stream, concatenated.
// In-place runs (kv_batch_blocks 0): the disk arena's directory (empty: a temp dir under
// /tmp, read through; /dev/shm: mapped, read in place), the staging turn's bytes, and
// where the decoder's counters go.
struct InPlace {
  std::string disk_dir;
  uint64_t turn_bytes = 0;
  DecodeCounters* counters = nullptr;
};

std::vector<float> Decode(std::shared_ptr<const GgufFile> file, KvCodec codec, const Budget& b, MemoryManager** mm_out,
                          std::unique_ptr<MemoryManager>* keep, const Chunks& chunks = {}, int query_group = 0,
                          bool llama_sums = false, const InPlace& in_place = {}) {
  testing::TempDir dir;
  testing::SmallTiers s;
  s.frame_bytes = 16 * 1024;
  s.device_frames = b.device_frames;
  s.host_frames = b.host_frames;
  s.disk_frames = b.disk_frames;
  *keep = testing::MakeManager(s, in_place.disk_dir.empty() ? dir.path() : in_place.disk_dir);
  *mm_out = keep->get();
  ModelOptions mo;
  mo.threads = 2;
  mo.kv_batch_blocks = b.kv_batch_blocks;
  mo.read_through_turn_bytes = in_place.turn_bytes;
  mo.attention_query_group = query_group;
  mo.llama_attention_sums = llama_sums;
  auto model = Model::Load(file, mo);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  auto cache = KvCache::Create(keep->get(), (*model)->KvGeometryFor(codec, /*block_tokens=*/16));
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
  std::vector<float> all;
  const Status st = Run(**model, **cache, (*cache)->NewSequence(), kTokens, 10, chunks, &all);
  EXPECT_TRUE(st.ok()) << st.ToString();
  std::string why;
  EXPECT_TRUE((*cache)->CheckInvariants(&why)) << why;
  if (in_place.counters != nullptr) *in_place.counters = (*model)->counters();
  return all;
}

TEST(TieringTest, ForcedEvictionEveryStepGivesBitIdenticalLogits) {
  TIERKV_NEED_REFERENCE(kModels);
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

// Attention in llama.cpp's summation orders (f16 codec) keeps its value sums by residue
// across the batches a streamed layer comes in: decode steps and chunked prefills give
// the same bits resident and with every block streamed through a tiny device tier, and
// a chunk's queries taken a few at a time change nothing.
TEST(TieringTest, LlamaSumsGiveBitIdenticalLogitsWhenStreamed) {
  TIERKV_NEED_REFERENCE(kModels);
  auto file = GgufFile::Open(kModels + "/ref-llama-f16.gguf");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  std::shared_ptr<const GgufFile> shared = std::move(file).value();
  const Chunks chunks = {37, 1, 64, 5, 16};
  MemoryManager* mm = nullptr;
  std::unique_ptr<MemoryManager> keep[5];
  const Budget resident_budget{0, 4096, 0, 0}, streamed{2, 3, 512, 1};
  const auto steps = Decode(shared, KvCodec::kF16, resident_budget, &mm, &keep[0], {}, 0, true);
  const auto steps_streamed = Decode(shared, KvCodec::kF16, streamed, &mm, &keep[1], {}, 0, true);
  EXPECT_GT(mm->Stats(Tier::kDisk).bytes_out, 0u) << "blocks were read back from disk";
  const auto chunked = Decode(shared, KvCodec::kF16, resident_budget, &mm, &keep[2], chunks, 0, true);
  const auto chunked_streamed = Decode(shared, KvCodec::kF16, streamed, &mm, &keep[3], chunks, 7, true);
  const auto default_sums = Decode(shared, KvCodec::kF16, resident_budget, &mm, &keep[4]);
  ASSERT_FALSE(steps.empty());
  ASSERT_EQ(steps.size(), steps_streamed.size());
  ASSERT_EQ(chunked.size(), chunked_streamed.size());
  EXPECT_EQ(std::memcmp(steps.data(), steps_streamed.data(), steps.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(chunked.data(), chunked_streamed.data(), chunked.size() * sizeof(float)), 0);
  // The option changes the sums, so the logits (a little).
  ASSERT_EQ(steps.size(), default_sums.size());
  EXPECT_NE(std::memcmp(steps.data(), default_sums.data(), steps.size() * sizeof(float)), 0);
}

// A prefill in chunks (ForwardBatch: layer by layer, every query of a chunk over each KV
// block) gives the bits of one Forward per token: with the whole layer resident (the
// fused two-pass form, or the online form for the other codecs), streamed a block at a
// time through a tiny device tier (the two passes apart), and with the chunk's queries
// taken a few at a time.
TEST(TieringTest, PrefillChunksGiveBitIdenticalLogits) {
  TIERKV_NEED_REFERENCE(kModels);
  auto file = GgufFile::Open(kModels + "/ref-llama-q8_0.gguf");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  std::shared_ptr<const GgufFile> shared = std::move(file).value();
  const Chunks chunks = {37, 1, 64, 5, 16};
  for (KvCodec codec : kAllKvCodecs) {
    SCOPED_TRACE(KvCodecName(codec));
    MemoryManager* mm = nullptr;
    std::unique_ptr<MemoryManager> keep[4];
    const auto one_by_one = Decode(shared, codec, {0, 4096, 0, 0}, &mm, &keep[0]);
    ASSERT_FALSE(one_by_one.empty());
    const auto resident = Decode(shared, codec, {0, 4096, 0, 0}, &mm, &keep[1], chunks);
    const auto grouped = Decode(shared, codec, {0, 4096, 0, 0}, &mm, &keep[2], chunks, /*query_group=*/3);
    const auto tiered = Decode(shared, codec, {2, 3, 512, 1}, &mm, &keep[3], chunks, /*query_group=*/7);
    EXPECT_GT(mm->Stats(Tier::kDisk).bytes_out, 0u) << "blocks were read back from disk";
    const std::pair<const char*, const std::vector<float>*> runs[] = {
        {"resident", &resident}, {"queries 3 at a time", &grouped}, {"tiered", &tiered}};
    for (const auto& [what, run] : runs) {
      ASSERT_EQ(run->size(), one_by_one.size()) << what;
      EXPECT_EQ(std::memcmp(run->data(), one_by_one.data(), one_by_one.size() * sizeof(float)), 0)
          << "the chunked prefill changed the logits: " << what;
    }
  }
}

// Attention reads KV blocks where they lie: on the sim device and in host RAM in place,
// on an O_DIRECT disk file through a staging area (all at once, or a visit at a time
// with the next read in flight when the staging area is small), on a disk arena mapped
// in /dev/shm in place again. Nothing is promoted to be read, and the logits are the
// all-resident run's, for decode steps and chunked prefills, for every codec.
TEST(TieringTest, BlocksReadWhereTheyLieGiveBitIdenticalLogits) {
  TIERKV_NEED_REFERENCE(kModels);
  auto file = GgufFile::Open(kModels + "/ref-llama-q8_0.gguf");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  std::shared_ptr<const GgufFile> shared = std::move(file).value();
  const Chunks chunks = {37, 1, 64, 5, 16};
  const bool shm = std::filesystem::is_directory("/dev/shm");
  for (KvCodec codec : kAllKvCodecs) {
    SCOPED_TRACE(KvCodecName(codec));
    MemoryManager* mm = nullptr;
    std::unique_ptr<MemoryManager> keep[6];
    const auto resident = Decode(shared, codec, {0, 4096, 0, 0}, &mm, &keep[0]);
    const auto resident_chunked = Decode(shared, codec, {0, 4096, 0, 0}, &mm, &keep[1], chunks);
    ASSERT_FALSE(resident.empty());
    // Fast tiers of 2 + 3 frames: nearly every block ends on disk.
    const Budget spill{2, 3, 512, 0};
    struct Case {
      const char* what;
      InPlace where;
      bool chunked;
      bool staged_per_visit;
    };
    DecodeCounters c[4];
    const Case cases[] = {
        {"read through at once", {"", 0, &c[0]}, false, false},
        {"read through per visit", {"", 16 * 1024, &c[1]}, false, true},
        {"chunked, read through per visit and query group", {"", 16 * 1024, &c[2]}, true, true},
        {"mapped disk in place", {"/dev/shm", 0, &c[3]}, true, false},
    };
    for (size_t i = 0; i < std::size(cases); ++i) {
      const Case& k = cases[i];
      if (k.where.disk_dir == "/dev/shm" && !shm) continue;
      SCOPED_TRACE(k.what);
      const auto run = Decode(shared, codec, spill, &mm, &keep[2 + i], k.chunked ? chunks : Chunks{}, 0, false, k.where);
      const auto& want = k.chunked ? resident_chunked : resident;
      ASSERT_EQ(run.size(), want.size());
      EXPECT_EQ(std::memcmp(run.data(), want.data(), want.size() * sizeof(float)), 0) << "reading in place changed the logits";
      const TierStats disk = mm->Stats(Tier::kDisk), host = mm->Stats(Tier::kHost);
      // Served from the disk tier: at every decode step, at every chunk of a prefill.
      const uint64_t least = k.chunked ? 4 : static_cast<uint64_t>(kTokens);
      EXPECT_GT(disk.hits, least) << "blocks were served from the disk tier";
      EXPECT_GT(disk.bytes_read, 0u);
      // Nothing was promoted from disk to be read. (A chunk's writes bring back the block
      // the chunk before left half filled, once per layer and chunk: with fast tiers of
      // five frames that is most of the chunked runs' disk traffic, so not checked there.)
      if (!k.chunked) {
        EXPECT_EQ(disk.bytes_out, 0u);
      }
      EXPECT_GT(host.misses, 0u);
      if (mm->host_addressable(Tier::kDisk)) {
        EXPECT_EQ(c[i].kv_read_through, 0u);
        EXPECT_EQ(c[i].kv_hits, c[i].kv_acquires);
      } else {
        EXPECT_GT(c[i].kv_read_through, least);
        EXPECT_LT(c[i].kv_hits, c[i].kv_acquires);
      }
    }
  }
}

// Paged weights and the prefetch pipeline under budgets that hold little more than the
// largest weight page: every step evicts experts, layer weights and KV blocks.
struct PagedRun {
  std::vector<float> logits;  // every 4th position's, concatenated
  DecodeCounters counters;
  TierStats device;
};

PagedRun DecodePaged(std::shared_ptr<const GgufFile> file, KvCodec codec, bool paged, int tokens,
                     const Chunks& chunks = {}, uint64_t frame_bytes = 16 * 1024) {
  PagedRun run;
  testing::TempDir dir;
  ModelOptions mo;
  mo.threads = 2;
  auto model = Model::Load(file, mo);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  if (!model.ok()) return run;
  testing::SmallTiers s;
  s.frame_bytes = frame_bytes;
  const uint64_t largest = (*model)->LargestWeightPage(s.frame_bytes);
  const auto frames = [&](uint64_t bytes) { return static_cast<uint32_t>((bytes + s.frame_bytes - 1) / s.frame_bytes); };
  if (paged) {
    s.device_frames = frames(largest) + 8;  // the largest page plus a few KV blocks
    s.host_frames = frames(largest) + 8;
    s.disk_frames = static_cast<uint32_t>((64ull << 20) / frame_bytes);
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
  const Status st = Run(**model, **cache, (*cache)->NewSequence(), tokens, 4, chunks, &run.logits);
  EXPECT_TRUE(st.ok()) << st.ToString();
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
      // A prefill in chunks under the same budgets: the chunk's experts and KV blocks
      // go through the same tiny device tier.
      const PagedRun chunked = DecodePaged(file, codec, /*paged=*/true, tokens, {9, 2, 13});
      // (F16 / BF16 / F32 matrices sum a chunk as a batch, so the chunked run's reference
      // is a resident chunked run.)
      const PagedRun resident_chunked = DecodePaged(file, codec, /*paged=*/false, tokens, {9, 2, 13});
      ASSERT_EQ(resident.logits.size(), tiered.logits.size());
      ASSERT_EQ(resident.logits.size(), chunked.logits.size());
      ASSERT_EQ(resident.logits.size(), resident_chunked.logits.size());
      ASSERT_FALSE(resident.logits.empty());
      EXPECT_EQ(std::memcmp(resident.logits.data(), tiered.logits.data(), resident.logits.size() * sizeof(float)), 0)
          << "paging changed the logits";
      EXPECT_EQ(std::memcmp(resident_chunked.logits.data(), chunked.logits.data(), chunked.logits.size() * sizeof(float)),
                0)
          << "paging a chunked prefill changed the logits";
      // Each chunk's pages went through the tiny device tier as well (whether a page was
      // there in time, a hit, depends on the prefetches' timing).
      EXPECT_GT(chunked.device.evictions + chunked.device.drops, 5u);
      // The budget forced traffic at every step: weights and KV were evicted and
      // fetched again (misses), experts too for MoE models.
      EXPECT_GT(tiered.device.evictions + tiered.device.drops, static_cast<uint64_t>(tokens));
      EXPECT_LT(tiered.counters.weight_hits, tiered.counters.weight_acquires);
      // (KV blocks are read where they lie: whether some were on the O_DIRECT disk, read
      // through rather than hit, depends on the eviction's timing; not checked here.)
      if (file->Has(std::string(file->architecture()) + ".expert_count")) {
        EXPECT_GT(tiered.counters.expert_acquires, 0u);
        EXPECT_LT(tiered.counters.expert_hits, tiered.counters.expert_acquires);
      }
      EXPECT_GT(tiered.counters.prefetched_pages, 0u);
    }
  }
}

// Experts smaller than half a frame share pages (Model::PlanWeightPages): with 1 MiB
// frames builtin:tiny-moe's 209 KiB experts go four to a page, the expert offsets inside
// a page are the views' bases, and the logits stay those of the resident run.
TEST(TieringTest, ExpertsSharingPagesGiveBitIdenticalLogits) {
  auto tiny = BuildBuiltinModel("tiny-moe");
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  std::shared_ptr<const GgufFile> file = std::move(tiny).value();
  {
    auto model = Model::Load(file, ModelOptions{});
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    const ModelConfig& c = (*model)->config();
    // One expert a frame, 1 MiB frames would take 4x the expert frames of 256 KiB ones
    // (tiny-moe's 209 KiB experts take a frame each at 256 KiB); shared, the same, plus a
    // frame of rounding for each layer page and the output matrix.
    EXPECT_LE((*model)->WeightPageBytes(kMiB),
              (*model)->WeightPageBytes(256 * kKiB) + static_cast<uint64_t>(c.n_layer + 1) * kMiB);
    EXPECT_LE((*model)->LargestWeightPage(kMiB), kMiB);
  }
  const int tokens = 24;
  for (const uint64_t frame : {uint64_t{512} * kKiB, uint64_t{1} * kMiB}) {
    SCOPED_TRACE("frame " + std::to_string(frame));
    const PagedRun resident = DecodePaged(file, KvCodec::kF16, /*paged=*/false, tokens, {}, frame);
    const PagedRun tiered = DecodePaged(file, KvCodec::kF16, /*paged=*/true, tokens, {}, frame);
    ASSERT_FALSE(resident.logits.empty());
    ASSERT_EQ(resident.logits.size(), tiered.logits.size());
    EXPECT_EQ(std::memcmp(resident.logits.data(), tiered.logits.data(), resident.logits.size() * sizeof(float)), 0)
        << "shared expert pages changed the logits";
    EXPECT_GT(tiered.counters.expert_acquires, 0u);
    EXPECT_GT(tiered.device.evictions + tiered.device.drops, static_cast<uint64_t>(tokens));
  }
}

}  // namespace
}  // namespace tierkv
