// tests/kvcache/session_lock_test.cc
#include "kvcache/session_lock.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "tests/kvcache/kv_test_util.h"

namespace tierkv {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

std::string ReadText(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

TEST(SessionLockTest, OneHolderAtATimeAndTheWaiterIsTold) {
  TempDir dir;
  const std::string session = dir.path() + "/s.tkv";
  SessionLock::Options first;
  first.command = "tierkv run (first)";
  auto a = SessionLock::Acquire(session, first);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ((*a)->lock_path(), session + ".lock");
  EXPECT_NE(ReadText(session + ".lock").find("pid " + std::to_string(getpid())), std::string::npos);

  SessionLock::Options no_wait;
  no_wait.wait = false;
  auto refused = SessionLock::Acquire(session, no_wait);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("in use by pid " + std::to_string(getpid()) + ": tierkv run (first)"),
            std::string::npos)
      << refused.status().message();

  std::atomic<bool> waited{false}, got{false};
  std::string holder;
  std::thread t([&] {
    SessionLock::Options o;
    o.on_wait = [&](const std::string& h) {
      holder = h;
      waited = true;
    };
    auto b = SessionLock::Acquire(session, o);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    got = true;
  });
  while (!waited) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_FALSE(got) << "the second holder waits for the first";
  a->reset();  // released: the waiter takes it (a new lock file)
  t.join();
  EXPECT_TRUE(got);
  EXPECT_NE(holder.find("tierkv run (first)"), std::string::npos) << holder;
  EXPECT_FALSE(fs::exists(session + ".lock")) << "removed by its last holder";
}

TEST(SessionLockTest, AWaitCanBeCancelled) {
  TempDir dir;
  const std::string session = dir.path() + "/s.tkv";
  auto a = SessionLock::Acquire(session);
  ASSERT_TRUE(a.ok());
  SessionLock::Options o;
  int polls = 0;
  o.cancelled = [&] { return ++polls > 3; };
  auto b = SessionLock::Acquire(session, o);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("gave up waiting"), std::string::npos) << b.status().message();
}

// A process that dies holding the lock releases it (the kernel drops flocks); its lock
// file, left behind, is taken over.
TEST(SessionLockTest, AKilledHolderReleasesTheLock) {
  TempDir dir;
  const std::string session = dir.path() + "/s.tkv";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto a = SessionLock::Acquire(session);
    if (!a.ok()) _exit(2);
    (void)a->release();  // never unlocked: killed
    pause();
    _exit(0);
  }
  while (!fs::exists(session + ".lock")) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  SessionLock::Options no_wait;
  no_wait.wait = false;
  for (int i = 0; i < 200 && SessionLock::Acquire(session, no_wait).ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the child has created but not yet locked it
  }
  EXPECT_FALSE(SessionLock::Acquire(session, no_wait).ok());
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(fs::exists(session + ".lock"));
  auto b = SessionLock::Acquire(session, no_wait);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
}

// The lock file is never a planted link or somebody's file: nothing is followed or written.
TEST(SessionLockTest, PlantedLockFilesAreRefusedAndUntouched) {
  TempDir dir;
  const std::string session = dir.path() + "/s.tkv";
  const std::string victim = dir.path() + "/victim";
  std::ofstream(victim) << "precious";
  fs::create_symlink(victim, session + ".lock");
  auto a = SessionLock::Acquire(session);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("symbolic link"), std::string::npos) << a.status().message();
  EXPECT_EQ(ReadText(victim), "precious");
  fs::remove(session + ".lock");
  fs::create_hard_link(victim, session + ".lock");
  auto b = SessionLock::Acquire(session);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("not a lock file tierkv made"), std::string::npos) << b.status().message();
  EXPECT_EQ(ReadText(victim), "precious");
}

// Links to one session share its lock (the lock sits beside the file the links end at).
TEST(SessionLockTest, LinksToOneSessionShareTheLock) {
  TempDir dir;
  const std::string real = dir.path() + "/real.tkv", link = dir.path() + "/link.tkv";
  fs::create_symlink("real.tkv", link);
  auto a = SessionLock::Acquire(link);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->lock_path(), real + ".lock");
  SessionLock::Options no_wait;
  no_wait.wait = false;
  EXPECT_FALSE(SessionLock::Acquire(real, no_wait).ok());
}

// Taking the lock clears what crashed saves left.
TEST(SessionLockTest, TakingTheLockRemovesLeftovers) {
  TempDir dir;
  const std::string session = dir.path() + "/s.tkv";
  std::ofstream(session + ".tierkv-tmp.00000000deadbeef") << "half a save";
  auto a = SessionLock::Acquire(session);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->leftovers_removed(), 1);
  EXPECT_FALSE(fs::exists(session + ".tierkv-tmp.00000000deadbeef"));
}

}  // namespace
}  // namespace tierkv
