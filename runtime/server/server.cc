// runtime/server/server.cc
#include "runtime/server/server.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>

#include <httplib.h>
#include <spdlog/spdlog.h>

#include "kvcache/remote_tier.h"
#include "kvcache/session_lock.h"
#include "memory/size.h"
#include "runtime/builtin_model.h"
#include "runtime/chat_template.h"
#include "runtime/generator.h"
#include "runtime/server/api.h"
#include "runtime/tokenizer.h"

namespace tierkv::server {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

std::string RandomId(const char* prefix) {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%016llx", prefix, static_cast<unsigned long long>(rng()));
  return buf;
}

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string SseFrame(const json& j) { return "data: " + DumpJson(j) + "\n\n"; }

// One request's work and the channel its results come back on.
struct Job {
  enum class Kind { kGenerate, kSlotSave, kSlotRestore, kSlotErase };
  Kind kind = Kind::kGenerate;
  GenerationRequest req;
  std::vector<int32_t> prompt;
  int slot_id = -1;
  std::string filename;  // slot save / restore
  std::string id;        // "chatcmpl-...", "cmpl-..."
  int64_t created = 0;
  Clock::time_point queued = Clock::now();
  std::atomic<bool> cancelled{false};

  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> frames;  // SSE frames, streaming
  bool finished = false;
  int status = 200;
  std::string body;  // the reply, not streaming

  void Post(std::string frame) {
    std::lock_guard<std::mutex> lock(mu);
    frames.push_back(std::move(frame));
    cv.notify_all();
  }
  // Blocks until Finish, then answers with its status and body (a request not streamed).
  void ReplyWhenFinished(httplib::Response& res) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return finished; });
    res.status = status;
    res.set_content(body, "application/json; charset=utf-8");
  }
  void Finish(int http_status, std::string reply) {
    std::lock_guard<std::mutex> lock(mu);
    status = http_status;
    body = std::move(reply);
    finished = true;
    cv.notify_all();
  }
};

// A warm conversation: a KV sequence and the tokens it holds.
struct Slot {
  int id = 0;
  std::optional<SeqId> seq;
  std::vector<int32_t> tokens;
  std::string file;  // the session file it was last saved to or restored from ("" = none)
  uint64_t last_used = 0;
  bool processing = false;
  int remote_blocks = 0;  // its leading full blocks the remote cache holds (or was sent)
};

// A session file of --session-dir and the tokens it holds (read at start-up, updated by
// each save).
struct SavedSession {
  std::string path;
  std::vector<int32_t> tokens;
};

size_t CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

bool IsPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace

struct Server::Impl {
  ServerOptions o;
  httplib::Server http;
  std::thread http_thread, worker;
  int port = 0;

  // Loading: set once by the worker.
  std::mutex load_mu;
  std::condition_variable load_cv;
  bool load_done = false;
  Status load_status;
  std::atomic<bool> ready{false};
  std::atomic<bool> stopping{false};
  bool shut_down = false;
  std::mutex shutdown_mu;

  // Set by the worker before `ready`; read-only afterwards.
  std::unique_ptr<Runtime> rt;
  std::unique_ptr<Tokenizer> tok;
  std::optional<ChatFormat> chat_format;
  std::string chat_template_text;
  std::string model_id;
  int n_ctx = 0;
  size_t max_token_bytes = 4;
  std::unique_ptr<SessionLock> dir_lock;
  std::unique_ptr<RemoteTier> remote;  // --remote (null: none)

  // The queue and the slots' public state.
  std::mutex mu;
  std::condition_variable queue_cv;
  std::deque<std::shared_ptr<Job>> queue;
  std::shared_ptr<Job> current;
  std::vector<Slot> slots;  // written by the worker under mu
  uint64_t use_clock = 0;

  // Worker only.
  std::vector<SavedSession> saved;

  // Metrics.
  std::atomic<uint64_t> requests{0}, rejected{0}, errors{0}, prompt_tokens{0}, cached_tokens{0}, predicted_tokens{0},
      slot_saves{0}, slot_restores{0}, cancelled_requests{0};
  std::atomic<uint64_t> prompt_us{0}, predicted_us{0};

  // --- loading -------------------------------------------------------------------
  Status Load();
  void IndexSessionDir();

  // --- the worker ----------------------------------------------------------------
  void WorkerLoop();
  void Run(Job& job);
  void Generate(Job& job);
  void SlotAction(Job& job);
  Result<Slot*> PickSlot(const Job& job, size_t* reuse);
  Status MakeRoom(const Slot& keep, size_t tokens_needed);
  Status SaveSlot(Slot& slot, const std::string& path);
  size_t ExtendFromRemote(Slot& slot, const std::vector<int32_t>& prompt, size_t reuse);
  void Free(Slot& slot);
  void Touch(Slot& slot) { slot.last_used = ++use_clock; }

  // --- HTTP ----------------------------------------------------------------------
  void Routes();
  void HandleGenerate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res);
  void HandleSlots(const httplib::Request& req, httplib::Response& res);
  void HandleSlotAction(const httplib::Request& req, httplib::Response& res);
  std::string Metrics();
  json Props();
  json SlotsJson();
  Status Enqueue(const std::shared_ptr<Job>& job);
  void Reply(httplib::Response& res, int status, const json& body);
  void ReplyError(httplib::Response& res, const Status& s) { Reply(res, HttpStatusFor(s), ErrorBody(HttpStatusFor(s), s.message())); }
  bool CheckReady(httplib::Response& res);
  Result<std::vector<int32_t>> Tokenize(const GenerationRequest& r);
  Result<std::vector<int32_t>> EncodeBounded(const std::string& text);
  json Timings(int cache_n, int prompt_n, double prompt_ms, int predicted_n, double predicted_ms) const;

  void Shutdown();
};

// ---------------------------------------------------------------------------------
// Loading

Status Server::Impl::Load() {
  const RunOptions& ro = o.run;
  TIERKV_ASSIGN_OR_RETURN(std::shared_ptr<const GgufFile> file, OpenModelFile(ro.model));
  TIERKV_ASSIGN_OR_RETURN(tok, Tokenizer::FromGguf(*file));
  TIERKV_ASSIGN_OR_RETURN(const ModelConfig config, ReadModelConfig(*file));
  const int usable = UsableContext(config, ro.rope);
  n_ctx = o.n_ctx > 0 ? o.n_ctx : std::min(config.context_length > 0 ? config.context_length : kDefaultCtx, kDefaultCtx);
  if (usable > 0 && n_ctx > usable) {
    return Status::InvalidArgument("-c " + std::to_string(n_ctx) + " is past the model's usable context of " +
                                   std::to_string(usable) + " tokens; lower -c or give --rope-scaling");
  }
  // Every slot's context at once: the budgets must hold them all.
  auto opened = OpenRuntime(ro, file, config, n_ctx, /*fingerprint=*/true);
  if (!opened.ok()) {
    // The budget errors name `tierkv run`'s flag; the host budget is --ram here.
    std::string m = opened.status().message();
    for (size_t at = m.find("--host"); at != std::string::npos; at = m.find("--host", at + 5)) m.replace(at, 6, "--ram");
    return Status(opened.status().code(), m);
  }
  rt = std::move(*opened);
  if (!rt->cache) return Status::Internal("no KV cache");
  max_token_bytes = MaxTokenInputBytes(*tok);
  if (auto format = ModelChatFormat(*file); format.ok()) chat_format = *format;
  if (!ro.chat_template.empty()) {
    TIERKV_ASSIGN_OR_RETURN(ChatFormat f, DetectChatFormat(ro.chat_template));
    chat_format = f;
  }
  if (auto t = file->GetString("tokenizer.chat_template"); t.ok()) chat_template_text = std::string(*t);
  model_id = o.alias;
  if (model_id.empty()) model_id = std::filesystem::path(ro.model).filename().string();
  {
    std::lock_guard<std::mutex> lock(mu);
    slots.resize(static_cast<size_t>(o.n_slots));
    for (int i = 0; i < o.n_slots; ++i) slots[static_cast<size_t>(i)].id = i;
  }
  if (!o.session_dir.empty()) IndexSessionDir();
  if (!ro.remote.url.empty()) {
    TIERKV_ASSIGN_OR_RETURN(remote, RemoteTier::Create(ro.remote, rt->fingerprint, rt->cache->geometry(),
                                                       rt->cache->block_bytes()));
    spdlog::info("remote KV cache {}: prompts' blocks are looked up there and published", remote->display_url());
  }
  return Status::Ok();
}

void Server::Impl::IndexSessionDir() {
  namespace fs = std::filesystem;
  std::error_code ec;
  int refused = 0;
  for (const auto& entry : fs::directory_iterator(o.session_dir, ec)) {
    const std::string path = entry.path().string();
    if (entry.path().extension() != ".tkv" || !entry.is_regular_file(ec) || entry.is_symlink(ec)) continue;
    auto summary = SessionFile::Inspect(path);
    if (!summary.ok() || summary->model.hash != rt->fingerprint.hash ||
        summary->geometry.codec != rt->cache->geometry().codec) {
      ++refused;
      continue;
    }
    saved.push_back(SavedSession{path, std::move(summary->tokens)});
  }
  spdlog::info("session dir {}: {} conversation(s) of this model{}", o.session_dir, saved.size(),
               refused > 0 ? fmt::format(", {} other file(s) skipped", refused) : std::string());
}

// ---------------------------------------------------------------------------------
// The worker

void Server::Impl::WorkerLoop() {
  Status s = Load();
  {
    std::lock_guard<std::mutex> lock(load_mu);
    load_status = s;
    load_done = true;
  }
  if (s.ok()) ready = true;
  load_cv.notify_all();
  if (!s.ok()) return;
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu);
      queue_cv.wait(lock, [&] { return !queue.empty() || stopping; });
      if (queue.empty()) break;
      job = queue.front();
      queue.pop_front();
      current = job;
    }
    Run(*job);
    std::lock_guard<std::mutex> lock(mu);
    current.reset();
    queue_cv.notify_all();
  }
}

void Server::Impl::Run(Job& job) {
  switch (job.kind) {
    case Job::Kind::kGenerate: Generate(job); break;
    default: SlotAction(job); break;
  }
}

void Server::Impl::Free(Slot& slot) {
  if (slot.seq) {
    const Status s = rt->cache->FreeSequence(*slot.seq);
    if (!s.ok()) spdlog::warn("slot {}: {}", slot.id, s.message());
  }
  slot.seq.reset();
  slot.tokens.clear();
  slot.file.clear();
  slot.remote_blocks = 0;
}

// The slot for a request and how many of its prompt tokens it holds already: the live
// slot or saved session with the longest common prefix (tokens compared); a branch of a
// slot that holds more is forked into a free or least recently used slot, copy-on-write.
Result<Slot*> Server::Impl::PickSlot(const Job& job, size_t* reuse) {
  const std::vector<int32_t>& p = job.prompt;
  const bool cache = job.req.cache_prompt;
  Slot* best = nullptr;
  size_t best_n = 0;
  for (Slot& s : slots) {
    if (!s.seq) continue;
    const size_t n = cache ? CommonPrefix(s.tokens, p) : 0;
    if (n > best_n) {
      best = &s;
      best_n = n;
    }
  }
  const SavedSession* file = nullptr;
  size_t file_n = 0;
  if (cache) {
    for (const SavedSession& f : saved) {
      const size_t n = CommonPrefix(f.tokens, p);
      if (n > file_n) {
        file = &f;
        file_n = n;
      }
    }
  }
  // The slot to compute in.
  Slot* target = nullptr;
  if (job.req.id_slot >= 0) {
    target = &slots[static_cast<size_t>(job.req.id_slot)];
  } else if (best != nullptr && best_n >= file_n && best_n == best->tokens.size()) {
    target = best;  // the prompt extends the slot's conversation
  } else {
    for (Slot& s : slots) {
      if (!s.seq) {
        target = &s;
        break;
      }
    }
    if (target == nullptr) {
      target = &*std::min_element(slots.begin(), slots.end(),
                                  [](const Slot& a, const Slot& b) { return a.last_used < b.last_used; });
    }
  }
  // The last prompt token is always computed: its logits choose the first new token.
  const size_t cap = p.size() - 1;
  const size_t own = cache && target->seq ? CommonPrefix(target->tokens, p) : 0;
  if (file != nullptr && file_n > std::max(best_n, own)) {
    const std::string path = file->path;
    Free(*target);
    const auto t0 = Clock::now();
    auto restored = SessionFile::Restore(*rt->cache, path, rt->fingerprint);
    if (restored.ok()) {
      slot_restores++;
      target->seq = restored->seq;
      target->tokens = std::move(restored->tokens);
      target->file = path;
      spdlog::info("slot {}: restored {} tokens from {} in {:.1f} ms", target->id, target->tokens.size(), path,
                   Ms(Clock::now() - t0));
      *reuse = std::min(file_n, cap);
    } else {
      // A damaged or foreign file is not reused (and not offered again).
      spdlog::warn("session {}: {}; computing the prompt instead", path, restored.status().message());
      saved.erase(std::remove_if(saved.begin(), saved.end(), [&](const SavedSession& f) { return f.path == path; }),
                  saved.end());
      *reuse = 0;
    }
  } else if (best != nullptr && best != target && best_n > own) {
    // A branch of another slot's conversation: a copy-on-write fork of it.
    Free(*target);
    TIERKV_ASSIGN_OR_RETURN(const SeqId fork, rt->cache->Fork(*best->seq));
    target->seq = fork;
    target->tokens = best->tokens;
    target->file = best->file;
    target->remote_blocks = best->remote_blocks;
    *reuse = std::min(best_n, cap);
  } else {
    *reuse = std::min(own, cap);
  }
  if (!target->seq) {
    target->seq = rt->cache->NewSequence();
    target->tokens.clear();
    target->file.clear();
  }
  if (target->tokens.size() > *reuse) {
    TIERKV_RETURN_IF_ERROR(rt->cache->Truncate(*target->seq, static_cast<int>(*reuse)));
    target->tokens.resize(*reuse);
  }
  target->remote_blocks =
      std::min(target->remote_blocks, static_cast<int>(*reuse) / rt->cache->geometry().block_tokens);
  return target;
}

// The prompt's next full blocks from the remote cache, when it has them and fetching is
// estimated faster than computing them at this server's measured prompt rate. Returns
// the tokens the slot holds afterwards.
size_t Server::Impl::ExtendFromRemote(Slot& slot, const std::vector<int32_t>& prompt, size_t reuse) {
  const uint64_t n = prompt_tokens.load();
  const double per_token = n >= 256 ? static_cast<double>(prompt_us.load()) / 1e6 / static_cast<double>(n) : 0.0;
  const auto t0 = Clock::now();
  // The last prompt token is always computed: its logits choose the first new token.
  const int held = remote->Extend(*rt->cache, *slot.seq, prompt, static_cast<int>(prompt.size()) - 1, per_token);
  if (static_cast<size_t>(held) == reuse) return reuse;
  std::lock_guard<std::mutex> lock(mu);
  slot.tokens.assign(prompt.begin(), prompt.begin() + held);
  slot.remote_blocks = held / rt->cache->geometry().block_tokens;
  if (static_cast<size_t>(held) > reuse) {
    spdlog::info("slot {}: {} prompt tokens from the remote cache in {:.1f} ms", slot.id, held - static_cast<int>(reuse),
                 Ms(Clock::now() - t0));
  }
  return static_cast<size_t>(held);
}

// Frees least recently used slots (saved already when there is a session dir) until the
// KV blocks of every live slot plus `tokens_needed` for `keep` fit the tiers' frames.
Status Server::Impl::MakeRoom(const Slot& keep, size_t tokens_needed) {
  KvCache& cache = *rt->cache;
  const KvGeometry& g = cache.geometry();
  const uint64_t frame = rt->frame_bytes;
  uint64_t frames = 0;
  for (int t = 0; t < kNumTiers; ++t) {
    const TierStats st = rt->mm->Stats(TierAt(t));
    if (!st.present || (TierAt(t) == Tier::kDevice && o.run.memory.device != DeviceKind::kSim)) continue;
    frames += st.budget_bytes / std::max<uint64_t>(frame, 1);
  }
  const auto blocks_of = [&](size_t tokens) {
    return static_cast<uint64_t>(g.n_layers) * ((tokens + static_cast<uint64_t>(g.block_tokens) - 1) /
                                                static_cast<uint64_t>(g.block_tokens));
  };
  for (;;) {
    uint64_t used = blocks_of(tokens_needed);
    Slot* lru = nullptr;
    for (Slot& s : slots) {
      if (&s == &keep || !s.seq) continue;
      used += blocks_of(s.tokens.size());
      if (lru == nullptr || s.last_used < lru->last_used) lru = &s;
    }
    if (used <= frames || lru == nullptr) return Status::Ok();
    spdlog::info("slot {}: freed ({} tokens) to make room in the KV budget", lru->id, lru->tokens.size());
    Free(*lru);
  }
}

Status Server::Impl::SaveSlot(Slot& slot, const std::string& path) {
  if (!slot.seq || slot.tokens.empty()) return Status::Ok();
  TIERKV_RETURN_IF_ERROR(SessionFile::Save(*rt->cache, *slot.seq, slot.tokens, rt->fingerprint, path));
  slot_saves++;
  auto it = std::find_if(saved.begin(), saved.end(), [&](const SavedSession& f) { return f.path == path; });
  if (it == saved.end()) {
    saved.push_back(SavedSession{path, slot.tokens});
  } else {
    it->tokens = slot.tokens;
  }
  return Status::Ok();
}

json Server::Impl::Timings(int cache_n, int prompt_n, double prompt_ms, int predicted_n, double predicted_ms) const {
  const auto per = [](double ms, int n) { return n > 0 ? ms / n : 0.0; };
  const auto rate = [](double ms, int n) { return ms > 0 ? 1e3 * n / ms : 0.0; };
  return {{"cache_n", cache_n},
          {"prompt_n", prompt_n},
          {"prompt_ms", prompt_ms},
          {"prompt_per_token_ms", per(prompt_ms, prompt_n)},
          {"prompt_per_second", rate(prompt_ms, prompt_n)},
          {"predicted_n", predicted_n},
          {"predicted_ms", predicted_ms},
          {"predicted_per_token_ms", per(predicted_ms, predicted_n)},
          {"predicted_per_second", rate(predicted_ms, predicted_n)}};
}

void Server::Impl::Generate(Job& job) {
  const GenerationRequest& r = job.req;
  const Endpoint ep = r.endpoint;
  const bool stream = r.stream;
  const auto fail = [&](const Status& s) {
    errors++;
    spdlog::warn("request {}: {}", job.id, s.message());
    const int code = HttpStatusFor(s) == 503 ? 503 : 500;
    if (stream) {
      job.Post(SseFrame(ErrorBody(code, s.message())));
      job.Finish(code, "");
    } else {
      job.Finish(code, DumpJson(ErrorBody(code, s.message())));
    }
  };
  const std::vector<int32_t>& p = job.prompt;
  const int room = n_ctx - static_cast<int>(p.size());
  const int n_predict = r.n_predict < 0 ? room : std::min(r.n_predict, room);
  size_t reuse = 0;
  Slot* slot = nullptr;
  Status picked_status;
  {
    // (The slots change under mu: GET /slots and /metrics read them.)
    std::lock_guard<std::mutex> lock(mu);
    auto picked = PickSlot(job, &reuse);
    if (picked.ok()) {
      slot = *picked;
      Touch(*slot);
      picked_status = MakeRoom(*slot, p.size() + static_cast<size_t>(std::max(n_predict, 0)));
      slot->processing = picked_status.ok();
    } else {
      picked_status = picked.status();
    }
  }
  if (!picked_status.ok()) return fail(picked_status);
  if (remote && r.cache_prompt) reuse = ExtendFromRemote(*slot, p, reuse);

  Generator gen(*rt->model, *rt->cache, *slot->seq, slot->tokens);
  const auto t0 = Clock::now();
  int prompt_n = 0;
  Status st = gen.Append(std::span<const int32_t>(p).subspan(reuse));
  Generator::PrefillHooks hooks;
  hooks.stop = [&job] { return job.cancelled.load(std::memory_order_relaxed); };
  if (r.return_progress) {
    hooks.progress = [&](int done, int total) {
      job.Post(SseFrame({{"prompt_progress",
                          {{"total", static_cast<int>(p.size())},
                           {"cache", static_cast<int>(reuse)},
                           {"processed", static_cast<int>(reuse) + done},
                           {"time_ms", Ms(Clock::now() - t0)}}}}));
      (void)total;
    };
  }
  bool prefilled = false;
  if (st.ok()) {
    auto done = gen.Prefill(o.run.batch, hooks);
    if (done.ok()) {
      prefilled = *done;
    } else {
      st = done.status();
    }
  }
  const double prompt_ms = Ms(Clock::now() - t0);
  prompt_n = std::max(gen.computed() - static_cast<int>(reuse), 0);
  prompt_tokens += static_cast<uint64_t>(prompt_n);
  cached_tokens += reuse;
  prompt_us += static_cast<uint64_t>(prompt_ms * 1e3);

  // Generation.
  std::string text;      // the reply's text (cut at a stop string)
  size_t sent = 0;       // bytes of it streamed
  std::vector<int32_t> generated;
  std::string finish = "length", stop_type = "limit", stopping_word;
  const auto t1 = Clock::now();
  const bool first_chat_chunk = ep == Endpoint::kChat && stream;
  if (first_chat_chunk && st.ok()) {
    job.Post(SseFrame({{"id", job.id},
                       {"object", "chat.completion.chunk"},
                       {"created", job.created},
                       {"model", model_id},
                       {"choices", json::array({{{"index", 0},
                                                 {"delta", {{"role", "assistant"}, {"content", nullptr}}},
                                                 {"finish_reason", nullptr}}})}}));
  }
  const auto emit = [&](std::string_view piece) {
    if (!stream || piece.empty()) return;
    json chunk;
    if (ep == Endpoint::kChat) {
      chunk = {{"id", job.id},
               {"object", "chat.completion.chunk"},
               {"created", job.created},
               {"model", model_id},
               {"choices", json::array({{{"index", 0}, {"delta", {{"content", piece}}}, {"finish_reason", nullptr}}})}};
    } else if (ep == Endpoint::kCompletions) {
      chunk = {{"id", job.id},
               {"object", "text_completion"},
               {"created", job.created},
               {"model", model_id},
               {"choices", json::array({{{"index", 0}, {"text", piece}, {"logprobs", nullptr}, {"finish_reason", nullptr}}})}};
    } else {
      chunk = {{"index", 0}, {"content", piece}, {"stop", false}, {"id_slot", slot->id}};
    }
    job.Post(SseFrame(chunk));
  };
  if (st.ok() && !prefilled) {
    finish = "stop";
    stop_type = "none";
  } else if (st.ok()) {
    SamplerOptions so = r.sampler;
    if (r.ignore_eos) {
      for (int32_t id = 0; id < tok->n_vocab(); ++id) {
        if (tok->IsEog(id)) so.banned_tokens.push_back(id);
      }
    }
    Sampler sampler(so);
    for (const int32_t t : p) sampler.Accept(t);
    if (n_predict <= 0) {
      finish = "length";
    }
    for (int i = 0; i < n_predict; ++i) {
      if (job.cancelled.load(std::memory_order_relaxed)) {
        finish = "stop";
        stop_type = "none";
        break;
      }
      const int32_t next = sampler.Sample(gen.logits());
      sampler.Accept(next);
      if (!r.ignore_eos && tok->IsEog(next)) {
        finish = "stop";
        stop_type = "eos";
        break;
      }
      gen.Accept(next);
      generated.push_back(next);
      const size_t before = text.size();
      text += tok->TokenToPiece(next, /*render_special=*/false);
      // A stop string ends the reply before it (searched where the new text could complete one).
      const size_t from = before >= kMaxStopBytes ? before - kMaxStopBytes : 0;
      std::string which;
      if (const size_t at = FindStop(std::string_view(text).substr(from), r.stop, &which); at != std::string::npos) {
        text.resize(from + at);
        finish = "stop";
        stop_type = "word";
        stopping_word = which;
        break;
      }
      const size_t safe = CompleteUtf8Prefix(text) - std::min(CompleteUtf8Prefix(text), PartialStopSuffix(text, r.stop));
      if (safe > sent) {
        emit(std::string_view(text).substr(sent, safe - sent));
        sent = safe;
      }
      if (i + 1 == n_predict) break;
      if (Status s = gen.Step(); !s.ok()) {
        st = s;
        break;
      }
    }
  }
  const double predicted_ms = Ms(Clock::now() - t1);
  predicted_tokens += generated.size();
  predicted_us += static_cast<uint64_t>(predicted_ms * 1e3);
  if (job.cancelled) cancelled_requests++;

  // The slot keeps what the cache holds (the unfed last token is computed by the next
  // request that reuses it), and is saved.
  Status trunc = gen.Truncate(gen.computed());
  {
    std::lock_guard<std::mutex> lock(mu);
    slot->tokens = gen.tokens();
    slot->processing = false;
  }
  if (!trunc.ok() && st.ok()) st = trunc;
  if (!o.session_dir.empty() && !slot->tokens.empty()) {
    // The file it came from when this extends it, else a new one named by the content
    // key of its last block (a hash chain over every token).
    std::string path;
    if (!slot->file.empty()) {
      auto it = std::find_if(saved.begin(), saved.end(), [&](const SavedSession& f) { return f.path == slot->file; });
      if (it != saved.end() && IsPrefix(it->tokens, slot->tokens)) path = slot->file;
    }
    if (path.empty()) {
      const auto keys = SessionFile::ContentKeys(rt->fingerprint, rt->cache->geometry(), slot->tokens);
      char name[40];
      std::snprintf(name, sizeof name, "%016llx.tkv", static_cast<unsigned long long>(keys.empty() ? 0 : keys.back()));
      path = (std::filesystem::path(o.session_dir) / name).string();
    }
    if (Status s = SaveSlot(*slot, path); s.ok()) {
      slot->file = path;
    } else {
      spdlog::warn("slot {}: not saved: {}", slot->id, s.message());
    }
  }
  // Its new full blocks are queued for the remote cache before the reply ends (sent in
  // the background), so a client that has the reply can count on them being on the way.
  if (remote && slot->seq && !slot->tokens.empty()) {
    slot->remote_blocks = remote->Publish(*rt->cache, *slot->seq, slot->tokens, slot->remote_blocks);
  }
  if (!st.ok()) return fail(st);

  // The rest of the text (held back for a stop string that did not come).
  if (sent < text.size()) emit(std::string_view(text).substr(sent));
  const int cache_n = static_cast<int>(reuse);
  const int predicted_n = static_cast<int>(generated.size());
  const json timings = Timings(cache_n, prompt_n, prompt_ms, predicted_n, predicted_ms);
  const json usage = {{"prompt_tokens", static_cast<int>(p.size())},
                      {"completion_tokens", predicted_n},
                      {"total_tokens", static_cast<int>(p.size()) + predicted_n},
                      {"prompt_tokens_details", {{"cached_tokens", cache_n}}}};
  if (ep == Endpoint::kLlamaCompletion) {
    json done = {{"index", 0},
                 {"content", stream ? std::string() : text},
                 {"tokens", stream ? json::array() : json(generated)},
                 {"id_slot", slot->id},
                 {"stop", true},
                 {"model", model_id},
                 {"tokens_predicted", predicted_n},
                 {"tokens_evaluated", static_cast<int>(p.size())},
                 {"tokens_cached", static_cast<int>(slot->tokens.size())},
                 {"truncated", false},
                 {"stop_type", stop_type},
                 {"stopped_eos", stop_type == "eos"},
                 {"stopped_word", stop_type == "word"},
                 {"stopped_limit", stop_type == "limit"},
                 {"stopping_word", stopping_word},
                 {"generation_settings",
                  {{"n_ctx", n_ctx},
                   {"n_predict", r.n_predict},
                   {"temperature", r.sampler.temperature},
                   {"top_k", r.sampler.top_k},
                   {"top_p", r.sampler.top_p},
                   {"min_p", r.sampler.min_p},
                   {"seed", r.sampler.seed}}},
                 {"timings", timings}};
    if (stream) {
      job.Post(SseFrame(done));
      job.Finish(200, "");
    } else {
      job.Finish(200, DumpJson(done));
    }
    return;
  }
  if (stream) {
    json last;
    if (ep == Endpoint::kChat) {
      last = {{"id", job.id},
              {"object", "chat.completion.chunk"},
              {"created", job.created},
              {"model", model_id},
              {"choices", json::array({{{"index", 0}, {"delta", json::object()}, {"finish_reason", finish}}})}};
    } else {
      last = {{"id", job.id},
              {"object", "text_completion"},
              {"created", job.created},
              {"model", model_id},
              {"choices", json::array({{{"index", 0}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", finish}}})}};
    }
    last["usage"] = usage;
    last["timings"] = timings;
    job.Post(SseFrame(last));
    if (r.include_usage) {
      // OpenAI's usage chunk: no choices.
      job.Post(SseFrame({{"id", job.id},
                         {"object", ep == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
                         {"created", job.created},
                         {"model", model_id},
                         {"choices", json::array()},
                         {"usage", usage}}));
    }
    job.Post("data: [DONE]\n\n");
    job.Finish(200, "");
    return;
  }
  json reply;
  if (ep == Endpoint::kChat) {
    reply = {{"id", job.id},
             {"object", "chat.completion"},
             {"created", job.created},
             {"model", model_id},
             {"choices", json::array({{{"index", 0},
                                       {"message", {{"role", "assistant"}, {"content", text}}},
                                       {"finish_reason", finish}}})}};
  } else {
    reply = {{"id", job.id},
             {"object", "text_completion"},
             {"created", job.created},
             {"model", model_id},
             {"choices", json::array({{{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", finish}}})}};
  }
  reply["usage"] = usage;
  reply["timings"] = timings;
  reply["id_slot"] = slot->id;
  job.Finish(200, DumpJson(reply));
}

void Server::Impl::SlotAction(Job& job) {
  Slot& slot = slots[static_cast<size_t>(job.slot_id)];
  const std::string path = o.session_dir.empty() ? std::string()
                                                 : (std::filesystem::path(o.session_dir) / job.filename).string();
  const auto t0 = Clock::now();
  const auto reply_error = [&](const Status& s) { job.Finish(HttpStatusFor(s), DumpJson(ErrorBody(HttpStatusFor(s), s.message()))); };
  switch (job.kind) {
    case Job::Kind::kSlotSave: {
      if (!slot.seq || slot.tokens.empty()) return reply_error(Status::InvalidArgument("slot " + std::to_string(slot.id) + " is empty"));
      if (Status s = SaveSlot(slot, path); !s.ok()) return reply_error(s);
      job.Finish(200, DumpJson({{"id_slot", slot.id},
                            {"filename", job.filename},
                            {"n_saved", static_cast<int>(slot.tokens.size())},
                            {"timings", {{"save_ms", Ms(Clock::now() - t0)}}}}));
      return;
    }
    case Job::Kind::kSlotRestore: {
      auto restored = SessionFile::Restore(*rt->cache, path, rt->fingerprint);
      if (!restored.ok()) {
        const Status& s = restored.status();
        return reply_error(s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kCorruption
                               ? Status::InvalidArgument(s.message())
                               : s);
      }
      if (restored->tokens.size() >= static_cast<size_t>(n_ctx)) {
        (void)rt->cache->FreeSequence(restored->seq);
        return reply_error(Status::InvalidArgument("the session holds " + std::to_string(restored->tokens.size()) +
                                                   " tokens, more than the slot context of " + std::to_string(n_ctx)));
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        Free(slot);
        slot.seq = restored->seq;
        slot.tokens = std::move(restored->tokens);
        slot.file = path;
        Touch(slot);
      }
      slot_restores++;
      job.Finish(200, DumpJson({{"id_slot", slot.id},
                            {"filename", job.filename},
                            {"n_restored", static_cast<int>(slot.tokens.size())},
                            {"timings", {{"restore_ms", Ms(Clock::now() - t0)}}}}));
      return;
    }
    case Job::Kind::kSlotErase: {
      const int n = static_cast<int>(slot.tokens.size());
      {
        std::lock_guard<std::mutex> lock(mu);
        Free(slot);
      }
      job.Finish(200, DumpJson({{"id_slot", slot.id}, {"n_erased", n}}));
      return;
    }
    case Job::Kind::kGenerate: break;
  }
}

// ---------------------------------------------------------------------------------
// HTTP

void Server::Impl::Reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(DumpJson(body), "application/json; charset=utf-8");
}

bool Server::Impl::CheckReady(httplib::Response& res) {
  if (stopping) {
    Reply(res, 503, ErrorBody(503, "the server is shutting down"));
    return false;
  }
  if (!ready) {
    Reply(res, 503, ErrorBody(503, "Loading model"));
    return false;
  }
  return true;
}

Status Server::Impl::Enqueue(const std::shared_ptr<Job>& job) {
  std::lock_guard<std::mutex> lock(mu);
  if (stopping) return Status::Exhausted("the server is shutting down");
  if (queue.size() >= static_cast<size_t>(o.max_queue)) {
    rejected++;
    return Status::Exhausted("the server is busy: " + std::to_string(queue.size()) + " requests wait (--queue " +
                             std::to_string(o.max_queue) + "); retry later");
  }
  queue.push_back(job);
  queue_cv.notify_all();
  return Status::Ok();
}

// A prompt's tokens (BOS where the vocabulary adds one, special tokens parsed), refused
// before the work of tokenizing when its bytes alone cannot fit the context.
Result<std::vector<int32_t>> Server::Impl::EncodeBounded(const std::string& text) {
  if (text.size() > static_cast<size_t>(n_ctx) * PromptBytesPerToken(*tok, max_token_bytes, text)) {
    return Status::InvalidArgument("the prompt (" + std::to_string(text.size()) + " bytes) cannot fit the context of " +
                                   std::to_string(n_ctx) + " tokens");
  }
  return tok->Encode(text, /*add_special=*/true, /*parse_special=*/true);
}

Result<std::vector<int32_t>> Server::Impl::Tokenize(const GenerationRequest& r) {
  std::vector<int32_t> tokens;
  if (r.endpoint == Endpoint::kChat) {
    if (!chat_format) {
      return Status::InvalidArgument("the model has no chat template that tierkv formats: use /v1/completions, or "
                                     "start the server with --chat-template chatml|llama3|llama2");
    }
    TIERKV_ASSIGN_OR_RETURN(const std::string text, FormatChat(*chat_format, r.messages, /*add_assistant=*/true));
    TIERKV_ASSIGN_OR_RETURN(tokens, EncodeBounded(text));
  } else if (r.prompt) {
    TIERKV_ASSIGN_OR_RETURN(tokens, EncodeBounded(*r.prompt));
  } else {
    for (const int32_t t : r.prompt_tokens) {
      if (t >= tok->n_vocab()) {
        return Status::InvalidArgument("prompt token " + std::to_string(t) + " is past the vocabulary of " +
                                       std::to_string(tok->n_vocab()));
      }
    }
    tokens = r.prompt_tokens;
  }
  if (tokens.empty()) return Status::InvalidArgument("the prompt is empty (no tokens)");
  if (tokens.size() >= static_cast<size_t>(n_ctx)) {
    return Status::InvalidArgument("the prompt (" + std::to_string(tokens.size()) +
                                   " tokens) does not fit the context of " + std::to_string(n_ctx) +
                                   " tokens (exceed_context_size_error); shorten it or start the server with a larger -c");
  }
  return tokens;
}

void Server::Impl::HandleGenerate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
  if (!CheckReady(res)) return;
  auto parsed = ParseGenerationRequest(endpoint, req.body);
  if (!parsed.ok()) return ReplyError(res, parsed.status());
  if (parsed->id_slot >= o.n_slots) {
    return ReplyError(res, Status::InvalidArgument("'id_slot' " + std::to_string(parsed->id_slot) + ": the server has " +
                                                   std::to_string(o.n_slots) + " slots (0.." +
                                                   std::to_string(o.n_slots - 1) + ")"));
  }
  auto tokens = Tokenize(*parsed);
  if (!tokens.ok()) return ReplyError(res, tokens.status());
  auto job = std::make_shared<Job>();
  job->req = std::move(*parsed);
  job->prompt = std::move(*tokens);
  job->id = RandomId(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-");
  job->created = UnixNow();
  requests++;
  if (Status s = Enqueue(job); !s.ok()) return ReplyError(res, s);
  if (!job->req.stream) return job->ReplyWhenFinished(res);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream; charset=utf-8",
      [job](size_t, httplib::DataSink& sink) {
        // Frames as they come; a comment every few seconds while none does (a long
        // prefill), so that proxies and clients keep the connection.
        std::unique_lock<std::mutex> lock(job->mu);
        job->cv.wait_for(lock, std::chrono::seconds(5), [&] { return !job->frames.empty() || job->finished; });
        std::deque<std::string> frames;
        frames.swap(job->frames);
        const bool finished = job->finished;
        lock.unlock();
        if (frames.empty() && !finished) frames.push_back(": keep-alive\n\n");
        for (const std::string& f : frames) {
          if (!sink.write(f.data(), f.size())) {
            job->cancelled = true;  // the client went away: stop its work (what was computed is kept)
            return false;
          }
        }
        if (finished) sink.done();
        return true;
      },
      [job](bool success) {
        if (!success) job->cancelled = true;
      });
}

json Server::Impl::SlotsJson() {
  std::lock_guard<std::mutex> lock(mu);
  json a = json::array();
  for (const Slot& s : slots) {
    a.push_back({{"id", s.id},
                 {"n_ctx", n_ctx},
                 {"is_processing", s.processing},
                 {"tokens_cached", static_cast<int>(s.tokens.size())},
                 {"session_file", s.file.empty() ? json(nullptr) : json(std::filesystem::path(s.file).filename().string())}});
  }
  return a;
}

void Server::Impl::HandleSlotAction(const httplib::Request& req, httplib::Response& res) {
  if (!CheckReady(res)) return;
  const std::string id_text = req.matches.size() > 1 ? std::string(req.matches[1]) : std::string();
  int id = -1;
  if (id_text.empty() || id_text.size() > 6 || id_text.find_first_not_of("0123456789") != std::string::npos ||
      (id = std::stoi(id_text)) >= o.n_slots) {
    return ReplyError(res, Status::NotFound("slot '" + id_text + "': the server has slots 0.." + std::to_string(o.n_slots - 1)));
  }
  const std::string action = req.get_param_value("action");
  auto job = std::make_shared<Job>();
  job->slot_id = id;
  if (action == "erase") {
    job->kind = Job::Kind::kSlotErase;
  } else if (action == "save" || action == "restore") {
    job->kind = action == "save" ? Job::Kind::kSlotSave : Job::Kind::kSlotRestore;
    if (o.session_dir.empty()) {
      return ReplyError(res, Status::InvalidArgument("slot " + action + " needs the server started with --session-dir"));
    }
    auto body = ParseObject(req.body);
    if (!body.ok()) return ReplyError(res, body.status());
    if (Status s = CheckKnownFields(*body, {"filename"}); !s.ok()) return ReplyError(res, s);
    auto f = body->find("filename");
    if (f == body->end() || !f->is_string()) return ReplyError(res, Status::InvalidArgument("'filename' must be a string"));
    job->filename = f->get<std::string>();
    if (Status s = CheckSessionFileName(job->filename); !s.ok()) return ReplyError(res, s);
    // A link in the session directory is never followed (a save would write through it).
    const std::string path = (std::filesystem::path(o.session_dir) / job->filename).string();
    struct stat st {};
    const bool exists = lstat(path.c_str(), &st) == 0;
    if (exists && !S_ISREG(st.st_mode)) {
      return ReplyError(res, Status::InvalidArgument("'" + job->filename + "' is not a regular file in the session directory"));
    }
    if (!exists && action == "restore") {
      return ReplyError(res, Status::NotFound("'" + job->filename + "': no such session file"));
    }
  } else {
    return ReplyError(res, Status::InvalidArgument("'action' must be save, restore or erase, not '" + action + "'"));
  }
  if (Status s = Enqueue(job); !s.ok()) return ReplyError(res, s);
  job->ReplyWhenFinished(res);
}

json Server::Impl::Props() {
  return {{"default_generation_settings",
           {{"n_ctx", n_ctx},
            {"params",
             {{"temperature", 0.8}, {"top_k", 40}, {"top_p", 0.95}, {"min_p", 0.05}, {"n_predict", -1}}}}},
          {"total_slots", o.n_slots},
          {"model_path", o.run.model},
          {"model_alias", model_id},
          {"chat_template", chat_template_text},
          {"chat_format", chat_format ? json(ChatFamilyName(chat_format->family)) : json(nullptr)},
          {"session_dir", o.session_dir.empty() ? json(nullptr) : json(o.session_dir)},
          {"build_info", "tierkv " + o.version}};
}

std::string Server::Impl::Metrics() {
  std::string m;
  const auto metric = [&m](const char* name, const char* type, const char* help, double value) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", value);
    m.append("# HELP ").append(name).append(" ").append(help).append("\n");
    m.append("# TYPE ").append(name).append(" ").append(type).append("\n");
    m.append(name).append(" ").append(buf).append("\n");
  };
  size_t waiting = 0, processing = 0, kv_tokens = 0, live = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    waiting = queue.size();
    processing = current ? 1 : 0;
    for (const Slot& s : slots) {
      kv_tokens += s.tokens.size();
      live += s.seq ? 1 : 0;
    }
  }
  metric("tierkv_requests_total", "counter", "Generation requests accepted.", static_cast<double>(requests.load()));
  metric("tierkv_requests_rejected_total", "counter", "Requests answered 503 because the queue was full.",
         static_cast<double>(rejected.load()));
  metric("tierkv_requests_failed_total", "counter", "Requests that failed while computing.", static_cast<double>(errors.load()));
  metric("tierkv_requests_cancelled_total", "counter", "Requests whose client went away.",
         static_cast<double>(cancelled_requests.load()));
  metric("tierkv_requests_processing", "gauge", "Requests computing now.", static_cast<double>(processing));
  metric("tierkv_requests_deferred", "gauge", "Requests waiting in the queue.", static_cast<double>(waiting));
  metric("tierkv_prompt_tokens_total", "counter", "Prompt tokens computed.", static_cast<double>(prompt_tokens.load()));
  metric("tierkv_prompt_tokens_cached_total", "counter", "Prompt tokens reused from slots and saved sessions.",
         static_cast<double>(cached_tokens.load()));
  metric("tierkv_prompt_seconds_total", "counter", "Time spent computing prompts.", prompt_us.load() / 1e6);
  metric("tierkv_tokens_predicted_total", "counter", "Tokens generated.", static_cast<double>(predicted_tokens.load()));
  metric("tierkv_tokens_predicted_seconds_total", "counter", "Time spent generating.", predicted_us.load() / 1e6);
  metric("tierkv_slots_live", "gauge", "Slots holding a conversation.", static_cast<double>(live));
  metric("tierkv_kv_cache_tokens", "gauge", "Tokens held by the slots.", static_cast<double>(kv_tokens));
  metric("tierkv_session_saves_total", "counter", "Slot saves to --session-dir.", static_cast<double>(slot_saves.load()));
  metric("tierkv_session_restores_total", "counter", "Sessions restored into slots.", static_cast<double>(slot_restores.load()));
  if (!ready) return m;
  if (remote) {
    const RemoteStats r = remote->stats();
    metric("tierkv_remote_connected", "gauge", "1 while the remote KV cache answers.", r.connected ? 1 : 0);
    metric("tierkv_remote_hit_blocks_total", "counter", "Prompt blocks fetched from the remote cache, verified and used.",
           static_cast<double>(r.hit_blocks));
    metric("tierkv_remote_hit_tokens_total", "counter", "Prompt tokens reused from the remote cache.",
           static_cast<double>(r.hit_tokens));
    metric("tierkv_remote_miss_blocks_total", "counter", "Full prompt blocks the remote cache did not give.",
           static_cast<double>(r.miss_blocks));
    metric("tierkv_remote_fetched_bytes_total", "counter", "Bytes fetched from the remote cache.",
           static_cast<double>(r.fetched_bytes));
    metric("tierkv_remote_fetch_seconds_total", "counter", "Time spent looking up and fetching.", r.fetch_us / 1e6);
    metric("tierkv_remote_verify_failures_total", "counter", "Remote values refused (damaged, truncated, foreign).",
           static_cast<double>(r.verify_failures));
    metric("tierkv_remote_skipped_total", "counter", "Fetches not made: computing was estimated faster.",
           static_cast<double>(r.skipped_slower));
    metric("tierkv_remote_published_blocks_total", "counter", "Blocks published to the remote cache.",
           static_cast<double>(r.published_blocks));
    metric("tierkv_remote_present_blocks_total", "counter", "Blocks not published: the remote cache held them.",
           static_cast<double>(r.present_blocks));
    metric("tierkv_remote_dropped_blocks_total", "counter", "Blocks not published: backlog full or refused.",
           static_cast<double>(r.dropped_blocks));
    metric("tierkv_remote_pending_bytes", "gauge", "Bytes waiting to be published.", static_cast<double>(r.pending_bytes));
    metric("tierkv_remote_errors_total", "counter", "Remote commands that failed (connection, timeout, server error).",
           static_cast<double>(r.errors));
  }
  std::vector<TierStats> tiers;
  for (int t = 0; t < kNumTiers; ++t) {
    TierStats s = rt->mm->Stats(TierAt(t));
    if (s.present) tiers.push_back(std::move(s));
  }
  const auto family = [&](const std::string& name, const char* type, const char* help, auto value) {
    m.append("# HELP ").append(name).append(" ").append(help).append("\n");
    m.append("# TYPE ").append(name).append(" ").append(type).append("\n");
    for (const TierStats& t : tiers) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.17g", static_cast<double>(value(t)));
      m.append(name).append("{tier=\"").append(TierName(t.tier)).append("\"} ").append(buf).append("\n");
    }
  };
  family("tierkv_tier_budget_bytes", "gauge", "The tier's budget.", [](const TierStats& t) { return t.budget_bytes; });
  family("tierkv_tier_free_frames", "gauge", "Frames not in use.", [](const TierStats& t) { return t.free_frames; });
#define TIERKV_METRIC_COUNTER(name, doc) \
  family("tierkv_tier_" #name "_total", "counter", doc ".", [](const TierStats& t) { return t.name; });
  TIERKV_TIER_COUNTERS(TIERKV_METRIC_COUNTER)
#undef TIERKV_METRIC_COUNTER
#define TIERKV_METRIC_GAUGE(name, doc)                                                                       \
  family("tierkv_tier_" #name, "gauge", doc ".", [](const TierStats& t) { return t.name.current; });        \
  family("tierkv_tier_" #name "_peak", "gauge", doc " (peak).", [](const TierStats& t) { return t.name.peak; });
  TIERKV_TIER_GAUGES(TIERKV_METRIC_GAUGE)
#undef TIERKV_METRIC_GAUGE
  family("tierkv_tier_internal_fragmentation", "gauge", "Share of held frame bytes no page asked for.",
         [](const TierStats& t) { return t.internal_fragmentation(); });
  family("tierkv_tier_external_fragmentation", "gauge", "Share of free frames that cannot serve the largest page.",
         [](const TierStats& t) { return t.external_fragmentation(); });
  return m;
}

void Server::Impl::Routes() {
  http.set_default_headers({{"Access-Control-Allow-Origin", "*"}});
  http.set_payload_max_length(o.max_body_bytes);
  const size_t threads = static_cast<size_t>(std::max(o.http_threads, 4));
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "OPTIONS") {
      res.status = 204;
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type, X-Api-Key");
      res.set_header("Access-Control-Max-Age", "86400");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (o.api_keys.empty() || req.path == "/health" || req.path == "/v1/health") {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    std::string key = req.get_header_value("X-Api-Key");
    const std::string auth = req.get_header_value("Authorization");
    if (auth.rfind("Bearer ", 0) == 0) key = auth.substr(7);
    if (std::find(o.api_keys.begin(), o.api_keys.end(), key) != o.api_keys.end()) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    Reply(res, 401, ErrorBody(401, "Invalid API Key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message = "error";
    if (res.status == 404) message = "no such endpoint: " + req.method + " " + req.path;
    if (res.status == 413) message = "the body is larger than " + FormatBytes(o.max_body_bytes);
    if (res.status == 400) message = "malformed HTTP request";
    if (res.status == 405) message = "method not allowed";
    Reply(res, res.status, ErrorBody(res.status, message));
  });
  http.set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    Reply(res, 500, ErrorBody(500, what));
  });
  const auto health = [this](const httplib::Request&, httplib::Response& res) {
    if (ready && !stopping) {
      Reply(res, 200, {{"status", "ok"}});
    } else {
      Reply(res, 503, ErrorBody(503, stopping ? "the server is shutting down" : "Loading model"));
    }
  };
  http.Get("/health", health);
  http.Get("/v1/health", health);
  const auto models = [this](const httplib::Request&, httplib::Response& res) {
    if (!CheckReady(res)) return;
    Reply(res, 200,
          {{"object", "list"},
           {"data", json::array({{{"id", model_id},
                                  {"object", "model"},
                                  {"created", UnixNow()},
                                  {"owned_by", "tierkv"},
                                  {"meta", {{"n_ctx", n_ctx}, {"n_vocab", tok->n_vocab()}}}}})}});
  };
  http.Get("/v1/models", models);
  http.Get("/models", models);
  http.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& s) { HandleGenerate(Endpoint::kChat, q, s); });
  http.Post("/chat/completions", [this](const httplib::Request& q, httplib::Response& s) { HandleGenerate(Endpoint::kChat, q, s); });
  http.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& s) { HandleGenerate(Endpoint::kCompletions, q, s); });
  http.Post("/completion", [this](const httplib::Request& q, httplib::Response& s) { HandleGenerate(Endpoint::kLlamaCompletion, q, s); });
  http.Post("/completions", [this](const httplib::Request& q, httplib::Response& s) { HandleGenerate(Endpoint::kLlamaCompletion, q, s); });
  http.Get("/props", [this](const httplib::Request&, httplib::Response& res) {
    if (CheckReady(res)) Reply(res, 200, Props());
  });
  http.Get("/slots", [this](const httplib::Request&, httplib::Response& res) {
    if (CheckReady(res)) Reply(res, 200, SlotsJson());
  });
  http.Post(R"(/slots/([^/]*))", [this](const httplib::Request& q, httplib::Response& s) { HandleSlotAction(q, s); });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.status = 200;
    res.set_content(Metrics(), "text/plain; version=0.0.4");
  });
  http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    if (!CheckReady(res)) return;
    auto body = ParseObject(req.body);
    if (!body.ok()) return ReplyError(res, body.status());
    if (Status s = CheckKnownFields(*body, {"content", "add_special", "parse_special", "with_pieces"}); !s.ok()) {
      return ReplyError(res, s);
    }
    auto content = body->find("content");
    if (content == body->end() || !content->is_string()) {
      return ReplyError(res, Status::InvalidArgument("'content' must be a string"));
    }
    bool add_special = false, parse_special = true, with_pieces = false;
    for (auto [name, out] : {std::pair<const char*, bool*>{"add_special", &add_special},
                             {"parse_special", &parse_special},
                             {"with_pieces", &with_pieces}}) {
      auto it = body->find(name);
      if (it == body->end() || it->is_null()) continue;
      if (!it->is_boolean()) return ReplyError(res, Status::InvalidArgument(std::string("'") + name + "' must be true or false"));
      *out = it->get<bool>();
    }
    const std::string text = content->get<std::string>();
    if (text.size() > static_cast<size_t>(n_ctx) * 4 * max_token_bytes + 4096 && text.size() > (1u << 20)) {
      return ReplyError(res, Status::InvalidArgument("'content' is too long to tokenize here"));
    }
    const std::vector<int32_t> ids = tok->Encode(text, add_special, parse_special);
    json tokens = json::array();
    for (const int32_t id : ids) {
      if (!with_pieces) {
        tokens.push_back(id);
        continue;
      }
      const std::string piece = tok->TokenToPiece(id, true);
      if (CompleteUtf8Prefix(piece) == piece.size() && json(piece).dump(-1, ' ', false, json::error_handler_t::ignore) == json(piece).dump(-1, ' ', false, json::error_handler_t::replace)) {
        tokens.push_back({{"id", id}, {"piece", piece}});
      } else {
        json bytes = json::array();
        for (const char c : piece) bytes.push_back(static_cast<unsigned char>(c));
        tokens.push_back({{"id", id}, {"piece", bytes}});
      }
    }
    Reply(res, 200, {{"tokens", tokens}});
  });
  http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    if (!CheckReady(res)) return;
    auto body = ParseObject(req.body);
    if (!body.ok()) return ReplyError(res, body.status());
    if (Status s = CheckKnownFields(*body, {"tokens"}); !s.ok()) return ReplyError(res, s);
    auto t = body->find("tokens");
    if (t == body->end() || !t->is_array()) return ReplyError(res, Status::InvalidArgument("'tokens' must be an array of token ids"));
    std::vector<int32_t> ids;
    for (const json& v : *t) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= tok->n_vocab()) {
        return ReplyError(res, Status::InvalidArgument("'tokens': " + v.dump() + " is not a token id of this vocabulary (0.." +
                                                       std::to_string(tok->n_vocab() - 1) + ")"));
      }
      ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    Reply(res, 200, {{"content", tok->Decode(ids)}});
  });
  http.Post("/apply-template", [this](const httplib::Request& req, httplib::Response& res) {
    if (!CheckReady(res)) return;
    auto parsed = ParseGenerationRequest(Endpoint::kChat, req.body);
    if (!parsed.ok()) return ReplyError(res, parsed.status());
    if (!chat_format) return ReplyError(res, Status::InvalidArgument("the model has no chat template that tierkv formats"));
    auto text = FormatChat(*chat_format, parsed->messages, true);
    if (!text.ok()) return ReplyError(res, text.status());
    Reply(res, 200, {{"prompt", *text}});
  });
}

void Server::Impl::Shutdown() {
  std::lock_guard<std::mutex> guard(shutdown_mu);
  if (shut_down) return;
  shut_down = true;
  {
    std::unique_lock<std::mutex> lock(mu);
    stopping = true;
    // Waiting requests are answered 503; the one in flight may finish.
    for (const auto& job : queue) {
      job->cancelled = true;
      if (job->req.stream) job->Post(SseFrame(ErrorBody(503, "the server is shutting down")));
      job->Finish(503, DumpJson(ErrorBody(503, "the server is shutting down")));
    }
    queue.clear();
    queue_cv.notify_all();
    const bool done = queue_cv.wait_for(lock, std::chrono::duration<double>(o.shutdown_grace_s), [&] { return !current; });
    if (!done && current) current->cancelled = true;
  }
  if (worker.joinable()) worker.join();
  // Streams still open get their last frames before the sockets close.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  http.stop();
  if (http_thread.joinable()) http_thread.join();
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { impl_->Shutdown(); }

int Server::port() const { return impl_->port; }

Status Server::WaitLoaded() {
  std::unique_lock<std::mutex> lock(impl_->load_mu);
  impl_->load_cv.wait(lock, [&] { return impl_->load_done; });
  return impl_->load_status;
}

void Server::Shutdown() { impl_->Shutdown(); }

Result<std::unique_ptr<Server>> Server::Start(ServerOptions options) {
  if (options.n_slots < 1) return Status::InvalidArgument("-np must be at least 1");
  if (options.max_queue < 1) return Status::InvalidArgument("--queue must be at least 1");
  auto impl = std::make_unique<Impl>();
  impl->o = std::move(options);
  Impl& s = *impl;
  if (!s.o.session_dir.empty()) {
    // Created when missing (with its parents), as a cache directory is.
    std::error_code ec;
    std::filesystem::create_directories(s.o.session_dir, ec);
    if (!std::filesystem::is_directory(s.o.session_dir, ec)) {
      return Status::InvalidArgument("--session-dir " + s.o.session_dir + ": not a directory" +
                                     (ec ? " (" + ec.message() + ")" : std::string()));
    }
    // One server per session directory: a second one is refused, naming the first.
    SessionLock::Options lo;
    lo.wait = false;
    lo.command = "tierkv serve --model " + s.o.run.model;
    TIERKV_ASSIGN_OR_RETURN(s.dir_lock,
                            SessionLock::Acquire((std::filesystem::path(s.o.session_dir) / "server").string(), lo));
  }
  s.Routes();
  if (s.o.port == 0) {
    s.port = s.http.bind_to_any_port(s.o.host);
    if (s.port <= 0) return Status::IoError("cannot listen on " + s.o.host + " (any port)");
  } else {
    if (!s.http.bind_to_port(s.o.host, s.o.port)) {
      return Status::IoError("cannot listen on " + s.o.host + ":" + std::to_string(s.o.port) +
                             " (in use, or not an address of this machine)");
    }
    s.port = s.o.port;
  }
  s.http_thread = std::thread([&s] { s.http.listen_after_bind(); });
  s.worker = std::thread([&s] { s.WorkerLoop(); });
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Status Serve(ServerOptions options) {
  // The signals are taken by this thread (sigwait), not by the server's threads, which
  // inherit the mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  const std::string host = options.host;
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<Server> server, Server::Start(std::move(options)));
  spdlog::info("loading the model; http://{}:{}/health answers 503 until it is ready", host, server->port());
  // A load failure ends the process: the waiter below is woken by SIGUSR1.
  std::thread watcher([&server, host] {
    if (server->WaitLoaded().ok()) {
      spdlog::info("ready: http://{}:{} (OpenAI API under /v1; SIGTERM or Ctrl-C stops)", host, server->port());
    } else {
      kill(getpid(), SIGUSR1);
    }
  });
  Status loaded;
  int sig = 0;
  sigwait(&set, &sig);
  watcher.join();
  loaded = server->WaitLoaded();
  if (!loaded.ok()) return loaded;
  spdlog::info("{}: shutting down", sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "signal");
  server->Shutdown();
  return Status::Ok();
}

}  // namespace tierkv::server
