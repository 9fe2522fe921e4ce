// tests/runtime/usage_command_test.cc
//
// Usage errors of the tierkv command line (runtime/cli/usage_command.h): an unknown
// command or flag, a missing command, a negative count: one "error:" line naming the
// problem, exit code 2; --help still exits 0.
#include "runtime/cli/usage_command.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "bench/tools/fragbench.h"
#include "runtime/cli/info_command.h"
#include "runtime/cli/run_command.h"
#include "runtime/cli/session_command.h"
#include "tests/runtime/cli_test_util.h"

namespace tierkv {
namespace {

// Parses args as the tierkv binary does (runtime/cli/main.cc), with some of its commands.
testing::CliResult Parse(std::vector<std::string> args) {
  CLI::App app;
  app.require_subcommand(1);
  int exit_code = -1;  // each command's callback sets it
  tools::AddFragbenchCommand(app, exit_code);
  AddInfoCommand(app, exit_code);
  AddSessionCommand(app, exit_code);
  AddRunCommand(app, exit_code);
  return testing::ParseCli(app, exit_code, std::move(args));
}

TEST(UsageCommandTest, UsageErrorsAreOneLineAndExitTwo) {
  const struct {
    std::vector<std::string> args;
    const char* message;
  } cases[] = {
      {{}, "error: tierkv needs a command (fragbench, info, session, run)"},
      {{"bogus"}, "error: unknown command 'bogus' for tierkv (fragbench, info, session, run)"},
      {{"session"}, "error: tierkv session needs a command (inspect, verify, repair)"},
      {{"session", "bogus", "x"}, "error: unknown command 'bogus' for tierkv session (inspect, verify, repair)"},
      {{"session", "inspect"}, "error: file is required (tierkv session inspect --help lists the options)"},
      {{"info", "a", "b"}, "error: The following argument was not expected: b (tierkv info --help lists the options)"},
      {{"info", "x.gguf", "--max-items", "-1"}, "error: --max-items: must not be negative"},
      {{"fragbench", "--seed", "-1"}, "error: --seed: must not be negative"},
      {{"run"}, "error: --model is required (tierkv run --help lists the options)"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.message);
    const testing::CliResult u = Parse(c.args);
    EXPECT_EQ(u.exit_code, 2);
    EXPECT_EQ(u.err.rfind(c.message, 0), 0u) << u.err;
    EXPECT_EQ(std::count(u.err.begin(), u.err.end(), '\n'), 1) << u.err;
  }
}

TEST(UsageCommandTest, HelpStillExitsZero) {
  const testing::CliResult u = Parse({"run", "--help"});
  EXPECT_EQ(u.exit_code, 0);
  EXPECT_NE(u.out.find("--model"), std::string::npos) << u.out;
  EXPECT_TRUE(u.err.empty()) << u.err;
}

// Output that cannot be written (here /dev/full: ENOSPC at the flush) fails the command
// that printed it, with one line naming why; a command that already failed keeps its code.
TEST(UsageCommandTest, UnwritableOutputFailsTheCommand) {
  std::FILE* full = std::fopen("/dev/full", "w");
  if (full == nullptr) GTEST_SKIP() << "no /dev/full";
  ::testing::internal::CaptureStderr();  // first: it flushes every stream
  std::fputs("{\"report\": 1}\n", full);
  const int code = FinishOutput(0, full);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, 1);
  EXPECT_EQ(err, "error: writing standard output: No space left on device\n");
  std::fclose(full);

  full = std::fopen("/dev/full", "w");
  ASSERT_NE(full, nullptr);
  ::testing::internal::CaptureStderr();
  std::fputs("partial report\n", full);
  EXPECT_EQ(FinishOutput(2, full), 2);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  std::fclose(full);

  std::FILE* fine = std::tmpfile();
  ASSERT_NE(fine, nullptr);
  std::fputs("report\n", fine);
  EXPECT_EQ(FinishOutput(0, fine), 0);
  std::fclose(fine);
}

// With stderr (and stdin) closed, the first file the run opens would take fd 2 and
// receive the streamed text: they are put on /dev/null first. In a child process.
TEST(UsageCommandTest, ClosedStandardFdsAreReopenedOnDevNull) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(0);
    close(2);
    const bool ok = KeepStandardFdsOpen();
    const int next = open("/dev/null", O_RDONLY);  // what a disk tier's open would get
    struct stat st {};
    const bool null_2 = fstat(2, &st) == 0 && S_ISCHR(st.st_mode);
    _exit(ok && next > 2 && null_2 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

}  // namespace
}  // namespace tierkv
