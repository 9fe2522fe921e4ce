// tests/runtime/session_command_test.cc
//
// `tierkv session inspect|verify`: exit codes and the one error line, in process.
#include "runtime/cli/session_command.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kvcache/session_file.h"
#include "tests/kvcache/kv_test_util.h"

namespace tierkv {
namespace {

int RunCli(std::vector<std::string> args) {
  CLI::App app;
  int exit_code = 0;
  AddSessionCommand(app, exit_code);
  std::vector<const char*> argv = {"tierkv"};
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
}

// A session of 20 tokens in a small geometry, ready to save to path.
struct Saved {
  testing::TempDir dir;
  std::unique_ptr<MemoryManager> mm = testing::MakeManager({}, dir.path());
  std::unique_ptr<KvCache> cache = KvCache::Create(mm.get(), testing::SmallGeometry()).value();
  SeqId s = [this] {
    const SeqId seq = cache->NewSequence();
    testing::AppendTokens(*cache, seq, 0, 20, 1);
    return seq;
  }();
  std::string path = dir.path() + "/s.tkv";
  std::vector<int32_t> tokens = std::vector<int32_t>(20, 7);
};

TEST(SessionCommandTest, VerifyNamesTheFirstBadBlockAndFails) {
  Saved saved;
  auto& [dir, mm, cache, s, path, tokens] = saved;
  ASSERT_TRUE(SessionFile::Save(*cache, s, tokens, {1, "m"}, path).ok());

  ::testing::internal::CaptureStdout();
  EXPECT_EQ(RunCli({"session", "verify", path}), 0);
  EXPECT_NE(::testing::internal::GetCapturedStdout().find("ok: 6 blocks, 20 tokens"), std::string::npos);
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(RunCli({"session", "inspect", path}), 0);
  EXPECT_NE(::testing::internal::GetCapturedStdout().find("tokens    20"), std::string::npos);

  {  // flip one byte of block 4 (layer 1, block 1)
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(4096 + 4 * (40 + cache->block_bytes()) + 40 + 100);
    f.seekg(at);
    const char c = static_cast<char>(f.get());
    f.seekp(at);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunCli({"session", "verify", path}), 1);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("error: session block 4 (layer 1, block 1)"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), err.size() - 1) << "one line: " << err;

  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunCli({"session", "inspect", dir.path() + "/missing.tkv"}), 1);
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("No such file"), std::string::npos);
}

// inspect --json gives the 64-bit hashes as the table does, 16 hex digits: as JSON
// numbers, values above 2^53 would lose their low bits in readers that parse doubles.
TEST(SessionCommandTest, InspectJsonGivesHashesInHex) {
  Saved saved;
  auto& [dir, mm, cache, s, path, tokens] = saved;
  const uint64_t hash = 0xfedcba9876543211ull;  // odd and above 2^53: a double cannot hold it
  ASSERT_TRUE(SessionFile::Save(*cache, s, tokens, {hash, "m"}, path).ok());
  ::testing::internal::CaptureStdout();
  ASSERT_EQ(RunCli({"session", "inspect", "--json", path}), 0);
  const auto j = nlohmann::json::parse(::testing::internal::GetCapturedStdout());
  EXPECT_EQ(j["model"]["fingerprint"], "fedcba9876543211");
  char seed[17];
  std::snprintf(seed, sizeof seed, "%016llx", static_cast<unsigned long long>(cache->geometry().codec_seed));
  EXPECT_EQ(j["kv"]["codec_seed"], seed);
  EXPECT_EQ(j["tokens"], 20);
}

// A file whose newest save is damaged (its manifest fails its checksum under an intact
// commit slot: not a crash, which never commits an unsynced manifest) still holds the
// save before it: inspect shows that save with a note saying why, exit 0; verify fails
// naming the reason, as run and save refuse the file (tests/runtime/run_command_test.cc).
// (A torn commit slot is a save that never committed: every command ignores it alike.)
TEST(SessionCommandTest, DamagedNewestSaveIsNotedByInspectAndFailsVerify) {
  Saved saved;
  auto& [dir, mm, cache, s, path, tokens] = saved;
  ASSERT_TRUE(SessionFile::Save(*cache, s, tokens, {1, "m"}, path).ok());
  tokens.push_back(8);
  testing::AppendTokens(*cache, s, 20, 21, 1);
  ASSERT_TRUE(SessionFile::Save(*cache, s, tokens, {1, "m"}, path).ok());
  {  // the last byte of the file: save 2's manifest (its commit slot is intact)
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    const char c = static_cast<char>(f.get());
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(RunCli({"session", "inspect", path}), 0);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("commit 1"), std::string::npos) << out;
  EXPECT_NE(out.find("tokens    20\n"), std::string::npos) << out;
  EXPECT_NE(out.find("\nnote      "), std::string::npos) << out;
  EXPECT_NE(out.find("shown: the save before it, 1"), std::string::npos) << out;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunCli({"session", "verify", path}), 1);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("fails its checksum (the save before it, 1, is intact: `tierkv session repair` rolls back to it)"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find('\n'), err.size() - 1) << "one line: " << err;

  // repair: rolls back to save 1 and says where the damaged file went; then verify
  // passes, and a second repair finds nothing to do.
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(RunCli({"session", "repair", path}), 0);
  const std::string repaired = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(repaired.find("repaired: " + path + " rolled back to save 1 (20 tokens, 6 blocks verified); the damaged file "
                          "is kept as " + path + ".damaged\n"),
            std::string::npos)
      << repaired;
  EXPECT_TRUE(std::filesystem::exists(path + ".damaged"));
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(RunCli({"session", "verify", path}), 0);
  EXPECT_NE(::testing::internal::GetCapturedStdout().find("ok: 6 blocks, 20 tokens"), std::string::npos);
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(RunCli({"session", "repair", path}), 0);
  const std::string again = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(again.find("ok: nothing to repair, save 1 is intact"), std::string::npos) << again;
}

// repair of something that is not a session file, or of damaged blocks: one error line,
// exit 1, the file untouched.
TEST(SessionCommandTest, RepairRefusalsAreOneLine) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/not-a-session";
  std::ofstream(path) << "hello";
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunCli({"session", "repair", path}), 1);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.rfind("error: ", 0), 0u) << err;
  EXPECT_NE(err.find("not a session file"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), err.size() - 1) << "one line: " << err;
  EXPECT_FALSE(std::filesystem::exists(path + ".damaged"));
}

}  // namespace
}  // namespace tierkv
