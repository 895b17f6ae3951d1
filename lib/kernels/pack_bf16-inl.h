// Packing for the native bf16 products (vdpbf16ps, the AVX3_BF16 entry):
// queries, keys and values as pairs of bf16. Per-target code.

#if defined(SIMDATTN_LIB_KERNELS_PACK_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_PACK_BF16_INL_H_
#undef SIMDATTN_LIB_KERNELS_PACK_BF16_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_PACK_BF16_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "hwy/highway.h"
#include "lib/kernels/bf16_dot-inl.h"
#include "lib/kernels/block-inl.h"
#include "lib/kernels/pack-inl.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Whether a call runs the native bf16 products: the AVX3_BF16 entry
// (kNative), with Q, K and V all stored in bf16, outside the decode
// micro-path (bound by memory, it widens K/V in registers instead).
template <bool kNative>
HWY_INLINE bool NativeBf16(const AttentionArgs& a, const Plan& plan) {
  return SIMDATTN_NATIVE_BF16 && kNative && a.q_type == Storage::kBF16 &&
         a.kv_type == Storage::kBF16 && plan.path == KernelPath::kTiled;
}

#if SIMDATTN_NATIVE_BF16
// One K row (dk bf16 values) as ceil(dk / 2) pairs; an odd dk's last pair
// gets a zero upper half.
inline void KeyRowPairs(const uint16_t* HWY_RESTRICT row, int64_t dk,
                        uint32_t* HWY_RESTRICT pairs) {
  pairs[(dk + 1) / 2 - 1] = 0;
  std::memcpy(pairs, row, static_cast<size_t>(dk) * sizeof(uint16_t));
}

// Rows [first, first + nk) of V (bf16) as key pairs, as PairValueRows
// (out[p * dv + e] holds keys first + 2p and first + 2p + 1), run by run of
// consecutive rows (KvRows::RunEnd). first is even; runs end on multiples
// of 8, so no pair spans two.
inline void PairValueRuns(const KvRows& src, int64_t first, int64_t nk,
                          int64_t dv, uint32_t* HWY_RESTRICT out) {
  const int64_t row = src.v_row / 2;  // bf16
  src.ForEachRun(true, first, nk, [&](const char* p, int64_t j, int64_t run) {
    PairValueRows(reinterpret_cast<const uint16_t*>(p), row, run, dv,
                  out + (j - first) / 2 * dv);
  });
}

// PackedKv's layout for the native products, in bf16 pairs (u32). With
// T = kTileRows, n = the group's valid keys, Dk2 = ceil(Dk / 2) and
// n2 = ceil(n / 2):
//   K: keys in groups of T, the group of key j at (j - j % T) * Dk2 holding
//      [Dk2][T] (pair p of a key: head dims 2p and 2p + 1); the last n % T
//      keys at (n - n % T) * Dk2 as [Dk2][n % T];
//   V: value dims in groups of T, group g at g * T * n2 holding [n2][T]
//      (pair p: keys 2p and 2p + 1); the last Dv % T dims at
//      (Dv - Dv % T) * n2 as [n2][Dv % T].
// Both fit in PackedGroupFloats(). scratch holds kTileRows x max(Dk, Dv)
// floats.
inline void PackKvBf16(const AttentionArgs& a, int64_t group,
                       uint32_t* HWY_RESTRICT dst,
                       uint32_t* HWY_RESTRICT scratch) {
  constexpr int64_t T = kTileRows;
  const int64_t b = group / a.kv_heads;
  const int64_t hkv = group % a.kv_heads;
  const int64_t n = a.kv_lengths != nullptr ? a.kv_lengths[b] : a.kv_len;
  const int64_t dk = a.head_dim_qk, dk2 = (dk + 1) / 2;
  const int64_t dv = a.head_dim_v, n2 = (n + 1) / 2;
  const KvRows src(a, b, hkv);
  for (int64_t j0 = 0; j0 < n; j0 += T) {
    const int64_t w = std::min(T, n - j0);
    for (int64_t r = 0; r < w; ++r) {
      KeyRowPairs(reinterpret_cast<const uint16_t*>(src.KRow(j0 + r)), dk,
                  scratch + r * dk2);
    }
    uint32_t* HWY_RESTRICT out = dst + j0 * dk2;
    for (int64_t p = 0; p < dk2; ++p) {
      for (int64_t r = 0; r < w; ++r) out[p * w + r] = scratch[r * dk2 + p];
    }
  }
  uint32_t* HWY_RESTRICT vp = dst + PackedKFloats(a);
  const int64_t full = dv / T * T;
  const int64_t rem = dv - full;
  for (int64_t p = 0; p < n2; ++p) {  // keys 2p, 2p + 1 paired along dv
    PairValueRuns(src, 2 * p, std::min<int64_t>(2, n - 2 * p), dv, scratch);
    for (int64_t e = 0; e < full; e += T) {
      std::memcpy(vp + e * n2 + p * T, scratch + e, T * sizeof(uint32_t));
    }
    for (int64_t i = 0; i < rem; ++i) vp[full * n2 + p * rem + i] = scratch[full + i];
  }
}

// Where the native products read keys [j0, j0 + nk) in the layout above
// (j0 % kTileRows == 0; nk a multiple of kTileRows or ending at n), as the
// broadcast rows of Q·Kᵀ and, for P·V, the value dims over the key pairs
// starting at j0 / 2 (j0 is even).
inline PairRows PackedKeyPairs(const PackedKv& p, int64_t j0, int64_t nk,
                               int64_t dk2) {
  const uint32_t* k = reinterpret_cast<const uint32_t*>(p.k);
  const int64_t full = nk / kTileRows * kTileRows;
  return {k + j0 * dk2, kTileRows * dk2, 1, kTileRows,
          k + (j0 + full) * dk2, 1, nk - full};
}
inline PairRows PackedValuePairs(const PackedKv& p, int64_t j0, int64_t dv) {
  const uint32_t* v = reinterpret_cast<const uint32_t*>(p.v);
  const int64_t full = dv / kTileRows * kTileRows;
  const int64_t n2 = (p.keys + 1) / 2, p0 = j0 / 2;
  return {v + p0 * kTileRows, kTileRows * n2, 1, kTileRows,
          v + full * n2 + p0 * (dv - full), 1, dv - full};
}

// The same for a tile read in place (LoadKvTileBf16): K as [nk][Dk2],
// V pairs as [ceil(nk / 2)][Dv].
inline PairRows TileKeyPairs(const uint32_t* k2, int64_t nk, int64_t dk2) {
  const int64_t full = nk / kTileRows * kTileRows;
  return {k2, kTileRows * dk2, dk2, 1, k2 + full * dk2, dk2, 1};
}
inline PairRows TileValuePairs(const uint32_t* v2, int64_t dv) {
  const int64_t full = dv / kTileRows * kTileRows;
  return {v2, kTileRows, 1, dv, v2 + full, 1, dv};
}

// qt2[p * mq + r] = the pair of head dims 2p, 2p + 1 of row r's query, as
// stored (bf16, unscaled: the scores are scaled in f32 afterwards).
inline void PackQueriesBf16(const AttentionArgs& a, int64_t b,
                            const RowTable& rt, int64_t mq,
                            uint32_t* HWY_RESTRICT qt2) {
  const int64_t dk = a.head_dim_qk, dk2 = (dk + 1) / 2;
  for (int64_t r = 0; r < mq; ++r) {
    const uint16_t* q = static_cast<const uint16_t*>(a.q) + b * a.q_strides[0] +
                        rt.head[r] * a.q_strides[1] + rt.query[r] * a.q_strides[2];
    for (int64_t p = 0; p < dk2; ++p) {
      const uint32_t hi = 2 * p + 1 < dk ? q[2 * p + 1] : 0u;
      qt2[p * mq + r] = q[2 * p] | hi << 16;
    }
  }
}

// One K/V tile for the native products, read in place from storage: K rows
// as pairs into k2 ([nk][Dk2]), V key pairs into v2 ([ceil(nk / 2)][Dv]).
inline void LoadKvTileBf16(const AttentionArgs& a, const KvRows& src,
                           int64_t kv_begin, int64_t nk,
                           uint32_t* HWY_RESTRICT k2,
                           uint32_t* HWY_RESTRICT v2) {
  const int64_t dk = a.head_dim_qk, dk2 = (dk + 1) / 2;
  for (int64_t j = 0; j < nk; ++j) {
    KeyRowPairs(reinterpret_cast<const uint16_t*>(src.KRow(kv_begin + j)), dk,
                k2 + j * dk2);
  }
  PairValueRuns(src, kv_begin, nk, a.head_dim_v, v2);
}

// Whether rows [first, first + nk) of V (bf16 storage) are all finite.
inline bool Bf16ValuesFinite(const AttentionArgs& a, const KvRows& src,
                             int64_t first, int64_t nk) {
  const hn::ScalableTag<uint16_t> du;
  const int64_t N = static_cast<int64_t>(hn::Lanes(du));
  const int64_t dv = a.head_dim_v;
  const auto exp = hn::Set(du, 0x7F80);  // exponent all ones: Inf or NaN
  auto top = hn::Zero(du);
  uint16_t tail = 0;
  for (int64_t j = first; j < first + nk; ++j) {
    const uint16_t* row = reinterpret_cast<const uint16_t*>(src.VRow(j));
    int64_t e = 0;
    for (; e + N <= dv; e += N) top = hn::Max(top, hn::And(hn::LoadU(du, row + e), exp));
    for (; e < dv; ++e) tail = std::max<uint16_t>(tail, row[e] & 0x7F80);
  }
  return tail != 0x7F80 && hn::AllFalse(du, hn::Eq(top, exp));
}
#endif  // SIMDATTN_NATIVE_BF16

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_PACK_BF16_INL_H_
