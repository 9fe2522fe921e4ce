// memory/cuda_device_backend.cc
//
// CUDA builds: the Device tier is one cudaMalloc'd arena. A batch becomes one
// cudaMemcpyAsync per contiguous run on a private copy stream, then one synchronize,
// so the host never waits per page. Host buffers come from the Host arena, which is
// registered (pinned) so these copies are DMA.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "memory/size.h"
#include "memory/tier_backend.h"

namespace tierkv {
namespace {

Status CudaError(cudaError_t err, const std::string& what) {
  return Status::IoError(what + ": " + cudaGetErrorString(err));
}

class CudaDeviceBackend final : public TierBackend {
 public:
  CudaDeviceBackend(std::byte* base, uint64_t bytes, cudaStream_t stream, double warmup_s)
      : base_(base), bytes_(bytes), stream_(stream), warmup_s_(warmup_s) {}
  ~CudaDeviceBackend() override {
    cudaStreamDestroy(stream_);
    cudaFree(base_);
  }

  Tier tier() const override { return Tier::kDevice; }
  std::string Describe() const override { return "device (cuda): cudaMalloc " + FormatBytes(bytes_); }
  uint64_t capacity() const override { return bytes_; }
  std::byte* base() override { return nullptr; }  // not host-addressable
  std::byte* arena_address() override { return base_; }
  double warmup_seconds() const override { return warmup_s_; }

  Status Write(std::span<const CopyOp> ops) override { return Copy(ops, cudaMemcpyHostToDevice); }
  Status Read(std::span<const CopyOp> ops) override { return Copy(ops, cudaMemcpyDeviceToHost); }

 private:
  Status Copy(std::span<const CopyOp> ops, cudaMemcpyKind kind) {
    std::vector<CopyOp> sorted(ops.begin(), ops.end());
    std::sort(sorted.begin(), sorted.end(), [](const CopyOp& a, const CopyOp& b) { return a.offset < b.offset; });
    size_t i = 0;
    while (i < sorted.size()) {
      // Merge ops contiguous on both sides into one copy.
      CopyOp run = sorted[i++];
      while (i < sorted.size() && sorted[i].offset == run.offset + run.bytes && sorted[i].host == run.host + run.bytes) {
        run.bytes += sorted[i++].bytes;
      }
      if (run.offset > bytes_ || run.bytes > bytes_ - run.offset) return Status::InvalidArgument("device copy past the arena end");
      void* dst = kind == cudaMemcpyHostToDevice ? static_cast<void*>(base_ + run.offset) : static_cast<void*>(run.host);
      const void* src = kind == cudaMemcpyHostToDevice ? static_cast<const void*>(run.host) : static_cast<const void*>(base_ + run.offset);
      const cudaError_t err = cudaMemcpyAsync(dst, src, run.bytes, kind, stream_);
      if (err != cudaSuccess) return CudaError(err, "cudaMemcpyAsync");
    }
    const cudaError_t err = cudaStreamSynchronize(stream_);
    if (err != cudaSuccess) return CudaError(err, "cudaStreamSynchronize");
    return Status::Ok();
  }

  std::byte* base_;
  uint64_t bytes_;
  cudaStream_t stream_;
  double warmup_s_;
};

}  // namespace

Status RegisterHostMemoryForDevice(std::byte* base, uint64_t bytes) {
  if (!CudaDeviceAvailable()) return Status::Unsupported("no CUDA device");
  const cudaError_t err = cudaHostRegister(base, bytes, cudaHostRegisterDefault);
  if (err != cudaSuccess) return CudaError(err, "cudaHostRegister of the host arena");
  return Status::Ok();
}

void UnregisterHostMemoryForDevice(std::byte* base) { cudaHostUnregister(base); }

bool CudaDeviceAvailable(std::string* why_not) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    if (why_not) *why_not = std::string("no CUDA device is visible (") + cudaGetErrorString(err) + ")";
    return false;
  }
  return true;
}

namespace {

// Frees what MeasureCudaCopies holds on every path out.
struct CopyBuffers {
  void* dev = nullptr;
  void* pinned = nullptr;
  std::vector<std::byte> pageable;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  ~CopyBuffers() {
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (pinned != nullptr) cudaFreeHost(pinned);
    if (dev != nullptr) cudaFree(dev);
  }
};

}  // namespace

Result<CudaCopyRates> MeasureCudaCopies(uint64_t bytes, int reps) {
  std::string why;
  if (!CudaDeviceAvailable(&why)) return Status::Unsupported(why);
  if (bytes == 0 || bytes % kMiB != 0 || reps < 1) return Status::InvalidArgument("copy probe: bad size or repetitions");
  CudaCopyRates r;
  size_t free_b = 0, total_b = 0;
  cudaError_t err = cudaMemGetInfo(&free_b, &total_b);
  if (err != cudaSuccess) return CudaError(err, "cudaMemGetInfo");
  r.vram_total_bytes = total_b;
  r.vram_free_bytes = free_b;
  CopyBuffers b;
  b.pageable.assign(bytes, std::byte{1});
  if ((err = cudaMalloc(&b.dev, bytes)) != cudaSuccess) return CudaError(err, "cudaMalloc");
  if ((err = cudaMallocHost(&b.pinned, bytes)) != cudaSuccess) return CudaError(err, "cudaMallocHost");
  std::memset(b.pinned, 1, bytes);
  if ((err = cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking)) != cudaSuccess) return CudaError(err, "stream");
  if ((err = cudaEventCreate(&b.start)) != cudaSuccess || (err = cudaEventCreate(&b.stop)) != cudaSuccess) {
    return CudaError(err, "cudaEventCreate");
  }
  // The best rate of `reps` runs of `copy` (which queues copies of `bytes` on the stream).
  const auto best = [&](const std::function<cudaError_t()>& copy, double* gbps) -> Status {
    for (int i = 0; i <= reps; ++i) {  // the first run warms up
      cudaError_t e = cudaEventRecord(b.start, b.stream);
      if (e == cudaSuccess) e = copy();
      if (e == cudaSuccess) e = cudaEventRecord(b.stop, b.stream);
      if (e == cudaSuccess) e = cudaEventSynchronize(b.stop);
      float ms = 0;
      if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, b.start, b.stop);
      if (e != cudaSuccess) return CudaError(e, "timed copy");
      if (i > 0 && ms > 0) *gbps = std::max(*gbps, static_cast<double>(bytes) / (ms * 1e-3) / 1e9);
    }
    return Status::Ok();
  };
  const auto one = [&](const void* src, void* dst, cudaMemcpyKind kind) {
    return [&b, src, dst, kind, bytes] { return cudaMemcpyAsync(dst, src, bytes, kind, b.stream); };
  };
  TIERKV_RETURN_IF_ERROR(best(one(b.pageable.data(), b.dev, cudaMemcpyHostToDevice), &r.h2d_pageable));
  TIERKV_RETURN_IF_ERROR(best(one(b.pinned, b.dev, cudaMemcpyHostToDevice), &r.h2d_pinned));
  TIERKV_RETURN_IF_ERROR(best(one(b.dev, b.pinned, cudaMemcpyDeviceToHost), &r.d2h_pinned));
  for (uint64_t page : {uint64_t{64} << 10, kMiB}) {
    const uint64_t n = bytes / page;
    std::vector<uint64_t> src(n), dst(n);
    for (uint64_t i = 0; i < n; ++i) src[i] = dst[i] = i;
    // Fixed shuffles (a multiplicative step coprime with n would do too): pages of a
    // batch come from and go to frames all over their arenas.
    std::mt19937_64 rng(7);
    std::shuffle(src.begin(), src.end(), rng);
    std::shuffle(dst.begin(), dst.end(), rng);
    const auto gathered = [&] {
      for (uint64_t i = 0; i < n; ++i) {
        const cudaError_t e = cudaMemcpyAsync(static_cast<std::byte*>(b.dev) + dst[i] * page,
                                              static_cast<const std::byte*>(b.pinned) + src[i] * page, page,
                                              cudaMemcpyHostToDevice, b.stream);
        if (e != cudaSuccess) return e;
      }
      return cudaSuccess;
    };
    TIERKV_RETURN_IF_ERROR(best(gathered, page == kMiB ? &r.h2d_pages_1m : &r.h2d_pages_64k));
  }
  return r;
}

Result<std::unique_ptr<TierBackend>> CreateCudaDeviceBackend(uint64_t bytes, bool warmup) {
  std::string why;
  if (!CudaDeviceAvailable(&why)) return Status::Unsupported("--device cuda: " + why);
  if (bytes == 0) return Status::InvalidArgument("device tier budget is zero");
  const auto t0 = std::chrono::steady_clock::now();
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) return Status::Exhausted("device tier: cudaMalloc of " + FormatBytes(bytes) + " failed: " + cudaGetErrorString(err));
  if (warmup) {
    err = cudaMemset(p, 0, bytes);
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
      cudaFree(p);
      return CudaError(err, "device tier warmup");
    }
  }
  cudaStream_t stream = nullptr;
  err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) {
    cudaFree(p);
    return CudaError(err, "cudaStreamCreate");
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return std::unique_ptr<TierBackend>(new CudaDeviceBackend(static_cast<std::byte*>(p), bytes, stream, secs));
}

}  // namespace tierkv
