// runtime/gguf.cc
//
// File layout (little endian; docs/gguf.md has the full description):
//   header   : u32 magic "GGUF", u32 version, u64 n_tensors, u64 n_kv
//   n_kv x   : string key, u32 value type, value
//   n_tensors: string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset
//   padding to alignment, then the tensor data section
// where a string is a u64 byte length followed by the bytes (no terminator), and an
// array value is u32 element type, u64 count, then the elements.
#include "runtime/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <type_traits>

#include "runtime/unicode.h"

namespace tierkv {

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader decodes little-endian fields in place");

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint32_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;
// Smallest encodings, used to bound counts by the bytes left before allocating.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;               // empty key, type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;   // empty name, n_dims 0, type, offset
constexpr uint32_t kMaxValueType = static_cast<uint32_t>(GgufValueType::kF64);

// Appends the pieces of a message: strings as they are, integers in decimal.
template <typename T>
void Append(std::string* out, const T& v) {
  if constexpr (std::is_integral_v<T>) {
    out->append(std::to_string(v));
  } else {
    out->append(std::string_view(v));
  }
}
template <typename... Args>
std::string Cat(const Args&... args) {
  std::string out;
  (Append(&out, args), ...);
  return out;
}

// 'name', escaped and cut for a one-line message. (Built by appending: GCC 12 warns
// falsely about "'" + std::string&&.)
std::string Quoted(std::string_view s) {
  std::string out(1, '\'');
  out += EscapeGgufString(s, 96, '\'');
  out += '\'';
  return out;
}

size_t ScalarBytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kU16:
    case GgufValueType::kI16:
      return 2;
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kF32:
      return 4;
    case GgufValueType::kU64:
    case GgufValueType::kI64:
    case GgufValueType::kF64:
      return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      return 0;
  }
  return 0;
}

// A decoded numeric/bool scalar.
struct Number {
  enum Kind { kUnsigned, kSigned, kFloat, kBool } kind = kUnsigned;
  uint64_t u = 0;
  int64_t i = 0;
  double d = 0;
};

Number Decode(GgufValueType type, uint64_t bits) {
  Number n;
  switch (type) {
    case GgufValueType::kU8:
    case GgufValueType::kU16:
    case GgufValueType::kU32:
    case GgufValueType::kU64:
      n.kind = Number::kUnsigned;
      n.u = bits;
      break;
    case GgufValueType::kI8:
      n.kind = Number::kSigned;
      n.i = static_cast<int8_t>(bits);
      break;
    case GgufValueType::kI16:
      n.kind = Number::kSigned;
      n.i = static_cast<int16_t>(bits);
      break;
    case GgufValueType::kI32:
      n.kind = Number::kSigned;
      n.i = static_cast<int32_t>(bits);
      break;
    case GgufValueType::kI64:
      n.kind = Number::kSigned;
      n.i = static_cast<int64_t>(bits);
      break;
    case GgufValueType::kF32: {
      n.kind = Number::kFloat;
      n.d = std::bit_cast<float>(static_cast<uint32_t>(bits));
      break;
    }
    case GgufValueType::kF64:
      n.kind = Number::kFloat;
      n.d = std::bit_cast<double>(bits);
      break;
    case GgufValueType::kBool:
      n.kind = Number::kBool;
      n.u = bits;
      break;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      break;
  }
  return n;
}

uint64_t LoadBits(const uint8_t* p, size_t bytes) {
  uint64_t bits = 0;
  std::memcpy(&bits, p, bytes);  // little-endian host: zero-extends
  return bits;
}

template <typename T>
constexpr const char* TargetName() {
  if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (std::is_same_v<T, float>) return "f32";
  else if constexpr (std::is_same_v<T, double>) return "f64";
  else if constexpr (std::is_same_v<T, uint8_t>) return "u8";
  else if constexpr (std::is_same_v<T, int8_t>) return "i8";
  else if constexpr (std::is_same_v<T, uint16_t>) return "u16";
  else if constexpr (std::is_same_v<T, int16_t>) return "i16";
  else if constexpr (std::is_same_v<T, uint32_t>) return "u32";
  else if constexpr (std::is_same_v<T, int32_t>) return "i32";
  else if constexpr (std::is_same_v<T, uint64_t>) return "u64";
  else return "i64";
}

std::string FormatNumber(GgufValueType type, uint64_t bits) {
  const Number n = Decode(type, bits);
  switch (n.kind) {
    case Number::kUnsigned: return std::to_string(n.u);
    case Number::kSigned: return std::to_string(n.i);
    case Number::kBool: return n.u ? "true" : "false";
    case Number::kFloat:
      return type == GgufValueType::kF32 ? FormatGgufFloat(static_cast<float>(n.d))
                                         : FormatGgufDouble(n.d);
  }
  return "?";
}

// Converts one decoded scalar to T, or explains why it cannot (no key in the message).
template <GgufNumber T>
Result<T> Convert(GgufValueType type, uint64_t bits) {
  const Number n = Decode(type, bits);
  auto mismatch = [&] {
    return Status::InvalidArgument(Cat("is ", GgufValueTypeName(type), ", expected ", TargetName<T>()));
  };
  auto out_of_range = [&] {
    return Status::InvalidArgument(Cat("value ", FormatNumber(type, bits), " (", GgufValueTypeName(type),
                                       ") does not fit in ", TargetName<T>()));
  };
  if constexpr (std::is_same_v<T, bool>) {
    if (n.kind != Number::kBool) return mismatch();
    return n.u != 0;
  } else if constexpr (std::is_floating_point_v<T>) {
    switch (n.kind) {
      case Number::kFloat:
        if constexpr (std::is_same_v<T, float>) {
          if (std::isfinite(n.d) && std::fabs(n.d) > std::numeric_limits<float>::max()) {
            return out_of_range();
          }
        }
        return static_cast<T>(n.d);
      case Number::kUnsigned: return static_cast<T>(n.u);
      case Number::kSigned: return static_cast<T>(n.i);
      case Number::kBool: return mismatch();
    }
    return mismatch();
  } else {
    if (n.kind == Number::kUnsigned) {
      if (n.u > static_cast<uint64_t>(std::numeric_limits<T>::max())) return out_of_range();
      return static_cast<T>(n.u);
    }
    if (n.kind == Number::kSigned) {
      if (std::is_unsigned_v<T> && n.i < 0) return out_of_range();
      if (n.i >= 0 && static_cast<uint64_t>(n.i) > static_cast<uint64_t>(std::numeric_limits<T>::max())) {
        return out_of_range();
      }
      if constexpr (std::is_signed_v<T>) {
        if (n.i < static_cast<int64_t>(std::numeric_limits<T>::min())) return out_of_range();
      }
      return static_cast<T>(n.i);
    }
    return mismatch();
  }
}

bool IsNumberType(GgufValueType t) { return t != GgufValueType::kString && t != GgufValueType::kArray; }

}  // namespace

// ---- Printing ----

const char* GgufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::kU8: return "u8";
    case GgufValueType::kI8: return "i8";
    case GgufValueType::kU16: return "u16";
    case GgufValueType::kI16: return "i16";
    case GgufValueType::kU32: return "u32";
    case GgufValueType::kI32: return "i32";
    case GgufValueType::kF32: return "f32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kU64: return "u64";
    case GgufValueType::kI64: return "i64";
    case GgufValueType::kF64: return "f64";
  }
  return "invalid type";
}

namespace {

// Shortest round-trip form; plain decimals (1000000, 0.001) between 1e-4 and 1e15,
// where they read better than 1e+06, scientific outside (1e-05, 1e+300).
template <typename F>
std::string ShortestDecimal(F value) {
  char buf[128];
  const F magnitude = std::fabs(value);
  const bool fixed = std::isfinite(value) && (magnitude == 0 || (magnitude >= F(1e-4) && magnitude < F(1e15)));
  auto [end, ec] = fixed ? std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::fixed)
                         : std::to_chars(buf, buf + sizeof(buf), value);
  return ec == std::errc() ? std::string(buf, end) : "?";
}

}  // namespace

std::string FormatGgufFloat(float value) { return ShortestDecimal(value); }
std::string FormatGgufDouble(double value) { return ShortestDecimal(value); }

std::string EscapeGgufString(std::string_view text, size_t max_bytes, char quote) {
  size_t cut = text.size();
  bool truncated = false;
  if (cut > max_bytes) {
    cut = max_bytes;
    // Back off to the start of a well-formed sequence that the cut would split (at most
    // three bytes); stray continuation bytes stay, to be escaped one by one.
    for (size_t back = 1; back <= 3 && back <= max_bytes; ++back) {
      const size_t len = unicode::WellFormedUtf8Len(text, max_bytes - back);
      if (len > back) {
        cut = max_bytes - back;
        break;
      }
      if (len > 0) break;  // a whole sequence (or ASCII) ends before the cut
    }
    truncated = true;
  }
  std::string out;
  out.reserve(cut + 8);
  for (size_t i = 0; i < cut; ++i) {
    const auto c = static_cast<uint8_t>(text[i]);
    if (c >= 0x80) {  // a well-formed sequence as it is; any other byte as \xNN
      const size_t len = unicode::WellFormedUtf8Len(text.substr(0, cut), i);
      if (len > 0) {
        out.append(text.substr(i, len));
        i += len - 1;
        continue;
      }
    }
    if (quote != 0 && c == static_cast<uint8_t>(quote)) {
      out += '\\';
      out += quote;
      continue;
    }
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c >= 0x7F) {
          static const char kHex[] = "0123456789abcdef";
          out += "\\x";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  if (truncated) out += "...";
  return out;
}

std::string GgufValueTypeString(const GgufValue& value) {
  if (!value.is_array()) return GgufValueTypeName(value.type());
  return Cat(GgufValueTypeName(value.element_type()), "[", value.size(), "]");
}

namespace {

std::string FormatString(std::string_view s, const GgufFormatOptions& options) {
  std::string out(1, '"');
  out += EscapeGgufString(s, options.max_string_bytes);
  out += '"';
  if (s.size() > options.max_string_bytes) out += Cat(" (", s.size(), " bytes)");
  return out;
}

}  // namespace

std::string FormatGgufValue(const GgufValue& value, const GgufFormatOptions& options) {
  if (value.type_ == GgufValueType::kString) return FormatString(value.string_, options);
  if (!value.is_array()) return FormatNumber(value.type_, value.bits_);
  const uint64_t shown = std::min<uint64_t>(value.count_, options.max_array_items);
  std::string out = "[";
  for (uint64_t i = 0; i < shown; ++i) {
    if (i > 0) out += ", ";
    if (value.element_type_ == GgufValueType::kString) {
      out += FormatString(value.strings_[i], options);
    } else {
      const size_t bytes = ScalarBytes(value.element_type_);
      out += FormatNumber(value.element_type_, LoadBits(value.elements_ + i * bytes, bytes));
    }
  }
  if (shown < value.count_) out += Cat(shown > 0 ? ", " : "", "... ", value.count_ - shown, " more");
  out += "]";
  return out;
}

// ---- GgufValue ----

template <GgufNumber T>
Result<T> GgufValue::As() const {
  if (!IsNumberType(type_)) {
    return Status::InvalidArgument(Cat("is ", GgufValueTypeString(*this), ", expected ", TargetName<T>()));
  }
  return Convert<T>(type_, bits_);
}

Result<std::string_view> GgufValue::AsString() const {
  if (type_ != GgufValueType::kString) {
    return Status::InvalidArgument(Cat("is ", GgufValueTypeString(*this), ", expected string"));
  }
  return string_;
}

template <GgufNumber T>
Result<T> GgufValue::ElementAs(uint64_t index) const {
  assert(is_array() && index < count_);
  if (!IsNumberType(element_type_)) {
    return Status::InvalidArgument(Cat("is ", GgufValueTypeString(*this), ", expected an array of ", TargetName<T>()));
  }
  const size_t bytes = ScalarBytes(element_type_);
  return Convert<T>(element_type_, LoadBits(elements_ + index * bytes, bytes));
}

template <GgufNumber T>
Result<std::vector<T>> GgufValue::AsArray() const {
  if (!is_array() || !IsNumberType(element_type_)) {
    return Status::InvalidArgument(Cat("is ", GgufValueTypeString(*this), ", expected an array of ", TargetName<T>()));
  }
  std::vector<T> out;
  out.reserve(count_);
  const size_t bytes = ScalarBytes(element_type_);
  for (uint64_t i = 0; i < count_; ++i) {
    Result<T> v = Convert<T>(element_type_, LoadBits(elements_ + i * bytes, bytes));
    if (!v.ok()) return v.status().Annotate(Cat("element ", i));
    out.push_back(*v);
  }
  return out;
}

Result<std::span<const std::string_view>> GgufValue::AsStringArray() const {
  if (!is_array() || element_type_ != GgufValueType::kString) {
    return Status::InvalidArgument(Cat("is ", GgufValueTypeString(*this), ", expected an array of strings"));
  }
  return std::span<const std::string_view>(strings_);
}

// ---- Parser ----

// Reads one image front to back. Every read is bounds-checked against the bytes left;
// counts are checked against the bytes left before anything is allocated for them.
class GgufParser {
 public:
  GgufParser(const uint8_t* data, uint64_t size, GgufFile* file) : p_(data), size_(size), file_(file) {}

  Status Run() {
    TIERKV_RETURN_IF_ERROR(ParseHeader());
    TIERKV_RETURN_IF_ERROR(ParseMetadata());
    TIERKV_RETURN_IF_ERROR(ParseAlignment());
    TIERKV_RETURN_IF_ERROR(ParseTensorInfos());
    return PlaceTensors();
  }

 private:
  uint64_t left() const { return size_ - pos_; }

  Status Truncated(uint64_t need, const char* what) const {
    return Status::Corruption(Cat("gguf: file truncated: ", what, " of ", where_, " needs ", need,
                                  " bytes at offset ", pos_, " but the file ends at ", size_));
  }

  template <typename T>
  Status Read(T* out, const char* what) {
    if (left() < sizeof(T)) return Truncated(sizeof(T), what);
    std::memcpy(out, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }

  // `element` >= 0 names an element of a string array in messages.
  Status ReadString(std::string_view* out, const char* what, int64_t element = -1) {
    uint64_t len = 0;
    const uint64_t at = pos_;
    TIERKV_RETURN_IF_ERROR(Read(&len, what));
    if (len > left()) {
      return Status::Corruption(Cat("gguf: ", where_, element >= 0 ? Cat(" element ", element) : std::string(),
                                    ": ", what, " ", len, " at offset ", at, " exceeds the ", left(),
                                    " bytes left in the file (size ", size_, ")"));
    }
    *out = std::string_view(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return Status::Ok();
  }

  Status ParseHeader() {
    where_ = "the header";
    if (size_ < 4) {
      return Status::Corruption(Cat("gguf: file is ", size_, " bytes, too small for a GGUF header (magic 'GGUF')"));
    }
    uint32_t magic = 0;
    TIERKV_RETURN_IF_ERROR(Read(&magic, "magic"));
    if (magic != kMagic) {
      const std::string_view m(reinterpret_cast<const char*>(p_), 4);
      std::string hint;
      if (m == "ggml" || m == "ggmf" || m == "ggjt" || m == "lmgg" || m == "fmgg" || m == "tjgg") {
        hint = " (a legacy GGML/GGJT file; convert it to GGUF with llama.cpp)";
      }
      char hex[16];
      std::snprintf(hex, sizeof(hex), "0x%08x", magic);
      return Status::Corruption(Cat("gguf: bad magic '", EscapeGgufString(m), "' (", hex,
                                    "): not a GGUF file", hint));
    }
    uint32_t version = 0;
    TIERKV_RETURN_IF_ERROR(Read(&version, "version"));
    if (version == 1) {
      return Status::Unsupported(
          "gguf: GGUF version 1 is not supported (only versions 2 and 3); re-convert the model with a "
          "current llama.cpp");
    }
    if ((version & 0xFFFF) == 0 && (version >> 24) >= 1 && (version >> 24) <= 3) {
      return Status::Unsupported(Cat("gguf: big-endian GGUF file (version field reads ", version >> 24,
                                     " byte-swapped) is not supported"));
    }
    if (version != 2 && version != 3) {
      return Status::Unsupported(Cat("gguf: unsupported GGUF version ", version, " (supported: 2, 3)"));
    }
    file_->version_ = version;
    TIERKV_RETURN_IF_ERROR(Read(&n_tensors_, "n_tensors"));
    TIERKV_RETURN_IF_ERROR(Read(&n_kv_, "n_kv"));
    if (n_kv_ > left() / kMinKvBytes) {
      return Status::Corruption(Cat("gguf: header: n_kv = ", n_kv_, " cannot fit in the ", left(),
                                    " bytes after the header (each key/value takes at least ", kMinKvBytes,
                                    " bytes)"));
    }
    if (n_tensors_ > left() / kMinTensorInfoBytes) {
      return Status::Corruption(Cat("gguf: header: n_tensors = ", n_tensors_, " cannot fit in the ", left(),
                                    " bytes after the header (each tensor info takes at least ",
                                    kMinTensorInfoBytes, " bytes)"));
    }
    return Status::Ok();
  }

  Status ParseMetadata() {
    file_->kvs_.reserve(n_kv_);
    file_->kv_index_.reserve(n_kv_);
    for (uint64_t i = 0; i < n_kv_; ++i) {
      GgufKv kv;
      kv.file_offset = pos_;
      where_ = Cat("key #", i);
      TIERKV_RETURN_IF_ERROR(ReadString(&kv.key, "key length"));
      if (kv.key.empty()) return Status::Corruption(Cat("gguf: key #", i, " at offset ", kv.file_offset, " is empty"));
      where_ = Cat("key ", Quoted(kv.key));
      uint32_t type = 0;
      TIERKV_RETURN_IF_ERROR(Read(&type, "value type"));
      if (type > kMaxValueType) {
        return Status::Corruption(Cat("gguf: key ", Quoted(kv.key), " has unknown value type ", type));
      }
      TIERKV_RETURN_IF_ERROR(ParseValue(static_cast<GgufValueType>(type), &kv.value));
      auto [it, inserted] = file_->kv_index_.emplace(kv.key, file_->kvs_.size());
      if (!inserted) {
        return Status::Corruption(Cat("gguf: duplicate key ", Quoted(kv.key), " (entries #", it->second,
                                      " and #", i, ")"));
      }
      file_->kvs_.push_back(std::move(kv));
    }
    return Status::Ok();
  }

  Status ParseValue(GgufValueType type, GgufValue* v) {
    v->type_ = type;
    if (type == GgufValueType::kString) return ReadString(&v->string_, "string length");
    if (type != GgufValueType::kArray) {
      const size_t bytes = ScalarBytes(type);
      if (left() < bytes) return Truncated(bytes, "value");
      v->bits_ = LoadBits(p_ + pos_, bytes);
      pos_ += bytes;
      if (type == GgufValueType::kBool && v->bits_ > 1) {
        return Status::Corruption(Cat("gguf: ", where_, ": bool value ", v->bits_, " is neither 0 nor 1"));
      }
      return Status::Ok();
    }
    uint32_t element_type = 0;
    TIERKV_RETURN_IF_ERROR(Read(&element_type, "array element type"));
    if (element_type > kMaxValueType) {
      return Status::Corruption(Cat("gguf: ", where_, " is an array of unknown value type ", element_type));
    }
    v->element_type_ = static_cast<GgufValueType>(element_type);
    if (v->element_type_ == GgufValueType::kArray) {
      return Status::Unsupported(Cat("gguf: ", where_, " is an array of arrays, which is not supported"));
    }
    const uint64_t count_at = pos_;
    TIERKV_RETURN_IF_ERROR(Read(&v->count_, "array length"));
    if (v->element_type_ == GgufValueType::kString) {
      if (v->count_ > left() / 8) {
        return Status::Corruption(Cat("gguf: ", where_, ": array length ", v->count_, " at offset ", count_at,
                                      " cannot fit in the ", left(), " bytes left in the file (each string "
                                      "takes at least 8 bytes)"));
      }
      v->strings_.resize(v->count_);
      for (uint64_t i = 0; i < v->count_; ++i) {
        TIERKV_RETURN_IF_ERROR(ReadString(&v->strings_[i], "string length", static_cast<int64_t>(i)));
      }
      return Status::Ok();
    }
    const size_t bytes = ScalarBytes(v->element_type_);
    if (v->count_ > left() / bytes) {
      return Status::Corruption(Cat("gguf: ", where_, ": array of ", v->count_, " ",
                                    GgufValueTypeName(v->element_type_), " at offset ", count_at,
                                    " extends past the end of the file (", left(), " bytes left, size ",
                                    size_, ")"));
    }
    v->elements_ = p_ + pos_;
    if (v->element_type_ == GgufValueType::kBool) {
      for (uint64_t i = 0; i < v->count_; ++i) {
        if (v->elements_[i] > 1) {
          return Status::Corruption(Cat("gguf: ", where_, " element ", i, ": bool value ",
                                        static_cast<int>(v->elements_[i]), " is neither 0 nor 1"));
        }
      }
    }
    pos_ += v->count_ * bytes;
    return Status::Ok();
  }

  Status ParseAlignment() {
    file_->alignment_ = kDefaultAlignment;
    auto it = file_->kv_index_.find("general.alignment");
    if (it == file_->kv_index_.end()) return Status::Ok();
    const GgufValue& v = file_->kvs_[it->second].value;
    if (v.type() != GgufValueType::kU32) {
      return Status::Corruption(Cat("gguf: general.alignment is ", GgufValueTypeString(v), ", expected u32"));
    }
    const auto alignment = static_cast<uint32_t>(v.bits_);
    if (alignment == 0 || !std::has_single_bit(alignment)) {
      return Status::Corruption(Cat("gguf: general.alignment = ", alignment, " is not a power of two"));
    }
    file_->alignment_ = alignment;
    return Status::Ok();
  }

  Status ParseTensorInfos() {
    file_->tensors_.reserve(n_tensors_);
    file_->tensor_index_.reserve(n_tensors_);
    for (uint64_t i = 0; i < n_tensors_; ++i) {
      GgufTensor t;
      const uint64_t info_at = pos_;
      where_ = Cat("tensor info #", i);
      TIERKV_RETURN_IF_ERROR(ReadString(&t.name, "name length"));
      if (t.name.empty()) {
        return Status::Corruption(Cat("gguf: tensor #", i, " at offset ", info_at, " has an empty name"));
      }
      const std::string name = Quoted(t.name);
      where_ = Cat("tensor ", name);
      TIERKV_RETURN_IF_ERROR(Read(&t.n_dims, "n_dims"));
      if (t.n_dims > kMaxDims) {
        return Status::Corruption(Cat("gguf: tensor ", name, " has ", t.n_dims, " dimensions (at most ",
                                      kMaxDims, " are supported)"));
      }
      for (uint32_t d = 0; d < t.n_dims; ++d) {
        uint64_t ne = 0;
        TIERKV_RETURN_IF_ERROR(Read(&ne, "dimension"));
        if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return Status::Corruption(Cat("gguf: tensor ", name, " ne[", d, "] = ", ne,
                                        " is out of range (negative as int64)"));
        }
        t.ne[d] = static_cast<int64_t>(ne);
      }
      uint32_t type = 0;
      TIERKV_RETURN_IF_ERROR(Read(&type, "ggml type"));
      TIERKV_RETURN_IF_ERROR(Read(&t.offset, "data offset"));
      TIERKV_RETURN_IF_ERROR(SizeTensor(name, type, &t));

      auto [it, inserted] = file_->tensor_index_.emplace(t.name, file_->tensors_.size());
      if (!inserted) {
        return Status::Corruption(Cat("gguf: duplicate tensor name ", name, " (tensors #", it->second,
                                      " and #", i, ")"));
      }
      file_->tensors_.push_back(t);
    }
    return Status::Ok();
  }

  // Type, element count and byte size of one tensor, without overflow.
  Status SizeTensor(const std::string& name, uint32_t type, GgufTensor* t) {
    const GgmlTypeTraits* traits = FindGgmlType(type);
    if (traits == nullptr) {
      return Status::Unsupported(Cat("gguf: tensor ", name, " has unknown ggml type id ", type));
    }
    if (!traits->known) {
      return Status::Unsupported(Cat("gguf: tensor ", name, " has ggml type ", type, " (", traits->name,
                                     "), which was removed from ggml; re-quantize the model"));
    }
    t->type = static_cast<GgmlType>(type);
    uint64_t elements = 1;
    for (int64_t ne : t->ne) {
      if (__builtin_mul_overflow(elements, static_cast<uint64_t>(ne), &elements) ||
          elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Status::Corruption(Cat("gguf: tensor ", name, " shape [", t->ne[0], ", ", t->ne[1], ", ",
                                      t->ne[2], ", ", t->ne[3], "] has more than INT64_MAX elements"));
      }
    }
    t->n_elements = elements;
    if (t->ne[0] % traits->block_size != 0) {
      return Status::Corruption(Cat("gguf: tensor ", name, " of type ", traits->name, " has ne[0] = ", t->ne[0],
                                    ", not a multiple of its block size ", traits->block_size));
    }
    uint64_t bytes = 0;
    bool overflow = __builtin_mul_overflow(static_cast<uint64_t>(t->ne[0]) / traits->block_size,
                                           traits->block_bytes, &bytes);
    for (int d = 1; d < 4 && !overflow; ++d) {
      overflow = __builtin_mul_overflow(bytes, static_cast<uint64_t>(t->ne[d]), &bytes);
    }
    if (overflow) return Status::Corruption(Cat("gguf: tensor ", name, " byte size overflows 64 bits"));
    t->n_bytes = bytes;
    return Status::Ok();
  }

  Status PlaceTensors() {
    GgufFile& f = *file_;
    const uint64_t a = f.alignment_;
    const uint64_t info_end = pos_;
    // info_end <= size_ < 2^63 in practice; guard the rounding anyway.
    if (info_end > std::numeric_limits<uint64_t>::max() - (a - 1)) {
      return Status::Corruption("gguf: data section offset overflows");
    }
    f.data_offset_ = (info_end + a - 1) / a * a;
    if (f.tensors_.empty()) return Status::Ok();
    if (f.data_offset_ > size_) {
      return Status::Corruption(Cat("gguf: file truncated: the tensor data section starts at offset ",
                                    f.data_offset_, " (tensor infos end at ", info_end,
                                    ", padded to alignment ", a, ") but the file ends at ", size_));
    }
    const uint64_t data_bytes = size_ - f.data_offset_;
    for (GgufTensor& t : f.tensors_) {
      const std::string name = Quoted(t.name);
      if (t.offset % a != 0) {
        return Status::Corruption(Cat("gguf: tensor ", name, " data offset ", t.offset,
                                      " is not a multiple of the alignment ", a));
      }
      if (t.offset > data_bytes || t.n_bytes > data_bytes - t.offset) {
        // Absolute offsets; saturate where they exceed 64 bits.
        uint64_t begin = 0, end = 0;
        if (__builtin_add_overflow(f.data_offset_, t.offset, &begin)) begin = UINT64_MAX;
        if (__builtin_add_overflow(begin, t.n_bytes, &end)) end = UINT64_MAX;
        return Status::Corruption(Cat("gguf: tensor ", name, " data [", begin, ", ", end,
                                      ") extends past the end of the file (size ", size_, ")"));
      }
      t.file_offset = f.data_offset_ + t.offset;
      t.data = p_ + t.file_offset;
      f.parameter_count_ += t.n_elements;  // each <= INT64_MAX and all fit in the file: no overflow
      f.tensor_bytes_ += t.n_bytes;
    }
    // No two tensors share bytes (empty tensors take none).
    std::vector<const GgufTensor*> order;
    order.reserve(f.tensors_.size());
    for (const GgufTensor& t : f.tensors_) {
      if (t.n_bytes > 0) order.push_back(&t);
    }
    std::sort(order.begin(), order.end(),
              [](const GgufTensor* x, const GgufTensor* y) { return x->file_offset < y->file_offset; });
    for (size_t i = 1; i < order.size(); ++i) {
      const GgufTensor& x = *order[i - 1];
      const GgufTensor& y = *order[i];
      if (x.file_offset + x.n_bytes > y.file_offset) {
        return Status::Corruption(Cat("gguf: tensors ", Quoted(x.name), " [", x.file_offset, ", ",
                                      x.file_offset + x.n_bytes, ") and ", Quoted(y.name), " [",
                                      y.file_offset, ", ", y.file_offset + y.n_bytes, ") overlap"));
      }
    }
    return Status::Ok();
  }

  const uint8_t* p_;
  uint64_t size_;
  GgufFile* file_;
  uint64_t pos_ = 0;
  uint64_t n_tensors_ = 0;
  uint64_t n_kv_ = 0;
  std::string where_;  // what is being read, for messages: "key 'general.name'"
};

// ---- GgufFile ----

GgufFile::~GgufFile() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_size_);
}

Result<std::unique_ptr<GgufFile>> GgufFile::Parse(const void* data, size_t size) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->base_ = static_cast<const uint8_t*>(data);
  file->size_ = size;
  GgufParser parser(file->base_, size, file.get());
  TIERKV_RETURN_IF_ERROR(parser.Run());
  return file;
}

Result<std::unique_ptr<GgufFile>> GgufFile::ParseOwned(std::vector<uint8_t> image, std::string name) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->owned_image_ = std::move(image);
  file->path_ = std::move(name);
  file->base_ = file->owned_image_.data();
  file->size_ = file->owned_image_.size();
  GgufParser parser(file->base_, file->size_, file.get());
  Status st = parser.Run();
  if (!st.ok()) return st.Annotate(file->path_);
  return file;
}

Result<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  // O_NONBLOCK: a FIFO is refused below instead of blocking the open.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) return Status::FromErrno(errno, path);
  struct stat st{};
  if (fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, path);
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(Cat(path, S_ISDIR(st.st_mode) ? ": a directory, not a GGUF file" : ": not a regular file"));
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size == 0) return Status::Corruption(Cat(path, ": gguf: file is empty"));
  void* mapping = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  const int map_errno = errno;
  if (mapping == MAP_FAILED) {
    return Status::FromErrno(map_errno, Cat(path, ": mmap"));
  }

  std::unique_ptr<GgufFile> file(new GgufFile());
  file->fd_ = std::move(fd);  // kept for reads that bypass the mapping (paged weights)
  file->path_ = path;
  file->mapping_ = mapping;
  file->mapping_size_ = size;
  file->base_ = static_cast<const uint8_t*>(mapping);
  file->size_ = size;
  GgufParser parser(file->base_, size, file.get());
  Status st_parse = parser.Run();
  if (!st_parse.ok()) return st_parse.Annotate(path);
  return file;
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

const GgufTensor* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

Status KeyNotFound(std::string_view key) { return Status::NotFound(Cat("gguf: key ", Quoted(key), " not found")); }
std::string KeyContext(std::string_view key) { return Cat("gguf: key ", Quoted(key)); }

}  // namespace

template <GgufNumber T>
Result<T> GgufFile::Get(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return KeyNotFound(key);
  Result<T> r = v->As<T>();
  if (!r.ok()) return r.status().Annotate(KeyContext(key));
  return r;
}

template <GgufNumber T>
Result<std::optional<T>> GgufFile::GetOptional(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::optional<T>();
  Result<T> r = v->As<T>();
  if (!r.ok()) return r.status().Annotate(KeyContext(key));
  return std::optional<T>(*r);
}

template <GgufNumber T>
Result<std::vector<T>> GgufFile::GetArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return KeyNotFound(key);
  Result<std::vector<T>> r = v->AsArray<T>();
  if (!r.ok()) return r.status().Annotate(KeyContext(key));
  return r;
}

Result<std::string_view> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return KeyNotFound(key);
  Result<std::string_view> r = v->AsString();
  if (!r.ok()) return r.status().Annotate(KeyContext(key));
  return r;
}

Result<std::span<const std::string_view>> GgufFile::GetArrayString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return KeyNotFound(key);
  auto r = v->AsStringArray();
  if (!r.ok()) return r.status().Annotate(KeyContext(key));
  return r;
}

std::string_view GgufFile::architecture() const {
  const GgufValue* v = Find("general.architecture");
  if (v == nullptr || v->type() != GgufValueType::kString) return {};
  return v->AsString().value();
}

// The supported conversions, instantiated once here.
#define TIERKV_GGUF_INSTANTIATE(T)                                                   \
  template Result<T> GgufValue::As<T>() const;                                       \
  template Result<std::vector<T>> GgufValue::AsArray<T>() const;                     \
  template Result<T> GgufValue::ElementAs<T>(uint64_t) const;                        \
  template Result<T> GgufFile::Get<T>(std::string_view) const;                       \
  template Result<std::optional<T>> GgufFile::GetOptional<T>(std::string_view) const; \
  template Result<std::vector<T>> GgufFile::GetArray<T>(std::string_view) const;
TIERKV_GGUF_INSTANTIATE(uint8_t)
TIERKV_GGUF_INSTANTIATE(int8_t)
TIERKV_GGUF_INSTANTIATE(uint16_t)
TIERKV_GGUF_INSTANTIATE(int16_t)
TIERKV_GGUF_INSTANTIATE(uint32_t)
TIERKV_GGUF_INSTANTIATE(int32_t)
TIERKV_GGUF_INSTANTIATE(uint64_t)
TIERKV_GGUF_INSTANTIATE(int64_t)
TIERKV_GGUF_INSTANTIATE(float)
TIERKV_GGUF_INSTANTIATE(double)
TIERKV_GGUF_INSTANTIATE(bool)
#undef TIERKV_GGUF_INSTANTIATE

}  // namespace tierkv
