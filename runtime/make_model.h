// runtime/make_model.h
//
// `tierkv make-model`: writes a GGUF with the exact shapes and tensor types of a named
// real model (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-8B) and random weights, so that the
// paging of a 17 GB MoE can be run and measured without downloading one. The weights are
// random quantized blocks whose values have the spread of trained weights (zero mean,
// standard deviation 1/sqrt(row length)); the router's rows get per-expert gains drawn
// log-normally (`skew`), so that some experts win more often than others, as in trained
// routers. The file is streamed to disk (a few MiB of memory however large it is),
// deterministic in the seed, and its type mix is llama.cpp's rule for the named
// quantization (docs/make-model.md).
//
// Thread-safety: pure function of its options (plus the files it reads and writes).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "memory/status.h"

namespace tierkv {

struct MakeModelOptions {
  std::string like = "qwen3-30b-a3b";  // MakeModelShapes()
  std::string type = "q4_k_m";         // q4_k_m or q8_0
  int layers = 0;                      // the first N layers only (0: all)
  // A GGUF whose tokenizer (every tokenizer.* key) the model takes, and with it the
  // vocabulary size; "" = a byte tokenizer of 258 tokens (tierkv only: llama.cpp has none).
  std::string vocab_from;
  uint64_t seed = 1;
  // Standard deviation of the log of the router rows' gains (0: every expert alike).
  double skew = 1.0;
  std::string out;
  std::function<void(uint64_t done, uint64_t total)> progress;
};

struct MakeModelReport {
  uint64_t file_bytes = 0;
  uint64_t tensors = 0;
  int layers = 0;
  int n_vocab = 0;
  // Bytes per tensor type ("Q4_K" -> bytes), in type order.
  std::vector<std::pair<std::string, uint64_t>> bytes_by_type;
};

struct MakeModelShape {
  const char* like;
  const char* arch;  // qwen3moe or qwen3
  int n_layer, n_embd, n_head, n_head_kv, head_dim;
  int n_ff;          // dense FFN width (qwen3moe files carry it too, unused by MoE layers)
  int n_expert, n_expert_used, n_ff_exp;  // 0 for dense models
  int n_vocab, context_length;
  float rope_freq_base, rms_eps;
};
const std::vector<MakeModelShape>& MakeModelShapes();

// Writes options.out.
Status MakeModel(const MakeModelOptions& options, MakeModelReport* report = nullptr);

// What MakeModel would write (its tensors, their types and the file's size), computed
// without writing anything (`--dry-run`); the tensors by name and type, in file order.
struct MakeModelTensor {
  std::string name;
  std::string type;  // "Q4_K"
  std::vector<uint64_t> ne;
};
Result<MakeModelReport> PlanMakeModel(const MakeModelOptions& options, std::vector<MakeModelTensor>* tensors = nullptr);

}  // namespace tierkv
