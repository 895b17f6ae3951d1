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
#include "lib/kernels/kernels.h"
#include "lib/kernels/online_softmax-inl.h"
#include "lib/kernels/pv_tile-inl.h"
#include "lib/kernels/qk_tile-inl.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Keys per K/V tile. The transposed score tile is kKeyTile x 4 vectors: 16 KiB
// for AVX-512, and the V tile kKeyTile x Dv floats is 32 KiB at Dv = 128, so
// both stay in Zen 5's 48 KiB L1D / 1 MiB L2 while every row group of the
// block re-reads them.
constexpr int64_t kKeyTile = 64;
// Scratch regions start on this many floats (256 bytes: one SVE-2048 vector).
constexpr int64_t kScratchAlign = 64;

inline int64_t RoundUpTo(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Query rows per task: 4 vectors of queries along the lanes of the score tile.
inline int64_t QueryBlockRowsImpl() {
  const hn::ScalableTag<float> d;
  return static_cast<int64_t>(4 * hn::Lanes(d));
}

// Scratch layout of one task (floats, each region kScratchAlign-aligned).
struct ScratchLayout {
  int64_t qt, st, acc, m, l, alpha, vtail, total;
};

inline ScratchLayout MakeLayout(int64_t head_dim_qk, int64_t head_dim_v) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t mq = 4 * N;
  ScratchLayout s;
  int64_t at = 0;
  auto take = [&at](int64_t floats) {
    const int64_t start = at;
    at += RoundUpTo(floats, kScratchAlign);
    return start;
  };
  s.qt = take(head_dim_qk * mq);
  s.st = take(kKeyTile * mq);
  s.acc = take(mq * RoundUpTo(head_dim_v, N));
  s.m = take(mq);
  s.l = take(mq);
  s.alpha = take(mq);
  s.vtail = take(kKeyTile * N);
  s.total = at;
  return s;
}

inline size_t ScratchFloatsImpl(int64_t head_dim_qk, int64_t head_dim_v) {
  return static_cast<size_t>(MakeLayout(head_dim_qk, head_dim_v).total);
}

// Contract: args validated by the driver (f32, unit stride along the head
// dims, q_len/kv_len < 2^31 - 1, head dims >= 1); scratch 256-byte aligned with
// ScratchFloatsImpl() floats. Writes rows [q_begin, q_begin + rows) of one
// (batch, head) of O and LSE and nothing else.
inline void AttentionTaskF32Impl(const AttentionArgsF32& a, int64_t task,
                                 float* HWY_RESTRICT scratch) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t mq = 4 * N;
  const ScratchLayout lay = MakeLayout(a.head_dim_qk, a.head_dim_v);
  float* HWY_RESTRICT qt = scratch + lay.qt;
  float* HWY_RESTRICT st = scratch + lay.st;
  float* HWY_RESTRICT acc = scratch + lay.acc;
  float* HWY_RESTRICT m = scratch + lay.m;
  float* HWY_RESTRICT l = scratch + lay.l;
  float* HWY_RESTRICT alpha = scratch + lay.alpha;
  float* HWY_RESTRICT vtail = scratch + lay.vtail;

  // Heaviest blocks first (causal cost grows with the block index) so that a
  // dynamic scheduler balances; consecutive tasks are different heads.
  const int64_t bh_count = a.batch * a.q_heads;
  const int64_t block = a.num_q_blocks - 1 - task / bh_count;
  const int64_t bh = task % bh_count;
  const int64_t b = bh / a.q_heads;
  const int64_t h = bh % a.q_heads;
  const int64_t hkv = h / a.group;
  const int64_t q_begin = block * mq;
  const int64_t rows = std::min(mq, a.q_len - q_begin);
  const int64_t dk = a.head_dim_qk;
  const int64_t dv = a.head_dim_v;
  const int64_t dv_full = dv / N;               // full vectors of V per row
  const int64_t dv_tail = dv - dv_full * N;     // leftover lanes
  const int64_t dv_vecs = dv_full + (dv_tail != 0 ? 1 : 0);
  const int64_t acc_stride = dv_vecs * N;

  const float* q = a.q + b * a.q_strides[0] + h * a.q_strides[1];
  const float* k = a.k + b * a.k_strides[0] + hkv * a.k_strides[1];
  const float* v = a.v + b * a.v_strides[0] + hkv * a.v_strides[1];

  // Pack the block transposed and scaled: qt[i][r] = scale * q[q_begin + r][i].
  // Rows past q_len are zero; their results are never stored.
  for (int64_t r = 0; r < rows; ++r) {
    const float* qr = q + (q_begin + r) * a.q_strides[2];
    for (int64_t i = 0; i < dk; ++i) qt[i * mq + r] = qr[i] * a.scale;
  }
  for (int64_t r = rows; r < mq; ++r) {
    for (int64_t i = 0; i < dk; ++i) qt[i * mq + r] = 0.0f;
  }
  std::fill(acc, acc + mq * acc_stride, 0.0f);
  std::fill(m, m + mq, -std::numeric_limits<float>::infinity());
  std::fill(l, l + mq, 0.0f);

  // Causal: query i sees keys j <= i + offset. Keys past the last row's limit
  // are skipped; tiles past the first row's limit need the mask.
  const int64_t offset = a.bottom_right ? a.kv_len - a.q_len : 0;
  int64_t kv_end = a.kv_len;
  if (a.causal) {
    kv_end = std::min(a.kv_len, std::max<int64_t>(0, q_begin + rows - 1 + offset + 1));
  }

  for (int64_t kv_begin = 0; kv_begin < kv_end; kv_begin += kKeyTile) {
    const int64_t nk = std::min(kKeyTile, kv_end - kv_begin);
    ScoreTile(d, qt, k + kv_begin * a.k_strides[2], a.k_strides[2], nk, dk, st);
    const bool masked = a.causal && kv_begin + nk - 1 > q_begin + offset;
    if (masked) CausalMaskTile(d, q_begin, kv_begin, nk, offset, st);
    SoftmaxTile(d, st, nk, m, l, alpha);

    const float* vt = v + kv_begin * a.v_strides[2];
    if (dv_tail != 0) {
      // The head-dim tail of each V row, zero-padded to a full vector, so the
      // PV kernel never reads past the caller's rows.
      for (int64_t j = 0; j < nk; ++j) {
        const float* src = vt + j * a.v_strides[2] + dv_full * N;
        float* dst = vtail + j * N;
        std::memcpy(dst, src, static_cast<size_t>(dv_tail) * sizeof(float));
        std::fill(dst + dv_tail, dst + N, 0.0f);
      }
    }
    for (int64_t r = 0; r < mq; r += 4) {
      // Keys of this tile that each of the 4 rows sees: all of them, except
      // in a diagonal tile, where row r + t sees the first
      // q_begin + r + t + offset - kv_begin + 1.
      int64_t seen[4] = {nk, nk, nk, nk};
      if (masked) {
        for (int t = 0; t < 4; ++t) {
          seen[t] = std::min(nk, std::max<int64_t>(
                                     0, q_begin + r + t + offset - kv_begin + 1));
        }
      }
      // Skip the rescale when no row of the group saw its max grow.
      const bool rescale = alpha[r] != 1.0f || alpha[r + 1] != 1.0f ||
                           alpha[r + 2] != 1.0f || alpha[r + 3] != 1.0f;
      const float* al = rescale ? alpha + r : nullptr;
      float* acc_r = acc + r * acc_stride;
      // seen[] grows with t: the keys all 4 rows see go through the register
      // tile, the rest row by row.
      const int64_t common = seen[0];
      PvRows4AnyWidth(d, st + r, mq, vt, a.v_strides[2], common, dv_full, al,
                      acc_r, acc_stride);
      if (dv_tail != 0) {
        PvRows4<1>(d, st + r, mq, vtail, N, common, al, acc_r + dv_full * N,
                   acc_stride);
      }
      for (int t = 1; t < 4; ++t) {
        if (seen[t] > common) {
          PvOneRow(d, st + r + t, mq, vt, a.v_strides[2], vtail, common,
                   seen[t], dv_full, dv_tail != 0, acc_r + t * acc_stride);
        }
      }
    }
  }

  // O = acc / l; rows without a visible key (l == 0) get zeros and LSE -inf.
  // l is NaN (not 0) for rows that saw NaN, which then stays NaN.
  float* o = a.o + b * a.o_strides[0] + h * a.o_strides[1];
  for (int64_t r = 0; r < rows; ++r) {
    const float lr = l[r];
    const float inv = lr == 0.0f ? 0.0f : 1.0f / lr;
    const auto vinv = hn::Set(d, inv);
    const float* src = acc + r * acc_stride;
    float* dst = o + (q_begin + r) * a.o_strides[2];
    int64_t c = 0;
    for (; c + N <= dv; c += N) {
      hn::StoreU(hn::Mul(hn::Load(d, src + c), vinv), d, dst + c);
    }
    for (; c < dv; ++c) dst[c] = src[c] * inv;
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
