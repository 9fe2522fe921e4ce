// runtime/tokenizer_spm.cc
//
// SentencePiece-style BPE over a "llama" vocabulary, as llama.cpp runs it: spaces
// become "▁" (U+2581), the text is cut into UTF-8 characters, and adjacent symbols
// are merged while their concatenation is a vocabulary token, always taking the pair
// whose token has the highest score (ties: the leftmost pair). A symbol that is not a
// token at the end is written as its bytes, one <0xXX> token each (byte fallback).
// A priority queue with lazy deletion keeps this O(n log n) in the text length.
#include <algorithm>

#include "runtime/tokenizer.h"

namespace tierkv {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581 "▁"

struct Symbol {
  uint32_t start;  // byte offset in the escaped text
  uint32_t n;      // bytes; 0 once merged into its left neighbour
  int32_t prev;
  int32_t next;    // -1 at the ends
};

struct Bigram {
  float score;
  int32_t left;
  int32_t right;
  uint32_t size;  // bytes of left + right when queued; a mismatch later means stale
};

// Heap order: the top is the highest score, then the smallest left index.
bool Worse(const Bigram& a, const Bigram& b) {
  return a.score < b.score || (a.score == b.score && a.left > b.left);
}

}  // namespace

void Tokenizer::EncodeSpm(std::string_view raw, bool add_prefix,
                          std::vector<int32_t>* out) const {
  std::string text;
  text.reserve(raw.size() + raw.size() / 2 + 3);
  if (add_prefix) text += kSpaceMark;
  for (char c : raw) {
    if (c == ' ') {
      text += kSpaceMark;
    } else {
      text.push_back(c);
    }
  }
  if (text.empty()) return;

  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (size_t offset = 0; offset < text.size();) {
    const size_t len = std::min(unicode::Utf8SeqLen(static_cast<uint8_t>(text[offset])),
                                text.size() - offset);
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({static_cast<uint32_t>(offset), static_cast<uint32_t>(len), index - 1,
                       offset + len == text.size() ? -1 : index + 1});
    offset += len;
  }

  std::vector<Bigram> heap;
  heap.reserve(symbols.size());
  auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const std::string_view piece(text.data() + symbols[left].start,
                                 symbols[left].n + symbols[right].n);
    const int32_t id = Lookup(piece);
    if (id < 0) return;
    heap.push_back({tokens_[id].score, left, right, static_cast<uint32_t>(piece.size())});
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

  for (int32_t i = 0; i != -1; i = symbols[i].next) {
    const std::string_view piece(text.data() + symbols[i].start, symbols[i].n);
    const int32_t id = Lookup(piece);
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    for (char c : piece) {
      const int32_t byte_id = byte_tokens_[static_cast<uint8_t>(c)];
      if (byte_id >= 0) out->push_back(byte_id);
    }
  }
}

}  // namespace tierkv
