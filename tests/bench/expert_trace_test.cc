// tests/bench/expert_trace_test.cc
//
// Expert traces: CSV round trip and one-line errors, replay counts on hand-made traces
// with known answers (per policy, with and without prefetch), the synthetic generator's
// skew, locality and prediction accuracy, and determinism.
#include "bench/tools/expert_trace.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace tierkv::tools {
namespace {

ExpertTrace Shape(int32_t n_layer, int32_t n_expert, int32_t n_used, uint64_t expert_bytes = 8192) {
  ExpertTrace t;
  t.n_layer = n_layer;
  t.n_expert = n_expert;
  t.n_used = n_used;
  t.expert_bytes = expert_bytes;
  return t;
}

// One layer, one expert used per token: the experts in `seq`, one token each.
ExpertTrace OneLayer(int32_t n_expert, const std::vector<int32_t>& seq) {
  ExpertTrace t = Shape(1, n_expert, 1);
  for (size_t i = 0; i < seq.size(); ++i) t.steps.push_back({static_cast<int32_t>(i), 0, {seq[i]}, {}});
  return t;
}

ReplayResult Replay(const ExpertTrace& t, PolicyKind policy, bool prefetch, uint64_t budget) {
  ReplayOptions o;
  o.policy = policy;
  o.prefetch = prefetch;
  o.budget_pages = budget;
  Result<ReplayResult> r = ReplayExpertTrace(t, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : ReplayResult{};
}

TEST(ExpertTraceCsv, RoundTrip) {
  ExpertTrace t = Shape(2, 8, 2, 208896);
  t.steps = {{0, 0, {3, 1}, {}}, {0, 1, {7, 0}, {7, 2}}, {1, 0, {5, 4}, {}}, {1, 1, {2, 6}, {6, 2}}};
  const std::string csv = FormatExpertTraceCsv(t);
  EXPECT_EQ(csv.substr(0, csv.find('\n')), "n_layer=2,n_expert=8,n_used=2,expert_bytes=208896");
  EXPECT_NE(csv.find("\n0,1,7 0,7 2\n"), std::string::npos) << csv;
  Result<ExpertTrace> back = ParseExpertTraceCsv(csv);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->n_layer, 2);
  EXPECT_EQ(back->n_expert, 8);
  EXPECT_EQ(back->n_used, 2);
  EXPECT_EQ(back->expert_bytes, 208896u);
  ASSERT_EQ(back->steps.size(), t.steps.size());
  for (size_t i = 0; i < t.steps.size(); ++i) {
    EXPECT_EQ(back->steps[i].pos, t.steps[i].pos);
    EXPECT_EQ(back->steps[i].layer, t.steps[i].layer);
    EXPECT_EQ(back->steps[i].experts, t.steps[i].experts);
    EXPECT_EQ(back->steps[i].predicted, t.steps[i].predicted);
  }
  EXPECT_EQ(CountTokens(*back), 2u);

  // Through a file, and a synthetic trace too.
  SyntheticTraceOptions so;
  so.tokens = 50;
  Result<ExpertTrace> syn = SyntheticSkewedTrace(so);
  ASSERT_TRUE(syn.ok()) << syn.status().ToString();
  const std::string path = std::filesystem::temp_directory_path() / ("tierkv-expert-trace-" + std::to_string(getpid()) + ".csv");
  ASSERT_TRUE(WriteExpertTraceCsv(*syn, path).ok());
  Result<ExpertTrace> read = ReadExpertTraceCsv(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(FormatExpertTraceCsv(*read), FormatExpertTraceCsv(*syn));
}

TEST(ExpertTraceCsv, CommentsBlankLinesAndCrlfAreAccepted) {
  Result<ExpertTrace> t =
      ParseExpertTraceCsv("# made by hand\r\n\r\nn_layer=1, n_expert=4, n_used=2, expert_bytes=100\r\n0,0,1  2,\r\n\n1,0,3 0,\n");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->steps.size(), 2u);
  EXPECT_EQ(t->steps[0].experts, (std::vector<int32_t>{1, 2}));
  EXPECT_TRUE(t->steps[1].predicted.empty());
}

TEST(ExpertTraceCsv, MalformedInputGivesOneLineErrors) {
  const std::string header = "n_layer=2,n_expert=4,n_used=2,expert_bytes=100\n";
  struct Case {
    std::string text;
    std::string expect;  // a substring of the message
  };
  const std::vector<Case> cases = {
      {"", "empty trace"},
      {"0,0,1 2,\n", "t.csv:1: header field 1 must be n_layer"},
      {"n_layer=2,n_expert=4,n_used=2\n", "t.csv:1: expected the header"},
      {"n_layer=2,n_expert=4,n_used=x,expert_bytes=100\n", "t.csv:1: header n_used is not a valid number"},
      {"n_layer=2,n_expert=4,n_used=5,expert_bytes=100\n", "t.csv:1: n_used must be in [1, n_expert]"},
      {"n_layer=0,n_expert=4,n_used=2,expert_bytes=100\n", "n_layer must be at least 1"},
      {header + "0,0,1 2\n", "t.csv:2: expected 4 fields"},
      {header + "0,0,1 2,,\n", "t.csv:2: expected 4 fields"},
      {header + "a,0,1 2,\n", "t.csv:2: pos is not a number"},
      {header + "0,-1,1 2,\n", "t.csv:2: layer -1 is outside [0, 2)"},
      {header + "0,2,1 2,\n", "layer 2 is outside"},
      {header + "0,0,1 x,\n", "t.csv:2: experts must be space-separated ids"},
      {header + "0,0,1,\n", "1 experts chosen, n_used is 2"},
      {header + "0,0,1 4,\n", "chosen expert 4 is outside [0, 4)"},
      {header + "0,0,1 1,\n", "chosen expert 1 appears twice"},
      {header + "0,1,1 2,3 3\n", "predicted expert 3 appears twice"},
      {header + "0,1,1 2,0 1 2 3 0\n", "5 experts predicted"},
      {header + "0,1,1 2,\n0,0,1 2,\n", "t.csv:3: layer 0 of pos 0 comes after layer 1"},
  };
  for (const Case& c : cases) {
    Result<ExpertTrace> t = ParseExpertTraceCsv(c.text, "t.csv");
    ASSERT_FALSE(t.ok()) << "accepted: " << c.text;
    EXPECT_NE(t.status().message().find(c.expect), std::string::npos) << t.status().message();
    EXPECT_EQ(t.status().message().find('\n'), std::string::npos) << t.status().message();
  }
  EXPECT_EQ(ReadExpertTraceCsv("/nonexistent/trace.csv").status().code(), StatusCode::kNotFound);
}

TEST(ExpertTraceReplay, OnePageAlternatingExpertsNeverHits) {
  const ExpertTrace t = OneLayer(4, {0, 1, 0, 1, 0, 1, 0, 1});
  for (PolicyKind p : {PolicyKind::kLru, PolicyKind::kDecayedLfu, PolicyKind::kTwoQ}) {
    const ReplayResult r = Replay(t, p, false, 1);
    EXPECT_EQ(r.acquires, 8u) << PolicyName(p);
    EXPECT_EQ(r.hits, 0u) << PolicyName(p);
    EXPECT_EQ(r.misses, 8u) << PolicyName(p);
    EXPECT_EQ(r.tokens, 8u);
    EXPECT_EQ(r.bytes_in, 8u * 8192u) << PolicyName(p);
    EXPECT_DOUBLE_EQ(r.bytes_moved_per_token, 8192.0);
    EXPECT_DOUBLE_EQ(r.hit_rate, 0.0);
  }
}

TEST(ExpertTraceReplay, RepeatedExpertHitsAfterTheFirstMiss) {
  const ExpertTrace t = OneLayer(4, {2, 2, 2, 2, 2});
  for (PolicyKind p : {PolicyKind::kLru, PolicyKind::kDecayedLfu, PolicyKind::kTwoQ}) {
    const ReplayResult r = Replay(t, p, false, 1);
    EXPECT_EQ(r.hits, 4u) << PolicyName(p);
    EXPECT_EQ(r.misses, 1u) << PolicyName(p);
    EXPECT_DOUBLE_EQ(r.hit_rate, 0.8);
    EXPECT_EQ(r.bytes_in, 8192u) << PolicyName(p);
  }
  // Expert bytes are rounded up to whole 4 KiB frames in bytes moved.
  ExpertTrace odd = t;
  odd.expert_bytes = 5000;
  EXPECT_EQ(Replay(odd, PolicyKind::kLru, false, 1).bytes_in, 8192u);
}

TEST(ExpertTraceReplay, LruAndLfuDifferOnAKnownPattern) {
  // Budget 2, 0 0 0 1 2 1 2 0: LRU evicts 0 for 2 (misses 0 1 2 0: 4 hits of 8);
  // decayed LFU keeps the thrice-used 0 and thrashes 1 and 2 (misses 0 1 2 1 2: 3 hits).
  // Budget 2, 0 1 0 2 0 3 0: both keep 0 (misses 0 1 2 3: 3 hits).
  const ExpertTrace t = OneLayer(4, {0, 0, 0, 1, 2, 1, 2, 0});
  EXPECT_EQ(Replay(t, PolicyKind::kLru, false, 2).hits, 4u);
  EXPECT_EQ(Replay(t, PolicyKind::kDecayedLfu, false, 2).hits, 3u);
  const ExpertTrace u = OneLayer(4, {0, 1, 0, 2, 0, 3, 0});
  EXPECT_EQ(Replay(u, PolicyKind::kLru, false, 2).hits, 3u);
  EXPECT_EQ(Replay(u, PolicyKind::kDecayedLfu, false, 2).hits, 3u);
}

// Two layers, two experts of eight used, predictions for layer 1 copied from the truth.
ExpertTrace TwoLayerTrace(bool perfect_predictions, int tokens) {
  ExpertTrace t = Shape(2, 8, 2);
  for (int pos = 0; pos < tokens; ++pos) {
    const int32_t a = (pos * 3) % 8, b = (pos * 3 + 5) % 8;
    const int32_t c = (pos * 5 + 1) % 8, d = (pos * 5 + 2) % 8;
    t.steps.push_back({pos, 0, {a, b}, {}});
    std::vector<int32_t> pred = perfect_predictions ? std::vector<int32_t>{c, d} : std::vector<int32_t>{};
    t.steps.push_back({pos, 1, {c, d}, pred});
  }
  return t;
}

TEST(ExpertTraceReplay, PerfectPredictionsTurnLayerOneMissesIntoHits) {
  const ExpertTrace t = TwoLayerTrace(true, 40);
  ASSERT_DOUBLE_EQ(PredictionAccuracy(t), 1.0);
  for (PolicyKind p : {PolicyKind::kLru, PolicyKind::kDecayedLfu, PolicyKind::kTwoQ}) {
    const ReplayResult off = Replay(t, p, false, 4);
    const ReplayResult on = Replay(t, p, true, 4);
    EXPECT_EQ(on.prefetch_requests, 80u) << PolicyName(p);
    EXPECT_EQ(off.prefetch_requests, 0u);
    EXPECT_GE(on.hit_rate, off.hit_rate) << PolicyName(p);
    // Every layer-1 acquire hits: its pages were prefetched right before layer 0 ran,
    // and layer 0's two acquires cannot evict them from four pages (2 pinned at most).
    EXPECT_GE(on.hits, 80u) << PolicyName(p);
  }
  // Without predictions the prefetching replay is the plain one.
  const ExpertTrace none = TwoLayerTrace(false, 40);
  const ReplayResult a = Replay(none, PolicyKind::kLru, true, 4), b = Replay(none, PolicyKind::kLru, false, 4);
  EXPECT_EQ(a.hits, b.hits);
  EXPECT_EQ(a.bytes_in, b.bytes_in);
}

TEST(ExpertTraceReplay, RejectsBadInput) {
  ReplayOptions o;
  o.budget_pages = 0;
  EXPECT_FALSE(ReplayExpertTrace(OneLayer(4, {0}), o).ok());
  ExpertTrace bad = OneLayer(4, {0});
  bad.steps[0].experts = {9};
  o.budget_pages = 1;
  Result<ReplayResult> r = ReplayExpertTrace(bad, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("record 0"), std::string::npos) << r.status().message();
}

TEST(SyntheticTrace, PopularityIsZipfSkewedWithPerLayerRanks) {
  SyntheticTraceOptions o;
  o.seed = 7;
  o.tokens = 4000;
  o.locality = 0;  // independent tokens: frequencies follow the popularity alone
  o.zipf_exponent = 1.0;
  Result<ExpertTrace> t = SyntheticSkewedTrace(o);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE(ValidateExpertTrace(*t).ok());
  EXPECT_EQ(t->steps.size(), 4000u * 4u);
  EXPECT_EQ(CountTokens(*t), 4000u);
  std::vector<std::vector<int>> count(4, std::vector<int>(32, 0));
  for (const ExpertStep& s : t->steps) for (int32_t e : s.experts) ++count[static_cast<size_t>(s.layer)][static_cast<size_t>(e)];
  std::vector<int> top_expert;
  for (auto& c : count) {
    top_expert.push_back(static_cast<int>(std::max_element(c.begin(), c.end()) - c.begin()));
    std::vector<int> sorted = c;
    std::sort(sorted.rbegin(), sorted.rend());
    const double total = std::accumulate(sorted.begin(), sorted.end(), 0.0);
    const double top8 = std::accumulate(sorted.begin(), sorted.begin() + 8, 0.0);
    // Uniform would give 8/32 = 25%; Zipf(1) drawn 4 without replacement gives ~55%.
    EXPECT_GT(top8 / total, 0.45);
    EXPECT_LT(top8 / total, 0.70);
    // The most popular expert is chosen far more often than the least.
    EXPECT_GT(sorted.front(), 5 * std::max(sorted.back(), 1));
  }
  // Ranks are permuted per layer: not all layers share the same favourite.
  EXPECT_FALSE(std::all_of(top_expert.begin(), top_expert.end(), [&](int e) { return e == top_expert[0]; }));

  // Exponent 0 is uniform.
  o.zipf_exponent = 0;
  Result<ExpertTrace> flat = SyntheticSkewedTrace(o);
  ASSERT_TRUE(flat.ok());
  std::vector<int> c0(32, 0);
  for (const ExpertStep& s : flat->steps) if (s.layer == 0) for (int32_t e : s.experts) ++c0[static_cast<size_t>(e)];
  const auto [lo, hi] = std::minmax_element(c0.begin(), c0.end());
  EXPECT_LT(*hi, 2 * *lo);
}

TEST(SyntheticTrace, PredictionAccuracyAndLocalityAreAsAsked) {
  for (double acc : {0.0, 0.5, 0.8, 1.0}) {
    SyntheticTraceOptions o;
    o.seed = 3;
    o.tokens = 3000;
    o.prediction_accuracy = acc;
    Result<ExpertTrace> t = SyntheticSkewedTrace(o);
    ASSERT_TRUE(t.ok());
    EXPECT_NEAR(PredictionAccuracy(*t), acc, 0.02) << acc;
    for (const ExpertStep& s : t->steps) {
      EXPECT_EQ(s.predicted.empty(), s.layer == 0);
      if (s.layer > 0) {
        EXPECT_EQ(s.predicted.size(), 4u);
      }
    }
  }
  // Locality: the share of a token's experts that the previous token also chose.
  auto overlap = [](double locality) {
    SyntheticTraceOptions o;
    o.seed = 11;
    o.tokens = 3000;
    o.locality = locality;
    ExpertTrace t = *SyntheticSkewedTrace(o);
    size_t same = 0, total = 0;
    for (size_t i = 4; i < t.steps.size(); ++i) {
      for (int32_t e : t.steps[i].experts) {
        same += std::count(t.steps[i - 4].experts.begin(), t.steps[i - 4].experts.end(), e) > 0;
        ++total;
      }
    }
    return static_cast<double>(same) / static_cast<double>(total);
  };
  const double none = overlap(0), some = overlap(0.5), all = overlap(1.0);
  EXPECT_LT(none + 0.2, some);
  EXPECT_DOUBLE_EQ(all, 1.0);
}

TEST(SyntheticTrace, DeterministicPerSeedAndValidated) {
  SyntheticTraceOptions o;
  o.tokens = 200;
  o.seed = 5;
  const std::string a = FormatExpertTraceCsv(*SyntheticSkewedTrace(o));
  const std::string b = FormatExpertTraceCsv(*SyntheticSkewedTrace(o));
  o.seed = 6;
  const std::string c = FormatExpertTraceCsv(*SyntheticSkewedTrace(o));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);

  o.prediction_accuracy = 1.5;
  EXPECT_FALSE(SyntheticSkewedTrace(o).ok());
  o.prediction_accuracy = 0.5;
  o.n_used = 20;  // wrong predictions need 2 * n_used <= n_expert
  EXPECT_FALSE(SyntheticSkewedTrace(o).ok());
  o.n_used = 4;
  o.zipf_exponent = -1;
  EXPECT_FALSE(SyntheticSkewedTrace(o).ok());
}

TEST(ExpertTraceReplay, DeterministicAndPrefetchHelpsOnSkewedTrace) {
  SyntheticTraceOptions so;
  so.seed = 2;
  so.tokens = 400;
  so.prediction_accuracy = 1.0;
  const ExpertTrace t = *SyntheticSkewedTrace(so);
  const uint64_t budget = 4 * 32 / 4;
  for (PolicyKind p : {PolicyKind::kLru, PolicyKind::kDecayedLfu}) {
    const ReplayResult a = Replay(t, p, true, budget), b = Replay(t, p, true, budget);
    EXPECT_EQ(a.hits, b.hits);
    EXPECT_EQ(a.bytes_in, b.bytes_in);
    const ReplayResult off = Replay(t, p, false, budget);
    // With perfect predictions only layer 0 can miss.
    EXPECT_GT(a.hit_rate, off.hit_rate) << PolicyName(p);
    EXPECT_GE(a.hit_rate, 0.75) << PolicyName(p);
    EXPECT_EQ(a.acquires, 400u * 4u * 4u);
  }
}

// The oracle (Belady's MIN): known answers, and never below a demand-only policy.
TEST(ExpertTraceOracle, EvictsThePageNeededFurthestAhead) {
  // Budget 2, 0 1 2 0 1 2: LRU always evicts the page needed next (0 hits); MIN evicts 1
  // for 2 (0 hits next), then 0 (never again) for 1, and 2 hits: 2 hits.
  const ExpertTrace cyclic = OneLayer(4, {0, 1, 2, 0, 1, 2});
  EXPECT_EQ(Replay(cyclic, PolicyKind::kLru, false, 2).hits, 0u);
  const Result<ReplayResult> o = OracleReplay(cyclic, 2);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->hits, 2u);
  EXPECT_EQ(o->misses, 4u);
  EXPECT_EQ(o->bytes_in, 4u * 8192u);
  EXPECT_EQ(o->tokens, 6u);
  // 0 0 0 1 2 1 2 0 with 2 pages: 4 hits, as LRU (LruAndLfuDifferOnAKnownPattern).
  EXPECT_EQ(OracleReplay(OneLayer(4, {0, 0, 0, 1, 2, 1, 2, 0}), 2)->hits, 4u);
  // Room for every page: only first touches miss.
  EXPECT_EQ(OracleReplay(cyclic, 3)->misses, 3u);
  EXPECT_FALSE(OracleReplay(cyclic, 0).ok());
}

TEST(ExpertTraceOracle, BoundsEveryDemandOnlyPolicy) {
  SyntheticTraceOptions so;
  so.seed = 3;
  so.tokens = 300;
  const ExpertTrace t = *SyntheticSkewedTrace(so);
  for (uint64_t budget : {8u, 32u, 64u}) {
    const Result<ReplayResult> o = OracleReplay(t, budget);
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    for (PolicyKind p : {PolicyKind::kLru, PolicyKind::kTwoQ, PolicyKind::kDecayedLfu}) {
      const ReplayResult r = Replay(t, p, false, budget);
      EXPECT_EQ(o->acquires, r.acquires);
      EXPECT_GE(o->hits, r.hits) << PolicyName(p) << " budget " << budget;
    }
  }
}

}  // namespace
}  // namespace tierkv::tools
