// tests/kvcache/checksum_test.cc
//
// The session files' checksum against the distribution's XXH3-64 (libxxhash's generic
// build): the same bits for every length around the AVX2 variant's block and stripe
// boundaries, at every alignment, and a known answer.
#include "kvcache/checksum.h"

#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>
#include <xxhash.h>

namespace tierkv {
namespace {

TEST(ChecksumTest, KnownAnswer) {
  // XXH3-64 of the empty input with seed 0 (xxHash's reference value).
  EXPECT_EQ(Checksum(nullptr, 0), 0x2D06800538D394C2ull);
  EXPECT_EQ(Checksum("", 0), XXH3_64bits("", 0));
  EXPECT_NE(Checksum("a", 1), Checksum("b", 1));
}

TEST(ChecksumTest, EqualsXxh3AtEveryLengthAndAlignment) {
  std::mt19937_64 rng(20261206);
  std::vector<uint8_t> data(1 << 20);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 2048; ++n) lengths.push_back(n);
  for (size_t n : {4095u, 4096u, 4097u, 65535u, 65536u, 262144u + 7u, 1000000u}) lengths.push_back(n);
  for (const size_t n : lengths) {
    for (const size_t offset : {0u, 1u, 7u}) {
      if (offset + n > data.size()) continue;
      ASSERT_EQ(Checksum(data.data() + offset, n), XXH3_64bits(data.data() + offset, n))
          << "length " << n << " offset " << offset;
    }
  }
}

TEST(ChecksumTest, ChangesWithAnyByte) {
  std::vector<uint8_t> data(4096, 0x5A);
  const uint64_t base = Checksum(data.data(), data.size());
  for (size_t at : {0u, 1u, 63u, 64u, 1000u, 4095u}) {
    data[at] ^= 1;
    EXPECT_NE(Checksum(data.data(), data.size()), base) << at;
    data[at] ^= 1;
  }
  EXPECT_EQ(Checksum(data.data(), data.size()), base);
}

}  // namespace
}  // namespace tierkv
