// kvcache/kv_cache.cc
#include "kvcache/kv_cache.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <limits>

namespace tierkv {

std::string KvGeometry::ToString() const {
  return "layers " + std::to_string(n_layers) + ", kv heads " + std::to_string(n_kv_heads) + ", head_dim " +
         std::to_string(head_dim) + ", block " + std::to_string(block_tokens) + " tokens, " + KvCodecName(codec);
}

namespace {

Result<std::unique_ptr<VectorCodec>> CodecFor(const KvGeometry& g) {
  if (g.n_layers <= 0 || g.n_kv_heads <= 0 || g.head_dim <= 0) {
    return Status::InvalidArgument("KV geometry needs positive layers, kv heads and head_dim (" + g.ToString() + ")");
  }
  auto codec = VectorCodec::Create(g.codec, g.head_dim, g.codec_seed);
  if (!codec.ok()) return codec.status().Annotate("KV cache");
  return codec;
}

int DerivedBlockTokens(const KvGeometry& g, const VectorCodec& codec, uint64_t frame_bytes) {
  if (g.block_tokens != 0) return g.block_tokens;
  const uint64_t per_token = 2ull * static_cast<uint64_t>(g.n_kv_heads) * codec.vector_bytes();
  if (g.codec == KvCodec::kQ8_0 || g.codec == KvCodec::kQ4_0) {
    // Their vectors are 34 or 18 bytes per 32 values, so a power of two of tokens would
    // leave up to half the frame empty: as many whole key tiles as fit instead.
    const uint64_t tiles = frame_bytes / (per_token * VectorCodec::kKeyTileTokens);
    return static_cast<int>(std::clamp<uint64_t>(tiles, 1, (1 << 20) / VectorCodec::kKeyTileTokens) *
                            VectorCodec::kKeyTileTokens);
  }
  int bt = 16;
  while (per_token * static_cast<uint64_t>(bt) * 2 <= frame_bytes) bt *= 2;
  return bt;
}

}  // namespace

Result<int> KvCache::BlockTokensFor(const KvGeometry& g, uint64_t frame_bytes) {
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<VectorCodec> codec, CodecFor(g));
  return DerivedBlockTokens(g, *codec, frame_bytes);
}

Result<std::unique_ptr<KvCache>> KvCache::Create(MemoryManager* mm, KvGeometry g, uint32_t page_tag) {
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<VectorCodec> codec, CodecFor(g));
  g.block_tokens = DerivedBlockTokens(g, *codec, mm->frame_bytes());
  if (g.block_tokens < 1 || g.block_tokens > (1 << 20)) return Status::InvalidArgument("block_tokens out of range");
  return std::unique_ptr<KvCache>(new KvCache(mm, g, std::move(codec), page_tag));
}

KvCache::KvCache(MemoryManager* mm, KvGeometry g, std::unique_ptr<VectorCodec> codec, uint32_t tag)
    : mm_(mm), g_(g), codec_(std::move(codec)), tag_(tag) {
  block_bytes_ = 2ull * g_.n_kv_heads * g_.block_tokens * codec_->vector_bytes();
  key_tiles_ = codec_->KeyTiles(g_.block_tokens);
  summary_floats_ = static_cast<size_t>(g_.n_kv_heads) * g_.head_dim;
}

const float* KvCache::KeyMin(BlockId b) const {
  const uint32_t slot = blocks_[b.value].summary;
  return slot == kNoSummary ? nullptr : summaries_.data() + static_cast<size_t>(slot) * 2 * summary_floats_;
}

const float* KvCache::KeyMax(BlockId b) const {
  const float* lo = KeyMin(b);
  return lo == nullptr ? nullptr : lo + summary_floats_;
}

KvCache::~KvCache() {
  for (BlockMeta& b : blocks_) {
    if (b.refs > 0) (void)mm_->Free(b.page);
  }
}

Tier KvCache::write_tier() const {
  const Tier t = mm_->compute_tier();
  return mm_->host_addressable(t) ? t : Tier::kHost;
}

KvCache::Sequence* KvCache::Seq(SeqId s) {
  if (!s.valid() || s.value >= seqs_.size() || !seqs_[s.value].live) return nullptr;
  return &seqs_[s.value];
}
const KvCache::Sequence* KvCache::Seq(SeqId s) const {
  if (!s.valid() || s.value >= seqs_.size() || !seqs_[s.value].live) return nullptr;
  return &seqs_[s.value];
}

uint32_t KvCache::NewSummary() {
  uint32_t slot;
  if (!free_summaries_.empty()) {
    slot = free_summaries_.back();
    free_summaries_.pop_back();
  } else {
    slot = summary_slots_++;
    summaries_.resize(static_cast<size_t>(summary_slots_) * 2 * summary_floats_);
  }
  float* lo = SummaryMin(slot);
  std::fill(lo, lo + summary_floats_, std::numeric_limits<float>::infinity());
  std::fill(lo + summary_floats_, lo + 2 * summary_floats_, -std::numeric_limits<float>::infinity());
  return slot;
}

BlockId KvCache::AddBlockMeta(PageId page, bool with_summary) {
  uint32_t id;
  if (!free_blocks_.empty()) {
    id = free_blocks_.back();
    free_blocks_.pop_back();
  } else {
    id = static_cast<uint32_t>(blocks_.size());
    blocks_.emplace_back();
  }
  BlockMeta& b = blocks_[id];
  b.page = page;
  b.refs = 1;
  b.saved = BlockSaveState{};
  b.summary = kNoSummary;
  if (with_summary) {
    const uint32_t slot = NewSummary();
    b.summary = slot;
  }
  return BlockId(id);
}

Result<BlockId> KvCache::NewBlock() {
  const Tier t = write_tier();
  TIERKV_ASSIGN_OR_RETURN(PageId page, mm_->Allocate(block_bytes_, t, tag_));
  // Zero it, so unwritten slots (and session files) are deterministic.
  auto pin = mm_->Acquire(page, t, Access::kWrite);
  if (!pin.ok()) {
    (void)mm_->Free(page);
    return pin.status();
  }
  std::memset(pin->data(), 0, block_bytes_);
  return AddBlockMeta(page, /*with_summary=*/true);
}

void KvCache::Unref(BlockId b) {
  BlockMeta& m = blocks_[b.value];
  assert(m.refs > 0);
  if (--m.refs == 0) {
    (void)mm_->Free(m.page);  // cannot be pinned: pins never outlive a KvCache call
    if (m.summary != kNoSummary) free_summaries_.push_back(m.summary);
    m.summary = kNoSummary;
    free_blocks_.push_back(b.value);
  }
}

SeqId KvCache::NewSequence() {
  uint32_t id = 0;
  while (id < seqs_.size() && seqs_[id].live) ++id;
  if (id == seqs_.size()) seqs_.emplace_back();
  Sequence& s = seqs_[id];
  s.live = true;
  s.length = 0;
  s.table.assign(static_cast<size_t>(g_.n_layers), {});
  return SeqId(id);
}

Result<SeqId> KvCache::Fork(SeqId src) {
  if (!Seq(src)) return Status::NotFound("fork of unknown sequence " + std::to_string(src.value));
  const SeqId dst = NewSequence();  // may reallocate seqs_: look src up again
  Sequence& from = *Seq(src);
  Sequence& to = *Seq(dst);
  to.length = from.length;
  to.table = from.table;
  for (const auto& layer : to.table) {
    for (BlockId b : layer) ++blocks_[b.value].refs;
  }
  return dst;
}

Status KvCache::Truncate(SeqId s, int n) {
  Sequence* seq = Seq(s);
  if (!seq) return Status::NotFound("truncate of unknown sequence " + std::to_string(s.value));
  if (n < 0 || n > seq->length) {
    return Status::InvalidArgument("truncate to " + std::to_string(n) + " tokens of a sequence of " +
                                   std::to_string(seq->length));
  }
  const size_t keep = (static_cast<size_t>(n) + g_.block_tokens - 1) / g_.block_tokens;
  for (auto& layer : seq->table) {
    while (layer.size() > keep) {
      Unref(layer.back());
      layer.pop_back();
    }
  }
  seq->length = n;
  return Status::Ok();
}

Status KvCache::FreeSequence(SeqId s) {
  TIERKV_RETURN_IF_ERROR(Truncate(s, 0));
  seqs_[s.value].live = false;
  seqs_[s.value].table.clear();
  return Status::Ok();
}

int KvCache::Length(SeqId s) const {
  const Sequence* seq = Seq(s);
  return seq ? seq->length : -1;
}

size_t KvCache::live_sequences() const {
  return static_cast<size_t>(std::count_if(seqs_.begin(), seqs_.end(), [](const Sequence& s) { return s.live; }));
}

Result<int> KvCache::AppendToken(SeqId s) {
  Sequence* seq = Seq(s);
  if (!seq) return Status::NotFound("append to unknown sequence " + std::to_string(s.value));
  const int pos = seq->length;
  if (pos % g_.block_tokens == 0 && static_cast<size_t>(pos / g_.block_tokens) == seq->table[0].size()) {
    // A new block on every layer; on failure undo the ones already added.
    for (int l = 0; l < g_.n_layers; ++l) {
      auto b = NewBlock();
      if (!b.ok()) {
        for (int u = 0; u < l; ++u) {
          Unref(seq->table[static_cast<size_t>(u)].back());
          seq->table[static_cast<size_t>(u)].pop_back();
        }
        return b.status().Annotate("KV cache append at token " + std::to_string(pos));
      }
      seq = Seq(s);
      seq->table[static_cast<size_t>(l)].push_back(*b);
    }
  }
  seq->length = pos + 1;
  return pos;
}

Status KvCache::MakeExclusive(Sequence& seq, int layer, int block) {
  BlockId& ref = seq.table[static_cast<size_t>(layer)][static_cast<size_t>(block)];
  if (blocks_[ref.value].refs == 1) return Status::Ok();
  const Tier t = write_tier();
  TIERKV_ASSIGN_OR_RETURN(PageId page, mm_->Allocate(block_bytes_, t, tag_));
  {
    auto src = mm_->Acquire(blocks_[ref.value].page, Tier::kHost);
    if (!src.ok()) {
      (void)mm_->Free(page);
      return src.status();
    }
    // Copy through the host: read the shared block, write the private one.
    std::vector<std::byte> tmp(block_bytes_);
    std::memcpy(tmp.data(), src->data(), block_bytes_);
    src->Release();
    auto dst = mm_->Acquire(page, t, Access::kWrite);
    if (!dst.ok()) {
      (void)mm_->Free(page);
      return dst.status();
    }
    std::memcpy(dst->data(), tmp.data(), block_bytes_);
  }
  const BlockId old = ref;
  const bool has_summary = blocks_[old.value].summary != kNoSummary;
  const BlockId fresh = AddBlockMeta(page, has_summary);  // may reallocate blocks_
  if (has_summary) {
    std::copy_n(KeyMin(old), 2 * summary_floats_, SummaryMin(blocks_[fresh.value].summary));
  }
  seq.table[static_cast<size_t>(layer)][static_cast<size_t>(block)] = fresh;
  Unref(old);
  return Status::Ok();
}

namespace {
// A key's lane in its tile: the tile starts TileLane(slot) vectors before the slot
// (a run's tiles are 16 vectors' bytes each).
int TileLane(int slot) { return slot % VectorCodec::kKeyTileTokens; }
}  // namespace

Result<KvCache::WriteTarget> KvCache::PrepareWrite(SeqId s, int layer, int pos, Tier tier) {
  Sequence* seq = Seq(s);
  if (!seq) return Status::NotFound("write to unknown sequence " + std::to_string(s.value));
  if (layer < 0 || layer >= g_.n_layers || pos < 0 || pos >= seq->length) {
    return Status::InvalidArgument("KV write at layer " + std::to_string(layer) + ", token " + std::to_string(pos) +
                                   " outside the sequence (" + std::to_string(seq->length) + " tokens)");
  }
  const int block = pos / g_.block_tokens, slot = pos % g_.block_tokens;
  TIERKV_RETURN_IF_ERROR(MakeExclusive(*seq, layer, block));
  const BlockId id = seq->table[static_cast<size_t>(layer)][static_cast<size_t>(block)];
  BlockMeta& b = blocks_[id.value];
  TIERKV_ASSIGN_OR_RETURN(Pin pin, mm_->Acquire(b.page, tier, Access::kWrite));
  b.saved = BlockSaveState{};  // its saved record no longer holds it
  const size_t vb = vector_bytes();
  const size_t half = static_cast<size_t>(g_.n_kv_heads) * g_.block_tokens * vb;
  WriteTarget t;
  t.slot.head_stride = static_cast<size_t>(g_.block_tokens) * vb;
  t.slot.n_kv_heads = g_.n_kv_heads;
  t.slot.k = pin.data() + static_cast<size_t>(slot) * vb;
  t.slot.v = pin.data() + half + static_cast<size_t>(slot) * vb;
  if (key_tiles_) {
    t.slot.tile_lane = TileLane(slot);
    t.slot.k -= static_cast<size_t>(t.slot.tile_lane) * vb;
  }
  t.pin = std::move(pin);
  t.block = id;
  return t;
}

void KvCache::NoteKeys(BlockId id, const float* k) {
  BlockMeta& b = blocks_[id.value];
  if (b.summary == kNoSummary) return;
  if (k == nullptr) {  // keys not seen: the block is unbounded from now on
    free_summaries_.push_back(b.summary);
    b.summary = kNoSummary;
    return;
  }
  float* lo = SummaryMin(b.summary);
  float* hi = lo + summary_floats_;
  for (size_t i = 0; i < summary_floats_; ++i) {
    lo[i] = std::min(lo[i], k[i]);
    hi[i] = std::max(hi[i], k[i]);
  }
}

void KvCache::SummarizeBlock(BlockId id, const std::byte* data, int fill) {
  BlockMeta& b = blocks_[id.value];
  if (b.summary != kNoSummary) return;
  b.summary = NewSummary();
  std::vector<float> k(static_cast<size_t>(g_.head_dim));
  const size_t vb = vector_bytes();
  float* lo = SummaryMin(b.summary);
  float* hi = lo + summary_floats_;
  for (int h = 0; h < g_.n_kv_heads; ++h) {
    for (int slot = 0; slot < fill; ++slot) {
      const size_t off = (static_cast<size_t>(h) * g_.block_tokens + slot) * vb;
      if (key_tiles_) {
        codec_->DecodeKeyInTile(data + off - TileLane(slot) * vb, TileLane(slot), k.data());
      } else {
        codec_->Decode(data + off, k.data());
      }
      for (int c = 0; c < g_.head_dim; ++c) {
        const size_t i = static_cast<size_t>(h) * g_.head_dim + c;
        lo[i] = std::min(lo[i], k[static_cast<size_t>(c)]);
        hi[i] = std::max(hi[i], k[static_cast<size_t>(c)]);
      }
    }
  }
}

Status KvCache::Write(SeqId s, int layer, int pos, const float* k, const float* v) {
  TIERKV_ASSIGN_OR_RETURN(WriteTarget t, PrepareWrite(s, layer, pos, write_tier()));
  kernels::EncodeKvSlot(*codec_, t.slot, k, v);
  NoteKeys(t.block, k);
  return Status::Ok();
}

Status KvCache::Read(SeqId s, int layer, int pos, float* k, float* v) {
  const Sequence* seq = Seq(s);
  if (!seq) return Status::NotFound("read of unknown sequence " + std::to_string(s.value));
  if (layer < 0 || layer >= g_.n_layers || pos < 0 || pos >= seq->length) {
    return Status::InvalidArgument("KV read outside the sequence");
  }
  const int block = pos / g_.block_tokens, slot = pos % g_.block_tokens;
  const BlockMeta& b = blocks_[seq->table[static_cast<size_t>(layer)][static_cast<size_t>(block)].value];
  const Tier t = write_tier();
  TIERKV_ASSIGN_OR_RETURN(Pin pin, mm_->Acquire(b.page, t));
  const size_t vb = vector_bytes();
  const size_t half = static_cast<size_t>(g_.n_kv_heads) * g_.block_tokens * vb;
  for (int h = 0; h < g_.n_kv_heads; ++h) {
    const size_t off = (static_cast<size_t>(h) * g_.block_tokens + slot) * vb;
    float* kh = k + static_cast<size_t>(h) * g_.head_dim;
    if (key_tiles_) {
      codec_->DecodeKeyInTile(pin.data() + off - TileLane(slot) * vb, TileLane(slot), kh);
    } else {
      codec_->Decode(pin.data() + off, kh);
    }
    codec_->Decode(pin.data() + half + off, v + static_cast<size_t>(h) * g_.head_dim);
  }
  return Status::Ok();
}

int KvCache::NumBlocks(SeqId s) const {
  const Sequence* seq = Seq(s);
  return seq ? static_cast<int>(seq->table[0].size()) : 0;
}

BlockId KvCache::Block(SeqId s, int layer, int block) const {
  return Seq(s)->table[static_cast<size_t>(layer)][static_cast<size_t>(block)];
}

PageId KvCache::BlockPage(SeqId s, int layer, int block) const { return blocks_[Block(s, layer, block).value].page; }

int KvCache::BlockFill(SeqId s, int block) const {
  const Sequence* seq = Seq(s);
  return std::min(g_.block_tokens, seq->length - block * g_.block_tokens);
}

Result<SeqId> KvCache::AdoptBackedSequence(int length, const std::vector<std::vector<PageId>>& pages,
                                           const std::vector<std::vector<BlockSaveState>>& saved) {
  const size_t n_blocks = (static_cast<size_t>(length) + g_.block_tokens - 1) / g_.block_tokens;
  if (pages.size() != static_cast<size_t>(g_.n_layers)) return Status::InvalidArgument("adopt: wrong layer count");
  for (const auto& l : pages) if (l.size() != n_blocks) return Status::InvalidArgument("adopt: wrong block count");
  const SeqId s = NewSequence();
  Sequence& seq = *Seq(s);
  seq.length = length;
  blocks_.reserve(blocks_.size() + n_blocks * static_cast<size_t>(g_.n_layers));
  for (auto& layer : seq.table) layer.reserve(n_blocks);
  for (int l = 0; l < g_.n_layers; ++l) {
    for (size_t b = 0; b < n_blocks; ++b) {
      // Restored blocks carry no key summary (unbounded): restore stays O(metadata).
      const BlockId id = AddBlockMeta(pages[static_cast<size_t>(l)][b], /*with_summary=*/false);
      blocks_[id.value].saved = saved[static_cast<size_t>(l)][b];
      seqs_[s.value].table[static_cast<size_t>(l)].push_back(id);
    }
  }
  return s;
}

Status KvCache::AppendBlock(SeqId s, int tokens, const std::function<bool(int layer, std::byte* dst)>& fill) {
  const Sequence* seq = Seq(s);
  if (!seq) return Status::NotFound("append to unknown sequence " + std::to_string(s.value));
  if (seq->length % g_.block_tokens != 0 || tokens <= 0 || tokens > g_.block_tokens) {
    return Status::InvalidArgument("append of a block of " + std::to_string(tokens) + " tokens to a sequence of " +
                                   std::to_string(seq->length));
  }
  const Tier t = write_tier();
  std::vector<BlockId> added;
  added.reserve(static_cast<size_t>(g_.n_layers));
  for (int l = 0; l < g_.n_layers; ++l) {
    auto page = mm_->Allocate(block_bytes_, t, tag_);
    Status st = page.status();
    if (st.ok()) {
      auto pin = mm_->Acquire(*page, t, Access::kWrite);
      if (!pin.ok()) {
        st = pin.status();
      } else if (!fill(l, pin->data())) {
        st = Status::FailedPrecondition("the block's bytes did not come");
      }
      if (!st.ok()) {
        if (pin.ok()) pin->Release();
        (void)mm_->Free(*page);
      }
    }
    if (!st.ok()) {
      for (BlockId b : added) Unref(b);
      return st.Annotate("KV cache append of a block at token " + std::to_string(Seq(s)->length));
    }
    added.push_back(AddBlockMeta(*page, /*with_summary=*/false));
  }
  Sequence& to = *Seq(s);
  for (size_t l = 0; l < added.size(); ++l) to.table[l].push_back(added[l]);
  to.length += tokens;
  return Status::Ok();
}

bool KvCache::CheckInvariants(std::string* why) const {
  std::vector<int> refs(blocks_.size(), 0);
  for (size_t i = 0; i < seqs_.size(); ++i) {
    const Sequence& s = seqs_[i];
    if (!s.live) continue;
    const size_t want = (static_cast<size_t>(s.length) + g_.block_tokens - 1) / g_.block_tokens;
    for (const auto& layer : s.table) {
      if (layer.size() != want) {
        *why = "sequence " + std::to_string(i) + " has " + std::to_string(layer.size()) + " blocks in a layer, wants " +
               std::to_string(want);
        return false;
      }
      for (BlockId b : layer) ++refs[b.value];
    }
  }
  for (size_t b = 0; b < blocks_.size(); ++b) {
    if (refs[b] != blocks_[b].refs) {
      *why = "block " + std::to_string(b) + " has refs " + std::to_string(blocks_[b].refs) + " but " +
             std::to_string(refs[b]) + " table entries";
      return false;
    }
  }
  return mm_->CheckInvariants(why);
}

}  // namespace tierkv
