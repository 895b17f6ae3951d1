// S^T = K_tile · (scale·Q_block)^T micro-kernel: per-target code (include
// from a foreach_target translation unit).

#if defined(SIMDATTN_LIB_KERNELS_QK_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_QK_TILE_INL_H_
#undef SIMDATTN_LIB_KERNELS_QK_TILE_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_QK_TILE_INL_H_
#endif

#include <cstdint>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Scores are computed transposed: one row per key, the block's queries along
// the lanes. The softmax then needs only vertical max/add (no horizontal
// reductions) and K is read straight from the caller's memory, one broadcast
// per element, with no packing.
//
// Contract:
//   qt: [head_dim][4 * Lanes(d)] floats, the query block transposed and
//       pre-multiplied by the scale, vector-aligned (packed by the driver).
//   k:  num_keys rows of head_dim floats, row i at k + i * k_stride.
//   st: [num_keys][4 * Lanes(d)] floats out, vector-aligned.
// Register tile: 4 keys x 4 query vectors = 16 accumulators; per head-dim
// step 4 vector loads + 4 broadcasts feed 16 FMAs, so loads (2/cycle on
// Zen 5 for zmm) stay under the 2 FMA/cycle ports. f32 accumulation.
template <class D>
HWY_INLINE void ScoreTile4x4(D d, const float* HWY_RESTRICT qt,
                             const float* k0, const float* k1,
                             const float* k2, const float* k3,
                             int64_t head_dim, float* HWY_RESTRICT st) {
  const size_t N = hn::Lanes(d);
  const size_t mq = 4 * N;
  auto a00 = hn::Zero(d), a01 = hn::Zero(d), a02 = hn::Zero(d), a03 = hn::Zero(d);
  auto a10 = hn::Zero(d), a11 = hn::Zero(d), a12 = hn::Zero(d), a13 = hn::Zero(d);
  auto a20 = hn::Zero(d), a21 = hn::Zero(d), a22 = hn::Zero(d), a23 = hn::Zero(d);
  auto a30 = hn::Zero(d), a31 = hn::Zero(d), a32 = hn::Zero(d), a33 = hn::Zero(d);
  for (int64_t i = 0; i < head_dim; ++i) {
    const float* HWY_RESTRICT row = qt + i * mq;
    const auto q0 = hn::Load(d, row);
    const auto q1 = hn::Load(d, row + N);
    const auto q2 = hn::Load(d, row + 2 * N);
    const auto q3 = hn::Load(d, row + 3 * N);
    const auto b0 = hn::Set(d, k0[i]);
    a00 = hn::MulAdd(b0, q0, a00);
    a01 = hn::MulAdd(b0, q1, a01);
    a02 = hn::MulAdd(b0, q2, a02);
    a03 = hn::MulAdd(b0, q3, a03);
    const auto b1 = hn::Set(d, k1[i]);
    a10 = hn::MulAdd(b1, q0, a10);
    a11 = hn::MulAdd(b1, q1, a11);
    a12 = hn::MulAdd(b1, q2, a12);
    a13 = hn::MulAdd(b1, q3, a13);
    const auto b2 = hn::Set(d, k2[i]);
    a20 = hn::MulAdd(b2, q0, a20);
    a21 = hn::MulAdd(b2, q1, a21);
    a22 = hn::MulAdd(b2, q2, a22);
    a23 = hn::MulAdd(b2, q3, a23);
    const auto b3 = hn::Set(d, k3[i]);
    a30 = hn::MulAdd(b3, q0, a30);
    a31 = hn::MulAdd(b3, q1, a31);
    a32 = hn::MulAdd(b3, q2, a32);
    a33 = hn::MulAdd(b3, q3, a33);
  }
  hn::Store(a00, d, st);
  hn::Store(a01, d, st + N);
  hn::Store(a02, d, st + 2 * N);
  hn::Store(a03, d, st + 3 * N);
  hn::Store(a10, d, st + mq);
  hn::Store(a11, d, st + mq + N);
  hn::Store(a12, d, st + mq + 2 * N);
  hn::Store(a13, d, st + mq + 3 * N);
  hn::Store(a20, d, st + 2 * mq);
  hn::Store(a21, d, st + 2 * mq + N);
  hn::Store(a22, d, st + 2 * mq + 2 * N);
  hn::Store(a23, d, st + 2 * mq + 3 * N);
  hn::Store(a30, d, st + 3 * mq);
  hn::Store(a31, d, st + 3 * mq + N);
  hn::Store(a32, d, st + 3 * mq + 2 * N);
  hn::Store(a33, d, st + 3 * mq + 3 * N);
}

// One key against the query block (key counts that are not a multiple of 4).
template <class D>
HWY_INLINE void ScoreTile1x4(D d, const float* HWY_RESTRICT qt,
                             const float* k0, int64_t head_dim,
                             float* HWY_RESTRICT st) {
  const size_t N = hn::Lanes(d);
  const size_t mq = 4 * N;
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  for (int64_t i = 0; i < head_dim; ++i) {
    const float* HWY_RESTRICT row = qt + i * mq;
    const auto b0 = hn::Set(d, k0[i]);
    a0 = hn::MulAdd(b0, hn::Load(d, row), a0);
    a1 = hn::MulAdd(b0, hn::Load(d, row + N), a1);
    a2 = hn::MulAdd(b0, hn::Load(d, row + 2 * N), a2);
    a3 = hn::MulAdd(b0, hn::Load(d, row + 3 * N), a3);
  }
  hn::Store(a0, d, st);
  hn::Store(a1, d, st + N);
  hn::Store(a2, d, st + 2 * N);
  hn::Store(a3, d, st + 3 * N);
}

// Scores of num_keys keys (rows of k, k_stride apart) against the block.
template <class D>
HWY_INLINE void ScoreTile(D d, const float* HWY_RESTRICT qt, const float* k,
                          int64_t k_stride, int64_t num_keys,
                          int64_t head_dim, float* HWY_RESTRICT st) {
  const int64_t mq = static_cast<int64_t>(4 * hn::Lanes(d));
  int64_t j = 0;
  for (; j + 4 <= num_keys; j += 4) {
    const float* kj = k + j * k_stride;
    ScoreTile4x4(d, qt, kj, kj + k_stride, kj + 2 * k_stride,
                 kj + 3 * k_stride, head_dim, st + j * mq);
  }
  for (; j < num_keys; ++j) {
    ScoreTile1x4(d, qt, k + j * k_stride, head_dim, st + j * mq);
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_QK_TILE_INL_H_
