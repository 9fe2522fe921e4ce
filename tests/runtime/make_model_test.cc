// tests/runtime/make_model_test.cc
//
// `tierkv make-model`: the type mix and sizes of the real models (planned, not
// written), and written slices that load, run under a host budget smaller than the
// file with the logits of an all-resident run, repeat from their seed, and take a
// tokenizer from another file. Failures leave no file behind.
#include "runtime/make_model.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>

#include "kvcache/checksum.h"
#include "runtime/gguf.h"
#include "runtime/model.h"
#include "runtime/run.h"
#include "runtime/tokenizer.h"
#include "tests/kvcache/kv_test_util.h"
#include "tests/runtime/reference_util.h"

namespace tierkv {
namespace {

namespace fs = std::filesystem;

std::map<std::string, std::string> TypesByName(const std::vector<MakeModelTensor>& tensors) {
  std::map<std::string, std::string> out;
  for (const auto& t : tensors) out[t.name] = t.type;
  return out;
}

// llama.cpp's Q4_K_M for Qwen3-30B-A3B: attn_v and ffn_down_exps in Q6_K on the first
// and last sixth layers and every third between, Q4_K elsewhere; the output in Q6_K;
// norms and the router in F32. About 17 GiB, as the real file.
TEST(MakeModelTest, Qwen3_30B_A3B_HasTheRealShapesAndTypeMix) {
  MakeModelOptions o;
  std::vector<MakeModelTensor> tensors;
  auto plan = PlanMakeModel(o, &tensors);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->layers, 48);
  EXPECT_EQ(plan->tensors, 3u + 48u * 12u);
  const auto types = TypesByName(tensors);
  EXPECT_EQ(types.at("token_embd.weight"), "Q4_K");
  EXPECT_EQ(types.at("output.weight"), "Q6_K");
  EXPECT_EQ(types.at("blk.0.ffn_gate_inp.weight"), "F32");
  EXPECT_EQ(types.at("blk.0.attn_q_norm.weight"), "F32");
  for (int l = 0; l < 48; ++l) {
    const bool more = l < 6 || l >= 42 || (l - 6) % 3 == 2;
    const std::string p = "blk." + std::to_string(l) + ".";
    EXPECT_EQ(types.at(p + "attn_v.weight"), more ? "Q6_K" : "Q4_K") << l;
    EXPECT_EQ(types.at(p + "ffn_down_exps.weight"), more ? "Q6_K" : "Q4_K") << l;
    EXPECT_EQ(types.at(p + "ffn_gate_exps.weight"), "Q4_K") << l;
    EXPECT_EQ(types.at(p + "attn_output.weight"), "Q4_K") << l;
  }
  for (const auto& t : tensors) {
    if (t.name == "blk.3.ffn_up_exps.weight") {
      EXPECT_EQ(t.ne, (std::vector<uint64_t>{2048, 768, 128}));
    } else if (t.name == "blk.3.attn_q.weight") {
      EXPECT_EQ(t.ne, (std::vector<uint64_t>{2048, 4096}));
    } else if (t.name == "blk.3.attn_k.weight") {
      EXPECT_EQ(t.ne, (std::vector<uint64_t>{2048, 512}));
    }
  }
  // With the byte tokenizer; the Qwen vocabulary adds its embedding and output rows.
  EXPECT_GT(plan->file_bytes, 16ull << 30);
  EXPECT_LT(plan->file_bytes, 18ull << 30);
  o.type = "q8_0";
  auto q8 = PlanMakeModel(o);
  ASSERT_TRUE(q8.ok());
  EXPECT_GT(q8->file_bytes, plan->file_bytes * 17 / 10);
}

TEST(MakeModelTest, BadOptionsAreOneLineErrors) {
  const auto err = [](MakeModelOptions o) {
    o.out = ::testing::TempDir() + "/never.gguf";
    const Status st = MakeModel(o);
    EXPECT_FALSE(st.ok());
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
    EXPECT_FALSE(fs::exists(o.out));
    return st.message();
  };
  MakeModelOptions o;
  o.like = "llama-9000";
  EXPECT_NE(err(o).find("qwen3-30b-a3b"), std::string::npos);
  o = {};
  o.type = "q2_k";
  EXPECT_NE(err(o).find("--type"), std::string::npos);
  o = {};
  o.layers = 49;
  EXPECT_NE(err(o).find("48 layers"), std::string::npos);
  o = {};
  o.vocab_from = "/no/such/file.gguf";
  EXPECT_NE(err(o).find("/no/such/file.gguf"), std::string::npos);
  o = {};
  o.layers = 1;
  o.out = "/no/such/dir/m.gguf";
  const Status st = MakeModel(o);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("/no/such/dir/m.gguf"), std::string::npos) << st.message();
}

// A file that cannot be written whole (here: past the file-size limit, as a full disk)
// is an error and leaves nothing: no partial file, no temporary one.
TEST(MakeModelTest, AFailedWriteLeavesNoFile) {
  testing::TempDir dir;
  MakeModelOptions o;
  o.like = "qwen3-8b";
  o.layers = 1;
  o.out = dir.path() + "/m.gguf";
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit low = old;
  low.rlim_cur = 8 << 20;
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &low), 0);
  const Status st = MakeModel(o);
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("writing " + o.out), std::string::npos) << st.message();
  EXPECT_TRUE(fs::is_empty(dir.path())) << "nothing is left behind";
}

uint64_t FileHash(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return Checksum(bytes.data(), bytes.size());
}

// The same seed writes the same bytes; another seed, other weights.
TEST(MakeModelTest, TheSeedDecidesTheFile) {
  testing::TempDir dir;
  MakeModelOptions o;
  o.like = "qwen3-8b";
  o.layers = 1;
  o.out = dir.path() + "/a.gguf";
  ASSERT_TRUE(MakeModel(o).ok());
  o.out = dir.path() + "/b.gguf";
  ASSERT_TRUE(MakeModel(o).ok());
  o.seed = 2;
  o.out = dir.path() + "/c.gguf";
  ASSERT_TRUE(MakeModel(o).ok());
  EXPECT_EQ(FileHash(dir.path() + "/a.gguf"), FileHash(dir.path() + "/b.gguf"));
  EXPECT_NE(FileHash(dir.path() + "/a.gguf"), FileHash(dir.path() + "/c.gguf"));
}

// One layer of Qwen3-30B-A3B (about 400 MB, 128 experts of 2.3 to 2.9 MiB): the file
// loads as the model it says it is, and runs with its weights paged through a host
// tier of a fifth of its size with the tokens and logits of a run that holds it all.
TEST(MakeModelTest, ASliceRunsUnderABudgetAsWhenResident) {
  testing::TempDir dir;
  MakeModelOptions o;
  o.layers = 1;
  o.out = dir.path() + "/slice.gguf";
  MakeModelReport report;
  ASSERT_TRUE(MakeModel(o, &report).ok());
  EXPECT_EQ(report.file_bytes, fs::file_size(o.out));
  auto file = GgufFile::Open(o.out);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto config = ReadModelConfig(**file);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->n_expert, 128);
  EXPECT_EQ(config->n_expert_used, 8);
  EXPECT_EQ(config->n_embd, 2048);

  const auto run = [&](uint64_t host) {
    RunOptions r;
    r.model = o.out;
    r.prompt = "The lamp was lit at dusk";
    r.n_predict = 4;
    r.weights = RunOptions::Weights::kPaged;
    r.memory.host_bytes = host;
    r.memory.mlock = MlockMode::kOff;
    r.memory.warmup = false;
    r.threads = 2;
    r.dump_logits = 2;
    return RunSession(r);
  };
  const uint64_t budget = report.file_bytes / 5 / (1 << 20) << 20;
  auto tight = run(budget);
  ASSERT_TRUE(tight.ok()) << tight.status().ToString();
  auto resident = run(1ull << 30);
  ASSERT_TRUE(resident.ok()) << resident.status().ToString();
  EXPECT_EQ(tight->generated_tokens, resident->generated_tokens);
  ASSERT_EQ(tight->steps.size(), resident->steps.size());
  for (size_t i = 0; i < tight->steps.size(); ++i) EXPECT_EQ(tight->steps[i].top, resident->steps[i].top) << i;
  ASSERT_EQ(tight->logits.size(), resident->logits.size());
  for (size_t i = 0; i < tight->logits.size(); ++i) EXPECT_EQ(tight->logits[i].top, resident->logits[i].top) << i;
  const TierStats* host = nullptr;
  for (const TierStats& t : tight->tiers) {
    if (t.tier == Tier::kHost) host = &t;
  }
  ASSERT_NE(host, nullptr);
  EXPECT_LE(host->budget_bytes, budget);
  EXPECT_LE(host->used_bytes.peak, host->budget_bytes);
  // More came in than the tier holds: the weights were paged, not held.
  EXPECT_GT(host->bytes_in, host->budget_bytes);
}

// Weights paged from the file do not stay in the process twice: the peak RSS of a run
// whose host tier is a sixth of the file stays near that budget, although it touches
// nearly every expert (the pages are read with pread, not through the mapping).
TEST(MakeModelTest, PagedWeightsKeepTheProcessNearItsBudget) {
#ifdef TIERKV_SANITIZE
  GTEST_SKIP() << "the sanitizers' shadow memory is in the RSS";
#endif
  testing::TempDir dir;
  MakeModelOptions o;
  o.layers = 1;
  o.skew = 0;  // every expert alike: a long prompt touches nearly all of them
  o.out = dir.path() + "/slice.gguf";
  MakeModelReport report;
  ASSERT_TRUE(MakeModel(o, &report).ok());
  std::string prompt;
  for (int i = 0; i < 12; ++i) prompt += "The lamp was lit at dusk. ";
  const uint64_t budget = 64ull << 20;
  const std::string json = dir.path() + "/r.json";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int fd = open(json.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 1);
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, 2);
    execl(TIERKV_CLI_BINARY, "tierkv", "run", "-m", o.out.c_str(), "-p", prompt.c_str(), "-n", "2", "--weights", "paged",
          "--host", "64MiB", "--no-warmup", "--mlock", "off", "-t", "1", "--json", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  rusage ru{};
  ASSERT_EQ(wait4(pid, &status, 0, &ru), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  std::ifstream in(json);
  const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_NE(out.find("\"bytes_in\""), std::string::npos) << out;
  const uint64_t peak_rss = static_cast<uint64_t>(ru.ru_maxrss) * 1024;
  // The tier, the binary, the heap (scratch, the tokenizer) and the small tensors read
  // in place: well under the file's 386 MiB, most of which the run pages through.
  EXPECT_LT(peak_rss, budget + (96ull << 20)) << "peak RSS " << (peak_rss >> 20) << " MiB for a file of "
                                             << (report.file_bytes >> 20) << " MiB";
}

// --vocab-from: the tokenizer of another file, whole, and the vocabulary size with it.
TEST(MakeModelTest, TheTokenizerComesFromTheGivenFile) {
  const std::string ref = std::string(TIERKV_SHARED_DIR) + "/reference/models/ref-qwen3moe-f16.gguf";
  TIERKV_NEED_REFERENCE(ref);
  testing::TempDir dir;
  MakeModelOptions o;
  o.layers = 1;
  o.vocab_from = ref;
  o.out = dir.path() + "/v.gguf";
  MakeModelReport report;
  ASSERT_TRUE(MakeModel(o, &report).ok());
  EXPECT_EQ(report.n_vocab, 151936);
  auto made = GgufFile::Open(o.out);
  auto src = GgufFile::Open(ref);
  ASSERT_TRUE(made.ok() && src.ok());
  auto a = Tokenizer::FromGguf(**made);
  auto b = Tokenizer::FromGguf(**src);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString();
  for (const std::string text : {"Hello, world!", "The lighthouse keeper's log, 1893: 七 ships.", "  spaces\tand\nlines"}) {
    EXPECT_EQ((*a)->Encode(text, true, false), (*b)->Encode(text, true, false)) << text;
  }
}

}  // namespace
}  // namespace tierkv
