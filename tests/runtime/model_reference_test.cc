// tests/runtime/model_reference_test.cc
//
// Every model in TIERKV_SHARED_DIR/reference/models against what llama.cpp computed for
// it (vectors/<name>.json; the reference README describes the schema and tolerances):
// one test per (model, prompt), with the default attention and again with llama.cpp's
// summation orders (ModelOptions::llama_attention_sums, which makes every F16 and Q8_0
// file bit-identical). The prompt's token ids come from the JSON (tokenization
// is tested elsewhere). With an f16 KV cache, as the reference used:
//   1. at every recorded prompt position, each of the 10 reference top logits (by token
//      id) within tolerance.logit_abs, the log-sum-exp within tolerance.logsumexp_abs;
//   2. the reference greedy ids teacher-forced, every greedy step compared the same way;
//   3. at least 99% of all compared logits within tolerance.logit_abs_p99;
//   4. free-running greedy decoding (a copy-on-write fork of the prompt's sequence)
//      reproduces greedy_ids for the first greedy_stable_prefix tokens.
// P3 (~3000 tokens) runs in Release builds only; under sanitizers it is skipped.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/activation.h"
#include "kvcache/kv_cache.h"
#include "memory/memory_manager.h"
#include "runtime/gguf.h"
#include "runtime/model.h"
#include "runtime/tokenizer.h"
#include "tests/runtime/reference_util.h"

namespace tierkv {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// TIERKV_REFERENCE_DIR, when set, names another folder of the same layout (models/,
// vectors/): vectors made with scripts/llama_xcheck for models and types outside
// ../shared (docs/testing.md).
const fs::path kRefDir = std::getenv("TIERKV_REFERENCE_DIR") != nullptr
                             ? fs::path(std::getenv("TIERKV_REFERENCE_DIR"))
                             : fs::path(TIERKV_SHARED_DIR) / "reference";

// ---- SHA-256 (FIPS 180-4), to make sure the vectors belong to the model file ----

class Sha256 {
 public:
  void Update(const uint8_t* p, size_t n) {
    bytes_ += n;
    while (n > 0) {
      const size_t take = std::min(n, 64 - fill_);
      std::copy(p, p + take, buf_.begin() + static_cast<std::ptrdiff_t>(fill_));
      fill_ += take;
      p += take;
      n -= take;
      if (fill_ == 64) {
        Block(buf_.data());
        fill_ = 0;
      }
    }
  }
  std::string HexDigest() {
    const uint64_t bits = bytes_ * 8;
    const uint8_t one = 0x80, zero = 0;
    Update(&one, 1);
    while (fill_ != 56) Update(&zero, 1);
    for (int i = 7; i >= 0; --i) {
      const uint8_t b = static_cast<uint8_t>(bits >> (8 * i));
      Update(&b, 1);
    }
    std::string hex;
    char tmp[9];
    for (uint32_t v : h_) {
      std::snprintf(tmp, sizeof(tmp), "%08x", v);
      hex += tmp;
    }
    return hex;
  }

 private:
  static uint32_t Rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
  void Block(const uint8_t* p) {
    static constexpr uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      w[i] = (uint32_t{p[4 * i]} << 24) | (uint32_t{p[4 * i + 1]} << 16) | (uint32_t{p[4 * i + 2]} << 8) | p[4 * i + 3];
    }
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = Rotr(w[i - 15], 7) ^ Rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = Rotr(w[i - 2], 17) ^ Rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = h + (Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const uint32_t t2 = (Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a; h_[1] += b; h_[2] += c; h_[3] += d; h_[4] += e; h_[5] += f; h_[6] += g; h_[7] += h;
  }

  std::array<uint32_t, 8> h_ = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<uint8_t, 64> buf_{};
  size_t fill_ = 0;
  uint64_t bytes_ = 0;
};

std::string FileSha256(const GgufFile& f) {
  Sha256 sha;
  sha.Update(f.base(), f.file_size());
  return sha.HexDigest();
}

// ---- the cases ----

struct RefCase {
  std::string model;  // "ref-llama-f16"
  int index = -1;     // case index in the JSON; -1: no vectors (skip); -2: unreadable vectors (fail)
  std::string id;     // "P1"
  bool llama_sums = false;  // ModelOptions::llama_attention_sums (both are run)
  bool cuda = false;        // on the CUDA executor (skipped where none answers)
};

std::vector<RefCase> ListCases() {
  std::vector<RefCase> out;
  std::error_code ec;
  std::vector<std::string> models;
  for (const auto& e : fs::directory_iterator(kRefDir / "models", ec)) {
    if (e.path().extension() == ".gguf") models.push_back(e.path().stem().string());
  }
  std::sort(models.begin(), models.end());
  for (const std::string& m : models) {
    std::ifstream in(kRefDir / "vectors" / (m + ".json"));
    if (!in) {
      out.push_back({m, -1, "none"});
      continue;
    }
    const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("cases")) {
      out.push_back({m, -2, "unreadable"});  // there, but not vectors: a failure
      continue;
    }
    for (bool sums : {false, true}) {
      for (size_t i = 0; i < j["cases"].size(); ++i) out.push_back({m, static_cast<int>(i), j["cases"][i]["id"], sums});
    }
    // The CUDA executor: the default sums (it has no llama.cpp-order attention).
    for (size_t i = 0; i < j["cases"].size(); ++i) {
      out.push_back({m, static_cast<int>(i), j["cases"][i]["id"], false, /*cuda=*/true});
    }
  }
  if (out.empty()) out.push_back({"none", -1, "none"});
  return out;
}

std::string CaseName(const ::testing::TestParamInfo<RefCase>& info) {
  std::string s = info.param.model + "_" + info.param.id + (info.param.llama_sums ? "_llama_sums" : "") +
                  (info.param.cuda ? "_cuda" : "");
  for (char& ch : s) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return s;
}

// Errors of one compared output, pooled per case.
struct Stats {
  double max_err = 0;       // over every compared top-10 logit
  double max_lse_err = 0;
  size_t compared = 0;
  size_t within_p99 = 0;
};

class ModelReferenceTest : public ::testing::TestWithParam<RefCase> {};

// Compares one output (the prediction after the token at `pos`) with a reference entry
// {top: [[id, logit]...], logsumexp}.
void CompareOutput(const json& ref, const std::vector<float>& logits, const json& tol, const std::string& where,
                   Stats* st) {
  const double logit_abs = tol["logit_abs"], p99_abs = tol["logit_abs_p99"], lse_abs = tol["logsumexp_abs"];
  for (const json& e : ref["top"]) {
    const int id = e[0];
    const double want = static_cast<float>(e[1].get<double>());  // printed to 9 digits: compare as float
    ASSERT_GE(id, 0);
    ASSERT_LT(static_cast<size_t>(id), logits.size());
    const double got = logits[static_cast<size_t>(id)];
    const double err = std::fabs(got - want);
    EXPECT_LE(err, logit_abs) << where << ": token " << id << " logit " << got << ", llama.cpp " << want;
    st->max_err = std::max(st->max_err, err);
    ++st->compared;
    if (err <= p99_abs) ++st->within_p99;
  }
  const double lse = kernels::LogSumExp(logits.data(), static_cast<int64_t>(logits.size()));
  const double want_lse = ref["logsumexp"];
  EXPECT_NEAR(lse, want_lse, lse_abs) << where << ": logsumexp";
  st->max_lse_err = std::max(st->max_lse_err, std::fabs(lse - want_lse));
}

TEST_P(ModelReferenceTest, MatchesLlamaCpp) {
  const RefCase& rc = GetParam();
  if (rc.model == "none") TIERKV_NEED_REFERENCE(kRefDir / "models" / "ref-llama-q8_0.gguf");
  std::shared_ptr<kernels::Executor> cuda;
  if (rc.cuda) {  // before the file's checksum: these cases are skipped wherever there is no GPU
    std::string why;
    cuda = kernels::MakeExecutor("cuda", 1, &why);
    if (cuda == nullptr) GTEST_SKIP() << "no CUDA executor: " << why;
  }
  // A model may come without vectors (nothing to compare); vectors that are there must read.
  if (rc.index == -1) GTEST_SKIP() << "no vectors/" << rc.model << ".json beside the model";
  ASSERT_GE(rc.index, 0) << "vectors/" << rc.model << ".json is not JSON with \"cases\"";

  std::ifstream in(kRefDir / "vectors" / (rc.model + ".json"));
  const json j = json::parse(in);
  const json& cs = j["cases"][static_cast<size_t>(rc.index)];
  const json& tol = j["tolerance"];
#if defined(TIERKV_SANITIZE)
  if (cs["n_prompt_tokens"].get<int>() > 1000) {
    GTEST_SKIP() << rc.id << " (" << cs["n_prompt_tokens"].get<int>()
                 << " tokens) runs in Release builds only: this build has TIERKV_SANITIZE";
  }
#endif
  ASSERT_EQ(j["reference"]["type_k"], "f16");
  ASSERT_EQ(j["reference"]["type_v"], "f16");

  // The model, checked against the JSON's checksum (once per file).
  static std::map<std::string, std::shared_ptr<const GgufFile>> files;
  std::shared_ptr<const GgufFile>& file = files[rc.model];
  if (file == nullptr) {
    auto opened = GgufFile::Open((kRefDir / "models" / (rc.model + ".gguf")).string());
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    file = std::shared_ptr<const GgufFile>(std::move(opened).value());
    ASSERT_EQ(file->file_size(), j["model"]["file_size"].get<uint64_t>());
    ASSERT_EQ(FileSha256(*file), j["model"]["file_sha256"].get<std::string>()) << "the vectors belong to another file";
  }

  // The prompt as this file's tokenizer reads it: llama.cpp's ids (so a file tierkv
  // wrote, `tierkv make-model`'s, tokenizes alike in both: scripts/llama_xcheck).
  if (cs.contains("prompt")) {
    auto tok = Tokenizer::FromGguf(*file);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    EXPECT_EQ((*tok)->Encode(cs["prompt"].get<std::string>(), /*add_special=*/true, /*parse_special=*/false),
              cs["prompt_ids"].get<std::vector<int32_t>>())
        << rc.id << ": the prompt's tokens differ from llama.cpp's";
  }

  ModelOptions mo;
  mo.threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
  mo.llama_attention_sums = rc.llama_sums;
  MemoryOptions mem;
  mem.host_bytes = 64 * kMiB;
  mem.warmup = false;
  mem.mlock = MlockMode::kOff;
  if (rc.cuda) {
    // The weights paged into VRAM and the KV cache there: as `tierkv run --device cuda`.
    mo.executor = cuda;
    mem.device = DeviceKind::kCuda;
    mem.device_bytes = 1024 * kMiB;
    mem.host_bytes = 256 * kMiB;
  }
  // Before the model, so that it outlives the model's weight pages.
  auto mm_or = MemoryManager::Create(mem);
  ASSERT_TRUE(mm_or.ok()) << mm_or.status().ToString();
  auto model_or = Model::Load(file, mo);
  ASSERT_TRUE(model_or.ok()) << model_or.status().ToString();
  Model& model = **model_or;
  const ModelConfig& cfg = model.config();
  EXPECT_EQ(cfg.n_embd, j["model"]["n_embd"].get<int>());
  EXPECT_EQ(cfg.n_layer, j["model"]["n_layer"].get<int>());
  EXPECT_EQ(cfg.tied_output, j["model"]["tied_embeddings"].get<bool>());
  if (rc.cuda) {
    ASSERT_TRUE(model.UseMemory(mm_or->get()).ok());
  }

  auto cache_or = KvCache::Create(mm_or->get(), model.KvGeometryFor(KvCodec::kF16));
  ASSERT_TRUE(cache_or.ok()) << cache_or.status().ToString();
  KvCache& cache = **cache_or;
  const SeqId seq = cache.NewSequence();

  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int> prompt = cs["prompt_ids"].get<std::vector<int>>();
  std::map<int, const json*> recorded;
  for (const json& p : cs["prompt_positions"]) recorded[p["pos"].get<int>()] = &p;
  const size_t n_vocab = static_cast<size_t>(cfg.n_vocab);
  std::vector<float> logits(n_vocab);
  Stats st;
  // The prompt in chunks of 64, as `tierkv run` prefills (ForwardBatch; the greedy steps
  // below are one Forward each).
  constexpr int kChunk = 64;
  const int n_prompt = static_cast<int>(prompt.size());
  for (int pos = 0; pos < n_prompt; pos += kChunk) {
    const int n = std::min(kChunk, n_prompt - pos);
    std::vector<int32_t> ids(prompt.begin() + pos, prompt.begin() + pos + n);
    std::vector<int> rows;
    for (int i = 0; i < n; ++i) {
      if (recorded.count(pos + i) > 0 || pos + i + 1 == n_prompt) rows.push_back(i);
    }
    std::vector<float> chunk(rows.size() * n_vocab);
    const Status s = model.ForwardBatch(cache, seq, ids, pos, rows, chunk);
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (size_t r = 0; r < rows.size(); ++r) {
      std::copy_n(chunk.begin() + static_cast<ptrdiff_t>(r * n_vocab), n_vocab, logits.begin());
      const auto it = recorded.find(pos + rows[r]);
      if (it == recorded.end()) continue;
      EXPECT_EQ(it->second->at("token").get<int>(), prompt[static_cast<size_t>(pos + rows[r])]);
      const double before = st.max_err; st.max_err = 0;
      CompareOutput(*it->second, logits, tol, "prompt position " + std::to_string(pos + rows[r]), &st);
      if (std::getenv("REF_DEBUG")) std::printf("pos %d err %.3g\n", pos + rows[r], st.max_err);
      st.max_err = std::max(st.max_err, before);
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  const std::vector<float> last = logits;

  // Free-running greedy on a fork of the prompt's KV (copy-on-write).
  const std::vector<int> greedy = cs["greedy_ids"].get<std::vector<int>>();
  const int stable = cs["greedy_stable_prefix"];
  auto fork = cache.Fork(seq);
  ASSERT_TRUE(fork.ok()) << fork.status().ToString();
  std::vector<int> own;
  {
    std::vector<float> fl = last;
    for (int s = 0; s < stable; ++s) {
      own.push_back(static_cast<int>(kernels::ArgMax(fl.data(), static_cast<int64_t>(fl.size()))));
      if (s + 1 < stable) {
        const Status r = model.Forward(cache, *fork, own.back(), static_cast<int>(prompt.size()) + s, fl);
        ASSERT_TRUE(r.ok()) << r.ToString();
      }
    }
  }
  EXPECT_EQ(own, std::vector<int>(greedy.begin(), greedy.begin() + stable)) << "free-running greedy ids";

  // Teacher-forced greedy steps.
  const json& steps = cs["greedy_steps"];
  for (size_t s = 0; s < steps.size(); ++s) {
    const int pos = static_cast<int>(prompt.size()) - 1 + static_cast<int>(s);
    ASSERT_EQ(steps[s]["pos"].get<int>(), pos);
    if (s > 0) {
      const Status r = model.Forward(cache, seq, greedy[s - 1], pos, logits);
      ASSERT_TRUE(r.ok()) << r.ToString();
    }
    CompareOutput(steps[s], s == 0 ? last : logits, tol, "greedy step " + std::to_string(s), &st);
  }
  const auto t2 = std::chrono::steady_clock::now();

  const double frac = st.compared ? static_cast<double>(st.within_p99) / static_cast<double>(st.compared) : 0;
  EXPECT_GE(frac, 0.99) << "share of top-10 logits within logit_abs_p99 " << tol["logit_abs_p99"];
  std::string why;
  EXPECT_TRUE(cache.CheckInvariants(&why)) << why;
  std::printf("[reference] %-22s %s%s%s: %4zu tokens, max |logit err| %.3g (tol %.3g), within p99 tol %.1f%% (tol %.3g), "
              "max |lse err| %.3g (tol %.3g), greedy prefix %d ok, prompt %.2f s, steps %.2f s\n",
              rc.model.c_str(), rc.id.c_str(), rc.llama_sums ? " llama-sums" : "", rc.cuda ? " cuda" : "", prompt.size(), st.max_err, tol["logit_abs"].get<double>(), 100 * frac,
              tol["logit_abs_p99"].get<double>(), st.max_lse_err, tol["logsumexp_abs"].get<double>(), stable,
              std::chrono::duration<double>(t1 - t0).count(), std::chrono::duration<double>(t2 - t1).count());
  RecordProperty("max_logit_err", std::to_string(st.max_err));
}

INSTANTIATE_TEST_SUITE_P(Reference, ModelReferenceTest, ::testing::ValuesIn(ListCases()), CaseName);

}  // namespace
}  // namespace tierkv
