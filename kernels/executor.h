// kernels/executor.h
//
// The compute seam: every operation the decoder (runtime/model_*.cc) computes goes
// through an Executor, over plain views (float arrays, MatrixView, PagedKvView, a
// codec's KvVectorKernels and its KvCodecDesc). One model, many executors: the CPU
// executor (kernels/cpu_executor.h) wraps the CPU kernels; a device executor
// implements the same members on its own stream. This header names no CUDA type.
//
// Memory. Pointers an op reads or writes are executor-visible: for the CPU executor
// any host pointer; for a device executor, memory on the tier it names (tier_for) or
// its own buffers. Moving data across is explicit: Upload (host to executor), ReadBack
// (executor to host: a synchronisation point, and the only one: every place the
// decoder needs a value on the host - routing choices, logits - calls ReadBack), Copy
// (executor to executor).
//
// Ordering. Ops run in the order they are called, on one compute queue. A page pinned
// through the MemoryManager is on its tier when Acquire returns a Pin for a host-side
// copy; a device executor whose copies complete asynchronously makes compute wait for
// the pin's copy (WaitFor) and must not let the page go while queued compute still
// reads it: Retire hands the pin over, and the executor releases it once the compute
// queued before it has completed. The CPU executor computes synchronously: WaitFor and
// Synchronize return at once and Retire releases at once.
//
// Bits. The CPU executor gives exactly the bits of the kernels it wraps (kernels/*.h
// state their numerics: llama.cpp's activation rounding per weight type, the attention
// forms' orders). Each op's contract is the wrapped kernel's; the conformance suite
// (tests/kernels/executor_test.cc) checks every executor present against the scalar
// references.
//
// Thread-safety: one caller at a time per executor (a Model owns its own).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "kernels/attention_types.h"
#include "kernels/kv_vector_kernels.h"
#include "kernels/matvec.h"
#include "kernels/rope.h"
#include "memory/memory_manager.h"

namespace tierkv::kernels {

// One visit of attention over a batch of a layer's blocks (kernels/attention.h):
//   kOnline   the one-pass form (AttentionBlocks);
//   kTwoPass  both passes over one batch holding the whole layer (AttentionTwoPass);
//   kScores   pass 1 of the two-pass form over a batch (AttentionScores);
//   kValues   pass 2 over a batch (AttentionValues), after AttentionSoftmax.
enum class AttentionVisit : uint8_t { kOnline, kTwoPass, kScores, kValues };

class Executor {
 public:
  virtual ~Executor() = default;

  virtual const char* name() const = 0;  // "cpu", "cuda"
  virtual int threads() const = 0;       // CPU threads it computes with (1 for a device)
  // The tier of `mm` whose pages this executor computes on: where the decoder pins
  // weights and KV blocks, and where KV blocks are written.
  virtual Tier tier_for(const MemoryManager& mm) const = 0;

  // True when ops take host pointers (the CPU executor): the decoder then lets them
  // write the caller's host arrays (logits) directly instead of reading them back.
  virtual bool host_memory() const = 0;

  // Whether AppendKv and attention take this KV codec (the CPU executor: all of them;
  // the CUDA executor: f16, q8_0, q4_0). Callers refuse the others before computing.
  virtual bool SupportsKv(const KvCodecDesc& codec) const { return true; }

  // Executor-visible memory (the decoder's scratch), at least 64-byte aligned;
  // contents unspecified. Allocate(0) may return null.
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Deallocate(void* p) = 0;

  // Data movement. Upload / Copy may be queued; ReadBack returns with dst filled.
  virtual void Upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void ReadBack(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void Copy(void* dst, const void* src, size_t bytes) = 0;

  // Ordering with the copy stream and pins (see the top of this file).
  virtual void WaitFor(const Pin& pin) = 0;
  virtual void Retire(Pin pin) = 0;
  virtual void Synchronize() = 0;

  // out[n] = row r of w as f32 (the token embedding).
  virtual void GetRow(const MatrixView& w, int64_t r, float* out) = 0;
  // out[rows][n] = RMSNorm of each row of x[rows][n] times w[n] (kernels/norm.h).
  virtual void RmsNorm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* out) = 0;
  // x[n_heads][head_dim] rotated in place for position pos (kernels/rope.h). The angles
  // of the last position are kept for the next call with the same params.
  virtual void Rope(const RopeParams& p, int64_t pos, float* x, int n_heads, int head_dim) = 0;
  // y[n] += x[n] (residuals and biases).
  virtual void Add(float* y, const float* x, size_t n) = 0;
  // out[n] = SiLU(gate) * up (kernels/activation.h); out may be gate.
  virtual void SwiGlu(const float* gate, const float* up, float* out, int64_t n) = 0;

  // row = x[n], an activation for the matrix products below, converted on demand to each
  // weight type's activation type (once per type; kernels/matvec.h, ActivationRow).
  virtual void SetActivation(ActivationRow& row, const float* x, int64_t n) = 0;
  // Matrix products (kernels/matvec.h): one token's, and a chunk's.
  virtual void MatVec(std::span<const MatVecJob> jobs) = 0;
  virtual void MatMul(std::span<const MatMulJob> jobs) = 0;
  // One product: MatVec of the one job {&w, &x, y}.
  void MatVecOne(const MatrixView& w, ActivationRow& x, float* y) {
    const MatVecJob job{&w, &x, y};
    MatVec({&job, 1});
  }

  // MoE (kernels/moe.h): the router's softmax and top k (ids, weights: [k], descending,
  // ties to the smaller id, renormalised when normalize); and out[n] = sum over i < k,
  // in order, of weights[i] * rows[i][n]. ids and weights are host memory: RouteTopK
  // returns with them filled (a read-back: the decoder pages experts by them), and
  // CombineExperts takes them from the host.
  virtual void RouteTopK(const float* logits, int n_expert, int k, bool normalize, int* ids, float* weights) = 0;
  virtual void CombineExperts(const float* weights, const float* rows, int k, int64_t n, float* out) = 0;

  // KV append: k, v [n_kv_heads][head_dim] encoded into `slot` with the codec.
  virtual void AppendKv(const KvVectorKernels& codec, const KvWriteSlot& slot, const float* k, const float* v) = 0;

  // Attention (kernels/attention.h) as begin / visits / end. One query (a decode step):
  virtual void AttentionBegin(const KvVectorKernels& codec, const AttentionParams& p, const float* q,
                              AttentionState* st) = 0;
  virtual void AttentionStep(const KvVectorKernels& codec, AttentionVisit visit, const AttentionParams& p,
                             const PagedKvView& kv, AttentionState* st) = 0;
  virtual void AttentionSoftmax(const AttentionParams& p, AttentionState* st) = 0;
  // n queries of a prefill chunk through the same visits, each with its own bits.
  virtual void AttentionStepMulti(const KvVectorKernels& codec, AttentionVisit visit, const AttentionParams* ps,
                                  AttentionState* const* sts, int64_t n, const PagedKvView& kv) = 0;
  virtual void AttentionSoftmaxMulti(const AttentionParams* ps, AttentionState* const* sts, int64_t n) = 0;
  virtual void AttentionEnd(const KvVectorKernels& codec, const AttentionParams& p, AttentionState* st,
                            float* out) = 0;
};

// An array of T in an executor's memory (Allocate), owned; resize keeps no contents.
// The host touches it only through the executor (Upload, ReadBack, the ops).
template <typename T>
class ExecArray {
 public:
  ExecArray() = default;
  ExecArray(Executor* e, size_t n) : e_(e) { resize(n); }
  ~ExecArray() { Reset(); }
  ExecArray(ExecArray&& o) noexcept : e_(o.e_), p_(o.p_), n_(o.n_), cap_(o.cap_) { o.p_ = nullptr; o.n_ = o.cap_ = 0; }
  ExecArray& operator=(ExecArray&& o) noexcept {
    if (this != &o) {
      Reset();
      e_ = o.e_;
      p_ = o.p_;
      n_ = o.n_;
      cap_ = o.cap_;
      o.p_ = nullptr;
      o.n_ = o.cap_ = 0;
    }
    return *this;
  }
  ExecArray(const ExecArray&) = delete;
  ExecArray& operator=(const ExecArray&) = delete;

  // n elements (reallocated, contents lost, when more than it holds).
  void resize(size_t n) {
    if (n > cap_) {
      Reset();
      p_ = static_cast<T*>(e_->Allocate(n * sizeof(T)));
      cap_ = n;
    }
    n_ = n;
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  void Reset() {
    if (p_ != nullptr) e_->Deallocate(p_);
    p_ = nullptr;
    n_ = cap_ = 0;
  }
  Executor* e_ = nullptr;
  T* p_ = nullptr;
  size_t n_ = 0, cap_ = 0;
};

// Executors by name: "cpu" always; "cuda" (issue 35) where built with CUDA and a device
// answers. Null with *why_not set when this build or machine has none of that name.
// threads: the CPU executor's kernel threads (0 = hardware concurrency).
std::unique_ptr<Executor> MakeExecutor(std::string_view name, int threads, std::string* why_not);
std::unique_ptr<Executor> MakeCpuExecutor(int threads);
// Every name MakeExecutor knows (the conformance suite runs each that is present).
std::span<const std::string_view> ExecutorNames();

}  // namespace tierkv::kernels
