// runtime/cli/run_report_json.h
//
// `tierkv run --json`'s object (docs/cli.md, "--json"): the report of one run, its
// timings, tiers, decoder counters, session and (with --dump-logits) logits.
#pragma once

#include <nlohmann/json.hpp>

#include "runtime/run.h"

namespace tierkv {

nlohmann::json RunReportJson(const RunReport& report);

}  // namespace tierkv
