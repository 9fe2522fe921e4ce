// bench/tools/fragbench.cc
#include "bench/tools/fragbench.h"

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <memory>

#include "runtime/cli/cli_checks.h"
#include "bench/tools/fragbench_report.h"
#include "memory/size.h"

namespace tierkv::fragbench {
namespace {

// stdio rather than a stream: fopen/fwrite/fclose set errno, so the error can say why.
Status WriteFile(const std::string& path, const std::string& text, const char* what) {
  const std::string context = std::string("cannot write ") + what + " " + path;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return Status::FromErrno(errno, context);
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int write_errno = errno;
  if (std::fclose(f) != 0 || !written) return Status::FromErrno(written ? errno : write_errno, context);
  return Status::Ok();
}

}  // namespace

Status RunFragbench(const FragbenchOptions& options, std::FILE* out, std::FILE* err) {
  const auto start = std::chrono::steady_clock::now();
  Result<Workload> workload =
      options.trace_path.empty() ? GenerateWorkload(options.workload) : LoadTrace(options.trace_path);
  if (!workload.ok()) return workload.status();
  if (!options.save_trace_path.empty()) {
    TIERKV_RETURN_IF_ERROR(WriteFile(options.save_trace_path, FormatTrace(*workload), "trace"));
  }
  Result<ReplayResult> result = Replay(*workload, options.replay);
  if (!result.ok()) return result.status();
  if (!options.csv_path.empty()) {
    TIERKV_RETURN_IF_ERROR(WriteFile(options.csv_path, FormatCsv(*result), "CSV"));
  }
  if (!options.svg_path.empty()) {
    TIERKV_RETURN_IF_ERROR(WriteFile(options.svg_path, RenderSvg(*workload, options.replay, *result), "SVG"));
  }
  const double elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fputs(FormatTable(*workload, options.replay, *result).c_str(), err);
  std::fprintf(err, "  took %.2f s\n", elapsed_s);
  if (options.json) {
    const std::string text = SummaryJson(*workload, options.replay, *result, elapsed_s)
                                 .dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
    // Not flushed here: main's FinishOutput flushes stdout once and names a failed
    // write's reason (docs/cli.md).
    std::fprintf(out, "%s\n", text.c_str());
  }
  return Status::Ok();
}

}  // namespace tierkv::fragbench

namespace tierkv::tools {

void AddFragbenchCommand(CLI::App& app, int& exit_code) {
  using fragbench::FragbenchOptions;
  // Flag values land here; the subcommand (and so this state) lives as long as `app`.
  struct State {
    FragbenchOptions options;
    std::string bytes_per_token = "96KiB";
    std::string arena;
    std::string allocators = "all";
    CLI::Option* workload = nullptr;
    std::vector<CLI::Option*> generator_only;
  };
  auto state = std::make_shared<State>();
  FragbenchOptions& o = state->options;

  CLI::App* sub = app.add_subcommand(
      "fragbench",
      "Replay a KV-cache allocation workload against paged, contiguous, malloc and mimalloc allocation; "
      "report utilisation, fragmentation and peaks (docs/fragbench.md)");
  state->workload =
      sub->add_option("--workload", o.workload.name, "Built-in workload: default, chat or long")->capture_default_str();
  sub->add_option("--trace", o.trace_path, "Replay a CSV trace of time,op,session,tokens events instead");
  state->generator_only = {
      sub->add_option("--sessions", o.workload.sessions, "Sessions the generator makes")->capture_default_str(),
      sub->add_option("--seed", o.workload.seed, "Generator seed")->check(NonNegative())->capture_default_str(),
      sub->add_option("--chunk-tokens", o.workload.chunk_tokens, "Tokens a session adds per grow event")
          ->capture_default_str(),
  };
  sub->add_option("--bytes-per-token", state->bytes_per_token,
                  "KV bytes of one token over all layers (default: Qwen3-30B-A3B f16, 96KiB)")
      ->capture_default_str();
  sub->add_option("--block-tokens", o.replay.block_tokens, "Tokens per block (one frame each)")->capture_default_str();
  sub->add_option("--max-tokens", o.replay.max_tokens, "Tokens the contiguous baseline reserves per session")
      ->capture_default_str();
  sub->add_option("--arena", state->arena,
                  "Arena of the paged and contiguous allocators, e.g. 24GiB (default: the workload's peak demand)");
  sub->add_option("--samples", o.replay.samples, "Sample points over time")->capture_default_str();
  sub->add_option("--real-scale", o.replay.real_scale,
                  "Divide bytes by N in the malloc/mimalloc replays (for strict overcommit or ulimit -v)")
      ->capture_default_str();
  sub->add_option("--allocators", state->allocators, "Comma list: paged,contiguous,malloc,mimalloc or all")
      ->capture_default_str();
  sub->add_option("--csv", o.csv_path, "Write the time series as CSV");
  sub->add_option("--svg", o.svg_path, "Write a chart as SVG");
  sub->add_option("--save-trace", o.save_trace_path, "Write the workload as a CSV trace");
  sub->add_flag("--json", o.json, "Print the summary as one JSON object on stdout");

  sub->callback([state, &exit_code] {
    auto run = [&]() -> Status {
      FragbenchOptions& o = state->options;
      if (!o.trace_path.empty()) {
        if (state->workload->count() > 0) return Status::InvalidArgument("--trace and --workload exclude each other");
        for (CLI::Option* opt : state->generator_only) {
          if (opt->count() > 0) {
            return Status::InvalidArgument(opt->get_name() + " applies to generated workloads, not to --trace");
          }
        }
      }
      Result<uint64_t> bpt = ParseSize(state->bytes_per_token);
      if (!bpt.ok()) return bpt.status().Annotate("--bytes-per-token");
      o.replay.bytes_per_token = *bpt;
      if (!state->arena.empty()) {
        Result<uint64_t> arena = ParseSize(state->arena);
        if (!arena.ok()) return arena.status().Annotate("--arena");
        if (*arena == 0)
          return Status::InvalidArgument("--arena must be larger than 0 (omit it to size the arena to the workload)");
        o.replay.arena_bytes = *arena;
      }
      Result<std::vector<fragbench::AllocatorKind>> kinds = fragbench::ParseAllocatorList(state->allocators);
      if (!kinds.ok()) return kinds.status().Annotate("--allocators");
      o.replay.allocators = *kinds;
      return fragbench::RunFragbench(o, stdout, stderr);
    };
    const Status st = run();
    if (!st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.message().c_str());
      exit_code = FailureExitCode(st);
    }
  });
}

}  // namespace tierkv::tools
