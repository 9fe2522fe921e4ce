// kernels/cuda_executor.cu
//
// The CUDA executor (kernels/cuda_executor.h). Everything here is queued on one stream;
// the host waits only in ReadBack, RouteTopK and Synchronize. The kernels are plain:
// this is the first version, written to be right (the exact class bit for bit, the
// rest deterministic), not yet to be fast; docs/gpu.md lists what is measured and what
// is not. Built with --fmad=false; the float steps whose rounding matters go through
// kernels/hd.h either way.
#include "kernels/cuda_executor.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "kernels/kv_layout_hd.h"
#include "kernels/moe.h"
#include "kernels/quant_hd.h"

namespace tierkv::kernels {
namespace {

// A failed CUDA call leaves the device in an unknown state mid-step: one error line and
// exit (session files are written crash-safe; nothing half-written is kept).
void Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  std::fprintf(stderr, "error: CUDA %s failed: %s\n", what, cudaGetErrorString(err));
  std::fflush(stderr);
  std::_Exit(1);
}

[[noreturn]] void Refuse(const char* what) {
  std::fprintf(stderr, "error: the CUDA executor %s\n", what);
  std::fflush(stderr);
  std::_Exit(1);
}

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
int Blocks(int64_t n, int per = kThreads) { return static_cast<int>((n + per - 1) / per); }

// ---- elementwise --------------------------------------------------------------------

__global__ void AddKernel(float* y, const float* x, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = HdAdd(y[i], x[i]);
}

__global__ void SwiGluKernel(const float* gate, const float* up, float* out, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) {
    const float g = gate[i];
    out[i] = HdMul(HdDiv(g, HdAdd(1.0f, expf(-g))), up[i]);
  }
}

// One block per row: the sum of squares in double (tree order, fixed), then as the CPU.
__global__ void RmsNormKernel(const float* x, const float* w, int64_t n, float eps, float* out) {
  __shared__ double part[kThreads];
  const float* xr = x + blockIdx.x * n;
  float* o = out + blockIdx.x * n;
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += static_cast<double>(HdMul(xr[i], xr[i]));
  part[threadIdx.x] = s;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) part[threadIdx.x] += part[threadIdx.x + stride];
    __syncthreads();
  }
  const float mean = static_cast<float>(part[0] / static_cast<double>(n));
  const float scale = HdDiv(1.0f, sqrtf(HdAdd(mean, eps)));
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = HdMul(xr[i], scale);
    o[i] = w != nullptr ? HdMul(v, w[i]) : v;
  }
}

// kernels/rope.cc's ApplyRope, the angles computed on the host (RopeAngles).
__global__ void RopeKernel(const float* cos_sin, float* x, int n_heads, int head_dim, int n_dims, bool norm) {
  const int pairs = n_dims / 2;
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= n_heads * pairs) return;
  const int h = idx / pairs, i0 = 2 * (idx % pairs);
  float* v = x + static_cast<int64_t>(h) * head_dim;
  const float c = cos_sin[i0], s = cos_sin[i0 + 1];
  const int a = norm ? i0 : i0 / 2;
  const int b = norm ? i0 + 1 : i0 / 2 + pairs;
  const float x0 = v[a], x1 = v[b];
  v[a] = HdFma(x0, c, -HdMul(x1, s));
  v[b] = HdFma(x0, s, HdMul(x1, c));
}

// out[d] = sum over i < k, in order, of w[i] * rows[i][d] (the CPU executor's loop).
__global__ void CombineKernel(const float* w, const float* rows, int k, int64_t n, float* out) {
  const int64_t d = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (d >= n) return;
  float s = 0.0f;
  for (int i = 0; i < k; ++i) s = HdAdd(s, HdMul(w[i], rows[i * n + d]));
  out[d] = s;
}

__global__ void GetRowKernel(WeightType type, const uint8_t* row, int64_t n, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) hd::RowValue(type, row, i, &out[i]);
}

// ---- activations ---------------------------------------------------------------------

__global__ void ToHalfKernel(const float* x, uint16_t* out, int64_t n, bool bf16) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  if (!bf16) {
    out[i] = HdFloatToHalf(x[i]);
    return;
  }
  // kernels/fp16.h's F32ToBf16: nearest even, NaN to a quiet NaN.
  const uint32_t b = __float_as_uint(x[i]);
  out[i] = (b & 0x7fffffffu) > 0x7f800000u ? static_cast<uint16_t>((b >> 16) | 0x40u)
                                           : static_cast<uint16_t>((b + (0x7fffu + ((b >> 16) & 1u))) >> 16);
}

__global__ void QuantizeQ8_0Kernel(const float* x, BlockQ8_0* out, int64_t nb) {
  const int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (b < nb) hd::QuantizeBlockQ8_0(x + b * kQk0, &out[b]);
}

__global__ void QuantizeQ8_KKernel(const float* x, BlockQ8_K* out, int64_t nb) {
  const int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (b >= nb) return;
  const float* xb = x + b * kQkK;
  hd::QuantizeBlockQ8_K(xb, hd::MaxMagnitude(xb, kQkK), &out[b]);
}

// ---- matrix-vector products: one warp per row ----------------------------------------
// Lanes compute the integer parts of 32 consecutive blocks at a time; lane 0 then runs
// the row's float chain over them in block order (quant_hd.h).

template <typename Block, typename Act, typename Chain, typename IntsT, IntsT (*kInts)(const Block&, const Act&)>
__global__ void DotBlocksKernel(const uint8_t* w, size_t row_bytes, int64_t rows, const Act* x, int64_t nb, float* y) {
  __shared__ IntsT ints[kWarps][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarps) + warp;
  if (r >= rows) return;
  const auto* row = reinterpret_cast<const Block*>(w + static_cast<size_t>(r) * row_bytes);
  Chain chain;
  for (int64_t b0 = 0; b0 < nb; b0 += 32) {
    const int64_t b = b0 + lane;
    if (b < nb) ints[warp][lane] = kInts(row[b], x[b]);
    __syncwarp();
    if (lane == 0) {
      const int64_t end = nb - b0 < 32 ? nb - b0 : 32;
      for (int64_t j = 0; j < end; ++j) chain.Add(ints[warp][j], row[b0 + j], x[b0 + j]);
    }
    __syncwarp();
  }
  if (lane == 0) y[r] = chain.Finish();
}

template <WeightType kType>
__global__ void DotFloatKernel(const uint8_t* w, size_t row_bytes, int64_t rows, const void* x, int64_t n, float* y) {
  __shared__ float lanes[kWarps][8];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarps) + warp;
  if (r >= rows) return;
  if (lane < 8) lanes[warp][lane] = hd::FloatLane<kType>(w + static_cast<size_t>(r) * row_bytes, x, n, lane);
  __syncwarp();
  if (lane == 0) y[r] = hd::Sum8(lanes[warp]);
}

// ---- KV append -----------------------------------------------------------------------

// One thread per (head, K or V, 32-value block or f16 value).
__global__ void AppendKvKernel(int codec, uint8_t* k_base, uint8_t* v_base, size_t head_stride, int n_kv_heads,
                               int tile_lane, const float* k, const float* v, int head_dim) {
  const int units = codec == hd::kKvF16 ? head_dim : head_dim / 32;
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= 2 * n_kv_heads * units) return;
  const int u = idx % units, kv = (idx / units) % 2, h = idx / (2 * units);
  const float* x = (kv == 0 ? k : v) + static_cast<size_t>(h) * head_dim;
  uint8_t* out = (kv == 0 ? k_base : v_base) + static_cast<size_t>(h) * head_stride;
  const int lane = kv == 0 ? tile_lane : -1;
  if (codec == hd::kKvF16) {
    hd::KvEncodeF16(x, u, out, lane);
  } else {
    hd::KvEncodeBlock(codec, x, u, out, lane);
  }
}

// ---- attention -------------------------------------------------------------------------
// Per query head: q prepared (rounded to f16 when asked; for q8_0 / q4_0 keys rounded
// through q8_0 as the CPU's scores round it), running m, l, acc. A step computes each
// block's partial (m_b, l_b, acc_b) independently, then folds them into the state in
// block order: the same bits for any batching of the blocks.

struct AttnGeom {
  int codec, n_heads, n_kv_heads, head_dim, block_tokens, first_block, n_tokens, n_blocks;
  size_t vector_bytes;
  bool tiles;
  bool round_weights;  // the weights of V rounded to f16 (AttentionParams::round_weights_f16)
  float scale;
  int64_t query_pos;
};

__global__ void AttnPrepareKernel(int codec, const float* q, float* q_prep, int n_heads, int head_dim, bool round_f16,
                                  float* m, float* l, float* acc) {
  const int h = blockIdx.x;
  if (threadIdx.x != 0) return;
  const float* qh = q + static_cast<size_t>(h) * head_dim;
  float* out = q_prep + static_cast<size_t>(h) * head_dim;
  for (int d = 0; d < head_dim; ++d) out[d] = round_f16 ? HdHalfToFloat(HdFloatToHalf(qh[d])) : qh[d];
  if (codec != hd::kKvF16) {  // through q8_0, as the codec's PrepareQuery encodes it
    for (int b = 0; b < head_dim / 32; ++b) {
      uint8_t enc[34];
      hd::KvEncodeBlock(hd::kKvQ8_0, out + 32 * b, 0, enc, -1);
      const float s = HdHalfToFloat(static_cast<uint16_t>(enc[0] | (enc[1] << 8)));
      for (int j = 0; j < 32; ++j) out[32 * b + j] = HdMul(static_cast<float>(static_cast<int8_t>(enc[2 + j])), s);
    }
  }
  m[h] = -INFINITY;
  l[h] = 0.0f;
  for (int d = 0; d < head_dim; ++d) acc[static_cast<size_t>(h) * head_dim + d] = 0.0f;
}

// grid (n_heads, n_blocks), kThreads threads: warp w takes tokens w, w + 4, ... of the
// block; lane i holds dims i, i + 32, ... (head_dim <= 256). part: [n_heads][n_blocks]
// of (m, l, acc[head_dim]).
__global__ void AttnBlockKernel(AttnGeom g, const uint8_t* const* blocks, const float* q_prep, float* part) {
  constexpr int kMaxDims = 8;
  __shared__ float wm[kWarps], wl[kWarps];
  __shared__ float wacc[kWarps][256];
  const int h = blockIdx.x, bi = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kvh = h / (g.n_heads / g.n_kv_heads);
  const uint8_t* block = blocks[bi];
  const size_t run_bytes = static_cast<size_t>(g.block_tokens) * g.vector_bytes;
  const uint8_t* krun = block + static_cast<size_t>(kvh) * run_bytes;
  const uint8_t* vrun = block + static_cast<size_t>(g.n_kv_heads) * run_bytes + static_cast<size_t>(kvh) * run_bytes;
  const int64_t first = static_cast<int64_t>(g.first_block + bi) * g.block_tokens;
  int64_t last = first + g.block_tokens;  // exclusive
  if (last > g.n_tokens) last = g.n_tokens;
  if (last > g.query_pos + 1) last = g.query_pos + 1;
  const float* q = q_prep + static_cast<size_t>(h) * g.head_dim;
  float m = -INFINITY, l = 0.0f, acc[kMaxDims];
  for (int i = 0; i < kMaxDims; ++i) acc[i] = 0.0f;
  for (int64_t pos = first + warp; pos < last; pos += kWarps) {
    const int t = static_cast<int>(pos - first);
    float s = 0.0f;
    for (int d = lane; d < g.head_dim; d += 32) s = HdFma(q[d], hd::KvValue(g.codec, krun, g.vector_bytes, g.tiles, t, d), s);
    for (int o = 16; o > 0; o /= 2) s = HdAdd(s, __shfl_xor_sync(0xffffffffu, s, o));
    s = HdMul(s, g.scale);
    const float m_new = s > m ? s : m;
    const float corr = expf(m - m_new), p = expf(s - m_new);
    l = HdFma(l, corr, p);
    const float pv = g.round_weights ? HdHalfToFloat(HdFloatToHalf(p)) : p;
    for (int i = 0, d = lane; d < g.head_dim; ++i, d += 32) {
      acc[i] = HdFma(acc[i], corr, HdMul(pv, hd::KvValue(g.codec, vrun, g.vector_bytes, false, t, d)));
    }
    m = m_new;
  }
  // The warps' states merged in warp order.
  if (lane == 0) {
    wm[warp] = m;
    wl[warp] = l;
  }
  for (int i = 0, d = lane; d < g.head_dim; ++i, d += 32) wacc[warp][d] = acc[i];
  __syncthreads();
  if (warp != 0) return;
  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) M = wl[w] > 0.0f && wm[w] > M ? wm[w] : M;
  float L = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    if (wl[w] > 0.0f) L = HdFma(wl[w], expf(wm[w] - M), L);
  }
  float* out = part + (static_cast<size_t>(h) * g.n_blocks + bi) * (g.head_dim + 2);
  for (int d = lane; d < g.head_dim; d += 32) {
    float a = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (wl[w] > 0.0f) a = HdFma(wacc[w][d], expf(wm[w] - M), a);
    }
    out[2 + d] = a;
  }
  if (lane == 0) {
    out[0] = M;
    out[1] = L;
  }
}

// grid n_heads, head_dim threads (<= 256): folds the blocks' partials in block order.
__global__ void AttnFoldKernel(const float* part, int n_blocks, int head_dim, float* m, float* l, float* acc) {
  const int h = blockIdx.x, d = threadIdx.x;
  float M = m[h], L = l[h];
  float a = d < head_dim ? acc[static_cast<size_t>(h) * head_dim + d] : 0.0f;
  for (int b = 0; b < n_blocks; ++b) {
    const float* p = part + (static_cast<size_t>(h) * n_blocks + b) * (head_dim + 2);
    if (!(p[1] > 0.0f)) continue;
    const float m_new = p[0] > M ? p[0] : M;
    const float x = expf(M - m_new), y = expf(p[0] - m_new);
    L = HdFma(L, x, HdMul(p[1], y));
    if (d < head_dim) a = HdFma(a, x, HdMul(p[2 + d], y));
    M = m_new;
  }
  if (d < head_dim) acc[static_cast<size_t>(h) * head_dim + d] = a;
  __syncthreads();
  if (d == 0) {
    m[h] = M;
    l[h] = L;
  }
}

__global__ void AttnEndKernel(const float* l, const float* acc, int head_dim, float* out) {
  const int h = blockIdx.x, d = threadIdx.x;
  if (d >= head_dim) return;
  const float L = l[h];
  out[static_cast<size_t>(h) * head_dim + d] = L > 0.0f ? HdDiv(acc[static_cast<size_t>(h) * head_dim + d], L) : 0.0f;
}

// ---- the executor -----------------------------------------------------------------------

class CudaExecutor final : public Executor {
 public:
  explicit CudaExecutor(cudaStream_t stream) : stream_(stream) {}
  ~CudaExecutor() override {
    cudaStreamSynchronize(stream_);
    ReapRetired(true);
    for (auto& [p, c] : constants_) cudaFree(c.dev);
    for (auto& [p, a] : acts_) {
      for (void* b : a.conv) cudaFree(b);
      cudaFree(a.x);
    }
    for (auto& [p, s] : attn_) cudaFree(s.mem);
    cudaFree(scratch_);
    cudaFree(small_);
    cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "cuda"; }
  int threads() const override { return 1; }
  Tier tier_for(const MemoryManager& mm) const override { return Tier::kDevice; }
  bool host_memory() const override { return false; }
  bool SupportsKv(const KvCodecDesc& c) const override {
    if (c.head_dim <= 0 || c.head_dim > 256) return false;
    if (c.codec_id == hd::kKvF16) return true;
    return (c.codec_id == hd::kKvQ8_0 || c.codec_id == hd::kKvQ4_0) && c.head_dim % 32 == 0;
  }

  void* Allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    Check(cudaMalloc(&p, bytes), "cudaMalloc of executor memory");
    return p;
  }
  void Deallocate(void* p) override {
    if (p == nullptr) return;
    Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    ReapRetired(true);  // the stream is idle: every retired pin may go (before its manager does)
    Check(cudaFree(p), "cudaFree");
  }

  void Upload(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0 || dst == host_src) return;
    Check(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyDefault, stream_), "upload");
  }
  void ReadBack(void* host_dst, const void* src, size_t bytes) override {
    if (bytes > 0 && host_dst != src) {
      Check(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDefault, stream_), "read-back");
    }
    Check(cudaStreamSynchronize(stream_), "read-back");  // a synchronisation point either way
    ReapRetired(true);
  }
  void Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return;
    Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "copy");
  }

  // The device tier's copies complete before Acquire returns (memory/cuda_device_backend.cc).
  void WaitFor(const Pin& pin) override {}
  void Retire(Pin pin) override {
    if (!pin.valid()) return;
    if (cudaStreamQuery(stream_) == cudaSuccess) {  // nothing queued reads it: release now
      ReapRetired(true);
      return;  // pin released on scope exit
    }
    cudaGetLastError();  // cudaErrorNotReady is no error to keep
    cudaEvent_t ev = nullptr;
    Check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    Check(cudaEventRecord(ev, stream_), "cudaEventRecord");
    retired_.push_back({ev, std::move(pin)});
    ReapRetired(false);
  }
  void Synchronize() override {
    Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    ReapRetired(true);
  }

  void GetRow(const MatrixView& w, int64_t r, float* out) override {
    if (w.cols == 0) return;
    if (!OnDevice(w.data)) {  // the embedding read in place from the file: one row on the host
      std::vector<float> row(static_cast<size_t>(w.cols));
      kernels::GetRow(w, r, row.data());
      Upload(out, row.data(), row.size() * sizeof(float));  // staged before it returns
      return;
    }
    CheckType(w.type);
    GetRowKernel<<<Blocks(w.cols), kThreads, 0, stream_>>>(w.type, static_cast<const uint8_t*>(w.Row(r)), w.cols, out);
    Launched("GetRow");
  }

  void RmsNorm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* out) override {
    if (rows == 0 || n == 0) return;
    const float* dw = w != nullptr ? Constant(w, static_cast<size_t>(n) * sizeof(float)) : nullptr;
    RmsNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream_>>>(x, dw, n, eps, out);
    Launched("RmsNorm");
  }

  void Rope(const RopeParams& p, int64_t pos, float* x, int n_heads, int head_dim) override {
    if (p.n_dims == 0 || n_heads == 0) return;
    std::vector<float> cos_sin(static_cast<size_t>(p.n_dims));
    RopeAngles(p, pos, cos_sin.data());
    float* dev = Small(cos_sin.size());
    Upload(dev, cos_sin.data(), cos_sin.size() * sizeof(float));
    RopeKernel<<<Blocks(static_cast<int64_t>(n_heads) * (p.n_dims / 2)), kThreads, 0, stream_>>>(
        dev, x, n_heads, head_dim, p.n_dims, p.mode == RopeMode::kNorm);
    Launched("Rope");
  }

  void Add(float* y, const float* x, size_t n) override {
    if (n == 0) return;
    const float* dx = OnDevice(x) ? x : Constant(x, n * sizeof(float));  // biases come from the file
    AddKernel<<<Blocks(static_cast<int64_t>(n)), kThreads, 0, stream_>>>(y, dx, static_cast<int64_t>(n));
    Launched("Add");
  }

  void SwiGlu(const float* gate, const float* up, float* out, int64_t n) override {
    if (n == 0) return;
    SwiGluKernel<<<Blocks(n), kThreads, 0, stream_>>>(gate, up, out, n);
    Launched("SwiGlu");
  }

  void SetActivation(ActivationRow& row, const float* x, int64_t n) override {
    DevAct& a = acts_[&row];
    if (a.cap < n) {
      Deallocate(a.x);
      for (void*& b : a.conv) {
        Deallocate(b);
        b = nullptr;
      }
      a.x = static_cast<float*>(Allocate(static_cast<size_t>(n) * sizeof(float)));
      a.cap = n;
    }
    a.n = n;
    for (bool& r : a.ready) r = false;
    Copy(a.x, x, static_cast<size_t>(n) * sizeof(float));
  }

  void MatVec(std::span<const MatVecJob> jobs) override {
    for (const MatVecJob& j : jobs) Product(*j.w, *j.x, j.y);
  }

  void MatMul(std::span<const MatMulJob> jobs) override {
    for (const MatMulJob& j : jobs) {
      for (int t = 0; t < j.n; ++t) Product(*j.w, *j.x[t], j.y + static_cast<size_t>(t) * j.y_stride);
    }
  }

  void RouteTopK(const float* logits, int n_expert, int k, bool normalize, int* ids, float* weights) override {
    std::vector<float> host(static_cast<size_t>(n_expert));
    ReadBack(host.data(), logits, host.size() * sizeof(float));
    kernels::RouteTopK(host.data(), n_expert, k, normalize, ids, weights);
  }

  void CombineExperts(const float* weights, const float* rows, int k, int64_t n, float* out) override {
    if (n == 0) return;
    float* w = Small(static_cast<size_t>(k));
    Upload(w, weights, static_cast<size_t>(k) * sizeof(float));
    CombineKernel<<<Blocks(n), kThreads, 0, stream_>>>(w, rows, k, n, out);
    Launched("CombineExperts");
  }

  void AppendKv(const KvVectorKernels& codec, const KvWriteSlot& slot, const float* k, const float* v) override {
    const KvCodecDesc& c = codec.desc();
    if (!SupportsKv(c)) Refuse("does not take this KV type (f16, q8_0 and q4_0 only)");
    const int units = c.codec_id == hd::kKvF16 ? c.head_dim : c.head_dim / 32;
    AppendKvKernel<<<Blocks(2 * slot.n_kv_heads * units), kThreads, 0, stream_>>>(
        c.codec_id, reinterpret_cast<uint8_t*>(slot.k), reinterpret_cast<uint8_t*>(slot.v), slot.head_stride,
        slot.n_kv_heads, slot.tile_lane, k, v, c.head_dim);
    Launched("AppendKv");
  }

  void AttentionBegin(const KvVectorKernels& codec, const AttentionParams& p, const float* q,
                      AttentionState* st) override {
    if (!SupportsKv(codec.desc())) Refuse("does not take this KV type (f16, q8_0 and q4_0 only)");
    DevAttn& s = State(st, p);
    AttnPrepareKernel<<<static_cast<unsigned>(p.n_heads), 32, 0, stream_>>>(
        codec.desc().codec_id, q, s.q, p.n_heads, p.head_dim, p.round_query_f16, s.m, s.l, s.acc);
    Launched("AttentionBegin");
  }

  void AttentionStep(const KvVectorKernels& codec, AttentionVisit visit, const AttentionParams& p,
                     const PagedKvView& kv, AttentionState* st) override {
    // Every visit but the second pass folds the blocks in: the online form's result, in
    // block order. The two-pass form's values pass and softmax have nothing left to do.
    if (visit == AttentionVisit::kValues || kv.n_blocks == 0) return;
    DevAttn& s = attn_.at(st);
    // At most kChunkBlocks blocks per launch (a whole resident layer may come as one
    // batch): bounded scratch and grid; the fold is sequential, so the bits are the same.
    constexpr int kChunkBlocks = 1024;
    for (int b0 = 0; b0 < kv.n_blocks; b0 += kChunkBlocks) {
      const int nb = std::min(kChunkBlocks, kv.n_blocks - b0);
      AttnGeom g{codec.desc().codec_id, p.n_heads, p.n_kv_heads, p.head_dim, kv.block_tokens, kv.first_block + b0,
                 kv.n_tokens, nb, kv.vector_bytes, kv.key_tiles, p.round_weights_f16, p.scale, p.query_pos};
      const size_t part_floats = static_cast<size_t>(p.n_heads) * nb * (p.head_dim + 2);
      const size_t ptr_bytes = static_cast<size_t>(nb) * sizeof(void*);
      auto* base = static_cast<uint8_t*>(Scratch(ptr_bytes + 256 + part_floats * sizeof(float)));
      auto* ptrs = reinterpret_cast<const uint8_t**>(base);
      auto* part = reinterpret_cast<float*>(base + (ptr_bytes + 255) / 256 * 256);
      Upload(ptrs, kv.blocks + b0, ptr_bytes);
      AttnBlockKernel<<<dim3(static_cast<unsigned>(p.n_heads), static_cast<unsigned>(nb)), kThreads, 0, stream_>>>(
          g, ptrs, s.q, part);
      Launched("attention blocks");
      AttnFoldKernel<<<static_cast<unsigned>(p.n_heads), 256, 0, stream_>>>(part, nb, p.head_dim, s.m, s.l, s.acc);
      Launched("attention fold");
    }
  }

  void AttentionSoftmax(const AttentionParams& p, AttentionState* st) override {}

  void AttentionStepMulti(const KvVectorKernels& codec, AttentionVisit visit, const AttentionParams* ps,
                          AttentionState* const* sts, int64_t n, const PagedKvView& kv) override {
    for (int64_t i = 0; i < n; ++i) AttentionStep(codec, visit, ps[i], kv, sts[i]);
  }
  void AttentionSoftmaxMulti(const AttentionParams* ps, AttentionState* const* sts, int64_t n) override {}

  void AttentionEnd(const KvVectorKernels& codec, const AttentionParams& p, AttentionState* st, float* out) override {
    DevAttn& s = attn_.at(st);
    AttnEndKernel<<<static_cast<unsigned>(p.n_heads), 256, 0, stream_>>>(s.l, s.acc, p.head_dim, out);
    Launched("AttentionEnd");
  }

 private:
  struct Retired {
    cudaEvent_t ev;
    Pin pin;
  };
  struct DevAct {
    float* x = nullptr;
    int64_t n = 0, cap = 0;
    void* conv[4] = {};  // F16, BF16, Q8_0, Q8_K
    bool ready[4] = {};
  };
  struct DevAttn {
    void* mem = nullptr;
    size_t cap = 0;
    float *q = nullptr, *m = nullptr, *l = nullptr, *acc = nullptr;
  };
  struct DevConstant {
    void* dev = nullptr;
    size_t bytes = 0;
  };

  static void CheckType(WeightType t) {
    switch (t) {
      case WeightType::kF32: case WeightType::kF16: case WeightType::kBF16: case WeightType::kQ8_0:
      case WeightType::kQ4_0: case WeightType::kQ4_K: case WeightType::kQ5_K: case WeightType::kQ6_K: return;
      default: break;
    }
    std::fprintf(stderr, "error: the CUDA executor does not read %s weights yet (F32, F16, BF16, Q8_0, Q4_0, Q4_K, "
                 "Q5_K, Q6_K)\n", WeightTypeName(t));
    std::fflush(stderr);
    std::_Exit(1);
  }

  void Launched(const char* what) { Check(cudaGetLastError(), what); }

  static bool OnDevice(const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }

  // A host operand (constant model data) as a device copy, made once.
  const float* Constant(const void* host, size_t bytes) {
    if (OnDevice(host)) return static_cast<const float*>(host);
    DevConstant& c = constants_[host];
    if (c.bytes < bytes) {
      if (c.dev != nullptr) Deallocate(c.dev);
      c.dev = Allocate(bytes);
      c.bytes = bytes;
      // On the compute stream: the kernels queued next must see it (constant model data,
      // so the source outlives the copy).
      Check(cudaMemcpyAsync(c.dev, host, bytes, cudaMemcpyHostToDevice, stream_), "upload of a constant");
    }
    return static_cast<const float*>(c.dev);
  }

  float* Small(size_t floats) {
    if (small_cap_ < floats) {
      Deallocate(small_);
      small_ = static_cast<float*>(Allocate(floats * sizeof(float)));
      small_cap_ = floats;
    }
    return small_;
  }

  void* Scratch(size_t bytes) {
    if (scratch_cap_ < bytes) {
      Deallocate(scratch_);
      scratch_ = Allocate(bytes);
      scratch_cap_ = bytes;
    }
    return scratch_;
  }

  DevAttn& State(const AttentionState* st, const AttentionParams& p) {
    DevAttn& s = attn_[st];
    const size_t qd = static_cast<size_t>(p.n_heads) * p.head_dim;
    const size_t need = (3 * qd + 2 * static_cast<size_t>(p.n_heads)) * sizeof(float);
    if (s.cap < need) {
      Deallocate(s.mem);
      s.mem = Allocate(need);
      s.cap = need;
    }
    auto* f = static_cast<float*>(s.mem);
    s.q = f;
    s.acc = f + qd;
    s.m = f + 2 * qd;
    s.l = f + 2 * qd + p.n_heads;
    return s;
  }

  // x converted for w's type (once per type per SetActivation).
  const void* Converted(DevAct& a, WeightType w) {
    const WeightType act = ActivationType(w);
    if (act == WeightType::kF32) return a.x;
    const int slot = act == WeightType::kF16 ? 0 : act == WeightType::kBF16 ? 1 : act == WeightType::kQ8_0 ? 2 : 3;
    if (a.ready[slot]) return a.conv[slot];
    if (a.conv[slot] == nullptr) a.conv[slot] = Allocate(RowBytes(act, (a.cap + kQkK - 1) / kQkK * kQkK));
    switch (act) {
      case WeightType::kF16:
      case WeightType::kBF16:
        ToHalfKernel<<<Blocks(a.n), kThreads, 0, stream_>>>(a.x, static_cast<uint16_t*>(a.conv[slot]), a.n,
                                                           act == WeightType::kBF16);
        break;
      case WeightType::kQ8_0:
        QuantizeQ8_0Kernel<<<Blocks(a.n / kQk0), kThreads, 0, stream_>>>(a.x, static_cast<BlockQ8_0*>(a.conv[slot]),
                                                                        a.n / kQk0);
        break;
      default:
        QuantizeQ8_KKernel<<<Blocks(a.n / kQkK, 32), 32, 0, stream_>>>(a.x, static_cast<BlockQ8_K*>(a.conv[slot]),
                                                                      a.n / kQkK);
        break;
    }
    Launched("activation conversion");
    a.ready[slot] = true;
    return a.conv[slot];
  }

  void Product(const MatrixView& w, ActivationRow& row, float* y) {
    if (w.rows == 0) return;
    CheckType(w.type);
    auto it = acts_.find(&row);
    if (it == acts_.end()) Refuse("got an activation row that SetActivation did not fill");
    DevAct& a = it->second;
    const void* x = Converted(a, w.type);
    const auto* wd = static_cast<const uint8_t*>(OnDevice(w.data) ? w.data : Constant(w.data, w.rows * w.row_bytes));
    const unsigned grid = static_cast<unsigned>((w.rows + kWarps - 1) / kWarps);
    const int64_t nb32 = w.cols / kQk0, nbk = w.cols / kQkK;
    switch (w.type) {
      case WeightType::kQ8_0:
        DotBlocksKernel<BlockQ8_0, BlockQ8_0, hd::ChainQ8_0, hd::IntsK, hd::IntsQ8_0><<<grid, kThreads, 0, stream_>>>(
            wd, w.row_bytes, w.rows, static_cast<const BlockQ8_0*>(x), nb32, y);
        break;
      case WeightType::kQ4_0:
        DotBlocksKernel<BlockQ4_0, BlockQ8_0, hd::ChainQ4_0, int, hd::IntsQ4_0><<<grid, kThreads, 0, stream_>>>(
            wd, w.row_bytes, w.rows, static_cast<const BlockQ8_0*>(x), nb32, y);
        break;
      case WeightType::kQ4_K:
        DotBlocksKernel<BlockQ4_K, BlockQ8_K, hd::ChainQ4_K, hd::IntsK, hd::IntsQ4_K><<<grid, kThreads, 0, stream_>>>(
            wd, w.row_bytes, w.rows, static_cast<const BlockQ8_K*>(x), nbk, y);
        break;
      case WeightType::kQ5_K:
        DotBlocksKernel<BlockQ5_K, BlockQ8_K, hd::ChainQ5_K, hd::IntsK, hd::IntsQ5_K><<<grid, kThreads, 0, stream_>>>(
            wd, w.row_bytes, w.rows, static_cast<const BlockQ8_K*>(x), nbk, y);
        break;
      case WeightType::kQ6_K:
        DotBlocksKernel<BlockQ6_K, BlockQ8_K, hd::ChainQ6_K, hd::IntsK, hd::IntsQ6_K><<<grid, kThreads, 0, stream_>>>(
            wd, w.row_bytes, w.rows, static_cast<const BlockQ8_K*>(x), nbk, y);
        break;
      case WeightType::kF32:
        DotFloatKernel<WeightType::kF32><<<grid, kThreads, 0, stream_>>>(wd, w.row_bytes, w.rows, x, w.cols, y);
        break;
      case WeightType::kF16:
        DotFloatKernel<WeightType::kF16><<<grid, kThreads, 0, stream_>>>(wd, w.row_bytes, w.rows, x, w.cols, y);
        break;
      default:
        DotFloatKernel<WeightType::kBF16><<<grid, kThreads, 0, stream_>>>(wd, w.row_bytes, w.rows, x, w.cols, y);
        break;
    }
    Launched("matrix product");
  }

  void ReapRetired(bool all) {
    while (!retired_.empty()) {
      Retired& r = retired_.front();
      if (!all && cudaEventQuery(r.ev) != cudaSuccess) {
        cudaGetLastError();  // cudaErrorNotReady is not an error to keep
        break;
      }
      cudaEventDestroy(r.ev);
      r.pin.Release();
      retired_.pop_front();
    }
  }

  cudaStream_t stream_;
  std::deque<Retired> retired_;
  std::unordered_map<const ActivationRow*, DevAct> acts_;
  std::unordered_map<const AttentionState*, DevAttn> attn_;
  std::unordered_map<const void*, DevConstant> constants_;
  float* small_ = nullptr;
  size_t small_cap_ = 0;
  void* scratch_ = nullptr;
  size_t scratch_cap_ = 0;
};

}  // namespace

std::unique_ptr<Executor> MakeCudaExecutor(std::string* why_not) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    if (why_not != nullptr) {
      *why_not = std::string("no CUDA device is visible (") + (err != cudaSuccess ? cudaGetErrorString(err) : "none") + ")";
    }
    cudaGetLastError();
    return nullptr;
  }
  cudaStream_t stream = nullptr;
  err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) {
    if (why_not != nullptr) *why_not = std::string("cudaStreamCreate: ") + cudaGetErrorString(err);
    return nullptr;
  }
  return std::make_unique<CudaExecutor>(stream);
}

}  // namespace tierkv::kernels
