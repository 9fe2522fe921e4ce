// runtime/cli/run_command.h
//
// `tierkv run` (DESIGN.md, CLI contract), with the short flags llama.cpp users type.
#pragma once

#include <CLI/CLI.hpp>

namespace tierkv {

void AddRunCommand(CLI::App& app, int& exit_code);
// Rewrites llama.cpp's multi-letter single-dash flags (-ctk, -ctv, -cnv, -sys) to their long form,
// which CLI11 cannot declare. Call on argv before parsing.
void NormalizeLlamaFlags(int argc, char** argv);

}  // namespace tierkv
