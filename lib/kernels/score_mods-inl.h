// What SEMANTICS.md does to a score between Q·K and the softmax: softcap,
// ALiBi and the index masks of causal/window (explicit masks: mask-inl.h),
// on transposed score tiles and on rows of scores. Per-target code
// (include from a foreach_target TU).

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

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_SCORE_MODS_INL_H_

