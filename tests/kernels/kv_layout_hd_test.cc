// tests/kernels/kv_layout_hd_test.cc
//
// The CUDA executor's KV bytes (kernels/kv_layout_hd.h) run on the CPU against the
// codecs (kvcache/codec.h): the encoders write the bytes of Encode / EncodeKeyInTile,
// and KvValue reads back what Decode / DecodeKeyInTile give, vector by vector and in
// 16-key tiles, for f16, q8_0 and q4_0 at head_dim 64 and 128.
#include "kernels/kv_layout_hd.h"

#include <bit>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kvcache/codec.h"

namespace tierkv::kernels {
namespace {

std::vector<float> Values(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = nd(rng) * (seed % 3 == 0 ? 1e-3f : 1.0f);
  if (seed % 5 == 0) std::fill(x.begin(), x.begin() + 32, 0.0f);  // an all-zero block
  return x;
}

// The encoders of kv_layout_hd.h over one vector, in place `lane` (-1: a vector).
void EncodeHd(int codec, const float* x, int head_dim, uint8_t* out, int lane) {
  if (codec == hd::kKvF16) {
    for (int d = 0; d < head_dim; ++d) hd::KvEncodeF16(x, d, out, lane);
  } else {
    for (int b = 0; b < head_dim / 32; ++b) hd::KvEncodeBlock(codec, x, b, out, lane);
  }
}

TEST(KvLayoutHdTest, EncodersAndReadersAreTheCodecs) {
  for (KvCodec c : {KvCodec::kF16, KvCodec::kQ8_0, KvCodec::kQ4_0}) {
    for (int head_dim : {64, 128}) {
      SCOPED_TRACE(std::string(KvCodecName(c)) + ", head_dim " + std::to_string(head_dim));
      auto codec = VectorCodec::Create(c, head_dim, 0).value();
      const int id = static_cast<int>(c);
      const size_t vb = codec->vector_bytes();
      ASSERT_TRUE(codec->KeyTiles(16));
      // A run of 32 tokens: vectors, and keys in two tiles.
      std::vector<uint8_t> want_run(32 * vb), got_run(32 * vb), want_tiles(32 * vb), got_tiles(32 * vb);
      for (int t = 0; t < 32; ++t) {
        const std::vector<float> x = Values(head_dim, 100 * head_dim + t);
        codec->Encode(x.data(), want_run.data() + t * vb);
        EncodeHd(id, x.data(), head_dim, got_run.data() + t * vb, -1);
        codec->EncodeKeyInTile(x.data(), want_tiles.data() + (t / 16) * 16 * vb, t % 16);
        EncodeHd(id, x.data(), head_dim, got_tiles.data() + (t / 16) * 16 * vb, t % 16);
      }
      ASSERT_EQ(got_run, want_run) << "vectors";
      ASSERT_EQ(got_tiles, want_tiles) << "key tiles";
      std::vector<float> want(static_cast<size_t>(head_dim));
      for (int t = 0; t < 32; ++t) {
        codec->Decode(want_run.data() + t * vb, want.data());
        for (int d = 0; d < head_dim; ++d) {
          ASSERT_EQ(std::bit_cast<uint32_t>(hd::KvValue(id, want_run.data(), vb, false, t, d)),
                    std::bit_cast<uint32_t>(want[d]))
              << "vector " << t << " value " << d;
        }
        codec->DecodeKeyInTile(want_tiles.data() + (t / 16) * 16 * vb, t % 16, want.data());
        for (int d = 0; d < head_dim; ++d) {
          ASSERT_EQ(std::bit_cast<uint32_t>(hd::KvValue(id, want_tiles.data(), vb, true, t, d)),
                    std::bit_cast<uint32_t>(want[d]))
              << "tiled key " << t << " value " << d;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tierkv::kernels
