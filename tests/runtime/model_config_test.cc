// tests/runtime/model_config_test.cc
//
// Every size read from a GGUF header is checked before anything is sized by it
// (docs/gguf.md, "Header sizes"): small valid models (qwen3moe and llama, built in
// memory) are copied with one metadata value changed (0, huge, past INT32_MAX or
// INT64_MAX, or disagreeing with the tensors), written to a file, and read back. Each
// must be refused by ReadModelConfig and by Model::Load with one line naming the file
// and the key, and without a large allocation: the process's peak resident memory may
// not grow by more than kMaxGrowth over the whole test (a buffer sized by a bad value,
// like the 2^31-float FFN scratch a MoE model's unused feed_forward_length once made,
// is zero-filled and so resident). Under ASan, allocation-size-too-big also aborts.
#include <unistd.h>
#include <sys/wait.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "memory/size.h"
#include "runtime/builtin_model.h"
#include "runtime/cli/run_command.h"
#include "runtime/gguf.h"
#include "runtime/gguf_writer.h"
#include "runtime/model.h"
#include "runtime/tokenizer.h"
#include "tests/runtime/model_test_util.h"
#include "tests/memory/mm_test_util.h"
#include "tests/runtime/cli_test_util.h"

namespace tierkv {
namespace {

constexpr uint64_t kMaxGrowth = 256 * kMiB;

// The process's peak resident set (VmHWM), in bytes; 0 when it cannot be read.
uint64_t PeakRss() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;  // "VmHWM:  1234 kB"
  }
  return 0;
}

// Fails the test when the peak resident memory grew by more than kMaxGrowth in scope.
class PeakRssGuard {
 public:
  PeakRssGuard() : start_(PeakRss()) {}
  ~PeakRssGuard() {
    const uint64_t end = PeakRss();
    EXPECT_LT(end - start_, kMaxGrowth) << "peak resident memory grew from " << FormatBytes(start_) << " to "
                                        << FormatBytes(end);
  }

 private:
  uint64_t start_;
};

GgufWriter SmallMoe() { return testing::SmallMoeWriter(); }

// The same with a dense FFN in layer 0 ([64, 96]) beside its experts: there
// feed_forward_length (96) must match it.
GgufWriter SmallMoeWithDenseFfn() {
  GgufWriter w = SmallMoe();
  w.U32("qwen3moe.feed_forward_length", 96);
  const size_t q8_row = 2 * 34;  // 64 values of Q8_0
  w.Tensor("blk.0.ffn_gate.weight", GgmlType::kQ8_0, {64, 96}, std::vector<uint8_t>(96 * q8_row));
  w.Tensor("blk.0.ffn_up.weight", GgmlType::kQ8_0, {64, 96}, std::vector<uint8_t>(96 * q8_row));
  w.Tensor("blk.0.ffn_down.weight", GgmlType::kQ8_0, {96, 64}, std::vector<uint8_t>(64 * 3 * 34));
  return w;
}

GgufWriter SmallLlama() {
  GgufWriter w = testing::SmallLlamaWriter();
  w.U32("llama.context_length", 4096);
  return w;
}

// The two architectures' small models, for the checks both share.
const std::pair<std::string, GgufWriter (*)()> kBases[] = {{"qwen3moe", &SmallMoe}, {"llama", &SmallLlama}};

// `image` written to DIR/crafted.gguf and opened from there (so messages name the path).
struct Crafted {
  testing::TempDir dir;
  std::string path;
  std::shared_ptr<const GgufFile> file;
};

std::unique_ptr<Crafted> Write(const GgufWriter& w) {
  auto c = std::make_unique<Crafted>();
  c->path = c->dir.path() + "/crafted.gguf";
  const std::vector<uint8_t> image = w.Finish();
  std::ofstream(c->path, std::ios::binary).write(reinterpret_cast<const char*>(image.data()),
                                                  static_cast<std::streamsize>(image.size()));
  auto f = GgufFile::Open(c->path);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  if (f.ok()) c->file = std::move(f).value();
  return c;
}

// The config and the model are refused with one line naming the file, `key` and `want`.
void ExpectRefused(const Crafted& c, const std::string& key, const std::string& want) {
  ASSERT_NE(c.file, nullptr);
  auto cfg = ReadModelConfig(*c.file);
  ASSERT_FALSE(cfg.ok()) << "loaded: " << cfg->ToString();
  const std::string m = cfg.status().message();
  EXPECT_EQ(m.rfind(c.path + ": ", 0), 0u) << m;
  EXPECT_NE(m.find(key), std::string::npos) << m;
  EXPECT_NE(m.find(want), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  ModelOptions mo;
  mo.threads = 1;
  auto model = Model::Load(c.file, mo);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().message(), m);
}

struct Case {
  std::string what;  // for SCOPED_TRACE
  std::function<GgufWriter()> base;
  std::function<void(GgufWriter&)> change;
  std::string key;   // named in the message
  std::string want;  // and this
};

void RunCases(const std::vector<Case>& cases) {
  PeakRssGuard rss;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    GgufWriter w = c.base();
    c.change(w);
    ExpectRefused(*Write(w), c.key, c.want);
  }
}

constexpr uint32_t kI32Max = 2147483647u;
constexpr uint32_t kU32Max = 4294967295u;
constexpr uint64_t k2To63 = uint64_t{1} << 63;

TEST(HeaderSizesTest, BaseModelsLoad) {
  PeakRssGuard rss;
  for (auto base : {SmallMoe, SmallMoeWithDenseFfn, SmallLlama}) {
    auto c = Write(base());
    ASSERT_NE(c->file, nullptr);
    ModelOptions mo;
    mo.threads = 1;
    auto model = Model::Load(c->file, mo);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
  }
}

// The report: a qwen3moe file whose feed_forward_length is 2^31-1 sized a 2^31-float FFN
// scratch (twice) that no MoE layer uses. Without dense FFN tensors the key sizes
// nothing (n_ff 0): the model loads and runs a step within small memory.
TEST(HeaderSizesTest, MoeOnlyFeedForwardLengthSizesNothing) {
  PeakRssGuard rss;
  for (uint64_t v : {uint64_t{kI32Max}, uint64_t{kU32Max}, k2To63, uint64_t{0}}) {
    SCOPED_TRACE(v);
    GgufWriter w = SmallMoe();
    w.U64("qwen3moe.feed_forward_length", v);
    auto c = Write(w);
    ASSERT_NE(c->file, nullptr);
    auto cfg = ReadModelConfig(*c->file);
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    EXPECT_EQ(cfg->n_ff, 0);
    ModelOptions mo;
    mo.threads = 1;
    auto model = Model::Load(c->file, mo);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    MemoryOptions mem;
    mem.host_bytes = 8 * kMiB;
    mem.frame_bytes = 64 * kKiB;
    mem.warmup = false;
    mem.mlock = MlockMode::kOff;
    auto mm = std::move(MemoryManager::Create(mem)).value();
    auto cache = std::move(KvCache::Create(mm.get(), (*model)->KvGeometryFor(KvCodec::kF16))).value();
    const SeqId seq = cache->NewSequence();
    std::vector<float> logits(static_cast<size_t>((*model)->config().n_vocab));
    ASSERT_TRUE((*model)->Forward(*cache, seq, 5, 0, logits).ok());
  }
}

TEST(HeaderSizesTest, FeedForwardLengthMatchesTheDenseFfnTensors) {
  RunCases({
      {"moe with a dense layer, 2^31-1", SmallMoeWithDenseFfn,
       [](GgufWriter& w) { w.U32("qwen3moe.feed_forward_length", kI32Max); }, "qwen3moe.feed_forward_length",
       "qwen3moe.feed_forward_length = 2147483647 does not match blk.0.ffn_gate.weight ([64, 96])"},
      {"moe with a dense layer, missing", SmallMoeWithDenseFfn,
       [](GgufWriter& w) { w.Remove("qwen3moe.feed_forward_length"); }, "qwen3moe.feed_forward_length",
       "not found"},
      {"llama, 2^31-1", SmallLlama, [](GgufWriter& w) { w.U32("llama.feed_forward_length", kI32Max); },
       "llama.feed_forward_length", "= 2147483647 does not match blk.0.ffn_gate.weight ([64, 128])"},
      {"llama, 2^32-1", SmallLlama, [](GgufWriter& w) { w.U32("llama.feed_forward_length", kU32Max); },
       "llama.feed_forward_length", "= 4294967295 is more than 2147483647"},
      {"llama, 2^63", SmallLlama, [](GgufWriter& w) { w.U64("llama.feed_forward_length", k2To63); },
       "llama.feed_forward_length", "= 9223372036854775808 is more than 2147483647"},
      {"llama, 0", SmallLlama, [](GgufWriter& w) { w.U32("llama.feed_forward_length", 0); },
       "llama.feed_forward_length", "= 0 must be positive"},
      {"llama, 64", SmallLlama, [](GgufWriter& w) { w.U32("llama.feed_forward_length", 64); },
       "llama.feed_forward_length", "= 64 does not match blk.0.ffn_gate.weight"},
  });
}

// The second report: 2^31-1 layers ended in std::bad_alloc naming nothing.
TEST(HeaderSizesTest, BlockCountIsTheNumberOfLayersPresent) {
  std::vector<Case> cases;
  for (auto [arch, base] : kBases) {
    const std::string key = arch + ".block_count";
    cases.push_back({arch + " 2^31-1", base, [key](GgufWriter& w) { w.U32(key, kI32Max); }, key,
                     key + " = 2147483647 but the file has tensors for 2 layers"});
    cases.push_back({arch + " 3", base, [key](GgufWriter& w) { w.U32(key, 3); }, key,
                     key + " = 3 but the file has tensors for 2 layers"});
    cases.push_back({arch + " 1", base, [key](GgufWriter& w) { w.U32(key, 1); }, key,
                     key + " = 1 but the file has tensors for 2 layers"});
    cases.push_back({arch + " 0", base, [key](GgufWriter& w) { w.U32(key, 0); }, key, key + " = 0 must be positive"});
    cases.push_back({arch + " 2^32-1", base, [key](GgufWriter& w) { w.U32(key, kU32Max); }, key,
                     key + " = 4294967295 is more than 2147483647"});
    cases.push_back({arch + " 2^64-1", base, [key](GgufWriter& w) { w.U64(key, UINT64_MAX); }, key,
                     key + " = 18446744073709551615 is more than 2147483647"});
    cases.push_back({arch + " -1", base, [key](GgufWriter& w) { w.I32(key, -1); }, key,
                     key + " = -1 must be positive"});
    cases.push_back({arch + " i64 min", base, [key](GgufWriter& w) { w.I64(key, INT64_MIN); }, key,
                     "must be positive"});
    cases.push_back({arch + " a string", base, [key](GgufWriter& w) { w.String(key, "2"); }, key, "is string"});
  }
  RunCases(cases);
}

// A layer numbered past the count, or missing in the middle.
TEST(HeaderSizesTest, LayersMustBeNumberedFromZero) {
  const size_t norm_bytes = 64 * sizeof(float);
  RunCases({
      {"blk.2 beside blk.0 and blk.1", SmallLlama,
       [&](GgufWriter& w) {
         w.Tensor("blk.2.attn_norm.weight", GgmlType::kF32, {64}, std::vector<uint8_t>(norm_bytes));
       },
       "llama.block_count", "llama.block_count = 2 but the file has tensors for 3 layers"},
      {"blk.7 beside blk.0 and blk.1, count 3", SmallLlama,
       [&](GgufWriter& w) {
         w.U32("llama.block_count", 3);
         w.Tensor("blk.7.attn_norm.weight", GgmlType::kF32, {64}, std::vector<uint8_t>(norm_bytes));
       },
       "llama.block_count", "numbered up to blk.7"},
      {"blk.99999999999999999999", SmallLlama,
       [&](GgufWriter& w) {
         w.U32("llama.block_count", 3);
         w.Tensor("blk.99999999999999999999.attn_norm.weight", GgmlType::kF32, {64},
                  std::vector<uint8_t>(norm_bytes));
       },
       "llama.block_count", "numbered up to blk.a number past 2^64"},
  });
}

TEST(HeaderSizesTest, EmbeddingLengthMatchesTokenEmbd) {
  std::vector<Case> cases;
  for (auto [arch, base] : kBases) {
    const std::string key = arch + ".embedding_length";
    cases.push_back({arch + " 2^31-1", base, [key](GgufWriter& w) { w.U32(key, kI32Max); }, key,
                     key + " = 2147483647 does not match token_embd.weight ([64, "});
    cases.push_back({arch + " 128", base, [key](GgufWriter& w) { w.U32(key, 128); }, key,
                     key + " = 128 does not match token_embd.weight"});
    cases.push_back({arch + " 0", base, [key](GgufWriter& w) { w.U32(key, 0); }, key, key + " = 0 must be positive"});
    cases.push_back({arch + " 2^63", base, [key](GgufWriter& w) { w.U64(key, k2To63); }, key,
                     "is more than 2147483647"});
  }
  RunCases(cases);
}

TEST(HeaderSizesTest, HeadCountsAndLengthsMatchTheAttentionTensors) {
  std::vector<Case> cases;
  for (auto [arch, base] : kBases) {
    const std::string h = arch + ".attention.head_count", kv = arch + ".attention.head_count_kv";
    const std::string kl = arch + ".attention.key_length", vl = arch + ".attention.value_length";
    cases.push_back({arch + " heads 2^31-1", base, [h](GgufWriter& w) { w.U32(h, kI32Max); }, h,
                     h + " = 2147483647 is not a multiple of " + kv + " = 2"});
    cases.push_back({arch + " heads 2^30", base, [h](GgufWriter& w) { w.U32(h, 1u << 30); }, h,
                     h + " = 1073741824 with key_length 16 does not match blk.0.attn_q.weight ([64, 64])"});
    cases.push_back({arch + " heads 8", base, [h](GgufWriter& w) { w.U32(h, 8); }, h,
                     "does not match blk.0.attn_q.weight"});
    cases.push_back({arch + " heads 0", base, [h](GgufWriter& w) { w.U32(h, 0); }, h, h + " = 0 must be positive"});
    cases.push_back({arch + " heads 2^32-1", base, [h](GgufWriter& w) { w.U32(h, kU32Max); }, h,
                     "is more than 2147483647"});
    cases.push_back({arch + " kv heads 2^31-1", base, [kv](GgufWriter& w) { w.U32(kv, kI32Max); }, kv,
                     "is not a multiple of " + kv + " = 2147483647"});
    cases.push_back({arch + " kv heads 4", base, [kv](GgufWriter& w) { w.U32(kv, 4); }, kv,
                     kv + " = 4 with key_length 16 does not match blk.0.attn_k.weight ([64, 32])"});
    cases.push_back({arch + " kv heads 0", base, [kv](GgufWriter& w) { w.U32(kv, 0); }, kv,
                     kv + " = 0 must be positive"});
    cases.push_back({arch + " kv heads 3", base, [kv](GgufWriter& w) { w.U32(kv, 3); }, kv,
                     "is not a multiple of " + kv + " = 3"});
    cases.push_back({arch + " key and value length 2^31-1", base,
                     [kl, vl](GgufWriter& w) {
                       w.U32(kl, kI32Max);
                       w.U32(vl, kI32Max);
                     },
                     "key_length 2147483647", "does not match blk.0.attn_q.weight"});
    cases.push_back({arch + " key length 2^31-1", base, [kl](GgufWriter& w) { w.U32(kl, kI32Max); }, kl,
                     kl + " = 2147483647 and " + vl + " = 16 must be equal"});
    cases.push_back({arch + " value length 0", base, [vl](GgufWriter& w) { w.U32(vl, 0); }, vl,
                     vl + " = 0 must be positive"});
    cases.push_back({arch + " key length 2^64-1", base, [kl](GgufWriter& w) { w.U64(kl, UINT64_MAX); }, kl,
                     "is more than 2147483647"});
    cases.push_back({arch + " rope dims 2^31-1", base,
                     [arch](GgufWriter& w) { w.U32(arch + ".rope.dimension_count", kI32Max); },
                     arch + ".rope.dimension_count", "must be even and within head_dim 16"});
  }
  // Without key_length, head_dim is embedding_length / head_count.
  cases.push_back({"llama heads 2^30 without key_length", SmallLlama,
                   [](GgufWriter& w) {
                     w.Remove("llama.attention.key_length").Remove("llama.attention.value_length");
                     w.U32("llama.attention.head_count", 1u << 30);
                   },
                   "llama.attention.head_count", "is more than embedding_length 64"});
  cases.push_back({"llama heads 8 without key_length", SmallLlama,
                   [](GgufWriter& w) {
                     w.Remove("llama.attention.key_length").Remove("llama.attention.value_length");
                     w.U32("llama.attention.head_count", 8);
                   },
                   "llama.attention.head_count_kv",
                   "= 2 with head_dim (embedding_length / head_count) 8 does not match "
                   "blk.0.attn_k.weight ([64, 32])"});
  RunCases(cases);
}

TEST(HeaderSizesTest, ExpertCountsMatchTheExpertTensors) {
  const std::string n = "qwen3moe.expert_count", used = "qwen3moe.expert_used_count",
                    ff = "qwen3moe.expert_feed_forward_length";
  RunCases({
      {"count 2^31-1", SmallMoe, [&](GgufWriter& w) { w.U32(n, kI32Max); }, n,
       n + " = 2147483647 times block_count 2 is more than 2147483647 experts"},
      {"count 2^29", SmallMoe, [&](GgufWriter& w) { w.U32(n, 1u << 29); }, n,
       n + " = 536870912 does not match blk.0.ffn_gate_inp.weight ([64, 8])"},
      {"count 16", SmallMoe, [&](GgufWriter& w) { w.U32(n, 16); }, n, n + " = 16 does not match"},
      {"count 0", SmallMoe, [&](GgufWriter& w) { w.U32(n, 0); }, n, n + " = 0 must be positive"},
      {"count 2^63", SmallMoe, [&](GgufWriter& w) { w.U64(n, k2To63); }, n, "is more than 2147483647"},
      {"used 0", SmallMoe, [&](GgufWriter& w) { w.U32(used, 0); }, used, used + " = 0 must be positive"},
      {"used 9 of 8", SmallMoe, [&](GgufWriter& w) { w.U32(used, 9); }, used,
       used + " = 9 is more than " + n + " = 8"},
      {"used 2^31-1", SmallMoe, [&](GgufWriter& w) { w.U32(used, kI32Max); }, used,
       used + " = 2147483647 is more than " + n + " = 8"},
      {"used 2^32-1", SmallMoe, [&](GgufWriter& w) { w.U32(used, kU32Max); }, used, "is more than 2147483647"},
      {"expert ffn 2^31-1", SmallMoe, [&](GgufWriter& w) { w.U32(ff, kI32Max); }, ff,
       ff + " = 2147483647 does not match blk.0.ffn_gate_exps.weight ([64, 64, 8])"},
      {"expert ffn 0", SmallMoe, [&](GgufWriter& w) { w.U32(ff, 0); }, ff, ff + " = 0 must be positive"},
      {"expert ffn missing", SmallMoe, [&](GgufWriter& w) { w.Remove(ff); }, ff, "not found"},
  });
}

// context_length is a default (-c, RoPE scaling), never a size: bounded to an int and
// positive, not matched. 2^31-1 loads.
TEST(HeaderSizesTest, ContextLengthIsBounded) {
  std::vector<Case> cases;
  for (auto [arch, base] : kBases) {
    const std::string key = arch + ".context_length";
    cases.push_back({arch + " 0", base, [key](GgufWriter& w) { w.U32(key, 0); }, key, key + " = 0 must be positive"});
    cases.push_back({arch + " 2^31", base, [key](GgufWriter& w) { w.U32(key, 1u << 31); }, key,
                     key + " = 2147483648 is more than 2147483647 (the largest an int holds)"});
    cases.push_back({arch + " 2^63", base, [key](GgufWriter& w) { w.U64(key, k2To63); }, key,
                     key + " = 9223372036854775808 is more than 2147483647"});
    cases.push_back({arch + " -1", base, [key](GgufWriter& w) { w.I64(key, -1); }, key,
                     key + " = -1 must be positive"});
    cases.push_back({arch + " orig ctx -1", base,
                     [arch](GgufWriter& w) { w.I32(arch + ".rope.scaling.original_context_length", -1); },
                     arch + ".rope.scaling.original_context_length", "= -1 must be at least 0"});
  }
  RunCases(cases);
  PeakRssGuard rss;
  GgufWriter w = SmallMoe();
  w.U32("qwen3moe.context_length", kI32Max);
  auto c = Write(w);
  ASSERT_NE(c->file, nullptr);
  auto model = Model::Load(c->file);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ((*model)->config().context_length, 2147483647);
}

// The byte-level vocabulary of tokenizer.ggml.model "none" has one id per row of
// token_embd: only rows the file holds (an empty [64, 2^30, 0] tensor takes no bytes).
// A vocabulary with more tokens than token_embd has rows is refused before its texts
// are copied. Both name the file.
TEST(HeaderSizesTest, TokenizerSizesComeFromRowsInTheFile) {
  PeakRssGuard rss;
  {
    GgufWriter w;
    w.String("general.architecture", "llama").String("tokenizer.ggml.model", "none");
    w.Tensor("token_embd.weight", GgmlType::kF32, {64, uint64_t{1} << 30, 0}, {});
    auto c = Write(w);
    ASSERT_NE(c->file, nullptr);
    auto tok = Tokenizer::FromGguf(*c->file);
    ASSERT_FALSE(tok.ok());
    EXPECT_EQ(tok.status().message().rfind(c->path + ": tokenizer: ", 0), 0u) << tok.status().message();
    EXPECT_NE(tok.status().message().find("token_embd.weight"), std::string::npos) << tok.status().message();
  }
  {
    GgufWriter w;
    const std::string_view tokens[] = {"<unk>", "<s>", "</s>", "a", "b"};
    w.String("general.architecture", "llama").String("tokenizer.ggml.model", "llama");
    w.Strings("tokenizer.ggml.tokens", tokens);
    w.Tensor("token_embd.weight", GgmlType::kF32, {4, 3}, std::vector<uint8_t>(4 * 3 * sizeof(float)));
    auto c = Write(w);
    ASSERT_NE(c->file, nullptr);
    auto tok = Tokenizer::FromGguf(*c->file);
    ASSERT_FALSE(tok.ok());
    EXPECT_EQ(tok.status().message(),
              c->path + ": tokenizer: tokenizer.ggml.tokens has 5 entries but token_embd.weight has only 3 rows");
  }
}

// `tierkv run` on crafted files: one error line naming the file and the key, exit code
// 1, in process (the run command as main() runs it) and through the built binary. The
// MoE-only file with feed_forward_length 2^31-1 runs, within --host 64MiB.
testing::CliResult RunCli(std::vector<std::string> args) {
  testing::WarningsToStderr();
  CLI::App app;
  int exit_code = 0;
  AddRunCommand(app, exit_code);
  return testing::ParseCli(app, exit_code, std::move(args));
}

std::vector<std::string> RunArgs(const std::string& path) {
  return {"run", "--model", path, "-p", "hi", "-n", "1", "--no-warmup", "--mlock", "off", "--host", "64MiB"};
}

// The tierkv binary built beside this test binary (build/<kind>/tests/runtime_tests,
// build/<kind>/runtime/tierkv).
std::string TierkvBinary() {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return (self.parent_path().parent_path() / "runtime" / "tierkv").string();
}

TEST(HeaderSizesTest, RunRefusesCraftedFilesWithOneLine) {
  PeakRssGuard rss;
  GgufWriter blocks = SmallMoe();
  blocks.U32("qwen3moe.block_count", kI32Max);
  GgufWriter ffn = SmallMoeWithDenseFfn();
  ffn.U32("qwen3moe.feed_forward_length", kI32Max);
  const std::string binary = TierkvBinary();
  ASSERT_TRUE(std::filesystem::exists(binary)) << binary;
  for (const auto& [w, key] : {std::pair{&blocks, std::string("qwen3moe.block_count = 2147483647")},
                               std::pair{&ffn, std::string("qwen3moe.feed_forward_length = 2147483647")}}) {
    SCOPED_TRACE(key);
    auto c = Write(*w);
    const testing::CliResult r = RunCli(RunArgs(c->path));
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(r.err.rfind("error: " + c->path + ": ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(key), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.out, "");

    std::string cmd = "'" + binary + "'";
    for (const std::string& a : RunArgs(c->path)) cmd += " '" + a + "'";
    const std::string err_path = c->dir.path() + "/err";
    const int status = std::system((cmd + " > /dev/null 2> " + err_path).c_str());
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 1);
    std::stringstream err;
    err << std::ifstream(err_path).rdbuf();
    EXPECT_EQ(err.str(), r.err);
  }
  GgufWriter moe_only = SmallMoe();
  moe_only.U32("qwen3moe.feed_forward_length", kI32Max);
  auto c = Write(moe_only);
  const testing::CliResult r = RunCli(RunArgs(c->path));
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

}  // namespace
}  // namespace tierkv
