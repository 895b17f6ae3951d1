// The bf16 products on Intel AMX tiles (the AVX3_AMX entry): K and V packed
// for the tiles, S^T = K·Qᵀ and O^T += Vᵀ·P^T with tdpbf16ps, between them
// the tiled kernel's softmax and options on AVX-512. Per-target code: only
// the AVX3 pass builds it (include from a foreach_target TU).

#if defined(SIMDATTN_LIB_KERNELS_AMX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_AMX_INL_H_
#undef SIMDATTN_LIB_KERNELS_AMX_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_AMX_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "hwy/highway.h"
#include "lib/kernels/amx_tiles.h"
#include "lib/kernels/block-inl.h"
#include "lib/kernels/pack_bf16-inl.h"
#include "lib/kernels/tile_gemm-inl.h"

// 1 in the pass that builds the AMX products: AVX3 with the native bf16
// products (the same CPU check), x86-64.
#undef SIMDATTN_AMX
#if SIMDATTN_NATIVE_BF16 && defined(__x86_64__)
#define SIMDATTN_AMX 1
#else
#define SIMDATTN_AMX 0
#endif

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if SIMDATTN_AMX

// The tile instructions need their own target; the emulator runs anywhere.
#define SIMDATTN_AMX_TARGET __attribute__((target("avx2,bmi,bmi2,fma,f16c,avx512f,avx512vl,avx512dq,avx512bw,amx-tile,amx-bf16")))

// The packed K/V of one group for the tiles (AmxPackedGroupFloats floats):
//   K:  [keys][Dk32] bf16, key rows padded with zero head dims;
//   Vᵀ: [Dv32][keys] bf16 right after, value dims along keys.
// keys = AmxPackedKeys(): the group's keys and zeros after them, so that a
// tile of 32 keys starting at any valid key stays inside.
struct AmxPackedKv {
  const uint16_t* k = nullptr;
  const uint16_t* vt = nullptr;
  int64_t keys = 0, dk32 = 0, dv32 = 0;

  AmxPackedKv() = default;
  AmxPackedKv(const AttentionArgs& a, const float* group) {
    keys = AmxPackedKeys(a);
    dk32 = RoundUpTo(a.head_dim_qk, 32);
    dv32 = RoundUpTo(a.head_dim_v, 32);
    k = reinterpret_cast<const uint16_t*>(group);
    vt = k + keys * dk32;
  }
};

// dst[c * dst_stride + r] = rows[r][c] for r < 16 and c < cols, in u32
// units: 16 x 16 blocks through Transpose16x16, the last columns one by one.
inline void Transpose16Rows(const uint32_t* const* rows, int64_t cols,
                            uint32_t* HWY_RESTRICT dst, int64_t dst_stride) {
  const hn::Full512<float> d16;
  int64_t c = 0;
  for (; c + 16 <= cols; c += 16) {
    hn::Vec<decltype(d16)> v[16];
    for (int r = 0; r < 16; ++r) {
      v[r] = hn::LoadU(d16, reinterpret_cast<const float*>(rows[r] + c));
    }
    Transpose16x16(v);  // v[k]: column c + k of the 16 rows
    for (int k = 0; k < 16; ++k) {
      hn::StoreU(v[k], d16, reinterpret_cast<float*>(dst + (c + k) * dst_stride));
    }
  }
  for (; c < cols; ++c) {
    for (int r = 0; r < 16; ++r) dst[c * dst_stride + r] = rows[r][c];
  }
}

SIMDATTN_AMX_TARGET HWY_NOINLINE inline void AmxConfigureHw() {
  amx::HardwareTiles::Configure();
}
SIMDATTN_AMX_TARGET HWY_NOINLINE inline void AmxReleaseHw() {
  amx::HardwareTiles::Release();
}

// The tile configuration of a task (AmxScoresImpl and AmxValuesImpl run
// between these two: every tile is 16 rows of 64 bytes).
template <class Tiles>
HWY_INLINE void AmxConfigure() {
  if constexpr (std::is_same_v<Tiles, amx::HardwareTiles>) AmxConfigureHw();
}
template <class Tiles>
HWY_INLINE void AmxRelease() {
  if constexpr (std::is_same_v<Tiles, amx::HardwareTiles>) AmxReleaseHw();
}

// Whether the softmax may scale the tile products' raw scores itself
// (SoftmaxTile's `scale`) instead of a pass over them: no score option
// comes between (causal and window cuts set -inf, which a positive scale
// keeps).
HWY_INLINE bool FoldScoreScale(const AttentionArgs& a) {
  return a.scale > 0.0f && a.softcap == 0.0f && a.alibi_slopes == nullptr &&
         a.mask_kind == MaskKind::kNone;
}

// x as bf16 (round to nearest even, NaN kept quiet) in the low 16 bits.
template <class D, class V = hn::VFromD<D>>
HWY_INLINE hn::VFromD<hn::RebindToUnsigned<D>> RoundToBf16(D d, V x) {
  const hn::RebindToUnsigned<D> du;
  const auto u = hn::BitCast(du, x);
  const auto odd = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  const auto rounded = hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du, 0x7FFFu), odd)));
  const auto quiet = hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x40u));
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(x)), quiet, rounded);
}

// n values of a row stored as `type`, as bf16 (round to nearest even) in
// dst: copied when bf16, widened first when f16 (n <= kAmxMaxRow).
constexpr int64_t kAmxMaxRow = 1024;
inline void RowToBf16(Storage type, const void* row, int64_t n,
                      uint16_t* HWY_RESTRICT dst) {
  if (type == Storage::kBF16) {
    std::memcpy(dst, row, static_cast<size_t>(n) * 2);
    return;
  }
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const hn::Rebind<uint16_t, decltype(d)> d16;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  HWY_ALIGN float wide[kAmxMaxRow];
  const float* f = static_cast<const float*>(row);
  if (type == Storage::kF16) {
    WidenRow(d, static_cast<const uint16_t*>(row), type, n, wide);
    f = wide;
  }
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto bits = hn::BitCast(di, RoundToBf16(d, hn::LoadU(d, f + i)));
    hn::StoreU(hn::DemoteTo(d16, bits), d16, dst + i);
  }
  for (; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, f + i, 4);
    dst[i] = std::isnan(f[i]) ? static_cast<uint16_t>((u >> 16) | 0x40)
                              : static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
  }
}

// Whether rows [first, first + nk) of V stay finite once rounded to bf16:
// bf16 and f16 values when finite, f32 ones below the first that rounds to
// infinity (0x7F7F8000).
inline bool ValuesFiniteAsBf16(const AttentionArgs& a, const KvRows& src,
                               int64_t first, int64_t nk) {
  if (src.v_type == Storage::kBF16) return Bf16ValuesFinite(a, src, first, nk);
  const int64_t dv = a.head_dim_v;
  for (int64_t j = first; j < first + nk; ++j) {
    const char* row = src.VRow(j);
    for (int64_t e = 0; e < dv; ++e) {
      if (src.v_type == Storage::kF16) {
        uint16_t h;
        std::memcpy(&h, row + 2 * e, 2);
        if ((h & 0x7C00) == 0x7C00) return false;
      } else {
        uint32_t u;
        std::memcpy(&u, row + 4 * e, 4);
        if ((u & 0x7FFFFFFFu) >= 0x7F7F8000u) return false;
      }
    }
  }
  return true;
}

// Rows [first, first + n) of V as f32 rows of dv floats in dst.
template <class D>
HWY_INLINE void ValueRowsF32(D d, const AttentionArgs& a, const KvRows& src,
                             int64_t first, int64_t n, float* HWY_RESTRICT dst) {
  WidenKvRows(d, src, true, first, n, a.head_dim_v, dst);
}

// Packs group `group` in AmxPackedKv's layout into dst. Vᵀ goes 32 keys at
// a time: pairs of keys along the value dims (PairValueRows, into scratch:
// 16 x Dv u32), then transposed, so that a row of Vᵀ holds consecutive keys.
inline void PackKvAmx(const AttentionArgs& a, int64_t group,
                      float* HWY_RESTRICT dst, float* HWY_RESTRICT scratch) {
  const int64_t b = group / a.kv_heads;
  const int64_t hkv = group % a.kv_heads;
  const int64_t n = a.kv_lengths != nullptr ? a.kv_lengths[b] : a.kv_len;
  const AmxPackedKv p(a, dst);
  uint16_t* k = const_cast<uint16_t*>(p.k);
  uint32_t* vt = reinterpret_cast<uint32_t*>(const_cast<uint16_t*>(p.vt));
  const KvRows src(a, b, hkv);
  const int64_t dk = a.head_dim_qk, dv = a.head_dim_v;
  std::memset(k, 0, static_cast<size_t>((p.keys * p.dk32 + p.dv32 * p.keys) * 2));
  for (int64_t j = 0; j < n; ++j) RowToBf16(src.k_type, src.KRow(j), dk, k + j * p.dk32);
  uint32_t* pairs = reinterpret_cast<uint32_t*>(scratch);
  uint16_t* rows16 = reinterpret_cast<uint16_t*>(pairs + 16 * dv);  // 32 x Dv
  const uint32_t* rows[16];
  for (int64_t j0 = 0; j0 < n; j0 += 32) {
    const int64_t nk = std::min<int64_t>(32, n - j0);
    if (src.v_type == Storage::kBF16) {
      PairValueRuns(src, j0, nk, dv, pairs);
    } else {  // rounded to bf16 first (ExecutionOptions::allow_bf16_compute)
      for (int64_t r = 0; r < nk; ++r) RowToBf16(src.v_type, src.VRow(j0 + r), dv, rows16 + r * dv);
      PairValueRows(rows16, dv, nk, dv, pairs);
    }
    const int64_t np = (nk + 1) / 2;
    std::fill(pairs + np * dv, pairs + 16 * dv, 0u);
    for (int r = 0; r < 16; ++r) rows[r] = pairs + r * dv;
    Transpose16Rows(rows, dv, vt + j0 / 2, p.keys / 2);
  }
}

// S^T[j][q] = sum_i K[k0 + j][i] Q[q][i] for keys j < 32 * key_blocks and
// the block's mq queries (a multiple of 32): 2 x 2 accumulator tiles of
// 32 keys x 32 queries, Dk32 / 32 steps each. qt2 holds the queries as
// pairs of head dims ([Dk32 / 2][mq] u32).
template <class Tiles>
HWY_INLINE void AmxScoresImpl(const AmxPackedKv& p, int64_t k0,
                              int64_t key_blocks, const uint32_t* qt2,
                              int64_t mq, float* st) {
  const int64_t k_stride = p.dk32 * 2, q_stride = mq * 4, s_stride = mq * 4;
  for (int64_t kb = 0; kb < key_blocks * 32; kb += 32) {
    const uint16_t* k = p.k + (k0 + kb) * p.dk32;
    for (int64_t qb = 0; qb < mq; qb += 32) {
      Tiles::template Zero<0>();
      Tiles::template Zero<1>();
      Tiles::template Zero<2>();
      Tiles::template Zero<3>();
      for (int64_t i = 0; i < p.dk32; i += 32) {
        Tiles::template Load<4>(k + i, k_stride);
        Tiles::template Load<5>(k + 16 * p.dk32 + i, k_stride);
        Tiles::template Load<6>(qt2 + (i / 2) * mq + qb, q_stride);
        Tiles::template Load<7>(qt2 + (i / 2) * mq + qb + 16, q_stride);
        Tiles::template Dot<0>();
        Tiles::template Dot<1>();
        Tiles::template Dot<2>();
        Tiles::template Dot<3>();
      }
      float* s = st + kb * mq + qb;
      Tiles::template Store<0>(s, s_stride);
      Tiles::template Store<1>(s + 16, s_stride);
      Tiles::template Store<2>(s + 16 * mq, s_stride);
      Tiles::template Store<3>(s + 16 * mq + 16, s_stride);
    }
  }
}

// O^T[e][q] += sum_j Vᵀ[e][k0 + j] P[j][q] for value dims e < Dv32 and keys
// j < 32 * key_blocks: 2 x 2 accumulator tiles of 32 dims x 32 queries,
// loaded from and stored back to acc ([Dv32][mq]). pairs holds P as pairs
// of keys ([16 * key_blocks][mq] u32).
template <class Tiles>
HWY_INLINE void AmxValuesImpl(const AmxPackedKv& p, int64_t k0,
                              int64_t key_blocks, const uint32_t* pairs,
                              int64_t mq, float* acc) {
  const int64_t v_stride = p.keys * 2, q_stride = mq * 4;
  for (int64_t eb = 0; eb < p.dv32; eb += 32) {
    const uint16_t* v = p.vt + eb * p.keys + k0;
    for (int64_t qb = 0; qb < mq; qb += 32) {
      float* o = acc + eb * mq + qb;
      Tiles::template Load<0>(o, q_stride);
      Tiles::template Load<1>(o + 16, q_stride);
      Tiles::template Load<2>(o + 16 * mq, q_stride);
      Tiles::template Load<3>(o + 16 * mq + 16, q_stride);
      for (int64_t j = 0; j < key_blocks * 32; j += 32) {
        Tiles::template Load<4>(v + j, v_stride);
        Tiles::template Load<5>(v + 16 * p.keys + j, v_stride);
        Tiles::template Load<6>(pairs + (j / 2) * mq + qb, q_stride);
        Tiles::template Load<7>(pairs + (j / 2) * mq + qb + 16, q_stride);
        Tiles::template Dot<0>();
        Tiles::template Dot<1>();
        Tiles::template Dot<2>();
        Tiles::template Dot<3>();
      }
      Tiles::template Store<0>(o, q_stride);
      Tiles::template Store<1>(o + 16, q_stride);
      Tiles::template Store<2>(o + 16 * mq, q_stride);
      Tiles::template Store<3>(o + 16 * mq + 16, q_stride);
    }
  }
}


SIMDATTN_AMX_TARGET HWY_NOINLINE inline void AmxScoresHw(
    const AmxPackedKv& p, int64_t k0, int64_t key_blocks, const uint32_t* qt2,
    int64_t mq, float* st) {
  AmxScoresImpl<amx::HardwareTiles>(p, k0, key_blocks, qt2, mq, st);
}
SIMDATTN_AMX_TARGET HWY_NOINLINE inline void AmxValuesHw(
    const AmxPackedKv& p, int64_t k0, int64_t key_blocks, const uint32_t* pairs,
    int64_t mq, float* acc) {
  AmxValuesImpl<amx::HardwareTiles>(p, k0, key_blocks, pairs, mq, acc);
}

// Weights P (rows j < nk of the transposed tile st) as bf16 pairs of keys,
// in place: pair row p (u32 [mq]) holds keys 2p (low half) and 2p + 1; rows
// up to `pair_rows` past the tile's keys are zeros.
template <class D>
HWY_INLINE void WeightsToPairs(D d, float* HWY_RESTRICT st, int64_t nk,
                               int64_t pair_rows, int64_t mq) {
  const hn::RebindToUnsigned<D> du;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  uint32_t* pairs = reinterpret_cast<uint32_t*>(st);
  for (int64_t p = 0; p < pair_rows; ++p) {
    const bool has_lo = 2 * p < nk, has_hi = 2 * p + 1 < nk;
    for (int64_t q = 0; q < mq; q += N) {
      const auto lo = has_lo ? RoundToBf16(d, hn::Load(d, st + 2 * p * mq + q)) : hn::Zero(du);
      const auto hi = has_hi ? RoundToBf16(d, hn::Load(d, st + (2 * p + 1) * mq + q))
                             : hn::Zero(du);
      hn::Store(hn::Or(lo, hn::ShiftLeft<16>(hi)), du, pairs + p * mq + q);
    }
  }
}

// The AMX products of the tiled kernel (prefill-inl.h's TileLoop policy),
// on the group's packed K/V; Tiles is amx::HardwareTiles or EmulatedTiles.
// The queries go as pairs of head dims, unscaled (scores are scaled in f32
// afterwards), P is rounded to bf16 for P·V as on the AVX3_BF16 entry.
template <class Tiles>
struct AmxProducts {
  // Keys per tile: each tile loads and stores the O^T accumulators once, so
  // longer tiles spend less of the products' time on them.
  static constexpr int64_t kKeys = 128;
  static_assert(kKeys <= kMaxKeyTile, "scratch");
  const AttentionArgs& a;
  const KvRows& src;
  const AmxPackedKv& packed;
  const TileScratch& s;
  int64_t kv_valid;
  bool fold_scale;  // FoldScoreScale: the softmax scales the scores

  float ScoreScale() const { return fold_scale ? a.scale : 1.0f; }

  uint32_t* qt2() const { return reinterpret_cast<uint32_t*>(s.qt); }

  // qt2[p][r]: head dims 2p, 2p + 1 of row r's query, zero past Dk: whole
  // pairs 16 rows at a time through Transpose16Rows, the rest one by one.
  void PackQueries(int64_t b, const RowTable& rt) {
    const int64_t dk = a.head_dim_qk, whole = dk / 32 * 16;
    std::fill(qt2(), qt2() + packed.dk32 / 2 * s.mq, 0u);
    const uint32_t* rows[16];
    // Q stored in another type is rounded to bf16 rows in ktile first.
    uint16_t* q16 = reinterpret_cast<uint16_t*>(s.ktile);
    const int64_t q_size = a.q_type == Storage::kF32 ? 4 : 2;
    for (int64_t r0 = 0; r0 < s.mq; r0 += 16) {
      for (int t = 0; t < 16; ++t) {
        const int64_t r = r0 + t;
        const char* q = static_cast<const char*>(a.q) +
                        (b * a.q_strides[0] + rt.head[r] * a.q_strides[1] +
                         rt.query[r] * a.q_strides[2]) * q_size;
        if (a.q_type != Storage::kBF16) {
          RowToBf16(a.q_type, q, dk, q16 + t * packed.dk32);
          q = reinterpret_cast<const char*>(q16 + t * packed.dk32);
        }
        rows[t] = reinterpret_cast<const uint32_t*>(q);
      }
      Transpose16Rows(rows, whole, qt2() + r0, s.mq);
      for (int t = 0; t < 16; ++t) {
        const uint16_t* q = reinterpret_cast<const uint16_t*>(rows[t]);
        for (int64_t i = 2 * whole; i < dk; ++i) {
          qt2()[(i / 2) * s.mq + r0 + t] |= static_cast<uint32_t>(q[i]) << (16 * (i % 2));
        }
      }
    }
  }
  void Load(int64_t, int64_t, int64_t) {}
  void Scores(int64_t kv_begin, int64_t nk) const {
    const hn::ScalableTag<float> d;
    const int64_t blocks = (nk + 31) / 32;
    if constexpr (std::is_same_v<Tiles, amx::HardwareTiles>) {
      AmxScoresHw(packed, kv_begin, blocks, qt2(), s.mq, s.st);
    } else {
      AmxScoresImpl<Tiles>(packed, kv_begin, blocks, qt2(), s.mq, s.st);
    }
    if (fold_scale) return;
    const auto scale = hn::Set(d, a.scale);
    const int64_t N = static_cast<int64_t>(hn::Lanes(d));
    for (int64_t i = 0; i < nk * s.mq; i += N) {
      hn::Store(hn::Mul(hn::Load(d, s.st + i), scale), d, s.st + i);
    }
  }
  void Values(int64_t kv_begin, int64_t nk, const float* scale,
              bool may_hide) const {
    const hn::ScalableTag<float> d;
    const int64_t blocks = (nk + 31) / 32;
    // Keys the tiles read past the tile's own (zero weights) and hidden keys
    // (+0.0 weights) would turn Inf/NaN of their V rows into NaN: such tiles
    // take the guarded f32 product instead.
    const int64_t read = std::min(blocks * 32, kv_valid - kv_begin);
    if ((may_hide || read > nk) && !ValuesFiniteAsBf16(a, src, kv_begin, read)) {
      const int64_t dv = a.head_dim_v;
      ValueRowsF32(d, a, src, kv_begin, nk, s.vtile);
      TileGemmRows<true, true>(d, s.cols, dv, s.vtile, 1, dv, s.st, s.mq, nk,
                               scale, s.acc, s.mq);
      return;
    }
    if (scale != nullptr) {  // O^T rows rescaled by alpha (per query lane)
      const int64_t N = static_cast<int64_t>(hn::Lanes(d));
      for (int64_t e = 0; e < a.head_dim_v; ++e) {
        float* row = s.acc + e * s.mq;
        for (int64_t q = 0; q < s.mq; q += N) {
          hn::Store(hn::Mul(hn::Load(d, row + q), hn::Load(d, scale + q)), d, row + q);
        }
      }
    }
    if constexpr (std::is_same_v<Tiles, amx::HardwareTiles>) {
      // vcvtne2ps2bf16 (every AMX CPU has AVX512_BF16), then zero pairs.
      WeightsToBf16Pairs(s.st, nk, s.mq);
      uint32_t* p = reinterpret_cast<uint32_t*>(s.st);
      std::fill(p + (nk + 1) / 2 * s.mq, p + blocks * 16 * s.mq, 0u);
    } else {
      WeightsToPairs(d, s.st, nk, blocks * 16, s.mq);
    }
    const uint32_t* pairs = reinterpret_cast<const uint32_t*>(s.st);
    if constexpr (std::is_same_v<Tiles, amx::HardwareTiles>) {
      AmxValuesHw(packed, kv_begin, blocks, pairs, s.mq, s.acc);
    } else {
      AmxValuesImpl<Tiles>(packed, kv_begin, blocks, pairs, s.mq, s.acc);
    }
  }
};

#endif  // SIMDATTN_AMX

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_AMX_INL_H_
