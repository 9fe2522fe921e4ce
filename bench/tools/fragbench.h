// bench/tools/fragbench.h
//
// `tierkv fragbench`: replays a KV-cache allocation workload (built-in generator or a CSV
// trace) against tierkv's paged frame allocator, a contiguous max-length reservation per
// session, glibc malloc and mimalloc, and reports utilisation, internal and external
// fragmentation and peaks over time (table on stderr, --csv, --svg, --json on stdout).
// The parts live in fragbench_workload.h, fragbench_replay.h and fragbench_report.h;
// docs/fragbench.md defines every number and format.
//
// Thread-safety: RunFragbench is not reentrant (the real-allocator replays measure
// process-wide heaps); call it from one thread at a time.
#pragma once

#include <cstdio>
#include <string>

#include "bench/tools/fragbench_replay.h"
#include "bench/tools/fragbench_workload.h"
#include "memory/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace tierkv::fragbench {

struct FragbenchOptions {
  std::string trace_path;    // non-empty: replay this trace instead of generating
  WorkloadOptions workload;  // generator settings (name, sessions, seed, chunk_tokens)
  ReplayOptions replay;
  std::string csv_path;         // time series, one row per sample and allocator
  std::string svg_path;         // chart
  std::string save_trace_path;  // the workload in the trace format, to edit or replay
  bool json = false;            // the summary as one JSON object on `out`
};

// Runs the whole tool: JSON (if asked) to `out`, the table to `err`. Errors are returned,
// not printed.
Status RunFragbench(const FragbenchOptions& options, std::FILE* out, std::FILE* err);

}  // namespace tierkv::fragbench

namespace tierkv::tools {

// Registers the "fragbench" subcommand; its callback sets exit_code (0 ok, 1 error, with
// one line "error: ..." on stderr).
void AddFragbenchCommand(CLI::App& app, int& exit_code);

}  // namespace tierkv::tools
