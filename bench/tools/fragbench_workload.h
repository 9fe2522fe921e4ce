// bench/tools/fragbench_workload.h
//
// fragbench workloads: a time-ordered list of alloc/grow/free events over sessions,
// made by a built-in generator (seeded, deterministic) or read from a CSV trace
// (format in docs/fragbench.md). Thread-safety: pure functions on plain values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memory/status.h"

namespace tierkv::fragbench {

enum class Op : uint8_t { kAlloc, kGrow, kFree };
const char* OpName(Op op);  // "alloc", "grow", "free"

// One event of a workload. `session` is a dense index into Workload::sessions: a trace
// that frees id 7 and later allocates id 7 again makes two sessions.
struct Event {
  double time_s = 0;  // seconds since the start; non-decreasing along a workload
  Op op = Op::kAlloc;
  uint32_t session = 0;  // index into Workload::sessions
  uint32_t tokens = 0;   // alloc: first tokens; grow: tokens added; free: 0
};

struct SessionInfo {
  uint64_t id = 0;            // the trace's session id (generated: the index)
  uint32_t final_tokens = 0;  // most tokens the session holds (it never shrinks)
  uint32_t chunks = 0;        // alloc + grow events: one allocation each in the malloc replay
  uint32_t line = 0;          // trace line of its alloc; 0 for generated workloads
};

// Invariants (CheckWorkload): events sorted by time; each session has exactly one alloc,
// which comes first, then grows, then at most one free (a session may stay live at the
// end); tokens > 0 except on free; sum of a session's tokens == final_tokens.
struct Workload {
  std::string name;         // "default", "chat", "long", or the trace path
  bool from_trace = false;  // ParseTrace made it
  uint64_t seed = 0;        // generated workloads only
  std::vector<Event> events;
  std::vector<SessionInfo> sessions;
  double duration_s() const { return events.empty() ? 0.0 : events.back().time_s; }
};

// Built-in generators. Defaults are the `default` workload of docs/fragbench.md.
struct WorkloadOptions {
  std::string name = "default";  // default | chat | long (WorkloadNames())
  uint32_t sessions = 1000;      // sessions that arrive over the run
  uint64_t seed = 42;            // fixed so two runs compare the same workload
  // The prompt is prefilled in chunks of this many tokens (llama.cpp's ubatch idea),
  // each one alloc/grow event: the first is the alloc.
  uint32_t prefill_chunk_tokens = 2048;
  double prefill_tokens_per_s = 2000;
  // After the prompt the session grows by this many tokens per grow event (decode and
  // user turns); smaller = more events.
  uint32_t chunk_tokens = 256;
  // Generation speed after the prompt (decode plus user turns), tokens per second.
  double growth_tokens_per_s = 50;
  // Mean live sessions; the Poisson arrival rate is derived from it and the mix.
  double mean_concurrency = 16;
};

std::vector<std::string> WorkloadNames();
Result<Workload> GenerateWorkload(const WorkloadOptions& options);

// Parses the CSV trace format. `source` names the input in errors:
// "trace.csv:12: unknown op 'allocate' (expected alloc, grow or free)".
Result<Workload> ParseTrace(std::string_view text, const std::string& source);
Result<Workload> LoadTrace(const std::string& path);
// Writes a workload in the trace format (ParseTrace(FormatTrace(w)) == w up to ids).
std::string FormatTrace(const Workload& workload);

// Returns an error naming the first violated invariant (tests; generator self-check).
Status CheckWorkload(const Workload& workload);

// Whole-workload aggregates computed in one pass; the replay sizes arenas from them.
struct WorkloadStats {
  uint64_t peak_live_tokens = 0;
  uint32_t peak_live_sessions = 0;
  uint64_t peak_blocks = 0;   // sum over live sessions of ceil(tokens / block_tokens)
  uint64_t total_tokens = 0;  // sum of final_tokens
  uint32_t max_session_tokens = 0;
  uint32_t long_sessions = 0;  // final_tokens >= 128 Ki tokens
};
WorkloadStats ComputeWorkloadStats(const Workload& workload, uint32_t block_tokens);

}  // namespace tierkv::fragbench
