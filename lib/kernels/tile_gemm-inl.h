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
// Register-tile row R of TileGemm: its accumulators c0, c1 (vectors 0 and 1
// of the row) loaded and rescaled, updated by one reduction step, stored.
// Rows at or past kRows do nothing, so TileGemm spells out all 8.
template <int R, int kRows, int kCols, class D, class V>
HWY_INLINE void LoadTileRow(D d, const float* HWY_RESTRICT out, int64_t out_row,
                            const float* HWY_RESTRICT scale, V& c0, V& c1) {
  if constexpr (R < kRows) {
    const size_t N = hn::Lanes(d);
    c0 = hn::Load(d, out + R * out_row);
    if (kCols > 1) c1 = hn::Load(d, out + R * out_row + N);
    if (scale != nullptr) {
      c0 = hn::Mul(c0, hn::Load(d, scale));
      if (kCols > 1) c1 = hn::Mul(c1, hn::Load(d, scale + N));
    }
  }
}

template <int R, int kRows, int kCols, class D, class V>
HWY_INLINE void FmaTileRow(D d, const float* HWY_RESTRICT bt, int64_t b_row,
                           V x0, V x1, V& c0, V& c1) {
  if constexpr (R < kRows) {
    const V y = hn::Set(d, bt[R * b_row]);
    c0 = hn::MulAdd(y, x0, c0);
    if (kCols > 1) c1 = hn::MulAdd(y, x1, c1);
  }
}

// FmaTileRow where lanes of hide0 / hide1 keep their accumulator (kGuard).
template <int R, int kRows, int kCols, class D, class V, class M>
HWY_INLINE void GuardedFmaTileRow(D d, const float* HWY_RESTRICT bt,
                                  int64_t b_row, V x0, V x1, M hide0, M hide1,
                                  V& c0, V& c1) {
  if constexpr (R < kRows) {
    const V y = hn::Set(d, bt[R * b_row]);
    c0 = hn::IfThenElse(hide0, c0, hn::MulAdd(y, x0, c0));
    if (kCols > 1) c1 = hn::IfThenElse(hide1, c1, hn::MulAdd(y, x1, c1));
  }
}

template <int R, int kRows, int kCols, class D, class V>
HWY_INLINE void StoreTileRow(D d, V c0, V c1, float* HWY_RESTRICT out,
                             int64_t out_row) {
  if constexpr (R < kRows) {
    hn::Store(c0, d, out + R * out_row);
    if (kCols > 1) hn::Store(c1, d, out + R * out_row + hn::Lanes(d));
  }
}

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
    LoadTileRow<0, kRows, kCols>(d, out, out_row, scale, a00, a01);
    LoadTileRow<1, kRows, kCols>(d, out, out_row, scale, a10, a11);
    LoadTileRow<2, kRows, kCols>(d, out, out_row, scale, a20, a21);
    LoadTileRow<3, kRows, kCols>(d, out, out_row, scale, a30, a31);
    LoadTileRow<4, kRows, kCols>(d, out, out_row, scale, a40, a41);
    LoadTileRow<5, kRows, kCols>(d, out, out_row, scale, a50, a51);
    LoadTileRow<6, kRows, kCols>(d, out, out_row, scale, a60, a61);
    LoadTileRow<7, kRows, kCols>(d, out, out_row, scale, a70, a71);
  }
  for (int64_t t = 0; t < n; ++t) {
    const V x0 = hn::Load(d, a + t * a_t);
    const V x1 = kCols > 1 ? hn::Load(d, a + t * a_t + N) : x0;
    const float* HWY_RESTRICT bt = b + t * b_t;
    if (kGuard) {
      const hn::RebindToUnsigned<D> du;
      const auto h0 = hn::RebindMask(d, hn::Eq(hn::BitCast(du, x0), hn::Zero(du)));
      const auto h1 = hn::RebindMask(d, hn::Eq(hn::BitCast(du, x1), hn::Zero(du)));
      GuardedFmaTileRow<0, kRows, kCols>(d, bt, b_row, x0, x1, h0, h1, a00, a01);
      GuardedFmaTileRow<1, kRows, kCols>(d, bt, b_row, x0, x1, h0, h1, a10, a11);
      GuardedFmaTileRow<2, kRows, kCols>(d, bt, b_row, x0, x1, h0, h1, a20, a21);
      GuardedFmaTileRow<3, kRows, kCols>(d, bt, b_row, x0, x1, h0, h1, a30, a31);
      GuardedFmaTileRow<4, kRows, kCols>(d, bt, b_row, x0, x1, h0, h1, a40, a41);
      GuardedFmaTileRow<5, kRows, kCols>(d, bt, b_row, x0, x1, h0, h1, a50, a51);
      GuardedFmaTileRow<6, kRows, kCols>(d, bt, b_row, x0, x1, h0, h1, a60, a61);
      GuardedFmaTileRow<7, kRows, kCols>(d, bt, b_row, x0, x1, h0, h1, a70, a71);
    } else {
      FmaTileRow<0, kRows, kCols>(d, bt, b_row, x0, x1, a00, a01);
      FmaTileRow<1, kRows, kCols>(d, bt, b_row, x0, x1, a10, a11);
      FmaTileRow<2, kRows, kCols>(d, bt, b_row, x0, x1, a20, a21);
      FmaTileRow<3, kRows, kCols>(d, bt, b_row, x0, x1, a30, a31);
      FmaTileRow<4, kRows, kCols>(d, bt, b_row, x0, x1, a40, a41);
      FmaTileRow<5, kRows, kCols>(d, bt, b_row, x0, x1, a50, a51);
      FmaTileRow<6, kRows, kCols>(d, bt, b_row, x0, x1, a60, a61);
      FmaTileRow<7, kRows, kCols>(d, bt, b_row, x0, x1, a70, a71);
    }
  }
  StoreTileRow<0, kRows, kCols>(d, a00, a01, out, out_row);
  StoreTileRow<1, kRows, kCols>(d, a10, a11, out, out_row);
  StoreTileRow<2, kRows, kCols>(d, a20, a21, out, out_row);
  StoreTileRow<3, kRows, kCols>(d, a30, a31, out, out_row);
  StoreTileRow<4, kRows, kCols>(d, a40, a41, out, out_row);
  StoreTileRow<5, kRows, kCols>(d, a50, a51, out, out_row);
  StoreTileRow<6, kRows, kCols>(d, a60, a61, out, out_row);
  StoreTileRow<7, kRows, kCols>(d, a70, a71, out, out_row);
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
