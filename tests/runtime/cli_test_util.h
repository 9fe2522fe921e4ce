// tests/runtime/cli_test_util.h
//
// Runs tierkv command lines in process, as runtime/cli/main.cc does: llama.cpp's
// flags normalised, usage errors reported by ReportParseError; stdout and stderr
// captured.
#pragma once

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <gtest/gtest.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "runtime/cli/run_command.h"
#include "runtime/cli/usage_command.h"

namespace tierkv::testing {

struct CliResult {
  int exit_code = -1;
  std::string out, err;
};

// Sends warnings to stderr, as the tierkv binary does (runtime/cli/main.cc); once per
// test binary.
inline void WarningsToStderr() {
  static const bool kOnce = [] {
    spdlog::set_default_logger(spdlog::stderr_color_mt("tierkv_cli_test"));
    return true;
  }();
  (void)kOnce;
}

// Parses "tierkv" followed by args with app; the result's exit code is the one a
// command's callback left in exit_code, or the usage error's.
inline CliResult ParseCli(CLI::App& app, const int& exit_code, std::vector<std::string> args) {
  std::vector<std::string> owned = {"tierkv"};
  owned.insert(owned.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : owned) argv.push_back(a.data());
  const int argc = static_cast<int>(argv.size());
  CliResult r;
  if (const std::string bad = NormalizeLlamaFlags(argc, argv.data()); !bad.empty()) {
    r.exit_code = 2;
    r.err = "error: " + bad + "\n";
    return r;
  }
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  try {
    app.parse(argc, argv.data());
    r.exit_code = exit_code;
  } catch (const CLI::ParseError& e) {
    r.exit_code = ReportParseError(app, e, argc, argv.data());
  }
  r.err = ::testing::internal::GetCapturedStderr();
  r.out = ::testing::internal::GetCapturedStdout();
  return r;
}

// A file's bytes ("" when it cannot be read): "loses no data" is checked byte for byte.
inline std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace tierkv::testing
