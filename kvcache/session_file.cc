// kvcache/session_file.cc
#include "kvcache/session_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string_view>

#include <spdlog/spdlog.h>

#include "kvcache/checksum.h"
#include "memory/size.h"

namespace tierkv {
namespace {

constexpr char kMagic[8] = {'T', 'I', 'E', 'R', 'K', 'V', 'S', 'F'};
constexpr char kSlotMagic[8] = {'T', 'K', 'V', 'S', 'L', 'O', 'T', '1'};
constexpr char kManifestMagic[8] = {'T', 'K', 'V', 'M', 'A', 'N', 'I', 'F'};
constexpr uint32_t kRecordMagic = 0x424b564b;  // "KVKB"
constexpr uint64_t kHeaderBytes = 4096;
constexpr uint64_t kHeaderChecked = 2040;      // header checksum covers [0, 2040)
constexpr uint64_t kSlotOffset[2] = {2048, 3072};
constexpr uint64_t kSlotBytes = 64;
constexpr uint64_t kRecordHeaderBytes = BlockRecordHeader::kBytes;
constexpr uint64_t kManifestEntryBytes = 32;
constexpr size_t kMaxDescription = 1024;
constexpr uint64_t kWriteBatchBytes = 8 * kMiB;  // gather block records into writes this large

uint64_t Hash(const void* p, size_t n) { return Checksum(p, n); }

// fp's description for a refusal against `other`; with the fingerprint in hex when the
// two descriptions read the same (same tensors and types, other weights).
std::string Describe(const ModelFingerprint& fp, const ModelFingerprint& other) {
  if (fp.description != other.description) return fp.description;
  char hex[40];
  std::snprintf(hex, sizeof(hex), " [fingerprint %016llx]", static_cast<unsigned long long>(fp.hash));
  return fp.description + hex;
}

// Little-endian field access (the format is little-endian; so is every host we build for).
template <typename T>
void Put(std::vector<std::byte>& buf, size_t off, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  std::memcpy(buf.data() + off, &v, sizeof v);
}
template <typename T>
T Get(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename T>
void Append(std::vector<std::byte>& buf, T v) {
  const size_t off = buf.size();
  buf.resize(off + sizeof v);
  Put(buf, off, v);
}

struct Header {
  uint32_t version = 0;
  uint64_t file_id = 0;
  ModelFingerprint model;
  KvGeometry geometry;
  uint64_t vector_bytes = 0;
  uint64_t block_bytes = 0;
};

std::vector<std::byte> EncodeHeader(const Header& h) {
  std::vector<std::byte> buf(kHeaderBytes, std::byte{0});
  std::memcpy(buf.data(), kMagic, 8);
  Put<uint32_t>(buf, 8, kSessionFormatVersion);
  Put<uint32_t>(buf, 12, static_cast<uint32_t>(kHeaderBytes));
  Put<uint64_t>(buf, 16, h.file_id);
  Put<uint64_t>(buf, 24, h.model.hash);
  Put<uint32_t>(buf, 32, static_cast<uint32_t>(h.geometry.n_layers));
  Put<uint32_t>(buf, 36, static_cast<uint32_t>(h.geometry.n_kv_heads));
  Put<uint32_t>(buf, 40, static_cast<uint32_t>(h.geometry.head_dim));
  Put<uint32_t>(buf, 44, static_cast<uint32_t>(h.geometry.block_tokens));
  Put<uint32_t>(buf, 48, static_cast<uint32_t>(h.geometry.codec));
  Put<uint32_t>(buf, 52, static_cast<uint32_t>(h.vector_bytes));
  Put<uint64_t>(buf, 56, h.geometry.codec_seed);
  Put<uint64_t>(buf, 64, h.block_bytes);
  const size_t n = std::min(h.model.description.size(), kMaxDescription);
  Put<uint32_t>(buf, 72, static_cast<uint32_t>(n));
  std::memcpy(buf.data() + 76, h.model.description.data(), n);
  Put<uint64_t>(buf, kHeaderChecked, Hash(buf.data(), kHeaderChecked));
  return buf;
}

Result<Header> DecodeHeader(const std::byte* p, const std::string& path) {
  if (std::memcmp(p, kMagic, 8) != 0) return Status::InvalidArgument(path + " is not a tierkv session file (bad magic)");
  Header h;
  h.version = Get<uint32_t>(p + 8);
  if (h.version == 2) {
    // Version 2 found reusable blocks by position and token count, so a save after an
    // edit or a regenerated reply could keep the KV of other tokens: its KV cannot be
    // trusted, and is not read.
    return Status::Unsupported(path + ": session file format version 2, whose saves could keep the KV of other "
                               "tokens; this tierkv reads version " + std::to_string(kSessionFormatVersion) +
                               " only: remove the file (the next run recomputes the prompt)");
  }
  if (h.version != kSessionFormatVersion && h.version != 3) {
    return Status::Unsupported(path + ": session file format version " + std::to_string(h.version) +
                               "; this tierkv reads version " + std::to_string(kSessionFormatVersion));
  }
  if (Get<uint64_t>(p + kHeaderChecked) != Hash(p, kHeaderChecked)) {
    return Status::Corruption(path + ": session header checksum mismatch");
  }
  h.file_id = Get<uint64_t>(p + 16);
  h.model.hash = Get<uint64_t>(p + 24);
  h.geometry.n_layers = static_cast<int>(Get<uint32_t>(p + 32));
  h.geometry.n_kv_heads = static_cast<int>(Get<uint32_t>(p + 36));
  h.geometry.head_dim = static_cast<int>(Get<uint32_t>(p + 40));
  h.geometry.block_tokens = static_cast<int>(Get<uint32_t>(p + 44));
  const uint32_t codec = Get<uint32_t>(p + 48);
  h.vector_bytes = Get<uint32_t>(p + 52);
  h.geometry.codec_seed = Get<uint64_t>(p + 56);
  h.block_bytes = Get<uint64_t>(p + 64);
  const uint32_t desc = Get<uint32_t>(p + 72);
  const auto& g = h.geometry;
  if (codec > static_cast<uint32_t>(KvCodec::kTq3) || desc > kMaxDescription || g.n_layers <= 0 || g.n_layers > 4096 ||
      g.n_kv_heads <= 0 || g.n_kv_heads > 4096 || g.head_dim <= 0 || g.head_dim > kMaxCodecHeadDim ||
      g.block_tokens <= 0 || g.block_tokens > (1 << 20) || h.vector_bytes == 0 || h.vector_bytes > 4 * kMaxCodecHeadDim ||
      h.block_bytes != 2ull * static_cast<uint64_t>(g.n_kv_heads) * static_cast<uint64_t>(g.block_tokens) * h.vector_bytes ||
      h.block_bytes > 1 * kGiB) {
    return Status::Corruption(path + ": session header has impossible geometry");
  }
  h.geometry.codec = static_cast<KvCodec>(codec);
  if (h.version == 3 && (h.geometry.codec == KvCodec::kQ8_0 || h.geometry.codec == KvCodec::kQ4_0)) {
    // Version 3 stored q8_0 / q4_0 keys vector by vector; version 4 stores them in key
    // tiles. f16 and tq blocks are the same in both, so those files are still read.
    return Status::Unsupported(path + ": session file format version 3 with " + KvCodecName(h.geometry.codec) +
                               " keys stored vector by vector; this tierkv reads those in version " +
                               std::to_string(kSessionFormatVersion) +
                               " only: remove the file (the next run recomputes the prompt)");
  }
  h.model.description.assign(reinterpret_cast<const char*>(p + 76), desc);
  return h;
}

struct Slot {
  bool valid = false;
  uint64_t seq = 0;
  uint64_t manifest_offset = 0;
  uint64_t manifest_bytes = 0;
  uint64_t manifest_hash = 0;
  uint64_t data_end = 0;
};

std::vector<std::byte> EncodeSlot(const Slot& s) {
  std::vector<std::byte> buf(kSlotBytes, std::byte{0});
  std::memcpy(buf.data(), kSlotMagic, 8);
  Put<uint64_t>(buf, 8, s.seq);
  Put<uint64_t>(buf, 16, s.manifest_offset);
  Put<uint64_t>(buf, 24, s.manifest_bytes);
  Put<uint64_t>(buf, 32, s.manifest_hash);
  Put<uint64_t>(buf, 40, s.data_end);
  Put<uint64_t>(buf, 56, Hash(buf.data(), 56));
  return buf;
}

Slot DecodeSlot(const std::byte* p) {
  Slot s;
  if (std::memcmp(p, kSlotMagic, 8) != 0 || Get<uint64_t>(p + 56) != Hash(p, 56)) return s;
  s.seq = Get<uint64_t>(p + 8);
  s.manifest_offset = Get<uint64_t>(p + 16);
  s.manifest_bytes = Get<uint64_t>(p + 24);
  s.manifest_hash = Get<uint64_t>(p + 32);
  s.data_end = Get<uint64_t>(p + 40);
  s.valid = true;
  return s;
}

uint64_t NewFileId() {
  std::random_device rd;
  const uint64_t t = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  uint64_t id = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ (t * 0x9E3779B97F4A7C15ull);
  return id == 0 ? 1 : id;
}

std::string GeometryMismatch(const KvGeometry& file, const KvGeometry& want, const std::string& path) {
  if (file.codec != want.codec) {
    return std::string("wrong codec: ") + path + " stores " + KvCodecName(file.codec) + " KV, this run uses " +
           KvCodecName(want.codec) + " (--kv-type)";
  }
  if (file.codec_seed != want.codec_seed) return "wrong codec seed: " + path + " was encoded with another rotation seed";
  return "wrong KV geometry: " + path + " has " + file.ToString() + ", this run has " + want.ToString();
}

}  // namespace

// ---------------------------------------------------------------------------- I/O seam
Status SessionIo::PWrite(int fd, const void* data, size_t bytes, uint64_t offset) {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = pwrite(fd, static_cast<const char*>(data) + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "writing the session file");
    if (n == 0) return Status::IoError("short write on the session file");
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status SessionIo::PWritev(int fd, const iovec* iov_in, int n, uint64_t offset) {
  std::vector<iovec> iov(iov_in, iov_in + n);
  size_t first = 0;
  uint64_t done = 0;
  while (first < iov.size()) {
    const ssize_t w = pwritev(fd, &iov[first], static_cast<int>(iov.size() - first), static_cast<off_t>(offset + done));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return Status::FromErrno(errno, "writing the session file");
    if (w == 0) return Status::IoError("short write on the session file");
    done += static_cast<uint64_t>(w);
    size_t left = static_cast<size_t>(w);
    while (left > 0 && first < iov.size()) {
      if (left >= iov[first].iov_len) {
        left -= iov[first].iov_len;
        ++first;
      } else {
        iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
        iov[first].iov_len -= left;
        left = 0;
      }
    }
  }
  return Status::Ok();
}

Status SessionIo::Sync(int fd) {
  if (fdatasync(fd) != 0) return Status::FromErrno(errno, "fsync of the session file");
  return Status::Ok();
}

Status SessionIo::Rename(const std::string& from, const std::string& to) {
  if (rename(from.c_str(), to.c_str()) != 0) return Status::FromErrno(errno, "renaming " + from + " to " + to);
  return Status::Ok();
}

Status SessionIo::Truncate(int fd, uint64_t bytes) {
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) return Status::FromErrno(errno, "truncating the session file");
  return Status::Ok();
}

SessionIo* SessionIo::Default() {
  static SessionIo io;
  return &io;
}

// ---------------------------------------------------------------------------- loading
struct SessionFile::Loaded {
  Header header;
  Slot slot;
  uint64_t file_bytes = 0;
  std::vector<int32_t> tokens;
  std::vector<Record> records;  // [layer][block], layer-major
  // The newest commit is damaged (its manifest fails its checksum or lies past the end:
  // never a crash, which commits only a synced manifest) and this is the one before it:
  // why. Inspect shows the older one with this note; restore, save and verify refuse.
  std::string newest_damage;
  // newest_damage and the save that is intact, for an error.
  std::string Damage() const {
    return newest_damage + " (the save before it, " + std::to_string(slot.seq) +
           ", is intact: `tierkv session repair` rolls back to it)";
  }
};

Result<SessionFile::Loaded> SessionFile::Load(const std::string& path, int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return Status::FromErrno(errno, "stat " + path);
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(path + " is not a session file: " +
                                   (S_ISDIR(st.st_mode) ? "a directory" : "not a regular file"));
  }
  Loaded L;
  L.file_bytes = static_cast<uint64_t>(st.st_size);
  if (L.file_bytes < kHeaderBytes) {
    // A short file that does not even begin as a session file is another kind of file.
    std::array<char, sizeof(kMagic)> magic{};
    const size_t have = static_cast<size_t>(std::min<uint64_t>(L.file_bytes, sizeof(kMagic)));
    if (have == 0 || pread(fd, magic.data(), have, 0) != static_cast<ssize_t>(have) ||
        std::memcmp(magic.data(), kMagic, have) != 0) {
      return Status::Corruption(path + " is not a session file (" + std::to_string(L.file_bytes) +
                                " bytes, no TIERKVSF magic)");
    }
    return Status::Corruption(path + " is truncated: " + std::to_string(L.file_bytes) +
                              " bytes, shorter than the 4096-byte session header");
  }
  std::vector<std::byte> head(kHeaderBytes);
  TIERKV_RETURN_IF_ERROR(PreadFully(fd, head.data(), kHeaderBytes, 0, "the session header"));
  TIERKV_ASSIGN_OR_RETURN(L.header, DecodeHeader(head.data(), path));
  const KvGeometry& g = L.header.geometry;

  // The newest commit whose slot and manifest are intact.
  std::array<Slot, 2> slots = {DecodeSlot(head.data() + kSlotOffset[0]), DecodeSlot(head.data() + kSlotOffset[1])};
  // The size once the slots are read: a save appends its blocks and manifest before it
  // writes its slot, so the file now reaches past every manifest a slot read above
  // names. (Taken before, a reader racing a commit saw its manifest as truncated.)
  if (fstat(fd, &st) != 0) return Status::FromErrno(errno, "stat " + path);
  L.file_bytes = static_cast<uint64_t>(st.st_size);
  std::sort(slots.begin(), slots.end(), [](const Slot& a, const Slot& b) { return a.seq > b.seq; });
  Status last_error = Status::Corruption(path + " holds no complete save (both commit slots are empty or damaged)");
  for (const Slot& s : slots) {
    if (!s.valid) continue;
    if (s.manifest_offset < kHeaderBytes || s.manifest_bytes > L.file_bytes ||
        s.manifest_offset > L.file_bytes - s.manifest_bytes) {
      last_error = Status::Corruption(path + " is truncated: save " + std::to_string(s.seq) + "'s manifest at offset " +
                                      std::to_string(s.manifest_offset) + " ends past the end of the file (" +
                                      std::to_string(L.file_bytes) + " bytes)");
      continue;
    }
    std::vector<std::byte> m(s.manifest_bytes);
    TIERKV_RETURN_IF_ERROR(PreadFully(fd, m.data(), m.size(), s.manifest_offset, "the session manifest"));
    if (Hash(m.data(), m.size()) != s.manifest_hash) {
      last_error = Status::Corruption(path + ": manifest of save " + std::to_string(s.seq) + " fails its checksum");
      continue;
    }
    // Parse: magic, n_tokens, tokens, n_records, entries.
    const auto bad = [&](const std::string& why) {
      return Status::Corruption(path + ": manifest of save " + std::to_string(s.seq) + " is malformed (" + why + ")");
    };
    if (m.size() < 32 || std::memcmp(m.data(), kManifestMagic, 8) != 0) return bad("magic");
    const uint32_t n_layers = Get<uint32_t>(m.data() + 12);
    const uint64_t n_tokens = Get<uint64_t>(m.data() + 16);
    const uint64_t n_records = Get<uint64_t>(m.data() + 24);
    if (n_layers != static_cast<uint32_t>(g.n_layers)) return bad("layer count");
    if (n_tokens > (uint64_t{1} << 31)) return bad("token count");
    const uint64_t n_blocks = (n_tokens + static_cast<uint64_t>(g.block_tokens) - 1) / static_cast<uint64_t>(g.block_tokens);
    if (n_records != n_blocks * n_layers) return bad("record count");
    if (m.size() != 32 + n_tokens * 4 + n_records * kManifestEntryBytes) return bad("size");
    L.tokens.resize(n_tokens);
    std::memcpy(L.tokens.data(), m.data() + 32, n_tokens * 4);
    L.records.resize(n_records);
    const std::byte* e = m.data() + 32 + n_tokens * 4;
    for (uint64_t i = 0; i < n_records; ++i, e += kManifestEntryBytes) {
      Record& r = L.records[i];
      r.layer = Get<uint32_t>(e);
      r.block = Get<uint32_t>(e + 4);
      r.tokens = Get<uint32_t>(e + 8);
      r.offset = Get<uint64_t>(e + 16);
      r.checksum = Get<uint64_t>(e + 24);
      const uint64_t want_layer = i / n_blocks, want_block = i % n_blocks;
      const uint64_t fill = std::min<uint64_t>(static_cast<uint64_t>(g.block_tokens), n_tokens - want_block * static_cast<uint64_t>(g.block_tokens));
      if (r.layer != want_layer || r.block != want_block || r.tokens != fill) return bad("entry " + std::to_string(i));
      if (r.offset < kHeaderBytes || r.offset > s.manifest_offset ||
          s.manifest_offset - r.offset < kRecordHeaderBytes + L.header.block_bytes) {
        return bad("entry " + std::to_string(i) + " points outside the block area");
      }
    }
    const std::vector<uint64_t> keys = ContentKeys(L.header.model, g, L.tokens);
    for (uint64_t i = 0; i < n_records; ++i) L.records[i].content = keys[i % n_blocks];
    L.slot = s;
    if (s.seq != slots[0].seq) L.newest_damage = last_error.message();
    return L;
  }
  return last_error;
}

// ---------------------------------------------------------------------------- saving
namespace {

// Whether a block's record from an earlier save of this file (file_id, committed data
// ending at data_end) holds the block as it is: the same content key (its tokens, and
// every token before them), and the block not written since (a write clears `saved`).
bool InFile(const BlockSaveState& saved, uint64_t file_id, uint64_t content, uint64_t data_end, uint64_t block_bytes) {
  return saved.file_id == file_id && saved.content == content && saved.offset + kRecordHeaderBytes + block_bytes <= data_end;
}

// A save appends the blocks that changed (a conversation's growing tail block, every
// turn) and leaves the old records behind as garbage. When the garbage after this save
// would be more than its live records, the save writes a new file instead (compaction):
// the file stays under about twice its live size, and each compaction's rewrite is paid
// for by as many bytes of appends since the last one.
bool ShouldCompact(KvCache& cache, SeqId s, const std::vector<uint64_t>& keys, uint64_t file_id, uint64_t data_end) {
  const uint64_t record = kRecordHeaderBytes + cache.block_bytes();
  const int n_blocks = cache.NumBlocks(s);
  uint64_t kept = 0, total = 0;
  for (int l = 0; l < cache.geometry().n_layers; ++l) {
    for (int b = 0; b < n_blocks; ++b) {
      ++total;
      if (InFile(cache.SaveState(cache.Block(s, l, b)), file_id, keys[static_cast<size_t>(b)], data_end,
                 cache.block_bytes())) {
        ++kept;
      }
    }
  }
  const uint64_t old_bytes = data_end > kHeaderBytes ? data_end - kHeaderBytes : 0;
  const uint64_t garbage = old_bytes - std::min(old_bytes, kept * record);
  return garbage > total * record;
}

}  // namespace

std::string SessionFile::SaveTarget(const std::string& path) {
  std::string target = path;
  for (int hops = 0; hops < 40; ++hops) {  // a loop: opening the path reports ELOOP
    std::array<char, 4096> buf;
    const ssize_t n = readlink(target.c_str(), buf.data(), buf.size());
    if (n <= 0 || static_cast<size_t>(n) == buf.size()) break;  // not a link
    std::string next(buf.data(), static_cast<size_t>(n));
    const size_t slash = target.rfind('/');
    if (next.front() != '/' && slash != std::string::npos) next = target.substr(0, slash + 1) + next;
    target = std::move(next);
  }
  return target;
}

std::vector<uint64_t> SessionFile::ContentKeys(const ModelFingerprint& model, const KvGeometry& g,
                                               std::span<const int32_t> tokens) {
  const size_t bt = static_cast<size_t>(g.block_tokens);
  const size_t n_blocks = (tokens.size() + bt - 1) / bt;
  const uint64_t root[8] = {0x746b766b65797331ull,  // "tkvkeys1"
                            model.hash,
                            static_cast<uint64_t>(g.n_layers),
                            static_cast<uint64_t>(g.n_kv_heads),
                            static_cast<uint64_t>(g.head_dim),
                            static_cast<uint64_t>(g.block_tokens),
                            static_cast<uint64_t>(g.codec),
                            g.codec_seed};
  std::vector<uint64_t> keys(n_blocks);
  std::vector<std::byte> buf(8 + bt * 4);  // [previous key][block's token ids]
  uint64_t prev = Hash(root, sizeof root);
  for (size_t b = 0; b < n_blocks; ++b) {
    const size_t fill = std::min(bt, tokens.size() - b * bt);
    std::memcpy(buf.data(), &prev, 8);
    std::memcpy(buf.data() + 8, tokens.data() + b * bt, fill * 4);
    prev = keys[b] = Hash(buf.data(), 8 + fill * 4);
  }
  return keys;
}

namespace {

std::string Hex16(uint64_t v) {
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(v));
  return s;
}

uint64_t RandomU64() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

bool IsHex(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

// (directory with a trailing slash or "", the name) of a path.
std::pair<std::string, std::string> SplitPath(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {"", path};
  return {path.substr(0, slash + 1), path.substr(slash + 1)};
}

constexpr size_t kMaxName = 255;

}  // namespace

void BlockRecordHeader::EncodeTo(std::byte* out) const {
  const uint32_t f32[4] = {kRecordMagic, layer, block, tokens};
  const uint64_t f64[3] = {block_bytes, checksum, content};
  std::memcpy(out, f32, 16);
  std::memcpy(out + 16, f64, 24);
}

bool BlockRecordHeader::Decode(const std::byte* in, BlockRecordHeader* h) {
  if (Get<uint32_t>(in) != kRecordMagic) return false;
  *h = BlockRecordHeader{Get<uint32_t>(in + 4),  Get<uint32_t>(in + 8),  Get<uint32_t>(in + 12),
                         Get<uint64_t>(in + 16), Get<uint64_t>(in + 24), Get<uint64_t>(in + 32)};
  return true;
}

std::string SessionSiblingPath(const std::string& target, const std::string& suffix, const std::string& tag) {
  const auto [dir, name] = SplitPath(target);
  if (name.size() + suffix.size() <= kMaxName) return target + suffix;
  return dir + "." + tag + "." + Hex16(Hash(name.data(), name.size()));
}

std::string SessionFile::TempPathFor(const std::string& target) {
  const std::string rnd = Hex16(RandomU64());
  return SessionSiblingPath(target, ".tierkv-tmp." + rnd, "tierkv-tmp." + rnd);
}

int SessionFile::RemoveLeftovers(const std::string& target) {
  const auto [dir, name] = SplitPath(target);
  const std::string long_prefix = name + ".tierkv-tmp.";
  // Appended: GCC 12 warns, falsely, that "." + std::string(...) may overlap in its
  // memcpy (-Wrestrict).
  std::string short_suffix = ".";
  short_suffix += Hex16(Hash(name.data(), name.size()));
  const std::string old_prefix = name + ".tmp.";  // before format 3: PATH.tmp.PID
  UniqueFd opened(open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!opened.valid()) return 0;
  DIR* d = fdopendir(opened.get());
  if (d == nullptr) return 0;
  const int dfd = opened.release();  // closedir closes it
  std::vector<std::string> doomed;
  while (const dirent* e = readdir(d)) {
    const std::string_view n = e->d_name;
    bool ours = false;
    if (n.size() == long_prefix.size() + 16 && n.starts_with(long_prefix)) {
      ours = IsHex(n.substr(long_prefix.size()));
    } else if (n.starts_with(".tierkv-tmp.") && n.size() == 12 + 16 + short_suffix.size() && n.ends_with(short_suffix)) {
      ours = IsHex(n.substr(12, 16));
    } else if (n.size() > old_prefix.size() && n.size() <= old_prefix.size() + 10 && n.starts_with(old_prefix) &&
               std::all_of(n.begin() + static_cast<long>(old_prefix.size()), n.end(),
                           [](char c) { return c >= '0' && c <= '9'; })) {
      const long pid = std::strtol(std::string(n.substr(old_prefix.size())).c_str(), nullptr, 10);
      ours = pid > 0 && pid <= INT32_MAX && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
    }
    if (ours) doomed.emplace_back(n);
  }
  int removed = 0;
  for (const std::string& n : doomed) {
    struct stat st {};
    // A link, a directory, or another user's file is not a leftover of ours; unlinkat
    // removes a name and never follows it.
    if (fstatat(dfd, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
      continue;
    }
    if (unlinkat(dfd, n.c_str(), 0) == 0) ++removed;
  }
  closedir(d);  // closes dfd
  return removed;
}

Status SessionFile::Save(KvCache& cache, SeqId s, const std::vector<int32_t>& tokens, const ModelFingerprint& model,
                         const std::string& path, SessionSaveStats* stats, SessionIo* io) {
  if (io == nullptr) io = SessionIo::Default();
  const int n = cache.Length(s);
  if (n < 0) return Status::NotFound("save of unknown sequence");
  if (tokens.size() != static_cast<size_t>(n)) {
    return Status::InvalidArgument("save: " + std::to_string(tokens.size()) + " token ids for a KV cache of " +
                                   std::to_string(n) + " tokens");
  }
  const KvGeometry& g = cache.geometry();
  const uint64_t bb = cache.block_bytes();
  SessionSaveStats local;
  SessionSaveStats& out = stats ? *stats : local;
  out = SessionSaveStats{};
  const std::vector<uint64_t> keys = ContentKeys(model, g, tokens);

  // Open the existing session (append) or start a temporary file (renamed at the end).
  Header header;
  Slot prev;
  uint64_t append_at = kHeaderBytes;
  uint64_t old_size = 0;  // the file's size before an append
  const std::string target = SessionFile::SaveTarget(path);
  std::string write_path = target;
  bool fresh = false;
  struct stat old_stat {};
  bool replacing = false;  // a compaction: the new file takes over the old one's mode and owner
  UniqueFd fd(open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC));
  if (fd.valid()) {
    auto loaded = Load(path, fd.get());
    if (!loaded.ok()) return loaded.status().Annotate("refusing to overwrite " + path);
    if (!loaded->newest_damage.empty()) {
      return Status::Corruption(loaded->Damage() + "; refusing to overwrite " + path);
    }
    header = loaded->header;
    if (header.model.hash != model.hash) {
      return Status::FailedPrecondition("wrong model: " + path + " holds a session of " + Describe(header.model, model) +
                                        ", not " + Describe(model, header.model) + "; refusing to overwrite it");
    }
    if (!(header.geometry == g)) {
      return Status::FailedPrecondition(GeometryMismatch(header.geometry, g, path) + "; refusing to overwrite it");
    }
    prev = loaded->slot;
    append_at = prev.data_end;
    old_size = loaded->file_bytes;
    // A file with other hard links is only appended to: a new file renamed over this
    // name would leave the other names on the old session.
    const bool linked = fstat(fd.get(), &old_stat) != 0 || old_stat.st_nlink > 1;
    if (!linked && ShouldCompact(cache, s, keys, header.file_id, append_at)) {
      // More garbage than live blocks after this save: write the session afresh, aside,
      // and rename it over this file (which stays intact until then). Blocks not yet
      // paged in are read from this file through the restore's open descriptor.
      fd.reset();
      out.compacted = true;
      replacing = true;
    }
  } else if (errno != ENOENT) {
    return Status::FromErrno(errno, "opening " + path);
  }
  if (!fd.valid()) {
    fresh = true;
    append_at = kHeaderBytes;
    write_path = TempPathFor(target);
    // A new name, created exclusively (never a file or link someone placed there).
    for (int tries = 0;; ++tries) {
      write_path = TempPathFor(target);
      fd.reset(open(write_path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666));  // as the umask allows
      if (fd.valid() || errno != EEXIST || tries == 8) break;
    }
    if (!fd.valid()) return Status::FromErrno(errno, "creating " + write_path);
    if (replacing) {
      // The same owner where this process may give it (root), and the same mode.
      (void)!fchown(fd.get(), old_stat.st_uid, old_stat.st_gid);
      if (fchmod(fd.get(), old_stat.st_mode & 07777) != 0) {
        const int err = errno;
        fd.reset();
        unlink(write_path.c_str());
        return Status::FromErrno(err, "setting the mode of " + write_path);
      }
    }
    header.file_id = NewFileId();
    header.model = model;
    header.geometry = g;
    header.vector_bytes = cache.vector_bytes();
    header.block_bytes = bb;
  }
  // A failed append (the process lives on: ENOSPC, EIO) puts the file back as it was:
  // the commit slot it may have touched rewritten with its old bytes, then the appended
  // tail cut off. The file is crash-safe without this (the old commit stays valid); this
  // makes a refused save leave the bytes themselves unchanged. If the slot cannot be put
  // back, the tail it may reference stays.
  std::array<std::byte, kSlotBytes> old_slot{};
  bool slot_touched = false;
  auto fail = [&](Status st) {
    if (!fresh) {
      const bool slot_back =
          !slot_touched ||
          (io->PWrite(fd.get(), old_slot.data(), old_slot.size(), kSlotOffset[(prev.seq + 1) % 2]).ok() &&
           io->Sync(fd.get()).ok());
      if (slot_back) (void)io->Truncate(fd.get(), old_size);
    }
    fd.reset();
    if (fresh) unlink(write_path.c_str());
    return st.Annotate("saving session " + path);
  };
  if (fresh) {
    const auto h = EncodeHeader(header);
    Status st = io->PWrite(fd.get(), h.data(), h.size(), 0);
    if (!st.ok()) return fail(st);
    out.bytes_written += h.size();
  }

  // Blocks: reuse what the file already holds; append the rest with gathered writes
  // straight from the pinned pages (record header + block bytes per record).
  const int n_blocks = cache.NumBlocks(s);
  std::vector<Record> records;
  records.reserve(static_cast<size_t>(g.n_layers) * n_blocks);
  std::vector<std::pair<BlockId, BlockSaveState>> updates;
  constexpr size_t kRecordsPerWrite = 512;  // two iovecs each, within IOV_MAX
  std::vector<std::array<std::byte, kRecordHeaderBytes>> headers;
  std::vector<Pin> pins;
  std::vector<iovec> iov;
  headers.reserve(kRecordsPerWrite);
  uint64_t write_at = append_at, pending = 0;
  auto flush = [&]() -> Status {
    if (iov.empty()) return Status::Ok();
    TIERKV_RETURN_IF_ERROR(io->PWritev(fd.get(), iov.data(), static_cast<int>(iov.size()), write_at));
    out.bytes_written += pending;
    write_at += pending;
    pending = 0;
    iov.clear();
    pins.clear();
    headers.clear();
    return Status::Ok();
  };
  MemoryManager& mm = cache.memory();
  for (int l = 0; l < g.n_layers; ++l) {
    for (int b = 0; b < n_blocks; ++b) {
      const BlockId id = cache.Block(s, l, b);
      const int fill = cache.BlockFill(s, b);
      Record r{static_cast<uint32_t>(l), static_cast<uint32_t>(b), static_cast<uint32_t>(fill), 0, 0,
               keys[static_cast<size_t>(b)]};
      if (InFile(cache.SaveState(id), header.file_id, r.content, append_at, bb)) {
        const BlockSaveState& saved = cache.SaveState(id);
        r.offset = saved.offset;
        r.checksum = saved.checksum;
        ++out.blocks_reused;
      } else {
        auto pin = mm.Acquire(cache.BlockPage(s, l, b), Tier::kHost);
        if (!pin.ok() && pin.status().code() == StatusCode::kExhausted && !pins.empty()) {
          // The host tier is full of this batch's pins: write them out and retry.
          if (Status st = flush(); !st.ok()) return fail(st);
          pin = mm.Acquire(cache.BlockPage(s, l, b), Tier::kHost);
        }
        if (!pin.ok()) return fail(pin.status());
        r.checksum = Hash(pin->data(), bb);
        r.offset = write_at + pending;
        auto& h = headers.emplace_back();
        BlockRecordHeader{r.layer, r.block, r.tokens, bb, r.checksum, r.content}.EncodeTo(h.data());
        iov.push_back({h.data(), kRecordHeaderBytes});
        iov.push_back({pin->data(), bb});
        pins.push_back(std::move(pin).value());
        pending += kRecordHeaderBytes + bb;
        updates.push_back({id, BlockSaveState{header.file_id, r.offset, r.checksum, r.content}});
        ++out.blocks_written;
        if (headers.size() == kRecordsPerWrite || pending >= kWriteBatchBytes) {
          Status st = flush();
          if (!st.ok()) return fail(st);
        }
      }
      records.push_back(r);
    }
  }
  if (Status st = flush(); !st.ok()) return fail(st);
  const uint64_t batch_at = write_at;

  // Manifest, then make everything durable, then commit through the older slot.
  std::vector<std::byte> m;
  m.reserve(32 + tokens.size() * 4 + records.size() * kManifestEntryBytes);
  m.resize(8);
  std::memcpy(m.data(), kManifestMagic, 8);
  Append<uint32_t>(m, kSessionFormatVersion);
  Append<uint32_t>(m, static_cast<uint32_t>(g.n_layers));
  Append<uint64_t>(m, tokens.size());
  Append<uint64_t>(m, records.size());
  for (int32_t t : tokens) Append<int32_t>(m, t);
  for (const Record& r : records) {
    Append<uint32_t>(m, r.layer);
    Append<uint32_t>(m, r.block);
    Append<uint32_t>(m, r.tokens);
    Append<uint32_t>(m, 0);
    Append<uint64_t>(m, r.offset);
    Append<uint64_t>(m, r.checksum);
  }
  const uint64_t manifest_at = batch_at;
  if (Status st = io->PWrite(fd.get(), m.data(), m.size(), manifest_at); !st.ok()) return fail(st);
  out.bytes_written += m.size();
  if (Status st = io->Sync(fd.get()); !st.ok()) return fail(st);
  Slot next;
  next.seq = prev.seq + 1;
  next.manifest_offset = manifest_at;
  next.manifest_bytes = m.size();
  next.manifest_hash = Hash(m.data(), m.size());
  next.data_end = manifest_at + m.size();
  const auto slot = EncodeSlot(next);
  if (!fresh) {
    if (Status st = PreadFully(fd.get(), old_slot.data(), old_slot.size(), kSlotOffset[next.seq % 2], "the commit slot");
        !st.ok()) {
      return fail(st);
    }
  }
  slot_touched = true;
  if (Status st = io->PWrite(fd.get(), slot.data(), slot.size(), kSlotOffset[next.seq % 2]); !st.ok()) return fail(st);
  out.bytes_written += slot.size();
  if (Status st = io->Sync(fd.get()); !st.ok()) return fail(st);
  // Garbage past the commit (a crashed earlier save) is no longer referenced: trim it.
  struct stat stt {};
  if (fstat(fd.get(), &stt) == 0 && static_cast<uint64_t>(stt.st_size) > next.data_end) {
    (void)!ftruncate(fd.get(), static_cast<off_t>(next.data_end));
  }
  out.file_bytes = next.data_end;
  fd.reset();
  if (fresh) {
    if (Status st = io->Rename(write_path, target); !st.ok()) {
      unlink(write_path.c_str());
      return st.Annotate("saving session " + path);
    }
  }
  for (auto& [id, state] : updates) cache.SaveState(id) = state;
  return Status::Ok();
}

// --------------------------------------------------------------------------- restoring
SessionFile::SessionFile(std::string path, UniqueFd fd, uint64_t block_bytes, std::vector<Record> records)
    : path_(std::move(path)), fd_(std::move(fd)), id_(0), block_bytes_(block_bytes), records_(std::move(records)) {}

SessionFile::~SessionFile() = default;

Status SessionFile::CheckModel(const std::string& path, const ModelFingerprint& saved, const ModelFingerprint& model) {
  if (saved.hash == model.hash) return Status::Ok();
  return Status::FailedPrecondition("wrong model: " + path + " was saved for " + Describe(saved, model) +
                                    ", this model is " + Describe(model, saved));
}

Result<SessionFile::Restored> SessionFile::Restore(KvCache& cache, const std::string& path, const ModelFingerprint& model) {
  UniqueFd fd;
  auto loaded = OpenAndLoad(path, &fd);
  if (!loaded.ok()) return loaded.status();
  if (!loaded->newest_damage.empty()) {
    return Status::Corruption(loaded->Damage() + "; refusing to restore or overwrite it");
  }
  const Header& h = loaded->header;
  if (Status s = CheckModel(path, h.model, model); !s.ok()) return s;
  if (!(h.geometry == cache.geometry())) {
    return Status::FailedPrecondition(GeometryMismatch(h.geometry, cache.geometry(), path));
  }
  auto file =
      std::shared_ptr<SessionFile>(new SessionFile(path, std::move(fd), h.block_bytes, std::move(loaded->records)));
  file->id_ = h.file_id;
  MemoryManager& mm = cache.memory();
  const int32_t source = mm.AddSource(file);
  const KvGeometry& g = h.geometry;
  // One backed page per record; manifest order is layer-major, so layer l's blocks
  // are keys [l * n_blocks, (l + 1) * n_blocks).
  const size_t n_records = file->records_.size();
  const size_t n_blocks = n_records / static_cast<size_t>(g.n_layers);
  auto all = mm.RegisterBackedRange(h.block_bytes, source, 0, n_records, /*tag=*/1);
  if (!all.ok()) return all.status();
  std::vector<std::vector<PageId>> pages(static_cast<size_t>(g.n_layers));
  std::vector<std::vector<BlockSaveState>> saved(static_cast<size_t>(g.n_layers));
  for (size_t l = 0; l < pages.size(); ++l) {
    pages[l].assign(all->begin() + static_cast<long>(l * n_blocks), all->begin() + static_cast<long>((l + 1) * n_blocks));
    saved[l].reserve(n_blocks);
    for (size_t b = 0; b < n_blocks; ++b) {
      const Record& r = file->records_[l * n_blocks + b];
      saved[l].push_back(BlockSaveState{h.file_id, r.offset, r.checksum, r.content});
    }
  }
  auto seq = cache.AdoptBackedSequence(static_cast<int>(loaded->tokens.size()), pages, saved);
  if (!seq.ok()) {
    for (PageId p : *all) (void)mm.Free(p);
    return seq.status();
  }
  return Restored{*seq, std::move(loaded->tokens), file};
}

Status SessionFile::ReadPage(uint64_t key, std::span<std::byte> out) {
  if (key >= records_.size() || out.size() < block_bytes_) return Status::InvalidArgument("session page-in out of range");
  const Record& r = records_[key];
  const std::string name = "session block " + std::to_string(key) + " (layer " + std::to_string(r.layer) + ", block " +
                            std::to_string(r.block) + ") of " + path_;
  std::byte hdr[kRecordHeaderBytes];
  iovec iov[2] = {{hdr, kRecordHeaderBytes}, {out.data(), block_bytes_}};
  const uint64_t want = kRecordHeaderBytes + block_bytes_;
  uint64_t done = 0;
  while (done < want) {
    ssize_t n;
    if (done == 0) {
      n = preadv(fd_.get(), iov, 2, static_cast<off_t>(r.offset));
    } else {
      // Resume after a short read (rare): finish with plain preads.
      std::byte* dst = done < kRecordHeaderBytes ? hdr + done : out.data() + (done - kRecordHeaderBytes);
      const uint64_t len = done < kRecordHeaderBytes ? kRecordHeaderBytes - done : want - done;
      n = pread(fd_.get(), dst, len, static_cast<off_t>(r.offset + done));
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "reading " + name);
    if (n == 0) return Status::Corruption(name + " is truncated");
    done += static_cast<uint64_t>(n);
  }
  BlockRecordHeader h;
  if (!BlockRecordHeader::Decode(hdr, &h) || h.layer != r.layer || h.block != r.block || h.tokens != r.tokens ||
      h.block_bytes != block_bytes_ || h.checksum != r.checksum) {
    return Status::Corruption(name + " has a damaged record header");
  }
  if (h.content != r.content) {
    // An intact record of other tokens (or another model or encoding): never restored.
    return Status::Corruption(name + " holds the KV of other tokens than the manifest's (its content key differs)");
  }
  if (Hash(out.data(), block_bytes_) != r.checksum) return Status::Corruption(name + " fails its checksum");
  return Status::Ok();
}

// ------------------------------------------------------------------- inspect / verify
Result<SessionFile::Loaded> SessionFile::OpenAndLoad(const std::string& path, UniqueFd* fd_out) {
  // O_NONBLOCK: a FIFO at `path` is refused by Load instead of blocking the open.
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) return Status::FromErrno(errno, "opening session " + path);
  auto loaded = Load(path, fd.get());
  if (!loaded.ok()) return loaded.status();
  *fd_out = std::move(fd);
  return loaded;
}

SessionSummary SessionFile::Summarize(const Loaded& loaded) {
  SessionSummary s;
  s.version = loaded.header.version;
  s.model = loaded.header.model;
  s.geometry = loaded.header.geometry;
  s.commit_seq = loaded.slot.seq;
  s.n_tokens = loaded.tokens.size();
  s.tokens = loaded.tokens;
  s.n_records = loaded.records.size();
  s.file_bytes = loaded.file_bytes;
  s.block_bytes = loaded.header.block_bytes;
  s.live_bytes = kHeaderBytes + s.n_records * (kRecordHeaderBytes + s.block_bytes) + loaded.slot.manifest_bytes;
  if (!loaded.newest_damage.empty()) {
    s.note = loaded.newest_damage + "; shown: the save before it, " + std::to_string(loaded.slot.seq);
  }
  return s;
}

Result<SessionSummary> SessionFile::Inspect(const std::string& path) {
  UniqueFd fd;
  auto loaded = OpenAndLoad(path, &fd);
  if (!loaded.ok()) return loaded.status();
  return Summarize(*loaded);
}

Status SessionFile::Verify(const std::string& path, SessionSummary* summary) {
  UniqueFd fd;
  auto loaded = OpenAndLoad(path, &fd);
  if (!loaded.ok()) return loaded.status();
  if (!loaded->newest_damage.empty()) return Status::Corruption(loaded->Damage());
  if (summary) *summary = Summarize(*loaded);
  return VerifyBlocks(path, std::move(fd), std::move(*loaded));
}

Status SessionFile::VerifyBlocks(const std::string& path, UniqueFd fd, Loaded loaded) {
  SessionFile file(path, std::move(fd), loaded.header.block_bytes, std::move(loaded.records));
  std::unique_ptr<std::byte[]> buf(new std::byte[file.block_bytes_]);
  for (size_t i = 0; i < file.records_.size(); ++i) {
    TIERKV_RETURN_IF_ERROR(file.ReadPage(i, std::span<std::byte>(buf.get(), file.block_bytes_)));
  }
  return Status::Ok();
}

Status SessionFile::Repair(const std::string& path, const std::string& backup, bool* repaired,
                           SessionSummary* summary, SessionIo* io) {
  if (io == nullptr) io = SessionIo::Default();
  *repaired = false;
  UniqueFd fd;
  auto loaded = OpenAndLoad(path, &fd);
  if (!loaded.ok()) return loaded.status();
  if (summary) *summary = Summarize(*loaded);
  const bool damaged = !loaded->newest_damage.empty();
  const uint64_t keep_seq = loaded->slot.seq;
  const uint64_t file_bytes = loaded->file_bytes;
  // The save rolled back to must itself be whole: a damaged block is lost either way.
  if (Status st = VerifyBlocks(path, std::move(fd), std::move(*loaded)); !st.ok()) {
    return st.Annotate(damaged ? "cannot repair (the save before the damaged one has a damaged block)"
                               : "cannot repair (block data is lost; only a damaged newest save can be rolled back)");
  }
  if (!damaged) return Status::Ok();

  // The copy first, so that what the rollback makes unreachable stays readable.
  const UniqueFd in(open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!in.valid()) return Status::FromErrno(errno, "opening " + path + " to repair it");
  UniqueFd out(open(backup.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!out.valid()) {
    const int err = errno;
    return Status::FromErrno(err, "creating the backup " + backup + (err == EEXIST ? " (move it aside first)" : ""));
  }
  Status st = Status::Ok();
  std::vector<std::byte> buf(4 * kMiB);
  for (uint64_t off = 0; st.ok() && off < file_bytes; off += buf.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), file_bytes - off));
    st = PreadFully(in.get(), buf.data(), n, off, path);
    if (st.ok()) st = io->PWrite(out.get(), buf.data(), n, off);
  }
  if (st.ok()) st = io->Sync(out.get());
  out.reset();
  if (!st.ok()) {
    unlink(backup.c_str());  // a partial copy is no backup; the session file is untouched
    return st.Annotate("backing up " + path + " to " + backup);
  }
  // Clear every commit slot newer than the save kept (the damaged one), then sync.
  std::vector<std::byte> head(kHeaderBytes);
  st = PreadFully(in.get(), head.data(), head.size(), 0, "the session header");
  for (int i = 0; st.ok() && i < 2; ++i) {
    const Slot slot = DecodeSlot(head.data() + kSlotOffset[i]);
    if (!slot.valid || slot.seq <= keep_seq) continue;
    const std::array<std::byte, kSlotBytes> zero{};
    st = io->PWrite(in.get(), zero.data(), zero.size(), kSlotOffset[i]);
  }
  if (st.ok()) st = io->Sync(in.get());
  if (!st.ok()) return st.Annotate("repairing " + path + " (its copy " + backup + " is whole)");
  *repaired = true;
  return Status::Ok();
}

}  // namespace tierkv
