// The explicit mask of a query block (SEMANTICS.md): bool or additive,
// read once per tile and applied to the transposed score tile or to one
// row of scores. Per-target code (include from a foreach_target TU).

#if defined(SIMDATTN_LIB_KERNELS_MASK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_MASK_INL_H_
#undef SIMDATTN_LIB_KERNELS_MASK_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_MASK_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "lib/dtype.h"
#include "lib/kernels/convert-inl.h"
#include "lib/kernels/kernels.h"
#include "lib/kernels/score_mods-inl.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The explicit mask of one query block. Lanes whose rows share a mask row
// (the mask broadcasts over heads or queries) share one row. Per tile, each
// distinct row's keys are read as an f32 bias (bool: 0 or -inf; additive: the
// value), converted in scratch unless the mask is f32, and is transposed to
// the score tile's [key][lane] layout with 4x4 transposes as it is applied
// (a version that gathered each lane's bias had about twice the overhead
// on an AVX-512 Xeon: +43% over no mask, against +17-21% for this one with
// a random f32 mask). Storage (MaskBlock::Floats) comes from the task's
// scratch.
struct MaskBlock {
  int64_t* row_offset;     // [mq] element offset of each distinct row
  const float** row_data;  // [mq] f32 bias of each distinct row, this tile
  int32_t* lane_row;       // [mq] distinct row of each lane
  float* rows;             // [mq][tile_keys] converted distinct rows
  float* zeros;            // [tile_keys] zeros
  int64_t num_rows = 0;    // distinct rows
  int64_t mq, tile_keys;

  static constexpr int64_t Floats(int64_t mq, int64_t tile_keys) {
    return 2 * mq + 2 * mq + mq + mq * tile_keys + tile_keys;
  }
  // storage: Floats() floats, 8-byte aligned.
  MaskBlock(float* storage, int64_t block_rows, int64_t keys)
      : row_offset(reinterpret_cast<int64_t*>(storage)),
        row_data(reinterpret_cast<const float**>(storage + 2 * block_rows)),
        lane_row(reinterpret_cast<int32_t*>(storage + 4 * block_rows)),
        rows(storage + 5 * block_rows),
        zeros(storage + 5 * block_rows + block_rows * keys),
        mq(block_rows),
        tile_keys(keys) {}

  // Maps the lanes of a block of batch b (row table rt) to their mask rows.
  // Padding lanes repeat a valid row, so they map to one too.
  void Init(const AttentionArgs& a, int64_t b, const RowTable& rt) {
    std::fill(zeros, zeros + tile_keys, 0.0f);
    num_rows = 0;
    for (int64_t r = 0; r < mq; ++r) {
      const int64_t offset = b * a.mask_strides[0] +
                             rt.head[r] * a.mask_strides[1] +
                             rt.query[r] * a.mask_strides[2];
      int64_t u = num_rows - 1;
      while (u >= 0 && row_offset[u] != offset) --u;
      if (u < 0) {
        u = num_rows++;
        row_offset[u] = offset;
      }
      lane_row[r] = static_cast<int32_t>(u);
    }
  }
};

// What a mask tile does to the block's lanes (MaskTileBias).
struct MaskTile {
  bool visible;  // some key is visible to some lane (else skip the tile)
  bool hidden;   // some key is hidden from some lane (P·V may need a guard)
  bool bias;     // some bias is not 0 (else nothing to apply)
};

// The f32 bias of distinct row u for keys [kv_begin, kv_begin + n): the mask
// itself when it is f32 along keys, else converted into mb->rows.
template <class D>
HWY_INLINE const float* MaskRow(D d, const AttentionArgs& a,
                                const MaskBlock& mb, int64_t u,
                                int64_t kv_begin, int64_t n) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int64_t key_stride = a.mask_strides[3];  // 1, or 0 (broadcast)
  const int64_t at = mb.row_offset[u] + kv_begin * key_stride;
  float* HWY_RESTRICT dst = mb.rows + u * mb.tile_keys;
  if (key_stride == 0) {
    float value;
    if (a.mask_kind == MaskKind::kBool) {
      value = static_cast<const uint8_t*>(a.mask)[at] != 0 ? 0.0f : neg_inf;
    } else if (a.mask_kind == MaskKind::kAddF32) {
      value = static_cast<const float*>(a.mask)[at];
    } else {
      value = F16ToF32(static_cast<const uint16_t*>(a.mask)[at]);
    }
    std::fill(dst, dst + n, value);
    return dst;
  }
  // Each distinct row is its own stream, more than the hardware prefetchers
  // follow: ask for the next tile's part of it now.
  const int64_t elem = a.mask_kind == MaskKind::kBool     ? 1
                       : a.mask_kind == MaskKind::kAddF32 ? 4
                                                          : 2;
  const char* next = static_cast<const char*>(a.mask) + (at + mb.tile_keys) * elem;
  for (int64_t byte = 0; byte < mb.tile_keys * elem; byte += 64) {
    hwy::Prefetch(next + byte);
  }
  if (a.mask_kind == MaskKind::kAddF32) return static_cast<const float*>(a.mask) + at;
  if (a.mask_kind == MaskKind::kAddF16) {
    WidenRow(d, static_cast<const uint16_t*>(a.mask) + at, Storage::kF16, n, dst);
    return dst;
  }
  const hn::RebindToUnsigned<D> du;
  const hn::Rebind<uint8_t, D> d8;
  const uint8_t* src = static_cast<const uint8_t*>(a.mask) + at;
  // Rows that allow every key of the tile (the common case) share mb.zeros.
  const hn::ScalableTag<uint8_t> d8_full;
  const int64_t N8 = static_cast<int64_t>(hn::Lanes(d8_full));
  auto any_zero = hn::FirstN(d8_full, 0);
  int64_t j = 0;
  for (; j + N8 <= n; j += N8) {
    any_zero = hn::Or(any_zero, hn::Eq(hn::LoadU(d8_full, src + j), hn::Zero(d8_full)));
  }
  bool allow_all = hn::AllFalse(d8_full, any_zero);
  for (; j < n && allow_all; ++j) allow_all = src[j] != 0;
  if (allow_all) return mb.zeros;
  for (j = 0; j + N <= n; j += N) {
    const auto allow = hn::PromoteTo(du, hn::LoadU(d8, src + j));
    hn::StoreU(hn::IfThenElseZero(hn::RebindMask(d, hn::Eq(allow, hn::Zero(du))),
                                  hn::Set(d, neg_inf)),
               d, dst + j);
  }
  for (; j < n; ++j) dst[j] = src[j] != 0 ? 0.0f : neg_inf;
  return dst;
}

// s += bias (-inf hides) for a column block of scores (4 lanes, or 16 on
// AVX-512); returns the lanes it hid.
template <class D4>
HWY_INLINE hn::Mask<D4> AddBias4(D4 d4, hn::Vec<D4> bias, float* HWY_RESTRICT x) {
  const auto neg_inf = hn::Set(d4, -std::numeric_limits<float>::infinity());
  const auto hide = hn::Eq(bias, neg_inf);
  hn::StoreU(hn::IfThenElse(hide, neg_inf, hn::Add(hn::LoadU(d4, x), bias)), d4, x);
  return hide;
}

// Applies lane r's bias row_data[lane_row[r]][j] to the transposed score tile
// st[j * stride + r] for keys j < n, transposing 16 lanes x 16 keys per step
// on AVX-512 and 4 lanes x 4 keys elsewhere (and for the last keys). Returns
// whether some key was hidden from some lane.
template <class D>
HWY_INLINE bool MaskTileApplyRows(D /* d */, const MaskBlock& mb, int64_t n,
                                  size_t stride, float* HWY_RESTRICT st) {
  const int64_t mq = mb.mq;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  bool hidden = false;
  int64_t j_first = 0;  // keys before this one are done
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  {
    const hn::Full512<float> d16;
    j_first = mq % 16 == 0 ? n / 16 * 16 : 0;
    auto any = hn::FirstN(d16, 0);
    for (int64_t r = 0; r < mq && j_first > 0; r += 16) {
      for (int64_t j = 0; j < j_first; j += 16) {
        hn::Vec<decltype(d16)> v[16];
        for (int t = 0; t < 16; ++t) {
          v[t] = hn::LoadU(d16, mb.row_data[mb.lane_row[r + t]] + j);
        }
        Transpose16x16(v);  // v[c]: key j + c of the 16 lanes
        for (int c = 0; c < 16; ++c) {
          any = hn::Or(any, AddBias4(d16, v[c], st + (j + c) * stride + r));
        }
      }
    }
    hidden = !hn::AllFalse(d16, any);
  }
#endif
#if HWY_TARGET == HWY_SCALAR
  (void)j_first;
  for (int64_t r = 0; r < mq; ++r) {
    const float* row = mb.row_data[mb.lane_row[r]];
    for (int64_t j = 0; j < n; ++j) {
      float& x = st[j * stride + r];
      hidden |= row[j] == neg_inf;
      x = row[j] == neg_inf ? neg_inf : x + row[j];
    }
  }
#else
  const hn::CappedTag<float, 4> d4;
  auto any4 = hn::FirstN(d4, 0);
  for (int64_t r = 0; r < mq; r += 4) {  // mq is a multiple of 4 lanes
    const float* r0 = mb.row_data[mb.lane_row[r]];
    const float* r1 = mb.row_data[mb.lane_row[r + 1]];
    const float* r2 = mb.row_data[mb.lane_row[r + 2]];
    const float* r3 = mb.row_data[mb.lane_row[r + 3]];
    int64_t j = j_first;
    for (; j + 4 <= n; j += 4) {
      auto a0 = hn::LoadU(d4, r0 + j), a1 = hn::LoadU(d4, r1 + j);
      auto a2 = hn::LoadU(d4, r2 + j), a3 = hn::LoadU(d4, r3 + j);
      Transpose4x4(d4, &a0, &a1, &a2, &a3);  // a_t: key j + t of the 4 lanes
      float* x = st + j * stride + r;
      any4 = hn::Or(any4, AddBias4(d4, a0, x));
      any4 = hn::Or(any4, AddBias4(d4, a1, x + stride));
      any4 = hn::Or(any4, AddBias4(d4, a2, x + 2 * stride));
      any4 = hn::Or(any4, AddBias4(d4, a3, x + 3 * stride));
    }
    for (; j < n; ++j) {
      float* x = st + j * stride + r;
      const float b[4] = {r0[j], r1[j], r2[j], r3[j]};
      for (int i = 0; i < 4; ++i) {
        hidden |= b[i] == neg_inf;
        x[i] = b[i] == neg_inf ? neg_inf : x[i] + b[i];
      }
    }
  }
  hidden |= !hn::AllFalse(d4, any4);
#endif
  return hidden;
}

// Reads the mask of keys [kv_begin, kv_begin + num_keys) and says what it
// does to the block: a tile hidden from every lane is skipped (hidden keys
// take no part at all), one that hides nothing needs no guard in the P·V
// product, and an all-zero bias (a bool mask that allows everything) needs
// no apply. Each distinct row is converted (and the next tile's prefetched)
// on the way.
//
// kExact (MaskTileBias, the decode path) scans every bias for all three
// flags. Otherwise (MaskTileRows, the prefill) it looks for a visible key
// only until it finds one and leaves `hidden` to MaskTileApply, which reads
// every bias anyway: `hidden` is false, and `bias` is true for any row but
// the shared zeros.
template <bool kExact, class D>
HWY_INLINE MaskTile ScanMaskTile(D d, const AttentionArgs& a, MaskBlock* mb,
                                 int64_t kv_begin, int64_t num_keys) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const float neg_inf_s = -std::numeric_limits<float>::infinity();
  const auto neg_inf = hn::Set(d, neg_inf_s);
  MaskTile t = {false, false, false};
  for (int64_t u = 0; u < mb->num_rows; ++u) {
    const float* row = MaskRow(d, a, *mb, u, kv_begin, num_keys);
    mb->row_data[u] = row;
    if (row == mb->zeros) {  // a bool row that allows the whole tile
      t.visible = true;
      continue;
    }
    int64_t j = 0;
    if constexpr (kExact) {
      const auto zero = hn::Zero(d);
      auto any_hidden = hn::FirstN(d, 0), any_bias = any_hidden;
      auto all_hidden = hn::Not(any_hidden);
      for (; j + N <= num_keys; j += N) {
        const auto x = hn::LoadU(d, row + j);
        const auto h = hn::Eq(x, neg_inf);
        any_hidden = hn::Or(any_hidden, h);
        all_hidden = hn::And(all_hidden, h);
        any_bias = hn::Or(any_bias, hn::Not(hn::Eq(x, zero)));
      }
      t.hidden |= !hn::AllFalse(d, any_hidden);
      t.visible |= !hn::AllTrue(d, all_hidden);
      t.bias |= !hn::AllFalse(d, any_bias);
      for (; j < num_keys; ++j) {
        const bool h = row[j] == neg_inf_s;
        t.hidden |= h;
        t.visible |= !h;
        t.bias |= !(row[j] == 0.0f);
      }
    } else {
      t.bias = true;
      for (; !t.visible && j + N <= num_keys; j += N) {
        t.visible = !hn::AllTrue(d, hn::Eq(hn::LoadU(d, row + j), neg_inf));
      }
      for (; !t.visible && j < num_keys; ++j) t.visible = !(row[j] == neg_inf_s);
    }
  }
  return t;
}

template <class D>
HWY_INLINE MaskTile MaskTileBias(D d, const AttentionArgs& a, MaskBlock* mb,
                                 int64_t kv_begin, int64_t num_keys) {
  return ScanMaskTile<true>(d, a, mb, kv_begin, num_keys);
}

template <class D>
HWY_INLINE MaskTile MaskTileRows(D d, const AttentionArgs& a, MaskBlock* mb,
                                 int64_t kv_begin, int64_t num_keys) {
  return ScanMaskTile<false>(d, a, mb, kv_begin, num_keys);
}

// Applies the tile's bias (MaskTileBias or MaskTileRows) to a transposed
// score tile (`cols` query vectors): s += bias, and a -inf bias hides even a
// +inf or NaN score (as the reference). Returns whether some key was hidden
// from some lane.
template <class D>
HWY_INLINE bool MaskTileApply(D d, int cols, const MaskBlock& mb,
                              int64_t num_keys, float* HWY_RESTRICT st) {
  const size_t N = hn::Lanes(d);
  const float neg_inf_s = -std::numeric_limits<float>::infinity();
  const auto neg_inf = hn::Set(d, neg_inf_s);
  const size_t stride = cols * N;
  if (mb.num_rows == 1) {  // every lane shares one row: broadcast per key
    const float* row = mb.row_data[0];
    bool hidden = false;
    for (int64_t j = 0; j < num_keys; ++j) {
      hidden |= row[j] == neg_inf_s;
      const auto bias = hn::Set(d, row[j]);
      const auto hide = hn::Eq(bias, neg_inf);
      for (int c = 0; c < cols; ++c) {
        float* HWY_RESTRICT x = st + j * stride + c * N;
        hn::Store(hn::IfThenElse(hide, neg_inf, hn::Add(hn::Load(d, x), bias)), d, x);
      }
    }
    return hidden;
  }
  return MaskTileApplyRows(d, mb, num_keys, stride, st);
}


// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_MASK_INL_H_
