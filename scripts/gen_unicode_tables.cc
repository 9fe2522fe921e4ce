// scripts/gen_unicode_tables.cc: prints runtime/unicode.cc's kLetterRanges and
// kNumberRanges (general categories L* and N*, U+0080..U+10FFFF, maximal runs) from
// ICU's character data, plus the one Unicode 15.1 block of letters that ICU 72
// (Unicode 15.0, Debian 12) predates: CJK Unified Ideographs Extension I.
//
//   g++ -std=c++20 scripts/gen_unicode_tables.cc $(pkg-config --cflags --libs icu-uc) -o /tmp/gen_unicode_tables
//   /tmp/gen_unicode_tables     # (Debian 12: apt-get install libicu-dev)
//
// scripts/check_unicode_tables.sh compares its output with the tables in runtime/unicode.cc.
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

#include <unicode/uchar.h>

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

void Add(Ranges& r, uint32_t cp) {
  if (!r.empty() && r.back().second + 1 == cp) {
    r.back().second = cp;
  } else {
    r.emplace_back(cp, cp);
  }
}

void Print(const char* name, const Ranges& r) {
  std::printf("constexpr CodepointRange %s[] = {  // %zu ranges\n", name, r.size());
  for (size_t i = 0; i < r.size(); ++i) {
    std::printf("%s{0x%05X, 0x%05X},", i % 4 == 0 ? "    " : " ", r[i].first, r[i].second);
    if (i % 4 == 3 || i + 1 == r.size()) std::printf("\n");
  }
  std::printf("};\n");
}

}  // namespace

int main() {
  Ranges letters, numbers;
  for (uint32_t cp = 0x80; cp <= 0x10FFFF; ++cp) {
    const int8_t t = u_charType(static_cast<UChar32>(cp));
    const bool letter = t == U_UPPERCASE_LETTER || t == U_LOWERCASE_LETTER || t == U_TITLECASE_LETTER ||
                        t == U_MODIFIER_LETTER || t == U_OTHER_LETTER ||
                        (cp >= 0x2EBF0 && cp <= 0x2EE5D);  // Unicode 15.1: CJK Extension I (Lo)
    const bool number = t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
    if (letter) Add(letters, cp);
    if (number) Add(numbers, cp);
  }
  Print("kLetterRanges", letters);
  std::printf("\n");
  Print("kNumberRanges", numbers);
  return 0;
}
