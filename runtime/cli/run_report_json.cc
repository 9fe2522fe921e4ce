// runtime/cli/run_report_json.cc
#include "runtime/cli/run_report_json.h"

#include "kernels/quant.h"

namespace tierkv {
namespace {

nlohmann::json EntryJson(const LogitsEntry& e) {
  nlohmann::json top = nlohmann::json::array();
  for (const auto& [id, v] : e.top) top.push_back({id, v});
  return {{"pos", e.pos}, {"top", top}, {"logsumexp", e.logsumexp}};
}

}  // namespace

nlohmann::json RunReportJson(const RunReport& r) {
  nlohmann::json j;
  j["prompt_tokens"] = r.prompt_tokens;
  j["generated_tokens"] = r.generated_tokens;
  j["text"] = r.text;
  const auto rate = [](int n, double s) { return s > 0 ? n / s : 0.0; };
  j["timings"] = {{"warmup_s", r.warmup_s},
                  {"restore_s", r.restore_s},
                  {"prefill_s", r.prefill_s},
                  {"decode_s", r.decode_s},
                  {"prefill_tok_s", rate(r.prefill_tokens, r.prefill_s)},
                  {"decode_tok_s", rate(static_cast<int>(r.generated_tokens.size()), r.decode_s)}};
  nlohmann::json tj = nlohmann::json::array();
  // A tier's accesses and traffic between two snapshots of its counters.
  const auto traffic = [](const TierStats& a, const TierStats& b) {
    return nlohmann::json{{"hits", b.hits - a.hits},
                          {"misses", b.misses - a.misses},
                          {"bytes_read", b.bytes_read - a.bytes_read},
                          {"bytes_in", b.bytes_in - a.bytes_in},
                          {"bytes_out", b.bytes_out - a.bytes_out}};
  };
  for (size_t i = 0; i < r.tiers.size(); ++i) {
    const TierStats& t = r.tiers[i];
    if (!t.present) continue;
    nlohmann::json one = {{"name", TierName(t.tier)},
                          {"budget_bytes", t.budget_bytes},
                          {"used_bytes", t.used_bytes.current},
                          {"peak_bytes", t.used_bytes.peak},
                          {"hits", t.hits},
                          {"misses", t.misses},
                          {"bytes_read", t.bytes_read},
                          {"bytes_in", t.bytes_in},
                          {"bytes_out", t.bytes_out},
                          {"evictions", t.evictions},
                          {"backend", t.backend}};
    if (i < r.tiers_prefill_end.size() && i < r.tiers_prefill_start.size()) {
      one["prefill"] = traffic(r.tiers_prefill_start[i], r.tiers_prefill_end[i]);
      one["decode"] = traffic(r.tiers_prefill_end[i], t);
    }
    tj.push_back(std::move(one));
  }
  j["tiers"] = tj;
  const DecodeCounters& d = r.decoder;
  const auto ratio = [](uint64_t a, uint64_t b) { return b > 0 ? static_cast<double>(a) / static_cast<double>(b) : 0.0; };
  j["decoder"] = {{"steps", d.steps},
                  {"step_s", d.step_s},
                  {"wait_s", d.wait_s},
                  {"kv_wait_s", d.kv_wait_s},
                  {"weight_wait_s", d.weight_wait_s},
                  {"expert_wait_s", d.expert_wait_s},
                  {"compute_s", d.step_s - d.wait_s},
                  {"copy_busy_s", r.copy_busy_s},
                  {"kv_acquires", d.kv_acquires},
                  {"kv_hit_rate", ratio(d.kv_hits, d.kv_acquires)},
                  {"kv_read_through", d.kv_read_through},
                  {"kv_read_through_bytes", d.kv_read_through_bytes},
                  {"weight_acquires", d.weight_acquires},
                  {"weight_hit_rate", ratio(d.weight_hits, d.weight_acquires)},
                  {"expert_acquires", d.expert_acquires},
                  {"expert_hit_rate", ratio(d.expert_hits, d.expert_acquires)},
                  {"expert_prediction_recall", ratio(d.experts_chosen_in_prediction, d.experts_chosen_predicted)},
                  {"prefetched_pages", d.prefetched_pages}};
  j["expert_split"] = nullptr;
  if (r.hybrid_experts) {
    const ExpertSplitRates& e = r.expert_rates;
    const char* mode = r.expert_split == ModelOptions::ExpertSplit::kHost ? "host" : "auto";
    j["expert_split"] = {{"mode", mode},
                         {"on_device", d.experts_on_device},
                         {"copied", d.experts_copied},
                         {"on_host", d.experts_on_host},
                         {"admitted", d.experts_admitted},
                         {"rates_gbps", {{"copy", e.copy / 1e9},
                                         {"device", e.device / 1e9},
                                         {"host", e.host / 1e9},
                                         {"host_token", e.host_token / 1e9},
                                         {"device_token", e.device_token / 1e9}}}};
  }
  j["kv"] = {{"type", r.kv_type}, {"tokens", r.kv_tokens}, {"bytes", r.kv_bytes}, {"llama_sums", r.llama_sums}};
  j["rope"] = r.rope;
  j["weights"] = r.paged_weights ? "paged" : "mapped";
  j["chat"] = r.chat.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.chat);
  j["frame_bytes"] = r.frame_bytes;
  j["host_budget"] = r.host_budget;
  j["threads"] = r.threads;
  j["kernels"] = kernels::ActiveKernelsName();
  j["session"] = {{"path", r.session_path.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.session_path)},
                  {"restored_tokens", r.restored_tokens},
                  {"reused_prefix_tokens", r.reused_prefix_tokens},
                  {"saved", r.saved}};
  j["remote"] = nullptr;
  if (r.remote) {
    const RemoteStats& m = *r.remote;
    j["remote"] = {{"prompt_tokens", r.remote_tokens},        {"hit_blocks", m.hit_blocks},
                   {"miss_blocks", m.miss_blocks},             {"fetched_bytes", m.fetched_bytes},
                   {"fetch_s", m.fetch_us / 1e6},              {"verify_failures", m.verify_failures},
                   {"skipped_slower", m.skipped_slower},       {"published_blocks", m.published_blocks},
                   {"present_blocks", m.present_blocks},       {"dropped_blocks", m.dropped_blocks},
                   {"errors", m.errors},                       {"connected", m.connected}};
  }
  j["n_ctx"] = r.n_ctx;
  j["seed"] = r.seed;
  j["interrupted"] = r.interrupted;
  j["stopped"] = r.stopped;
  j["reverse_prompt"] = r.reverse_prompt;
  j["context_full"] = r.context_full;
  j["stop_reason"] = StopReasonName(r.stop_reason);
  j["output_failed"] = r.output_failed;
  if (!r.turns.empty()) {
    nlohmann::json tj2 = nlohmann::json::array();
    for (const TurnReport& t : r.turns) {
      tj2.push_back({{"input", t.input},
                     {"input_tokens", t.input_tokens},
                     {"generated", t.generated},
                     {"text", t.text},
                     {"reverse_prompt", t.reverse_prompt},
                     {"stop_reason", StopReasonName(t.stop_reason)}});
    }
    j["turns"] = tj2;
  }
  if (!r.logits.empty() || !r.steps.empty()) {
    nlohmann::json lj = nlohmann::json::array(), sj = nlohmann::json::array();
    for (const auto& e : r.logits) lj.push_back(EntryJson(e));
    for (const auto& e : r.steps) sj.push_back(EntryJson(e));
    j["logits"] = lj;
    j["steps"] = sj;
  }
  return j;
}

}  // namespace tierkv
