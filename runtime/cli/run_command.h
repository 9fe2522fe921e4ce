// runtime/cli/run_command.h
//
// `tierkv run` (DESIGN.md, CLI contract), with the short flags llama.cpp users type.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace tierkv {

void AddRunCommand(CLI::App& app, int& exit_code);
// Rewrites llama.cpp's multi-letter single-dash flags of `tierkv run` (-ctk, -ctv,
// -cnv, -sys, -ngl, -fa, -no-cnv) to their long form, which CLI11 cannot declare. Call on
// argv before parsing. Returns the usage error for a single-dash word it does not know
// (CLI11 would read -ngl as -n "gl"), else "".
std::string NormalizeLlamaFlags(int argc, char** argv);

}  // namespace tierkv
