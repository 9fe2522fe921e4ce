// runtime/run.h
//
// One `tierkv run`: load a model, build the tiers and the KV cache from the options,
// restore a session (reusing the longest common prefix of its tokens), prefill the
// rest of the prompt, generate, save the session, and report (DESIGN.md, CLI contract).
//
// Thread-safety: RunSession is self-contained; it may be called from one thread at a time
// per process (it sets up its own thread pool and memory manager).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/codec.h"
#include "kvcache/kv_cache.h"
#include "kvcache/remote_tier.h"
#include "kvcache/session_file.h"
#include "memory/memory_manager.h"
#include "runtime/gguf.h"
#include "runtime/model.h"
#include "runtime/sampler.h"

namespace tierkv {

// The longest context a model runs at with these RoPE settings (docs/cli.md, "-c and
// the trained context"): its trained context (context_length), or, with RoPE scaling in
// effect (the file's, or --rope-scaling / --rope-scale), max(trained, original context x
// factor). 0 = no bound: --rope-scaling linear|yarn without a factor scales RoPE to
// whatever context is asked for (ApplyRopeOverrides).
int UsableContext(const ModelConfig& file_config, const RopeOverrides& rope);

// The most bytes of input text one token of `tok` can stand for: its longest piece
// (TokenToPiece with specials rendered), at least 4 (an unknown token may stand for one
// UTF-8 character). A text of more than n x this bytes has more than n tokens, so it
// cannot fit a context of n tokens: checked before tokenizing (a 50 MB prompt took a
// minute to tokenize before its size was refused). Byte-level BPE decodes overlong
// UTF-8 forms to shorter text first, so for text that is not well-formed UTF-8 a token
// may stand for 4 times that (PromptBytesPerToken).
class Tokenizer;
size_t MaxTokenInputBytes(const Tokenizer& tok);
// MaxTokenInputBytes(tok), times 4 for byte-level BPE when `text` is not well-formed UTF-8.
size_t PromptBytesPerToken(const Tokenizer& tok, size_t max_token_bytes, std::string_view text);

// A run without next_turn whose prompt is missing or empty (RunOptions::prompt).
inline constexpr const char* kNoPromptMessage = "no prompt: give -p TEXT or -f FILE";

// Why a reply (or a one-shot run's generation) ended.
enum class StopReason {
  kNone,           // no reply was generated (an interactive run without input)
  kEog,            // an end-of-generation token was sampled
  kLimit,          // -n tokens were generated
  kContextFull,    // the context has no room for another token (-c, or -n -1's end)
  kReversePrompt,  // the text completed a -r string
  kInterrupted,    // RunOptions::stop (Ctrl-C): during the prefill or the reply
  kOutputFailed,   // RunOptions::on_text could not show the text (standard output failed)
};
// "none", "eog", "limit", "context_full", "reverse_prompt", "interrupted", "output_failed"
// (--json's stop_reason).
const char* StopReasonName(StopReason reason);

struct RunOptions {
  std::string model;           // path to a .gguf
  // The prompt's text. A run without next_turn needs one that is not empty (and not
  // made empty by read_prompt): "no prompt", whatever the vocabulary (a llama one would
  // otherwise run on BOS alone, a qwen one refuse it).
  std::string prompt;
  // -f FILE: reads the prompt (replacing `prompt`) once RunSession knows how many bytes
  // can fit the context (max_bytes: the context's tokens x MaxTokenInputBytes); it reads
  // at most max_bytes + 1, more meaning "cannot fit". null = `prompt`. Its errors are
  // returned as they are (the CLI reports them as usage errors).
  std::function<Result<std::string>(size_t max_bytes)> read_prompt;
  // llama-cli shows the prompt, then the generated text: a raw (not --chat) prompt's
  // text goes through on_text before the prefill (after every check; not in
  // RunReport::text). --no-display-prompt turns it off; a chat turn is never shown
  // (it is input, like a typed one).
  bool echo_prompt = false;
  // --chat: the prompt is one user turn in the model's chat format (runtime/chat_template.h),
  // after system_prompt when not empty; chat_template names the format ("" = the file's).
  bool chat = false;
  std::string system_prompt;
  std::string chat_template;
  // --continue (with chat and an existing session file): the prompt is the next user
  // turn of the conversation saved there, appended after its tokens.
  bool continue_chat = false;
  int n_predict = 32;          // -n; -1 = until end of generation or a full context
  int n_ctx = 0;               // 0 = prompt + n_predict (with n_predict -1: the model's trained context)
  bool ignore_eos = false;     // --ignore-eos: end-of-generation tokens are never sampled
  // -r: a reply ends as soon as its text contains one of these (llama.cpp's reverse
  // prompts: checked over the text the last token added, with what came just before it).
  // The token that completed it is shown and kept; an interactive run then reads the
  // next input, which follows it in the context.
  std::vector<std::string> reverse_prompts;
  SamplerOptions sampler;
  MemoryOptions memory;        // tiers and budgets
  // --mlock given (off, try, require, or bare). Otherwise memory.mlock's kTry is the
  // default: the host tier is locked where the process may lock it (CAP_IPC_LOCK, or
  // an RLIMIT_MEMLOCK that holds it), and left unlocked, silently, where it may not,
  // instead of warning on every run of an unprivileged user who asked for nothing.
  bool mlock_asked = false;
  bool auto_host = false;      // --host auto: RunSession sizes memory.host_bytes (AutoHostBytes)
  uint64_t auto_host_floor = 0;  // --host auto's least budget without device or disk tiers (serve: kAutoHostFloor)
  bool auto_frame = false;     // --frame auto: RunSession picks memory.frame_bytes (AutoFrameBytes)
  KvCodec kv_type = KvCodec::kF16;
  std::string session;         // "" = no session file
  // The shared KV cache on Redis (docs/remote.md): the prompt's blocks are looked up
  // there after the session's, and the run's full blocks published at its end. url "" = none.
  RemoteOptions remote;
  int threads = 0;             // 0 = all cores
  int dump_logits = 0;         // first and last N prompt positions, plus every step
  // Weights as pages under the budgets (Model::UseMemory) or read in place from the
  // mapping. Auto: paged with a Device or Disk tier, or when the weight pages and the
  // context's KV cache fit the Host budget together; otherwise (a Host tier alone, too
  // small) in place: the CPU computes from host memory, which the mapping already is,
  // and pages that do not fit would be copied out of it again every token.
  enum class Weights { kAuto, kPaged, kMapped };
  Weights weights = Weights::kAuto;
  bool prefetch = true;        // the decoder's prefetch pipeline (ModelOptions::prefetch)
  // llama.cpp's summation orders (ModelOptions::llama_attention_sums; an f16 cache), for
  // bit-exact comparisons only: off by default, whatever the context (docs/cli.md;
  // docs/decisions/2026-12-06-llama-sums-opt-in.md).
  enum class LlamaSums { kOff, kOn };
  LlamaSums llama_sums = LlamaSums::kOff;
  int kv_batch_blocks = 0;     // ModelOptions::kv_batch_blocks (0 = automatic)
  int attn_topk = 0;           // ModelOptions::attn_topk (--attn-topk; 0 = full attention)
  // Experts with a device tier (ModelOptions::expert_split; --expert-split): kAuto here,
  // the cost model's split; kDevice copies every miss; kHost computes every miss on the CPU.
  ModelOptions::ExpertSplit expert_split = ModelOptions::ExpertSplit::kAuto;
  int expert_admit = 1;        // ModelOptions::expert_admit (--expert-admit)
  int batch = 64;              // prompt tokens per ForwardBatch chunk (-b; the same logits for any value)
  RopeOverrides rope;          // --rope-* / --yarn-* (ModelOptions::rope)
  // Called with each generated token's text as soon as it is sampled (streaming
  // output), and with the prompt's when echo_prompt; null = none. RunReport::text has the
  // whole generated text either way. Returns false when the text could not be shown
  // (standard output failed: a full disk, a closed pipe): generation ends there as at a
  // stop (the session is still saved), nothing more is shown, and the report says
  // output_failed.
  std::function<bool(std::string_view)> on_text;
  // Called after each prefill chunk with the prompt tokens computed so far and their
  // total (this run's, the reused prefix excluded); null = none.
  std::function<void(int done, int total)> on_prefill;
  // The same moment with what a progress line shows: where the prefill is in the whole
  // context, and each tier's residency ("device 64.0 / 64.0 MiB, host ..."); null = none.
  struct PrefillProgress {
    int done = 0, total = 0;    // as on_prefill
    int position = 0, end = 0;  // tokens the context holds now, and will hold after it
    std::string residency;
  };
  std::function<void(const PrefillProgress&)> on_prefill_progress;
  // Seconds between saves of the session during a long prefill (0: none): a run killed
  // there (SIGKILL, power) resumes from the last save instead of from the start.
  double prefill_save_seconds = 60;
  // -i, interactive: after each reply, next_turn() gives the next input (nullopt ends
  // the conversation). With chat it is the next user turn (FormatChatContinuation);
  // without, raw text appended as it is. An empty prompt takes its first input from
  // next_turn() as well. n_predict limits each reply (-1: until end of generation or a
  // full context); a context full ends the conversation. With a session file, the
  // session is saved after every reply. null = one prompt, one reply.
  std::function<std::optional<std::string>()> next_turn;
  // Set from outside (a SIGINT handler) to stop. During a prefill: the run ends after
  // the current chunk, generating nothing, and the session (when given) holds the
  // tokens computed so far, so the next run with the same prompt resumes there
  // (RunReport::interrupted). During a reply: the reply ends (RunReport::stopped) and
  // an interactive run asks for the next input. RunSession clears it once handled.
  std::atomic<bool>* stop = nullptr;
};

// One reply of an interactive run.
struct TurnReport {
  std::string input;       // the text given (the prompt, for the first turn)
  int input_tokens = 0;    // tokens it added to the context
  int generated = 0;       // tokens sampled for the reply
  std::string text;        // the reply
  std::string reverse_prompt;  // the -r string that ended it ("" = none did)
  StopReason stop_reason = StopReason::kNone;
};

struct LogitsEntry {
  int pos = 0;
  std::vector<std::pair<int32_t, float>> top;  // 10 largest
  double logsumexp = 0;
};

struct RunReport {
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> generated_tokens;
  std::string text;  // the generated text
  double warmup_s = 0, restore_s = 0, prefill_s = 0, decode_s = 0;
  // Prompt tokens computed (not reused from the session): after a stop, those computed
  // before it (an interactive input dropped part way included), so that prefill_s /
  // prefill_tokens is the rate reached.
  int prefill_tokens = 0;
  uint64_t seed = 0;       // the sampling seed used (-s -1's random one included), to repeat the run
  std::vector<TierStats> tiers;
  // The tiers' counters when the prompt's prefill began and ended: the report's
  // per-tier traffic during prefill and during decode (what followed) are differences.
  std::vector<TierStats> tiers_prefill_start, tiers_prefill_end;
  DecodeCounters decoder;     // the paged decoder's counters over prefill and decode
  // Hybrid experts (--expert-split with a device tier): whether on, the split used and
  // the cost model's rates at the end (what it measured).
  bool hybrid_experts = false;
  ModelOptions::ExpertSplit expert_split = ModelOptions::ExpertSplit::kDevice;
  ExpertSplitRates expert_rates;
  double copy_busy_s = 0;     // the copy stream's busy time over the same span
  std::string kv_type;
  bool llama_sums = false;  // llama.cpp's summation orders taken (RunOptions::llama_sums resolved)
  bool paged_weights = false;  // what --weights (auto) chose
  std::string chat;            // the chat format used ("" without --chat)
  std::string rope;  // the RoPE settings used: "yarn x4 base 1000000 from 32768 attn 1 beta 32/1"
  int kv_tokens = 0;
  uint64_t frame_bytes = 0;  // the frame size the run used
  // How the host budget was chosen: "--host" when given, else --host auto's reason
  // ("auto: the KV cache of 4096 tokens (4.00 MiB) + ...").
  std::string host_budget;
  int threads = 0;           // the kernels' threads (the caller included)
  uint64_t kv_bytes = 0;
  std::string session_path;
  int restored_tokens = 0;
  int remote_tokens = 0;                // prompt tokens fetched from the remote cache
  std::optional<RemoteStats> remote;    // with --remote: its counters at the end
  int reused_prefix_tokens = 0;
  bool saved = false;
  std::vector<LogitsEntry> logits;  // with dump_logits
  std::vector<LogitsEntry> steps;
  bool interrupted = false;   // RunOptions::stop ended the prefill
  bool stopped = false;       // RunOptions::stop ended a reply
  bool context_full = false;  // generation (or a next input) met the end of the context
  std::string reverse_prompt;  // the -r string that ended the (last) reply ("" = none)
  // Why the (last) reply ended; kInterrupted also for a stopped prefill, kContextFull
  // for an interactive input that left no room to reply.
  StopReason stop_reason = StopReason::kNone;
  bool output_failed = false;  // on_text returned false: the text was not all shown
  int n_ctx = 0;              // the context the run was sized for
  std::vector<TurnReport> turns;  // interactive runs: one per reply

};

// The first of `prompts` (-r) that `text` contains where its last `added` bytes could
// complete it (searched in the new text with the prompt's length - 1 bytes before it;
// llama.cpp searches only the last prompt-length bytes, so it misses a prompt inside a
// token that also holds more text), or null.
const std::string* ReversePromptEnding(const std::vector<std::string>& prompts, std::string_view text, size_t added);

// The model identity stored in session files: architecture, every tensor's name,
// type and shape and the first 4 KiB of its data, and the RoPE parameters. The
// description names the model and its weight types by share of bytes, so that a
// refusal tells two quantizations of one model apart.
ModelFingerprint FingerprintOf(const GgufFile& file);

// --frame auto (docs/cli.md): 1 MiB frames, whose KV blocks attention streams faster,
// when the context is long (n_ctx >= kAutoFrameLongContext), every tier with a budget
// holds at least kAutoFrameMinFrames of them, and the weight pages lose little to the
// larger grain (what their rounding to 1 MiB frames adds over 256 KiB is at most 1/16 of
// the smallest budget: many small experts keep 256 KiB); 256 KiB otherwise. A session
// file to restore decides instead: the frame its blocks were made for (the power of two
// at or above its block bytes), so that restoring never meets a different block size.
// weights_256k / weights_1m: Model::WeightPageBytes at each size (0 when the weights are
// read in place); session_block_bytes: 0 when there is no session file to restore.
inline constexpr int kAutoFrameLongContext = 16384;
inline constexpr uint64_t kAutoFrameMinFrames = 64;
uint64_t AutoFrameBytes(int n_ctx, const MemoryOptions& memory, uint64_t weights_256k, uint64_t weights_1m,
                        uint64_t session_block_bytes);

// --host auto (the default; docs/cli.md): with a device or a disk tier, kAutoHostFloor
// (1 GiB: a hierarchy the user laid out); otherwise what the run needs, at least
// floor_bytes: the context's KV cache (n_ctx tokens in blocks of max(frame, 1 MiB)) and
// paged_bytes of weight pages (--weights paged), plus 1/16 and two 1 MiB frames (a
// block copied on write), and with weight pages 64 MiB for their working set; at most
// kAutoHostAvailablePercent of what available_bytes (MemAvailable; 0 = unknown, no cap)
// leaves besides mapped_bytes (weights read in place from the page cache). So resident
// memory follows the model and the context, not a fixed gigabyte (`tierkv serve` asks
// for floor_bytes = kAutoHostFloor: room for warm conversations besides the one).
// A capped budget may be too small: CheckKvFits then refuses the context, naming it.
inline constexpr uint64_t kAutoHostFloor = 1ull << 30;
inline constexpr int kAutoHostAvailablePercent = 90;
struct AutoHost {
  uint64_t bytes = 0;
  uint64_t usable_bytes = 0;  // available_bytes less mapped_bytes
  uint64_t mapped_bytes = 0;
  bool capped = false;  // the need was above the cap
  std::string why;      // what the budget holds, for the report ("" with a device or disk tier)
};
AutoHost AutoHostBytes(int n_ctx, const KvGeometry& geometry, const MemoryOptions& memory, uint64_t available_bytes,
                       uint64_t mapped_bytes = 0, uint64_t paged_bytes = 0, uint64_t floor_bytes = 0);

// A loaded model and what it runs in: the tiers (sized from options' budgets for
// contexts of n_ctx tokens), the model (weights paged or read in place) and an empty KV
// cache. What RunSession opens for one run and `tierkv serve` once for its slots.
struct Runtime {
  std::shared_ptr<const GgufFile> file;
  // Declared before the model and the cache: destroyed after them, whose pages it holds.
  std::unique_ptr<MemoryManager> mm;
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCache> cache;
  ModelFingerprint fingerprint;  // for session files (OpenRuntime's `fingerprint`; else empty)
  std::string rope;              // RunReport::rope
  bool paged_weights = false;
  bool llama_sums = false;
  uint64_t frame_bytes = 0;
  double warmup_s = 0;
  int threads = 0;
  std::string host_budget;  // RunReport::host_budget
};
// `config`: ReadModelConfig(*file). The budgets are checked against a context of n_ctx
// tokens (CheckKvFits: one clear error when they cannot hold it). With --frame auto, a
// session file at options.session decides the frame. fingerprint: compute
// Runtime::fingerprint (a page of every tensor is read).
Result<std::unique_ptr<Runtime>> OpenRuntime(const RunOptions& options, std::shared_ptr<const GgufFile> file,
                                             const ModelConfig& config, int n_ctx, bool fingerprint);

Result<RunReport> RunSession(const RunOptions& options);

}  // namespace tierkv
