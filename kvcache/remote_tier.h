// kvcache/remote_tier.h
//
// The remote tier: a KV cache shared by machines on Redis (or Valkey), below the disk
// tier. Lossy and never authoritative (session files are): the token blocks any tierkv
// computed are found again by their content keys and fetched instead of recomputed.
// docs/remote.md has the layout; in short, per full block:
//   tkv:<id>:<layer>  the block record of that layer (BlockRecordHeader + its bytes,
//                     as session files store it)
//   tkv:<id>:c        the commit marker, written after every layer's record: the
//                     block's index, its token ids, the model fingerprint, a checksum
// where <id> (16 hex digits) hashes the tenant salt with the block's content key (a hash
// chain over every token up to the block's end, rooted in the model fingerprint and the
// KV geometry and codec: SessionFile::ContentKeys), so chains of different models,
// codecs or tenants never meet. A block is reused only when its marker holds the
// prompt's own token ids and each layer's record names the block's content key and
// passes its checksum; only full blocks are published. Publishing is asynchronous (a
// thread with its own connection), first writer wins (SET NX), every key has a TTL and
// eviction is the server's (allkeys-lru).
//
// Faults never fail a caller: a server that is down, hung (every reply has a timeout),
// restarted, evicting, full, or holding damaged or foreign values costs one warning per
// outage, and what it cannot give is computed instead. A connection that failed is
// tried again after a back-off (1 s, doubling to 30 s).
//
// Thread-safety: Extend, Publish and Flush from one thread (the one driving the
// KvCache); stats() from any.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "kvcache/kv_cache.h"
#include "kvcache/session_file.h"
#include "memory/status.h"

namespace tierkv {

struct RemoteOptions {
  // redis://[[user]:password@]host[:port][/db] or unix:///path/to/socket[?db=N]; "" = none.
  std::string url;
  std::string password;          // overrides the URL's when set
  std::string salt;              // tenant salt: chains under different salts never meet
  int ttl_s = 7 * 24 * 3600;     // every key's time to live
  int timeout_ms = 500;          // the connect and each reply
  uint64_t max_pending_bytes = 256ull << 20;  // publishing backlog; blocks past it are not published
  std::function<void()> before_fetch;  // tests: runs between the lookup and the fetch of the values
};

struct RemoteStats {
  uint64_t hit_blocks = 0;       // blocks fetched, verified and used
  uint64_t hit_tokens = 0;
  uint64_t miss_blocks = 0;      // full prompt blocks past the local prefix the remote did not give
  uint64_t fetched_bytes = 0;
  uint64_t fetch_us = 0;         // lookups and fetches
  uint64_t verify_failures = 0;  // values refused (damaged, truncated, foreign): never used
  uint64_t skipped_slower = 0;   // fetches not made: recomputing was estimated faster
  uint64_t published_blocks = 0;
  uint64_t present_blocks = 0;   // not published: the remote held them already
  uint64_t dropped_blocks = 0;   // not published: the backlog was full, or the server refused
  uint64_t pending_bytes = 0;    // publishing backlog now
  uint64_t errors = 0;           // commands that failed (connection, timeout, server error)
  bool connected = false;
};

class RemoteTier {
 public:
  // The options' mistakes (a URL that does not parse, a TTL or timeout under 1), named.
  static Status CheckOptions(const RemoteOptions& options);
  // Parses the URL (an error names what is wrong with it); the server need not be up.
  static Result<std::unique_ptr<RemoteTier>> Create(const RemoteOptions& options, const ModelFingerprint& model,
                                                    const KvGeometry& geometry, uint64_t block_bytes);
  ~RemoteTier();  // publishes what is queued for at most the reply timeout, then stops

  // Extends s, which holds prompt[0, Length(s)), with the prompt's next full blocks the
  // remote holds, cut at `limit` tokens (a block across the limit is fetched whole and
  // truncated there), when fetching them is estimated faster than recomputing them at
  // `recompute_s_per_token` (0: unknown, fetch). A partial last block of s is dropped
  // first when the remote has it whole. Returns the tokens s holds afterwards; never
  // fails (what does not come is computed by the caller).
  int Extend(KvCache& cache, SeqId s, std::span<const int32_t> prompt, int limit, double recompute_s_per_token);

  // Queues s's full blocks from `first_block` on that the remote does not hold for
  // publishing (their bytes copied now, sent by the background thread). Returns the
  // block to start from next time (the full blocks queued or present; fewer when the
  // backlog is full or the server is down).
  int Publish(KvCache& cache, SeqId s, std::span<const int32_t> tokens, int first_block);

  // Waits until the publishing backlog is sent (or timeout_s passes); true when empty.
  bool Flush(double timeout_s);

  RemoteStats stats() const;
  // The URL without its password (logs, /metrics).
  const std::string& display_url() const;
  // The key of the block whose content key is `content`: its record of `layer`, or its
  // commit marker for layer -1 (tests damage values through these).
  std::string Key(uint64_t content, int layer) const;

 private:
  struct Impl;
  explicit RemoteTier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tierkv
