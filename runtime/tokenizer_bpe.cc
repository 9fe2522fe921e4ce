// runtime/tokenizer_bpe.cc
//
// Byte-level BPE over a "gpt2" vocabulary, as llama.cpp runs it:
//   1. the text is decoded to codepoints (invalid UTF-8 -> U+FFFD, see unicode.h) and
//      split into words by the pre-tokenizer regex (unicode::PreTokenizeSplit);
//   2. each word is re-encoded to UTF-8 and every byte is replaced by its GPT-2
//      alphabet character (' ' -> 'Ġ'), the form the vocabulary and merges use;
//   3. within a word, adjacent symbols are merged by the lowest merge rank (ties: the
//      leftmost pair) until no listed pair is left; a priority queue with lazy
//      deletion makes this O(k log k) for a word of k bytes;
//   4. each final symbol is its token (a symbol that is no token, which a consistent
//      vocabulary never produces, falls back to single-byte tokens where they exist).
// llama3's pre-tokenizer also takes a word whole when it is a token (ignore_merges).
#include <algorithm>
#include <array>

#include "runtime/tokenizer.h"

namespace tierkv {
namespace {

struct Symbol {
  uint32_t start;
  uint32_t n;
  int32_t prev;
  int32_t next;
};

struct Bigram {
  int32_t rank;
  int32_t left;
  int32_t right;
  uint32_t size;
};

// Heap order: the top is the lowest rank, then the smallest left index.
bool Worse(const Bigram& a, const Bigram& b) {
  return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
}

// The UTF-8 of each byte's GPT-2 alphabet character.
struct MappedBytes {
  std::array<std::string, 256> utf8;
  MappedBytes() {
    for (int b = 0; b < 256; ++b) unicode::AppendUtf8(unicode::ByteToUnicode(b), &utf8[b]);
  }
};
const MappedBytes& Mapped() {
  static const MappedBytes mapped;
  return mapped;
}

}  // namespace

struct Tokenizer::BpeScratch {
  std::vector<Symbol> symbols;
  std::vector<Bigram> heap;
};

int32_t Tokenizer::MergeRank(std::string_view left, std::string_view right) const {
  auto it = merge_ranks_.find(std::make_pair(left, right));
  return it == merge_ranks_.end() ? -1 : it->second;
}

void Tokenizer::EncodeBpe(std::string_view text, std::vector<int32_t>* out) const {
  const std::vector<uint32_t> cps = unicode::DecodeUtf8(text);
  std::vector<size_t> lengths;
  unicode::PreTokenizeSplit(cps, pre_regex_, &lengths);
  const MappedBytes& mapped = Mapped();
  BpeScratch scratch;
  std::string utf8;
  std::string word;
  size_t pos = 0;
  for (size_t len : lengths) {
    utf8.clear();
    for (size_t k = pos; k < pos + len; ++k) unicode::AppendUtf8(cps[k], &utf8);
    pos += len;
    word.clear();
    for (char c : utf8) word += mapped.utf8[static_cast<uint8_t>(c)];
    EncodeBpeWord(word, &scratch, out);
  }
}

void Tokenizer::EncodeBpeWord(std::string_view word, BpeScratch* scratch,
                              std::vector<int32_t>* out) const {
  if (ignore_merges_) {
    const int32_t id = Lookup(word);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
  }
  std::vector<Symbol>& symbols = scratch->symbols;
  std::vector<Bigram>& heap = scratch->heap;
  symbols.clear();
  heap.clear();
  for (size_t offset = 0; offset < word.size();) {
    const size_t len = std::min(unicode::Utf8SeqLen(static_cast<uint8_t>(word[offset])),
                                word.size() - offset);
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({static_cast<uint32_t>(offset), static_cast<uint32_t>(len), index - 1,
                       offset + len == word.size() ? -1 : index + 1});
    offset += len;
  }
  auto view = [&](int32_t i) {
    return std::string_view(word.data() + symbols[i].start, symbols[i].n);
  };
  auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const int32_t rank = MergeRank(view(left), view(right));
    if (rank < 0) return;
    heap.push_back({rank, left, right, symbols[left].n + symbols[right].n});
    std::push_heap(heap.begin(), heap.end(), Worse);
  };
  for (size_t i = 1; i < symbols.size(); ++i) {
    try_add(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));
  }
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), Worse);
    const Bigram b = heap.back();
    heap.pop_back();
    Symbol& left = symbols[b.left];
    Symbol& right = symbols[b.right];
    if (left.n == 0 || right.n == 0 || left.n + right.n != b.size) continue;  // stale
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = b.left;
    try_add(left.prev, b.left);
    try_add(b.left, left.next);
  }
  if (symbols.empty()) return;
  for (int32_t i = 0; i != -1; i = symbols[i].next) {
    const std::string_view piece = view(i);
    const int32_t id = Lookup(piece);
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    for (size_t k = 0; k < piece.size(); ++k) {
      const int32_t byte_id = Lookup(piece.substr(k, 1));
      if (byte_id >= 0) out->push_back(byte_id);
    }
  }
}

std::string Tokenizer::BpePiece(const std::string& text) const {
  // Byte-level decoding; a character outside the GPT-2 alphabet is reported inline
  // the way llama.cpp does: [UNK_BYTE_0x<its UTF-8 in hex><token text>].
  std::string piece;
  piece.reserve(text.size());
  for (uint32_t cp : unicode::DecodeUtf8(text)) {
    const int b = unicode::UnicodeToByte(cp);
    if (b >= 0) {
      piece.push_back(static_cast<char>(b));
      continue;
    }
    std::string utf8;
    unicode::AppendUtf8(cp, &utf8);
    piece += "[UNK_BYTE_0x";
    static constexpr char kHex[] = "0123456789abcdef";
    for (char c : utf8) {
      piece.push_back(kHex[static_cast<uint8_t>(c) >> 4]);
      piece.push_back(kHex[static_cast<uint8_t>(c) & 15]);
    }
    piece += text;
    piece += "]";
  }
  return piece;
}

}  // namespace tierkv
