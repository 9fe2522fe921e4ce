// tests/runtime/gguf_test.cc
//
// The GGUF reader: every validation error on small synthetic files written by a tiny
// writer below (one file per error path, checked by code and message), typed metadata
// access and value printing, mmap'd Open(), the reference models of
// ../shared/reference (metadata and tensor types against vectors/<name>.json, tensor
// placement, tokenizer arrays, tensor data read through the mapping), the KV cost
// formulas, and the `tierkv info` command (in process, output captured).
#include "runtime/gguf.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runtime/cli/info_command.h"
#include "kernels/ggml_types.h"
#include "tests/runtime/cli_test_util.h"
#include "tests/runtime/reference_util.h"

namespace tierkv {
namespace {

namespace fs = std::filesystem;

// ---- A tiny GGUF writer ----

// Little-endian byte sink.
class Bytes {
 public:
  template <typename T>
  Bytes& Put(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    data_.append(b, sizeof(T));
    return *this;
  }
  Bytes& U8(uint8_t v) { return Put(v); }
  Bytes& U32(uint32_t v) { return Put(v); }
  Bytes& U64(uint64_t v) { return Put(v); }
  Bytes& Str(std::string_view s) {
    U64(s.size());
    data_.append(s);
    return *this;
  }
  Bytes& Raw(std::string_view s) {
    data_.append(s);
    return *this;
  }
  const std::string& str() const { return data_; }

 private:
  std::string data_;
};

constexpr uint32_t kF32 = 0, kF16 = 1, kQ8_0 = 8, kQ4_K = 12;

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type = kF32;
  std::optional<uint64_t> offset;  // default: packed after the previous one, aligned
};

// Builds a GGUF image: header, key/values (each given as its raw value bytes),
// tensor infos, padding, data. Counts and fields can be overridden to make bad files.
class TinyGguf {
 public:
  uint32_t magic = 0x46554747;
  uint32_t version = 3;
  std::optional<uint64_t> n_tensors_override, n_kv_override;
  uint32_t alignment = 32;  // used for placing data; write general.alignment to change the file's
  int64_t data_bytes_delta = 0;  // grow (or shrink) the data section

  TinyGguf& Kv(std::string_view key, GgufValueType type, const Bytes& value) {
    Bytes b;
    b.Str(key).U32(static_cast<uint32_t>(type)).Raw(value.str());
    kvs_.push_back(b.str());
    return *this;
  }
  TinyGguf& KvU32(std::string_view key, uint32_t v) { return Kv(key, GgufValueType::kU32, Bytes().U32(v)); }
  TinyGguf& KvString(std::string_view key, std::string_view v) {
    return Kv(key, GgufValueType::kString, Bytes().Str(v));
  }
  TinyGguf& KvStrings(std::string_view key, const std::vector<std::string>& v) {
    Bytes b;
    b.U32(static_cast<uint32_t>(GgufValueType::kString)).U64(v.size());
    for (const std::string& s : v) b.Str(s);
    return Kv(key, GgufValueType::kArray, b);
  }
  TinyGguf& KvRaw(const std::string& raw) {
    kvs_.push_back(raw);
    return *this;
  }
  TinyGguf& Tensor(std::string name, std::vector<uint64_t> ne, uint32_t type,
                   std::optional<uint64_t> offset = std::nullopt) {
    tensors_.push_back({std::move(name), std::move(ne), type, offset});
    return *this;
  }

  static uint64_t NBytes(const TensorSpec& t) {
    const GgmlTypeTraits* tr = FindGgmlType(t.type);
    if (tr == nullptr || !tr->known) return 0;
    uint64_t n = 1;
    for (size_t d = 0; d < t.ne.size(); ++d) {
      uint64_t x = d == 0 ? t.ne[0] / tr->block_size * tr->block_bytes : t.ne[d];
      if (__builtin_mul_overflow(n, x, &n)) return 0;
    }
    return n;
  }

  std::string Build() const {
    Bytes b;
    b.U32(magic).U32(version);
    b.U64(n_tensors_override.value_or(tensors_.size()));
    b.U64(n_kv_override.value_or(kvs_.size()));
    for (const std::string& kv : kvs_) b.Raw(kv);
    uint64_t next = 0, end = 0;
    for (const TensorSpec& t : tensors_) {
      const uint64_t off = t.offset.value_or(next);
      b.Str(t.name).U32(static_cast<uint32_t>(t.ne.size()));
      for (uint64_t ne : t.ne) b.U64(ne);
      b.U32(t.type).U64(off);
      const uint64_t nb = NBytes(t);
      if (off < (1ull << 30) && nb < (1ull << 30)) end = std::max(end, off + nb);
      next = (std::max(next, off + nb) + alignment - 1) / alignment * alignment;
    }
    std::string out = b.str();
    if (!tensors_.empty()) {
      out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
      const size_t data_start = out.size();
      out.resize(static_cast<size_t>(static_cast<int64_t>(data_start + end) + data_bytes_delta));
      for (size_t i = data_start; i < out.size(); ++i) out[i] = static_cast<char>(i * 131);
    }
    return out;
  }

 private:
  std::vector<std::string> kvs_;
  std::vector<TensorSpec> tensors_;
};

// The value of a Result, or a failure naming its status (and T{}).
template <typename T>
T Val(Result<T> r) {
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : T{};
}

// A small valid model-like file.
TinyGguf ValidFile() {
  TinyGguf g;
  g.KvString("general.architecture", "llama").KvU32("llama.block_count", 2);
  g.Tensor("a", {64, 2}, kF32).Tensor("b", {256, 3}, kQ4_K).Tensor("c", {32}, kQ8_0);
  return g;
}

// Parses and requires a failure with `code` whose message contains every `parts`.
void ExpectError(const std::string& image, StatusCode code, std::vector<std::string> parts) {
  auto r = GgufFile::Parse(image.data(), image.size());
  ASSERT_FALSE(r.ok()) << "expected an error containing '" << parts.front() << "'";
  const Status st = r.status();
  EXPECT_EQ(st.code(), code) << st.ToString();
  EXPECT_EQ(st.message().rfind("gguf: ", 0), 0u) << st.message();
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << "message must be one line: " << st.message();
  for (const std::string& p : parts) EXPECT_NE(st.message().find(p), std::string::npos) << st.message();
}

std::unique_ptr<GgufFile> MustParse(const std::string& image) {
  auto r = GgufFile::Parse(image.data(), image.size());
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return nullptr;
  return std::move(r).value();
}

// ---- Valid synthetic files ----

TEST(GgufSynthetic, ValidFileParses) {
  const std::string image = ValidFile().Build();
  auto f = MustParse(image);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->architecture(), "llama");
  ASSERT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->data_offset() % 32, 0u);
  const GgufTensor* b = f->FindTensor("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->type, GgmlType::kQ4_K);
  EXPECT_EQ(b->n_dims, 2u);
  EXPECT_EQ(b->ne[0], 256);
  EXPECT_EQ(b->ne[1], 3);
  EXPECT_EQ(b->ne[2], 1);
  EXPECT_EQ(b->n_elements, 768u);
  EXPECT_EQ(b->n_bytes, 3u * 144);
  EXPECT_EQ(b->row_bytes(), 144u);
  EXPECT_EQ(b->offset, 512u);  // after a: 64*2*4 = 512 bytes
  EXPECT_EQ(b->file_offset, f->data_offset() + 512);
  EXPECT_EQ(b->data, reinterpret_cast<const uint8_t*>(image.data()) + b->file_offset);
  EXPECT_EQ(f->parameter_count(), 128u + 768 + 32);
  EXPECT_EQ(f->tensor_bytes(), 512u + 432 + 34);
  EXPECT_EQ(f->FindTensor("nope"), nullptr);
}

TEST(GgufSynthetic, Version2AndCustomAlignment) {
  TinyGguf g = ValidFile();
  g.version = 2;
  g.alignment = 64;
  g.KvU32("general.alignment", 64);
  const std::string image = g.Build();  // Parse() borrows the image
  auto f = MustParse(image);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);
  EXPECT_EQ(f->FindTensor("b")->offset, 512u);
  EXPECT_EQ(f->FindTensor("c")->offset, 512u + 448);  // 432 rounded up to 64
}

TEST(GgufSynthetic, NoTensorsAndNoMetadata) {
  TinyGguf g;
  const std::string image = g.Build();
  EXPECT_EQ(image.size(), 24u);  // just the header
  auto f = MustParse(image);
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->metadata().empty());
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->architecture(), "");
}

// ---- Every error path ----

TEST(GgufErrors, BadMagic) {
  TinyGguf g = ValidFile();
  g.magic = 0x12345678;
  ExpectError(g.Build(), StatusCode::kCorruption, {"bad magic", "0x12345678", "not a GGUF file"});
  std::string legacy = ValidFile().Build();
  std::memcpy(legacy.data(), "tjgg", 4);
  ExpectError(legacy, StatusCode::kCorruption, {"bad magic 'tjgg'", "legacy GGML"});
}

TEST(GgufErrors, TooSmall) {
  ExpectError("", StatusCode::kCorruption, {"0 bytes, too small"});
  ExpectError("GGU", StatusCode::kCorruption, {"3 bytes, too small"});
  ExpectError("GGUF\x03", StatusCode::kCorruption, {"file truncated", "version"});
  ExpectError(ValidFile().Build().substr(0, 12), StatusCode::kCorruption, {"file truncated", "n_tensors"});
}

TEST(GgufErrors, Version1Refused) {
  TinyGguf g = ValidFile();
  g.version = 1;
  ExpectError(g.Build(), StatusCode::kUnsupported, {"version 1 is not supported"});
}

TEST(GgufErrors, Version4AndZeroRefused) {
  TinyGguf g = ValidFile();
  g.version = 4;
  ExpectError(g.Build(), StatusCode::kUnsupported, {"unsupported GGUF version 4", "supported: 2, 3"});
  g.version = 0;
  ExpectError(g.Build(), StatusCode::kUnsupported, {"unsupported GGUF version 0"});
}

TEST(GgufErrors, BigEndianRefused) {
  TinyGguf g = ValidFile();
  g.version = 0x03000000;
  ExpectError(g.Build(), StatusCode::kUnsupported, {"big-endian"});
}

TEST(GgufErrors, HugeTensorCount) {
  TinyGguf g = ValidFile();
  g.n_tensors_override = 1ull << 60;
  ExpectError(g.Build(), StatusCode::kCorruption, {"n_tensors = 1152921504606846976 cannot fit"});
  g.n_tensors_override = UINT64_MAX;
  ExpectError(g.Build(), StatusCode::kCorruption, {"n_tensors = 18446744073709551615 cannot fit"});
}

TEST(GgufErrors, HugeKvCount) {
  TinyGguf g = ValidFile();
  g.n_kv_override = UINT64_MAX / 2;
  ExpectError(g.Build(), StatusCode::kCorruption, {"n_kv = 9223372036854775807 cannot fit"});
}

TEST(GgufErrors, MoreTensorsThanWritten) {
  // Plausible counts that the file does not hold: plain truncation errors.
  TinyGguf g = ValidFile();
  g.n_tensors_override = 5;
  const std::string image = g.Build();
  auto r = GgufFile::Parse(image.data(), image.size());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
}

TEST(GgufErrors, HugeKeyLength) {
  TinyGguf g;
  g.KvRaw(Bytes().U64(1ull << 60).Raw("abcdef").str());
  ExpectError(g.Build(), StatusCode::kCorruption,
              {"key #0: key length 1152921504606846976 at offset 24 exceeds the 6 bytes left"});
}

TEST(GgufErrors, HugeStringValueLength) {
  TinyGguf g;
  g.Kv("general.name", GgufValueType::kString, Bytes().U64(UINT64_MAX - 3).Raw("xy"));
  ExpectError(g.Build(), StatusCode::kCorruption,
              {"key 'general.name': string length 18446744073709551612", "exceeds the 2 bytes left"});
}

TEST(GgufErrors, HugeStringInArray) {
  TinyGguf g;
  Bytes arr;
  arr.U32(static_cast<uint32_t>(GgufValueType::kString)).U64(2).Str("a").U64(1ull << 62).Raw("zz");
  g.Kv("tokenizer.ggml.tokens", GgufValueType::kArray, arr);
  ExpectError(g.Build(), StatusCode::kCorruption,
              {"key 'tokenizer.ggml.tokens' element 1: string length 4611686018427387904"});
}

TEST(GgufErrors, HugeArrayCounts) {
  TinyGguf g;
  g.Kv("s", GgufValueType::kArray, Bytes().U32(static_cast<uint32_t>(GgufValueType::kString)).U64(1ull << 40));
  ExpectError(g.Build(), StatusCode::kCorruption, {"key 's': array length 1099511627776", "cannot fit"});
  TinyGguf h;
  h.Kv("f", GgufValueType::kArray,
       Bytes().U32(static_cast<uint32_t>(GgufValueType::kF32)).U64(UINT64_MAX / 2).U32(0));
  ExpectError(h.Build(), StatusCode::kCorruption, {"key 'f': array of 9223372036854775807 f32", "past the end"});
}

TEST(GgufErrors, UnknownValueTypes) {
  TinyGguf g;
  g.Kv("k", static_cast<GgufValueType>(13), Bytes().U32(0));
  ExpectError(g.Build(), StatusCode::kCorruption, {"key 'k' has unknown value type 13"});
  TinyGguf h;
  h.Kv("arr", GgufValueType::kArray, Bytes().U32(99).U64(1).U32(0));
  ExpectError(h.Build(), StatusCode::kCorruption, {"key 'arr' is an array of unknown value type 99"});
}

TEST(GgufErrors, NestedArrayRefused) {
  TinyGguf g;
  Bytes inner;
  inner.U32(static_cast<uint32_t>(GgufValueType::kArray)).U64(1).U32(static_cast<uint32_t>(GgufValueType::kU8)).U64(0);
  g.Kv("nested", GgufValueType::kArray, inner);
  ExpectError(g.Build(), StatusCode::kUnsupported, {"key 'nested' is an array of arrays"});
}

TEST(GgufErrors, BadBool) {
  TinyGguf g;
  g.Kv("b", GgufValueType::kBool, Bytes().U8(2));
  ExpectError(g.Build(), StatusCode::kCorruption, {"key 'b': bool value 2 is neither 0 nor 1"});
  TinyGguf h;
  h.Kv("bs", GgufValueType::kArray, Bytes().U32(static_cast<uint32_t>(GgufValueType::kBool)).U64(3).U8(1).U8(0).U8(7));
  ExpectError(h.Build(), StatusCode::kCorruption, {"key 'bs' element 2: bool value 7"});
}

TEST(GgufErrors, EmptyKeyAndDuplicateKey) {
  TinyGguf g;
  g.KvU32("", 1);
  ExpectError(g.Build(), StatusCode::kCorruption, {"key #0 at offset 24 is empty"});
  TinyGguf h;
  h.KvU32("llama.block_count", 2).KvString("general.name", "x").KvU32("llama.block_count", 3);
  ExpectError(h.Build(), StatusCode::kCorruption, {"duplicate key 'llama.block_count' (entries #0 and #2)"});
}

TEST(GgufErrors, UnknownTensorType) {
  TinyGguf g = ValidFile();
  g.Tensor("weird", {32}, 99);
  ExpectError(g.Build(), StatusCode::kUnsupported, {"tensor 'weird' has unknown ggml type id 99"});
  TinyGguf h = ValidFile();
  h.Tensor("repacked", {32}, 31);
  ExpectError(h.Build(), StatusCode::kUnsupported, {"tensor 'repacked' has ggml type 31 (Q4_0_4_4)", "removed"});
}

TEST(GgufErrors, TooManyDimensions) {
  TinyGguf g;
  g.Tensor("t5", {1, 1, 1, 1, 1}, kF32);
  ExpectError(g.Build(), StatusCode::kCorruption, {"tensor 't5' has 5 dimensions (at most 4"});
}

TEST(GgufErrors, DimensionOverflow) {
  TinyGguf g;
  g.Tensor("big", {1ull << 32, 1ull << 32}, kF32);
  ExpectError(g.Build(), StatusCode::kCorruption,
              {"tensor 'big' shape [4294967296, 4294967296, 1, 1] has more than INT64_MAX elements"});
  TinyGguf h;
  h.Tensor("neg", {16, UINT64_MAX}, kF32);
  ExpectError(h.Build(), StatusCode::kCorruption, {"tensor 'neg' ne[1] = 18446744073709551615 is out of range"});
  TinyGguf bytes;  // elements fit in int64, bytes do not fit in 64 bits
  bytes.Tensor("wide", {1ull << 62}, static_cast<uint32_t>(GgmlType::kF64));
  ExpectError(bytes.Build(), StatusCode::kCorruption, {"tensor 'wide' byte size overflows"});
}

TEST(GgufErrors, RowNotMultipleOfBlock) {
  TinyGguf g;
  g.Tensor("q", {100, 2}, kQ4_K);
  ExpectError(g.Build(), StatusCode::kCorruption,
              {"tensor 'q' of type Q4_K has ne[0] = 100, not a multiple of its block size 256"});
}

TEST(GgufErrors, MisalignedOffset) {
  TinyGguf g;
  g.Tensor("a", {8}, kF32).Tensor("b", {8}, kF32, 40);
  ExpectError(g.Build(), StatusCode::kCorruption, {"tensor 'b' data offset 40 is not a multiple of the alignment 32"});
}

TEST(GgufErrors, DataPastEndOfFile) {
  TinyGguf g;
  g.Tensor("blk.0.attn_q.weight", {16, 4}, kF16);
  g.data_bytes_delta = -1;
  const std::string image = g.Build();
  const uint64_t data_offset = image.size() + 1 - 128;
  ExpectError(image, StatusCode::kCorruption,
              {"gguf: tensor 'blk.0.attn_q.weight' data [" + std::to_string(data_offset) + ", " +
               std::to_string(data_offset + 128) + ") extends past the end of the file (size " +
               std::to_string(image.size()) + ")"});
  TinyGguf far;
  far.Tensor("w", {8}, kF32, 1ull << 40);
  ExpectError(far.Build(), StatusCode::kCorruption, {"tensor 'w' data [", "extends past the end of the file"});
  TinyGguf wrap;  // offset + size wraps around 2^64
  wrap.Tensor("w", {8}, kF32, UINT64_MAX - 31);
  ExpectError(wrap.Build(), StatusCode::kCorruption, {"tensor 'w' data [", "extends past the end of the file"});
}

TEST(GgufErrors, DataSectionPastEnd) {
  // Tensor infos end mid-alignment and the file stops there.
  TinyGguf g;
  g.Tensor("abc", {8}, kF32);
  std::string image = g.Build();
  const auto f = GgufFile::Parse(image.data(), image.size());
  ASSERT_TRUE(f.ok());
  const uint64_t info_end = 24 + 8 + 3 + 4 + 8 + 4 + 8;
  ASSERT_NE(info_end % 32, 0u);
  ExpectError(image.substr(0, info_end), StatusCode::kCorruption, {"tensor data section starts at offset 64"});
}

TEST(GgufErrors, DuplicateTensorName) {
  TinyGguf g = ValidFile();
  g.Tensor("b", {32}, kF32);
  ExpectError(g.Build(), StatusCode::kCorruption, {"duplicate tensor name 'b' (tensors #1 and #3)"});
}

TEST(GgufErrors, EmptyTensorName) {
  TinyGguf g;
  g.Tensor("", {8}, kF32);
  ExpectError(g.Build(), StatusCode::kCorruption, {"tensor #0 at offset 24 has an empty name"});
}

TEST(GgufErrors, OverlappingTensors) {
  TinyGguf g;
  g.Tensor("a", {64}, kF32, 0).Tensor("b", {8}, kF32, 128);
  ExpectError(g.Build(), StatusCode::kCorruption, {"tensors 'a'", "and 'b'", "overlap"});
}

TEST(GgufErrors, BadAlignmentKey) {
  TinyGguf g = ValidFile();
  g.KvU32("general.alignment", 48);
  ExpectError(g.Build(), StatusCode::kCorruption, {"general.alignment = 48 is not a power of two"});
  TinyGguf z = ValidFile();
  z.KvU32("general.alignment", 0);
  ExpectError(z.Build(), StatusCode::kCorruption, {"general.alignment = 0 is not a power of two"});
  TinyGguf t = ValidFile();
  t.Kv("general.alignment", GgufValueType::kU64, Bytes().U64(32));
  ExpectError(t.Build(), StatusCode::kCorruption, {"general.alignment is u64, expected u32"});
}

TEST(GgufErrors, NamesWithControlCharactersStayOnOneLine) {
  TinyGguf g;
  g.KvU32("a\nb", 1).KvU32("a\nb", 2);
  ExpectError(g.Build(), StatusCode::kCorruption, {"duplicate key 'a\\nb'"});
}

TEST(GgufErrors, TruncatedEverywhereInASmallFile) {
  // Every proper prefix of a valid file with tensors is an error, never a crash.
  const std::string image = ValidFile().Build();
  for (size_t n = 0; n < image.size(); ++n) {
    auto r = GgufFile::Parse(image.data(), n);
    ASSERT_FALSE(r.ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
  }
}

// ---- Typed access and printing ----

std::string AllTypesFile() {
  TinyGguf g;
  g.Kv("u8", GgufValueType::kU8, Bytes().U8(200));
  g.Kv("i8", GgufValueType::kI8, Bytes().Put<int8_t>(-5));
  g.Kv("u16", GgufValueType::kU16, Bytes().Put<uint16_t>(65535));
  g.Kv("i16", GgufValueType::kI16, Bytes().Put<int16_t>(-300));
  g.Kv("u32", GgufValueType::kU32, Bytes().U32(4000000000u));
  g.Kv("i32", GgufValueType::kI32, Bytes().Put<int32_t>(-1));
  g.Kv("f32", GgufValueType::kF32, Bytes().Put<float>(1e-5f));
  g.Kv("bool", GgufValueType::kBool, Bytes().U8(1));
  g.KvString("str", "hi \"there\"\n\x01");
  g.Kv("u64", GgufValueType::kU64, Bytes().U64(1ull << 40));
  g.Kv("i64", GgufValueType::kI64, Bytes().Put<int64_t>(INT64_MIN));
  g.Kv("f64", GgufValueType::kF64, Bytes().Put<double>(1e300));
  g.KvStrings("tokens", {"<unk>", "<s>", "</s>", "a", "b"});
  Bytes scores;
  scores.U32(static_cast<uint32_t>(GgufValueType::kF32)).U64(3).Put<float>(0.f).Put<float>(-1.5f).Put<float>(2.25f);
  g.Kv("scores", GgufValueType::kArray, scores);
  Bytes types;
  types.U32(static_cast<uint32_t>(GgufValueType::kI32)).U64(3).Put<int32_t>(2).Put<int32_t>(-7).Put<int32_t>(3);
  g.Kv("token_type", GgufValueType::kArray, types);
  Bytes empty;
  empty.U32(static_cast<uint32_t>(GgufValueType::kU8)).U64(0);
  g.Kv("empty", GgufValueType::kArray, empty);
  return g.Build();
}

TEST(GgufMetadata, TypedGetters) {
  const std::string image = AllTypesFile();
  auto f = MustParse(image);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->metadata().size(), 16u);
  EXPECT_EQ(Val(f->GetU8("u8")), 200);
  EXPECT_EQ(Val(f->GetU32("u8")), 200u);  // widening is lossless
  EXPECT_EQ(Val(f->GetI8("i8")), -5);
  EXPECT_EQ(Val(f->GetI64("i8")), -5);
  EXPECT_EQ(Val(f->GetU16("u16")), 65535);
  EXPECT_EQ(Val(f->GetI16("i16")), -300);
  EXPECT_EQ(Val(f->GetU32("u32")), 4000000000u);
  EXPECT_EQ(Val(f->GetU64("u32")), 4000000000u);
  EXPECT_EQ(Val(f->GetI32("i32")), -1);
  EXPECT_EQ(Val(f->GetF32("f32")), 1e-5f);
  EXPECT_DOUBLE_EQ(Val(f->GetF64("f32")), static_cast<double>(1e-5f));
  EXPECT_EQ(Val(f->GetF32("u16")), 65535.f);  // integers read as floats
  EXPECT_TRUE(Val(f->GetBool("bool")));
  EXPECT_EQ(Val(f->GetString("str")), "hi \"there\"\n\x01");
  EXPECT_EQ(Val(f->GetU64("u64")), 1ull << 40);
  EXPECT_EQ(Val(f->GetI64("i64")), INT64_MIN);
  EXPECT_EQ(Val(f->GetF64("f64")), 1e300);
  EXPECT_TRUE(f->Has("str"));
  EXPECT_FALSE(f->Has("nope"));
}

TEST(GgufMetadata, GetterErrorsNameKeyTypeAndValue) {
  const std::string image = AllTypesFile();
  auto f = MustParse(image);
  ASSERT_NE(f, nullptr);
  auto expect = [](const Status& st, StatusCode code, const std::string& text) {
    EXPECT_EQ(st.code(), code) << st.ToString();
    EXPECT_NE(st.message().find(text), std::string::npos) << st.message();
  };
  expect(f->GetU32("nope").status(), StatusCode::kNotFound, "gguf: key 'nope' not found");
  expect(f->GetU32("i32").status(), StatusCode::kInvalidArgument,
         "gguf: key 'i32': value -1 (i32) does not fit in u32");
  expect(f->GetU8("u16").status(), StatusCode::kInvalidArgument, "value 65535 (u16) does not fit in u8");
  expect(f->GetI32("u32").status(), StatusCode::kInvalidArgument, "value 4000000000 (u32) does not fit in i32");
  expect(f->GetI32("i64").status(), StatusCode::kInvalidArgument, "does not fit in i32");
  expect(f->GetU32("f32").status(), StatusCode::kInvalidArgument, "key 'f32': is f32, expected u32");
  expect(f->GetF32("f64").status(), StatusCode::kInvalidArgument, "value 1e+300 (f64) does not fit in f32");
  expect(f->GetBool("u8").status(), StatusCode::kInvalidArgument, "is u8, expected bool");
  expect(f->GetString("u32").status(), StatusCode::kInvalidArgument, "is u32, expected string");
  expect(f->GetU32("str").status(), StatusCode::kInvalidArgument, "is string, expected u32");
  expect(f->GetU32("tokens").status(), StatusCode::kInvalidArgument, "is string[5], expected u32");
  expect(f->GetArrayF32("u32").status(), StatusCode::kInvalidArgument, "is u32, expected an array of f32");
  expect(f->GetArrayU32("token_type").status(), StatusCode::kInvalidArgument,
         "key 'token_type': element 1: value -7 (i32) does not fit in u32");
  expect(f->GetArrayString("scores").status(), StatusCode::kInvalidArgument, "expected an array of strings");
}

TEST(GgufMetadata, OptionalGetter) {
  const std::string image = AllTypesFile();
  auto f = MustParse(image);
  ASSERT_NE(f, nullptr);
  auto missing = f->GetOptional<uint32_t>("llama.attention.key_length");
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->has_value());
  auto present = f->GetOptional<uint32_t>("u16");
  ASSERT_TRUE(present.ok());
  EXPECT_EQ(present->value(), 65535u);
  EXPECT_FALSE(f->GetOptional<uint32_t>("i32").ok());  // present with a bad value is still an error
}

TEST(GgufMetadata, Arrays) {
  const std::string image = AllTypesFile();
  auto f = MustParse(image);
  ASSERT_NE(f, nullptr);
  auto tokens = f->GetArrayString("tokens");
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ(tokens->size(), 5u);
  EXPECT_EQ((*tokens)[1], "<s>");
  // Views into the image, not copies.
  EXPECT_GE((*tokens)[1].data(), image.data());
  EXPECT_LT((*tokens)[1].data(), image.data() + image.size());
  EXPECT_EQ(Val(f->GetArrayF32("scores")), (std::vector<float>{0.f, -1.5f, 2.25f}));
  EXPECT_EQ(Val(f->GetArrayI32("token_type")), (std::vector<int32_t>{2, -7, 3}));
  EXPECT_EQ(Val(f->GetArray<int64_t>("token_type")), (std::vector<int64_t>{2, -7, 3}));
  EXPECT_EQ(Val(f->GetArray<double>("scores")), (std::vector<double>{0.0, -1.5, 2.25}));
  const GgufValue* tt = f->Find("token_type");
  ASSERT_NE(tt, nullptr);
  EXPECT_TRUE(tt->is_array());
  EXPECT_EQ(tt->element_type(), GgufValueType::kI32);
  EXPECT_EQ(tt->size(), 3u);
  EXPECT_EQ(Val(tt->ElementAs<int32_t>(1)), -7);
  EXPECT_TRUE(f->GetArray<uint8_t>("empty")->empty());
}

TEST(GgufMetadata, FormatsEveryKindOfValue) {
  const std::string image = AllTypesFile();
  auto f = MustParse(image);
  ASSERT_NE(f, nullptr);
  auto fmt = [&](const char* key, GgufFormatOptions o = {}) { return FormatGgufValue(*(f->Find(key)), o); };
  EXPECT_EQ(fmt("u8"), "200");
  EXPECT_EQ(fmt("i8"), "-5");
  EXPECT_EQ(fmt("i16"), "-300");
  EXPECT_EQ(fmt("u32"), "4000000000");
  EXPECT_EQ(fmt("i32"), "-1");
  EXPECT_EQ(fmt("f32"), "1e-05");
  EXPECT_EQ(fmt("bool"), "true");
  EXPECT_EQ(fmt("str"), "\"hi \\\"there\\\"\\n\\x01\"");
  EXPECT_EQ(fmt("u64"), "1099511627776");
  EXPECT_EQ(fmt("i64"), "-9223372036854775808");
  EXPECT_EQ(fmt("f64"), "1e+300");
  EXPECT_EQ(fmt("tokens"), "[\"<unk>\", \"<s>\", \"</s>\", \"a\", \"b\"]");
  EXPECT_EQ(fmt("tokens", {.max_array_items = 2}), "[\"<unk>\", \"<s>\", ... 3 more]");
  EXPECT_EQ(fmt("tokens", {.max_array_items = 0}), "[... 5 more]");
  EXPECT_EQ(fmt("scores"), "[0, -1.5, 2.25]");
  EXPECT_EQ(fmt("token_type"), "[2, -7, 3]");
  EXPECT_EQ(fmt("empty"), "[]");
  EXPECT_EQ(fmt("str", {.max_string_bytes = 3}), "\"hi ...\" (12 bytes)");
  EXPECT_EQ(GgufValueTypeString(*(f->Find("tokens"))), "string[5]");
  EXPECT_EQ(GgufValueTypeString(*(f->Find("scores"))), "f32[3]");
  EXPECT_EQ(GgufValueTypeString(*(f->Find("f64"))), "f64");
  EXPECT_EQ(FormatGgufFloat(10000.f), "10000");
  EXPECT_EQ(FormatGgufFloat(1e6f), "1000000");
  EXPECT_EQ(FormatGgufFloat(0.1f), "0.1");
  EXPECT_EQ(FormatGgufFloat(1e-6f), "1e-06");
  EXPECT_EQ(FormatGgufFloat(-2.5e20f), "-2.5e+20");
  EXPECT_EQ(FormatGgufDouble(0.0), "0");
  // Only the quote character in use is escaped.
  EXPECT_EQ(EscapeGgufString("it's \"x\""), "it's \\\"x\\\"");
  EXPECT_EQ(EscapeGgufString("it's", 96, '\''), "it\\'s");
  EXPECT_EQ(EscapeGgufString(std::string_view("a\0b", 3), 96, 0), "a\\x00b");
  // UTF-8 is kept and never cut inside a character.
  EXPECT_EQ(EscapeGgufString("h\xc3\xa9llo", 2), "h...");
  EXPECT_EQ(EscapeGgufString("h\xc3\xa9llo", 3), "h\xc3\xa9...");
  // Bytes outside well-formed UTF-8 are escaped: a stray continuation byte, a lead byte
  // without its continuation, an overlong form, a surrogate, DEL; CJK and emoji are kept.
  EXPECT_EQ(EscapeGgufString("\x82*\xdb\x7f"), "\\x82*\\xdb\\x7f");
  EXPECT_EQ(EscapeGgufString("a\xc0\xaf" "b\xed\xa0\x80"), "a\\xc0\\xafb\\xed\\xa0\\x80");
  EXPECT_EQ(EscapeGgufString("\xe4\xb8\xad\xf0\x9f\x98\x80"), "\xe4\xb8\xad\xf0\x9f\x98\x80");
  EXPECT_EQ(EscapeGgufString("\xe4\xb8"), "\\xe4\\xb8");  // truncated sequence
  // A cut keeps the stray bytes before it (escaped) and backs off over a split sequence only.
  EXPECT_EQ(EscapeGgufString(std::string(6, '\x80'), 4), "\\x80\\x80\\x80\\x80...");
  EXPECT_EQ(EscapeGgufString("ab\xf0\x9f\x98\x80" "cd", 4), "ab...");
  EXPECT_EQ(EscapeGgufString("ab\xf0\x9f\x98\x80" "cd", 6), "ab\xf0\x9f\x98\x80...");
}

// ---- ggml types ----

TEST(GgmlTypes, LayoutsOfTheTypesWeRead) {
  struct Want {
    GgmlType type;
    const char* name;
    uint32_t block_size, block_bytes;
  };
  const Want wants[] = {{GgmlType::kF32, "F32", 1, 4},       {GgmlType::kF16, "F16", 1, 2},
                        {GgmlType::kBF16, "BF16", 1, 2},     {GgmlType::kQ8_0, "Q8_0", 32, 34},
                        {GgmlType::kQ4_0, "Q4_0", 32, 18},   {GgmlType::kQ4_K, "Q4_K", 256, 144},
                        {GgmlType::kQ5_K, "Q5_K", 256, 176}, {GgmlType::kQ6_K, "Q6_K", 256, 210}};
  for (const Want& w : wants) {
    const GgmlTypeTraits* t = FindGgmlType(w.type);
    ASSERT_NE(t, nullptr);
    EXPECT_STREQ(t->name, w.name);
    EXPECT_EQ(t->block_size, w.block_size) << w.name;
    EXPECT_EQ(t->block_bytes, w.block_bytes) << w.name;
    EXPECT_TRUE(t->known);
    GgmlType parsed;
    ASSERT_TRUE(ParseGgmlTypeName(w.name, &parsed));
    EXPECT_EQ(parsed, w.type);
  }
  EXPECT_EQ(GgmlRowBytes(*FindGgmlType(GgmlType::kQ4_K), 4096), 16u * 144);
  EXPECT_FALSE(IsKnownGgmlType(4));
  EXPECT_FALSE(IsKnownGgmlType(31));
  EXPECT_FALSE(IsKnownGgmlType(40));
  EXPECT_EQ(FindGgmlType(1000), nullptr);
  EXPECT_EQ(GgmlTypeName(31), "Q4_0_4_4 (removed from ggml)");
  EXPECT_EQ(GgmlTypeName(1000), "unknown type 1000");
  GgmlType unused;
  EXPECT_FALSE(ParseGgmlTypeName("Q4_2", &unused));
  for (const GgmlTypeTraits& t : AllGgmlTypes()) {
    if (t.known) {
      EXPECT_GT(t.block_size, 0u) << t.name;
      EXPECT_GT(t.block_bytes, 0u) << t.name;
    }
  }
}

// ---- Open() over mmap ----

class TempFile {
 public:
  explicit TempFile(const std::string& contents) {
    std::string tmpl = (fs::temp_directory_path() / "tierkv-gguf-test-XXXXXX").string();
    const int fd = mkstemp(tmpl.data());
    path_ = tmpl;
    if (fd >= 0) {
      if (!contents.empty()) {
        EXPECT_EQ(write(fd, contents.data(), contents.size()), static_cast<ssize_t>(contents.size()));
      }
      close(fd);
    }
  }
  ~TempFile() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(GgufOpen, MapsAValidFile) {
  TempFile tmp(ValidFile().Build());
  auto f = GgufFile::Open(tmp.path());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->path(), tmp.path());
  EXPECT_EQ((*f)->tensors().size(), 3u);
  const GgufTensor* c = (*f)->FindTensor("c");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->data, (*f)->base() + c->file_offset);
  // The mapping holds the file's bytes.
  std::ifstream in(tmp.path(), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(std::memcmp(c->data, bytes.data() + c->file_offset, c->n_bytes), 0);
}

TEST(GgufOpen, ErrorsNameThePath) {
  auto missing = GgufFile::Open("/nonexistent/dir/model.gguf");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/dir/model.gguf"), std::string::npos);

  auto dir = GgufFile::Open(fs::temp_directory_path().string());
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("a directory, not a GGUF file"), std::string::npos);

  TempFile empty("");
  auto e = GgufFile::Open(empty.path());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("file is empty"), std::string::npos);

  TinyGguf g = ValidFile();
  g.version = 1;
  TempFile v1(g.Build());
  auto r = GgufFile::Open(v1.path());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  EXPECT_EQ(r.status().message(), v1.path() + ": gguf: GGUF version 1 is not supported (only versions 2 and 3); "
                                              "re-convert the model with a current llama.cpp");
}

// ---- Reference models ----

const std::string kShared = TIERKV_SHARED_DIR;

std::vector<std::string> ReferenceModels() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(kShared + "/reference/models", ec)) {
    if (e.path().extension() == ".gguf") names.push_back(e.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

#define SKIP_WITHOUT_REFERENCE()                                                                   \
  if (ReferenceModels().empty()) TIERKV_NEED_REFERENCE(kShared + "/reference/models/ref-llama-q8_0.gguf")

nlohmann::json LoadVectors(const std::string& name) {
  std::ifstream in(kShared + "/reference/vectors/" + name + ".json");
  return nlohmann::json::parse(in);
}

TEST(GgufReference, MetadataMatchesTheVectors) {
  SKIP_WITHOUT_REFERENCE();
  for (const std::string& name : ReferenceModels()) {
    SCOPED_TRACE(name);
    auto opened = GgufFile::Open(kShared + "/reference/models/" + name + ".gguf");
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    const GgufFile& f = **opened;
    const nlohmann::json model = LoadVectors(name)["model"];
    const std::string arch = model["arch"];
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.file_size(), model["file_size"].get<uint64_t>());
    EXPECT_EQ(f.architecture(), arch);
    EXPECT_EQ(Val(f.GetU32(arch + ".block_count")), model["n_layer"].get<uint32_t>());
    EXPECT_EQ(Val(f.GetU32(arch + ".embedding_length")), model["n_embd"].get<uint32_t>());
    EXPECT_EQ(Val(f.GetU32(arch + ".attention.head_count")), model["n_head"].get<uint32_t>());
    EXPECT_EQ(Val(f.GetU32(arch + ".attention.head_count_kv")), model["n_head_kv"].get<uint32_t>());
    EXPECT_EQ(Val(f.GetU32(arch + ".attention.key_length")), model["head_dim"].get<uint32_t>());
    EXPECT_EQ(Val(f.GetU32(arch + ".context_length")), model["context_length"].get<uint32_t>());
    EXPECT_EQ(Val(f.GetF32(arch + ".rope.freq_base")), model["rope_freq_base"].get<float>());
    EXPECT_EQ(Val(f.GetF32(arch + ".attention.layer_norm_rms_epsilon")), model["rms_norm_eps"].get<float>());
    if (model.contains("n_expert")) {
      EXPECT_EQ(Val(f.GetU32(arch + ".expert_count")), model["n_expert"].get<uint32_t>());
      EXPECT_EQ(Val(f.GetU32(arch + ".expert_used_count")), model["n_expert_used"].get<uint32_t>());
    }

    // Every tensor, with its type, and nothing else.
    const nlohmann::json& types = model["tensor_types"];
    EXPECT_EQ(f.tensors().size(), types.size());
    for (const GgufTensor& t : f.tensors()) {
      const std::string tname(t.name);
      ASSERT_TRUE(types.contains(tname)) << tname;
      EXPECT_EQ(t.traits().name, types[tname].get<std::string>()) << tname;
    }
    for (const auto& [tname, type] : types.items()) EXPECT_NE(f.FindTensor(tname), nullptr) << tname;

    // The embedding is [n_embd, n_vocab]; tied models have no output.weight.
    const GgufTensor* embd = f.FindTensor("token_embd.weight");
    ASSERT_NE(embd, nullptr);
    EXPECT_EQ(embd->n_dims, 2u);
    EXPECT_EQ(embd->ne[0], model["n_embd"].get<int64_t>());
    EXPECT_EQ(embd->ne[1], static_cast<int64_t>(f.GetArrayString("tokenizer.ggml.tokens")->size()));
    if (model["tied_embeddings"].get<bool>()) {
      EXPECT_EQ(f.FindTensor("output.weight"), nullptr);
    }
  }
}

TEST(GgufReference, TensorsAreAlignedPackedAndInsideTheFile) {
  SKIP_WITHOUT_REFERENCE();
  for (const std::string& name : ReferenceModels()) {
    SCOPED_TRACE(name);
    auto opened = GgufFile::Open(kShared + "/reference/models/" + name + ".gguf");
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    const GgufFile& f = **opened;
    std::vector<const GgufTensor*> order;
    uint64_t params = 0, bytes = 0;
    for (const GgufTensor& t : f.tensors()) {
      EXPECT_EQ(t.offset % f.alignment(), 0u) << t.name;
      EXPECT_EQ(t.file_offset % f.alignment(), 0u) << t.name;
      EXPECT_LE(t.file_offset + t.n_bytes, f.file_size()) << t.name;
      EXPECT_EQ(t.data, f.base() + t.file_offset);
      params += t.n_elements;
      bytes += t.n_bytes;
      order.push_back(&t);
    }
    EXPECT_EQ(f.parameter_count(), params);
    EXPECT_EQ(f.tensor_bytes(), bytes);
    // llama.cpp writes tensors back to back, each padded to the alignment: so the
    // byte sizes we compute for F32/F16/Q8_0/Q4_0/Q4_K/Q6_K match the writer's.
    std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    uint64_t expect = 0;
    for (const GgufTensor* t : order) {
      EXPECT_EQ(t->offset, expect) << t->name;
      expect = (t->offset + t->n_bytes + f.alignment() - 1) / f.alignment() * f.alignment();
    }
    const uint64_t data_end = f.data_offset() + order.back()->offset + order.back()->n_bytes;
    EXPECT_LE(data_end, f.file_size());
    EXPECT_LT(f.file_size() - data_end, f.alignment());  // at most the last tensor's padding
  }
}

TEST(GgufReference, TokenizerArrays) {
  SKIP_WITHOUT_REFERENCE();
  for (const std::string& name : ReferenceModels()) {
    SCOPED_TRACE(name);
    auto opened = GgufFile::Open(kShared + "/reference/models/" + name + ".gguf");
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    const GgufFile& f = **opened;
    const std::string vocab = LoadVectors(name)["model"]["vocab"];
    const size_t n_vocab = vocab == "qwen3" ? 151936 : 32000;
    auto tokens = f.GetArrayString("tokenizer.ggml.tokens");
    ASSERT_TRUE(tokens.ok()) << tokens.status().ToString();
    EXPECT_EQ(tokens->size(), n_vocab);
    auto types = f.GetArrayI32("tokenizer.ggml.token_type");
    ASSERT_TRUE(types.ok()) << types.status().ToString();
    EXPECT_EQ(types->size(), n_vocab);
    if (vocab == "qwen3") {
      EXPECT_EQ(Val(f.GetString("tokenizer.ggml.model")), "gpt2");
      EXPECT_EQ(Val(f.GetString("tokenizer.ggml.pre")), "qwen2");
      EXPECT_EQ(f.GetArrayString("tokenizer.ggml.merges")->size(), 151387u);
      EXPECT_EQ((*tokens)[151643], "<|endoftext|>");
      EXPECT_EQ((*tokens)[151645], "<|im_end|>");
      EXPECT_EQ(Val(f.GetU32("tokenizer.ggml.eos_token_id")), 151645u);
      EXPECT_FALSE(Val(f.GetBool("tokenizer.ggml.add_bos_token")));
    } else {
      EXPECT_EQ(Val(f.GetString("tokenizer.ggml.model")), "llama");
      auto scores = f.GetArrayF32("tokenizer.ggml.scores");
      ASSERT_TRUE(scores.ok()) << scores.status().ToString();
      EXPECT_EQ(scores->size(), n_vocab);
      EXPECT_EQ((*tokens)[0], "<unk>");
      EXPECT_EQ((*tokens)[1], "<s>");
      EXPECT_EQ((*tokens)[2], "</s>");
      EXPECT_EQ((*types)[1], 3);  // CONTROL
      EXPECT_EQ(Val(f.GetU32("tokenizer.ggml.bos_token_id")), 1u);
      EXPECT_TRUE(Val(f.GetBool("tokenizer.ggml.add_bos_token")));
    }
  }
}

TEST(GgufReference, NormWeightsReadThroughTheMappingAreOne) {
  SKIP_WITHOUT_REFERENCE();
  // README: "All norm weights are exactly 1" and they stay F32 in every file.
  for (const std::string& name : ReferenceModels()) {
    SCOPED_TRACE(name);
    auto opened = GgufFile::Open(kShared + "/reference/models/" + name + ".gguf");
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    const GgufTensor* norm = (*opened)->FindTensor("output_norm.weight");
    ASSERT_NE(norm, nullptr);
    ASSERT_EQ(norm->type, GgmlType::kF32);
    ASSERT_EQ(norm->n_bytes, static_cast<uint64_t>(norm->ne[0]) * 4);
    for (int64_t i = 0; i < norm->ne[0]; ++i) {
      float v;
      std::memcpy(&v, norm->data + 4 * i, 4);
      ASSERT_EQ(v, 1.0f) << "element " << i;
    }
  }
}

// ---- `tierkv info` ----

TEST(InfoKvCost, VectorBytesPerCodec) {
  // head_dim 32: f16 64, q8_0 34, q4_0 18, tq4 16 + 2, tq3 12 + 2.
  EXPECT_EQ(*KvVectorBytes("f16", 32), 64.0);
  EXPECT_EQ(*KvVectorBytes("q8_0", 32), 34.0);
  EXPECT_EQ(*KvVectorBytes("q4_0", 32), 18.0);
  EXPECT_EQ(*KvVectorBytes("tq4", 32), 18.0);
  EXPECT_EQ(*KvVectorBytes("tq3", 32), 14.0);
  // head_dim 128: the norm costs less per value.
  EXPECT_EQ(*KvVectorBytes("f16", 128), 256.0);
  EXPECT_EQ(*KvVectorBytes("q8_0", 128), 136.0);
  EXPECT_EQ(*KvVectorBytes("q4_0", 128), 72.0);
  EXPECT_EQ(*KvVectorBytes("tq4", 128), 66.0);
  EXPECT_EQ(*KvVectorBytes("tq3", 128), 50.0);
  EXPECT_FALSE(KvVectorBytes("q5_1", 32).has_value());
  EXPECT_EQ(KvCodecNames(), (std::vector<std::string>{"f16", "q8_0", "q4_0", "tq4", "tq3"}));
}

// A llama-like file with the attention keys given (0 = left out).
std::string AttentionFile(uint32_t n_layer, uint32_t n_embd, uint32_t n_head, uint32_t n_head_kv,
                          uint32_t key_length, uint32_t value_length) {
  TinyGguf g;
  g.KvString("general.architecture", "llama").KvU32("llama.block_count", n_layer);
  g.KvU32("llama.embedding_length", n_embd).KvU32("llama.attention.head_count", n_head);
  if (n_head_kv) g.KvU32("llama.attention.head_count_kv", n_head_kv);
  if (key_length) g.KvU32("llama.attention.key_length", key_length);
  if (value_length) g.KvU32("llama.attention.value_length", value_length);
  g.KvU32("llama.context_length", 4096);
  return g.Build();
}

std::map<std::string, double> CostOf(const std::string& image) {
  auto f = GgufFile::Parse(image.data(), image.size());
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  if (!f.ok()) return {};
  auto shape = ReadKvCacheShape(**f);
  EXPECT_TRUE(shape.ok()) << shape.status().ToString();
  if (!shape.ok()) return {};
  std::map<std::string, double> out;
  for (const KvCodecCost& c : KvBytesPerToken(*shape)) out[c.codec] = c.bytes_per_token;
  return out;
}

TEST(InfoKvCost, BytesPerTokenFromMetadata) {
  // 2 * n_layer * n_head_kv * head_dim * bytes/value: 2 * 32 * 8 * 128 = 65536 values.
  auto c = CostOf(AttentionFile(32, 4096, 32, 8, 128, 128));
  EXPECT_EQ(c["f16"], 65536 * 2.0);
  EXPECT_EQ(c["q8_0"], 65536 * 34.0 / 32);
  EXPECT_EQ(c["q4_0"], 65536 * 18.0 / 32);
  EXPECT_EQ(c["tq4"], 65536 * (4.0 * 128 + 16) / (8 * 128));
  EXPECT_EQ(c["tq3"], 65536 * (3.0 * 128 + 16) / (8 * 128));
  // head_dim from n_embd / n_head when key_length is absent: 4096 / 32 = 128 again.
  EXPECT_EQ(CostOf(AttentionFile(32, 4096, 32, 8, 0, 0)), c);
  // n_head_kv defaults to n_head (no GQA): 4x the values.
  EXPECT_EQ(CostOf(AttentionFile(32, 4096, 32, 0, 0, 0))["f16"], 4 * 65536 * 2.0);
  // K and V of different widths (e.g. 192 / 128) are costed separately.
  auto kv = CostOf(AttentionFile(2, 2048, 16, 16, 192, 128));
  EXPECT_EQ(kv["f16"], 2 * 16 * (192 + 128) * 2.0);
  EXPECT_EQ(kv["tq3"], 2 * 16 * ((3.0 * 192 + 16) / 8 + (3.0 * 128 + 16) / 8));
}

TEST(InfoKvCost, PerLayerKvHeadsAndMissingKeys) {
  TinyGguf g;
  g.KvString("general.architecture", "llama").KvU32("llama.block_count", 3);
  g.KvU32("llama.embedding_length", 256).KvU32("llama.attention.head_count", 8);
  Bytes heads;
  heads.U32(static_cast<uint32_t>(GgufValueType::kU32)).U64(3).U32(2).U32(4).U32(0);
  g.Kv("llama.attention.head_count_kv", GgufValueType::kArray, heads);
  const std::string image = g.Build();
  auto f = MustParse(image);
  ASSERT_NE(f, nullptr);
  auto shape = ReadKvCacheShape(*f);
  ASSERT_TRUE(shape.ok()) << shape.status().ToString();
  EXPECT_EQ(shape->kv_heads_all_layers, 6u);
  EXPECT_EQ(shape->key_length, 32u);
  EXPECT_FALSE(shape->context_length.has_value());
  EXPECT_EQ(KvBytesPerToken(*shape)[0].bytes_per_token, 6 * 2 * 32 * 2.0);

  const std::string no_heads = ValidFile().Build();
  auto nf = MustParse(no_heads);
  ASSERT_NE(nf, nullptr);
  auto missing = ReadKvCacheShape(*nf);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("llama.attention.head_count"), std::string::npos);
}

// Runs `tierkv <args>` in process; stdout and stderr captured.
using testing::CliResult;

CliResult RunCli(std::vector<std::string> args) {
  CLI::App app{"tierkv"};
  app.require_subcommand(1);
  int exit_code = -1;
  AddInfoCommand(app, exit_code);
  return testing::ParseCli(app, exit_code, std::move(args));
}

TEST(InfoCommand, JsonReportForTheReferenceModels) {
  SKIP_WITHOUT_REFERENCE();
  // KV bytes/token = n_layer * n_head_kv * (K + V vector bytes), head_dim 32.
  struct Want {
    const char* model;
    uint64_t f16, q8_0, q4_0, tq4, tq3;
  };
  const Want wants[] = {
      {"ref-llama-q4_k_m", 2 * 4 * 2 * 64, 2 * 4 * 2 * 34, 2 * 4 * 2 * 18, 2 * 4 * 2 * 18, 2 * 4 * 2 * 14},
      {"ref-qwen3moe-q8_0", 2 * 2 * 2 * 64, 2 * 2 * 2 * 34, 2 * 2 * 2 * 18, 2 * 2 * 2 * 18, 2 * 2 * 2 * 14},
  };
  for (const Want& w : wants) {
    SCOPED_TRACE(w.model);
    const std::string path = kShared + "/reference/models/" + w.model + ".gguf";
    ASSERT_TRUE(fs::exists(path)) << path;  // the reference directory is there (SKIP_WITHOUT_REFERENCE)
    CliResult r = RunCli({"info", "--json", path});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(r.err.empty()) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);  // exactly one JSON object
    const nlohmann::json model = LoadVectors(w.model)["model"];
    EXPECT_EQ(j["architecture"], model["arch"]);
    EXPECT_EQ(j["file_size"], model["file_size"]);
    EXPECT_EQ(j["tensor_count"].get<size_t>(), model["tensor_types"].size());
    EXPECT_EQ(j["tensors"].size(), model["tensor_types"].size());
    uint64_t params = 0, bytes = 0;
    for (const auto& t : j["tensors"]) {
      EXPECT_EQ(t["type"], model["tensor_types"][t["name"].get<std::string>()]);
      params += t["n_elements"].get<uint64_t>();
      bytes += t["bytes"].get<uint64_t>();
    }
    EXPECT_EQ(j["parameter_count"].get<uint64_t>(), params);
    EXPECT_EQ(j["tensor_bytes"].get<uint64_t>(), bytes);
    // The type mix: every type's tensors and bytes, largest first, adding up.
    uint64_t mix_bytes = 0, mix_tensors = 0, last = UINT64_MAX;
    for (const auto& m : j["type_mix"]) {
      const uint64_t b = m["bytes"].get<uint64_t>();
      EXPECT_LE(b, last) << "largest first";
      last = b;
      mix_bytes += b;
      mix_tensors += m["tensors"].get<uint64_t>();
      uint64_t of_type = 0;
      for (const auto& t : j["tensors"]) {
        if (t["type"] == m["type"]) of_type += t["bytes"].get<uint64_t>();
      }
      EXPECT_EQ(b, of_type) << m["type"];
    }
    EXPECT_EQ(mix_bytes, bytes);
    EXPECT_EQ(mix_tensors, j["tensors"].size());
    const auto& tokens = j["metadata"]["tokenizer.ggml.tokens"];
    EXPECT_EQ(tokens["element_type"], "string");
    EXPECT_EQ(tokens["values"].size(), 8u);  // summarized
    EXPECT_TRUE(tokens["truncated"].get<bool>());
    const std::string arch = model["arch"];
    EXPECT_EQ(j["metadata"][arch + ".block_count"]["value"], model["n_layer"]);
    EXPECT_EQ(j["metadata"][arch + ".rope.freq_base"]["value"].get<double>(), model["rope_freq_base"].get<double>());
    EXPECT_EQ(j["metadata"][arch + ".attention.layer_norm_rms_epsilon"]["value"].get<double>(),
              model["rms_norm_eps"].get<double>());  // f32 printed as written, not widened
    const auto& per_token = j["kv_cache"]["bytes_per_token"];
    EXPECT_EQ(per_token["f16"], w.f16);
    EXPECT_EQ(per_token["q8_0"], w.q8_0);
    EXPECT_EQ(per_token["q4_0"], w.q4_0);
    EXPECT_EQ(per_token["tq4"], w.tq4);
    EXPECT_EQ(per_token["tq3"], w.tq3);
    EXPECT_EQ(j["kv_cache"]["context_length"], model["context_length"]);
    EXPECT_EQ(j["kv_cache"]["key_length"], model["head_dim"]);
    // The qwen3 vocabulary carries a chatml template; the llama-spm one none.
    EXPECT_EQ(j["chat_format"], model["vocab"] == "qwen3" ? nlohmann::json("chatml") : nlohmann::json(nullptr));
  }
}

TEST(InfoCommand, TextReport) {
  SKIP_WITHOUT_REFERENCE();
  const std::string path = kShared + "/reference/models/ref-llama-q4_k_m.gguf";
  TIERKV_NEED_REFERENCE(path);
  CliResult r = RunCli({"info", "-m", path});  // -m works like the positional argument
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string& out = r.out;
  for (const char* want : {
           "architecture  llama\n",
           "metadata (26 keys)\n",
           "  llama.block_count                       u32            2\n",
           "  llama.rope.freq_base                    f32            10000\n",
           "  llama.attention.layer_norm_rms_epsilon  f32            1e-05\n",
           "string[32000]  [\"<unk>\", \"<s>\", \"</s>\", \"<0x00>\", \"<0x01>\", \"<0x02>\", \"<0x03>\", \"<0x04>\", "
           "... 31992 more]\n",
           "tensors (20)\n",
           "  token_embd.weight         Q6_K  [256, 32000]  6720000     1024\n",
           "  blk.1.ffn_down.weight     Q6_K  [512, 256]     107520  7174912\n",
           "parameters    9.37 M (9372928)\n",
           "tensor bytes  7430912 (7.09 MiB)\n",
           "type mix      Q6_K 6.54 MiB (92.2%), Q4_K 558 KiB (7.7%), F32 5.00 KiB (0.1%)\n",
           "(n_layer 2, n_head_kv 4, head_dim 32)\n",
           "  f16           1024  32.0 MiB\n",
           "  q8_0           544  17.0 MiB\n",
           "  tq3            224  7.00 MiB\n",
       }) {
    EXPECT_NE(out.find(want), std::string::npos) << "missing: " << want << "\nin:\n" << out;
  }
  // --max-items changes the summary.
  CliResult more = RunCli({"info", "--max-items", "2", path});
  ASSERT_EQ(more.exit_code, 0) << more.err;
  EXPECT_NE(more.out.find("[\"<unk>\", \"<s>\", ... 31998 more]"), std::string::npos);
  EXPECT_EQ(out.find("chat format"), std::string::npos) << "the llama-spm vocabulary has no chat template";
  // The qwen3 vocabulary's template is chatml.
  CliResult qwen = RunCli({"info", kShared + "/reference/models/ref-qwen3moe-q8_0.gguf"});
  ASSERT_EQ(qwen.exit_code, 0) << qwen.err;
  EXPECT_NE(qwen.out.find("chat format   chatml (run --chat)\n"), std::string::npos) << qwen.out;
}

TEST(InfoCommand, ErrorsAreOneLineAndNonZero) {
  auto one_error_line = [](const CliResult& r, const std::string& text, int exit_code = 1) {
    EXPECT_EQ(r.exit_code, exit_code);
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_EQ(r.err.rfind("error: info: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(text), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  };
  one_error_line(RunCli({"info", "builtin:tiny"}), "unknown builtin model 'tiny'");
  one_error_line(RunCli({"info", "-m", "builtin:"}), "unknown builtin model ''");
  one_error_line(RunCli({"info", "/nonexistent/model.gguf"}), "/nonexistent/model.gguf: No such file");
  // Usage errors: exit 2, as a bad option.
  one_error_line(RunCli({"info"}), "no model given", 2);
  one_error_line(RunCli({"info", "a.gguf", "-m", "b.gguf"}), "give the model once", 2);

  TinyGguf g = ValidFile();
  g.Tensor("blk.0.attn_q.weight", {32}, kF32, 1ull << 40);
  TempFile bad(g.Build());
  one_error_line(RunCli({"info", bad.path()}),
                 bad.path() + ": gguf: tensor 'blk.0.attn_q.weight' data [");
  TinyGguf v1 = ValidFile();
  v1.version = 1;
  TempFile old(v1.Build());
  one_error_line(RunCli({"info", "--json", old.path()}), "GGUF version 1 is not supported");
}

TEST(InfoCommand, FileWithoutAttentionKeys) {
  TempFile tmp(ValidFile().Build());  // llama with block_count only: no head counts
  CliResult r = RunCli({"info", "--json", tmp.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["kv_cache"].is_null());
  EXPECT_NE(j["kv_cache_error"].get<std::string>().find("llama.attention.head_count"), std::string::npos);
  EXPECT_EQ(j["parameter_count"].get<uint64_t>(), 128u + 768 + 32);
  EXPECT_EQ(j["tensors"][1]["shape"], nlohmann::json::array({256, 3}));
  EXPECT_EQ(j["tensors"][1]["type"], "Q4_K");
  EXPECT_EQ(j["tensors"][1]["bytes"], 432);
  CliResult text = RunCli({"info", tmp.path()});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("kv cache      not available: gguf: key 'llama.attention.head_count' not found"),
            std::string::npos)
      << text.out;
}

TEST(InfoCommand, JsonSurvivesInvalidUtf8) {
  TinyGguf g;
  g.KvString("general.architecture", "llama").KvString("general.name", "bad \xff\xfe utf8");
  g.KvStrings("tokenizer.ggml.tokens", {"ok", "\xc3"});
  TempFile tmp(g.Build());
  CliResult r = RunCli({"info", "--json", tmp.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["metadata"]["general.name"]["value"].get<std::string>().substr(0, 4), "bad ");
  EXPECT_EQ(j["metadata"]["tokenizer.ggml.tokens"]["count"], 2);
}

}  // namespace
}  // namespace tierkv
