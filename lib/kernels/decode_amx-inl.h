// Decode on the AMX tiles (the AVX3_AMX entry): a decode task of more rows
// than the fused loop takes (5 to 32: GQA groups of 8, speculative decoding
// with a group of 4) runs its keys 32 at a time with both products on the
// tiles, K and V read where they are stored. Per-target code: only the AVX3
// pass builds it (include from a foreach_target TU, after amx-inl.h).

#if defined(SIMDATTN_LIB_KERNELS_DECODE_AMX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_DECODE_AMX_INL_H_
#undef SIMDATTN_LIB_KERNELS_DECODE_AMX_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_DECODE_AMX_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "hwy/highway.h"
#include "lib/kernels/amx-inl.h"
#include "lib/kernels/bf16_dot-inl.h"
#include "lib/kernels/decode_task-inl.h"
#include "lib/kernels/exp-inl.h"
#include "lib/kernels/tile_gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if SIMDATTN_AMX

// Rows of a task that go to the tiles: more than the fused loop's 4 (where
// it applies it reads memory as fast as the tiles would), at most two
// tiles' 32 (two halves of 16 rows).
constexpr int64_t kAmxDecodeMinRows = 5;
constexpr int64_t kAmxDecodeMaxRows = 32;
// Keys per step: one tile row of bf16 pairs for P·V.
constexpr int64_t kAmxDecodeKeys = 32;

// S^T of 32 keys for `halves` halves of 16 rows: st + 512 h holds half h's
// [key][row] (f32, 2 x 16 tile rows) = the keys' K rows (bf16; the first 16
// from k0, the others from k1, each `k_row` bytes apart) times the half's
// queries as pairs of head dims (qt + 8 dk h, [dk / 2][16] u32). Tiles:
// A4/A5 the two runs of K rows, B6/B7 the halves' queries, C0/C2 half 0's
// scores of the two runs, C1/C3 half 1's.
template <class Tiles>
HWY_INLINE void AmxDecodeScoresImpl(const char* k0, const char* k1, int64_t k_row, int64_t dk,
                                    int halves, const uint32_t* qt, float* st) {
  const uint32_t* qt1 = qt + dk * 8;
  Tiles::template Zero<0>();
  Tiles::template Zero<2>();
  if (halves == 2) {
    Tiles::template Zero<1>();
    Tiles::template Zero<3>();
  }
  for (int64_t i = 0; i < dk; i += 32) {
    Tiles::template Load<4>(k0 + 2 * i, k_row);
    Tiles::template Load<5>(k1 + 2 * i, k_row);
    Tiles::template Load<6>(qt + i / 2 * 16, 64);
    Tiles::template Dot<0>();
    Tiles::template Dot<2>();
    if (halves == 2) {
      Tiles::template Load<7>(qt1 + i / 2 * 16, 64);
      Tiles::template Dot<1>();
      Tiles::template Dot<3>();
    }
  }
  Tiles::template Store<0>(st, 64);
  Tiles::template Store<2>(st + 16 * 16, 64);
  if (halves == 2) {
    Tiles::template Store<1>(st + 32 * 16, 64);
    Tiles::template Store<3>(st + 48 * 16, 64);
  }
}

// o[row][e] += sum over the 32 keys of P[row][key] V[key][e] for `halves`
// halves of 16 rows: pt + 256 h holds half h's P as pairs of keys ([16
// rows][16] u32), vp V as pairs of rows ([16][dv] u32, PairValueRows), o is
// [32][dv] f32. Tiles: A4/A5 the halves' P, B6/B7 two 16-dim slices of V,
// C0/C1 half 0's o in those slices, C2/C3 half 1's.
template <class Tiles>
HWY_INLINE void AmxDecodeValuesImpl(const uint32_t* pt, const uint32_t* vp, int64_t dv,
                                    int halves, float* o) {
  const int64_t stride = dv * 4;
  float* o1 = o + 16 * dv;
  Tiles::template Load<4>(pt, 64);
  if (halves == 2) Tiles::template Load<5>(pt + 16 * 16, 64);
  for (int64_t e = 0; e < dv; e += 32) {
    Tiles::template Load<0>(o + e, stride);
    Tiles::template Load<1>(o + e + 16, stride);
    Tiles::template Load<6>(vp + e, stride);
    Tiles::template Load<7>(vp + e + 16, stride);
    Tiles::template Dot<0>();
    Tiles::template Dot<1>();
    if (halves == 2) {
      Tiles::template Load<2>(o1 + e, stride);
      Tiles::template Load<3>(o1 + e + 16, stride);
      Tiles::template Dot<2>();
      Tiles::template Dot<3>();
      Tiles::template Store<2>(o1 + e, stride);
      Tiles::template Store<3>(o1 + e + 16, stride);
    }
    Tiles::template Store<0>(o + e, stride);
    Tiles::template Store<1>(o + e + 16, stride);
  }
}

SIMDATTN_AMX_TARGET HWY_NOINLINE inline void AmxDecodeScoresHw(const char* k0, const char* k1,
                                                              int64_t k_row, int64_t dk,
                                                              int halves, const uint32_t* qt,
                                                              float* st) {
  AmxDecodeScoresImpl<amx::HardwareTiles>(k0, k1, k_row, dk, halves, qt, st);
}
SIMDATTN_AMX_TARGET HWY_NOINLINE inline void AmxDecodeValuesHw(const uint32_t* pt,
                                                              const uint32_t* vp, int64_t dv,
                                                              int halves, float* o) {
  AmxDecodeValuesImpl<amx::HardwareTiles>(pt, vp, dv, halves, o);
}

// A decode task's keys on the tiles (DecodeTask's `leading`): Tiles is
// amx::HardwareTiles or amx::EmulatedTiles.
template <class Tiles>
struct AmxDecodeKeys {
  static constexpr bool kHardware = std::is_same_v<Tiles, amx::HardwareTiles>;
  using D = hn::Full512<float>;
  using V = hn::Vec<D>;

  static void Scores(const char* k0, const char* k1, int64_t k_row, int64_t dk, int halves,
                     const uint32_t* qt, float* st) {
    if constexpr (kHardware) {
      AmxDecodeScoresHw(k0, k1, k_row, dk, halves, qt, st);
    } else {
      AmxDecodeScoresImpl<Tiles>(k0, k1, k_row, dk, halves, qt, st);
    }
  }
  static void Values(const uint32_t* pt, const uint32_t* vp, int64_t dv, int halves,
                     float* o) {
    if constexpr (kHardware) {
      AmxDecodeValuesHw(pt, vp, dv, halves, o);
    } else {
      AmxDecodeValuesImpl<Tiles>(pt, vp, dv, halves, o);
    }
  }

  // One half's online-softmax step on its scores st ([32 keys][16 rows],
  // times scale; mx their maximum per row): m and l of its `rows` rows
  // along the lanes, its rows of o ([rows][dv]) scaled where the maximum
  // rose; its weights rounded to bf16 and stored as pairs of keys per row in
  // pt ([16][16] u32; rows past `rows` untouched).
  static void Softmax(const float* st, V scale, V mx, int64_t rows, int64_t dv, V& vm,
                      V& vl, float* o, uint32_t* pt) {
    const D d;
    const hn::RebindToUnsigned<D> du;
    const V m_new = hn::Max(vm, mx);
    if (!hn::AllTrue(d, hn::Eq(m_new, vm))) {
      const V alpha = ExpNonPositive(d, hn::Sub(vm, m_new));
      vl = hn::Mul(vl, alpha);
      HWY_ALIGN float al[16];
      hn::Store(alpha, d, al);
      for (int64_t i = 0; i < rows; ++i) {
        if (al[i] == 1.0f) continue;
        const V ai = hn::Set(d, al[i]);
        float* row = o + i * dv;
        for (int64_t e = 0; e < dv; e += 16) {
          hn::Store(hn::Mul(ai, hn::Load(d, row + e)), d, row + e);
        }
      }
      vm = m_new;
    }
    V pairs[16];
    for (int64_t c = 0; c < kAmxDecodeKeys; c += 2) {
      const V p0 = ExpNonPositive(d, hn::Sub(hn::Mul(hn::Load(d, st + c * 16), scale), vm));
      const V p1 =
          ExpNonPositive(d, hn::Sub(hn::Mul(hn::Load(d, st + (c + 1) * 16), scale), vm));
      vl = hn::Add(vl, hn::Add(p0, p1));
      pairs[c / 2] =
          hn::BitCast(d, hn::Or(RoundToBf16(d, p0), hn::ShiftLeft<16>(RoundToBf16(d, p1))));
    }
    Transpose16x16(pairs);  // pairs[i]: row i's 16 pairs of keys
    for (int64_t i = 0; i < rows; ++i) hn::Store(hn::BitCast(du, pairs[i]), du, pt + i * 16);
  }

  // Keys [kv_start, kv_end) of the task's r.rows rows (r.m, r.l and r.o as
  // the decode path keeps them; no options, every key visible to every
  // row), 32 at a time while 32 remain: S^T = K·Qᵀ on the tiles, scaled by
  // a.scale in f32, the online softmax in f32 with the rows along the
  // lanes, P rounded to bf16 (as on the tiled path) and o += P·V on the
  // tiles. A step whose scores are not all finite (NaN or Inf in Q or K),
  // a step whose halves are not each in one run of rows (pages), and the
  // last keys, are left to the decode path's exact handling.
  // Returns the first key not done. Scratch: r.ktile and r.vtile.
  int64_t operator()(const AttentionArgs& a, const KvRows& src, const RowTable& rt,
                     int64_t b, const DecodeRows& r, int64_t kv_start,
                     int64_t kv_end) const {
    const int64_t rows = r.rows;
    if (kv_end - kv_start < kAmxDecodeKeys || rows < kAmxDecodeMinRows ||
        rows > kAmxDecodeMaxRows || !AmxDecodeInputs(a)) {
      return kv_start;
    }
    const D d;
    const int64_t dk = a.head_dim_qk, dv = a.head_dim_v;
    const int halves = rows > 16 ? 2 : 1;
    uint32_t* qt = reinterpret_cast<uint32_t*>(r.ktile);       // [2][dk / 2][16]
    float* st = r.ktile + dk * 16;                               // [2][32][16]
    uint32_t* pt = reinterpret_cast<uint32_t*>(st + 64 * 16);   // [2][16][16]
    uint16_t* q16 = reinterpret_cast<uint16_t*>(pt + 32 * 16);  // [dk]
    uint32_t* vp = reinterpret_cast<uint32_t*>(r.vtile);       // [16][dv]
    float* o = r.vtile + 16 * dv;                                // [32][dv]
    std::fill(qt, qt + dk * 16, 0u);
    const int64_t q_size = a.q_type == Storage::kF32 ? 4 : 2;
    for (int64_t i = 0; i < rows; ++i) {
      const char* q = static_cast<const char*>(a.q) +
                      (b * a.q_strides[0] + rt.head[i] * a.q_strides[1] +
                       rt.query[i] * a.q_strides[2]) * q_size;
      RowToBf16(a.q_type, q, dk, q16);
      uint32_t* col = qt + i / 16 * dk * 8 + i % 16;
      for (int64_t e = 0; e < dk; ++e) {
        col[e / 2 * 16] |= static_cast<uint32_t>(q16[e]) << (16 * (e % 2));
      }
    }
    std::fill(pt, pt + 32 * 16, 0u);  // rows past `rows` stay zero
    std::copy(r.o, r.o + rows * dv, o);
    std::fill(o + rows * dv, o + 32 * dv, 0.0f);
    // Each half's m and l along the lanes; lanes past `rows` see scores of 0.
    HWY_ALIGN float ml[2][2][16] = {};
    for (int64_t i = 0; i < rows; ++i) {
      ml[i / 16][0][i % 16] = r.m[i];
      ml[i / 16][1][i % 16] = r.l[i];
    }
    V vm[2], vl[2];
    for (int h = 0; h < 2; ++h) vm[h] = hn::Load(d, ml[h][0]), vl[h] = hn::Load(d, ml[h][1]);
    const V scale = hn::Set(d, a.scale);
    const int64_t v_row = src.v_row / 2;
    AmxConfigure<Tiles>();
    int64_t j = kv_start;
    for (; j + kAmxDecodeKeys <= kv_end; j += kAmxDecodeKeys) {
      // Each run of 16 keys in one run of rows one stride apart (a page
      // holds whole runs when its size is a multiple of 16).
      if (src.RunEnd(j) < j + 16 || src.RunEnd(j + 16) < j + 32) break;
      Scores(src.KRow(j), src.KRow(j + 16), src.k_row, dk, halves, qt, st);
      // Each half's maxima, and whether every score is finite, before any
      // state changes.
      V mx[2];
      V nonfinite = hn::Zero(d);  // x - x: NaN where x is Inf or NaN
      for (int h = 0; h < halves; ++h) {
        mx[h] = hn::Set(d, -std::numeric_limits<float>::infinity());
        for (int64_t c = 0; c < kAmxDecodeKeys; ++c) {
          const V x = hn::Mul(hn::Load(d, st + (32 * h + c) * 16), scale);
          mx[h] = hn::Max(mx[h], x);
          nonfinite = hn::Add(nonfinite, hn::Sub(x, x));
        }
      }
      if (!hn::AllFalse(d, hn::IsNaN(nonfinite))) break;
      for (int h = 0; h < halves; ++h) {
        Softmax(st + 512 * h, scale, mx[h], std::min<int64_t>(16, rows - 16 * h), dv, vm[h],
                vl[h], o + 16 * h * dv, pt + 256 * h);
      }
      for (int64_t h = 0; h < 2; ++h) {
        PairValueRows(reinterpret_cast<const uint16_t*>(src.VRow(j + 16 * h)), v_row, 16, dv,
                      vp + 8 * h * dv);
      }
      Values(pt, vp, dv, halves, o);
    }
    AmxRelease<Tiles>();
    for (int h = 0; h < 2; ++h) hn::Store(vm[h], d, ml[h][0]), hn::Store(vl[h], d, ml[h][1]);
    for (int64_t i = 0; i < rows; ++i) {
      r.m[i] = ml[i / 16][0][i % 16];
      r.l[i] = ml[i / 16][1][i % 16];
    }
    std::copy(o, o + rows * dv, r.o);
    return j;
  }
};

#endif  // SIMDATTN_AMX

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_DECODE_AMX_INL_H_
