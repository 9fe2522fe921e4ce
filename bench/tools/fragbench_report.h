// bench/tools/fragbench_report.h
//
// fragbench's outputs from a replay: the time series as CSV, the summary as one JSON
// object, a self-contained SVG chart, and the table printed on stderr. Columns and keys
// are documented in docs/fragbench.md. Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "bench/tools/fragbench_replay.h"
#include "bench/tools/fragbench_workload.h"

namespace tierkv::fragbench {

// One row per (sample time, available allocator), times ascending, with a header row.
std::string FormatCsv(const ReplayResult& result);

// The --json summary. elapsed_s: wall time of the whole run.
nlohmann::json SummaryJson(const Workload& workload, const ReplayOptions& options, const ReplayResult& result,
                           double elapsed_s);

// Two panels over time: bytes held per allocator (with live bytes and peak markers), and
// waste as a percentage of allocated bytes. Axes with units, tick labels, legend, title.
std::string RenderSvg(const Workload& workload, const ReplayOptions& options, const ReplayResult& result);

// The human-readable table for stderr.
std::string FormatTable(const Workload& workload, const ReplayOptions& options, const ReplayResult& result);

}  // namespace tierkv::fragbench
