// Decode micro-path: the few query rows of a KV group (its G heads, times
// Lq for speculative decoding) against a tile of keys, vectorized along the
// head dimension. The fused loop for 16-bit K/V is in decode_fused-inl.h,
// the shared dot products in decode_dot-inl.h.
// Per-target code (include from a foreach_target translation unit).

#if defined(SIMDATTN_LIB_KERNELS_DECODE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_DECODE_INL_H_
#undef SIMDATTN_LIB_KERNELS_DECODE_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_DECODE_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include "hwy/highway.h"
#include "lib/kernels/decode_dot-inl.h"
#include "lib/kernels/decode_fused-inl.h"
#include "lib/kernels/online_softmax-inl.h"
#include "lib/kernels/types.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Why a separate path: the tiled kernel puts queries along the lanes, and a
// decode group has only G of them (4 of 16 lanes for 32/8 heads), so it
// computes mostly padding. Here lanes run along the head dimension, and the
// cost grows with the rows rather than the vectors they fill.
//   Q·K: 4 keys x 4 rows of dot products share their loads (each K vector
//        feeds 4 rows, each Q vector 4 keys): 16 accumulators.
//   P·V: 4 rows x 4 vectors of the output stay in registers across the whole
//        tile (16 accumulators); each V vector feeds the 4 rows.
// 16-bit K/V with at most 4 rows and no options take DecodeFused instead.
// Contract: q: rows of dk floats (pre-scaled), row g at q + g * dk; k, v:
// nk rows (stored as KvElem<kKv>) with strides k_row, v_row; s: scratch of
// 4 * nk floats. m, l, o (o row g at o + g * dv) carry the online softmax
// of online_softmax-inl.h across tiles (-inf max while nothing is seen).

// Software prefetch a fixed distance ahead in each stream: as the dot
// products read a line of K row j, the same line of row j + k_ahead; as the
// first pass of the P·V products reads V row j, all of row j + v_ahead. The
// distance runs past the tile and the chunk wherever the rows exist (the
// next task streams on from there).
// About kPrefetchBytes ahead into L1 (hint NTA, not kept in L2; 4-8 KiB
// best): f16 K/V 17.7 GB/s against 10.9 without (Zen 5, 1 thread). Entry:
// attention/simdattn/qf32kvf16/B1_Hq32_Hkv8_Lq1_Lk16384_D128/softcap/threads:1
constexpr int64_t kPrefetchBytes = 8192;

// f32 K/V also take the lines into L2 (hint T1) kFarPrefetchBytes ahead:
// +4% at Lk 16384 (1 thread; 16-bit K/V 9-18% slower, so not them),
// measured before f32 tiles took runs (no bench entry runs this path now).
constexpr int64_t kFarPrefetchBytes = 32768;

// Row of the tile's key j, counted from the tile's first. kRuns = 1: the
// tile is one run of consecutive keys (row j). kRuns > 1: the tile
// interleaves kRuns runs of consecutive keys, run_rows rows apart: key j is
// row j / kRuns of run j % kRuns, so each group of 4 keys reads a row of
// each run. The hardware prefetchers follow runs read side by side better
// than adjacent rows (a synthetic loop on the Zen 5: 39-43 GB/s against
// 19-25).
template <int kRuns>
HWY_INLINE int64_t RunRow(int64_t j, int64_t run_rows) {
  if constexpr (kRuns == 1) {
    (void)run_rows;
    return j;
  } else {
    return (j % kRuns) * run_rows + j / kRuns;
  }
}

// Key j's row at p (row: elements between rows).
template <int kRuns, class T>
HWY_INLINE const T* KeyAt(const T* HWY_RESTRICT p, int64_t j, int64_t row,
                          int64_t run_rows) {
  return p + RunRow<kRuns>(j, run_rows) * row;
}

// With the tile's keys in runs (kRuns > 1; only f32 K/V) each run is its own
// stream of K and V rows, prefetched this far ahead along it: into L1 and
// (far) into L2. 22.8-24.4 GB/s, 20.5-22.6 without the L2 prefetches. Entry:
// attention/simdattn/f32/B1_Hq32_Hkv8_Lq1_Lk16384_D128/none/threads:1
constexpr int64_t kRunPrefetchBytes = 1024;
constexpr int64_t kRunFarPrefetchBytes = 4096;

// The prefetches of K/V elements stored as KvElem<kKv>, for a tile of
// kRuns runs (KeyAt).
template <Storage kKv, int kRuns = 1>
class RowPrefetch {
 public:
  RowPrefetch() = default;  // prefetches nothing

  // K and V rows from the tile's first: base pointers and row strides in
  // bytes, V's row length in bytes, and how many rows exist (`rows`; 0:
  // none is prefetched); with kRuns > 1, the rows between runs.
  RowPrefetch(const void* k, int64_t k_stride, const void* v, int64_t v_stride,
              int64_t v_bytes, int64_t rows, int64_t run_rows = 0)
      : k_(static_cast<const char*>(k)),
        v_(static_cast<const char*>(v)),
        k_stride_(k_stride),
        v_stride_(v_stride),
        v_bytes_(v_bytes),
        rows_(rows),
        run_rows_(run_rows),
        k_ahead_(Rows(kNear, k_stride)),
        v_ahead_(Rows(kNear, v_stride)),
        k_far_(kFar ? Rows(kFarBytes, k_stride) : 0),
        v_far_(kFar ? Rows(kFarBytes, v_stride) : 0) {}

  // The lines of bytes [offset, offset + bytes) of K row `row` + k_ahead
  // (and of row + k_far into L2); rows counted along the run.
  HWY_INLINE void K(int64_t row, int64_t offset, int64_t bytes) const {
    const int64_t r = Ahead(row, k_ahead_);
    if (k_ == nullptr || r >= rows_) return;
    const char* p = k_ + r * k_stride_ + offset;
    for (int64_t b = 0; b < bytes; b += 64) Line(p + b);
    if constexpr (kFar) {
      const int64_t f = Ahead(row, k_far_);
      if (f >= rows_) return;
      const char* pf = k_ + f * k_stride_ + offset;
      for (int64_t b = 0; b < bytes; b += 64) Far(pf + b);
    }
  }

  // All lines of V row `row` + v_ahead (and of row + v_far into L2).
  HWY_INLINE void V(int64_t row) const {
    const int64_t r = Ahead(row, v_ahead_);
    if (v_ == nullptr || r >= rows_) return;
    const char* p = v_ + r * v_stride_;
    for (int64_t b = 0; b < v_bytes_; b += 64) Line(p + b);
    if constexpr (kFar) {
      const int64_t f = Ahead(row, v_far_);
      if (f >= rows_) return;
      const char* pf = v_ + f * v_stride_;
      for (int64_t b = 0; b < v_bytes_; b += 64) Far(pf + b);
    }
  }

 private:
  static constexpr bool kFar = kKv == Storage::kF32;
  static constexpr int64_t kNear = kRuns == 1 ? kPrefetchBytes : kRunPrefetchBytes;
  static constexpr int64_t kFarBytes =
      kRuns == 1 ? kFarPrefetchBytes : kRunFarPrefetchBytes;
  // Rows of `stride` bytes in about `bytes` (at least 1).
  static int64_t Rows(int64_t bytes, int64_t stride) {
    return std::max<int64_t>(1, bytes / std::max<int64_t>(1, stride));
  }
  // The row `ahead` rows past the tile's key j along its run.
  HWY_INLINE int64_t Ahead(int64_t j, int64_t ahead) const {
    return RunRow<kRuns>(j, run_rows_) + ahead;
  }
  static HWY_INLINE void Line(const char* p) { __builtin_prefetch(p, 0, 0); }
  static HWY_INLINE void Far(const char* p) { __builtin_prefetch(p, 0, 2); }

  const char* k_ = nullptr;
  const char* v_ = nullptr;
  int64_t k_stride_ = 0, v_stride_ = 0, v_bytes_ = 0, rows_ = 0;
  int64_t run_rows_ = 0;  // only with kRuns > 1
  int64_t k_ahead_ = 1, v_ahead_ = 1;
  int64_t k_far_ = 0, v_far_ = 0;  // only with kFar
};

// out[c] = sum(a_c) + the head-dim tail of row qr's dot product with key c,
// for the 4 keys c (rows k0..k3) of one query row.
template <Storage kKv, class D, class V>
HWY_INLINE void StoreDots(D d, V a0, V a1, V a2, V a3, const float* HWY_RESTRICT qr,
                          const KvElem<kKv>* k0, const KvElem<kKv>* k1,
                          const KvElem<kKv>* k2, const KvElem<kKv>* k3,
                          int64_t dk_vec, int64_t dk, float* HWY_RESTRICT out) {
  if constexpr (kBlockReduce) {
    const auto sums = Sums4(d, a0, a1, a2, a3);
    hn::StoreU(sums, hn::DFromV<decltype(sums)>(), out);
  } else {
    out[0] = hn::GetLane(hn::SumOfLanes(d, a0));
    out[1] = hn::GetLane(hn::SumOfLanes(d, a1));
    out[2] = hn::GetLane(hn::SumOfLanes(d, a2));
    out[3] = hn::GetLane(hn::SumOfLanes(d, a3));
  }
  for (int64_t i = dk_vec; i < dk; ++i) {
    out[0] += qr[i] * KvToF32<kKv>(k0[i]);
    out[1] += qr[i] * KvToF32<kKv>(k1[i]);
    out[2] += qr[i] * KvToF32<kKv>(k2[i]);
    out[3] += qr[i] * KvToF32<kKv>(k3[i]);
  }
}

// Scores of up to 4 rows (kRows) against the tile's keys into s[r * nk + j].
// `pf` prefetches K rows ahead of those read.
// Loads go across the 4 keys' rows, not along each row: reading K rows whole
// (Q reloaded per key) cost 12% (f16, Lk 16384, 1 thread). Entry:
// attention/simdattn/qf32kvf16/B1_Hq32_Hkv8_Lq1_Lk16384_D128/softcap/threads:1
template <int kRows, Storage kKv, int kRuns, class D, class Prefetch>
HWY_INLINE void DecodeScores(D d, const float* HWY_RESTRICT q, int64_t dk,
                             const KvElem<kKv>* HWY_RESTRICT k, int64_t k_row,
                             int64_t run_rows, int64_t nk, const Prefetch& pf,
                             float* HWY_RESTRICT s) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t dk_vec = dk / N * N;
  int64_t j = 0;
  for (; j + 4 <= nk; j += 4) {
    const KvElem<kKv>* k0 = KeyAt<kRuns>(k, j, k_row, run_rows);
    const KvElem<kKv>* k1 = KeyAt<kRuns>(k, j + 1, k_row, run_rows);
    const KvElem<kKv>* k2 = KeyAt<kRuns>(k, j + 2, k_row, run_rows);
    const KvElem<kKv>* k3 = KeyAt<kRuns>(k, j + 3, k_row, run_rows);
    auto a00 = hn::Zero(d), a01 = a00, a02 = a00, a03 = a00;
    auto a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    auto a20 = a00, a21 = a00, a22 = a00, a23 = a00;
    auto a30 = a00, a31 = a00, a32 = a00, a33 = a00;
    DotProducts4<kRows, kKv, 1, false>(d, q, dk, dk_vec, k0, k1, k2, k3, j, pf,
                                       a00, a01, a02, a03, a10, a11, a12, a13,
                                       a20, a21, a22, a23, a30, a31, a32, a33);
    StoreDots<kKv>(d, a00, a01, a02, a03, q, k0, k1, k2, k3, dk_vec, dk, s + j);
    if constexpr (kRows > 1) {
      StoreDots<kKv>(d, a10, a11, a12, a13, q + dk, k0, k1, k2, k3, dk_vec, dk,
                     s + nk + j);
    }
    if constexpr (kRows > 2) {
      StoreDots<kKv>(d, a20, a21, a22, a23, q + 2 * dk, k0, k1, k2, k3, dk_vec, dk,
                     s + 2 * nk + j);
    }
    if constexpr (kRows > 3) {
      StoreDots<kKv>(d, a30, a31, a32, a33, q + 3 * dk, k0, k1, k2, k3, dk_vec, dk,
                     s + 3 * nk + j);
    }
  }
  for (; j < nk; ++j) {  // leftover keys: one at a time
    const KvElem<kKv>* kj = KeyAt<kRuns>(k, j, k_row, run_rows);
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

// Whether 16 accumulators hold only finite values (x * 0 is +-0 for finite
// x and NaN for Inf/NaN).
template <class D, class V>
HWY_INLINE bool AllFinite16(D d, V x0, V x1, V x2, V x3, V x4, V x5, V x6, V x7,
                            V x8, V x9, V x10, V x11, V x12, V x13, V x14, V x15) {
  const hn::RebindToUnsigned<D> du;
  const V z = hn::Zero(d);
  const auto t0 = hn::Or(hn::Or(hn::Mul(x0, z), hn::Mul(x1, z)),
                         hn::Or(hn::Mul(x2, z), hn::Mul(x3, z)));
  const auto t1 = hn::Or(hn::Or(hn::Mul(x4, z), hn::Mul(x5, z)),
                         hn::Or(hn::Mul(x6, z), hn::Mul(x7, z)));
  const auto t2 = hn::Or(hn::Or(hn::Mul(x8, z), hn::Mul(x9, z)),
                         hn::Or(hn::Mul(x10, z), hn::Mul(x11, z)));
  const auto t3 = hn::Or(hn::Or(hn::Mul(x12, z), hn::Mul(x13, z)),
                         hn::Or(hn::Mul(x14, z), hn::Mul(x15, z)));
  const auto all = hn::BitCast(du, hn::Or(hn::Or(t0, t1), hn::Or(t2, t3)));
  const auto magnitude = hn::And(all, hn::Set(du, 0x7FFFFFFFu));
  return hn::AllTrue(du, hn::Eq(magnitude, hn::Zero(du)));
}

// The 4N elements at p as 4 vectors of f32.
template <Storage kKv, class D, class V>
HWY_INLINE void LoadKv4(D d, const KvElem<kKv>* HWY_RESTRICT p, V& x0, V& x1,
                        V& x2, V& x3) {
  const size_t N = hn::Lanes(d);
  x0 = LoadKv<kKv>(d, p);
  x1 = LoadKv<kKv>(d, p + N);
  x2 = LoadKv<kKv>(d, p + 2 * N);
  x3 = LoadKv<kKv>(d, p + 3 * N);
}

// a_c = c * orow[c * N, (c + 1) * N) for the 4 vectors c of one output row.
template <class D, class V>
HWY_INLINE void LoadScaledRow(D d, float c, const float* HWY_RESTRICT orow, V& a0,
                              V& a1, V& a2, V& a3) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto vc = hn::Set(d, c);
  a0 = hn::Mul(vc, hn::LoadU(d, orow));
  a1 = hn::Mul(vc, hn::LoadU(d, orow + N));
  a2 = hn::Mul(vc, hn::LoadU(d, orow + 2 * N));
  a3 = hn::Mul(vc, hn::LoadU(d, orow + 3 * N));
}

template <class D, class V>
HWY_INLINE void StoreRow4(D d, V a0, V a1, V a2, V a3, float* HWY_RESTRICT orow) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  hn::StoreU(a0, d, orow);
  hn::StoreU(a1, d, orow + N);
  hn::StoreU(a2, d, orow + 2 * N);
  hn::StoreU(a3, d, orow + 3 * N);
}

// The output columns [e, e + 4N) of rows [0, kRows), scaled by scale[r],
// into the accumulators aRC (row R, vector C).
template <int kRows, class D, class V>
HWY_INLINE void LoadScaledRows(D d, const float* HWY_RESTRICT scale,
                               const float* HWY_RESTRICT o, int64_t dv, int64_t e,
                               V& a00, V& a01, V& a02, V& a03, V& a10, V& a11,
                               V& a12, V& a13, V& a20, V& a21, V& a22, V& a23,
                               V& a30, V& a31, V& a32, V& a33) {
  LoadScaledRow(d, scale[0], o + e, a00, a01, a02, a03);
  if constexpr (kRows > 1) LoadScaledRow(d, scale[1], o + dv + e, a10, a11, a12, a13);
  if constexpr (kRows > 2) LoadScaledRow(d, scale[2], o + 2 * dv + e, a20, a21, a22, a23);
  if constexpr (kRows > 3) LoadScaledRow(d, scale[3], o + 3 * dv + e, a30, a31, a32, a33);
}

// The accumulators back to the output columns [e, e + 4N).
template <int kRows, class D, class V>
HWY_INLINE void StoreRows(D d, float* HWY_RESTRICT o, int64_t dv, int64_t e,
                          V a00, V a01, V a02, V a03, V a10, V a11, V a12, V a13,
                          V a20, V a21, V a22, V a23, V a30, V a31, V a32, V a33) {
  StoreRow4(d, a00, a01, a02, a03, o + e);
  if constexpr (kRows > 1) StoreRow4(d, a10, a11, a12, a13, o + dv + e);
  if constexpr (kRows > 2) StoreRow4(d, a20, a21, a22, a23, o + 2 * dv + e);
  if constexpr (kRows > 3) StoreRow4(d, a30, a31, a32, a33, o + 3 * dv + e);
}

// a_c += w * x_c: one row's weight w of a V row (vectors x0..x3). kGuard:
// a +0.0 weight (a hidden key) takes no part.
template <bool kGuard, class D, class V>
HWY_INLINE void AddWeighted(D d, float w, V x0, V x1, V x2, V x3, V& a0, V& a1,
                            V& a2, V& a3) {
  if (kGuard && BitCastScalar(w) == 0) return;
  auto vw = hn::Set(d, w);
  InRegister(vw);
  MulAdd4(vw, x0, x1, x2, x3, a0, a1, a2, a3);
}

// The P·V products of the tile's keys for output columns [e, e + 4N) of rows
// [0, kRows), added to the accumulators aRC. The first pass (e = 0)
// prefetches V rows ahead, unless kGuard (the rare redo).
template <int kRows, Storage kKv, int kRuns, bool kGuard, class D, class V>
HWY_INLINE void ValuesOfKeys(D d, const float* HWY_RESTRICT p, int64_t nk,
                             const KvElem<kKv>* HWY_RESTRICT v, int64_t v_row,
                             int64_t run_rows, int64_t e,
                             const RowPrefetch<kKv, kRuns>& pf, V& a00, V& a01,
                             V& a02, V& a03, V& a10, V& a11, V& a12, V& a13,
                             V& a20, V& a21, V& a22, V& a23, V& a30, V& a31,
                             V& a32, V& a33) {
  for (int64_t j = 0; j < nk; ++j) {
    const KvElem<kKv>* vj = KeyAt<kRuns>(v, j, v_row, run_rows) + e;
    if (!kGuard && e == 0) pf.V(j);
    V x0, x1, x2, x3;
    LoadKv4<kKv>(d, vj, x0, x1, x2, x3);
    InRegister(x0), InRegister(x1), InRegister(x2), InRegister(x3);
    AddWeighted<kGuard>(d, p[j], x0, x1, x2, x3, a00, a01, a02, a03);
    if constexpr (kRows > 1) {
      AddWeighted<kGuard>(d, p[nk + j], x0, x1, x2, x3, a10, a11, a12, a13);
    }
    if constexpr (kRows > 2) {
      AddWeighted<kGuard>(d, p[2 * nk + j], x0, x1, x2, x3, a20, a21, a22, a23);
    }
    if constexpr (kRows > 3) {
      AddWeighted<kGuard>(d, p[3 * nk + j], x0, x1, x2, x3, a30, a31, a32, a33);
    }
  }
}

// DecodeValues for output columns [e, e + 4N) skipping +0.0 weights (hidden
// keys): the rare redo when the plain product was not finite. Out of line,
// so that the plain loop's code stays as it is without options.
template <int kRows, Storage kKv, int kRuns, class D>
HWY_NOINLINE void DecodeValuesGuarded(D d, const float* HWY_RESTRICT p,
                                      int64_t nk,
                                      const KvElem<kKv>* HWY_RESTRICT v,
                                      int64_t v_row, int64_t run_rows, int64_t dv,
                                      int64_t e,
                                      const float* HWY_RESTRICT scale,
                                      float* HWY_RESTRICT o) {
  const RowPrefetch<kKv, kRuns> pf;  // none on this rare path
  auto a00 = hn::Zero(d), a01 = a00, a02 = a00, a03 = a00;
  auto a10 = a00, a11 = a00, a12 = a00, a13 = a00;
  auto a20 = a00, a21 = a00, a22 = a00, a23 = a00;
  auto a30 = a00, a31 = a00, a32 = a00, a33 = a00;
  LoadScaledRows<kRows>(d, scale, o, dv, e, a00, a01, a02, a03, a10, a11, a12, a13,
                        a20, a21, a22, a23, a30, a31, a32, a33);
  ValuesOfKeys<kRows, kKv, kRuns, true>(d, p, nk, v, v_row, run_rows, e, pf, a00,
                                        a01, a02, a03, a10, a11, a12, a13, a20,
                                        a21, a22, a23, a30, a31, a32, a33);
  StoreRows<kRows>(d, o, dv, e, a00, a01, a02, a03, a10, a11, a12, a13, a20, a21,
                   a22, a23, a30, a31, a32, a33);
}

// o[r] = scale[r] * o[r] + sum_j p[r * nk + j] * v_j for up to 4 rows; 4
// output vectors per row in registers, then the head-dim tail in scalar code.
// `pf` prefetches V rows ahead of those read (in the first pass).
// kMayHide: some weight may be +0.0 for a hidden key, whose V row must take
// no part (0 * Inf would be NaN). The plain product runs first; only if its
// result is not finite is it redone skipping +0.0 weights (dropped keys are
// -0.0 and still take part, as in the reference).
template <int kRows, Storage kKv, int kRuns, bool kMayHide, class D>
HWY_INLINE void DecodeValues(D d, const float* HWY_RESTRICT p, int64_t nk,
                             const KvElem<kKv>* HWY_RESTRICT v, int64_t v_row,
                             int64_t run_rows, int64_t dv,
                             const RowPrefetch<kKv, kRuns>& pf,
                             const float* HWY_RESTRICT scale,
                             float* HWY_RESTRICT o) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t e = 0;
  for (; e + 4 * N <= dv; e += 4 * N) {
    auto a00 = hn::Zero(d), a01 = a00, a02 = a00, a03 = a00;
    auto a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    auto a20 = a00, a21 = a00, a22 = a00, a23 = a00;
    auto a30 = a00, a31 = a00, a32 = a00, a33 = a00;
    LoadScaledRows<kRows>(d, scale, o, dv, e, a00, a01, a02, a03, a10, a11, a12,
                          a13, a20, a21, a22, a23, a30, a31, a32, a33);
    ValuesOfKeys<kRows, kKv, kRuns, false>(d, p, nk, v, v_row, run_rows, e, pf,
                                           a00, a01, a02, a03, a10, a11, a12, a13,
                                           a20, a21, a22, a23, a30, a31, a32, a33);
    if (kMayHide && !AllFinite16(d, a00, a01, a02, a03, a10, a11, a12, a13, a20,
                                 a21, a22, a23, a30, a31, a32, a33)) {
      DecodeValuesGuarded<kRows, kKv, kRuns>(d, p, nk, v, v_row, run_rows, dv, e,
                                             scale, o);
      continue;
    }
    StoreRows<kRows>(d, o, dv, e, a00, a01, a02, a03, a10, a11, a12, a13, a20, a21,
                     a22, a23, a30, a31, a32, a33);
  }
  // Head-dim tail (none when Dv is a multiple of 4 vectors: then the key
  // loop below, with its data-dependent branch, must not run at all).
  for (int r = 0; r < kRows && e < dv; ++r) {
    for (int64_t t = e; t < dv; ++t) o[r * dv + t] *= scale[r];
    for (int64_t j = 0; j < nk; ++j) {
      const float w = p[r * nk + j];
      if (kMayHide && BitCastScalar(w) == 0) continue;  // a hidden key
      const KvElem<kKv>* vj = KeyAt<kRuns>(v, j, v_row, run_rows);
      for (int64_t t = e; t < dv; ++t) o[r * dv + t] += w * KvToF32<kKv>(vj[t]);
    }
  }
}

template <Storage kKv, int kRuns, bool kMayHide, class D>
HWY_INLINE void DecodeValuesRows(D d, int64_t n, const float* HWY_RESTRICT p,
                                 int64_t nk, const KvElem<kKv>* HWY_RESTRICT v,
                                 int64_t v_row, int64_t run_rows, int64_t dv,
                                 const RowPrefetch<kKv, kRuns>& pf,
                                 const float* HWY_RESTRICT scale,
                                 float* HWY_RESTRICT o) {
  switch (n) {
    case 4:
      DecodeValues<4, kKv, kRuns, kMayHide>(d, p, nk, v, v_row, run_rows, dv, pf,
                                            scale, o);
      break;
    case 3:
      DecodeValues<3, kKv, kRuns, kMayHide>(d, p, nk, v, v_row, run_rows, dv, pf,
                                            scale, o);
      break;
    case 2:
      DecodeValues<2, kKv, kRuns, kMayHide>(d, p, nk, v, v_row, run_rows, dv, pf,
                                            scale, o);
      break;
    default:
      DecodeValues<1, kKv, kRuns, kMayHide>(d, p, nk, v, v_row, run_rows, dv, pf,
                                            scale, o);
      break;
  }
}

// Out of line for f32 K/V: inlined into the task, GCC kept one or two of the
// 16 accumulators on the stack (17.1 GB/s against 23.5 out of line). Entry:
// attention/simdattn/f32/B1_Hq32_Hkv8_Lq1_Lk16384_D128/none/threads:1
template <Storage kKv, int kRuns, bool kMayHide, class D>
HWY_NOINLINE void DecodeValuesRowsOutOfLine(
    D d, int64_t n, const float* HWY_RESTRICT p, int64_t nk,
    const KvElem<kKv>* HWY_RESTRICT v, int64_t v_row, int64_t run_rows, int64_t dv,
    const RowPrefetch<kKv, kRuns>& pf, const float* HWY_RESTRICT scale,
    float* HWY_RESTRICT o) {
  DecodeValuesRows<kKv, kRuns, kMayHide>(d, n, p, nk, v, v_row, run_rows, dv, pf,
                                         scale, o);
}

template <Storage kKv, int kRuns, class D>
HWY_INLINE void DecodeScoresRows(D d, int64_t n, const float* HWY_RESTRICT q,
                                 int64_t dk, const KvElem<kKv>* HWY_RESTRICT k,
                                 int64_t k_row, int64_t run_rows, int64_t nk,
                                 const RowPrefetch<kKv, kRuns>& pf,
                                 float* HWY_RESTRICT s) {
  switch (n) {
    case 4: DecodeScores<4, kKv, kRuns>(d, q, dk, k, k_row, run_rows, nk, pf, s); break;
    case 3: DecodeScores<3, kKv, kRuns>(d, q, dk, k, k_row, run_rows, nk, pf, s); break;
    case 2: DecodeScores<2, kKv, kRuns>(d, q, dk, k, k_row, run_rows, nk, pf, s); break;
    default: DecodeScores<1, kKv, kRuns>(d, q, dk, k, k_row, run_rows, nk, pf, s); break;
  }
}

template <Storage kKv, int kRuns, class D>
HWY_NOINLINE void DecodeScoresRowsOutOfLine(
    D d, int64_t n, const float* HWY_RESTRICT q, int64_t dk,
    const KvElem<kKv>* HWY_RESTRICT k, int64_t k_row, int64_t run_rows, int64_t nk,
    const RowPrefetch<kKv, kRuns>& pf, float* HWY_RESTRICT s) {
  DecodeScoresRows<kKv, kRuns>(d, n, q, dk, k, k_row, run_rows, nk, pf, s);
}

// Score and weight options of the decode path: none.
struct NoDecodeMods {
  static constexpr bool kActive = false;
  bool may_hide() const { return false; }
  void Scores(int64_t /* row */, int64_t /* nk */, float* /* s */) const {}
  void Weights(int64_t /* row */, int64_t /* nk */, float* /* p */) const {}
};

// One tile for `rows` rows (any count), in groups of 4: scores, online
// softmax (SoftmaxRow), values. Only the first group streams the tile from
// memory and prefetches ahead; the groups after it read it again from cache.
// Up to 4 rows the arithmetic does not bound the decode from memory (1, 2
// and 4 rows within 5%); 8 rows (two groups) read 18-36% slower. Entry:
// attention/simdattn/qf32kvf16/B1_Hq32_Hkv8_Lq2_Lk16384_D128/causal/threads:1
// K/V rows below `prefetch_end` (counted from the tile's first; 0 for none)
// exist: pf prefetches among them (RowPrefetch). kRuns > 1: the keys come
// from kRuns runs, run_rows rows apart (KeyAt).
// Mods (NoDecodeMods's interface) changes block row r's scores of the tile
// before the softmax (Scores) and its weights after it (Weights); may_hide()
// says whether some key of the tile may be hidden from a row.
template <Storage kKv, int kRuns = 1, class D, class Mods = NoDecodeMods>
HWY_INLINE void DecodeTile(D d, int64_t rows, const float* HWY_RESTRICT q,
                           int64_t dk, const KvElem<kKv>* HWY_RESTRICT k,
                           int64_t k_row, const KvElem<kKv>* HWY_RESTRICT v,
                           int64_t v_row, int64_t dv, int64_t nk,
                           int64_t prefetch_end, float* HWY_RESTRICT s,
                           float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                           float* HWY_RESTRICT o, const Mods& mods = Mods(),
                           int64_t run_rows = 0) {
  constexpr bool kF32 = kKv == Storage::kF32;
  constexpr int64_t kElem = static_cast<int64_t>(sizeof(KvElem<kKv>));
  const RowPrefetch<kKv, kRuns> first(k, k_row * kElem, v, v_row * kElem,
                                      dv * kElem, prefetch_end, run_rows);
  const RowPrefetch<kKv, kRuns> none;
  for (int64_t r0 = 0; r0 < rows; r0 += 4) {
    const RowPrefetch<kKv, kRuns>& pf = r0 == 0 ? first : none;
    const int64_t n = std::min<int64_t>(4, rows - r0);
    const float* qr = q + r0 * dk;
    float scale[4];  // per row: alpha, the factor of the output so far
    if constexpr (kF32) {
      DecodeScoresRowsOutOfLine<kKv, kRuns>(d, n, qr, dk, k, k_row, run_rows, nk, pf, s);
    } else {
      DecodeScoresRows<kKv, kRuns>(d, n, qr, dk, k, k_row, run_rows, nk, pf, s);
    }
    for (int64_t t = 0; t < n; ++t) {
      const int64_t r = r0 + t;
      float* HWY_RESTRICT sr = s + t * nk;
      if constexpr (Mods::kActive) mods.Scores(r, nk, sr);
      scale[t] = SoftmaxRow(d, sr, nk, m[r], l[r]);
      if constexpr (Mods::kActive) mods.Weights(r, nk, sr);
    }
    float* orows = o + r0 * dv;
    if (mods.may_hide()) {
      if constexpr (kF32) {
        DecodeValuesRowsOutOfLine<kKv, kRuns, true>(d, n, s, nk, v, v_row, run_rows,
                                                    dv, pf, scale, orows);
      } else {
        DecodeValuesRows<kKv, kRuns, true>(d, n, s, nk, v, v_row, run_rows, dv, pf,
                                           scale, orows);
      }
    } else if constexpr (kF32) {
      DecodeValuesRowsOutOfLine<kKv, kRuns, false>(d, n, s, nk, v, v_row, run_rows,
                                                   dv, pf, scale, orows);
    } else {
      DecodeValuesRows<kKv, kRuns, false>(d, n, s, nk, v, v_row, run_rows, dv, pf,
                                          scale, orows);
    }
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_DECODE_INL_H_
