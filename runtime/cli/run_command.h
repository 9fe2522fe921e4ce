// runtime/cli/run_command.h
//
// `tierkv run` (DESIGN.md, CLI contract), with the short flags llama.cpp users type.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "memory/status.h"
#include "runtime/run.h"

namespace tierkv {

// Output (docs/cli.md, "Output"): the prompt (unless --no-display-prompt) and the
// generated text on stdout, each piece flushed as it comes, as llama-cli prints them;
// logs, progress, warnings and the summary (RunSummary) on stderr. With --json, stdout
// holds the JSON object alone and the text streams to stderr. A write to stdout that
// fails (a full disk, a closed pipe) stops generation and is one error line, exit 1.
void AddRunCommand(CLI::App& app, int& exit_code);

// For `tierkv serve` (runtime/cli/serve_command.h): registers on `sub` the model (-m),
// --chat-template and the flags of a model's run that `tierkv run` has (tiers and
// budgets, kernels, KV codec, -b, RoPE, llama.cpp's ignored ones). After parsing, the
// returned function gives the RunOptions they say (a usage error: kInvalidArgument).
std::function<Result<RunOptions>()> AddServeRunFlags(CLI::App* sub);

// -f PATH ("-": standard input), read with read(2): at most max_bytes + 1 bytes (more
// cannot fit the context: RunSession says so), and never more than 256 MiB (an error
// naming the file: -f /dev/zero). A directory, a file that cannot be opened, or a read
// that fails part way (EIO) is an error naming it, never a shorter prompt.
Result<std::string> ReadPromptFile(const std::string& path, size_t max_bytes);

// What `tierkv run` prints on stderr after a run: for a one-shot run, one line saying
// why generation stopped ("stopped: -n limit reached (32 tokens)"; end-of-generation
// token, context full, reverse prompt, Ctrl-C); then the prompt's tokens, those reused,
// those computed and the rate they were computed at (after a stopped prefill, the part
// computed), and the generated tokens and their rate.
std::string RunSummary(const RunReport& r, bool interactive);
// The line a long prefill prints every 10 s: tokens done of this prefill, the position
// in the whole context, the rate, the time spent and left, and the tiers' residency.
std::string FormatPrefillProgress(const RunOptions::PrefillProgress& at, double elapsed_s);

// llama.cpp's spellings NormalizeLlamaFlags rewrites, and the long option of each
// ({"-ngl", "--n-gpu-layers"}, ...); tierkv run --help lists them.
std::vector<std::pair<std::string, std::string>> LlamaFlagSpellings();
// Rewrites llama.cpp's multi-letter single-dash flags of `tierkv run` (-ctk, -ctv,
// -cnv, -sys, -ngl, -fa, -no-cnv) to their long form, which CLI11 cannot declare. Call on
// argv before parsing. Returns the usage error for a single-dash word it does not know
// (CLI11 would read -ngl as -n "gl"), else "".
std::string NormalizeLlamaFlags(int argc, char** argv);

}  // namespace tierkv
