// kernels/kv_dot_tree.h
//
// The AVX-512 reduction of 16 keys' dot products that the f16 KV kernels
// (kernels/kv_codec_simd.cc) and tq's fused kernels (kvcache/codec_tq.cc) share, so that
// both give DotF16Avx2's bits: per (head, key) a 512-bit product sum p (DotF16Avx2's two
// 8-lane chains a0 in lanes 0-7, a1 in 8-15) is reduced exactly as HorizontalSum(a0 + a1)
// does, for 16 keys at once and without leaving registers. Each level of the tree
// combines two vectors of partial sums with two shuffles and one add (the same adds, in
// the same order, as the one-key reduction):
//   level 1, keys 2j, 2j+1:  [u_2j | u_2j+1],      u = a0 + a1          (8 lanes each)
//   level 2, 4 keys:         [s_t] per 128-bit lane, s_t[i] = u_t[i] + u_t[i + 4]
//   level 3, 8 keys:         per lane k, s_k[0] + s_k[2], s_k[1] + s_k[3] of keys k, k + 4
//   level 4, 16 keys:        per lane k, the sums of keys k, k + 4, k + 8, k + 12
// and a final permutation (TreeKeyOrder) puts the 16 results in key order.
//
// A Leaf gives the product sums of one key: leaf(t, p) fills p[kG] for key t of the 16
// (each p[h] an FMA chain onto +0 over the head's 16-value query slices, as DotF16Avx2).
// Where the key's values come from (f16 bytes, tq centroids) is the leaf's business.
//
// x86 only; the functions carry their own target attributes.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include <cstddef>
#include <type_traits>

#define TIERKV_KV_TREE_INLINE __attribute__((target("avx512f,avx2,fma,f16c"), always_inline)) inline

namespace tierkv::kernels::kv_tree {

// Two vectors of partial sums combined one tree level up: kKeys is the number of keys
// the result covers.
template <int kKeys>
TIERKV_KV_TREE_INLINE __m512 CombineLevel(__m512 a, __m512 b) {
  static_assert(kKeys == 2 || kKeys == 4 || kKeys == 8 || kKeys == 16);
  if constexpr (kKeys == 2) return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
  if constexpr (kKeys == 4) return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xdd));
  if constexpr (kKeys == 8) return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xee));
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xdd));
}

// The reduced sums of keys [t, t + kKeys) for kG heads, as the tree leaves them (for 16
// keys: per 128-bit lane j, keys j, j + 4, j + 8, j + 12).
template <int kKeys, int kG, typename Leaf>
TIERKV_KV_TREE_INLINE void DotTree(const Leaf& leaf, size_t t, __m512* out) {
  if constexpr (kKeys == 1) {
    leaf(t, out);
  } else {
    __m512 a[kG], b[kG];
    DotTree<kKeys / 2, kG>(leaf, t, a);
    DotTree<kKeys / 2, kG>(leaf, t + kKeys / 2, b);
    for (int h = 0; h < kG; ++h) out[h] = CombineLevel<kKeys>(a[h], b[h]);
  }
}

// The permutation (for _mm512_permutexvar_ps) from a 16-key tree's lanes to key order.
TIERKV_KV_TREE_INLINE __m512i TreeKeyOrder() {
  return _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
}

// fn(std::integral_constant<int, kG>{}, h0) over the heads [0, heads) in groups of kG <= 4
// (a tree's per-head sums stay in registers): fours, then the 3, 2 or 1 left.
template <typename F>
inline void ForTreeHeadGroups(int heads, F&& fn) {
  int h = 0;
  for (; h + 4 <= heads; h += 4) fn(std::integral_constant<int, 4>{}, h);
  switch (heads - h) {
    case 3: fn(std::integral_constant<int, 3>{}, h); break;
    case 2: fn(std::integral_constant<int, 2>{}, h); break;
    case 1: fn(std::integral_constant<int, 1>{}, h); break;
    default: break;
  }
}

}  // namespace tierkv::kernels::kv_tree

#endif  // x86
