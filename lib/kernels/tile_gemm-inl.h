// The register-blocked micro-kernel behind both products of the fused
// kernel, S^T = K·Qt and O^T += V^T·P^T: per-target code (include from a
// foreach_target translation unit).

#if defined(SIMDATTN_LIB_KERNELS_TILE_GEMM_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_TILE_GEMM_INL_H_
#undef SIMDATTN_LIB_KERNELS_TILE_GEMM_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_TILE_GEMM_INL_H_
#endif

#include <cstdint>
#include <type_traits>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Register tile: kTileRows broadcast rows x kTileCols vectors of queries.
// 32-register targets (AVX-512, NEON, SVE) hold 8 x 2 = 16 accumulators plus
// 2 loaded vectors and a broadcast: per reduction step 2 vector loads and 8
// broadcasts (10 loads, 5 cycles on 2 load ports) feed 16 FMAs (8 cycles on 2
// FMA ports), and the packed operand costs 8 bytes per FMA from L1/L2.
// 16-register targets (AVX2, SSE4, SSSE3) use 4 x 2 so nothing spills.
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4 || \
    HWY_TARGET == HWY_SSSE3 || HWY_TARGET == HWY_SCALAR
constexpr int kTileRows = 4;
#else
constexpr int kTileRows = 8;
#endif
// Query vectors per register tile: 2. A query block has up to
// kQueryBlockVectors of them; TileGemmRows runs wider blocks as pairs.
constexpr int kTileCols = 2;

// For rows r < kRows and vectors c < kTileCols:
//   out[r][c] = (kAccumulate ? scale[c] * out[r][c] : 0)
//             + sum_{t < n} b[r * b_row + t * b_t] * a[t * a_t + c * N]
// where N = Lanes(d). `a` is the packed operand (vector-aligned rows of
// kTileCols vectors); `b` is read by scalar broadcasts straight from the
// caller's tensor. out rows are out_row floats apart, vector-aligned.
// scale may be null (no rescale). f32 accumulation, sequential over t, so the
// result does not depend on how callers split rows.
//
// kGuard (P·V of a tile with hidden keys): terms whose packed value a is
// +0.0 are skipped, not multiplied: a hidden key has weight exactly +0.0, and
// 0 * Inf would make an Inf of V leak into rows that never see it. (A visible
// key whose weight underflowed to +0.0 in f32 is skipped too; it adds 0
// either way unless its V is Inf/NaN. Dropped keys carry -0.0 and are
// multiplied.)
template <int kRows, int kCols, bool kAccumulate, bool kGuard, class D>
HWY_INLINE void TileGemm(D d, const float* HWY_RESTRICT b, int64_t b_row,
                         int64_t b_t, const float* HWY_RESTRICT a, int64_t a_t,
                         int64_t n, const float* HWY_RESTRICT scale,
                         float* HWY_RESTRICT out, int64_t out_row) {
  static_assert(kRows >= 1 && kRows <= 8, "1 to 8 rows");
  static_assert(kCols == 1 || kCols == 2, "the accumulators below are for 1 or 2 vectors");
  const size_t N = hn::Lanes(d);
  using V = hn::VFromD<D>;
  V a00 = hn::Zero(d), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00;
  V a30 = a00, a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00;
  V a60 = a00, a61 = a00, a70 = a00, a71 = a00;
  if (kAccumulate) {
#define SIMDATTN_LOAD_ROW(R)                                        \
  if (R < kRows) {                                                  \
    a##R##0 = hn::Load(d, out + R * out_row);                       \
    if (kCols > 1) a##R##1 = hn::Load(d, out + R * out_row + N);    \
    if (scale != nullptr) {                                         \
      a##R##0 = hn::Mul(a##R##0, hn::Load(d, scale));               \
      if (kCols > 1) a##R##1 = hn::Mul(a##R##1, hn::Load(d, scale + N)); \
    }                                                               \
  }
    SIMDATTN_LOAD_ROW(0) SIMDATTN_LOAD_ROW(1) SIMDATTN_LOAD_ROW(2)
    SIMDATTN_LOAD_ROW(3) SIMDATTN_LOAD_ROW(4) SIMDATTN_LOAD_ROW(5)
    SIMDATTN_LOAD_ROW(6) SIMDATTN_LOAD_ROW(7)
#undef SIMDATTN_LOAD_ROW
  }
  for (int64_t t = 0; t < n; ++t) {
    const V x0 = hn::Load(d, a + t * a_t);
    const V x1 = kCols > 1 ? hn::Load(d, a + t * a_t + N) : x0;
    const float* HWY_RESTRICT bt = b + t * b_t;
    if (kGuard) {
      const hn::RebindToUnsigned<D> du;
      const auto hide0 = hn::RebindMask(d, hn::Eq(hn::BitCast(du, x0), hn::Zero(du)));
      const auto hide1 = hn::RebindMask(d, hn::Eq(hn::BitCast(du, x1), hn::Zero(du)));
#define SIMDATTN_FMA_ROW(R)                                                 \
  if (R < kRows) {                                                          \
    const V y = hn::Set(d, bt[R * b_row]);                                  \
    a##R##0 = hn::IfThenElse(hide0, a##R##0, hn::MulAdd(y, x0, a##R##0));   \
    if (kCols > 1) {                                                        \
      a##R##1 = hn::IfThenElse(hide1, a##R##1, hn::MulAdd(y, x1, a##R##1)); \
    }                                                                       \
  }
      SIMDATTN_FMA_ROW(0) SIMDATTN_FMA_ROW(1) SIMDATTN_FMA_ROW(2)
      SIMDATTN_FMA_ROW(3) SIMDATTN_FMA_ROW(4) SIMDATTN_FMA_ROW(5)
      SIMDATTN_FMA_ROW(6) SIMDATTN_FMA_ROW(7)
#undef SIMDATTN_FMA_ROW
    } else {
#define SIMDATTN_FMA_ROW(R)                      \
  if (R < kRows) {                               \
    const V y = hn::Set(d, bt[R * b_row]);       \
    a##R##0 = hn::MulAdd(y, x0, a##R##0);        \
    if (kCols > 1) a##R##1 = hn::MulAdd(y, x1, a##R##1); \
  }
      SIMDATTN_FMA_ROW(0) SIMDATTN_FMA_ROW(1) SIMDATTN_FMA_ROW(2)
      SIMDATTN_FMA_ROW(3) SIMDATTN_FMA_ROW(4) SIMDATTN_FMA_ROW(5)
      SIMDATTN_FMA_ROW(6) SIMDATTN_FMA_ROW(7)
#undef SIMDATTN_FMA_ROW
    }
  }
#define SIMDATTN_STORE_ROW(R)                        \
  if (R < kRows) {                                   \
    hn::Store(a##R##0, d, out + R * out_row);        \
    if (kCols > 1) hn::Store(a##R##1, d, out + R * out_row + N); \
  }
  SIMDATTN_STORE_ROW(0) SIMDATTN_STORE_ROW(1) SIMDATTN_STORE_ROW(2)
  SIMDATTN_STORE_ROW(3) SIMDATTN_STORE_ROW(4) SIMDATTN_STORE_ROW(5)
  SIMDATTN_STORE_ROW(6) SIMDATTN_STORE_ROW(7)
#undef SIMDATTN_STORE_ROW
}

// TileGemm over any number of rows: full tiles of kTileRows, then single rows.
template <int kCols, bool kAccumulate, bool kGuard, class D>
HWY_INLINE void TileGemmRowsCols(D d, int64_t rows, const float* HWY_RESTRICT b,
                             int64_t b_row, int64_t b_t,
                             const float* HWY_RESTRICT a, int64_t a_t,
                             int64_t n, const float* HWY_RESTRICT scale,
                             float* HWY_RESTRICT out, int64_t out_row) {
  int64_t r = 0;
  for (; r + kTileRows <= rows; r += kTileRows) {
    TileGemm<kTileRows, kCols, kAccumulate, kGuard>(d, b + r * b_row, b_row, b_t, a,
                                             a_t, n, scale, out + r * out_row,
                                             out_row);
  }
  for (; r < rows; ++r) {
    TileGemm<1, kCols, kAccumulate, kGuard>(d, b + r * b_row, b_row, b_t, a, a_t, n,
                                     scale, out + r * out_row, out_row);
  }
}

// Runs fn(kCols, a, scale, out) over the query vectors of a block chosen at
// run time: 1, or any even number, two at a time (kCols is a
// std::integral_constant). The pairs go outermost, so that one pair's packed
// operand stays in L1 while the broadcast rows come again from L2.
template <class D, class Fn>
HWY_INLINE void ForEachVectorPair(D d, int cols, const float* a,
                                  const float* scale, float* out, const Fn& fn) {
  if (cols == 1) {
    fn(std::integral_constant<int, 1>(), a, scale, out);
    return;
  }
  const size_t N = hn::Lanes(d);
  for (size_t c = 0; c < static_cast<size_t>(cols); c += 2) {
    fn(std::integral_constant<int, 2>(), a + c * N,
       scale != nullptr ? scale + c * N : nullptr, out + c * N);
  }
}

// TileGemmRowsCols with the number of query vectors chosen at run time.
template <bool kAccumulate, bool kGuard, class D>
HWY_INLINE void TileGemmRows(D d, int cols, int64_t rows,
                             const float* HWY_RESTRICT b, int64_t b_row,
                             int64_t b_t, const float* HWY_RESTRICT a,
                             int64_t a_t, int64_t n,
                             const float* HWY_RESTRICT scale,
                             float* HWY_RESTRICT out, int64_t out_row) {
  ForEachVectorPair(d, cols, a, scale, out,
                    [&](auto k, const float* ac, const float* sc, float* oc) {
                      TileGemmRowsCols<decltype(k)::value, kAccumulate, kGuard>(
                          d, rows, b, b_row, b_t, ac, a_t, n, sc, oc, out_row);
                    });
}

// TileGemmRows over a packed broadcast operand (K and V as PackKvImpl lays
// them out): rows come in groups of kTileRows, group k at b + k * b_group,
// stored [t][kTileRows] so that the reduction reads it sequentially; the
// rows after the last full group (rows % kTileRows of them) are stored
// [t][rem] at b_tail.
template <int kCols, bool kAccumulate, bool kGuard, class D>
HWY_INLINE void TileGemmPackedRowsCols(D d, int64_t rows,
                                       const float* HWY_RESTRICT b,
                                       int64_t b_group,
                                       const float* HWY_RESTRICT b_tail,
                                       const float* HWY_RESTRICT a, int64_t a_t,
                                       int64_t n,
                                       const float* HWY_RESTRICT scale,
                                       float* HWY_RESTRICT out,
                                       int64_t out_row) {
  int64_t r = 0;
  for (; r + kTileRows <= rows; r += kTileRows, b += b_group) {
    TileGemm<kTileRows, kCols, kAccumulate, kGuard>(d, b, 1, kTileRows, a, a_t,
                                                    n, scale, out + r * out_row,
                                                    out_row);
  }
  const int64_t rem = rows - r;
  for (int64_t i = 0; i < rem; ++i) {
    TileGemm<1, kCols, kAccumulate, kGuard>(d, b_tail + i, 1, rem, a, a_t, n,
                                            scale, out + (r + i) * out_row,
                                            out_row);
  }
}

template <bool kAccumulate, bool kGuard, class D>
HWY_INLINE void TileGemmPackedRows(D d, int cols, int64_t rows,
                                   const float* HWY_RESTRICT b, int64_t b_group,
                                   const float* HWY_RESTRICT b_tail,
                                   const float* HWY_RESTRICT a, int64_t a_t,
                                   int64_t n, const float* HWY_RESTRICT scale,
                                   float* HWY_RESTRICT out, int64_t out_row) {
  ForEachVectorPair(
      d, cols, a, scale, out,
      [&](auto k, const float* ac, const float* sc, float* oc) {
        TileGemmPackedRowsCols<decltype(k)::value, kAccumulate, kGuard>(
            d, rows, b, b_group, b_tail, ac, a_t, n, sc, oc, out_row);
      });
}

#if HWY_TARGET != HWY_SCALAR
// In-register transpose of a 4x4 block of floats (4-lane vectors): row t of
// the result is column t of the input. Used to move data between the
// queries-along-lanes tiles and row-major tensors.
template <class D4>
HWY_INLINE void Transpose4x4(D4 d4, hn::Vec<D4>* a0, hn::Vec<D4>* a1,
                             hn::Vec<D4>* a2, hn::Vec<D4>* a3) {
  const hn::Repartition<uint64_t, D4> d64;
  // t0 = (a0[0] a1[0] a0[1] a1[1]), t2 = (a0[2] a1[2] a0[3] a1[3]), ...
  const auto t0 = hn::BitCast(d64, hn::InterleaveLower(d4, *a0, *a1));
  const auto t1 = hn::BitCast(d64, hn::InterleaveLower(d4, *a2, *a3));
  const auto t2 = hn::BitCast(d64, hn::InterleaveUpper(d4, *a0, *a1));
  const auto t3 = hn::BitCast(d64, hn::InterleaveUpper(d4, *a2, *a3));
  *a0 = hn::BitCast(d4, hn::InterleaveLower(d64, t0, t1));
  *a1 = hn::BitCast(d4, hn::InterleaveUpper(d64, t0, t1));
  *a2 = hn::BitCast(d4, hn::InterleaveLower(d64, t2, t3));
  *a3 = hn::BitCast(d4, hn::InterleaveUpper(d64, t2, t3));
}
#endif

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// In-register transpose of 16 rows of 16 floats: afterwards v[c] holds
// column c. Used by the mask apply on the AVX-512 targets. Two interleave
// stages inside 128-bit blocks, then a 4x4 transpose of the blocks.
HWY_INLINE void Transpose16x16(hn::Vec<hn::Full512<float>>* v) {
  const hn::Full512<float> d;
  const hn::Repartition<double, decltype(d)> d64;
  using V = hn::Vec<decltype(d)>;
  V t[16];
  for (int p = 0; p < 8; ++p) {  // rows 2p, 2p + 1 interleaved
    t[2 * p] = hn::InterleaveLower(d, v[2 * p], v[2 * p + 1]);
    t[2 * p + 1] = hn::InterleaveUpper(d, v[2 * p], v[2 * p + 1]);
  }
  // u[4q + k], block b: column 4b + k of rows 4q .. 4q + 3.
  V u[16];
  for (int q = 0; q < 4; ++q) {
    const auto x0 = hn::BitCast(d64, t[4 * q]), x1 = hn::BitCast(d64, t[4 * q + 1]);
    const auto y0 = hn::BitCast(d64, t[4 * q + 2]), y1 = hn::BitCast(d64, t[4 * q + 3]);
    u[4 * q] = hn::BitCast(d, hn::InterleaveLower(d64, x0, y0));
    u[4 * q + 1] = hn::BitCast(d, hn::InterleaveUpper(d64, x0, y0));
    u[4 * q + 2] = hn::BitCast(d, hn::InterleaveLower(d64, x1, y1));
    u[4 * q + 3] = hn::BitCast(d, hn::InterleaveUpper(d64, x1, y1));
  }
  for (int k = 0; k < 4; ++k) {  // column 4b + k = block b of u[4q + k], q = 0..3
    const V g0 = u[k], g1 = u[4 + k], g2 = u[8 + k], g3 = u[12 + k];
    const V e01 = hn::OddEvenBlocks(hn::SwapAdjacentBlocks(g1), g0);  // g0b0 g1b0 g0b2 g1b2
    const V o01 = hn::OddEvenBlocks(g1, hn::SwapAdjacentBlocks(g0));  // g0b1 g1b1 g0b3 g1b3
    const V e23 = hn::OddEvenBlocks(hn::SwapAdjacentBlocks(g3), g2);
    const V o23 = hn::OddEvenBlocks(g3, hn::SwapAdjacentBlocks(g2));
    v[k] = hn::ConcatLowerLower(d, e23, e01);
    v[4 + k] = hn::ConcatLowerLower(d, o23, o01);
    v[8 + k] = hn::ConcatUpperUpper(d, e23, e01);
    v[12 + k] = hn::ConcatUpperUpper(d, o23, o01);
  }
}
#endif

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_TILE_GEMM_INL_H_
