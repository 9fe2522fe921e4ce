// bench/tokenizer_bench.cc
//
// Tokenizer speed on the reference vocabularies: encoding the reference prompt P3
// (11,939 bytes of numbered English lines) and the same text 100 times over (1.2 MB),
// with the llama-spm vocabulary (SentencePiece merges by score) and the qwen3 one
// (byte-level BPE with the qwen2 pre-tokenizer). Also decoding P3's tokens back, and
// loading each vocabulary from its GGUF. The vocabularies and the prompt come from
// $TIERKV_REFERENCE_DIR (default /work/shared/reference: models/ and vectors/).
//
//   ./build/release/bench/tokenizer_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <nlohmann/json.hpp>

#include "runtime/gguf.h"
#include "runtime/tokenizer.h"

namespace tierkv {
namespace {

namespace fs = std::filesystem;

std::string ReferenceDir() {
  const char* d = std::getenv("TIERKV_REFERENCE_DIR");
  return d ? d : "/work/shared/reference";
}

struct Vocab {
  const char* name;        // as the vectors call it
  const char* model_file;  // a model file that carries the vocabulary
  const char* vectors;     // its vectors (for the prompt)
};
constexpr Vocab kVocabs[] = {
    {"llama-spm", "ref-llama-f16.gguf", "ref-llama-f16.json"},
    {"qwen3", "ref-qwen3moe-f16.gguf", "ref-qwen3moe-f16.json"},
};

std::string PromptP3(const Vocab& v) {
  std::ifstream in(fs::path(ReferenceDir()) / "vectors" / v.vectors);
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(ss.str());  // alive for the loop (C++20 range-for)
  for (const auto& c : j["cases"]) {
    if (c["id"] == "P3") return c["prompt"].get<std::string>();
  }
  return {};
}

std::unique_ptr<Tokenizer> Load(const Vocab& v) {
  auto file = GgufFile::Open((fs::path(ReferenceDir()) / "models" / v.model_file).string());
  if (!file.ok()) return nullptr;
  auto tok = Tokenizer::FromGguf(**file);
  return tok.ok() ? std::move(tok).value() : nullptr;
}

void BM_Encode(benchmark::State& state, const Vocab& v, int copies) {
  const std::unique_ptr<Tokenizer> tok = Load(v);
  std::string text;
  for (int i = 0; i < copies; ++i) text += PromptP3(v);
  if (tok == nullptr || text.empty()) {
    state.SkipWithError("reference vocabulary or prompt not found");
    return;
  }
  size_t n = 0;
  for (auto _ : state) {
    n = tok->Encode(text, /*add_special=*/true, /*parse_special=*/false).size();
    benchmark::DoNotOptimize(n);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(text.size()));
  state.counters["tokens"] = static_cast<double>(n);
  state.counters["bytes"] = static_cast<double>(text.size());
}

void BM_Decode(benchmark::State& state, const Vocab& v) {
  const std::unique_ptr<Tokenizer> tok = Load(v);
  const std::string text = PromptP3(v);
  if (tok == nullptr || text.empty()) {
    state.SkipWithError("reference vocabulary or prompt not found");
    return;
  }
  const std::vector<int32_t> ids = tok->Encode(text, false, false);
  for (auto _ : state) benchmark::DoNotOptimize(tok->Decode(ids));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(text.size()));
  state.counters["tokens"] = static_cast<double>(ids.size());
}

void BM_Load(benchmark::State& state, const Vocab& v) {
  for (auto _ : state) {
    if (Load(v) == nullptr) {
      state.SkipWithError("reference vocabulary not found");
      return;
    }
  }
}

}  // namespace
}  // namespace tierkv

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  for (const tierkv::Vocab& v : tierkv::kVocabs) {
    const std::string n = v.name;
    benchmark::RegisterBenchmark(("encode/" + n + "/P3").c_str(), tierkv::BM_Encode, v, 1)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("encode/" + n + "/P3x100").c_str(), tierkv::BM_Encode, v, 100)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("decode/" + n + "/P3").c_str(), tierkv::BM_Decode, v)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("load/" + n).c_str(), tierkv::BM_Load, v)->Unit(benchmark::kMillisecond);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
