// kernels/kv_vector_kernels.h
//
// What attention and the KV append need from a KV codec (kvcache/codec.h, whose
// VectorCodec implements it): encode one K or V vector into its stored bytes, and the
// dot products and weighted sums over stored vectors that paged attention runs on
// (kernels/attention.h has the arithmetic; the per-member contracts are VectorCodec's).
// It lives here so that executors (kernels/executor.h) and the attention kernels take a
// codec without kernels/ depending on kvcache/.
//
// KvCodecDesc is the codec's plain, device-portable description: a device executor
// builds its own kernels from it (codec id, head_dim, the tq rotation's seed) and never
// calls the virtual members, which run on the host.
//
// Thread-safety: implementations are immutable; every member is const.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tierkv::kernels {

struct KvCodecDesc {
  int codec_id = 0;  // kvcache's KvCodec value (0 f16, 1 q8_0, 2 q4_0, 3 tq4, 4 tq3)
  int head_dim = 0;
  uint64_t seed = 0;  // picks the tq rotation
  size_t vector_bytes = 0;
};

class KvVectorKernels {
 public:
  virtual ~KvVectorKernels() = default;

  const KvCodecDesc& desc() const { return desc_; }
  int head_dim() const { return desc_.head_dim; }
  size_t vector_bytes() const { return desc_.vector_bytes; }

  virtual void Encode(const float* x, void* out) const = 0;
  virtual void Decode(const void* in, float* out) const = 0;
  virtual void PrepareQuery(const float* q, float* q_prep) const = 0;
  virtual float Dot(const float* q_prep, const void* k_enc) const = 0;
  virtual void Accumulate(float w, const void* v_enc, float* acc) const = 0;
  virtual void FinishOutput(const float* acc, float* out) const = 0;
  virtual void DotMany(const float* q_prep, const void* k_enc, size_t n, float* scores) const = 0;
  virtual void AccumulateMany(const float* w, const void* v_enc, size_t n, float* acc) const = 0;
  virtual void EncodeMany(const float* x, size_t n, void* out) const = 0;
  virtual void DecodeMany(const void* in, size_t n, float* out) const = 0;
  virtual void DotManyGroup(const float* q_prep, int heads, const void* k_enc, size_t n, float* scores,
                            size_t scores_stride) const = 0;
  virtual void AccumulateManyGroup(const float* w, size_t w_stride, int heads, const void* v_enc, size_t n,
                                   float* acc) const = 0;
  virtual void AccumulateManyGroupRuns(const float* w, size_t w_stride, int heads, int runs, const void* v_enc,
                                       size_t run_stride, size_t n, float* acc) const = 0;

  // Key tiles: kKeyTileTokens consecutive keys stored dimension by dimension.
  static constexpr int kKeyTileTokens = 16;
  virtual bool KeyTiles(int block_tokens) const = 0;
  virtual void EncodeKeyInTile(const float* x, void* tile, int lane) const = 0;
  virtual void DecodeKeyInTile(const void* tile, int lane, float* out) const = 0;
  virtual void DotManyGroupTiled(const float* q_prep, int heads, const void* k_tiles, size_t n, float* scores,
                                 size_t scores_stride) const = 0;

  // Decoded runs (optional). A codec whose vectors cost more to read than f16's (tq's
  // codebook lookups) may decode a block's run of n vectors once, for the queries of a
  // prefill chunk to read many times (kernels/attention.h, the *Multi forms).
  // DecodedRunBytes(n, keys): the decoded form's bytes, 0 for none (the default); keys
  // picks a layout for scores or for weighted sums. DecodeRun fills one; the *Decoded
  // forms read vectors [0, n) of a run decoded from run_n >= n vectors and give
  // DotManyGroup's / AccumulateManyGroup's bits over the encoded run.
  virtual size_t DecodedRunBytes(size_t n, bool keys) const { return 0; }
  virtual void DecodeRun(const void* enc, size_t n, bool keys, void* decoded) const {}
  virtual void DotManyGroupDecoded(const float* q_prep, int heads, const void* decoded, size_t run_n, size_t n,
                                   float* scores, size_t scores_stride) const {}
  virtual void AccumulateManyGroupDecoded(const float* w, size_t w_stride, int heads, const void* decoded,
                                          size_t run_n, size_t n, float* acc) const {}

  virtual const char* kernel_name() const = 0;

 protected:
  explicit KvVectorKernels(const KvCodecDesc& desc) : desc_(desc) {}
  KvVectorKernels(const KvVectorKernels&) = delete;
  KvVectorKernels& operator=(const KvVectorKernels&) = delete;

 private:
  const KvCodecDesc desc_;
};

// Where one token's K/V go in a block (kvcache's KvCache::PrepareWrite fills it): KV
// head h's key at k + h * head_stride bytes (with key tiles: lane `tile_lane` of the
// tile starting there), its value at v + h * head_stride.
struct KvWriteSlot {
  std::byte* k = nullptr;
  std::byte* v = nullptr;
  size_t head_stride = 0;
  int n_kv_heads = 0;
  int tile_lane = -1;  // -1: keys stored vector by vector
};

// k, v [n_kv_heads][head_dim] encoded into `slot` on the host (the CPU executor's
// AppendKv, and KvCache::Write).
inline void EncodeKvSlot(const KvVectorKernels& codec, const KvWriteSlot& slot, const float* k, const float* v) {
  const size_t hd = static_cast<size_t>(codec.head_dim());
  for (int h = 0; h < slot.n_kv_heads; ++h) {
    const size_t off = static_cast<size_t>(h) * slot.head_stride;
    const float* kh = k + static_cast<size_t>(h) * hd;
    if (slot.tile_lane >= 0) {
      codec.EncodeKeyInTile(kh, slot.k + off, slot.tile_lane);
    } else {
      codec.Encode(kh, slot.k + off);
    }
    codec.Encode(v + static_cast<size_t>(h) * hd, slot.v + off);
  }
}

}  // namespace tierkv::kernels
