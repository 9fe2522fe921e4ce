// runtime/generator.h
//
// The run loop's steps over one token sequence, shared by `tierkv run` (RunSession) and
// `tierkv serve` (runtime/server): the tokens a KV sequence holds, the prompt's prefill
// in chunks, one generated token at a time, and the save to a session file.
//
//   Generator g(model, cache, seq, tokens_held);
//   g.Append(prompt_rest);
//   g.Prefill(batch, stop, progress);          // logits() = the last token's
//   while (...) { int32_t t = sampler.Sample(g.logits()); g.Accept(t); g.Step(); }
//   g.Save(path, fingerprint);                 // feeds the last token first
//
// The last token accepted is "unfed" until something follows it (a Step, a next input,
// a save): an end-of-generation token or the -n limit's last token costs no forward
// pass unless the text goes on.
//
// Thread-safety: one thread at a time per Generator, and per Model (Model::Forward).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kvcache/kv_cache.h"
#include "kvcache/session_file.h"
#include "memory/status.h"
#include "runtime/model.h"

namespace tierkv {

class Generator {
 public:
  // A generator over sequence `seq` of `cache`, which holds the K/V of `tokens` (all of
  // them: cache.Length(seq) == tokens.size()).
  Generator(Model& model, KvCache& cache, SeqId seq, std::vector<int32_t> tokens);

  // Every token of the text: those whose K/V the cache holds, then the unfed one.
  const std::vector<int32_t>& tokens() const { return tokens_; }
  SeqId seq() const { return seq_; }
  // Logits of the last token computed with logits (Prefill's last, or Step's).
  std::span<const float> logits() const { return logits_; }
  // Tokens whose K/V the cache holds.
  int computed() const;

  // Appends tokens to compute with the next Prefill (feeding the unfed token first).
  Status Append(std::span<const int32_t> more);

  // Computes every appended token in chunks of `batch` (the same bits for any size),
  // the last one's logits into logits(). `stop` (may be null) is polled before each
  // chunk: when it says true, the tokens not computed are dropped and Prefill returns
  // false. `progress(done, total)` after each chunk (may be null). `keep_row(pos)` (may
  // be null) asks for the logits of other positions too, handed to `on_row(pos, logits)`.
  struct PrefillHooks {
    std::function<bool()> stop;
    std::function<void(int done, int total)> progress;
    std::function<bool(int pos)> keep_row;
    std::function<void(int pos, std::span<const float> logits)> on_row;
  };
  Result<bool> Prefill(int batch, const PrefillHooks& hooks = {});

  // Accepts a sampled token into the text, unfed.
  void Accept(int32_t token);
  // Computes the unfed token, its logits into logits().
  Status Step();
  // Computes the unfed token without logits (something follows it that is not sampled
  // from it: an input, a save). No-op when there is none.
  Status FeedLast();
  // Keeps the first n tokens. REQUIRES: n <= tokens().size().
  Status Truncate(int n);

  // Saves the sequence and its tokens to `path` (the unfed token fed first, so that the
  // file holds the whole text).
  Status Save(const ModelFingerprint& model, const std::string& path, SessionSaveStats* stats = nullptr);
  // Saves the tokens computed so far (a checkpoint during Prefill, from its progress
  // hook: the tokens still to compute are not in the file).
  Status SaveComputed(const ModelFingerprint& model, const std::string& path);

 private:
  Model& model_;
  KvCache& cache_;
  SeqId seq_;
  std::vector<int32_t> tokens_;
  bool unfed_ = false;
  std::vector<float> logits_;
  std::vector<int> rows_;             // Prefill's scratch
  std::vector<float> chunk_logits_;   // Prefill's scratch
};

}  // namespace tierkv
