// bench/kv_fill.h
//
// A sequence's KV cache filled to a chosen depth without forward passes: the benches
// that time a step at depth D (decode_bench, prefill_bench) write deterministic random
// K/V (uniform in [-1, 1)) with KvCache::Write. Header-only: each bench is its own
// executable.
#pragma once

#include <cstdint>
#include <vector>

#include "kvcache/kv_cache.h"
#include "memory/memory_manager.h"
#include "memory/status.h"

namespace tierkv::bench {

// Memory options whose Host tier holds the f16 KV of `tokens` tokens of geometry g,
// plus an eighth and 16 frames for partly filled last blocks; no mlock (ulimit -l is
// small on the bench machines).
inline MemoryOptions KvHostMemory(const KvGeometry& g, uint64_t tokens, uint64_t frame_bytes) {
  const uint64_t token_bytes = 2ull * g.n_layers * g.n_kv_heads * g.head_dim * 2;  // f16
  MemoryOptions mem;
  mem.frame_bytes = frame_bytes;
  mem.host_bytes = token_bytes * tokens * 9 / 8 + 16 * frame_bytes;
  mem.host_bytes = (mem.host_bytes + frame_bytes - 1) / frame_bytes * frame_bytes;
  mem.mlock = MlockMode::kOff;
  return mem;
}

// xorshift64: the benches' deterministic stream (x must start non-zero).
inline uint64_t XorShift(uint64_t& x) {
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return x;
}

// Grows or cuts `seq` to `depth` tokens; new tokens get K/V uniform in [-1, 1) drawn
// from *rng.
inline Status FillKvTo(KvCache& cache, SeqId seq, int depth, uint64_t* rng) {
  const int length = cache.Length(seq);
  if (length >= depth) return cache.Truncate(seq, depth);
  const KvGeometry& g = cache.geometry();
  std::vector<float> k(static_cast<size_t>(g.n_kv_heads * g.head_dim)), v(k.size());
  auto uniform = [&] { return static_cast<float>(static_cast<int64_t>(XorShift(*rng) >> 40) - (1 << 23)) / (1 << 23); };
  for (int pos = length; pos < depth; ++pos) {
    TIERKV_ASSIGN_OR_RETURN(const int at, cache.AppendToken(seq));
    (void)at;
    for (int l = 0; l < g.n_layers; ++l) {
      for (size_t i = 0; i < k.size(); ++i) {
        k[i] = uniform();
        v[i] = uniform();
      }
      TIERKV_RETURN_IF_ERROR(cache.Write(seq, l, pos, k.data(), v.data()));
    }
  }
  return Status::Ok();
}

}  // namespace tierkv::bench
