// tests/runtime/model_test_util.h
//
// Running a model over a token sequence in tests: the logits after each token, with the
// weights read in place (no paging) and an f16 KV cache on a small host tier.
#pragma once

#include <algorithm>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "kvcache/kv_cache.h"
#include "memory/memory_manager.h"
#include "runtime/gguf.h"
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

}  // namespace tierkv::testing
