// tests/kvcache/remote_tier_test.cc
//
// The remote tier against a redis-server of the test's own: blocks one cache publishes
// are fetched by another, bit for bit; what is damaged, foreign, evicted or cut off is
// never used, and a server that is down, hung or full costs time, never a failure.
#include "kvcache/remote_tier.h"

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/kvcache/kv_test_util.h"
#include "tests/kvcache/redis_test_util.h"

namespace tierkv {
namespace {

using testing::AppendTokens;
using testing::SmallGeometry;
using testing::TempDir;
using testing::TestRedis;

using testing::kModel;
using testing::kOtherModel;
using testing::Tokens;
constexpr int kBlock = 8;  // SmallGeometry's block_tokens

struct World {  // one process's memory, cache and remote tier
  TempDir dir;
  std::unique_ptr<MemoryManager> mm;
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<RemoteTier> remote;
  World(const std::string& url, const ModelFingerprint& model = kModel, KvCodec codec = KvCodec::kF16,
        const std::string& salt = "", std::function<void()> before_fetch = nullptr) {
    testing::SmallTiers s;
    s.device_frames = 0;
    s.host_frames = 128;
    s.disk_frames = 0;
    mm = testing::MakeManager(s, dir.path());
    cache = KvCache::Create(mm.get(), SmallGeometry(codec)).value();
    RemoteOptions o;
    o.url = url;
    o.salt = salt;
    o.timeout_ms = 200;
    o.before_fetch = std::move(before_fetch);
    remote = RemoteTier::Create(o, model, cache->geometry(), cache->block_bytes()).value();
  }
  // A sequence of n tokens of the deterministic stream `seed`.
  SeqId Computed(int n, uint64_t seed = 7) {
    const SeqId s = cache->NewSequence();
    AppendTokens(*cache, s, 0, n, seed);
    return s;
  }
  // Computed for all of `prompt` and its full blocks published (sent before it returns).
  SeqId Published(const std::vector<int32_t>& prompt) {
    const SeqId s = Computed(static_cast<int>(prompt.size()));
    EXPECT_EQ(remote->Publish(*cache, s, prompt, 0), static_cast<int>(prompt.size()) / kBlock);
    EXPECT_TRUE(remote->Flush(10));
    return s;
  }
};

// Tokens [0, n) of a and b hold the same K and V bits.
void ExpectSameKv(KvCache& a, SeqId sa, KvCache& b, SeqId sb, int n) {
  const KvGeometry& g = a.geometry();
  std::vector<float> ka(static_cast<size_t>(g.n_kv_heads) * g.head_dim), va(ka.size()), kb(ka.size()), vb(ka.size());
  for (int pos = 0; pos < n; ++pos) {
    for (int l = 0; l < g.n_layers; ++l) {
      ASSERT_TRUE(a.Read(sa, l, pos, ka.data(), va.data()).ok());
      ASSERT_TRUE(b.Read(sb, l, pos, kb.data(), vb.data()).ok());
      ASSERT_EQ(0, std::memcmp(ka.data(), kb.data(), ka.size() * sizeof(float))) << "K at " << pos << " layer " << l;
      ASSERT_EQ(0, std::memcmp(va.data(), vb.data(), va.size() * sizeof(float))) << "V at " << pos << " layer " << l;
    }
  }
}

TEST(RemoteTierTest, BadUrlsAreNamed) {
  for (const char* url : {"http://x", "redis://", "redis://h:0", "redis://h:99999", "unix://relative.sock", "redis://h/x"}) {
    RemoteOptions o;
    o.url = url;
    const Status s = RemoteTier::CheckOptions(o);
    EXPECT_FALSE(s.ok()) << url;
    EXPECT_NE(s.message().find(url), std::string::npos) << s.message();
  }
  RemoteOptions o;
  for (const char* url : {"redis://h", "redis://:pw@127.0.0.1:6380/2", "redis://u:pw@[::1]:7000", "unix:///run/r.sock?db=3"}) {
    o.url = url;
    EXPECT_TRUE(RemoteTier::CheckOptions(o).ok()) << url;
  }
  o.url = "redis://:secret@h:1";
  auto r = RemoteTier::Create(o, kModel, SmallGeometry(), 2048);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->display_url().find("secret"), std::string::npos) << (*r)->display_url();
}

TEST(RemoteTierTest, PublishedBlocksAreFetchedBitForBit) {
  TIERKV_NEED_REDIS();
  TestRedis redis;
  World a(redis.url()), b(redis.url());
  const std::vector<int32_t> prompt = Tokens(43);  // 5 full blocks and 3 tokens
  const SeqId sa = a.Computed(43);
  EXPECT_EQ(a.remote->Publish(*a.cache, sa, prompt, 0), 5);
  ASSERT_TRUE(a.remote->Flush(10));
  EXPECT_EQ(a.remote->stats().published_blocks, 5u);
  EXPECT_EQ(redis.Keys("tkv:*:c").size(), 5u) << "full blocks only";

  const SeqId sb = b.cache->NewSequence();
  EXPECT_EQ(b.remote->Extend(*b.cache, sb, prompt, 42, 0), 40);
  ExpectSameKv(*a.cache, sa, *b.cache, sb, 40);
  RemoteStats st = b.remote->stats();
  EXPECT_EQ(st.hit_blocks, 5u);
  EXPECT_EQ(st.hit_tokens, 40u);
  EXPECT_EQ(st.fetched_bytes, 5u * 2 * (BlockRecordHeader::kBytes + b.cache->block_bytes()));
  EXPECT_TRUE(st.connected);
  std::string why;
  EXPECT_TRUE(b.cache->CheckInvariants(&why)) << why;
  // The fetched blocks decode on: B appends the rest itself.
  AppendTokens(*b.cache, sb, 40, 43, 7);
  ExpectSameKv(*a.cache, sa, *b.cache, sb, 43);
  // Published again by B: the remote holds them already.
  EXPECT_EQ(b.remote->Publish(*b.cache, sb, prompt, 0), 5);
  EXPECT_EQ(b.remote->stats().present_blocks, 5u);

  // A limit inside a full block (the prompt's last token, computed for its logits): the
  // block comes whole and is cut there; the token computed again lands in it.
  World e(redis.url());
  const SeqId se = e.cache->NewSequence();
  const std::vector<int32_t> forty(prompt.begin(), prompt.begin() + 40);
  EXPECT_EQ(e.remote->Extend(*e.cache, se, forty, 39, 0), 39);
  AppendTokens(*e.cache, se, 39, 40, 7);
  ExpectSameKv(*a.cache, sa, *e.cache, se, 40);
  EXPECT_TRUE(e.cache->CheckInvariants(&why)) << why;

  // A limit short of the blocks, and a sequence that holds a partial block already.
  World c(redis.url());
  const SeqId sc = c.Computed(12);  // block 0 and half of block 1
  EXPECT_EQ(c.remote->Extend(*c.cache, sc, prompt, 20, 0), 20);
  ExpectSameKv(*a.cache, sa, *c.cache, sc, 20);
}

// The cost model: once a fetch has measured the rate, blocks that would take longer to
// fetch than to compute are not fetched (counted); with no estimate of either, they are.
TEST(RemoteTierTest, AFetchSlowerThanComputingIsSkipped) {
  TIERKV_NEED_REDIS();
  TestRedis redis;
  World a(redis.url()), b(redis.url());
  const std::vector<int32_t> prompt = Tokens(40);
  const SeqId sa = a.Published(prompt);
  const SeqId first = b.cache->NewSequence();
  EXPECT_EQ(b.remote->Extend(*b.cache, first, prompt, 40, /*recompute_s_per_token=*/1e-15), 40)
      << "no fetch measured yet: fetched";
  const SeqId slow = b.cache->NewSequence();
  EXPECT_EQ(b.remote->Extend(*b.cache, slow, prompt, 40, 1e-15), 0) << "computing 40 tokens takes 40 fs";
  EXPECT_EQ(b.remote->stats().skipped_slower, 1u);
  const SeqId fast = b.cache->NewSequence();
  EXPECT_EQ(b.remote->Extend(*b.cache, fast, prompt, 40, 1.0), 40) << "a second a token: fetched";
  ExpectSameKv(*a.cache, sa, *b.cache, fast, 40);
}

TEST(RemoteTierTest, OtherSaltModelCodecOrTokensFindNothingOfIt) {
  TIERKV_NEED_REDIS();
  TestRedis redis;
  World a(redis.url());
  const std::vector<int32_t> prompt = Tokens(40);
  const SeqId sa = a.Published(prompt);
  World salted(redis.url(), kModel, KvCodec::kF16, "tenant-b"), other(redis.url(), kOtherModel),
      q8(redis.url(), kModel, KvCodec::kQ8_0);
  for (World* w : {&salted, &other, &q8}) {
    const SeqId s = w->cache->NewSequence();
    EXPECT_EQ(w->remote->Extend(*w->cache, s, prompt, 40, 0), 0);
    EXPECT_EQ(w->remote->stats().miss_blocks, 5u);
  }
  // A prompt that differs in block 2: blocks 0 and 1 only.
  std::vector<int32_t> edited = prompt;
  edited[20] += 1;
  World b(redis.url());
  const SeqId sb = b.cache->NewSequence();
  EXPECT_EQ(b.remote->Extend(*b.cache, sb, edited, 40, 0), 16);
  ExpectSameKv(*a.cache, sa, *b.cache, sb, 16);
}

// Damaged, truncated and foreign values, and a marker of other tokens: refused, counted,
// removed (so a later writer replaces them); the blocks before them are used.
TEST(RemoteTierTest, DamagedTruncatedOrForeignValuesAreNeverUsed) {
  TIERKV_NEED_REDIS();
  TestRedis redis;
  World a(redis.url());
  const std::vector<int32_t> prompt = Tokens(40);
  const SeqId sa = a.Computed(40);
  const std::vector<uint64_t> keys = SessionFile::ContentKeys(kModel, a.cache->geometry(), prompt);
  // Another model's record of the same tokens.
  World other(redis.url(), kOtherModel);
  const SeqId so = other.Computed(40, /*seed=*/9);
  ASSERT_EQ(other.remote->Publish(*other.cache, so, prompt, 0), 5);
  ASSERT_TRUE(other.remote->Flush(10));
  const std::vector<uint64_t> other_keys = SessionFile::ContentKeys(kOtherModel, a.cache->geometry(), prompt);

  struct Damage {
    const char* what;
    std::function<void()> apply;
    const char* gone;  // the key the fetch removes
  };
  const std::string k2 = a.remote->Key(keys[2], 1);
  const std::string value2 = [&] {
    EXPECT_EQ(a.remote->Publish(*a.cache, sa, prompt, 0), 5);
    EXPECT_TRUE(a.remote->Flush(10));
    return redis.Command({"GET", k2});
  }();
  ASSERT_EQ(value2.size(), BlockRecordHeader::kBytes + a.cache->block_bytes());
  const std::vector<Damage> damages = {
      {"a flipped byte", [&] { redis.Command({"SETRANGE", k2, "1000", std::string(1, static_cast<char>(value2[1000] ^ 1))}); }, "value"},
      {"a truncated value", [&] { redis.Command({"SET", k2, value2.substr(0, 1500)}); }, "value"},
      {"another block's record", [&] { redis.Command({"SET", k2, redis.Command({"GET", a.remote->Key(keys[1], 1)})}); }, "value"},
      {"another model's record", [&] { redis.Command({"SET", k2, redis.Command({"GET", other.remote->Key(other_keys[2], 1)})}); }, "value"},
      {"a marker of other tokens", [&] { redis.Command({"SET", a.remote->Key(keys[2], -1), redis.Command({"GET", a.remote->Key(keys[1], -1)})}); }, "marker"},
  };
  uint64_t failures = 0;
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.what);
    // Whole again (the previous case's removal republished), then damaged.
    ASSERT_EQ(a.remote->Publish(*a.cache, sa, prompt, 0), 5);
    ASSERT_TRUE(a.remote->Flush(10));
    ASSERT_EQ(redis.Command({"GET", k2}), value2);
    d.apply();
    World b(redis.url());
    const SeqId sb = b.cache->NewSequence();
    EXPECT_EQ(b.remote->Extend(*b.cache, sb, prompt, 40, 0), 16);
    ExpectSameKv(*a.cache, sa, *b.cache, sb, 16);
    EXPECT_EQ(b.remote->stats().verify_failures, 1u);
    EXPECT_EQ(redis.Command({"EXISTS", a.remote->Key(keys[2], -1)}), "0") << "the marker is removed";
    if (std::string(d.gone) == "value") {
      EXPECT_EQ(redis.Command({"EXISTS", k2}), "0") << "the value is removed";
    }
    ++failures;
  }
  EXPECT_EQ(failures, damages.size());
  // A layer evicted under its marker: the block is not used, and published again later.
  ASSERT_EQ(a.remote->Publish(*a.cache, sa, prompt, 0), 5);
  ASSERT_TRUE(a.remote->Flush(10));
  redis.Command({"DEL", a.remote->Key(keys[3], 0)});
  World b(redis.url());
  const SeqId sb = b.cache->NewSequence();
  EXPECT_EQ(b.remote->Extend(*b.cache, sb, prompt, 40, 0), 24);
  EXPECT_EQ(b.remote->stats().verify_failures, 0u) << "gone is not damaged";
  EXPECT_EQ(redis.Command({"EXISTS", a.remote->Key(keys[3], -1)}), "0");
}

TEST(RemoteTierTest, ADownHungOrRestartedServerCostsATimeoutNeverAFailure) {
  TIERKV_NEED_REDIS();
  TestRedis redis;
  World a(redis.url());
  const std::vector<int32_t> prompt = Tokens(40);
  const SeqId sa = a.Published(prompt);

  // Killed: nothing comes, nothing fails, and the next calls do not wait for it.
  redis.Kill();
  World b(redis.url());
  SeqId sb = b.cache->NewSequence();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(b.remote->Extend(*b.cache, sb, prompt, 40, 0), 0);
  EXPECT_EQ(a.remote->Publish(*a.cache, sa, prompt, 0), 0) << "nothing queued while it is down";
  EXPECT_EQ(b.remote->Extend(*b.cache, sb, prompt, 40, 0), 0);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  EXPECT_FALSE(b.remote->stats().connected);
  EXPECT_GE(b.remote->stats().errors, 1u);
  EXPECT_EQ(b.cache->Length(sb), 0);

  // Restarted (empty: it kept nothing): found again after the back-off, then published to.
  redis.Start();
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  EXPECT_EQ(b.remote->Extend(*b.cache, sb, prompt, 40, 0), 0);
  EXPECT_TRUE(b.remote->stats().connected);
  EXPECT_EQ(a.remote->Publish(*a.cache, sa, prompt, 0), 5);
  ASSERT_TRUE(a.remote->Flush(10));
  EXPECT_EQ(b.remote->Extend(*b.cache, sb, prompt, 40, 0), 40);

  // Stopped (SIGSTOP) between the lookup and the fetch: the fetch times out, the
  // sequence keeps what it had, and the server is used again once it answers.
  World c(redis.url(), kModel, KvCodec::kF16, "", [&] { redis.Pause(); });
  SeqId sc = c.cache->NewSequence();
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_EQ(c.remote->Extend(*c.cache, sc, prompt, 40, 0), 0);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count(), 2.0);
  EXPECT_FALSE(c.remote->stats().connected);
  redis.Resume();
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  World d(redis.url());
  SeqId sd = d.cache->NewSequence();
  EXPECT_EQ(d.remote->Extend(*d.cache, sd, prompt, 40, 0), 40);
  ExpectSameKv(*a.cache, sa, *d.cache, sd, 40);
}

// A server at its memory limit refuses writes (noeviction) or evicts (allkeys-lru):
// publishing drops blocks, a fetch uses the committed run it finds, all of it right.
TEST(RemoteTierTest, AFullServerDropsBlocksAndWhatIsFetchedIsRight) {
  TIERKV_NEED_REDIS();
  for (const char* policy : {"noeviction", "allkeys-lru"}) {
    SCOPED_TRACE(policy);
    TestRedis redis;
    const std::string used = redis.Command({"INFO", "memory"});
    const size_t at = used.find("used_memory:");
    ASSERT_NE(at, std::string::npos);
    const uint64_t base = std::stoull(used.substr(at + 12));
    // Room for about a dozen of the 40 blocks' values.
    ASSERT_EQ(redis.Command({"CONFIG", "SET", "maxmemory", std::to_string(base + 12 * 2 * 2200)}), "OK");
    ASSERT_EQ(redis.Command({"CONFIG", "SET", "maxmemory-policy", policy}), "OK");
    World a(redis.url());
    const std::vector<int32_t> prompt = Tokens(320);
    const SeqId sa = a.Computed(320);
    EXPECT_EQ(a.remote->Publish(*a.cache, sa, prompt, 0), 40);
    ASSERT_TRUE(a.remote->Flush(10));
    const RemoteStats pub = a.remote->stats();
    EXPECT_EQ(pub.published_blocks + pub.dropped_blocks + pub.present_blocks, 40u);
    if (std::string(policy) == "noeviction") {
      EXPECT_GT(pub.dropped_blocks, 0u) << "writes were refused";
    }
    World b(redis.url());
    const SeqId sb = b.cache->NewSequence();
    const int got = b.remote->Extend(*b.cache, sb, prompt, 320, 0);
    EXPECT_EQ(got % kBlock, 0);
    EXPECT_LT(got, 320) << "not everything fits";
    ExpectSameKv(*a.cache, sa, *b.cache, sb, got);
    EXPECT_EQ(b.remote->stats().verify_failures, 0u);
  }
}

}  // namespace
}  // namespace tierkv
