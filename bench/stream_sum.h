// bench/stream_sum.h
//
// The plain streaming read the bench tools compare kernels with: a sum of 64-bit words
// with four independent accumulators (256-bit where the CPU has AVX2), enough loads in
// flight to be bound by the memory system, not by the adds. Header-only: each bench is
// its own executable.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/thread_pool.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace tierkv::bench {

inline uint64_t SumWordsScalar(const uint64_t* p, size_t n) {
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += p[i];
    s1 += p[i + 1];
    s2 += p[i + 2];
    s3 += p[i + 3];
  }
  for (; i < n; ++i) s0 += p[i];
  return s0 + s1 + s2 + s3;
}

#if defined(__x86_64__) || defined(_M_X64)
__attribute__((target("avx2"))) inline uint64_t SumWordsAvx2(const uint64_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + SumWordsScalar(p + i, n - i);
}
#endif

// The sum of the n 64-bit words at p (8-byte aligned).
inline uint64_t SumWords(const uint64_t* p, size_t n) {
#if defined(__x86_64__) || defined(_M_X64)
  static const bool avx2 = kernels::CpuHas().avx2;
  if (avx2) return SumWordsAvx2(p, n);
#endif
  return SumWordsScalar(p, n);
}

// SumWords over n words in `chunks` contiguous pieces of whole 64-byte lines, run on
// `pool`: the same-size read the benches divide by, on the threads of the kernels they
// compare (their cache effects alike).
inline uint64_t ParallelSumWords(kernels::ThreadPool& pool, const uint64_t* p, size_t n, int64_t chunks) {
  const size_t step = (n / static_cast<size_t>(chunks) + 7) / 8 * 8;
  std::vector<uint64_t> sums(static_cast<size_t>(chunks), 0);
  pool.ParallelFor(chunks, [&](int64_t c) {
    const size_t b = std::min(n, static_cast<size_t>(c) * step);
    const size_t e = c + 1 == chunks ? n : std::min(n, b + step);
    sums[static_cast<size_t>(c)] = SumWords(p + b, e - b);
  });
  uint64_t s = 0;
  for (uint64_t v : sums) s += v;
  return s;
}

}  // namespace tierkv::bench
