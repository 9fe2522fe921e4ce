// bench/tools/cli_checks.h
//
// CLI11 checks shared by the tierkv commands (the tools here and runtime/cli/).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace tierkv::tools {

// For counts and seeds: a value written with a leading '-' is refused ("--seed: must not
// be negative") before CLI11 converts it, which would wrap it to a huge unsigned number.
inline CLI::Validator NonNegative() {
  return CLI::Validator(
      [](std::string& v) { return v.rfind('-', 0) == 0 ? std::string("must not be negative") : std::string(); }, "");
}

}  // namespace tierkv::tools
