// Packing for the tiled kernel: a block's queries transposed and scaled,
// and a group's K/V in the layout the tile products read sequentially.
// Per-target code.

#if defined(SIMDATTN_LIB_KERNELS_PACK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_PACK_INL_H_
#undef SIMDATTN_LIB_KERNELS_PACK_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_PACK_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "hwy/highway.h"
#include "lib/kernels/block-inl.h"
#include "lib/kernels/tile_gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Packed K/V of one (batch, KV head) group: the layout TileGemmPackedRows
// reads, built once per call and group (PackKv) and shared by all of the
// group's query blocks. With T = kTileRows and n = the group's valid keys:
//   K: keys in groups of T, the group of key j at (j - j % T) * Dk holding
//      [Dk][T]; the last n % T keys at (n - n % T) * Dk as [Dk][n % T].
//   V: value dims in groups of T, group g at g * T * n holding [key][T]; the
//      last Dv % T dims at (Dv - Dv % T) * n as [key][Dv % T].
// Both products then read their broadcast operand sequentially, where
// row-major K/V costs one new cache line per key (or per key and value-dim
// group) and several streams at a large stride: 71% of the FMA peak
// against 59% in place (f32 B1 H8 L2048 D128, 1 thread, AVX-512). A tile
// [j0, j0 + nk) needs j0 % T == 0
// and j0 + nk a multiple of T or n.
struct PackedKv {
  const float* k = nullptr;  // null: not packed
  const float* v = nullptr;
  int64_t keys = 0;          // n above

  // Keys [j0, j0 + nk): S^T tile = K·Qt.
  template <class D>
  void Scores(D d, int cols, int64_t j0, int64_t nk, int64_t dk,
              const float* HWY_RESTRICT qt, int64_t mq,
              float* HWY_RESTRICT st) const {
    const int64_t full = nk / kTileRows * kTileRows;
    TileGemmPackedRows<false, false>(d, cols, nk, k + j0 * dk, kTileRows * dk,
                                     k + (j0 + full) * dk, qt, mq, dk, nullptr,
                                     st, mq);
  }
  // O^T += V^T·P^T over keys [j0, j0 + nk) (see TileGemm for kGuard).
  template <bool kGuard, class D>
  void Values(D d, int cols, int64_t j0, int64_t nk, int64_t dv,
              const float* HWY_RESTRICT pt, int64_t mq,
              const float* HWY_RESTRICT scale, float* HWY_RESTRICT acc) const {
    const int64_t full = dv / kTileRows * kTileRows;
    TileGemmPackedRows<true, kGuard>(d, cols, dv, v + j0 * kTileRows,
                                     kTileRows * keys,
                                     v + full * keys + j0 * (dv - full), pt,
                                     mq, nk, scale, acc, mq);
  }
  // Whether V rows [j0, j0 + nk) are all finite.
  template <class D>
  bool ValuesFinite(D d, int64_t j0, int64_t nk, int64_t dv) const;
};


template <class D>
bool PackedKv::ValuesFinite(D d, int64_t j0, int64_t nk, int64_t dv) const {
  const int64_t full = dv / kTileRows * kTileRows;
  for (int64_t e = 0; e < full; e += kTileRows) {
    if (!AllFinite(d, v + e * keys + j0 * kTileRows, 0, 1, nk * kTileRows)) return false;
  }
  return AllFinite(d, v + full * keys + j0 * (dv - full), 0, 1, nk * (dv - full));
}

// Builds the PackedKv layout of group `group` in dst (PackedGroupFloats()
// floats); scratch holds kTileRows x max(Dk, Dv) floats.
inline void PackKvF32(const AttentionArgs& a, int64_t group,
                      float* HWY_RESTRICT dst, float* HWY_RESTRICT scratch) {
  const hn::ScalableTag<float> d;
  constexpr int64_t T = kTileRows;
  const int64_t b = group / a.kv_heads;
  const int64_t hkv = group % a.kv_heads;
  const int64_t n = a.kv_lengths != nullptr ? a.kv_lengths[b] : a.kv_len;
  const int64_t dk = a.head_dim_qk;
  const int64_t dv = a.head_dim_v;
  const KvRows src(a, b, hkv);
  float* HWY_RESTRICT kp = dst;
  for (int64_t j0 = 0; j0 < n; j0 += T) {
    const int64_t w = std::min(T, n - j0);
    const float* rows[T];
    for (int64_t r = 0; r < w; ++r) {
      rows[r] = RowF32(d, src, false, j0 + r, dk, scratch + r * dk);
    }
    float* HWY_RESTRICT out = kp + j0 * dk;
    int64_t i = 0;
#if HWY_TARGET != HWY_SCALAR
    if (w == T) {  // T is a multiple of 4: 4x4 blocks through transposes
      const hn::CappedTag<float, 4> d4;
      for (; i + 4 <= dk; i += 4) {
        for (int64_t r = 0; r < T; r += 4) {
          auto a0 = hn::LoadU(d4, rows[r] + i), a1 = hn::LoadU(d4, rows[r + 1] + i);
          auto a2 = hn::LoadU(d4, rows[r + 2] + i), a3 = hn::LoadU(d4, rows[r + 3] + i);
          Transpose4x4(d4, &a0, &a1, &a2, &a3);  // a_t: element i + t of 4 keys
          hn::StoreU(a0, d4, out + i * T + r);
          hn::StoreU(a1, d4, out + (i + 1) * T + r);
          hn::StoreU(a2, d4, out + (i + 2) * T + r);
          hn::StoreU(a3, d4, out + (i + 3) * T + r);
        }
      }
    }
#endif
    for (; i < dk; ++i) {
      for (int64_t r = 0; r < w; ++r) out[i * w + r] = rows[r][i];
    }
  }
  float* HWY_RESTRICT vp = dst + PackedKFloats(a);
  const int64_t full = dv / T * T;
  const int64_t rem = dv - full;
  const hn::CappedTag<float, T> dg;
  const int64_t G = static_cast<int64_t>(hn::Lanes(dg));
  for (int64_t j = 0; j < n; ++j) {
    const float* row = RowF32(d, src, true, j, dv, scratch);
    for (int64_t e = 0; e < full; e += T) {
      float* HWY_RESTRICT out = vp + e * n + j * T;
      for (int64_t c = 0; c < T; c += G) {
        hn::StoreU(hn::LoadU(dg, row + e + c), dg, out + c);
      }
    }
    for (int64_t i = 0; i < rem; ++i) vp[full * n + j * rem + i] = row[full + i];
  }
}

// Row r's query as stored (any type).
inline const void* QueryRowPtr(const AttentionArgs& a, int64_t b,
                               const RowTable& rt, int64_t r) {
  const int64_t at = b * a.q_strides[0] + rt.head[r] * a.q_strides[1] +
                     rt.query[r] * a.q_strides[2];
  return static_cast<const char*>(a.q) + at * StorageBytes(a.q_type);
}

// Row r's query widened exactly to f32 and scaled: dst[i] = scale * q[i].
// 16-bit rows go through WidenRow (hardware f16 where the target has it).
template <class D>
HWY_INLINE void QueryRow(D d, const AttentionArgs& a, int64_t b,
                         const RowTable& rt, int64_t r,
                         float* HWY_RESTRICT dst) {
  const void* src = QueryRowPtr(a, b, rt, r);
  const int64_t dk = a.head_dim_qk;
  if (a.q_type == Storage::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(dk) * sizeof(float));
  } else {
    WidenRow(d, static_cast<const uint16_t*>(src),
             a.q_type, dk, dst);
  }
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto scale = hn::Set(d, a.scale);
  int64_t i = 0;
  for (; i + N <= dk; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, dst + i), scale), d, dst + i);
  for (; i < dk; ++i) dst[i] *= a.scale;
}

// qt[i * mq + r] = scale * q_r[i] for the block's mq lanes. f32 rows are
// read in place: on AVX-512 16 rows at a time through 16x16 transposes,
// elsewhere 4 at a time through 4x4 transposes, scaled after the transpose
// (the same single rounding of scale * q). 16-bit rows are first widened
// and scaled into `rows` (4 x Dk floats). At L256 D64 the row copies and
// 4x4 transposes took about 8% of a call (perf, AVX3_DL).
template <class D>
HWY_INLINE void PackQueries(D d, const AttentionArgs& a, int64_t b,
                            const RowTable& rt, int64_t mq,
                            float* HWY_RESTRICT rows, float* HWY_RESTRICT qt) {
  const int64_t dk = a.head_dim_qk;
  int64_t r = 0;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (a.q_type == Storage::kF32 && mq % 16 == 0) {
    const hn::Full512<float> d16;
    const auto scale = hn::Set(d16, a.scale);
    for (; r < mq; r += 16) {
      const float* src[16];
      for (int t = 0; t < 16; ++t) {
        src[t] = static_cast<const float*>(QueryRowPtr(a, b, rt, r + t));
      }
      int64_t i = 0;
      for (; i + 16 <= dk; i += 16) {
        hn::Vec<decltype(d16)> v[16];
        for (int t = 0; t < 16; ++t) v[t] = hn::LoadU(d16, src[t] + i);
        Transpose16x16(v);  // v[c]: element i + c of the 16 rows
        for (int c = 0; c < 16; ++c) {
          hn::Store(hn::Mul(v[c], scale), d16, qt + (i + c) * mq + r);
        }
      }
      for (; i < dk; ++i) {
        for (int t = 0; t < 16; ++t) qt[i * mq + r + t] = src[t][i] * a.scale;
      }
    }
    return;
  }
#endif
#if HWY_TARGET != HWY_SCALAR
  const hn::CappedTag<float, 4> d4;
  const auto scale4 = hn::Set(d4, a.scale);
  for (; r + 4 <= mq; r += 4) {
    const float* src[4];
    if (a.q_type == Storage::kF32) {
      for (int t = 0; t < 4; ++t) {
        src[t] = static_cast<const float*>(QueryRowPtr(a, b, rt, r + t));
      }
    } else {  // widened and scaled into rows
      for (int t = 0; t < 4; ++t) QueryRow(d, a, b, rt, r + t, rows + t * dk);
      for (int t = 0; t < 4; ++t) src[t] = rows + t * dk;
    }
    const bool scaled = a.q_type != Storage::kF32;
    int64_t i = 0;
    for (; i + 4 <= dk; i += 4) {
      auto a0 = hn::LoadU(d4, src[0] + i), a1 = hn::LoadU(d4, src[1] + i);
      auto a2 = hn::LoadU(d4, src[2] + i), a3 = hn::LoadU(d4, src[3] + i);
      Transpose4x4(d4, &a0, &a1, &a2, &a3);  // a_t: element i + t of 4 lanes
      if (!scaled) {
        a0 = hn::Mul(a0, scale4);
        a1 = hn::Mul(a1, scale4);
        a2 = hn::Mul(a2, scale4);
        a3 = hn::Mul(a3, scale4);
      }
      float* out = qt + i * mq + r;
      hn::StoreU(a0, d4, out);
      hn::StoreU(a1, d4, out + mq);
      hn::StoreU(a2, d4, out + 2 * mq);
      hn::StoreU(a3, d4, out + 3 * mq);
    }
    for (; i < dk; ++i) {
      for (int t = 0; t < 4; ++t) {
        qt[i * mq + r + t] = scaled ? src[t][i] : src[t][i] * a.scale;
      }
    }
  }
#endif
  for (; r < mq; ++r) {
    QueryRow(d, a, b, rt, r, rows);
    for (int64_t i = 0; i < dk; ++i) qt[i * mq + r] = rows[i];
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_PACK_INL_H_
