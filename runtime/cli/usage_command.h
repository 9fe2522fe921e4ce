// runtime/cli/usage_command.h
//
// Usage errors of every subcommand (an unknown flag or command, a missing or malformed
// value: CLI11's parse errors) reported as tierkv reports every refusal: one line on
// stderr starting with "error:", naming the problem and where the options are listed,
// and exit code 2. --help still prints the help and exits 0.
#pragma once

#include <CLI/CLI.hpp>

namespace tierkv {

// A CLI11 check for counts and seeds: a value written with a leading '-' is refused
// ("--seed: must not be negative") before CLI11 converts it, which would wrap it to a
// huge unsigned number.
CLI::Validator NonNegative();

// Prints e for the command line argv parsed by app; returns the exit code.
int ReportParseError(CLI::App& app, const CLI::ParseError& e, int argc, char** argv);

}  // namespace tierkv
