// bench/tools/expertbench_command.cc
#include "bench/tools/expertbench_command.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "runtime/cli/cli_checks.h"
#include "kvcache/kv_cache.h"
#include "memory/memory_manager.h"
#include "runtime/builtin_model.h"
#include "runtime/cli/usage_command.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#include "runtime/tokenizer.h"

namespace tierkv {

const char* const kExpertbenchPrompt =
    "The expert pager keeps a quarter of the experts in fast memory. Each token asks every "
    "layer's router for four experts out of thirty-two; a hit costs nothing, a miss copies a "
    "whole expert from the slow tier before the layer can go on. The question is which experts "
    "to keep, and whether guessing the next layer's choice early pays for the copies it makes.";

namespace {

using tools::ExpertTrace;
using tools::ReplayOptions;
using tools::ReplayResult;

// Bytes of one expert page as Model::UseMemory lays it out: gate, up and down of one
// expert, the first two rounded up to 64 bytes (the largest over the layers).
Result<uint64_t> ExpertPageBytes(const GgufFile& file, const ModelConfig& c) {
  uint64_t max = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    uint64_t page = 0;
    const char* parts[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    for (int i = 0; i < 3; ++i) {
      const std::string name = "blk." + std::to_string(l) + "." + parts[i] + ".weight";
      const GgufTensor* t = nullptr;
      for (const GgufTensor& x : file.tensors()) if (x.name == name) t = &x;
      if (t == nullptr) return Status::NotFound("tensor " + name + " is missing");
      const uint64_t bytes = t->n_bytes / static_cast<uint64_t>(c.n_expert);
      page += i < 2 ? (bytes + 63) / 64 * 64 : bytes;
    }
    max = std::max(max, page);
  }
  return max;
}

// Decodes o.tokens positions of the model (the fixed prompt, then sampled tokens) with
// the decoder's expert prediction on and returns its routing trace. Weights are read in
// place: routing does not depend on where the weights live.
Result<ExpertTrace> RecordModelTrace(const ExpertbenchOptions& o) {
  TIERKV_ASSIGN_OR_RETURN(std::shared_ptr<const GgufFile> file, OpenModelFile(o.model));
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::FromGguf(*file));
  std::vector<int32_t> tokens = tok->Encode(kExpertbenchPrompt, /*add_special=*/true, /*parse_special=*/false);
  if (static_cast<int>(tokens.size()) > o.tokens) tokens.resize(static_cast<size_t>(o.tokens));

  MemoryOptions mo;
  mo.host_bytes = 64 * kMiB;  // the KV cache only
  mo.warmup = false;
  mo.mlock = MlockMode::kOff;
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<MemoryManager> mm, MemoryManager::Create(mo));
  ModelOptions opts;
  opts.threads = o.threads;
  opts.n_ctx = o.tokens;
  opts.prefetch = true;  // the decoder predicts the next layer's experts only with prefetch
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Load(file, opts));
  const ModelConfig& c = model->config();
  if (!c.is_moe()) return Status::InvalidArgument(o.model + " is not a mixture-of-experts model");
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache, KvCache::Create(mm.get(), model->KvGeometryFor(KvCodec::kF16)));

  std::vector<RouteRecord> records;
  model->set_route_trace(&records);
  const SeqId seq = cache->NewSequence();
  SamplerOptions sampling;  // llama.cpp's sampling defaults
  sampling.temperature = 0.8f;
  sampling.seed = o.seed;
  Sampler sampler(sampling);
  std::vector<float> logits(static_cast<size_t>(c.n_vocab));
  const int n_prompt = static_cast<int>(tokens.size());
  for (int pos = 0; pos < o.tokens; ++pos) {
    // Logits only where the next token is sampled from them.
    const bool want = pos >= n_prompt - 1 && pos + 1 < o.tokens;
    TIERKV_RETURN_IF_ERROR(model->Forward(*cache, seq, tokens[static_cast<size_t>(pos)], pos,
                                          want ? std::span<float>(logits) : std::span<float>()));
    if (want) tokens.push_back(sampler.Sample(logits));  // an end-of-text token is fed like any other
  }
  model->set_route_trace(nullptr);

  ExpertTrace t;
  t.n_layer = c.n_layer;
  t.n_expert = c.n_expert;
  t.n_used = c.n_expert_used;
  TIERKV_ASSIGN_OR_RETURN(t.expert_bytes, ExpertPageBytes(*file, c));
  t.steps.reserve(records.size());
  for (RouteRecord& r : records) t.steps.push_back({r.pos, r.layer, std::move(r.experts), std::move(r.predicted)});
  TIERKV_RETURN_IF_ERROR(tools::ValidateExpertTrace(t));
  return t;
}

struct Variant {
  const char* name;
  PolicyKind policy;
  bool prefetch;
  bool is_default;  // the decoder's default: decayed LFU + next-layer expert prefetch
};
constexpr Variant kVariants[] = {
    {"lru", PolicyKind::kLru, false, false},
    {"2q", PolicyKind::kTwoQ, false, false},
    {"lfu", PolicyKind::kDecayedLfu, false, false},
    {"lru+prefetch", PolicyKind::kLru, true, false},
    {"2q+prefetch", PolicyKind::kTwoQ, true, false},
    {"lfu+prefetch", PolicyKind::kDecayedLfu, true, true},
};

struct TraceReport {
  std::string name, source;
  const ExpertTrace* trace;
  double accuracy = 0;
  std::vector<ReplayResult> results;  // [kVariants]
  // The default's hit rate >= that of every policy without prefetch (the simple ones),
  // and >= that of every other variant (prefetch on LRU and 2Q too).
  bool default_beats_simple = false;
  bool default_best = false;
  ReplayResult oracle;  // Belady's MIN, demand only (tools::OracleReplay)
};

}  // namespace

Status RunExpertbench(const ExpertbenchOptions& o, std::FILE* out, std::FILE* err) {
  if (o.tokens < 2) return Status::InvalidArgument("--tokens must be at least 2");
  if (!(o.half_life > 0)) return Status::InvalidArgument("--half-life must be positive");
  if (!(o.budget_fraction > 0 && o.budget_fraction <= 1)) {
    return Status::InvalidArgument("--budget-fraction must be in (0, 1]");
  }
  const auto t0 = std::chrono::steady_clock::now();
  ExpertTrace model_trace;
  std::string model_source;
  if (!o.trace_path.empty()) {
    TIERKV_ASSIGN_OR_RETURN(model_trace, tools::ReadExpertTraceCsv(o.trace_path));
    model_source = o.trace_path;
  } else {
    TIERKV_ASSIGN_OR_RETURN(model_trace, RecordModelTrace(o));
    model_source = o.model + ", " + std::to_string(o.tokens) + " tokens, seed " + std::to_string(o.seed);
  }
  const double record_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!o.trace_out.empty()) TIERKV_RETURN_IF_ERROR(tools::WriteExpertTraceCsv(model_trace, o.trace_out));

  tools::SyntheticTraceOptions so;
  so.seed = o.seed;
  so.tokens = static_cast<int32_t>(tools::CountTokens(model_trace));
  so.n_layer = model_trace.n_layer;
  so.n_expert = model_trace.n_expert;
  so.n_used = model_trace.n_used;
  so.expert_bytes = model_trace.expert_bytes;
  so.zipf_exponent = o.zipf_exponent;
  so.prediction_accuracy = o.prediction_accuracy;
  so.locality = o.locality;
  TIERKV_ASSIGN_OR_RETURN(ExpertTrace synthetic, tools::SyntheticSkewedTrace(so));
  if (!o.synthetic_out.empty()) TIERKV_RETURN_IF_ERROR(tools::WriteExpertTraceCsv(synthetic, o.synthetic_out));

  const uint64_t n_pages = static_cast<uint64_t>(model_trace.n_layer) * static_cast<uint64_t>(model_trace.n_expert);
  const uint64_t budget = std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(o.budget_fraction * static_cast<double>(n_pages))));

  char buf[512];
  std::vector<TraceReport> reports;
  reports.push_back({o.trace_path.empty() ? o.model : "trace", model_source, &model_trace, 0, {}, false, false, {}});
  std::snprintf(buf, sizeof(buf), "zipf %.2f, accuracy %.2f, locality %.2f, seed %llu", o.zipf_exponent,
                o.prediction_accuracy, o.locality, static_cast<unsigned long long>(o.seed));
  reports.push_back({"synthetic", buf, &synthetic, 0, {}, false, false, {}});
  for (TraceReport& r : reports) {
    r.accuracy = tools::PredictionAccuracy(*r.trace);
    double best_simple = 0, best_other = 0, default_rate = 0;
    for (const Variant& v : kVariants) {
      ReplayOptions ro;
      ro.policy = v.policy;
      ro.prefetch = v.prefetch;
      ro.budget_pages = budget;
      ro.tiers = o.tiers;
      ro.timing = o.timing;
      ro.policy_options.half_life = o.half_life;
      Result<ReplayResult> res = tools::ReplayExpertTrace(*r.trace, ro);
      if (!res.ok()) return res.status().Annotate(r.name + " " + v.name);
      r.results.push_back(*res);
      if (v.is_default) default_rate = res->hit_rate;
      else best_other = std::max(best_other, res->hit_rate);
      if (!v.prefetch) best_simple = std::max(best_simple, res->hit_rate);
    }
    Result<ReplayResult> oracle = tools::OracleReplay(*r.trace, budget);
    if (!oracle.ok()) return oracle.status().Annotate(r.name + " oracle");
    r.oracle = *oracle;
    r.default_beats_simple = default_rate >= best_simple;
    r.default_best = default_rate >= best_other;
  }

  std::fprintf(err, "expert pages: %llu (%d layers x %d experts, %d used), %.1f KiB each; budget %llu pages (%.0f%%)\n",
               static_cast<unsigned long long>(n_pages), model_trace.n_layer, model_trace.n_expert, model_trace.n_used,
               static_cast<double>(model_trace.expert_bytes) / 1024.0, static_cast<unsigned long long>(budget),
               100.0 * static_cast<double>(budget) / static_cast<double>(n_pages));
  std::fprintf(err, "compute tier: %s; prefetch queued %s; decayed LFU half-life %g accesses\n",
               o.tiers == tools::ReplayTiers::kHost ? "host (CPU decoding)" : "device over host (GPU decoding)",
               o.timing == tools::PrefetchTiming::kBeforeLayer ? "before the layer (decoder)" : "after the layer's experts",
               o.half_life);
  if (o.trace_path.empty()) std::fprintf(err, "recorded %s in %.1f s\n", model_source.c_str(), record_s);
  std::fprintf(err, "%-18s %-14s %9s %14s %12s %14s %10s %10s\n", "trace", "policy", "hit rate", "bytes/token",
               "misses/tok", "prefetch/tok", "lost/tok", "pred acc");
  for (const TraceReport& r : reports) {
    for (size_t i = 0; i < r.results.size(); ++i) {
      const ReplayResult& x = r.results[i];
      const double tok = static_cast<double>(std::max<uint64_t>(x.tokens, 1));
      std::fprintf(err, "%-18s %-14s %8.1f%% %10.1f KiB %12.2f %14.2f %10.2f %9.1f%%%s\n", r.name.c_str(),
                   kVariants[i].name, 100.0 * x.hit_rate, x.bytes_moved_per_token / 1024.0,
                   static_cast<double>(x.misses) / tok, static_cast<double>(x.prefetch_requests) / tok,
                   static_cast<double>(x.prefetch_lost) / tok, 100.0 * r.accuracy,
                   kVariants[i].is_default ? "  (default)" : "");
    }
    const ReplayResult& x = r.oracle;
    const double tok = static_cast<double>(std::max<uint64_t>(x.tokens, 1));
    std::fprintf(err, "%-18s %-14s %8.1f%% %10.1f KiB %12.2f %14s %10s %10s  (bound for demand-only policies)\n",
                 r.name.c_str(), "oracle (MIN)", 100.0 * x.hit_rate, x.bytes_moved_per_token / 1024.0,
                 static_cast<double>(x.misses) / tok, "-", "-", "-");
  }
  for (const TraceReport& r : reports) {
    std::fprintf(err, "%s: the default (lfu+prefetch) %s every policy without prefetch; %s\n", r.name.c_str(),
                 r.default_beats_simple ? "beats" : "does NOT beat",
                 r.default_best ? "highest hit rate of all rows" : "NOT the highest hit rate of all rows");
  }

  if (o.json) {
    nlohmann::json j;
    j["budget_fraction"] = o.budget_fraction;
    j["tiers"] = o.tiers == tools::ReplayTiers::kHost ? "host" : "device";
    j["prefetch_timing"] = o.timing == tools::PrefetchTiming::kBeforeLayer ? "before" : "after";
    j["half_life"] = o.half_life;
    j["budget_pages"] = budget;
    j["expert_pages"] = n_pages;
    j["expert_bytes"] = model_trace.expert_bytes;
    nlohmann::json traces = nlohmann::json::array();
    for (const TraceReport& r : reports) {
      nlohmann::json rows = nlohmann::json::array();
      for (size_t i = 0; i < r.results.size(); ++i) {
        const ReplayResult& x = r.results[i];
        rows.push_back({{"policy", PolicyName(kVariants[i].policy)},
                        {"prefetch", kVariants[i].prefetch},
                        {"name", kVariants[i].name},
                        {"default", kVariants[i].is_default},
                        {"hit_rate", x.hit_rate},
                        {"bytes_moved_per_token", x.bytes_moved_per_token},
                        {"acquires", x.acquires},
                        {"hits", x.hits},
                        {"misses", x.misses},
                        {"bytes_in", x.bytes_in},
                        {"prefetch_requests", x.prefetch_requests},
                        {"prefetch_lost", x.prefetch_lost}});
      }
      traces.push_back({{"name", r.name},
                        {"source", r.source},
                        {"tokens", tools::CountTokens(*r.trace)},
                        {"n_layer", r.trace->n_layer},
                        {"n_expert", r.trace->n_expert},
                        {"n_used", r.trace->n_used},
                        {"prediction_accuracy", r.accuracy},
                        {"default_beats_simple", r.default_beats_simple},
                        {"default_best", r.default_best},
                        {"oracle", {{"hit_rate", r.oracle.hit_rate},
                                    {"bytes_moved_per_token", r.oracle.bytes_moved_per_token},
                                    {"misses", r.oracle.misses}}},
                        {"results", rows}});
    }
    j["traces"] = traces;
    std::fprintf(out, "%s\n", j.dump().c_str());
  }
  return Status::Ok();
}

void AddExpertbenchCommand(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ExpertbenchOptions>();
  CLI::App* sub = app.add_subcommand(
      "expertbench",
      "Compare expert-paging policies (LRU, 2Q, decayed LFU, each +/- next-layer prefetch) on a recorded MoE "
      "routing trace and a synthetic skewed one (docs/expertbench.md)");
  sub->add_option("-m,--model", o->model, "MoE model whose routing is recorded")->capture_default_str();
  sub->add_option("--tokens", o->tokens, "Positions decoded: the fixed prompt, then sampled tokens")
      ->check(tools::NonNegative())
      ->capture_default_str();
  sub->add_option("-s,--seed", o->seed, "Seed of the continuation sampler and of the synthetic trace")
      ->check(tools::NonNegative())
      ->capture_default_str();
  sub->add_option("-t,--threads", o->threads, "Kernel threads (0: all cores)")
      ->check(tools::NonNegative())
      ->capture_default_str();
  sub->add_option("--budget-fraction", o->budget_fraction, "Compute-tier budget as a share of all expert pages")
      ->capture_default_str();
  sub->add_option("--trace", o->trace_path, "Replay this CSV trace instead of recording the model");
  sub->add_option("--trace-out", o->trace_out, "Write the model trace as CSV");
  sub->add_option("--synthetic-out", o->synthetic_out, "Write the synthetic trace as CSV");
  sub->add_option("--zipf", o->zipf_exponent, "Synthetic: Zipf exponent of expert popularity")->capture_default_str();
  sub->add_option("--accuracy", o->prediction_accuracy, "Synthetic: probability a predicted expert is right")
      ->capture_default_str();
  sub->add_option("--locality", o->locality, "Synthetic: probability an expert is kept from the previous token")
      ->capture_default_str();
  sub->add_option("--tiers", o->tiers, "Compute tier: host (CPU decoding, default) or device (over a host tier)")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, tools::ReplayTiers>{{"host", tools::ReplayTiers::kHost},
                                                    {"device", tools::ReplayTiers::kDevice}}));
  sub->add_option("--prefetch-timing", o->timing,
                  "Queue layer l+1's predicted experts before layer l (decoder, default) or after its experts")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, tools::PrefetchTiming>{{"before", tools::PrefetchTiming::kBeforeLayer},
                                                       {"after", tools::PrefetchTiming::kAfterExperts}}));
  sub->add_option("--half-life", o->half_life, "Decayed LFU half-life in accesses")->capture_default_str();
  sub->add_flag("--json", o->json, "Print one JSON object on stdout");
  sub->callback([o, &exit_code] {
    o->threads = ThreadsWithinCpus(o->threads);
    Status st = RunExpertbench(*o, stdout, stderr);
    if (!st.ok()) {
      std::fprintf(stderr, "error: expertbench: %s\n", st.message().c_str());
      exit_code = tools::FailureExitCode(st);
      return;
    }
    exit_code = 0;
  });
}

}  // namespace tierkv
