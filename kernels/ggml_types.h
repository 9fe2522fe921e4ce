// kernels/ggml_types.h
//
// The ggml tensor element types a GGUF file may name: their numeric ids (as written in
// GGUF tensor infos), their names (the upper-case spelling of llama.cpp's gguf-py, e.g.
// "Q4_K"), and their block layouts (values per block, bytes per block). A tensor row of
// ne[0] values takes (ne[0] / block_size) * block_bytes bytes; ne[0] must be a multiple
// of block_size.
//
// Every id ggml ever assigned is listed. Ids that ggml has since removed (Q4_2, Q4_3 and
// the repacked Q4_0_4_4 ... IQ4_NL_8_8 types) have known == false: their names are
// kept for error messages, but a file that uses them is refused.
//
// Thread-safety: constant tables and pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace tierkv {

// Numeric ids are ggml's, fixed by the file format.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  // 4 (Q4_2) and 5 (Q4_3): removed from ggml.
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  // 31..33 (Q4_0_4_4, Q4_0_4_8, Q4_0_8_8): removed from ggml.
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  // 36..38 (IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8): removed from ggml.
  kMXFP4 = 39,
};

struct GgmlTypeTraits {
  uint32_t id = 0;
  const char* name = "";     // "Q4_K": the spelling used by gguf-py and our test vectors
  uint32_t block_size = 0;   // values per block (1 for F32, F16, BF16, I8 ... F64)
  uint32_t block_bytes = 0;  // bytes per block
  // false: an id ggml used once and removed; its layout is not read and files using it
  // are refused (block_size and block_bytes are 0).
  bool known = false;
};

// The traits of a type id, or nullptr when ggml never assigned that id.
const GgmlTypeTraits* FindGgmlType(uint32_t id);
inline const GgmlTypeTraits* FindGgmlType(GgmlType type) {
  return FindGgmlType(static_cast<uint32_t>(type));
}

// True for ids whose layout is known (a tensor of this type can be read).
bool IsKnownGgmlType(uint32_t id);

// "Q4_K"; "Q4_2 (removed from ggml)" for removed ids; "unknown type 99" otherwise.
std::string GgmlTypeName(uint32_t id);
inline std::string GgmlTypeName(GgmlType type) { return GgmlTypeName(static_cast<uint32_t>(type)); }

// The id named `name` (exact, case-sensitive spelling as in GgmlTypeTraits::name),
// known types only; false when there is none.
bool ParseGgmlTypeName(std::string_view name, GgmlType* out);

// Every listed id, known or removed, in id order.
std::span<const GgmlTypeTraits> AllGgmlTypes();

// Bytes of one row of ne0 values.
// REQUIRES: IsKnownGgmlType(id), ne0 % block_size == 0, and the product fits in uint64.
uint64_t GgmlRowBytes(const GgmlTypeTraits& traits, uint64_t ne0);

}  // namespace tierkv
