// bench/tools/fragbench_workload.cc
#include "bench/tools/fragbench_workload.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <unordered_map>

namespace tierkv::fragbench {
namespace {

// xoshiro256** seeded through splitmix64: a fixed, library-independent generator, so a
// seed names the same workload with every standard library (std::*_distribution does
// not promise that).
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (auto& s : state_) {
      seed += 0x9e3779b97f4a7c15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      s = z ^ (z >> 31);
    }
  }
  uint64_t Next() {
    const uint64_t result = Rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = Rotl(state_[3], 45);
    return result;
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  // Uniform integer in [lo, hi].
  uint32_t Between(uint32_t lo, uint32_t hi) {
    const uint64_t range = uint64_t{hi} - lo + 1;
    return lo + static_cast<uint32_t>((static_cast<unsigned __int128>(Next()) * range) >> 64);
  }
  double Exponential(double mean) { return -std::log1p(-Uniform()) * mean; }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t state_[4];
};

struct LengthClass {
  double weight;
  uint32_t min_tokens, max_tokens;
};

constexpr uint32_t kKi = 1024;
// Session length mixtures (final tokens). "default": many short chats, some medium
// documents, and a tail of 128K-190K-token sessions.
const std::vector<LengthClass>* FindMix(const std::string& name) {
  static const std::vector<LengthClass> kDefault = {
      {0.70, 1 * kKi, 16 * kKi}, {0.22, 32 * kKi, 64 * kKi}, {0.08, 128 * kKi, 190 * kKi}};
  static const std::vector<LengthClass> kChat = {{1.0, 1 * kKi, 16 * kKi}};
  static const std::vector<LengthClass> kLong = {{1.0, 128 * kKi, 190 * kKi}};
  if (name == "default") return &kDefault;
  if (name == "chat") return &kChat;
  if (name == "long") return &kLong;
  return nullptr;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

template <typename T>
bool ParseUnsigned(std::string_view s, T* out) {
  if (s.empty()) return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

bool ParseTime(std::string_view s, double* out) {
  if (s.empty()) return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size() && std::isfinite(*out) && *out >= 0;
}

// (Appended rather than "'" + std::string(...) + "'": GCC 12 warns, falsely, that the
// concatenation's memcpy may overlap, -Wrestrict.)
std::string Quote(std::string_view s) {
  std::string q = "'";
  q.append(s.substr(0, 40)).append("'");
  return q;
}

}  // namespace

const char* OpName(Op op) {
  switch (op) {
    case Op::kAlloc:
      return "alloc";
    case Op::kGrow:
      return "grow";
    case Op::kFree:
      return "free";
  }
  return "?";
}

std::vector<std::string> WorkloadNames() { return {"default", "chat", "long"}; }

Result<Workload> GenerateWorkload(const WorkloadOptions& options) {
  const std::vector<LengthClass>* mix = FindMix(options.name);
  if (mix == nullptr) {
    return Status::InvalidArgument("--workload: unknown workload '" + options.name +
                                   "' (expected default, chat or long, or use --trace FILE)");
  }
  if (options.sessions == 0) return Status::InvalidArgument("--sessions must be at least 1");
  if (options.chunk_tokens == 0 || options.prefill_chunk_tokens == 0) {
    return Status::InvalidArgument("--chunk-tokens must be at least 1");
  }
  if (!(options.growth_tokens_per_s > 0) || !(options.prefill_tokens_per_s > 0) || !(options.mean_concurrency > 0)) {
    return Status::InvalidArgument("token rates and mean concurrency must be positive");
  }

  // Mean session lifetime, to turn the wanted mean concurrency into an arrival rate
  // (Little's law: concurrency = arrival rate * lifetime). The prompt is on average
  // half the session and is prefilled fast; the rest grows at growth_tokens_per_s; one
  // chunk interval of reading before the session leaves.
  const double interval_s = options.chunk_tokens / options.growth_tokens_per_s;
  double mean_tokens = 0, total_weight = 0;
  for (const auto& c : *mix) {
    mean_tokens += c.weight * (static_cast<double>(c.min_tokens) + c.max_tokens) / 2;
    total_weight += c.weight;
  }
  mean_tokens /= total_weight;
  const double mean_lifetime_s =
      0.5 * mean_tokens / options.prefill_tokens_per_s + 0.5 * mean_tokens / options.growth_tokens_per_s + interval_s;
  const double mean_gap_s = mean_lifetime_s / options.mean_concurrency;

  Rng rng(options.seed);
  Workload w;
  w.name = options.name;
  w.seed = options.seed;
  w.sessions.reserve(options.sessions);
  double arrival = 0;
  for (uint32_t i = 0; i < options.sessions; ++i) {
    if (i > 0) arrival += rng.Exponential(mean_gap_s);
    double pick = rng.Uniform() * total_weight;
    const LengthClass* cls = &mix->back();
    for (const auto& c : *mix) {
      if (pick < c.weight) {
        cls = &c;
        break;
      }
      pick -= c.weight;
    }
    const uint32_t length = rng.Between(cls->min_tokens, cls->max_tokens);
    const double prompt_fraction = 0.25 + 0.5 * rng.Uniform();
    const uint32_t prompt = std::clamp<uint32_t>(static_cast<uint32_t>(length * prompt_fraction), 1, length);

    SessionInfo info;
    info.id = i;
    info.final_tokens = length;
    const auto index = static_cast<uint32_t>(w.sessions.size());
    // Each chunk's event is at the start of its computation: KV space is taken before
    // the tokens are written.
    double t = arrival;
    uint32_t held = 0;
    while (held < length) {
      const bool prefill = held < prompt;
      const uint32_t add = prefill ? std::min(options.prefill_chunk_tokens, prompt - held)
                                   : std::min(options.chunk_tokens, length - held);
      w.events.push_back({t, held == 0 ? Op::kAlloc : Op::kGrow, index, add});
      ++info.chunks;
      held += add;
      t += add / (prefill ? options.prefill_tokens_per_s : options.growth_tokens_per_s);
    }
    w.events.push_back({t + interval_s, Op::kFree, index, 0});
    w.sessions.push_back(info);
  }
  // Stable: ties keep generation order, so a seed names one event order.
  std::stable_sort(w.events.begin(), w.events.end(),
                   [](const Event& a, const Event& b) { return a.time_s < b.time_s; });
  TIERKV_RETURN_IF_ERROR(CheckWorkload(w).Annotate("internal: generated workload"));
  return w;
}

Result<Workload> ParseTrace(std::string_view text, const std::string& source) {
  Workload w;
  w.name = source;
  w.from_trace = true;
  std::unordered_map<uint64_t, uint32_t> live;  // trace id -> session index
  uint32_t line_no = 0;
  bool seen_data = false;
  double last_time = 0;
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    std::string_view line = Trim(text.substr(0, eol));
    text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
    ++line_no;
    if (line.empty() || line.front() == '#') continue;
    auto fail = [&](const std::string& what) {
      return Status::InvalidArgument(source + ":" + std::to_string(line_no) + ": " + what);
    };

    std::vector<std::string_view> f;
    for (size_t start = 0;;) {
      const size_t comma = line.find(',', start);
      f.push_back(Trim(line.substr(start, comma == std::string_view::npos ? line.npos : comma - start)));
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    if (!seen_data && f.size() == 4 && f[0] == "time" && f[1] == "op" && f[2] == "session" && f[3] == "tokens") {
      seen_data = true;  // the optional header
      continue;
    }
    seen_data = true;
    if (f.size() != 4 && !(f.size() == 3 && f[1] == "free")) {
      return fail("expected 4 fields time,op,session,tokens, found " + std::to_string(f.size()));
    }
    Event e;
    if (!ParseTime(f[0], &e.time_s)) {
      return fail("bad time " + Quote(f[0]) + " (expected seconds, a number >= 0)");
    }
    if (e.time_s < last_time) {
      return fail("time " + std::string(f[0]) + " is earlier than the previous event's; events must be in time order");
    }
    last_time = e.time_s;
    if (f[1] == "alloc")
      e.op = Op::kAlloc;
    else if (f[1] == "grow")
      e.op = Op::kGrow;
    else if (f[1] == "free")
      e.op = Op::kFree;
    else
      return fail("unknown op " + Quote(f[1]) + " (expected alloc, grow or free)");
    uint64_t id = 0;
    if (!ParseUnsigned(f[2], &id)) return fail("bad session id " + Quote(f[2]) + " (expected an integer >= 0)");

    const std::string_view tokens_field = f.size() == 4 ? f[3] : std::string_view();
    if (e.op == Op::kFree) {
      uint32_t zero = 0;
      if (!tokens_field.empty() && !(ParseUnsigned(tokens_field, &zero) && zero == 0)) {
        return fail("free takes no tokens (leave the field empty or 0), found " + Quote(tokens_field));
      }
    } else if (!ParseUnsigned(tokens_field, &e.tokens) || e.tokens == 0) {
      return fail(std::string("bad tokens ") + Quote(tokens_field) + " for " + OpName(e.op) +
                  " (expected an integer >= 1)");
    }

    auto it = live.find(id);
    if (e.op == Op::kAlloc) {
      if (it != live.end()) {
        return fail("session " + std::to_string(id) + " is already allocated (line " +
                    std::to_string(w.sessions[it->second].line) + ")");
      }
      e.session = static_cast<uint32_t>(w.sessions.size());
      live.emplace(id, e.session);
      w.sessions.push_back({id, e.tokens, 1, line_no});
    } else {
      if (it == live.end()) {
        return fail("session " + std::to_string(id) + " is not allocated (" + OpName(e.op) +
                    " needs an earlier alloc)");
      }
      e.session = it->second;
      SessionInfo& s = w.sessions[e.session];
      if (e.op == Op::kGrow) {
        if (uint64_t{s.final_tokens} + e.tokens > UINT32_MAX) {
          return fail("session " + std::to_string(id) + " grows past 2^32-1 tokens");
        }
        s.final_tokens += e.tokens;
        ++s.chunks;
      } else {
        live.erase(it);
      }
    }
    w.events.push_back(e);
  }
  if (w.events.empty()) return Status::InvalidArgument(source + ": trace has no events");
  return w;
}

Result<Workload> LoadTrace(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return Status::FromErrno(errno, "cannot open trace " + path);
  std::string text;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  if (failed) return Status::FromErrno(err, "cannot read trace " + path);
  return ParseTrace(text, path);
}

std::string FormatTrace(const Workload& workload) {
  std::string out = "# tierkv fragbench trace: " + workload.name + "\ntime,op,session,tokens\n";
  char buf[64];
  for (const Event& e : workload.events) {
    auto r = std::to_chars(buf, buf + sizeof(buf), e.time_s);  // shortest exact form
    out.append(buf, r.ptr);
    out += ',';
    out += OpName(e.op);
    out += ',';
    out += std::to_string(workload.sessions[e.session].id);
    out += ',';
    if (e.op != Op::kFree) out += std::to_string(e.tokens);
    out += '\n';
  }
  return out;
}

Status CheckWorkload(const Workload& w) {
  enum State : uint8_t { kNew, kLive, kFreed };
  std::vector<State> state(w.sessions.size(), kNew);
  std::vector<uint64_t> tokens(w.sessions.size(), 0);
  std::vector<uint32_t> chunks(w.sessions.size(), 0);
  for (size_t i = 0; i < w.events.size(); ++i) {
    const Event& e = w.events[i];
    const std::string at = "event " + std::to_string(i) + ": ";
    if (e.session >= w.sessions.size()) return Status::Internal(at + "session index out of range");
    if (i > 0 && e.time_s < w.events[i - 1].time_s) return Status::Internal(at + "time goes back");
    State& s = state[e.session];
    if (e.op == Op::kAlloc ? s != kNew : s != kLive) {
      return Status::Internal(at + OpName(e.op) + " in the wrong session state");
    }
    if ((e.op == Op::kFree) != (e.tokens == 0)) return Status::Internal(at + "bad token count");
    if (e.op == Op::kFree)
      s = kFreed;
    else {
      s = kLive;
      tokens[e.session] += e.tokens;
      ++chunks[e.session];
    }
  }
  for (size_t i = 0; i < w.sessions.size(); ++i) {
    if (state[i] == kNew) return Status::Internal("session " + std::to_string(i) + " never allocated");
    if (tokens[i] != w.sessions[i].final_tokens || chunks[i] != w.sessions[i].chunks) {
      return Status::Internal("session " + std::to_string(i) + ": final_tokens or chunks disagree with its events");
    }
  }
  return Status::Ok();
}

WorkloadStats ComputeWorkloadStats(const Workload& w, uint32_t block_tokens) {
  WorkloadStats st;
  std::vector<uint32_t> tokens(w.sessions.size(), 0);
  uint64_t live_tokens = 0, blocks = 0;
  uint32_t sessions = 0;
  auto blocks_of = [&](uint64_t t) { return (t + block_tokens - 1) / block_tokens; };
  for (const Event& e : w.events) {
    uint32_t& t = tokens[e.session];
    blocks -= blocks_of(t);
    if (e.op == Op::kFree) {
      live_tokens -= t;
      t = 0;
      --sessions;
    } else {
      if (e.op == Op::kAlloc) ++sessions;
      t += e.tokens;
      live_tokens += e.tokens;
    }
    blocks += blocks_of(t);
    st.peak_live_tokens = std::max(st.peak_live_tokens, live_tokens);
    st.peak_live_sessions = std::max(st.peak_live_sessions, sessions);
    st.peak_blocks = std::max(st.peak_blocks, blocks);
  }
  for (const SessionInfo& s : w.sessions) {
    st.total_tokens += s.final_tokens;
    st.max_session_tokens = std::max(st.max_session_tokens, s.final_tokens);
    if (s.final_tokens >= 128 * kKi) ++st.long_sessions;
  }
  return st;
}

}  // namespace tierkv::fragbench
