// tests/kernels/kernel_test_util.h
//
// Random weight matrices of every GGUF weight type and random activations, shared by
// the matrix-product tests and the executor conformance suite.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/executor.h"
#include "kernels/fp16.h"
#include "kernels/matvec.h"

namespace tierkv::kernels {

struct OwnedMatrix {
  std::vector<uint8_t> bytes;
  MatrixView view;
};

// A rows x cols matrix of `type` from random f32 values (quantized ones by simple
// per-block rounding; the exact codes do not matter here).
inline OwnedMatrix RandomMatrix(WeightType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  OwnedMatrix m;
  const size_t rb = RowBytes(type, cols);
  m.bytes.resize(rb * static_cast<size_t>(rows));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : m.bytes) b = static_cast<uint8_t>(byte(rng));
  const WeightTypeInfo& info = GetWeightTypeInfo(type);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = m.bytes.data() + r * rb;
    if (type == WeightType::kF32) {
      for (int64_t i = 0; i < cols; ++i) {
        const float v = normal(rng);
        std::memcpy(row + 4 * i, &v, 4);
      }
    } else if (type == WeightType::kF16 || type == WeightType::kBF16) {
      for (int64_t i = 0; i < cols; ++i) {
        const float v = normal(rng);
        const uint16_t h = type == WeightType::kF16 ? F32ToF16(v) : F32ToBf16(v);
        std::memcpy(row + 2 * i, &h, 2);
      }
    } else {
      // Sane fp16 scales at the places each layout keeps them, a different one per block
      // (so that a kernel that takes another row's or block's scale gives other bits).
      std::uniform_real_distribution<float> spread(0.5f, 1.5f);
      for (int64_t b = 0; b < cols / info.block_size; ++b) {
        uint8_t* blk = row + b * info.block_bytes;
        const uint16_t d = F32ToF16(0.01f * spread(rng)), dmin = F32ToF16(0.002f * spread(rng));
        if (type == WeightType::kQ6_K) {
          std::memcpy(blk + 208, &d, 2);
        } else if (type == WeightType::kQ3_K) {
          std::memcpy(blk + 108, &d, 2);
        } else if (type == WeightType::kQ2_K) {
          std::memcpy(blk + 80, &d, 2);
          std::memcpy(blk + 82, &dmin, 2);
        } else {
          std::memcpy(blk, &d, 2);
          if (type == WeightType::kQ4_K || type == WeightType::kQ5_K || type == WeightType::kQ4_1 ||
              type == WeightType::kQ5_1) {
            std::memcpy(blk + 2, &dmin, 2);  // K-quant dmin, Q4_1 / Q5_1 m
          }
        }
      }
    }
  }
  m.view = MatrixView{type, m.bytes.data(), cols, rows, rb};
  return m;
}

// host -> a new array in the executor's memory, and an array's contents back to the host
// (the executor tests' way in and out: a device executor runs them unchanged).
template <typename T>
ExecArray<T> PutArray(Executor& e, const std::vector<T>& host) {
  ExecArray<T> a(&e, host.size());
  e.Upload(a.data(), host.data(), host.size() * sizeof(T));
  return a;
}
template <typename T>
std::vector<T> GetArray(Executor& e, const ExecArray<T>& a) {
  std::vector<T> host(a.size());
  e.ReadBack(host.data(), a.data(), a.size() * sizeof(T));
  return host;
}

inline std::vector<float> RandomVector(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

}  // namespace tierkv::kernels
