// kernels/cpu_executor.h
//
// The CPU executor: kernels/executor.h over the CPU kernels of this folder, on a
// ThreadPool, computing synchronously (an op returns with its result written). Its
// bits are those of the kernels it wraps, so a model computes the same with it as by
// calling the kernels directly (runtime's reference-vector and bit-identity tests).
//
// It computes on host memory: its tier of a MemoryManager is the compute tier when that
// tier is host-addressable (host, or the simulated device), else the host tier.
#pragma once

#include <memory>
#include <vector>

#include "kernels/executor.h"
#include "kernels/thread_pool.h"

namespace tierkv::kernels {

class CpuExecutor final : public Executor {
 public:
  // threads: kernel threads in all, the calling thread included (0 = hardware
  // concurrency).
  explicit CpuExecutor(int threads);
  ~CpuExecutor() override;

  ThreadPool& pool() { return pool_; }

  const char* name() const override { return "cpu"; }
  int threads() const override { return pool_.size(); }
  Tier tier_for(const MemoryManager& mm) const override;
  bool host_memory() const override { return true; }
  void* Allocate(size_t bytes) override;
  void Deallocate(void* p) override;

  void Upload(void* dst, const void* host_src, size_t bytes) override;
  void ReadBack(void* host_dst, const void* src, size_t bytes) override;
  void Copy(void* dst, const void* src, size_t bytes) override;
  void WaitFor(const Pin&) override {}
  void Retire(Pin pin) override { pin.Release(); }
  void Synchronize() override {}

  void GetRow(const MatrixView& w, int64_t r, float* out) override;
  void RmsNorm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* out) override;
  void Rope(const RopeParams& p, int64_t pos, float* x, int n_heads, int head_dim) override;
  void Add(float* y, const float* x, size_t n) override;
  void SwiGlu(const float* gate, const float* up, float* out, int64_t n) override;
  void SetActivation(ActivationRow& row, const float* x, int64_t n) override { row.Set(x, n); }
  void MatVec(std::span<const MatVecJob> jobs) override;
  void MatMul(std::span<const MatMulJob> jobs) override;
  void RouteTopK(const float* logits, int n_expert, int k, bool normalize, int* ids, float* weights) override;
  void CombineExperts(const float* weights, const float* rows, int k, int64_t n, float* out) override;
  void AppendKv(const KvVectorKernels& codec, const KvWriteSlot& slot, const float* k, const float* v) override;
  void AttentionBegin(const KvVectorKernels& codec, const AttentionParams& p, const float* q,
                      AttentionState* st) override;
  void AttentionStep(const KvVectorKernels& codec, AttentionVisit visit, const AttentionParams& p,
                     const PagedKvView& kv, AttentionState* st) override;
  void AttentionSoftmax(const AttentionParams& p, AttentionState* st) override;
  void AttentionStepMulti(const KvVectorKernels& codec, AttentionVisit visit, const AttentionParams* ps,
                          AttentionState* const* sts, int64_t n, const PagedKvView& kv) override;
  void AttentionSoftmaxMulti(const AttentionParams* ps, AttentionState* const* sts, int64_t n) override;
  void AttentionEnd(const KvVectorKernels& codec, const AttentionParams& p, AttentionState* st,
                    float* out) override;

 private:
  ThreadPool pool_;
  // Rope: the angles of the last (params, position) asked for.
  std::vector<float> cos_sin_;
  RopeParams cos_sin_params_;
  int64_t cos_sin_pos_ = -1;  // -1: none yet
};

}  // namespace tierkv::kernels
