// kvcache/checksum.cc
#include "kvcache/checksum.h"

#include <xxhash.h>

#include "kernels/cpu_features.h"

namespace tierkv {

uint64_t ChecksumAvx2(const void* data, size_t bytes);  // checksum_avx2.cc (-mavx2)

uint64_t Checksum(const void* data, size_t bytes) {
  static const bool avx2 = kernels::CpuHas().avx2;
  return avx2 ? ChecksumAvx2(data, bytes) : XXH3_64bits(data, bytes);
}

}  // namespace tierkv
