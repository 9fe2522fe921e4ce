// tests/runtime/session_integrity_test.cc
//
// Sessions never lie: a run with a session file gives the logits a run without it
// gives, whatever the runs before it did to the file (regenerated replies, edits in the
// middle of a prompt, other continuations, Ctrl-C, SIGKILL, two runs at once). On
// builtin:tiny-moe (Q8_0 weights) without llama.cpp's sums, a prefill and a token-by-
// token decode give the same bits (docs/architecture.md), so "the same" is bit for bit.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kvcache/session_file.h"
#include "kvcache/session_lock.h"
#include "runtime/run.h"
#include "tests/kvcache/kv_test_util.h"
#include "tests/runtime/reference_util.h"

namespace tierkv {
namespace {

namespace fs = std::filesystem;

const std::string kPrompt =
    "The keeper of the lighthouse wrote in his log every night: the sea, the wind, the ships that passed by.";

RunOptions Tiny(const std::string& prompt, int n, KvCodec codec = KvCodec::kF16, uint64_t frame = 64 * 1024) {
  RunOptions o;
  o.model = "builtin:tiny-moe";
  o.prompt = prompt;
  o.n_predict = n;
  o.memory.host_bytes = 64 << 20;
  o.memory.mlock = MlockMode::kOff;
  o.memory.warmup = false;
  o.memory.frame_bytes = frame;  // the smallest frames: blocks of 128 (f16) to 512 tokens
  o.kv_type = codec;
  o.llama_sums = RunOptions::LlamaSums::kOff;
  o.threads = 1;
  o.dump_logits = 1;
  return o;
}

// The logits a run computed for its last prompt position and for every generated
// token are those of the run without a session, bit for bit.
void ExpectSameLogits(const RunReport& with, const RunReport& without) {
  ASSERT_EQ(with.prompt_tokens, without.prompt_tokens);
  EXPECT_EQ(with.generated_tokens, without.generated_tokens);
  ASSERT_FALSE(with.logits.empty());
  ASSERT_FALSE(without.logits.empty());
  const LogitsEntry& a = with.logits.back();
  const LogitsEntry& b = without.logits.back();
  EXPECT_EQ(a.pos, b.pos);
  EXPECT_EQ(a.top, b.top) << "the last prompt position's logits differ";
  EXPECT_EQ(a.logsumexp, b.logsumexp);
  ASSERT_EQ(with.steps.size(), without.steps.size());
  for (size_t i = 0; i < with.steps.size(); ++i) {
    EXPECT_EQ(with.steps[i].top, without.steps[i].top) << "step " << i;
    EXPECT_EQ(with.steps[i].logsumexp, without.steps[i].logsumexp) << "step " << i;
  }
}

// Runs `o` with its session and then without one; the two must agree.
RunReport CheckAgainstFresh(RunOptions o) {
  auto with = RunSession(o);
  EXPECT_TRUE(with.ok()) << with.status().ToString();
  if (!with.ok()) return {};
  o.session.clear();
  auto without = RunSession(o);
  EXPECT_TRUE(without.ok()) << without.status().ToString();
  if (without.ok()) ExpectSameLogits(*with, *without);
  return *with;
}

// The three ways to branch a conversation, each of which restored the KV of the
// old text under format 2: regenerate a reply with another seed, then continue it; edit
// a word in the middle of the prompt; continue a prefix with other text. Every codec,
// two frame sizes.
TEST(SessionIntegrityTest, RegenerateEditAndBranchRestoreTheirOwnKv) {
  for (const KvCodec codec : kAllKvCodecs) {
    for (const uint64_t frame : {uint64_t{64} << 10, uint64_t{256} << 10}) {
      SCOPED_TRACE(std::string(KvCodecName(codec)) + ", frames of " + std::to_string(frame) + " bytes");
      testing::TempDir dir;
      const std::string session = dir.path() + "/r.tkv";
      RunOptions first = Tiny(kPrompt, 40, codec, frame);
      first.sampler.temperature = 1.0f;
      first.sampler.seed = 1;
      first.session = session;
      first.dump_logits = 0;
      auto r1 = RunSession(first);
      ASSERT_TRUE(r1.ok()) << r1.status().ToString();
      RunOptions regen = first;
      regen.sampler.seed = 2;
      auto r2 = RunSession(regen);
      ASSERT_TRUE(r2.ok()) << r2.status().ToString();
      ASSERT_NE(r1->text, r2->text) << "the seeds should give two replies";
      EXPECT_EQ(r2->reused_prefix_tokens, static_cast<int>(r2->prompt_tokens.size()) - 1);
      ASSERT_TRUE(SessionFile::Verify(session).ok());

      RunOptions cont = Tiny(kPrompt + r2->text, 8, codec, frame);
      cont.session = session;
      const RunReport c = CheckAgainstFresh(cont);
      EXPECT_GT(c.reused_prefix_tokens, static_cast<int>(kPrompt.size()));

      std::string edited = kPrompt + r2->text;
      edited.replace(30, 10, "LIGHTHOUSE");
      RunOptions edit = Tiny(edited, 8, codec, frame);
      edit.session = session;
      auto held = SessionFile::Inspect(session);
      ASSERT_TRUE(held.ok());
      const RunReport e = CheckAgainstFresh(edit);
      // Reused: up to the edit (the tokens the file and the edited prompt share).
      size_t lcp = 0;
      while (lcp < held->tokens.size() && lcp < e.prompt_tokens.size() && held->tokens[lcp] == e.prompt_tokens[lcp]) ++lcp;
      EXPECT_EQ(e.reused_prefix_tokens, static_cast<int>(lcp));
      EXPECT_LT(lcp, 40u);

      RunOptions branch = Tiny(kPrompt.substr(0, 70) + " and then a storm came in from the west.", 8, codec, frame);
      branch.session = session;
      CheckAgainstFresh(branch);
      EXPECT_TRUE(SessionFile::Verify(session).ok());
    }
  }
}

// Random sequences of runs on one session: prompts sharing random prefixes of what the
// session holds, edits, regenerations, truncations, Ctrl-C in the prefill or the reply,
// SIGKILL at a random moment (in a child process). After each, a run with the session
// gives the logits of a run without it, and nothing is left beside the file.
TEST(SessionIntegrityTest, RandomRunsNeverRestoreForeignKv) {
  testing::TempDir dir;
  const std::string session = dir.path() + "/p.tkv";
  std::mt19937_64 rng(4307);
  const std::vector<std::string> words = {"sea", "wind", "ship", "night", "lamp", "stairs", "log", "storm", "gull",
                                          "harbour", "rope", "bell"};
  auto some_words = [&](int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += " " + words[rng() % words.size()];
    return s;
  };
  std::string held = kPrompt;  // text of the tokens the session holds (tiny-moe: one token a byte)
#ifdef TIERKV_SANITIZE
  const int kSteps = 10;
#else
  const int kSteps = 24;
#endif
  const KvCodec codecs[] = {KvCodec::kF16, KvCodec::kQ4_0};
  const KvCodec codec = codecs[rng() % 2];
  for (int step = 0; step < kSteps; ++step) {
    // The prompt of this step: a random prefix of what the session holds, then an edit
    // or new words.
    std::string prompt = held.substr(0, 1 + rng() % held.size());
    const int kind = static_cast<int>(rng() % 7);
    if (kind == 0 && prompt.size() > 10) {
      prompt[rng() % (prompt.size() - 1)] = 'X';  // an edit in the middle
    } else if (kind != 1) {
      prompt += some_words(1 + static_cast<int>(rng() % 12));
    }  // kind 1: a truncation (the prefix alone)
    const int n = 1 + static_cast<int>(rng() % 24);
    SCOPED_TRACE("step " + std::to_string(step) + ", kind " + std::to_string(kind) + ", " +
                 std::to_string(prompt.size()) + " bytes");
    RunOptions o = Tiny(prompt, n, codec);
    o.session = session;
    o.batch = 8 + static_cast<int>(rng() % 40);
    o.sampler.temperature = (rng() % 2) ? 1.0f : 0.0f;  // a regeneration when the prompt repeats
    o.sampler.seed = rng();
    o.dump_logits = 0;
    const int action = static_cast<int>(rng() % 4);
    if (action == 0) {  // SIGKILL at a random moment
      const auto delay = std::chrono::milliseconds(rng() % 400);
      const pid_t pid = fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        auto r = RunSession(o);
        _exit(r.ok() ? 0 : 1);
      }
      std::this_thread::sleep_for(delay);
      kill(pid, SIGKILL);
      int status = 0;
      ASSERT_EQ(waitpid(pid, &status, 0), pid);
      EXPECT_TRUE(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == 0));
    } else {
      std::atomic<bool> stop{false};
      o.stop = &stop;
      const int stop_at = static_cast<int>(rng() % 6);
      if (action == 1) {  // Ctrl-C in the prefill, after a chunk or two
        o.on_prefill = [&, k = 0](int, int) mutable {
          if (++k == 1 + stop_at % 2) stop = true;
        };
      } else if (action == 2) {  // Ctrl-C in the reply
        o.on_text = [&, k = 0](std::string_view) mutable {
          if (++k == 1 + stop_at) stop = true;
          return true;
        };
      }
      auto r = RunSession(o);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
    }
    if (fs::exists(session)) {
      const Status v = SessionFile::Verify(session);
      ASSERT_TRUE(v.ok()) << v.ToString();
      auto summary = SessionFile::Inspect(session);
      ASSERT_TRUE(summary.ok());
      held.assign(summary->tokens.begin(), summary->tokens.end());  // bytes back to text
      if (held.empty()) held = kPrompt;
    }
    // The check: continue what the session holds, with and without it.
    RunOptions check = Tiny(held + some_words(2), 4, codec);
    check.session = session;
    const RunReport c = CheckAgainstFresh(check);
    if (::testing::Test::HasFailure()) return;
    held.assign(c.prompt_tokens.begin(), c.prompt_tokens.end());
    for (const auto& e : fs::directory_iterator(dir.path())) {
      EXPECT_EQ(e.path().filename(), "p.tkv") << "left beside the session: " << e.path();
    }
  }
}

// Two runs on one session at once: the second waits for the first (and says so), then
// builds on its save; the file verifies and holds the second run's tokens.
TEST(SessionIntegrityTest, ConcurrentRunsTakeTurns) {
  testing::TempDir dir;
  const std::string session = dir.path() + "/c.tkv";
  RunOptions a = Tiny(kPrompt, 48);
  a.session = session;
  a.dump_logits = 0;
  std::atomic<bool> a_started{false}, release_a{false};
  a.on_text = [&](std::string_view) {
    a_started = true;
    while (!release_a) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return true;
  };
  Result<RunReport> ra = Status::Internal("not run");
  std::thread ta([&] { ra = RunSession(a); });
  while (!a_started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // a holds the session now.
  SessionLock::Options no_wait;
  no_wait.wait = false;
  auto probe = SessionLock::Acquire(session, no_wait);
  ASSERT_FALSE(probe.ok());
  EXPECT_NE(probe.status().message().find("in use by pid"), std::string::npos) << probe.status().message();

  RunOptions b = Tiny(kPrompt + " Later that night", 8);
  b.session = session;
  b.dump_logits = 0;
  Result<RunReport> rb = Status::Internal("not run");
  std::thread tb([&] { rb = RunSession(b); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  release_a = true;
  ta.join();
  tb.join();
  ASSERT_TRUE(ra.ok()) << ra.status().ToString();
  ASSERT_TRUE(rb.ok()) << rb.status().ToString();
  EXPECT_TRUE(ra->saved);
  EXPECT_TRUE(rb->saved);
  EXPECT_GT(rb->restored_tokens, 0) << "b restored a's save: it waited for it";
  ASSERT_TRUE(SessionFile::Verify(session).ok());
  auto s = SessionFile::Inspect(session);
  ASSERT_TRUE(s.ok());
  std::vector<int32_t> b_all = rb->prompt_tokens;
  b_all.insert(b_all.end(), rb->generated_tokens.begin(), rb->generated_tokens.end());
  EXPECT_EQ(s->tokens, b_all);
}

// ---------------------------------------------------------------- the built binary

struct Ran {
  int code = -1;
  std::string out, err;
};

std::string Slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

Ran Tierkv(const std::string& args, const std::string& dir) {
  const std::string out = dir + "/.out", err = dir + "/.err";
  const int status = std::system((Quote(TIERKV_CLI_BINARY) + " " + args + " > " + out + " 2> " + err).c_str());
  Ran r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = Slurp(out);
  r.err = Slurp(err);
  fs::remove(out);
  fs::remove(err);
  return r;
}

// The failure on the built binary: a session of a long prompt, then a run with
// a word of that prompt edited near its end (which reuses the text before the edit and
// saves blocks of the old size over it), then a continuation of the edited text with
// and without the session: the same tokens and logits. On ref-llama-q8_0 (the issue's
// model) and builtin:tiny-moe (which runs without the reference files).
void EditedPromptRepro(const std::string& model) {
  testing::TempDir dir;
  const std::string s = dir.path() + "/r.tkv";
  const std::string common =
      "run --model " + Quote(model) + " --frame 64KiB --host 64MiB --no-warmup --no-llama-sums -t 1 -n 8 ";
  std::string prompt;
  for (int i = 0; i < 30; ++i) prompt += "Night " + std::to_string(i) + ": the keeper lit the lamp and watched the sea. ";
  std::string edited = prompt;
  edited.replace(edited.size() * 3 / 4, 5, "STORM");
  ASSERT_EQ(Tierkv(common + "--temp 1 -s 1 -p " + Quote(prompt) + " --session " + s, dir.path()).code, 0);
  const Ran edit = Tierkv(common + "--temp 1 -s 2 -p " + Quote(edited) + " --session " + s + " --json", dir.path());
  ASSERT_EQ(edit.code, 0) << edit.err;
  EXPECT_EQ(Tierkv("session verify " + s, dir.path()).code, 0);
  const std::string next = common + "-p " + Quote(edited + " Then the ships came home.") + " --dump-logits 2 --json";
  const Ran with = Tierkv(next + " --session " + s, dir.path());
  const Ran without = Tierkv(next, dir.path());
  ASSERT_EQ(with.code, 0) << with.err;
  ASSERT_EQ(without.code, 0) << without.err;
  const auto je = nlohmann::json::parse(edit.out);
  const auto jw = nlohmann::json::parse(with.out), jo = nlohmann::json::parse(without.out);
  // The continuation reuses the whole edited prompt (and what followed it).
  EXPECT_GE(jw["session"]["reused_prefix_tokens"].get<size_t>(), je["prompt_tokens"].size() - 1);
  EXPECT_EQ(jw["generated_tokens"], jo["generated_tokens"]);
  EXPECT_EQ(jw["steps"], jo["steps"]);
  EXPECT_EQ(jw["logits"].back(), jo["logits"].back());
}

TEST(SessionIntegrityCliTest, EditedPromptContinuesAsWithoutTheSession) { EditedPromptRepro("builtin:tiny-moe"); }

TEST(SessionIntegrityCliTest, EditedPromptContinuesAsWithoutTheSessionOnLlama) {
  const std::string model = std::string(TIERKV_SHARED_DIR) + "/reference/models/ref-llama-q8_0.gguf";
  TIERKV_NEED_REFERENCE(model);
  EditedPromptRepro(model);
}

// Two tierkv processes on one session: the second waits (and says so on stderr), both
// exit 0, and the file verifies holding the second one's tokens.
TEST(SessionIntegrityCliTest, TwoProcessesOnOneSessionTakeTurns) {
  testing::TempDir dir;
  const std::string s = dir.path() + "/c.tkv";
  const std::string common = "--model builtin:tiny-moe --host 64MiB --no-warmup -t 1 --session " + s + " ";
  const std::string a_out = dir.path() + "/a.json", a_err = dir.path() + "/a.err";
  // The first holds the session through a long reply; the second starts meanwhile.
  const std::string a_args = "run " + common + "-p " + Quote(kPrompt) + " -n 400 --ignore-eos --json";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string cmd = Quote(TIERKV_CLI_BINARY) + " " + a_args + " > " + a_out + " 2> " + a_err;
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  const std::string lock = s + ".lock";
  for (int i = 0; i < 2000 && !fs::exists(lock); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_TRUE(fs::exists(lock)) << "the first run takes the session's lock";
  const Ran b = Tierkv("run " + common + "-p " + Quote(kPrompt + " And then") + " -n 4 --json", dir.path());
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << Slurp(a_err);
  EXPECT_EQ(b.code, 0) << b.err;
  const auto ja = nlohmann::json::parse(Slurp(a_out)), jb = nlohmann::json::parse(b.out);
  EXPECT_TRUE(ja["session"]["saved"].get<bool>());
  EXPECT_TRUE(jb["session"]["saved"].get<bool>());
  const bool b_waited = b.err.find("waiting for session") != std::string::npos;
  if (b_waited) {
    EXPECT_GT(jb["session"]["restored_tokens"].get<int>(), 0) << "b restored a's save";
  }
  EXPECT_TRUE(b_waited || jb["session"]["restored_tokens"].get<int>() > 0) << b.err;
  EXPECT_EQ(Tierkv("session verify " + s, dir.path()).code, 0);
  std::vector<int32_t> b_all = jb["prompt_tokens"].get<std::vector<int32_t>>();
  for (int32_t t : jb["generated_tokens"].get<std::vector<int32_t>>()) b_all.push_back(t);
  auto summary = SessionFile::Inspect(s);
  ASSERT_TRUE(summary.ok());
  EXPECT_EQ(summary->tokens, b_all);
  EXPECT_FALSE(fs::exists(lock)) << "released and removed";
}

// A symlink planted at any name tierkv uses beside a session is never followed: the
// lock file's name is refused, the old temporary name is ignored, the session is saved.
TEST(SessionIntegrityCliTest, PlantedLinksAreNeverFollowed) {
  testing::TempDir dir;
  const std::string s = dir.path() + "/l.tkv";
  const std::string victim = dir.path() + "/victim";
  std::ofstream(victim) << "precious";
  const std::string common = "run --model builtin:tiny-moe --host 64MiB --no-warmup -t 1 -n 2 -p hello --session " + s;
  // Every PID a format-2 tierkv might have had for its temporary file is too many; the
  // next few are enough to show the old name is not used.
  for (int i = 0; i < 50; ++i) fs::create_symlink(victim, s + ".tmp." + std::to_string(getpid() + i));
  Ran r = Tierkv(common, dir.path());
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(Slurp(victim), "precious");
  EXPECT_FALSE(fs::is_symlink(s));
  EXPECT_TRUE(SessionFile::Verify(s).ok());
  fs::create_symlink(victim, s + ".lock");
  r = Tierkv(common, dir.path());
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("symbolic link"), std::string::npos) << r.err;
  EXPECT_EQ(Slurp(victim), "precious");
}

}  // namespace
}  // namespace tierkv

namespace tierkv {
namespace {

// A long prefill saves checkpoints: killed (SIGKILL) after some chunks, it leaves a
// session holding a prefix of the prompt that verifies, and the same command resumes
// from there with the logits of a run that was never killed.
TEST(SessionIntegrityTest, SigkillDuringPrefillResumesFromCheckpoint) {
  testing::TempDir dir;
  const std::string session = dir.path() + "/k.tkv";
  std::string prompt;
  while (prompt.size() < 1500) prompt += kPrompt + " ";
  RunOptions o = Tiny(prompt, 4);
  o.session = session;
  o.batch = 64;
  o.prefill_save_seconds = 1e-9;  // a checkpoint after every chunk
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    o.on_prefill = [](int done, int) {
      if (done >= 640) kill(getpid(), SIGKILL);  // after the checkpoint of 576 tokens
    };
    auto r = RunSession(o);
    _exit(r.ok() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the run was to be killed in its prefill";
  ASSERT_TRUE(SessionFile::Verify(session).ok());
  auto summary = SessionFile::Inspect(session);
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_GE(summary->tokens.size(), 512u) << "checkpoints were saved during the prefill";
  EXPECT_LT(summary->tokens.size(), 700u);
  const RunReport r = CheckAgainstFresh(o);
  EXPECT_EQ(static_cast<size_t>(r.reused_prefix_tokens), summary->tokens.size()) << "resumed from the checkpoint";
}

}  // namespace
}  // namespace tierkv
