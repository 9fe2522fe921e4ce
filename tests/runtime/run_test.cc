// tests/runtime/run_test.cc
//
// `tierkv run` end to end (RunSession): --dump-logits reports what llama.cpp computed
// for the reference models, and a session round trip reuses the common prefix.
#include "runtime/cli/run_report_json.h"
#include "runtime/run.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <optional>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/cpu_features.h"
#include "runtime/builtin_model.h"
#include "runtime/gguf.h"
#include "runtime/gguf_writer.h"
#include "runtime/tokenizer.h"
#include "tests/runtime/cli_test_util.h"
#include "tests/runtime/reference_util.h"

namespace tierkv {
namespace {

const std::string kRef = std::string(TIERKV_SHARED_DIR) + "/reference";

RunOptions Options(const std::string& model) {
  RunOptions o;
  o.model = kRef + "/models/" + model + ".gguf";
  o.memory.host_bytes = 64 << 20;
  o.memory.mlock = MlockMode::kOff;
  o.threads = 2;
  return o;
}

// --host auto: with a host tier alone, the context's KV cache (at least a floor asked
// for), capped by the available memory; with a device or disk tier, the 1 GiB floor.
TEST(RunTest, AutoHostBudgetFitsTheContextWithinAvailableMemory) {
  // 2 layers x 4 heads x 32 dims of f16: 512 B of K and V per token and layer, so 2048
  // tokens a 1 MiB block.
  KvGeometry g;
  g.n_layers = 2;
  g.n_kv_heads = 4;
  g.head_dim = 32;
  MemoryOptions m;
  const uint64_t gib = 1ull << 30;
  // 4096 tokens: 2 layers x 2 blocks of 1 MiB, plus 1/16 and two frames, in whole MiB:
  // what the run needs, not a fixed gigabyte.
  const AutoHost small = AutoHostBytes(4096, g, m, 16 * gib);
  EXPECT_EQ(small.bytes, 7 * kMiB);
  EXPECT_FALSE(small.capped);
  EXPECT_NE(small.why.find("the KV cache of 4096 tokens (4.00 MiB)"), std::string::npos) << small.why;
  // A floor asked for (tierkv serve: room for warm conversations) is kept.
  EXPECT_EQ(AutoHostBytes(4096, g, m, 16 * gib, 0, 0, kAutoHostFloor).bytes, kAutoHostFloor);

  // 4M tokens: 2 layers x 2048 blocks of 1 MiB = 4 GiB, plus 1/16 and two frames.
  const AutoHost big = AutoHostBytes(4 << 20, g, m, 16 * gib);
  EXPECT_EQ(big.bytes, 4 * gib + gib / 4 + 2 * kMiB);
  EXPECT_FALSE(big.capped);
  EXPECT_EQ(AutoHostBytes(4 << 20, g, m, 0).bytes, big.bytes) << "unknown available memory: no cap";
  // Weight pages asked for (--weights paged) count like the KV cache, with 64 MiB for
  // their working set; weights read in place (mapped) come off the available memory.
  EXPECT_EQ(AutoHostBytes(4 << 20, g, m, 16 * gib, 0, gib).bytes, 5 * gib + 5 * gib / 16 + 66 * kMiB);
  const AutoHost mapped = AutoHostBytes(4 << 20, g, m, 6 * gib, 2 * gib);
  EXPECT_TRUE(mapped.capped);
  EXPECT_EQ(mapped.bytes, 4 * gib / 100 * 90 / kMiB * kMiB);

  const AutoHost capped = AutoHostBytes(4 << 20, g, m, 2 * gib);
  EXPECT_TRUE(capped.capped);
  EXPECT_EQ(capped.bytes, kAutoHostFloor + 819 * kMiB) << "90% of 2 GiB, in whole MiB";
  EXPECT_EQ(AutoHostBytes(4 << 20, g, m, gib / 2).bytes, 460 * kMiB) << "90% of 512 MiB";
  EXPECT_EQ(AutoHostBytes(4 << 20, g, m, gib / 2, 0, 0, kAutoHostFloor).bytes, kAutoHostFloor)
      << "never below a floor asked for";

  MemoryOptions disk = m;
  disk.disk_bytes = 8 * gib;
  EXPECT_EQ(AutoHostBytes(4 << 20, g, disk, 16 * gib).bytes, kAutoHostFloor) << "a disk tier takes the rest";
  MemoryOptions dev = m;
  dev.device = DeviceKind::kSim;
  dev.device_bytes = gib;
  EXPECT_EQ(AutoHostBytes(4 << 20, g, dev, 16 * gib).bytes, kAutoHostFloor);
}

// on_text sees every generated token's text as it comes, in order: together, the text.
TEST(RunTest, StreamedTextIsTheReportedText) {
  RunOptions o;
  o.model = "builtin:tiny-moe";
  o.prompt = "The sea";
  o.n_predict = 24;
  o.memory.host_bytes = 64 << 20;
  o.memory.mlock = MlockMode::kOff;
  o.memory.warmup = false;
  std::string streamed;
  int calls = 0;
  o.on_text = [&](std::string_view piece) {
    streamed += piece;
    ++calls;
    return true;
  };
  auto r = RunSession(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(calls, static_cast<int>(r->generated_tokens.size()));
  EXPECT_EQ(streamed, r->text);
  EXPECT_FALSE(streamed.empty());
}

RunOptions Tiny(const std::string& prompt, int n) {
  RunOptions o;
  o.model = "builtin:tiny-moe";
  o.prompt = prompt;
  o.n_predict = n;
  o.memory.host_bytes = 64 << 20;
  o.memory.mlock = MlockMode::kOff;
  o.memory.warmup = false;
  o.threads = 2;
  return o;
}

// A stop during a reply (Ctrl-C in the CLI) ends it; the session holds what was shown.
TEST(RunTest, StopEndsTheReplyAndSavesWhatWasShown) {
  const std::string session = ::testing::TempDir() + "/stop_reply.tkv";
  std::filesystem::remove(session);
  std::atomic<bool> stop{false};
  RunOptions o = Tiny("The lighthouse keeper climbed the stairs", 16);
  o.session = session;
  o.stop = &stop;
  int shown = 0;
  o.on_text = [&](std::string_view) {
    if (++shown == 3) stop = true;
    return true;
  };
  auto r = RunSession(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->stopped);
  EXPECT_FALSE(r->interrupted);
  EXPECT_FALSE(stop.load()) << "the run clears the request it handled";
  EXPECT_EQ(r->generated_tokens.size(), 3u);
  auto saved = SessionFile::Inspect(session);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_EQ(saved->tokens.size(), r->prompt_tokens.size() + 3);
  // The same reply, not stopped, begins with the same three tokens.
  auto full = RunSession(Tiny("The lighthouse keeper climbed the stairs", 16));
  ASSERT_TRUE(full.ok());
  ASSERT_EQ(full->generated_tokens.size(), 16u);
  EXPECT_TRUE(std::equal(r->generated_tokens.begin(), r->generated_tokens.end(), full->generated_tokens.begin()));
  std::filesystem::remove(session);
}

// A stop during the prefill ends the run after the current chunk: nothing is generated,
// the session holds the tokens computed, and the same prompt resumes there with the
// result of a run never stopped.
TEST(RunTest, InterruptedPrefillResumesFromItsSession) {
  const std::string session = ::testing::TempDir() + "/stop_prefill.tkv";
  std::filesystem::remove(session);
  std::string prompt;
  for (int i = 0; i < 12; ++i) prompt += "The ships were late tonight. ";
  std::atomic<bool> stop{false};
  RunOptions o = Tiny(prompt, 6);
  o.batch = 32;
  o.session = session;
  o.stop = &stop;
  std::vector<int> progress;
  o.on_prefill = [&](int done, int total) {
    progress.push_back(done);
    EXPECT_EQ(total, 12 * 29 + 1);
    if (done == 64) stop = true;
  };
  auto cut = RunSession(o);
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  EXPECT_TRUE(cut->interrupted);
  EXPECT_EQ(progress, (std::vector<int>{32, 64}));
  EXPECT_TRUE(cut->generated_tokens.empty());
  EXPECT_EQ(cut->prefill_tokens, 64) << "the tokens computed, not the prompt's";
  EXPECT_EQ(cut->stop_reason, StopReason::kInterrupted);
  EXPECT_EQ(RunReportJson(*cut)["timings"]["prefill_tok_s"], 64 / cut->prefill_s) << "the rate reached";
  EXPECT_TRUE(cut->saved);
  EXPECT_FALSE(stop.load());
  const auto saved = SessionFile::Inspect(session);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_EQ(saved->tokens.size(), 64u);

  RunOptions again = Tiny(prompt, 6);
  again.session = session;
  auto resumed = RunSession(again);
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_EQ(resumed->reused_prefix_tokens, 64);
  auto whole = RunSession(Tiny(prompt, 6));
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(resumed->generated_tokens, whole->generated_tokens);
  EXPECT_EQ(resumed->prompt_tokens, whole->prompt_tokens);

  // A stop before anything new is computed leaves the session file as it was.
  const std::string bytes = testing::FileBytes(session);
  stop = true;
  RunOptions none = Tiny(prompt + "More.", 6);
  none.session = session;
  none.stop = &stop;
  auto r = RunSession(none);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->interrupted);
  EXPECT_FALSE(r->saved);
  EXPECT_TRUE(testing::FileBytes(session) == bytes) << "the session file changed";
  std::filesystem::remove(session);
}

// Interactive turns extend one context: the same tokens as one run given the whole
// conversation as its prompt, and replies bounded by -n each.
// -r: the reply ends with the token that completes a reverse prompt (tiny-moe's tokens
// are bytes, so the text says which); an interactive run's next input follows it.
TEST(RunTest, ReversePromptEndsTheReply) {
  auto free_run = RunSession(Tiny("Once upon a time", 24));
  ASSERT_TRUE(free_run.ok()) << free_run.status().ToString();
  const std::string text = free_run->text;
  ASSERT_EQ(text.size(), 24u) << "one byte a token, and no end of generation";
  EXPECT_EQ(free_run->reverse_prompt, "");
  const std::string rp = text.substr(10, 2);
  const size_t end = text.find(rp) + rp.size();
  RunOptions o = Tiny("Once upon a time", 24);
  o.reverse_prompts = {"not in the reply", rp};
  auto r = RunSession(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->text, text.substr(0, end));
  EXPECT_EQ(r->generated_tokens.size(), end);
  EXPECT_EQ(r->reverse_prompt, rp);

  std::vector<std::string> inputs = {"more\n"};
  size_t next = 0;
  o.n_ctx = 512;
  o.next_turn = [&]() -> std::optional<std::string> {
    if (next == inputs.size()) return std::nullopt;
    return inputs[next++];
  };
  auto i = RunSession(o);
  ASSERT_TRUE(i.ok()) << i.status().ToString();
  ASSERT_EQ(i->turns.size(), 2u);
  EXPECT_EQ(i->turns[0].text, text.substr(0, end));
  EXPECT_EQ(i->turns[0].reverse_prompt, rp);
  RunOptions whole = Tiny("Once upon a time" + i->turns[0].text + "more\n", 24);
  whole.reverse_prompts = o.reverse_prompts;
  auto w = RunSession(whole);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->text, i->turns[1].text);
  EXPECT_EQ(w->reverse_prompt, i->turns[1].reverse_prompt);
  EXPECT_EQ(i->reverse_prompt, i->turns[1].reverse_prompt) << "the report's is the last reply's";
}

TEST(RunTest, ReversePromptIsLookedForWhereTheNewTextCompletesIt) {
  const std::vector<std::string> p = {"User:", "###"};
  EXPECT_EQ(ReversePromptEnding(p, "hello Us", 2), nullptr);
  const std::string* hit = ReversePromptEnding(p, "hello User:", 3);  // "er:" completes it
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(*hit, "User:");
  EXPECT_EQ(ReversePromptEnding(p, "User: and more", 4), nullptr) << "before the new text: seen already";
  hit = ReversePromptEnding(p, "a###b", 5);  // one token holding it and more
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(*hit, "###");
  EXPECT_EQ(ReversePromptEnding(p, "##", 2), nullptr);
  EXPECT_EQ(ReversePromptEnding({}, "User:", 5), nullptr);
}

TEST(RunTest, InteractiveTurnsExtendOneContext) {
  std::vector<std::string> inputs = {"and then\n", "the end\n"};
  size_t next = 0;
  RunOptions o = Tiny("Once upon a time", 4);
  o.n_ctx = 512;  // (the default, the model's trained context, needs more than 64 MiB)
  o.next_turn = [&]() -> std::optional<std::string> {
    if (next == inputs.size()) return std::nullopt;
    return inputs[next++];
  };
  auto r = RunSession(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->turns.size(), 3u);
  EXPECT_EQ(r->turns[0].input, "Once upon a time");
  EXPECT_EQ(r->turns[2].input, "the end\n");
  EXPECT_EQ(r->generated_tokens.size(), 12u);
  // builtin:tiny-moe's vocabulary is bytes (plus BOS): the context is the text.
  std::string context = "Once upon a time" + r->turns[0].text + "and then\n" + r->turns[1].text + "the end\n";
  RunOptions whole = Tiny(context, 4);
  auto w = RunSession(whole);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->text, r->turns[2].text);
  EXPECT_EQ(r->kv_tokens, static_cast<int>(w->prompt_tokens.size()) + 3) << "the last reply's final token is not fed";

  // No prompt: the first input is the prompt. No input at all: nothing to do.
  next = 0;
  RunOptions first = Tiny("", 4);
  first.n_ctx = 512;
  first.next_turn = o.next_turn;
  auto f = RunSession(first);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->turns.size(), 2u);
  EXPECT_EQ(f->turns[0].input, "and then\n");
  auto nothing = RunSession(first);
  ASSERT_TRUE(nothing.ok());
  EXPECT_TRUE(nothing->turns.empty());

  // A stop during an input's prefill drops that input and ends the conversation as it
  // was before it; the session holds that.
  {
    const std::string session = ::testing::TempDir() + "/stop_turn.tkv";
    std::filesystem::remove(session);
    std::atomic<bool> stop{false};
    std::vector<std::string> long_input = {std::string(40, 'x') + "\n"};
    size_t given = 0;
    RunOptions cut = Tiny("Once upon a time", 4);
    cut.n_ctx = 512;
    cut.batch = 8;
    cut.session = session;
    cut.stop = &stop;
    cut.next_turn = [&]() -> std::optional<std::string> {
      if (given == long_input.size()) return std::nullopt;
      return long_input[given++];
    };
    cut.on_prefill = [&](int done, int total) {
      if (total == 41 && done == 16) stop = true;  // the input's second chunk
    };
    auto c = RunSession(cut);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_TRUE(c->interrupted);
    EXPECT_FALSE(stop.load());
    ASSERT_EQ(c->turns.size(), 1u);
    const size_t before = c->prompt_tokens.size() + c->generated_tokens.size();  // the first reply, fed
    EXPECT_EQ(c->kv_tokens, static_cast<int>(before));
    const auto saved = SessionFile::Inspect(session);
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    EXPECT_EQ(saved->tokens.size(), before);
    std::filesystem::remove(session);
  }

  // A context that fills ends the conversation, not with an error.
  next = 0;
  RunOptions small = Tiny("Once upon a time", -1);
  small.n_ctx = 24;
  small.ignore_eos = true;
  small.next_turn = o.next_turn;
  auto full = RunSession(small);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  EXPECT_TRUE(full->context_full);
  EXPECT_EQ(full->generated_tokens.size(), 24u - 17u) << "BOS and 16 bytes of prompt, then to the end";
  EXPECT_EQ(full->kv_tokens, 23) << "the last token, at position 23, is fed only for a save";
  EXPECT_EQ(full->turns.size(), 1u);
}

// With --llama-sums (RunOptions::llama_sums) these two files give llama.cpp's float logits
// exactly (docs/kernels.md), so there the tolerance is 0, on a CPU with AVX-512: the
// vectors come from llama.cpp's AVX-512 build, and the F16 products of ref-qwen3moe-f16
// sum in that build's order only at tierkv's AVX-512 level (at the AVX2 level they sum
// as llama.cpp's AVX2 build would, last bits apart). ref-llama-q8_0 is exact at the
// AVX2 level too (its Q8_0 products sum in the same order there). Elsewhere the file's
// tolerance.
TEST(RunTest, DumpLogitsMatchesTheReferenceVectors) {
  TIERKV_NEED_REFERENCE(kRef);
  const bool avx512 = kernels::DetectedSimdLevel() >= kernels::SimdLevel::kAvx512;
  const bool avx2 = kernels::DetectedSimdLevel() >= kernels::SimdLevel::kAvx2;
  for (const bool llama_sums : {false, true}) {
    for (const char* name : {"ref-llama-q8_0", "ref-qwen3moe-f16"}) {
      SCOPED_TRACE(std::string(name) + (llama_sums ? " --llama-sums" : ""));
      std::ifstream in(kRef + "/vectors/" + name + ".json");
      const auto ref = nlohmann::json::parse(in);
      const auto& c = ref["cases"][0];  // P1
      const bool exact = llama_sums && (avx512 || (avx2 && std::string_view(name) == "ref-llama-q8_0"));
      const double tol = exact ? 0.0 : ref["tolerance"]["logit_abs"].get<double>();
      const double lse_tol = ref["tolerance"]["logsumexp_abs"];
      RunOptions o = Options(name);
      o.llama_sums = llama_sums ? RunOptions::LlamaSums::kOn : RunOptions::LlamaSums::kOff;
      o.prompt = c["prompt"];
      o.n_predict = 4;
      o.dump_logits = 8;
      auto r = RunSession(o);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->prompt_tokens, c["prompt_ids"].get<std::vector<int32_t>>());
      const auto greedy = c["greedy_ids"].get<std::vector<int32_t>>();
      // Free-running greedy ids are the reference's for its stable prefix (all 4 when the
      // logits are llama.cpp's bits); past it, ids within the tolerance may differ.
      const size_t stable = exact ? 4 : std::min<size_t>(4, c["greedy_stable_prefix"].get<size_t>());
      ASSERT_GE(r->generated_tokens.size(), stable);
      EXPECT_EQ(std::vector<int32_t>(r->generated_tokens.begin(), r->generated_tokens.begin() + stable),
                std::vector<int32_t>(greedy.begin(), greedy.begin() + stable));
      auto check = [&](const LogitsEntry& got, const nlohmann::json& want) {
        EXPECT_NEAR(got.logsumexp, want["logsumexp"].get<double>(), lse_tol) << "pos " << got.pos;
        // Compare by token id: every reference top-10 id must be in ours within tolerance
        // of its reference logit (ids closer than the tolerance may swap ranks).
        for (const auto& pair : want["top"]) {
          const int32_t id = pair[0];
          const double logit = pair[1];
          bool found = false;
          for (const auto& [gid, gl] : got.top) {
            if (gid != id) continue;
            found = true;
            if (exact) {
              EXPECT_EQ(static_cast<float>(gl), static_cast<float>(logit)) << "pos " << got.pos << " id " << id;
            } else {
              EXPECT_NEAR(gl, logit, tol) << "pos " << got.pos << " id " << id;
            }
          }
          if (!found) {
            EXPECT_LT(logit, got.top.back().second + tol) << "pos " << got.pos << " id " << id << " missing";
          }
        }
      };
      size_t checked = 0;
      for (const auto& want : c["prompt_positions"]) {
        for (const auto& got : r->logits) {
          if (got.pos == want["pos"].get<int>()) { check(got, want); ++checked; }
        }
      }
      EXPECT_EQ(checked, c["prompt_positions"].size());
      ASSERT_EQ(r->steps.size(), 4u);
      for (size_t s = 0; s < 4; ++s) check(r->steps[s], c["greedy_steps"][s]);
      const auto j = RunReportJson(*r);
      for (const char* k : {"prompt_tokens", "generated_tokens", "text", "timings", "tiers", "kv", "session", "logits", "steps"}) {
        EXPECT_TRUE(j.contains(k)) << k;
      }
    }
  }
}

// -b: the prompt in chunks of any size reports the same logits and tokens, bit for bit,
// as one token at a time.
TEST(RunTest, PrefillBatchSizeDoesNotChangeTheResult) {
  TIERKV_NEED_REFERENCE(kRef);
  std::ifstream in(kRef + "/vectors/ref-qwen3moe-q8_0.json");
  const auto ref = nlohmann::json::parse(in);
  std::vector<RunReport> reports;
  for (int batch : {1, 7, 64}) {
    RunOptions o = Options("ref-qwen3moe-q8_0");
    o.prompt = ref["cases"][1]["prompt"];  // P2: 31 tokens
    o.n_predict = 3;
    o.dump_logits = 40;  // every prompt position
    o.batch = batch;
    auto r = RunSession(o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    reports.push_back(std::move(r).value());
  }
  ASSERT_EQ(reports[0].logits.size(), reports[0].prompt_tokens.size());
  for (size_t i = 1; i < reports.size(); ++i) {
    EXPECT_EQ(reports[i].generated_tokens, reports[0].generated_tokens);
    ASSERT_EQ(reports[i].logits.size(), reports[0].logits.size());
    for (size_t k = 0; k < reports[0].logits.size(); ++k) {
      EXPECT_EQ(reports[i].logits[k].pos, reports[0].logits[k].pos);
      EXPECT_EQ(reports[i].logits[k].top, reports[0].logits[k].top) << "pos " << reports[0].logits[k].pos;
      EXPECT_EQ(reports[i].logits[k].logsumexp, reports[0].logits[k].logsumexp);
    }
  }
}

// The fingerprint tells weights apart, not only tensor lists: one byte of a tensor's
// first 4 KiB changes it; bytes past them, and nothing at all, do not. Two
// quantizations of one model differ in hash and in description.
TEST(FingerprintTest, CoversTheWeightsAndNamesTheTypes) {
  auto image = [](uint8_t first, uint8_t last) {
    std::vector<uint8_t> data(8192 * 4, 0x11);  // 8192 F32 values: 32 KiB
    data[0] = first;
    data.back() = last;
    return GgufWriter().String("general.architecture", "llama").Tensor("w", GgmlType::kF32, {8192}, data).Finish();
  };
  auto fp = [](std::vector<uint8_t> bytes) {
    auto file = GgufFile::ParseOwned(std::move(bytes), "test");
    EXPECT_TRUE(file.ok()) << file.status().ToString();
    return FingerprintOf(**file);
  };
  const ModelFingerprint a = fp(image(1, 9));
  EXPECT_EQ(fp(image(1, 9)).hash, a.hash);
  EXPECT_EQ(fp(image(1, 7)).hash, a.hash);  // past the sample
  EXPECT_NE(fp(image(2, 9)).hash, a.hash);
  EXPECT_NE(a.description.find("F32"), std::string::npos) << a.description;

  TIERKV_NEED_REFERENCE(kRef);
  auto open = [](const std::string& model) {
    auto file = GgufFile::Open(kRef + "/models/" + model + ".gguf");
    EXPECT_TRUE(file.ok()) << file.status().ToString();
    return FingerprintOf(**file);
  };
  const ModelFingerprint q8 = open("ref-llama-q8_0");
  const ModelFingerprint q4 = open("ref-llama-q4_0");
  EXPECT_NE(q8.hash, q4.hash);
  EXPECT_NE(q8.description, q4.description);
  EXPECT_NE(q8.description.find("Q8_0 + F32"), std::string::npos) << q8.description;
  EXPECT_NE(q4.description.find("Q4_0"), std::string::npos) << q4.description;
  EXPECT_NE(q4.description.find("Q6_K"), std::string::npos) << q4.description;
}

TEST(RunTest, SessionRoundTripReusesThePrefixAndRefusesAnotherModel) {
  TIERKV_NEED_REFERENCE(kRef);
  const std::string path = ::testing::TempDir() + "/run_test_session.tkv";
  std::filesystem::remove(path);
  RunOptions a = Options("ref-llama-q4_0");
  a.prompt = "Once upon a time there was a lighthouse";
  a.n_predict = 6;
  a.session = path;
  auto first = RunSession(a);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(first->saved);
  // Same prompt again: everything but the last prompt token is reused, same tokens out.
  auto again = RunSession(a);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->reused_prefix_tokens, static_cast<int>(first->prompt_tokens.size()) - 1);
  EXPECT_EQ(again->prefill_tokens, 1);
  EXPECT_EQ(again->generated_tokens, first->generated_tokens);
  // A longer prompt sharing the beginning reuses that beginning.
  RunOptions b = a;
  b.prompt = "Once upon a time there was a castle by the sea";
  auto longer = RunSession(b);
  ASSERT_TRUE(longer.ok()) << longer.status().ToString();
  EXPECT_GT(longer->reused_prefix_tokens, 3);
  EXPECT_LT(longer->reused_prefix_tokens, static_cast<int>(longer->prompt_tokens.size()));
  // Another model: refused, the file untouched.
  const std::string saved_bytes = testing::FileBytes(path);
  ASSERT_FALSE(saved_bytes.empty());
  RunOptions c = Options("ref-qwen3moe-q8_0");
  c.prompt = "hi";
  c.session = path;
  auto wrong = RunSession(c);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("wrong model"), std::string::npos) << wrong.status().message();
  EXPECT_TRUE(testing::FileBytes(path) == saved_bytes) << "the session file changed";
  std::filesystem::remove(path);
}

// -c is checked against the model's usable context before anything is tokenized or
// loaded: its trained context (tiny-moe: 262144), or what the RoPE flags extend it to
// (trained x factor); the error names both numbers and the flags. The default context
// (prompt + -n) is held to it too.
TEST(RunTest, ContextPastTheTrainedOneIsRefused) {
  RunOptions o = Tiny("ab", 2);
  o.n_ctx = 262145;
  auto past = RunSession(o);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().message(),
            "-c 262145 is past the model's trained context (262144 tokens); lower -c, or --rope-scaling yarn "
            "--rope-scale F (or linear) runs it at up to F x 262144 tokens");
  // Scaled twice, -c 524288 is within reach (then the 64 MiB host tier refuses it); one
  // more is past the scaled context.
  o.rope.scaling = RopeScaling::kYarn;
  o.rope.scale_factor = 2;
  o.n_ctx = 524288;
  auto scaled = RunSession(o);
  ASSERT_FALSE(scaled.ok());
  EXPECT_EQ(scaled.status().message().rfind("impossible budget: a context of 524288 tokens", 0), 0u)
      << scaled.status().message();
  o.n_ctx = 524289;
  auto beyond = RunSession(o);
  ASSERT_FALSE(beyond.ok());
  EXPECT_EQ(beyond.status().message(),
            "-c 524289 is past the 524288 tokens the model reaches with RoPE yarn x2 (trained context 262144); "
            "lower -c, or raise --rope-scale");
  // The default context, prompt + -n.
  RunOptions many = Tiny("ab", 262144);
  auto too_many = RunSession(many);
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().message().rfind("the prompt (3 tokens) plus -n 262144 is past the model's trained "
                                              "context (262144 tokens)", 0),
            0u)
      << too_many.status().message();

  ModelConfig c;
  c.context_length = 32768;
  EXPECT_EQ(UsableContext(c, {}), 32768);
  RopeOverrides linear;
  linear.scale_factor = 4;  // no type: the file's, or linear
  EXPECT_EQ(UsableContext(c, linear), 131072);
  RopeOverrides yarn;
  yarn.scaling = RopeScaling::kYarn;
  EXPECT_EQ(UsableContext(c, yarn), 0) << "no factor: RoPE is scaled to the context asked for";
  yarn.scale_factor = 4;
  yarn.orig_ctx = 8192;
  EXPECT_EQ(UsableContext(c, yarn), 32768) << "never below the trained context";
  ModelConfig scaled_file = c;  // a file that carries its own scaling
  scaled_file.rope_scaling = RopeScaling::kYarn;
  scaled_file.rope_scale_factor = 4;
  scaled_file.rope_orig_ctx = 32768;
  EXPECT_EQ(UsableContext(scaled_file, {}), 131072);
  RopeOverrides off;
  off.scaling = RopeScaling::kNone;
  EXPECT_EQ(UsableContext(scaled_file, off), 32768);
  RopeOverrides same_type;
  same_type.scaling = RopeScaling::kYarn;
  EXPECT_EQ(UsableContext(scaled_file, same_type), 131072) << "the file's factor of that type";
}

// A prompt whose bytes alone need more tokens than the context takes is refused before
// it is tokenized: tiny-moe's tokens stand for at most 4 bytes ("</s>"), so with -c 1000
// 4000 bytes may fit (and are then tokenized: 4001 tokens, refused as too long for -c)
// and 4001 may not. A prompt read by read_prompt is asked for at most that many bytes.
TEST(RunTest, PromptThatCannotFitIsRefusedBeforeTokenizing) {
  auto tiny = OpenModelFile("builtin:tiny-moe");
  ASSERT_TRUE(tiny.ok());
  auto tok = Tokenizer::FromGguf(**tiny);
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ(MaxTokenInputBytes(**tok), 4u);
  EXPECT_EQ(PromptBytesPerToken(**tok, 4, "\xC0\xAF"), 4u) << "bytes are bytes here";

  RunOptions o = Tiny(std::string(4001, 'a'), 2);
  o.n_ctx = 1000;
  auto over = RunSession(o);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().message(),
            "the prompt (4001 bytes) cannot fit the context of at most 1000 tokens (-c): a token of this vocabulary "
            "stands for at most 4 bytes of text, so at most 4000 bytes fit; shorten it or raise -c");
  o.prompt.pop_back();
  auto at = RunSession(o);
  ASSERT_FALSE(at.ok());
  EXPECT_NE(at.status().message().find("--ctx 1000 is smaller than the prompt (4001 tokens)"), std::string::npos)
      << at.status().message();

  // Without -c the bound is the trained context (the host tier may grow to hold it); a
  // prompt file is read up to it.
  size_t asked = 0;
  RunOptions file = Tiny("", 2);
  file.auto_host = true;
  file.read_prompt = [&](size_t max_bytes) -> Result<std::string> {
    asked = max_bytes;
    return std::string(max_bytes + 1, 'a');
  };
  auto endless = RunSession(file);
  ASSERT_FALSE(endless.ok());
  EXPECT_EQ(asked, 262144u * 4);
  EXPECT_EQ(endless.status().message().rfind("the prompt (more than 1048576 bytes) cannot fit the context of at most "
                                             "262144 tokens (the model's trained context)", 0),
            0u)
      << endless.status().message();
  // ... or up to what the budgets hold, when that is less: 64 MiB of 256 KiB frames, 64
  // blocks of 512 tokens a layer.
  RunOptions bounded = Tiny("", 2);
  bounded.memory.frame_bytes = 256 << 10;
  bounded.read_prompt = file.read_prompt;
  EXPECT_FALSE(RunSession(bounded).ok());
  EXPECT_EQ(asked, 32768u * 4);

  // Byte-level BPE: a token may stand for 4 times its piece in text that is not
  // well-formed UTF-8 (an overlong form decodes to a quarter of its bytes).
  const std::string qwen = kRef + "/models/ref-qwen3moe-q8_0.gguf";
  TIERKV_NEED_REFERENCE(qwen);
  auto file_q = OpenModelFile(qwen);
  ASSERT_TRUE(file_q.ok());
  auto q = Tokenizer::FromGguf(**file_q);
  ASSERT_TRUE(q.ok());
  const size_t l = MaxTokenInputBytes(**q);
  size_t longest = 0;
  for (int32_t id = 0; id < (*q)->n_vocab(); ++id) longest = std::max(longest, (*q)->TokenToPiece(id).size());
  EXPECT_EQ(l, longest);
  EXPECT_EQ(PromptBytesPerToken(**q, l, "plain text, caf\xC3\xA9"), l);
  EXPECT_EQ(PromptBytesPerToken(**q, l, "a\xF0\x80\x80\xAF"), 4 * l);
}

// A run with no prompt, or an empty one, is refused the same way whatever the
// vocabulary (a llama one adds BOS, a qwen one nothing); an interactive one starts from
// its first input instead (RunTest.InteractiveTurnsExtendOneContext).
TEST(RunTest, NoPromptIsRefusedOnEveryVocabulary) {
  auto tiny = RunSession(Tiny("", 2));
  ASSERT_FALSE(tiny.ok());
  EXPECT_EQ(tiny.status().message(), kNoPromptMessage);
  TIERKV_NEED_REFERENCE(kRef);
  for (const char* model : {"ref-llama-q8_0", "ref-qwen3moe-q8_0"}) {
    SCOPED_TRACE(model);
    RunOptions o = Options(model);
    o.prompt = "";
    auto r = RunSession(o);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().message(), kNoPromptMessage);
  }
}

// Why generation ended: the -n limit, a full context (-n -1, which used to report
// context_full false), a reverse prompt, a stop, and text that could not be shown (the
// session then still holds what was generated).
TEST(RunTest, StopReasonSaysWhyGenerationEnded) {
  auto limit = RunSession(Tiny("Once upon a time", 4));
  ASSERT_TRUE(limit.ok()) << limit.status().ToString();
  EXPECT_EQ(limit->stop_reason, StopReason::kLimit);
  EXPECT_FALSE(limit->context_full);
  EXPECT_EQ(RunReportJson(*limit)["stop_reason"], "limit");

  RunOptions unlimited = Tiny("Once upon a time", -1);
  unlimited.n_ctx = 24;
  unlimited.ignore_eos = true;
  auto full = RunSession(unlimited);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  EXPECT_EQ(full->generated_tokens.size(), 24u - 17u);
  EXPECT_TRUE(full->context_full);
  EXPECT_EQ(full->stop_reason, StopReason::kContextFull);
  EXPECT_EQ(RunReportJson(*full)["context_full"], true);
  // -n that fills the context exactly stops at its limit.
  RunOptions exact = Tiny("Once upon a time", 7);
  exact.n_ctx = 24;
  exact.ignore_eos = true;
  auto at_limit = RunSession(exact);
  ASSERT_TRUE(at_limit.ok());
  EXPECT_EQ(at_limit->stop_reason, StopReason::kLimit);

  RunOptions rp = Tiny("Once upon a time", 24);
  ASSERT_GT(limit->text.size(), 1u);
  rp.reverse_prompts = {limit->text.substr(0, 2)};
  auto reversed = RunSession(rp);
  ASSERT_TRUE(reversed.ok());
  EXPECT_EQ(reversed->stop_reason, StopReason::kReversePrompt);

  std::atomic<bool> stop{false};
  RunOptions stopped = Tiny("Once upon a time", 16);
  stopped.stop = &stop;
  stopped.on_text = [&](std::string_view) {
    stop = true;
    return true;
  };
  auto s = RunSession(stopped);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->stop_reason, StopReason::kInterrupted);

  const std::string session = ::testing::TempDir() + "/output_failed.tkv";
  std::filesystem::remove(session);
  RunOptions failing = Tiny("Once upon a time", 16);
  failing.session = session;
  int shown = 0;
  failing.on_text = [&](std::string_view) { return ++shown < 3; };
  auto f = RunSession(failing);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_TRUE(f->output_failed);
  EXPECT_EQ(f->stop_reason, StopReason::kOutputFailed);
  EXPECT_EQ(shown, 3) << "nothing more is shown after a failure";
  EXPECT_EQ(f->generated_tokens.size(), 3u);
  auto saved = SessionFile::Inspect(session);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_EQ(saved->tokens.size(), f->prompt_tokens.size() + 3);
  std::filesystem::remove(session);
}

// echo_prompt: the raw prompt's text goes through on_text before the generated text (as
// llama-cli shows it), and not into RunReport::text; when it cannot be shown nothing is
// computed. A chat turn is never shown.
TEST(RunTest, PromptIsShownBeforeTheText) {
  RunOptions o = Tiny("The sea", 8);
  o.echo_prompt = true;
  std::vector<std::string> pieces;
  o.on_text = [&](std::string_view piece) {
    pieces.emplace_back(piece);
    return true;
  };
  auto r = RunSession(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(pieces.size(), r->generated_tokens.size() + 1);
  EXPECT_EQ(pieces[0], "The sea");
  std::string rest;
  for (size_t i = 1; i < pieces.size(); ++i) rest += pieces[i];
  EXPECT_EQ(rest, r->text);

  RunOptions refused = Tiny("The sea", 8);
  refused.echo_prompt = true;
  refused.on_text = [](std::string_view) { return false; };
  auto none = RunSession(refused);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_TRUE(none->output_failed);
  EXPECT_EQ(none->prefill_tokens, 0);
  EXPECT_TRUE(none->generated_tokens.empty());

  TIERKV_NEED_REFERENCE(kRef);
  RunOptions chat = Options("ref-qwen3moe-q8_0");
  chat.prompt = "Hi";
  chat.chat = true;
  chat.n_predict = 2;
  chat.echo_prompt = true;
  pieces.clear();
  chat.on_text = o.on_text;
  auto c = RunSession(chat);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(pieces.size(), c->generated_tokens.size()) << "the turn is not shown";
}

}  // namespace
}  // namespace tierkv
