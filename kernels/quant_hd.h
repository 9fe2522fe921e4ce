// kernels/quant_hd.h
//
// The exact class of the CUDA executor, written once for host and device (kernels/hd.h):
// activation quantization (Q8_0, Q8_K), the row dot products of the model weight types
// (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) and the values of a row (GetRow), each
// giving the bits of the CPU kernels: for the quantized types those of the AVX2 and
// AVX-512 kernels (the two levels agree; kernels/quant.cc's scalar definitions too, but
// for Q8_0, whose scalar form keeps one running sum), for F32 / F16 / BF16 the scalar
// definitions' order (the SIMD levels sum these in orders of their own).
//
// A row dot is split the way a GPU runs it: the integer part of each block (exact in
// any order, so many threads may compute blocks at once), then a short float chain over
// the blocks in row order (one thread, the scalar definition's operations one by one):
//
//   type   Ints per block                 chain step (in block order)       finish
//   Q8_0   lane[8]                        acc[l] = fma(d_w * d_x, lane[l], acc[l])
//                                                                            HsumLanes8(acc)
//   Q4_0   sumi                           sum = fma(sumi, d_w * d_x, sum)    sum + 0
//   Q4_K   sumi, summ (mins)              sum = fma(sumi, d_x * d_w, sum),   sum - mins
//                                         mins = fma(summ, d_x * dmin_w, mins)
//   Q5_K   lane[8], summ                  acc[l] = fma(d_x * d_w, lane[l], acc[l]),
//                                         mins = fma(-(d_x * dmin_w), summ, mins)
//                                                                            HsumLanes8(acc) + mins
//   Q6_K   lane[8] (with the -32 offset)  acc[l] = fma(d_x * d_w, lane[l], acc[l])
//                                                                            HsumLanes8(acc)
//   F32, F16, BF16: lane L (< 8) sums w[i] * x[i] over i = L mod 8 in order, one
//   rounding per product and per sum; the lanes are added as ((0+4)+(2+6))+((1+5)+(3+7)).
//
// tests/kernels/quant_hd_test.cc runs all of this on the CPU against kernels/quant.cc.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "kernels/hd.h"
#include "kernels/quant.h"

namespace tierkv::kernels::hd {

// ---- activation quantization --------------------------------------------------------

// One 32-value block of x to Q8_0 (quant.cc's QuantizeBlock32).
TIERKV_HD void QuantizeBlockQ8_0(const float* x, BlockQ8_0* out) {
  float amax = 0.0f;
  for (int j = 0; j < kQk0; ++j) {
    const float a = HdAbs(x[j]);
    amax = a > amax ? a : amax;
  }
  out->d = HdFloatToHalf(HdDiv(amax, 127.0f));
  const float id = amax != 0.0f ? HdDiv(127.0f, amax) : 0.0f;
  for (int j = 0; j < kQk0; ++j) out->qs[j] = static_cast<int8_t>(HdRoundHalfEven(HdMul(x[j], id)));
}

// One 256-value super-block of x to Q8_K, given the value of largest magnitude (the
// first such value on ties): quant.cc's QuantizeQ8_K<false>.
TIERKV_HD void QuantizeBlockQ8_K(const float* x, float max, BlockQ8_K* out) {
  if (max == 0.0f) {
    out->d = 0.0f;
    for (int j = 0; j < kQkK; ++j) out->qs[j] = 0;
    for (int g = 0; g < kQkK / 16; ++g) out->bsums[g] = 0;
    return;
  }
  const float iscale = HdDiv(-127.0f, max);
  for (int j = 0; j < kQkK; ++j) {
    const int v = HdRoundHalfEven(HdMul(iscale, x[j]));
    out->qs[j] = static_cast<int8_t>(v < 127 ? v : 127);
  }
  for (int g = 0; g < kQkK / 16; ++g) {
    int sum = 0;
    for (int l = 0; l < 16; ++l) sum += out->qs[16 * g + l];
    out->bsums[g] = static_cast<int16_t>(sum);
  }
  out->d = HdDiv(1.0f, iscale);
}

// The value of largest magnitude of a super-block (first on ties), as QuantizeQ8_K picks it.
TIERKV_HD float MaxMagnitude(const float* x, int n) {
  float max = 0.0f, amax = 0.0f;
  for (int j = 0; j < n; ++j) {
    const float ax = HdAbs(x[j]);
    if (ax > amax) {
      amax = ax;
      max = x[j];
    }
  }
  return max;
}

// ---- integer parts of one block -----------------------------------------------------

TIERKV_HD int IntsQ4_0(const BlockQ4_0& w, const BlockQ8_0& x) {
  int s = 0;
  for (int j = 0; j < kQk0 / 2; ++j) {
    s += ((w.qs[j] & 0xf) - 8) * x.qs[j];
    s += ((w.qs[j] >> 4) - 8) * x.qs[j + kQk0 / 2];
  }
  return s;
}

struct IntsK {
  int lane[8];  // Q8_0, Q5_K, Q6_K; Q4_K keeps sumi in lane[0]
  int summ;     // Q4_K, Q5_K: the mins' sum
};

// Lane L: the products of values 4L .. 4L + 3 (the AVX2 / AVX-512 kernels' lanes).
TIERKV_HD IntsK IntsQ8_0(const BlockQ8_0& w, const BlockQ8_0& x) {
  IntsK r{};
  for (int j = 0; j < kQk0; ++j) r.lane[j / 4] += w.qs[j] * x.qs[j];
  return r;
}

TIERKV_HD IntsK IntsQ4_K(const BlockQ4_K& w, const BlockQ8_K& x) {
  IntsK r{};
  const uint8_t* q = w.qs;
  const int8_t* a = x.qs;
  for (int c = 0; c < 4; ++c, q += 32, a += 64) {
    uint8_t sc0, m0, sc1, m1;
    ScaleMinK4(2 * c, w.scales, &sc0, &m0);
    ScaleMinK4(2 * c + 1, w.scales, &sc1, &m1);
    int lo = 0, hi = 0;
    for (int l = 0; l < 32; ++l) {
      lo += (q[l] & 0xf) * a[l];
      hi += (q[l] >> 4) * a[l + 32];
    }
    r.lane[0] += sc0 * lo + sc1 * hi;
    r.summ += m0 * (x.bsums[4 * c] + x.bsums[4 * c + 1]) + m1 * (x.bsums[4 * c + 2] + x.bsums[4 * c + 3]);
  }
  return r;
}

TIERKV_HD IntsK IntsQ5_K(const BlockQ5_K& w, const BlockQ8_K& x) {
  IntsK r{};
  for (int c = 0; c < 8; ++c) {
    uint8_t sc, m;
    ScaleMinK4(c, w.scales, &sc, &m);
    r.summ += m * (x.bsums[2 * c] + x.bsums[2 * c + 1]);
    const uint8_t* q = w.qs + 32 * (c / 2);
    for (int l = 0; l < 32; ++l) {
      const int code = (c % 2 == 0 ? q[l] & 0xf : q[l] >> 4) | (((w.qh[l] >> c) & 1) << 4);
      r.lane[l / 4] += sc * code * x.qs[32 * c + l];
    }
  }
  return r;
}

TIERKV_HD IntsK IntsQ6_K(const BlockQ6_K& w, const BlockQ8_K& x) {
  IntsK r{};
  const int8_t* sc = w.scales;
  for (int e = 0; e < kQkK; ++e) {
    const int h = e / 128, k = (e % 128) / 32, b = e % 32;
    const uint8_t ql = w.ql[64 * h + 32 * (k & 1) + b];
    const int q = ((k < 2 ? ql : ql >> 4) & 0xf) | (((w.qh[32 * h + b] >> (2 * k)) & 3) << 4);
    r.lane[b / 4] += sc[e / 16] * q * x.qs[e];
  }
  for (int l = 0; l < 8; ++l) r.lane[l] -= 32 * (sc[2 * l] * x.bsums[2 * l] + sc[2 * l + 1] * x.bsums[2 * l + 1]);
  return r;
}

// ---- the float chains ---------------------------------------------------------------

struct ChainQ8_0 {
  float acc[8] = {};
  TIERKV_HD void Add(const IntsK& i, const BlockQ8_0& w, const BlockQ8_0& x) {
    const float d = HdMul(HdHalfToFloat(w.d), HdHalfToFloat(x.d));
    for (int l = 0; l < 8; ++l) acc[l] = HdFma(d, static_cast<float>(i.lane[l]), acc[l]);
  }
  TIERKV_HD float Finish() const { return HsumLanes8(acc); }
};

struct ChainQ4_0 {
  float sum = 0.0f;
  TIERKV_HD void Add(int sumi, const BlockQ4_0& w, const BlockQ8_0& x) {
    sum = HdFma(static_cast<float>(sumi), HdMul(HdHalfToFloat(w.d), HdHalfToFloat(x.d)), sum);
  }
  TIERKV_HD float Finish() const { return HdAdd(sum, 0.0f); }
};

struct ChainQ4_K {
  float sum = 0.0f, mins = 0.0f;
  TIERKV_HD void Add(const IntsK& i, const BlockQ4_K& w, const BlockQ8_K& x) {
    sum = HdFma(static_cast<float>(i.lane[0]), HdMul(x.d, HdHalfToFloat(w.d)), sum);
    mins = HdFma(static_cast<float>(i.summ), HdMul(x.d, HdHalfToFloat(w.dmin)), mins);
  }
  TIERKV_HD float Finish() const { return HdAdd(sum, -mins); }
};

// Q5_K (with mins) and Q6_K (without).
template <bool kMins>
struct ChainLanes8 {
  float acc[8] = {};
  float mins = 0.0f;
  template <typename Block>
  TIERKV_HD void Add(const IntsK& i, const Block& w, const BlockQ8_K& x) {
    const float d = HdMul(x.d, HdHalfToFloat(w.d));
    for (int l = 0; l < 8; ++l) acc[l] = HdFma(d, static_cast<float>(i.lane[l]), acc[l]);
    if constexpr (kMins) mins = HdFma(-HdMul(x.d, HdHalfToFloat(w.dmin)), static_cast<float>(i.summ), mins);
  }
  TIERKV_HD float Finish() const {
    if constexpr (kMins) {
      return HdAdd(HsumLanes8(acc), mins);
    } else {
      return HsumLanes8(acc);
    }
  }
};
using ChainQ5_K = ChainLanes8<true>;
using ChainQ6_K = ChainLanes8<false>;

// Lane L of a float-type dot: the sum of w[i] * x[i] over i = L, L + 8, ... < n.
template <WeightType kType>
TIERKV_HD float FloatValue(const void* p, int64_t i) {
  if constexpr (kType == WeightType::kF32) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (kType == WeightType::kF16) {
    return HdHalfToFloat(static_cast<const uint16_t*>(p)[i]);
  } else {
    return HdBf16ToFloat(static_cast<const uint16_t*>(p)[i]);
  }
}

template <WeightType kType>
TIERKV_HD float FloatLane(const void* row, const void* act, int64_t n, int lane) {
  float s = 0.0f;
  for (int64_t i = lane; i < n; i += 8) s = HdAdd(s, HdMul(FloatValue<kType>(row, i), FloatValue<kType>(act, i)));
  return s;
}

TIERKV_HD float Sum8(const float* l) { return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])); }

// ---- whole rows (the CPU tests; a GPU spreads the same steps over threads) ------------

template <typename Block, typename Act, typename Chain, typename Ints>
TIERKV_HD float DotBlocks(const void* row, const void* act, int64_t nb, Ints ints) {
  const auto* w = static_cast<const Block*>(row);
  const auto* x = static_cast<const Act*>(act);
  Chain chain;
  for (int64_t b = 0; b < nb; ++b) chain.Add(ints(w[b], x[b]), w[b], x[b]);
  return chain.Finish();
}

// The row dot of `type` (one of the eight model types) with an activation row already
// in ActivationType(type); false for another type.
TIERKV_HD bool DotRow(WeightType type, const void* row, const void* act, int64_t n, float* out) {
  switch (type) {
    case WeightType::kQ8_0:
      *out = DotBlocks<BlockQ8_0, BlockQ8_0, ChainQ8_0>(row, act, n / kQk0, IntsQ8_0);
      return true;
    case WeightType::kQ4_0:
      *out = DotBlocks<BlockQ4_0, BlockQ8_0, ChainQ4_0>(row, act, n / kQk0, IntsQ4_0);
      return true;
    case WeightType::kQ4_K:
      *out = DotBlocks<BlockQ4_K, BlockQ8_K, ChainQ4_K>(row, act, n / kQkK, IntsQ4_K);
      return true;
    case WeightType::kQ5_K:
      *out = DotBlocks<BlockQ5_K, BlockQ8_K, ChainQ5_K>(row, act, n / kQkK, IntsQ5_K);
      return true;
    case WeightType::kQ6_K:
      *out = DotBlocks<BlockQ6_K, BlockQ8_K, ChainQ6_K>(row, act, n / kQkK, IntsQ6_K);
      return true;
    case WeightType::kF32:
    case WeightType::kF16:
    case WeightType::kBF16: {
      float lanes[8];
      for (int l = 0; l < 8; ++l) {
        lanes[l] = type == WeightType::kF32   ? FloatLane<WeightType::kF32>(row, act, n, l)
                   : type == WeightType::kF16 ? FloatLane<WeightType::kF16>(row, act, n, l)
                                              : FloatLane<WeightType::kBF16>(row, act, n, l);
      }
      *out = Sum8(lanes);
      return true;
    }
    default: return false;
  }
}

// ---- values of a row (GetRow: quant.cc's dequantization) ----------------------------

// Value i of a row of `type`; false for a type outside the eight.
TIERKV_HD bool RowValue(WeightType type, const void* row, int64_t i, float* out) {
  const auto* bytes = static_cast<const uint8_t*>(row);
  switch (type) {
    case WeightType::kF32: *out = FloatValue<WeightType::kF32>(row, i); return true;
    case WeightType::kF16: *out = FloatValue<WeightType::kF16>(row, i); return true;
    case WeightType::kBF16: *out = FloatValue<WeightType::kBF16>(row, i); return true;
    case WeightType::kQ8_0: {
      const auto& b = reinterpret_cast<const BlockQ8_0*>(bytes)[i / kQk0];
      *out = HdMul(static_cast<float>(b.qs[i % kQk0]), HdHalfToFloat(b.d));
      return true;
    }
    case WeightType::kQ4_0: {
      const auto& b = reinterpret_cast<const BlockQ4_0*>(bytes)[i / kQk0];
      const int j = static_cast<int>(i % kQk0);
      const int code = (j < kQk0 / 2 ? (b.qs[j] & 0xf) : (b.qs[j - kQk0 / 2] >> 4)) - 8;
      *out = HdMul(static_cast<float>(code), HdHalfToFloat(b.d));
      return true;
    }
    case WeightType::kQ4_K:
    case WeightType::kQ5_K: {
      const int v = static_cast<int>(i % kQkK), c = v / 64, l = v % 32;
      const bool high = v % 64 >= 32;
      const uint8_t* scales;
      const uint8_t* qs;
      uint16_t d16, dmin16;
      int fifth = 0;
      if (type == WeightType::kQ4_K) {
        const auto& b = reinterpret_cast<const BlockQ4_K*>(bytes)[i / kQkK];
        scales = b.scales, qs = b.qs, d16 = b.d, dmin16 = b.dmin;
      } else {
        const auto& b = reinterpret_cast<const BlockQ5_K*>(bytes)[i / kQkK];
        scales = b.scales, qs = b.qs, d16 = b.d, dmin16 = b.dmin;
        fifth = (b.qh[l] >> (2 * c + (high ? 1 : 0))) & 1 ? 16 : 0;
      }
      uint8_t sc, m;
      ScaleMinK4(2 * c + (high ? 1 : 0), scales, &sc, &m);
      const float dl = HdMul(HdHalfToFloat(d16), static_cast<float>(sc));
      const float ml = HdMul(HdHalfToFloat(dmin16), static_cast<float>(m));
      const int q = (high ? qs[32 * c + l] >> 4 : qs[32 * c + l] & 0xf) + fifth;
      *out = HdAdd(HdMul(dl, static_cast<float>(q)), -ml);
      return true;
    }
    case WeightType::kQ6_K: {
      const auto& b = reinterpret_cast<const BlockQ6_K*>(bytes)[i / kQkK];
      const int v = static_cast<int>(i % kQkK), h = v / 128, k = (v % 128) / 32, l = v % 32;
      const uint8_t ql = b.ql[64 * h + l + (k & 1 ? 32 : 0)];
      const int q = ((k < 2 ? ql & 0xf : ql >> 4) | (((b.qh[32 * h + l] >> (2 * k)) & 3) << 4)) - 32;
      const float ds = HdMul(HdHalfToFloat(b.d), static_cast<float>(b.scales[8 * h + l / 16 + 2 * k]));
      *out = HdMul(ds, static_cast<float>(q));
      return true;
    }
    default: return false;
  }
}

}  // namespace tierkv::kernels::hd
