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

#include <cstdint>
#include <cstring>
#include <limits>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "lib/dtype.h"
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

// s = cap * tanh(s / cap) (Gemma 2).
template <class D>
HWY_INLINE void SoftcapTile(D d, int cols, float cap, int64_t num_keys,
                            float* HWY_RESTRICT st) {
  const size_t n = static_cast<size_t>(num_keys) * cols * hn::Lanes(d);
  const auto vcap = hn::Set(d, cap);
  const auto inv = hn::Set(d, 1.0f / cap);
  for (size_t i = 0; i < n; i += hn::Lanes(d)) {
    const auto s = hn::Load(d, st + i);
    hn::Store(hn::Mul(vcap, hn::Tanh(d, hn::Mul(s, inv))), d, st + i);
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

// Explicit mask for rows [0, rows) of the block: bool hides where 0; an
// additive mask adds, and -inf hides even a +inf score (as the reference).
// Scalar: the mask's query stride is arbitrary (broadcasts are stride 0).
inline void ExplicitMaskTile(const AttentionArgsF32& a, int64_t b,
                             const RowTable& rt, int64_t rows,
                             int64_t kv_begin, int64_t num_keys,
                             int64_t row_stride, float* HWY_RESTRICT st) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < num_keys; ++j) {
    float* HWY_RESTRICT row = st + j * row_stride;
    const int64_t col = b * a.mask_strides[0] + (kv_begin + j) * a.mask_strides[3];
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t at = col + rt.head[r] * a.mask_strides[1] +
                         rt.query[r] * a.mask_strides[2];
      if (a.mask_kind == 1) {
        if (static_cast<const uint8_t*>(a.mask)[at] == 0) row[r] = neg_inf;
        continue;
      }
      float add;
      if (a.mask_kind == 2) {
        add = static_cast<const float*>(a.mask)[at];
      } else {
        add = F16ToF32(static_cast<const uint16_t*>(a.mask)[at]);
      }
      row[r] = add == neg_inf ? neg_inf : row[r] + add;
    }
  }
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

// Dropout on the weights of a tile (after the softmax recurrence consumed
// them, so l and LSE are unaffected): kept weights are divided by 1 - p,
// dropped ones become -0.0. The sign tells the P·V guard (which skips +0.0,
// the weight of a hidden key) that a dropped key is visible: like the
// reference, it still multiplies its V row, so Inf/NaN there propagates.
// keep(b, h, i, j) is the Philox4x32-10 draw of DropoutKeep (reference.h):
// counter (j / 4, i, h, b), word j % 4, so it depends on nothing but the
// indices. Scalar: one Philox call per 4 keys of a row.
inline void DropoutTile(const AttentionArgsF32& a, int64_t b,
                        const RowTable& rt, int64_t rows, int64_t kv_begin,
                        int64_t num_keys, int64_t row_stride,
                        float* HWY_RESTRICT st) {
  const Philox4x32Key key = {{static_cast<uint32_t>(a.dropout_seed),
                              static_cast<uint32_t>(a.dropout_seed >> 32)}};
  const uint64_t threshold = static_cast<uint64_t>(
      static_cast<double>(a.dropout_p) * 4294967296.0);
  const float inv_keep = static_cast<float>(1.0 / (1.0 - a.dropout_p));
  for (int64_t r = 0; r < rows; ++r) {
    const uint32_t i = static_cast<uint32_t>(rt.query[r]);
    const uint32_t h = static_cast<uint32_t>(rt.head[r]);
    int64_t j = 0;
    while (j < num_keys) {
      const int64_t key_index = kv_begin + j;
      const Philox4x32Counter counter = {
          {static_cast<uint32_t>(key_index / 4), i, h,
           static_cast<uint32_t>(b)}};
      const Philox4x32Counter draw = Philox4x32_10(counter, key);
      // The keys of this draw that fall in the tile.
      for (int64_t w = key_index % 4; w < 4 && j < num_keys; ++w, ++j) {
        float& p = st[j * row_stride + r];
        if (p == 0.0f) continue;  // hidden (+0.0) stays hidden
        p = static_cast<uint64_t>(draw.v[w]) >= threshold ? p * inv_keep
                                                           : -0.0f;
      }
    }
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_SCORE_MODS_INL_H_
