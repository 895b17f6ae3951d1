// acc = alpha * acc + P · V_tile micro-kernel: per-target code (include from
// a foreach_target translation unit).

#if defined(SIMDATTN_LIB_KERNELS_PV_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_PV_TILE_INL_H_
#undef SIMDATTN_LIB_KERNELS_PV_TILE_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_PV_TILE_INL_H_
#endif

#include <cstdint>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Contract:
//   pt:    [num_keys][pt_stride] weights, transposed (key-major): pt[j][r] is
//          the weight of key j for query row r. Read by scalar broadcasts.
//   v:     num_keys rows, row j at v + j * v_stride, kCols full vectors each
//          (the caller passes a padded copy for a head-dim tail).
//   acc:   4 rows of the output tile, acc_stride floats apart, kCols vectors
//          each, vector-aligned.
//   alpha: the 4 rows' rescale factors, or null when all are 1.
// Register tile: 4 rows x kCols (<= 4) vectors = up to 16 accumulators that
// stay in registers across the whole key tile; per key kCols loads of V and 4
// broadcasts feed 4 * kCols FMAs. f32 accumulation.
template <int kCols, class D>
HWY_INLINE void PvRows4(D d, const float* HWY_RESTRICT pt, int64_t pt_stride,
                        const float* v, int64_t v_stride, int64_t num_keys,
                        const float* HWY_RESTRICT alpha,
                        float* HWY_RESTRICT acc, int64_t acc_stride) {
  static_assert(kCols >= 1 && kCols <= 4, "1 to 4 vectors per row");
  const size_t N = hn::Lanes(d);
  float* HWY_RESTRICT o0 = acc;
  float* HWY_RESTRICT o1 = acc + acc_stride;
  float* HWY_RESTRICT o2 = acc + 2 * acc_stride;
  float* HWY_RESTRICT o3 = acc + 3 * acc_stride;
  auto a00 = hn::Load(d, o0), a10 = hn::Load(d, o1);
  auto a20 = hn::Load(d, o2), a30 = hn::Load(d, o3);
  auto a01 = a00, a11 = a00, a21 = a00, a31 = a00;
  auto a02 = a00, a12 = a00, a22 = a00, a32 = a00;
  auto a03 = a00, a13 = a00, a23 = a00, a33 = a00;
  if (kCols > 1) {
    a01 = hn::Load(d, o0 + N), a11 = hn::Load(d, o1 + N);
    a21 = hn::Load(d, o2 + N), a31 = hn::Load(d, o3 + N);
  }
  if (kCols > 2) {
    a02 = hn::Load(d, o0 + 2 * N), a12 = hn::Load(d, o1 + 2 * N);
    a22 = hn::Load(d, o2 + 2 * N), a32 = hn::Load(d, o3 + 2 * N);
  }
  if (kCols > 3) {
    a03 = hn::Load(d, o0 + 3 * N), a13 = hn::Load(d, o1 + 3 * N);
    a23 = hn::Load(d, o2 + 3 * N), a33 = hn::Load(d, o3 + 3 * N);
  }
  if (alpha != nullptr) {
    const auto s0 = hn::Set(d, alpha[0]), s1 = hn::Set(d, alpha[1]);
    const auto s2 = hn::Set(d, alpha[2]), s3 = hn::Set(d, alpha[3]);
    a00 = hn::Mul(a00, s0), a10 = hn::Mul(a10, s1);
    a20 = hn::Mul(a20, s2), a30 = hn::Mul(a30, s3);
    if (kCols > 1) {
      a01 = hn::Mul(a01, s0), a11 = hn::Mul(a11, s1);
      a21 = hn::Mul(a21, s2), a31 = hn::Mul(a31, s3);
    }
    if (kCols > 2) {
      a02 = hn::Mul(a02, s0), a12 = hn::Mul(a12, s1);
      a22 = hn::Mul(a22, s2), a32 = hn::Mul(a32, s3);
    }
    if (kCols > 3) {
      a03 = hn::Mul(a03, s0), a13 = hn::Mul(a13, s1);
      a23 = hn::Mul(a23, s2), a33 = hn::Mul(a33, s3);
    }
  }
  for (int64_t j = 0; j < num_keys; ++j) {
    const float* HWY_RESTRICT vj = v + j * v_stride;
    const float* HWY_RESTRICT pj = pt + j * pt_stride;
    const auto p0 = hn::Set(d, pj[0]), p1 = hn::Set(d, pj[1]);
    const auto p2 = hn::Set(d, pj[2]), p3 = hn::Set(d, pj[3]);
    const auto v0 = hn::LoadU(d, vj);
    a00 = hn::MulAdd(p0, v0, a00);
    a10 = hn::MulAdd(p1, v0, a10);
    a20 = hn::MulAdd(p2, v0, a20);
    a30 = hn::MulAdd(p3, v0, a30);
    if (kCols > 1) {
      const auto v1 = hn::LoadU(d, vj + N);
      a01 = hn::MulAdd(p0, v1, a01);
      a11 = hn::MulAdd(p1, v1, a11);
      a21 = hn::MulAdd(p2, v1, a21);
      a31 = hn::MulAdd(p3, v1, a31);
    }
    if (kCols > 2) {
      const auto v2 = hn::LoadU(d, vj + 2 * N);
      a02 = hn::MulAdd(p0, v2, a02);
      a12 = hn::MulAdd(p1, v2, a12);
      a22 = hn::MulAdd(p2, v2, a22);
      a32 = hn::MulAdd(p3, v2, a32);
    }
    if (kCols > 3) {
      const auto v3 = hn::LoadU(d, vj + 3 * N);
      a03 = hn::MulAdd(p0, v3, a03);
      a13 = hn::MulAdd(p1, v3, a13);
      a23 = hn::MulAdd(p2, v3, a23);
      a33 = hn::MulAdd(p3, v3, a33);
    }
  }
  hn::Store(a00, d, o0), hn::Store(a10, d, o1);
  hn::Store(a20, d, o2), hn::Store(a30, d, o3);
  if (kCols > 1) {
    hn::Store(a01, d, o0 + N), hn::Store(a11, d, o1 + N);
    hn::Store(a21, d, o2 + N), hn::Store(a31, d, o3 + N);
  }
  if (kCols > 2) {
    hn::Store(a02, d, o0 + 2 * N), hn::Store(a12, d, o1 + 2 * N);
    hn::Store(a22, d, o2 + 2 * N), hn::Store(a32, d, o3 + 2 * N);
  }
  if (kCols > 3) {
    hn::Store(a03, d, o0 + 3 * N), hn::Store(a13, d, o1 + 3 * N);
    hn::Store(a23, d, o2 + 3 * N), hn::Store(a33, d, o3 + 3 * N);
  }
}

// acc[r][0..num_vecs) = alpha[r] * acc[r] + sum_j pt[j][r] * v[j] for the 4
// rows starting at acc; num_vecs full vectors of v, any count.
template <class D>
HWY_INLINE void PvRows4AnyWidth(D d, const float* HWY_RESTRICT pt,
                                int64_t pt_stride, const float* v,
                                int64_t v_stride, int64_t num_keys,
                                int64_t num_vecs,
                                const float* HWY_RESTRICT alpha,
                                float* HWY_RESTRICT acc, int64_t acc_stride) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t c = 0;
  for (; c + 4 <= num_vecs; c += 4) {
    PvRows4<4>(d, pt, pt_stride, v + c * N, v_stride, num_keys, alpha,
               acc + c * N, acc_stride);
  }
  switch (num_vecs - c) {
    case 3:
      PvRows4<3>(d, pt, pt_stride, v + c * N, v_stride, num_keys, alpha,
                 acc + c * N, acc_stride);
      break;
    case 2:
      PvRows4<2>(d, pt, pt_stride, v + c * N, v_stride, num_keys, alpha,
                 acc + c * N, acc_stride);
      break;
    case 1:
      PvRows4<1>(d, pt, pt_stride, v + c * N, v_stride, num_keys, alpha,
                 acc + c * N, acc_stride);
      break;
    default:
      break;
  }
}

// acc_row += sum_{j in [j_begin, j_end)} pt[j * pt_stride] * v[j] for one
// row (full vectors from v, then the padded tail copy). For the few keys of a
// diagonal tile that some rows of a 4-row group see and others do not: a
// hidden key must not be multiplied at all, since 0 * Inf = NaN would leak an
// Inf of V into rows that never see it.
template <class D>
HWY_INLINE void PvOneRow(D d, const float* pt, int64_t pt_stride,
                         const float* v, int64_t v_stride,
                         const float* vtail, int64_t j_begin, int64_t j_end,
                         int64_t num_full_vecs, bool has_tail,
                         float* HWY_RESTRICT acc_row) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t j = j_begin; j < j_end; ++j) {
    const auto p = hn::Set(d, pt[j * pt_stride]);
    const float* vj = v + j * v_stride;
    for (int64_t c = 0; c < num_full_vecs; ++c) {
      hn::Store(hn::MulAdd(p, hn::LoadU(d, vj + c * N),
                           hn::Load(d, acc_row + c * N)),
                d, acc_row + c * N);
    }
    if (has_tail) {
      float* at = acc_row + num_full_vecs * N;
      hn::Store(hn::MulAdd(p, hn::Load(d, vtail + j * N), hn::Load(d, at)), d,
                at);
    }
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_PV_TILE_INL_H_
