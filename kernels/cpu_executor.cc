// kernels/cpu_executor.cc
#include "kernels/cpu_executor.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <string>

#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/cuda_executor.h"
#include "kernels/moe.h"
#include "kernels/norm.h"

namespace tierkv::kernels {
namespace {

bool SameRope(const RopeParams& a, const RopeParams& b) {
  return a.n_dims == b.n_dims && a.mode == b.mode && a.freq_base == b.freq_base && a.freq_scale == b.freq_scale &&
         a.ext_factor == b.ext_factor && a.attn_factor == b.attn_factor && a.beta_fast == b.beta_fast &&
         a.beta_slow == b.beta_slow && a.n_ctx_orig == b.n_ctx_orig && a.freq_factors == b.freq_factors;
}

}  // namespace

std::unique_ptr<Executor> MakeCpuExecutor(int threads) { return std::make_unique<CpuExecutor>(threads); }

std::unique_ptr<Executor> MakeExecutor(std::string_view name, int threads, std::string* why_not) {
  if (name == "cpu") return MakeCpuExecutor(threads);
  if (name == "cuda") return MakeCudaExecutor(why_not);
  if (why_not != nullptr) *why_not = "unknown executor \"" + std::string(name) + "\"";
  return nullptr;
}

std::span<const std::string_view> ExecutorNames() {
  static constexpr std::string_view kNames[] = {"cpu", "cuda"};
  return kNames;
}

CpuExecutor::CpuExecutor(int threads) : pool_(threads) {}
CpuExecutor::~CpuExecutor() = default;

Tier CpuExecutor::tier_for(const MemoryManager& mm) const {
  const Tier t = mm.compute_tier();
  return mm.host_addressable(t) ? t : Tier::kHost;
}

void* CpuExecutor::Allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  return ::operator new(bytes, std::align_val_t{64});
}

void CpuExecutor::Deallocate(void* p) {
  if (p != nullptr) ::operator delete(p, std::align_val_t{64});
}

void CpuExecutor::Upload(void* dst, const void* host_src, size_t bytes) {
  if (dst != host_src && bytes > 0) std::memcpy(dst, host_src, bytes);
}

void CpuExecutor::ReadBack(void* host_dst, const void* src, size_t bytes) {
  if (host_dst != src && bytes > 0) std::memcpy(host_dst, src, bytes);
}

void CpuExecutor::Copy(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes > 0) std::memmove(dst, src, bytes);
}

void CpuExecutor::GetRow(const MatrixView& w, int64_t r, float* out) { kernels::GetRow(w, r, out); }

void CpuExecutor::RmsNorm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* out) {
  if (rows == 1) {
    kernels::RmsNorm(x, w, n, eps, out);
  } else {
    RmsNormRows(x, w, rows, n, eps, out);
  }
}

void CpuExecutor::Rope(const RopeParams& p, int64_t pos, float* x, int n_heads, int head_dim) {
  if (cos_sin_pos_ != pos || !SameRope(cos_sin_params_, p)) {
    cos_sin_.resize(static_cast<size_t>(p.n_dims));
    RopeAngles(p, pos, cos_sin_.data());
    cos_sin_params_ = p;
    cos_sin_pos_ = pos;
  }
  ApplyRope(p, cos_sin_.data(), x, n_heads, head_dim);
}

void CpuExecutor::Add(float* y, const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += x[i];
}

void CpuExecutor::SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  kernels::SwiGlu(gate, up, out, n);
}

void CpuExecutor::MatVec(std::span<const MatVecJob> jobs) { MatVecMany(jobs, &pool_); }

void CpuExecutor::MatMul(std::span<const MatMulJob> jobs) { MatMulMany(jobs, &pool_); }

void CpuExecutor::RouteTopK(const float* logits, int n_expert, int k, bool normalize, int* ids, float* weights) {
  kernels::RouteTopK(logits, n_expert, k, normalize, ids, weights);
}

void CpuExecutor::CombineExperts(const float* weights, const float* rows, int k, int64_t n, float* out) {
  const size_t nn = static_cast<size_t>(n);
  std::fill(out, out + nn, 0.0f);
  for (int i = 0; i < k; ++i) {
    const float w = weights[i];
    const float* row = rows + static_cast<size_t>(i) * nn;
    for (size_t d = 0; d < nn; ++d) out[d] += w * row[d];
  }
}

void CpuExecutor::AppendKv(const KvVectorKernels& codec, const KvWriteSlot& slot, const float* k, const float* v) {
  EncodeKvSlot(codec, slot, k, v);
}

void CpuExecutor::AttentionBegin(const KvVectorKernels& codec, const AttentionParams& p, const float* q,
                                 AttentionState* st) {
  kernels::AttentionBegin(codec, p, q, st);
}

void CpuExecutor::AttentionStep(const KvVectorKernels& codec, AttentionVisit visit, const AttentionParams& p,
                                const PagedKvView& kv, AttentionState* st) {
  switch (visit) {
    case AttentionVisit::kOnline:
      AttentionBlocks(codec, p, kv, st, &pool_);
      break;
    case AttentionVisit::kTwoPass:
      AttentionTwoPass(codec, p, kv, st, &pool_);
      break;
    case AttentionVisit::kScores:
      AttentionScores(codec, p, kv, st, &pool_);
      break;
    case AttentionVisit::kValues:
      AttentionValues(codec, p, kv, st, &pool_);
      break;
  }
}

void CpuExecutor::AttentionSoftmax(const AttentionParams& p, AttentionState* st) {
  kernels::AttentionSoftmax(p, st, &pool_);
}

void CpuExecutor::AttentionStepMulti(const KvVectorKernels& codec, AttentionVisit visit, const AttentionParams* ps,
                                     AttentionState* const* sts, int64_t n, const PagedKvView& kv) {
  switch (visit) {
    case AttentionVisit::kOnline:
      AttentionBlocksMulti(codec, ps, sts, n, kv, &pool_);
      break;
    case AttentionVisit::kTwoPass:
      AttentionTwoPassMulti(codec, ps, sts, n, kv, &pool_);
      break;
    case AttentionVisit::kScores:
      AttentionScoresMulti(codec, ps, sts, n, kv, &pool_);
      break;
    case AttentionVisit::kValues:
      AttentionValuesMulti(codec, ps, sts, n, kv, &pool_);
      break;
  }
}

void CpuExecutor::AttentionSoftmaxMulti(const AttentionParams* ps, AttentionState* const* sts, int64_t n) {
  kernels::AttentionSoftmaxMulti(ps, sts, n, &pool_);
}

void CpuExecutor::AttentionEnd(const KvVectorKernels& codec, const AttentionParams& p, AttentionState* st,
                               float* out) {
  kernels::AttentionEnd(codec, p, st, out);
}

}  // namespace tierkv::kernels
