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
//
// Thread-safety: a Model is immutable after Load except for its scratch buffers: one
// Forward at a time per Model (several Models may share one GgufFile).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/attention.h"
#include "kernels/matvec.h"
#include "kernels/rope.h"
#include "kernels/thread_pool.h"
#include "kvcache/kv_cache.h"
#include "memory/status.h"
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
  int n_ff = 0;            // feed_forward_length (dense models)
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

// Reads and checks the hyperparameters; kUnsupported for other architectures.
Result<ModelConfig> ReadModelConfig(const GgufFile& file);

struct ModelOptions {
  // Kernel threads in all (the calling thread included); 0 = hardware concurrency.
  int threads = 0;
  // RoPE scaling: empty keeps the file's. kYarn or kLinear with factor 0 derive the
  // factor from n_ctx / context_length (running past the trained length); factor < 1 is
  // refused.
  std::optional<RopeScaling> rope_scaling;
  float rope_scale_factor = 0.0f;
  int n_ctx = 0;  // the context the caller means to use (0 = the trained one)
  // With an f16 KV codec, round Q and the softmax weights to f16 in attention as
  // llama.cpp does without flash attention (keeps logits closest to llama.cpp's).
  bool llama_attention_rounding = true;
  // Attention pins a layer's KV blocks this many at a time (0 = all at once). Results
  // do not depend on it; small values keep the compute tier's working set small.
  int kv_batch_blocks = 0;
};

class Model {
 public:
  // The model in `file` (kept alive by the Model: weights point into its mapping).
  static Result<std::unique_ptr<Model>> Load(std::shared_ptr<const GgufFile> file, const ModelOptions& options = {});
  ~Model();

  const ModelConfig& config() const { return cfg_; }
  const ModelOptions& options() const { return options_; }
  const GgufFile& file() const { return *file_; }
  kernels::ThreadPool& pool() { return *pool_; }

  // The KV geometry this model needs, for KvCache::Create.
  KvGeometry KvGeometryFor(KvCodec codec, int block_tokens = 0) const;

  // Runs `token` at position `pos` of `seq`: appends one token to the sequence in
  // `cache` and writes its K/V on every layer; fills logits ([n_vocab]) unless it is
  // empty (prompt tokens whose prediction nobody reads skip the output projection).
  // REQUIRES: pos == cache.Length(seq); the cache's geometry matches KvGeometryFor.
  // On error the sequence is left as it was (the appended token is truncated away).
  Status Forward(KvCache& cache, SeqId seq, int32_t token, int pos, std::span<float> logits);

 private:
  struct Layer;
  struct Weights;
  struct Scratch;

  Model(std::shared_ptr<const GgufFile> file, ModelConfig cfg, ModelOptions options);
  Status BindWeights();
  Status ForwardLayers(KvCache& cache, SeqId seq, int32_t token, int pos, std::span<float> logits);
  Status Attention(KvCache& cache, SeqId seq, int layer, int pos, const float* q, float* out);
  void Ffn(const Layer& L);
  void Moe(const Layer& L);

  std::shared_ptr<const GgufFile> file_;
  ModelConfig cfg_;
  ModelOptions options_;
  kernels::RopeParams rope_;
  std::unique_ptr<kernels::ThreadPool> pool_;
  std::unique_ptr<Weights> w_;
  std::unique_ptr<Scratch> s_;
};

}  // namespace tierkv
