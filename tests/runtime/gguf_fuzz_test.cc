// tests/runtime/gguf_fuzz_test.cc
//
// A fixed corpus of malformed GGUF files, generated deterministically from the
// reference models: truncation at every section boundary (and next to it) and at many
// evenly spaced offsets, huge counts and lengths written into each count/length field,
// invalid value and tensor types, dimensions and data offsets past the end, random byte
// flips and random field overwrites (fixed seed), and random garbage after a GGUF
// header. Every case must give an error Status (single-line, "gguf: ...") or a parse
// whose tensors all lie, aligned, inside the buffer; never a crash, a hang or a huge
// allocation (ASan flags those). The model bytes are mutated in one buffer and restored
// after each case, so the corpus costs no copies; it runs in a few seconds under ASan.
//
// Header sizes (docs/gguf.md): every integer metadata value of two small valid models
// built in memory (qwen3moe and llama) set in turn to 0, 1, 2^31-1, 2^32-1, 2^63, -1,
// ... (and to a string), then the config read, the tokenizer, Model::Load and one
// decode step of what loads: each gives a clean one-line error naming the key, or works.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "kvcache/kv_cache.h"
#include "memory/memory_manager.h"
#include "runtime/builtin_model.h"
#include "kernels/ggml_types.h"
#include "runtime/gguf.h"
#include "runtime/gguf_writer.h"
#include "runtime/model.h"
#include "runtime/tokenizer.h"
#include "tests/runtime/model_test_util.h"
#include "tests/runtime/reference_util.h"

namespace tierkv {
namespace {

namespace fs = std::filesystem;

const std::string kModels = std::string(TIERKV_SHARED_DIR) + "/reference/models";

// Where the fields of a (valid) file are, found by a walker independent of the reader.
struct Field {
  enum Kind { kNTensors, kNKv, kKeyLength, kValueType, kStringLength, kArrayType, kArrayCount,
              kNameLength, kNDims, kNe, kTensorType, kTensorOffset };
  Kind kind;
  uint64_t offset;
};

struct Layout {
  std::vector<uint64_t> boundaries;  // starts/ends of every section and field group
  std::vector<Field> fields;
  uint64_t info_end = 0;
  uint64_t data_offset = 0;
  uint64_t data_end = 0;   // end of the last tensor's data: shorter files must fail
};

class Walker {
 public:
  Walker(const std::vector<uint8_t>& b) : b_(b) {}

  Layout Walk() {
    Layout l;
    layout_ = &l;
    Mark();
    pos_ += 8;  // magic, version
    Mark();
    Add(Field::kNTensors);
    const uint64_t n_tensors = U64();
    Add(Field::kNKv);
    const uint64_t n_kv = U64();
    Mark();
    uint32_t alignment = 32;
    for (uint64_t i = 0; i < n_kv; ++i) {
      Mark();
      Add(Field::kKeyLength);
      const std::string_view key = Str();
      Mark();
      Add(Field::kValueType);
      const uint32_t type = U32();
      Mark();
      if (key == "general.alignment") {
        std::memcpy(&alignment, b_.data() + pos_, 4);
      }
      Value(type);
      Mark();
    }
    std::vector<std::pair<uint64_t, uint64_t>> spans;  // offset, bytes
    for (uint64_t i = 0; i < n_tensors; ++i) {
      Mark();
      Add(Field::kNameLength);
      Str();
      Add(Field::kNDims);
      const uint32_t n_dims = U32();
      uint64_t ne[4] = {1, 1, 1, 1};
      for (uint32_t d = 0; d < n_dims; ++d) {
        Add(Field::kNe);
        ne[d] = U64();
      }
      Add(Field::kTensorType);
      const uint32_t type = U32();
      Add(Field::kTensorOffset);
      const uint64_t offset = U64();
      const GgmlTypeTraits& t = *FindGgmlType(type);
      spans.emplace_back(offset, ne[0] / t.block_size * t.block_bytes * ne[1] * ne[2] * ne[3]);
    }
    Mark();
    l.info_end = pos_;
    l.data_offset = (pos_ + alignment - 1) / alignment * alignment;
    l.boundaries.push_back(l.data_offset);
    for (auto [offset, bytes] : spans) {
      l.boundaries.push_back(l.data_offset + offset);
      l.boundaries.push_back(l.data_offset + offset + bytes);
      l.data_end = std::max(l.data_end, l.data_offset + offset + bytes);
    }
    std::sort(l.boundaries.begin(), l.boundaries.end());
    l.boundaries.erase(std::unique(l.boundaries.begin(), l.boundaries.end()), l.boundaries.end());
    return l;
  }

 private:
  void Mark() { layout_->boundaries.push_back(pos_); }
  void Add(Field::Kind k) { layout_->fields.push_back({k, pos_}); }
  uint32_t U32() {
    uint32_t v;
    std::memcpy(&v, b_.data() + pos_, 4);
    pos_ += 4;
    return v;
  }
  uint64_t U64() {
    uint64_t v;
    std::memcpy(&v, b_.data() + pos_, 8);
    pos_ += 8;
    return v;
  }
  std::string_view Str() {
    const uint64_t n = U64();
    std::string_view s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  void Value(uint32_t type) {
    static const uint64_t kSizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type == 8) {
      Add(Field::kStringLength);
      Str();
    } else if (type == 9) {
      Add(Field::kArrayType);
      const uint32_t et = U32();
      Add(Field::kArrayCount);
      const uint64_t n = U64();
      Mark();
      if (et == 8) {
        for (uint64_t i = 0; i < n; ++i) {
          const bool edge = i < 3 || i + 3 >= n;  // the first and last few elements only
          if (edge) {
            Mark();
            Add(Field::kStringLength);
          }
          Str();
        }
      } else {
        pos_ += n * kSizes[et];
      }
    } else {
      pos_ += kSizes[type];
    }
  }

  const std::vector<uint8_t>& b_;
  Layout* layout_ = nullptr;
  uint64_t pos_ = 0;
};

std::vector<uint8_t> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> bytes(fs::file_size(path));
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  EXPECT_TRUE(in.good()) << path;
  return bytes;
}

struct Tally {
  int cases = 0, errors = 0, parsed = 0;
};

// Parses buf[0, size) and checks the outcome is an error or a self-consistent file.
void CheckOne(const std::vector<uint8_t>& buf, size_t size, bool must_fail, const std::string& what,
              Tally* tally) {
  ++tally->cases;
  auto r = GgufFile::Parse(buf.data(), size);
  if (!r.ok()) {
    ++tally->errors;
    const std::string m = r.status().message();
    EXPECT_EQ(m.rfind("gguf: ", 0), 0u) << what << ": " << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << what << ": " << m;
    EXPECT_LT(m.size(), 1024u) << what;
    return;
  }
  ++tally->parsed;
  EXPECT_FALSE(must_fail) << what << ": parsed, but should have failed";
  const GgufFile& f = **r;
  for (const GgufTensor& t : f.tensors()) {
    const GgmlTypeTraits* tr = FindGgmlType(t.type);
    ASSERT_TRUE(tr != nullptr && tr->known) << what;
    EXPECT_LE(t.n_dims, 4u) << what;
    EXPECT_EQ(t.offset % f.alignment(), 0u) << what;
    EXPECT_EQ(t.file_offset, f.data_offset() + t.offset) << what;
    EXPECT_LE(t.file_offset, size) << what;
    EXPECT_LE(t.n_bytes, size - t.file_offset) << what;
    EXPECT_EQ(t.data, buf.data() + t.file_offset) << what;
    EXPECT_EQ(t.n_bytes, static_cast<uint64_t>(t.ne[0]) / tr->block_size * tr->block_bytes * t.ne[1] * t.ne[2] *
                             t.ne[3])
        << what;
  }
  // Reading every value back must stay inside the buffer (ASan checks the reads).
  GgufFormatOptions fmt;
  fmt.max_array_items = 4;
  fmt.max_string_bytes = 64;
  for (const GgufKv& kv : f.metadata()) {
    (void)FormatGgufValue(kv.value, fmt);
    if (kv.value.is_array() && kv.value.size() > 0 && kv.value.element_type() != GgufValueType::kString) {
      (void)kv.value.ElementAs<double>(kv.value.size() - 1);
    }
  }
}

// Overwrites buf at `offset` with `bytes` bytes of `value`, runs the check, restores.
void WithPatch(std::vector<uint8_t>& buf, uint64_t offset, uint64_t value, size_t bytes, bool must_fail,
               const std::string& what, Tally* tally) {
  if (offset + bytes > buf.size()) return;
  uint8_t saved[8];
  std::memcpy(saved, buf.data() + offset, bytes);
  std::memcpy(buf.data() + offset, &value, bytes);
  CheckOne(buf, buf.size(), must_fail, what, tally);
  std::memcpy(buf.data() + offset, saved, bytes);
}

// stride > 1 keeps every stride-th boundary and field: for files whose parse is dear.
void RunCorpus(const std::string& model, int flips, int evenly_spaced, size_t stride, int min_cases) {
  const std::string path = kModels + "/" + model + ".gguf";
  TIERKV_NEED_REFERENCE(path);
  std::vector<uint8_t> buf = ReadFile(path);
  const std::vector<uint8_t> original = buf;
  const Layout l = Walker(buf).Walk();
  ASSERT_GT(l.fields.size(), 10u);
  ASSERT_LE(l.data_end, buf.size());
  ASSERT_GT(l.data_end, l.info_end);
  Tally tally;
  CheckOne(buf, buf.size(), false, "unmodified", &tally);
  ASSERT_EQ(tally.parsed, 1) << "the reference model itself must parse";

  // 1. Truncation at every boundary and one byte either side.
  for (size_t i = 0; i < l.boundaries.size(); i += stride) {
    const uint64_t b = l.boundaries[i];
    for (int64_t d : {-1, 0, 1}) {
      const int64_t n = static_cast<int64_t>(b) + d;
      if (n < 0 || static_cast<uint64_t>(n) >= l.data_end) continue;
      CheckOne(buf, n, true, "truncated at " + std::to_string(n), &tally);
    }
  }
  // 2. Truncation at evenly spaced offsets: through the metadata, then the data.
  for (int i = 0; i < evenly_spaced; ++i) {
    const uint64_t n = l.info_end * i / evenly_spaced;
    CheckOne(buf, n, true, "truncated at " + std::to_string(n), &tally);
    const uint64_t m = l.info_end + (l.data_end - l.info_end) * i / evenly_spaced;
    CheckOne(buf, m, true, "truncated at " + std::to_string(m), &tally);
  }

  // 3. Every count, length, type and offset field set to values that must be refused.
  const uint64_t size = buf.size();
  for (size_t i = 0; i < l.fields.size(); i += stride) {
    const Field& f = l.fields[i];
    const std::string at = " at " + std::to_string(f.offset);
    const uint64_t left_after = size - (f.offset + 8);  // bytes after a u64 field
    switch (f.kind) {
      case Field::kNTensors:
      case Field::kNKv:
      case Field::kKeyLength:
      case Field::kStringLength:
      case Field::kNameLength:
      case Field::kArrayCount:
        // Each element, entry or byte takes at least one byte: left_after + 1 cannot fit.
        for (uint64_t v : std::initializer_list<uint64_t>{UINT64_MAX, 1ull << 63, size, left_after + 1}) {
          WithPatch(buf, f.offset, v, 8, true, "count/length " + std::to_string(v) + at, &tally);
        }
        break;
      case Field::kValueType:
      case Field::kArrayType:
        for (uint64_t v : {13ull, 99ull, 0xFFFFFFFFull}) {
          WithPatch(buf, f.offset, v, 4, true, "value type " + std::to_string(v) + at, &tally);
        }
        if (f.kind == Field::kArrayType) WithPatch(buf, f.offset, 9, 4, true, "nested array" + at, &tally);
        break;
      case Field::kNDims:
        for (uint64_t v : {5ull, 0xFFFFFFFFull}) {
          WithPatch(buf, f.offset, v, 4, true, "n_dims " + std::to_string(v) + at, &tally);
        }
        break;
      case Field::kNe:
        for (uint64_t v : std::initializer_list<uint64_t>{UINT64_MAX, 1ull << 62, size * 64}) {
          WithPatch(buf, f.offset, v, 8, true, "ne " + std::to_string(v) + at, &tally);
        }
        break;
      case Field::kTensorType:
        for (uint64_t v : {4ull, 31ull, 40ull, 0xFFFFFFFFull}) {
          WithPatch(buf, f.offset, v, 4, true, "tensor type " + std::to_string(v) + at, &tally);
        }
        break;
      case Field::kTensorOffset: {
        uint64_t cur;
        std::memcpy(&cur, buf.data() + f.offset, 8);
        for (uint64_t v : std::initializer_list<uint64_t>{size, UINT64_MAX - 31, cur + 1, cur + 16}) {
          WithPatch(buf, f.offset, v, 8, true, "tensor offset " + std::to_string(v) + at, &tally);
        }
        break;
      }
    }
  }

  // 4. Random flips and field overwrites with a fixed seed: any outcome but a crash.
  std::mt19937_64 rng(0x5eed'6775'6600ull);
  for (int i = 0; i < flips; ++i) {
    const int n = 1 + static_cast<int>(rng() % 4);
    std::vector<std::pair<uint64_t, uint8_t>> saved;
    for (int k = 0; k < n; ++k) {
      uint64_t pos;
      if (rng() % 2 == 0) {
        const Field& f = l.fields[rng() % l.fields.size()];
        pos = f.offset + rng() % 8;  // a byte of (or just after) a structural field
      } else {
        pos = rng() % l.info_end;  // anywhere in the metadata and tensor infos
      }
      saved.emplace_back(pos, buf[pos]);
      buf[pos] = (rng() % 3 == 0) ? 0xFF : static_cast<uint8_t>(buf[pos] ^ (1u << (rng() % 8)));
    }
    CheckOne(buf, buf.size(), false, "flip case " + std::to_string(i), &tally);
    for (auto it = saved.rbegin(); it != saved.rend(); ++it) buf[it->first] = it->second;
  }
  ASSERT_EQ(buf, original) << "a mutation was not restored";

  // 5. Random garbage after a valid header start, small and large claimed counts.
  for (int i = 0; i < 100; ++i) {
    std::vector<uint8_t> g(24 + rng() % 2048);
    for (uint8_t& byte : g) byte = static_cast<uint8_t>(rng());
    std::memcpy(g.data(), "GGUF", 4);
    const uint32_t version = 2 + (i % 2);
    std::memcpy(g.data() + 4, &version, 4);
    const uint64_t nt = (i % 3 == 0) ? rng() : rng() % 4, nkv = (i % 5 == 0) ? rng() : rng() % 4;
    std::memcpy(g.data() + 8, &nt, 8);
    std::memcpy(g.data() + 16, &nkv, 8);
    CheckOne(g, g.size(), false, "garbage case " + std::to_string(i), &tally);
  }

  EXPECT_GE(tally.cases, min_cases);
  ::testing::Test::RecordProperty("cases", tally.cases);
  std::printf("[ corpus   ] %s: %d cases, %d errors, %d parsed\n", model.c_str(), tally.cases, tally.errors,
              tally.parsed);
}

TEST(GgufFuzzCorpus, LlamaQ4KM) { RunCorpus("ref-llama-q4_k_m", 400, 150, 1, 1500); }

// The qwen3 vocabulary (152k tokens, 151k merges) makes each parse ~10x dearer: a
// sample of the same kinds of cases.
TEST(GgufFuzzCorpus, Qwen3MoeQ8_0) { RunCorpus("ref-qwen3moe-q8_0", 30, 10, 16, 200); }

// A small qwen3moe (with feed_forward_length, as real files have) and a small llama.
std::vector<std::unique_ptr<GgufFile>> SmallModels() {
  std::vector<std::unique_ptr<GgufFile>> out;
  out.push_back(std::move(GgufFile::ParseOwned(testing::SmallMoeWriter().Finish(), "moe.gguf")).value());
  out.push_back(std::move(GgufFile::ParseOwned(testing::SmallLlamaWriter().Finish(), "llama.gguf")).value());
  return out;
}

bool IsIntegerType(GgufValueType t) {
  return t != GgufValueType::kF32 && t != GgufValueType::kF64 && t != GgufValueType::kBool &&
         t != GgufValueType::kString && t != GgufValueType::kArray;
}

// A one-line error that names `key` (when not empty) and the file.
void ExpectCleanError(const Status& st, const std::string& key, const std::string& what) {
  const std::string m = st.message();
  EXPECT_EQ(m.find('\n'), std::string::npos) << what << ": " << m;
  EXPECT_LT(m.size(), 1024u) << what;
  if (!key.empty()) {
    EXPECT_NE(m.find(key), std::string::npos) << what << ": " << m;
  }
}

TEST(GgufFuzzCorpus, HeaderSizesOfSmallModels) {
  constexpr uint64_t kUnsigned[] = {0, 1, 2, 3, 255, 65535, 2147483647, 2147483648, 4294967295, 4294967296,
                                    9223372036854775807ull, 9223372036854775808ull, UINT64_MAX};
  constexpr int64_t kSigned[] = {-1, INT32_MIN, INT64_MIN};
  Tally tally;
  int loaded = 0;
  for (const auto& base : SmallModels()) {
    const std::string prefix = std::string(base->architecture()) + ".";
    for (const GgufKv& kv : base->metadata()) {
      if (!IsIntegerType(kv.value.type())) continue;
      const std::string key(kv.key);
      // The keys the model config reads name themselves; others (general.alignment) may
      // fail elsewhere.
      const bool config_key = key.rfind(prefix, 0) == 0;
      std::vector<std::pair<std::string, std::function<void(GgufWriter&)>>> changes;
      for (uint64_t v : kUnsigned) {
        changes.emplace_back(std::to_string(v), [&key, v](GgufWriter& w) {
          if (v <= UINT32_MAX) {
            w.U32(key, static_cast<uint32_t>(v));
          } else {
            w.U64(key, v);
          }
        });
      }
      for (int64_t v : kSigned) {
        changes.emplace_back(std::to_string(v), [&key, v](GgufWriter& w) {
          if (v >= INT32_MIN) {
            w.I32(key, static_cast<int32_t>(v));
          } else {
            w.I64(key, v);
          }
        });
      }
      changes.emplace_back("\"2\"", [&key](GgufWriter& w) { w.String(key, "2"); });
      for (const auto& [value, change] : changes) {
        const std::string what = std::string(base->path()) + ": " + key + " = " + value;
        ++tally.cases;
        GgufWriter w = GgufWriter::CopyOf(*base);
        change(w);
        auto file = GgufFile::ParseOwned(w.Finish(), "crafted.gguf");
        if (!file.ok()) {
          ++tally.errors;
          ExpectCleanError(file.status(), "", what);
          continue;
        }
        const std::shared_ptr<const GgufFile> f = std::move(file).value();
        if (auto tok = Tokenizer::FromGguf(*f); !tok.ok()) ExpectCleanError(tok.status(), "", what);
        auto cfg = ReadModelConfig(*f);
        ModelOptions mo;
        mo.threads = 1;
        auto model = Model::Load(f, mo);
        if (!cfg.ok()) {
          ++tally.errors;
          ExpectCleanError(cfg.status(), config_key ? "crafted.gguf: " : "", what);
          ExpectCleanError(cfg.status(), config_key ? key : "", what);
          ASSERT_FALSE(model.ok()) << what;
          EXPECT_EQ(model.status().message(), cfg.status().message()) << what;
          continue;
        }
        if (!model.ok()) {
          ++tally.errors;
          ExpectCleanError(model.status(), "crafted.gguf: ", what);
          continue;
        }
        // What loads, runs: one decode step.
        ++tally.parsed;
        ++loaded;
        MemoryOptions mem;
        mem.host_bytes = 8 * kMiB;
        mem.frame_bytes = 64 * kKiB;
        mem.warmup = false;
        mem.mlock = MlockMode::kOff;
        auto mm = std::move(MemoryManager::Create(mem)).value();
        auto cache = KvCache::Create(mm.get(), (*model)->KvGeometryFor(KvCodec::kF16));
        ASSERT_TRUE(cache.ok()) << what << ": " << cache.status().ToString();
        const SeqId seq = (*cache)->NewSequence();
        std::vector<float> logits(static_cast<size_t>((*model)->config().n_vocab));
        const Status st = (*model)->Forward(**cache, seq, 1, 0, logits);
        EXPECT_TRUE(st.ok()) << what << ": " << st.ToString();
      }
    }
  }
  EXPECT_GE(tally.cases, 300);
  EXPECT_GT(loaded, 10);           // values that change nothing the model needs still load
  EXPECT_GT(tally.errors, 200);    // and most of the others are refused
  std::printf("[ corpus   ] header sizes: %d cases, %d errors, %d loaded\n", tally.cases, tally.errors, loaded);
}

}  // namespace
}  // namespace tierkv
