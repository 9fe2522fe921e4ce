// kvcache/checksum.h
//
// The block and manifest checksum of session files: XXH3-64 (seed 0). The AVX2 variant
// (twice the speed of the distribution's generic build here) is chosen at run time; the
// result is the same bits either way. Thread-safety: pure function.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tierkv {

uint64_t Checksum(const void* data, size_t bytes);

}  // namespace tierkv
