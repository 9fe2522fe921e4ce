// tests/runtime/run_command_test.cc
//
// `tierkv run` flag handling, in process: contradictory or out-of-range flags give one
// error line and exit code 2 before anything loads; a --vram without a device tier is a
// warning, not a silent no-op; llama.cpp's -ctk / -ctv are read; a context whose KV
// cache cannot fit in all tiers together is refused before the prefill; -n -1 fills the
// context and --ignore-eos never samples an end-of-generation token.
#include "runtime/cli/run_command.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/cpu_features.h"
#include "kernels/executor.h"
#include "kernels/quant.h"
#include "kernels/thread_pool.h"
#include "kvcache/session_file.h"
#include "runtime/run.h"
#include "tests/kvcache/redis_test_util.h"
#include "tests/runtime/cli_test_util.h"
#include "tests/runtime/reference_util.h"

namespace tierkv {
namespace {

using testing::CliResult;

CliResult RunCli(std::vector<std::string> args) {
  testing::WarningsToStderr();
  CLI::App app;
  int exit_code = 0;  // the run command sets it on failures only
  AddRunCommand(app, exit_code);
  return testing::ParseCli(app, exit_code, std::move(args));
}

// The flags of a small, quick run of the builtin model.
std::vector<std::string> Quick(std::vector<std::string> extra) {
  std::vector<std::string> a = {"run", "-m", "builtin:tiny-moe", "-p", "ab", "--no-warmup", "--host", "64MiB",
                                "--mlock", "off"};
  if (std::find(extra.begin(), extra.end(), "-n") == extra.end()) extra.insert(extra.end(), {"-n", "2"});
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

int Lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

TEST(RunCommandTest, BadFlagsGiveOneErrorLineAndExitTwo) {
  const struct {
    std::vector<std::string> flags;
    const char* message;
  } cases[] = {
      {{"-n", "-2"}, "-n must be -1 (until end of generation or a full context) or more"},
      {{"--repeat-penalty", "0"}, "--repeat-penalty must be positive"},
      {{"-f", "/dev/null"}, "give the prompt once: -p TEXT or -f FILE, not both"},
      {{"--repeat-last-n", "-5"}, "--repeat-last-n must be -1 (all), 0 (off) or positive"},
      {{"--dump-logits", "-3"}, "--dump-logits must not be negative"},
      {{"--kv-type", "q5"}, "unknown KV codec 'q5'"},
      {{"-ctk", "q8_0", "-ctv", "f16"}, "-ctk q8_0 and -ctv f16 differ"},
      {{"--weights", "somewhere"}, "--weights must be auto, paged or mapped"},
      {{"--device", "tpu"}, "--device must be cuda, sim or none"},
      {{"--kv-batch", "-1"}, "--kv-batch must be >= 0"},
      {{"--expert-split", "gpu"}, "--expert-split must be auto, device or host, not 'gpu'"},
      {{"--expert-admit", "-1"}, "--expert-admit must be >= 0"},
      {{"-b", "0"}, "-b/--batch-size must be >= 1"},
      {{"--disk", "lots"}, "lots"},
      {{"--rope-scaling", "ntk"}, "--rope-scaling must be none, linear or yarn, not 'ntk'"},
      {{"--rope-scale", "2", "--rope-freq-scale", "0.25"}, "disagree"},
      {{"--rope-scale", "0.5"}, "RoPE: the scale factor (--rope-scale) must be >= 1"},
      {{"-r", "User:", "-r", ""}, "-r: a reverse prompt must not be empty"},
      {{"-c", "-7"}, "-c/--ctx must not be negative"},
      {{"-t", "-3"}, "-t/--threads must not be negative"},
      {{"-s", "-5"}, "-s/--seed must be -1 (random) or a seed 0..18446744073709551615, not '-5'"},
      {{"-s", "18446744073709551616"}, "-s/--seed must be -1 (random) or a seed 0..18446744073709551615"},
      {{"--vram", "auto"}, "--vram auto: size 'auto' does not start with a number"},
      {{"--disk", "12XB"}, "--disk 12XB: size '12XB'"},
      {{"--session", ""}, "--session must name a file"},
      {{"--session", "/dev/null/s.tkv"}, "--session /dev/null/s.tkv: /dev/null is not a directory"},
      {{"--dump-logits", "2"}, "--dump-logits reports in the JSON output: give --json as well"},
      {{"--sim-gbps", "nan"}, "--sim-gbps must be a bandwidth >= 0"},
      {{"--sim-gbps", "-1"}, "--sim-gbps must be a bandwidth >= 0"},
      {{"--frame", "1KiB"}, "--frame 1KiB: frame size 1.00 KiB must be 64 KiB .. 4 MiB"},
      {{"--kv-type", "f16", "-ctk", "q8_0"}, "--kv-type f16 and -ctk q8_0 differ"},
      {{"--chat-template", ""}, "--chat-template must not be empty"},
      {{"--session", "/nonexistent-dir/s.tkv"}, "--session /nonexistent-dir/s.tkv: /nonexistent-dir: directory does not exist"},
      {{"--session", "/"}, "--session /: a directory"},
      {{"--session", "/proc/s.tkv"}, "--session /proc/s.tkv: cannot create a file in /proc"},
      // Usage errors CLI11 finds (runtime/cli/usage_command.h).
      {{"--bogus"}, "The following argument was not expected: --bogus (tierkv run --help lists the options)"},
      {{"-n", "abc"}, "Could not convert: --n-predict = abc"},
      {{"-p", "twice"}, "--prompt: At Most 1 required but received 2"},
      // llama.cpp's flags: single-dash words tierkv lacks are named (not read as -n "gl").
      {{"-ub", "512"}, "unknown flag -ub"},
      {{"-ub=512"}, "unknown flag -ub ("},
      {{"-sys", ""}, "--system-prompt (-sys) must not be empty"},
      {{"-ncmoe", "4"}, "unknown flag -ncmoe"},
      {{"-fa", "maybe"}, "--flash-attn must be on, off or auto, not 'maybe'"},
      {{"-no-cnv", "--chat"}, "-no-cnv (no chat) contradicts --chat"},
      {{"-ngl", "many"}, "-ngl/--n-gpu-layers must be a layer count, auto or all, not 'many'"},
      {{"--no-mmap", "--weights", "mapped"}, "--no-mmap (paged weights) contradicts --weights mapped"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.flags[0]);
    const CliResult r = RunCli(Quick(c.flags));
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_EQ(Lines(r.err), 1) << r.err;
  }
}

// llama.cpp command lines run: -ngl (with no device: a warning), -fa with or without a
// value, -no-cnv, --ctx-size, and -p with a dash-word as its text.
TEST(RunCommandTest, LlamaCppFlagsAreRead) {
  const CliResult r = RunCli(Quick({"-ngl", "99", "-fa", "--ctx-size", "24", "-no-cnv", "--json"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("-ngl 99 is ignored"), std::string::npos) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["n_ctx"], 24) << r.out;
  const CliResult on = RunCli(Quick({"-fa", "on", "--n-gpu-layers", "0", "--json"}));
  const CliResult all = RunCli(Quick({"-ngl", "all"}));
  EXPECT_EQ(all.exit_code, 0) << all.err;
  EXPECT_NE(all.err.find("-ngl all is ignored"), std::string::npos) << all.err;
  // The -flag=value spelling, llama.cpp's other values, bare --mlock (llama.cpp's: lock
  // if the system lets it, as --mlock try) and --predict.
  std::vector<std::string> spelled = Quick({"-ngl=-1", "-ctk=q8_0", "-fa=1", "--predict", "3", "--json"});
  spelled.erase(std::find(spelled.begin(), spelled.end(), "--mlock"), std::find(spelled.begin(), spelled.end(), "--mlock") + 2);
  spelled.erase(std::find(spelled.begin(), spelled.end(), "-n"), std::find(spelled.begin(), spelled.end(), "-n") + 2);
  spelled.push_back("--mlock");
  const CliResult eq = RunCli(spelled);
  ASSERT_EQ(eq.exit_code, 0) << eq.err;
  const nlohmann::json je = nlohmann::json::parse(eq.out);
  EXPECT_EQ(je["kv"]["type"], "q8_0") << eq.out;
  EXPECT_EQ(je["generated_tokens"].size(), 3u) << eq.out;
  EXPECT_EQ(je["seed"], 0u) << "the default seed is reported";
  EXPECT_EQ(eq.err.find("-ngl -1 is ignored"), std::string::npos) << eq.err;
  ASSERT_EQ(on.exit_code, 0) << on.err;
  EXPECT_EQ(on.err.find("ignored"), std::string::npos) << on.err;
  std::vector<std::string> dash = Quick({"--json"});
  dash[std::find(dash.begin(), dash.end(), "ab") - dash.begin()] = "-xyz";
  const CliResult text = RunCli(dash);
  ASSERT_EQ(text.exit_code, 0) << text.err;
}

// -s -1 draws a random seed; --json reports it, and giving it back with -s repeats the
// run's draws.
TEST(RunCommandTest, RandomSeedIsReportedAndRepeats) {
  const CliResult drawn = RunCli(Quick({"-s", "-1", "--temp", "1.5", "--min-p", "0", "-n", "8", "--json"}));
  ASSERT_EQ(drawn.exit_code, 0) << drawn.err;
  const nlohmann::json jd = nlohmann::json::parse(drawn.out);
  const uint64_t seed = jd["seed"];
  EXPECT_NE(drawn.err.find("sampling seed " + std::to_string(seed)), std::string::npos) << drawn.err;
  const CliResult again =
      RunCli(Quick({"-s", std::to_string(seed), "--temp", "1.5", "--min-p", "0", "-n", "8", "--json"}));
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(nlohmann::json::parse(again.out)["generated_tokens"], jd["generated_tokens"]);
}

// A prompt file that is a directory is refused (it would read as an empty prompt); one
// that cannot be opened names the reason; a FIFO as the model or the session is refused
// without blocking in open().
TEST(RunCommandTest, PathsThatAreNotFilesAreRefused) {
  const std::string dir = ::testing::TempDir();
  auto expect = [](const CliResult& r, int code, const std::string& message) {
    EXPECT_EQ(r.exit_code, code) << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_EQ(Lines(r.err), 1) << r.err;
  };
  const std::vector<std::string> base = {"run", "-m", "builtin:tiny-moe", "-n", "2", "--no-warmup", "--host", "64MiB",
                                         "--mlock", "off"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  expect(RunCli(with({"-f", dir})), 2, "--prompt-file " + dir + ": a directory, not a file");
  expect(RunCli(with({"-f", dir + "/no-such-prompt.txt"})), 2, "No such file or directory");
  // A read that fails part way (/proc/self/mem at offset 0: EIO) is not an empty prompt.
  if (std::filesystem::exists("/proc/self/mem")) {
    expect(RunCli(with({"-f", "/proc/self/mem"})), 2, "reading --prompt-file /proc/self/mem: Input/output error");
  }
  // An endless one (it used to be read until memory ran out): read up to what can fit
  // the context (here what 64 MiB of host tier holds, 32768 tokens of at most 4 bytes),
  // and an empty name.
  expect(RunCli(with({"-f", "/dev/zero"})), 1,
         "error: the prompt (more than 131072 bytes) cannot fit the context of at most 32768 tokens");
  expect(RunCli(with({"-f", ""})), 2, "--prompt-file must name a file");
  const std::string fifo = dir + "/run_command_test.fifo";
  std::filesystem::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  expect(RunCli(with({"-p", "ab", "--session", fifo})), 2, "--session " + fifo + ": not a regular file");
  // A link whose target's directory does not exist: found before the run, not at its save.
  const std::string dangling = dir + "/run_command_test_dangling.tkv";
  std::filesystem::remove(dangling);
  std::filesystem::create_symlink("/nonexistent-dir/s.tkv", dangling);
  expect(RunCli(with({"-p", "ab", "--session", dangling})), 2, "/nonexistent-dir: directory does not exist");
  std::filesystem::remove(dangling);
  expect(RunCli({"run", "-m", fifo, "-p", "ab", "--mlock", "off"}), 1, fifo + ": not a regular file");
  std::filesystem::remove(fifo);
}

// An explicit --host that warm-up or mlock would touch past the machine's available
// memory is an impossible budget, not a run that ends in the out-of-memory killer.
TEST(RunCommandTest, HostBeyondAvailableMemoryIsRefused) {
  const CliResult r = RunCli({"run", "-m", "builtin:tiny-moe", "-p", "ab", "-n", "2", "--host", "4096TiB"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("error: impossible budget: --host ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("of memory available"), std::string::npos) << r.err;
  EXPECT_EQ(Lines(r.err), 1) << r.err;
}

// --device sim holds its "VRAM" in host memory, which the warm-up touches: a budget past
// the available memory is refused the same way, before anything is reserved.
TEST(RunCommandTest, SimDeviceBeyondAvailableMemoryIsRefused) {
  const CliResult r =
      RunCli({"run", "-m", "builtin:tiny-moe", "-p", "ab", "-n", "2", "--device", "sim", "--vram", "4096TiB"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("error: impossible budget: --vram 4096 TiB of --device sim", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("of memory available"), std::string::npos) << r.err;
  EXPECT_EQ(Lines(r.err), 1) << r.err;
}

// -n -1 generates until an end-of-generation token or a full context; --ignore-eos
// never samples one, so the context fills.
TEST(RunCommandTest, UnlimitedGenerationFillsTheContextWithIgnoreEos) {
  const CliResult r = RunCli(Quick({"-n", "-1", "-c", "12", "--ignore-eos", "--temp", "1.5", "--min-p", "0",
                                    "--repeat-penalty", "1.3", "-s", "7", "--json"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const size_t n_prompt = j["prompt_tokens"].size();
  EXPECT_EQ(j["generated_tokens"].size(), 12 - n_prompt);
  EXPECT_EQ(j["kv"]["tokens"], 11);  // the last token is sampled, never fed back
  EXPECT_EQ(j["context_full"], true) << "it ran to the end of the context";
  EXPECT_EQ(j["stop_reason"], "context_full");
  EXPECT_NE(r.err.find("stopped: the context is full (12 tokens, -c)\n"), std::string::npos) << r.err;

  // Near-uniform draws (temperature 100, no cuts) reach an end-of-text token within 300
  // steps for most seeds (about 1 in 258 a step: with seed 1 at token 163); with the same
  // seed and --ignore-eos every one of the 300 comes.
  std::vector<std::string> uniform = {"-n", "300", "--temp", "100", "--top-k", "0", "--top-p", "1",
                                      "--min-p", "0", "--json", "-s", "1"};
  int eog = -1;
  for (int seed = 1; seed <= 20 && eog < 0; ++seed) {
    uniform.back() = std::to_string(seed);
    const CliResult stops = RunCli(Quick(uniform));
    ASSERT_EQ(stops.exit_code, 0) << stops.err;
    const nlohmann::json js = nlohmann::json::parse(stops.out);
    if (js["generated_tokens"].size() < 300u) {
      eog = js["generated_tokens"].back();
      EXPECT_EQ(js["stop_reason"], "eog");
      EXPECT_NE(stops.err.find("stopped: end-of-generation token\n"), std::string::npos) << stops.err;
    }
  }
  ASSERT_GE(eog, 0) << "no seed of 20 drew an end-of-text token in 300 near-uniform steps";
  std::vector<std::string> ignoring = uniform;
  ignoring.push_back("--ignore-eos");
  const CliResult goes_on = RunCli(Quick(ignoring));
  ASSERT_EQ(goes_on.exit_code, 0) << goes_on.err;
  const nlohmann::json jg = nlohmann::json::parse(goes_on.out);
  ASSERT_EQ(jg["generated_tokens"].size(), 300u);
  EXPECT_EQ(jg["stop_reason"], "limit");
  EXPECT_EQ(jg["context_full"], false);
  EXPECT_NE(goes_on.err.find("stopped: -n limit reached (300 tokens)\n"), std::string::npos) << goes_on.err;
  for (const int t : jg["generated_tokens"]) EXPECT_NE(t, eog);

  const CliResult full = RunCli(Quick({"-n", "-1", "-c", "2"}));
  EXPECT_EQ(full.exit_code, 1) << full.err;
  EXPECT_NE(full.err.find("fills the context of 2 tokens"), std::string::npos) << full.err;
}

// Without --host, a context whose KV cache passes 1 GiB gets a host tier to hold it
// (here 4M tokens of tiny-moe, 8 GiB of f16 KV; --no-warmup, so only reserved).
TEST(RunCommandTest, AutoHostGrowsToTheContext) {
  // (Past the trained context of 262144 tokens: scaled 16 times.)
  const CliResult r = RunCli({"run", "-m", "builtin:tiny-moe", "-p", "ab", "-n", "2", "--no-warmup", "--mlock",
                              "off", "-c", "4194304", "--rope-scaling", "linear", "--rope-scale", "16", "--json"});
  if (r.exit_code == 1 && r.err.find("--host auto: 90% of the") != std::string::npos) {
    GTEST_SKIP() << "this machine has less than 9 GiB available: " << r.err;
  }
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  uint64_t host = 0;
  for (const auto& t : j["tiers"]) {
    if (t["name"] == "host") host = t["budget_bytes"];
  }
  EXPECT_GE(host, 8ull << 30);
  EXPECT_LT(host, 9ull << 30);
}

// ... and a short one a host tier of what it needs (not a fixed gigabyte), with the
// reason in the report; --host SIZE is reported as given.
TEST(RunCommandTest, AutoHostIsWhatTheContextNeeds) {
  const CliResult r = RunCli({"run", "-m", "builtin:tiny-moe", "-p", "ab", "-n", "2", "--mlock", "off", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  uint64_t host = 0;
  for (const auto& t : j["tiers"]) {
    if (t["name"] == "host") host = t["budget_bytes"];
  }
  EXPECT_GT(host, 0u);
  EXPECT_LE(host, 8ull << 20) << "a few tokens' KV cache and room: megabytes";
  EXPECT_NE(j["host_budget"].get<std::string>().find("auto: the KV cache of"), std::string::npos) << j["host_budget"];
  const CliResult given = RunCli({"run", "-m", "builtin:tiny-moe", "-p", "ab", "-n", "2", "--mlock", "off", "--host",
                                  "64MiB", "--json"});
  ASSERT_EQ(given.exit_code, 0) << given.err;
  EXPECT_EQ(nlohmann::json::parse(given.out)["host_budget"], "--host");
}

// --chat wraps the prompt in the model's chat format (the reference qwen3 vocabulary
// carries a chatml template); -sys implies it; a model without a template is refused
// with one line, and an unknown --chat-template is a bad flag.
TEST(RunCommandTest, ChatUsesTheModelsTemplate) {
  const std::string ref = std::string(TIERKV_SHARED_DIR) + "/reference/models/";
  TIERKV_NEED_REFERENCE(ref + "ref-qwen3moe-q8_0.gguf");
  const std::vector<std::string> base = {"run", "-n", "2", "--no-warmup", "--mlock", "off", "-p", "Hi", "--json"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return RunCli(a);
  };
  const CliResult chat = with({"-m", ref + "ref-qwen3moe-q8_0.gguf", "-sys", "Be brief."});
  ASSERT_EQ(chat.exit_code, 0) << chat.err;
  const nlohmann::json j = nlohmann::json::parse(chat.out);
  EXPECT_EQ(j["chat"], "chatml");
  ASSERT_FALSE(j["prompt_tokens"].empty());
  EXPECT_EQ(j["prompt_tokens"][0], 151644);  // <|im_start|>
  const CliResult plain = with({"-m", ref + "ref-qwen3moe-q8_0.gguf"});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_TRUE(nlohmann::json::parse(plain.out)["chat"].is_null());

  const CliResult none = with({"-m", ref + "ref-llama-q8_0.gguf", "-cnv"});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("the model has no chat template"), std::string::npos) << none.err;
  EXPECT_EQ(Lines(none.err), 1) << none.err;
  const CliResult named = with({"-m", ref + "ref-llama-q8_0.gguf", "--chat-template", "llama2-sys"});
  ASSERT_EQ(named.exit_code, 0) << named.err;
  EXPECT_EQ(nlohmann::json::parse(named.out)["chat"], "llama2");
  const CliResult bad = with({"-m", ref + "ref-llama-q8_0.gguf", "--chat-template", "alpaca"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--chat-template: "), std::string::npos) << bad.err;
}

// --continue appends the prompt as the next user turn of the conversation saved in
// --session: the new prompt is the saved tokens, the closing end-of-turn marker and the
// new turn, and all of the saved part is reused.
TEST(RunCommandTest, ContinueAppendsATurnToTheSavedConversation) {
  const std::string model = std::string(TIERKV_SHARED_DIR) + "/reference/models/ref-qwen3moe-q8_0.gguf";
  TIERKV_NEED_REFERENCE(model);
  const std::string session = ::testing::TempDir() + "/continue_chat.tkv";
  std::filesystem::remove(session);
  auto turn = [&](const char* text) {
    return RunCli({"run", "-m", model, "-n", "3", "--no-warmup", "--mlock", "off", "--continue", "--session", session,
                   "-p", text, "--json"});
  };
  const CliResult first = turn("Hi");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const nlohmann::json j1 = nlohmann::json::parse(first.out);
  EXPECT_EQ(j1["chat"], "chatml");
  EXPECT_EQ(j1["session"]["restored_tokens"], 0);
  // The saved conversation holds the reply as shown, its last token included (fed before
  // the save), unless that token ended the turn.
  std::vector<int> saved = j1["prompt_tokens"];
  for (const int t : j1["generated_tokens"]) saved.push_back(t);
  if (saved.back() == 151645 || saved.back() == 151643) saved.pop_back();
  ASSERT_EQ(j1["kv"]["tokens"], saved.size());

  const CliResult second = turn("More");
  ASSERT_EQ(second.exit_code, 0) << second.err;
  const nlohmann::json j2 = nlohmann::json::parse(second.out);
  const std::vector<int> prompt2 = j2["prompt_tokens"];
  ASSERT_GT(prompt2.size(), saved.size() + 6);
  EXPECT_TRUE(std::equal(saved.begin(), saved.end(), prompt2.begin()));
  EXPECT_EQ(prompt2[saved.size()], 151645);      // <|im_end|> closes the reply
  EXPECT_EQ(prompt2[saved.size() + 2], 151644);  // <|im_start|>user
  EXPECT_EQ(j2["session"]["reused_prefix_tokens"], saved.size());

  const CliResult needs_session = RunCli({"run", "-m", model, "--continue", "-p", "x"});
  EXPECT_EQ(needs_session.exit_code, 2);
  EXPECT_NE(needs_session.err.find("--continue needs --session"), std::string::npos) << needs_session.err;
  // A format that cannot continue is refused at the first turn too.
  const std::string fresh = ::testing::TempDir() + "/continue_llama2.tkv";
  std::filesystem::remove(fresh);
  const CliResult llama2 = RunCli({"run", "-m", model, "-n", "2", "--no-warmup", "--mlock", "off", "--continue",
                                   "--chat-template", "llama2", "--session", fresh, "-p", "x"});
  EXPECT_EQ(llama2.exit_code, 1);
  EXPECT_NE(llama2.err.find("chatml and llama3"), std::string::npos) << llama2.err;
  EXPECT_FALSE(std::filesystem::exists(fresh));
  // Another model's conversation is refused before anything loads, with one line.
  const std::string llama = std::string(TIERKV_SHARED_DIR) + "/reference/models/ref-llama-q8_0.gguf";
  const CliResult other = RunCli({"run", "-m", llama, "-n", "2", "--no-warmup", "--mlock", "off", "--continue",
                                  "--chat-template", "chatml", "--session", session, "-p", "x"});
  EXPECT_EQ(other.exit_code, 1);
  EXPECT_NE(other.err.find("wrong model"), std::string::npos) << other.err;
  EXPECT_EQ(Lines(other.err), 1) << other.err;
  // A corrupt file: one line naming it, and the file is left as it was.
  {
    std::FILE* f = std::fopen(session.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fputs("garbage!", f);
    std::fclose(f);
  }
  const std::string before = testing::FileBytes(session);
  const CliResult corrupt = turn("Again");
  EXPECT_EQ(corrupt.exit_code, 1);
  EXPECT_NE(corrupt.err.find(session), std::string::npos) << corrupt.err;
  EXPECT_EQ(Lines(corrupt.err), 1) << corrupt.err;
  EXPECT_TRUE(testing::FileBytes(session) == before) << "the corrupt file is kept as it was";
  std::filesystem::remove(session);
}

// -i with --chat: each line of standard input is the next user turn, in one context.
// The conversation is the one two --continue runs make (the same tokens, the same
// replies), and the session is saved after each reply.
TEST(RunCommandTest, InteractiveChatIsTheConversationContinueMakes) {
  const std::string model = std::string(TIERKV_SHARED_DIR) + "/reference/models/ref-qwen3moe-q8_0.gguf";
  TIERKV_NEED_REFERENCE(model);
  const std::string live = ::testing::TempDir() + "/interactive.tkv", steps = ::testing::TempDir() + "/steps.tkv";
  std::filesystem::remove(live);
  std::filesystem::remove(steps);
  std::istringstream fake("More\n\n");
  std::streambuf* old = std::cin.rdbuf(fake.rdbuf());
  const CliResult chat = RunCli({"run", "-m", model, "-n", "3", "--no-warmup", "--mlock", "off", "-cnv", "-i",
                                 "--session", live, "-p", "Hi", "--json"});
  std::cin.rdbuf(old);
  ASSERT_EQ(chat.exit_code, 0) << chat.err;
  const nlohmann::json j = nlohmann::json::parse(chat.out);
  ASSERT_EQ(j["turns"].size(), 2u);
  EXPECT_EQ(j["turns"][1]["input"], "More");
  EXPECT_NE(chat.err.find("\n> "), std::string::npos) << "asks for each input on stderr";

  auto turn = [&](const char* text) {
    return RunCli({"run", "-m", model, "-n", "3", "--no-warmup", "--mlock", "off", "--continue", "--session", steps,
                   "-p", text, "--json"});
  };
  ASSERT_EQ(turn("Hi").exit_code, 0);
  const CliResult second = turn("More");
  ASSERT_EQ(second.exit_code, 0) << second.err;
  const nlohmann::json j2 = nlohmann::json::parse(second.out);
  EXPECT_EQ(j["turns"][1]["text"], j2["text"]);
  auto a = SessionFile::Inspect(live), b = SessionFile::Inspect(steps);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tokens, b->tokens);

  // Standard input cannot be both the prompt and the turns.
  const CliResult both = RunCli({"run", "-m", model, "-i", "-f", "-"});
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_EQ(Lines(both.err), 1) << both.err;
  std::filesystem::remove(live);
  std::filesystem::remove(steps);
}

// A damaged session file at the command line: a flipped byte in a block is refused when
// the block is paged in, a truncated file when it is opened; each is one line naming the
// problem, exit 1, and the file's bytes stay as they were (nothing is "repaired" away).
TEST(RunCommandTest, DamagedSessionIsRefusedAndKept) {
  const std::string session = ::testing::TempDir() + "/run_command_damaged.tkv";
  std::filesystem::remove(session);
  const std::vector<std::string> run = {"run", "-m", "builtin:tiny-moe", "-p", "The sea was calm and the night was long",
                                        "-n", "2", "--no-warmup", "--mlock", "off", "--session", session};
  ASSERT_EQ(RunCli(run).exit_code, 0);
  const std::string good = testing::FileBytes(session);
  ASSERT_GT(good.size(), 4096u + 64);
  auto write = [&](const std::string& bytes) {
    std::ofstream(session, std::ios::binary | std::ios::trunc) << bytes;
  };
  auto refused = [&](const std::string& what, const std::string& message) {
    SCOPED_TRACE(what);
    const std::string before = testing::FileBytes(session);
    const CliResult r = RunCli(run);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_EQ(Lines(r.err), 1) << r.err;
    EXPECT_TRUE(testing::FileBytes(session) == before) << "the file changed";
  };
  std::string flipped = good;
  flipped[4096 + 40 + 7] ^= 0x10;  // the first record's block bytes, past its 40-byte header
  write(flipped);
  refused("flipped block", "checksum");
  write(good.substr(0, good.size() - 40));  // the manifest's tail is gone
  refused("truncated", session);
  write(good);
  EXPECT_EQ(RunCli(run).exit_code, 0) << "the good file still restores";
  // A later save whose manifest is then damaged: refused as it is, not rolled back to an
  // earlier save (where the file holds one) and overwritten.
  std::vector<std::string> longer = run;
  longer[std::find(longer.begin(), longer.end(), "-p") - longer.begin() + 1] += " and the stars were out";
  ASSERT_EQ(RunCli(longer).exit_code, 0);
  std::string twice = testing::FileBytes(session);
  twice.back() ^= 0x01;  // the last byte: the second save's manifest
  write(twice);
  refused("damaged newest save", "fails its checksum");
  std::filesystem::remove(session);
}

// A save that runs out of room (here the file-size limit, RLIMIT_FSIZE: EFBIG, as a full
// disk gives ENOSPC) fails the run with one line; the session file keeps the bytes of
// its last save and no temporary file is left.
TEST(RunCommandTest, SaveThatCannotWriteKeepsTheOldSession) {
  // A directory of its own: ctest runs other session tests beside this one, and their
  // temporary files in the shared temp dir are not this save's.
  const std::string dir = ::testing::TempDir() + "/run_command_full";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string session = dir + "/run_command_full.tkv";
  auto run = [&](const std::string& prompt) {
    return RunCli({"run", "-m", "builtin:tiny-moe", "-p", prompt, "-n", "2", "--no-warmup", "--mlock", "off",
                   "--session", session});
  };
  ASSERT_EQ(run("The sea").exit_code, 0);
  const std::string saved = testing::FileBytes(session);
  ASSERT_FALSE(saved.empty());
  struct rlimit old {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  struct rlimit low = old;
  // The tail block grows, so the save writes the session afresh beside the old one (a
  // compaction: its garbage would outgrow the live blocks); half the old size stops it.
  low.rlim_cur = saved.size() / 2;
  void (*old_handler)(int) = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &low), 0);
  const CliResult r = run("The sea was calm and the night was long, and the ship sailed on");
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("saving session " + session), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("File too large"), std::string::npos) << r.err;
  EXPECT_EQ(Lines(r.err.substr(r.err.find("error: "))), 1) << r.err;
  EXPECT_TRUE(testing::FileBytes(session) == saved) << "the last save's bytes are kept";
  EXPECT_TRUE(SessionFile::Verify(session).ok());
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(session).parent_path())) {
    EXPECT_EQ(e.path().filename().string().find(".tierkv-tmp."), std::string::npos) << "the temporary file is removed";
  }
  std::filesystem::remove_all(dir);
}

// Drops CAP_IPC_LOCK from this thread's effective set for its lifetime (root ignores
// RLIMIT_MEMLOCK with it) and lowers RLIMIT_MEMLOCK, so that mlock fails as it does for
// an unprivileged user with the usual 8 MiB limit.
class MlockRefused {
 public:
  MlockRefused() {
    header_.version = _LINUX_CAPABILITY_VERSION_3;
    if (syscall(SYS_capget, &header_, saved_) != 0 || getrlimit(RLIMIT_MEMLOCK, &limit_) != 0) return;
    __user_cap_data_struct dropped[2] = {saved_[0], saved_[1]};
    dropped[CAP_TO_INDEX(CAP_IPC_LOCK)].effective &= ~CAP_TO_MASK(CAP_IPC_LOCK);
    struct rlimit low = limit_;
    low.rlim_cur = 64 * 1024;
    ok_ = syscall(SYS_capset, &header_, dropped) == 0 && setrlimit(RLIMIT_MEMLOCK, &low) == 0;
  }
  ~MlockRefused() {
    setrlimit(RLIMIT_MEMLOCK, &limit_);
    syscall(SYS_capset, &header_, saved_);
  }
  bool ok() const { return ok_; }

 private:
  __user_cap_header_struct header_{};
  __user_cap_data_struct saved_[2]{};
  struct rlimit limit_ {};
  bool ok_ = false;
};

// A host tier that cannot be locked: --mlock require refuses the run with one line
// naming mlock and the limit; --mlock try warns the same way and runs unpinned.
TEST(RunCommandTest, FailedMlockFailsUnderRequireAndWarnsUnderTry) {
  auto run = [](const char* mode) {
    return RunCli({"run", "-m", "builtin:tiny-moe", "-p", "ab", "-n", "2", "--host", "16MiB", "--mlock", mode});
  };
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer intercepts mlock as a no-op that succeeds (the Release run checks this)";
#endif
  MlockRefused refused;
  ASSERT_TRUE(refused.ok()) << "cannot lower RLIMIT_MEMLOCK here";
  const CliResult require = run("require");
  EXPECT_EQ(require.exit_code, 1) << require.err;
  EXPECT_EQ(require.err.rfind("error: host tier: mlock of 16.0 MiB failed: ", 0), 0u) << require.err;
  EXPECT_NE(require.err.find("RLIMIT_MEMLOCK soft limit 64.0 KiB"), std::string::npos) << require.err;
  EXPECT_EQ(Lines(require.err), 1) << require.err;
  const CliResult attempt = run("try");
  EXPECT_EQ(attempt.exit_code, 0) << attempt.err;
  EXPECT_NE(attempt.err.find("mlock of 16.0 MiB failed"), std::string::npos) << attempt.err;
  EXPECT_NE(attempt.err.find("continuing unpinned [--mlock try]"), std::string::npos) << attempt.err;
}

// Runs args with file descriptor 0 replaced by fd for the call.
CliResult RunCliWithStdin(int fd, std::vector<std::string> args) {
  const int saved = dup(STDIN_FILENO);
  EXPECT_GE(saved, 0);
  EXPECT_EQ(dup2(fd, STDIN_FILENO), STDIN_FILENO);
  CliResult r = RunCli(std::move(args));
  dup2(saved, STDIN_FILENO);
  close(saved);
  return r;
}

// -f - reads the prompt from standard input; one that cannot be read (a directory) is an
// error naming it, not an empty prompt.
TEST(RunCommandTest, PromptFromStandardInput) {
  const std::vector<std::string> args = {"run", "-m", "builtin:tiny-moe", "-f", "-", "-n", "1", "--no-warmup",
                                         "--mlock", "off", "--json"};
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const std::string text = "The sea was calm";
  ASSERT_EQ(write(pipe_fds[1], text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(pipe_fds[1]);
  const CliResult piped = RunCliWithStdin(pipe_fds[0], args);
  close(pipe_fds[0]);
  ASSERT_EQ(piped.exit_code, 0) << piped.err;
  const CliResult given = RunCli({"run", "-m", "builtin:tiny-moe", "-p", "The sea was calm", "-n", "1", "--no-warmup",
                                  "--mlock", "off", "--json"});
  ASSERT_EQ(given.exit_code, 0) << given.err;
  EXPECT_EQ(nlohmann::json::parse(piped.out)["prompt_tokens"], nlohmann::json::parse(given.out)["prompt_tokens"]);

  const int dir = open(::testing::TempDir().c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(dir, 0);
  const CliResult unreadable = RunCliWithStdin(dir, args);
  close(dir);
  EXPECT_EQ(unreadable.exit_code, 2);
  EXPECT_NE(unreadable.err.find("reading the prompt from standard input (-f -): Is a directory"), std::string::npos)
      << unreadable.err;
  EXPECT_EQ(Lines(unreadable.err), 1) << unreadable.err;
}

TEST(RunCommandTest, VramWithoutADeviceIsAWarning) {
  const CliResult r = RunCli(Quick({"--vram", "1GiB"}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("--vram 1GiB is ignored"), std::string::npos) << r.err;
  // With a device tier it is a budget, and no warning.
  const CliResult sim = RunCli(Quick({"--device", "sim", "--vram", "16MiB"}));
  EXPECT_EQ(sim.exit_code, 0) << sim.err;
  EXPECT_EQ(sim.err.find("ignored"), std::string::npos) << sim.err;
}

// --expert-split reaches the model: with a device tier too small for every expert,
// "host" computes misses on the CPU and admits some, "device" copies them all, "auto"
// lets the cost model choose; the tokens are the same, and the report says which ran
// where (no expert_split section without hybrid experts).
TEST(RunCommandTest, ExpertSplitIsReportedAndChangesNoToken) {
  nlohmann::json first;
  for (const char* split : {"device", "host", "auto"}) {
    SCOPED_TRACE(split);
    const CliResult r = RunCli(Quick({"--device", "sim", "--vram", "6MiB", "--weights", "paged", "--expert-split",
                                      split, "-n", "8", "--temp", "0", "--ignore-eos", "--json"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    if (first.is_null()) first = j["generated_tokens"];
    EXPECT_EQ(j["generated_tokens"], first);
    const nlohmann::json& e = j["expert_split"];
    if (std::string(split) == "device") {
      EXPECT_TRUE(e.is_null()) << e;
      continue;
    }
    ASSERT_TRUE(e.is_object()) << j.dump();
    EXPECT_EQ(e["mode"], split);
    EXPECT_EQ(e["on_device"].get<uint64_t>() + e["on_host"].get<uint64_t>(), j["decoder"]["expert_acquires"]);
    if (std::string(split) == "host") {
      EXPECT_GT(e["on_host"].get<uint64_t>(), 0u);
      EXPECT_GT(e["admitted"].get<uint64_t>(), 0u);
      EXPECT_EQ(e["copied"], 0);
    }
    EXPECT_GT(e["rates_gbps"]["host"].get<double>(), 0);
  }
}

TEST(RunCommandTest, LlamaCacheTypeFlagsSelectTheCodec) {
  const CliResult r = RunCli(Quick({"-ctk", "q8_0", "-ctv", "q8_0", "--json"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["kv"]["type"], "q8_0");
  EXPECT_EQ(j["kv"]["llama_sums"], false);
}

// --llama-sums reaches the model (with the default f16 cache) and the report says so;
// without it (or with --no-llama-sums) the faster orders run at any context: llama.cpp's
// orders are for bit-exact comparisons only; both flags at once are refused.
TEST(RunCommandTest, LlamaSumsFlagIsReported) {
  struct Case {
    std::vector<std::string> args;
    bool want;
  };
  const Case cases[] = {{{"--llama-sums"}, true},
                        {{}, false},
                        {{"-c", "512"}, false},
                        {{"--llama-sums", "-c", "8256"}, true},
                        {{"--no-llama-sums"}, false}};
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    args.push_back("--json");
    const CliResult r = RunCli(Quick(args));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["kv"]["type"], "f16");
    EXPECT_EQ(j["kv"]["llama_sums"], c.want) << ::testing::PrintToString(c.args);
  }
  const CliResult both = RunCli(Quick({"--llama-sums", "--no-llama-sums"}));
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.err.find("not both"), std::string::npos) << both.err;
}

// llama.cpp's RoPE flags reach the model (the report names the settings used), and a
// session made with other RoPE settings than the run's is refused (its K was rotated
// differently), while the same settings spelled out again reuse it.
TEST(RunCommandTest, RopeFlagsReachTheModelAndSeparateSessions) {
  const std::string session = ::testing::TempDir() + "/rope_flags.tkv";
  std::remove(session.c_str());
  const CliResult plain = RunCli(Quick({"--session", session, "--json"}));
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(nlohmann::json::parse(plain.out)["rope"], "none x1 base 1000000 from 262144 attn 1 beta 32/1");

  const std::vector<std::string> yarn = {"--rope-scaling", "yarn", "--rope-scale", "4", "--yarn-orig-ctx", "32768"};
  std::vector<std::string> flags = yarn;
  flags.insert(flags.end(), {"--session", session, "--json"});
  const CliResult refused = RunCli(Quick(flags));
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("RoPE yarn x4"), std::string::npos) << refused.err;
  EXPECT_EQ(Lines(refused.err), 1) << refused.err;

  flags = yarn;
  flags.insert(flags.end(), {"--json"});
  const CliResult scaled = RunCli(Quick(flags));
  ASSERT_EQ(scaled.exit_code, 0) << scaled.err;
  EXPECT_EQ(nlohmann::json::parse(scaled.out)["rope"], "yarn x4 base 1000000 from 32768 attn 1 beta 32/1");

  // The file's own base, given explicitly: the same settings, the same session.
  const CliResult same = RunCli(Quick({"--rope-freq-base", "1000000", "--session", session, "--json"}));
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_GT(nlohmann::json::parse(same.out)["session"]["reused_prefix_tokens"].get<int>(), 0);
  std::remove(session.c_str());
}

// --device cuda computes on the GPU (the CUDA executor). Where this build or machine
// has none (CI), the run is refused with one line naming why, before any work; where
// there is one (the GPU check), it runs, and a KV type the executor does not take is
// refused with one line.
TEST(RunCommandTest, CudaDeviceComputesOnTheGpuOrSaysWhyNot) {
  std::string why;
  const bool gpu = kernels::MakeExecutor("cuda", 1, &why) != nullptr;
  const CliResult r = RunCli(Quick({"--device", "cuda", "--vram", "1GiB", "-n", "4"}));
  if (!gpu) {
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(r.err.rfind("error: --device cuda: " + why, 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
    return;
  }
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const CliResult tq = RunCli(Quick({"--device", "cuda", "--vram", "1GiB", "-n", "4", "--kv-type", "tq4"}));
  EXPECT_EQ(tq.exit_code, 1);
  EXPECT_NE(tq.err.find("error: --device cuda: the CUDA executor does not take --kv-type tq4"), std::string::npos)
      << tq.err;
}

// tiny-moe keeps 512 tokens of a layer in a 256 KiB block: -c 262144 needs 4 x 512
// blocks (512 MiB) of KV cache, more than --host 64MiB (with or without a 64 MiB disk
// tier) holds. Refused up front with one line naming the need and the budgets; with a
// disk tier large enough the same context runs.
TEST(RunCommandTest, ContextLargerThanAllTiersIsRefusedUpFront) {
  const CliResult r = RunCli(Quick({"-c", "262144"}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.rfind("error: impossible budget: a context of 262144 tokens needs 512 MiB of KV cache", 0), 0u)
      << r.err;
  EXPECT_NE(r.err.find("host 64.0 MiB"), std::string::npos) << r.err;
  EXPECT_EQ(Lines(r.err), 1) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;

  const std::string dir = ::testing::TempDir();
  const CliResult small = RunCli(Quick({"-c", "262144", "--disk", "64MiB", "--disk-dir", dir}));
  EXPECT_EQ(small.exit_code, 1);
  EXPECT_NE(small.err.find("host 64.0 MiB + disk 64.0 MiB"), std::string::npos) << small.err;

  const CliResult fits = RunCli(Quick({"-c", "262144", "--disk", "512MiB", "--disk-dir", dir}));
  EXPECT_EQ(fits.exit_code, 0) << fits.err;
}

// -t above the CPUs this process may use is lowered to them with a warning (the pool's
// workers spin between jobs: oversubscribed, they take turns); -t 0 is all of them.
TEST(RunCommandTest, ThreadsAreAtMostTheAvailableCpus) {
  const int cpus = kernels::AvailableCpus();
  ASSERT_GE(cpus, 1);
  for (const auto& [t, want] : {std::pair{std::string("0"), cpus}, std::pair{std::string("1"), 1},
                                std::pair{std::to_string(cpus + 1), cpus}, std::pair{std::string("100000"), cpus}}) {
    SCOPED_TRACE("-t " + t);
    const CliResult r = RunCli(Quick({"-t", t, "--json"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["threads"], want);
    EXPECT_EQ(j["kernels"], kernels::ActiveKernelsName());
    const bool warned = r.err.find("-t " + t + ": this process may run on " + std::to_string(cpus) + " CPU") !=
                        std::string::npos;
    EXPECT_EQ(warned, std::stoi(t) > cpus) << r.err;
  }
}

// The text goes to stdout as llama-cli prints it, the prompt first (--no-display-prompt:
// without it); why generation stopped and the summary go to stderr. With --json stdout
// holds the JSON object alone (the text then streams to stderr).
TEST(RunCommandTest, TextGoesToStdoutAndLogsToStderr) {
  const std::vector<std::string> args = {"run", "-m", "builtin:tiny-moe", "-p", "Zebra crossing", "-n", "8",
                                         "--no-warmup", "--host", "64MiB"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = args;
    a.insert(a.end(), extra.begin(), extra.end());
    return RunCli(a);
  };
  const CliResult json = with({"--json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const nlohmann::json j = nlohmann::json::parse(json.out);  // the whole of stdout
  ASSERT_TRUE(j.is_object());
  const std::string text = j["text"];
  ASSERT_FALSE(text.empty());
  EXPECT_NE(json.err.find("stopped: -n limit reached (8 tokens)\n"), std::string::npos) << json.err;

  // builtin:tiny-moe's tokens below 256 are bytes, the others render as nothing (the
  // JSON's text has invalid UTF-8 replaced).
  std::string bytes;
  for (const int t : j["generated_tokens"]) {
    if (t < 256) bytes += static_cast<char>(t);
  }
  const CliResult plain = with({});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_TRUE(plain.out == "Zebra crossing" + bytes) << "stdout holds the prompt and the text, byte for byte";
  EXPECT_EQ(plain.err.find("Zebra"), std::string::npos) << plain.err;
  EXPECT_EQ(plain.err.rfind("stopped: -n limit reached (8 tokens)\nprompt 15 tokens (0 reused from the session), 15 "
                            "computed in ",
                            0),
            0u)
      << plain.err;
  EXPECT_EQ(Lines(plain.err), 2) << plain.err;
  EXPECT_EQ(plain.err.find("mlock"), std::string::npos) << "no --mlock asked: nothing said about it";

  const CliResult bare = with({"--no-display-prompt"});
  ASSERT_EQ(bare.exit_code, 0) << bare.err;
  EXPECT_TRUE(bare.out == bytes) << bare.out;
}

// The summary after a Ctrl-C'd prefill gives the tokens computed and the rate they were
// computed at, not the whole prompt's; one line says why generation stopped.
TEST(RunCommandTest, SummaryReportsTheTokensComputed) {
  RunReport r;
  r.prompt_tokens.assign(5000, 1);
  r.prefill_tokens = 64;
  r.prefill_s = 2.0;
  r.interrupted = true;
  r.saved = true;
  r.stop_reason = StopReason::kInterrupted;
  EXPECT_EQ(RunSummary(r, false),
            "stopped: interrupted (Ctrl-C) during the prefill, after 64 of 5000 prompt tokens; the session holds "
            "them, and the same command resumes there\n"
            "prompt 5000 tokens (0 reused from the session), 64 computed in 2.000 s (32.0 tok/s); 0 generated in "
            "0.000 s (0.0 tok/s)\n");
  RunReport g;
  g.prompt_tokens.assign(10, 1);
  g.reused_prefix_tokens = 4;
  g.prefill_tokens = 6;
  g.prefill_s = 0.5;
  g.generated_tokens.assign(3, 2);
  g.decode_s = 1.5;
  g.stop_reason = StopReason::kReversePrompt;
  g.reverse_prompt = "User:";
  EXPECT_EQ(RunSummary(g, false),
            "stopped: reverse prompt 'User:' (-r)\n"
            "prompt 10 tokens (4 reused from the session), 6 computed in 0.500 s (too few for a rate); 3 generated in "
            "1.500 s (2.0 tok/s)\n");
  EXPECT_EQ(RunSummary(g, true).find("stopped:"), std::string::npos) << "an interactive run's replies end at \"> \"";
}

// A long prefill's progress line: this prefill's tokens, the position in the whole
// context, the rate, the time spent and left, and the tiers' residency.
TEST(RunCommandTest, PrefillProgressLineSaysWhereAndHowFast) {
  RunOptions::PrefillProgress at;
  at.done = 1000;
  at.total = 5000;
  at.position = 91000;
  at.end = 95000;
  at.residency = "device 64.0 MiB / 64.0 MiB, host 100 MiB / 128 MiB";
  EXPECT_EQ(FormatPrefillProgress(at, 4.0),
            "prefill: 1000 / 5000 tokens (context 91000 / 95000), 250 tok/s, 4 s, 16 s left; device 64.0 MiB / 64.0 "
            "MiB, host 100 MiB / 128 MiB\n");
}

// A run needs a prompt, on every model: none, an empty -p or an empty -f file is a usage
// error (it ran on BOS alone on llama vocabularies); -i starts from the first input.
TEST(RunCommandTest, NoPromptIsAUsageError) {
  const std::vector<std::string> base = {"run", "-m", "builtin:tiny-moe", "-n", "2", "--no-warmup", "--host", "64MiB"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return RunCli(a);
  };
  const std::string empty = ::testing::TempDir() + "/empty_prompt.txt";
  std::ofstream(empty).close();
  for (const auto& [flags, message] :
       {std::pair<std::vector<std::string>, std::string>{{}, "error: no prompt: give -p TEXT or -f FILE\n"},
        {{"-p", ""}, "error: no prompt: give -p TEXT or -f FILE\n"},
        {{"-f", empty}, "error: no prompt: --prompt-file " + empty + " is empty\n"}}) {
    SCOPED_TRACE(::testing::PrintToString(flags));
    const CliResult r = with(flags);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.err, message);
    EXPECT_TRUE(r.out.empty());
  }
  std::istringstream fake("hello\n");
  std::streambuf* old = std::cin.rdbuf(fake.rdbuf());
  const CliResult interactive = with({"-i", "-c", "64", "--json"});
  std::cin.rdbuf(old);
  ASSERT_EQ(interactive.exit_code, 0) << interactive.err;
  EXPECT_EQ(nlohmann::json::parse(interactive.out)["turns"][0]["input"], "hello\n");
  EXPECT_NE(interactive.err.find("\n> \nprompt "), std::string::npos) << "the summary starts its own line: "
                                                                       << interactive.err;
  std::filesystem::remove(empty);
}

// -c past the model's trained context is one error line naming both and the flags that
// extend it; past what the budgets hold, one line naming them; both before any work.
TEST(RunCommandTest, ContextPastTheModelOrTheBudgetsIsOneLine) {
  const CliResult trained = RunCli(Quick({"-c", "10000000"}));
  EXPECT_EQ(trained.exit_code, 1);
  EXPECT_EQ(trained.err,
            "error: -c 10000000 is past the model's trained context (262144 tokens); lower -c, or --rope-scaling "
            "yarn --rope-scale F (or linear) runs it at up to F x 262144 tokens\n");
  EXPECT_TRUE(trained.out.empty());
  const CliResult budget = RunCli(Quick({"-c", "10000000", "--rope-scaling", "yarn", "--rope-scale", "64"}));
  EXPECT_EQ(budget.exit_code, 1);
  EXPECT_EQ(budget.err.rfind("error: impossible budget: a context of 10000000 tokens needs ", 0), 0u) << budget.err;
  EXPECT_EQ(Lines(budget.err), 1) << budget.err;
}

// tierkv run --help lists every flag it accepts: CLI11's names and llama.cpp's
// single-dash spellings that NormalizeLlamaFlags rewrites (-ngl, -fa, -no-cnv, -cnv,
// -sys, -ctk, -ctv), among them those the README advertises.
TEST(RunCommandTest, HelpListsEveryFlag) {
  testing::WarningsToStderr();
  CLI::App app;
  int exit_code = 0;
  AddRunCommand(app, exit_code);
  const CliResult r = testing::ParseCli(app, exit_code, {"run", "--help"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // A flag is listed when it appears as a whole word: before ',' ' ' or '=' and after a
  // space or ','.
  auto listed = [&](const std::string& flag) {
    for (size_t at = r.out.find(flag); at != std::string::npos; at = r.out.find(flag, at + 1)) {
      const char before = at == 0 ? ' ' : r.out[at - 1];
      const char after = at + flag.size() < r.out.size() ? r.out[at + flag.size()] : ' ';
      if ((before == ' ' || before == ',') && (after == ' ' || after == ',' || after == '\n')) return true;
    }
    return false;
  };
  CLI::App* run = app.get_subcommand("run");
  int names = 0;
  for (const CLI::Option* opt : run->get_options()) {
    for (const std::string& s : opt->get_snames()) EXPECT_TRUE(listed("-" + s)) << "-" << s << "\n" << r.out;
    for (const std::string& l : opt->get_lnames()) EXPECT_TRUE(listed("--" + l)) << "--" << l << "\n" << r.out;
    names += static_cast<int>(opt->get_snames().size() + opt->get_lnames().size());
  }
  EXPECT_GT(names, 60);
  for (const auto& [from, to] : LlamaFlagSpellings()) EXPECT_TRUE(listed(from)) << from << "\n" << r.out;
  for (const char* flag : {"-ngl", "-fa", "-no-cnv", "-c", "--ctx-size", "--no-mmap", "-n", "-s", "-p", "-f", "-t",
                           "-b", "-i", "-r", "-cnv", "-sys", "--mlock", "-ctk", "-ctv", "--no-display-prompt"}) {
    EXPECT_TRUE(listed(flag)) << flag << "\n" << r.out;
  }
  // Each llama.cpp spelling is listed on its option's line.
  EXPECT_NE(r.out.find("-ngl,--n-gpu-layers"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("-cnv,--conversation,--chat"), std::string::npos) << r.out;
}

// Without --mlock nothing is said about locking, also where the host tier cannot be
// locked (an unprivileged user's 8 MiB RLIMIT_MEMLOCK); asked for (bare --mlock, as
// llama.cpp's), a refused lock is a warning (and under require an error:
// FailedMlockFailsUnderRequireAndWarnsUnderTry).
TEST(RunCommandTest, MlockIsMentionedOnlyWhenAskedFor) {
  MlockRefused refused;
  ASSERT_TRUE(refused.ok()) << "cannot lower RLIMIT_MEMLOCK here";
  const CliResult quiet = RunCli({"run", "-m", "builtin:tiny-moe", "-p", "ab", "-n", "2", "--host", "16MiB"});
  EXPECT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find("mlock"), std::string::npos) << quiet.err;
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer intercepts mlock as a no-op that succeeds (the Release run checks the rest)";
#endif
  const CliResult asked = RunCli({"run", "-m", "builtin:tiny-moe", "-p", "ab", "-n", "2", "--host", "16MiB", "--mlock"});
  EXPECT_EQ(asked.exit_code, 0) << asked.err;
  EXPECT_NE(asked.err.find("mlock of 16.0 MiB failed"), std::string::npos) << asked.err;
}


// --remote: a second run of a prompt fetches the blocks the first published, and both
// give the text a run without Redis gives; a Redis that is gone changes nothing but
// the counters; a bad URL is a usage error naming it.
TEST(RunCommandTest, RemoteCacheSharesAPromptBetweenRuns) {
  TIERKV_NEED_REDIS();
  testing::TestRedis redis;
  std::string prompt;
  for (int i = 0; i < 30; ++i) prompt += "The tide came in at " + std::to_string(i) + " and went out again. ";
  const auto run = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"run", "-m", "builtin:tiny-moe", "-p", prompt, "-n", "6", "--no-warmup",
                                     "--mlock", "off", "--frame", "64KiB", "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    const CliResult r = RunCli(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out, nullptr, false);
  };
  const nlohmann::json alone = run({});
  ASSERT_TRUE(alone.is_object());
  EXPECT_TRUE(alone["remote"].is_null());
  const nlohmann::json first = run({"--remote", redis.url()});
  ASSERT_TRUE(first.is_object());
  EXPECT_EQ(first["text"], alone["text"]);
  EXPECT_EQ(first["remote"]["prompt_tokens"], 0);
  EXPECT_GT(first["remote"]["published_blocks"].get<int>(), 0);
  const nlohmann::json second = run({"--remote", redis.url()});
  ASSERT_TRUE(second.is_object());
  EXPECT_EQ(second["text"], alone["text"]) << "from Redis";
  const int fetched = second["remote"]["prompt_tokens"].get<int>();
  EXPECT_GT(fetched, static_cast<int>(alone["prompt_tokens"].size()) / 2);
  EXPECT_EQ(second["session"]["reused_prefix_tokens"], fetched);
  EXPECT_GT(second["remote"]["hit_blocks"].get<int>(), 0);
  EXPECT_EQ(second["remote"]["verify_failures"], 0);
  EXPECT_EQ(second["remote"]["published_blocks"], 0) << "it held them all already";

  redis.Kill();
  const nlohmann::json gone = run({"--remote", redis.url(), "--remote-timeout-ms", "100"});
  ASSERT_TRUE(gone.is_object());
  EXPECT_EQ(gone["text"], alone["text"]);
  EXPECT_EQ(gone["remote"]["connected"], false);
  EXPECT_EQ(gone["remote"]["prompt_tokens"], 0);

  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--remote", "http://example.com"}, {"--remote-salt", "x"}, {"--remote", redis.url(), "--remote-ttl", "0"}}) {
    std::vector<std::string> args = {"run", "-m", "builtin:tiny-moe", "-p", "hi", "-n", "1"};
    args.insert(args.end(), bad.begin(), bad.end());
    const CliResult r = RunCli(args);
    EXPECT_EQ(r.exit_code, 2) << bad[0];
    EXPECT_EQ(Lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(bad[0]), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace tierkv
