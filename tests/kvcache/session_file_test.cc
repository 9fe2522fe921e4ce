// tests/kvcache/session_file_test.cc
#include "kvcache/session_file.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "kvcache/checksum.h"
#include "tests/kvcache/kv_test_util.h"

namespace tierkv {
namespace {

using testing::AppendTokens;
using testing::BlockBytes;
using testing::SmallGeometry;
using testing::TempDir;

using testing::kModel;
using testing::kOtherModel;
using testing::Tokens;

std::string Hex16(uint64_t v) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(v));
  return hex;
}

struct World {  // a memory manager and a cache, as one process would have
  TempDir dir;
  std::unique_ptr<MemoryManager> mm;
  std::unique_ptr<KvCache> cache;
  explicit World(KvCodec codec = KvCodec::kF16, int block_tokens = 8, uint64_t frame_bytes = 4096) {
    testing::SmallTiers s;
    s.device_frames = 2;
    s.host_frames = 4;  // fewer than the blocks: saves and restores page through tiers
    s.disk_frames = 64;
    s.frame_bytes = frame_bytes;
    mm = testing::MakeManager(s, dir.path());
    KvGeometry g = SmallGeometry(codec);
    g.block_tokens = block_tokens;
    cache = KvCache::Create(mm.get(), g).value();
  }
};

// Forgets which file holds each of s's blocks (the bookkeeping a save leaves), so that
// the next save writes them all again.
void ForgetSaves(KvCache& cache, SeqId s) {
  for (int b = 0; b < cache.NumBlocks(s); ++b) {
    for (int l = 0; l < cache.geometry().n_layers; ++l) cache.SaveState(cache.Block(s, l, b)) = BlockSaveState{};
  }
}

std::vector<std::byte> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return std::vector<std::byte>(reinterpret_cast<std::byte*>(c.data()), reinterpret_cast<std::byte*>(c.data()) + c.size());
}
void WriteFile(const std::string& path, const std::vector<std::byte>& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

void ExpectOneLine(const Status& st) { EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message(); }

TEST(SessionFileTest, SaveRestoreRoundTripIsBitIdenticalForEveryCodec) {
  for (KvCodec codec : kAllKvCodecs) {
    TempDir files;
    const std::string path = files.path() + "/s.tkv";
    World a(codec);
    const SeqId s = a.cache->NewSequence();
    AppendTokens(*a.cache, s, 0, 29, 11);
    const auto bytes = BlockBytes(*a.cache, s);
    SessionSaveStats st;
    ASSERT_TRUE(SessionFile::Save(*a.cache, s, Tokens(29), kModel, path, &st).ok());
    EXPECT_EQ(st.blocks_written, 8u);  // 4 blocks x 2 layers
    World b(codec);
    auto r = SessionFile::Restore(*b.cache, path, kModel);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->tokens, Tokens(29));
    EXPECT_EQ(b.cache->Length(r->seq), 29);
    EXPECT_EQ(b.mm->Stats(Tier::kHost).bytes_in, 0u) << "restore must be lazy";
    EXPECT_EQ(BlockBytes(*b.cache, r->seq), bytes) << KvCodecName(codec);
    std::string why;
    EXPECT_TRUE(b.cache->CheckInvariants(&why)) << why;
  }
}

TEST(SessionFileTest, RestoreInANewProcess) {
  TempDir files;
  const std::string path = files.path() + "/s.tkv";
  World a;
  const SeqId s = a.cache->NewSequence();
  AppendTokens(*a.cache, s, 0, 20, 3);
  const auto bytes = BlockBytes(*a.cache, s);
  ASSERT_TRUE(SessionFile::Save(*a.cache, s, Tokens(20), kModel, path).ok());
  const std::string expect_path = files.path() + "/expected.bin";
  std::vector<std::byte> flat;
  for (const auto& b : bytes) flat.insert(flat.end(), b.begin(), b.end());
  WriteFile(expect_path, flat);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // the new process: nothing of the parent's memory manager is used
    World b;
    auto r = SessionFile::Restore(*b.cache, path, kModel);
    if (!r.ok() || r->tokens != Tokens(20)) _exit(2);
    std::vector<std::byte> got;
    for (const auto& blk : BlockBytes(*b.cache, r->seq)) got.insert(got.end(), blk.begin(), blk.end());
    _exit(got == ReadFile(expect_path) ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// The stale-KV defect of format 2: a run that reuses part of a session and then saves
// a block with as many tokens as the file's block of that index (a regenerated reply,
// an edit in the middle of a prompt, another continuation) must write that block
// again, and the next restore must give the KV of the new tokens. Every codec, two
// block sizes, cuts inside and at the edges of blocks; once with the save bookkeeping
// as a run leaves it, once with it forced stale (so the content key alone decides).
TEST(SessionFileTest, BranchesNeverRestoreTheKvOfOtherTokens) {
  for (KvCodec codec : kAllKvCodecs) {
    for (const int bt : {8, 16}) {
      for (const int cut : {0, 5, 8, 12, 17}) {
        for (const bool force_stale : {false, true}) {
          SCOPED_TRACE(std::string(KvCodecName(codec)) + " block " + std::to_string(bt) + " cut " +
                       std::to_string(cut) + (force_stale ? " stale" : ""));
          TempDir files;
          const std::string path = files.path() + "/s.tkv";
          {
            World a(codec, bt);
            const SeqId s = a.cache->NewSequence();
            AppendTokens(*a.cache, s, 0, 24, 1);
            ASSERT_TRUE(SessionFile::Save(*a.cache, s, Tokens(24), kModel, path).ok());
          }
          // The branch: the first `cut` tokens reused, then other tokens up to 24 again.
          std::vector<int32_t> branch = Tokens(24);
          for (int i = cut; i < 24; ++i) branch[static_cast<size_t>(i)] = Tokens(24, 5)[static_cast<size_t>(i)];
          std::vector<std::vector<std::byte>> expect;
          {
            World b(codec, bt);
            auto r = SessionFile::Restore(*b.cache, path, kModel);
            ASSERT_TRUE(r.ok()) << r.status().ToString();
            std::vector<BlockSaveState> before;
            for (int l = 0; l < 2; ++l) {
              for (int blk = 0; blk < b.cache->NumBlocks(r->seq); ++blk) {
                before.push_back(b.cache->SaveState(b.cache->Block(r->seq, l, blk)));
              }
            }
            ASSERT_TRUE(b.cache->Truncate(r->seq, cut).ok());
            AppendTokens(*b.cache, r->seq, cut, 24, 2);
            if (force_stale) {  // as format 2 left it: every block claims its old record
              size_t i = 0;
              for (int l = 0; l < 2; ++l) {
                for (int blk = 0; blk < b.cache->NumBlocks(r->seq); ++blk) {
                  b.cache->SaveState(b.cache->Block(r->seq, l, blk)) = before[i++];
                }
              }
            }
            expect = BlockBytes(*b.cache, r->seq);
            SessionSaveStats st;
            ASSERT_TRUE(SessionFile::Save(*b.cache, r->seq, branch, kModel, path, &st).ok());
            const uint64_t kept_blocks = static_cast<uint64_t>(cut / bt);  // whole blocks before the cut
            EXPECT_EQ(st.blocks_reused, 2 * kept_blocks);
          }
          ASSERT_TRUE(SessionFile::Verify(path).ok());
          World c(codec, bt);
          auto r = SessionFile::Restore(*c.cache, path, kModel);
          ASSERT_TRUE(r.ok()) << r.status().ToString();
          EXPECT_EQ(r->tokens, branch);
          EXPECT_TRUE(BlockBytes(*c.cache, r->seq) == expect) << "the restore holds the branch's KV";
        }
      }
    }
  }
}

// The content key names every token up to a block's end, the model and the encoding.
TEST(SessionFileTest, ContentKeysChainTokensModelAndCodec) {
  const KvGeometry g = SmallGeometry();
  const auto keys = SessionFile::ContentKeys(kModel, g, Tokens(20));
  ASSERT_EQ(keys.size(), 3u);
  EXPECT_EQ(SessionFile::ContentKeys(kModel, g, Tokens(17)).front(), keys[0]);
  EXPECT_EQ(SessionFile::ContentKeys(kModel, g, Tokens(17))[1], keys[1]);
  EXPECT_NE(SessionFile::ContentKeys(kModel, g, Tokens(17))[2], keys[2]) << "fewer tokens in the block";
  std::vector<int32_t> edited = Tokens(20);
  edited[3] += 1;  // block 0 changes, and with it every key after it
  const auto k2 = SessionFile::ContentKeys(kModel, g, edited);
  for (size_t b = 0; b < 3; ++b) EXPECT_NE(k2[b], keys[b]) << b;
  EXPECT_NE(SessionFile::ContentKeys(kOtherModel, g, Tokens(20))[1], keys[1]);
  KvGeometry q = g;
  q.codec = KvCodec::kQ8_0;
  EXPECT_NE(SessionFile::ContentKeys(kModel, q, Tokens(20))[1], keys[1]);
}

// A manifest whose tokens are not the ones its records were saved with (a record of
// other tokens, checksums all intact) is refused at page-in and by verify.
TEST(SessionFileTest, ARecordOfOtherTokensIsRefused) {
  TempDir files;
  const std::string path = files.path() + "/s.tkv";
  World a;
  const SeqId s = a.cache->NewSequence();
  AppendTokens(*a.cache, s, 0, 20, 1);
  ASSERT_TRUE(SessionFile::Save(*a.cache, s, Tokens(20), kModel, path).ok());
  // Rewrite token 9 (block 1) in the manifest and re-seal it: manifest checksum in the
  // commit slot, then the slot's own checksum.
  auto data = ReadFile(path);
  size_t slot = 0;
  uint64_t best = 0;
  for (size_t at : {size_t{2048}, size_t{3072}}) {
    uint64_t seq;
    std::memcpy(&seq, data.data() + at + 8, 8);
    if (std::memcmp(data.data() + at, "TKVSLOT1", 8) == 0 && seq >= best) best = seq, slot = at;
  }
  ASSERT_NE(slot, 0u);
  uint64_t m_off, m_bytes;
  std::memcpy(&m_off, data.data() + slot + 16, 8);
  std::memcpy(&m_bytes, data.data() + slot + 24, 8);
  int32_t tok;
  std::memcpy(&tok, data.data() + m_off + 32 + 9 * 4, 4);
  tok += 1;
  std::memcpy(data.data() + m_off + 32 + 9 * 4, &tok, 4);
  const uint64_t mh = Checksum(data.data() + m_off, m_bytes);
  std::memcpy(data.data() + slot + 32, &mh, 8);
  const uint64_t sh = Checksum(data.data() + slot, 56);
  std::memcpy(data.data() + slot + 56, &sh, 8);
  WriteFile(path, data);

  const Status v = SessionFile::Verify(path);
  EXPECT_EQ(v.code(), StatusCode::kCorruption) << v.ToString();
  EXPECT_NE(v.message().find("(layer 0, block 1)"), std::string::npos) << v.message();
  EXPECT_NE(v.message().find("other tokens"), std::string::npos) << v.message();
  World b;
  auto r = SessionFile::Restore(*b.cache, path, kModel);
  ASSERT_TRUE(r.ok()) << r.status().ToString();  // lazy: refused when the block is needed
  EXPECT_TRUE(b.mm->Acquire(b.cache->BlockPage(r->seq, 0, 0), Tier::kHost).ok()) << "block 0 is its tokens' KV";
  auto pin = b.mm->Acquire(b.cache->BlockPage(r->seq, 0, 1), Tier::kHost);
  ASSERT_FALSE(pin.ok());
  EXPECT_EQ(pin.status().code(), StatusCode::kCorruption);
}

// A saved file's bytes as an older format would have written its header: the version
// field set and the header's checksum made again.
void SetHeaderVersion(std::vector<std::byte>& data, uint32_t version) {
  std::memcpy(data.data() + 8, &version, 4);
  const uint64_t hh = Checksum(data.data(), 2040);
  std::memcpy(data.data() + 2040, &hh, 8);
}

// Format 2 files (whose saves could keep other tokens' KV) are refused, not trusted.
TEST(SessionFileTest, Version2FilesAreRefused) {
  TempDir files;
  const std::string path = files.path() + "/s.tkv";
  World a;
  const SeqId s = a.cache->NewSequence();
  AppendTokens(*a.cache, s, 0, 10, 1);
  ASSERT_TRUE(SessionFile::Save(*a.cache, s, Tokens(10), kModel, path).ok());
  auto data = ReadFile(path);
  SetHeaderVersion(data, 2);
  WriteFile(path, data);
  const Status v = SessionFile::Verify(path);
  EXPECT_EQ(v.code(), StatusCode::kUnsupported) << v.ToString();
  EXPECT_NE(v.message().find("version 2"), std::string::npos) << v.message();
  ExpectOneLine(v);
  World b;
  EXPECT_FALSE(SessionFile::Restore(*b.cache, path, kModel).ok());
  EXPECT_FALSE(SessionFile::Save(*a.cache, s, Tokens(10), kModel, path).ok()) << "never overwritten";
  EXPECT_EQ(ReadFile(path), data);
}

// Format 3 files: read for f16 and tq (the same blocks as format 4), refused for q8_0 and
// q4_0, whose keys format 3 stored vector by vector and format 4 stores in key tiles.
TEST(SessionFileTest, Version3FilesAreReadUnlessTheirKeysMoved) {
  for (KvCodec codec : {KvCodec::kF16, KvCodec::kTq4, KvCodec::kQ8_0, KvCodec::kQ4_0}) {
    SCOPED_TRACE(KvCodecName(codec));
    TempDir files;
    const std::string path = files.path() + "/s.tkv";
    World a(codec, 16, 8192);
    const SeqId s = a.cache->NewSequence();
    AppendTokens(*a.cache, s, 0, 20, 1);
    ASSERT_TRUE(SessionFile::Save(*a.cache, s, Tokens(20), kModel, path).ok());
    auto data = ReadFile(path);
    SetHeaderVersion(data, 3);
    WriteFile(path, data);
    const Status v = SessionFile::Verify(path);
    World b(codec, 16, 8192);
    auto r = SessionFile::Restore(*b.cache, path, kModel);
    if (codec == KvCodec::kQ8_0 || codec == KvCodec::kQ4_0) {
      EXPECT_EQ(v.code(), StatusCode::kUnsupported) << v.ToString();
      EXPECT_NE(v.message().find("version 3"), std::string::npos) << v.message();
      EXPECT_NE(v.message().find(KvCodecName(codec)), std::string::npos) << v.message();
      ExpectOneLine(v);
      EXPECT_FALSE(r.ok());
      EXPECT_EQ(ReadFile(path), data) << "a refused file is left as it was";
    } else {
      EXPECT_TRUE(v.ok()) << v.ToString();
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      std::vector<float> k(64), v2(64), wk(64), wv(64);
      for (int pos : {0, 17}) {
        ASSERT_TRUE(b.cache->Read(r->seq, 1, pos, k.data(), v2.data()).ok());
        ASSERT_TRUE(a.cache->Read(s, 1, pos, wk.data(), wv.data()).ok());
        EXPECT_EQ(k, wk) << pos;
        EXPECT_EQ(v2, wv) << pos;
      }
    }
  }
}

// A save never follows or overwrites what sits at the name of its new file: the names
// are unguessable and created exclusively; a link planted at an old-style name is inert.
TEST(SessionFileTest, SavesNeverFollowPlantedLinks) {
  namespace fs = std::filesystem;
  TempDir files;
  const std::string path = files.path() + "/s.tkv";
  const std::string victim = files.path() + "/victim";
  WriteFile(victim, std::vector<std::byte>(100, std::byte{7}));
  const auto victim_bytes = ReadFile(victim);
  // Links at every name a format-2 tierkv would have used, and at a guess of ours.
  fs::create_symlink(victim, path + ".tmp." + std::to_string(getpid()));
  fs::create_symlink(victim, path + ".tierkv-tmp.0000000000000000");
  World a;
  const SeqId s = a.cache->NewSequence();
  AppendTokens(*a.cache, s, 0, 20, 1);
  ASSERT_TRUE(SessionFile::Save(*a.cache, s, Tokens(20), kModel, path).ok());
  EXPECT_FALSE(fs::is_symlink(path));
  EXPECT_EQ(ReadFile(victim), victim_bytes);
  // Two temporary names are never the same.
  EXPECT_NE(SessionFile::TempPathFor(path), SessionFile::TempPathFor(path));
  EXPECT_EQ(SessionFile::TempPathFor(path).rfind(path + ".tierkv-tmp.", 0), 0u);
  const std::string long_name = files.path() + "/" + std::string(250, 'x');
  const std::string t = SessionFile::TempPathFor(long_name);
  EXPECT_LE(fs::path(t).filename().string().size(), 255u);
  EXPECT_EQ(fs::path(t).parent_path(), fs::path(long_name).parent_path());
}

// Leftovers of crashed saves are recognised by name and removed; nothing else is: not
// other sessions' files, not links (their targets untouched), not a live process's file.
TEST(SessionFileTest, LeftoversOfCrashedSavesAreRemovedSafely) {
  namespace fs = std::filesystem;
  TempDir files;
  const std::string path = files.path() + "/s.tkv";
  const std::string victim = files.path() + "/victim";
  WriteFile(victim, std::vector<std::byte>(10, std::byte{1}));
  const std::vector<std::byte> junk(64, std::byte{3});
  WriteFile(path + ".tierkv-tmp.0123456789abcdef", junk);                      // ours: removed
  WriteFile(SessionSiblingPath(path, std::string(300, 'z'), "tierkv-tmp.fedcba9876543210"), junk);  // short form
  WriteFile(path + ".tmp.999999999", junk);                                    // format 2, no such pid: removed
  WriteFile(path + ".tmp." + std::to_string(getpid()), junk);                  // a live pid: kept
  WriteFile(files.path() + "/other.tkv.tierkv-tmp.0123456789abcdef", junk);    // another session's: kept
  WriteFile(path + ".tierkv-tmp.notahexnumber!!", junk);                       // not our pattern: kept
  fs::create_symlink(victim, path + ".tierkv-tmp.aaaaaaaaaaaaaaaa");           // a link: kept
  EXPECT_EQ(SessionFile::RemoveLeftovers(path), 3);
  EXPECT_FALSE(fs::exists(path + ".tierkv-tmp.0123456789abcdef"));
  EXPECT_FALSE(fs::exists(path + ".tmp.999999999"));
  EXPECT_TRUE(fs::exists(path + ".tmp." + std::to_string(getpid())));
  EXPECT_TRUE(fs::exists(files.path() + "/other.tkv.tierkv-tmp.0123456789abcdef"));
  EXPECT_TRUE(fs::exists(path + ".tierkv-tmp.notahexnumber!!"));
  EXPECT_TRUE(fs::is_symlink(path + ".tierkv-tmp.aaaaaaaaaaaaaaaa"));
  EXPECT_EQ(ReadFile(victim), std::vector<std::byte>(10, std::byte{1}));
}

// Readers take no lock and never see a torn save: while one thread saves a growing
// session again and again (appends, rewritten tail blocks, compactions renamed over the
// file), inspect and verify in another thread always find a whole save.
TEST(SessionFileTest, ReadersDuringSavesSeeWholeSaves) {
  TempDir files;
  const std::string path = files.path() + "/s.tkv";
  World a;
  const SeqId s = a.cache->NewSequence();
  AppendTokens(*a.cache, s, 0, 4, 1);
  ASSERT_TRUE(SessionFile::Save(*a.cache, s, Tokens(4), kModel, path).ok());
  std::atomic<bool> done{false};
  std::atomic<int> reads{0}, bad{0};
  std::string first_bad;
  std::thread reader([&] {
    while (!done) {
      auto summary = SessionFile::Inspect(path);
      const Status v = SessionFile::Verify(path);
      if (!summary.ok() || !v.ok()) {
        if (bad++ == 0) first_bad = summary.ok() ? v.ToString() : summary.status().ToString();
      } else if (summary->tokens != Tokens(static_cast<int>(summary->n_tokens))) {
        if (bad++ == 0) first_bad = "tokens of no save";
      }
      ++reads;
    }
  });
  int compactions = 0;
  for (int n = 5; n <= 60; ++n) {
    AppendTokens(*a.cache, s, n - 1, n, 1);
    SessionSaveStats st;
    ASSERT_TRUE(SessionFile::Save(*a.cache, s, Tokens(n), kModel, path, &st).ok()) << n;
    compactions += st.compacted;
  }
  done = true;
  reader.join();
  EXPECT_GE(compactions, 2);
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ(bad.load(), 0) << first_bad;
}

TEST(SessionFileTest, SecondSaveAppendsOnlyNewBlocksAndAManifest) {
  TempDir files;
  const std::string path = files.path() + "/s.tkv";
  World a;
  const SeqId s = a.cache->NewSequence();
  AppendTokens(*a.cache, s, 0, 20, 1);  // blocks 8, 8, 4
  SessionSaveStats first, second, third;
  ASSERT_TRUE(SessionFile::Save(*a.cache, s, Tokens(20), kModel, path, &first).ok());
  const auto before = ReadFile(path);
  AppendTokens(*a.cache, s, 20, 30, 1);  // blocks 8, 8, 8, 6: block 2 changed, block 3 new
  ASSERT_TRUE(SessionFile::Save(*a.cache, s, Tokens(30), kModel, path, &second).ok());
  EXPECT_EQ(second.blocks_reused, 4u);
  EXPECT_EQ(second.blocks_written, 4u);
  const uint64_t record = 40 + a.cache->block_bytes();
  const uint64_t manifest = 32 + 30 * 4 + 8 * 32;
  EXPECT_EQ(second.bytes_written, 4 * record + manifest + 64);  // blocks + manifest + commit slot
  const auto after = ReadFile(path);
  // Everything the first save wrote, except its commit slot, is untouched.
  for (size_t i = 0; i < before.size() - (32 + 20 * 4 + 6 * 32); ++i) {
    if (i >= 2048 && i < 4096) continue;  // commit slots
    ASSERT_EQ(before[i], after[i]) << "byte " << i << " of the first save was rewritten";
  }
  // Nothing changed: a third save writes only a manifest and a slot.
  ASSERT_TRUE(SessionFile::Save(*a.cache, s, Tokens(30), kModel, path, &third).ok());
  EXPECT_EQ(third.blocks_written, 0u);
  EXPECT_TRUE(SessionFile::Verify(path).ok());
  // And a restored session saved again reuses the file's blocks.
  World b;
  auto r = SessionFile::Restore(*b.cache, path, kModel);
  ASSERT_TRUE(r.ok());
  AppendTokens(*b.cache, r->seq, 30, 33, 1);
  SessionSaveStats fourth;
  ASSERT_TRUE(SessionFile::Save(*b.cache, r->seq, Tokens(33), kModel, path, &fourth).ok());
  EXPECT_EQ(fourth.blocks_written, 4u);  // per layer: the grown tail block and the new one
  EXPECT_EQ(fourth.blocks_reused, 6u);
  EXPECT_TRUE(SessionFile::Verify(path).ok());
}

// Injects a fault at the k-th operation; that write is torn (half its bytes written).
// kCrash: every operation from the k-th on fails, as if the process were gone (nothing
// is put back: Truncate fails too). kFailOnce: only the k-th fails, with ENOSPC, as a
// full disk or an I/O error does while the process carries on.
class FaultyIo : public SessionIo {
 public:
  enum class Mode { kCrash, kFailOnce };
  FaultyIo(int at, Mode mode) : at_(at), mode_(mode) {}
  Status PWrite(int fd, const void* data, size_t bytes, uint64_t offset) override {
    if (!Hit()) {
      Status st = SessionIo::PWrite(fd, data, bytes, offset);
      if (st.ok() && (offset == 2048 || offset == 3072)) commit_written_ = true;
      return st;
    }
    if (torn_) (void)SessionIo::PWrite(fd, data, bytes / 2, offset);
    return Fault();
  }
  Status PWritev(int fd, const struct iovec* iov, int n, uint64_t offset) override {
    if (!Hit()) return SessionIo::PWritev(fd, iov, n, offset);
    if (torn_) {  // the first half of the gathered bytes
      std::vector<char> flat;
      for (int i = 0; i < n; ++i) {
        const char* p = static_cast<const char*>(iov[i].iov_base);
        flat.insert(flat.end(), p, p + iov[i].iov_len);
      }
      (void)SessionIo::PWrite(fd, flat.data(), flat.size() / 2, offset);
    }
    return Fault();
  }
  Status Sync(int fd) override { return Hit() ? Fault() : SessionIo::Sync(fd); }
  Status Rename(const std::string& a, const std::string& b) override {
    return Hit() ? Fault() : SessionIo::Rename(a, b);
  }
  Status Truncate(int fd, uint64_t bytes) override {
    if (mode_ == Mode::kCrash && faulted_) return Status::IoError("crash injected");
    return SessionIo::Truncate(fd, bytes);
  }
  bool faulted() const { return faulted_; }
  // The commit slot reached the file (the fault came at the final fsync or later).
  bool commit_written() const { return commit_written_; }

 private:
  // Whether this operation fails; torn_ says whether it is the k-th (the torn one).
  bool Hit() {
    const int op = ops_++;
    torn_ = op == at_;
    return torn_ || (mode_ == Mode::kCrash && op > at_);
  }
  Status Fault() {
    faulted_ = true;
    return mode_ == Mode::kCrash ? Status::IoError("crash injected") : Status::FromErrno(ENOSPC, "injected");
  }
  int at_;
  Mode mode_;
  int ops_ = 0;
  bool torn_ = false;
  bool faulted_ = false;
  bool commit_written_ = false;
};

TEST(SessionFileTest, CrashAtEveryWriteStepLeavesThePreviousSaveLoadable) {
  TempDir files;
  const std::string base = files.path() + "/base.tkv";
  World a;
  const SeqId s = a.cache->NewSequence();
  AppendTokens(*a.cache, s, 0, 20, 1);
  ASSERT_TRUE(SessionFile::Save(*a.cache, s, Tokens(20), kModel, base).ok());
  const auto saved = ReadFile(base);
  const SeqId t = a.cache->Fork(s).value();
  AppendTokens(*a.cache, t, 20, 45, 2);
  int completed_at = -1;
  for (int k = 0; k < 64 && completed_at < 0; ++k) {
    const std::string path = files.path() + "/crash" + std::to_string(k) + ".tkv";
    WriteFile(path, saved);
    ForgetSaves(*a.cache, t);  // earlier saves' bookkeeping
    FaultyIo io(k, FaultyIo::Mode::kCrash);
    Status st = SessionFile::Save(*a.cache, t, Tokens(45), kModel, path, nullptr, &io);
    if (!io.faulted()) {
      ASSERT_TRUE(st.ok()) << st.ToString();
      completed_at = k;
    } else {
      EXPECT_FALSE(st.ok());
    }
    ASSERT_TRUE(SessionFile::Verify(path).ok()) << "crash at step " << k << ": " << SessionFile::Verify(path).ToString();
    World b;
    auto r = SessionFile::Restore(*b.cache, path, kModel);
    ASSERT_TRUE(r.ok()) << "crash at step " << k << ": " << r.status().ToString();
    // A crash may only lose the new save, never the old one; once the commit slot is
    // written the new save is the one loaded (a real crash before that fsync may still
    // lose it: then the old one loads, also fine).
    if (io.commit_written()) EXPECT_EQ(r->tokens, Tokens(45)) << "step " << k;
    else EXPECT_EQ(r->tokens, Tokens(20)) << "step " << k;
  }
  EXPECT_GT(completed_at, 2) << "the save has several write steps";
  // A first save that crashes leaves no file at all (it is written aside, then renamed).
  for (int k = 0; k < 6; ++k) {
    const std::string path = files.path() + "/fresh" + std::to_string(k) + ".tkv";
    FaultyIo io(k, FaultyIo::Mode::kCrash);
    Status st = SessionFile::Save(*a.cache, s, Tokens(20), kModel, path, nullptr, &io);
    if (io.faulted()) {
      EXPECT_FALSE(std::filesystem::exists(path)) << "step " << k;
    } else {
      EXPECT_TRUE(SessionFile::Verify(path).ok());
    }
  }
}

// A save that fails with the process alive (ENOSPC at any write or sync, the commit's
// included) reports the error and leaves the file byte for byte as it was.
TEST(SessionFileTest, FailedAppendLeavesTheFileAsItWas) {
  TempDir files;
  const std::string path = files.path() + "/s.tkv";
  World a;
  const SeqId s = a.cache->NewSequence();
  AppendTokens(*a.cache, s, 0, 20, 1);
  ASSERT_TRUE(SessionFile::Save(*a.cache, s, Tokens(20), kModel, path).ok());
  const auto saved = ReadFile(path);
  AppendTokens(*a.cache, s, 20, 45, 2);
  int failures = 0;
  for (int k = 0; k < 64; ++k) {
    WriteFile(path, saved);
    ForgetSaves(*a.cache, s);  // what the successful save below wrote
    FaultyIo io(k, FaultyIo::Mode::kFailOnce);
    Status st = SessionFile::Save(*a.cache, s, Tokens(45), kModel, path, nullptr, &io);
    if (!io.faulted()) {
      ASSERT_TRUE(st.ok()) << st.ToString();
      break;
    }
    ++failures;
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("No space left on device"), std::string::npos) << st.message();
    EXPECT_EQ(ReadFile(path), saved) << "failure at step " << k;
  }
  EXPECT_GT(failures, 3) << "the save has several write steps";
}

// A conversation saved after every turn rewrites its tail block each time. The file is
// compacted (written afresh, renamed over) when its garbage would outgrow its live
// records, so it stays under about twice their size; a restored session whose blocks
// are not paged in compacts from the file it replaces.
TEST(SessionFileTest, RepeatedSavesCompactTheFile) {
  TempDir files;
  const std::string path = files.path() + "/s.tkv";
  {
    World a;
    const SeqId s = a.cache->NewSequence();
    AppendTokens(*a.cache, s, 0, 3, 5);
    ASSERT_TRUE(SessionFile::Save(*a.cache, s, Tokens(3), kModel, path).ok());
  }
  World b;
  auto r = SessionFile::Restore(*b.cache, path, kModel);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const uint64_t record = 40 + b.cache->block_bytes();
  int compactions = 0, saves = 0;
  for (int n = 4; n <= 40; ++n, ++saves) {
    AppendTokens(*b.cache, r->seq, n - 1, n, 5);
    SessionSaveStats st;
    ASSERT_TRUE(SessionFile::Save(*b.cache, r->seq, Tokens(n), kModel, path, &st).ok()) << n;
    compactions += st.compacted ? 1 : 0;
    const uint64_t records = 2 * static_cast<uint64_t>(b.cache->NumBlocks(r->seq));
    const uint64_t manifest = 32 + 4 * static_cast<uint64_t>(n) + 32 * records;
    EXPECT_LE(st.file_bytes, 4096 + 2 * records * record + manifest) << "after the save of " << n << " tokens";
    EXPECT_EQ(st.file_bytes, std::filesystem::file_size(path));
    if (st.compacted) {
      EXPECT_EQ(st.blocks_reused, 0u);
    }
  }
  EXPECT_GE(compactions, 2);
  EXPECT_LT(compactions, saves / 2) << "a compaction is paid for by the appends before it";
  EXPECT_TRUE(SessionFile::Verify(path).ok());
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(files.path())) ++entries;
  EXPECT_EQ(entries, 1) << "no temporary file is left behind";
  World c;
  auto back = SessionFile::Restore(*c.cache, path, kModel);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->tokens, Tokens(40));
  EXPECT_EQ(BlockBytes(*c.cache, back->seq), BlockBytes(*b.cache, r->seq));
}

// A compacting save that crashes at any step leaves the file it would replace as it
// was, and no temporary file.
TEST(SessionFileTest, CrashDuringCompactionLeavesTheOldFile) {
  TempDir files;
  const std::string base = files.path() + "/base.tkv";
  World a;
  const SeqId s = a.cache->NewSequence();
  AppendTokens(*a.cache, s, 0, 20, 1);
  auto forget = [&] { ForgetSaves(*a.cache, s); };
  // A file with some garbage: the tail block written twice.
  ASSERT_TRUE(SessionFile::Save(*a.cache, s, Tokens(20), kModel, base).ok());
  for (int l = 0; l < 2; ++l) a.cache->SaveState(a.cache->Block(s, l, 2)) = BlockSaveState{};
  SessionSaveStats second;
  ASSERT_TRUE(SessionFile::Save(*a.cache, s, Tokens(20), kModel, base, &second).ok());
  ASSERT_FALSE(second.compacted);
  const auto before = ReadFile(base);
  // Saves that forget every record then leave all of the old file as garbage: they compact.
  bool completed = false;
  for (int k = 0; k < 64 && !completed; ++k) {
    TempDir dir;
    const std::string path = dir.path() + "/s.tkv";
    WriteFile(path, before);
    forget();
    FaultyIo io(k, FaultyIo::Mode::kCrash);
    SessionSaveStats st;
    const Status saved = SessionFile::Save(*a.cache, s, Tokens(20), kModel, path, &st, &io);
    if (io.faulted()) {
      EXPECT_FALSE(saved.ok());
      EXPECT_EQ(ReadFile(path), before) << "crash at step " << k;
      int entries = 0;
      for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++entries;
      EXPECT_EQ(entries, 1) << "crash at step " << k;
    } else {
      ASSERT_TRUE(saved.ok()) << saved.ToString();
      EXPECT_TRUE(st.compacted);
      EXPECT_LT(std::filesystem::file_size(path), before.size());
      EXPECT_TRUE(SessionFile::Verify(path).ok());
      completed = true;
    }
  }
  EXPECT_TRUE(completed);
}

// A compaction replaces the file's contents, not what the user set up around it: the
// mode stays, a save through a symbolic link rewrites the link's target (the link stays
// a link), and a file with other hard links is appended to instead, so that every name
// sees the new session.
TEST(SessionFileTest, CompactionKeepsModeLinksAndHardLinks) {
  TempDir files;
  World a;
  const SeqId s = a.cache->NewSequence();
  AppendTokens(*a.cache, s, 0, 20, 1);
  const std::string base = files.path() + "/base.tkv";
  ASSERT_TRUE(SessionFile::Save(*a.cache, s, Tokens(20), kModel, base).ok());
  const auto before = ReadFile(base);
  auto compact = [&](const std::string& path) {  // every record forgotten: all garbage
    ForgetSaves(*a.cache, s);
    SessionSaveStats st;
    const Status saved = SessionFile::Save(*a.cache, s, Tokens(20), kModel, path, &st);
    EXPECT_TRUE(saved.ok()) << saved.ToString();
    EXPECT_TRUE(SessionFile::Verify(path).ok()) << path;
    return st;
  };
  namespace fs = std::filesystem;
  {
    const std::string path = files.path() + "/mode.tkv";
    WriteFile(path, before);
    ASSERT_EQ(chmod(path.c_str(), 0600), 0);
    ASSERT_TRUE(compact(path).compacted);
    struct stat st {};
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0600u);
  }
  {
    const std::string real = files.path() + "/real.tkv", link = files.path() + "/link.tkv";
    WriteFile(real, before);
    fs::create_symlink("real.tkv", link);  // relative, as ln -s makes it
    ASSERT_TRUE(compact(link).compacted);
    EXPECT_TRUE(fs::is_symlink(link));
    EXPECT_NE(ReadFile(real), before) << "the target was rewritten (a new file id)";
    for (const auto& e : fs::directory_iterator(files.path())) {
      EXPECT_EQ(e.path().filename().string().find(".tierkv-tmp."), std::string::npos) << e.path();
    }
  }
  {
    const std::string one = files.path() + "/one.tkv", two = files.path() + "/two.tkv";
    WriteFile(one, before);
    fs::create_hard_link(one, two);
    EXPECT_FALSE(compact(one).compacted);
    EXPECT_GT(fs::file_size(one), before.size()) << "appended";
    EXPECT_EQ(ReadFile(one), ReadFile(two));
    EXPECT_EQ(fs::hard_link_count(one), 2u);
  }
}

TEST(SessionFileTest, FlippedByteInAnyBlockIsNamedAndRefusedAtPageIn) {
  TempDir files;
  const std::string path = files.path() + "/s.tkv";
  World a;
  const SeqId s = a.cache->NewSequence();
  AppendTokens(*a.cache, s, 0, 20, 1);
  ASSERT_TRUE(SessionFile::Save(*a.cache, s, Tokens(20), kModel, path).ok());
  const auto good = ReadFile(path);
  const uint64_t record = 40 + a.cache->block_bytes();
  std::mt19937_64 rng(77);
  for (int blk = 0; blk < 6; ++blk) {
    auto bad = good;
    const uint64_t off = 4096 + blk * record + 40 + rng() % a.cache->block_bytes();
    bad[off] ^= std::byte{0x10};
    WriteFile(path, bad);
    Status v = SessionFile::Verify(path);
    ASSERT_FALSE(v.ok());
    EXPECT_EQ(v.code(), StatusCode::kCorruption);
    EXPECT_NE(v.message().find("session block " + std::to_string(blk) + " "), std::string::npos) << v.message();
    ExpectOneLine(v);
    World b;
    auto r = SessionFile::Restore(*b.cache, path, kModel);
    ASSERT_TRUE(r.ok()) << "restore is lazy: it does not read blocks";
    const int layer = blk / 3, index = blk % 3;
    auto pin = b.mm->Acquire(b.cache->BlockPage(r->seq, layer, index), Tier::kHost);
    ASSERT_FALSE(pin.ok());
    EXPECT_EQ(pin.status().code(), StatusCode::kCorruption);
    EXPECT_NE(pin.status().message().find("fails its checksum"), std::string::npos);
    // The other blocks still page in.
    auto other = b.mm->Acquire(b.cache->BlockPage(r->seq, 1 - layer, index), Tier::kHost);
    EXPECT_TRUE(other.ok());
  }
}

TEST(SessionFileTest, RefusalsAreOneClearError) {
  TempDir files;
  const std::string path = files.path() + "/s.tkv";
  World a;
  const SeqId s = a.cache->NewSequence();
  AppendTokens(*a.cache, s, 0, 20, 1);
  ASSERT_TRUE(SessionFile::Save(*a.cache, s, Tokens(20), kModel, path).ok());
  const auto good = ReadFile(path);
  auto restore_error = [&](const std::vector<std::byte>& data, KvCodec codec = KvCodec::kF16,
                           const ModelFingerprint& model = kModel) {
    WriteFile(path, data);
    World b(codec);
    auto r = SessionFile::Restore(*b.cache, path, model);
    EXPECT_FALSE(r.ok());
    ExpectOneLine(r.status());
    return r.status();
  };
  // Truncated: in the header, in the blocks, in the manifest.
  for (size_t cut : {size_t{100}, size_t{5000}, good.size() - 10}) {
    Status st = restore_error(std::vector<std::byte>(good.begin(), good.begin() + static_cast<long>(cut)));
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
    EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.message();
  }
  auto bad_magic = good;
  bad_magic[0] = std::byte{'X'};
  EXPECT_NE(restore_error(bad_magic).message().find("not a tierkv session file"), std::string::npos);
  auto bad_version = good;
  bad_version[8] = std::byte{7};
  Status v = restore_error(bad_version);
  EXPECT_EQ(v.code(), StatusCode::kUnsupported);
  EXPECT_NE(v.message().find("version 7"), std::string::npos) << v.message();
  Status m = restore_error(good, KvCodec::kF16, kOtherModel);
  EXPECT_NE(m.message().find("wrong model"), std::string::npos) << m.message();
  EXPECT_EQ(m.message().find("[fingerprint"), std::string::npos) << m.message();  // the descriptions differ
  // Same description, other weights: the two fingerprints are named.
  const ModelFingerprint twin{kModel.hash + 1, kModel.description};
  Status t = restore_error(good, KvCodec::kF16, twin);
  EXPECT_NE(t.message().find("wrong model"), std::string::npos) << t.message();
  EXPECT_NE(t.message().find("[fingerprint " + Hex16(kModel.hash) + "]"), std::string::npos) << t.message();
  EXPECT_NE(t.message().find("[fingerprint " + Hex16(twin.hash) + "]"), std::string::npos) << t.message();
  Status c = restore_error(good, KvCodec::kQ8_0);
  EXPECT_NE(c.message().find("wrong codec"), std::string::npos) << c.message();
  auto bad_header = good;
  bad_header[40] = std::byte{64};  // head_dim, under the header checksum
  EXPECT_NE(restore_error(bad_header).message().find("header checksum"), std::string::npos);
  // Saving over another model's session is refused; the file is untouched.
  WriteFile(path, good);
  World other;
  const SeqId o = other.cache->NewSequence();
  AppendTokens(*other.cache, o, 0, 3, 5);
  Status sv = SessionFile::Save(*other.cache, o, Tokens(3), kOtherModel, path);
  EXPECT_NE(sv.message().find("wrong model"), std::string::npos) << sv.message();
  EXPECT_EQ(ReadFile(path), good);
}

// Paths that hold no session: a directory, a FIFO (refused without blocking in open), a
// short file of another kind ("not a session file", not "truncated"), and a short file
// that does begin as a session file (truncated).
TEST(SessionFileTest, OtherKindsOfFileAreNamed) {
  TempDir files;
  auto message = [](const std::string& path) {
    auto r = SessionFile::Inspect(path);
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_EQ(message(files.path()), files.path() + " is not a session file: a directory");
  const std::string fifo = files.path() + "/f";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(message(fifo), fifo + " is not a session file: not a regular file");
  EXPECT_FALSE(SessionFile::Verify(fifo).ok());
  const std::string text = files.path() + "/t";
  WriteFile(text, {std::byte{'h'}, std::byte{'i'}});
  EXPECT_EQ(message(text), text + " is not a session file (2 bytes, no TIERKVSF magic)");
  const std::string head = files.path() + "/h";
  WriteFile(head, {std::byte{'T'}, std::byte{'I'}, std::byte{'E'}, std::byte{'R'}, std::byte{'K'}, std::byte{'V'},
                   std::byte{'S'}, std::byte{'F'}, std::byte{2}});
  EXPECT_EQ(message(head), head + " is truncated: 9 bytes, shorter than the 4096-byte session header");
}

TEST(SessionFileTest, FuzzedFilesNeverCrashTheReader) {
  TempDir files;
  const std::string seed_path = files.path() + "/seed.tkv";
  World a;
  const SeqId s = a.cache->NewSequence();
  AppendTokens(*a.cache, s, 0, 20, 1);
  ASSERT_TRUE(SessionFile::Save(*a.cache, s, Tokens(20), kModel, seed_path).ok());
  AppendTokens(*a.cache, s, 20, 26, 1);
  ASSERT_TRUE(SessionFile::Save(*a.cache, s, Tokens(26), kModel, seed_path).ok());
  const auto good = ReadFile(seed_path);
  std::mt19937_64 rng(0xf022);
  const std::string path = files.path() + "/fuzz.tkv";
  World b;
#ifdef TIERKV_SANITIZE
  const int kCases = 150;
#else
  const int kCases = 600;
#endif
  int refused = 0;
  for (int i = 0; i < kCases; ++i) {
    auto data = good;
    switch (i % 4) {
      case 0:  // a few random byte flips anywhere
        for (int f = 0; f < 1 + static_cast<int>(rng() % 4); ++f) data[rng() % data.size()] ^= static_cast<std::byte>(1 + rng() % 255);
        break;
      case 1:  // truncation
        data.resize(rng() % data.size());
        break;
      case 2: {  // a random 8-byte field in the header or manifest area set to a huge value
        const size_t off = (rng() % 2) ? rng() % 4088 : data.size() - 8 - rng() % std::min<size_t>(data.size() - 8, 600);
        const uint64_t v = rng() % 2 ? ~uint64_t{0} : rng();
        std::memcpy(data.data() + off, &v, 8);
        break;
      }
      case 3:  // garbage appended (a torn later save)
        for (int g = 0; g < 1000; ++g) data.push_back(static_cast<std::byte>(rng()));
        break;
    }
    WriteFile(path, data);
    (void)SessionFile::Inspect(path);
    if (!SessionFile::Verify(path).ok()) ++refused;
    auto r = SessionFile::Restore(*b.cache, path, kModel);
    if (r.ok()) {  // whatever loads must page in verified data or refuse it
      for (int l = 0; l < 2; ++l) {
        for (int blk = 0; blk < b.cache->NumBlocks(r->seq); ++blk) {
          auto pin = b.mm->Acquire(b.cache->BlockPage(r->seq, l, blk), Tier::kHost);
          if (!pin.ok()) {
            EXPECT_EQ(pin.status().code(), StatusCode::kCorruption) << pin.status().ToString();
          }
        }
      }
      ASSERT_TRUE(b.cache->FreeSequence(r->seq).ok());
    }
  }
  EXPECT_GT(refused, kCases / 4);
}

// A file whose newest save is damaged (save 2's manifest flipped, its commit slot intact:
// not what a crash leaves) and the same file with both saves intact.
struct TwoSaves {
  TempDir files;
  std::string path = files.path() + "/s.tkv";
  World w;
  SeqId s = w.cache->NewSequence();
  std::vector<std::byte> damaged;
  TwoSaves() {
    AppendTokens(*w.cache, s, 0, 20, 1);
    EXPECT_TRUE(SessionFile::Save(*w.cache, s, Tokens(20), kModel, path).ok());
    AppendTokens(*w.cache, s, 20, 45, 2);
    EXPECT_TRUE(SessionFile::Save(*w.cache, s, Tokens(45), kModel, path).ok());
    damaged = ReadFile(path);
    damaged.back() ^= std::byte{0x5a};  // the last byte: save 2's manifest
    WriteFile(path, damaged);
  }
};

// repair rolls such a file back to the save before the damaged one, keeping the whole
// file as it was in the backup; restore and the next save then work as after save 1.
TEST(SessionRepairTest, RollsBackADamagedNewestSave) {
  TwoSaves f;
  World fresh;
  ASSERT_FALSE(SessionFile::Restore(*fresh.cache, f.path, kModel).ok()) << "refused before the repair";
  const std::string backup = f.path + ".damaged";
  bool repaired = false;
  SessionSummary summary;
  const Status st = SessionFile::Repair(f.path, backup, &repaired, &summary);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(repaired);
  EXPECT_EQ(summary.commit_seq, 1u);
  EXPECT_EQ(summary.n_tokens, 20u);
  EXPECT_EQ(ReadFile(backup), f.damaged);
  SessionSummary after;
  ASSERT_TRUE(SessionFile::Verify(f.path, &after).ok());
  EXPECT_TRUE(after.note.empty()) << after.note;
  World b;
  auto r = SessionFile::Restore(*b.cache, f.path, kModel);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tokens, Tokens(20));
  AppendTokens(*b.cache, r->seq, 20, 45, 2);
  ASSERT_TRUE(SessionFile::Save(*b.cache, r->seq, Tokens(45), kModel, f.path).ok());
  World c;
  auto r2 = SessionFile::Restore(*c.cache, f.path, kModel);
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(r2->tokens, Tokens(45));
  ASSERT_TRUE(SessionFile::Verify(f.path).ok());
}

// Nothing to repair: the file is not touched and no backup is made. A damaged block is
// lost data, not something a rollback can mend: an error naming the block. A backup
// name already taken is refused, the session file untouched.
TEST(SessionRepairTest, RefusesWhatItCannotRepair) {
  TwoSaves f;
  const std::string backup = f.path + ".damaged";
  {
    std::vector<std::byte> whole = f.damaged;
    whole.back() ^= std::byte{0x5a};
    WriteFile(f.path, whole);
    bool repaired = true;
    ASSERT_TRUE(SessionFile::Repair(f.path, backup, &repaired).ok());
    EXPECT_FALSE(repaired);
    EXPECT_FALSE(std::filesystem::exists(backup));
    EXPECT_EQ(ReadFile(f.path), whole);
  }
  {
    std::vector<std::byte> bad_block = f.damaged;
    bad_block[4096 + 40 + 100] ^= std::byte{0x5a};  // block 0 of save 1 (both saves use it)
    WriteFile(f.path, bad_block);
    bool repaired = true;
    const Status st = SessionFile::Repair(f.path, backup, &repaired);
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
    EXPECT_NE(st.message().find("session block 0 (layer 0, block 0)"), std::string::npos) << st.message();
    EXPECT_FALSE(repaired);
    EXPECT_FALSE(std::filesystem::exists(backup));
    EXPECT_EQ(ReadFile(f.path), bad_block);
  }
  {
    WriteFile(f.path, f.damaged);
    WriteFile(backup, {std::byte{1}});
    bool repaired = true;
    const Status st = SessionFile::Repair(f.path, backup, &repaired);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("move it aside first"), std::string::npos) << st.message();
    EXPECT_EQ(ReadFile(f.path), f.damaged);
    EXPECT_EQ(ReadFile(backup), std::vector<std::byte>{std::byte{1}});
  }
}

// A write or sync that fails at any step of a repair (a full disk for the backup, an I/O
// error at the slot) is reported, and nothing is lost: either the file is as it was and
// no partial backup is left, or the backup holds the file as it was. Save 1 restores
// either way once the repair is run again.
TEST(SessionRepairTest, FailureAtEveryStepLosesNothing) {
  TwoSaves f;
  const std::string backup = f.path + ".damaged";
  int failures = 0;
  for (int k = 0; k < 16; ++k) {
    WriteFile(f.path, f.damaged);
    std::filesystem::remove(backup);
    FaultyIo io(k, FaultyIo::Mode::kFailOnce);
    bool repaired = false;
    const Status st = SessionFile::Repair(f.path, backup, &repaired, nullptr, &io);
    if (!io.faulted()) {
      ASSERT_TRUE(st.ok()) << st.ToString();
      EXPECT_TRUE(repaired);
      break;
    }
    ++failures;
    EXPECT_FALSE(st.ok()) << "step " << k;
    EXPECT_FALSE(repaired);
    EXPECT_NE(st.message().find("No space left on device"), std::string::npos) << st.message();
    if (std::filesystem::exists(backup)) {
      EXPECT_EQ(ReadFile(backup), f.damaged) << "step " << k;
    } else {
      EXPECT_EQ(ReadFile(f.path), f.damaged) << "step " << k;
    }
    std::filesystem::remove(backup);
    bool again = false;
    ASSERT_TRUE(SessionFile::Repair(f.path, backup, &again).ok()) << "step " << k;
    World b;
    auto r = SessionFile::Restore(*b.cache, f.path, kModel);
    ASSERT_TRUE(r.ok()) << "step " << k << ": " << r.status().ToString();
    EXPECT_EQ(r->tokens, Tokens(20));
  }
  EXPECT_GE(failures, 3) << "backup write, backup sync, slot write, slot sync";
}

}  // namespace
}  // namespace tierkv
