// kernels/matvec.cc
#include "kernels/matvec.h"

#include <algorithm>
#include <cassert>
#include <cstring>

namespace tierkv::kernels {
namespace {

int SlotOf(WeightType act) {
  switch (act) {
    case WeightType::kF32: return 0;
    case WeightType::kF16: return 1;
    case WeightType::kBF16: return 2;
    case WeightType::kQ8_0: return 3;
    case WeightType::kQ8_K: return 4;
    case WeightType::kQ8_1: return 5;
    default: break;
  }
  assert(false && "not an activation type");
  return 0;
}

// Below this many multiply-adds in one MatMulMany (or MatVecMany) a fork-join costs more
// than it saves.
constexpr int64_t kMinParallelMacs = int64_t{1} << 18;

// Multiply-adds per parallel task: at least ~16K (to amortise the hand-out), and big
// enough that a job is about 8 tasks per thread: every task costs a claim on a cache line
// the threads share, which for a 0.5 us task is as much as the task.
int64_t MacsPerTask(int64_t total_macs, int threads) {
  return std::max<int64_t>(int64_t{1} << 14, total_macs / (8 * std::max(threads, 1)));
}

// Rows a MatMul chunk dots with every token before moving on: about 24 KiB of them (a
// multiple of 16 rows, the multi-row kernels' group), so they stay in L1 while they do.
int64_t RowsInCache(size_t row_bytes) {
  const int64_t rows = static_cast<int64_t>((24 * 1024) / std::max<size_t>(row_bytes, 1));
  return std::max<int64_t>(16, rows / 16 * 16);
}

struct MulChunk {
  const MatMulJob* job;
  DotFn dot;
  DotRowsFn dot_rows;
  DotRowsTokensFn dot_tokens;  // set when the job has several tokens (or batched sums) and the type a kernel
  const void* const* acts;  // [job->n]
  int64_t begin, end;
};

// Whether llama.cpp would multiply this job's matrix through its repacked gemm
// (MatMulJob::llama_gemm: Q4_K with a multiple of 8 rows).
bool LlamaRepacked(const MatMulJob& j) { return j.llama_gemm && j.w->type == WeightType::kQ4_K && j.w->rows % 8 == 0; }

void RunMulChunk(const MulChunk& c) {
  const MatrixView& w = *c.job->w;
  if (c.dot_tokens != nullptr) {
    // Each row group once for all the tokens.
    c.dot_tokens(w.Row(c.begin), w.row_bytes, c.end - c.begin, c.acts, c.job->n, w.cols,
                 c.job->y + c.begin, c.job->y_stride);
    return;
  }
  // One token: the whole chunk in one call (the multi-row kernels' longest run).
  const int64_t sub = c.job->n == 1 ? c.end - c.begin : RowsInCache(w.row_bytes);
  for (int64_t r0 = c.begin; r0 < c.end; r0 += sub) {
    const int64_t r1 = std::min(c.end, r0 + sub);
    for (int t = 0; t < c.job->n; ++t) {
      float* y = c.job->y + static_cast<size_t>(t) * c.job->y_stride;
      if (c.dot_rows != nullptr) {
        c.dot_rows(w.Row(r0), w.row_bytes, r1 - r0, c.acts[t], w.cols, y + r0);
      } else {
        for (int64_t r = r0; r < r1; ++r) y[r] = c.dot(w.Row(r), c.acts[t], w.cols);
      }
    }
  }
}

}  // namespace

void ActivationRow::Set(const float* x, int64_t n) {
  x_.assign(x, x + n);
  n_ = n;
  ready_.fill(false);
}

const void* ActivationRow::For(WeightType weight_type, bool q8k_ties_away) {
  const WeightType act = ActivationType(weight_type);
  if (act == WeightType::kF32) return x_.data();
  q8k_ties_away = q8k_ties_away && act == WeightType::kQ8_K;
  const int slot = q8k_ties_away ? kSlots - 1 : SlotOf(act);
  if (!ready_[static_cast<size_t>(slot)]) {
    std::vector<uint8_t>& b = buf_[static_cast<size_t>(slot)];
    b.resize(RowBytes(act, n_));
    if (q8k_ties_away) {
      QuantizeQ8KTiesAway(x_.data(), b.data(), n_);
    } else {
      QuantizeActivation(act, x_.data(), b.data(), n_);
    }
    ready_[static_cast<size_t>(slot)] = true;
  }
  return buf_[static_cast<size_t>(slot)].data();
}

void MatMulMany(std::span<const MatMulJob> jobs, ThreadPool* pool) {
  const SimdLevel level = ActiveSimdLevel();
  int64_t macs = 0;
  size_t n_acts = 0;
  for (const MatMulJob& j : jobs) {
    macs += j.w->rows * j.w->cols * j.n;
    n_acts += static_cast<size_t>(j.n);
  }
  // The conversions happen here, on this thread.
  std::vector<const void*> acts;
  acts.reserve(n_acts);
  for (const MatMulJob& j : jobs) {
    const int grouped = LlamaRepacked(j) ? j.n - j.n % 4 : 0;
    for (int t = 0; t < j.n; ++t) {
      assert(j.x[t]->size() == j.w->cols);
      acts.push_back(j.x[t]->For(j.w->type, /*q8k_ties_away=*/t < grouped));
    }
  }
  if (macs < kMinParallelMacs) pool = nullptr;
  const int threads = pool != nullptr ? pool->size() : 1;
  const int64_t task_macs = MacsPerTask(macs, threads);
  std::vector<MulChunk> chunks;
  size_t first_act = 0;
  int64_t left = macs;  // multiply-adds not yet in a chunk
  for (const MatMulJob& j : jobs) {
    const DotFn dot = GetDotFn(j.w->type, level);
    DotRowsFn dot_rows = GetDotRowsFn(j.w->type, level);
    if (j.n == 1 && j.w->row_bytes >= kLongRowBytes && !DotRowsFnStreams(j.w->type, level)) dot_rows = nullptr;
    const bool batched = j.sums == TokenSums::kBatched && BatchedSumsDiffer(j.w->type, level);
    DotRowsTokensFn dot_tokens = j.n > 1 || batched ? GetDotRowsTokensFn(j.w->type, level, j.sums) : nullptr;
    if (LlamaRepacked(j) && j.n >= 4) {
      if (DotRowsTokensFn g = GetLlamaGemmRowsTokensFn(j.w->type, level)) dot_tokens = g;
    }
    const int64_t row_macs = std::max<int64_t>(j.w->cols * std::max(j.n, 1), 1);
    // Guided: a chunk takes 1 / (2 * threads) of the work not yet in a chunk, down to a
    // quarter of task_macs (and ~16K multiply-adds), so the first chunks are large, the
    // last ones small, and the threads end within a small chunk of each other (with equal
    // chunks the thread that finished first waited half a chunk on average: 10 - 20% of
    // the 32000-row output projection of a decode step). Chunks are whole groups of 16
    // rows (the multi-row kernels' groups). Which rows share a chunk never changes a bit.
    for (int64_t b = 0; b < j.w->rows;) {
      const int64_t want = std::max({int64_t{1} << 14, task_macs / 4, left / (2 * threads)});
      int64_t step = std::max<int64_t>(1, want / row_macs);
      if (step >= 16 || dot_tokens != nullptr) step = (step + 15) / 16 * 16;
      const int64_t e = std::min(j.w->rows, b + step);
      chunks.push_back({&j, dot, dot_rows, dot_tokens, acts.data() + first_act, b, e});
      left -= (e - b) * row_macs;
      b = e;
    }
    first_act += static_cast<size_t>(j.n);
  }
  if (pool == nullptr || chunks.size() == 1) {
    for (const MulChunk& c : chunks) RunMulChunk(c);
    return;
  }
  pool->ParallelFor(static_cast<int64_t>(chunks.size()),
                    [&](int64_t i) { RunMulChunk(chunks[static_cast<size_t>(i)]); });
}

void MatVecMany(std::span<const MatVecJob> jobs, ThreadPool* pool) {
  std::vector<MatMulJob> mul;
  mul.reserve(jobs.size());
  for (const MatVecJob& j : jobs) {
    mul.push_back({j.w, &j.x, 1, j.y, static_cast<size_t>(j.w->rows), TokenSums::kPerToken});
  }
  MatMulMany(mul, pool);
}

void MatVec(const MatrixView& w, ActivationRow& x, float* y, ThreadPool* pool) {
  const MatVecJob job{&w, &x, y};
  MatVecMany({&job, 1}, pool);
}

void MatVec(const MatrixView& w, const float* x, float* y, ThreadPool* pool) {
  ActivationRow row;
  row.Set(x, w.cols);
  MatVec(w, row, y, pool);
}

void GetRow(const MatrixView& w, int64_t r, float* out) { DequantizeRow(w.type, w.Row(r), out, w.cols); }

}  // namespace tierkv::kernels
