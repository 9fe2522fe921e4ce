// runtime/unicode.h
//
// The Unicode pieces the tokenizers need, behaving the way llama.cpp behaves so that
// token ids match it:
//   - UTF-8 decoding that never fails (llama.cpp's lenient rules, below);
//   - the three character classes its pre-tokenizer regexes ask for: letters \p{L},
//     numbers \p{N} and whitespace \s (everything else is "other");
//   - the GPT-2 style pre-tokenizer split (qwen2 and llama3 regexes), written as a
//     hand-coded matcher with the regexes' leftmost, first-alternative semantics;
//   - the GPT-2 byte <-> Unicode mapping used by byte-level BPE vocabularies.
// Category data: Unicode 15.1 (what llama.cpp's tables hold), generated ranges in
// unicode.cc. docs/tokenizers.md describes all of it.
//
// Thread-safety: pure functions over immutable tables.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tierkv::unicode {

inline constexpr uint32_t kReplacementChar = 0xFFFD;
inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;

// Length of a UTF-8 sequence from its first byte alone, by the high nibble:
// 0x0-0xB -> 1 (ASCII, and stray continuation bytes count as one), 0xC-0xD -> 2,
// 0xE -> 3, 0xF -> 4. The SPM tokenizer and the BPE merge loop cut symbols with it.
inline size_t Utf8SeqLen(uint8_t first_byte) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[first_byte >> 4];
}

// Length of the well-formed UTF-8 sequence (RFC 3629: no overlong forms, surrogates or
// values above U+10FFFF) that starts text[i], 1 for ASCII; 0 when none does.
size_t WellFormedUtf8Len(std::string_view text, size_t i);

// Decodes `text` to codepoints without ever failing, with llama.cpp's rules:
//   - a byte that cannot start a sequence (0x80-0xBF, 0xF8-0xFF), and a lead byte whose
//     continuation bytes are missing or malformed (truncated sequence), becomes
//     U+FFFD and decoding resumes at the next byte;
//   - well-formed sequences are taken at face value: overlong forms decode to their
//     value (C0 AF -> U+002F '/'), UTF-8-encoded surrogates to D800-DFFF, and F4 90+ /
//     F5-F7 leads to values above U+10FFFF.
std::vector<uint32_t> DecodeUtf8(std::string_view text);

// Appends the UTF-8 form of `cp`; values above U+10FFFF are written as U+FFFD.
// Surrogates are written as their 3-byte form (so a decoded surrogate round-trips).
void AppendUtf8(uint32_t cp, std::string* out);
std::string CodepointsToUtf8(std::span<const uint32_t> cps);

enum class CharClass : uint8_t {
  kOther = 0,       // punctuation, symbols, marks, controls, unassigned, > U+10FFFF
  kLetter = 1,      // general category L* (Lu Ll Lt Lm Lo)
  kNumber = 2,      // general category N* (Nd Nl No)
  kWhitespace = 3,  // White_Space: \t \n \v \f \r, space, U+0085, U+00A0, U+1680,
                    // U+2000-200A, U+2028, U+2029, U+202F, U+205F, U+3000
};
CharClass Classify(uint32_t cp);
inline bool IsLetter(uint32_t cp) { return Classify(cp) == CharClass::kLetter; }
inline bool IsNumber(uint32_t cp) { return Classify(cp) == CharClass::kNumber; }
inline bool IsWhitespace(uint32_t cp) { return Classify(cp) == CharClass::kWhitespace; }

// The pre-tokenizer regexes of byte-level BPE vocabularies (tokenizer.ggml.pre):
//   kQwen2 : (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])
//            |[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+
//            |\s+(?!\S)|\s+
//   kLlama3: the same with \p{N}{1,3} in place of \p{N}.
enum class PreTokenizerRegex { kQwen2, kLlama3 };

// Splits `cps` into words, appending each word's length in codepoints to `lengths`
// (their sum is cps.size(); every length is > 0). At each position the first
// alternative that matches wins and quantifiers are greedy with backtracking, as in
// an ECMAScript/PCRE engine.
void PreTokenizeSplit(std::span<const uint32_t> cps, PreTokenizerRegex regex,
                      std::vector<size_t>* lengths);

// GPT-2 byte-level alphabet: bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF stand for
// themselves; the other 68 bytes (0x00-0x20, 0x7F-0xA0, 0xAD) map, in increasing
// order, to U+0100, U+0101, ... (so ' ' -> U+0120 'Ġ', '\n' -> U+010A 'Ċ').
uint32_t ByteToUnicode(uint8_t byte);
// The inverse; -1 when `cp` is not one of the 256 codepoints above.
int UnicodeToByte(uint32_t cp);

}  // namespace tierkv::unicode
