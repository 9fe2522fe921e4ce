// runtime/cli/session_command.h
//
// `tierkv session inspect FILE` and `tierkv session verify FILE` (DESIGN.md, CLI contract).
#pragma once

#include <CLI/CLI.hpp>

namespace tierkv {

void AddSessionCommand(CLI::App& app, int& exit_code);

}  // namespace tierkv
