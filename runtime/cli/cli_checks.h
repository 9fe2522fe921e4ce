// runtime/cli/cli_checks.h
//
// CLI11 checks shared by the tierkv commands (runtime/cli/ and the tools in bench/tools/).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "memory/status.h"

namespace tierkv::tools {

// For counts and seeds: a value written with a leading '-' is refused ("--seed: must not
// be negative") before CLI11 converts it, which would wrap it to a huge unsigned number.
inline CLI::Validator NonNegative() {
  return CLI::Validator(
      [](std::string& v) { return v.rfind('-', 0) == 0 ? std::string("must not be negative") : std::string(); }, "");
}

// The exit code of a command that failed with st: 2 for a bad flag value (an
// InvalidArgument that starts with the flag's name, "--tokens must be at least 2"), as
// for CLI11's usage errors; 1 for everything else (bad input files, I/O, the machine).
inline int FailureExitCode(const Status& st) {
  return st.code() == StatusCode::kInvalidArgument && st.message().rfind("--", 0) == 0 ? 2 : 1;
}

}  // namespace tierkv::tools
