// tests/bench/expertbench_command_test.cc
//
// `tierkv expertbench` flag handling, in process: negative counts are usage errors (one
// line, exit 2), and -t above the CPUs is lowered to them with a warning, as for `run`
// (the threads the model starts are counted); a short recording of builtin:tiny-moe
// then reports every policy.
#include "bench/tools/expertbench_command.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <system_error>
#include <thread>
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

// Threads of this process now: the entries of /proc/self/task (-1 where it cannot be read).
int ProcessThreads() {
  std::error_code ec;
  std::filesystem::directory_iterator it("/proc/self/task", ec), end;
  int n = 0;
  for (; !ec && it != end; it.increment(ec)) ++n;
  return ec ? -1 : n;
}

// Runs expertbench with args while another thread samples ProcessThreads(); *extra is the
// most threads seen beyond those alive before the run (the sampler not counted).
CliResult RunExpertbenchCountingThreads(std::vector<std::string> args, int* extra) {
  const int before = ProcessThreads();
  std::atomic<bool> done{false};
  std::atomic<int> peak{before};
  std::thread sampler([&] {
    while (!done.load()) {
      peak.store(std::max(peak.load(), ProcessThreads()));
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  CliResult r = RunExpertbenchCli(std::move(args));
  done.store(true);
  sampler.join();
  *extra = peak.load() - before - 1;
  return r;
}

// The kernel threads (-t) are at most the CPUs this process may use: above them they
// are lowered with a warning, as for `run`. The JSON does not report the thread count,
// so the threads are counted while the model decodes: the model's pool (-t threads,
// the caller included) lives through the recording, ~10 ms at 32 tokens (at 8, ~3 ms:
// the sampler could miss it). -t <cpus> is the reference; -t <cpus + 7> must start no
// more threads than it (unlowered: 7 more).
TEST(ExpertbenchCommandTest, ThreadsAreAtMostTheAvailableCpus) {
  if (ProcessThreads() < 1) GTEST_SKIP() << "/proc/self/task cannot be read: no thread count";
  const int cpus = kernels::AvailableCpus();
  const std::string at = std::to_string(cpus), many = std::to_string(cpus + 7);

  int extra_at = 0;
  const CliResult ref = RunExpertbenchCountingThreads({"-t", at, "--tokens", "32", "--json"}, &extra_at);
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  EXPECT_EQ(ref.err.find("this process may run on"), std::string::npos) << ref.err;
  // The sampler saw the pool: its cpus - 1 workers at least (the copy stream adds one).
  ASSERT_GE(extra_at, cpus - 1);

  int extra_many = 0;
  const CliResult r = RunExpertbenchCountingThreads({"-t", many, "--tokens", "32", "--json"}, &extra_many);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("-t " + many + ": this process may run on " + at + " CPU"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("; using " + at + " threads"), std::string::npos) << r.err;
  EXPECT_LE(extra_many, extra_at) << "-t " << many << " started more threads than -t " << at;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["traces"].size(), 2u);  // the recorded trace and the synthetic one
  for (const auto& t : j["traces"]) EXPECT_EQ(t["results"].size(), 6u) << t["name"];  // every policy, +/- prefetch
}

}  // namespace
}  // namespace tierkv
