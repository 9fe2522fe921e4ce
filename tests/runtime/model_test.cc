// tests/runtime/model_test.cc
//
// Model loading and the forward step on the reference models: config against the
// vectors' metadata, argument errors that leave the sequence untouched, results that do
// not depend on the thread count or on how attention batches the KV blocks, the
// attention path reading pinned pages (hits counted by the MemoryManager), and RoPE
// scaling options. Numbers against llama.cpp are in model_reference_test.cc.
#include "runtime/model.h"

#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <span>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kvcache/kv_cache.h"
#include "memory/memory_manager.h"
#include "runtime/gguf.h"
#include "tests/runtime/reference_util.h"

namespace tierkv {
namespace {

namespace fs = std::filesystem;
const fs::path kRefDir = fs::path(TIERKV_SHARED_DIR) / "reference";

fs::path RefPath(const std::string& name) { return kRefDir / "models" / (name + ".gguf"); }

// A reference model that is there must load: its absence skips the test, its failure fails it.
#define REQUIRE_REF(file, name)                                                          \
  TIERKV_NEED_REFERENCE(RefPath(name));                                                  \
  auto file##_opened = GgufFile::Open(RefPath(name).string());                           \
  ASSERT_TRUE(file##_opened.ok()) << file##_opened.status().ToString();                  \
  const std::shared_ptr<const GgufFile> file(std::move(file##_opened).value())

struct Runner {
  std::unique_ptr<MemoryManager> mm;
  std::unique_ptr<KvCache> cache;
  SeqId seq;

  explicit Runner(const Model& model, KvCodec codec = KvCodec::kF16, uint64_t host = 32 * kMiB, int block_tokens = 0) {
    MemoryOptions mem;
    mem.host_bytes = host;
    mem.frame_bytes = 64 * kKiB;
    mem.warmup = false;
    mem.mlock = MlockMode::kOff;
    mm = std::move(MemoryManager::Create(mem)).value();
    cache = std::move(KvCache::Create(mm.get(), model.KvGeometryFor(codec, block_tokens))).value();
    seq = cache->NewSequence();
  }

  // Logits after each of `tokens`.
  std::vector<std::vector<float>> Run(Model& model, const std::vector<int>& tokens) {
    std::vector<std::vector<float>> out;
    std::vector<float> logits(static_cast<size_t>(model.config().n_vocab));
    for (size_t i = 0; i < tokens.size(); ++i) {
      const Status s = model.Forward(*cache, seq, tokens[i], static_cast<int>(i), logits);
      EXPECT_TRUE(s.ok()) << s.ToString();
      out.push_back(logits);
    }
    return out;
  }
};

ModelOptions Opts(int threads, int kv_batch_blocks = 0) {
  ModelOptions mo;
  mo.threads = threads;
  mo.kv_batch_blocks = kv_batch_blocks;
  return mo;
}

const std::vector<int> kTokens = {1, 450, 4996, 17354, 1701, 29916, 432, 17204, 975, 278, 17366, 11203, 29889,
                                  9038, 2501, 263, 931, 1, 2, 3, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000,
                                  1100, 1200, 1300, 1400, 1500, 1600, 1700, 1800, 1900, 2000};

TEST(ModelTest, ConfigMatchesVectors) {
  for (const char* name : {"ref-llama-q4_k_m", "ref-qwen3moe-f16"}) {
    SCOPED_TRACE(name);
    REQUIRE_REF(file, name);
    TIERKV_NEED_REFERENCE(kRefDir / "vectors" / (std::string(name) + ".json"));
    std::ifstream in(kRefDir / "vectors" / (std::string(name) + ".json"));
    ASSERT_TRUE(in) << "cannot read the vectors of " << name;
    const nlohmann::json m = nlohmann::json::parse(in)["model"];
    auto cfg = ReadModelConfig(*file);
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    EXPECT_EQ(ModelArchName(cfg->arch), m["arch"].get<std::string>());
    EXPECT_EQ(cfg->n_embd, m["n_embd"].get<int>());
    EXPECT_EQ(cfg->n_layer, m["n_layer"].get<int>());
    EXPECT_EQ(cfg->n_head, m["n_head"].get<int>());
    EXPECT_EQ(cfg->n_head_kv, m["n_head_kv"].get<int>());
    EXPECT_EQ(cfg->head_dim, m["head_dim"].get<int>());
    EXPECT_EQ(cfg->context_length, m["context_length"].get<int>());
    EXPECT_FLOAT_EQ(cfg->rope_freq_base, m["rope_freq_base"].get<float>());
    EXPECT_FLOAT_EQ(cfg->rms_eps, m["rms_norm_eps"].get<float>());
    EXPECT_EQ(cfg->tied_output, m["tied_embeddings"].get<bool>());
    EXPECT_EQ(cfg->qkv_bias, m["qkv_bias"].get<bool>());
    EXPECT_EQ(cfg->rope_scaling, RopeScaling::kNone);
    if (cfg->is_moe()) {
      EXPECT_EQ(cfg->n_expert, m["n_expert"].get<int>());
      EXPECT_EQ(cfg->n_expert_used, m["n_expert_used"].get<int>());
      EXPECT_EQ(cfg->n_ff_exp, m["n_ff_exp"].get<int>());
      EXPECT_TRUE(cfg->norm_topk_prob);
      EXPECT_TRUE(cfg->qk_norm);
      EXPECT_EQ(cfg->rope_mode, kernels::RopeMode::kNeox);
    } else {
      EXPECT_EQ(cfg->n_ff, m["n_ff"].get<int>());
      EXPECT_EQ(cfg->rope_mode, kernels::RopeMode::kNorm);
    }
    EXPECT_FALSE(cfg->ToString().empty());
  }
}

TEST(ModelTest, ForwardRejectsBadArgumentsAndKeepsTheSequence) {
  REQUIRE_REF(file, "ref-llama-q8_0");
  auto model_or = Model::Load(file, Opts(2));
  ASSERT_TRUE(model_or.ok());
  Model& model = **model_or;
  Runner r(model);
  std::vector<float> logits(static_cast<size_t>(model.config().n_vocab));
  ASSERT_TRUE(model.Forward(*r.cache, r.seq, 1, 0, logits).ok());
  EXPECT_EQ(model.Forward(*r.cache, r.seq, 450, 5, logits).code(), StatusCode::kInvalidArgument);  // not next
  EXPECT_EQ(model.Forward(*r.cache, r.seq, -1, 1, logits).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(model.Forward(*r.cache, r.seq, model.config().n_vocab, 1, logits).code(), StatusCode::kInvalidArgument);
  std::vector<float> small(10);
  EXPECT_EQ(model.Forward(*r.cache, r.seq, 450, 1, small).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(model.Forward(*r.cache, SeqId(77), 450, 0, logits).code(), StatusCode::kNotFound);
  EXPECT_EQ(r.cache->Length(r.seq), 1);
  ASSERT_TRUE(model.Forward(*r.cache, r.seq, 450, 1, logits).ok());
  EXPECT_EQ(r.cache->Length(r.seq), 2);

  // A cache of another geometry.
  KvGeometry g = model.KvGeometryFor(KvCodec::kF16);
  g.n_kv_heads = 1;
  auto other = KvCache::Create(r.mm.get(), g);
  ASSERT_TRUE(other.ok());
  const SeqId s2 = (*other)->NewSequence();
  EXPECT_EQ(model.Forward(**other, s2, 1, 0, logits).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*other)->Length(s2), 0);
}

TEST(ModelTest, FailedKvAppendLeavesTheSequence) {
  REQUIRE_REF(file, "ref-llama-f16");
  auto model_or = Model::Load(file, Opts(1));
  ASSERT_TRUE(model_or.ok());
  Model& model = **model_or;
  // A host tier of 4 frames, 16-token blocks (2 layers -> 2 pages per 16 tokens).
  Runner r(model, KvCodec::kF16, 4 * 64 * kKiB, 16);
  std::vector<float> logits(static_cast<size_t>(model.config().n_vocab));
  int pos = 0;
  Status st;
  for (; pos < 1000; ++pos) {
    st = model.Forward(*r.cache, r.seq, kTokens[static_cast<size_t>(pos) % kTokens.size()], pos, logits);
    if (!st.ok()) break;
  }
  ASSERT_FALSE(st.ok()) << "the tiny tier never filled up";
  EXPECT_EQ(st.code(), StatusCode::kExhausted) << st.ToString();
  EXPECT_EQ(r.cache->Length(r.seq), pos);
  std::string why;
  EXPECT_TRUE(r.cache->CheckInvariants(&why)) << why;
}

TEST(ModelTest, ForwardBatchRejectsBadArgumentsAndKeepsTheSequence) {
  REQUIRE_REF(file, "ref-llama-q8_0");
  auto model_or = Model::Load(file, Opts(2));
  ASSERT_TRUE(model_or.ok());
  Model& model = **model_or;
  Runner r(model);
  const size_t n_vocab = static_cast<size_t>(model.config().n_vocab);
  const std::vector<int32_t> ids = {1, 450, 4996, 17354};
  std::vector<float> one(n_vocab), two(2 * n_vocab);
  const std::vector<int> last = {3}, both = {1, 3};
  EXPECT_EQ(model.ForwardBatch(*r.cache, r.seq, ids, 1, last, one).code(), StatusCode::kInvalidArgument);  // not next
  EXPECT_EQ(model.ForwardBatch(*r.cache, r.seq, std::vector<int32_t>{1, -1}, 0, {}, {}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(model.ForwardBatch(*r.cache, r.seq, ids, 0, both, one).code(), StatusCode::kInvalidArgument);  // size
  EXPECT_EQ(model.ForwardBatch(*r.cache, r.seq, ids, 0, std::vector<int>{3, 1}, two).code(),
            StatusCode::kInvalidArgument);  // not ascending
  EXPECT_EQ(model.ForwardBatch(*r.cache, r.seq, ids, 0, std::vector<int>{4}, one).code(),
            StatusCode::kInvalidArgument);  // past the chunk
  EXPECT_EQ(model.ForwardBatch(*r.cache, SeqId(77), ids, 0, last, one).code(), StatusCode::kNotFound);
  EXPECT_EQ(r.cache->Length(r.seq), 0);
  ASSERT_TRUE(model.ForwardBatch(*r.cache, r.seq, {}, 0, {}, {}).ok());  // an empty chunk does nothing
  EXPECT_EQ(r.cache->Length(r.seq), 0);
  ASSERT_TRUE(model.ForwardBatch(*r.cache, r.seq, ids, 0, both, two).ok());
  EXPECT_EQ(r.cache->Length(r.seq), 4);
  // The rows are the logits after entries 1 and 3, as one Forward per token gives them.
  Runner single(model);
  std::vector<float> logits(n_vocab);
  for (int pos = 0; pos < 4; ++pos) {
    ASSERT_TRUE(model.Forward(*single.cache, single.seq, ids[static_cast<size_t>(pos)], pos, logits).ok());
    if (pos == 1 || pos == 3) {
      const size_t row = pos == 1 ? 0 : 1;
      EXPECT_EQ(std::memcmp(logits.data(), two.data() + row * n_vocab, n_vocab * sizeof(float)), 0) << pos;
    }
  }
}

TEST(ModelTest, FailedKvAppendInAChunkLeavesTheSequence) {
  REQUIRE_REF(file, "ref-llama-f16");
  auto model_or = Model::Load(file, Opts(1));
  ASSERT_TRUE(model_or.ok());
  Model& model = **model_or;
  // A host tier of 4 frames, 16-token blocks: 32 tokens fit, the chunk 24 .. 47 does not.
  Runner r(model, KvCodec::kF16, 4 * 64 * kKiB, 16);
  std::vector<int32_t> ids;
  for (int i = 0; i < 48; ++i) ids.push_back(kTokens[static_cast<size_t>(i) % kTokens.size()]);
  ASSERT_TRUE(model.ForwardBatch(*r.cache, r.seq, std::span(ids).first(24), 0, {}, {}).ok());
  const Status st = model.ForwardBatch(*r.cache, r.seq, std::span(ids).subspan(24), 24, {}, {});
  ASSERT_FALSE(st.ok()) << "the tiny tier never filled up";
  EXPECT_EQ(st.code(), StatusCode::kExhausted) << st.ToString();
  EXPECT_EQ(r.cache->Length(r.seq), 24);
  std::string why;
  EXPECT_TRUE(r.cache->CheckInvariants(&why)) << why;
  // The sequence goes on where it was.
  ASSERT_TRUE(model.ForwardBatch(*r.cache, r.seq, std::span(ids).subspan(24, 4), 24, {}, {}).ok());
  EXPECT_EQ(r.cache->Length(r.seq), 28);
}

TEST(ModelTest, ThreadsAndKvBatchingAreBitIdentical) {
  for (const char* name : {"ref-llama-q4_k_m", "ref-qwen3moe-q8_0"}) {
    SCOPED_TRACE(name);
    REQUIRE_REF(file, name);
    std::vector<std::vector<float>> base;
    for (const ModelOptions& mo : {Opts(1), Opts(3), Opts(2, 1), Opts(2, 2)}) {
      auto model_or = Model::Load(file, mo);
      ASSERT_TRUE(model_or.ok());
      Runner r(**model_or, KvCodec::kF16, 32 * kMiB, 16);  // 40 tokens: 3 blocks per layer
      auto logits = r.Run(**model_or, kTokens);
      if (base.empty()) {
        base = std::move(logits);
      } else {
        EXPECT_TRUE(logits == base) << "threads " << mo.threads << ", kv_batch_blocks " << mo.kv_batch_blocks;
      }
    }
  }
}

TEST(ModelTest, AttentionReadsPinnedPages) {
  REQUIRE_REF(file, "ref-llama-f16");
  auto model_or = Model::Load(file, Opts(2));
  ASSERT_TRUE(model_or.ok());
  Runner r(**model_or, KvCodec::kF16, 32 * kMiB, 16);
  const uint64_t hits0 = r.mm->Stats(Tier::kHost).hits;
  r.Run(**model_or, std::vector<int>(kTokens.begin(), kTokens.begin() + 20));
  // Two passes over each layer's blocks per token, plus the KV writes.
  EXPECT_GE(r.mm->Stats(Tier::kHost).hits - hits0, 2u * 2u * 20u);
}

TEST(ModelTest, OtherCodecsStayClose) {
  REQUIRE_REF(file, "ref-llama-f16");
  auto model_or = Model::Load(file, Opts(2));
  ASSERT_TRUE(model_or.ok());
  Runner f16(**model_or, KvCodec::kF16);
  const auto ref = f16.Run(**model_or, kTokens);
  for (KvCodec c : {KvCodec::kQ8_0, KvCodec::kQ4_0, KvCodec::kTq4}) {
    Runner r(**model_or, c);
    const auto got = r.Run(**model_or, kTokens);
    double sum_err = 0, sum_ref = 0;
    size_t n = 0;
    for (size_t t = 0; t < got.size(); ++t) {
      for (size_t i = 0; i < got[t].size(); ++i, ++n) {
        sum_err += std::fabs(got[t][i] - ref[t][i]);
        sum_ref += std::fabs(ref[t][i]);
      }
    }
    const double mean_err = sum_err / static_cast<double>(n), mean_ref = sum_ref / static_cast<double>(n);
    std::printf("[codec] %s: mean |logit - f16 cache logit| %.4f (mean |logit| %.3f)\n", KvCodecName(c), mean_err,
                mean_ref);
    // These random models have peaky attention, so single logits move a lot (llama.cpp's
    // own f32-vs-f16 cache comparison moves some by 5); on average the codecs stay close.
    // (Changing one early token of P1 moves the last logits by 1.78 on average: README.)
    EXPECT_LT(mean_err, c == KvCodec::kQ8_0 ? 0.05 * mean_ref : 0.4 * mean_ref) << KvCodecName(c);
    EXPECT_GT(mean_err, 0.0) << KvCodecName(c);
  }
}

TEST(ModelTest, RopeScalingOptions) {
  REQUIRE_REF(file, "ref-qwen3moe-f16");
  ModelOptions mo;
  mo.threads = 1;
  mo.rope.scaling = RopeScaling::kYarn;
  mo.n_ctx = 4 * 262144;
  auto yarn = Model::Load(file, mo);
  ASSERT_TRUE(yarn.ok()) << yarn.status().ToString();
  EXPECT_EQ((*yarn)->config().rope_scaling, RopeScaling::kYarn);
  EXPECT_FLOAT_EQ((*yarn)->config().rope_scale_factor, 4.0f);
  EXPECT_EQ((*yarn)->config().rope_orig_ctx, 262144);

  mo.rope.scaling = RopeScaling::kLinear;
  mo.rope.scale_factor = 0.5f;
  EXPECT_EQ(Model::Load(file, mo).status().code(), StatusCode::kInvalidArgument);

  // Scaling changes the numbers (positions > 0), but not at position 0.
  auto plain = Model::Load(file, Opts(1));
  ASSERT_TRUE(plain.ok());
  Runner a(**plain), b(**yarn);
  const std::vector<int> toks = {100, 200, 300};
  const auto la = a.Run(**plain, toks), lb = b.Run(**yarn, toks);
  EXPECT_TRUE(la[0] == lb[0]);
  EXPECT_FALSE(la[2] == lb[2]);
}

// llama.cpp's RoPE flags over a config: a factor without a type scales linearly (a file
// without rope.scaling.type reads as linear there); a type without a factor keeps the
// file's factor of that type, else derives it from the context; the YaRN attention
// factor multiplies the file's; out-of-range values are refused.
TEST(ModelTest, RopeOverridesApplyAsLlamaCppFlags) {
  ModelConfig base;
  base.context_length = 32768;
  base.rope_freq_base = 1e6f;
  base.rope_orig_ctx = 32768;
  base.yarn_attn_factor = 1.5f;

  ModelConfig c = base;
  ASSERT_TRUE(ApplyRopeOverrides({}, 0, &c).ok());
  EXPECT_EQ(c.rope_scaling, RopeScaling::kNone);
  EXPECT_FLOAT_EQ(c.rope_scale_factor, 1.0f);

  RopeOverrides o;
  o.scale_factor = 2.0f;
  o.freq_base = 5e5f;
  c = base;
  ASSERT_TRUE(ApplyRopeOverrides(o, 0, &c).ok());
  EXPECT_EQ(c.rope_scaling, RopeScaling::kLinear);
  EXPECT_FLOAT_EQ(c.rope_scale_factor, 2.0f);
  EXPECT_FLOAT_EQ(c.rope_freq_base, 5e5f);

  // Qwen3's recipe for 128K: yarn, factor 4, from its 32768 trained tokens.
  o = {};
  o.scaling = RopeScaling::kYarn;
  o.scale_factor = 4.0f;
  o.orig_ctx = 32768;
  o.yarn_attn_factor = 2.0f;
  o.yarn_beta_fast = 16.0f;
  c = base;
  c.rope_orig_ctx = 0;
  ASSERT_TRUE(ApplyRopeOverrides(o, 131072, &c).ok());
  EXPECT_EQ(c.rope_scaling, RopeScaling::kYarn);
  EXPECT_FLOAT_EQ(c.rope_scale_factor, 4.0f);
  EXPECT_EQ(c.rope_orig_ctx, 32768);
  EXPECT_FLOAT_EQ(c.yarn_attn_factor, 3.0f);
  EXPECT_FLOAT_EQ(c.yarn_beta_fast, 16.0f);
  EXPECT_FLOAT_EQ(c.yarn_beta_slow, base.yarn_beta_slow);

  // A type alone: derived from the context, or the file's factor of that type.
  o = {};
  o.scaling = RopeScaling::kYarn;
  c = base;
  ASSERT_TRUE(ApplyRopeOverrides(o, 98304, &c).ok());
  EXPECT_FLOAT_EQ(c.rope_scale_factor, 3.0f);
  c = base;
  c.rope_scaling = RopeScaling::kYarn;
  c.rope_scale_factor = 8.0f;
  ASSERT_TRUE(ApplyRopeOverrides(o, 98304, &c).ok());
  EXPECT_FLOAT_EQ(c.rope_scale_factor, 8.0f);
  // "none" switches a file's scaling off.
  o.scaling = RopeScaling::kNone;
  ASSERT_TRUE(ApplyRopeOverrides(o, 98304, &c).ok());
  EXPECT_EQ(c.rope_scaling, RopeScaling::kNone);
  EXPECT_FLOAT_EQ(c.rope_scale_factor, 1.0f);

  std::vector<RopeOverrides> bads(4);
  bads[0].scale_factor = 0.5f;
  bads[1].freq_base = -1.0f;
  bads[2].orig_ctx = -5;
  bads[3].yarn_beta_slow = -1.0f;
  for (const RopeOverrides& bad : bads) {
    c = base;
    const Status s = ApplyRopeOverrides(bad, 0, &c);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_EQ(s.message().rfind("RoPE: ", 0), 0u) << s.message();
  }
}

TEST(ModelTest, LoadErrors) {
  EXPECT_EQ(Model::Load(nullptr).status().code(), StatusCode::kInvalidArgument);
  REQUIRE_REF(file, "ref-llama-f16");
  ModelOptions bad;
  bad.threads = -1;
  EXPECT_EQ(Model::Load(file, bad).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tierkv
