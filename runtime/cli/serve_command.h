// runtime/cli/serve_command.h
//
// `tierkv serve` (docs/server.md): the OpenAI-compatible server (runtime/server/server.h)
// with llama-server's flags: -m, --host, --port, -c (each slot's context), -np (slots),
// --api-key / --api-key-file, --session-dir, and `tierkv run`'s budget and kernel flags.
#pragma once

#include <CLI/CLI.hpp>

namespace tierkv {

void AddServeCommand(CLI::App& app, int& exit_code);

}  // namespace tierkv
