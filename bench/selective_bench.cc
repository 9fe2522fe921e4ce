// bench/selective_bench.cc
//
// Selective attention (ModelOptions::attn_topk, `tierkv run --attn-topk N`) against full
// attention, on real text. Per model and depth: the prompt (an English paragraph
// repeated) prefilled to the depth in both runs (prefill attends to every block, so both
// hold the same KV), then kSteps decode steps, each run fed the full-attention run's
// greedy token. N is 3% of the context's blocks ($TIERKV_BENCH_TOPK_PERCENT to change).
// Counters:
//   top1        share of steps whose argmax agrees with full attention's
//   max_dlogit  largest |logit difference| over all steps and the vocabulary
//   kl          mean KL(full || selective) per step, in nats
//   blocks      share of the layer's KV blocks a selective step reads (sinks, recent
//               window and the chosen ones, the union over KV heads)
//   full_ms, topk_ms   a decode step's time, each way (median of the steps)
// The iteration time is one selective step (truncated back after it).
//
//   ./build/release/bench/selective_bench --benchmark_min_time=0.2s   (one line)
//
// KV blocks of 64 tokens (f16) in a Host tier; models: builtin:tiny-moe and
// $TIERKV_MODELS_DIR/ref-{llama,qwen3moe}-q8_0.gguf (default /work/shared/reference/models).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "kvcache/kv_cache.h"
#include "memory/memory_manager.h"
#include "runtime/builtin_model.h"
#include "runtime/model.h"
#include "runtime/tokenizer.h"

namespace tierkv {
namespace {

constexpr int kSteps = 32;
constexpr int kBlockTokens = 64;
constexpr int kChunk = 256;

struct Run {
  std::unique_ptr<MemoryManager> mm;
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCache> cache;
  SeqId seq;
};

Run Open(const std::shared_ptr<const GgufFile>& file, int depth, int topk) {
  Run r;
  ModelOptions mo;
  mo.attn_topk = topk;
  r.model = std::move(Model::Load(file, mo)).value();
  const KvGeometry g = r.model->KvGeometryFor(KvCodec::kF16, kBlockTokens);
  MemoryOptions mem;
  mem.frame_bytes = 64 * 1024;
  // Every block takes whole frames: n_layers per kBlockTokens tokens, each rounded up.
  const uint64_t block_bytes = 2ull * g.n_kv_heads * kBlockTokens * g.head_dim * 2;
  const uint64_t block_frames = (block_bytes + mem.frame_bytes - 1) / mem.frame_bytes;
  const uint64_t blocks = static_cast<uint64_t>(g.n_layers) * ((depth + kSteps) / kBlockTokens + 2);
  mem.host_bytes = (blocks * block_frames + 64) * mem.frame_bytes;
  mem.mlock = MlockMode::kOff;
  r.mm = std::move(MemoryManager::Create(mem)).value();
  r.cache = std::move(KvCache::Create(r.mm.get(), g)).value();
  r.seq = r.cache->NewSequence();
  return r;
}

// The prompt's first `depth` tokens: a paragraph repeated, with the model's tokenizer.
std::vector<int32_t> PromptTokens(const GgufFile& file, int depth) {
  auto tok = std::move(Tokenizer::FromGguf(file)).value();
  const std::string para =
      "The keeper of the lighthouse climbed the stairs every evening, counted the steps, lit the lamp and wrote "
      "in his log what the sea had done that day: the wind from the west, a ship far out, the gulls, the rain. ";
  std::string text;
  std::vector<int32_t> ids;
  while (static_cast<int>(ids.size()) < depth) {
    text += para;
    ids = tok->Encode(text, /*add_special=*/true, /*parse_special=*/false);
  }
  ids.resize(static_cast<size_t>(depth));
  return ids;
}

void Prefill(Run& r, const std::vector<int32_t>& ids) {
  std::vector<float> none;
  for (size_t pos = 0; pos < ids.size(); pos += kChunk) {
    const size_t n = std::min<size_t>(kChunk, ids.size() - pos);
    const std::vector<int32_t> chunk(ids.begin() + static_cast<ptrdiff_t>(pos), ids.begin() + static_cast<ptrdiff_t>(pos + n));
    const Status st = r.model->ForwardBatch(*r.cache, r.seq, chunk, static_cast<int>(pos), {}, none);
    if (!st.ok()) std::fprintf(stderr, "prefill: %s\n", st.ToString().c_str());
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void BM_Selective(benchmark::State& state, std::string path, int depth) {
  auto opened = path.rfind("builtin:", 0) == 0 ? BuildBuiltinModel(path.substr(8)) : GgufFile::Open(path);
  if (!opened.ok()) {
    state.SkipWithError(opened.status().ToString().c_str());
    return;
  }
  std::shared_ptr<const GgufFile> file = std::move(opened).value();
  const char* percent_env = std::getenv("TIERKV_BENCH_TOPK_PERCENT");
  const double percent = percent_env != nullptr ? std::atof(percent_env) : 3.0;
  const int topk = std::max(1, static_cast<int>(std::lround(depth / kBlockTokens * percent / 100.0)));
  Run full = Open(file, depth, 0), sel = Open(file, depth, topk);
  const std::vector<int32_t> ids = PromptTokens(*file, depth);
  Prefill(full, ids);
  Prefill(sel, ids);
  const size_t n_vocab = static_cast<size_t>(full.model->config().n_vocab);
  std::vector<float> a(n_vocab), b(n_vocab);
  int32_t token = ids.back();
  int agree = 0;
  double max_diff = 0, kl_sum = 0;
  std::vector<double> full_ms, sel_ms;
  uint64_t sel_blocks = 0, all_blocks = 0;
  for (int i = 0; i < kSteps; ++i) {
    const int pos = depth + i;
    auto t0 = std::chrono::steady_clock::now();
    (void)full.model->Forward(*full.cache, full.seq, token, pos, a);
    auto t1 = std::chrono::steady_clock::now();
    const uint64_t acq0 = sel.model->counters().kv_acquires;
    (void)sel.model->Forward(*sel.cache, sel.seq, token, pos, b);
    auto t2 = std::chrono::steady_clock::now();
    sel_blocks += sel.model->counters().kv_acquires - acq0;
    all_blocks += static_cast<uint64_t>(full.cache->NumBlocks(full.seq)) * full.model->config().n_layer;
    full_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    sel_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    const auto ia = std::max_element(a.begin(), a.end()) - a.begin();
    const auto ib = std::max_element(b.begin(), b.end()) - b.begin();
    agree += ia == ib;
    // KL(p || q) of the softmaxes, in doubles.
    const double ma = a[static_cast<size_t>(ia)], mb = b[static_cast<size_t>(ib)];
    double za = 0, zb = 0;
    for (size_t v = 0; v < n_vocab; ++v) {
      za += std::exp(a[v] - ma);
      zb += std::exp(b[v] - mb);
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(a[v] - b[v])));
    }
    double kl = 0;
    for (size_t v = 0; v < n_vocab; ++v) {
      const double lp = a[v] - ma - std::log(za), lq = b[v] - mb - std::log(zb);
      kl += std::exp(lp) * (lp - lq);
    }
    kl_sum += kl;
    token = static_cast<int32_t>(ia);
  }
  const int pos = depth + kSteps;
  for (auto _ : state) {
    const Status st = sel.model->Forward(*sel.cache, sel.seq, token, pos, b);
    if (!st.ok()) state.SkipWithError(st.ToString().c_str());
    state.PauseTiming();
    (void)sel.cache->Truncate(sel.seq, pos);
    state.ResumeTiming();
  }
  state.counters["topk"] = topk;
  state.counters["top1"] = static_cast<double>(agree) / kSteps;
  state.counters["max_dlogit"] = max_diff;
  state.counters["kl"] = kl_sum / kSteps;
  state.counters["blocks"] = all_blocks > 0 ? static_cast<double>(sel_blocks) / static_cast<double>(all_blocks) : 0;
  state.counters["full_ms"] = Median(full_ms);
  state.counters["topk_ms"] = Median(sel_ms);
}

void Register() {
  const char* dir_env = std::getenv("TIERKV_MODELS_DIR");
  const std::string dir = dir_env != nullptr ? dir_env : "/work/shared/reference/models";
  const std::pair<std::string, std::vector<int>> models[] = {
      {"builtin:tiny-moe", {4096, 16384}},
      {dir + "/ref-llama-q8_0.gguf", {2048, 8192}},
      {dir + "/ref-qwen3moe-q8_0.gguf", {2048, 8192}},
  };
  for (const auto& [path, depths] : models) {
    if (path.rfind("builtin:", 0) != 0 && !std::filesystem::exists(path)) continue;
    const std::string name = std::filesystem::path(path).stem().string();
    for (int depth : depths) {
      benchmark::RegisterBenchmark(("selective/" + name + "/depth:" + std::to_string(depth)).c_str(), BM_Selective, path,
                                   depth)
          ->Unit(benchmark::kMillisecond)
          ->Iterations(8);
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
