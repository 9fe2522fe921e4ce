// tests/runtime/cli_main_test.cc
//
// What only runtime/cli/main.cc does, checked on the built tierkv binary: the version
// flag at the top level and under a subcommand, and a report that cannot be written
// (stdout on /dev/full) as one error line naming the reason and exit 1; `tierkv run`'s
// text on stdout, flushed as it is produced, and a text that cannot be written (a full
// disk, a closed pipe) as one error line and exit 1.
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/kvcache/kv_test_util.h"

namespace tierkv {
namespace {

struct Ran {
  int code = -1;
  std::string out, err;
};

// Runs `tierkv ARGS > OUT 2> ERR` through the shell; stdout goes to `out_path` when given.
Ran RunTierkv(const std::string& args, const std::string& out_path = "") {
  testing::TempDir dir;
  const std::string out = out_path.empty() ? dir.path() + "/out" : out_path;
  const std::string err = dir.path() + "/err";
  const std::string cmd = std::string("'") + TIERKV_CLI_BINARY + "' " + args + " > " + out + " 2> " + err;
  const int status = std::system(cmd.c_str());
  Ran r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  auto slurp = [](const std::string& p) {
    std::ifstream f(p);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  };
  if (out_path.empty()) r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

TEST(CliMainTest, VersionAtTheTopLevelAndUnderASubcommand) {
  const std::string want = "tierkv " TIERKV_VERSION "\n";
  for (const std::string args : {"--version", "run --version", "session verify --version"}) {
    const Ran r = RunTierkv(args);
    EXPECT_EQ(r.code, 0) << args << ": " << r.err;
    EXPECT_EQ(r.out, want) << args;
  }
  // Without it, a subcommand's missing option is still the usage error it was.
  const Ran r = RunTierkv("run");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("error: --model is required"), std::string::npos) << r.err;
}

TEST(CliMainTest, ReportThatCannotBeWrittenIsOneErrorLineAndExitOne) {
  struct stat st {};
  if (stat("/dev/full", &st) != 0) GTEST_SKIP() << "no /dev/full here";
  const Ran r = RunTierkv("info builtin:tiny-moe", "/dev/full");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.err, "error: writing standard output: No space left on device\n");
  // The same command with somewhere to write succeeds, so it was the write that failed.
  const Ran ok = RunTierkv("info builtin:tiny-moe");
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_FALSE(ok.out.empty());
}

// A quick run of the builtin model (-n follows).
const std::string kQuickRun = "run -m builtin:tiny-moe -p Zebra --no-warmup --host 64MiB -n";

TEST(CliMainTest, RunTextGoesToStdout) {
  const Ran r = RunTierkv(kQuickRun + " 8");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Zebra", 0), 0u) << "the prompt, then the text: " << r.out;
  EXPECT_GT(r.out.size(), 5u);
  EXPECT_EQ(r.err.find("Zebra"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("stopped: -n limit reached (8 tokens)\n"), std::string::npos) << r.err;
}

TEST(CliMainTest, RunTextThatCannotBeWrittenIsOneErrorLine) {
  struct stat st {};
  if (stat("/dev/full", &st) == 0) {
    const Ran full = RunTierkv(kQuickRun + " 8", "/dev/full");
    EXPECT_EQ(full.code, 1) << full.err;
    EXPECT_EQ(full.err, "error: writing standard output: No space left on device\n");
  }
  // A pipe whose reader is gone: EPIPE (not a silent death by SIGPIPE).
  testing::TempDir dir;
  const std::string err = dir.path() + "/err";
  const std::string cmd = std::string("'") + TIERKV_CLI_BINARY + "' " + kQuickRun + " 200 2> " + err + " | true";
  const int status = std::system(("bash -o pipefail -c \"" + cmd + "\"").c_str());
  // The reader may exit before or after the first write: either way the first write
  // after it fails. (With the prompt and 200 tokens there is a write after it.)
  std::ifstream f(err);
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status << ": " << text.str();
  EXPECT_EQ(text.str(), "error: writing standard output: Broken pipe\n");
}

// The text is flushed as it is produced, not at exit: an interactive run that waits for
// its next input (its "> " on stderr) has already written the prompt and the reply to
// its stdout, a pipe here.
TEST(CliMainTest, RunTextIsFlushedAsItIsProduced) {
  int in[2], out[2], err[2];
  ASSERT_EQ(pipe(in), 0);
  ASSERT_EQ(pipe(out), 0);
  ASSERT_EQ(pipe(err), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  for (const int fd : {in[0], in[1], out[0], out[1], err[0], err[1]}) posix_spawn_file_actions_addclose(&actions, fd);
  std::vector<std::string> args = {TIERKV_CLI_BINARY, "run", "-m", "builtin:tiny-moe", "-p", "Zebra", "-n", "8",
                                   "-c", "512", "-i", "--no-warmup", "--host", "64MiB"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  close(in[0]);
  close(out[1]);
  close(err[1]);
  // Reads what fd has within the deadline, until `until` is in it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  auto read_until = [&](int fd, const std::string& until, std::string* got) {
    char buf[4096];
    while (got->find(until) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = read(fd, buf, sizeof buf);
      if (n <= 0) break;
      got->append(buf, static_cast<size_t>(n));
    }
    return got->find(until) != std::string::npos;
  };
  std::string stderr_text, stdout_text;
  EXPECT_TRUE(read_until(err[0], "\n> ", &stderr_text)) << "no input prompt: " << stderr_text;
  // The run now waits for input: what it wrote to stdout is in the pipe.
  pollfd p{out[0], POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 0), 1) << "nothing on stdout while the run waits";
  char buf[4096];
  const ssize_t n = read(out[0], buf, sizeof buf);
  ASSERT_GT(n, 0);
  stdout_text.assign(buf, static_cast<size_t>(n));
  EXPECT_EQ(stdout_text.rfind("Zebra", 0), 0u) << stdout_text;
  EXPECT_GT(stdout_text.size(), 5u) << "the reply is there too: " << stdout_text;
  close(in[1]);  // end of input: the conversation ends
  std::string rest;
  read_until(out[0], "\x01never", &rest);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  close(out[0]);
  close(err[0]);
}

}  // namespace
}  // namespace tierkv
