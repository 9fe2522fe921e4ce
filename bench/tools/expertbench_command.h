// bench/tools/expertbench_command.h
//
// `tierkv expertbench` (docs/expertbench.md): expert-paging policies compared on expert
// routing traces. Records the routing trace of a MoE model decoding a fixed text
// (builtin:tiny-moe by default) or reads one (--trace), generates a synthetic trace of
// the same shape with skewed expert popularity, and replays both
// (bench/tools/expert_trace.h) with LRU, 2Q and decayed LFU, each without and with the
// decoder's next-layer expert prefetch, at a compute-tier budget of a fraction of all
// experts. Prints a table on stderr and, with --json, one JSON object on stdout.
//
// Thread-safety: RunExpertbench runs one model at a time; call from one thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "bench/tools/expert_trace.h"
#include "memory/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace tierkv {

struct ExpertbenchOptions {
  std::string model = "builtin:tiny-moe";  // recorded when trace_path is empty
  std::string trace_path;                  // replay this CSV instead of recording
  std::string trace_out;                   // write the recorded (or read) trace here
  std::string synthetic_out;               // write the synthetic trace here
  int tokens = 512;                        // positions decoded (prompt + continuation)
  uint64_t seed = 1;                       // continuation sampler and synthetic generator
  int threads = 0;                         // kernel threads; 0 = all cores
  double budget_fraction = 0.25;           // of n_layer * n_expert expert pages
  // Synthetic generator (the shape comes from the model trace).
  double zipf_exponent = 1.0;
  double prediction_accuracy = 0.8;
  double locality = 0.25;
  // Replay setup (bench/tools/expert_trace.h): the compute tier, when the next layer's
  // prefetch is queued, and decayed LFU's half-life in accesses.
  tools::ReplayTiers tiers = tools::ReplayTiers::kHost;
  tools::PrefetchTiming timing = tools::PrefetchTiming::kBeforeLayer;
  double half_life = PolicyOptions{}.half_life;
  bool json = false;
};

// The fixed text the recorded trace decodes first (docs/expertbench.md); the rest of
// the positions are sampled at temperature 0.8 (top-k 40, top-p 0.95) with the seed.
extern const char* const kExpertbenchPrompt;

// Runs the whole benchmark: JSON (if asked) to `out`, the table to `err`.
Status RunExpertbench(const ExpertbenchOptions& options, std::FILE* out, std::FILE* err);

// Registers `tierkv expertbench`; its callback sets exit_code (0, or 1 after one
// "error: ..." line on stderr).
void AddExpertbenchCommand(CLI::App& app, int& exit_code);

}  // namespace tierkv
