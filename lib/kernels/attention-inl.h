// Fused prefill attention for one query block (f32): packs the block, streams
// K/V tiles through the QK tile, online softmax and PV tile, and writes its
// rows of O and LSE. Per-target code (include from a foreach_target TU).

#if defined(SIMDATTN_LIB_KERNELS_ATTENTION_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_ATTENTION_INL_H_
#undef SIMDATTN_LIB_KERNELS_ATTENTION_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_ATTENTION_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "hwy/highway.h"
#include "lib/kernels/convert-inl.h"
#include "lib/kernels/kernels.h"
#include "lib/kernels/online_softmax-inl.h"
#include "lib/kernels/score_mods-inl.h"
#include "lib/kernels/tile_gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Both products run on TileGemm with the block's queries along the lanes:
//   S^T[j][q]  = sum_i K[j][i] * Qt[i][q]      (Qt packed, K broadcast)
//   O^T[e][q] += sum_j V[j][e] * P^T[j][q]     (P^T in place, V broadcast)
// so K and V are read straight from the caller's memory, the softmax needs
// only vertical max/add, and rescaling O by alpha is a per-lane multiply.
//
// Keys per K/V tile. With a 32-query block (AVX-512) the score tile is
// 64 x 32 floats = 8 KiB and stays in L1D while every row group of the P·V
// product re-reads it; the packed block Qt is Dk x 32 floats (16 KiB at
// Dk = 128) and O^T is Dv x 32 floats.
constexpr int64_t kKeyTile = 64;
// Scratch regions start on this many floats (256 bytes: one SVE-2048 vector).
constexpr int64_t kScratchAlign = 64;

inline int64_t RoundUpTo(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Query rows per task: kTileCols vectors of queries along the lanes.
inline int64_t QueryBlockRowsImpl() {
  const hn::ScalableTag<float> d;
  return static_cast<int64_t>(kTileCols * hn::Lanes(d));
}

// Scratch layout of one task (floats, each region kScratchAlign-aligned).
struct ScratchLayout {
  int64_t qt, st, acc, m, l, alpha, ktile, vtile, total;
};

inline ScratchLayout MakeLayout(int64_t head_dim_qk, int64_t head_dim_v) {
  const int64_t mq = QueryBlockRowsImpl();
  ScratchLayout s;
  int64_t at = 0;
  auto take = [&at](int64_t floats) {
    const int64_t start = at;
    at += RoundUpTo(floats, kScratchAlign);
    return start;
  };
  s.qt = take(head_dim_qk * mq);
  s.st = take(kKeyTile * mq);
  s.acc = take(head_dim_v * mq);
  s.m = take(mq);
  s.l = take(mq);
  s.alpha = take(mq);
  // f32 copies of one K and V tile when K/V are stored in 16 bits.
  s.ktile = take(kKeyTile * head_dim_qk);
  s.vtile = take(kKeyTile * head_dim_v);
  s.total = at;
  return s;
}

inline size_t ScratchFloatsImpl(int64_t head_dim_qk, int64_t head_dim_v) {
  return static_cast<size_t>(MakeLayout(head_dim_qk, head_dim_v).total);
}

// Contract: args validated by the driver (f32 Q/O, f32/f16/bf16 K/V, unit stride along the head
// dims, q_len/kv_len < 2^31 - 1, head dims >= 1); scratch 256-byte aligned
// with ScratchFloatsImpl() floats. Writes rows [q_begin, q_begin + rows) of
// one (batch, head) of O and LSE and nothing else.
inline void AttentionTaskF32Impl(const AttentionArgsF32& a, int64_t task,
                                 float* HWY_RESTRICT scratch) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t mq = kTileCols * N;
  const ScratchLayout lay = MakeLayout(a.head_dim_qk, a.head_dim_v);
  float* HWY_RESTRICT qt = scratch + lay.qt;
  float* HWY_RESTRICT st = scratch + lay.st;
  float* HWY_RESTRICT acc = scratch + lay.acc;  // O^T: [Dv][mq]
  float* HWY_RESTRICT m = scratch + lay.m;
  float* HWY_RESTRICT l = scratch + lay.l;
  float* HWY_RESTRICT alpha = scratch + lay.alpha;

  // Consecutive tasks are blocks of one head, so its K/V stay in L2/L3 from
  // one task to the next; within a head the heaviest (last, for causal)
  // blocks come first so the dynamic scheduler ends on light ones.
  const int64_t block = a.num_q_blocks - 1 - task % a.num_q_blocks;
  const int64_t bh = task / a.num_q_blocks;
  const int64_t b = bh / a.q_heads;
  const int64_t h = bh % a.q_heads;
  const int64_t hkv = h / a.group;
  const int64_t q_begin = block * mq;
  const int64_t rows = std::min(mq, a.q_len - q_begin);
  const int64_t dk = a.head_dim_qk;
  const int64_t dv = a.head_dim_v;

  const int64_t q_size = a.q_type == 0 ? 4 : 2;
  const char* q = static_cast<const char*>(a.q) +
                  (b * a.q_strides[0] + h * a.q_strides[1]) * q_size;
  const KvType kv_type = static_cast<KvType>(a.kv_type);
  const int64_t kv_size = kv_type == KvType::kF32 ? 4 : 2;
  const char* k = static_cast<const char*>(a.k) +
                  (b * a.k_strides[0] + hkv * a.k_strides[1]) * kv_size;
  const char* v = static_cast<const char*>(a.v) +
                  (b * a.v_strides[0] + hkv * a.v_strides[1]) * kv_size;
  float* HWY_RESTRICT ktile = scratch + lay.ktile;
  float* HWY_RESTRICT vtile = scratch + lay.vtile;

  // Pack the block transposed and scaled: qt[i][r] = scale * q[q_begin + r][i].
  // Rows past q_len are zero; their results are never stored.
  // 16-bit Q is widened exactly here (scalar: Dk x rows per block).
  for (int64_t r = 0; r < rows; ++r) {
    const char* qr = q + (q_begin + r) * a.q_strides[2] * q_size;
    if (a.q_type == 0) {
      const float* qf = reinterpret_cast<const float*>(qr);
      for (int64_t i = 0; i < dk; ++i) qt[i * mq + r] = qf[i] * a.scale;
    } else {
      const uint16_t* qh = reinterpret_cast<const uint16_t*>(qr);
      for (int64_t i = 0; i < dk; ++i) {
        const float x = a.q_type == 1 ? F16ToF32(qh[i]) : BF16ToF32(qh[i]);
        qt[i * mq + r] = x * a.scale;
      }
    }
  }
  for (int64_t r = rows; r < mq; ++r) {
    for (int64_t i = 0; i < dk; ++i) qt[i * mq + r] = 0.0f;
  }
  std::fill(acc, acc + dv * mq, 0.0f);
  // A sink (one logit per head, no value) starts every row's recurrence as if
  // it were a first key with score sink: m = sink, l = exp(sink - m) = 1. A
  // -inf sink is no sink.
  const float sink =
      a.sinks != nullptr ? a.sinks[h] : -std::numeric_limits<float>::infinity();
  const bool has_sink = !(sink == -std::numeric_limits<float>::infinity());
  std::fill(m, m + mq, has_sink ? sink : -std::numeric_limits<float>::infinity());
  std::fill(l, l + mq, has_sink ? 1.0f : 0.0f);

  // Index visibility (SEMANTICS.md): key j is visible to query i when
  // j < Lk_b, lo(i) <= j <= hi(i) with p(i) = i + offset, hi(i) = p(i) + right
  // (right = 0 for causal, min with window_right) and lo(i) = p(i) - left.
  const int64_t kv_valid = a.kv_lengths != nullptr ? a.kv_lengths[b] : a.kv_len;
  const int64_t offset = a.bottom_right ? kv_valid - a.q_len : 0;
  const bool has_hi = a.causal || a.window_right >= 0;
  const int64_t right = a.causal ? (a.window_right >= 0 ? std::min<int64_t>(a.window_right, 0) : 0)
                                 : a.window_right;
  const bool has_lo = a.window_left >= 0;
  const int64_t left = a.window_left;
  const int64_t p_first = q_begin + offset;
  const int64_t p_last = q_begin + rows - 1 + offset;
  // Keys any row of the block sees: [kv_start, kv_end).
  int64_t kv_start = has_lo ? std::max<int64_t>(0, p_first - left) : 0;
  int64_t kv_end = kv_valid;
  if (has_hi) kv_end = std::min(kv_end, std::max<int64_t>(0, p_last + right + 1));
  if (kv_start > kv_end) kv_start = kv_end;

  const bool has_mask = a.mask_kind != 0;
  const bool score_mods = a.softcap > 0.0f || a.alibi_slopes != nullptr;
  for (int64_t kv_begin = kv_start; kv_begin < kv_end; kv_begin += kKeyTile) {
    const int64_t nk = std::min(kKeyTile, kv_end - kv_begin);
    const float* kt;
    const float* vt;
    int64_t k_row, v_row;  // f32 row strides of the tiles
    if (kv_type == KvType::kF32) {
      kt = reinterpret_cast<const float*>(k) + kv_begin * a.k_strides[2];
      vt = reinterpret_cast<const float*>(v) + kv_begin * a.v_strides[2];
      k_row = a.k_strides[2];
      v_row = a.v_strides[2];
    } else {
      // Widened once per tile and block: nk x (Dk + Dv) conversions against
      // 2 x nk x (Dk + Dv) x block-rows FMAs.
      WidenRows(d, reinterpret_cast<const uint16_t*>(k) + kv_begin * a.k_strides[2],
                a.k_strides[2], kv_type, nk, dk, ktile);
      WidenRows(d, reinterpret_cast<const uint16_t*>(v) + kv_begin * a.v_strides[2],
                a.v_strides[2], kv_type, nk, dv, vtile);
      kt = ktile;
      vt = vtile;
      k_row = dk;
      v_row = dv;
    }
    // S^T: rows are keys (broadcast along the head dim), reduction over Dk.
    TileGemmRows<false, false>(d, nk, kt, k_row, 1, qt, mq, dk, nullptr, st,
                               mq);
    if (score_mods) {
      if (a.softcap > 0.0f) SoftcapTile(d, a.softcap, nk, st);
      if (a.alibi_slopes != nullptr) {
        AlibiTile(d, a.alibi_slopes[h], q_begin, offset, kv_begin, nk, st);
      }
    }
    if (has_mask) ExplicitMaskTile(a, b, h, q_begin, rows, kv_begin, nk, mq, st);
    // Index masks only where some row's window ends inside the tile.
    const bool cut_hi = has_hi && kv_begin + nk - 1 > p_first + right;
    const bool cut_lo = has_lo && kv_begin < p_last - left;
    if (cut_hi || cut_lo) {
      IndexMaskTile(d, q_begin, kv_begin, nk, cut_hi, offset + right, cut_lo,
                    offset - left, st);
    }
    const bool rescale = SoftmaxTile(d, st, nk, m, l, alpha);
    if (a.dropout_p > 0.0f) {
      DropoutTile(a, b, h, q_begin, rows, kv_begin, nk, mq, st);
    }
    // O^T: rows are value dims (broadcast along the keys), reduction over the
    // tile's keys; the old O^T is rescaled by alpha on the way in.
    const float* scale = rescale ? alpha : nullptr;
    if (cut_hi || cut_lo || has_mask) {
      TileGemmRows<true, true>(d, dv, vt, 1, v_row, st, mq, nk, scale, acc,
                               mq);
    } else {
      TileGemmRows<true, false>(d, dv, vt, 1, v_row, st, mq, nk, scale, acc,
                                mq);
    }
  }

  // O = acc / l; rows without a visible key (l == 0) get zeros and LSE -inf.
  // l is NaN (not 0) for rows that saw NaN, which then stays NaN.
  // 16-bit O is rounded to nearest even here.
  const int64_t o_size = a.o_type == 0 ? 4 : 2;
  char* o = static_cast<char*>(a.o) +
            (b * a.o_strides[0] + h * a.o_strides[1]) * o_size;
  for (int64_t r = 0; r < rows; ++r) {
    const float lr = l[r];
    const float inv = lr == 0.0f ? 0.0f : 1.0f / lr;
    char* row = o + (q_begin + r) * a.o_strides[2] * o_size;
    if (a.o_type == 0) {
      float* dst = reinterpret_cast<float*>(row);
      for (int64_t e = 0; e < dv; ++e) dst[e] = acc[e * mq + r] * inv;
    } else {
      uint16_t* dst = reinterpret_cast<uint16_t*>(row);
      for (int64_t e = 0; e < dv; ++e) {
        const float x = acc[e * mq + r] * inv;
        dst[e] = a.o_type == 1 ? F32ToF16(x) : F32ToBF16(x);
      }
    }
    if (a.lse != nullptr) {
      float* lse = a.lse + b * a.lse_strides[0] + h * a.lse_strides[1] +
                   (q_begin + r) * a.lse_strides[2];
      *lse = lr == 0.0f ? -std::numeric_limits<float>::infinity()
                        : m[r] + std::log(lr);
    }
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_ATTENTION_INL_H_
