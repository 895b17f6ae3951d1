// Decode micro-path: one query row per head (Lq = 1) for the G heads of a KV
// group against a tile of keys, vectorized along the head dimension.
// Per-target code (include from a foreach_target translation unit).

#if defined(SIMDATTN_LIB_KERNELS_DECODE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_DECODE_INL_H_
#undef SIMDATTN_LIB_KERNELS_DECODE_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_DECODE_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "hwy/highway.h"
#include "lib/dtype.h"
#include "lib/kernels/convert-inl.h"
#include "lib/kernels/exp-inl.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Why a separate path: the tiled kernel puts queries along the lanes, and a
// decode group has only G of them (4 of 16 lanes for 32/8 heads), so it
// computes mostly padding. Here lanes run along the head dimension.
//   Q·K: 4 keys x 4 rows of dot products share their loads (each K vector
//        feeds 4 rows, each Q vector 4 keys): 16 accumulators.
//   P·V: 4 rows x 4 vectors of the output stay in registers across the whole
//        tile (16 accumulators); each V vector feeds the 4 rows.
// Contract: q: rows of dk floats (pre-scaled), row g at q + g * dk; k, v:
// nk rows (stored as KvElem<kKv>) with strides k_row, v_row; s: scratch of 4 * nk floats.
// m, l, o (o row g at o + g * dv) carry the online softmax of
// online_softmax-inl.h across tiles (-inf max while nothing is seen).

// K/V elements as stored: kKv 0 = f32, 1 = f16, 2 = bf16 (the KvType
// codes), widened to f32 in registers as they are loaded. f16 is only used
// this way where the target converts it in hardware (kKvF16InRegisters).
template <int kKv>
using KvElem = std::conditional_t<kKv == 0, float, uint16_t>;

constexpr bool kKvF16InRegisters = SIMDATTN_HW_F16 != 0;

template <int kKv, class D>
HWY_INLINE hn::VFromD<D> LoadKv(D d, const KvElem<kKv>* HWY_RESTRICT p) {
  if constexpr (kKv == 0) {
    return hn::LoadU(d, p);
  } else if constexpr (kKv == 1) {
#if SIMDATTN_HW_F16
    const hn::Rebind<hwy::float16_t, D> dh;
    return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
#else
    (void)p;
    return hn::Zero(d);  // not used: these targets widen f16 tiles first
#endif
  } else {
    const hn::Rebind<hwy::bfloat16_t, D> dbf;
    return hn::PromoteTo(d, hn::LoadU(dbf, reinterpret_cast<const hwy::bfloat16_t*>(p)));
  }
}

template <int kKv>
HWY_INLINE float KvToF32(KvElem<kKv> x) {
  if constexpr (kKv == 0) {
    return x;
  } else if constexpr (kKv == 1) {
    return F16ToF32(x);
  } else {
    return BF16ToF32(x);
  }
}

// Scores of up to 4 rows (kRows) against the tile's keys into s[r * nk + j].
template <int kRows, int kKv, class D>
HWY_INLINE void DecodeScores(D d, const float* HWY_RESTRICT q, int64_t dk,
                             const KvElem<kKv>* HWY_RESTRICT k, int64_t k_row,
                             int64_t nk, float* HWY_RESTRICT s) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t dk_vec = dk / N * N;
  int64_t j = 0;
  for (; j + 4 <= nk; j += 4) {
    const KvElem<kKv>* k0 = k + j * k_row;
    const KvElem<kKv>* k1 = k0 + k_row;
    const KvElem<kKv>* k2 = k1 + k_row;
    const KvElem<kKv>* k3 = k2 + k_row;
    auto a00 = hn::Zero(d), a01 = a00, a02 = a00, a03 = a00;
    auto a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    auto a20 = a00, a21 = a00, a22 = a00, a23 = a00;
    auto a30 = a00, a31 = a00, a32 = a00, a33 = a00;
    for (int64_t i = 0; i < dk_vec; i += N) {
      const auto x0 = LoadKv<kKv>(d, k0 + i), x1 = LoadKv<kKv>(d, k1 + i);
      const auto x2 = LoadKv<kKv>(d, k2 + i), x3 = LoadKv<kKv>(d, k3 + i);
#define SIMDATTN_DOT_ROW(R)                                   \
  if (R < kRows) {                                            \
    const auto y = hn::LoadU(d, q + R * dk + i);              \
    a##R##0 = hn::MulAdd(y, x0, a##R##0);                     \
    a##R##1 = hn::MulAdd(y, x1, a##R##1);                     \
    a##R##2 = hn::MulAdd(y, x2, a##R##2);                     \
    a##R##3 = hn::MulAdd(y, x3, a##R##3);                     \
  }
      SIMDATTN_DOT_ROW(0) SIMDATTN_DOT_ROW(1) SIMDATTN_DOT_ROW(2)
      SIMDATTN_DOT_ROW(3)
#undef SIMDATTN_DOT_ROW
    }
#define SIMDATTN_STORE_DOTS(R)                                             \
  if (R < kRows) {                                                         \
    const float* qr = q + R * dk;                                          \
    float t0 = hn::GetLane(hn::SumOfLanes(d, a##R##0));                    \
    float t1 = hn::GetLane(hn::SumOfLanes(d, a##R##1));                    \
    float t2 = hn::GetLane(hn::SumOfLanes(d, a##R##2));                    \
    float t3 = hn::GetLane(hn::SumOfLanes(d, a##R##3));                    \
    for (int64_t i = dk_vec; i < dk; ++i) {                                \
      t0 += qr[i] * KvToF32<kKv>(k0[i]);                                   \
      t1 += qr[i] * KvToF32<kKv>(k1[i]);                                   \
      t2 += qr[i] * KvToF32<kKv>(k2[i]);                                   \
      t3 += qr[i] * KvToF32<kKv>(k3[i]);                                   \
    }                                                                      \
    s[R * nk + j] = t0;                                                    \
    s[R * nk + j + 1] = t1;                                                \
    s[R * nk + j + 2] = t2;                                                \
    s[R * nk + j + 3] = t3;                                                \
  }
    SIMDATTN_STORE_DOTS(0) SIMDATTN_STORE_DOTS(1) SIMDATTN_STORE_DOTS(2)
    SIMDATTN_STORE_DOTS(3)
#undef SIMDATTN_STORE_DOTS
  }
  for (; j < nk; ++j) {  // leftover keys: one at a time
    const KvElem<kKv>* kj = k + j * k_row;
    for (int r = 0; r < kRows; ++r) {
      auto acc = hn::Zero(d);
      int64_t i = 0;
      for (; i < dk_vec; i += N) {
        acc = hn::MulAdd(hn::LoadU(d, q + r * dk + i), LoadKv<kKv>(d, kj + i), acc);
      }
      float t = hn::GetLane(hn::SumOfLanes(d, acc));
      for (; i < dk; ++i) t += q[r * dk + i] * KvToF32<kKv>(kj[i]);
      s[r * nk + j] = t;
    }
  }
}

// o[r] += sum_j p[r * nk + j] * v_j for up to 4 rows; 4 output vectors per
// row in registers, then the head-dim tail in scalar code.
template <int kRows, int kKv, class D>
HWY_INLINE void DecodeValues(D d, const float* HWY_RESTRICT p, int64_t nk,
                             const KvElem<kKv>* HWY_RESTRICT v, int64_t v_row,
                             int64_t dv, float* HWY_RESTRICT o) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t e = 0;
  for (; e + 4 * N <= dv; e += 4 * N) {
    auto a00 = hn::Zero(d), a01 = a00, a02 = a00, a03 = a00;
    auto a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    auto a20 = a00, a21 = a00, a22 = a00, a23 = a00;
    auto a30 = a00, a31 = a00, a32 = a00, a33 = a00;
#define SIMDATTN_LOAD_O(R)                                 \
  if (R < kRows) {                                         \
    a##R##0 = hn::LoadU(d, o + R * dv + e);                \
    a##R##1 = hn::LoadU(d, o + R * dv + e + N);            \
    a##R##2 = hn::LoadU(d, o + R * dv + e + 2 * N);        \
    a##R##3 = hn::LoadU(d, o + R * dv + e + 3 * N);        \
  }
    SIMDATTN_LOAD_O(0) SIMDATTN_LOAD_O(1) SIMDATTN_LOAD_O(2) SIMDATTN_LOAD_O(3)
#undef SIMDATTN_LOAD_O
    for (int64_t j = 0; j < nk; ++j) {
      const KvElem<kKv>* vj = v + j * v_row + e;
      const auto x0 = LoadKv<kKv>(d, vj), x1 = LoadKv<kKv>(d, vj + N);
      const auto x2 = LoadKv<kKv>(d, vj + 2 * N), x3 = LoadKv<kKv>(d, vj + 3 * N);
#define SIMDATTN_PV_ROW(R)                                   \
  if (R < kRows) {                                           \
    const auto w = hn::Set(d, p[R * nk + j]);                \
    a##R##0 = hn::MulAdd(w, x0, a##R##0);                    \
    a##R##1 = hn::MulAdd(w, x1, a##R##1);                    \
    a##R##2 = hn::MulAdd(w, x2, a##R##2);                    \
    a##R##3 = hn::MulAdd(w, x3, a##R##3);                    \
  }
      SIMDATTN_PV_ROW(0) SIMDATTN_PV_ROW(1) SIMDATTN_PV_ROW(2) SIMDATTN_PV_ROW(3)
#undef SIMDATTN_PV_ROW
    }
#define SIMDATTN_STORE_O(R)                                  \
  if (R < kRows) {                                           \
    hn::StoreU(a##R##0, d, o + R * dv + e);                  \
    hn::StoreU(a##R##1, d, o + R * dv + e + N);              \
    hn::StoreU(a##R##2, d, o + R * dv + e + 2 * N);          \
    hn::StoreU(a##R##3, d, o + R * dv + e + 3 * N);          \
  }
    SIMDATTN_STORE_O(0) SIMDATTN_STORE_O(1) SIMDATTN_STORE_O(2) SIMDATTN_STORE_O(3)
#undef SIMDATTN_STORE_O
  }
  for (int r = 0; r < kRows; ++r) {  // head-dim tail
    for (int64_t j = 0; j < nk; ++j) {
      const float w = p[r * nk + j];
      const KvElem<kKv>* vj = v + j * v_row;
      for (int64_t t = e; t < dv; ++t) o[r * dv + t] += w * KvToF32<kKv>(vj[t]);
    }
  }
}

// One tile for `rows` rows (any count): scores, online softmax, values.
template <int kKv, class D>
HWY_INLINE void DecodeTile(D d, int64_t rows, const float* HWY_RESTRICT q,
                           int64_t dk, const KvElem<kKv>* HWY_RESTRICT k,
                           int64_t k_row, const KvElem<kKv>* HWY_RESTRICT v,
                           int64_t v_row, int64_t dv, int64_t nk,
                           float* HWY_RESTRICT s, float* HWY_RESTRICT m,
                           float* HWY_RESTRICT l, float* HWY_RESTRICT o) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t r0 = 0; r0 < rows; r0 += 4) {
    const int64_t n = std::min<int64_t>(4, rows - r0);
    const float* qr = q + r0 * dk;
    switch (n) {
      case 4: DecodeScores<4, kKv>(d, qr, dk, k, k_row, nk, s); break;
      case 3: DecodeScores<3, kKv>(d, qr, dk, k, k_row, nk, s); break;
      case 2: DecodeScores<2, kKv>(d, qr, dk, k, k_row, nk, s); break;
      default: DecodeScores<1, kKv>(d, qr, dk, k, k_row, nk, s); break;
    }
    // Online softmax per row (the recurrence of online_softmax-inl.h).
    for (int64_t t = 0; t < n; ++t) {
      const int64_t r = r0 + t;
      float* HWY_RESTRICT sr = s + t * nk;
      float mx = neg_inf;
      bool nan = false;
      for (int64_t j = 0; j < nk; ++j) {
        if (std::isnan(sr[j])) nan = true;
        mx = std::max(mx, sr[j]);
      }
      const float m_old = m[r];
      float m_new = std::max(m_old, mx);
      if (nan || std::isnan(m_old)) m_new = std::numeric_limits<float>::quiet_NaN();
      const float m_sub = m_new == neg_inf ? 0.0f : m_new;
      const auto vsub = hn::Set(d, m_sub);
      auto vsum = hn::Zero(d);
      int64_t j = 0;
      for (; j + N <= nk; j += N) {
        const auto p = ExpNonPositive(d, hn::Sub(hn::LoadU(d, sr + j), vsub));
        hn::StoreU(p, d, sr + j);
        vsum = hn::Add(vsum, p);
      }
      float sum = hn::GetLane(hn::SumOfLanes(d, vsum));
      for (; j < nk; ++j) {
        const float x = sr[j] - m_sub;
        const float p = std::isnan(x) ? x : (x < -87.0f ? 0.0f : std::exp(x));
        sr[j] = p;
        sum += p;
      }
      const float alpha =
          m_old == neg_inf ? 0.0f
                           : (std::isnan(m_new) ? m_new : std::exp(m_old - m_sub));
      l[r] = l[r] * alpha + sum;
      m[r] = m_new;
      if (alpha != 1.0f) {
        float* HWY_RESTRICT orow = o + r * dv;
        for (int64_t e = 0; e < dv; ++e) orow[e] *= alpha;
      }
    }
    float* orows = o + r0 * dv;
    switch (n) {
      case 4: DecodeValues<4, kKv>(d, s, nk, v, v_row, dv, orows); break;
      case 3: DecodeValues<3, kKv>(d, s, nk, v, v_row, dv, orows); break;
      case 2: DecodeValues<2, kKv>(d, s, nk, v, v_row, dv, orows); break;
      default: DecodeValues<1, kKv>(d, s, nk, v, v_row, dv, orows); break;
    }
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_DECODE_INL_H_
