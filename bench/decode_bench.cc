// bench/decode_bench.cc
//
// Decode throughput of real GGUF models at KV depths 0, 4K, 16K and 64K, each as a
// ratio to a memory-bandwidth roofline measured in the same run:
//
//   bytes/token  = weight bytes one decode step reads + KV bytes it reads
//   roofline     = read bandwidth / bytes/token        (tokens/s)
//   ratio        = decode tokens/s / roofline           (target >= 0.5 at 16K and 64K)
//
// Weight bytes: every tensor's n_bytes, except that the token embedding lookup reads
// one row (a tied output projection then reads the whole token_embd as well) and MoE
// expert tensors (*_exps) count n_expert_used / n_expert of their bytes. KV bytes: the
// step attends over depth + 2 tokens (its own included), (depth + 2) * token_bytes.
//
// The read bandwidth is a streaming read (a sum of 64-bit words) over a buffer of the
// same size as bytes/token, on the model's own thread pool (same threads), so cache
// effects are comparable: the L3 of the machine this was written on is larger than
// some of the working sets. Each iteration times one read of that buffer and then one
// decode step, so the two alternate under the same load; the ratio is their summed
// times' quotient. `dram_GBps` is a 1 GiB read measured once per model (reported
// beside, with `ratio_dram`), and `read_bandwidth/1GiB` measures it on its own.
//
// The KV cache is filled to depth + 1 tokens directly (deterministic random K/V written
// with KvCache::Write, no forward passes); every step runs Forward(token, pos = depth +
// 1) with logits and is truncated back afterwards (not timed). The depths are multiples
// of the block size, so the step's token lands in a block that already exists, as in
// block_tokens - 1 of every block_tokens steps of a real decode (a step at pos = depth
// would allocate and zero a new block on every layer in every timed step);
// `block_alloc_us` says what that costs (AppendToken at the block boundary + Truncate,
// measured apart).
//
//   flock /tmp/tierkv-build.lock ./build/release/bench/decode_bench
//       --benchmark_repetitions=5 --benchmark_report_aggregates_only=true  (one line)
//
// The KV lives in a Host tier of 1 MiB frames ($TIERKV_BENCH_FRAME_KIB to change it; see
// BenchFrameBytes), so blocks are 1 MiB: 2048 tokens for ref-llama, 4096 for ref-qwen3moe.
// $TIERKV_BENCH_KV picks the KV codec (f16 q8_0 q4_0 tq4 tq3; default f16).
//
// Models: $TIERKV_MODELS_DIR/*.gguf (default /work/shared/reference/models), one
// benchmark per model and depth, named decode/<model>/depth:<tokens>.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>

#include "bench/kv_fill.h"
#include "bench/stream_sum.h"
#include "kernels/cpu_executor.h"
#include "kernels/thread_pool.h"
#include "kvcache/kv_cache.h"
#include "memory/memory_manager.h"
#include "runtime/gguf.h"
#include "runtime/model.h"

namespace tierkv {
namespace {

constexpr int kDepths[] = {0, 4096, 16384, 65536};
constexpr int kMaxDepth = 65536;

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// ---- streaming read ----------------------------------------------------------------

// A buffer of `bytes` (rounded up to 64-byte lines) with deterministic contents, read
// by `pool` in about 4 contiguous chunks per thread.
class ReadBuffer {
 public:
  void Resize(uint64_t bytes) {
    const size_t words = static_cast<size_t>((bytes + 63) / 64 * 8);
    if (words == words_.size()) return;
    words_.assign(words, 0);
    for (size_t i = 0; i < words; ++i) words_[i] = i * 0x9e3779b97f4a7c15ull;  // touches every OS page
  }
  uint64_t bytes() const { return words_.size() * 8; }

  // One full read; returns its wall time in seconds.
  double Read(kernels::ThreadPool& pool) {
    const auto t0 = Clock::now();
    const int64_t chunks = static_cast<int64_t>(pool.size()) * 4;
    const uint64_t s = bench::ParallelSumWords(pool, words_.data(), words_.size(), chunks);
    const auto t1 = Clock::now();
    benchmark::DoNotOptimize(s);
    return Seconds(t0, t1);
  }

 private:
  std::vector<uint64_t> words_;
};

// A 1 GiB buffer, made once and kept for the whole run (filling 1 GiB is slow).
ReadBuffer& GibBuffer() {
  static ReadBuffer* gib = [] {
    auto* b = new ReadBuffer;
    b->Resize(kGiB);
    return b;
  }();
  return *gib;
}

// Median of `reps` reads of the 1 GiB buffer, bytes/s.
double DramBandwidth(kernels::ThreadPool& pool, int reps) {
  ReadBuffer* gib = &GibBuffer();
  std::vector<double> t;
  (void)gib->Read(pool);  // wakes the workers
  for (int i = 0; i < reps; ++i) t.push_back(gib->Read(pool));
  std::sort(t.begin(), t.end());
  return static_cast<double>(gib->bytes()) / t[t.size() / 2];
}

// ---- what a decode step reads ---------------------------------------------------------

uint64_t WeightBytesPerToken(const GgufFile& file, const ModelConfig& cfg) {
  uint64_t bytes = 0;
  for (const GgufTensor& t : file.tensors()) {
    const std::string_view name = t.name;
    if (name == "token_embd.weight") {
      bytes += t.row_bytes();                 // the embedding lookup
      if (cfg.tied_output) bytes += t.n_bytes;  // the output projection
    } else if (cfg.is_moe() && name.find("_exps.") != std::string_view::npos) {
      bytes += t.n_bytes / static_cast<uint64_t>(cfg.n_expert) * static_cast<uint64_t>(cfg.n_expert_used);
    } else {
      bytes += t.n_bytes;
    }
  }
  return bytes;
}

// ---- one model ------------------------------------------------------------------------

// A loaded model with a KV cache big enough for kMaxDepth + 2 tokens on the Host tier.
// Only one is alive at a time (they run one after the other).
struct ModelRun {
  std::string path;
  std::shared_ptr<kernels::CpuExecutor> exec;  // the model's (its pool reads the buffers)
  std::unique_ptr<Model> model;
  std::unique_ptr<MemoryManager> mm;
  std::unique_ptr<KvCache> cache;
  SeqId seq;
  uint64_t weight_bytes = 0;
  double dram_bps = 0;
  uint64_t kv_rng = 0x6b762066696c6c21ull;    // fill values
  uint64_t tok_rng = 0x746f6b656e732121ull;   // decoded tokens
  ReadBuffer buffer;
  std::vector<float> logits;

  // Grows or cuts the sequence to `depth` tokens; new tokens get K/V uniform in [-1, 1).
  Status FillTo(int depth) { return bench::FillKvTo(*cache, seq, depth, &kv_rng); }

  int32_t NextToken() {
    return static_cast<int32_t>(bench::XorShift(tok_rng) % static_cast<uint64_t>(model->config().n_vocab));
  }
};

// The host tier's frame size, so the KV block size: $TIERKV_BENCH_FRAME_KIB, default
// 1024 (1 MiB, as `--frame 1MiB`). A KV head's K (or V) is one run of block_tokens
// vectors per block, and attention streams each run; 1 MiB frames make those runs 128 KiB
// for ref-llama instead of 32 KiB with the tool's default 256 KiB frames, which the
// hardware prefetchers follow better (docs/benchmarks.md has both in a paired run).
uint64_t BenchFrameBytes() {
  const char* v = std::getenv("TIERKV_BENCH_FRAME_KIB");
  const long kib = v != nullptr ? std::strtol(v, nullptr, 10) : 1024;
  return static_cast<uint64_t>(kib > 0 ? kib : 1024) * 1024;
}

std::unique_ptr<ModelRun>& Current() {
  static std::unique_ptr<ModelRun> run;
  return run;
}

Result<ModelRun*> GetRun(const std::string& path) {
  std::unique_ptr<ModelRun>& cur = Current();
  if (cur != nullptr && cur->path == path) return cur.get();
  cur.reset();
  auto run = std::make_unique<ModelRun>();
  run->path = path;
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> opened, GgufFile::Open(path));
  std::shared_ptr<const GgufFile> file(std::move(opened));
  ModelOptions mo;
  run->exec = std::make_shared<kernels::CpuExecutor>(0);  // every core
  mo.executor = run->exec;
  TIERKV_ASSIGN_OR_RETURN(run->model, Model::Load(file, mo));

  // Host tier: the KV of kMaxDepth + 2 tokens, in the codec $TIERKV_BENCH_KV names (f16
  // by default).
  KvCodec codec = KvCodec::kF16;
  if (const char* name = std::getenv("TIERKV_BENCH_KV"); name != nullptr) {
    TIERKV_ASSIGN_OR_RETURN(codec, ParseKvCodec(name));
  }
  const KvGeometry want = run->model->KvGeometryFor(codec);
  TIERKV_ASSIGN_OR_RETURN(run->mm, MemoryManager::Create(bench::KvHostMemory(want, kMaxDepth + 2, BenchFrameBytes())));
  TIERKV_ASSIGN_OR_RETURN(run->cache, KvCache::Create(run->mm.get(), want));
  run->seq = run->cache->NewSequence();
  run->weight_bytes = WeightBytesPerToken(*file, run->model->config());
  run->logits.resize(static_cast<size_t>(run->model->config().n_vocab));
  run->dram_bps = DramBandwidth(run->exec->pool(), 3);
  cur = std::move(run);
  return cur.get();
}

void BM_Decode(benchmark::State& state, std::string path, int depth) {
  auto run_or = GetRun(path);
  if (!run_or.ok()) {
    state.SkipWithError(run_or.status().ToString().c_str());
    return;
  }
  ModelRun& run = **run_or;
  Status st = run.FillTo(depth);
  if (!st.ok()) {
    state.SkipWithError(st.ToString().c_str());
    return;
  }
  Model& model = *run.model;
  KvCache& cache = *run.cache;
  kernels::ThreadPool& pool = run.exec->pool();
  const uint64_t kv_bytes = static_cast<uint64_t>(depth + 2) * cache.token_bytes();
  const uint64_t bytes = run.weight_bytes + kv_bytes;
  run.buffer.Resize(bytes);

  // What a new block costs: AppendToken at the block boundary (a block per layer,
  // allocated and zeroed) and Truncate back, median of 9. Not part of the timed steps.
  std::vector<double> append_s;
  for (int i = 0; i < 9 && st.ok(); ++i) {
    const auto t0 = Clock::now();
    auto at = cache.AppendToken(run.seq);
    st = at.ok() ? cache.Truncate(run.seq, depth) : at.status();
    append_s.push_back(Seconds(t0, Clock::now()));
  }
  std::sort(append_s.begin(), append_s.end());

  // The step's block exists. Warm-up: first touch of the weights' file pages and the
  // scratch buffers.
  const int pos = depth + 1;
  if (st.ok()) st = run.FillTo(pos);
  if (st.ok()) st = model.Forward(cache, run.seq, run.NextToken(), pos, run.logits);
  if (st.ok()) st = cache.Truncate(run.seq, pos);
  if (!st.ok()) {
    state.SkipWithError(st.ToString().c_str());
    return;
  }
  (void)run.buffer.Read(pool);

  double decode_s = 0, read_s = 0;
  for (auto _ : state) {
    read_s += run.buffer.Read(pool);
    const int32_t token = run.NextToken();
    const auto t0 = Clock::now();
    st = model.Forward(cache, run.seq, token, pos, run.logits);
    const auto t1 = Clock::now();
    if (st.ok()) st = cache.Truncate(run.seq, pos);
    if (!st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(run.logits.data());
    state.SetIterationTime(Seconds(t0, t1));
    decode_s += Seconds(t0, t1);
  }
  if (decode_s <= 0 || read_s <= 0) return;
  const double n = static_cast<double>(state.iterations());
  const double read_bps = n * static_cast<double>(run.buffer.bytes()) / read_s;
  const double tok_s = n / decode_s;
  const double roofline = read_bps / static_cast<double>(bytes);
  state.counters["tok_s"] = tok_s;
  state.counters["bytes_per_tok_MB"] = static_cast<double>(bytes) / 1e6;
  state.counters["kv_MB"] = static_cast<double>(kv_bytes) / 1e6;
  state.counters["read_GBps"] = read_bps / 1e9;
  state.counters["roofline_tok_s"] = roofline;
  state.counters["ratio"] = tok_s / roofline;
  state.counters["dram_GBps"] = run.dram_bps / 1e9;
  state.counters["ratio_dram"] = tok_s / (run.dram_bps / static_cast<double>(bytes));
  state.counters["block_alloc_us"] = append_s[append_s.size() / 2] * 1e6;
  state.counters["threads"] = pool.size();
  state.counters["frame_KiB"] = static_cast<double>(run.mm->frame_bytes() / 1024);
  state.counters["block_tokens"] = cache.geometry().block_tokens;
}

// The DRAM figure on its own: a 1 GiB streaming read on all cores.
void BM_ReadBandwidth(benchmark::State& state) {
  Current().reset();  // no model pool spinning next to this one
  kernels::ThreadPool pool(0);
  ReadBuffer& buf = GibBuffer();
  (void)buf.Read(pool);
  double s = 0;
  for (auto _ : state) {
    const double t = buf.Read(pool);
    state.SetIterationTime(t);
    s += t;
  }
  state.counters["GBps"] = static_cast<double>(state.iterations()) * static_cast<double>(buf.bytes()) / s / 1e9;
  state.counters["threads"] = pool.size();
}

std::string ModelsDir() {
  const char* d = std::getenv("TIERKV_MODELS_DIR");
  return d ? d : "/work/shared/reference/models";
}

}  // namespace
}  // namespace tierkv

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  std::vector<fs::path> models;
  std::error_code ec;
  const std::string dir = tierkv::ModelsDir();
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".gguf") models.push_back(e.path());
  }
  std::sort(models.begin(), models.end());
  if (models.empty()) {
    std::fprintf(stderr, "decode_bench: no *.gguf models in %s (set TIERKV_MODELS_DIR); decode benchmarks skipped\n",
                 dir.c_str());
  }
  for (const fs::path& m : models) {
    for (int depth : tierkv::kDepths) {
      const std::string name = "decode/" + m.stem().string() + "/depth:" + std::to_string(depth);
      benchmark::RegisterBenchmark(name.c_str(), tierkv::BM_Decode, m.string(), depth)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond)
          ->MinTime(0.3);
    }
  }
  benchmark::RegisterBenchmark("read_bandwidth/1GiB", tierkv::BM_ReadBandwidth)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);

  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
