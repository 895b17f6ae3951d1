// Native bf16 products for the AVX3_BF16 entry of the dispatch table: both
// products of the fused kernel through vdpbf16ps (AVX512_BF16), which
// Highway 1.0.3 does not offer (it emulates bf16 with shifts and f32 FMAs).
// Compiled inside the AVX3 target only, with the extra instructions enabled
// per function; the AVX3 code calls them when the CPU has them
// (lib/dispatch.cc checks) and Q, K and V are all stored in bf16.
//
// vdpbf16ps adds, per f32 lane, the dot product of a pair of bf16 values
// from each operand: acc[q] += a[2q] * b[2q] + a[2q + 1] * b[2q + 1]. So
// both operands carry the reduction dimension in pairs, one pair per 32-bit
// element:
//   S^T[j][q]  = scale * sum_p K2[j][p] . Qt2[p][q]   (p: pairs of head dims)
//   O^T[e][q] += sum_p V2[p][e] . P2[p][q]            (p: pairs of keys)
// where K2 is K as stored (two adjacent head dims), V2 pairs the rows of two
// keys, and Qt2 / P2 carry the queries along the lanes. Odd counts are padded
// with a zero pair half. Products of two bf16 values are exact in f32; the
// accumulation is f32 (the instruction flushes bf16 denormals to zero).

#if defined(SIMDATTN_LIB_KERNELS_BF16_DOT_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_BF16_DOT_INL_H_
#undef SIMDATTN_LIB_KERNELS_BF16_DOT_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_BF16_DOT_INL_H_
#endif

#include <cstdint>

#include "hwy/highway.h"
#include "lib/kernels/kernels.h"
#include "lib/kernels/tile_gemm-inl.h"

#undef SIMDATTN_NATIVE_BF16
#if HWY_TARGET == HWY_AVX3 && SIMDATTN_NATIVE_BF16_COMPILER
#define SIMDATTN_NATIVE_BF16 1
#include <immintrin.h>
#else
#define SIMDATTN_NATIVE_BF16 0
#endif

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {

#if SIMDATTN_NATIVE_BF16

// AVX3's features plus AVX512_BF16, for the functions below only.
// clang-format off
#define SIMDATTN_BF16_TARGET __attribute__((target("avx2,bmi,bmi2,fma,f16c,avx512f,avx512vl,avx512dq,avx512bw,avx512bf16")))
// clang-format on

// Where the broadcast operand's rows are (u32 pairs): rows [0, full) in
// groups of kTileRows, group k at first + k * group with row r's pair p at
// r * row + p * t inside it; the rows after the last full group at tail,
// row i's pair p at i * tail_row + p * tail_t.
struct PairRows {
  const uint32_t* first;
  int64_t group, row, t;
  const uint32_t* tail;
  int64_t tail_row, tail_t;
};

// out[r][c] = (kAccumulate ? scale[c] * out[r][c] : 0)
//           + out_scale * sum_{p < n} dot2(b[r * b_row + p * b_t], a[p * a_t + 16 c])
// for r < kRows, c < kCols (16 lanes each); out_scale applies only when
// !kAccumulate. `a` is vector-aligned.
template <int kRows, int kCols, bool kAccumulate>
SIMDATTN_BF16_TARGET HWY_INLINE void TileDotBf16(
    const uint32_t* HWY_RESTRICT b, int64_t b_row, int64_t b_t,
    const uint32_t* HWY_RESTRICT a, int64_t a_t, int64_t n,
    const float* HWY_RESTRICT scale, float out_scale, float* HWY_RESTRICT out,
    int64_t out_row) {
  static_assert(kRows >= 1 && kRows <= 8 && (kCols == 1 || kCols == 2), "tile");
  __m512 acc[kRows][kCols];
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) {
      if (kAccumulate) {
        acc[r][c] = _mm512_load_ps(out + r * out_row + 16 * c);
        if (scale != nullptr) {
          acc[r][c] = _mm512_mul_ps(acc[r][c], _mm512_loadu_ps(scale + 16 * c));
        }
      } else {
        acc[r][c] = _mm512_setzero_ps();
      }
    }
  }
  for (int64_t p = 0; p < n; ++p) {
    const __m512bh x0 = (__m512bh)_mm512_load_si512(a + p * a_t);
    const __m512bh x1 =
        kCols > 1 ? (__m512bh)_mm512_load_si512(a + p * a_t + 16) : x0;
    const uint32_t* HWY_RESTRICT bp = b + p * b_t;
    for (int r = 0; r < kRows; ++r) {
      const __m512bh y = (__m512bh)_mm512_set1_epi32(static_cast<int>(bp[r * b_row]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], y, x0);
      if (kCols > 1) acc[r][kCols - 1] = _mm512_dpbf16_ps(acc[r][kCols - 1], y, x1);
    }
  }
  const __m512 vscale = _mm512_set1_ps(out_scale);
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) {
      const __m512 v = kAccumulate ? acc[r][c] : _mm512_mul_ps(acc[r][c], vscale);
      _mm512_store_ps(out + r * out_row + 16 * c, v);
    }
  }
}

// TileDotBf16 over `rows` rows of `b` for kCols query vectors starting at
// vector c0. (A named function, not a lambda: Clang gives a lambda none of
// its enclosing function's target attributes.)
template <int kCols, bool kAccumulate>
SIMDATTN_BF16_TARGET HWY_INLINE void DotBf16Cols(
    int64_t c0, int64_t rows, const PairRows& b, const uint32_t* HWY_RESTRICT a,
    int64_t a_t, int64_t n, const float* HWY_RESTRICT scale, float out_scale,
    float* HWY_RESTRICT out, int64_t out_row) {
  const int64_t full = rows / kTileRows * kTileRows;
  const uint32_t* ac = a + 16 * c0;
  const float* sc = scale != nullptr ? scale + 16 * c0 : nullptr;
  float* oc = out + 16 * c0;
  const uint32_t* g = b.first;
  for (int64_t r = 0; r < full; r += kTileRows, g += b.group) {
    TileDotBf16<kTileRows, kCols, kAccumulate>(g, b.row, b.t, ac, a_t, n, sc,
                                               out_scale, oc + r * out_row,
                                               out_row);
  }
  for (int64_t i = 0; full + i < rows; ++i) {
    TileDotBf16<1, kCols, kAccumulate>(b.tail + i * b.tail_row, 0, b.tail_t,
                                       ac, a_t, n, sc, out_scale,
                                       oc + (full + i) * out_row, out_row);
  }
}

// DotBf16Cols over `cols` vectors of queries: 1, or an even number run two
// at a time with the pair outermost (as ForEachVectorPair does for the f32
// tiles).
template <bool kAccumulate>
SIMDATTN_BF16_TARGET HWY_NOINLINE void DotBf16Rows(
    int cols, int64_t rows, const PairRows& b, const uint32_t* HWY_RESTRICT a,
    int64_t a_t, int64_t n, const float* HWY_RESTRICT scale, float out_scale,
    float* HWY_RESTRICT out, int64_t out_row) {
  if (cols == 1) {
    DotBf16Cols<1, kAccumulate>(0, rows, b, a, a_t, n, scale, out_scale, out,
                                out_row);
    return;
  }
  for (int64_t c = 0; c < cols; c += 2) {
    DotBf16Cols<2, kAccumulate>(c, rows, b, a, a_t, n, scale, out_scale, out,
                                out_row);
  }
}

// The weights of a score tile (f32, [nk][mq], keys as rows) rounded to bf16
// (nearest even) and paired in place: row p becomes u32 [mq] holding the
// weights of keys 2p and 2p + 1 (+0 for a key past nk). Row p is written
// after rows 2p and 2p + 1 are read, so the pass can run in place.
SIMDATTN_BF16_TARGET HWY_NOINLINE inline void WeightsToBf16Pairs(
    float* HWY_RESTRICT st, int64_t nk, int64_t mq) {
  // Element 2q of the result is lane q of the first row, 2q + 1 lane q of
  // the second (vcvtne2ps2bf16 puts the second operand's lanes first).
  alignas(64) static constexpr uint16_t kZip[32] = {
      0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i zip = _mm512_load_si512(kZip);
  for (int64_t p = 0; 2 * p < nk; ++p) {
    const float* lo = st + 2 * p * mq;
    const float* hi = lo + mq;
    const bool has_hi = 2 * p + 1 < nk;
    for (int64_t q = 0; q < mq; q += 16) {
      const __m512 l = _mm512_load_ps(lo + q);
      const __m512 h = has_hi ? _mm512_load_ps(hi + q) : _mm512_setzero_ps();
      const __m512i pairs =
          _mm512_permutexvar_epi16(zip, (__m512i)_mm512_cvtne2ps_pbh(h, l));
      _mm512_store_si512(reinterpret_cast<uint32_t*>(st) + p * mq + q, pairs);
    }
  }
}

// Rows [0, nk) of V (bf16, row stride `stride` elements, dv each) as key
// pairs: out[p * dv + e] = V[2p][e] | V[2p + 1][e] << 16 (+0 past nk).
SIMDATTN_BF16_TARGET HWY_NOINLINE inline void PairValueRows(
    const uint16_t* HWY_RESTRICT v, int64_t stride, int64_t nk, int64_t dv,
    uint32_t* HWY_RESTRICT out) {
  alignas(64) static constexpr uint16_t kLow[32] = {
      0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
      8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr uint16_t kHigh[32] = {
      16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
      24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i low = _mm512_load_si512(kLow);
  const __m512i high = _mm512_load_si512(kHigh);
  for (int64_t p = 0; 2 * p < nk; ++p) {
    const uint16_t* r0 = v + 2 * p * stride;
    const uint16_t* r1 = 2 * p + 1 < nk ? r0 + stride : nullptr;
    uint32_t* o = out + p * dv;
    int64_t e = 0;
    for (; e + 32 <= dv; e += 32) {
      const __m512i a = _mm512_loadu_si512(r0 + e);
      const __m512i b = r1 != nullptr ? _mm512_loadu_si512(r1 + e) : _mm512_setzero_si512();
      _mm512_storeu_si512(o + e, _mm512_permutex2var_epi16(a, low, b));
      _mm512_storeu_si512(o + e + 16, _mm512_permutex2var_epi16(a, high, b));
    }
    for (; e < dv; ++e) {
      o[e] = r0[e] | (r1 != nullptr ? static_cast<uint32_t>(r1[e]) << 16 : 0u);
    }
  }
}

#endif  // SIMDATTN_NATIVE_BF16

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_BF16_DOT_INL_H_
