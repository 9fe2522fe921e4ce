// kvcache/checksum_avx2.cc
//
// XXH3 compiled for AVX2 (this file alone is built with -mavx2; its only entry point is
// called after a run-time CPU check in checksum.cc).
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

namespace tierkv {

uint64_t ChecksumAvx2(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

}  // namespace tierkv
