// runtime/cli/usage_command.h
//
// Usage errors of every subcommand (an unknown flag or command, a missing or malformed
// value: CLI11's parse errors) reported as tierkv reports every refusal: one line on
// stderr starting with "error:", naming the problem and where the options are listed,
// and exit code 2. --help still prints the help and exits 0.
#pragma once

#include <cstdio>

#include <CLI/CLI.hpp>

namespace tierkv {

// Prints e for the command line argv parsed by app; returns the exit code.
int ReportParseError(CLI::App& app, const CLI::ParseError& e, int argc, char** argv);

// A -t/--threads request (0: all CPUs) held to the CPUs this process may run on
// (kernels::AvailableCpus), with a warning when lowered: the pool's workers spin between
// a step's jobs, so more threads than CPUs only take turns (docs/cli.md).
int ThreadsWithinCpus(int threads);

// Opens /dev/null on each of the standard descriptors 0, 1 and 2 that is closed, before
// anything else opens a file: otherwise the first file opened (a disk tier's arena, a
// session file) would take the number, and text meant for stderr would be written into
// it. Returns false if one could not be opened.
bool KeepStandardFdsOpen();

// The exit code once a command's output is flushed: a report that could not be written
// whole (a full disk, /dev/full) is a failure, "error: writing standard output: <reason>"
// and exit 1, where the command itself had succeeded.
int FinishOutput(int exit_code, std::FILE* out);

}  // namespace tierkv
