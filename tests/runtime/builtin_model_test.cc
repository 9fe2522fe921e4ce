// tests/runtime/builtin_model_test.cc
//
// builtin:tiny-moe: built deterministically through the GGUF writer and the strict
// parser, the shape docs/builtin-models.md describes, skewed expert popularity, `info`,
// a full paged session through RunSession, and the errors (unknown name, a weight page
// that cannot fit the compute tier).
#include "runtime/builtin_model.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <span>

#include <gtest/gtest.h>

#include "runtime/cli/info_command.h"
#include "runtime/gguf_writer.h"
#include "runtime/model.h"
#include "runtime/cli/run_report_json.h"
#include "runtime/run.h"
#include "tests/memory/mm_test_util.h"

namespace tierkv {
namespace {

TEST(GgufWriterTest, RoundTripsThroughTheParser) {
  GgufWriter w;
  std::vector<uint8_t> data(3 * 4 * sizeof(float));
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7);
  w.String("general.architecture", "x").U32("x.n", 7).F32("x.f", 0.5f).Bool("x.b", true);
  w.Tensor("t.weight", GgmlType::kF32, {4, 3}, data);
  w.Tensor("u.weight", GgmlType::kF32, {5}, std::vector<uint8_t>(5 * sizeof(float), 1));
  auto f = GgufFile::ParseOwned(w.Finish(), "mem");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->path(), "mem");
  EXPECT_EQ((*f)->GetU32("x.n").value(), 7u);
  EXPECT_EQ((*f)->GetF32("x.f").value(), 0.5f);
  EXPECT_TRUE((*f)->GetBool("x.b").value());
  const GgufTensor* t = (*f)->FindTensor("t.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->ne[0], 4);
  EXPECT_EQ(t->ne[1], 3);
  EXPECT_EQ(std::memcmp(t->data, data.data(), data.size()), 0);
  const GgufTensor* u = (*f)->FindTensor("u.weight");
  ASSERT_NE(u, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(u->data) % 32, reinterpret_cast<uintptr_t>((*f)->base()) % 32);
}

TEST(GgufWriterTest, WrongDataSizeIsRefusedByTheParser) {
  GgufWriter w;
  w.String("general.architecture", "x");
  w.Tensor("t.weight", GgmlType::kF32, {4, 3}, std::vector<uint8_t>(4));  // 4 of 48 bytes
  EXPECT_FALSE(GgufFile::ParseOwned(w.Finish(), "mem").ok());
}

TEST(BuiltinModelTest, TinyMoeIsDeterministicAndShapedAsDocumented) {
  auto a = BuildBuiltinModel("tiny-moe");
  auto b = BuildBuiltinModel("tiny-moe");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok());
  ASSERT_EQ((*a)->file_size(), (*b)->file_size());
  EXPECT_EQ(std::memcmp((*a)->base(), (*b)->base(), (*a)->file_size()), 0);
  EXPECT_EQ((*a)->path(), "builtin:tiny-moe");
  auto cfg = ReadModelConfig(**a);
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->arch, ModelArch::kQwen3Moe);
  EXPECT_EQ(cfg->n_layer, 4);
  EXPECT_EQ(cfg->n_embd, 256);
  EXPECT_EQ(cfg->n_head, 8);
  EXPECT_EQ(cfg->n_head_kv, 2);
  EXPECT_EQ(cfg->head_dim, 64);
  EXPECT_EQ(cfg->n_expert, 32);
  EXPECT_EQ(cfg->n_expert_used, 4);
  EXPECT_EQ(cfg->n_vocab, 258);
  EXPECT_EQ(cfg->context_length, 262144);
  EXPECT_TRUE(cfg->qk_norm);
}

TEST(BuiltinModelTest, UnknownNameListsTheBuiltins) {
  auto f = OpenModelFile("builtin:huge");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  EXPECT_NE(f.status().message().find("builtin:tiny-moe"), std::string::npos) << f.status().message();
}

TEST(BuiltinModelTest, InfoDescribesIt) {
  auto text = RunInfo("builtin:tiny-moe", {});
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_NE(text->find("qwen3moe"), std::string::npos);
  EXPECT_NE(text->find("blk.3.ffn_down_exps.weight"), std::string::npos);
  EXPECT_NE(text->find("tierkv tiny-moe"), std::string::npos);
}

// builtin:tiny-moe on two threads with a q8_0 KV cache on a 64 MiB host tier.
struct TinyMoe {
  testing::TempDir dir;
  std::unique_ptr<Model> model;
  std::unique_ptr<MemoryManager> mm;
  std::unique_ptr<KvCache> cache;
  SeqId seq;

  void Start() {
    ModelOptions mo;
    mo.threads = 2;
    auto loaded = Model::Load(BuildBuiltinModel("tiny-moe").value(), mo);
    ASSERT_TRUE(loaded.ok());
    model = std::move(loaded).value();
    testing::SmallTiers s;
    s.frame_bytes = 64 * 1024;
    s.device_frames = 0;
    s.host_frames = 1024;
    s.disk_frames = 0;
    mm = testing::MakeManager(s, dir.path());
    auto made = KvCache::Create(mm.get(), model->KvGeometryFor(KvCodec::kQ8_0));
    ASSERT_TRUE(made.ok());
    cache = std::move(made).value();
    seq = cache->NewSequence();
  }
  ~TinyMoe() {
    cache.reset();
    model.reset();
  }
};

// Routing over a token stream: low expert ids are chosen more often than high ones.
TEST(BuiltinModelTest, ExpertPopularityIsSkewed) {
  TinyMoe r;
  ASSERT_NO_FATAL_FAILURE(r.Start());
  std::vector<RouteRecord> trace;
  r.model->set_route_trace(&trace);
  const std::string text = "The quick brown fox jumps over the lazy dog; 0123456789. ";
  std::vector<float> logits(258);
  for (int pos = 0; pos < 120; ++pos) {
    const int32_t token = static_cast<unsigned char>(text[static_cast<size_t>(pos) % text.size()]);
    ASSERT_TRUE(r.model->Forward(*r.cache, r.seq, token, pos, logits).ok());
  }
  std::vector<int> count(32, 0);
  for (const RouteRecord& r : trace) for (int e : r.experts) ++count[static_cast<size_t>(e)];
  int low = 0, high = 0;
  for (int e = 0; e < 8; ++e) low += count[static_cast<size_t>(e)];
  for (int e = 24; e < 32; ++e) high += count[static_cast<size_t>(e)];
  EXPECT_GT(low, 2 * high) << "experts 0-7 chosen " << low << " times, 24-31 " << high;
}

// A prefill in chunks routes every token as one Forward per token does; its routing
// trace has one record per token and layer, with a prediction for each chunk's last
// token only (the one it was made for).
TEST(BuiltinModelTest, ChunkedPrefillRoutesLikeOneTokenAtATime) {
  const std::string text = "The quick brown fox jumps over the lazy dog; 0123456789. ";
  std::vector<int32_t> ids;
  for (size_t i = 0; i < 40; ++i) ids.push_back(static_cast<unsigned char>(text[i % text.size()]));
  constexpr int kChunk = 16;
  std::vector<RouteRecord> traces[2];
  for (int chunked = 0; chunked < 2; ++chunked) {
    TinyMoe r;
    ASSERT_NO_FATAL_FAILURE(r.Start());
    r.model->set_route_trace(&traces[chunked]);
    std::vector<float> logits(258);
    for (int pos = 0; pos < static_cast<int>(ids.size());) {
      const int n = chunked ? std::min(kChunk, static_cast<int>(ids.size()) - pos) : 1;
      const Status st = chunked ? r.model->ForwardBatch(*r.cache, r.seq, std::span(ids).subspan(pos, n), pos, {}, {})
                                : r.model->Forward(*r.cache, r.seq, ids[static_cast<size_t>(pos)], pos, logits);
      ASSERT_TRUE(st.ok()) << st.ToString();
      pos += n;
    }
  }
  ASSERT_EQ(traces[0].size(), ids.size() * 4);
  ASSERT_EQ(traces[1].size(), traces[0].size());
  auto by_pos = [](const RouteRecord& a, const RouteRecord& b) {
    return a.pos != b.pos ? a.pos < b.pos : a.layer < b.layer;
  };
  std::stable_sort(traces[1].begin(), traces[1].end(), by_pos);
  for (size_t i = 0; i < traces[0].size(); ++i) {
    const RouteRecord& one = traces[0][i];
    const RouteRecord& chunk = traces[1][i];
    ASSERT_EQ(chunk.pos, one.pos);
    ASSERT_EQ(chunk.layer, one.layer);
    EXPECT_EQ(chunk.experts, one.experts) << "pos " << one.pos << " layer " << one.layer;
    const bool last_of_chunk = one.pos % kChunk == kChunk - 1 || one.pos + 1 == static_cast<int>(ids.size());
    EXPECT_FALSE(one.predicted.empty()) << "every layer of a step is predicted (layer 0 from the embedding)";
    EXPECT_EQ(chunk.predicted.empty(), !last_of_chunk) << "pos " << one.pos;
    if (last_of_chunk) {
      EXPECT_EQ(chunk.predicted, one.predicted) << "pos " << one.pos;
    }
  }
}

// A short tiny-moe run with a session file in dir (mlock off, two threads).
RunOptions TinyMoeSession(const testing::TempDir& dir, int n_predict) {
  RunOptions o;
  o.model = "builtin:tiny-moe";
  o.prompt = "Once upon a time, in a tiered memory,";
  o.n_predict = n_predict;
  o.threads = 2;
  o.memory.mlock = MlockMode::kOff;
  o.session = dir.path() + "/s.tkv";
  return o;
}

TEST(BuiltinModelTest, PagedSessionRunsAndReportsTheDecoder) {
  testing::TempDir dir;
  RunOptions o = TinyMoeSession(dir, 16);
  o.memory.frame_bytes = 64 * 1024;
  o.memory.device = DeviceKind::kSim;
  o.memory.device_bytes = 8 << 20;
  o.memory.host_bytes = 64 << 20;
  auto r = RunSession(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->generated_tokens.size(), 16u);
  EXPECT_GT(r->decoder.expert_acquires, 0u);
  EXPECT_GT(r->decoder.weight_acquires, 0u);
  EXPECT_GT(r->decoder.prefetched_pages, 0u);
  const nlohmann::json j = RunReportJson(*r);
  EXPECT_TRUE(j.contains("decoder"));
  EXPECT_EQ(j["tiers"].size(), 2u);  // device (sim) and host
  EXPECT_EQ(j["weights"], "paged");  // auto, with a device tier
  // The same run with weights read in place gives the same tokens.
  RunOptions m = o;
  m.weights = RunOptions::Weights::kMapped;
  m.prefetch = false;
  m.session.clear();
  auto r2 = RunSession(m);
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(r2->generated_tokens, r->generated_tokens);
  EXPECT_FALSE(r2->paged_weights);
  EXPECT_EQ(r2->decoder.weight_acquires, 0u);
}

// --weights auto with a host tier alone: tiny-moe's weight pages (34.3 MiB in 256 KiB
// frames) are paged when they and the context's KV cache fit the host budget, and read
// in place when they do not (pages that do not fit would be copied out of the mapping
// again for every token); a disk tier, or an explicit --weights paged, pages them
// anyway. The tokens are the same every way.
TEST(BuiltinModelTest, AutoWeightsPagesOnlyWhatTheHostBudgetHolds) {
  testing::TempDir dir;
  RunOptions o = TinyMoeSession(dir, 4);
  o.session.clear();
  o.memory.frame_bytes = 256 * 1024;
  o.memory.host_bytes = 64 << 20;
  auto roomy = RunSession(o);
  ASSERT_TRUE(roomy.ok()) << roomy.status().ToString();
  EXPECT_TRUE(roomy->paged_weights);
  EXPECT_GT(roomy->decoder.weight_acquires, 0u);

  o.memory.host_bytes = 32 << 20;
  auto tight = RunSession(o);
  ASSERT_TRUE(tight.ok()) << tight.status().ToString();
  EXPECT_FALSE(tight->paged_weights);
  EXPECT_EQ(tight->decoder.weight_acquires, 0u);
  EXPECT_EQ(tight->generated_tokens, roomy->generated_tokens);

  o.memory.disk_bytes = 64 << 20;
  o.memory.disk_dir = dir.path();
  auto tiered = RunSession(o);
  ASSERT_TRUE(tiered.ok()) << tiered.status().ToString();
  EXPECT_TRUE(tiered->paged_weights);
  EXPECT_EQ(tiered->generated_tokens, roomy->generated_tokens);

  o.memory.disk_bytes = 0;
  o.weights = RunOptions::Weights::kPaged;
  auto forced = RunSession(o);
  ASSERT_TRUE(forced.ok()) << forced.status().ToString();
  EXPECT_TRUE(forced->paged_weights);
  EXPECT_EQ(forced->generated_tokens, roomy->generated_tokens);
}

// --frame auto: the rule (long contexts on big budgets with little rounding loss in the
// weight pages get 1 MiB frames; everything else 256 KiB; a session file's block size
// wins), and a session made with 1 MiB frames restored by a short auto-framed run.
TEST(BuiltinModelTest, AutoFrameRule) {
  constexpr uint64_t kKiB = 1024, kMiB = 1024 * 1024;
  MemoryOptions m;  // no Device, no Disk
  m.host_bytes = 1024 * kMiB;
  EXPECT_EQ(AutoFrameBytes(4096, m, 0, 0, 0), 256 * kKiB) << "short context";
  EXPECT_EQ(AutoFrameBytes(kAutoFrameLongContext, m, 0, 0, 0), kMiB);
  EXPECT_EQ(AutoFrameBytes(200000, m, 100 * kMiB, 164 * kMiB, 0), kMiB) << "rounding adds 1/16 of 1 GiB";
  EXPECT_EQ(AutoFrameBytes(200000, m, 100 * kMiB, 165 * kMiB, 0), 256 * kKiB) << "more: small pages";
  MemoryOptions dev = m;
  dev.device = DeviceKind::kSim;
  dev.device_bytes = 4 * kMiB;
  EXPECT_EQ(AutoFrameBytes(190000, dev, 0, 0, 0), 256 * kKiB) << "a 4 MiB device";
  dev.device_bytes = 64 * kMiB;
  EXPECT_EQ(AutoFrameBytes(190000, dev, 0, 0, 0), kMiB);
  EXPECT_EQ(AutoFrameBytes(190000, dev, 10 * kMiB, 15 * kMiB, 0), 256 * kKiB) << "5 MiB more > 64 MiB / 16";
  MemoryOptions disk = m;
  disk.disk_bytes = 32 * kMiB;
  EXPECT_EQ(AutoFrameBytes(190000, disk, 0, 0, 0), 256 * kKiB) << "a small disk tier";
  MemoryOptions host = m;
  host.host_bytes = 48 * kMiB;
  EXPECT_EQ(AutoFrameBytes(190000, host, 0, 0, 0), 256 * kKiB) << "a small host tier";
  // A session's blocks decide, whatever the context.
  EXPECT_EQ(AutoFrameBytes(10, m, 0, 0, kMiB), kMiB);
  EXPECT_EQ(AutoFrameBytes(200000, m, 0, 0, 300 * kKiB), 512 * kKiB);
  EXPECT_EQ(AutoFrameBytes(200000, m, 0, 0, 8 * kKiB), 64 * kKiB);
  EXPECT_EQ(AutoFrameBytes(10, m, 0, 0, 5 * kMiB), 4 * kMiB);

  testing::TempDir dir;
  RunOptions o = TinyMoeSession(dir, 4);
  o.memory.host_bytes = 128 * kMiB;
  o.memory.frame_bytes = kMiB;
  auto first = RunSession(o);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->frame_bytes, kMiB);
  RunOptions again = o;
  again.auto_frame = true;  // a short context alone would pick 256 KiB
  again.memory.frame_bytes = 256 * kKiB;
  auto second = RunSession(again);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->frame_bytes, kMiB) << "the session's frame";
  EXPECT_GT(second->reused_prefix_tokens, 0);
  EXPECT_EQ(RunReportJson(*second)["frame_bytes"], kMiB);
  RunOptions fresh = again;
  fresh.session.clear();
  auto third = RunSession(fresh);
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  EXPECT_EQ(third->frame_bytes, 256 * kKiB) << "no session, short context";
  EXPECT_EQ(third->generated_tokens, first->generated_tokens) << "the frame changes no token";
}

TEST(BuiltinModelTest, AWeightPageLargerThanTheComputeTierIsRefused) {
  std::shared_ptr<const GgufFile> file = BuildBuiltinModel("tiny-moe").value();
  auto model = Model::Load(file, {});
  ASSERT_TRUE(model.ok());
  testing::TempDir dir;
  testing::SmallTiers s;
  s.frame_bytes = 64 * 1024;
  s.device_frames = 2;  // 128 KiB: a layer page (~350 KiB) does not fit
  s.host_frames = 1024;
  auto mm = testing::MakeManager(s, dir.path());
  Status st = (*model)->UseMemory(mm.get());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("layer 0's weights"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("device"), std::string::npos) << st.message();
  EXPECT_EQ(mm->live_pages(), 0u) << "nothing registered";
}

}  // namespace
}  // namespace tierkv
