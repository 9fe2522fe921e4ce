// runtime/cli/main.cc
//
// The tierkv command line (DESIGN.md, CLI contract). Each subcommand registers itself
// with Add<Name>Command(app, exit_code) and sets exit_code from its callback; errors are
// one line on stderr and a non-zero exit (usage errors: exit 2, runtime/cli/usage_command.h).
#include <csignal>
#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "bench/tools/fragbench.h"
#include "bench/tools/probe.h"
#include "bench/tools/expertbench_command.h"
#include "runtime/cli/info_command.h"
#include "runtime/cli/make_model_command.h"
#include "runtime/cli/run_command.h"
#include "runtime/cli/serve_command.h"
#include "runtime/cli/session_command.h"
#include "runtime/cli/usage_command.h"

int main(int argc, char** argv) {
  if (!tierkv::KeepStandardFdsOpen()) return 1;  // no /dev/null: nowhere safe to write
  // Reports go out whole at the end (FinishOutput's flush), where a failed write still
  // has its errno to name; `tierkv run`'s text is flushed piece by piece as it is
  // generated (runtime/cli/run_command.h), each flush checked the same way.
  static char out_buffer[1 << 20];
  std::setvbuf(stdout, out_buffer, _IOFBF, sizeof out_buffer);
  // A reader that went away (`tierkv run ... | head`) is a failed write (EPIPE) named on
  // stderr with exit 1, as a full disk is, rather than a silent death by SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  spdlog::set_default_logger(spdlog::stderr_color_mt("tierkv"));
  spdlog::set_pattern("%^%l%$: %v");

  CLI::App app{"tierkv: tiered memory runtime for long-context LLM decoding"};
  app.require_subcommand(1);
  int exit_code = 0;
  tierkv::tools::AddProbeCommand(app, exit_code);
  tierkv::tools::AddFragbenchCommand(app, exit_code);
  tierkv::AddInfoCommand(app, exit_code);
  tierkv::AddSessionCommand(app, exit_code);
  tierkv::AddRunCommand(app, exit_code);
  tierkv::AddExpertbenchCommand(app, exit_code);
  tierkv::AddMakeModelCommand(app, exit_code);
  tierkv::AddServeCommand(app, exit_code);

  app.set_version_flag("--version", "tierkv " TIERKV_VERSION);
  // `tierkv run --version` prints the version too, rather than "--model is required":
  // a flag a subcommand does not know falls through to the top level.
  const auto fall_through = [](CLI::App* parent, const auto& self) -> void {
    for (CLI::App* sub : parent->get_subcommands({})) {
      sub->fallthrough();
      self(sub, self);
    }
  };
  fall_through(&app, fall_through);
  if (const std::string bad = tierkv::NormalizeLlamaFlags(argc, argv); !bad.empty()) {
    std::fprintf(stderr, "error: %s\n", bad.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return tierkv::FinishOutput(tierkv::ReportParseError(app, e, argc, argv), stdout);  // --help, --version print
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return tierkv::FinishOutput(exit_code, stdout);
}
