// tests/memory/fd_test.cc
//
// UniqueFd closes what it owns exactly once: on destruction, reset and move-assignment,
// never after release or a move away.
#include "memory/fd.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include <gtest/gtest.h>

namespace tierkv {
namespace {

bool IsOpen(int fd) { return fcntl(fd, F_GETFD) != -1 || errno != EBADF; }

int OpenNull() { return open("/dev/null", O_RDONLY | O_CLOEXEC); }

TEST(UniqueFdTest, ClosesOnDestructionResetAndMoveAssignment) {
  int raw = OpenNull();
  ASSERT_GE(raw, 0);
  {
    UniqueFd fd(raw);
    EXPECT_TRUE(fd.valid());
    EXPECT_EQ(fd.get(), raw);
  }
  EXPECT_FALSE(IsOpen(raw)) << "closed when the owner went";

  UniqueFd a(OpenNull());
  const int first = a.get();
  a.reset(OpenNull());
  EXPECT_FALSE(IsOpen(first)) << "reset closes the one held";
  const int second = a.get();
  UniqueFd b(OpenNull());
  const int third = b.get();
  b = std::move(a);
  EXPECT_FALSE(IsOpen(third)) << "move-assignment closes the target's";
  EXPECT_TRUE(IsOpen(second));
  EXPECT_FALSE(a.valid());  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(b.get(), second);
  b.reset();
  EXPECT_FALSE(IsOpen(second));
  EXPECT_FALSE(b.valid());
}

TEST(UniqueFdTest, ReleaseAndMoveConstructionHandOwnershipOn) {
  UniqueFd a(OpenNull());
  const int raw = a.get();
  UniqueFd b(std::move(a));
  EXPECT_EQ(b.get(), raw);
  const int released = b.release();
  EXPECT_EQ(released, raw);
  EXPECT_FALSE(b.valid());
  EXPECT_TRUE(IsOpen(raw)) << "released: the caller owns it";
  close(released);
  UniqueFd none;
  none.reset();  // nothing held: no close
  EXPECT_FALSE(none.valid());
}

}  // namespace
}  // namespace tierkv
