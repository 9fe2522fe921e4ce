// runtime/gguf_writer.cc
#include "runtime/gguf_writer.h"

#include <cstring>

namespace tierkv {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint32_t kVersion = 3;
constexpr uint64_t kAlignment = 32;
constexpr uint32_t kTypeU32 = 4, kTypeF32 = 6, kTypeBool = 7, kTypeString = 8;

template <typename T>
void Put(std::vector<uint8_t>* out, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out->insert(out->end(), b, b + sizeof(T));
}

void PutString(std::vector<uint8_t>* out, std::string_view s) {
  Put<uint64_t>(out, s.size());
  out->insert(out->end(), s.begin(), s.end());
}

uint64_t AlignUp(uint64_t x) { return (x + kAlignment - 1) / kAlignment * kAlignment; }

}  // namespace

GgufWriter& GgufWriter::Key(std::string_view key, uint32_t type) {
  PutString(&kv_, key);
  Put<uint32_t>(&kv_, type);
  ++n_kv_;
  return *this;
}

GgufWriter& GgufWriter::U32(std::string_view key, uint32_t v) {
  Key(key, kTypeU32);
  Put(&kv_, v);
  return *this;
}

GgufWriter& GgufWriter::F32(std::string_view key, float v) {
  Key(key, kTypeF32);
  Put(&kv_, v);
  return *this;
}

GgufWriter& GgufWriter::Bool(std::string_view key, bool v) {
  Key(key, kTypeBool);
  Put<uint8_t>(&kv_, v ? 1 : 0);
  return *this;
}

GgufWriter& GgufWriter::String(std::string_view key, std::string_view v) {
  Key(key, kTypeString);
  PutString(&kv_, v);
  return *this;
}

GgufWriter& GgufWriter::Tensor(std::string_view name, GgmlType type, std::vector<uint64_t> ne,
                               std::vector<uint8_t> data) {
  tensors_.push_back({std::string(name), type, std::move(ne), std::move(data)});
  return *this;
}

std::vector<uint8_t> GgufWriter::Finish() const {
  std::vector<uint8_t> out;
  Put(&out, kMagic);
  Put(&out, kVersion);
  Put<uint64_t>(&out, tensors_.size());
  Put<uint64_t>(&out, n_kv_);
  out.insert(out.end(), kv_.begin(), kv_.end());
  uint64_t offset = 0;
  for (const TensorEntry& t : tensors_) {
    PutString(&out, t.name);
    Put<uint32_t>(&out, static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) Put(&out, d);
    Put<uint32_t>(&out, static_cast<uint32_t>(t.type));
    Put(&out, offset);
    offset = AlignUp(offset + t.data.size());
  }
  out.resize(AlignUp(out.size()), 0);
  const size_t data_start = out.size();
  out.resize(data_start + offset, 0);
  uint64_t at = 0;
  for (const TensorEntry& t : tensors_) {
    std::memcpy(out.data() + data_start + at, t.data.data(), t.data.size());
    at = AlignUp(at + t.data.size());
  }
  return out;
}

}  // namespace tierkv
