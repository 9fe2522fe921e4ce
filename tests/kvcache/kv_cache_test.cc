// tests/kvcache/kv_cache_test.cc
#include "kvcache/kv_cache.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "memory/half.h"
#include "tests/kvcache/kv_test_util.h"

namespace tierkv {

// Reaches into the block tables so that a test can show CheckInvariants catching damage.
class KvCacheTestPeer {
 public:
  static int& Refs(KvCache& c, BlockId b) { return c.blocks_[b.value].refs; }
  static std::vector<BlockId>& Table(KvCache& c, SeqId s, int layer) {
    return c.seqs_[s.value].table[static_cast<size_t>(layer)];
  }
};

namespace {

using testing::AppendTokens;
using testing::BlockBytes;
using testing::SmallGeometry;
using testing::TempDir;
using testing::TokenKv;

std::unique_ptr<MemoryManager> Memory(const std::string& dir, uint32_t device = 4, uint32_t host = 8, uint32_t disk = 64) {
  testing::SmallTiers s;
  s.device_frames = device;
  s.host_frames = host;
  s.disk_frames = disk;
  return testing::MakeManager(s, dir);
}

double RelError(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * static_cast<double>(got[i] - want[i]);
    den += want[i] * static_cast<double>(want[i]);
  }
  return std::sqrt(num / den);
}

// Relative L2 error over all vectors each codec must stay within on N(0,1) data with
// head_dim 32 (docs/codecs.md has the measured values); single vectors may reach twice
// that (a 32-value vector has few values to average over).
double Bound(KvCodec c) {
  switch (c) {
    case KvCodec::kF16: return 1e-3;
    case KvCodec::kQ8_0: return 0.01;
    case KvCodec::kQ4_0: return 0.12;
    case KvCodec::kTq4: return 0.11;
    case KvCodec::kTq3: return 0.20;
  }
  return 0;
}

TEST(KvCacheTest, AppendReadRoundTripEveryCodec) {
  for (KvCodec codec : kAllKvCodecs) {
    TempDir dir;
    auto mm = Memory(dir.path());
    auto cache = KvCache::Create(mm.get(), SmallGeometry(codec)).value();
    const SeqId s = cache->NewSequence();
    AppendTokens(*cache, s, 0, 21, 5);
    EXPECT_EQ(cache->Length(s), 21);
    EXPECT_EQ(cache->NumBlocks(s), 3);
    EXPECT_EQ(cache->BlockFill(s, 2), 5);
    std::vector<float> k(64), v(64), all_got, all_want;
    for (int pos = 0; pos < 21; ++pos) {
      for (int l = 0; l < 2; ++l) {
        ASSERT_TRUE(cache->Read(s, l, pos, k.data(), v.data()).ok());
        const auto wk = TokenKv(cache->geometry(), 5, pos, l, false), wv = TokenKv(cache->geometry(), 5, pos, l, true);
        EXPECT_LT(RelError(k, wk), 2 * Bound(codec)) << KvCodecName(codec) << " pos " << pos;
        EXPECT_LT(RelError(v, wv), 2 * Bound(codec)) << KvCodecName(codec) << " pos " << pos;
        all_got.insert(all_got.end(), k.begin(), k.end());
        all_got.insert(all_got.end(), v.begin(), v.end());
        all_want.insert(all_want.end(), wk.begin(), wk.end());
        all_want.insert(all_want.end(), wv.begin(), wv.end());
      }
    }
    EXPECT_LT(RelError(all_got, all_want), Bound(codec)) << KvCodecName(codec);
    std::string why;
    EXPECT_TRUE(cache->CheckInvariants(&why)) << why;
  }
}

// f16 with 16-token blocks stores keys in key tiles: dimension d of the key in slot t of
// a KV head's run at byte 2 * (d * 16 + t % 16) of its tile, values vector by vector;
// Read gives back exactly the halves written, also after a fork and a copy-on-write
// into a partly filled tiled block. Blocks of 8 tokens, and q8_0, keep vectors.
TEST(KvCacheTest, F16KeyTilesLayoutAndRoundTrip) {
  TempDir dir;
  auto mm = Memory(dir.path());  // 4 KiB frames: 16 f16 tokens of SmallGeometry
  KvGeometry g = SmallGeometry();
  g.block_tokens = 16;
  auto cache = KvCache::Create(mm.get(), g).value();
  ASSERT_TRUE(cache->key_tiles());
  const SeqId s = cache->NewSequence();
  AppendTokens(*cache, s, 0, 21, 9);
  const size_t vb = cache->vector_bytes(), run = 16 * vb;
  const std::vector<std::vector<std::byte>> bytes = BlockBytes(*cache, s);
  ASSERT_EQ(bytes.size(), 4u);  // 2 layers x 2 blocks
  for (int pos = 0; pos < 21; ++pos) {
    for (int l = 0; l < g.n_layers; ++l) {
      const auto wk = TokenKv(g, 9, pos, l, false), wv = TokenKv(g, 9, pos, l, true);
      const std::vector<std::byte>& blk = bytes[static_cast<size_t>(l * 2 + pos / 16)];
      for (int h = 0; h < g.n_kv_heads; ++h) {
        for (int d = 0; d < g.head_dim; ++d) {
          uint16_t key, value;
          std::memcpy(&key, blk.data() + h * run + 2 * (d * 16 + pos % 16), 2);
          std::memcpy(&value, blk.data() + g.n_kv_heads * run + h * run + (pos % 16) * vb + 2 * d, 2);
          ASSERT_EQ(key, FloatToHalf(wk[h * g.head_dim + d])) << pos << " " << h << " " << d;
          ASSERT_EQ(value, FloatToHalf(wv[h * g.head_dim + d])) << pos << " " << h << " " << d;
        }
      }
      std::vector<float> k(wk.size()), v(wv.size());
      ASSERT_TRUE(cache->Read(s, l, pos, k.data(), v.data()).ok());
      for (size_t i = 0; i < k.size(); ++i) {
        ASSERT_EQ(FloatToHalf(k[i]), FloatToHalf(wk[i])) << pos;
        ASSERT_EQ(FloatToHalf(v[i]), FloatToHalf(wv[i])) << pos;
      }
    }
  }
  // A fork shares the partly filled tiled block; writing token 21 into the fork copies it.
  const SeqId f = cache->Fork(s).value();
  AppendTokens(*cache, f, 21, 23, 10);
  for (int pos = 0; pos < 23; ++pos) {
    std::vector<float> k(64), v(64);
    ASSERT_TRUE(cache->Read(f, 1, pos, k.data(), v.data()).ok());
    const auto wk = TokenKv(g, pos < 21 ? 9 : 10, pos, 1, false);
    for (size_t i = 0; i < k.size(); ++i) ASSERT_EQ(FloatToHalf(k[i]), FloatToHalf(wk[i])) << pos;
  }
  EXPECT_EQ(BlockBytes(*cache, s), bytes) << "the fork's writes reached the original";
  std::string why;
  EXPECT_TRUE(cache->CheckInvariants(&why)) << why;

  g.block_tokens = 8;
  EXPECT_FALSE(KvCache::Create(mm.get(), g).value()->key_tiles());
  g.block_tokens = 16;
  g.codec = KvCodec::kQ8_0;
  EXPECT_TRUE(KvCache::Create(mm.get(), g).value()->key_tiles());
  g.codec = KvCodec::kTq4;
  EXPECT_FALSE(KvCache::Create(mm.get(), g).value()->key_tiles());
}

TEST(KvCacheTest, DerivedBlockTokensFillAFrame) {
  TempDir dir;
  auto mm = Memory(dir.path());  // 4 KiB frames
  KvGeometry g = SmallGeometry();
  g.block_tokens = 0;
  auto cache = KvCache::Create(mm.get(), g).value();
  // f16, 2 heads x 32 dims x 2 bytes x (K+V) = 256 bytes per token -> 16 tokens per 4 KiB.
  EXPECT_EQ(cache->geometry().block_tokens, 16);
  EXPECT_EQ(cache->block_bytes(), 4096u);
  // BlockTokensFor says the same before any memory exists, for every codec and frame.
  EXPECT_EQ(KvCache::BlockTokensFor(g, mm->frame_bytes()).value(), 16);
  for (KvCodec c : {KvCodec::kF16, KvCodec::kTq4, KvCodec::kTq3}) {
    g.codec = c;
    const int bt = KvCache::BlockTokensFor(g, mm->frame_bytes()).value();
    EXPECT_EQ(KvCache::Create(mm.get(), g).value()->geometry().block_tokens, bt) << KvCodecName(c);
    EXPECT_EQ(KvCache::BlockTokensFor(g, 1 << 20).value(), bt * 256) << KvCodecName(c);
  }
  // q8_0 / q4_0 (34 / 18 bytes per 32 values): whole key tiles, as many as fit, not a
  // power of two that would leave up to half of each frame unused.
  for (KvCodec c : {KvCodec::kQ8_0, KvCodec::kQ4_0}) {
    g.codec = c;
    const uint64_t per_token = 2 * 2 * (c == KvCodec::kQ8_0 ? 34 : 18);  // K+V, 2 heads, head_dim 32
    for (uint64_t frame : {uint64_t{4096}, uint64_t{1} << 20}) {
      const int bt = KvCache::BlockTokensFor(g, frame).value();
      EXPECT_EQ(bt % 16, 0) << KvCodecName(c);
      EXPECT_LE(per_token * static_cast<uint64_t>(bt), frame) << KvCodecName(c);
      EXPECT_GT(per_token * static_cast<uint64_t>(bt + 16), frame) << KvCodecName(c);
    }
    EXPECT_EQ(KvCache::Create(mm.get(), g).value()->geometry().block_tokens,
              KvCache::BlockTokensFor(g, mm->frame_bytes()).value());
  }
  g.block_tokens = 48;  // explicit: kept
  EXPECT_EQ(KvCache::BlockTokensFor(g, 1 << 20).value(), 48);
  g.head_dim = 0;
  EXPECT_FALSE(KvCache::BlockTokensFor(g, 1 << 20).ok());
}

TEST(KvCacheTest, ForkSharesBlocksAndCopiesOnWrite) {
  TempDir dir;
  auto mm = Memory(dir.path(), 4, 16, 64);
  auto cache = KvCache::Create(mm.get(), SmallGeometry()).value();
  const SeqId a = cache->NewSequence();
  AppendTokens(*cache, a, 0, 12, 1);  // blocks: 8 full + 4
  const auto before = BlockBytes(*cache, a);
  auto b = cache->Fork(a);
  ASSERT_TRUE(b.ok());
  for (int blk = 0; blk < 2; ++blk) EXPECT_EQ(cache->BlockRefs(cache->Block(a, 0, blk)), 2);
  // b continues differently: its partial block is copied, a is untouched.
  AppendTokens(*cache, *b, 12, 14, 2);
  EXPECT_EQ(cache->BlockRefs(cache->Block(a, 0, 0)), 2);  // the full block stays shared
  EXPECT_EQ(cache->BlockRefs(cache->Block(a, 0, 1)), 1);  // the tail was copied
  EXPECT_NE(cache->Block(a, 0, 1), cache->Block(*b, 0, 1));
  EXPECT_EQ(BlockBytes(*cache, a), before);
  std::vector<float> k(64), v(64);
  ASSERT_TRUE(cache->Read(*b, 1, 5, k.data(), v.data()).ok());  // shared prefix still readable through b
  EXPECT_LT(RelError(k, TokenKv(cache->geometry(), 1, 5, 1, false)), 1e-3);
  ASSERT_TRUE(cache->Read(*b, 1, 13, k.data(), v.data()).ok());
  EXPECT_LT(RelError(k, TokenKv(cache->geometry(), 2, 13, 1, false)), 1e-3);
  std::string why;
  EXPECT_TRUE(cache->CheckInvariants(&why)) << why;
  ASSERT_TRUE(cache->FreeSequence(a).ok());
  EXPECT_EQ(cache->BlockRefs(cache->Block(*b, 0, 0)), 1);
  EXPECT_TRUE(cache->CheckInvariants(&why)) << why;
  ASSERT_TRUE(cache->FreeSequence(*b).ok());
  EXPECT_EQ(mm->live_pages(), 0u);
}

TEST(KvCacheTest, TruncateDropsBlocksAndRewritesTheTail) {
  TempDir dir;
  auto mm = Memory(dir.path(), 4, 16, 64);
  auto cache = KvCache::Create(mm.get(), SmallGeometry()).value();
  const SeqId a = cache->NewSequence();
  AppendTokens(*cache, a, 0, 20, 1);
  const size_t pages = mm->live_pages();
  ASSERT_TRUE(cache->Truncate(a, 9).ok());
  EXPECT_EQ(cache->NumBlocks(a), 2);
  EXPECT_EQ(mm->live_pages(), pages - 2);  // one block per layer gone
  AppendTokens(*cache, a, 9, 11, 3);       // overwrite positions 9, 10
  std::vector<float> k(64), v(64);
  ASSERT_TRUE(cache->Read(a, 0, 10, k.data(), v.data()).ok());
  EXPECT_LT(RelError(k, TokenKv(cache->geometry(), 3, 10, 0, false)), 1e-3);
  ASSERT_TRUE(cache->Read(a, 0, 8, k.data(), v.data()).ok());
  EXPECT_LT(RelError(k, TokenKv(cache->geometry(), 1, 8, 0, false)), 1e-3);
  EXPECT_EQ(cache->Truncate(a, 50).code(), StatusCode::kInvalidArgument);
  std::string why;
  EXPECT_TRUE(cache->CheckInvariants(&why)) << why;
}

TEST(KvCacheTest, KeySummariesBoundTheKeys) {
  TempDir dir;
  auto mm = Memory(dir.path(), 4, 16, 64);
  auto cache = KvCache::Create(mm.get(), SmallGeometry()).value();
  const SeqId a = cache->NewSequence();
  AppendTokens(*cache, a, 0, 10, 4);
  const KvGeometry& g = cache->geometry();
  for (int l = 0; l < g.n_layers; ++l) {
    for (int b = 0; b < 2; ++b) {
      const BlockId id = cache->Block(a, l, b);
      std::vector<float> lo(64, INFINITY), hi(64, -INFINITY);
      for (int pos = b * 8; pos < std::min(10, b * 8 + 8); ++pos) {
        const auto k = TokenKv(g, 4, pos, l, false);
        for (int i = 0; i < 64; ++i) { lo[i] = std::min(lo[i], k[i]); hi[i] = std::max(hi[i], k[i]); }
      }
      for (int i = 0; i < 64; ++i) {
        EXPECT_EQ(cache->KeyMin(id)[i], lo[i]);
        EXPECT_EQ(cache->KeyMax(id)[i], hi[i]);
      }
    }
  }
}

// A block without bounds (as a restored one) gets them from its contents: the bounds of
// the keys as the codec decodes them, for every codec and key layout.
TEST(KvCacheTest, SummarizeBlockBoundsTheDecodedKeys) {
  for (KvCodec codec : kAllKvCodecs) {
    SCOPED_TRACE(KvCodecName(codec));
    TempDir dir;
    auto mm = Memory(dir.path(), 4, 16, 64);
    auto cache = KvCache::Create(mm.get(), SmallGeometry(codec)).value();
    const SeqId a = cache->NewSequence();
    AppendTokens(*cache, a, 0, 13, 4);
    const KvGeometry& g = cache->geometry();
    for (int b = 0; b < 2; ++b) {
      const BlockId id = cache->Block(a, 1, b);
      cache->NoteKeys(id, nullptr);  // unbounded, as restored
      ASSERT_EQ(cache->KeyMin(id), nullptr);
      const int fill = cache->BlockFill(a, b);
      std::vector<float> lo(64, INFINITY), hi(64, -INFINITY), k(64), v(64);
      for (int pos = b * g.block_tokens; pos < b * g.block_tokens + fill; ++pos) {
        ASSERT_TRUE(cache->Read(a, 1, pos, k.data(), v.data()).ok());
        for (int i = 0; i < 64; ++i) { lo[i] = std::min(lo[i], k[i]); hi[i] = std::max(hi[i], k[i]); }
      }
      auto pin = mm->Acquire(cache->BlockPage(a, 1, b), Tier::kHost);
      ASSERT_TRUE(pin.ok()) << pin.status().ToString();
      cache->SummarizeBlock(id, pin->data(), fill);
      ASSERT_NE(cache->KeyMin(id), nullptr);
      for (int i = 0; i < 64; ++i) {
        EXPECT_EQ(cache->KeyMin(id)[i], lo[i]) << i;
        EXPECT_EQ(cache->KeyMax(id)[i], hi[i]) << i;
      }
    }
  }
}

TEST(KvCacheTest, BlocksKeepIdenticalBytesAcrossForcedMigrations) {
  for (KvCodec codec : kAllKvCodecs) {
    TempDir dir;
    auto mm = Memory(dir.path(), 2, 3, 64);  // far fewer frames than blocks: constant eviction
    auto cache = KvCache::Create(mm.get(), SmallGeometry(codec)).value();
    const SeqId a = cache->NewSequence();
    AppendTokens(*cache, a, 0, 40, 9);  // 5 blocks x 2 layers
    const auto reference = BlockBytes(*cache, a);
    std::vector<PageId> pages;
    for (int l = 0; l < 2; ++l) for (int b = 0; b < cache->NumBlocks(a); ++b) pages.push_back(cache->BlockPage(a, l, b));
    for (int round = 0; round < 4; ++round) {
      ASSERT_TRUE(mm->Demote(pages, Tier::kDisk).Wait().ok());
      for (PageId p : pages) {
        ASSERT_TRUE(mm->Acquire(p, Tier::kDevice).ok());
        ASSERT_TRUE(mm->Acquire(p, Tier::kHost).ok());
      }
      EXPECT_EQ(BlockBytes(*cache, a), reference) << KvCodecName(codec) << " round " << round;
    }
    EXPECT_GT(mm->Stats(Tier::kDisk).bytes_out, 0u);
    std::string why;
    EXPECT_TRUE(cache->CheckInvariants(&why)) << why;
  }
}

TEST(KvCacheTest, AppendFailsCleanlyWhenMemoryIsExhausted) {
  TempDir dir;
  auto mm = Memory(dir.path(), 0, 2, 0);  // host only, 2 frames, no disk: 1 token's blocks fit
  auto cache = KvCache::Create(mm.get(), SmallGeometry()).value();
  const SeqId a = cache->NewSequence();
  AppendTokens(*cache, a, 0, 8, 1);
  auto p = cache->AppendToken(a);  // needs 2 more frames
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kExhausted);
  EXPECT_EQ(cache->Length(a), 8);
  std::string why;
  EXPECT_TRUE(cache->CheckInvariants(&why)) << why;
}

// A reference count that disagrees with the tables, and a layer table of the wrong
// length, are each named by CheckInvariants (which the other tests rely on), and the
// cache passes again once the damage is undone.
TEST(KvCacheTest, CheckInvariantsNamesDamagedTables) {
  TempDir dir;
  auto mm = Memory(dir.path());
  auto cache = KvCache::Create(mm.get(), SmallGeometry()).value();
  const SeqId s = cache->NewSequence();
  AppendTokens(*cache, s, 0, 21, 3);  // 3 blocks a layer
  const SeqId f = cache->Fork(s).value();
  std::string why;
  ASSERT_TRUE(cache->CheckInvariants(&why)) << why;

  std::vector<BlockId>& table = KvCacheTestPeer::Table(*cache, f, 1);
  const BlockId b = table[0];
  ASSERT_EQ(KvCacheTestPeer::Refs(*cache, b), 2) << "shared by s and its fork";
  --KvCacheTestPeer::Refs(*cache, b);
  EXPECT_FALSE(cache->CheckInvariants(&why));
  EXPECT_EQ(why, "block " + std::to_string(b.value) + " has refs 1 but 2 table entries");
  ++KvCacheTestPeer::Refs(*cache, b);
  ASSERT_TRUE(cache->CheckInvariants(&why)) << why;

  const BlockId last = table.back();
  table.pop_back();
  --KvCacheTestPeer::Refs(*cache, last);  // the counts agree; the length does not
  EXPECT_FALSE(cache->CheckInvariants(&why));
  EXPECT_EQ(why, "sequence " + std::to_string(f.value) + " has 2 blocks in a layer, wants 3");
  table.push_back(last);
  ++KvCacheTestPeer::Refs(*cache, last);
  EXPECT_TRUE(cache->CheckInvariants(&why)) << why;
}

}  // namespace
}  // namespace tierkv
