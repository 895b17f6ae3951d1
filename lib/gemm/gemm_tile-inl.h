// The GEMM's register tile: kGemmRows rows of packed A (broadcast) times
// kGemmCols vectors of a packed W panel, f32 accumulators held in named
// registers. Per-target code (include from a foreach_target TU).

#if defined(SIMDATTN_LIB_GEMM_GEMM_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_GEMM_GEMM_TILE_INL_H_
#undef SIMDATTN_LIB_GEMM_GEMM_TILE_INL_H_
#else
#define SIMDATTN_LIB_GEMM_GEMM_TILE_INL_H_
#endif

#include <cstdint>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// 32-register targets (AVX-512, NEON, SVE): 6 x 4 = 24 accumulators, 4
// panel vectors and a broadcast. Per reduction step 6 broadcasts + 4 loads
// feed 24 FMAs (0.42 loads per FMA; the attention's 8 x 2 tile needs 0.63
// and reached 70% of roofline/fma_f32 here against oneDNN's 77%).
// 16-register targets: 6 x 2 = 12 accumulators + 2 + 1 (BLIS's Haswell
// shape), nothing spills.
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4 || \
    HWY_TARGET == HWY_SSSE3 || HWY_TARGET == HWY_SCALAR
constexpr int kGemmRows = 6;
constexpr int kGemmCols = 2;
#else
constexpr int kGemmRows = 6;
constexpr int kGemmCols = 4;
#endif

// Row R of the tile: its kGemmCols accumulators updated by one step (its
// value of A at bt[R * row], `row` elements between rows).
template <int R, int kRows, class D, class V>
HWY_INLINE void GemmFmaRow(D d, const float* HWY_RESTRICT bt, int64_t row, V x0, V x1,
                           V x2, V x3, V& c0, V& c1, V& c2, V& c3) {
  if constexpr (R < kRows) {
    const V y = hn::Set(d, bt[R * row]);
    c0 = hn::MulAdd(y, x0, c0);
    c1 = hn::MulAdd(y, x1, c1);
    if constexpr (kGemmCols > 2) {
      c2 = hn::MulAdd(y, x2, c2);
      c3 = hn::MulAdd(y, x3, c3);
    }
  }
}

template <int R, int kRows, bool kAccumulate, class D, class V>
HWY_INLINE void GemmLoadRow(D d, const float* HWY_RESTRICT out, V& c0, V& c1,
                            V& c2, V& c3) {
  if constexpr (kAccumulate && R < kRows) {
    const size_t N = hn::Lanes(d);
    const float* row = out + R * kGemmCols * N;
    c0 = hn::Load(d, row);
    c1 = hn::Load(d, row + N);
    if constexpr (kGemmCols > 2) {
      c2 = hn::Load(d, row + 2 * N);
      c3 = hn::Load(d, row + 3 * N);
    }
  }
}

template <int R, int kRows, class D, class V>
HWY_INLINE void GemmStoreRow(D d, V c0, V c1, V c2, V c3, float* HWY_RESTRICT out) {
  if constexpr (R < kRows) {
    const size_t N = hn::Lanes(d);
    float* row = out + R * kGemmCols * N;
    hn::Store(c0, d, row);
    hn::Store(c1, d, row + N);
    if constexpr (kGemmCols > 2) {
      hn::Store(c2, d, row + 2 * N);
      hn::Store(c3, d, row + 3 * N);
    }
  }
}

// out[r][c] (+)= sum_{t < n} b[t * step + r * row] * a[t * kGemmCols * N + c]
// for r < kRows and the kGemmCols * N columns c. b: rows of A (a packed
// group: step = its rows, row = 1; A in place: step = 1, row = lda); a:
// the packed panel; out: rows of kGemmCols vectors, vector-aligned. One
// FMA chain per element over t in order.
template <int kRows, bool kAccumulate, class D>
HWY_INLINE void GemmTile(D d, const float* HWY_RESTRICT b, int64_t step, int64_t row,
                         const float* HWY_RESTRICT a, int64_t n,
                         float* HWY_RESTRICT out) {
  static_assert(kRows >= 1 && kRows <= 6, "1 to 6 rows");
  using V = hn::VFromD<D>;
  const size_t N = hn::Lanes(d);
  V c00 = hn::Zero(d), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00;
  V c12 = c00, c13 = c00, c20 = c00, c21 = c00, c22 = c00, c23 = c00;
  V c30 = c00, c31 = c00, c32 = c00, c33 = c00, c40 = c00, c41 = c00;
  V c42 = c00, c43 = c00, c50 = c00, c51 = c00, c52 = c00, c53 = c00;
  GemmLoadRow<0, kRows, kAccumulate>(d, out, c00, c01, c02, c03);
  GemmLoadRow<1, kRows, kAccumulate>(d, out, c10, c11, c12, c13);
  GemmLoadRow<2, kRows, kAccumulate>(d, out, c20, c21, c22, c23);
  GemmLoadRow<3, kRows, kAccumulate>(d, out, c30, c31, c32, c33);
  GemmLoadRow<4, kRows, kAccumulate>(d, out, c40, c41, c42, c43);
  GemmLoadRow<5, kRows, kAccumulate>(d, out, c50, c51, c52, c53);
  for (int64_t t = 0; t < n; ++t) {
    const float* HWY_RESTRICT at = a + t * kGemmCols * N;
    const V x0 = hn::Load(d, at), x1 = hn::Load(d, at + N);
    const V x2 = kGemmCols > 2 ? hn::Load(d, at + 2 * N) : x0;
    const V x3 = kGemmCols > 2 ? hn::Load(d, at + 3 * N) : x1;
    const float* HWY_RESTRICT bt = b + t * step;
    GemmFmaRow<0, kRows>(d, bt, row, x0, x1, x2, x3, c00, c01, c02, c03);
    GemmFmaRow<1, kRows>(d, bt, row, x0, x1, x2, x3, c10, c11, c12, c13);
    GemmFmaRow<2, kRows>(d, bt, row, x0, x1, x2, x3, c20, c21, c22, c23);
    GemmFmaRow<3, kRows>(d, bt, row, x0, x1, x2, x3, c30, c31, c32, c33);
    GemmFmaRow<4, kRows>(d, bt, row, x0, x1, x2, x3, c40, c41, c42, c43);
    GemmFmaRow<5, kRows>(d, bt, row, x0, x1, x2, x3, c50, c51, c52, c53);
  }
  GemmStoreRow<0, kRows>(d, c00, c01, c02, c03, out);
  GemmStoreRow<1, kRows>(d, c10, c11, c12, c13, out);
  GemmStoreRow<2, kRows>(d, c20, c21, c22, c23, out);
  GemmStoreRow<3, kRows>(d, c30, c31, c32, c33, out);
  GemmStoreRow<4, kRows>(d, c40, c41, c42, c43, out);
  GemmStoreRow<5, kRows>(d, c50, c51, c52, c53, out);
}

// Where the rows of A lie for GemmRows, from reduction step k0 on: full
// groups of kGemmRows rows (group g at groups + g * group_stride), then the
// m % kGemmRows last rows at tail; row r's value at step t is at
// t * step + r * row from its group's start (tail_step, tail_row for the
// tail).
struct GemmRowsOfA {
  const float* groups;
  int64_t group_stride, step, row;
  const float* tail;
  int64_t tail_step, tail_row;
};

// GemmTile over `rows` rows of A from step k0 on: the full groups, then
// the tail rows in one tile of the tail's size.
template <bool kAccumulate, class D>
HWY_INLINE void GemmRows(D d, int64_t rows, const GemmRowsOfA& ra, int64_t k0,
                         const float* HWY_RESTRICT a, int64_t n,
                         float* HWY_RESTRICT out) {
  const int64_t out_row = kGemmCols * static_cast<int64_t>(hn::Lanes(d));
  const float* b = ra.groups + k0 * ra.step;
  int64_t r = 0;
  for (; r + kGemmRows <= rows; r += kGemmRows, b += ra.group_stride) {
    GemmTile<kGemmRows, kAccumulate>(d, b, ra.step, ra.row, a, n, out + r * out_row);
  }
  if (r == rows) return;
  float* o = out + r * out_row;
  const float* bt = ra.tail + k0 * ra.tail_step;
  const int64_t ts = ra.tail_step, tr = ra.tail_row;
  switch (rows - r) {  // the last rows of A, fewer than kGemmRows
    case 1: GemmTile<1, kAccumulate>(d, bt, ts, tr, a, n, o); break;
    case 2: GemmTile<2, kAccumulate>(d, bt, ts, tr, a, n, o); break;
    case 3: GemmTile<3, kAccumulate>(d, bt, ts, tr, a, n, o); break;
    case 4: GemmTile<4, kAccumulate>(d, bt, ts, tr, a, n, o); break;
    default: GemmTile<5, kAccumulate>(d, bt, ts, tr, a, n, o); break;
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_GEMM_GEMM_TILE_INL_H_
