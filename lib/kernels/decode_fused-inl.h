// Fused decode for 16-bit and 8-bit (int8, fp8) K/V without options: each
// group of 4 keys gets its scores, its online-softmax step and its P·V
// products, so that K and V are read side by side as two sequential streams. f32 K/V keep the tile path
// and its runs (decode-inl.h): fused, they read 7-14% slower.
// Per-target code (include from a foreach_target translation unit).

#if defined(SIMDATTN_LIB_KERNELS_DECODE_FUSED_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_DECODE_FUSED_INL_H_
#undef SIMDATTN_LIB_KERNELS_DECODE_FUSED_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_DECODE_FUSED_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "hwy/highway.h"
#include "lib/kernels/decode_dot-inl.h"
#include "lib/kernels/exp-inl.h"
#include "lib/kernels/online_softmax-inl.h"
#include "lib/kernels/types.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if SIMDATTN_HAVE_DECODE_FUSED

// DecodeFused's largest Dk (its packed Q is on the stack).
constexpr int64_t kFusedMaxDk = 256;

// DecodeFused's stand-in for the prefetcher of the dot steps: DecodeFused
// leaves K and V to the hardware prefetchers.
struct NoPrefetch {
  HWY_INLINE void K(int64_t, int64_t, int64_t) const {}
};

// A compiler barrier for memory: values just stored are read back from
// memory after it. DecodeFused stores its 16 weights and broadcasts them one
// by one; without it GCC broadcasts them out of the stored vector with a
// lane permute each (vpermd), on the shuffle ports that the score
// reductions need. Only on AVX-512, where it was measured: 7-11% faster with
// K/V in L2 (f16, bf16, 1 thread), -3% to +14% from memory. Entry:
// attention/simdattn/qf32kvbf16/B1_Hq32_Hkv8_Lq1_Lk4096_D128/none/threads:1
HWY_INLINE void ReloadFromMemory() {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && \
    (defined(__GNUC__) || defined(__clang__))
  asm volatile("" ::: "memory");
#endif
}

// The exact online-softmax step (ScalarStep) of rows [0, kRows) for a group
// of 4 keys (scores s[r * 4 + c]) up to the weights: the rows' new maxima
// into m and mrep (repeated per key), l and the rows of o scaled by alpha,
// and the maxima to subtract into msub. The fused loop's rare path: the
// first group, a rising maximum, NaN or infinite scores.
template <int kRows, class D>
HWY_NOINLINE void FusedGroupMaxima(D d, const float* HWY_RESTRICT s, int64_t dv,
                                   float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                                   float* HWY_RESTRICT o, float* HWY_RESTRICT mrep,
                                   float* HWY_RESTRICT msub) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t r = 0; r < kRows; ++r) {
    const float* sr = s + r * 4;
    float mx = -std::numeric_limits<float>::infinity();
    bool nan = false;
    for (int64_t c = 0; c < 4; ++c) {
      if (std::isnan(sr[c])) nan = true;
      mx = std::max(mx, sr[c]);
    }
    const ScalarStep step = OnlineStep(m[r], mx, nan);
    for (int64_t c = 0; c < 4; ++c) {
      mrep[r * 4 + c] = step.m_new;
      msub[r * 4 + c] = step.m_sub;
    }
    m[r] = step.m_new;
    if (step.m_new == step.m_old) continue;  // alpha is 1
    const float alpha = step.Alpha();
    l[r] *= alpha;
    float* HWY_RESTRICT orow = o + r * dv;
    const auto va = hn::Set(d, alpha);
    int64_t e = 0;
    for (; e + N <= dv; e += N) hn::StoreU(hn::Mul(va, hn::LoadU(d, orow + e)), d, orow + e);
    for (; e < dv; ++e) orow[e] *= alpha;
  }
}

// Q rows [0, kRows) packed step by step for DecodeFused ([dk / N][4][N],
// rows past kRows zero): the dot steps read the 4 rows from one pointer.
template <int kRows, class D>
HWY_INLINE void PackFusedQ(D d, const float* HWY_RESTRICT q, int64_t dk,
                           float* HWY_RESTRICT qp) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t i = 0; i < dk; i += N) {
    for (int64_t r = 0; r < 4; ++r) {
      const auto y = r < kRows ? hn::LoadU(d, q + r * dk + i) : hn::Zero(d);
      hn::Store(y, d, qp + i * 4 + r * N);
    }
  }
}

// The scores of the group of 4 keys whose first K row is k, one 4-lane
// vector per row: s_r = [q_r·k_0, q_r·k_1, q_r·k_2, q_r·k_3] (zero past
// kRows). qp is PackFusedQ's; dk is a whole number of vectors; kNanCodes
// as LoadKv's.
template <int kRows, Storage kKv, bool kNanCodes, class D, class V4>
HWY_INLINE void FusedScores(D d, const float* HWY_RESTRICT qp, int64_t dk,
                            const KvElem<kKv>* HWY_RESTRICT k, int64_t k_row,
                            V4& s0, V4& s1, V4& s2, V4& s3) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const KvElem<kKv>* k1 = k + k_row;
  const KvElem<kKv>* k2 = k1 + k_row;
  const KvElem<kKv>* k3 = k2 + k_row;
  auto a00 = hn::Zero(d), a01 = a00, a02 = a00, a03 = a00;
  auto a10 = a00, a11 = a00, a12 = a00, a13 = a00;
  auto a20 = a00, a21 = a00, a22 = a00, a23 = a00;
  auto a30 = a00, a31 = a00, a32 = a00, a33 = a00;
  DotProducts4<kRows, kKv, 4, true, kNanCodes>(d, qp, N, dk, k, k1, k2, k3, 0, NoPrefetch(),
                                    a00, a01, a02, a03, a10, a11, a12, a13, a20,
                                    a21, a22, a23, a30, a31, a32, a33);
  const hn::CappedTag<float, 4> d4;
  s0 = Sums4(d, a00, a01, a02, a03);
  s1 = kRows > 1 ? Sums4(d, a10, a11, a12, a13) : hn::Zero(d4);
  s2 = kRows > 2 ? Sums4(d, a20, a21, a22, a23) : hn::Zero(d4);
  s3 = kRows > 3 ? Sums4(d, a30, a31, a32, a33) : hn::Zero(d4);
}

// Part i of the group's 16 scores [row][key] as vectors of dc (16 / kLanes
// parts), from FusedScores's rows.
template <class DC, class V4>
HWY_INLINE hn::VFromD<DC> ScoresPart(DC dc, size_t i, V4 s0, V4 s1, V4 s2, V4 s3) {
  constexpr size_t kParts = 16 / hn::MaxLanes(dc);
  if constexpr (kParts == 1) {
    (void)i;
    const hn::Half<DC> d8;
    return hn::Combine(dc, hn::Combine(d8, s3, s2), hn::Combine(d8, s1, s0));
  } else if constexpr (kParts == 2) {
    return i == 0 ? hn::Combine(dc, s1, s0) : hn::Combine(dc, s3, s2);
  } else {
    return i == 0 ? s0 : (i == 1 ? s1 : (i == 2 ? s2 : s3));
  }
}

// w_c = p[c] broadcast, for the 4 keys c of one row.
template <class D, class V>
HWY_INLINE void BroadcastWeights(D d, const float* HWY_RESTRICT p, V& w0, V& w1,
                                 V& w2, V& w3) {
  w0 = hn::Set(d, p[0]), w1 = hn::Set(d, p[1]);
  w2 = hn::Set(d, p[2]), w3 = hn::Set(d, p[3]);
  InRegister(w0), InRegister(w1), InRegister(w2), InRegister(w3);
}

// orow[0, N) += sum_c w_c x_c: one row's output vector.
template <class D, class V>
HWY_INLINE void FusedPvRow(D d, V w0, V w1, V w2, V w3, V x0, V x1, V x2, V x3,
                           float* HWY_RESTRICT orow) {
  auto acc = hn::LoadU(d, orow);
  acc = hn::MulAdd(w0, x0, acc);
  acc = hn::MulAdd(w1, x1, acc);
  acc = hn::MulAdd(w2, x2, acc);
  acc = hn::MulAdd(w3, x3, acc);
  hn::StoreU(acc, d, orow);
}

// o[r] += sum_c p[r * 4 + c] * v_c for rows [0, kRows), the group's 4 V
// rows (from vj, v_row apart) read side by side; dv is a whole number of
// vectors; kNanCodes as LoadKv's.
template <int kRows, Storage kKv, bool kNanCodes, class D>
HWY_INLINE void FusedValues(D d, const float* HWY_RESTRICT p,
                            const KvElem<kKv>* HWY_RESTRICT vj, int64_t v_row,
                            int64_t dv, float* HWY_RESTRICT o) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  hn::VFromD<D> w00, w01, w02, w03, w10, w11, w12, w13;
  hn::VFromD<D> w20, w21, w22, w23, w30, w31, w32, w33;
  BroadcastWeights(d, p, w00, w01, w02, w03);
  BroadcastWeights(d, p + 4, w10, w11, w12, w13);
  BroadcastWeights(d, p + 8, w20, w21, w22, w23);
  BroadcastWeights(d, p + 12, w30, w31, w32, w33);
#pragma GCC unroll 16
  for (int64_t e = 0; e < dv; e += N) {
    auto x0 = LoadKvAt<kKv, kNanCodes>(d, vj, e);
    auto x1 = LoadKvAt<kKv, kNanCodes>(d, vj + v_row, e);
    auto x2 = LoadKvAt<kKv, kNanCodes>(d, vj + 2 * v_row, e);
    auto x3 = LoadKvAt<kKv, kNanCodes>(d, vj + 3 * v_row, e);
    InRegister(x0), InRegister(x1), InRegister(x2), InRegister(x3);
    FusedPvRow(d, w00, w01, w02, w03, x0, x1, x2, x3, o + e);
    if constexpr (kRows > 1) FusedPvRow(d, w10, w11, w12, w13, x0, x1, x2, x3, o + dv + e);
    if constexpr (kRows > 2) {
      FusedPvRow(d, w20, w21, w22, w23, x0, x1, x2, x3, o + 2 * dv + e);
    }
    if constexpr (kRows > 3) {
      FusedPvRow(d, w30, w31, w32, w33, x0, x1, x2, x3, o + 3 * dv + e);
    }
  }
}

// Where DecodeFused finds its keys' rows: K(j) and V(j) for key j of the
// call (a multiple of 4; the group's 4 rows follow at k_row and v_row
// elements), and for 8-bit K/V their scales: KS(j), VS(j), the group's
// next at ks_row and vs_row floats (0: fp8's one scale per tensor).
// Rows of consecutive keys one stride apart:
template <class T>
struct StridedRows {
  const T* k;
  const T* v;
  int64_t k_row, v_row;
  const float* ks;
  const float* vs;
  int64_t ks_row, vs_row;
  HWY_INLINE const T* K(int64_t j) const { return k + j * k_row; }
  HWY_INLINE const T* V(int64_t j) const { return v + j * v_row; }
  HWY_INLINE const float* KS(int64_t j) const { return ks + j * ks_row; }
  HWY_INLINE const float* VS(int64_t j) const { return vs + j * vs_row; }
};
// Rows of a paged cache (Src: block-inl.h's KvRows), from key `first` on:
template <class T, class Src>
struct PagedRows {
  const Src* src;
  int64_t first;
  int64_t k_row, v_row;
  int64_t ks_row, vs_row;
  HWY_INLINE const T* K(int64_t j) const {
    return reinterpret_cast<const T*>(src->KRow(first + j));
  }
  HWY_INLINE const T* V(int64_t j) const {
    return reinterpret_cast<const T*>(src->VRow(first + j));
  }
  HWY_INLINE const float* KS(int64_t j) const { return src->KScaleAt(first + j); }
  HWY_INLINE const float* VS(int64_t j) const { return src->VScaleAt(first + j); }
};

// The largest magnitude (byte & 0x7F) of the e4m3 codes in 4 rows of n
// bytes, `row` bytes apart, from p: into acc (whole vectors) and tail (the
// rest). 0x7F, the largest, is NaN's.
template <class D8>
HWY_INLINE void NanCodeMax(D8 d8, const uint8_t* HWY_RESTRICT p, int64_t row, int64_t n,
                           hn::VFromD<D8>& acc, uint8_t& tail) {
  const int64_t N8 = static_cast<int64_t>(hn::Lanes(d8));
  const auto magnitude = hn::Set(d8, uint8_t{0x7F});
  for (int r = 0; r < 4; ++r, p += row) {
    int64_t i = 0;
    for (; i + N8 <= n; i += N8) acc = hn::Max(acc, hn::And(hn::LoadU(d8, p + i), magnitude));
    for (; i < n; ++i) tail = std::max<uint8_t>(tail, p[i] & 0x7F);
  }
}

// Asks for the 4 K rows (k_bytes each) and 4 V rows (v_bytes) of a group
// into L2.
template <class T>
HWY_INLINE void PrefetchFusedGroup(const T* k, int64_t k_row, int64_t k_bytes,
                                   const T* v, int64_t v_row, int64_t v_bytes) {
  for (int r = 0; r < 4; ++r) {
    const char* kr = reinterpret_cast<const char*>(k + r * k_row);
    const char* vr = reinterpret_cast<const char*>(v + r * v_row);
    for (int64_t b = 0; b < k_bytes; b += 64) __builtin_prefetch(kr + b, 0, 2);
    for (int64_t b = 0; b < v_bytes; b += 64) __builtin_prefetch(vr + b, 0, 2);
  }
}

// Decode without score or weight options, rows [0, kRows) (kRows <= 4) over
// nk keys (a multiple of 4) of 16-bit K/V, Dk (at most kFusedMaxDk) and Dv
// whole vectors; same contract for m, l and o as DecodeTile. Each group of 4
// keys gets its scores, its online-softmax step and its P·V products (the
// tile path reads a tile's K, works on its scores alone, then reads its V).
// Software-pipelined: the next group's dot products are issued before this
// group's P·V products, so that its K loads and score reduction overlap
// them. The output rows stay in L1 (each group loads, updates and stores
// them); the 16 scores [row][key], the rows' maxima and the sums of the
// weights not yet in l stay in registers. While every score of a group is
// at most its row's finite maximum, the weights are exp(s - m) and l and o
// need no scaling (alpha would be exactly 1); otherwise FusedGroupMaxima
// takes the exact step first. Rows stored one after another need no
// software prefetch: the hardware prefetchers follow the two streams. Rows
// further apart (a head of a [tokens, heads, D] cache, or of a page of one)
// defeat them; there `ahead` > 0 asks for the rows of the group that many
// keys ahead, within the nk keys.
// Tuned on the Zen 5 (f16, Lk 16384, 1 thread, rows one after another): pipelined without prefetch
// 17.0 GB/s, with the tile path's prefetches 8.3, not pipelined 10.8. Entry:
// paired/qf32kvf16/B1_Hq32_Hkv8_Lq1_Lk16384_D128/none/read_vs_simdattn/threads:1
// 8-bit K/V (int8, fp8; kKv8) load their values unscaled: key j's scale
// ks[j * ks_row] multiplies its scores (s_j = ks_j (q · k_j)) and
// vs[j * vs_row] its weights for P·V (not for l), so that each element
// costs a conversion and no multiply (fp8's per-tensor scale: a row
// stride of 0). 16-bit and q8_0 K/V (its scales are in its blocks:
// LoadKvAt) take no scales (null).
// kNanCodes false (e4m3 only): the values load without the test for NaN
// codes (LoadE4M3ViaF16), and the loop instead takes the largest magnitude
// of each group's bytes and stops before a group with a NaN code, leaving
// m, l and o partly updated: it returns false, and the caller runs the
// keys again from its copy of them (DecodeFusedE4M3). Otherwise it returns
// true.
template <int kRows, Storage kKv, bool kNanCodes = true, class D, class Rows>
HWY_INLINE bool DecodeFused(D d, const float* HWY_RESTRICT q, int64_t dk,
                            const Rows& rows, int64_t dv, int64_t nk, int64_t ahead,
                            float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                            float* HWY_RESTRICT o) {
  const int64_t k_row = rows.k_row, v_row = rows.v_row;
  static_assert(kKv != Storage::kF32 && kRows >= 1 && kRows <= 4,
                "16-bit or 8-bit K/V, 1-4 rows");
  static_assert(kNanCodes || kKv == Storage::kE4M3, "only e4m3 has NaN codes to test");
  const hn::ScalableTag<uint8_t> d8;
  auto codes = hn::Zero(d8);  // the largest magnitudes (kNanCodes false)
  uint8_t codes_tail = 0;
  const auto nan_code = [&]() {
    return codes_tail == 0x7F || !hn::AllFalse(d8, hn::Eq(codes, hn::Set(d8, uint8_t{0x7F})));
  };
  constexpr bool kScaled = kKv8<kKv>;
  // The group's 16 values [row][key] as kParts vectors of dc.
  const hn::CappedTag<float, 16> dc;
  using VC = hn::VFromD<decltype(dc)>;
  using V4 = hn::VFromD<hn::CappedTag<float, 4>>;
  constexpr size_t kLanes = hn::MaxLanes(dc);
  constexpr size_t kParts = 16 / kLanes;
  static_assert(kLanes >= 4 && kParts * kLanes == 16, "4, 8 or 16 lanes");
  HWY_ALIGN float qp[4 * kFusedMaxDk];
  PackFusedQ<kRows>(d, q, dk, qp);
  HWY_ALIGN float buf[16] = {};   // scores (rare path), sums of weights
  HWY_ALIGN float p[16];          // weights [row][key]
  HWY_ALIGN float mrep[16] = {};  // maxima per [row][key] (0 past kRows)
  HWY_ALIGN float msub[16] = {};  // the maxima to subtract
  bool fast = true;  // every row's maximum is finite
  for (int64_t r = 0; r < kRows; ++r) {
    fast = fast && std::isfinite(m[r]);
    for (int64_t c = 0; c < 4; ++c) mrep[r * 4 + c] = msub[r * 4 + c] = m[r];
  }
  VC vm[kParts], vsub[kParts], vl[kParts];
  const auto load_maxima = [&]() {
    for (size_t i = 0; i < kParts; ++i) {
      vm[i] = hn::Load(dc, mrep + i * kLanes);
      vsub[i] = hn::Load(dc, msub + i * kLanes);
    }
  };
  const auto fold_sums = [&]() {  // the weights' sums into l
    for (size_t i = 0; i < kParts; ++i) {
      hn::Store(vl[i], dc, buf + i * kLanes);
      vl[i] = hn::Zero(dc);
    }
    for (int64_t r = 0; r < kRows; ++r) {
      l[r] += (buf[r * 4] + buf[r * 4 + 1]) + (buf[r * 4 + 2] + buf[r * 4 + 3]);
    }
  };
  // The 4 scales of keys [j, j + 4) repeated for each row's 4 lanes.
  HWY_ALIGN float scale4[4];
  const auto scales_of = [&](const float* HWY_RESTRICT sp, int64_t row) {
    for (int64_t c = 0; c < 4; ++c) scale4[c] = sp[c * row];
    const VC v = hn::LoadDup128(dc, scale4);
    return kKvLoadUnit<kKv> == 1.0f ? v : hn::Mul(v, hn::Set(dc, kKvLoadUnit<kKv>));
  };
  // The scores of the group of keys [j, j + 4) into out.
  const auto group_scores = [&](int64_t j, VC* out) {
    V4 s0, s1, s2, s3;
    FusedScores<kRows, kKv, kNanCodes>(d, qp, dk, rows.K(j), k_row, s0, s1, s2, s3);
    for (size_t i = 0; i < kParts; ++i) out[i] = ScoresPart(dc, i, s0, s1, s2, s3);
    if constexpr (kScaled) {
      const VC vks = scales_of(rows.KS(j), rows.ks_row);
      for (size_t i = 0; i < kParts; ++i) out[i] = hn::Mul(out[i], vks);
    }
  };
  load_maxima();
  for (size_t i = 0; i < kParts; ++i) vl[i] = hn::Zero(dc);
  VC sc[kParts];  // this group's scores
  if (nk >= 4) group_scores(0, sc);
  for (int64_t j = 0; j + 4 <= nk; j += 4) {
    if constexpr (!kNanCodes) {
      // Before anything of the group is used: its K rows (their scores are
      // in sc) and V rows.
      NanCodeMax(d8, rows.K(j), k_row, dk, codes, codes_tail);
      NanCodeMax(d8, rows.V(j), v_row, dv, codes, codes_tail);
      if (HWY_UNLIKELY(nan_code())) return false;
    }
    bool below = fast;
    for (size_t i = 0; i < kParts; ++i) below = below && hn::AllTrue(dc, hn::Le(sc[i], vm[i]));
    if (HWY_UNLIKELY(!below)) {
      fold_sums();
      for (size_t i = 0; i < kParts; ++i) hn::Store(sc[i], dc, buf + i * kLanes);
      FusedGroupMaxima<kRows>(d, buf, dv, m, l, o, mrep, msub);
      load_maxima();
      fast = true;
      for (int64_t r = 0; r < kRows; ++r) fast = fast && std::isfinite(m[r]);
    }
    VC vvs = hn::Zero(dc);  // V's scales (8-bit K/V)
    if constexpr (kScaled) vvs = scales_of(rows.VS(j), rows.vs_row);
    for (size_t i = 0; i < kParts; ++i) {
      const VC w = ExpNonPositive(dc, hn::Sub(sc[i], vsub[i]));
      hn::Store(kScaled ? hn::Mul(w, vvs) : w, dc, p + i * kLanes);
      vl[i] = hn::Add(vl[i], w);
    }
    // The next group's scores before this group's products, so that their
    // reduction overlaps the products.
    VC sn[kParts];
    if (j + 8 <= nk) {
      group_scores(j + 4, sn);
    } else {
      for (size_t i = 0; i < kParts; ++i) sn[i] = sc[i];
    }
    if (ahead > 0 && j + ahead + 4 <= nk) {
      PrefetchFusedGroup(rows.K(j + ahead), k_row, StorageRowBytes(kKv, dk),
                         rows.V(j + ahead), v_row, StorageRowBytes(kKv, dv));
    }
    ReloadFromMemory();  // the weights broadcast from p
    FusedValues<kRows, kKv, kNanCodes>(d, p, rows.V(j), v_row, dv, o);
    for (size_t i = 0; i < kParts; ++i) sc[i] = sn[i];
  }
  fold_sums();
  return true;
}

// DecodeFused for e4m3 K/V: without the test for NaN codes per value where
// the target converts through f16 (SIMDATTN_HW_F16), 5 ops per vector
// against 8, and where a NaN code turns up, again from a copy of m, l and o
// with the test. 1 thread, from memory, this way 15.4-15.9 ms against
// 17.4-17.8 ms with the test per value (two runs of 3 of
// paired/qf32kve4m3/B1_Hq32_Hkv8_Lq1_Lk65536_D128/bf16_vs_e4m3/threads:1).
template <int kRows, class D, class Rows>
HWY_INLINE void DecodeFusedE4M3(D d, const float* HWY_RESTRICT q, int64_t dk,
                                const Rows& rows, int64_t dv, int64_t nk, int64_t ahead,
                                float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                                float* HWY_RESTRICT o) {
#if SIMDATTN_HW_F16
  if (dv <= kFusedMaxDk) {
    HWY_ALIGN float saved[kRows * (2 + kFusedMaxDk)];
    std::copy(m, m + kRows, saved);
    std::copy(l, l + kRows, saved + kRows);
    std::copy(o, o + kRows * dv, saved + 2 * kRows);
    if (DecodeFused<kRows, Storage::kE4M3, false>(d, q, dk, rows, dv, nk, ahead, m, l, o)) {
      return;
    }
    std::copy(saved, saved + kRows, m);
    std::copy(saved + kRows, saved + 2 * kRows, l);
    std::copy(saved + 2 * kRows, saved + 2 * kRows + kRows * dv, o);
  }
#endif
  DecodeFused<kRows, Storage::kE4M3>(d, q, dk, rows, dv, nk, ahead, m, l, o);
}

// DecodeFused for kRows rows.
template <int kRows, Storage kKv, class D, class Rows>
HWY_INLINE void DecodeFusedFor(D d, const float* HWY_RESTRICT q, int64_t dk,
                               const Rows& rows, int64_t dv, int64_t nk, int64_t ahead,
                               float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                               float* HWY_RESTRICT o) {
  if constexpr (kKv == Storage::kE4M3) {
    DecodeFusedE4M3<kRows>(d, q, dk, rows, dv, nk, ahead, m, l, o);
  } else {
    DecodeFused<kRows, kKv>(d, q, dk, rows, dv, nk, ahead, m, l, o);
  }
}

// DecodeFused for `num_rows` (1-4) rows.
template <Storage kKv, class D, class Rows>
HWY_NOINLINE void DecodeFusedRows(D d, int64_t num_rows, const float* HWY_RESTRICT q,
                                  int64_t dk, const Rows& rows, int64_t dv, int64_t nk,
                                  int64_t ahead, float* HWY_RESTRICT m,
                                  float* HWY_RESTRICT l, float* HWY_RESTRICT o) {
  switch (num_rows) {
    case 4:
      DecodeFusedFor<4, kKv>(d, q, dk, rows, dv, nk, ahead, m, l, o);
      break;
    case 3:
      DecodeFusedFor<3, kKv>(d, q, dk, rows, dv, nk, ahead, m, l, o);
      break;
    case 2:
      DecodeFusedFor<2, kKv>(d, q, dk, rows, dv, nk, ahead, m, l, o);
      break;
    default:
      DecodeFusedFor<1, kKv>(d, q, dk, rows, dv, nk, ahead, m, l, o);
      break;
  }
}

#endif  // SIMDATTN_HAVE_DECODE_FUSED

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_DECODE_FUSED_INL_H_
