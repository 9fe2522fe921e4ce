// tests/runtime/model_test_util.h
//
// Running a model over a token sequence in tests: the logits after each token, with the
// weights read in place (no paging) and an f16 KV cache on a small host tier.
#pragma once

#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "kvcache/kv_cache.h"
#include "memory/memory_manager.h"
#include "runtime/gguf.h"
#include "runtime/model.h"

namespace tierkv::testing {

// Logits after each of `tokens` (positions 0, 1, ...); empty when the model does not
// load (the failure is reported). block_tokens 0: the geometry's default.
inline std::vector<std::vector<float>> LogitsAfterEachToken(std::shared_ptr<const GgufFile> file,
                                                            const std::vector<int>& tokens, int threads,
                                                            int block_tokens = 0) {
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
  std::vector<float> logits(static_cast<size_t>((*model)->config().n_vocab));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const Status s = (*model)->Forward(*cache, seq, tokens[i], static_cast<int>(i), logits);
    EXPECT_TRUE(s.ok()) << s.ToString();
    out.push_back(logits);
  }
  return out;
}

}  // namespace tierkv::testing
