// bench/codec_model_bench.cc
//
// KV codecs on real activations: each reference model decodes the same prompt with
// every KV codec; the logits of the last positions are compared with the f16-KV run
// (relative L2 error of the logits, and how often the top-1 token agrees). This is
// the end-to-end effect of the codec on a model's own K/V, not a synthetic one.
//
//   ./build/release/bench/codec_model_bench [../shared/reference]
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/model.h"
#include "runtime/sampler.h"

namespace tierkv {
namespace {

constexpr int kCompared = 64;  // last positions whose logits are compared

Result<std::vector<std::vector<float>>> LastLogits(std::shared_ptr<const GgufFile> file, KvCodec codec,
                                                   const std::vector<int32_t>& tokens) {
  MemoryOptions mo;
  mo.host_bytes = 256 << 20;
  mo.mlock = MlockMode::kOff;
  TIERKV_ASSIGN_OR_RETURN(auto mm, MemoryManager::Create(mo));
  ModelOptions opt;
  TIERKV_ASSIGN_OR_RETURN(auto model, Model::Load(file, opt));
  TIERKV_ASSIGN_OR_RETURN(auto cache, KvCache::Create(mm.get(), model->KvGeometryFor(codec)));
  const SeqId seq = cache->NewSequence();
  std::vector<std::vector<float>> out;
  std::vector<float> logits(static_cast<size_t>(model->config().n_vocab));
  const int n = static_cast<int>(tokens.size());
  for (int pos = 0; pos < n; ++pos) {
    const bool want = pos >= n - kCompared;
    TIERKV_RETURN_IF_ERROR(model->Forward(*cache, seq, tokens[static_cast<size_t>(pos)], pos,
                                          want ? std::span<float>(logits) : std::span<float>()));
    if (want) out.push_back(logits);
  }
  return out;
}

}  // namespace
}  // namespace tierkv

int main(int argc, char** argv) {
  using namespace tierkv;
  const std::string ref = argc > 1 ? argv[1] : "../shared/reference";
  if (!std::filesystem::exists(ref)) {
    std::fprintf(stderr, "no reference models at %s\n", ref.c_str());
    return 0;
  }
  std::printf("| model | codec | bits/value | logit rel. error vs f16 KV | top-1 agreement |\n|---|---|---:|---:|---:|\n");
  for (const char* name : {"ref-llama-f16", "ref-qwen3moe-f16"}) {
    std::ifstream in(ref + "/vectors/" + name + ".json");
    const auto j = nlohmann::json::parse(in);
    const auto tokens = j["cases"][2]["prompt_ids"].get<std::vector<int32_t>>();  // P3, ~3K tokens
    auto file = GgufFile::Open(ref + "/models/" + name + ".gguf");
    if (!file.ok()) {
      std::fprintf(stderr, "error: %s\n", file.status().message().c_str());
      return 1;
    }
    std::shared_ptr<const GgufFile> shared = std::move(file).value();
    auto base = LastLogits(shared, KvCodec::kF16, tokens);
    if (!base.ok()) {
      std::fprintf(stderr, "error: %s\n", base.status().message().c_str());
      return 1;
    }
    for (KvCodec codec : kAllKvCodecs) {
      auto got = LastLogits(shared, codec, tokens);
      if (!got.ok()) {
        std::fprintf(stderr, "error: %s\n", got.status().message().c_str());
        return 1;
      }
      double num = 0, den = 0;
      int agree = 0;
      for (size_t p = 0; p < base->size(); ++p) {
        const auto& a = (*base)[p];
        const auto& b = (*got)[p];
        for (size_t i = 0; i < a.size(); ++i) {
          num += (a[i] - b[i]) * static_cast<double>(a[i] - b[i]);
          den += a[i] * static_cast<double>(a[i]);
        }
        agree += Argmax(a) == Argmax(b);
      }
      const auto vc = VectorCodec::Create(codec, 32, 0);
      std::printf("| %s | %s | %.3f | %.4f | %d/%zu |\n", name, KvCodecName(codec), (*vc)->bits_per_value(),
                  std::sqrt(num / den), agree, base->size());
      std::fflush(stdout);
    }
  }
  return 0;
}
