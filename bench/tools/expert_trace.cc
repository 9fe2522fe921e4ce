// bench/tools/expert_trace.cc
#include "bench/tools/expert_trace.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <span>
#include <set>
#include <sstream>
#include <unordered_map>

#include "memory/memory_manager.h"
#include "memory/page_source.h"
#include "memory/rng.h"
#include "memory/tier_backend.h"

namespace tierkv::tools {
namespace {

// What is wrong with one record, or "" (the per-record invariants of ExpertTrace).
std::string CheckStep(const ExpertTrace& t, const ExpertStep& s) {
  if (s.pos < 0) return "pos " + std::to_string(s.pos) + " is negative";
  if (s.layer < 0 || s.layer >= t.n_layer) {
    return "layer " + std::to_string(s.layer) + " is outside [0, " + std::to_string(t.n_layer) + ")";
  }
  if (static_cast<int64_t>(s.experts.size()) != t.n_used) {
    return std::to_string(s.experts.size()) + " experts chosen, n_used is " + std::to_string(t.n_used);
  }
  if (static_cast<int64_t>(s.predicted.size()) > t.n_expert) {
    return std::to_string(s.predicted.size()) + " experts predicted, n_expert is " + std::to_string(t.n_expert);
  }
  for (const auto* ids : {&s.experts, &s.predicted}) {
    const char* what = ids == &s.experts ? "chosen" : "predicted";
    for (size_t i = 0; i < ids->size(); ++i) {
      const int32_t e = (*ids)[i];
      if (e < 0 || e >= t.n_expert) {
        return std::string(what) + " expert " + std::to_string(e) + " is outside [0, " + std::to_string(t.n_expert) + ")";
      }
      if (std::find(ids->begin(), ids->begin() + static_cast<std::ptrdiff_t>(i), e) != ids->begin() + static_cast<std::ptrdiff_t>(i)) {
        return std::string(what) + " expert " + std::to_string(e) + " appears twice";
      }
    }
  }
  return "";
}

// Order within a token: layers strictly increase while pos stays the same.
std::string CheckOrder(const ExpertStep* prev, const ExpertStep& s) {
  if (prev != nullptr && prev->pos == s.pos && s.layer <= prev->layer) {
    return "layer " + std::to_string(s.layer) + " of pos " + std::to_string(s.pos) + " comes after layer " +
           std::to_string(prev->layer) + " (a token's layers must increase)";
  }
  return "";
}

std::string CheckShape(const ExpertTrace& t) {
  if (t.n_layer < 1) return "n_layer must be at least 1";
  if (t.n_expert < 1) return "n_expert must be at least 1";
  if (t.n_used < 1 || t.n_used > t.n_expert) return "n_used must be in [1, n_expert]";
  if (t.expert_bytes == 0) return "expert_bytes must be at least 1";
  return "";
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    const size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) return out;
    start = at + 1;
  }
}

template <typename T>
bool ParseNumber(std::string_view s, T* out) {
  s = Trim(s);
  if (s.empty()) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

// "3 17 5 9" -> ids; "" -> empty. False on anything else.
bool ParseIds(std::string_view s, std::vector<int32_t>* out) {
  out->clear();
  for (std::string_view tok : Split(Trim(s), ' ')) {
    if (tok.empty()) continue;  // repeated spaces, or an empty field
    int32_t v = 0;
    if (!ParseNumber(tok, &v)) return false;
    out->push_back(v);
  }
  return true;
}

void AppendIds(const std::vector<int32_t>& ids, std::string* out) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out->push_back(' ');
    *out += std::to_string(ids[i]);
  }
}

// An index drawn with probability weight[i] / sum over the indices not excluded.
// REQUIRES: some non-excluded index has positive weight.
int32_t WeightedDraw(SplitMix64& rng, const std::vector<double>& weight, const std::vector<bool>& excluded) {
  double total = 0;
  int32_t last = -1;
  for (size_t i = 0; i < weight.size(); ++i) {
    if (!excluded[i]) {
      total += weight[i];
      last = static_cast<int32_t>(i);
    }
  }
  double u = rng.Uniform() * total;
  for (size_t i = 0; i < weight.size(); ++i) {
    if (excluded[i]) continue;
    if (u < weight[i]) return static_cast<int32_t>(i);
    u -= weight[i];
  }
  return last;  // rounding at the top end
}

// Pages backed by nothing: reading one writes its key into the first bytes, so a pin's
// data says which expert it holds, and costs nothing else.
class CheapExpertSource : public PageSource {
 public:
  Status ReadPage(uint64_t key, std::span<std::byte> out) override {
    if (out.size() >= sizeof(key)) std::memcpy(out.data(), &key, sizeof(key));
    return Status::Ok();
  }
};

}  // namespace

Status ValidateExpertTrace(const ExpertTrace& trace) {
  if (std::string why = CheckShape(trace); !why.empty()) return Status::InvalidArgument("expert trace: " + why);
  const ExpertStep* prev = nullptr;
  for (size_t i = 0; i < trace.steps.size(); ++i) {
    const ExpertStep& s = trace.steps[i];
    std::string why = CheckStep(trace, s);
    if (why.empty()) why = CheckOrder(prev, s);
    if (!why.empty()) return Status::InvalidArgument("expert trace record " + std::to_string(i) + ": " + why);
    prev = &s;
  }
  return Status::Ok();
}

uint64_t CountTokens(const ExpertTrace& trace) {
  uint64_t n = 0;
  for (size_t i = 0; i < trace.steps.size(); ++i) {
    if (i == 0 || trace.steps[i].pos != trace.steps[i - 1].pos) ++n;
  }
  return n;
}

std::string FormatExpertTraceCsv(const ExpertTrace& trace) {
  std::string out = "n_layer=" + std::to_string(trace.n_layer) + ",n_expert=" + std::to_string(trace.n_expert) +
                    ",n_used=" + std::to_string(trace.n_used) + ",expert_bytes=" + std::to_string(trace.expert_bytes) +
                    "\n# pos,layer,experts,predicted\n";
  for (const ExpertStep& s : trace.steps) {
    out += std::to_string(s.pos) + "," + std::to_string(s.layer) + ",";
    AppendIds(s.experts, &out);
    out.push_back(',');
    AppendIds(s.predicted, &out);
    out.push_back('\n');
  }
  return out;
}

Result<ExpertTrace> ParseExpertTraceCsv(std::string_view text, const std::string& source) {
  ExpertTrace t;
  bool have_header = false;
  size_t line_no = 0;
  const ExpertStep* prev = nullptr;
  auto fail = [&](const std::string& what) {
    return Status::InvalidArgument(source + ":" + std::to_string(line_no) + ": " + what);
  };
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    const std::string_view line = Trim(text.substr(0, eol));
    text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
    ++line_no;
    if (line.empty() || line.front() == '#') continue;
    const std::vector<std::string_view> fields = Split(line, ',');
    if (!have_header) {
      static constexpr const char* kKeys[] = {"n_layer", "n_expert", "n_used", "expert_bytes"};
      if (fields.size() != 4) return fail("expected the header n_layer=L,n_expert=E,n_used=K,expert_bytes=B");
      uint64_t v[4] = {};
      for (int i = 0; i < 4; ++i) {
        const std::string_view f = Trim(fields[static_cast<size_t>(i)]);
        const size_t eq = f.find('=');
        if (eq == std::string_view::npos || Trim(f.substr(0, eq)) != kKeys[i]) {
          return fail("header field " + std::to_string(i + 1) + " must be " + kKeys[i] + "=<number>, not '" +
                      std::string(f) + "'");
        }
        if (!ParseNumber(f.substr(eq + 1), &v[i]) || (i < 3 && v[i] > INT32_MAX)) {
          return fail(std::string("header ") + kKeys[i] + " is not a valid number: '" + std::string(f.substr(eq + 1)) + "'");
        }
      }
      t.n_layer = static_cast<int32_t>(v[0]);
      t.n_expert = static_cast<int32_t>(v[1]);
      t.n_used = static_cast<int32_t>(v[2]);
      t.expert_bytes = v[3];
      if (std::string why = CheckShape(t); !why.empty()) return fail(why);
      have_header = true;
      continue;
    }
    if (fields.size() != 4) {
      return fail("expected 4 fields pos,layer,experts,predicted, found " + std::to_string(fields.size()));
    }
    ExpertStep s;
    if (!ParseNumber(fields[0], &s.pos)) return fail("pos is not a number: '" + std::string(Trim(fields[0])) + "'");
    if (!ParseNumber(fields[1], &s.layer)) return fail("layer is not a number: '" + std::string(Trim(fields[1])) + "'");
    if (!ParseIds(fields[2], &s.experts)) {
      return fail("experts must be space-separated ids, not '" + std::string(Trim(fields[2])) + "'");
    }
    if (!ParseIds(fields[3], &s.predicted)) {
      return fail("predicted must be space-separated ids, not '" + std::string(Trim(fields[3])) + "'");
    }
    std::string why = CheckStep(t, s);
    if (why.empty()) why = CheckOrder(prev, s);
    if (!why.empty()) return fail(why);
    t.steps.push_back(std::move(s));
    prev = &t.steps.back();
  }
  if (!have_header) return Status::InvalidArgument(source + ": empty trace (no header line)");
  return t;
}

Status WriteExpertTraceCsv(const ExpertTrace& trace, const std::string& path) {
  TIERKV_RETURN_IF_ERROR(ValidateExpertTrace(trace));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::IoError(path + ": cannot open for writing");
  const std::string text = FormatExpertTraceCsv(trace);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  if (!out) return Status::IoError(path + ": write failed");
  return Status::Ok();
}

Result<ExpertTrace> ReadExpertTraceCsv(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseExpertTraceCsv(ss.str(), path);
}

Result<ExpertTrace> SyntheticSkewedTrace(const SyntheticTraceOptions& o) {
  ExpertTrace t;
  t.n_layer = o.n_layer;
  t.n_expert = o.n_expert;
  t.n_used = o.n_used;
  t.expert_bytes = o.expert_bytes;
  if (std::string why = CheckShape(t); !why.empty()) return Status::InvalidArgument("synthetic trace: " + why);
  if (o.tokens < 0) return Status::InvalidArgument("synthetic trace: tokens must not be negative");
  if (!(o.zipf_exponent >= 0) || !std::isfinite(o.zipf_exponent)) {
    return Status::InvalidArgument("synthetic trace: the Zipf exponent must be >= 0");
  }
  if (!(o.prediction_accuracy >= 0 && o.prediction_accuracy <= 1)) {
    return Status::InvalidArgument("synthetic trace: the prediction accuracy must be in [0, 1]");
  }
  if (!(o.locality >= 0 && o.locality <= 1)) return Status::InvalidArgument("synthetic trace: locality must be in [0, 1]");
  if (o.n_used * 2 > o.n_expert && o.prediction_accuracy < 1) {
    // A wrong prediction must find an expert that is neither chosen nor predicted.
    return Status::InvalidArgument("synthetic trace: needs n_expert >= 2 * n_used for wrong predictions");
  }

  const auto n_expert = static_cast<size_t>(o.n_expert), n_used = static_cast<size_t>(o.n_used);
  SplitMix64 rng(o.seed);
  // weight[l][e]: popularity of expert e of layer l (the Zipf weight of its rank).
  std::vector<std::vector<double>> weight(static_cast<size_t>(o.n_layer), std::vector<double>(n_expert));
  for (auto& w : weight) {
    std::vector<int32_t> rank_to_id(n_expert);
    for (size_t r = 0; r < n_expert; ++r) rank_to_id[r] = static_cast<int32_t>(r);
    for (size_t i = n_expert - 1; i > 0; --i) std::swap(rank_to_id[i], rank_to_id[rng.Next() % (i + 1)]);  // Fisher-Yates
    for (size_t r = 0; r < n_expert; ++r) {
      w[static_cast<size_t>(rank_to_id[r])] = 1.0 / std::pow(static_cast<double>(r + 1), o.zipf_exponent);
    }
  }

  std::vector<std::vector<int32_t>> last(static_cast<size_t>(o.n_layer));  // previous token's choice
  std::vector<bool> taken(n_expert);
  t.steps.reserve(static_cast<size_t>(o.tokens) * static_cast<size_t>(o.n_layer));
  for (int32_t pos = 0; pos < o.tokens; ++pos) {
    for (int32_t l = 0; l < o.n_layer; ++l) {
      const std::vector<double>& w = weight[static_cast<size_t>(l)];
      ExpertStep s;
      s.pos = pos;
      s.layer = l;
      std::fill(taken.begin(), taken.end(), false);
      for (int32_t e : last[static_cast<size_t>(l)]) {
        if (rng.Uniform() < o.locality) {
          s.experts.push_back(e);
          taken[static_cast<size_t>(e)] = true;
        }
      }
      while (s.experts.size() < n_used) {
        const int32_t e = WeightedDraw(rng, w, taken);
        s.experts.push_back(e);
        taken[static_cast<size_t>(e)] = true;
      }
      last[static_cast<size_t>(l)] = s.experts;
      if (l > 0) {
        // taken == chosen here; it also collects the predictions as they are made.
        for (size_t i = 0; i < n_used; ++i) {
          const int32_t right = s.experts[i];
          if (rng.Uniform() < o.prediction_accuracy) {
            s.predicted.push_back(right);
          } else {
            const int32_t e = WeightedDraw(rng, w, taken);
            s.predicted.push_back(e);
            taken[static_cast<size_t>(e)] = true;
          }
        }
      }
      t.steps.push_back(std::move(s));
    }
  }
  return t;
}

double PredictionAccuracy(const ExpertTrace& trace) {
  uint64_t predicted = 0, used = 0;
  for (const ExpertStep& s : trace.steps) {
    predicted += s.predicted.size();
    for (int32_t p : s.predicted) used += std::count(s.experts.begin(), s.experts.end(), p) > 0 ? 1 : 0;
  }
  return predicted > 0 ? static_cast<double>(used) / static_cast<double>(predicted) : 0.0;
}

Result<ReplayResult> ReplayExpertTrace(const ExpertTrace& trace, const ReplayOptions& o) {
  TIERKV_RETURN_IF_ERROR(ValidateExpertTrace(trace));
  if (o.budget_pages == 0) return Status::InvalidArgument("replay: the budget must hold at least one expert page");

  // One frame per expert page (whole 4 KiB OS pages), so the arena holds exactly
  // budget_pages experts and bytes_in counts expert_bytes rounded up to 4 KiB.
  constexpr uint64_t kOsPage = 4096;
  const uint64_t frame_bytes = (trace.expert_bytes + kOsPage - 1) / kOsPage * kOsPage;
  const uint64_t n_pages = static_cast<uint64_t>(trace.n_layer) * static_cast<uint64_t>(trace.n_expert);
  const bool device = o.tiers == ReplayTiers::kDevice;
  HostBackendOptions host;
  host.bytes = (device ? n_pages : o.budget_pages) * frame_bytes;
  host.mlock = MlockMode::kOff;
  host.warmup = false;
  host.huge_pages = false;
  MemoryManager::Backends backends;
  TIERKV_ASSIGN_OR_RETURN(backends[TierIndex(Tier::kHost)], CreateHostBackend(host));
  if (device) {
    TIERKV_ASSIGN_OR_RETURN(backends[TierIndex(Tier::kDevice)],
                            CreateSimDeviceBackend({o.budget_pages * frame_bytes, /*gbps=*/0, /*warmup=*/false}));
  }
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<MemoryManager> mm,
                          MemoryManager::CreateWithBackends(std::move(backends), frame_bytes, o.policy, o.policy_options));
  const Tier tier = mm->compute_tier();
  const int32_t source = mm->AddSource(std::make_shared<CheapExpertSource>());
  // pages[layer * n_expert + expert]
  TIERKV_ASSIGN_OR_RETURN(std::vector<PageId> pages,
                          mm->RegisterBackedRange(trace.expert_bytes, source, /*first_key=*/0, n_pages));
  auto page_of = [&](int32_t layer, int32_t expert) {
    return pages[static_cast<size_t>(layer) * static_cast<size_t>(trace.n_expert) + static_cast<size_t>(expert)];
  };

  ReplayResult r;
  r.tokens = CountTokens(trace);
  const std::vector<ExpertStep>& steps = trace.steps;
  // Queues (and waits for) the prediction made for the record after steps[i].
  auto prefetch_next = [&](size_t i) -> Status {
    if (!o.prefetch || i + 1 >= steps.size()) return Status::Ok();
    const ExpertStep& s = steps[i];
    const ExpertStep& next = steps[i + 1];
    if (next.pos != s.pos || next.layer != s.layer + 1 || next.predicted.empty()) return Status::Ok();
    std::vector<PageId> want;
    for (int32_t e : next.predicted) want.push_back(page_of(next.layer, e));
    r.prefetch_requests += want.size();
    return mm->Prefetch(std::move(want), tier)
        .Wait()
        .Annotate("replay: prefetch for pos " + std::to_string(s.pos) + " layer " + std::to_string(next.layer));
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const ExpertStep& s = steps[i];
    if (o.timing == PrefetchTiming::kBeforeLayer) TIERKV_RETURN_IF_ERROR(prefetch_next(i));
    // A prediction for this record was queued only if the previous record is layer - 1.
    const bool was_predicted = o.prefetch && i > 0 && steps[i - 1].pos == s.pos && steps[i - 1].layer + 1 == s.layer;
    for (int32_t e : s.experts) {
      Result<Pin> pin = mm->Acquire(page_of(s.layer, e), tier);
      if (!pin.ok()) {
        return pin.status().Annotate("replay: pos " + std::to_string(s.pos) + " layer " + std::to_string(s.layer) +
                                     " expert " + std::to_string(e));
      }
      ++r.acquires;
      if (pin->hit()) {
        ++r.hits;
      } else if (was_predicted && std::find(s.predicted.begin(), s.predicted.end(), e) != s.predicted.end()) {
        ++r.prefetch_lost;
      }
    }
    if (o.timing == PrefetchTiming::kAfterExperts) TIERKV_RETURN_IF_ERROR(prefetch_next(i));
  }
  const TierStats stats = mm->Stats(tier);
  r.misses = r.acquires - r.hits;
  r.bytes_in = stats.bytes_in;
  r.hit_rate = r.acquires > 0 ? static_cast<double>(r.hits) / static_cast<double>(r.acquires) : 0.0;
  r.bytes_moved_per_token = r.tokens > 0 ? static_cast<double>(r.bytes_in) / static_cast<double>(r.tokens) : 0.0;
  return r;
}

Result<ReplayResult> OracleReplay(const ExpertTrace& trace, uint64_t budget_pages) {
  TIERKV_RETURN_IF_ERROR(ValidateExpertTrace(trace));
  if (budget_pages == 0) return Status::InvalidArgument("oracle replay: the budget must hold at least one expert page");
  std::vector<uint64_t> keys;
  for (const ExpertStep& s : trace.steps) {
    for (int32_t e : s.experts) {
      keys.push_back(static_cast<uint64_t>(s.layer) * static_cast<uint64_t>(trace.n_expert) + static_cast<uint64_t>(e));
    }
  }
  // next[i]: the index of the next acquire of keys[i]'s page, or `never`.
  const uint64_t never = keys.size();
  std::vector<uint64_t> next(keys.size(), never);
  std::unordered_map<uint64_t, uint64_t> seen;
  for (uint64_t i = keys.size(); i-- > 0;) {
    auto it = seen.find(keys[i]);
    next[i] = it == seen.end() ? never : it->second;
    seen[keys[i]] = i;
  }
  ReplayResult r;
  r.tokens = CountTokens(trace);
  std::set<std::pair<uint64_t, uint64_t>> by_next;  // (next acquire, page) of the resident pages
  std::unordered_map<uint64_t, uint64_t> resident;  // page -> its next acquire
  for (uint64_t i = 0; i < keys.size(); ++i) {
    ++r.acquires;
    auto it = resident.find(keys[i]);
    if (it != resident.end()) {
      ++r.hits;
      by_next.erase({it->second, keys[i]});
    } else {
      if (resident.size() == budget_pages) {  // evict the page needed furthest ahead
        const auto victim = std::prev(by_next.end());
        resident.erase(victim->second);
        by_next.erase(victim);
      }
      it = resident.emplace(keys[i], 0).first;
    }
    it->second = next[i];
    by_next.insert({next[i], keys[i]});
  }
  r.misses = r.acquires - r.hits;
  r.bytes_in = r.misses * trace.expert_bytes;
  r.hit_rate = r.acquires > 0 ? static_cast<double>(r.hits) / static_cast<double>(r.acquires) : 0.0;
  r.bytes_moved_per_token = r.tokens > 0 ? static_cast<double>(r.bytes_in) / static_cast<double>(r.tokens) : 0.0;
  return r;
}

}  // namespace tierkv::tools
