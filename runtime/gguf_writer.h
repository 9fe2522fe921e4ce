// runtime/gguf_writer.h
//
// Builds a GGUF v3 image in memory: metadata key/values, then tensors whose data is
// placed at general.alignment (32) boundaries. The builtin models are made with it;
// GgufFile::ParseOwned reads the result back through the same strict validation as a
// file from disk. Tests and fuzzers also start from a copy of a valid file (CopyOf) and
// change its values (a key written again keeps its place with the new value).
//
// Thread-safety: a GgufWriter belongs to one caller.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "memory/status.h"
#include "kernels/ggml_types.h"

namespace tierkv {

class GgufFile;
class GgufValue;

class GgufWriter {
 public:
  // Every key/value of `file` in its order and every tensor with a copy of its data.
  // The data is placed anew at 32-byte alignment (a file with another
  // general.alignment reads back only if that key is changed too).
  static GgufWriter CopyOf(const GgufFile& file);

  // Each setter appends the key, or replaces the value of a key already written, in
  // its place.
  GgufWriter& U32(std::string_view key, uint32_t v);
  GgufWriter& I32(std::string_view key, int32_t v);
  GgufWriter& U64(std::string_view key, uint64_t v);
  GgufWriter& I64(std::string_view key, int64_t v);
  GgufWriter& F32(std::string_view key, float v);
  GgufWriter& Bool(std::string_view key, bool v);
  GgufWriter& String(std::string_view key, std::string_view v);
  GgufWriter& Strings(std::string_view key, std::span<const std::string_view> v);  // an array of strings
  // A value as read from a file, of any type (arrays included).
  GgufWriter& Value(std::string_view key, const GgufValue& v);
  // Drops the key when it was written (no-op otherwise).
  GgufWriter& Remove(std::string_view key);

  // A tensor of dims ne[0] (the row length) x ne[1] x ...; data.size() must equal the
  // type's byte count for that shape (checked by the parser on the way back in).
  GgufWriter& Tensor(std::string_view name, GgmlType type, std::vector<uint64_t> ne, std::vector<uint8_t> data);

  // A tensor whose bytes are produced while WriteFile writes them, never held whole
  // (multi-gigabyte models). REQUIRES: ne[0] a multiple of the type's block size.
  GgufWriter& StreamedTensor(std::string_view name, GgmlType type, std::vector<uint64_t> ne);

  // The image: header, metadata, tensor infos, padding, tensor data.
  // REQUIRES: no StreamedTensor.
  std::vector<uint8_t> Finish() const;

  // Produces bytes [offset, offset + out.size()) of streamed tensor `index` (its place
  // among the StreamedTensors). Called in order of offset for each tensor, tensors in
  // file order; out.size() is a whole number of the type's blocks.
  using Fill = std::function<Status(size_t index, uint64_t offset, std::span<uint8_t> out)>;
  // Called now and then with the bytes written and the file's size.
  using Progress = std::function<void(uint64_t done, uint64_t total)>;
  // Writes the image to `path`, streaming: the whole size is allocated first (a full
  // disk is refused before any data is written), into a new file beside `path`
  // (created exclusively, random name) renamed over it once complete and synced; on
  // any failure that file is removed and `path` is left as it was.
  Status WriteFile(const std::string& path, const Fill& fill, const Progress& progress = {}) const;
  // Bytes of the image (what WriteFile writes).
  uint64_t ImageBytes() const;

 private:
  struct KvEntry {
    std::string key;
    std::vector<uint8_t> value;  // u32 value type, then the value's bytes
  };
  struct TensorEntry {
    std::string name;
    GgmlType type;
    std::vector<uint64_t> ne;
    std::vector<uint8_t> data;
    bool streamed = false;
    uint64_t bytes = 0;  // data.size(), or a streamed tensor's size
  };
  // Header, metadata and tensor infos, padded to the alignment (the data follows).
  std::vector<uint8_t> Head() const;
  // The entry of `key` emptied for a new value of `type` (appended when new).
  std::vector<uint8_t>& Key(std::string_view key, uint32_t type);

  std::vector<KvEntry> kvs_;
  std::vector<TensorEntry> tensors_;
};

}  // namespace tierkv
