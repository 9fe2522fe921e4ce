// tests/runtime/expertbench_command_test.cc
//
// `tierkv expertbench` flag handling, in process: negative counts are usage errors (one
// line, exit 2), and -t above the CPUs is lowered to them with a warning, as for `run`;
// a short recording of builtin:tiny-moe then reports every policy.
#include "runtime/cli/expertbench_command.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/thread_pool.h"
#include "tests/runtime/cli_test_util.h"

namespace tierkv {
namespace {

using testing::CliResult;

CliResult RunExpertbenchCli(std::vector<std::string> args) {
  testing::WarningsToStderr();
  CLI::App app;
  int exit_code = 0;
  AddExpertbenchCommand(app, exit_code);
  args.insert(args.begin(), "expertbench");
  return testing::ParseCli(app, exit_code, std::move(args));
}

TEST(ExpertbenchCommandTest, NegativeCountsAreUsageErrors) {
  for (const char* flag : {"-t", "--tokens", "-s"}) {
    SCOPED_TRACE(flag);
    const CliResult r = RunExpertbenchCli({flag, "-1"});
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find("error:"), std::string::npos) << r.err;
  }
}

TEST(ExpertbenchCommandTest, ThreadsAreAtMostTheAvailableCpus) {
  const int cpus = kernels::AvailableCpus();
  const std::string many = std::to_string(cpus + 7);
  const CliResult r = RunExpertbenchCli({"-t", many, "--tokens", "8", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("-t " + many + ": this process may run on " + std::to_string(cpus) + " CPU"),
            std::string::npos)
      << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j.is_object());
  EXPECT_FALSE(j.empty());
}

}  // namespace
}  // namespace tierkv
