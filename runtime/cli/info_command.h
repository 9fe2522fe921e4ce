// runtime/cli/info_command.h
//
// `tierkv info <file.gguf | builtin:NAME>`: what is in a GGUF model file. Prints the
// metadata (long arrays and strings summarized), the tensor list (name, type, shape,
// bytes, offset), the parameter count, the total tensor bytes, and the KV cache bytes
// per token for each KV codec (DESIGN.md, Codecs). `--json` prints the same as one
// JSON object. docs/gguf.md describes the output and every key.
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memory/status.h"
#include "runtime/gguf.h"

namespace CLI {
class App;
}  // namespace CLI

namespace tierkv {

struct InfoOptions {
  bool json = false;
  // Arrays longer than this show their first items and a count ("... 31992 more").
  size_t max_array_items = 8;
  // Longer strings (chat templates run to kilobytes) are cut, with their length shown.
  size_t max_string_bytes = 120;
};

// The KV cache shape of a transformer model, from <arch>.* metadata.
//   key_length   = <arch>.attention.key_length,   else n_embd / n_head
//   value_length = <arch>.attention.value_length, else n_embd / n_head
//   kv_heads_all_layers = n_layer * <arch>.attention.head_count_kv (sum over layers
//                         when it is a per-layer array; n_head when it is absent)
struct KvCacheShape {
  std::string arch;
  uint64_t n_layer = 0;
  uint64_t n_head_kv = 0;             // per layer (the first layer's when it varies)
  uint64_t kv_heads_all_layers = 0;
  uint64_t key_length = 0;
  uint64_t value_length = 0;
  std::optional<uint64_t> context_length;  // <arch>.context_length
};

// Fails (with the missing or malformed key named) for files that are not transformer
// models, e.g. vocab-only files.
Result<KvCacheShape> ReadKvCacheShape(const GgufFile& file);

// Bytes of one K or V vector of `dim` values under a KV codec:
//   f16 2*dim, q8_0 34*dim/32, q4_0 18*dim/32, tq4 (4*dim+16)/8, tq3 (3*dim+16)/8
// (tq*: a b-bit code per coordinate plus an fp16 norm per vector). nullopt for an
// unknown codec name.
std::optional<double> KvVectorBytes(std::string_view codec, uint64_t dim);
// "f16", "q8_0", "q4_0", "tq4", "tq3".
const std::vector<std::string>& KvCodecNames();

struct KvCodecCost {
  std::string codec;
  double bytes_per_token = 0;  // K and V, all layers, all KV heads
};
// bytes_per_token = kv_heads_all_layers * (KvVectorBytes(key_length) +
//                                          KvVectorBytes(value_length)),
// i.e. 2 * n_layer * n_head_kv * head_dim * bytes_per_value when K and V agree.
std::vector<KvCodecCost> KvBytesPerToken(const KvCacheShape& shape);

// The human-readable report and the JSON object (newline-terminated).
std::string FormatInfoText(const GgufFile& file, const InfoOptions& options);
std::string FormatInfoJson(const GgufFile& file, const InfoOptions& options);

// Opens `model` (a path; "builtin:NAME" is refused as an unknown builtin model for
// now) and returns the report.
Result<std::string> RunInfo(const std::string& model, const InfoOptions& options);

// Registers `tierkv info [FILE] [-m|--model FILE] [--json] [--max-items N]` on app;
// its callback sets exit_code (0, or 1 after one error line on stderr).
void AddInfoCommand(CLI::App& app, int& exit_code);

}  // namespace tierkv
