// tests/kvcache/kv_test_util.h
//
// Small KV caches on small three-tier memory for tests.
#pragma once

#include <random>
#include <vector>

#include "kvcache/kv_cache.h"
#include "kvcache/session_file.h"
#include "tests/memory/mm_test_util.h"

namespace tierkv::testing {

inline KvGeometry SmallGeometry(KvCodec codec = KvCodec::kF16) {
  KvGeometry g;
  g.n_layers = 2;
  g.n_kv_heads = 2;
  g.head_dim = 32;
  g.block_tokens = 8;
  g.codec = codec;
  return g;
}

// Models as sessions and the remote tier name them, and prompt token ids.
inline const ModelFingerprint kModel{0x1234abcd, "test-model (2 layers)"};
inline const ModelFingerprint kOtherModel{0x9999, "other-model"};
inline std::vector<int32_t> Tokens(int n, int salt = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (i * 37 + salt) % 1000;
  return t;
}

// One token's K or V for one layer: [n_kv_heads][head_dim], deterministic in (seed, pos, layer).
inline std::vector<float> TokenKv(const KvGeometry& g, uint64_t seed, int pos, int layer, bool value) {
  std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(pos) * 131 + static_cast<uint64_t>(layer) * 7 + value);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(g.n_kv_heads) * g.head_dim);
  for (auto& v : x) v = nd(rng);
  return x;
}

// Appends tokens [from, to) of a deterministic stream to s.
inline void AppendTokens(KvCache& cache, SeqId s, int from, int to, uint64_t seed) {
  const KvGeometry& g = cache.geometry();
  for (int pos = from; pos < to; ++pos) {
    auto p = cache.AppendToken(s);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    ASSERT_EQ(*p, pos);
    for (int l = 0; l < g.n_layers; ++l) {
      ASSERT_TRUE(cache.Write(s, l, pos, TokenKv(g, seed, pos, l, false).data(), TokenKv(g, seed, pos, l, true).data()).ok());
    }
  }
}

// The exact bytes of every block of s (read through Acquire on the Host tier).
inline std::vector<std::vector<std::byte>> BlockBytes(KvCache& cache, SeqId s) {
  std::vector<std::vector<std::byte>> out;
  for (int l = 0; l < cache.geometry().n_layers; ++l) {
    for (int b = 0; b < cache.NumBlocks(s); ++b) {
      auto pin = cache.memory().Acquire(cache.BlockPage(s, l, b), Tier::kHost);
      EXPECT_TRUE(pin.ok()) << pin.status().ToString();
      if (!pin.ok()) return out;
      out.emplace_back(pin->data(), pin->data() + cache.block_bytes());
    }
  }
  return out;
}

}  // namespace tierkv::testing
