// What SEMANTICS.md does to a score between Q·K and the softmax: softcap,
// ALiBi, explicit masks and the index masks of causal/window. Per-target code
// on transposed score tiles (include from a foreach_target TU).

#if defined(SIMDATTN_LIB_KERNELS_SCORE_MODS_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_SCORE_MODS_INL_H_
#undef SIMDATTN_LIB_KERNELS_SCORE_MODS_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_SCORE_MODS_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "lib/dtype.h"
#include "lib/kernels/convert-inl.h"
#include "lib/kernels/exp-inl.h"
#include "lib/kernels/kernels.h"
#include "lib/philox.h"
#include "lib/kernels/tile_gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Lane r of a block is query rt.query[r] of head rt.head[r]; pos is its
// position p(i) on the key axis and slope its head's ALiBi slope.
struct RowTable {
  int32_t* query;
  int32_t* head;
  float* pos;
  float* slope;

  static constexpr int64_t Floats(int64_t rows) { return 4 * rows; }
  RowTable(float* storage, int64_t rows)
      : query(reinterpret_cast<int32_t*>(storage)),
        head(reinterpret_cast<int32_t*>(storage + rows)),
        pos(storage + 2 * rows),
        slope(storage + 3 * rows) {}
};

// Every function works on a transposed tile st of num_keys rows (key
// kv_begin + j in row j) and `cols` vectors of queries (lane r is the row
// table's query r), row stride cols * N.

// cap * tanh(s / cap) for one vector (Gemma 2), with inv = 1 / cap.
// |y| < 0.625 (y = s / cap): the odd polynomial y + y^3 P(y^2) with the
// Cephes tanhf coefficients, about 1 ulp. Larger |y|: (1 - e) / (1 + e)
// with e = exp(-2|y|) <= 0.29, so 1 - e has no cancellation; that second
// form runs only for vectors holding such a |y|. Against hn::Tanh (expm1
// and a division for every vector) this is about 3x fewer operations
// where logits stay within 0.625 cap. NaN stays NaN; +-Inf gives +-cap.
template <class D, class V = hn::VFromD<D>>
HWY_INLINE V Softcap(D d, V s, V vcap, V inv) {
  const V y = hn::Mul(s, inv);
  const V y2 = hn::Mul(y, y);
  V p = hn::Set(d, -5.70498872745e-3f);
  p = hn::MulAdd(p, y2, hn::Set(d, 2.06390887954e-2f));
  p = hn::MulAdd(p, y2, hn::Set(d, -5.37397155531e-2f));
  p = hn::MulAdd(p, y2, hn::Set(d, 1.33314422036e-1f));
  p = hn::MulAdd(p, y2, hn::Set(d, -3.33332819422e-1f));
  V t = hn::MulAdd(hn::Mul(p, y2), y, y);
  const V ay = hn::Abs(y);
  const auto big = hn::Ge(ay, hn::Set(d, 0.625f));
  if (HWY_UNLIKELY(!hn::AllFalse(d, big))) {
    const V e = ExpNonPositive(d, hn::Mul(ay, hn::Set(d, -2.0f)));
    const V one = hn::Set(d, 1.0f);
    const V q = hn::Div(hn::Sub(one, e), hn::Add(one, e));
    t = hn::IfThenElse(big, hn::CopySign(q, y), t);
  }
  return hn::Mul(vcap, t);
}

// s = cap * tanh(s / cap) (Gemma 2).
template <class D>
HWY_INLINE void SoftcapTile(D d, int cols, float cap, int64_t num_keys,
                            float* HWY_RESTRICT st) {
  const size_t n = static_cast<size_t>(num_keys) * cols * hn::Lanes(d);
  const auto vcap = hn::Set(d, cap);
  const auto inv = hn::Set(d, 1.0f / cap);
  for (size_t i = 0; i < n; i += hn::Lanes(d)) {
    hn::Store(Softcap(d, hn::Load(d, st + i), vcap, inv), d, st + i);
  }
}

// s -= slope * |p(i) - j|, slope and p(i) per lane from the row table.
// Positions are exact in f32 up to 2^24 (checked by the driver).
template <class D>
HWY_INLINE void AlibiTile(D d, int cols, const RowTable& rt, int64_t kv_begin,
                          int64_t num_keys, float* HWY_RESTRICT st) {
  const size_t N = hn::Lanes(d);
  for (int c = 0; c < cols; ++c) {
    const auto slope = hn::LoadU(d, rt.slope + c * N);
    const auto pos = hn::LoadU(d, rt.pos + c * N);
    for (int64_t j = 0; j < num_keys; ++j) {
      const auto key = hn::Set(d, static_cast<float>(kv_begin + j));
      float* HWY_RESTRICT x = st + j * cols * N + c * N;
      hn::Store(hn::NegMulAdd(slope, hn::Abs(hn::Sub(pos, key)), hn::Load(d, x)),
                d, x);
    }
  }
}

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
  void Init(const AttentionArgsF32& a, int64_t b, const RowTable& rt) {
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
HWY_INLINE const float* MaskRow(D d, const AttentionArgsF32& a,
                                const MaskBlock& mb, int64_t u,
                                int64_t kv_begin, int64_t n) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int64_t key_stride = a.mask_strides[3];  // 1, or 0 (broadcast)
  const int64_t at = mb.row_offset[u] + kv_begin * key_stride;
  float* HWY_RESTRICT dst = mb.rows + u * mb.tile_keys;
  if (key_stride == 0) {
    float value;
    if (a.mask_kind == 1) {
      value = static_cast<const uint8_t*>(a.mask)[at] != 0 ? 0.0f : neg_inf;
    } else if (a.mask_kind == 2) {
      value = static_cast<const float*>(a.mask)[at];
    } else {
      value = F16ToF32(static_cast<const uint16_t*>(a.mask)[at]);
    }
    std::fill(dst, dst + n, value);
    return dst;
  }
  // Each distinct row is its own stream, more than the hardware prefetchers
  // follow: ask for the next tile's part of it now.
  const int64_t elem = a.mask_kind == 1 ? 1 : a.mask_kind == 2 ? 4 : 2;
  const char* next = static_cast<const char*>(a.mask) + (at + mb.tile_keys) * elem;
  for (int64_t byte = 0; byte < mb.tile_keys * elem; byte += 64) {
    hwy::Prefetch(next + byte);
  }
  if (a.mask_kind == 2) return static_cast<const float*>(a.mask) + at;
  if (a.mask_kind == 3) {
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
HWY_INLINE MaskTile ScanMaskTile(D d, const AttentionArgsF32& a, MaskBlock* mb,
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
HWY_INLINE MaskTile MaskTileBias(D d, const AttentionArgsF32& a, MaskBlock* mb,
                                 int64_t kv_begin, int64_t num_keys) {
  return ScanMaskTile<true>(d, a, mb, kv_begin, num_keys);
}

template <class D>
HWY_INLINE MaskTile MaskTileRows(D d, const AttentionArgsF32& a, MaskBlock* mb,
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

// Hides keys outside each query's index window: key j is visible to query i
// when j - hi_shift <= i (j <= p(i) + right bound) and
// i <= j - lo_shift (j >= p(i) - left bound). A disabled bound passes
// has_hi / has_lo = false. Shifts fit int32 (checked by the driver).
template <class D>
HWY_INLINE void IndexMaskTile(D d, int cols, const RowTable& rt,
                              int64_t kv_begin, int64_t num_keys, bool has_hi,
                              int64_t hi_shift, bool has_lo, int64_t lo_shift,
                              float* HWY_RESTRICT st) {
  const hn::RebindToSigned<D> di;
  const size_t N = hn::Lanes(d);
  const auto neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  for (int c = 0; c < cols; ++c) {
    const auto query = hn::LoadU(di, rt.query + c * N);
    for (int64_t j = 0; j < num_keys; ++j) {
      const int64_t key = kv_begin + j;
      // Thresholds beyond int32 mean "no query of this block is affected".
      const int64_t first = has_hi ? key - hi_shift : INT32_MIN;
      const int64_t last = has_lo ? key - lo_shift : INT32_MAX;
      const auto t_first = hn::Set(
          di, static_cast<int32_t>(first < INT32_MIN ? INT32_MIN
                                   : first > INT32_MAX ? INT32_MAX : first));
      const auto t_last = hn::Set(
          di, static_cast<int32_t>(last < INT32_MIN ? INT32_MIN
                                   : last > INT32_MAX ? INT32_MAX : last));
      float* HWY_RESTRICT x = st + j * cols * N + c * N;
      const auto hide = hn::Or(hn::Lt(query, t_first), hn::Gt(query, t_last));
      hn::Store(hn::IfThenElse(hn::RebindMask(d, hide), neg_inf, hn::Load(d, x)),
                d, x);
    }
  }
}

#if HWY_TARGET != HWY_SCALAR
// Philox4x32-10 of lib/philox.h with one counter per 64-bit lane, held in
// its even 32-bit lane (the odd lanes carry junk that MulEven ignores): each
// round's two products come whole from MulEven, so a round is 6 operations.
// (One counter per 32-bit lane needs two MulEven per product, Highway 1.0.3
// having no 32x32 -> high-32 multiply, and shuffles to interleave the
// halves: 16 operations per round for twice the counters.)
template <class D32>
HWY_INLINE void PhiloxEvenLanes(D32 d, hn::Vec<D32>* c0, hn::Vec<D32>* c1,
                                hn::Vec<D32>* c2, hn::Vec<D32>* c3,
                                Philox4x32Key key) {
  const auto m0 = hn::Set(d, philox_internal::kMultiplier0);
  const auto m1 = hn::Set(d, philox_internal::kMultiplier1);
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key.v[0] += philox_internal::kWeyl0;
      key.v[1] += philox_internal::kWeyl1;
    }
    const auto p0 = hn::MulEven(*c0, m0);  // hi:lo of c0 * M0, per 64 bits
    const auto p1 = hn::MulEven(*c2, m1);
    *c0 = hn::Xor3(hn::BitCast(d, hn::ShiftRight<32>(p1)), *c1, hn::Set(d, key.v[0]));
    *c1 = hn::BitCast(d, p1);
    *c2 = hn::Xor3(hn::BitCast(d, hn::ShiftRight<32>(p0)), *c3, hn::Set(d, key.v[1]));
    *c3 = hn::BitCast(d, p0);
  }
}
#endif

// The keep rule of dropout, shared by the tile and row forms below: a weight
// is kept when its 16-bit draw (lib/philox.h) is >= DropoutThreshold(p), then
// divided by 1 - p; a dropped one becomes -0.0; +0.0 (a hidden key) stays as
// it is.
struct DropoutRule {
  Philox4x32Key key;
  uint32_t threshold;
  float inv_keep;

  explicit DropoutRule(const AttentionArgsF32& a)
      : key{{static_cast<uint32_t>(a.dropout_seed),
             static_cast<uint32_t>(a.dropout_seed >> 32)}},
        threshold(DropoutThreshold(a.dropout_p)),
        inv_keep(static_cast<float>(1.0 / (1.0 - a.dropout_p))) {}

  float Apply(uint32_t draw, float p) const {
    if (p == 0.0f) return p;
    return draw >= threshold ? p * inv_keep : -0.0f;
  }
};

#if HWY_TARGET != HWY_SCALAR
// DropoutRule::Apply on a vector of weights p with their draws (u32 lanes
// holding 16-bit values, so a signed compare is exact).
template <class D, class VU>
HWY_INLINE hn::VFromD<D> DropoutLanes(D d, VU draw, hn::VFromD<D> p,
                                      const DropoutRule& rule) {
  const hn::RebindToSigned<D> di;
  // draw >= threshold, as draw > threshold - 1: one compare.
  const auto below = hn::Set(di, static_cast<int32_t>(rule.threshold) - 1);
  const auto keep = hn::RebindMask(d, hn::Gt(hn::BitCast(di, draw), below));
  const auto dropped = hn::IfThenElse(hn::Eq(p, hn::Zero(d)), p, hn::Set(d, -0.0f));
  return hn::IfThenElse(keep, hn::Mul(p, hn::Set(d, rule.inv_keep)), dropped);
}

// The 16-bit draw of key k (0..7) of a group from the four Philox words.
template <class DU>
HWY_INLINE hn::VFromD<DU> DrawOfKey(DU du, int64_t k, hn::VFromD<DU> w0,
                                    hn::VFromD<DU> w1, hn::VFromD<DU> w2,
                                    hn::VFromD<DU> w3) {
  const auto w = k < 2 ? w0 : k < 4 ? w1 : k < 6 ? w2 : w3;
  return (k & 1) ? hn::ShiftRight<16>(w) : hn::And(w, hn::Set(du, 0xFFFFu));
}
#endif

// Dropout on the weights of a tile (after the softmax recurrence consumed
// them, so l and LSE are unaffected): kept weights are divided by 1 - p,
// dropped ones become -0.0. The sign tells the P·V guard (which skips +0.0,
// the weight of a hidden key) that a dropped key is visible: like the
// reference, it still multiplies its V row, so Inf/NaN there propagates.
// keep(b, h, i, j) is DropoutKeep's (reference.h), so it depends on nothing
// but the indices. Lanes are queries: two PhiloxEvenLanes calls (the lanes'
// first and second halves) cover 8 keys of a query vector. Against one call
// with a counter per 32-bit lane, alternating call by call (f32 B1 H8 L2048
// D128, dropout 0.1, 1 thread, 40 pairs): 1.017x faster, and 1.023x more
// from the 5-operation keep rule of DropoutLanes.
template <class D>
HWY_INLINE void DropoutTile(D d, int cols, const AttentionArgsF32& a,
                            int64_t b, const RowTable& rt, int64_t kv_begin,
                            int64_t num_keys, float* HWY_RESTRICT st) {
  const DropoutRule rule(a);
  const Philox4x32Key key = rule.key;
  const size_t N = hn::Lanes(d);
  const size_t stride = cols * N;
  constexpr int64_t G = kDropoutKeysPerCall;
#if HWY_TARGET == HWY_SCALAR
  for (int c = 0; c < cols; ++c) {
    const int64_t i = rt.query[c];
    const int64_t h = rt.head[c];
    int64_t j = 0;
    while (j < num_keys) {
      const int64_t key_index = kv_begin + j;
      const Philox4x32Counter out =
          Philox4x32_10(DropoutCounter(b, h, i, key_index / G), key);
      for (int64_t k = key_index % G; k < G && j < num_keys; ++k, ++j) {
        float& p = st[j * stride + c];
        p = rule.Apply(DropoutDraw(out, k), p);
      }
    }
  }
  (void)N;
#else
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;
  const int64_t group_first = kv_begin / G;
  const int64_t group_last = (kv_begin + num_keys - 1) / G;
  const hn::Repartition<uint64_t, decltype(du)> d64;
  const hn::Half<decltype(du)> dh;
  for (int c = 0; c < cols; ++c) {
    const auto query = hn::BitCast(du, hn::LoadU(di, rt.query + c * N));
    const auto head = hn::BitCast(du, hn::LoadU(di, rt.head + c * N));
    // The lanes' queries and heads in the even 32-bit lanes of two vectors,
    // lanes [0, N / 2) and [N / 2, N).
    const auto query_lo = hn::BitCast(du, hn::PromoteTo(d64, hn::LowerHalf(dh, query)));
    const auto query_hi = hn::BitCast(du, hn::PromoteTo(d64, hn::UpperHalf(dh, query)));
    const auto head_lo = hn::BitCast(du, hn::PromoteTo(d64, hn::LowerHalf(dh, head)));
    const auto head_hi = hn::BitCast(du, hn::PromoteTo(d64, hn::UpperHalf(dh, head)));
    for (int64_t g = group_first; g <= group_last; ++g) {
      // (SVE vectors cannot live in arrays: four named words.)
      auto w0 = hn::Set(du, static_cast<uint32_t>(g));
      auto w1 = query_lo;
      auto w2 = head_lo;
      auto w3 = hn::Set(du, static_cast<uint32_t>(b));
      auto u0 = w0, u1 = query_hi, u2 = head_hi, u3 = w3;
      PhiloxEvenLanes(du, &w0, &w1, &w2, &w3, key);
      PhiloxEvenLanes(du, &u0, &u1, &u2, &u3, key);
      // Lane r's words, r < N / 2 from w, the others from u.
      w0 = hn::ConcatEven(du, u0, w0);
      w1 = hn::ConcatEven(du, u1, w1);
      w2 = hn::ConcatEven(du, u2, w2);
      w3 = hn::ConcatEven(du, u3, w3);
      const int64_t j_first = std::max<int64_t>(G * g, kv_begin) - kv_begin;
      const int64_t j_end = std::min<int64_t>(G * g + G, kv_begin + num_keys) - kv_begin;
      const auto apply = [&](int64_t j, hn::VFromD<decltype(du)> draw) {
        float* HWY_RESTRICT x = st + j * stride + c * N;
        hn::Store(DropoutLanes(d, draw, hn::Load(d, x), rule), d, x);
      };
      if (j_end - j_first == G) {
        // A whole group, unrolled so that each key's word and half are
        // known at compile time: against the loop below (which picks them at
        // run time), alternating call by call, f32 B1 H8 L2048 D128,
        // dropout 0.1, 1 thread: 1.012x faster (63 of 100 pairs).
        static_assert(G == 8, "four words of two draws");
        apply(j_first + 0, DrawOfKey(du, 0, w0, w1, w2, w3));
        apply(j_first + 1, DrawOfKey(du, 1, w0, w1, w2, w3));
        apply(j_first + 2, DrawOfKey(du, 2, w0, w1, w2, w3));
        apply(j_first + 3, DrawOfKey(du, 3, w0, w1, w2, w3));
        apply(j_first + 4, DrawOfKey(du, 4, w0, w1, w2, w3));
        apply(j_first + 5, DrawOfKey(du, 5, w0, w1, w2, w3));
        apply(j_first + 6, DrawOfKey(du, 6, w0, w1, w2, w3));
        apply(j_first + 7, DrawOfKey(du, 7, w0, w1, w2, w3));
        continue;
      }
      for (int64_t j = j_first; j < j_end; ++j) {
        apply(j, DrawOfKey(du, (kv_begin + j) % G, w0, w1, w2, w3));
      }
    }
  }
#endif
}

// ---------------------------------------------------------------- rows
// The same score and weight options for one row of scores with the keys
// along the lanes (the decode path): x[j] is key kv_begin + j of one query.

// s = cap * tanh(s / cap).
template <class D>
HWY_INLINE void SoftcapRow(D d, float cap, int64_t n, float* HWY_RESTRICT x) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto vcap = hn::Set(d, cap);
  const auto inv = hn::Set(d, 1.0f / cap);
  int64_t j = 0;
  for (; j + N <= n; j += N) {
    hn::StoreU(Softcap(d, hn::LoadU(d, x + j), vcap, inv), d, x + j);
  }
  if (j < n) {  // the tail through a vector too, so every key gets one tanh
    HWY_ALIGN float tail[hn::MaxLanes(d)] = {};
    std::copy(x + j, x + n, tail);
    hn::Store(Softcap(d, hn::Load(d, tail), vcap, inv), d, tail);
    std::copy(tail, tail + (n - j), x + j);
  }
}

// s -= slope * |pos - j| for keys j = kv_begin + [0, n).
template <class D>
HWY_INLINE void AlibiRow(D d, float slope, float pos, int64_t kv_begin,
                         int64_t n, float* HWY_RESTRICT x) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto vslope = hn::Set(d, slope);
  const auto vpos = hn::Set(d, pos);
  const auto step = hn::Set(d, static_cast<float>(N));
  auto key = hn::Iota(d, static_cast<float>(kv_begin));
  int64_t j = 0;
  for (; j + N <= n; j += N, key = hn::Add(key, step)) {
    hn::StoreU(hn::NegMulAdd(vslope, hn::Abs(hn::Sub(vpos, key)), hn::LoadU(d, x + j)),
               d, x + j);
  }
  for (; j < n; ++j) {
    x[j] -= slope * std::fabs(pos - static_cast<float>(kv_begin + j));
  }
}

// s += bias, where a -inf bias hides the key even from a +inf or NaN score.
template <class D>
HWY_INLINE void BiasRow(D d, const float* HWY_RESTRICT bias, int64_t n,
                        float* HWY_RESTRICT x) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const float neg_inf_s = -std::numeric_limits<float>::infinity();
  const auto neg_inf = hn::Set(d, neg_inf_s);
  int64_t j = 0;
  for (; j + N <= n; j += N) {
    const auto b = hn::LoadU(d, bias + j);
    hn::StoreU(hn::IfThenElse(hn::Eq(b, neg_inf), neg_inf,
                              hn::Add(hn::LoadU(d, x + j), b)),
               d, x + j);
  }
  for (; j < n; ++j) x[j] = bias[j] == neg_inf_s ? neg_inf_s : x[j] + bias[j];
}

// Dropout on one row of weights of query i of head h (DropoutTile's rule:
// kept weights / (1 - p), dropped ones -0.0, hidden +0.0 untouched). The
// 64-bit lanes are Philox counters here (PhiloxEvenLanes), one per group of
// 8 keys: each call gives 4 words per lane, which StoreInterleaved2 of
// (w0, w1) and (w2, w3) pairs lays out in key order, two 16-bit draws per
// word (low half first: both targets are little-endian). At most
// kDropoutRowKeys keys per call. Against a counter per 32-bit lane (half of
// them unused at 8 groups per tile), alternating call by call on
// decode with f16 KV, B1 Hq32 Hkv8 Lk 16384 D128, dropout 0.1, 1 thread:
// the old code took 6.8% longer (median of 60 pairs).
constexpr int64_t kDropoutRowKeys = 64;

template <class D>
HWY_INLINE void DropoutRow(D d, const AttentionArgsF32& a, int64_t b,
                           int64_t h, int64_t i, int64_t kv_begin, int64_t n,
                           float* HWY_RESTRICT x) {
  const DropoutRule rule(a);
  const Philox4x32Key key = rule.key;
  constexpr int64_t G = kDropoutKeysPerCall;
  const int64_t group_first = kv_begin / G;
  const int64_t group_end = (kv_begin + n + G - 1) / G;
#if HWY_TARGET == HWY_SCALAR
  (void)d;
  for (int64_t g = group_first; g < group_end; ++g) {
    const Philox4x32Counter out = Philox4x32_10(DropoutCounter(b, h, i, g), key);
    for (int64_t k = 0; k < G; ++k) {
      const int64_t j = G * g + k - kv_begin;
      if (j >= 0 && j < n) x[j] = rule.Apply(DropoutDraw(out, k), x[j]);
    }
  }
#else
  const hn::RebindToUnsigned<D> du;
  const hn::Repartition<uint64_t, decltype(du)> d64;
  const hn::Rebind<uint16_t, decltype(du)> du16;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t N64 = static_cast<int64_t>(hn::Lanes(d64));
  // Words of groups group_first + [0, groups), 4 per group, rounded up to
  // whole vectors of groups.
  constexpr size_t kMaxWords = 4 * (kDropoutRowKeys / G + 1) + 4 * hn::MaxLanes(d64);
  HWY_ALIGN uint32_t words[kMaxWords];
  for (int64_t g = group_first; g < group_end; g += N64) {
    // Counter word 0 of group g + k in the low half of 64-bit lane k.
    auto w0 = hn::BitCast(du, hn::Iota(d64, static_cast<uint64_t>(static_cast<uint32_t>(g))));
    auto w1 = hn::Set(du, static_cast<uint32_t>(i));
    auto w2 = hn::Set(du, static_cast<uint32_t>(h));
    auto w3 = hn::Set(du, static_cast<uint32_t>(b));
    PhiloxEvenLanes(du, &w0, &w1, &w2, &w3, key);
    // Lane k as 64 bits: words (0, 1) and (2, 3) of group g + k.
    const auto w01 = hn::BitCast(
        d64, hn::OddEven(hn::BitCast(du, hn::ShiftLeft<32>(hn::BitCast(d64, w1))), w0));
    const auto w23 = hn::BitCast(
        d64, hn::OddEven(hn::BitCast(du, hn::ShiftLeft<32>(hn::BitCast(d64, w3))), w2));
    hn::StoreInterleaved2(w01, w23, d64,
                          reinterpret_cast<uint64_t*>(words + 4 * (g - group_first)));
  }
  // The 16-bit draws of keys G * group_first + [0, 2 * words), in key order.
  HWY_ALIGN uint16_t draws[2 * kMaxWords];
  const int64_t used_words = 4 * (group_end - group_first);
  std::memcpy(draws, words, static_cast<size_t>(used_words) * sizeof(uint32_t));
  const uint16_t* row = draws + (kv_begin - G * group_first);
  int64_t j = 0;
  for (; j + N <= n; j += N) {
    const auto draw = hn::PromoteTo(du, hn::LoadU(du16, row + j));
    hn::StoreU(DropoutLanes(d, draw, hn::LoadU(d, x + j), rule), d, x + j);
  }
  for (; j < n; ++j) x[j] = rule.Apply(row[j], x[j]);
#endif
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_SCORE_MODS_INL_H_
