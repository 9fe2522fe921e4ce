// bench/session_bench.cc
//
// Session files: save throughput as a ratio to raw pwrite of the same bytes, full
// verify throughput as a ratio to raw pread, and lazy restore time of a 128K-token
// session (flat in file size). Directory: $TIERKV_BENCH_DIR, default /dev/shm.
//
//   ./build/release/bench/session_bench --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true        (one command line)
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include <benchmark/benchmark.h>

#include "kvcache/session_file.h"
#include "memory/memory_manager.h"

namespace tierkv {
namespace {

std::string BenchDir() {
  const char* d = std::getenv("TIERKV_BENCH_DIR");
  return d ? d : "/dev/shm";
}

const ModelFingerprint kModel{42, "bench model"};

// A memory manager with one big Host tier and a KV cache holding one sequence whose
// blocks are filled with deterministic bytes (writing real K/V through the codec would
// only slow the set-up; the file path is what is measured).
struct Session {
  std::unique_ptr<MemoryManager> mm;
  std::unique_ptr<KvCache> cache;
  SeqId seq;
  std::vector<int32_t> tokens;
  uint64_t bytes = 0;  // block bytes the sequence holds

  Session(KvGeometry g, int n_tokens, uint64_t frame_bytes, bool fill) {
    MemoryManager::Backends b;
    const uint64_t block = 2ull * g.n_kv_heads * g.block_tokens * VectorCodec::Create(g.codec, g.head_dim, g.codec_seed).value()->vector_bytes();
    const uint64_t blocks = static_cast<uint64_t>(g.n_layers) * ((n_tokens + g.block_tokens - 1) / g.block_tokens);
    const uint64_t frames_per_block = (block + frame_bytes - 1) / frame_bytes;
    HostBackendOptions h;
    h.bytes = (blocks * frames_per_block + 16) * frame_bytes;
    h.mlock = MlockMode::kOff;
    b[TierIndex(Tier::kHost)] = CreateHostBackend(h).value();
    mm = MemoryManager::CreateWithBackends(std::move(b), frame_bytes, PolicyKind::kDecayedLfu).value();
    cache = KvCache::Create(mm.get(), g).value();
    seq = cache->NewSequence();
    for (int i = 0; i < n_tokens; ++i) {
      (void)cache->AppendToken(seq);
      tokens.push_back(i % 32000);
    }
    bytes = blocks * cache->block_bytes();
    if (fill) {
      uint64_t x = 1;
      for (int l = 0; l < g.n_layers; ++l) {
        for (int blk = 0; blk < cache->NumBlocks(seq); ++blk) {
          auto pin = mm->Acquire(cache->BlockPage(seq, l, blk), Tier::kHost, Access::kWrite).value();
          auto* p = reinterpret_cast<uint64_t*>(pin.data());
          for (uint64_t i = 0; i < cache->block_bytes() / 8; ++i) p[i] = (x = x * 6364136223846793005ull + 1442695040888963407ull);
        }
      }
    }
  }
};

KvGeometry Geometry(int layers, int heads, int head_dim, int block_tokens, KvCodec codec) {
  KvGeometry g;
  g.n_layers = layers;
  g.n_kv_heads = heads;
  g.head_dim = head_dim;
  g.block_tokens = block_tokens;
  g.codec = codec;
  return g;
}

// 8 layers x 4 kv heads x 128 x f16, 32-token blocks (64 KiB): 4096 tokens = 64 MiB.
Session& SaveSession() {
  static Session s(Geometry(8, 4, 128, 32, KvCodec::kF16), 4096, 64 * 1024, true);
  return s;
}

void BM_SessionSave(benchmark::State& state) {
  Session& s = SaveSession();
  const std::string path = BenchDir() + "/tierkv-bench-save.tkv";
  for (auto _ : state) {
    std::filesystem::remove(path);
    // Forget the previous iteration's save so every block is written again.
    for (int l = 0; l < s.cache->geometry().n_layers; ++l)
      for (int b = 0; b < s.cache->NumBlocks(s.seq); ++b) s.cache->SaveState(s.cache->Block(s.seq, l, b)) = BlockSaveState{};
    Status st = SessionFile::Save(*s.cache, s.seq, s.tokens, kModel, path);
    if (!st.ok()) state.SkipWithError(st.ToString().c_str());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * s.bytes));
  std::filesystem::remove(path);
}
BENCHMARK(BM_SessionSave)->Unit(benchmark::kMillisecond)->UseRealTime();

// The same bytes with plain pwrite in 8 MiB writes, then fdatasync, into a new file.
void BM_RawPwrite(benchmark::State& state) {
  Session& s = SaveSession();
  const std::string path = BenchDir() + "/tierkv-bench-raw.bin";
  std::vector<char> buf(8 << 20, 7);
  for (auto _ : state) {
    std::filesystem::remove(path);
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    for (uint64_t off = 0; off < s.bytes; off += buf.size()) {
      if (pwrite(fd, buf.data(), std::min<uint64_t>(buf.size(), s.bytes - off), static_cast<off_t>(off)) < 0) state.SkipWithError("pwrite");
    }
    fdatasync(fd);
    close(fd);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * s.bytes));
  std::filesystem::remove(path);
}
BENCHMARK(BM_RawPwrite)->Unit(benchmark::kMillisecond)->UseRealTime();

std::string SavedFile() {
  static std::string path = [] {
    Session& s = SaveSession();
    const std::string p = BenchDir() + "/tierkv-bench-verify.tkv";
    std::filesystem::remove(p);
    (void)SessionFile::Save(*s.cache, s.seq, s.tokens, kModel, p);
    return p;
  }();
  return path;
}

void BM_SessionVerify(benchmark::State& state) {
  const std::string path = SavedFile();
  for (auto _ : state) {
    Status st = SessionFile::Verify(path);
    if (!st.ok()) state.SkipWithError(st.ToString().c_str());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * SaveSession().bytes));
}
BENCHMARK(BM_SessionVerify)->Unit(benchmark::kMillisecond)->UseRealTime();

// The same file read back with plain pread, one block-sized read at a time.
void BM_RawPread(benchmark::State& state) {
  const std::string path = SavedFile();
  const uint64_t block = SaveSession().cache->block_bytes();
  std::vector<char> buf(block);
  for (auto _ : state) {
    const int fd = open(path.c_str(), O_RDONLY);
    for (uint64_t off = 0; off < SaveSession().bytes; off += block) {
      if (pread(fd, buf.data(), block, static_cast<off_t>(4096 + off)) < 0) state.SkipWithError("pread");
    }
    close(fd);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * SaveSession().bytes));
}
BENCHMARK(BM_RawPread)->Unit(benchmark::kMillisecond)->UseRealTime();

// Lazy restore of a 128K-token, 48-layer session; arg 0: small blocks (q4_0, 1 kv head
// x 64), arg 1: 4x larger file (q8_0, 2 kv heads x 64). Restore reads only metadata,
// so the time should not grow with the file size.
std::map<int, std::pair<std::string, uint64_t>>& RestoreFiles() {
  static std::map<int, std::pair<std::string, uint64_t>> files;
  return files;
}

KvGeometry RestoreGeometry(int variant) {
  return variant == 0 ? Geometry(48, 1, 64, 32, KvCodec::kQ4_0) : Geometry(48, 2, 64, 32, KvCodec::kQ8_0);
}

void BM_SessionLazyRestore128K(benchmark::State& state) {
  const int variant = static_cast<int>(state.range(0));
  const KvGeometry g = RestoreGeometry(variant);
  auto& files = RestoreFiles();
  if (!files.count(variant)) {
    Session s(g, 128 * 1024, 4096, false);
    const std::string p = BenchDir() + "/tierkv-bench-restore" + std::to_string(variant) + ".tkv";
    std::filesystem::remove(p);
    Status st = SessionFile::Save(*s.cache, s.seq, s.tokens, kModel, p);
    if (!st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      return;
    }
    files[variant] = {p, std::filesystem::file_size(p)};
  }
  const auto& [path, size] = files[variant];
  // A host tier big enough for the pages' bookkeeping; nothing is read into it.
  MemoryManager::Backends b;
  HostBackendOptions h;
  h.bytes = 64 << 20;
  h.mlock = MlockMode::kOff;
  h.warmup = false;
  b[TierIndex(Tier::kHost)] = CreateHostBackend(h).value();
  auto mm = MemoryManager::CreateWithBackends(std::move(b), 64 * 1024, PolicyKind::kDecayedLfu).value();
  for (auto _ : state) {
    state.PauseTiming();
    auto cache = KvCache::Create(mm.get(), g).value();
    state.ResumeTiming();
    auto r = SessionFile::Restore(*cache, path, kModel);
    if (!r.ok()) state.SkipWithError(r.status().ToString().c_str());
    benchmark::DoNotOptimize(r);
    state.PauseTiming();
    cache.reset();  // frees the backed pages
    state.ResumeTiming();
  }
  state.counters["file_MiB"] = static_cast<double>(size) / (1 << 20);
  state.counters["blocks"] = static_cast<double>(48 * 128 * 1024 / 32);
}
BENCHMARK(BM_SessionLazyRestore128K)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(5);

}  // namespace
}  // namespace tierkv

BENCHMARK_MAIN();
