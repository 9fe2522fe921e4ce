// bench/prefill_bench.cc
//
// Prefill throughput: P prompt tokens at KV depth D computed in chunks (Model::ForwardBatch,
// as `tierkv run -b N` does) against one Forward per token, the two paired in every
// iteration (under the same load), so that their ratio is measured in one run:
//
//   ratio = chunked tokens/s / one-at-a-time tokens/s   (= their summed times' quotient)
//
// The chunked path multiplies each matrix by every token of a chunk in one pass and has
// attention read each KV block once for all the chunk's queries; the logits are the same
// bits (tests/runtime/tiering_test.cc). Models:
//   synthetic-llama: a dense llama of 200 M Q8_0 parameters built in memory (210 MB of
//     weights, far beyond the caches: one token at a time reads them all per token);
//   synthetic-moe: qwen3moe-shaped, embedding 1024, 64 experts of FFN 512 of which 4 are
//     used (400 M Q8_0 parameters, 425 MB; a token reads 4 experts a layer, a chunk of 64
//     each expert its tokens chose, about 4 tokens an expert, once);
//   builtin:tiny-moe: 27 MiB of weights (in cache); deep, attention dominates.
// The KV is filled to D with random values (bench/kv_fill.h), f16, 1 MiB frames; every
// timed prefill is truncated back to D afterwards. The chunk's last token's logits are
// computed, as a prompt's are.
//
//   flock /tmp/tierkv-build.lock ./build/release/bench/prefill_bench --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true  (one line)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "bench/kv_fill.h"
#include "kvcache/kv_cache.h"
#include "memory/memory_manager.h"
#include "runtime/builtin_model.h"
#include "runtime/gguf.h"
#include "runtime/model.h"

namespace tierkv {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

constexpr int kPromptTokens = 128;
constexpr int kMaxDepth = 32768;

// One model with a KV cache for kMaxDepth + kPromptTokens tokens; one alive at a time.
struct PrefillRun {
  std::string name;
  std::unique_ptr<Model> model;
  std::unique_ptr<MemoryManager> mm;
  std::unique_ptr<KvCache> cache;
  SeqId seq;
  uint64_t kv_rng = 0x6b762066696c6c21ull;
  uint64_t tok_rng = 0x746f6b656e732121ull;
  std::vector<float> logits;

  // kPromptTokens tokens at positions depth, depth + 1, ... in chunks of `chunk` (1: one
  // Forward each), then back to depth. Returns the seconds the prefill took.
  Result<double> Prefill(int depth, int chunk) {
    const int n_vocab = model->config().n_vocab;
    std::vector<int32_t> ids;
    for (int i = 0; i < kPromptTokens; ++i) {
      ids.push_back(static_cast<int32_t>(bench::XorShift(tok_rng) % static_cast<uint64_t>(n_vocab)));
    }
    const auto t0 = Clock::now();
    for (int i = 0; i < kPromptTokens;) {
      const int n = std::min(chunk, kPromptTokens - i);
      const bool last = i + n == kPromptTokens;
      if (chunk == 1) {
        TIERKV_RETURN_IF_ERROR(model->Forward(*cache, seq, ids[static_cast<size_t>(i)], depth + i,
                                              last ? std::span<float>(logits) : std::span<float>()));
      } else {
        const std::vector<int> rows = last ? std::vector<int>{n - 1} : std::vector<int>{};
        TIERKV_RETURN_IF_ERROR(model->ForwardBatch(*cache, seq, std::span(ids).subspan(static_cast<size_t>(i),
                                                                                       static_cast<size_t>(n)),
                                                   depth + i, rows,
                                                   last ? std::span<float>(logits) : std::span<float>()));
      }
      i += n;
    }
    const double s = Seconds(t0, Clock::now());
    benchmark::DoNotOptimize(logits.data());
    TIERKV_RETURN_IF_ERROR(cache->Truncate(seq, depth));
    return s;
  }
};

std::unique_ptr<PrefillRun>& Current() {
  static std::unique_ptr<PrefillRun> run;
  return run;
}

Result<PrefillRun*> GetRun(const std::string& name) {
  std::unique_ptr<PrefillRun>& cur = Current();
  if (cur != nullptr && cur->name == name) return cur.get();
  cur.reset();
  auto run = std::make_unique<PrefillRun>();
  run->name = name;
  std::unique_ptr<GgufFile> built;
  if (name == "synthetic-llama") {
    TIERKV_ASSIGN_OR_RETURN(built, BuildSyntheticLlama());
  } else if (name == "synthetic-moe") {
    SyntheticMoeShape shape;
    shape.n_embd = 1024;
    shape.n_head = 16;
    shape.n_head_kv = 4;
    shape.n_expert = 64;
    shape.n_ff_exp = 512;
    TIERKV_ASSIGN_OR_RETURN(built, BuildSyntheticMoe(shape));
  } else {
    TIERKV_ASSIGN_OR_RETURN(built, OpenModelFile(name));
  }
  std::shared_ptr<const GgufFile> file(std::move(built));
  ModelOptions mo;
  mo.threads = 0;  // every core
  TIERKV_ASSIGN_OR_RETURN(run->model, Model::Load(file, mo));
  const KvGeometry want = run->model->KvGeometryFor(KvCodec::kF16);
  TIERKV_ASSIGN_OR_RETURN(run->mm, MemoryManager::Create(bench::KvHostMemory(want, kMaxDepth + kPromptTokens, kMiB)));
  TIERKV_ASSIGN_OR_RETURN(run->cache, KvCache::Create(run->mm.get(), want));
  run->seq = run->cache->NewSequence();
  run->logits.resize(static_cast<size_t>(run->model->config().n_vocab));
  cur = std::move(run);
  return cur.get();
}

void BM_Prefill(benchmark::State& state, std::string name, int depth, int chunk) {
  auto run_or = GetRun(name);
  Status st = run_or.ok() ? bench::FillKvTo(*(*run_or)->cache, (*run_or)->seq, depth, &(*run_or)->kv_rng)
                          : run_or.status();
  // Warm-up: the weights' pages and the scratch buffers of both paths.
  for (int c : {1, chunk}) {
    if (!st.ok()) break;
    auto s = (*run_or)->Prefill(depth, c);
    st = s.status();
  }
  if (!st.ok()) {
    state.SkipWithError(st.ToString().c_str());
    return;
  }
  PrefillRun& run = **run_or;
  double one_s = 0, chunk_s = 0;
  for (auto _ : state) {
    auto one = run.Prefill(depth, 1);
    auto chunked = one.ok() ? run.Prefill(depth, chunk) : one;
    if (!chunked.ok()) {
      state.SkipWithError(chunked.status().ToString().c_str());
      break;
    }
    one_s += *one;
    chunk_s += *chunked;
    state.SetIterationTime(*chunked);
  }
  if (one_s <= 0 || chunk_s <= 0) return;
  const double tokens = static_cast<double>(state.iterations()) * kPromptTokens;
  state.counters["one_tok_s"] = tokens / one_s;
  state.counters["chunk_tok_s"] = tokens / chunk_s;
  state.counters["ratio"] = one_s / chunk_s;
  state.counters["threads"] = run.model->executor().threads();
}

void Register() {
  struct Case {
    const char* model;
    int depth;
  };
  for (const Case& c : {Case{"synthetic-llama", 0}, Case{"synthetic-llama", 4096}, Case{"synthetic-moe", 0},
                        Case{"builtin:tiny-moe", 0},
                        Case{"builtin:tiny-moe", 8192}, Case{"builtin:tiny-moe", kMaxDepth}}) {
    for (int chunk : {16, 64}) {
      const std::string label =
          std::string("prefill/") + c.model + "/depth:" + std::to_string(c.depth) + "/chunk:" + std::to_string(chunk);
      benchmark::RegisterBenchmark(label.c_str(), BM_Prefill, std::string(c.model), c.depth, chunk)
          ->UseManualTime()
          ->Iterations(2)
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace
}  // namespace tierkv

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  tierkv::Register();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
