// memory/prefetch.h
//
// Software prefetch of a byte range into the L1 cache: one prefetcht0 per 64-byte line
// from p to p + bytes (PrefetchLinesL2: prefetcht1, into L2, for a second, farther
// distance). Used by kernels that stream memory in patterns the hardware
// prefetchers follow poorly (KV blocks run by run, rows of a matrix side by side). The
// range may run past the end of an allocation: a prefetch never faults.
//
// An asm statement, not _mm_prefetch or __builtin_prefetch: GCC 12 deletes a loop whose
// body is only those builtins (it has no side effect to keep), which is how the f16
// attention kernels once ran without a single prefetch instruction. No-op off x86.
//
// Thread-safety: pure.
#pragma once

#include <cstddef>

namespace tierkv {

namespace prefetch_internal {
template <bool kL2>
inline void Lines(const void* p, size_t bytes) {
#if defined(__x86_64__) || defined(__i386__)
  const char* c = static_cast<const char*>(p);
  for (size_t o = 0; o < bytes; o += 64) {
    if constexpr (kL2) {
      asm volatile("prefetcht1 %0" : : "m"(*(c + o)));
    } else {
      asm volatile("prefetcht0 %0" : : "m"(*(c + o)));
    }
  }
#else
  (void)p;
  (void)bytes;
#endif
}
}  // namespace prefetch_internal

inline void PrefetchLines(const void* p, size_t bytes) { prefetch_internal::Lines<false>(p, bytes); }
inline void PrefetchLinesL2(const void* p, size_t bytes) { prefetch_internal::Lines<true>(p, bytes); }

}  // namespace tierkv
