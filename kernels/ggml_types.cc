// kernels/ggml_types.cc
#include "kernels/ggml_types.h"

#include <array>
#include <cassert>

namespace tierkv {
namespace {

// Block layouts, from the block structs of ggml: e.g. Q4_K = fp16 d + fp16 dmin +
// 12 bytes of 6-bit scales + 128 bytes of 4-bit quants = 144 bytes per 256 values.
constexpr uint32_t kQK = 256;  // K-quant / IQ super-block
constexpr GgmlTypeTraits kTypes[] = {
    {0, "F32", 1, 4, true},
    {1, "F16", 1, 2, true},
    {2, "Q4_0", 32, 2 + 16, true},
    {3, "Q4_1", 32, 2 + 2 + 16, true},
    {4, "Q4_2", 0, 0, false},
    {5, "Q4_3", 0, 0, false},
    {6, "Q5_0", 32, 2 + 4 + 16, true},
    {7, "Q5_1", 32, 2 + 2 + 4 + 16, true},
    {8, "Q8_0", 32, 2 + 32, true},
    {9, "Q8_1", 32, 2 + 2 + 32, true},
    {10, "Q2_K", kQK, kQK / 16 + kQK / 4 + 2 + 2, true},                    // 84
    {11, "Q3_K", kQK, kQK / 8 + kQK / 4 + 12 + 2, true},                    // 110
    {12, "Q4_K", kQK, 2 + 2 + 12 + kQK / 2, true},                          // 144
    {13, "Q5_K", kQK, 2 + 2 + 12 + kQK / 8 + kQK / 2, true},                // 176
    {14, "Q6_K", kQK, kQK / 2 + kQK / 4 + kQK / 16 + 2, true},              // 210
    {15, "Q8_K", kQK, 4 + kQK + (kQK / 16) * 2, true},                      // 292
    {16, "IQ2_XXS", kQK, 2 + (kQK / 8) * 2, true},                          // 66
    {17, "IQ2_XS", kQK, 2 + (kQK / 8) * 2 + kQK / 32, true},                // 74
    {18, "IQ3_XXS", kQK, 2 + 3 * kQK / 8, true},                            // 98
    {19, "IQ1_S", kQK, 2 + kQK / 8 + (kQK / 32) * 2, true},                 // 50
    {20, "IQ4_NL", 32, 2 + 16, true},                                       // 18
    {21, "IQ3_S", kQK, 2 + kQK / 4 + kQK / 32 + kQK / 8 + kQK / 64, true},  // 110
    {22, "IQ2_S", kQK, 2 + kQK / 4 + kQK / 32 + kQK / 32, true},            // 82
    {23, "IQ4_XS", kQK, 2 + 2 + kQK / 64 + kQK / 2, true},                  // 136
    {24, "I8", 1, 1, true},
    {25, "I16", 1, 2, true},
    {26, "I32", 1, 4, true},
    {27, "I64", 1, 8, true},
    {28, "F64", 1, 8, true},
    {29, "IQ1_M", kQK, kQK / 8 + kQK / 16 + kQK / 32, true},  // 56
    {30, "BF16", 1, 2, true},
    {31, "Q4_0_4_4", 0, 0, false},
    {32, "Q4_0_4_8", 0, 0, false},
    {33, "Q4_0_8_8", 0, 0, false},
    {34, "TQ1_0", kQK, (kQK - 4 * kQK / 64) / 5 + kQK / 64 + 2, true},  // 54
    {35, "TQ2_0", kQK, kQK / 4 + 2, true},                              // 66
    {36, "IQ4_NL_4_4", 0, 0, false},
    {37, "IQ4_NL_4_8", 0, 0, false},
    {38, "IQ4_NL_8_8", 0, 0, false},
    {39, "MXFP4", 32, 1 + 16, true},  // 17: e8m0 scale + 32 e2m1 nibbles
};
constexpr size_t kNumTypes = sizeof(kTypes) / sizeof(kTypes[0]);

// The table is indexed by id; catch a misplaced row at compile time.
constexpr bool IdsMatchIndex() {
  for (size_t i = 0; i < kNumTypes; ++i) {
    if (kTypes[i].id != i) return false;
  }
  return true;
}
static_assert(IdsMatchIndex(), "kTypes must be indexed by ggml type id");
static_assert(kTypes[12].block_bytes == 144 && kTypes[14].block_bytes == 210 &&
                  kTypes[10].block_bytes == 84 && kTypes[11].block_bytes == 110 &&
                  kTypes[13].block_bytes == 176 && kTypes[15].block_bytes == 292,
              "K-quant block sizes");
static_assert(kTypes[16].block_bytes == 66 && kTypes[17].block_bytes == 74 &&
                  kTypes[18].block_bytes == 98 && kTypes[19].block_bytes == 50 &&
                  kTypes[21].block_bytes == 110 && kTypes[22].block_bytes == 82 &&
                  kTypes[23].block_bytes == 136 && kTypes[29].block_bytes == 56 &&
                  kTypes[34].block_bytes == 54 && kTypes[35].block_bytes == 66,
              "IQ / TQ block sizes");

}  // namespace

const GgmlTypeTraits* FindGgmlType(uint32_t id) {
  return id < kNumTypes ? &kTypes[id] : nullptr;
}

bool IsKnownGgmlType(uint32_t id) {
  const GgmlTypeTraits* t = FindGgmlType(id);
  return t != nullptr && t->known;
}

std::string GgmlTypeName(uint32_t id) {
  const GgmlTypeTraits* t = FindGgmlType(id);
  if (t == nullptr) return "unknown type " + std::to_string(id);
  if (!t->known) return std::string(t->name) + " (removed from ggml)";
  return t->name;
}

bool ParseGgmlTypeName(std::string_view name, GgmlType* out) {
  for (const GgmlTypeTraits& t : kTypes) {
    if (t.known && name == t.name) {
      *out = static_cast<GgmlType>(t.id);
      return true;
    }
  }
  return false;
}

std::span<const GgmlTypeTraits> AllGgmlTypes() { return {kTypes, kNumTypes}; }

uint64_t GgmlRowBytes(const GgmlTypeTraits& traits, uint64_t ne0) {
  assert(traits.known && ne0 % traits.block_size == 0);
  return ne0 / traits.block_size * traits.block_bytes;
}

}  // namespace tierkv
