// runtime/tokenizer.h
//
// Text <-> token ids, the way llama.cpp does it for the vocabularies a GGUF file
// carries (tokenizer.ggml.*): SentencePiece-style BPE ("llama": merges by token score,
// byte fallback to <0xXX> tokens, "▁" for spaces) and byte-level BPE ("gpt2": a
// pre-tokenizer regex, then merges by rank from tokenizer.ggml.merges). A third kind,
// ByteLevel(), serves builtin models that have no vocabulary. docs/tokenizers.md
// describes every behaviour, including what invalid UTF-8 produces.
//
// Thread-safety: immutable after construction; every const method may be called from
// any thread at once. A Tokenizer owns copies of the vocabulary strings, so it may
// outlive the GgufFile it was read from.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "memory/status.h"
#include "runtime/unicode.h"

namespace tierkv {

class GgufFile;

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // <s>, </s>, <|im_end|>: matched in text only with parse_special
  kUserDefined = 4,  // <think>: always matched in text, rendered even without specials
  kUnused = 5,       // [PAD151669]: renders as nothing
  kByte = 6,         // <0x0A> in SentencePiece vocabularies
};

enum class TokenizerKind {
  kSpm,        // tokenizer.ggml.model "llama"
  kBpe,        // tokenizer.ggml.model "gpt2"
  kByteLevel,  // Tokenizer::ByteLevel(): one id per byte, no merges
};

class Tokenizer {
 public:
  // A vocabulary given field by field: what FromGguf reads, and what tests and builtin
  // models can build by hand. Optional fields follow llama.cpp's defaults.
  struct Vocab {
    std::string model;                  // "llama" or "gpt2"
    std::string pre;                    // gpt2: "qwen2", "llama-bpe", ... (docs/tokenizers.md)
    std::vector<std::string> tokens;    // id -> text; "" becomes "[EMPTY_<id>]"
    std::vector<float> scores;          // empty: all 0 (SPM merges by these)
    std::vector<int32_t> token_types;   // empty: all kNormal
    std::vector<std::string> merges;    // gpt2: "left right", rank = index
    // Absent: the model's default (llama: bos 1, eos 2, unk 0; gpt2: bos = eos = 11),
    // or for eot/eom/fim_* the token found by its text (<|im_end|>, <|fim_pad|>, ...).
    std::optional<int32_t> bos, eos, unk, pad, eot, eom, fim_pad, fim_rep, fim_sep;
    std::optional<bool> add_bos, add_eos, add_space_prefix;
  };

  // Reads tokenizer.ggml.* from `gguf`; model "none" (or llama.cpp's "no_vocab") is
  // ByteLevel(rows of token_embd.weight). Errors (one line, "PATH: tokenizer: ..."; no
  // path after GgufFile::Parse): missing or mistyped keys, array lengths that disagree
  // (with each other, or more tokens than token_embd.weight has rows), and an unsupported
  // tokenizer.ggml.model or tokenizer.ggml.pre (kUnsupported, naming the value and
  // listing what is supported).
  static Result<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& gguf);
  static Result<std::unique_ptr<Tokenizer>> FromVocab(Vocab vocab);

  // For builtin models without a vocabulary: ids 0..255 are the bytes 0x00..0xFF
  // (type kByte, text "<0xXX>"); when n_vocab >= 258, id 256 is BOS "<s>" and id 257
  // is EOS "</s>" (both kControl; add_special adds BOS); ids 258.. are kUnused
  // "<unused_N>" and render as nothing. n_vocab below 256 is raised to 256. Encode
  // maps each byte of the text to its id, so Decode(Encode(x)) == x for any bytes.
  static std::unique_ptr<Tokenizer> ByteLevel(int n_vocab);

  // add_special: BOS first when the vocabulary says so (add_bos: llama-spm yes, qwen3
  // no) and EOS last when add_eos. parse_special: control and unknown token texts in
  // `text` (<|im_end|>, <s>) become their ids; user-defined ones (<think>) are matched
  // even when it is false, as llama.cpp does. Never fails: invalid UTF-8 is handled
  // as docs/tokenizers.md says.
  std::vector<int32_t> Encode(std::string_view text, bool add_special, bool parse_special) const;

  // The bytes of one token, as llama_token_to_piece gives them: SPM "▁" -> ' ',
  // <0xXX> -> that byte; BPE byte-level decoding; control/unknown tokens -> their text
  // when render_special, else nothing; user-defined -> their text; unused, undefined
  // and out-of-range ids -> nothing.
  std::string TokenToPiece(int32_t id, bool render_special = true) const;

  struct DecodeOptions {
    bool render_special = true;  // as TokenToPiece
    // Vocabularies with add_space_prefix (llama-spm): drop one ' ' from the start of
    // the first non-empty piece, undoing the space Encode put in front of the text.
    bool remove_space_prefix = false;
  };
  // Concatenated pieces. With the defaults, Decode(ids) == concatenation of
  // TokenToPiece(id) (what a streaming printer shows). Round trips:
  //   BPE, byte level: Decode(Encode(x, false, false)) == x for valid UTF-8 x;
  //   SPM:             Decode(Encode(x, false, false)) == " " + x for non-empty x,
  //                    and == x with {.render_special = false, .remove_space_prefix =
  //                    true}, also when add_special put BOS in front.
  std::string Decode(const std::vector<int32_t>& ids) const;
  std::string Decode(const std::vector<int32_t>& ids, const DecodeOptions& options) const;

  int32_t bos() const { return bos_; }  // -1 when the vocabulary has none
  int32_t eos() const { return eos_; }
  int32_t unk() const { return unk_; }
  int32_t pad() const { return pad_; }
  int n_vocab() const { return static_cast<int>(tokens_.size()); }
  // End of generation: EOS, EOT, EOM, FIM pad/repo/file-separator tokens, and tokens
  // whose text is one llama.cpp treats as EOG (<|im_end|>, <|endoftext|>, <|eot_id|>, ...).
  bool IsEog(int32_t id) const;
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  bool add_space_prefix() const { return add_space_prefix_; }
  TokenizerKind kind() const { return kind_; }
  const std::string& model() const { return model_; }  // "llama", "gpt2", "byte"
  const std::string& pre() const { return pre_; }

  // REQUIRES: 0 <= id < n_vocab().
  std::string_view token_text(int32_t id) const { return tokens_[id].text; }
  // The effective type: tokens recognised by their text (EOG, FIM) read as kControl.
  TokenType token_type(int32_t id) const { return tokens_[id].type; }
  float token_score(int32_t id) const { return tokens_[id].score; }
  // Exact vocabulary lookup by text; when texts repeat, the highest id wins (llama.cpp).
  std::optional<int32_t> TokenId(std::string_view text) const;

 private:
  struct TokenData {
    std::string text;
    float score = 0.0f;
    TokenType type = TokenType::kNormal;
  };
  // A piece of the input after special tokens were cut out: token >= 0 is one of
  // them, else [offset, offset + length) of the text.
  struct Fragment {
    int32_t token;
    size_t offset;
    size_t length;
  };
  struct BpeScratch;  // per-call buffers of the merge loop (tokenizer_bpe.cc)
  struct PairHash {
    size_t operator()(const std::pair<std::string_view, std::string_view>& p) const;
  };

  Tokenizer() = default;
  static Result<std::unique_ptr<Tokenizer>> FromGgufMetadata(const GgufFile& gguf);  // FromGguf, without the path
  Status Init(Vocab vocab);
  // token_ids_, byte_tokens_, special and end-of-generation tokens. REQUIRES: tokens_
  // and the special ids set.
  void BuildIndexes(const Vocab* vocab);

  std::vector<Fragment> Partition(std::string_view text, bool parse_special) const;
  int32_t Lookup(std::string_view text) const;  // -1 when absent
  // tokenizer_spm.cc
  void EncodeSpm(std::string_view text, bool add_prefix, std::vector<int32_t>* out) const;
  // tokenizer_bpe.cc
  void EncodeBpe(std::string_view text, std::vector<int32_t>* out) const;
  void EncodeBpeWord(std::string_view word, BpeScratch* scratch, std::vector<int32_t>* out) const;
  int32_t MergeRank(std::string_view left, std::string_view right) const;  // -1: none
  std::string BpePiece(const std::string& text) const;

  TokenizerKind kind_ = TokenizerKind::kSpm;
  std::string model_;
  std::string pre_;
  unicode::PreTokenizerRegex pre_regex_ = unicode::PreTokenizerRegex::kQwen2;
  bool ignore_merges_ = false;  // llama3: a word that is a token is taken whole

  std::vector<TokenData> tokens_;
  // Views into tokens_[i].text; tokens_ is never resized after Init.
  std::unordered_map<std::string_view, int32_t> token_ids_;
  std::string merge_pool_;  // owns the texts merge_ranks_ views
  std::unordered_map<std::pair<std::string_view, std::string_view>, int32_t, PairHash>
      merge_ranks_;
  int32_t byte_tokens_[256] = {};   // SPM byte fallback: <0xXX> (or the raw byte), else unk/-1
  std::vector<int32_t> special_tokens_;  // control/user-defined/unknown, longest text first
  std::vector<int32_t> eog_tokens_;      // sorted

  int32_t bos_ = -1;
  int32_t eos_ = -1;
  int32_t unk_ = -1;
  int32_t pad_ = -1;
  int32_t eot_ = -1;
  int32_t eom_ = -1;
  int32_t fim_pad_ = -1;
  int32_t fim_rep_ = -1;
  int32_t fim_sep_ = -1;
  bool add_bos_ = false;
  bool add_eos_ = false;
  bool add_space_prefix_ = false;
};

}  // namespace tierkv
