// runtime/cli/make_model_command.cc
#include "runtime/cli/make_model_command.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "memory/size.h"
#include "runtime/make_model.h"

namespace tierkv {

void AddMakeModelCommand(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<MakeModelOptions>();
  CLI::App* sub = app.add_subcommand(
      "make-model", "Write a GGUF with a real model's shapes and type mix and random weights (docs/make-model.md)");
  std::string likes;
  for (const MakeModelShape& s : MakeModelShapes()) likes += std::string(likes.empty() ? "" : ", ") + s.like;
  sub->add_option("--like", o->like, "the model whose shapes to take: " + likes)->capture_default_str();
  sub->add_option("--type", o->type, "q4_k_m (llama.cpp's type mix) or q8_0")->capture_default_str();
  sub->add_option("--layers", o->layers, "write only the first N layers (0: all)")->capture_default_str();
  sub->add_option("--vocab-from", o->vocab_from,
                  "take the tokenizer (and the vocabulary size) of this GGUF; default: a 258-token byte "
                  "tokenizer that only tierkv reads");
  sub->add_option("--seed", o->seed, "random seed (the same seed writes the same file)")->capture_default_str();
  sub->add_option("--skew", o->skew,
                  "router skew: standard deviation of the log of the experts' router gains (0: uniform)")
      ->capture_default_str();
  sub->add_option("-o,--output", o->out, "the GGUF file to write");
  auto dry_run = std::make_shared<bool>(false);
  sub->add_flag("--dry-run", *dry_run, "print the tensors' types, bytes and the file's size; write nothing");
  sub->callback([o, dry_run, &exit_code] {
    const auto summary = [&](const char* verb, const MakeModelReport& report, double secs) {
      std::printf("%s %s: %s (%llu bytes), %llu tensors, %d layers, vocabulary %d", verb,
                  o->out.empty() ? "(no file)" : o->out.c_str(), FormatBytes(report.file_bytes).c_str(),
                  static_cast<unsigned long long>(report.file_bytes), static_cast<unsigned long long>(report.tensors),
                  report.layers, report.n_vocab);
      if (secs >= 0) std::printf(", in %.1f s", secs);
      std::printf("\n");
      for (const auto& [type, bytes] : report.bytes_by_type) {
        std::printf("  %-5s %s (%.1f%%)\n", type.c_str(), FormatBytes(bytes).c_str(),
                    100.0 * static_cast<double>(bytes) / static_cast<double>(report.file_bytes));
      }
    };
    if (*dry_run) {
      auto plan = PlanMakeModel(*o);
      if (!plan.ok()) {
        std::fprintf(stderr, "error: make-model: %s\n", plan.status().message().c_str());
        exit_code = plan.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
        return;
      }
      summary("would write", *plan, -1);
      exit_code = 0;
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto last = t0;
    const bool tty = isatty(STDERR_FILENO) != 0;
    int last_decile = 0;  // a log gets a line at each tenth from 10%
    bool printed = false;
    o->progress = [&](uint64_t done, uint64_t total) {
      const auto now = std::chrono::steady_clock::now();
      const int decile = total ? static_cast<int>(done * 10 / total) : 10;
      // A terminal gets a line redrawn each second; a log one line each tenth.
      if (tty ? (now - last < std::chrono::seconds(1) && done < total) : decile == last_decile) return;
      last = now;
      last_decile = decile;
      printed = true;
      std::fprintf(stderr, "%swriting %s: %s of %s (%d%%)%s", tty ? "\r" : "", o->out.c_str(), FormatBytes(done).c_str(),
                   FormatBytes(total).c_str(), total ? static_cast<int>(done * 100 / total) : 100, tty ? "" : "\n");
      std::fflush(stderr);
    };
    MakeModelReport report;
    const Status st = MakeModel(*o, &report);
    if (tty && printed) std::fprintf(stderr, "\n");
    if (!st.ok()) {
      std::fprintf(stderr, "error: make-model: %s\n", st.message().c_str());
      exit_code = st.code() == StatusCode::kInvalidArgument ? 2 : 1;
      return;
    }
    summary("wrote", report, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    exit_code = 0;
  });
}

}  // namespace tierkv
