// tests/kvcache/redis_test_util.h
//
// A redis-server of the test's own on a unix socket in a fresh directory (no
// persistence, never the system's service), stopped by pid; and a client for what the
// tests do to it behind tierkv's back (flush, damage a value, limit its memory).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

namespace tierkv::testing {

// GTEST_SKIP()s the test where redis-server is not installed (scripts/deps.sh installs it).
#define TIERKV_NEED_REDIS()                                                                        \
  do {                                                                                             \
    if (!::tierkv::testing::TestRedis::Installed()) {                                              \
      GTEST_SKIP() << "redis-server is not installed (scripts/deps.sh installs it)";              \
    }                                                                                              \
  } while (0)

class TestRedis {
 public:
  static bool Installed() { return std::system("command -v redis-server >/dev/null 2>&1") == 0; }

  TestRedis() {
    std::mt19937_64 rng(std::random_device{}());
    dir_ = std::filesystem::temp_directory_path() / ("tierkv-redis-" + std::to_string(rng()));
    std::filesystem::create_directories(dir_);
    Start();
  }
  ~TestRedis() {
    Kill();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::string socket() const { return (dir_ / "redis.sock").string(); }
  std::string url() const { return "unix://" + socket(); }

  // Starts the server (again, after Kill) and waits until it answers PING.
  void Start() {
    std::filesystem::remove(socket());
    // Everything the child needs is made before fork: the test process has threads, and
    // only exec is safe in the child.
    const std::string dir = dir_.string(), sock = socket(), log = (dir_ / "redis.log").string();
    pid_ = fork();
    if (pid_ == 0) {
      execlp("redis-server", "redis-server", "--port", "0", "--unixsocket", sock.c_str(), "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", dir.c_str(), "--logfile", log.c_str(), "--daemonize", "no",
             static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 500; ++i) {
      if (Command({"PING"}) == "PONG") return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "redis-server did not start (" << (dir_ / "redis.log").string() << ")";
  }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGCONT);
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  void Pause() { kill(pid_, SIGSTOP); }
  void Resume() { kill(pid_, SIGCONT); }

  // Runs one command on a connection of its own: a string reply's bytes, an integer's
  // digits, "(nil)", or "(error) ..." ("(down)" when the server cannot be reached).
  std::string Command(const std::vector<std::string>& args) const {
    const timeval tv{1, 0};
    redisContext* c = redisConnectUnixWithTimeout(socket().c_str(), tv);
    if (c == nullptr || c->err != 0) {
      if (c != nullptr) redisFree(c);
      return "(down)";
    }
    redisSetTimeout(c, tv);
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()));
    std::string out = "(down)";
    if (r != nullptr) {
      switch (r->type) {
        case REDIS_REPLY_STRING:
        case REDIS_REPLY_STATUS: out.assign(r->str, r->len); break;
        case REDIS_REPLY_INTEGER: out = std::to_string(r->integer); break;
        case REDIS_REPLY_NIL: out = "(nil)"; break;
        case REDIS_REPLY_ERROR: out = "(error) " + std::string(r->str, r->len); break;
        case REDIS_REPLY_ARRAY:
          out.clear();
          for (size_t i = 0; i < r->elements; ++i) out.append(r->element[i]->str, r->element[i]->len).append("\n");
          break;
        default: out = "(other)";
      }
      freeReplyObject(r);
    }
    redisFree(c);
    return out;
  }
  // The keys matching a pattern.
  std::vector<std::string> Keys(const std::string& pattern) const {
    std::vector<std::string> keys;
    const std::string all = Command({"KEYS", pattern});
    for (size_t at = 0; at < all.size();) {
      const size_t nl = all.find('\n', at);
      keys.push_back(all.substr(at, nl - at));
      at = nl + 1;
    }
    return keys;
  }

 private:
  std::filesystem::path dir_;
  pid_t pid_ = -1;
};

}  // namespace tierkv::testing
