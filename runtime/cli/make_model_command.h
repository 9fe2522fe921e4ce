// runtime/cli/make_model_command.h
//
// `tierkv make-model --like qwen3-30b-a3b --type q4_k_m [--layers N] [--vocab-from FILE]
// [--seed S] [--skew X] -o OUT.gguf`: writes a GGUF of a real model's shapes and type mix
// with random weights (runtime/make_model.h, docs/make-model.md). Progress on stderr,
// a summary (size, tensors, bytes per type) on stdout.
//
// Thread-safety: registration only.
#pragma once

namespace CLI {
class App;
}  // namespace CLI

namespace tierkv {

// Registers the subcommand on app; its callback sets exit_code (0; 1 after one error
// line on stderr; 2 for a bad flag value).
void AddMakeModelCommand(CLI::App& app, int& exit_code);

}  // namespace tierkv
