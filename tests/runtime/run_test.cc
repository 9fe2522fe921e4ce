// tests/runtime/run_test.cc
//
// `tierkv run` end to end (RunSession): --dump-logits reports what llama.cpp computed
// for the reference models, and a session round trip reuses the common prefix.
#include "runtime/run.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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

// --host auto: the 1 GiB floor, grown to the context's KV cache with a host tier alone,
// capped by the available memory.
TEST(RunTest, AutoHostBudgetFitsTheContextWithinAvailableMemory) {
  // 2 layers x 4 heads x 32 dims of f16: 512 B of K and V per token and layer, so 2048
  // tokens a 1 MiB block.
  KvGeometry g;
  g.n_layers = 2;
  g.n_kv_heads = 4;
  g.head_dim = 32;
  MemoryOptions m;
  const uint64_t gib = 1ull << 30;
  const AutoHost small = AutoHostBytes(4096, g, m, 16 * gib);
  EXPECT_EQ(small.bytes, kAutoHostFloor);
  EXPECT_FALSE(small.capped);

  // 4M tokens: 2 layers x 2048 blocks of 1 MiB = 4 GiB, plus 1/16 and 64 MiB.
  const AutoHost big = AutoHostBytes(4 << 20, g, m, 16 * gib);
  EXPECT_EQ(big.bytes, 4 * gib + gib / 4 + 64 * kMiB);
  EXPECT_FALSE(big.capped);
  EXPECT_EQ(AutoHostBytes(4 << 20, g, m, 0).bytes, big.bytes) << "unknown available memory: no cap";
  // Weight pages asked for (--weights paged) count like the KV cache; weights read in
  // place (mapped) come off the available memory instead.
  EXPECT_EQ(AutoHostBytes(4 << 20, g, m, 16 * gib, 0, gib).bytes, 5 * gib + 5 * gib / 16 + 64 * kMiB);
  const AutoHost mapped = AutoHostBytes(4 << 20, g, m, 6 * gib, 2 * gib);
  EXPECT_TRUE(mapped.capped);
  EXPECT_EQ(mapped.bytes, 4 * gib / 100 * 90 / kMiB * kMiB);

  const AutoHost capped = AutoHostBytes(4 << 20, g, m, 2 * gib);
  EXPECT_TRUE(capped.capped);
  EXPECT_EQ(capped.bytes, kAutoHostFloor + 819 * kMiB) << "90% of 2 GiB, in whole MiB";
  EXPECT_EQ(AutoHostBytes(4 << 20, g, m, gib / 2).bytes, kAutoHostFloor) << "never below the floor";

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
  };
  auto r = RunSession(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(calls, static_cast<int>(r->generated_tokens.size()));
  EXPECT_EQ(streamed, r->text);
  EXPECT_FALSE(streamed.empty());
}

TEST(RunTest, DumpLogitsMatchesTheReferenceVectors) {
  if (!std::filesystem::exists(kRef)) GTEST_SKIP() << "no reference vectors at " << kRef;
  for (const char* name : {"ref-llama-q8_0", "ref-qwen3moe-f16"}) {
    SCOPED_TRACE(name);
    std::ifstream in(kRef + "/vectors/" + name + ".json");
    const auto ref = nlohmann::json::parse(in);
    const auto& c = ref["cases"][0];  // P1
    const double tol = ref["tolerance"]["logit_abs"], lse_tol = ref["tolerance"]["logsumexp_abs"];
    RunOptions o = Options(name);
    o.prompt = c["prompt"];
    o.n_predict = 4;
    o.dump_logits = 8;
    auto r = RunSession(o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->prompt_tokens, c["prompt_ids"].get<std::vector<int32_t>>());
    const auto greedy = c["greedy_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(r->generated_tokens, std::vector<int32_t>(greedy.begin(), greedy.begin() + 4));
    auto check = [&](const LogitsEntry& got, const nlohmann::json& want) {
      EXPECT_NEAR(got.logsumexp, want["logsumexp"].get<double>(), lse_tol) << "pos " << got.pos;
      // Compare by token id: every reference top-10 id must be in ours within tolerance
      // of its reference logit (ids closer than the tolerance may swap ranks).
      for (const auto& pair : want["top"]) {
        const int32_t id = pair[0];
        const double logit = pair[1];
        bool found = false;
        for (const auto& [gid, gl] : got.top) {
          if (gid == id) { found = true; EXPECT_NEAR(gl, logit, tol) << "pos " << got.pos << " id " << id; }
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
    const auto j = r->ToJson();
    for (const char* k : {"prompt_tokens", "generated_tokens", "text", "timings", "tiers", "kv", "session", "logits", "steps"}) {
      EXPECT_TRUE(j.contains(k)) << k;
    }
  }
}

// -b: the prompt in chunks of any size reports the same logits and tokens, bit for bit,
// as one token at a time.
TEST(RunTest, PrefillBatchSizeDoesNotChangeTheResult) {
  if (!std::filesystem::exists(kRef)) GTEST_SKIP() << "no reference vectors at " << kRef;
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

TEST(RunTest, SessionRoundTripReusesThePrefixAndRefusesAnotherModel) {
  if (!std::filesystem::exists(kRef)) GTEST_SKIP() << "no reference vectors at " << kRef;
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
  const auto size = std::filesystem::file_size(path);
  RunOptions c = Options("ref-qwen3moe-q8_0");
  c.prompt = "hi";
  c.session = path;
  auto wrong = RunSession(c);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("wrong model"), std::string::npos) << wrong.status().message();
  EXPECT_EQ(std::filesystem::file_size(path), size);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace tierkv
