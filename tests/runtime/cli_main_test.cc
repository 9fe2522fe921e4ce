// tests/runtime/cli_main_test.cc
//
// What only runtime/cli/main.cc does, checked on the built tierkv binary: the version
// flag at the top level and under a subcommand, and a report that cannot be written
// (stdout on /dev/full) as one error line naming the reason and exit 1.
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

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

}  // namespace
}  // namespace tierkv
