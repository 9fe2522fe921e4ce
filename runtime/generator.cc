// runtime/generator.cc
#include "runtime/generator.h"

#include <algorithm>
#include <cassert>

namespace tierkv {

Generator::Generator(Model& model, KvCache& cache, SeqId seq, std::vector<int32_t> tokens)
    : model_(model), cache_(cache), seq_(seq), tokens_(std::move(tokens)),
      logits_(static_cast<size_t>(model.config().n_vocab)) {
  assert(cache_.Length(seq_) == static_cast<int>(tokens_.size()));
}

int Generator::computed() const { return cache_.Length(seq_); }

Status Generator::Append(std::span<const int32_t> more) {
  if (more.empty()) return Status::Ok();
  TIERKV_RETURN_IF_ERROR(FeedLast());
  tokens_.insert(tokens_.end(), more.begin(), more.end());
  return Status::Ok();
}

Result<bool> Generator::Prefill(int batch, const PrefillHooks& hooks) {
  const size_t n_vocab = logits_.size();
  const int from = computed();
  const int end = static_cast<int>(tokens_.size());
  for (int pos = from; pos < end;) {
    if (hooks.stop && hooks.stop()) {
      tokens_.resize(static_cast<size_t>(pos));
      return false;
    }
    const int n = std::min(std::max(model_.PrefillChunk(cache_, seq_, batch), 1), end - pos);
    rows_.clear();
    for (int i = 0; i < n; ++i) {
      const int p = pos + i;
      if (p == end - 1 || (hooks.keep_row && hooks.keep_row(p))) rows_.push_back(i);
    }
    chunk_logits_.resize(rows_.size() * n_vocab);
    const auto chunk = std::span<const int32_t>(tokens_).subspan(static_cast<size_t>(pos), static_cast<size_t>(n));
    TIERKV_RETURN_IF_ERROR(model_.ForwardBatch(cache_, seq_, chunk, pos, rows_, chunk_logits_));
    for (size_t k = 0; k < rows_.size(); ++k) {
      std::copy_n(chunk_logits_.begin() + static_cast<ptrdiff_t>(k * n_vocab), n_vocab, logits_.begin());
      if (hooks.on_row) hooks.on_row(pos + rows_[k], logits_);
    }
    pos += n;
    if (hooks.progress) hooks.progress(pos - from, end - from);
  }
  unfed_ = false;
  return true;
}

void Generator::Accept(int32_t token) {
  assert(!unfed_);
  tokens_.push_back(token);
  unfed_ = true;
}

Status Generator::Step() {
  assert(unfed_);
  TIERKV_RETURN_IF_ERROR(model_.Forward(cache_, seq_, tokens_.back(), static_cast<int>(tokens_.size()) - 1, logits_));
  unfed_ = false;
  return Status::Ok();
}

Status Generator::FeedLast() {
  if (!unfed_) return Status::Ok();
  TIERKV_RETURN_IF_ERROR(
      model_.Forward(cache_, seq_, tokens_.back(), static_cast<int>(tokens_.size()) - 1, std::span<float>()));
  unfed_ = false;
  return Status::Ok();
}

Status Generator::Truncate(int n) {
  assert(n >= 0 && n <= static_cast<int>(tokens_.size()));
  if (unfed_ && n < static_cast<int>(tokens_.size())) unfed_ = false;
  tokens_.resize(static_cast<size_t>(n));
  if (n < computed()) TIERKV_RETURN_IF_ERROR(cache_.Truncate(seq_, n));
  return Status::Ok();
}

Status Generator::Save(const ModelFingerprint& model, const std::string& path, SessionSaveStats* stats) {
  TIERKV_RETURN_IF_ERROR(FeedLast());
  assert(computed() == static_cast<int>(tokens_.size()));
  return SessionFile::Save(cache_, seq_, tokens_, model, path, stats);
}

Status Generator::SaveComputed(const ModelFingerprint& model, const std::string& path) {
  const std::vector<int32_t> held(tokens_.begin(), tokens_.begin() + computed());
  return SessionFile::Save(cache_, seq_, held, model, path);
}

}  // namespace tierkv
