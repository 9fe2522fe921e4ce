// kvcache/kv_cache.h
//
// The KV cache on paged memory. A block is `block_tokens` consecutive tokens of one
// sequence's K and V for one layer, stored in one page of the MemoryManager, so blocks
// move between tiers under the shared budget like any page. Per-layer blocks let the
// decoder stream one layer's KV at a time.
//
// Block layout (one page, HND; vb = codec vector bytes):
//   K: [n_kv_heads][block_tokens][vb]  then  V: [n_kv_heads][block_tokens][vb]
// except that when the codec takes key tiles for this block size (f16 with head_dim % 8
// == 0, q8_0 and q4_0; block_tokens % 16 == 0: VectorCodec::KeyTiles, key_tiles() here)
// each KV head's K run is block_tokens / 16 tiles of 16 keys stored dimension by
// dimension (f16: [head_dim][16] halves; q8_0/q4_0: kernels/kv_codec_simd.h; the same
// bytes per run): attention's scores then need no horizontal sums (docs/kernels.md). V
// is always vector by vector.
// Sequences own per-layer block tables; Fork shares every block copy-on-write (reference
// counts); the first write into a shared block copies it. Each block also has a key
// summary (per-channel min and max of its keys, in host memory beside the block table)
// for selective attention; after Truncate a summary may be looser than the keys it
// covers, never tighter (still a valid bound). Blocks restored from a session file have
// no summary (KeyMin/KeyMax return nullptr: unbounded) so that restore stays
// O(metadata); they are not recomputed when such a block is written again.
//
// Invariants (CheckInvariants):
//   refs(b) == number of (sequence, layer, index) table entries naming b
//   every sequence's layer tables have ceil(length / block_tokens) blocks
//
// Thread-safety: not thread-safe; one decoder thread drives a KvCache. The pages it
// owns are thread-safe through the MemoryManager.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvcache/codec.h"
#include "memory/memory_manager.h"

namespace tierkv {

struct SeqIdTag {};
using SeqId = StrongId<SeqIdTag>;
struct BlockIdTag {};
using BlockId = StrongId<BlockIdTag>;

struct KvGeometry {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  // 0 = derive: the largest power of two (>= 16) whose block fits one frame, so blocks
  // waste no frame space (f16, tq); for q8_0 / q4_0, whose vectors are 34 / 18 bytes per
  // 32 values, the largest multiple of 16 that fits. Explicit values are kept.
  int block_tokens = 0;
  KvCodec codec = KvCodec::kF16;
  uint64_t codec_seed = 0x746b76636f646563ull;  // tq rotation seed; stored in sessions

  bool operator==(const KvGeometry&) const = default;
  std::string ToString() const;  // "layers 2, kv heads 4, head_dim 32, block 128 tokens, f16"
};

// Where a block stands with respect to a session file (see kvcache/session_file.h).
// Cleared by every Write into the block: a block written since its save is not the
// record any more, whatever its tokens.
struct BlockSaveState {
  uint64_t file_id = 0;     // the session file's id (from its header), 0 = never saved
  uint64_t offset = 0;      // its record's offset in that file
  uint64_t checksum = 0;    // xxh3 of the block bytes
  uint64_t content = 0;     // content key of the tokens it held (SessionFile::ContentKeys)
};

class KvCache {
 public:
  // REQUIRES: geometry valid for the codec (head_dim rules in codec.h).
  static Result<std::unique_ptr<KvCache>> Create(MemoryManager* mm, KvGeometry geometry, uint32_t page_tag = 1);
  // The block_tokens Create would use with frames of frame_bytes (geometry.block_tokens
  // when set), so that callers can size a context before the memory exists.
  static Result<int> BlockTokensFor(const KvGeometry& geometry, uint64_t frame_bytes);
  ~KvCache();  // frees every block

  const KvGeometry& geometry() const { return g_; }
  const VectorCodec& codec() const { return *codec_; }
  size_t vector_bytes() const { return codec_->vector_bytes(); }
  uint64_t block_bytes() const { return block_bytes_; }
  // K runs are key tiles (the layout above); attention views pass this on.
  bool key_tiles() const { return key_tiles_; }
  // Bytes of one token's K and V over all layers.
  uint64_t token_bytes() const { return 2ull * g_.n_layers * g_.n_kv_heads * vector_bytes(); }
  MemoryManager& memory() { return *mm_; }
  const MemoryManager& memory() const { return *mm_; }

  SeqId NewSequence();
  // A new sequence sharing every block of src (copy-on-write).
  Result<SeqId> Fork(SeqId src);
  // Keeps the first n tokens. REQUIRES: n <= Length(s).
  Status Truncate(SeqId s, int n);
  Status FreeSequence(SeqId s);
  int Length(SeqId s) const;
  size_t live_sequences() const;

  // Grows s by one token (a new block per layer when the last is full); returns its
  // position. The token's K/V are then written layer by layer with Write.
  Result<int> AppendToken(SeqId s);
  // Encodes one token's K and V (each [n_kv_heads][head_dim] f32) for one layer at pos,
  // on the host: PrepareWrite, the codec's encoding (kernels::EncodeKvSlot), NoteKeys.
  // REQUIRES: pos < Length(s).
  Status Write(SeqId s, int layer, int pos, const float* k, const float* v);

  // The block table's half of a write, for an executor to encode into
  // (kernels::Executor::AppendKv): the block holding (s, layer, pos) made exclusive to s
  // (copied if shared), its saved-record state cleared, pinned for writing on `tier`,
  // and where the token's K and V go in it. The pin must stay held until the encoding
  // has completed (an executor's Retire). Then NoteKeys with the token's keys.
  struct WriteTarget {
    Pin pin;
    kernels::KvWriteSlot slot;
    BlockId block;
  };
  Result<WriteTarget> PrepareWrite(SeqId s, int layer, int pos, Tier tier);
  // Widens the block's per-channel key bounds by k ([n_kv_heads][head_dim], host
  // memory) where the block keeps them; k == null (keys the host never saw): drops
  // them, the block is unbounded as a restored one.
  void NoteKeys(BlockId b, const float* k);
  // Decodes one token's K and V for one layer (tests, reference paths).
  Status Read(SeqId s, int layer, int pos, float* k, float* v);

  // The layer's blocks in order (the decoder pins or prefetches these pages).
  int NumBlocks(SeqId s) const;
  PageId BlockPage(SeqId s, int layer, int block) const;
  BlockId Block(SeqId s, int layer, int block) const;
  // Tokens held by block `block` of s: block_tokens, or fewer for the last one.
  int BlockFill(SeqId s, int block) const;
  // Per-channel key bounds of a block: [n_kv_heads * head_dim] each; nullptr when the
  // block has no summary (restored: treat as unbounded).
  const float* KeyMin(BlockId b) const;
  // Gives a block without key bounds (restored) its bounds from its contents (`data`, the
  // block in host memory, `fill` tokens); no-op for a block that has them.
  void SummarizeBlock(BlockId b, const std::byte* data, int fill);
  const float* KeyMax(BlockId b) const;
  int BlockRefs(BlockId b) const { return blocks_[b.value].refs; }

  // Session-file bookkeeping (kvcache/session_file.cc).
  BlockSaveState& SaveState(BlockId b) { return blocks_[b.value].saved; }
  // A sequence whose blocks are backed pages (lazy restore). pages: [n_layers][n_blocks].
  Result<SeqId> AdoptBackedSequence(int length, const std::vector<std::vector<PageId>>& pages,
                                    const std::vector<std::vector<BlockSaveState>>& saved);

  // Appends to s one block of `tokens` tokens whose bytes fill(layer, dst) writes for
  // each layer in order (block_bytes() bytes at dst, a page on the write tier pinned for
  // writing), e.g. a block fetched from the remote tier; the block has no key bounds (as
  // restored blocks). A fill that returns false abandons the block: s is unchanged (as on
  // any failure). REQUIRES: Length(s) is a multiple of block_tokens; 0 < tokens <=
  // block_tokens.
  Status AppendBlock(SeqId s, int tokens, const std::function<bool(int layer, std::byte* dst)>& fill);

  bool CheckInvariants(std::string* why) const;

 private:
  friend class KvCacheTestPeer;  // tests: breaks a block table to show the check fails
  static constexpr uint32_t kNoSummary = UINT32_MAX;
  struct BlockMeta {
    PageId page;
    int refs = 0;                    // 0 = free slot
    uint32_t summary = kNoSummary;   // slot in summaries_, or none (unbounded)
    BlockSaveState saved;
  };
  struct Sequence {
    bool live = false;
    int length = 0;
    std::vector<std::vector<BlockId>> table;  // [n_layers][n_blocks]
  };

  KvCache(MemoryManager* mm, KvGeometry g, std::unique_ptr<VectorCodec> codec, uint32_t tag);
  Result<BlockId> NewBlock();
  // with_summary: a fresh block whose keys will all be written here (bounds start empty).
  BlockId AddBlockMeta(PageId page, bool with_summary);
  uint32_t NewSummary();  // a summary slot with empty bounds
  float* SummaryMin(uint32_t slot) { return summaries_.data() + static_cast<size_t>(slot) * 2 * summary_floats_; }
  void Unref(BlockId b);
  // Makes table[layer][block] exclusively owned by s (copies it if shared).
  Status MakeExclusive(Sequence& seq, int layer, int block);
  Sequence* Seq(SeqId s);
  const Sequence* Seq(SeqId s) const;
  // The tier KV blocks are allocated on (and Write writes on): the compute tier where it
  // is host-addressable, else the host tier (the CPU executor's tier_for).
  Tier write_tier() const;

  MemoryManager* mm_;
  KvGeometry g_;
  std::unique_ptr<VectorCodec> codec_;
  uint32_t tag_;
  uint64_t block_bytes_;
  bool key_tiles_;
  std::vector<BlockMeta> blocks_;      // [block ids]
  std::vector<uint32_t> free_blocks_;
  size_t summary_floats_;              // n_kv_heads * head_dim
  std::vector<float> summaries_;       // [slots][min, max][summary_floats_]
  std::vector<uint32_t> free_summaries_;
  uint32_t summary_slots_ = 0;
  std::vector<Sequence> seqs_;         // [sequence ids]
};

}  // namespace tierkv
