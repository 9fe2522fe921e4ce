// runtime/tokenizer.cc
//
// Loading a vocabulary (from GGUF metadata or by hand), special tokens, Encode's
// outer loop, and the way back from ids to bytes. The merge loops live in
// tokenizer_spm.cc and tokenizer_bpe.cc.
#include "runtime/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <functional>

#include <spdlog/spdlog.h>

#include "runtime/gguf.h"

namespace tierkv {
namespace {

constexpr std::string_view kSupportedModels = "llama, gpt2";
constexpr std::string_view kSupportedPre = "qwen2, deepseek-r1-qwen, llama-bpe, llama3, llama-v3";

// Texts by which llama.cpp recognises special tokens whose ids the metadata does not
// give. Any token so found is treated as a control token.
constexpr std::string_view kEotTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>", "<EOT>", "_<EOT>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",  // <｜end▁of▁sentence｜>
    "<end_of_utterance>"};
constexpr std::string_view kEomTexts[] = {"<|eom_id|>"};
constexpr std::string_view kFimPreTexts[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
                                             "<PRE>", "\xe2\x96\x81<PRE>"};
constexpr std::string_view kFimSufTexts[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                                             "<SUF>", "\xe2\x96\x81<SUF>"};
constexpr std::string_view kFimMidTexts[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
                                             "<MID>", "\xe2\x96\x81<MID>"};
constexpr std::string_view kFimPadTexts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"};
constexpr std::string_view kFimRepTexts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                             "<REPO>", "<reponame>"};
constexpr std::string_view kFimSepTexts[] = {"<|file_sep|>"};
// Every token with one of these texts ends generation.
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>"};

std::string Quote(std::string_view s) {
  std::string out(1, '\'');
  out += EscapeGgufString(s, 64);
  out += '\'';
  return out;
}

Status Err(StatusCode code, const std::string& message) {
  return Status(code, "tokenizer: " + message);
}

bool IsSpecialType(TokenType t) {
  return t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown;
}

// "<0x0A>" -> 0x0A; -1 when the text is not of that form.
int ParseByteToken(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (char c : text.substr(3, 2)) {
    int d = (c >= '0' && c <= '9') ? c - '0'
            : (c >= 'A' && c <= 'F') ? c - 'A' + 10
            : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                     : -1;
    if (d < 0) return -1;
    value = value * 16 + d;
  }
  return value;
}

// Reads an optional token id key; ids outside the vocabulary are ignored (the
// default stays), as llama.cpp does.
Status ReadId(const GgufFile& gguf, std::string_view key, std::optional<int32_t>* out) {
  auto v = gguf.GetOptional<int64_t>(key);
  if (!v.ok()) return v.status().Annotate("tokenizer");
  if (v->has_value()) {
    int64_t id = **v;
    if (id >= 0 && id <= INT32_MAX) *out = static_cast<int32_t>(id);
  }
  return Status::Ok();
}

Status ReadBool(const GgufFile& gguf, std::string_view key, std::optional<bool>* out) {
  auto v = gguf.GetOptional<bool>(key);
  if (!v.ok()) return v.status().Annotate("tokenizer");
  *out = *v;
  return Status::Ok();
}

}  // namespace

size_t Tokenizer::PairHash::operator()(
    const std::pair<std::string_view, std::string_view>& p) const {
  const size_t a = std::hash<std::string_view>()(p.first);
  const size_t b = std::hash<std::string_view>()(p.second);
  return a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2));
}

// Errors name the file (after Parse, a file has no path; builtin models, their name).
Result<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& gguf) {
  auto t = FromGgufMetadata(gguf);
  if (!t.ok() && !gguf.path().empty()) return t.status().Annotate(gguf.path());
  return t;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromGgufMetadata(const GgufFile& gguf) {
  Vocab v;
  auto model = gguf.GetString("tokenizer.ggml.model");
  if (!model.ok()) return model.status().Annotate("tokenizer");
  v.model = std::string(*model);
  if (v.model == "none" || v.model == "no_vocab") {
    // No vocabulary (builtin models): one id per byte, sized to the embedding rows.
    // Only rows the file holds count: an empty tensor ([64, 2^30, 0]) takes no bytes, and
    // each id costs a token text here. kMaxByteLevelVocab is 100x the largest real
    // vocabularies (~150K).
    constexpr int64_t kMaxByteLevelVocab = int64_t{1} << 24;
    const GgufTensor* embd = gguf.FindTensor("token_embd.weight");
    if (embd == nullptr || embd->n_dims < 2 || embd->n_bytes == 0 || embd->ne[2] != 1 || embd->ne[3] != 1 ||
        embd->ne[1] > kMaxByteLevelVocab) {
      return Status::InvalidArgument("tokenizer: model '" + v.model +
                                     "' needs a token_embd.weight of [n_embd, n_vocab] with 1 <= n_vocab <= " +
                                     std::to_string(kMaxByteLevelVocab) + " to size the vocabulary");
    }
    return ByteLevel(static_cast<int>(embd->ne[1]));
  }
  if (gguf.Has("tokenizer.ggml.pre")) {
    auto pre = gguf.GetString("tokenizer.ggml.pre");
    if (!pre.ok()) return pre.status().Annotate("tokenizer");
    v.pre = std::string(*pre);
  }
  auto tokens = gguf.GetArrayString("tokenizer.ggml.tokens");
  if (!tokens.ok()) return tokens.status().Annotate("tokenizer");
  // Checked before the texts are copied: ids past token_embd's rows could never run (a
  // file without token_embd, vocabulary only, is bounded by its size alone).
  if (const GgufTensor* embd = gguf.FindTensor("token_embd.weight");
      embd != nullptr && tokens->size() > static_cast<uint64_t>(embd->ne[1])) {
    return Err(StatusCode::kInvalidArgument, "tokenizer.ggml.tokens has " + std::to_string(tokens->size()) +
                                                 " entries but token_embd.weight has only " +
                                                 std::to_string(embd->ne[1]) + " rows");
  }
  v.tokens.assign(tokens->begin(), tokens->end());
  if (gguf.Has("tokenizer.ggml.scores")) {
    auto scores = gguf.GetArrayF32("tokenizer.ggml.scores");
    if (!scores.ok()) return scores.status().Annotate("tokenizer");
    v.scores = std::move(*scores);
  }
  if (gguf.Has("tokenizer.ggml.token_type")) {
    auto types = gguf.GetArrayI32("tokenizer.ggml.token_type");
    if (!types.ok()) return types.status().Annotate("tokenizer");
    v.token_types = std::move(*types);
  }
  if (gguf.Has("tokenizer.ggml.merges")) {
    auto merges = gguf.GetArrayString("tokenizer.ggml.merges");
    if (!merges.ok()) return merges.status().Annotate("tokenizer");
    v.merges.assign(merges->begin(), merges->end());
  } else if (v.model == "gpt2") {
    return Err(StatusCode::kNotFound, "tokenizer.ggml.merges is missing (needed by gpt2)");
  }
  const std::pair<const char*, std::optional<int32_t>*> ids[] = {
      {"tokenizer.ggml.bos_token_id", &v.bos},
      {"tokenizer.ggml.eos_token_id", &v.eos},
      {"tokenizer.ggml.unknown_token_id", &v.unk},
      {"tokenizer.ggml.padding_token_id", &v.pad},
      {"tokenizer.ggml.eot_token_id", &v.eot},
      {"tokenizer.ggml.eom_token_id", &v.eom},
      {"tokenizer.ggml.fim_pad_token_id", &v.fim_pad},
      {"tokenizer.ggml.fim_rep_token_id", &v.fim_rep},
      {"tokenizer.ggml.fim_sep_token_id", &v.fim_sep},
  };
  for (const auto& [key, out] : ids) TIERKV_RETURN_IF_ERROR(ReadId(gguf, key, out));
  TIERKV_RETURN_IF_ERROR(ReadBool(gguf, "tokenizer.ggml.add_bos_token", &v.add_bos));
  TIERKV_RETURN_IF_ERROR(ReadBool(gguf, "tokenizer.ggml.add_eos_token", &v.add_eos));
  TIERKV_RETURN_IF_ERROR(ReadBool(gguf, "tokenizer.ggml.add_space_prefix", &v.add_space_prefix));
  return FromVocab(std::move(v));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromVocab(Vocab vocab) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  TIERKV_RETURN_IF_ERROR(t->Init(std::move(vocab)));
  return t;
}

Status Tokenizer::Init(Vocab v) {
  model_ = v.model;
  pre_ = v.pre;
  if (v.model == "llama") {
    kind_ = TokenizerKind::kSpm;
  } else if (v.model == "gpt2") {
    kind_ = TokenizerKind::kBpe;
    if (v.pre == "qwen2" || v.pre == "deepseek-r1-qwen") {
      pre_regex_ = unicode::PreTokenizerRegex::kQwen2;
    } else if (v.pre == "llama-bpe" || v.pre == "llama3" || v.pre == "llama-v3") {
      pre_regex_ = unicode::PreTokenizerRegex::kLlama3;
      ignore_merges_ = true;
    } else {
      return Err(StatusCode::kUnsupported,
                 "unsupported tokenizer.ggml.pre " + Quote(v.pre) +
                     " for tokenizer.ggml.model 'gpt2' (supported: " + std::string(kSupportedPre) +
                     ")");
    }
  } else {
    return Err(StatusCode::kUnsupported, "unsupported tokenizer.ggml.model " + Quote(v.model) +
                                             " (supported: " + std::string(kSupportedModels) + ")");
  }

  const size_t n = v.tokens.size();
  if (n == 0) return Err(StatusCode::kInvalidArgument, "tokenizer.ggml.tokens is empty");
  if (n > static_cast<size_t>(INT32_MAX)) {
    return Err(StatusCode::kInvalidArgument, "tokenizer.ggml.tokens has too many entries");
  }
  if (!v.scores.empty() && v.scores.size() != n) {
    return Err(StatusCode::kInvalidArgument,
               "tokenizer.ggml.scores has " + std::to_string(v.scores.size()) +
                   " entries for " + std::to_string(n) + " tokens");
  }
  if (!v.token_types.empty() && v.token_types.size() != n) {
    return Err(StatusCode::kInvalidArgument,
               "tokenizer.ggml.token_type has " + std::to_string(v.token_types.size()) +
                   " entries for " + std::to_string(n) + " tokens");
  }
  tokens_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    TokenData& t = tokens_[i];
    t.text = std::move(v.tokens[i]);
    if (t.text.empty()) t.text = "[EMPTY_" + std::to_string(i) + "]";
    t.score = v.scores.empty() ? 0.0f : v.scores[i];
    const int32_t type = v.token_types.empty() ? 1 : v.token_types[i];
    t.type = (type >= 0 && type <= 6) ? static_cast<TokenType>(type) : TokenType::kUndefined;
  }

  if (kind_ == TokenizerKind::kBpe) {
    // "left right", split at the first space after the first byte (so a left part
    // may itself start with a space); rank = index; a repeated pair keeps its first
    // rank; an entry without a separator is skipped.
    size_t total = 0;
    for (const auto& m : v.merges) total += m.size();
    merge_pool_.reserve(total);
    for (const auto& m : v.merges) merge_pool_ += m;
    merge_ranks_.reserve(v.merges.size());
    size_t offset = 0;
    for (size_t rank = 0; rank < v.merges.size(); ++rank) {
      const std::string_view m(merge_pool_.data() + offset, v.merges[rank].size());
      offset += m.size();
      const size_t space = m.find(' ', 1);
      if (space == std::string_view::npos) continue;
      merge_ranks_.emplace(std::make_pair(m.substr(0, space), m.substr(space + 1)),
                           static_cast<int32_t>(rank));
    }
  }

  auto in_range = [n](std::optional<int32_t> id) {
    return id.has_value() && *id >= 0 && static_cast<size_t>(*id) < n;
  };
  // An id outside the vocabulary is replaced by the default, as llama.cpp does (it loads
  // such files), with a warning naming it.
  auto pick = [&](const char* what, std::optional<int32_t> given, int32_t fallback) -> int32_t {
    if (in_range(given)) return *given;
    const int32_t id = (fallback >= 0 && static_cast<size_t>(fallback) < n) ? fallback : -1;
    if (given.has_value()) {
      spdlog::warn("tokenizer: {} token id {} is outside the vocabulary of {} tokens; using {}", what, *given, n,
                   id >= 0 ? std::to_string(id) : std::string("none"));
    }
    return id;
  };
  if (kind_ == TokenizerKind::kSpm) {
    bos_ = pick("bos", v.bos, 1);
    eos_ = pick("eos", v.eos, 2);
    unk_ = pick("unknown", v.unk, 0);
    add_bos_ = v.add_bos.value_or(true);
    add_eos_ = v.add_eos.value_or(false);
    add_space_prefix_ = v.add_space_prefix.value_or(true);
  } else {
    bos_ = pick("bos", v.bos, 11);
    eos_ = pick("eos", v.eos, 11);
    unk_ = pick("unknown", v.unk, -1);
    add_bos_ = v.add_bos.value_or(pre_regex_ == unicode::PreTokenizerRegex::kLlama3);
    add_eos_ = v.add_eos.value_or(false);
    add_space_prefix_ = false;  // byte-level vocabularies encode spaces themselves
  }
  pad_ = pick("padding", v.pad, -1);
  eot_ = pick("eot", v.eot, -1);
  eom_ = pick("eom", v.eom, -1);
  fim_pad_ = pick("fim_pad", v.fim_pad, -1);
  fim_rep_ = pick("fim_rep", v.fim_rep, -1);
  fim_sep_ = pick("fim_sep", v.fim_sep, -1);
  BuildIndexes(&v);
  return Status::Ok();
}

void Tokenizer::BuildIndexes(const Vocab* vocab) {
  const int32_t n = static_cast<int32_t>(tokens_.size());
  token_ids_.clear();
  token_ids_.reserve(tokens_.size());
  for (int32_t i = 0; i < n; ++i) token_ids_[tokens_[i].text] = i;  // last one wins

  // Special tokens the metadata did not name, found by their text; such a token is
  // treated as a control token whatever its type says.
  auto find_by_text = [&](std::span<const std::string_view> texts, int32_t* id) {
    if (*id >= 0) return;
    for (std::string_view text : texts) {
      const int32_t found = Lookup(text);
      if (found < 0) continue;
      *id = found;
      tokens_[found].type = TokenType::kControl;
      return;
    }
  };
  if (vocab != nullptr) {
    int32_t fim_pre = -1, fim_suf = -1, fim_mid = -1;
    find_by_text(kEotTexts, &eot_);
    find_by_text(kEomTexts, &eom_);
    find_by_text(kFimPreTexts, &fim_pre);
    find_by_text(kFimSufTexts, &fim_suf);
    find_by_text(kFimMidTexts, &fim_mid);
    find_by_text(kFimPadTexts, &fim_pad_);
    find_by_text(kFimRepTexts, &fim_rep_);
    find_by_text(kFimSepTexts, &fim_sep_);
  }

  eog_tokens_.clear();
  for (int32_t id : {eos_, eot_, eom_, fim_pad_, fim_rep_, fim_sep_}) {
    if (id >= 0) eog_tokens_.push_back(id);
  }
  if (vocab != nullptr) {
    for (std::string_view text : kEogTexts) {
      const int32_t id = Lookup(text);
      if (id < 0) continue;
      eog_tokens_.push_back(id);
      tokens_[id].type = TokenType::kControl;
    }
  }
  std::sort(eog_tokens_.begin(), eog_tokens_.end());
  eog_tokens_.erase(std::unique(eog_tokens_.begin(), eog_tokens_.end()), eog_tokens_.end());

  special_tokens_.clear();
  for (int32_t i = 0; i < n; ++i) {
    if (IsSpecialType(tokens_[i].type)) special_tokens_.push_back(i);
  }
  std::stable_sort(special_tokens_.begin(), special_tokens_.end(), [&](int32_t a, int32_t b) {
    return tokens_[a].text.size() > tokens_[b].text.size();
  });

  // SPM byte fallback: the <0xXX> token, else a token whose text is the byte itself,
  // else the unknown token (or nothing).
  for (int b = 0; b < 256; ++b) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
    int32_t id = Lookup(hex);
    if (id < 0) {
      const char raw = static_cast<char>(b);
      id = Lookup(std::string_view(&raw, 1));
    }
    byte_tokens_[b] = id >= 0 ? id : unk_;
  }
}

std::unique_ptr<Tokenizer> Tokenizer::ByteLevel(int n_vocab) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  const int n = std::max(n_vocab, 256);
  t->kind_ = TokenizerKind::kByteLevel;
  t->model_ = "byte";
  t->tokens_.resize(n);
  for (int i = 0; i < n; ++i) {
    TokenData& d = t->tokens_[i];
    if (i < 256) {
      char hex[16];
      std::snprintf(hex, sizeof(hex), "<0x%02X>", i);
      d.text = hex;
      d.type = TokenType::kByte;
    } else if (i == 256 && n >= 258) {
      d.text = "<s>";
      d.type = TokenType::kControl;
    } else if (i == 257 && n >= 258) {
      d.text = "</s>";
      d.type = TokenType::kControl;
    } else {
      d.text = "<unused_" + std::to_string(i) + ">";
      d.type = TokenType::kUnused;
    }
  }
  if (n >= 258) {
    t->bos_ = 256;
    t->eos_ = 257;
    t->add_bos_ = true;
  }
  t->BuildIndexes(nullptr);
  return t;
}

int32_t Tokenizer::Lookup(std::string_view text) const {
  auto it = token_ids_.find(text);
  return it == token_ids_.end() ? -1 : it->second;
}

std::optional<int32_t> Tokenizer::TokenId(std::string_view text) const {
  const int32_t id = Lookup(text);
  if (id < 0) return std::nullopt;
  return id;
}

bool Tokenizer::IsEog(int32_t id) const {
  return std::binary_search(eog_tokens_.begin(), eog_tokens_.end(), id);
}

std::vector<Tokenizer::Fragment> Tokenizer::Partition(std::string_view text,
                                                      bool parse_special) const {
  std::vector<Fragment> fragments;
  if (text.empty()) return fragments;
  fragments.push_back({-1, 0, text.size()});
  std::vector<Fragment> next;
  // Longest special texts first, so "<|im_end|>" is cut before a shorter token that
  // is a part of it; each cut is leftmost-first and non-overlapping.
  for (int32_t id : special_tokens_) {
    const TokenData& special = tokens_[id];
    if (!parse_special && special.type != TokenType::kUserDefined) continue;
    const std::string_view needle = special.text;
    bool found_any = false;
    next.clear();
    for (const Fragment& f : fragments) {
      if (f.token >= 0 || f.length < needle.size()) {
        next.push_back(f);
        continue;
      }
      const std::string_view piece = text.substr(f.offset, f.length);
      size_t start = 0;
      for (size_t at = piece.find(needle); at != std::string_view::npos;
           at = piece.find(needle, start)) {
        found_any = true;
        if (at > start) next.push_back({-1, f.offset + start, at - start});
        next.push_back({id, 0, 0});
        start = at + needle.size();
      }
      if (start < piece.size()) next.push_back({-1, f.offset + start, piece.size() - start});
    }
    if (found_any) fragments.swap(next);
  }
  return fragments;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special && add_bos_ && bos_ >= 0) out.push_back(bos_);
  // SPM puts "▁" before the text, and again after every special token.
  bool after_special = true;
  for (const Fragment& f : Partition(text, parse_special)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      after_special = true;
      continue;
    }
    const std::string_view piece = text.substr(f.offset, f.length);
    switch (kind_) {
      case TokenizerKind::kSpm:
        EncodeSpm(piece, add_space_prefix_ && after_special, &out);
        break;
      case TokenizerKind::kBpe:
        EncodeBpe(piece, &out);
        break;
      case TokenizerKind::kByteLevel:
        for (char c : piece) out.push_back(static_cast<uint8_t>(c));
        break;
    }
    after_special = false;
  }
  if (add_special && add_eos_ && eos_ >= 0) out.push_back(eos_);
  return out;
}

std::string Tokenizer::TokenToPiece(int32_t id, bool render_special) const {
  if (id < 0 || static_cast<size_t>(id) >= tokens_.size()) return {};
  const TokenData& t = tokens_[id];
  switch (t.type) {
    case TokenType::kControl:
    case TokenType::kUnknown:
      return render_special ? t.text : std::string();
    case TokenType::kUserDefined:
      return t.text;
    case TokenType::kNormal:
      if (kind_ == TokenizerKind::kBpe) return BpePiece(t.text);
      if (kind_ == TokenizerKind::kSpm) {
        std::string piece;
        piece.reserve(t.text.size());
        const std::string_view text = t.text;
        for (size_t i = 0; i < text.size();) {
          if (text.compare(i, 3, "\xE2\x96\x81") == 0) {
            piece.push_back(' ');
            i += 3;
          } else {
            piece.push_back(text[i++]);
          }
        }
        return piece;
      }
      return t.text;
    case TokenType::kByte: {
      const int b = ParseByteToken(t.text);
      return b >= 0 ? std::string(1, static_cast<char>(b)) : std::string();
    }
    case TokenType::kUnused:
    case TokenType::kUndefined:
      return {};
  }
  return {};
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  return Decode(ids, DecodeOptions());
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids,
                              const DecodeOptions& options) const {
  std::string out;
  bool strip = options.remove_space_prefix && add_space_prefix_;
  for (int32_t id : ids) {
    std::string piece = TokenToPiece(id, options.render_special);
    if (strip && !piece.empty()) {
      if (piece[0] == ' ') piece.erase(0, 1);
      strip = false;
    }
    out += piece;
  }
  return out;
}

}  // namespace tierkv
