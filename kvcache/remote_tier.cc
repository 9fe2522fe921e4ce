// kvcache/remote_tier.cc
#include "kvcache/remote_tier.h"

#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>

#include "kvcache/checksum.h"

namespace tierkv {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMarkerMagic = 0x43564b54;  // "TKVC"
constexpr uint32_t kMarkerVersion = 1;
constexpr size_t kMarkerHeaderBytes = 48;
constexpr int kLookupBatch = 256;                  // markers asked for per round trip
constexpr uint64_t kFetchBatchBytes = 16ull << 20; // values asked for per round trip
constexpr double kMaxBackoffS = 30;

struct ReplyDeleter {
  void operator()(redisReply* r) const {
    if (r != nullptr) freeReplyObject(r);
  }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;
using Command = std::vector<std::string_view>;

struct Endpoint {
  std::string host;
  int port = 6379;
  std::string unix_path;
  std::string user;
  std::string password;
  int db = 0;
  std::string display;  // the URL without its password
};

Result<int> ParseNumber(std::string_view s, const std::string& url, const char* what, int lo, int hi) {
  int v = 0;
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string_view::npos ||
      (v = std::stoi(std::string(s))) < lo || v > hi) {
    return Status::InvalidArgument("remote URL " + url + ": " + what + " must be a number " + std::to_string(lo) + ".." +
                                   std::to_string(hi));
  }
  return v;
}

Result<Endpoint> ParseUrl(const std::string& url) {
  Endpoint ep;
  constexpr std::string_view kUnix = "unix://", kRedis = "redis://";
  const std::string_view u = url;
  if (u.starts_with(kUnix)) {
    std::string_view rest = u.substr(kUnix.size());
    if (const size_t q = rest.find("?db="); q != std::string_view::npos) {
      TIERKV_ASSIGN_OR_RETURN(ep.db, ParseNumber(rest.substr(q + 4), url, "the database", 0, 1 << 20));
      rest = rest.substr(0, q);
    }
    if (!rest.starts_with("/")) {
      return Status::InvalidArgument("remote URL " + url + ": a socket path must be absolute (unix:///path/to/socket)");
    }
    ep.unix_path = std::string(rest);
    ep.display = url;
    return ep;
  }
  if (!u.starts_with(kRedis)) {
    return Status::InvalidArgument("remote URL '" + url + "' must start with redis:// or unix://");
  }
  std::string_view rest = u.substr(kRedis.size());
  std::string_view userinfo;
  if (const size_t at = rest.rfind('@'); at != std::string_view::npos) {
    userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
  }
  if (!userinfo.empty()) {
    const size_t colon = userinfo.find(':');
    ep.user = std::string(userinfo.substr(0, colon));
    if (colon != std::string_view::npos) ep.password = std::string(userinfo.substr(colon + 1));
  }
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    if (slash + 1 < rest.size()) {
      TIERKV_ASSIGN_OR_RETURN(ep.db, ParseNumber(rest.substr(slash + 1), url, "the database", 0, 1 << 20));
    }
    rest = rest.substr(0, slash);
  }
  std::string_view hostport = rest;
  size_t colon = std::string_view::npos;
  if (hostport.starts_with("[")) {  // [ipv6]:port
    const size_t close = hostport.find(']');
    if (close == std::string_view::npos) return Status::InvalidArgument("remote URL " + url + ": unclosed [");
    ep.host = std::string(hostport.substr(1, close - 1));
    if (close + 1 < hostport.size()) {
      if (hostport[close + 1] != ':') return Status::InvalidArgument("remote URL " + url + ": junk after ]");
      colon = close + 1;
    }
  } else {
    colon = hostport.rfind(':');
    ep.host = std::string(hostport.substr(0, colon));
  }
  if (colon != std::string_view::npos) {
    TIERKV_ASSIGN_OR_RETURN(ep.port, ParseNumber(hostport.substr(colon + 1), url, "the port", 1, 65535));
  }
  if (ep.host.empty()) return Status::InvalidArgument("remote URL " + url + " names no host");
  ep.display = "redis://" + (userinfo.empty() ? "" : (ep.user + (ep.password.empty() ? "" : ":***") + "@")) +
               std::string(rest) + (ep.db != 0 ? "/" + std::to_string(ep.db) : "");
  return ep;
}

timeval Timeval(int ms) { return timeval{ms / 1000, (ms % 1000) * 1000}; }

// Shared by the caller's connection and the publisher's: one warning per outage.
struct Health {
  std::string url;
  std::atomic<bool> up{false};
  std::atomic<bool> warned{false};
  std::atomic<uint64_t> errors{0};

  void Failed(const std::string& why) {
    up = false;
    errors++;
    if (!warned.exchange(true)) {
      spdlog::warn("remote KV cache {}: {}; prompts are computed until it answers", url, why);
    }
  }
  void Connected() {
    up = true;
    if (warned.exchange(false)) spdlog::info("remote KV cache {}: connected again", url);
  }
};

// One hiredis connection: connects on demand (not before the back-off has passed),
// sends pipelines, closes itself on any I/O error or timeout.
class Connection {
 public:
  Connection(const Endpoint& ep, int timeout_ms, Health* health) : ep_(ep), timeout_ms_(timeout_ms), health_(health) {}
  ~Connection() { Close(); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  bool Ready() { return ctx_ != nullptr || (Clock::now() >= retry_at_ && Connect()); }

  // A pipeline: Send queues the commands (which must outlive their replies) and Next
  // reads their replies in order, one at a time (a caller keeps at most one value of a
  // large fetch in memory); null (the connection closed, warned) on an I/O error or a
  // timeout. Server error replies are replies. A connection held from before that the
  // server closed (it restarted) is replaced once, at once, when the first reply finds
  // it so: the commands here (GET, EXISTS, SET NX, DEL) may be sent twice.
  bool Send(const std::vector<Command>& cmds) {
    held_ = ctx_ != nullptr;
    pending_ = nullptr;
    if (!Ready()) return false;
    pending_ = &cmds;
    read_ = 0;
    std::string why;
    if (!Append(cmds, &why)) {
      Fail(why);
      return false;
    }
    return true;
  }
  Reply Next() {
    if (ctx_ == nullptr || pending_ == nullptr || read_ >= pending_->size()) return nullptr;
    std::string why;
    Reply r;
    Outcome out = Read(&r, &why);
    if (out == Outcome::kClosed && held_ && read_ == 0) {
      Close();
      held_ = false;
      if (!Connect()) return nullptr;
      out = Append(*pending_, &why) ? Read(&r, &why) : Outcome::kFailed;
    }
    if (out != Outcome::kOk) {
      Fail(why);
      pending_ = nullptr;
      return nullptr;
    }
    ++read_;
    return r;
  }
  // Reads and drops the replies still due (a caller that stopped early).
  void Drain() {
    while (ctx_ != nullptr && pending_ != nullptr && read_ < pending_->size()) {
      if (!Next()) break;
    }
  }
  // Send, and every reply.
  bool Run(const std::vector<Command>& cmds, std::vector<Reply>* replies) {
    replies->clear();
    if (!Send(cmds)) return false;
    for (size_t i = 0; i < cmds.size(); ++i) {
      Reply r = Next();
      if (!r) return false;
      replies->push_back(std::move(r));
    }
    pending_ = nullptr;  // read whole (cmds may be a temporary)
    return true;
  }

 private:
  enum class Outcome { kOk, kClosed, kFailed };

  bool Connect() {
    const timeval tv = Timeval(timeout_ms_);
    ctx_ = ep_.unix_path.empty() ? redisConnectWithTimeout(ep_.host.c_str(), ep_.port, tv)
                                 : redisConnectUnixWithTimeout(ep_.unix_path.c_str(), tv);
    if (ctx_ == nullptr || ctx_->err != 0) {
      Fail(ctx_ != nullptr ? ctx_->errstr : "cannot allocate a connection");
      return false;
    }
    if (redisSetTimeout(ctx_, tv) != REDIS_OK) {
      Fail("cannot set the reply timeout");
      return false;
    }
    const std::string db = std::to_string(ep_.db);
    std::vector<Command> hello;
    if (!ep_.password.empty()) {
      hello.push_back(ep_.user.empty() ? Command{"AUTH", ep_.password} : Command{"AUTH", ep_.user, ep_.password});
    }
    if (ep_.db != 0) hello.push_back({"SELECT", db});
    hello.push_back({"PING"});  // a server that accepts but does not answer (stopped) times out here
    std::string why;
    if (!Append(hello, &why)) {
      Fail(why);
      return false;
    }
    for (size_t i = 0; i < hello.size(); ++i) {
      Reply r;
      if (Read(&r, &why) != Outcome::kOk) {
        Fail(why);
        return false;
      }
      if (r->type == REDIS_REPLY_ERROR) {
        Fail(std::string(r->str, r->len));
        return false;
      }
    }
    backoff_s_ = 1;
    health_->Connected();
    return true;
  }

  bool Append(const std::vector<Command>& cmds, std::string* why) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const Command& c : cmds) {
      argv.clear();
      lens.clear();
      for (std::string_view a : c) {
        argv.push_back(a.data());
        lens.push_back(a.size());
      }
      if (redisAppendCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data()) != REDIS_OK) {
        *why = ctx_->errstr;
        return false;
      }
    }
    return true;
  }

  Outcome Read(Reply* out, std::string* why) {
    void* r = nullptr;
    errno = 0;
    if (redisGetReply(ctx_, &r) != REDIS_OK || r == nullptr) {
      const bool timeout = ctx_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
      *why = timeout ? "no reply within " + std::to_string(timeout_ms_) + " ms" : std::string(ctx_->errstr);
      const bool closed =
          ctx_->err == REDIS_ERR_EOF || (ctx_->err == REDIS_ERR_IO && (errno == EPIPE || errno == ECONNRESET));
      return closed ? Outcome::kClosed : Outcome::kFailed;
    }
    out->reset(static_cast<redisReply*>(r));
    return Outcome::kOk;
  }

  void Fail(const std::string& why) {
    Close();
    retry_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(backoff_s_));
    backoff_s_ = std::min(backoff_s_ * 2, kMaxBackoffS);
    health_->Failed(why);
  }
  void Close() {
    if (ctx_ != nullptr) redisFree(ctx_);
    ctx_ = nullptr;
  }

  const Endpoint& ep_;
  const int timeout_ms_;
  Health* health_;
  redisContext* ctx_ = nullptr;
  Clock::time_point retry_at_{};
  double backoff_s_ = 1;
  const std::vector<Command>* pending_ = nullptr;  // the pipeline being read
  size_t read_ = 0;                                // its replies read
  bool held_ = false;                              // it went out on a connection held from before
};

bool IsOk(const redisReply* r) {  // SET's "OK", or nil when NX found the key (first writer wins)
  return r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_NIL;
}

template <typename T>
T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
void Store(std::string& s, size_t off, T v) {
  std::memcpy(s.data() + off, &v, sizeof v);
}

}  // namespace

struct RemoteTier::Impl {
  struct Item {  // one block to publish
    std::vector<std::string> keys;    // each layer's, then the marker's
    std::vector<std::string> values;  // likewise
    uint64_t bytes = 0;
  };

  RemoteOptions o;
  Endpoint ep;
  ModelFingerprint model;
  KvGeometry g;
  uint64_t block_bytes = 0;
  Health health;
  std::unique_ptr<Connection> conn;  // the caller's
  std::atomic<bool> warned_bad_value{false};

  mutable std::mutex stats_mu;
  RemoteStats st;                // under stats_mu (pending_bytes, errors, connected: filled in by stats())
  double fetch_bytes_per_s = 0;  // measured by the last fetch (caller's thread only)

  std::mutex mu;
  std::condition_variable cv, idle_cv;
  std::deque<Item> queue;
  uint64_t pending = 0;
  bool busy = false;
  bool stop = false;
  std::thread publisher;

  uint64_t value_bytes() const { return BlockRecordHeader::kBytes + block_bytes; }
  uint64_t marker_bytes() const { return kMarkerHeaderBytes + 4ull * static_cast<uint64_t>(g.block_tokens) + 8; }

  std::string Key(uint64_t content, int layer) const {
    std::string in = o.salt;
    in.append(reinterpret_cast<const char*>(&content), sizeof content);
    char buf[48];
    std::snprintf(buf, sizeof buf, "tkv:%016llx:", static_cast<unsigned long long>(Checksum(in.data(), in.size())));
    return std::string(buf) + (layer < 0 ? std::string("c") : std::to_string(layer));
  }

  std::string Marker(int block, uint64_t content, std::span<const int32_t> tokens) const {
    std::string m(marker_bytes(), '\0');
    const uint32_t f32[6] = {kMarkerMagic, kMarkerVersion, static_cast<uint32_t>(block),
                             static_cast<uint32_t>(tokens.size()), static_cast<uint32_t>(g.n_layers), 0};
    std::memcpy(m.data(), f32, sizeof f32);
    Store<uint64_t>(m, 24, content);
    Store<uint64_t>(m, 32, block_bytes);
    Store<uint64_t>(m, 40, model.hash);
    std::memcpy(m.data() + kMarkerHeaderBytes, tokens.data(), tokens.size_bytes());
    Store<uint64_t>(m, m.size() - 8, Checksum(m.data(), m.size() - 8));
    return m;
  }

  // The marker is the one Marker(block, content, tokens) writes: the prompt's own tokens.
  bool MarkerMatches(const redisReply* r, int block, uint64_t content, std::span<const int32_t> tokens) const {
    if (r->type != REDIS_REPLY_STRING || r->len != marker_bytes()) return false;
    const std::string want = Marker(block, content, tokens);
    return std::memcmp(r->str, want.data(), want.size()) == 0;
  }

  // Why the value of (block, layer) cannot be used ("" when it can).
  std::string CheckValue(const redisReply* r, int block, int layer, uint64_t content) const {
    if (r->type == REDIS_REPLY_NIL) return "gone";
    if (r->type != REDIS_REPLY_STRING) return "not a string";
    if (r->len != value_bytes()) {
      return "holds " + std::to_string(r->len) + " bytes instead of " + std::to_string(value_bytes());
    }
    BlockRecordHeader h;
    if (!BlockRecordHeader::Decode(reinterpret_cast<const std::byte*>(r->str), &h)) return "is not a block record";
    if (h.layer != static_cast<uint32_t>(layer) || h.block != static_cast<uint32_t>(block) ||
        h.tokens != static_cast<uint32_t>(g.block_tokens) || h.block_bytes != block_bytes) {
      return "has a record header of another block";
    }
    if (h.content != content) return "holds the KV of other tokens, or of another model or codec";
    if (Checksum(r->str + BlockRecordHeader::kBytes, block_bytes) != h.checksum) return "fails its checksum";
    return "";
  }

  void Count(uint64_t RemoteStats::*field, uint64_t n) {
    std::lock_guard<std::mutex> lock(stats_mu);
    st.*field += n;
  }

  void PublishLoop();
};

void RemoteTier::Impl::PublishLoop() {
  Connection pub(ep, o.timeout_ms, &health);
  const std::string ttl = std::to_string(o.ttl_s);
  bool warned_refused = false;
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (stop) return;
      item = std::move(queue.front());
      queue.pop_front();
      busy = true;
    }
    // The layers first; the marker, which makes the block visible, only once all are in.
    std::vector<Command> cmds;
    const size_t n_layers = item.keys.size() - 1;
    for (size_t l = 0; l < n_layers; ++l) cmds.push_back({"SET", item.keys[l], item.values[l], "NX", "EX", ttl});
    std::vector<Reply> replies;
    bool ok = pub.Run(cmds, &replies);
    for (size_t i = 0; ok && i < replies.size(); ++i) {
      if (!IsOk(replies[i].get())) {
        ok = false;
        health.errors++;
        if (!warned_refused) {
          warned_refused = true;
          spdlog::warn("remote KV cache {}: refused a block: {}; blocks it refuses are not shared", health.url,
                       replies[i]->type == REDIS_REPLY_ERROR ? std::string(replies[i]->str, replies[i]->len)
                                                             : std::string("unexpected reply"));
        }
      }
    }
    if (ok) {
      ok = pub.Run({{"SET", item.keys.back(), item.values.back(), "NX", "EX", ttl}}, &replies) && IsOk(replies[0].get());
      if (ok) Count(replies[0]->type == REDIS_REPLY_NIL ? &RemoteStats::present_blocks : &RemoteStats::published_blocks, 1);
    }
    if (!ok) Count(&RemoteStats::dropped_blocks, 1);
    std::lock_guard<std::mutex> lock(mu);
    pending -= item.bytes;
    busy = false;
    idle_cv.notify_all();
  }
}

RemoteTier::RemoteTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RemoteTier::~RemoteTier() {
  Flush(std::max(impl_->o.timeout_ms, 1000) / 1e3);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  impl_->publisher.join();
}

Status RemoteTier::CheckOptions(const RemoteOptions& options) {
  TIERKV_RETURN_IF_ERROR(ParseUrl(options.url).status());
  if (options.ttl_s < 1) return Status::InvalidArgument("the remote cache's TTL must be at least 1 second");
  if (options.timeout_ms < 1) return Status::InvalidArgument("the remote cache's timeout must be at least 1 ms");
  return Status::Ok();
}

Result<std::unique_ptr<RemoteTier>> RemoteTier::Create(const RemoteOptions& options, const ModelFingerprint& model,
                                                       const KvGeometry& geometry, uint64_t block_bytes) {
  auto impl = std::make_unique<Impl>();
  impl->o = options;
  TIERKV_RETURN_IF_ERROR(CheckOptions(options));
  TIERKV_ASSIGN_OR_RETURN(impl->ep, ParseUrl(options.url));
  // hiredis writes with write(2): a server that went away would raise SIGPIPE and end
  // the process. Ignored unless the program chose a handler of its own.
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
  if (!options.password.empty()) impl->ep.password = options.password;
  impl->model = model;
  impl->g = geometry;
  impl->block_bytes = block_bytes;
  impl->health.url = impl->ep.display;
  impl->conn = std::make_unique<Connection>(impl->ep, options.timeout_ms, &impl->health);
  Impl* raw = impl.get();
  impl->publisher = std::thread([raw] { raw->PublishLoop(); });
  return std::unique_ptr<RemoteTier>(new RemoteTier(std::move(impl)));
}

int RemoteTier::Extend(KvCache& cache, SeqId s, std::span<const int32_t> prompt, int limit,
                       double recompute_s_per_token) {
  Impl& m = *impl_;
  const int B = m.g.block_tokens;
  int have = cache.Length(s);
  const int first = have / B;
  limit = static_cast<int>(std::min<size_t>(static_cast<size_t>(std::max(limit, 0)), prompt.size()));
  // The full blocks of the prompt; a block past the limit is fetched and then cut at it
  // (the tokens past the limit are computed again by the caller).
  const int last = static_cast<int>(prompt.size()) / B;
  if (first >= last || have >= limit) return have;
  const auto t0 = Clock::now();
  const std::vector<uint64_t> keys =
      SessionFile::ContentKeys(m.model, m.g, prompt.first(static_cast<size_t>(last) * static_cast<size_t>(B)));
  const auto tokens_of = [&](int b) { return prompt.subspan(static_cast<size_t>(b) * B, static_cast<size_t>(B)); };
  const auto drop = [&](int b, int layer) {  // a bad value and its marker: a later writer replaces them
    std::vector<Reply> ignored;
    std::vector<std::string> k{m.Key(keys[static_cast<size_t>(b)], -1)};
    if (layer >= 0) k.push_back(m.Key(keys[static_cast<size_t>(b)], layer));
    Command del{"DEL"};
    for (const std::string& key : k) del.push_back(key);
    (void)m.conn->Run({del}, &ignored);
  };
  const auto refused = [&](int b, int layer, const std::string& why) {
    m.Count(&RemoteStats::verify_failures, 1);
    if (!m.warned_bad_value.exchange(true)) {
      spdlog::warn("remote KV cache {}: prompt block {}{} {}; not used (removed), computed instead", m.health.url, b,
                   layer >= 0 ? " layer " + std::to_string(layer) : std::string(" (its commit marker)"), why);
    }
    drop(b, layer);
  };

  // The committed run of blocks from `first`, markers checked against the prompt's tokens.
  int found = 0;
  bool ended = false;
  std::vector<Reply> replies;
  std::vector<std::string> names;
  std::vector<Command> cmds;
  for (int b = first; b < last && !ended; b += kLookupBatch) {
    const int e = std::min(last, b + kLookupBatch);
    names.clear();
    cmds.clear();
    for (int i = b; i < e; ++i) names.push_back(m.Key(keys[static_cast<size_t>(i)], -1));
    for (const std::string& n : names) cmds.push_back({"GET", n});
    if (!m.conn->Run(cmds, &replies)) break;
    for (int i = b; i < e; ++i) {
      const redisReply* r = replies[static_cast<size_t>(i - b)].get();
      if (!m.MarkerMatches(r, i, keys[static_cast<size_t>(i)], tokens_of(i))) {
        if (r->type != REDIS_REPLY_NIL) refused(i, -1, "is not this block's commit marker");
        ended = true;
        break;
      }
      ++found;
    }
  }
  const auto finish = [&](int reused_blocks) {
    m.Count(&RemoteStats::miss_blocks, static_cast<uint64_t>(last - first - reused_blocks));
    m.Count(&RemoteStats::fetch_us,
            static_cast<uint64_t>(std::chrono::duration<double, std::micro>(Clock::now() - t0).count()));
    return have;
  };
  const int gain = std::min((first + found) * B, limit) - have;
  if (gain <= 0) return finish(0);

  // Worth it? (No estimate yet: fetch, and measure.)
  const uint64_t bytes = static_cast<uint64_t>(found) * static_cast<uint64_t>(m.g.n_layers) * m.value_bytes();
  if (recompute_s_per_token > 0 && m.fetch_bytes_per_s > 0 &&
      static_cast<double>(bytes) / m.fetch_bytes_per_s > gain * recompute_s_per_token) {
    m.Count(&RemoteStats::skipped_slower, 1);
    return finish(0);
  }

  if (have > first * B) {
    if (!cache.Truncate(s, first * B).ok()) return finish(0);
    have = first * B;
  }
  const int base = have;
  if (m.o.before_fetch) m.o.before_fetch();
  const auto f0 = Clock::now();
  uint64_t fetched = 0;
  int reused = 0;
  const int per_batch = static_cast<int>(std::max<uint64_t>(1, kFetchBatchBytes / (m.g.n_layers * m.value_bytes())));
  bool stopped = false;
  for (int b = first; b < first + found && !stopped; b += per_batch) {
    const int e = std::min(first + found, b + per_batch);
    names.clear();
    cmds.clear();
    for (int i = b; i < e; ++i) {
      for (int l = 0; l < m.g.n_layers; ++l) names.push_back(m.Key(keys[static_cast<size_t>(i)], l));
    }
    for (const std::string& n : names) cmds.push_back({"GET", n});
    if (!m.conn->Send(cmds)) break;
    // Each value verified and copied into its page as it comes (one reply in memory at once).
    for (int i = b; i < e && !stopped; ++i) {
      int bad_layer = -1;
      std::string why;
      bool gone = false;
      const Status st = cache.AppendBlock(s, B, [&](int l, std::byte* dst) {
        Reply r = m.conn->Next();
        if (!r) return false;  // the connection failed (warned)
        why = m.CheckValue(r.get(), i, l, keys[static_cast<size_t>(i)]);
        if (!why.empty()) {
          bad_layer = l;
          gone = r->type == REDIS_REPLY_NIL;
          return false;
        }
        std::memcpy(dst, r->str + BlockRecordHeader::kBytes, m.block_bytes);
        fetched += r->len;
        return true;
      });
      if (st.ok()) {
        have += B;
        ++reused;
        continue;
      }
      stopped = true;
      m.conn->Drain();
      if (bad_layer < 0) break;
      if (gone) {
        drop(i, -1);  // evicted under the marker: the block is published again by the next writer
      } else {
        refused(i, bad_layer, why);
      }
    }
  }
  if (have > limit) {
    (void)cache.Truncate(s, limit);  // cannot fail: limit < Length(s)
    have = limit;
  }
  const double secs = std::chrono::duration<double>(Clock::now() - f0).count();
  if (fetched > 0 && secs > 0) m.fetch_bytes_per_s = static_cast<double>(fetched) / secs;
  m.Count(&RemoteStats::hit_blocks, static_cast<uint64_t>(reused));
  m.Count(&RemoteStats::hit_tokens, static_cast<uint64_t>(std::max(have - base, 0)));
  m.Count(&RemoteStats::fetched_bytes, fetched);
  return finish(reused);
}

int RemoteTier::Publish(KvCache& cache, SeqId s, std::span<const int32_t> tokens, int first_block) {
  Impl& m = *impl_;
  const int B = m.g.block_tokens;
  const int n_full = static_cast<int>(std::min<size_t>(static_cast<size_t>(std::max(cache.Length(s), 0)), tokens.size())) / B;
  if (first_block >= n_full) return first_block;
  const std::vector<uint64_t> keys =
      SessionFile::ContentKeys(m.model, m.g, tokens.first(static_cast<size_t>(n_full) * static_cast<size_t>(B)));
  // Which the remote holds already (one round trip).
  std::vector<std::string> markers;
  std::vector<Command> cmds;
  for (int b = first_block; b < n_full; ++b) markers.push_back(m.Key(keys[static_cast<size_t>(b)], -1));
  for (const std::string& k : markers) cmds.push_back({"EXISTS", k});
  std::vector<Reply> replies;
  if (!m.conn->Run(cmds, &replies)) return first_block;
  MemoryManager& mm = cache.memory();
  // Copied first, then queued at once: the backlog never looks empty half-way.
  std::vector<Impl::Item> items;
  int next = n_full;
  uint64_t queued = 0;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    queued = m.pending;
  }
  for (int b = first_block; b < n_full; ++b) {
    const redisReply* r = replies[static_cast<size_t>(b - first_block)].get();
    if (r->type == REDIS_REPLY_INTEGER && r->integer == 1) {
      m.Count(&RemoteStats::present_blocks, 1);
      continue;
    }
    Impl::Item item;
    for (int l = 0; l < m.g.n_layers; ++l) {
      auto pin = mm.Acquire(cache.BlockPage(s, l, b), Tier::kHost);
      if (!pin.ok()) break;
      std::string v(m.value_bytes(), '\0');
      std::memcpy(v.data() + BlockRecordHeader::kBytes, pin->data(), m.block_bytes);
      BlockRecordHeader{static_cast<uint32_t>(l), static_cast<uint32_t>(b), static_cast<uint32_t>(B), m.block_bytes,
                        Checksum(pin->data(), m.block_bytes), keys[static_cast<size_t>(b)]}
          .EncodeTo(reinterpret_cast<std::byte*>(v.data()));
      item.keys.push_back(m.Key(keys[static_cast<size_t>(b)], l));
      item.bytes += v.size();
      item.values.push_back(std::move(v));
    }
    if (item.values.size() != static_cast<size_t>(m.g.n_layers)) {  // a page could not be read: tried again next time
      next = b;
      break;
    }
    item.keys.push_back(markers[static_cast<size_t>(b - first_block)]);
    item.values.push_back(m.Marker(b, keys[static_cast<size_t>(b)], tokens.subspan(static_cast<size_t>(b) * B, B)));
    item.bytes += item.values.back().size();
    if (queued + item.bytes > m.o.max_pending_bytes) {
      m.Count(&RemoteStats::dropped_blocks, static_cast<uint64_t>(n_full - b));
      next = b;
      break;
    }
    queued += item.bytes;
    items.push_back(std::move(item));
  }
  if (!items.empty()) {
    std::lock_guard<std::mutex> lock(m.mu);
    for (Impl::Item& item : items) {
      m.pending += item.bytes;
      m.queue.push_back(std::move(item));
    }
  }
  m.cv.notify_one();
  return next;
}

bool RemoteTier::Flush(double timeout_s) {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mu);
  return m.idle_cv.wait_for(lock, std::chrono::duration<double>(timeout_s),
                            [&] { return m.queue.empty() && !m.busy; });
}

RemoteStats RemoteTier::stats() const {
  RemoteStats out;
  {
    std::lock_guard<std::mutex> lock(impl_->stats_mu);
    out = impl_->st;
  }
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    out.pending_bytes = impl_->pending;
  }
  out.errors = impl_->health.errors;
  out.connected = impl_->health.up;
  return out;
}

const std::string& RemoteTier::display_url() const { return impl_->ep.display; }

std::string RemoteTier::Key(uint64_t content, int layer) const { return impl_->Key(content, layer); }

}  // namespace tierkv
