// bench/tools/expert_trace.h
//
// Expert routing traces and their replay against the MemoryManager's residency
// policies (`tierkv expertbench`, docs/expertbench.md). A trace is what a MoE decoder's
// routers chose, per token per MoE layer, and what was predicted for that layer one
// layer earlier. Replaying it with a compute tier that holds a fixed number of expert
// pages measures a policy's expert hit rate and the bytes it moves per token, without
// running the model.
//
// Sources of traces: the decoder (runtime/cli/expertbench_command.cc records one from
// builtin:tiny-moe; this file does not depend on runtime/), a CSV file, or the
// synthetic skewed generator below.
//
// Thread-safety: pure functions of their arguments; ReplayExpertTrace builds a private
// MemoryManager per call, so calls may run concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memory/policy.h"
#include "memory/status.h"

namespace tierkv::tools {

// One routing decision of one MoE layer for one token.
struct ExpertStep {
  int32_t pos = 0;
  int32_t layer = 0;
  std::vector<int32_t> experts;    // chosen, in router order: n_used distinct ids
  std::vector<int32_t> predicted;  // predicted one layer earlier; empty = no prediction
};

// Records come in decode order: the records of one token are consecutive (a token is
// a maximal run of records with the same pos) and their layers strictly increase.
// Invariants (ValidateExpertTrace):
//   0 <= layer < n_layer; experts.size() == n_used; predicted.size() <= n_expert
//   every id in [0, n_expert); no id twice within experts, nor within predicted
struct ExpertTrace {
  int32_t n_layer = 0;
  int32_t n_expert = 0;
  int32_t n_used = 0;
  uint64_t expert_bytes = 0;  // bytes of one expert page (gate + up + down)
  std::vector<ExpertStep> steps;
};

Status ValidateExpertTrace(const ExpertTrace& trace);
// Number of tokens: runs of consecutive records with the same pos.
uint64_t CountTokens(const ExpertTrace& trace);

// CSV (docs/expertbench.md):
//   n_layer=4,n_expert=32,n_used=4,expert_bytes=208896      <- first non-comment line
//   # pos,layer,experts,predicted                            <- '#' lines: comments
//   0,0,3 17 5 9,                                            <- one line per record
//   0,1,2 4 6 8,2 4 7 8
// ids are space-separated; an empty predicted field means no prediction. Blank lines
// are skipped. Errors are one line: "<source>:<line>: <what>".
std::string FormatExpertTraceCsv(const ExpertTrace& trace);
Result<ExpertTrace> ParseExpertTraceCsv(std::string_view text, const std::string& source = "trace");
Status WriteExpertTraceCsv(const ExpertTrace& trace, const std::string& path);
Result<ExpertTrace> ReadExpertTraceCsv(const std::string& path);

// Synthetic trace with skewed expert popularity (docs/expertbench.md, Generator).
//   Popularity: in each layer, the expert of popularity rank r (0-based) has weight
//     w(r) = 1 / (r + 1)^zipf_exponent; ranks map to expert ids through a per-layer
//     random permutation, so the popular experts differ between layers.
//   Temporal locality: each of the previous token's experts of the same layer is kept
//     with probability `locality` (in its slot order); the remaining slots are drawn by
//     popularity without replacement. locality = 0: tokens are independent.
//   Predictions (layers >= 1): slot i predicts the chosen experts[i] with probability
//     `prediction_accuracy`, else an expert drawn by popularity among those neither
//     chosen nor already predicted; so each predicted id is right with exactly that
//     probability. Layer 0 has no prediction (the decoder's former rule: it now predicts
//     layer 0 from the token's embedding; the generator keeps the old rule so that its
//     traces and figures stay comparable).
// Randomness is SplitMix64 from `seed`, with no std:: distributions, so a seed gives
// the same trace on every platform.
struct SyntheticTraceOptions {
  uint64_t seed = 1;
  int32_t tokens = 512;
  int32_t n_layer = 4;
  int32_t n_expert = 32;
  int32_t n_used = 4;
  uint64_t expert_bytes = 208896;
  double zipf_exponent = 1.0;
  double prediction_accuracy = 0.8;
  double locality = 0.25;
};
Result<ExpertTrace> SyntheticSkewedTrace(const SyntheticTraceOptions& options);

// Share of predicted ids that the router then chose (0 when nothing was predicted).
double PredictionAccuracy(const ExpertTrace& trace);

// Where the compute tier sits (the decoder's two setups):
//   kHost:   CPU decoding. The Host arena is the compute tier and the only one; an
//            evicted expert is dropped (its backing remains), so the residency policy
//            forgets it (decayed LFU restarts its count when it comes back).
//   kDevice: GPU decoding. A Device arena (sim, unthrottled) is the compute tier over a
//            Host arena that holds every expert; an expert evicted from Device stays on
//            Host, so the policy keeps its history. First-touch reads into Host are not
//            counted in bytes moved (only Device bytes_in).
enum class ReplayTiers { kHost, kDevice };
// When the prefetch of layer l + 1's predicted experts is issued:
//   kBeforeLayer:  before layer l acquires its experts (what the decoder does: it queues
//                  layer l + 1's pages before layer l computes);
//   kAfterExperts: after layer l's experts are acquired and released, so layer l's
//                  misses cannot evict layer l + 1's prefetched pages.
enum class PrefetchTiming { kBeforeLayer, kAfterExperts };

struct ReplayOptions {
  PolicyKind policy = PolicyKind::kDecayedLfu;
  PolicyOptions policy_options;  // the MemoryManager defaults
  bool prefetch = false;
  uint64_t budget_pages = 0;     // expert pages the compute tier holds; >= 1
  ReplayTiers tiers = ReplayTiers::kHost;
  PrefetchTiming timing = PrefetchTiming::kBeforeLayer;
};

struct ReplayResult {
  uint64_t tokens = 0;
  uint64_t acquires = 0;          // one per chosen expert per record
  uint64_t hits = 0;              // Pin::hit(): on the tier already (or prefetched)
  uint64_t misses = 0;            // acquires - hits
  uint64_t prefetch_requests = 0; // predicted pages handed to Prefetch
  // Right predictions whose acquire still missed: the prefetched page was evicted (or
  // never fetched) before its layer ran.
  uint64_t prefetch_lost = 0;
  uint64_t bytes_in = 0;          // compute tier bytes_in (demand misses + prefetches)
  double hit_rate = 0;            // hits / acquires
  double bytes_moved_per_token = 0;  // bytes_in / tokens
};

// Replays `trace` in decode order against a fresh MemoryManager whose compute tier
// holds exactly budget_pages expert pages (`tiers` says which arena that is; no Disk
// tier); every expert is a page backed by a PageSource that costs nothing to read (the
// GGUF mapping's role). For each token, for each record (layer l):
//   1. if prefetch and the token's next record is layer l + 1 with a prediction:
//      Prefetch(those pages), and wait for the ticket (deterministic replay);
//   2. Acquire each chosen expert of layer l in router order, count Pin::hit(), release.
// (With PrefetchTiming::kAfterExperts, step 1 comes after step 2.) The default order is
// the decoder's: it queues layer l + 1's predicted experts before layer l computes.
// Deterministic: the same trace and options give the same result.
Result<ReplayResult> ReplayExpertTrace(const ExpertTrace& trace, const ReplayOptions& options);

// The oracle: Belady's MIN over the trace's acquires (in ReplayExpertTrace's order,
// demand only), with a compute tier of budget_pages expert pages: on a miss with the tier
// full, the page evicted is the one whose next acquire lies furthest ahead (or never
// comes). No policy that fetches only on demand hits more often (prefetching ones can).
// bytes_in: misses x expert_bytes. REQUIRES: a valid trace, budget_pages >= 1.
Result<ReplayResult> OracleReplay(const ExpertTrace& trace, uint64_t budget_pages);

}  // namespace tierkv::tools
