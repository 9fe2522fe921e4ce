// bench/attention_bench.cc
//
// The two-pass attention of one decode step (kernels/attention.h: f16 KV, llama.cpp
// rounding, the form the decoder uses), kernel by kernel, without the rest of the model:
//
//   attention/<shape>/<phase>/tokens:N/threads:T
//     shape   llama    8 query heads, 4 KV heads, head_dim 32 (ref-llama)
//             qwen3moe 4 query heads, 2 KV heads, head_dim 32 (ref-qwen3moe)
//             qwen3-30b 32 query heads, 4 KV heads, head_dim 128 (Qwen3-30B-A3B's layers)
//             blocks of one frame, as kvcache sizes them: $TIERKV_BENCH_FRAME_KIB, default
//             1024 as in decode_bench (2048-token blocks for llama, 4096 for qwen3moe,
//             512 for qwen3-30b; 256 gives the tool's default frames: 512, 1024 and 128
//             tokens)
//     phase   scores   AttentionScores (pass 1, reads K)
//             softmax  AttentionSoftmax (no KV read; GB/s is still per KV byte of the step)
//             values   AttentionValues (pass 2, reads V)
//             three    the three calls one after the other
//             fused    AttentionTwoPass (the decoder's call when a layer is one batch)
//             fused-llama-sums  the same in llama.cpp's summation orders (--llama-sums)
//             read     no arithmetic: a sum of the same K and V bytes in the fused path's
//                      order (a task per KV head: its K runs block by block, then its V
//                      runs), the memory-bound floor for the others in the same run
//             online-<codec>  AttentionBlocks over a cache of that codec (f16, q8_0,
//                      q4_0, tq4, tq3; keys in tiles where the codec takes them): one
//                      online pass, the decoder's call when a layer's KV comes in batches
//             two-pass-<codec>  AttentionTwoPass over the same without llama.cpp's
//                      rounding: the decoder's call when a layer is one batch
//
// Each iteration runs the phase for two layers whose blocks are distinct frames of one
// arena backed by huge pages where the kernel allows (as the Host tier's arena is), so at
// 64K tokens the KV (2 x 33.5 MB for llama) does not stay in cache between iterations any
// more than it does in a decode. Only the phase is timed;
// `GBps` is the layers' K + V bytes over that time (for scores and values alone, half of
// it is what they read). K/V are uniform in [-1, 1), the query N(0, 2^2) (peaky
// softmax), fixed seeds.
//
//   ./build/release/bench/attention_bench --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true              (one line)
#include <chrono>
#include <cstddef>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sys/mman.h>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "bench/stream_sum.h"
#include "kernels/attention.h"
#include "kernels/thread_pool.h"
#include "kvcache/codec.h"
#include "kvcache/kv_cache.h"

namespace tierkv {
namespace {

using Clock = std::chrono::steady_clock;

struct Shape {
  const char* name;
  int n_heads, n_kv_heads, head_dim;
};
constexpr Shape kShapes[] = {{"llama", 8, 4, 32}, {"qwen3moe", 4, 2, 32}, {"qwen3-30b", 32, 4, 128}};

size_t FrameBytes() {
  const char* v = std::getenv("TIERKV_BENCH_FRAME_KIB");
  const long kib = v != nullptr ? std::strtol(v, nullptr, 10) : 1024;
  return static_cast<size_t>(kib > 0 ? kib : 1024) * 1024;
}
enum Phase { kScores, kSoftmax, kValues, kThree, kFused, kRead, kOnline, kTwoPass };
constexpr const char* kPhaseNames[] = {"scores", "softmax", "values", "three", "fused", "read", "online", "two-pass"};
constexpr int kLayers = 2;

// Two layers of blocks holding `tokens` tokens, laid out as kvcache's blocks (HND:
// K [kv_heads][block_tokens][vector] or key tiles, then V [kv_heads][block_tokens][vector]).
struct Cache {
  std::unique_ptr<VectorCodec> codec;
  std::byte* arena = nullptr;
  size_t arena_bytes = 0;
  std::vector<std::vector<const std::byte*>> ptrs;  // [layer][block]
  std::vector<float> q;
  uint64_t kv_bytes = 0;
  int block_tokens = 0;

  Cache() = default;
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;
  ~Cache() {
    if (arena != nullptr) munmap(arena, arena_bytes);
  }

  bool Build(const Shape& s, int tokens, KvCodec kind) {
    auto c = VectorCodec::Create(kind, s.head_dim, 1);
    if (!c.ok()) return false;
    codec = std::move(c).value();
    const size_t vb = codec->vector_bytes();
    KvGeometry g;
    g.n_layers = kLayers;
    g.n_kv_heads = s.n_kv_heads;
    g.head_dim = s.head_dim;
    g.codec = kind;
    auto bt = KvCache::BlockTokensFor(g, FrameBytes());  // as the cache sizes its blocks
    if (!bt.ok()) return false;
    block_tokens = *bt;
    const int n_blocks = (tokens + block_tokens - 1) / block_tokens;
    const size_t block_bytes = 2 * static_cast<size_t>(s.n_kv_heads) * block_tokens * vb;
    arena_bytes = block_bytes * static_cast<size_t>(n_blocks) * kLayers;
    void* m = mmap(nullptr, arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return false;
    arena = static_cast<std::byte*>(m);
    (void)madvise(arena, arena_bytes, MADV_HUGEPAGE);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(s.head_dim));
    const bool tiles = codec->KeyTiles(block_tokens);
    const size_t run = static_cast<size_t>(block_tokens) * vb;
    for (size_t block = 0; block < arena_bytes; block += block_bytes) {
      for (int half = 0; half < 2; ++half) {
        for (int g = 0; g < s.n_kv_heads; ++g) {
          std::byte* r = arena + block + (static_cast<size_t>(half) * s.n_kv_heads + g) * run;
          for (int t = 0; t < block_tokens; ++t) {
            for (float& v : x) v = uniform(rng);
            if (half == 0 && tiles) {
              const int lane = t % VectorCodec::kKeyTileTokens;
              codec->EncodeKeyInTile(x.data(), r + static_cast<size_t>(t - lane) * vb, lane);
            } else {
              codec->Encode(x.data(), r + static_cast<size_t>(t) * vb);
            }
          }
        }
      }
    }
    // Layer l's blocks are frames l, l + kLayers, ...: interleaved, as blocks allocated
    // token by token for every layer are.
    ptrs.assign(kLayers, {});
    for (int b = 0; b < n_blocks; ++b) {
      for (int l = 0; l < kLayers; ++l) {
        ptrs[static_cast<size_t>(l)].push_back(arena + (static_cast<size_t>(b) * kLayers + l) * block_bytes);
      }
    }
    std::normal_distribution<float> normal(0.0f, 2.0f);
    q.resize(static_cast<size_t>(s.n_heads) * s.head_dim);
    for (float& v : q) v = normal(rng);
    kv_bytes = static_cast<uint64_t>(kLayers) * tokens * 2 * s.n_kv_heads * vb;
    return true;
  }
};

// The read phase of one layer: per KV head, its K runs in block order, then its V runs.
uint64_t ReadLayer(const Shape& s, int block_tokens, const std::vector<const std::byte*>& blocks, size_t vb,
                   kernels::ThreadPool& pool) {
  const size_t run = static_cast<size_t>(block_tokens) * vb;
  const size_t half = run * static_cast<size_t>(s.n_kv_heads);
  std::vector<uint64_t> sums(static_cast<size_t>(s.n_kv_heads));
  pool.ParallelFor(s.n_kv_heads, [&](int64_t g) {
    uint64_t sum = 0;
    for (size_t off : {size_t{0}, half}) {
      for (const std::byte* b : blocks) sum += bench::SumWords(reinterpret_cast<const uint64_t*>(b + off + static_cast<size_t>(g) * run), run / 8);
    }
    sums[static_cast<size_t>(g)] = sum;
  });
  uint64_t total = 0;
  for (uint64_t x : sums) total += x;
  return total;
}

void BM_Attention(benchmark::State& state, Shape shape, Phase phase, bool llama_sums, KvCodec kind) {
  const int tokens = static_cast<int>(state.range(0));
  kernels::ThreadPool pool(static_cast<int>(state.range(1)));
  Cache cache;
  if (!cache.Build(shape, tokens, kind)) {
    state.SkipWithError("no codec for this head_dim");
    return;
  }
  const VectorCodec& codec = *cache.codec;
  kernels::AttentionParams p;
  p.n_heads = shape.n_heads;
  p.n_kv_heads = shape.n_kv_heads;
  p.head_dim = shape.head_dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  p.query_pos = tokens - 1;
  p.round_query_f16 = p.round_weights_f16 = phase != kOnline && phase != kTwoPass;
  if (llama_sums) p.sums = kernels::AttentionSums::kOneToken;  // a decode step with --llama-sums
  kernels::AttentionState st;
  std::vector<float> out(cache.q.size());
  double total = 0;
  for (auto _ : state) {
    double t = 0;
    for (int l = 0; l < kLayers; ++l) {
      kernels::PagedKvView v;
      v.blocks = cache.ptrs[static_cast<size_t>(l)].data();
      v.n_blocks = static_cast<int>(cache.ptrs[static_cast<size_t>(l)].size());
      v.n_tokens = tokens;
      v.block_tokens = cache.block_tokens;
      v.n_kv_heads = shape.n_kv_heads;
      v.vector_bytes = codec.vector_bytes();
      v.key_tiles = codec.KeyTiles(cache.block_tokens);  // as kvcache lays K out
      kernels::AttentionBegin(codec, p, cache.q.data(), &st);
      Clock::time_point t0 = Clock::now();
      switch (phase) {
        case kScores:
          kernels::AttentionScores(codec, p, v, &st, &pool);
          break;
        case kSoftmax:
          kernels::AttentionScores(codec, p, v, &st, &pool);
          t0 = Clock::now();
          kernels::AttentionSoftmax(p, &st, &pool);
          break;
        case kValues:
          kernels::AttentionScores(codec, p, v, &st, &pool);
          kernels::AttentionSoftmax(p, &st, &pool);
          t0 = Clock::now();
          kernels::AttentionValues(codec, p, v, &st, &pool);
          break;
        case kThree:
          kernels::AttentionScores(codec, p, v, &st, &pool);
          kernels::AttentionSoftmax(p, &st, &pool);
          kernels::AttentionValues(codec, p, v, &st, &pool);
          break;
        case kFused:
          kernels::AttentionTwoPass(codec, p, v, &st, &pool);
          break;
        case kOnline:
          kernels::AttentionBlocks(codec, p, v, &st, &pool);
          break;
        case kTwoPass:
          kernels::AttentionTwoPass(codec, p, v, &st, &pool);
          break;
        case kRead:
          benchmark::DoNotOptimize(ReadLayer(shape, cache.block_tokens, cache.ptrs[static_cast<size_t>(l)], codec.vector_bytes(), pool));
          break;
      }
      t += std::chrono::duration<double>(Clock::now() - t0).count();
      kernels::AttentionEnd(codec, p, &st, out.data());
    }
    benchmark::DoNotOptimize(out.data());
    state.SetIterationTime(t);
    total += t;
  }
  if (total > 0) {
    state.counters["GBps"] = static_cast<double>(state.iterations()) * static_cast<double>(cache.kv_bytes) / total / 1e9;
  }
  state.counters["kv_MB"] = static_cast<double>(cache.kv_bytes) / 1e6;
  state.counters["block_tokens"] = cache.block_tokens;
}

void Register() {
  for (const Shape& s : kShapes) {
    auto add = [&](const std::string& phase_name, Phase ph, bool llama_sums, KvCodec kind = KvCodec::kF16) {
      const std::string name = std::string("attention/") + s.name + "/" + phase_name;
      benchmark::RegisterBenchmark(name.c_str(), BM_Attention, s, ph, llama_sums, kind)
          ->ArgNames({"tokens", "threads"})
          ->ArgsProduct({{4096, 16384, 65536}, {1, 2}})
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.2);
    };
    for (Phase ph : {kScores, kSoftmax, kValues, kThree, kFused, kRead}) add(kPhaseNames[ph], ph, false);
    // The fused call with llama.cpp's summation orders (one token's; --llama-sums).
    add("fused-llama-sums", kFused, true);
    for (KvCodec kind : kAllKvCodecs) {
      add(std::string("online-") + KvCodecName(kind), kOnline, false, kind);
      add(std::string("two-pass-") + KvCodecName(kind), kTwoPass, false, kind);
    }
  }
}

}  // namespace
}  // namespace tierkv

int main(int argc, char** argv) {
  tierkv::Register();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
