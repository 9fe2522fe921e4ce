// runtime/gguf.h
//
// GGUF v2/v3 reader. The file is mmap'd read-only and never copied: metadata strings,
// arrays and tensor data are views into the mapping, valid while the GgufFile lives.
// Open() validates the whole layout before it returns (docs/gguf.md lists every check):
// magic, version, counts, string and array lengths, value types, tensor dimensions and
// their element/byte counts (no overflow), known ggml types, tensor data offsets that
// are aligned, inside the file and non-overlapping, no duplicate keys or tensor names.
// Every failure is one Status whose single-line message starts with "gguf: " and names
// the problem; nothing past the header is trusted before it is bounds-checked, and no
// allocation is larger than a small multiple of the file size.
//
// Shapes follow ggml: ne[0] is the contiguous dimension (a row), ne[1] the number of
// rows, and so on; dimensions past n_dims are 1.
//
// Thread-safety: a GgufFile is immutable after Open(); every const method may be called
// from any thread. Another process truncating the file while it is mapped makes reads
// of the lost range fault (SIGBUS); GGUF files are not expected to change in place.
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "memory/fd.h"
#include "memory/status.h"
#include "kernels/ggml_types.h"

namespace tierkv {

// Metadata value types; the numbers are the file format's.
enum class GgufValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// "u8", "i32", "f32", "bool", "string", "array", ...; "type N" for invalid values.
const char* GgufValueTypeName(GgufValueType type);

// The C++ types a value converts to (Get<T>, As<T>, GetArray<T>).
template <typename T>
concept GgufNumber = std::same_as<T, uint8_t> || std::same_as<T, int8_t> ||
                     std::same_as<T, uint16_t> || std::same_as<T, int16_t> ||
                     std::same_as<T, uint32_t> || std::same_as<T, int32_t> ||
                     std::same_as<T, uint64_t> || std::same_as<T, int64_t> ||
                     std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, bool>;

// Printing any value, e.g. for `tierkv info`: numbers in decimal (floats in the
// shortest form that reads back to the same value), bools as true/false, strings in
// double quotes with control characters and quotes escaped, arrays as
// [a, b, c, ... 31997 more].
struct GgufFormatOptions {
  size_t max_array_items = std::numeric_limits<size_t>::max();  // later items: "... N more"
  size_t max_string_bytes = std::numeric_limits<size_t>::max(); // longer: cut, "... (N bytes)"
};
class GgufValue;
std::string FormatGgufValue(const GgufValue& value, const GgufFormatOptions& options = {});

// One metadata value: a scalar, a string, or an array of scalars or strings (arrays
// of arrays are refused at open). Conversions are lossless or fail:
//   integer T: any integer value type whose value fits in T (a u8 1 reads as u32 1;
//              an i32 -1 does not read as u32);
//   float, double: f32, f64, or any integer type (f64 values outside the float range
//              fail for float);
//   bool: bool only.
// Error messages from these methods do not name the key; GgufFile's getters add it.
class GgufValue {
 public:
  GgufValueType type() const { return type_; }
  bool is_array() const { return type_ == GgufValueType::kArray; }
  // REQUIRES: is_array().
  GgufValueType element_type() const { return element_type_; }
  uint64_t size() const { return count_; }

  template <GgufNumber T>
  Result<T> As() const;
  Result<std::string_view> AsString() const;

  // Arrays. Elements of numeric arrays are read from the mapping (unaligned, little
  // endian) and converted one by one; string arrays are views into the mapping.
  template <GgufNumber T>
  Result<std::vector<T>> AsArray() const;
  template <GgufNumber T>
  Result<T> ElementAs(uint64_t index) const;  // REQUIRES: is_array(), index < size()
  Result<std::span<const std::string_view>> AsStringArray() const;

 private:
  friend class GgufParser;
  friend std::string FormatGgufValue(const GgufValue& value, const GgufFormatOptions& options);

  GgufValueType type_ = GgufValueType::kU8;
  GgufValueType element_type_ = GgufValueType::kU8;  // arrays only
  uint64_t bits_ = 0;            // numeric/bool scalar: its little-endian bytes, zero-extended
  std::string_view string_;      // kString
  uint64_t count_ = 0;           // arrays: number of elements
  const uint8_t* elements_ = nullptr;       // numeric/bool arrays: count_ packed elements
  std::vector<std::string_view> strings_;   // string arrays
};

struct GgufKv {
  std::string_view key;
  GgufValue value;
  uint64_t file_offset = 0;  // where the entry (its key length) starts
};

struct GgufTensor {
  std::string_view name;
  GgmlType type = GgmlType::kF32;
  uint32_t n_dims = 0;                  // 0..4, as written
  std::array<int64_t, 4> ne = {1, 1, 1, 1};
  uint64_t n_elements = 0;              // ne[0] * ne[1] * ne[2] * ne[3] <= INT64_MAX
  uint64_t n_bytes = 0;                 // (ne[0] / block_size) * block_bytes * ne[1] * ...
  uint64_t offset = 0;                  // as written: relative to the data section
  uint64_t file_offset = 0;             // data_offset() + offset
  const uint8_t* data = nullptr;        // into the mapping: [data, data + n_bytes)

  const GgmlTypeTraits& traits() const { return *FindGgmlType(type); }
  uint64_t row_bytes() const { return GgmlRowBytes(traits(), static_cast<uint64_t>(ne[0])); }
};

class GgufFile {
 public:
  // Maps `path` read-only and validates it. Errors are prefixed with the path.
  static Result<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Validates an image already in memory, which must outlive the result and stay
  // unchanged (tests, fuzzers). No copy is made.
  static Result<std::unique_ptr<GgufFile>> Parse(const void* data, size_t size);
  // Validates an image the GgufFile then owns (builtin models); path() is `name`.
  static Result<std::unique_ptr<GgufFile>> ParseOwned(std::vector<uint8_t> image, std::string name);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }  // "" after Parse()
  // The file Open() mapped, still open, for reads that bypass the mapping (a pread of
  // the page cache touches no mapped page, so the process's RSS does not grow); -1 for
  // images in memory. Offsets are those of base().
  int fd() const { return fd_.get(); }
  uint32_t version() const { return version_; }       // 2 or 3
  uint64_t file_size() const { return size_; }
  const uint8_t* base() const { return base_; }
  uint32_t alignment() const { return alignment_; }   // general.alignment, default 32
  // Start of the tensor data section: the end of the tensor infos rounded up to
  // alignment(). Tensor offsets are relative to it.
  uint64_t data_offset() const { return data_offset_; }

  // Metadata in file order.
  std::span<const GgufKv> metadata() const { return kvs_; }
  const GgufValue* Find(std::string_view key) const;
  bool Has(std::string_view key) const { return Find(key) != nullptr; }

  // Typed access. A missing key is kNotFound ("gguf: key 'x' not found"); a value of
  // the wrong type or out of range is kInvalidArgument naming the key, its type and
  // the value.
  template <GgufNumber T>
  Result<T> Get(std::string_view key) const;
  // Like Get, but a missing key is an empty optional rather than an error.
  template <GgufNumber T>
  Result<std::optional<T>> GetOptional(std::string_view key) const;
  template <GgufNumber T>
  Result<std::vector<T>> GetArray(std::string_view key) const;

  Result<uint8_t> GetU8(std::string_view key) const { return Get<uint8_t>(key); }
  Result<int8_t> GetI8(std::string_view key) const { return Get<int8_t>(key); }
  Result<uint16_t> GetU16(std::string_view key) const { return Get<uint16_t>(key); }
  Result<int16_t> GetI16(std::string_view key) const { return Get<int16_t>(key); }
  Result<uint32_t> GetU32(std::string_view key) const { return Get<uint32_t>(key); }
  Result<int32_t> GetI32(std::string_view key) const { return Get<int32_t>(key); }
  Result<uint64_t> GetU64(std::string_view key) const { return Get<uint64_t>(key); }
  Result<int64_t> GetI64(std::string_view key) const { return Get<int64_t>(key); }
  Result<float> GetF32(std::string_view key) const { return Get<float>(key); }
  Result<double> GetF64(std::string_view key) const { return Get<double>(key); }
  Result<bool> GetBool(std::string_view key) const { return Get<bool>(key); }
  Result<std::string_view> GetString(std::string_view key) const;
  Result<std::vector<float>> GetArrayF32(std::string_view key) const { return GetArray<float>(key); }
  Result<std::vector<int32_t>> GetArrayI32(std::string_view key) const { return GetArray<int32_t>(key); }
  Result<std::vector<uint32_t>> GetArrayU32(std::string_view key) const { return GetArray<uint32_t>(key); }
  // tokenizer.ggml.tokens, tokenizer.ggml.merges: views into the mapping.
  Result<std::span<const std::string_view>> GetArrayString(std::string_view key) const;

  // general.architecture, or "" when it is missing or not a string.
  std::string_view architecture() const;

  // Tensors in file order.
  std::span<const GgufTensor> tensors() const { return tensors_; }
  const GgufTensor* FindTensor(std::string_view name) const;
  uint64_t parameter_count() const { return parameter_count_; }  // sum of n_elements
  uint64_t tensor_bytes() const { return tensor_bytes_; }        // sum of n_bytes

 private:
  friend class GgufParser;
  GgufFile() = default;

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* mapping_ = nullptr;  // owned when Open() mapped the file
  UniqueFd fd_;              // the mapped file (Open)
  std::vector<uint8_t> owned_image_;  // ParseOwned()
  size_t mapping_size_ = 0;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufKv> kvs_;
  std::unordered_map<std::string_view, size_t> kv_index_;
  std::vector<GgufTensor> tensors_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
  uint64_t parameter_count_ = 0;
  uint64_t tensor_bytes_ = 0;
};

// "u32", "string", "string[32000]", "f32[32000]".
std::string GgufValueTypeString(const GgufValue& value);
// A float as its shortest round-trip decimal: plain between 1e-4 and 1e15 ("10000",
// "1000000", "0.5"), scientific outside ("1e-05", "1e+300").
std::string FormatGgufFloat(float value);
std::string FormatGgufDouble(double value);
// Escapes `text` for a single-line message or listing: the quote character (when not
// 0), \\ \n \t \r, other control bytes and every byte that is not part of well-formed
// UTF-8 as \xNN (so a message never carries broken UTF-8 to a terminal or a JSON
// reader); well-formed UTF-8 is kept, and cut (at a character boundary) after max_bytes
// with "...".
std::string EscapeGgufString(std::string_view text, size_t max_bytes = 96, char quote = '"');

}  // namespace tierkv
