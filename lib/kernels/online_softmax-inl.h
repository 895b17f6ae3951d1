// Online (streaming) softmax over transposed score tiles, and the causal
// mask of a diagonal tile: per-target code (include from a foreach_target TU).

#if defined(SIMDATTN_LIB_KERNELS_ONLINE_SOFTMAX_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_ONLINE_SOFTMAX_INL_H_
#undef SIMDATTN_LIB_KERNELS_ONLINE_SOFTMAX_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_ONLINE_SOFTMAX_INL_H_
#endif

#include <cstdint>
#include <limits>

#include "hwy/highway.h"
#include "lib/kernels/exp-inl.h"
#include "lib/kernels/tile_gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The recurrence (written once, here). For each query row we keep the running
// max m and the running sum l of exp(s - m) over the keys seen so far, and an
// unnormalized output acc = sum exp(s_j - m) v_j. A new tile with scores s_j:
//   m'    = max(m, max_j s_j)
//   alpha = exp(m - m')                  rescales the old l and acc
//   p_j   = exp(s_j - m')
//   l'    = alpha * l + sum_j p_j
//   acc'  = alpha * acc + sum_j p_j v_j
// After the last tile, O = acc / l and LSE = m + log(l).
// Fully-masked rows: hidden scores are -inf. While a row has seen no visible
// key its m is -inf; we then subtract 0 instead of m' (m' = -inf would give
// -inf - -inf = NaN), so every p_j and alpha is exp(-inf) = 0 and l stays 0.
// A row whose l is 0 at the end has no visible key: O = 0, LSE = -inf.
// NaN in a score (from NaN/Inf in Q or K) flows into p, l and acc of that row
// only: every operation here is per lane.

// One step of the recurrence for the query vector at lane offset `col` of a
// transposed tile (row stride `stride` floats): turns the scores into p_j in
// place, updates m, l (vectors of this column) and writes alpha. Returns
// whether any lane's max grew (alpha != 1 somewhere).
template <class D>
HWY_INLINE bool SoftmaxColumn(D d, size_t stride, float* HWY_RESTRICT st,
                              int64_t num_keys, float* HWY_RESTRICT m,
                              float* HWY_RESTRICT l,
                              float* HWY_RESTRICT alpha) {
  const auto neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  // Max over the tile's keys: four chains, so that the max's latency (4
  // cycles on x86) does not bound the pass (two chains measured 1.003x and
  // 1.012x slower, f32 L2048 D64, 60 pairs each).
  auto mx0 = neg_inf, mx1 = neg_inf, mx2 = neg_inf, mx3 = neg_inf;
  int64_t j = 0;
  for (; j + 4 <= num_keys; j += 4) {
    mx0 = hn::Max(mx0, hn::Load(d, st + j * stride));
    mx1 = hn::Max(mx1, hn::Load(d, st + (j + 1) * stride));
    mx2 = hn::Max(mx2, hn::Load(d, st + (j + 2) * stride));
    mx3 = hn::Max(mx3, hn::Load(d, st + (j + 3) * stride));
  }
  for (; j < num_keys; ++j) mx0 = hn::Max(mx0, hn::Load(d, st + j * stride));
  const auto m_old = hn::Load(d, m);
  const auto m_new = hn::Max(m_old, hn::Max(hn::Max(mx0, mx1), hn::Max(mx2, mx3)));
  // -inf rows subtract 0 instead (see the recurrence above).
  const auto m_sub = hn::IfThenZeroElse(hn::Eq(m_new, neg_inf), m_new);
  const auto a = ExpNonPositive(d, hn::Sub(m_old, m_sub));
  auto sum0 = hn::Zero(d), sum1 = hn::Zero(d);
  for (j = 0; j + 2 <= num_keys; j += 2) {
    float* r0 = st + j * stride;
    float* r1 = r0 + stride;
    const auto p0 = ExpNonPositive(d, hn::Sub(hn::Load(d, r0), m_sub));
    const auto p1 = ExpNonPositive(d, hn::Sub(hn::Load(d, r1), m_sub));
    hn::Store(p0, d, r0);
    hn::Store(p1, d, r1);
    sum0 = hn::Add(sum0, p0);
    sum1 = hn::Add(sum1, p1);
  }
  if (j < num_keys) {
    float* r0 = st + j * stride;
    const auto p0 = ExpNonPositive(d, hn::Sub(hn::Load(d, r0), m_sub));
    hn::Store(p0, d, r0);
    sum0 = hn::Add(sum0, p0);
  }
  hn::Store(m_new, d, m);
  hn::Store(hn::MulAdd(hn::Load(d, l), a, hn::Add(sum0, sum1)), d, l);
  hn::Store(a, d, alpha);
  return !hn::AllTrue(d, hn::Eq(m_new, m_old));
}

// Applies the recurrence to a whole transposed tile (`cols` query
// vectors); returns whether the output needs rescaling by alpha.
template <class D>
HWY_INLINE bool SoftmaxTile(D d, int cols, float* HWY_RESTRICT st,
                            int64_t num_keys, float* HWY_RESTRICT m,
                            float* HWY_RESTRICT l, float* HWY_RESTRICT alpha) {
  const size_t N = hn::Lanes(d);
  bool rescale = false;
  for (size_t c = 0; c < static_cast<size_t>(cols); ++c) {
    rescale |= SoftmaxColumn(d, cols * N, st + c * N, num_keys, m + c * N,
                             l + c * N, alpha + c * N);
  }
  return rescale;
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_ONLINE_SOFTMAX_INL_H_
