// tests/runtime/model_test_util.h
//
// Running a model over a token sequence in tests: the logits after each token, with the
// weights read in place (no paging) and an f16 KV cache on a small host tier.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu_features.h"
#include "kernels/quant.h"
#include "kvcache/kv_cache.h"
#include "memory/memory_manager.h"
#include "runtime/builtin_model.h"
#include "runtime/gguf.h"
#include "runtime/gguf_writer.h"
#include "runtime/model.h"

namespace tierkv::testing {

// Logits after each of `tokens` (positions 0, 1, ...); empty when the model does not
// load (the failure is reported). block_tokens 0: the geometry's default. chunk 0: one
// Forward per token; else ForwardBatch over chunks of that many tokens.
inline std::vector<std::vector<float>> LogitsAfterEachToken(std::shared_ptr<const GgufFile> file,
                                                            const std::vector<int>& tokens, int threads,
                                                            int block_tokens = 0, int chunk = 0) {
  ModelOptions mo;
  mo.threads = threads;
  auto model = Model::Load(std::move(file), mo);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  if (!model.ok()) return {};
  MemoryOptions mem;
  mem.host_bytes = 32 * kMiB;
  mem.frame_bytes = 64 * kKiB;
  mem.warmup = false;
  mem.mlock = MlockMode::kOff;
  auto mm = std::move(MemoryManager::Create(mem)).value();
  auto cache = std::move(KvCache::Create(mm.get(), (*model)->KvGeometryFor(KvCodec::kF16, block_tokens))).value();
  const SeqId seq = cache->NewSequence();
  std::vector<std::vector<float>> out;
  const size_t n_vocab = static_cast<size_t>((*model)->config().n_vocab);
  std::vector<float> logits(n_vocab);
  for (size_t i = 0; i < tokens.size() && chunk <= 0; ++i) {
    const Status s = (*model)->Forward(*cache, seq, tokens[i], static_cast<int>(i), logits);
    EXPECT_TRUE(s.ok()) << s.ToString();
    out.push_back(logits);
  }
  for (size_t i = 0; i < tokens.size() && chunk > 0; i += static_cast<size_t>(chunk)) {
    const size_t n = std::min(static_cast<size_t>(chunk), tokens.size() - i);
    const std::vector<int32_t> ids(tokens.begin() + static_cast<ptrdiff_t>(i),
                                   tokens.begin() + static_cast<ptrdiff_t>(i + n));
    std::vector<int> rows(n);
    for (size_t r = 0; r < n; ++r) rows[r] = static_cast<int>(r);
    logits.resize(n * n_vocab);
    const Status s = (*model)->ForwardBatch(*cache, seq, ids, static_cast<int>(i), rows, logits);
    EXPECT_TRUE(s.ok()) << s.ToString();
    for (size_t r = 0; r < n; ++r) {
      out.emplace_back(logits.begin() + static_cast<ptrdiff_t>(r * n_vocab),
                       logits.begin() + static_cast<ptrdiff_t>((r + 1) * n_vocab));
    }
  }
  return out;
}

// A prefill in chunks of `file` (whose matrices are of `type`) against `steps`, the logits
// of one Forward per token. Where a batch sums `type` as one token does (the quantized
// types; every type below the AVX-512 level) the bits are the same. Where it does not
// (F32, F16, BF16 at AVX-512: kernels::TokenSums) they are the same for any chunking, and
// within max_abs of the steps.
inline void ExpectChunkedPrefill(const std::shared_ptr<const GgufFile>& file, const std::vector<int>& tokens,
                                 int threads, int block_tokens, kernels::WeightType type,
                                 const std::vector<std::vector<float>>& steps, double max_abs) {
  const auto chunked = LogitsAfterEachToken(file, tokens, threads, block_tokens, /*chunk=*/5);
  if (!kernels::BatchedSumsDiffer(type, kernels::ActiveSimdLevel())) {
    EXPECT_EQ(chunked, steps) << "a prefill in chunks changed the bits";
    return;
  }
  EXPECT_EQ(LogitsAfterEachToken(file, tokens, threads, block_tokens, /*chunk=*/7), chunked)
      << "two chunkings gave different bits";
  ASSERT_EQ(chunked.size(), steps.size());
  double worst = 0;
  for (size_t t = 0; t < steps.size(); ++t) {
    for (size_t i = 0; i < steps[t].size(); ++i) worst = std::max(worst, std::fabs(double{chunked[t][i]} - steps[t][i]));
  }
  EXPECT_GT(worst, 0.0) << "batched sums were expected to differ from one token's";
  EXPECT_LT(worst, max_abs);
}

// Small models built in memory, for the header-size tests and their fuzz corpus: a
// qwen3moe carrying feed_forward_length as real files do (Qwen3-30B-A3B: 6144) although
// no layer has a dense FFN, and a llama (context_length 262144, the builder's).
inline GgufWriter SmallMoeWriter() {
  SyntheticMoeShape s;
  s.n_vocab = 258;  // the byte-level vocabulary's (tokenizer.ggml.model "none")
  s.n_embd = 64;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.head_dim = 16;
  s.n_expert = 8;
  s.n_expert_used = 2;
  s.n_ff_exp = 64;
  s.context_length = 4096;
  auto file = BuildSyntheticMoe(s);
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  GgufWriter w = GgufWriter::CopyOf(**file);
  w.U32("qwen3moe.feed_forward_length", 6144);
  return w;
}

inline GgufWriter SmallLlamaWriter() {
  SyntheticLlamaShape s;
  s.n_embd = 64;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.head_dim = 16;
  s.n_ff = 128;
  auto file = BuildSyntheticLlama(s);
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  return GgufWriter::CopyOf(**file);
}

}  // namespace tierkv::testing
