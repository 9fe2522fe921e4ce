// runtime/cli/usage_command.cc
#include "runtime/cli/usage_command.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "kernels/thread_pool.h"

namespace tierkv {
namespace {

// The subcommand chain argv names ("tierkv session verify"); *problem says where argv
// leaves the known commands, or that it stops before naming one, with the commands
// expected there (empty when the chain reaches a command that takes options).
std::string CommandPath(CLI::App& app, int argc, char** argv, std::string* problem) {
  auto all = [](CLI::App* a) { return a->get_subcommands([](CLI::App*) { return true; }); };
  auto names = [&](CLI::App* a) {
    std::string n;
    for (CLI::App* s : all(a)) n += (n.empty() ? "" : ", ") + s->get_name();
    return n;
  };
  CLI::App* cur = &app;
  std::string path = "tierkv";
  int i = 1;
  for (; i < argc && !all(cur).empty(); ++i) {
    const std::string word = argv[i];
    if (!word.empty() && word[0] == '-') break;
    CLI::App* next = nullptr;
    for (CLI::App* s : all(cur)) {
      if (s->get_name() == word) next = s;
    }
    if (next == nullptr) {
      *problem = "unknown command '" + word + "' for " + path + " (" + names(cur) + ")";
      return path;
    }
    cur = next;
    path += " " + word;
  }
  if (i >= argc && !all(cur).empty()) *problem = path + " needs a command (" + names(cur) + ")";
  return path;
}

}  // namespace

int ReportParseError(CLI::App& app, const CLI::ParseError& e, int argc, char** argv) {
  if (e.get_exit_code() == 0) return app.exit(e);  // --help
  std::string problem;
  const std::string path = CommandPath(app, argc, argv, &problem);
  if (!problem.empty()) {
    std::fprintf(stderr, "error: %s\n", problem.c_str());
  } else {
    std::fprintf(stderr, "error: %s (%s --help lists the options)\n", e.what(), path.c_str());
  }
  return 2;
}

int ThreadsWithinCpus(int threads) {
  const int cpus = kernels::AvailableCpus();
  if (threads <= cpus) return threads;
  spdlog::warn("-t {}: this process may run on {} CPU{}; using {} threads", threads, cpus, cpus == 1 ? "" : "s", cpus);
  return cpus;
}

bool KeepStandardFdsOpen() {
  // In order: open() takes the lowest free number, which is fd once those below it are open.
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    if (open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY) != fd) return false;
  }
  return true;
}

int FinishOutput(int exit_code, std::FILE* out) {
  errno = 0;
  const bool flushed = std::fflush(out) == 0;
  const int err = errno;
  if (flushed && std::ferror(out) == 0) return exit_code;
  if (exit_code != 0) return exit_code;  // the command's own error line was the one
  // A write that failed inside an earlier printf leaves no errno behind.
  if (err != 0) {
    std::fprintf(stderr, "error: writing standard output: %s\n", std::strerror(err));
  } else {
    std::fputs("error: writing standard output failed\n", stderr);
  }
  return 1;
}

}  // namespace tierkv
