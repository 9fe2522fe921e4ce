// kernels/matvec.h
//
// y = W x for one token, with W in any supported weight type read in place (from the
// mmap'd GGUF) and dequantized on the fly inside the dot products. Numerics follow
// llama.cpp's CPU backend: x is first converted to ActivationType(W.type) (f16, bf16,
// Q8_0 or Q8_K; see quant.h), then every row is one DotRow. Rows are independent, so
// the result does not depend on the thread count or scheduling.
//
// Thread-safety: MatVec* are reentrant; an ActivationRow is not thread-safe while it is
// being prepared, and read-only afterwards.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/quant.h"
#include "kernels/thread_pool.h"

namespace tierkv::kernels {

// A row-major weight matrix: `rows` rows of `cols` values, row r at data + r * row_bytes.
// (ggml: cols = ne[0], rows = ne[1].)
struct MatrixView {
  WeightType type = WeightType::kF32;
  const void* data = nullptr;
  int64_t cols = 0;
  int64_t rows = 0;
  size_t row_bytes = 0;

  const void* Row(int64_t r) const { return static_cast<const uint8_t*>(data) + static_cast<size_t>(r) * row_bytes; }
};

// One activation vector, converted on demand to each activation type the matrices
// reading it need (Q, K and V share one conversion; so do gate and up).
class ActivationRow {
 public:
  // Takes x[n] (copied). Invalidates earlier conversions.
  void Set(const float* x, int64_t n);
  // x converted for dot products with weights of `weight_type`; with q8k_ties_away (Q8_K
  // activations only) rounded as llama.cpp's repacked gemm rounds them
  // (QuantizeQ8KTiesAway).
  // REQUIRES: Set() called; n divisible by the activation type's block size.
  const void* For(WeightType weight_type, bool q8k_ties_away = false);
  int64_t size() const { return n_; }
  const float* values() const { return x_.data(); }

 private:
  static constexpr int kSlots = 7;  // F32, F16, BF16, Q8_0, Q8_K, Q8_1, Q8_K ties away
  std::vector<float> x_;
  int64_t n_ = 0;
  std::array<std::vector<uint8_t>, kSlots> buf_;
  std::array<bool, kSlots> ready_{};
};

// y[w.rows] = W x. REQUIRES: x.size() == w.cols. pool may be null (single thread).
void MatVec(const MatrixView& w, ActivationRow& x, float* y, ThreadPool* pool);
// Convenience: converts x[w.cols] itself.
void MatVec(const MatrixView& w, const float* x, float* y, ThreadPool* pool);

// Several products in one parallel pass (fewer fork-joins per token).
struct MatVecJob {
  const MatrixView* w;
  ActivationRow* x;  // converted for w before the pass
  float* y;          // [w->rows]
};
void MatVecMany(std::span<const MatVecJob> jobs, ThreadPool* pool);

// Several tokens (a prefill chunk): y[t * y_stride + r] = (W x_t)[r] for t in [0, n).
// The rows are read from memory once for all n tokens (a few rows at a time, each dotted
// with every token while they are in cache) instead of once per token. With
// sums = kPerToken each (row, token) dot product is the one MatVec computes, bit for bit;
// with kBatched (the default) F32, F16 and BF16 weights sum as llama.cpp's batched
// product does (quant.h, TokenSums), even for n = 1.
struct MatMulJob {
  const MatrixView* w;
  ActivationRow* const* x;  // [n], each converted for w before the pass
  int n;
  float* y;
  size_t y_stride;  // >= w->rows
  TokenSums sums = TokenSums::kBatched;
  // llama.cpp's repacked gemm (ModelOptions::llama_attention_sums): for Q4_K matrices
  // whose rows are a multiple of 8, the tokens in whole groups of four from the first
  // (t < n - n % 4) get their Q8_K activations rounded ties-away, as ggml quantizes the
  // rows its gemm takes four at a time; the rest are rounded as for one token.
  bool llama_gemm = false;
};
void MatMulMany(std::span<const MatMulJob> jobs, ThreadPool* pool);

// out[n] = row `r` of W as f32 (token embedding lookup: llama.cpp dequantizes the row).
void GetRow(const MatrixView& w, int64_t r, float* out);

}  // namespace tierkv::kernels
