// tests/memory/meminfo_test.cc
#include "memory/meminfo.h"

#include <gtest/gtest.h>

namespace tierkv {
namespace {

TEST(MeminfoTest, ParsesTotalAndAvailable) {
  auto m = ParseMeminfo(
      "MemTotal:       24731708 kB\n"
      "MemFree:        23350740 kB\n"
      "MemAvailable:   24431216 kB\n"
      "HugePages_Total:       0\n");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->total_bytes, 24731708ull * 1024);
  EXPECT_EQ(m->available_bytes, 24431216ull * 1024);

  auto old_kernel = ParseMeminfo("MemTotal: 1000 kB\nMemFree: 400 kB\n");
  ASSERT_TRUE(old_kernel.ok());
  EXPECT_EQ(old_kernel->available_bytes, 400u * 1024);

  EXPECT_FALSE(ParseMeminfo("MemFree: 400 kB\n").ok());
  EXPECT_FALSE(ParseMeminfo("").ok());
}

TEST(MeminfoTest, ThisMachineHasSomeAvailableMemory) {
  auto m = ReadMeminfo();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_GT(m->total_bytes, 0u);
  EXPECT_LE(m->available_bytes, m->total_bytes);
}

}  // namespace
}  // namespace tierkv
