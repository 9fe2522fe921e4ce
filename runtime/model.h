// runtime/model.h
//
// Transformer decoders read from llama.cpp GGUF files: llama, qwen2 (Q/K/V biases),
// qwen3 (per-head RMSNorm on Q and K) and qwen3moe (QK-norm and a mixture of experts).
// Weights are views into the GGUF mapping (never copied); a missing output.weight falls
// back to token_embd.weight (tied embeddings), as llama.cpp does.
//
// One Forward call runs one token at one position: embed, then per layer RMSNorm,
// Q/K/V projections, (QK-norm), RoPE, K/V appended to the KvCache, paged attention over
// the sequence's KV blocks (pinned on the compute tier through the MemoryManager, read in
// their codec's encoding), output projection, residual, RMSNorm, FFN or MoE, residual;
// then, if asked, the final norm and the logits. The arithmetic follows llama.cpp's CPU
// backend (docs/kernels.md): activations rounded to each weight type's dot-product type,
// and with an f16 KV codec Q and the softmax weights rounded to f16 in attention.
// ForwardBatch runs a prefill chunk of tokens layer by layer with the same bits per
// token (docs/architecture.md, prefill in chunks); its scratch (per-token buffers, the
// queries' score rows) is kept for the next chunk.
//
// Thread-safety: a Model is immutable after Load except for its scratch buffers: one
// Forward or ForwardBatch at a time per Model (several Models may share one GgufFile).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/attention_types.h"
#include "kernels/executor.h"
#include "kernels/matvec.h"
#include "kernels/rope.h"
#include "kvcache/kv_cache.h"
#include "memory/memory_manager.h"
#include "memory/status.h"
#include "runtime/expert_split.h"
#include "runtime/gguf.h"

namespace tierkv {

enum class ModelArch { kLlama, kQwen2, kQwen3, kQwen3Moe };
const char* ModelArchName(ModelArch arch);  // the GGUF general.architecture spelling

enum class RopeScaling { kNone, kLinear, kYarn };
const char* RopeScalingName(RopeScaling s);  // "none", "linear", "yarn"

// Hyperparameters, from the GGUF metadata (keys "<arch>.<name>").
struct ModelConfig {
  ModelArch arch = ModelArch::kLlama;
  int n_vocab = 0;         // rows of token_embd
  int n_embd = 0;          // embedding_length
  int n_layer = 0;         // block_count
  int n_head = 0;          // attention.head_count
  int n_head_kv = 0;       // attention.head_count_kv (default n_head)
  int head_dim = 0;        // attention.key_length (default n_embd / n_head)
  int n_ff = 0;            // feed_forward_length where layers have dense FFN tensors;
                           // 0 in a MoE model without them (the key sizes nothing there)
  int n_expert = 0;        // expert_count (MoE)
  int n_expert_used = 0;   // expert_used_count
  int n_ff_exp = 0;        // expert_feed_forward_length
  bool norm_topk_prob = false;  // renormalise the selected experts' weights
  int context_length = 0;  // trained context
  float rms_eps = 1e-5f;   // attention.layer_norm_rms_epsilon

  // RoPE: rope.dimension_count, rope.freq_base, rope.scaling.{type, factor,
  // original_context_length, attn_factor, yarn_beta_fast, yarn_beta_slow}.
  int rope_dims = 0;
  kernels::RopeMode rope_mode = kernels::RopeMode::kNorm;
  float rope_freq_base = 10000.0f;
  RopeScaling rope_scaling = RopeScaling::kNone;
  float rope_scale_factor = 1.0f;  // context multiplier (freq_scale = 1 / factor)
  int rope_orig_ctx = 0;           // trained context the scaling refers to
  float yarn_attn_factor = 1.0f;
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;

  bool qk_norm = false;      // qwen3, qwen3moe
  bool qkv_bias = false;     // qwen2 (attn_{q,k,v}.bias present)
  bool tied_output = false;  // no output.weight

  bool is_moe() const { return n_expert > 0; }
  std::string ToString() const;  // one line for logs and `tierkv info`
};

// Reads and checks the hyperparameters; kUnsupported for other architectures. Every
// size is checked before anything is sized by it (docs/gguf.md, "Header sizes"): counts
// within [1, INT32_MAX], block_count equal to the blk.N layers present, and the widths
// (embedding_length, head counts times key/value_length, feed_forward_length, expert
// counts and widths) equal to the tensors' shapes. Errors are one line naming the file,
// the key and its value (and the tensor it disagrees with).
Result<ModelConfig> ReadModelConfig(const GgufFile& file);

// RoPE settings over the file's: `tierkv run`'s --rope-* and --yarn-* flags, which are
// llama.cpp's. Zero or empty keeps the file's value.
struct RopeOverrides {
  // The scaling type. A scale_factor without one: the file's type, or linear when the
  // file has none (llama.cpp reads a missing rope.scaling.type as linear).
  std::optional<RopeScaling> scaling;
  // Context multiplier (llama.cpp's --rope-scale; its --rope-freq-scale is 1 / this).
  // 0 with a scaling type: the file's factor when it has one of that type, else
  // n_ctx / context_length (running past the trained length). < 1 is refused.
  float scale_factor = 0.0f;
  float freq_base = 0.0f;         // --rope-freq-base
  int orig_ctx = 0;               // --yarn-orig-ctx: the trained context YaRN refers to
  float yarn_attn_factor = 0.0f;  // --yarn-attn-factor: multiplies the file's (as llama.cpp)
  float yarn_beta_fast = 0.0f;    // --yarn-beta-fast
  float yarn_beta_slow = 0.0f;    // --yarn-beta-slow
  bool any() const {
    return scaling.has_value() || scale_factor != 0.0f || freq_base != 0.0f || orig_ctx != 0 ||
           yarn_attn_factor != 0.0f || yarn_beta_fast != 0.0f || yarn_beta_slow != 0.0f;
  }
};

// Applies `o` to `c` (ModelConfig from the file); kInvalidArgument for values out of
// range. n_ctx: the context the caller means to use (0 = the trained one).
Status ApplyRopeOverrides(const RopeOverrides& o, int n_ctx, ModelConfig* c);

struct ModelOptions {
  // What computes the forward steps (kernels/executor.h); null: a CPU executor with
  // `threads` kernel threads in all (the calling thread included; 0 = hardware
  // concurrency). An executor serves one Model at a time.
  std::shared_ptr<kernels::Executor> executor;
  int threads = 0;
  RopeOverrides rope;
  int n_ctx = 0;  // the context the caller means to use (0 = the trained one)
  // With an f16 KV codec, round Q and the softmax weights to f16 in attention as
  // llama.cpp does without flash attention (keeps logits closest to llama.cpp's).
  bool llama_attention_rounding = true;
  // And (with the rounding) sum Q.K and P.V in llama.cpp's orders, one token's for a
  // decode step and a batch's for a prefill chunk (kernels/attention_sums.h): then the
  // logits are llama.cpp's bit for bit where the matrix products are too (the reference
  // vectors' F16 and Q8_0 files), at a cost in attention time (docs/kernels.md).
  bool llama_attention_sums = false;
  // 0 (the default with the CPU executor): attention reads each KV block where it lies
  // (host RAM, the sim device, a mapped disk arena) and reads the others (an O_DIRECT
  // disk file, a session file not read yet) through a staging area, moving nothing.
  // N > 0: it acquires a layer's blocks on the compute tier N at a time (the path a
  // device executor takes; tests). Results do not depend on it.
  int kv_batch_blocks = 0;
  // Selective attention (0 = off: every block): each decode step attends to the first
  // block (attention sinks), the last two (the recent window), and the attn_topk blocks
  // with the highest bound on a query's score per KV head (from each block's per-channel
  // key bounds; a block without bounds, restored and not read since, is always taken and
  // gets its bounds when read), and reads only those. Prefill attends to every block.
  // An approximation: the logits differ from full attention's (docs/benchmarks.md has the
  // measured quality).
  int attn_topk = 0;
  // The staging area for blocks read through: two turns of this many bytes (0 = 8 MiB,
  // and a prefill chunk reads up to 256 MiB of them at once; N > 0: never more than the
  // two turns). Results do not depend on it (tests make it small).
  uint64_t read_through_turn_bytes = 0;
  // ForwardBatch's attention takes the chunk's queries this many at a time (0 =
  // automatic: all of them, or with the two-pass form as many as keep their score rows
  // within 2 MiB). Results do not depend on it.
  int attention_query_group = 0;
  // After UseMemory: while layer l computes, the copy stream fetches what layer l + 1
  // needs (its weights, its first batch of KV blocks, and the experts its router picks
  // for the current hidden state), and attention fetches batch b + 1 while batch b
  // computes. Off: every page is fetched when it is needed.
  bool prefetch = true;
  // The prediction of the next layer's experts takes the router's top
  // n_expert_used + predict_extra (more copies, fewer misses); -1 = n_expert_used / 2.
  int predict_extra = -1;
  // Experts when UseMemory pages the weights onto a device tier the executor computes
  // on (`--device cuda` or `sim`; docs/gpu.md, "Hybrid experts"). kDevice: every
  // expert a token picks computes on the device, a miss copied there first. kHost: the
  // experts the device holds (hits) compute there while the host CPU computes the
  // others (misses) from host memory; kAuto: likewise, but each step the cost model
  // (ExpertSplitModel, fed by expert_rates and by what it measures) may copy some
  // misses to the device instead. Results do not depend on it.
  enum class ExpertSplit : uint8_t { kDevice, kHost, kAuto };
  ExpertSplit expert_split = ExpertSplit::kDevice;
  // kHost / kAuto: of the misses the host computed, at most this many per layer and
  // step (per chunk in prefill) are copied to the device in the background: admissions
  // into the device's expert cache, whose victims the frequency policy picks.
  int expert_admit = 1;
  ExpertSplitRates expert_rates;
  // The CPU executor of kHost / kAuto (null: the executor itself when it computes on
  // host memory, else a CPU executor of `threads` threads). Tests inject a checking one.
  std::shared_ptr<kernels::Executor> host_executor;
};

// One routing decision of a MoE layer (traces for the expert-paging benchmark).
struct RouteRecord {
  int32_t pos = 0;
  int32_t layer = 0;
  std::vector<int32_t> experts;    // chosen by the layer's router, in router order
  std::vector<int32_t> predicted;  // predicted one layer earlier (layer 0: from the
                                   // embedding); empty for a prefill chunk's tokens
                                   // but the last
};

// The paged decoder's counters since Load or ResetCounters (DESIGN.md pipeline).
struct DecodeCounters {
  uint64_t steps = 0;
  double step_s = 0;  // wall time inside Forward
  double wait_s = 0;  // of which blocked acquiring pages (waiting for copies)
  double kv_wait_s = 0, weight_wait_s = 0, expert_wait_s = 0;  // wait_s by kind of page
  // Acquires on the compute tier and how many found the page there (or in flight
  // from a prefetch): KV blocks, weight pages (per layer and output), experts. KV
  // blocks read in place count as hits; those read through (model_forward.cc) do not.
  uint64_t kv_acquires = 0, kv_hits = 0;
  // KV blocks read through into the staging area, and their bytes.
  uint64_t kv_read_through = 0, kv_read_through_bytes = 0;
  uint64_t weight_acquires = 0, weight_hits = 0;
  uint64_t expert_acquires = 0, expert_hits = 0;
  // Experts chosen in layers that had a prediction, and how many of them were among
  // the predicted ones (the prediction's recall).
  uint64_t experts_chosen_predicted = 0, experts_chosen_in_prediction = 0;
  // Page ids queued for prefetch (KV blocks, weights and experts).
  uint64_t prefetched_pages = 0;
  // Hybrid experts (ModelOptions::expert_split kHost / kAuto): experts (one per token
  // and slot in decode, one per chunk in prefill) computed on the device (hits and
  // copied misses), of which copied misses, computed on the host, and host-computed
  // misses copied to the device in the background (admissions).
  uint64_t experts_on_device = 0, experts_copied = 0, experts_on_host = 0, experts_admitted = 0;
};

class Model {
 public:
  // The model in `file` (kept alive by the Model: weights point into its mapping).
  static Result<std::unique_ptr<Model>> Load(std::shared_ptr<const GgufFile> file, const ModelOptions& options = {});
  ~Model();

  const ModelConfig& config() const { return cfg_; }
  const ModelOptions& options() const { return options_; }
  const GgufFile& file() const { return *file_; }
  kernels::Executor& executor() { return *exec_; }

  // Places the weights under `mm`'s budgets: each layer's matrices (attention, dense
  // FFN), each expert, and the output matrix become pages backed by the GGUF mapping
  // (read on first use; dropped, never written, when evicted). Token embeddings (one
  // row per step), norms, biases and routers (needed to predict the next layer's
  // experts) stay read in place. Later Forward calls must use a KvCache on the same
  // MemoryManager. Errors: a weight page larger than the compute tier's budget.
  // REQUIRES: called at most once; mm outlives the Model.
  Status UseMemory(MemoryManager* mm);
  bool uses_memory() const { return mm_ != nullptr; }
  // The largest page UseMemory would make with frames of frame_bytes: the compute tier
  // must hold at least this.
  uint64_t LargestWeightPage(uint64_t frame_bytes) const;
  // The frames all weight pages take, in bytes, for frames of frame_bytes.
  uint64_t WeightPageBytes(uint64_t frame_bytes) const;

  // A weight page's contents: parts copied out of the mapping (internal; public for the
  // page source).
  struct WeightPart {
    const uint8_t* src;
    size_t bytes;
    size_t offset;  // within the page
  };

  const DecodeCounters& counters() const { return counters_; }
  // Hybrid experts: whether UseMemory turned them on, and the cost model's current rates.
  bool hybrid_experts() const { return hybrid_; }
  const ExpertSplitRates& expert_split_rates() const { return split_.rates(); }
  void ResetCounters() { counters_ = {}; }
  // While set, each Forward appends one RouteRecord per MoE layer, and ForwardBatch one
  // per token and MoE layer, layer by layer (null: off).
  void set_route_trace(std::vector<RouteRecord>* trace) { route_trace_ = trace; }

  // The KV geometry this model needs, for KvCache::Create.
  KvGeometry KvGeometryFor(KvCodec codec, int block_tokens = 0) const;

  // The prompt tokens ForwardBatch should take next for `seq` when the caller asks for
  // `batch`: more while some of the sequence's KV blocks lie below the fast tiers (on
  // the Disk tier or only in a backing), so that each chunk's one pass over them serves
  // many tokens, capped by the chunk's working memory (kSpillChunkBytes). The logits do
  // not depend on it.
  int PrefillChunk(const KvCache& cache, SeqId seq, int batch) const;

  // Runs `token` at position `pos` of `seq`: appends one token to the sequence in
  // `cache` and writes its K/V on every layer; fills logits ([n_vocab]) unless it is
  // empty (prompt tokens whose prediction nobody reads skip the output projection).
  // REQUIRES: pos == cache.Length(seq); the cache's geometry matches KvGeometryFor.
  // On error the sequence is left as it was (the appended token is truncated away).
  Status Forward(KvCache& cache, SeqId seq, int32_t token, int pos, std::span<float> logits);

  // A prefill chunk: tokens[i] at position pos + i, layer by layer over the whole chunk
  // (each layer's weights acquired once for the chunk; attention reads each KV block
  // once for all the chunk's queries while it is in cache). Logits for the chunk
  // entries listed in logit_rows (ascending), row r of `logits` ([logit_rows.size()]
  // [n_vocab]) for entry logit_rows[r]. The values do not depend on how a prompt is cut
  // into chunks (tested). With quantized weights they are bit-identical to calling
  // Forward token by token; F32 / F16 / BF16 matrices sum as llama.cpp's batched product
  // does (kernels::TokenSums), in another order than one token's.
  // REQUIRES: as Forward, pos == cache.Length(seq). On error the sequence is truncated
  // back to pos.
  Status ForwardBatch(KvCache& cache, SeqId seq, std::span<const int32_t> tokens, int pos,
                      std::span<const int> logit_rows, std::span<float> logits);

 private:
  struct Layer;
  struct Weights;
  struct Scratch;
  struct ExpertWork;
  struct HostExperts;

  Model(std::shared_ptr<const GgufFile> file, ModelConfig cfg, ModelOptions options);
  // KV batches in flight ahead of the one attention computes: the copy stream keeps
  // working through a batch's compute even when a batch copies slower than it computes.
  static constexpr int kKvLookahead = 2;
  Status BindWeights();
  struct WeightPage {
    std::string what;  // for messages: "layer 3's weights", "experts 4-7 of layer 2"
    std::vector<WeightPart> parts;
    uint64_t bytes;
    // Expert pages: the layer, the first expert and how many, each `expert_stride`
    // bytes after the one before.
    int layer = -1;
    int first_expert = 0;
    int experts = 0;
    size_t expert_stride = 0;
  };
  // The pages for frames of frame_bytes (experts share a page where several fit a frame).
  std::vector<WeightPage> PlanWeightPages(uint64_t frame_bytes) const;
  Status ForwardLayers(KvCache& cache, SeqId seq, int32_t token, int pos, std::span<float> logits);
  Status CheckStep(KvCache& cache, SeqId seq, int pos) const;
  Status ForwardChunk(KvCache& cache, SeqId seq, std::span<const int32_t> tokens, int pos,
                      std::span<const int> logit_rows, std::span<float> logits);
  void SizeChunk(size_t n);
  void SetChunkActivations(kernels::ExecArray<float>& in, size_t width, const float* norm, size_t n);
  Status ChunkAttentionBlock(KvCache& cache, SeqId seq, const Layer& L, int layer, int pos, int n);
  Status ChunkFeedForwardBlock(const Layer& L, int layer, int pos, int n);
  Status ChunkLogits(std::span<const int> logit_rows, std::span<float> logits);
  // The layer's attention block up to the K/V write, for the token in s_->x at pos:
  // leaves the query (after RoPE) in s_->q.
  Status AttentionInput(KvCache& cache, SeqId seq, const Layer& L, int layer, int pos);
  // After the Q/K/V projections of the token at pos: biases, QK-norm, RoPE (q and k in
  // place), and K/V written to the cache.
  Status QkvToCache(KvCache& cache, SeqId seq, const Layer& L, int layer, int pos, float* q, float* k, float* v);
  void AttentionOutputProjection(const Layer& L);
  Status FeedForward(const Layer& L, int layer, int pos);
  // Queries q[n][n_heads * head_dim] at positions pos .. pos + n - 1; out likewise.
  // chunk: called for a prefill chunk (ForwardBatch), whose sums follow llama.cpp's batch.
  Status Attention(KvCache& cache, SeqId seq, int layer, int pos, int n, bool chunk, const float* q, float* out);
  struct AttentionPlan;
  AttentionPlan PlanAttention(const KvCache& cache, SeqId seq, int pos, int n, bool chunk, int batch,
                              int n_blocks) const;
  bool PinWholeLayer(KvCache& cache, SeqId seq, int layer, int n_blocks);
  int PinInPlace(KvCache& cache, SeqId seq, int layer, std::span<const int> blocks, bool many_queries);
  // Selective attention's blocks for a decode step of `layer` (q: the step's queries,
  // after RoPE), ascending, into s_->kv_selected; false when it would take them all.
  bool SelectBlocks(const KvCache& cache, SeqId seq, int layer, const float* q);
  Status ReadStaged(KvCache& cache, SeqId seq, int layer, const AttentionPlan& plan, int v, int turn, Ticket* ticket);
  Status UseStaged(int turn, Ticket& ticket);
  bool KvInPlace() const;
  Status PinVisit(KvCache& cache, SeqId seq, int layer, const AttentionPlan& plan, int v);
  void RetirePins();
  void RetireKvPins();
  Status AcquireOutput(kernels::MatrixView* output);
  Status Logits(std::span<float> logits);
  float* HostLogitsOr(std::span<float> logits);
  void Ffn(const Layer& L);
  Status Moe(const Layer& L, int layer, int pos);
  Status MoeGroup(const Layer& L, int layer, std::span<const int> slots);
  // The products of experts, on either side: a token's experts in `slots` (ExpertGroup)
  // or one expert for a chunk's tokens (ChunkExpert), on executor `e` from pins on `tier`
  // with w's scratch; compute_s (optional): the seconds they computed, pins taken.
  Status ExpertGroup(const Layer& L, int layer, std::span<const int> slots, kernels::Executor& e, Tier tier,
                     ExpertWork& w, kernels::ActivationRow& act, float* out, double* compute_s = nullptr);
  Status ChunkExpert(const Layer& L, int layer, int expert, kernels::Executor& e, Tier tier, ExpertWork& w,
                     double* compute_s = nullptr);
  Status ChunkMoe(const Layer& L, int layer, int pos, int n, kernels::ActivationRow* const* acts, float* x);
  void Route(int layer, int pos, const float* router, bool predicted_for_it, int* ids, float* weights);
  int ExpertOrder(int layer, std::span<const int> experts, int window, std::vector<int>* order);
  void SplitHits(int layer, std::span<const int> experts, std::vector<int>* hits, std::vector<int>* misses);
  void MissAhead(int layer, std::span<const int> experts, std::span<const int> order, int hits, size_t p, int window);
  void QueueExpert(int layer, int e, bool urgent, Tier tier);
  Status AcquireExpert(const Layer& L, int layer, int e, Tier tier, kernels::MatrixView out[3], Pin* pin);
  // Hybrid experts: a token's experts split between device and host (HybridMoe), the
  // host's share of a token (HostMoeGroup) or of a chunk (HostChunkExpert), admissions.
  Status HybridMoe(const Layer& L, int layer);
  Status HostMoeGroup(const Layer& L, int layer, std::span<const int> slots);
  Status HostChunkExpert(const Layer& L, int layer, int e, std::span<const std::pair<int, int>> who, size_t n_tokens);
  void AdmitExperts(int layer, std::span<const int> experts);
  bool ExpertOnDevice(PageId page) const;
  uint64_t ExpertBytes(const Layer& L) const;
  // Paged weights: the layer's matrices pinned on the compute tier, as views into the pin.
  Status AcquireLayer(int layer, Layer* out);
  // Acquire (for reading) timed into wait_s and *wait; counts the acquire and a hit
  // where those are given.
  Result<Pin> AcquireCounted(MemoryManager& mm, PageId page, Tier tier, double* wait, uint64_t* acquires = nullptr,
                             uint64_t* hits = nullptr);
  // The pages layer `next` needs first (its weight page, the output matrix's before
  // layer 0, its first KV batches and last block), planned without side effects; and
  // PrefetchLayer, which queues them and the layer's predicted experts.
  std::vector<PageId> PlanPrefetch(KvCache& cache, SeqId seq, int next) const;
  void PrefetchLayer(KvCache& cache, SeqId seq, int next);
  // predicted_[layer] = the layer's router's top n_expert_used + predict_extra for the
  // hidden state in s_->x, and their copies queued (paged experts).
  void PredictExperts(int layer);
  int KvBatchBlocks(KvCache& cache, int n_blocks) const;

  std::shared_ptr<const GgufFile> file_;
  ModelConfig cfg_;
  ModelOptions options_;
  kernels::RopeParams rope_;
  std::shared_ptr<kernels::Executor> exec_;
  std::unique_ptr<Weights> w_;
  std::unique_ptr<Scratch> s_;
  // Paged weights (UseMemory).
  MemoryManager* mm_ = nullptr;
  Tier weight_tier_ = Tier::kHost;
  std::vector<PageId> layer_pages_;   // [n_layer]
  std::vector<PageId> expert_pages_;  // [n_layer * n_expert]: the page holding the expert
  std::vector<size_t> expert_base_;   // [n_layer * n_expert]: where the expert starts in it
  PageId output_page_;
  // [layer]: offset of each present matrix in its page, in Layer::PagedMatrices order;
  // of gate, up and down from the expert's start.
  std::vector<std::vector<size_t>> layer_offsets_;
  std::vector<std::array<size_t, 3>> expert_offsets_;
  DecodeCounters counters_;
  std::vector<RouteRecord>* route_trace_ = nullptr;
  std::vector<std::vector<int32_t>> predicted_;  // [n_layer]: experts predicted for the layer
  // Hybrid experts (UseMemory, expert_split kHost / kAuto with a device tier).
  bool hybrid_ = false;
  std::shared_ptr<kernels::Executor> host_exec_;
  std::unique_ptr<HostExperts> h_;
  ExpertSplitModel split_;
};

}  // namespace tierkv
