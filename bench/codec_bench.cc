// bench/codec_bench.cc
//
// KV codec throughput (kvcache/codec.h), in GB/s of f32 values (4 bytes per value
// encoded, decoded, scored or accumulated), for every codec at head_dim 64 and 128,
// over 1024 vectors per iteration (the working set stays in L2):
//   BM_Encode      EncodeMany      f32 -> bytes
//   BM_Decode      DecodeMany      bytes -> f32
//   BM_Dot         DotMany         one prepared query against 1024 encoded keys
//   BM_Accumulate  AccumulateMany  1024 weighted encoded values into one accumulator
// The third argument picks the kernels: 0 = what Create chooses (AVX2 when the CPU has
// it), 1 = generic.
//
//   codec_bench --quality [--ablation]
// prints the markdown tables of docs/codecs.md (attention error vs f16 on synthetic K/V)
// instead of running the benchmarks.
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "kvcache/codec.h"

namespace tierkv {
namespace {

constexpr int kVectors = 1024;

struct Fixture {
  std::unique_ptr<VectorCodec> codec;
  std::vector<float> x;       // [kVectors][d]
  std::vector<uint8_t> enc;   // [kVectors][vector_bytes]
  std::vector<float> out;     // [kVectors][d]
  std::vector<float> q, w;    // [d], [kVectors]
};

// Returns false (and marks the benchmark skipped) when the codec rejects head_dim.
bool Setup(benchmark::State& state, Fixture* f) {
  const auto c = static_cast<KvCodec>(state.range(0));
  const int d = static_cast<int>(state.range(1));
  codec_internal::ForceGenericKernels(state.range(2) != 0);
  Result<std::unique_ptr<VectorCodec>> r = VectorCodec::Create(c, d, 1234);
  codec_internal::ForceGenericKernels(false);
  if (!r.ok()) {
    state.SkipWithError(r.status().ToString().c_str());
    return false;
  }
  f->codec = std::move(r).value();
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal;
  f->x.resize(static_cast<size_t>(kVectors) * d);
  for (size_t i = 0; i < f->x.size(); ++i) f->x[i] = normal(rng) * (i % d == 5 ? 15.0f : 1.0f);
  f->enc.resize(kVectors * f->codec->vector_bytes());
  f->codec->EncodeMany(f->x.data(), kVectors, f->enc.data());
  f->out.resize(f->x.size());
  f->q.resize(d);
  for (float& v : f->q) v = normal(rng);
  f->codec->PrepareQuery(f->q.data(), f->q.data());
  f->w.assign(kVectors, 1.0f / kVectors);
  state.SetLabel(std::string(KvCodecName(c)) + " " + f->codec->kernel_name());
  return true;
}

void Finish(benchmark::State& state, const Fixture& f) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kVectors *
                          f.codec->head_dim() * static_cast<int64_t>(sizeof(float)));
}

void BM_Encode(benchmark::State& state) {
  Fixture f;
  if (!Setup(state, &f)) return;
  for (auto _ : state) {
    f.codec->EncodeMany(f.x.data(), kVectors, f.enc.data());
    benchmark::DoNotOptimize(f.enc.data());
    benchmark::ClobberMemory();
  }
  Finish(state, f);
}

void BM_Decode(benchmark::State& state) {
  Fixture f;
  if (!Setup(state, &f)) return;
  for (auto _ : state) {
    f.codec->DecodeMany(f.enc.data(), kVectors, f.out.data());
    benchmark::DoNotOptimize(f.out.data());
    benchmark::ClobberMemory();
  }
  Finish(state, f);
}

void BM_Dot(benchmark::State& state) {
  Fixture f;
  if (!Setup(state, &f)) return;
  for (auto _ : state) {
    f.codec->DotMany(f.q.data(), f.enc.data(), kVectors, f.out.data());
    benchmark::DoNotOptimize(f.out.data());
    benchmark::ClobberMemory();
  }
  Finish(state, f);
}

void BM_Accumulate(benchmark::State& state) {
  Fixture f;
  if (!Setup(state, &f)) return;
  for (auto _ : state) {
    std::fill(f.out.begin(), f.out.begin() + f.codec->head_dim(), 0.0f);
    f.codec->AccumulateMany(f.w.data(), f.enc.data(), kVectors, f.out.data());
    benchmark::DoNotOptimize(f.out.data());
    benchmark::ClobberMemory();
  }
  Finish(state, f);
}

void CodecArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"codec", "d", "generic"});
  for (int generic : {0, 1}) {
    for (KvCodec c : kAllKvCodecs) {
      for (int d : {64, 128}) b->Args({static_cast<int>(c), d, generic});
    }
  }
}

BENCHMARK(BM_Encode)->Apply(CodecArgs);
BENCHMARK(BM_Decode)->Apply(CodecArgs);
BENCHMARK(BM_Dot)->Apply(CodecArgs);
BENCHMARK(BM_Accumulate)->Apply(CodecArgs);

// ---- --quality ------------------------------------------------------------------------

constexpr int kQualitySeeds = 8;

struct Mean {
  double bits = 0, attn = 0, k = 0, v = 0;
};

// Mean over kQualitySeeds data sets (seed s) and rotations (codec seed 1000 + s).
template <typename MakeCodec>
Mean Average(const SyntheticKvOptions& base, MakeCodec make) {
  Mean m;
  for (int s = 1; s <= kQualitySeeds; ++s) {
    SyntheticKvOptions o = base;
    o.seed = static_cast<uint64_t>(s);
    std::unique_ptr<VectorCodec> codec = make(1000 + s);
    Result<CodecQuality> q = MeasureCodecQuality(*codec, o);
    if (!q.ok()) {
      std::fprintf(stderr, "%s\n", q.status().ToString().c_str());
      std::exit(1);
    }
    m.bits = q->bits_per_value;
    m.attn += q->attention_rel_error / kQualitySeeds;
    m.k += q->k_rel_mse / kQualitySeeds;
    m.v += q->v_rel_mse / kQualitySeeds;
  }
  return m;
}

void PrintQualityTable(const char* title, SyntheticKvOptions base) {
  std::printf("\n%s\n\n", title);
  std::printf("| codec | head_dim | bits/value | attention rel. error | K rel. MSE | V rel. MSE |\n");
  std::printf("|---|---:|---:|---:|---:|---:|\n");
  for (int d : {64, 128}) {
    base.head_dim = d;
    for (KvCodec c : kAllKvCodecs) {
      const Mean m = Average(base, [&](uint64_t seed) {
        return VectorCodec::Create(c, d, seed).value();
      });
      std::printf("| %s | %d | %.3f | %.4f | %.5f | %.5f |\n", KvCodecName(c), d, m.bits, m.attn,
                  m.k, m.v);
    }
  }
}

void PrintAblation() {
  using codec_internal::TqOptions;
  using codec_internal::TqScaleMode;
  struct Variant {
    std::string name;
    TqOptions options;
  };
  std::vector<Variant> variants;
  // Each row changes the defaults (TqOptions{}) as its name says.
  auto add = [&](std::string name, int rounds, TqScaleMode mode, int refine, int books, int group) {
    TqOptions t;
    t.rounds = rounds;
    t.scale_mode = mode;
    t.refine_iterations = refine;
    t.books = books;
    t.group = group;
    variants.push_back({std::move(name), t});
  };
  const TqOptions def;
  const auto ls = TqScaleMode::kLeastSquares;
  add("plain TurboQuant: 2 rounds, norm, 1 book, whole vector", 2, TqScaleMode::kNorm, 0, 1, 1024);
  add("1 round, norm, 1 book, whole vector", 1, TqScaleMode::kNorm, 0, 1, 1024);
  add("1 round, norm-preserving scale, 1 book, whole vector", 1, TqScaleMode::kPreserve, 0, 1, 1024);
  add("1 round, least-squares scale, 1 book, whole vector", 1, ls, 0, 1, 1024);
  add("1 round, least-squares + 2 refits, 1 book, whole vector", 1, ls, 2, 1, 1024);
  add("1 round, least-squares + 2 refits, 8 books, whole vector", 1, ls, 2, 8, 1024);
  add("default with 2 rounds", 2, def.scale_mode, def.refine_iterations, def.books, def.group);
  add("default with 1 book", def.rounds, def.scale_mode, def.refine_iterations, 1, def.group);
  add("default with 3 books", def.rounds, def.scale_mode, def.refine_iterations, 3, def.group);
  add("default with 0 refits", def.rounds, def.scale_mode, 0, def.books, def.group);
  add("default with 4 refits", def.rounds, def.scale_mode, 4, def.books, def.group);
  add("**default**: 1 round, least-squares + 2 refits, 8 books, group 64", def.rounds,
      def.scale_mode, def.refine_iterations, def.books, def.group);
  add("default with group 32 (not a stored format)", def.rounds, def.scale_mode,
      def.refine_iterations, def.books, 32);
  std::printf("\ntq design ablation (K and V with outlier channels)\n\n");
  std::printf("| variant | head_dim | tq4 bits | tq4 attn err | tq4 K MSE | tq3 bits | tq3 attn err | tq3 K MSE |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int d : {64, 128}) {
    SyntheticKvOptions base;
    base.head_dim = d;
    for (const Variant& v : variants) {
      Mean m[2];
      int i = 0;
      for (KvCodec c : {KvCodec::kTq4, KvCodec::kTq3}) {
        m[i++] = Average(base, [&](uint64_t seed) {
          return codec_internal::CreateTqCodec(c, d, seed, v.options).value();
        });
      }
      std::printf("| %s | %d | %.3f | %.4f | %.5f | %.3f | %.4f | %.5f |\n", v.name.c_str(), d, m[0].bits,
                  m[0].attn, m[0].k, m[1].bits, m[1].attn, m[1].k);
    }
  }
}

int QualityMain(bool ablation) {
  SyntheticKvOptions o;
  std::printf("Synthetic K/V: %d tokens, %d queries, N(0,1) entries, head_dim/32 outlier "
              "channels scaled x%.0f..x%.0f; mean over %d seeds.\n",
              o.tokens, o.queries, o.outlier_scale_min, o.outlier_scale_max, kQualitySeeds);
  PrintQualityTable("K and V with outlier channels (the acceptance data)", o);
  o.outliers_in_v = false;
  PrintQualityTable("Outlier channels in K only (V plain N(0,1))", o);
  o.outlier_channels = 0;
  PrintQualityTable("No outlier channels (K and V plain N(0,1))", o);
  if (ablation) PrintAblation();
  return 0;
}

}  // namespace
}  // namespace tierkv

int main(int argc, char** argv) {
  bool quality = false, ablation = false;
  for (int i = 1; i < argc; ++i) {
    quality |= std::strcmp(argv[i], "--quality") == 0;
    ablation |= std::strcmp(argv[i], "--ablation") == 0;
  }
  if (quality || ablation) return tierkv::QualityMain(ablation);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
