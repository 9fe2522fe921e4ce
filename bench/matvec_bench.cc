// bench/matvec_bench.cc
//
// The matrix-vector product y = W x (kernels::MatVec) for each quantized weight type, on
// one thread or two, through the kernels MatVec picks (the AVX512-VNNI multi-row kernels
// where the type has one) against the same MatVec with the level capped at AVX2, in the
// same run. Both give the same bits (tests/kernels/quant_test.cc); only speed differs.
//
//   matvec/<type>/rows:<R>/threads:<T>/path:<best|avx2|avx2vnni>
//
// path:avx2 is the AVX2 level without AVX-VNNI; path:avx2vnni (Q8_0 and Q4_0, only on
// CPUs with AVX-VNNI) the AVX2 level with it, what a CPU with AVX-VNNI and no AVX-512 runs.
//
// W is R x 4096 with random codes and fixed, sane block scales (seed 1), x is N(0, 1)
// converted once to the type's activation (not timed). R = 256 keeps W in the L2 of
// most cores (a compute comparison); R = 8192 (16 - 34 MB) reads it from L3 or memory.
// Counter: GB/s of weight bytes (wall time). Also matmul/<type>/tokens:<N>/path:<tokens|rows>
// (BM_MatMulTokens below): a prefill chunk's product through the several-token kernel
// against the one-token kernel once per token (matmul-avx2/...: the same at the AVX2
// level). Commands and results: docs/benchmarks.md.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>

#include "bench/stream_sum.h"
#include "kernels/cpu_features.h"
#include "kernels/fp16.h"
#include "kernels/matvec.h"
#include "kernels/quant.h"
#include "kernels/thread_pool.h"

namespace tierkv {
namespace {

using kernels::WeightType;

constexpr int64_t kCols = 4096;

// Random code bytes, then fp16 block scales of 0.01 (and mins of 0.002) where each
// layout keeps them, so no NaN or infinity reaches the float parts.
std::vector<uint8_t> RandomRows(WeightType t, int64_t rows) {
  const size_t rb = kernels::RowBytes(t, kCols);
  std::vector<uint8_t> m(rb * static_cast<size_t>(rows));
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : m) b = static_cast<uint8_t>(byte(rng));
  const kernels::WeightTypeInfo& info = kernels::GetWeightTypeInfo(t);
  const uint16_t d = kernels::F32ToF16(0.01f), dmin = kernels::F32ToF16(0.002f);
  for (size_t blk = 0; blk < m.size() / static_cast<size_t>(info.block_bytes); ++blk) {
    uint8_t* p = m.data() + blk * static_cast<size_t>(info.block_bytes);
    switch (t) {
      case WeightType::kQ6_K: std::memcpy(p + 208, &d, 2); break;
      case WeightType::kQ3_K: std::memcpy(p + 108, &d, 2); break;
      case WeightType::kQ2_K:
        std::memcpy(p + 80, &d, 2);
        std::memcpy(p + 82, &dmin, 2);
        break;
      case WeightType::kQ4_K:
      case WeightType::kQ5_K:
      case WeightType::kQ4_1:
      case WeightType::kQ5_1:
        std::memcpy(p, &d, 2);
        std::memcpy(p + 2, &dmin, 2);
        break;
      case WeightType::kF32: {
        const float v = 0.01f * static_cast<float>(p[0] - 128);
        std::memcpy(p, &v, 4);
        break;
      }
      default: std::memcpy(p, &d, 2); break;
    }
  }
  return m;
}

// n values N(0, 1), seed 2: the activation row of the matrix-vector benchmarks.
std::vector<float> NormalVector(int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  return x;
}

enum class Path { kBest, kAvx2, kAvx2Vnni };

const char* PathName(Path path) {
  return path == Path::kBest ? "best" : path == Path::kAvx2 ? "avx2" : "avx2vnni";
}

// The kernels a path runs, for the scope of one benchmark: the AVX2 paths cap the level
// (the same row ranges per thread), path:avx2 without AVX-VNNI.
class PathScope {
 public:
  explicit PathScope(Path path) : before_(kernels::ActiveSimdLevel()) {
    if (path != Path::kBest) kernels::ForceSimdLevel(kernels::SimdLevel::kAvx2);
    kernels::AllowAvxVnni(path != Path::kAvx2);
  }
  ~PathScope() {
    kernels::ForceSimdLevel(before_);
    kernels::AllowAvxVnni(true);
  }
  PathScope(const PathScope&) = delete;
  PathScope& operator=(const PathScope&) = delete;

 private:
  const kernels::SimdLevel before_;
};

void BM_MatVec(benchmark::State& state, WeightType t, int64_t rows, Path path, int threads) {
  const std::vector<uint8_t> w = RandomRows(t, rows);
  const size_t rb = kernels::RowBytes(t, kCols);
  const std::vector<float> x = NormalVector(kCols);
  std::vector<float> y(static_cast<size_t>(rows));
  kernels::ActivationRow act;
  act.Set(x.data(), kCols);
  const kernels::MatrixView view{t, w.data(), kCols, rows, rb};
  std::unique_ptr<kernels::ThreadPool> pool;
  if (threads > 1) pool = std::make_unique<kernels::ThreadPool>(threads);
  const PathScope scope(path);
  for (auto _ : state) {
    kernels::MatVec(view, act, y.data(), pool.get());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetLabel(std::string(kernels::SimdLevelName(kernels::DotFnLevel(t, kernels::ActiveSimdLevel()))) +
                 (path == Path::kAvx2Vnni ? "+avx-vnni" : ""));
  const double bytes = static_cast<double>(w.size()) * static_cast<double>(state.iterations());
  state.counters["GBps"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
}

// The output projection of the small reference models (vocab x n_embd: short rows, many
// of them), on two threads, against a streaming read of the same bytes on the same pool,
// alternated in each iteration (outproj/<type>/<rows>x<cols>); with /threads:1, on one
// thread (the kernel alone, without the other core's share of the host's noise);
// Q8_0 and Q4_0 on CPUs with AVX-VNNI also /threads:1/path:avx2 and path:avx2vnni (the
// AVX2 level's 8-row kernels without and with it).
// Counters: the matvec's GB/s, the read's, and their ratio (the part of decode_bench's
// roofline these matrices are).
void BM_OutputProjection(benchmark::State& state, WeightType t, int64_t rows, int64_t cols, int threads, Path path) {
  const PathScope scope(path);
  const size_t rb = kernels::RowBytes(t, cols);
  std::vector<uint8_t> w(rb * static_cast<size_t>(rows));
  {
    // Random codes with the scales RandomRows gives 4096-wide rows (its layout per block).
    const std::vector<uint8_t> one = RandomRows(t, 1);
    const size_t block = static_cast<size_t>(kernels::GetWeightTypeInfo(t).block_bytes);
    for (size_t off = 0; off < w.size(); off += block) {
      std::memcpy(w.data() + off, one.data() + off % one.size(), block);
    }
  }
  const std::vector<float> x = NormalVector(cols);
  std::vector<float> y(static_cast<size_t>(rows));
  kernels::ActivationRow act;
  act.Set(x.data(), cols);
  const kernels::MatrixView view{t, w.data(), cols, rows, rb};
  kernels::ThreadPool pool(threads);
  std::vector<uint64_t> buf((w.size() + 7) / 8, 1);
  double mv_s = 0, read_s = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    const uint64_t sum = bench::ParallelSumWords(pool, buf.data(), buf.size(), 8);
    auto t1 = std::chrono::steady_clock::now();
    kernels::MatVec(view, act, y.data(), &pool);
    auto t2 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(sum);
    benchmark::DoNotOptimize(y.data());
    read_s += std::chrono::duration<double>(t1 - t0).count();
    mv_s += std::chrono::duration<double>(t2 - t1).count();
    state.SetIterationTime(std::chrono::duration<double>(t2 - t1).count());
  }
  const double bytes = static_cast<double>(w.size()) * static_cast<double>(state.iterations());
  state.counters["GBps"] = bytes / mv_s / 1e9;
  state.counters["read_GBps"] = bytes / read_s / 1e9;
  state.counters["ratio"] = read_s / mv_s;
}

// A prefill chunk's product, kernel level, one thread: R rows x 4096 against N tokens,
// through the several-token kernel (path:tokens: each weight block set up once for four
// tokens) or the one-token multi-row kernel once per token (path:rows, what MatMulMany
// did before), same bits either way (tests/kernels/matvec_test.cc) except for F32 / F16 /
// BF16, whose batch sums in tinyBLAS's order and one token in vec_dot's. R = 256: the rows
// stay in L2, so this compares arithmetic. Counter: GMAC/s.
void BM_MatMulTokens(benchmark::State& state, WeightType t, int n_tokens, bool tokens, bool avx2) {
  constexpr int64_t kRows = 256;
  const std::vector<uint8_t> w = RandomRows(t, kRows);
  const size_t rb = kernels::RowBytes(t, kCols);
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<kernels::ActivationRow> acts(static_cast<size_t>(n_tokens));
  std::vector<const void*> ptrs;
  for (kernels::ActivationRow& a : acts) {
    std::vector<float> x(kCols);
    for (float& v : x) v = normal(rng);
    a.Set(x.data(), kCols);
    ptrs.push_back(a.For(t));
  }
  std::vector<float> y(static_cast<size_t>(n_tokens) * kRows);
  const kernels::SimdLevel level = avx2 ? kernels::SimdLevel::kAvx2 : kernels::ActiveSimdLevel();
  // What MatMulMany runs for a chunk: F32 / F16 / BF16 sum as a batch (kernels::TokenSums).
  const kernels::DotRowsTokensFn many = kernels::GetDotRowsTokensFn(t, level, kernels::TokenSums::kBatched);
  const kernels::DotRowsFn one = kernels::GetDotRowsFn(t, level);
  const kernels::DotFn dot = kernels::GetDotFn(t, level);  // for types without a multi-row kernel (IQ4_NL)
  if (many == nullptr) {
    state.SkipWithError("no several-token kernel for this type on this CPU");
    return;
  }
  for (auto _ : state) {
    if (tokens) {
      many(w.data(), rb, kRows, ptrs.data(), n_tokens, kCols, y.data(), kRows);
    } else {
      for (int i = 0; i < n_tokens; ++i) {
        const void* x = ptrs[static_cast<size_t>(i)];
        float* out = y.data() + i * kRows;
        if (one != nullptr) {
          one(w.data(), rb, kRows, x, kCols, out);
        } else {
          for (int64_t r = 0; r < kRows; ++r) out[r] = dot(w.data() + static_cast<size_t>(r) * rb, x, kCols);
        }
      }
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double macs = static_cast<double>(kRows) * kCols * n_tokens * static_cast<double>(state.iterations());
  state.counters["GMACps"] = benchmark::Counter(macs / 1e9, benchmark::Counter::kIsRate);
}

void Register() {
  if (kernels::DetectedSimdLevel() < kernels::SimdLevel::kAvx2) return;
  for (WeightType t : {WeightType::kF32, WeightType::kF16, WeightType::kBF16, WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kIQ4_NL,
                       WeightType::kIQ4_XS, WeightType::kQ5_0, WeightType::kQ4_1, WeightType::kQ5_1, WeightType::kQ2_K,
                       WeightType::kQ3_K, WeightType::kQ4_K, WeightType::kQ5_K, WeightType::kQ6_K}) {
    if (kernels::GetDotRowsTokensFn(t, kernels::ActiveSimdLevel(), kernels::TokenSums::kBatched) == nullptr) continue;
    for (int n : {4, 16, 64}) {
      for (bool tokens : {true, false}) {
        const std::string name = std::string("matmul/") + kernels::WeightTypeName(t) + "/tokens:" + std::to_string(n) +
                                 "/path:" + (tokens ? "tokens" : "rows");
        benchmark::RegisterBenchmark(name.c_str(), BM_MatMulTokens, t, n, tokens, false)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
      }
    }
  }
  // The AVX2 level's several-token kernels (CPUs without AVX-512) against its one-token
  // kernel per row and token.
  for (WeightType t : {WeightType::kQ4_K, WeightType::kQ5_K}) {
    for (int n : {4, 16, 64}) {
      for (bool tokens : {true, false}) {
        const std::string name = std::string("matmul-avx2/") + kernels::WeightTypeName(t) + "/tokens:" +
                                 std::to_string(n) + "/path:" + (tokens ? "tokens" : "rows");
        benchmark::RegisterBenchmark(name.c_str(), BM_MatMulTokens, t, n, tokens, true)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
      }
    }
  }
  // The reference models' output projections: ref-llama 32000 x 256, ref-qwen3moe 151936 x 64.
  for (WeightType t : {WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kQ6_K, WeightType::kF16}) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{32000, 256}, {151936, 64}}) {
      if (cols % kernels::GetWeightTypeInfo(t).block_size != 0) continue;
      const std::string name = std::string("outproj/") + kernels::WeightTypeName(t) + "/" + std::to_string(rows) + "x" +
                               std::to_string(cols);
      for (int threads : {2, 1}) {
        benchmark::RegisterBenchmark((threads == 2 ? name : name + "/threads:1").c_str(), BM_OutputProjection, t, rows,
                                     cols, threads, Path::kBest)
            ->Unit(benchmark::kMicrosecond)
            ->UseManualTime();
      }
      if ((t == WeightType::kQ8_0 || t == WeightType::kQ4_0) && kernels::AvxVnniActive()) {
        for (Path path : {Path::kAvx2, Path::kAvx2Vnni}) {
          benchmark::RegisterBenchmark((name + "/threads:1/path:" + PathName(path)).c_str(), BM_OutputProjection, t,
                                       rows, cols, 1, path)
              ->Unit(benchmark::kMicrosecond)
              ->UseManualTime();
        }
      }
    }
  }
  for (WeightType t : {WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kQ4_K, WeightType::kQ5_K, WeightType::kQ6_K,
                       WeightType::kIQ4_XS, WeightType::kIQ4_NL, WeightType::kQ5_0, WeightType::kQ4_1,
                       WeightType::kQ5_1, WeightType::kQ3_K, WeightType::kQ2_K}) {
    for (int64_t rows : {256, 2048, 8192, 32768}) {
      for (int threads : {1, 2}) {
        for (Path path : {Path::kBest, Path::kAvx2, Path::kAvx2Vnni}) {
          // AVX-VNNI changes only Q8_0's and Q4_0's kernels: the other types' avx2vnni
          // would time their avx2 path again.
          const bool vnni_kernel = t == WeightType::kQ8_0 || t == WeightType::kQ4_0;
          if (path == Path::kAvx2Vnni && !(vnni_kernel && kernels::AvxVnniActive())) continue;
          const std::string name = std::string("matvec/") + kernels::WeightTypeName(t) + "/rows:" +
                                   std::to_string(rows) + "/threads:" + std::to_string(threads) + "/path:" +
                                   PathName(path);
          benchmark::RegisterBenchmark(name.c_str(), BM_MatVec, t, rows, path, threads)
              ->Unit(benchmark::kMicrosecond)
              ->UseRealTime();
        }
      }
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
