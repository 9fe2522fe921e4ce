// runtime/gguf_writer.h
//
// Builds a GGUF v3 image in memory: metadata key/values, then tensors whose data is
// placed at general.alignment (32) boundaries. The builtin models are made with it;
// GgufFile::ParseOwned reads the result back through the same strict validation as a
// file from disk.
//
// Thread-safety: a GgufWriter belongs to one caller.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/ggml_types.h"

namespace tierkv {

class GgufWriter {
 public:
  GgufWriter& U32(std::string_view key, uint32_t v);
  GgufWriter& F32(std::string_view key, float v);
  GgufWriter& Bool(std::string_view key, bool v);
  GgufWriter& String(std::string_view key, std::string_view v);

  // A tensor of dims ne[0] (the row length) x ne[1] x ...; data.size() must equal the
  // type's byte count for that shape (checked by the parser on the way back in).
  GgufWriter& Tensor(std::string_view name, GgmlType type, std::vector<uint64_t> ne, std::vector<uint8_t> data);

  // The image: header, metadata, tensor infos, padding, tensor data.
  std::vector<uint8_t> Finish() const;

 private:
  struct TensorEntry {
    std::string name;
    GgmlType type;
    std::vector<uint64_t> ne;
    std::vector<uint8_t> data;
  };
  GgufWriter& Key(std::string_view key, uint32_t type);

  std::vector<uint8_t> kv_;  // serialised key/values
  uint64_t n_kv_ = 0;
  std::vector<TensorEntry> tensors_;
};

}  // namespace tierkv
