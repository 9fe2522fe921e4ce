// runtime/gguf_writer.cc
#include "runtime/gguf_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>

#include "runtime/gguf.h"

namespace tierkv {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint32_t kVersion = 3;
constexpr uint64_t kAlignment = 32;

// (resize + memcpy: GCC 12 warns of a false overflow in insert() of a small array.)
template <typename T>
void Put(std::vector<uint8_t>* out, T v) {
  const size_t at = out->size();
  out->resize(at + sizeof(T));
  std::memcpy(out->data() + at, &v, sizeof(T));
}

void PutString(std::vector<uint8_t>* out, std::string_view s) {
  Put<uint64_t>(out, s.size());
  out->insert(out->end(), s.begin(), s.end());
}

uint64_t AlignUp(uint64_t x) { return (x + kAlignment - 1) / kAlignment * kAlignment; }

// One scalar of `type` (a value's own, or an array's element type), its bits taken from
// the conversion that holds every value of that type exactly.
template <typename Read>
void PutScalar(std::vector<uint8_t>* out, GgufValueType type, Read read) {
  switch (type) {
    case GgufValueType::kU8: Put(out, static_cast<uint8_t>(read.template operator()<uint64_t>())); break;
    case GgufValueType::kU16: Put(out, static_cast<uint16_t>(read.template operator()<uint64_t>())); break;
    case GgufValueType::kU32: Put(out, static_cast<uint32_t>(read.template operator()<uint64_t>())); break;
    case GgufValueType::kU64: Put(out, read.template operator()<uint64_t>()); break;
    case GgufValueType::kI8: Put(out, static_cast<int8_t>(read.template operator()<int64_t>())); break;
    case GgufValueType::kI16: Put(out, static_cast<int16_t>(read.template operator()<int64_t>())); break;
    case GgufValueType::kI32: Put(out, static_cast<int32_t>(read.template operator()<int64_t>())); break;
    case GgufValueType::kI64: Put(out, read.template operator()<int64_t>()); break;
    case GgufValueType::kF32: Put(out, read.template operator()<float>()); break;
    case GgufValueType::kF64: Put(out, read.template operator()<double>()); break;
    case GgufValueType::kBool: Put<uint8_t>(out, read.template operator()<bool>() ? 1 : 0); break;
    case GgufValueType::kString:
    case GgufValueType::kArray: break;  // not scalars
  }
}

}  // namespace

GgufWriter GgufWriter::CopyOf(const GgufFile& file) {
  GgufWriter w;
  for (const GgufKv& kv : file.metadata()) w.Value(kv.key, kv.value);
  for (const GgufTensor& t : file.tensors()) {
    w.Tensor(t.name, t.type, std::vector<uint64_t>(t.ne.begin(), t.ne.begin() + t.n_dims),
             std::vector<uint8_t>(t.data, t.data + t.n_bytes));
  }
  return w;
}

std::vector<uint8_t>& GgufWriter::Key(std::string_view key, uint32_t type) {
  auto it = std::find_if(kvs_.begin(), kvs_.end(), [&](const KvEntry& e) { return e.key == key; });
  if (it == kvs_.end()) it = kvs_.insert(kvs_.end(), KvEntry{std::string(key), {}});
  it->value.clear();
  Put(&it->value, type);
  return it->value;
}

GgufWriter& GgufWriter::U32(std::string_view key, uint32_t v) {
  Put(&Key(key, static_cast<uint32_t>(GgufValueType::kU32)), v);
  return *this;
}

GgufWriter& GgufWriter::I32(std::string_view key, int32_t v) {
  Put(&Key(key, static_cast<uint32_t>(GgufValueType::kI32)), v);
  return *this;
}

GgufWriter& GgufWriter::U64(std::string_view key, uint64_t v) {
  Put(&Key(key, static_cast<uint32_t>(GgufValueType::kU64)), v);
  return *this;
}

GgufWriter& GgufWriter::I64(std::string_view key, int64_t v) {
  Put(&Key(key, static_cast<uint32_t>(GgufValueType::kI64)), v);
  return *this;
}

GgufWriter& GgufWriter::F32(std::string_view key, float v) {
  Put(&Key(key, static_cast<uint32_t>(GgufValueType::kF32)), v);
  return *this;
}

GgufWriter& GgufWriter::Bool(std::string_view key, bool v) {
  Put<uint8_t>(&Key(key, static_cast<uint32_t>(GgufValueType::kBool)), v ? 1 : 0);
  return *this;
}

GgufWriter& GgufWriter::String(std::string_view key, std::string_view v) {
  PutString(&Key(key, static_cast<uint32_t>(GgufValueType::kString)), v);
  return *this;
}

GgufWriter& GgufWriter::Strings(std::string_view key, std::span<const std::string_view> v) {
  std::vector<uint8_t>& out = Key(key, static_cast<uint32_t>(GgufValueType::kArray));
  Put(&out, static_cast<uint32_t>(GgufValueType::kString));
  Put<uint64_t>(&out, v.size());
  for (std::string_view s : v) PutString(&out, s);
  return *this;
}

GgufWriter& GgufWriter::Value(std::string_view key, const GgufValue& v) {
  std::vector<uint8_t>& out = Key(key, static_cast<uint32_t>(v.type()));
  if (v.type() == GgufValueType::kString) {
    PutString(&out, v.AsString().value());
  } else if (!v.is_array()) {
    PutScalar(&out, v.type(), [&]<typename T>() { return v.As<T>().value(); });
  } else {
    Put(&out, static_cast<uint32_t>(v.element_type()));
    Put<uint64_t>(&out, v.size());
    if (v.element_type() == GgufValueType::kString) {
      const std::span<const std::string_view> strings = v.AsStringArray().value();  // views into the file
      for (std::string_view s : strings) PutString(&out, s);
    } else {
      for (uint64_t i = 0; i < v.size(); ++i) {
        PutScalar(&out, v.element_type(), [&]<typename T>() { return v.ElementAs<T>(i).value(); });
      }
    }
  }
  return *this;
}

GgufWriter& GgufWriter::Remove(std::string_view key) {
  std::erase_if(kvs_, [&](const KvEntry& e) { return e.key == key; });
  return *this;
}

GgufWriter& GgufWriter::Tensor(std::string_view name, GgmlType type, std::vector<uint64_t> ne,
                               std::vector<uint8_t> data) {
  const uint64_t bytes = data.size();
  tensors_.push_back({std::string(name), type, std::move(ne), std::move(data), false, bytes});
  return *this;
}

GgufWriter& GgufWriter::StreamedTensor(std::string_view name, GgmlType type, std::vector<uint64_t> ne) {
  const GgmlTypeTraits* traits = FindGgmlType(type);
  assert(traits != nullptr && !ne.empty() && ne[0] % traits->block_size == 0);
  uint64_t bytes = GgmlRowBytes(*traits, ne[0]);
  for (size_t d = 1; d < ne.size(); ++d) bytes *= ne[d];
  tensors_.push_back({std::string(name), type, std::move(ne), {}, true, bytes});
  return *this;
}

std::vector<uint8_t> GgufWriter::Head() const {
  std::vector<uint8_t> out;
  Put(&out, kMagic);
  Put(&out, kVersion);
  Put<uint64_t>(&out, tensors_.size());
  Put<uint64_t>(&out, kvs_.size());
  for (const KvEntry& kv : kvs_) {
    PutString(&out, kv.key);
    out.insert(out.end(), kv.value.begin(), kv.value.end());
  }
  uint64_t offset = 0;
  for (const TensorEntry& t : tensors_) {
    PutString(&out, t.name);
    Put<uint32_t>(&out, static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) Put(&out, d);
    Put<uint32_t>(&out, static_cast<uint32_t>(t.type));
    Put(&out, offset);
    offset = AlignUp(offset + t.bytes);
  }
  out.resize(AlignUp(out.size()), 0);
  return out;
}

uint64_t GgufWriter::ImageBytes() const {
  uint64_t data = 0;
  for (const TensorEntry& t : tensors_) data = AlignUp(data + t.bytes);
  return Head().size() + data;
}

Status GgufWriter::WriteFile(const std::string& path, const Fill& fill, const Progress& progress) const {
  const std::vector<uint8_t> head = Head();
  const uint64_t total = ImageBytes();
  std::string tmp = path + ".tierkv-tmp.XXXXXX";
  const int fd = mkostemp(tmp.data(), O_CLOEXEC);  // O_EXCL, a random name
  if (fd < 0) return Status::FromErrno(errno, "creating a file beside " + path);
  const auto fail = [&](Status st) {
    close(fd);
    unlink(tmp.c_str());
    return st.Annotate("writing " + path);
  };
  // mkostemp makes 0600; a model file is for reading (0644, as a default umask leaves).
  (void)!fchmod(fd, 0644);
  if (const int err = posix_fallocate(fd, 0, static_cast<off_t>(total)); err != 0 && err != EOPNOTSUPP) {
    return fail(Status::FromErrno(err, "allocating " + std::to_string(total) + " bytes"));
  }
  auto write_at = [&](const uint8_t* p, uint64_t n, uint64_t at) -> Status {
    while (n > 0) {
      const ssize_t w = pwrite(fd, p, n, static_cast<off_t>(at));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return Status::FromErrno(w < 0 ? errno : EIO, "pwrite");
      p += w;
      n -= static_cast<uint64_t>(w);
      at += static_cast<uint64_t>(w);
    }
    return Status::Ok();
  };
  if (Status st = write_at(head.data(), head.size(), 0); !st.ok()) return fail(st);
  constexpr uint64_t kChunk = 16ull << 20;
  std::vector<uint8_t> buf;
  uint64_t at = head.size(), streamed = 0;
  for (const TensorEntry& t : tensors_) {
    if (!t.streamed) {
      if (Status st = write_at(t.data.data(), t.data.size(), at); !st.ok()) return fail(st);
    } else {
      const uint64_t unit = FindGgmlType(t.type)->block_bytes;
      const uint64_t chunk = std::max<uint64_t>(unit, kChunk / unit * unit);
      for (uint64_t off = 0; off < t.bytes; off += chunk) {
        const uint64_t n = std::min(chunk, t.bytes - off);
        buf.resize(n);
        if (Status st = fill(streamed, off, std::span<uint8_t>(buf.data(), n)); !st.ok()) return fail(st);
        if (Status st = write_at(buf.data(), n, at + off); !st.ok()) return fail(st);
        if (progress) progress(at + off + n, total);
      }
      ++streamed;
    }
    at = head.size() + (AlignUp(at - head.size() + t.bytes));
  }
  if (fdatasync(fd) != 0) return fail(Status::FromErrno(errno, "fsync"));
  if (close(fd) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return Status::FromErrno(err, "closing").Annotate("writing " + path);
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return Status::FromErrno(err, "renaming " + tmp + " to " + path);
  }
  if (progress) progress(total, total);
  return Status::Ok();
}

std::vector<uint8_t> GgufWriter::Finish() const {
  std::vector<uint8_t> out = Head();
  const size_t data_start = out.size();
  uint64_t at = 0;
  for (const TensorEntry& t : tensors_) {
    assert(!t.streamed);
    out.resize(data_start + at, 0);
    out.insert(out.end(), t.data.begin(), t.data.end());
    at = AlignUp(at + t.data.size());
  }
  out.resize(data_start + at, 0);
  return out;
}

}  // namespace tierkv
