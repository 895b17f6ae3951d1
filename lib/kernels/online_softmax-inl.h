// Online (streaming) softmax: the step of the recurrence in a vector form
// (lanes along queries or keys) and a scalar form, the merge of partial
// results, and the step over whole score tiles of the prefill and decode
// paths. Per-target code (include from a foreach_target TU).

#if defined(SIMDATTN_LIB_KERNELS_ONLINE_SOFTMAX_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_ONLINE_SOFTMAX_INL_H_
#undef SIMDATTN_LIB_KERNELS_ONLINE_SOFTMAX_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_ONLINE_SOFTMAX_INL_H_
#endif

#include <algorithm>
#include <cmath>
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
//
// Merging partial results (m_c, l_c, acc_c) of the same row over disjoint
// key ranges c (chunks of a split call) is the same step with the partials
// as the tile: M = max_c m_c, w_c = exp(m_c - M), L = sum_c w_c l_c and
// acc = sum_c w_c acc_c; a chunk that saw no visible key (l_c = 0) has
// w_c = 0. MergePartials below.

// The step's maxima and factor for the vector of rows whose running max is
// m_old and whose tile max is tile_max (lanes are rows): sets m_new and the
// value the scores subtract (m_sub), returns alpha. NaN flows through
// hn::Max and ExpNonPositive per lane.
template <class D, class V = hn::VFromD<D>>
HWY_INLINE V OnlineStep(D d, V m_old, V tile_max, V& m_new, V& m_sub) {
  const V neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  m_new = hn::Max(m_old, tile_max);
  m_sub = hn::IfThenZeroElse(hn::Eq(m_new, neg_inf), m_new);
  return ExpNonPositive(d, hn::Sub(m_old, m_sub));
}

// The scalar form, for one row: std::max drops NaN, so NaN is carried
// explicitly (`tile_nan`: some score of the tile is NaN).
struct ScalarStep {
  float m_old;
  float m_new;  // max(m_old, tile max); NaN if either or a score is NaN
  float m_sub;  // what the scores subtract: m_new, or 0 while it is -inf

  // The factor of the old l and acc: 0 for a row that had seen nothing.
  HWY_INLINE float Alpha() const {
    if (m_old == -std::numeric_limits<float>::infinity()) return 0.0f;
    return std::isnan(m_new) ? m_new : std::exp(m_old - m_sub);
  }
};

HWY_INLINE ScalarStep OnlineStep(float m_old, float tile_max, bool tile_nan) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float m_new = std::max(m_old, tile_max);
  if (tile_nan || std::isnan(m_old)) m_new = std::numeric_limits<float>::quiet_NaN();
  return {m_old, m_new, m_new == neg_inf ? 0.0f : m_new};
}

// The merged m and l of one row.
struct MergedPartials {
  float m;
  float l;
};

// Merges the n partial results of one row, in order (so the result does not
// depend on which thread made which partial): partial c's m is at
// m_parts[c * stride], its l at l_parts[c * stride]. `sink` is an extra
// logit that takes part in l only (-inf for none). Writes w_c to weight[c]
// (the merged acc is sum_c weight[c] acc_c, in order) and returns M and L;
// M = -inf and L = 0 when no partial saw a visible key and there is no sink.
// M is NaN when some m_c is.
HWY_INLINE MergedPartials MergePartials(int64_t n, const float* m_parts,
                                        const float* l_parts, int64_t stride,
                                        float sink, float* HWY_RESTRICT weight) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float big = neg_inf;
  bool nan = false;
  for (int64_t c = 0; c < n; ++c) {
    const float mc = m_parts[c * stride];
    if (std::isnan(mc)) nan = true;
    if (mc > big) big = mc;
  }
  if (sink > big) big = sink;
  if (nan) big = std::numeric_limits<float>::quiet_NaN();
  const bool empty = big == neg_inf;  // no visible key in any partial, no sink
  float total = 0.0f;
  for (int64_t c = 0; c < n; ++c) {
    const float lc = l_parts[c * stride];
    weight[c] = empty || lc == 0.0f ? 0.0f : std::exp(m_parts[c * stride] - big);
    total += lc * weight[c];
  }
  if (!empty && !(sink == neg_inf)) total += std::exp(sink - big);
  return {big, empty ? 0.0f : total};
}

// One step for the query vector at lane offset `col` of a transposed tile
// (row stride `stride` floats; the prefill path, lanes along queries): turns
// the scores into p_j in place, updates m, l (vectors of this column) and
// writes alpha. Returns whether any lane's max grew (alpha != 1 somewhere).
// The tile's scores may still want multiplying by `scale` (> 0; 1: they
// are final): the max is taken over them as they are and scaled (scaling
// by a positive number keeps the order), and each weight is
// exp(s * scale - m) with one rounding.
template <class D>
HWY_INLINE bool SoftmaxColumn(D d, size_t stride, float* HWY_RESTRICT st,
                              int64_t num_keys, float* HWY_RESTRICT m,
                              float* HWY_RESTRICT l,
                              float* HWY_RESTRICT alpha, float scale = 1.0f) {
  const auto neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  // Max over the tile's keys in four chains, so that the max's latency (4
  // cycles on x86) does not bound the pass: two chains ran 0.3-1.2% slower.
  // Entry: attention/simdattn/f32/B1_Hq8_Hkv8_Lq2048_Lk2048_D64/none/threads:1
  auto mx0 = neg_inf, mx1 = neg_inf, mx2 = neg_inf, mx3 = neg_inf;
  int64_t j = 0;
  for (; j + 4 <= num_keys; j += 4) {
    mx0 = hn::Max(mx0, hn::Load(d, st + j * stride));
    mx1 = hn::Max(mx1, hn::Load(d, st + (j + 1) * stride));
    mx2 = hn::Max(mx2, hn::Load(d, st + (j + 2) * stride));
    mx3 = hn::Max(mx3, hn::Load(d, st + (j + 3) * stride));
  }
  for (; j < num_keys; ++j) mx0 = hn::Max(mx0, hn::Load(d, st + j * stride));
  const auto vscale = hn::Set(d, scale);
  const auto m_old = hn::Load(d, m);
  auto m_new = m_old, m_sub = m_old;
  const auto a = OnlineStep(
      d, m_old, hn::Mul(hn::Max(hn::Max(mx0, mx1), hn::Max(mx2, mx3)), vscale), m_new, m_sub);
  auto sum0 = hn::Zero(d), sum1 = hn::Zero(d);
  for (j = 0; j + 2 <= num_keys; j += 2) {
    float* r0 = st + j * stride;
    float* r1 = r0 + stride;
    const auto p0 = ExpNonPositive(d, hn::MulSub(hn::Load(d, r0), vscale, m_sub));
    const auto p1 = ExpNonPositive(d, hn::MulSub(hn::Load(d, r1), vscale, m_sub));
    hn::Store(p0, d, r0);
    hn::Store(p1, d, r1);
    sum0 = hn::Add(sum0, p0);
    sum1 = hn::Add(sum1, p1);
  }
  if (j < num_keys) {
    float* r0 = st + j * stride;
    const auto p0 = ExpNonPositive(d, hn::MulSub(hn::Load(d, r0), vscale, m_sub));
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
                            float* HWY_RESTRICT l, float* HWY_RESTRICT alpha,
                            float scale = 1.0f) {
  const size_t N = hn::Lanes(d);
  bool rescale = false;
  for (size_t c = 0; c < static_cast<size_t>(cols); ++c) {
    rescale |= SoftmaxColumn(d, cols * N, st + c * N, num_keys, m + c * N,
                             l + c * N, alpha + c * N, scale);
  }
  return rescale;
}

// One step for one row whose tile scores are s[0, nk) (the decode path,
// lanes along keys): turns the scores into p_j in place, updates the row's
// m and l and returns alpha. The tile's max is a scalar (ScalarStep), the
// keys past the last whole vector take a scalar exp.
template <class D>
HWY_INLINE float SoftmaxRow(D d, float* HWY_RESTRICT s, int64_t nk, float& m,
                            float& l) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  auto vmax = hn::Set(d, -std::numeric_limits<float>::infinity());
  auto vnan = hn::Zero(d);  // all-ones lanes where a score was NaN
  // (Loops to nk_vec, then from it: with nk a constant 64, GCC 12 warned
  // of undefined behavior in the tail loops written as j + N <= nk.)
  const int64_t nk_vec = nk / N * N;
  int64_t j = 0;
  for (; j < nk_vec; j += N) {
    const auto x = hn::LoadU(d, s + j);
    vmax = hn::Max(vmax, x);
    vnan = hn::Or(vnan, hn::VecFromMask(d, hn::Ne(x, x)));
  }
  float mx = hn::GetLane(hn::MaxOfLanes(d, vmax));
  bool nan = !hn::AllTrue(d, hn::Eq(vnan, hn::Zero(d)));
  for (; j < nk; ++j) {
    if (std::isnan(s[j])) nan = true;
    mx = std::max(mx, s[j]);
  }
  const ScalarStep step = OnlineStep(m, mx, nan);
  const auto vsub = hn::Set(d, step.m_sub);
  auto vsum = hn::Zero(d);
  for (j = 0; j < nk_vec; j += N) {
    const auto p = ExpNonPositive(d, hn::Sub(hn::LoadU(d, s + j), vsub));
    hn::StoreU(p, d, s + j);
    vsum = hn::Add(vsum, p);
  }
  float sum = hn::GetLane(hn::SumOfLanes(d, vsum));
  for (j = nk_vec; j < nk; ++j) {  // ExpNonPositive's rule: +0.0 below 2^-126
    const float x = s[j] - step.m_sub;
    const float p = std::isnan(x) ? x : (x < -87.0f ? 0.0f : std::exp(x));
    s[j] = p;
    sum += p;
  }
  const float alpha = step.Alpha();
  l = l * alpha + sum;
  m = step.m_new;
  return alpha;
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_ONLINE_SOFTMAX_INL_H_
