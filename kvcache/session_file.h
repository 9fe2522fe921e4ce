// kvcache/session_file.h
//
// Session files: one sequence's tokens and KV cache, persisted across restarts.
// docs/formats.md has the byte layout; in short:
//   [header 4 KiB: magic, version, model fingerprint, KV geometry, codec + seed,
//    header checksum; two commit slots A/B]
//   [block records: {record header, block bytes}, appended, each with an xxh3 checksum]
//   [manifest: token ids, one entry per (layer, block) naming its record; xxh3]
// A save appends the blocks that are new or changed since the last save, then a
// manifest, fsyncs, and only then commits by writing the older commit slot (sequence
// number + manifest location + checksums) and fsyncing again. A crash at any point
// leaves the newest intact slot pointing at a complete, checksummed save. The first
// save goes to a temporary file renamed into place, and so does a save that compacts:
// one after which the file's garbage (records of blocks since rewritten, such as a
// conversation's growing tail block) would outgrow its live records.
//
// Restore is lazy: it reads the header, a slot and the manifest (O(metadata)), and
// registers every block as a backed page of the MemoryManager; a block is read, and
// its checksum verified, the first time the decoder needs it. A corrupt block is
// refused at page-in with an error naming it.
//
// Thread-safety: a SessionFile may serve page-ins (copy stream) while the owning
// thread saves to it; nothing else is shared.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <sys/uio.h>

#include "kvcache/kv_cache.h"
#include "memory/fd.h"
#include "memory/page_source.h"

namespace tierkv {

// 4: q8_0 / q4_0 keys in key tiles (version 3 stored them vector by vector: such files
// are refused; version-3 files of the other codecs have the same blocks and are read).
// 3: every block record carries the content key of the tokens it holds, checked at
// page-in (docs/formats.md); version-2 saves could keep a record of other tokens, so
// they are refused. (2: f16 keys in key tiles; version 1 stored them vector by vector.)
inline constexpr uint32_t kSessionFormatVersion = 4;

// Identifies the model a KV cache belongs to: a hash of the architecture, tensor
// names/shapes/types and rope parameters (computed by the runtime), and a readable
// description for error messages.
struct ModelFingerprint {
  uint64_t hash = 0;
  std::string description;  // e.g. "qwen3moe, 48 layers, Q4_K_M"
};

// The narrow seam for session-file I/O, so tests can inject faults and crashes.
class SessionIo {
 public:
  virtual ~SessionIo() = default;
  virtual Status PWrite(int fd, const void* data, size_t bytes, uint64_t offset);
  // Gathered write of iov[0..n) at offset (resumes after short writes).
  virtual Status PWritev(int fd, const struct iovec* iov, int n, uint64_t offset);
  virtual Status Sync(int fd);
  virtual Status Rename(const std::string& from, const std::string& to);
  virtual Status Truncate(int fd, uint64_t bytes);
  static SessionIo* Default();
};

struct SessionSaveStats {
  uint64_t blocks_written = 0;   // new or changed blocks appended by this save
  uint64_t blocks_reused = 0;    // blocks whose record from an earlier save was kept
  uint64_t bytes_written = 0;    // everything this save wrote (blocks, manifest, slot)
  uint64_t file_bytes = 0;       // file size after the save
  bool compacted = false;        // the file was written afresh (its garbage outgrew its live blocks)
};

struct SessionSummary {  // what `session inspect` prints
  uint32_t version = 0;
  ModelFingerprint model;
  KvGeometry geometry;
  uint64_t commit_seq = 0;
  uint64_t n_tokens = 0;
  std::vector<int32_t> tokens;
  uint64_t n_records = 0;        // records referenced by the manifest
  uint64_t file_bytes = 0;
  uint64_t block_bytes = 0;
  uint64_t live_bytes = 0;       // header + referenced records + manifest
  std::string note;              // the newest save is damaged and the one before it is shown: why ("" else)
};

// A block record's header (docs/formats.md): what session files, and the remote tier
// (kvcache/remote_tier.h), store before a block's bytes.
struct BlockRecordHeader {
  static constexpr size_t kBytes = 40;
  uint32_t layer = 0;
  uint32_t block = 0;
  uint32_t tokens = 0;        // tokens the block holds
  uint64_t block_bytes = 0;
  uint64_t checksum = 0;      // XXH3 of the block's bytes
  uint64_t content = 0;       // content key of its tokens (SessionFile::ContentKeys)
  void EncodeTo(std::byte* out) const;
  // False when `in` does not start with the record magic.
  static bool Decode(const std::byte* in, BlockRecordHeader* h);
  bool operator==(const BlockRecordHeader&) const = default;
};

// A name beside `target` for a file tierkv keeps with it: target + suffix, or, where
// that would pass the 255-byte name limit, "." + tag + "." + a hash of target's name in
// its directory.
std::string SessionSiblingPath(const std::string& target, const std::string& suffix, const std::string& tag);

class SessionFile : public PageSource, public std::enable_shared_from_this<SessionFile> {
 public:
  ~SessionFile() override;

  // Saves sequence s of `cache` with its tokens to `path`. If `path` already holds a
  // session of the same model and geometry, appends only what changed; a file of a
  // different model, geometry or codec is refused, never overwritten.
  static Status Save(KvCache& cache, SeqId s, const std::vector<int32_t>& tokens, const ModelFingerprint& model,
                     const std::string& path, SessionSaveStats* stats = nullptr, SessionIo* io = nullptr);

  // Lazy restore: a new sequence of `cache` backed by the file's blocks. Refuses (one
  // clear error) a file that is not a session, truncated, of another version, another
  // model (fingerprint), or another geometry or codec than `cache`.
  struct Restored {
    SeqId seq;
    std::vector<int32_t> tokens;
    std::shared_ptr<SessionFile> file;  // keeps the backing open; also held by the cache's memory
  };
  static Result<Restored> Restore(KvCache& cache, const std::string& path, const ModelFingerprint& model);
  // Ok when a session saved for `saved` may be restored into `model`; else the "wrong
  // model" error Restore gives, naming both (for a check before Restore, from Inspect).
  static Status CheckModel(const std::string& path, const ModelFingerprint& saved, const ModelFingerprint& model);

  // Content keys of the blocks of a session holding `tokens` (one per block of
  // geometry.block_tokens tokens, the last one partial): key[b] hashes key[b-1] with
  // block b's token ids, and key[-1] the model fingerprint and the KV geometry and
  // codec. A block's key thus names every token up to its end, and the model and
  // encoding it was computed with. Saves reuse, and restores accept, a record only
  // under its block's key.
  static std::vector<uint64_t> ContentKeys(const ModelFingerprint& model, const KvGeometry& geometry,
                                           std::span<const int32_t> tokens);

  // The file a save to `path` writes: path, or the file its chain of symbolic links
  // ends at (a save that writes a new file renames it over that one, and the links
  // stay). Found before a run so that its directory can be checked up front.
  static std::string SaveTarget(const std::string& path);
  // Where a save that writes a new file (the first, or a compaction) writes it before
  // the rename over `target`: beside it, under a name no one can guess (a fresh random
  // one each call: target + ".tierkv-tmp." + 16 hex digits, or where that would pass
  // the 255-byte name limit, ".tierkv-tmp.<hash of the name>.<16 hex digits>" in its
  // directory). Created with O_EXCL | O_NOFOLLOW: nothing planted there is followed.
  static std::string TempPathFor(const std::string& target);
  // Removes what crashed saves of `target` left: its temporary files (the names above;
  // and, from tierkv before format 3, target + ".tmp.PID" of a process that is gone),
  // only regular files of this user, never following links. REQUIRES: the caller holds
  // the session's SessionLock, so no save of it is under way. Returns how many it removed.
  static int RemoveLeftovers(const std::string& target);

  // Reads header, slots and manifest (no block data).
  static Result<SessionSummary> Inspect(const std::string& path);
  // Full checksum pass over every referenced block; the error names the first bad one.
  static Status Verify(const std::string& path, SessionSummary* summary = nullptr);

  // `tierkv session repair`: a file whose newest save is damaged (docs/formats.md) is
  // rolled back to the save before it, once every block of that save has passed its
  // checksum: the file is first copied whole to `backup` (created, never overwritten;
  // synced), then the damaged save's commit slot is cleared and synced, so the next run
  // restores the intact save and the next save takes the cleared slot. A file whose
  // newest save is intact is left untouched (*repaired false); damaged blocks cannot be
  // repaired and are an error naming the first one. io injects write faults in tests.
  static Status Repair(const std::string& path, const std::string& backup, bool* repaired,
                       SessionSummary* summary = nullptr, SessionIo* io = nullptr);

  // PageSource: reads record `key` and verifies it. Evicted blocks are kept on the Disk
  // tier when it has room (a read there skips the verification).
  Status ReadPage(uint64_t key, std::span<std::byte> out) override;
  bool KeepBelow() const override { return true; }
  uint64_t id() const { return id_; }
  const std::string& path() const { return path_; }

 private:
  struct Record {  // manifest entry
    uint32_t layer = 0;
    uint32_t block = 0;
    uint32_t tokens = 0;
    uint64_t offset = 0;
    uint64_t checksum = 0;
    uint64_t content = 0;  // content key of its tokens (from the manifest's token ids)
  };
  struct Loaded;  // header + slot + manifest, parsed
  static Result<Loaded> Load(const std::string& path, int fd);
  // Opens `path` read-only and loads it; on success *fd is the open descriptor.
  static Result<Loaded> OpenAndLoad(const std::string& path, UniqueFd* fd);
  static SessionSummary Summarize(const Loaded& loaded);
  // Reads and checks every block `loaded` references; takes (and closes) fd.
  static Status VerifyBlocks(const std::string& path, UniqueFd fd, Loaded loaded);

  SessionFile(std::string path, UniqueFd fd, uint64_t block_bytes, std::vector<Record> records);

  std::string path_;
  UniqueFd fd_;
  uint64_t id_;
  uint64_t block_bytes_;
  std::vector<Record> records_;
};

}  // namespace tierkv
