// runtime/run.cc
#include "runtime/run.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>

#include <linux/capability.h>
#include <linux/magic.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "kernels/cpu_features.h"
#include "kernels/executor.h"
#include "kernels/quant.h"
#include "kvcache/checksum.h"
#include "kvcache/kv_cache.h"
#include "kvcache/session_lock.h"
#include "memory/meminfo.h"
#include "memory/size.h"
#include "memory/tier_backend.h"
#include "runtime/builtin_model.h"
#include "runtime/chat_template.h"
#include "runtime/generator.h"
#include "runtime/model.h"
#include "runtime/tokenizer.h"
#include "runtime/unicode.h"

namespace tierkv {

namespace {

// Each present tier's use against its budget: "device 64.0 MiB / 64.0 MiB, host ...".
std::string Residency(const MemoryManager& mm) {
  std::string out;
  for (int t = 0; t < kNumTiers; ++t) {
    if (!mm.has_tier(TierAt(t))) continue;
    const TierStats st = mm.Stats(TierAt(t));
    if (!out.empty()) out += ", ";
    out += std::string(TierName(TierAt(t))) + " " + FormatBytes(st.used_bytes.current) + " / " +
           FormatBytes(st.frames * st.frame_bytes);
  }
  return out;
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

LogitsEntry Entry(int pos, std::span<const float> logits) {
  return LogitsEntry{pos, TopLogits(logits, 10), LogSumExp(logits)};
}

// Whether the decoder computes on pages of the device tier: the simulated device is host
// memory the CPU executor computes on; --device cuda computes on the GPU (the CUDA
// executor), so VRAM holds the weights and KV blocks it reads.
bool DecoderUsesDevice(const MemoryOptions& m) { return m.device != DeviceKind::kNone; }

// The context's KV blocks (one frame each) must fit in all tiers together, or the run
// would fail when the cache fills, after the prefill's work: refused before it starts
// (and before the warmup touches the arenas).
// host_note: how the host budget was chosen when the user did not ("" when they did).
Status CheckKvFits(int n_ctx, const KvGeometry& g, const MemoryOptions& m, const std::string& host_note) {
  const uint64_t frame = m.frame_bytes;
  if (frame == 0) return Status::Ok();  // MemoryManager::Create names that problem
  TIERKV_ASSIGN_OR_RETURN(const int block_tokens, KvCache::BlockTokensFor(g, frame));
  const uint64_t blocks = static_cast<uint64_t>(g.n_layers) *
                          ((static_cast<uint64_t>(n_ctx) + block_tokens - 1) / static_cast<uint64_t>(block_tokens));
  uint64_t frames = 0;
  std::string held;
  const auto add = [&](Tier t, uint64_t budget) {
    frames += budget / frame;
    held += std::string(held.empty() ? "" : " + ") + TierName(t) + " " + FormatBytes(budget);
  };
  if (DecoderUsesDevice(m)) add(Tier::kDevice, m.device_bytes);
  add(Tier::kHost, m.host_bytes);
  held += host_note;
  if (m.disk_bytes > 0) add(Tier::kDisk, m.disk_bytes);
  if (blocks <= frames) return Status::Ok();
  return Status::InvalidArgument(
      "impossible budget: a context of " + std::to_string(n_ctx) + " tokens needs " + FormatBytes(blocks * frame) +
      " of KV cache (" + std::to_string(blocks) + " blocks of " + FormatBytes(frame) + "), more than all tiers hold (" +
      held + "); raise --host, add --disk SIZE, or lower -c (by default the prompt plus -n)");
}

// The RoPE settings that shape the cached K (stored after RoPE), as text.
std::string RopeKey(const ModelConfig& c) {
  char buf[192];
  std::snprintf(buf, sizeof(buf), "%s x%.9g base %.9g from %d attn %.9g beta %.9g/%.9g", RopeScalingName(c.rope_scaling),
                c.rope_scale_factor, c.rope_freq_base, c.rope_orig_ctx, c.yarn_attn_factor, c.yarn_beta_fast,
                c.yarn_beta_slow);
  return buf;
}

// Sessions hold K after RoPE, so a run whose RoPE settings differ from the file's
// (--rope-* / --yarn-* flags) must not share sessions with the file's defaults: its
// fingerprint mixes the settings in, and its description names them. Called only when
// flags were given (settings spelled out equal to the file's change nothing).
ModelFingerprint WithRope(ModelFingerprint fp, const GgufFile& file, const ModelConfig& used) {
  auto from_file = ReadModelConfig(file);
  const std::string key = RopeKey(used);
  if (from_file.ok() && RopeKey(*from_file) == key) return fp;
  const std::string mixed = std::to_string(fp.hash) + ";rope " + key;
  return ModelFingerprint{Checksum(mixed.data(), mixed.size()), fp.description + ", RoPE " + key};
}

// --weights auto (RunOptions::Weights): paged with a device or disk tier (a hierarchy
// the user asked for), or when the weight pages and the context's KV cache (f16, the
// largest codec) fit the host budget together.
bool PageWeights(const RunOptions& o, const MemoryOptions& m, const Model& model, int n_ctx) {
  switch (o.weights) {
    case RunOptions::Weights::kPaged: return true;
    case RunOptions::Weights::kMapped: return false;
    case RunOptions::Weights::kAuto: break;
  }
  if (m.device != DeviceKind::kNone || m.disk_bytes > 0) return true;
  const ModelConfig& c = model.config();
  const uint64_t kv = 4ull * static_cast<uint64_t>(c.n_layer) * static_cast<uint64_t>(c.n_head_kv) *
                      static_cast<uint64_t>(c.head_dim) * static_cast<uint64_t>(n_ctx);
  return model.WeightPageBytes(256 * kKiB) + kv <= m.host_bytes;
}

// Budgets held in RAM beyond what the machine has available: an explicit --host that
// warm-up or mlock would touch, or a --disk in a RAM-backed directory (tmpfs, such as
// /dev/shm) that the disk tier's preallocation fills, would end in the kernel's
// out-of-memory killer rather than an error line. --host auto is capped already.
Status CheckMemoryBudgets(const MemoryOptions& m) {
  const auto meminfo = ReadMeminfo();
  if (!meminfo.ok() || meminfo->available_bytes == 0) return Status::Ok();
  const uint64_t available = meminfo->available_bytes;
  if ((m.warmup || m.mlock != MlockMode::kOff) && m.host_bytes > available) {
    return Status::InvalidArgument("impossible budget: --host " + FormatBytes(m.host_bytes) + " is more than the " +
                                   FormatBytes(available) +
                                   " of memory available; lower --host (or --host auto), add --disk SIZE, or give "
                                   "--no-warmup --mlock off to reserve it untouched");
  }
  const uint64_t host_in_ram = m.warmup || m.mlock != MlockMode::kOff ? m.host_bytes : 0;
  // --device sim's arena is host memory too, touched by the warm-up.
  const uint64_t sim_in_ram = m.device == DeviceKind::kSim && m.warmup ? m.device_bytes : 0;
  const std::string with_host = host_in_ram > 0 ? " with --host " + FormatBytes(host_in_ram) : "";
  if (sim_in_ram > 0 && sim_in_ram + host_in_ram > available) {
    return Status::InvalidArgument("impossible budget: --vram " + FormatBytes(sim_in_ram) +
                                   " of --device sim (held in host memory)" + with_host + " is more than the " +
                                   FormatBytes(available) +
                                   " of memory available; lower --vram or --host, or give --no-warmup");
  }
  struct statfs fs {};
  if (m.disk_bytes > 0 && statfs(m.disk_dir.c_str(), &fs) == 0 && fs.f_type == TMPFS_MAGIC) {
    if (m.disk_bytes + host_in_ram + sim_in_ram > available) {
      return Status::InvalidArgument("impossible budget: --disk " + FormatBytes(m.disk_bytes) + " in " + m.disk_dir +
                                     " (RAM-backed)" + with_host +
                                     (sim_in_ram > 0 ? " and --vram " + FormatBytes(sim_in_ram) + " of --device sim" : "") +
                                     " is more than the " + FormatBytes(available) +
                                     " of memory available; lower --disk or --host, or put --disk-dir on a disk");
    }
  }
  return Status::Ok();
}

// ", --host auto: 90% of the 3.20 GiB available" when the automatic host budget was
// capped by the machine's memory, else "".
std::string AutoHostNote(const AutoHost& h) {
  if (!h.capped) return "";
  std::string note = ", --host auto: " + std::to_string(kAutoHostAvailablePercent) + "% of the " +
                     FormatBytes(h.usable_bytes) + " available";
  if (h.mapped_bytes > 0) note += " besides " + FormatBytes(h.mapped_bytes) + " of weights read in place";
  return note;
}

// Whether this process may mlock `bytes` (RunOptions::mlock_asked): CAP_IPC_LOCK
// ignores RLIMIT_MEMLOCK; without it the soft limit must hold them.
bool MayLock(uint64_t bytes) {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &header, data) == 0 &&
      (data[CAP_TO_INDEX(CAP_IPC_LOCK)].effective & CAP_TO_MASK(CAP_IPC_LOCK)) != 0) {
    return true;
  }
  return MemlockLimitBytes() >= bytes;
}

// The KV geometry a model of this config has (Model::KvGeometryFor), known before the
// model loads.
KvGeometry GeometryOf(const ModelConfig& c, KvCodec codec) {
  KvGeometry g;
  g.n_layers = c.n_layer;
  g.n_kv_heads = c.n_head_kv;
  g.head_dim = c.head_dim;
  g.codec = codec;
  return g;
}

// At best, how many tokens of KV cache the tiers hold: each budget in frames, the host's
// at the most --host auto may take, and with --frame auto the frame (64 KiB .. 4 MiB)
// that holds the most. Known before the model loads and the prompt is tokenized, so a
// context (or a prompt) past it is refused before that work; `memory` and `host_note`
// are the budgets it assumed, for CheckKvFits' message. Once the frame and the host
// budget are settled, CheckKvFits checks the context itself.
struct TiersHold {
  int64_t tokens = std::numeric_limits<int32_t>::max();  // no bound known
  MemoryOptions memory;
  std::string host_note;
};
TiersHold KvTokensTiersHold(const KvGeometry& g, const RunOptions& o, int n_ctx_hint, uint64_t mapped) {
  TiersHold best;
  best.memory = o.memory;
  MemoryOptions m = o.memory;
  std::string note;
  if (o.auto_host) {
    const auto meminfo = ReadMeminfo();
    const uint64_t available = meminfo.ok() ? meminfo->available_bytes : 0;
    // With device or disk tiers the floor; else as much as any context could get.
    const AutoHost h = AutoHostBytes(std::numeric_limits<int32_t>::max(), g, m, available, mapped);
    if (available == 0 && !DecoderUsesDevice(m) && m.disk_bytes == 0) return best;  // no cap known
    m.host_bytes = h.bytes;
    note = AutoHostNote(h);
  }
  std::vector<uint64_t> frames = {m.frame_bytes};
  if (o.auto_frame) {
    frames = {AutoFrameBytes(n_ctx_hint, m, 0, 0, 0)};
    for (uint64_t f = 64 * kKiB; f <= 4 * kMiB; f *= 2) frames.push_back(f);
  }
  bool any = false;
  for (const uint64_t f : frames) {
    if (f == 0 || g.n_layers <= 0) continue;
    const auto block_tokens = KvCache::BlockTokensFor(g, f);
    if (!block_tokens.ok()) continue;
    uint64_t n = m.host_bytes / f + m.disk_bytes / f;
    if (DecoderUsesDevice(m)) n += m.device_bytes / f;
    const uint64_t tokens = n / static_cast<uint64_t>(g.n_layers) * static_cast<uint64_t>(*block_tokens);
    const int64_t t = static_cast<int64_t>(std::min<uint64_t>(tokens, std::numeric_limits<int32_t>::max()));
    if (!any || t > best.tokens) {
      best.tokens = t;
      best.memory = m;
      best.memory.frame_bytes = f;
      best.host_note = note;
      any = true;
    }
  }
  return best;
}

// "the model's trained context (32768 tokens)" or, with RoPE scaling in effect, "the
// 131072 tokens the model reaches with RoPE yarn x4 (trained context 32768)".
std::string UsableContextText(int usable, const ModelConfig& file_config, const RopeOverrides& rope) {
  ModelConfig c = file_config;
  if (!ApplyRopeOverrides(rope, 0, &c).ok() || c.rope_scaling == RopeScaling::kNone ||
      usable == file_config.context_length) {
    return "the model's trained context (" + std::to_string(file_config.context_length) + " tokens)";
  }
  char factor[32];
  std::snprintf(factor, sizeof factor, "%.9g", c.rope_scale_factor);
  return "the " + std::to_string(usable) + " tokens the model reaches with RoPE " + RopeScalingName(c.rope_scaling) +
         " x" + factor + " (trained context " + std::to_string(file_config.context_length) + ")";
}

// What extends the usable context: the RoPE flags, or a larger factor.
std::string ExtendContextHint(const ModelConfig& file_config, const RopeOverrides& rope) {
  ModelConfig c = file_config;
  if (ApplyRopeOverrides(rope, 0, &c).ok() && c.rope_scaling != RopeScaling::kNone) return "raise --rope-scale";
  const std::string trained = std::to_string(file_config.context_length);
  return "--rope-scaling yarn --rope-scale F (or linear) runs it at up to F x " + trained + " tokens";
}

}  // namespace

int UsableContext(const ModelConfig& file_config, const RopeOverrides& rope) {
  ModelConfig c = file_config;
  // --rope-scaling linear|yarn without a factor, where the file has none of that type:
  // the factor is the context asked for over the trained one, so any context is usable.
  const bool file_factor = rope.scaling.has_value() && *rope.scaling == file_config.rope_scaling &&
                           file_config.rope_scale_factor > 1.0f;
  if (rope.scaling.has_value() && *rope.scaling != RopeScaling::kNone && rope.scale_factor == 0.0f && !file_factor) {
    return 0;
  }
  if (!ApplyRopeOverrides(rope, 0, &c).ok() || c.rope_scaling == RopeScaling::kNone) return c.context_length;
  const double scaled = static_cast<double>(c.rope_orig_ctx) * static_cast<double>(c.rope_scale_factor);
  const double usable = std::max(static_cast<double>(c.context_length), std::floor(scaled));
  return static_cast<int>(std::min(usable, static_cast<double>(std::numeric_limits<int32_t>::max())));
}

size_t MaxTokenInputBytes(const Tokenizer& tok) {
  size_t longest = 4;  // an unknown token stands for one UTF-8 character, up to 4 bytes
  for (int32_t id = 0; id < tok.n_vocab(); ++id) longest = std::max(longest, tok.TokenToPiece(id, true).size());
  return longest;
}

size_t PromptBytesPerToken(const Tokenizer& tok, size_t max_token_bytes, std::string_view text) {
  if (tok.kind() != TokenizerKind::kBpe) return max_token_bytes;
  for (size_t i = 0; i < text.size();) {
    const size_t n = unicode::WellFormedUtf8Len(text, i);
    if (n == 0) return 4 * max_token_bytes;  // an overlong form may decode to 1/4 of its bytes
    i += n;
  }
  return max_token_bytes;
}

const char* StopReasonName(StopReason reason) {
  switch (reason) {
    case StopReason::kNone: return "none";
    case StopReason::kEog: return "eog";
    case StopReason::kLimit: return "limit";
    case StopReason::kContextFull: return "context_full";
    case StopReason::kReversePrompt: return "reverse_prompt";
    case StopReason::kInterrupted: return "interrupted";
    case StopReason::kOutputFailed: return "output_failed";
  }
  return "none";
}

const std::string* ReversePromptEnding(const std::vector<std::string>& prompts, std::string_view text, size_t added) {
  for (const std::string& p : prompts) {
    if (p.empty() || text.size() < p.size()) continue;
    const size_t from = text.size() - std::min(text.size(), added + p.size() - 1);
    if (text.find(p, from) != std::string_view::npos) return &p;
  }
  return nullptr;
}

// Data bytes per tensor that enter a model's fingerprint: enough to tell two sets of
// weights apart, few enough that a fingerprint of a file on a slow disk costs a read of
// one page per tensor.
constexpr uint64_t kFingerprintSampleBytes = 4096;

ModelFingerprint FingerprintOf(const GgufFile& file) {
  std::string key = std::string(file.architecture()) + ";";
  // Bytes of weights per type, for the description.
  std::vector<std::pair<uint64_t, std::string>> by_type;
  for (const GgufTensor& t : file.tensors()) {
    key.append(t.name).append(":").append(std::to_string(static_cast<int>(t.type)));
    for (int64_t d : t.ne) key.append(",").append(std::to_string(d));
    // The first bytes of the data: two files of the same shapes and types (a fine-tune
    // and its base) hold different weights, and a session of one is not the other's.
    const size_t sample = static_cast<size_t>(std::min<uint64_t>(t.n_bytes, kFingerprintSampleBytes));
    key.append("#").append(std::to_string(Checksum(t.data, sample))).append(";");
    const std::string type = GgmlTypeName(t.type);
    auto it = std::find_if(by_type.begin(), by_type.end(), [&](const auto& e) { return e.second == type; });
    if (it == by_type.end()) {
      by_type.emplace_back(t.n_bytes, type);
    } else {
      it->first += t.n_bytes;
    }
  }
  const std::string arch(file.architecture());
  for (const char* k : {".rope.freq_base", ".rope.dimension_count", ".rope.scaling.type", ".rope.scaling.factor"}) {
    if (const GgufValue* v = file.Find(arch + k)) key += std::string(k) + "=" + FormatGgufValue(*v, {}) + ";";
  }
  const uint64_t hash = Checksum(key.data(), key.size());
  // Largest share first: "Q4_K + Q6_K + F32".
  std::stable_sort(by_type.begin(), by_type.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string types;
  for (const auto& [bytes, name] : by_type) types.append(types.empty() ? "" : " + ").append(name);
  std::string desc = arch + ", " + std::to_string(file.tensors().size()) + " tensors, " +
                     std::to_string(file.parameter_count()) + " parameters, " + types;
  if (auto name = file.GetString("general.name"); name.ok()) desc = std::string(*name) + " (" + desc + ")";
  return ModelFingerprint{hash, desc};
}

uint64_t AutoFrameBytes(int n_ctx, const MemoryOptions& m, uint64_t weights_256k, uint64_t weights_1m,
                        uint64_t session_block_bytes) {
  constexpr uint64_t kSmall = 256 * kKiB, kLarge = kMiB;
  if (session_block_bytes > 0) {
    uint64_t f = 64 * kKiB;
    while (f < session_block_bytes && f < 4 * kMiB) f *= 2;
    return f;
  }
  if (n_ctx < kAutoFrameLongContext) return kSmall;
  // The smallest budget of a tier that exists.
  uint64_t smallest = m.host_bytes;
  if (m.device != DeviceKind::kNone) smallest = std::min(smallest, m.device_bytes);
  if (m.disk_bytes > 0) smallest = std::min(smallest, m.disk_bytes);
  if (smallest < kAutoFrameMinFrames * kLarge) return kSmall;
  const uint64_t extra = weights_1m > weights_256k ? weights_1m - weights_256k : 0;
  if (extra > smallest / 16) return kSmall;
  return kLarge;
}

AutoHost AutoHostBytes(int n_ctx, const KvGeometry& g, const MemoryOptions& m, uint64_t available_bytes,
                       uint64_t mapped_bytes, uint64_t paged_bytes, uint64_t floor_bytes) {
  AutoHost h;
  h.bytes = kAutoHostFloor;
  h.mapped_bytes = mapped_bytes;
  // The weights read in place stay in the page cache, out of the arena's way.
  h.usable_bytes = available_bytes - std::min(available_bytes, mapped_bytes);
  // A device tier the decoder computes on, or a disk tier, is a hierarchy the user laid
  // out: the host keeps the floor.
  if (DecoderUsesDevice(m) || m.disk_bytes > 0) return h;
  h.bytes = floor_bytes;
  // The KV cache in blocks of the frame, at least 1 MiB (the largest grain --frame auto
  // picks, and the most rounding), the weight pages asked for, plus 1/16 and two
  // frames (a block copied on write, rounding), and 64 MiB for the working set of
  // weight pages when there are any.
  const uint64_t frame = std::max<uint64_t>(m.frame_bytes, kMiB);
  const auto block_tokens = KvCache::BlockTokensFor(g, frame);
  if (!block_tokens.ok()) return h;  // CheckKvFits / KvCache::Create name the problem
  const uint64_t per_layer = (static_cast<uint64_t>(n_ctx) + static_cast<uint64_t>(*block_tokens) - 1) /
                             static_cast<uint64_t>(*block_tokens);
  const uint64_t kv = static_cast<uint64_t>(g.n_layers) * per_layer * frame;
  uint64_t need = kv + paged_bytes;
  need += need / 16 + 2 * frame + (paged_bytes > 0 ? 64 * kMiB : 0);
  need = (need + kMiB - 1) / kMiB * kMiB;
  h.why = "auto: the KV cache of " + std::to_string(n_ctx) + " tokens (" + FormatBytes(kv) + ")";
  if (paged_bytes > 0) h.why += " + weight pages (" + FormatBytes(paged_bytes) + ")";
  h.why += " + " + FormatBytes(need - kv - paged_bytes) + " of room";
  if (need <= h.bytes) {
    h.why += "; at least " + FormatBytes(h.bytes);
    return h;
  }
  const uint64_t cap = h.usable_bytes / 100 * kAutoHostAvailablePercent / kMiB * kMiB;
  if (available_bytes > 0 && need > cap) {
    h.capped = true;
    h.bytes = std::max(h.bytes, cap);
    h.why += "; capped to " + std::to_string(kAutoHostAvailablePercent) + "% of the available memory";
    return h;
  }
  h.bytes = need;
  return h;
}

// --device cuda: the CUDA executor, or one line saying why not (no CUDA in this build,
// no device, a KV type or option it does not take).
Result<std::shared_ptr<kernels::Executor>> CudaExecutorFor(const RunOptions& o, const ModelConfig& config) {
  std::string why;
  std::shared_ptr<kernels::Executor> exec = kernels::MakeExecutor("cuda", o.threads, &why);
  if (exec == nullptr) return Status::Unsupported("--device cuda: " + why + "; use --device sim or none to compute on the CPU");
  TIERKV_ASSIGN_OR_RETURN(auto codec, VectorCodec::Create(o.kv_type, config.head_dim, 0));
  if (!exec->SupportsKv(codec->desc())) {
    return Status::Unsupported(std::string("--device cuda: the CUDA executor does not take --kv-type ") +
                               KvCodecName(o.kv_type) + " with head_dim " + std::to_string(config.head_dim) +
                               " (f16, q8_0 and q4_0, head_dim a multiple of 32 up to 256)");
  }
  if (o.attn_topk > 0) return Status::Unsupported("--device cuda: --attn-topk is not on the CUDA executor yet");
  return exec;
}

Result<std::unique_ptr<Runtime>> OpenRuntime(const RunOptions& o, std::shared_ptr<const GgufFile> file,
                                              const ModelConfig& config, int n_ctx, bool fingerprint) {
  auto rt = std::make_unique<Runtime>();
  rt->file = file;
  ModelOptions mo;
  mo.threads = o.threads;
  mo.n_ctx = n_ctx;
  mo.prefetch = o.prefetch;
  mo.llama_attention_sums = o.kv_type == KvCodec::kF16 && o.llama_sums == RunOptions::LlamaSums::kOn;
  mo.kv_batch_blocks = o.kv_batch_blocks;
  mo.attn_topk = o.attn_topk;
  mo.expert_split = o.expert_split;
  mo.expert_admit = o.expert_admit;
  // The cost model's copy rate: --device sim's throttle (0: unthrottled, free), else the
  // prior of a PCIe 4.0 x8 card (ExpertSplitRates).
  if (o.memory.device == DeviceKind::kSim) mo.expert_rates.copy = o.memory.sim_gbps * 1e9;
  mo.rope = o.rope;
  if (o.memory.device == DeviceKind::kCuda) {
    TIERKV_ASSIGN_OR_RETURN(mo.executor, CudaExecutorFor(o, config));
  }
  if (mo.executor != nullptr && mo.llama_attention_sums) {
    spdlog::warn("--llama-sums: the CUDA executor sums in its own orders (docs/gpu.md); ignored");
    mo.llama_attention_sums = false;
  }
  // The memory manager is created once the frame size is known (Runtime: destroyed
  // after the model, whose pages it holds).
  TIERKV_ASSIGN_OR_RETURN(rt->model, Model::Load(file, mo));
  Model* model = rt->model.get();
  MemoryOptions memory = o.memory;
  const KvGeometry kv_geometry = model->KvGeometryFor(o.kv_type);
  std::string host_note;
  if (o.auto_host) {
    const auto meminfo = ReadMeminfo();
    // Weights that may be read in place (all but --weights paged) keep their room in
    // the page cache; a builtin model's weights are already in memory.
    const uint64_t mapped = o.weights != RunOptions::Weights::kPaged && o.model.rfind(kBuiltinPrefix, 0) != 0
                                ? file->tensor_bytes()
                                : 0;
    // --weights paged asked for every weight page in the host tier: room for them too.
    const uint64_t paged = o.weights == RunOptions::Weights::kPaged
                               ? model->WeightPageBytes(std::max<uint64_t>(memory.frame_bytes, kMiB))
                               : 0;
    const AutoHost h = AutoHostBytes(n_ctx, kv_geometry, memory, meminfo.ok() ? meminfo->available_bytes : 0, mapped,
                                     paged, o.auto_host_floor);
    memory.host_bytes = h.bytes;
    host_note = AutoHostNote(h);
    rt->host_budget = h.why.empty() ? "auto: " + FormatBytes(h.bytes) + " beside the device or disk tier" : h.why;
  } else {
    rt->host_budget = "--host";
  }
  TIERKV_RETURN_IF_ERROR(CheckMemoryBudgets(memory));
  rt->paged_weights = PageWeights(o, memory, *model, n_ctx);
  if (o.auto_frame) {
    uint64_t session_block_bytes = 0;
    std::error_code ec;
    if (!o.session.empty() && std::filesystem::exists(o.session, ec)) {
      // A file that cannot be read is left to the restore below, which names the problem.
      if (auto summary = SessionFile::Inspect(o.session); summary.ok()) session_block_bytes = summary->block_bytes;
    }
    const uint64_t w_small = rt->paged_weights ? model->WeightPageBytes(256 * kKiB) : 0;
    const uint64_t w_large = rt->paged_weights ? model->WeightPageBytes(kMiB) : 0;
    memory.frame_bytes = AutoFrameBytes(n_ctx, memory, w_small, w_large, session_block_bytes);
  }
  rt->frame_bytes = memory.frame_bytes;
  TIERKV_RETURN_IF_ERROR(CheckKvFits(n_ctx, kv_geometry, memory, host_note));
  if (o.auto_host && memory.host_bytes > kAutoHostFloor) {
    spdlog::info("host tier: {} (--host auto: the KV cache of {} tokens{})", FormatBytes(memory.host_bytes), n_ctx,
                 host_note);
  }
  // A warm-up of gigabytes takes seconds (a 60 GiB --vram on sim: about half a minute):
  // say so up front rather than sit silent. (Not for the default 1 GiB host tier.)
  constexpr uint64_t kLoudWarmupBytes = 4ull << 30;
  const uint64_t warm_bytes = memory.warmup ? memory.host_bytes + memory.device_bytes + memory.disk_bytes : 0;
  if (warm_bytes >= kLoudWarmupBytes) {
    spdlog::info("warm-up: reserving and touching {} of tier memory (--no-warmup skips it)", FormatBytes(warm_bytes));
  }
  // The default --mlock try locks where the process may, silently; a warning about a
  // refused lock is for a run that asked for one (RunOptions::mlock_asked).
  if (!o.mlock_asked && memory.mlock == MlockMode::kTry && !MayLock(memory.host_bytes)) memory.mlock = MlockMode::kOff;
  const auto t_warm = std::chrono::steady_clock::now();
  TIERKV_ASSIGN_OR_RETURN(rt->mm, MemoryManager::Create(memory));
  rt->warmup_s = Since(t_warm);
  if (warm_bytes >= kLoudWarmupBytes) spdlog::info("warm-up took {:.1f} s", rt->warmup_s);
  if (rt->paged_weights) TIERKV_RETURN_IF_ERROR(model->UseMemory(rt->mm.get()));
  TIERKV_ASSIGN_OR_RETURN(rt->cache, KvCache::Create(rt->mm.get(), kv_geometry));
  rt->llama_sums = mo.llama_attention_sums;
  rt->threads = model->executor().threads();
  rt->rope = RopeKey(model->config());
  // The fingerprint reads a page of every tensor: only for runs with sessions.
  if (fingerprint) {
    rt->fingerprint = o.rope.any() ? WithRope(FingerprintOf(*file), *file, model->config()) : FingerprintOf(*file);
  }
  return rt;
}

Result<RunReport> RunSession(const RunOptions& o) {
  RunReport r;
  TIERKV_ASSIGN_OR_RETURN(std::shared_ptr<const GgufFile> file, OpenModelFile(o.model));
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::FromGguf(*file));
  TIERKV_RETURN_IF_ERROR(o.sampler.Validate());
  // One writer per session file: held from before anything reads it until the last
  // save, so a second run on it waits and then builds on this one's save.
  std::unique_ptr<SessionLock> session_lock;
  if (!o.session.empty()) {
    SessionLock::Options lo;
    lo.command = "tierkv run --model " + o.model;
    lo.on_wait = [&](const std::string& holder) {
      spdlog::info("waiting for session {}: in use by {} (Ctrl-C gives up)", o.session, holder);
    };
    lo.cancelled = [&] { return o.stop != nullptr && o.stop->load(std::memory_order_relaxed); };
    TIERKV_ASSIGN_OR_RETURN(session_lock, SessionLock::Acquire(o.session, lo));
    if (session_lock->leftovers_removed() > 0) {
      spdlog::info("removed {} file(s) left by crashed saves of {}", session_lock->leftovers_removed(), o.session);
    }
  }
  const bool interactive = static_cast<bool>(o.next_turn);
  std::optional<ChatFormat> format;
  if (o.chat) {
    auto detected = o.chat_template.empty() ? ModelChatFormat(*file) : DetectChatFormat(o.chat_template);
    if (!detected.ok()) {
      return detected.status().code() == StatusCode::kNotFound
                 ? Status::NotFound(detected.status().message() + "; give --chat-template chatml|llama3|llama2")
                 : detected.status();
    }
    format = *detected;
    r.chat = ChatFamilyName(format->family);
    // A format that cannot continue is refused at the first turn already.
    if (o.continue_chat || interactive) TIERKV_RETURN_IF_ERROR(FormatChatContinuation(*format, "").status());
  }
  // The model's shape: its trained context and its attention's size (the defaults below).
  TIERKV_ASSIGN_OR_RETURN(const ModelConfig config, ReadModelConfig(*file));
  // -c against the model's usable context (its trained one, or what the RoPE flags
  // extend it to): refused past it, naming both (docs/cli.md), before anything is
  // tokenized, loaded or allocated.
  const int usable_ctx = UsableContext(config, o.rope);
  if (o.n_ctx > 0 && usable_ctx > 0 && o.n_ctx > usable_ctx) {
    return Status::InvalidArgument("-c " + std::to_string(o.n_ctx) + " is past " +
                                   UsableContextText(usable_ctx, config, o.rope) + "; lower -c, or " +
                                   ExtendContextHint(config, o.rope));
  }
  // ... and against what the budgets can hold at best.
  const KvGeometry early_geometry = GeometryOf(config, o.kv_type);
  const uint64_t mapped_weights =
      o.weights != RunOptions::Weights::kPaged && o.model.rfind(kBuiltinPrefix, 0) != 0 ? file->tensor_bytes() : 0;
  const TiersHold hold =
      KvTokensTiersHold(early_geometry, o, o.n_ctx > 0 ? o.n_ctx : std::max(usable_ctx, 1), mapped_weights);
  if (o.n_ctx > 0 && o.n_ctx > hold.tokens) {
    TIERKV_RETURN_IF_ERROR(CheckKvFits(o.n_ctx, early_geometry, hold.memory, hold.host_note));
  }
  // The prompt, bounded before it is tokenized: a token stands for at most
  // MaxTokenInputBytes bytes of text, so more than (the most tokens the context can
  // take) x that cannot fit.
  int ctx_bound = o.n_ctx > 0 ? o.n_ctx : usable_ctx > 0 ? usable_ctx : std::numeric_limits<int32_t>::max();
  std::string bound_why = o.n_ctx > 0                           ? "-c"
                          : usable_ctx == config.context_length ? "the model's trained context"
                                                                : "the model's context with its RoPE scaling";
  if (hold.tokens < ctx_bound) {
    ctx_bound = static_cast<int>(hold.tokens);
    bound_why = "what the tiers' budgets hold as KV cache";
  }
  const size_t token_bytes = MaxTokenInputBytes(*tok);
  const size_t most_token_bytes = tok->kind() == TokenizerKind::kBpe ? 4 * token_bytes : token_bytes;
  std::string prompt_text = o.prompt;
  if (o.read_prompt) {
    TIERKV_ASSIGN_OR_RETURN(prompt_text, o.read_prompt(static_cast<size_t>(ctx_bound) * most_token_bytes));
  }
  if (!interactive && prompt_text.empty()) return Status::InvalidArgument(kNoPromptMessage);
  // (A prompt read by read_prompt stops one byte past the bound: "more than".)
  const auto cannot_fit = [&](const std::string& text, const std::string& what, bool cut) -> Status {
    const size_t per_token = PromptBytesPerToken(*tok, token_bytes, text);
    const size_t max_bytes = static_cast<size_t>(ctx_bound) * per_token;
    const size_t bytes = text.size() + o.system_prompt.size();
    if (bytes <= max_bytes) return Status::Ok();
    return Status::InvalidArgument(what + " (" + (cut ? "more than " + std::to_string(max_bytes) : std::to_string(bytes)) +
                                   " bytes) cannot fit the context of at most " + std::to_string(ctx_bound) +
                                   " tokens (" + bound_why + "): a token of this vocabulary stands for at most " +
                                   std::to_string(per_token) + " bytes of text, so at most " +
                                   std::to_string(max_bytes) + " bytes fit; shorten it" +
                                   (o.n_ctx > 0 ? " or raise -c" : ""));
  };
  TIERKV_RETURN_IF_ERROR(cannot_fit(prompt_text, "the prompt",
                                    o.read_prompt && prompt_text.size() > static_cast<size_t>(ctx_bound) * most_token_bytes));
  // An interactive run without a prompt starts with the first input.
  std::string first_input = prompt_text;
  if (interactive && first_input.empty()) {
    std::optional<std::string> in = o.next_turn();
    if (!in) return r;  // no input at all: nothing to do
    first_input = std::move(*in);
    TIERKV_RETURN_IF_ERROR(cannot_fit(first_input, "the first input", false));
  }
  if (format) {
    if (o.continue_chat && std::filesystem::exists(o.session)) {
      // The saved conversation, then this turn: the restore below reuses all of it.
      TIERKV_ASSIGN_OR_RETURN(SessionSummary saved, SessionFile::Inspect(o.session));
      // Another model's conversation is refused before the model loads (with RoPE flags
      // the fingerprint needs the loaded config: Restore refuses it then, the same way).
      if (!o.rope.any()) TIERKV_RETURN_IF_ERROR(SessionFile::CheckModel(o.session, saved.model, FingerprintOf(*file)));
      TIERKV_ASSIGN_OR_RETURN(const std::string more, FormatChatContinuation(*format, first_input));
      if (!o.system_prompt.empty()) spdlog::warn("--system-prompt is ignored: the conversation in {} has begun", o.session);
      r.prompt_tokens = std::move(saved.tokens);
      const std::vector<int32_t> turn = tok->Encode(more, /*add_special=*/false, /*parse_special=*/true);
      r.prompt_tokens.insert(r.prompt_tokens.end(), turn.begin(), turn.end());
    } else {
      // One chat turn in the model's format; its markers are special tokens (parsed, as
      // llama.cpp does in chat mode). The user's own text may then spell special tokens too.
      r.prompt_tokens = tok->Encode(FormatChatTurn(*format, o.system_prompt, first_input), /*add_special=*/true,
                                    /*parse_special=*/true);
    }
  } else {
    r.prompt_tokens = tok->Encode(first_input, /*add_special=*/true, /*parse_special=*/false);
  }
  if (r.prompt_tokens.empty()) return Status::InvalidArgument("the prompt is empty (no tokens)");
  const int n_prompt_tokens = static_cast<int>(r.prompt_tokens.size());
  int n_predict = o.n_predict;
  int n_ctx = o.n_ctx;
  if ((n_predict < 0 || interactive) && n_ctx <= 0) {
    // -n -1 and -i: until an end-of-generation token or a full context (-c, else the
    // model's trained context, as llama.cpp's default -c 0 takes).
    n_ctx = config.context_length;
  }
  if (n_predict < 0 || interactive) {
    if (n_ctx - n_prompt_tokens < 1) {
      return Status::InvalidArgument("the prompt (" + std::to_string(n_prompt_tokens) + " tokens) fills the context of " +
                                     std::to_string(n_ctx) + " tokens; raise -c");
    }
    // One shot: what is left of the context. Interactive: each reply's own limit.
    if (!interactive) n_predict = n_ctx - n_prompt_tokens;
  }
  if (!interactive && static_cast<int64_t>(n_prompt_tokens) + n_predict > std::numeric_limits<int32_t>::max()) {
    return Status::InvalidArgument("the prompt (" + std::to_string(n_prompt_tokens) + " tokens) plus -n " +
                                   std::to_string(n_predict) + " is more tokens than a context can hold");
  }
  if (n_ctx <= 0) {
    n_ctx = n_prompt_tokens + n_predict;
    // The default context (prompt + -n) past the usable one: refused as -c would be.
    if (usable_ctx > 0 && n_ctx > usable_ctx) {
      return Status::InvalidArgument("the prompt (" + std::to_string(n_prompt_tokens) + " tokens) plus -n " +
                                     std::to_string(n_predict) + " is past " +
                                     UsableContextText(usable_ctx, config, o.rope) + "; lower -n or shorten the prompt, or " +
                                     ExtendContextHint(config, o.rope));
    }
  }
  if (!interactive && n_prompt_tokens + n_predict > n_ctx) {
    return Status::InvalidArgument("--ctx " + std::to_string(n_ctx) + " is smaller than the prompt (" +
                                   std::to_string(r.prompt_tokens.size()) + " tokens) plus -n " + std::to_string(n_predict));
  }
  r.n_ctx = n_ctx;
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<Runtime> rt, OpenRuntime(o, file, config, n_ctx, /*fingerprint=*/!o.session.empty()));
  Model* model = rt->model.get();
  KvCache* cache = rt->cache.get();
  MemoryManager* mm = rt->mm.get();
  r.warmup_s = rt->warmup_s;
  r.paged_weights = rt->paged_weights;
  r.frame_bytes = rt->frame_bytes;
  r.host_budget = rt->host_budget;
  r.kv_type = KvCodecName(o.kv_type);
  r.llama_sums = rt->llama_sums;
  r.threads = rt->threads;

  // Session restore and prefix reuse.
  const ModelFingerprint& fp = rt->fingerprint;
  r.rope = rt->rope;
  SeqId seq;
  int start = 0;
  std::shared_ptr<SessionFile> session_file;
  r.session_path = o.session;
  if (!o.session.empty() && std::filesystem::exists(o.session)) {
    const auto t0 = std::chrono::steady_clock::now();
    TIERKV_ASSIGN_OR_RETURN(SessionFile::Restored restored, SessionFile::Restore(*cache, o.session, fp));
    r.restore_s = Since(t0);
    seq = restored.seq;
    session_file = restored.file;
    r.restored_tokens = static_cast<int>(restored.tokens.size());
    size_t lcp = 0;
    while (lcp < restored.tokens.size() && lcp < r.prompt_tokens.size() && restored.tokens[lcp] == r.prompt_tokens[lcp]) ++lcp;
    // The last prompt token is always recomputed: its logits choose the first new token.
    lcp = std::min(lcp, r.prompt_tokens.size() - 1);
    TIERKV_RETURN_IF_ERROR(cache->Truncate(seq, static_cast<int>(lcp)));
    r.reused_prefix_tokens = static_cast<int>(lcp);
    start = static_cast<int>(lcp);
  } else {
    seq = cache->NewSequence();
  }
  // The prompt's next blocks from the shared cache (never an error: what does not come is
  // computed).
  std::unique_ptr<RemoteTier> remote;
  if (!o.remote.url.empty()) {
    TIERKV_ASSIGN_OR_RETURN(remote, RemoteTier::Create(o.remote, fp, cache->geometry(), cache->block_bytes()));
    const int held = remote->Extend(*cache, seq, r.prompt_tokens, static_cast<int>(r.prompt_tokens.size()) - 1, 0);
    if (held != start) {
      r.remote_tokens = std::max(held - start, 0);
      start = held;
      r.reused_prefix_tokens = held;
    }
  }

  // The prompt's tokens the cache holds, then the rest to compute.
  const size_t n_vocab = static_cast<size_t>(model->config().n_vocab);
  Generator gen(*model, *cache, seq,
                std::vector<int32_t>(r.prompt_tokens.begin(), r.prompt_tokens.begin() + start));
  TIERKV_RETURN_IF_ERROR(gen.Append(std::span<const int32_t>(r.prompt_tokens).subspan(static_cast<size_t>(start))));
  const std::vector<int32_t>& all = gen.tokens();
  auto stop_requested = [&] { return o.stop != nullptr && o.stop->load(std::memory_order_relaxed); };
  auto clear_stop = [&] {
    if (o.stop != nullptr) o.stop->store(false, std::memory_order_relaxed);
  };

  // Computes what was appended (the first prompt with the --dump-logits positions); a
  // stop between chunks drops the tokens not computed and returns false.
  auto prefill = [&](bool dump) -> Result<bool> {
    Generator::PrefillHooks hooks;
    hooks.stop = stop_requested;
    auto last_save = std::chrono::steady_clock::now();
    bool save_failed = false;
    hooks.progress = [&](int done, int total) {
      if (o.on_prefill) o.on_prefill(done, total);
      if (o.on_prefill_progress) {
        RunOptions::PrefillProgress p;
        p.done = done;
        p.total = total;
        p.position = gen.computed();
        p.end = static_cast<int>(all.size());
        p.residency = Residency(*mm);
        o.on_prefill_progress(p);
      }
      // A checkpoint: what is computed so far, so that a run killed later resumes here.
      if (o.session.empty() || o.prefill_save_seconds <= 0 || done >= total || save_failed ||
          Since(last_save) < o.prefill_save_seconds) {
        return;
      }
      const Status st = gen.SaveComputed(fp, o.session);
      if (!st.ok()) {
        save_failed = true;  // said once; the save at the end reports it as an error
        spdlog::warn("prefill checkpoint not saved: {}", st.message());
      }
      last_save = std::chrono::steady_clock::now();
    };
    if (dump && o.dump_logits > 0) {
      const int end = static_cast<int>(all.size());
      hooks.keep_row = [&o, end](int pos) { return pos < o.dump_logits || pos >= end - o.dump_logits; };
      hooks.on_row = [&r](int pos, std::span<const float> l) { r.logits.push_back(Entry(pos, l)); };
    }
    return gen.Prefill(o.batch, hooks);
  };

  SamplerOptions sampling = o.sampler;
  r.seed = o.sampler.seed;
  if (o.ignore_eos) {
    // As llama.cpp's --ignore-eos: end-of-generation tokens are never drawn.
    for (int32_t id = 0; id < static_cast<int32_t>(n_vocab); ++id) {
      if (tok->IsEog(id)) sampling.banned_tokens.push_back(id);
    }
  }
  Sampler sampler(sampling);

  // One reply of at most `limit` tokens (-1: until end of generation or a full context).
  // An end-of-generation token is reported but never fed (a next turn's text closes the
  // reply itself).
  // Whether the context has no room for another token (then it says so, once).
  auto full = [&] {
    if (static_cast<int>(all.size()) < n_ctx) return false;
    r.context_full = true;
    if (interactive) spdlog::warn("the conversation ends: the context of {} tokens is full (raise -c)", n_ctx);
    return true;
  };
  // Why the reply ended (turn->stop_reason); the -n limit is checked before a full
  // context, so -n N that fills the context exactly is "limit", and -n -1 (limit -1)
  // "context_full".
  auto generate = [&](int limit, TurnReport* turn) -> Status {
    const auto t0 = std::chrono::steady_clock::now();
    r.reverse_prompt.clear();
    StopReason& why = turn->stop_reason;
    why = StopReason::kLimit;  // limit 0: nothing asked
    for (int i = 0; limit < 0 || i < limit; ++i) {
      if (stop_requested()) {
        r.stopped = true;
        clear_stop();
        why = StopReason::kInterrupted;
        break;
      }
      if (full()) {
        why = StopReason::kContextFull;
        break;
      }
      if (o.dump_logits > 0) r.steps.push_back(Entry(static_cast<int>(all.size()) - 1, gen.logits()));
      const int32_t next = sampler.Sample(gen.logits());
      sampler.Accept(next);
      r.generated_tokens.push_back(next);
      ++turn->generated;
      const std::string piece = tok->TokenToPiece(next, /*render_special=*/false);
      r.text += piece;
      turn->text += piece;
      const bool shown = !o.on_text || o.on_text(piece);
      if (!shown) r.output_failed = true;
      if (!o.ignore_eos && tok->IsEog(next)) {
        why = shown ? StopReason::kEog : StopReason::kOutputFailed;
        break;
      }
      gen.Accept(next);
      if (!shown) {
        why = StopReason::kOutputFailed;
        break;
      }
      if (const std::string* rp = ReversePromptEnding(o.reverse_prompts, turn->text, piece.size())) {
        turn->reverse_prompt = r.reverse_prompt = *rp;
        why = StopReason::kReversePrompt;
        break;
      }
      if (i + 1 == limit) {
        why = StopReason::kLimit;
        break;
      }
      if (full()) {
        why = StopReason::kContextFull;
        break;
      }
      TIERKV_RETURN_IF_ERROR(gen.Step());
    }
    r.stop_reason = why;
    r.decode_s += Since(t0);
    return Status::Ok();
  };
  // The session holds every token whose K/V is in the cache: the last sampled token is
  // fed first, so the file holds the whole text shown (a reply cut off by -n included),
  // which the next run's prompt (or --continue) builds on.
  auto save = [&]() -> Status {
    if (o.session.empty()) return Status::Ok();
    TIERKV_RETURN_IF_ERROR(gen.Save(fp, o.session));
    r.saved = true;
    return Status::Ok();
  };

  const double copy_busy0 = mm->copy_busy_seconds();
  // llama-cli shows the prompt, then the text generated after it (a raw prompt only: a
  // chat turn is input, as a typed one is). Output that fails here computes nothing.
  if (o.echo_prompt && !format && !prompt_text.empty() && o.on_text && !o.on_text(prompt_text)) {
    r.output_failed = true;
    r.stop_reason = StopReason::kOutputFailed;
  }
  const auto snapshot = [&](std::vector<TierStats>* out) {
    for (int t = 0; t < kNumTiers; ++t) out->push_back(mm->Stats(TierAt(t)));
  };
  snapshot(&r.tiers_prefill_start);
  const auto t_prefill = std::chrono::steady_clock::now();
  bool prefilled = false;
  if (!r.output_failed) {
    TIERKV_ASSIGN_OR_RETURN(prefilled, prefill(/*dump=*/true));
  }
  r.prefill_s = Since(t_prefill);
  snapshot(&r.tiers_prefill_end);
  r.prefill_tokens = r.output_failed ? 0 : static_cast<int>(all.size()) - start;
  if (r.output_failed) {
    // Nothing computed, nothing to save.
  } else if (!prefilled) {
    // Stopped: no reply. The tokens computed are saved when there are new ones, so that
    // the same prompt resumes there (an untouched session file is left as it was).
    r.interrupted = true;
    r.stop_reason = StopReason::kInterrupted;
    clear_stop();
    if (static_cast<int>(all.size()) > start) TIERKV_RETURN_IF_ERROR(save());
  } else {
    // The prompt counts for the repetition penalties, as in llama.cpp.
    for (const int32_t t : r.prompt_tokens) sampler.Accept(t);
    TurnReport turn{first_input, n_prompt_tokens, 0, {}, {}, StopReason::kNone};
    // A one-shot -n -1 runs to the end of the context (n_predict is what is left of it),
    // which is then why it stopped.
    TIERKV_RETURN_IF_ERROR(generate(interactive || o.n_predict < 0 ? o.n_predict : n_predict, &turn));
    if (interactive) r.turns.push_back(std::move(turn));
    // Interactive: save after each reply (only new blocks are appended), then the next
    // input joins the context and is answered, until the inputs end or the context is full.
    while (interactive && !r.context_full && !r.output_failed) {
      TIERKV_RETURN_IF_ERROR(save());
      std::optional<std::string> in = o.next_turn();
      if (!in) break;
      // An input whose bytes alone need more tokens than the context has left ends the
      // conversation before it is tokenized (as one that is tokenized and does not fit).
      const size_t per_token = PromptBytesPerToken(*tok, token_bytes, *in);
      if (all.size() + (in->size() + per_token - 1) / per_token >= static_cast<size_t>(n_ctx)) {
        spdlog::warn("the conversation ends: {} tokens held and an input of {} bytes (at least {} tokens) leave no "
                     "room to reply in the context of {} (raise -c)",
                     all.size(), in->size(), (in->size() + per_token - 1) / per_token, n_ctx);
        r.context_full = true;
        r.stop_reason = StopReason::kContextFull;
        break;
      }
      std::vector<int32_t> add;
      if (format) {
        TIERKV_ASSIGN_OR_RETURN(const std::string more, FormatChatContinuation(*format, *in));
        add = tok->Encode(more, /*add_special=*/false, /*parse_special=*/true);
      } else {
        add = tok->Encode(*in, /*add_special=*/false, /*parse_special=*/false);
      }
      if (add.empty()) continue;
      // (Append feeds the reply's last token first, when it was not an end of generation.)
      if (all.size() + add.size() >= static_cast<size_t>(n_ctx)) {
        spdlog::warn("the conversation ends: {} tokens held and {} more for the input leave no room to reply in "
                     "the context of {} (raise -c)",
                     all.size(), add.size(), n_ctx);
        r.context_full = true;
        r.stop_reason = StopReason::kContextFull;
        break;
      }
      const int from = static_cast<int>(all.size());
      TIERKV_RETURN_IF_ERROR(gen.Append(add));
      for (const int32_t t : add) sampler.Accept(t);
      const auto t0 = std::chrono::steady_clock::now();
      TIERKV_ASSIGN_OR_RETURN(const bool done, prefill(/*dump=*/false));
      r.prefill_s += Since(t0);
      if (!done) {
        // The input is dropped whole: the conversation is saved as it was before it. The
        // part computed still counts for the rate reached.
        r.prefill_tokens += static_cast<int>(all.size()) - from;
        TIERKV_RETURN_IF_ERROR(gen.Truncate(from));
        r.interrupted = true;
        r.stop_reason = StopReason::kInterrupted;
        clear_stop();
        break;
      }
      r.prefill_tokens += static_cast<int>(add.size());
      TurnReport next{std::move(*in), static_cast<int>(add.size()), 0, {}, {}, StopReason::kNone};
      TIERKV_RETURN_IF_ERROR(generate(o.n_predict, &next));
      r.turns.push_back(std::move(next));
    }
    TIERKV_RETURN_IF_ERROR(save());
  }
  if (remote) {
    // The run's full blocks for the others; sent before the process ends (or given up on).
    remote->Publish(*cache, seq, gen.tokens(), 0);
    remote->Flush(std::max(2.0, 4e-3 * o.remote.timeout_ms));
    r.remote = remote->stats();
  }
  r.kv_tokens = cache->Length(seq);
  r.kv_bytes = static_cast<uint64_t>(r.kv_tokens) * cache->token_bytes();
  r.decoder = model->counters();
  r.hybrid_experts = model->hybrid_experts();
  r.expert_split = model->options().expert_split;
  r.expert_rates = model->expert_split_rates();
  r.copy_busy_s = mm->copy_busy_seconds() - copy_busy0;
  snapshot(&r.tiers);
  return r;
}

}  // namespace tierkv
