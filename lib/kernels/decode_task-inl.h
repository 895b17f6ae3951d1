// The decode path's task: a group's few query rows along the head dims
// against one chunk of keys, with every option (decode-inl.h's loops).
// Per-target code.

#if defined(SIMDATTN_LIB_KERNELS_DECODE_TASK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_DECODE_TASK_INL_H_
#undef SIMDATTN_LIB_KERNELS_DECODE_TASK_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_DECODE_TASK_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <limits>

#include "hwy/highway.h"
#include "lib/kernels/block-inl.h"
#include "lib/kernels/decode-inl.h"
#include "lib/kernels/output-inl.h"
#include "lib/kernels/pack-inl.h"
#include "lib/kernels/dropout-inl.h"
#include "lib/kernels/mask-inl.h"
#include "lib/kernels/score_mods-inl.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Runs that a decode tile's f32 keys come from (DecodeTiles), so that K and
// V stream as 4 sequences each. f32 K/V from memory, 1 thread: +23% to +30%
// (attention/simdattn/qf32kvf32/B1_Hq32_Hkv8_Lq1_Lk16384_D128/none);
// 16-bit K/V gained less or lost, so they keep tiles of consecutive keys.
constexpr int64_t kDecodeRuns = 4;

// Paged K/V: a page holds block_size rows of each head, pages lie anywhere,
// so the hardware prefetchers lose the streams at every page. Each tile or
// run of keys asks for the rows this many keys ahead of it (into L2).
constexpr int64_t kPagedAheadKeys = 32;

// The rows [first + kPagedAheadKeys, ... + n) of paged K/V that exist.
HWY_INLINE void PrefetchPagedAhead(const AttentionArgs& a, const KvRows& src,
                                   int64_t first, int64_t n) {
  if (src.table == nullptr) return;
  PrefetchKvTile(a, src, first + kPagedAheadKeys, n, a.kv_len);
}

// 8-bit K/V (int8, q8_0, fp8) whose rows follow each other: the fused
// loop spends 2-5 ops converting each vector, and asking for the rows this
// many keys ahead keeps more of the stream in flight than the hardware
// prefetchers alone. Lk 65536, with it against a build without, two runs
// of 3 each: int8 13.04-13.24 against 13.56-13.85 ms on 1 thread,
// 6.55-6.74 against 6.91-7.05 ms on 2 (paired/qf32kvi8/
// B1_Hq32_Hkv8_Lq1_Lk65536_D128/bf16_vs_i8); e4m3 on 2 threads 8.20-8.35
// against 8.77-8.79 ms. bf16 is slower with it (DecodeFused alone: 148
// against 110 ns per group of 4 keys), so 16-bit K/V take none.
constexpr int64_t kDense8BitAheadKeys = 64;

// Keys ahead that the fused loop prefetches (DecodeFused's `ahead`): none
// where each 16-bit K and V row follows the previous one in memory, where
// the hardware prefetchers keep up, and kDense8BitAheadKeys for 8-bit
// ones; kPagedAheadKeys where rows lie further apart (the heads of a
// [tokens, heads, D] layout share each token's bytes) or in pages.
HWY_INLINE int64_t FusedAheadKeys(const AttentionArgs& a, const KvRows& src) {
  const bool apart = src.k_row != StorageRowBytes(src.k_type, a.head_dim_qk) ||
                     src.v_row != StorageRowBytes(src.v_type, a.head_dim_v);
  if (apart || src.table != nullptr) return kPagedAheadKeys;
  return IsWideStorage(src.type) ? 0 : kDense8BitAheadKeys;
}

// Score and weight options on the decode path (decode-inl.h's Mods): the
// same rules and order as the tiled kernel (softcap, ALiBi, mask; dropout on
// the weights), applied per row with the keys along the lanes.
struct DecodeMods {
  static constexpr bool kActive = true;
  const AttentionArgs* a;
  const RowTable* rt;
  const MaskBlock* mask;  // null without a mask
  int64_t b;
  int64_t kv_begin = 0;   // the tile's first key
  bool hide = false;      // the mask hides some key of the tile from some row
  bool bias = false;      // the mask's tile has a non-zero bias
  // Index cuts of the current tile (SetCuts; used when Lq > 1, where rows
  // have different queries and so different key ranges. With Lq = 1 the
  // task's key range is exactly each row's and no tile cuts).
  IndexCuts index;
  bool cut_hi = false, cut_lo = false;

  // Sets the cuts of tile [begin, begin + nk); whether it has any.
  bool SetCuts(int64_t begin, int64_t nk) {
    kv_begin = begin;
    cut_hi = index.has_hi && begin + nk - 1 > index.hi_first;
    cut_lo = index.has_lo && begin < index.lo_last;
    return cut_hi || cut_lo;
  }
  bool may_hide() const { return hide || cut_hi || cut_lo; }
  void Scores(int64_t r, int64_t nk, float* HWY_RESTRICT x) const {
    const hn::ScalableTag<float> d;
    if (a->softcap > 0.0f) SoftcapRow(d, a->softcap, nk, x);
    if (a->alibi_slopes != nullptr) AlibiRow(d, rt->slope[r], rt->pos[r], kv_begin, nk, x);
    if (bias) {
      const float* row = mask->row_data[mask->lane_row[r]];
      if (row != mask->zeros) BiasRow(d, row, nk, x);
    }
    // Last, as in the tiled kernel: a hidden key is -inf whatever came before.
    const float neg_inf = -std::numeric_limits<float>::infinity();
    const int64_t query = rt->query[r];
    if (cut_hi) {  // keys from query + hi_shift + 1 on
      const int64_t from = std::max<int64_t>(0, query + index.hi_shift + 1 - kv_begin);
      if (from < nk) std::fill(x + from, x + nk, neg_inf);
    }
    if (cut_lo) {  // keys before query + lo_shift
      const int64_t to = std::min<int64_t>(nk, query + index.lo_shift - kv_begin);
      if (to > 0) std::fill(x, x + to, neg_inf);
    }
  }
  static_assert(kKeyTile <= kDropoutRowKeys, "DropoutRow takes one tile");
  void Weights(int64_t r, int64_t nk, float* HWY_RESTRICT p) const {
    const hn::ScalableTag<float> d;
    if (a->dropout_p > 0.0f) {
      DropoutRow(d, *a, b, rt->head[r], rt->query[r], kv_begin, nk, p);
    }
  }
};

// A decode task's rows and scratch (DecodeTask).
struct DecodeRows {
  int64_t rows;
  const float* q;  // [rows][Dk], scaled
  float* s;        // one tile's scores
  float* o;        // [rows][Dv], unnormalized
  float* m;
  float* l;
  float* ktile;    // f32 copies of a tile, where K/V are widened by tiles
  float* vtile;
};

// Keys [kv_begin, kv_begin + nk) of a chunk ending at kv_end, for every row,
// with the tile's options `mods`.
template <class TileMods>
HWY_INLINE void DecodeKeyTile(const AttentionArgs& a, const KvRows& src,
                              const DecodeRows& r, int64_t kv_begin, int64_t nk,
                              int64_t kv_end, const TileMods& mods) {
  const hn::ScalableTag<float> d;
  const int64_t dk = a.head_dim_qk, dv = a.head_dim_v;
  const int64_t ks = a.k_strides[2], vs = a.v_strides[2];
  // f32 and bf16 K/V (and f16 where the target converts it in hardware) are
  // widened in registers as they are loaded; otherwise (K and V of
  // different types, quantized formats) widened or dequantized tile by tile.
  if ((src.type == Storage::kF16 && !kKvF16InRegisters) || !IsWideStorage(src.type)) {
    PrefetchKvTile(a, src, kv_begin + kKeyTile, kKeyTile, kv_end);
    const KvTile t = LoadKvTile(d, a, src, kv_begin, nk, r.ktile, r.vtile);
    DecodeTile<Storage::kF32>(d, r.rows, r.q, dk, t.k, t.k_row, t.v, t.v_row, dv, nk,
                              0, r.s, r.m, r.l, r.o, mods);
    return;
  }
  // Rows that exist past this tile may be prefetched, even past the chunk
  // (the next task streams on from there), up to the end of the tile's run
  // of consecutive rows.
  const int64_t prefetch_end = std::min(a.kv_len, src.RunEnd(kv_begin)) - kv_begin;
  if (src.type == Storage::kF32) {
    const KvTile t = LoadKvTile(d, a, src, kv_begin, nk, r.ktile, r.vtile);
    DecodeTile<Storage::kF32>(d, r.rows, r.q, dk, t.k, t.k_row, t.v, t.v_row, dv, nk,
                              prefetch_end, r.s, r.m, r.l, r.o, mods);
    return;
  }
  const uint16_t* k16 = reinterpret_cast<const uint16_t*>(src.KRow(kv_begin));
  const uint16_t* v16 = reinterpret_cast<const uint16_t*>(src.VRow(kv_begin));
  if (src.type == Storage::kF16) {
    DecodeTile<Storage::kF16>(d, r.rows, r.q, dk, k16, ks, v16, vs, dv, nk,
                              prefetch_end, r.s, r.m, r.l, r.o, mods);
  } else {
    DecodeTile<Storage::kBF16>(d, r.rows, r.q, dk, k16, ks, v16, vs, dv, nk,
                               prefetch_end, r.s, r.m, r.l, r.o, mods);
  }
}

#if SIMDATTN_HAVE_DECODE_FUSED
// The fused loop over keys [first, first + n) of K/V stored as kKv, from
// their rows in place (dense, strided or paged), with 8-bit K/V's scales.
template <Storage kKv, class D>
HWY_INLINE void FusedKeys(D d, const KvRows& src, const DecodeRows& r, int64_t dk,
                          int64_t dv, int64_t first, int64_t n, int64_t ahead) {
  using T = KvElem<kKv>;
  const int64_t k_row = src.k_row / int64_t{sizeof(T)};
  const int64_t v_row = src.v_row / int64_t{sizeof(T)};
  const int64_t ks_row = src.KScaleStride(), vs_row = src.VScaleStride();
  if (src.table != nullptr) {
    const PagedRows<T, KvRows> rows{&src, first, k_row, v_row, ks_row, vs_row};
    DecodeFusedRows<kKv>(d, r.rows, r.q, dk, rows, dv, n, ahead, r.m, r.l, r.o);
    return;
  }
  const StridedRows<T> rows{reinterpret_cast<const T*>(src.KRow(first)),
                            reinterpret_cast<const T*>(src.VRow(first)),
                            k_row,
                            v_row,
                            src.KScaleAt(first),
                            src.VScaleAt(first),
                            ks_row,
                            vs_row};
  DecodeFusedRows<kKv>(d, r.rows, r.q, dk, rows, dv, n, ahead, r.m, r.l, r.o);
}
#endif

// The keys of [kv_start, kv_end) that a task without options and without
// per-row cuts runs ahead of its tiles: the fused groups of 4 keys
// (KernelPath::kDecodeFused), or for f32 K/V whole tiles whose keys come
// from kDecodeRuns runs that split the chunk evenly (KeyAt), so that a
// tile's 4-key groups read one row of each run and K and V stream as 4
// sequences each. The split depends only on the chunk. Returns the first
// key left for the tiles.
HWY_INLINE int64_t DecodeLeadingKeys(const AttentionArgs& a, const Plan& plan,
                                     const KvRows& src, const DecodeRows& r,
                                     int64_t kv_start, int64_t kv_end) {
  const hn::ScalableTag<float> d;
  const int64_t dk = a.head_dim_qk, dv = a.head_dim_v;
  const int64_t ks = a.k_strides[2], vs = a.v_strides[2];
#if SIMDATTN_HAVE_DECODE_FUSED
  if (plan.path == KernelPath::kDecodeFused) {
    // Paged K/V: the rows of each group of 4 keys lie in one page (pages
    // hold multiples of 8 keys, chunks start on multiples of 64); a window
    // that starts the keys off the grid of 4 leaves them to the tiles.
    const int64_t n4 = (kv_end - kv_start) / 4 * 4;
    const int64_t ahead = FusedAheadKeys(a, src);
    if (src.table != nullptr) {
      if (kv_start % 4 != 0) return kv_start;
      PrefetchKvTile(a, src, kv_start, ahead, kv_end);
    }
    switch (src.type) {
      case Storage::kF16:
        FusedKeys<Storage::kF16>(d, src, r, dk, dv, kv_start, n4, ahead);
        break;
      case Storage::kBF16:
        FusedKeys<Storage::kBF16>(d, src, r, dk, dv, kv_start, n4, ahead);
        break;
      case Storage::kI8:
        FusedKeys<Storage::kI8>(d, src, r, dk, dv, kv_start, n4, ahead);
        break;
      case Storage::kE4M3:
        FusedKeys<Storage::kE4M3>(d, src, r, dk, dv, kv_start, n4, ahead);
        break;
      case Storage::kE5M2:
        FusedKeys<Storage::kE5M2>(d, src, r, dk, dv, kv_start, n4, ahead);
        break;
      default:
        FusedKeys<Storage::kQ8_0>(d, src, r, dk, dv, kv_start, n4, ahead);
        break;
    }
    return kv_start + n4;
  }
#else
  (void)plan;
#endif
  if (src.type != Storage::kF32 || src.table != nullptr) return kv_start;
  constexpr int64_t kRun = kKeyTile / kDecodeRuns;
  const int64_t run = (kv_end - kv_start) / kKeyTile * kRun;
  const NoDecodeMods none;
  for (int64_t t = 0; t < run; t += kRun) {
    const int64_t first = kv_start + t;
    DecodeTile<Storage::kF32, kDecodeRuns>(
        d, r.rows, r.q, dk, reinterpret_cast<const float*>(src.k) + first * ks, ks,
        reinterpret_cast<const float*>(src.v) + first * vs, vs, dv, kKeyTile,
        a.kv_len - first, r.s, r.m, r.l, r.o, none, run);
  }
  return kv_start + kDecodeRuns * run;
}

// The tiles of a decode task over keys [kv_start, kv_end), with score and
// weight options (DecodeMods) or without (NoDecodeMods). A tile the mask
// hides from every row is skipped. `cuts` (null when Lq = 1) holds the index
// cuts of rows with different queries: a tile that cuts some row runs with
// them (and `mods`'s options).
template <class Mods>
HWY_INLINE void DecodeTiles(const AttentionArgs& a, const Plan& plan,
                            const KvRows& src, const DecodeRows& r,
                            int64_t kv_start, int64_t kv_end, MaskBlock* mask,
                            Mods* mods, DecodeMods* cuts) {
  const hn::ScalableTag<float> d;
  int64_t kv_first = kv_start;
  if constexpr (!Mods::kActive) {
    if (cuts == nullptr) kv_first = DecodeLeadingKeys(a, plan, src, r, kv_start, kv_end);
  }
  int64_t nk = 0;
  for (int64_t kv_begin = kv_first; kv_begin < kv_end; kv_begin += nk) {
    // A tile lies in one run of consecutive rows (paged K/V: one page).
    nk = std::min({kKeyTile, kv_end - kv_begin, src.RunEnd(kv_begin) - kv_begin});
    PrefetchPagedAhead(a, src, kv_begin, nk);
    if constexpr (Mods::kActive) {
      mods->kv_begin = kv_begin;
      if (mask != nullptr) {
        const MaskTile mt = MaskTileBias(d, a, mask, kv_begin, nk);
        if (!mt.visible) continue;
        mods->hide = mt.hidden;
        mods->bias = mt.bias;
      }
    }
    if (cuts != nullptr && cuts->SetCuts(kv_begin, nk)) {
      DecodeKeyTile(a, src, r, kv_begin, nk, kv_end, *cuts);  // cuts == mods
      continue;
    }
    DecodeKeyTile(a, src, r, kv_begin, nk, kv_end, *mods);
  }
}

// DecodeTask's `leading` without a matrix unit: no keys ahead of the tiles
// (the AVX3_AMX entry's is AmxDecodeKeys, decode_amx-inl.h).
struct NoLeadingKeys {
  int64_t operator()(const AttentionArgs&, const KvRows&, const RowTable&, int64_t,
                     const DecodeRows&, int64_t kv_start, int64_t) const {
    return kv_start;
  }
};

// The decode path's task (KernelPath::kDecode, kDecodeFused): the block's
// (head, query) rows, G x Lq of them (Lq = 1: the G heads, all seeing the
// same key range; Lq > 1: speculative decoding, whose rows t.cuts limits
// each to its own range), with the head dims along the lanes. In scratch:
// Q rows in lay.qt ([rows][Dk], scaled), outputs in lay.acc ([rows][Dv]),
// scores in lay.st. Writes partials (split calls) or O/LSE. Without options,
// `leading` runs the keys it can of those every row sees first and returns
// the first one left for the tiles.
template <class Leading = NoLeadingKeys>
inline void DecodeTask(const AttentionArgs& a, const Plan& plan,
                       const Wave& wave, int64_t task, const BlockTask& t,
                       const RowTable& rt, float* HWY_RESTRICT scratch,
                       const ScratchLayout& lay, const Leading& leading = Leading()) {
  const hn::ScalableTag<float> d;
  const int64_t dk = a.head_dim_qk;
  const int64_t dv = a.head_dim_v;
  const int64_t rows = t.rows;
  float* HWY_RESTRICT qrows = scratch + lay.qt;
  float* HWY_RESTRICT orow = scratch + lay.acc;
  float* HWY_RESTRICT m = scratch + lay.m;
  float* HWY_RESTRICT l = scratch + lay.l;
  const DecodeRows dr{rows, qrows, scratch + lay.st, orow, m, l,
                      scratch + lay.ktile, scratch + lay.vtile};
  const KvRows src(a, t.b, t.hkv);
  for (int64_t r = 0; r < rows; ++r) QueryRow(d, a, t.b, rt, r, qrows + r * dk);
  InitRowState(a, plan, rt, rows, m, l);
  std::fill(orow, orow + rows * dv, 0.0f);
  const bool has_mask = a.mask_kind != MaskKind::kNone;
  MaskBlock mask(scratch + lay.mask, plan.block_rows, kKeyTile);
  if (has_mask) mask.Init(a, t.b, rt);
  DecodeMods mods;
  mods.a = &a;
  mods.rt = &rt;
  mods.mask = has_mask ? &mask : nullptr;
  mods.b = t.b;
  mods.index = t.cuts;
  DecodeMods* cuts = a.q_len > 1 && (t.cuts.has_hi || t.cuts.has_lo) ? &mods : nullptr;
  if (has_mask || a.softcap > 0.0f || a.alibi_slopes != nullptr || a.dropout_p > 0.0f) {
    DecodeTiles(a, plan, src, dr, t.kv_start, t.kv_end, has_mask ? &mask : nullptr,
                &mods, cuts);
  } else {
    NoDecodeMods none;
    // `leading` takes keys that every row sees: with cuts, those up to the
    // first that a causal or right window hides (if none is hidden before).
    int64_t first = t.kv_start;
    if (cuts == nullptr) {
      first = leading(a, src, rt, t.b, dr, t.kv_start, t.kv_end);
    } else if (!t.cuts.has_lo || t.cuts.lo_last <= t.kv_start) {
      const int64_t end =
          t.cuts.has_hi ? std::min(t.kv_end, t.cuts.hi_first + 1) : t.kv_end;
      if (end > t.kv_start) first = leading(a, src, rt, t.b, dr, t.kv_start, end);
    }
    DecodeTiles(a, plan, src, dr, first, t.kv_end, nullptr, &none, cuts);
  }
  if (plan.num_chunks > 1) {
    StorePartial(a, plan, wave, task, rows, m, l, orow, rows * dv);
    return;
  }
  WriteRows(a, plan, t.b, rt, rows, m, l, orow, 1, dv);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_DECODE_TASK_INL_H_
