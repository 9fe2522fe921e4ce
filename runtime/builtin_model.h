// runtime/builtin_model.h
//
// Models that ship inside the binary, so the main job runs with nothing downloaded.
// A builtin model is a GGUF image built in memory from a fixed recipe and read back
// through GgufFile's strict parser: everything downstream (config, weights, info,
// session fingerprints) treats it exactly like a file.
//
// builtin:tiny-moe (docs/builtin-models.md): qwen3moe-shaped, 4 layers, embedding 256,
// 8 query heads over 2 KV heads of 64, 32 experts of which 4 are used (expert FFN 256),
// a 262144-token trained context, byte-level vocabulary of 258 (bytes, <s>, </s>),
// Q8_0 matrices, F32 norms. Weights are deterministic (SplitMix64 from a fixed seed),
// scaled like an initialised network; the router rows are scaled so that expert
// popularity is skewed (low ids chosen more often), as in trained MoE models.
//
// Thread-safety: free functions, no shared state.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "memory/status.h"
#include "runtime/gguf.h"

namespace tierkv {

inline constexpr std::string_view kBuiltinPrefix = "builtin:";

// Names after "builtin:".
std::vector<std::string> BuiltinModelNames();

// The image of builtin model `name` (without the prefix); kNotFound listing the names.
Result<std::unique_ptr<GgufFile>> BuildBuiltinModel(std::string_view name);

// A llama-shaped model of the given shape with the same kind of deterministic Q8_0
// weights and byte-level vocabulary (258) as builtin:tiny-moe, for benchmarks that need
// weights far larger than the caches (the defaults: 200 M parameters, 210 MB). Not one
// of the builtin names.
struct SyntheticLlamaShape {
  int n_embd = 2048;
  int n_layer = 4;
  int n_head = 16;
  int n_head_kv = 4;
  int head_dim = 128;
  int n_ff = 5632;
};
Result<std::unique_ptr<GgufFile>> BuildSyntheticLlama(const SyntheticLlamaShape& shape = {});

// qwen3moe shapes; the defaults are builtin:tiny-moe's (whose weights come from its own
// seed). BuildSyntheticMoe makes one of any shape the same way, with another seed.
struct SyntheticMoeShape {
  int n_vocab = 258;
  int n_embd = 256;
  int n_layer = 4;
  int n_head = 8;
  int n_head_kv = 2;
  int head_dim = 64;
  int n_expert = 32;
  int n_expert_used = 4;
  int n_ff_exp = 256;
  int context_length = 262144;
  float rope_freq_base = 1000000.0f;
  float rms_eps = 1e-6f;
};
Result<std::unique_ptr<GgufFile>> BuildSyntheticMoe(const SyntheticMoeShape& shape);

// A model argument as the CLI takes it: "builtin:NAME" or a path to a .gguf file.
Result<std::unique_ptr<GgufFile>> OpenModelFile(const std::string& spec);

}  // namespace tierkv
