// kernels/kv_layout_hd.h
//
// The stored bytes of the f16, q8_0 and q4_0 KV codecs (kvcache/codec.h), for host and
// device (kernels/hd.h): where value d of a KV head's vector lies in a block's K or V
// run (vector by vector, or keys in 16-key tiles: kernels/kv_codec_simd.h), what it
// decodes to, and the encoders that write one vector, byte for byte as the codecs' host
// Encode / EncodeKeyInTile do. The CUDA executor appends and reads KV with these; the
// CPU tests check them against the codecs.
//
// A run is one KV head's block_tokens vectors of vector_bytes (K, or V). With key tiles,
// token t's key is lane t % 16 of the tile at run + (t / 16) * 16 * vector_bytes:
//   f16   value d at tile + 2 * (16 * d + lane);
//   q8_0, q4_0  per 32-value block b a tile block at tile + b * 16 * block_bytes: the
//         16 lanes' fp16 scales, then payload byte m of lane `lane` at
//         32 + (m / 4) * 64 + 4 * lane + m % 4.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/hd.h"

namespace tierkv::kernels::hd {

// kvcache's KvCodec values (KvCodecDesc::codec_id) these functions read and write.
inline constexpr int kKvF16 = 0, kKvQ8_0 = 1, kKvQ4_0 = 2;
inline constexpr int kKvTileLanes = 16;

TIERKV_HD int KvBlockBytes(int codec) { return codec == kKvQ8_0 ? 34 : 18; }  // q8_0, q4_0
TIERKV_HD size_t KvTilePayloadOffset(int m, int lane) {
  return static_cast<size_t>(2 * kKvTileLanes + (m / 4) * 64 + 4 * lane + m % 4);
}

// Value d of the vector of token t in a run.
TIERKV_HD float KvValue(int codec, const uint8_t* run, size_t vector_bytes, bool tiles, int t, int d) {
  if (!tiles) {
    const uint8_t* v = run + static_cast<size_t>(t) * vector_bytes;
    if (codec == kKvF16) return HdHalfToFloat(static_cast<uint16_t>(v[2 * d] | (v[2 * d + 1] << 8)));
    const uint8_t* blk = v + static_cast<size_t>(d / 32) * KvBlockBytes(codec);
    const float scale = HdHalfToFloat(static_cast<uint16_t>(blk[0] | (blk[1] << 8)));
    const int j = d % 32;
    if (codec == kKvQ8_0) return HdMul(static_cast<float>(static_cast<int8_t>(blk[2 + j])), scale);
    const int nib = j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4);
    return HdMul(static_cast<float>(nib - 8), scale);
  }
  const int lane = t % kKvTileLanes;
  const uint8_t* tile = run + static_cast<size_t>(t / kKvTileLanes) * kKvTileLanes * vector_bytes;
  if (codec == kKvF16) {
    const uint8_t* p = tile + 2 * (static_cast<size_t>(kKvTileLanes) * d + lane);
    return HdHalfToFloat(static_cast<uint16_t>(p[0] | (p[1] << 8)));
  }
  const uint8_t* blk = tile + static_cast<size_t>(d / 32) * kKvTileLanes * KvBlockBytes(codec);
  const float scale = HdHalfToFloat(static_cast<uint16_t>(blk[2 * lane] | (blk[2 * lane + 1] << 8)));
  const int j = d % 32;
  if (codec == kKvQ8_0) return HdMul(static_cast<float>(static_cast<int8_t>(blk[KvTilePayloadOffset(j, lane)])), scale);
  const int nib = j < 16 ? (blk[KvTilePayloadOffset(j, lane)] & 15) : (blk[KvTilePayloadOffset(j - 16, lane)] >> 4);
  return HdMul(static_cast<float>(nib - 8), scale);
}

// Where encoded byte i of a vector goes: at out + i for a vector, or, in a tile, lane
// `lane`'s place (f16: i = 2 * d + byte; q8_0 / q4_0: i = block * block_bytes + offset).
TIERKV_HD uint8_t* KvBytePlace(int codec, uint8_t* out, int lane, int i) {
  if (lane < 0) return out + i;
  if (codec == kKvF16) return out + 2 * (static_cast<size_t>(kKvTileLanes) * (i / 2) + lane) + i % 2;
  const int bb = KvBlockBytes(codec), b = i / bb, o = i % bb;
  uint8_t* blk = out + static_cast<size_t>(b) * kKvTileLanes * bb;
  return o < 2 ? blk + 2 * lane + o : blk + KvTilePayloadOffset(o - 2, lane);
}

// q4_0's code of x * id: the codec's Q4Nibble.
TIERKV_HD uint8_t KvQ4Nibble(float x_times_id) {
  float v = HdAdd(x_times_id, 8.5f);
  v = v >= 0.0f ? v : 0.0f;
  v = v <= 15.0f ? v : 15.0f;
  return static_cast<uint8_t>(static_cast<int>(v));
}

// Encodes the 32 values of block b of x (a q8_0 / q4_0 vector) into its bytes: the
// codec's EncodeQ8Block / EncodeQ4Block. The bytes go through KvBytePlace.
TIERKV_HD void KvEncodeBlock(int codec, const float* x, int b, uint8_t* out, int lane) {
  const float* xb = x + 32 * b;
  const int base = b * KvBlockBytes(codec);
  float d;
  if (codec == kKvQ8_0) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float a = HdAbs(xb[j]);
      amax = a > amax ? a : amax;
    }
    d = HdDiv(amax, 127.0f);
  } else {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float a = HdAbs(xb[j]);
      if (amax < a) {
        amax = a;
        max = xb[j];
      }
    }
    d = HdDiv(max, -8.0f);
  }
  const float id = d != 0.0f ? HdDiv(1.0f, d) : 0.0f;
  const uint16_t dh = HdFloatToHalf(d);
  *KvBytePlace(codec, out, lane, base) = static_cast<uint8_t>(dh & 0xff);
  *KvBytePlace(codec, out, lane, base + 1) = static_cast<uint8_t>(dh >> 8);
  if (codec == kKvQ8_0) {
    for (int j = 0; j < 32; ++j) {
      float v = HdMul(xb[j], id);
      v = v >= -127.0f ? v : -127.0f;
      v = v <= 127.0f ? v : 127.0f;
      *KvBytePlace(codec, out, lane, base + 2 + j) = static_cast<uint8_t>(static_cast<int8_t>(HdRoundHalfAway(v)));
    }
  } else {
    for (int j = 0; j < 16; ++j) {
      const uint8_t lo = KvQ4Nibble(HdMul(xb[j], id)), hi = KvQ4Nibble(HdMul(xb[j + 16], id));
      *KvBytePlace(codec, out, lane, base + 2 + j) = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

// Encodes value d of an f16 vector (both of its bytes).
TIERKV_HD void KvEncodeF16(const float* x, int d, uint8_t* out, int lane) {
  const uint16_t h = HdFloatToHalf(x[d]);
  *KvBytePlace(kKvF16, out, lane, 2 * d) = static_cast<uint8_t>(h & 0xff);
  *KvBytePlace(kKvF16, out, lane, 2 * d + 1) = static_cast<uint8_t>(h >> 8);
}

}  // namespace tierkv::kernels::hd
