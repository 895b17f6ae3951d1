// What every task of the fused kernel shares: tile and scratch sizes, the
// row table of a query block, K/V rows and tiles in their storage type,
// and the online softmax's start. Per-target code (foreach_target TU).

#if defined(SIMDATTN_LIB_KERNELS_BLOCK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_BLOCK_INL_H_
#undef SIMDATTN_LIB_KERNELS_BLOCK_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_BLOCK_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "hwy/highway.h"
#include "lib/kernels/convert-inl.h"
#include "lib/kernels/dequant-inl.h"
#include "lib/kernels/kernels.h"
#include "lib/kernels/mask-inl.h"
#include "lib/kernels/score_mods-inl.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Keys per K/V tile. With a 64-query block (AVX-512) the score tile is
// 64 x 64 floats = 16 KiB, half of it (one pair of query vectors) in L1D per
// product, next to half of the packed Qt (16 KiB at Dk = 128) or of O^T.
constexpr int64_t kKeyTile = 64;
// The longest key tile of any product kind: AMX's (amx-inl.h).
constexpr int64_t kMaxKeyTile = 128;
// Scratch regions start on this many floats (256 bytes: one SVE-2048 vector).
constexpr int64_t kScratchAlign = 64;
// Block rows are at most kQueryBlockVectors vectors of at most 64 lanes
// (SVE-2048).
constexpr int64_t kMaxBlockRows = kQueryBlockVectors * 64;

inline int64_t RoundUpTo(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Query rows per task: kQueryBlockVectors vectors of queries along the lanes.
inline int64_t QueryBlockRowsImpl() {
  const hn::ScalableTag<float> d;
  return static_cast<int64_t>(kQueryBlockVectors * hn::Lanes(d));
}

// Scratch layout of one task (floats, each region kScratchAlign-aligned).
struct ScratchLayout {
  int64_t qt, st, acc, m, l, alpha, ktile, vtile, rows, mask, total;
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
  // Head dims rounded up to 32 for the AMX tiles (zero padding).
  s.qt = take(RoundUpTo(head_dim_qk, 32) * mq);
  s.st = take(kMaxKeyTile * mq);
  s.acc = take(RoundUpTo(head_dim_v, 32) * mq);
  s.m = take(mq);
  s.l = take(mq);
  s.alpha = take(mq);
  // f32 copies of one K and V tile when K/V are stored in 16 bits.
  s.ktile = take(kMaxKeyTile * head_dim_qk);
  s.vtile = take(kMaxKeyTile * head_dim_v);
  s.rows = take(RowTable::Floats(mq));
  s.mask = take(MaskBlock::Floats(mq, kMaxKeyTile));
  s.total = at;
  return s;
}

inline size_t ScratchFloatsImpl(int64_t head_dim_qk, int64_t head_dim_v) {
  return static_cast<size_t>(MakeLayout(head_dim_qk, head_dim_v).total);
}

// Which query each lane of a block is: block `block` of group (b, hkv).
// Returns the number of valid rows; padding lanes repeat the last valid row
// (their results are never stored).
inline int64_t FillRowTable(const AttentionArgs& a, int64_t block,
                            int64_t hkv, int64_t offset, int64_t mq,
                            RowTable* t) {
  const int64_t group_rows = a.group * a.q_len;
  const int64_t first = block * mq;
  const int64_t rows = std::min(mq, group_rows - first);
  // Row g of the group is query g % Lq of head hkv * group + g / Lq: one
  // division for the block, then a counter (no division per row).
  int64_t h = hkv * a.group + first / a.q_len;
  int64_t i = first % a.q_len;
  for (int64_t r = 0; r < mq; ++r) {
    if (r > 0 && r < rows && ++i == a.q_len) {
      i = 0;
      ++h;
    }
    t->query[r] = static_cast<int32_t>(i);
    t->head[r] = static_cast<int32_t>(h);
    t->pos[r] = static_cast<float>(i + offset);
    t->slope[r] = a.alibi_slopes != nullptr ? a.alibi_slopes[h] : 0.0f;
  }
  return rows;
}

// The K/V rows of one (batch, KV head) group in their storage types (K's
// and V's each their own). Dense K/V: row j at k + j * k_row bytes. Paged
// (AttentionArgs::block_table): row j in page block_table[Page(j)]
// at row j % block_size, so rows are consecutive in memory only within a
// page (RunEnd). int8 rows have a per-row scale (KScale, VScale) at the
// same (page,) head and row of the scale views; fp8 one per tensor.
struct KvRows {
  Storage type;            // K's and V's common type, or kMixed
  Storage k_type, v_type;
  const char* k;  // row 0 (dense) or row 0 of page 0 (paged)
  const char* v;
  int64_t k_row, v_row;    // bytes between rows
  int64_t k_page, v_page;  // bytes between pages
  const int32_t* table;    // null: dense
  int64_t block_size;
  int block_shift;         // log2(block_size) when a power of two, else -1
  const float* k_scales;   // int8: row 0's scale (as k); else null
  const float* v_scales;
  int64_t ks_row, vs_row, ks_page, vs_page;  // floats between scales
  float k_scale, v_scale;  // fp8: the tensors' scales

  KvRows(const AttentionArgs& a, int64_t b, int64_t hkv)
      : type(a.kv_type),
        k_type(a.k_type),
        v_type(a.v_type),
        k(static_cast<const char*>(a.k) +
          ((a.block_table != nullptr ? 0 : b * a.k_strides[0]) + hkv * a.k_strides[1]) *
              StorageBytes(a.k_type)),
        v(static_cast<const char*>(a.v) +
          ((a.block_table != nullptr ? 0 : b * a.v_strides[0]) + hkv * a.v_strides[1]) *
              StorageBytes(a.v_type)),
        k_row(a.k_strides[2] * StorageBytes(a.k_type)),
        v_row(a.v_strides[2] * StorageBytes(a.v_type)),
        k_page(a.k_strides[0] * StorageBytes(a.k_type)),
        v_page(a.v_strides[0] * StorageBytes(a.v_type)),
        table(a.block_table),
        block_size(a.block_size),
        block_shift(Log2IfPow2(a.block_size)),
        k_scales(ScaleBase(a.k_scales, a.k_scale_strides, a.block_table, b, hkv)),
        v_scales(ScaleBase(a.v_scales, a.v_scale_strides, a.block_table, b, hkv)),
        ks_row(a.k_scale_strides[2]),
        vs_row(a.v_scale_strides[2]),
        ks_page(a.k_scale_strides[0]),
        vs_page(a.v_scale_strides[0]),
        k_scale(a.k_scale),
        v_scale(a.v_scale) {}

  static int Log2IfPow2(int64_t n) {
    if (n <= 0 || (n & (n - 1)) != 0) return -1;
    int s = 0;
    while ((int64_t{1} << s) < n) ++s;
    return s;
  }
  // Page index and row within it of key j.
  HWY_INLINE int64_t Page(int64_t j) const {
    return block_shift >= 0 ? j >> block_shift : j / block_size;
  }
  HWY_INLINE int64_t Row(int64_t j) const {
    return block_shift >= 0 ? j & (block_size - 1) : j % block_size;
  }

  static const float* ScaleBase(const float* s, const int64_t* st,
                                const int32_t* table, int64_t b, int64_t hkv) {
    if (s == nullptr) return nullptr;
    return s + (table != nullptr ? 0 : b * st[0]) + hkv * st[1];
  }

  const char* KRow(int64_t j) const {
    if (table == nullptr) return k + j * k_row;
    return k + table[Page(j)] * k_page + Row(j) * k_row;
  }
  const char* VRow(int64_t j) const {
    if (table == nullptr) return v + j * v_row;
    return v + table[Page(j)] * v_page + Row(j) * v_row;
  }
  // Row j's scale: int8's own, fp8's tensor scale, 1 otherwise (q8_0's are
  // in its blocks).
  float KScale(int64_t j) const { return RowScale(k_scales, ks_row, ks_page, k_scale, j); }
  float VScale(int64_t j) const { return RowScale(v_scales, vs_row, vs_page, v_scale, j); }
  float RowScale(const float* s, int64_t row, int64_t page, float tensor,
                 int64_t j) const {
    if (s == nullptr) return tensor;
    if (table == nullptr) return s[j * row];
    return s[table[Page(j)] * page + Row(j) * row];
  }
  // Row j's K (V) scale as a pointer and the floats to the next row's
  // within its run (0 for fp8's tensor scale).
  const float* KScaleAt(int64_t j) const { return ScaleAt(k_scales, ks_row, ks_page, &k_scale, j); }
  const float* VScaleAt(int64_t j) const { return ScaleAt(v_scales, vs_row, vs_page, &v_scale, j); }
  int64_t KScaleStride() const { return k_scales != nullptr ? ks_row : 0; }
  int64_t VScaleStride() const { return v_scales != nullptr ? vs_row : 0; }
  const float* ScaleAt(const float* s, int64_t row, int64_t page,
                       const float* tensor, int64_t j) const {
    if (s == nullptr) return tensor;
    if (table == nullptr) return s + j * row;
    return s + table[Page(j)] * page + Row(j) * row;
  }
  // The end of the run of rows consecutive in memory that holds row j.
  int64_t RunEnd(int64_t j) const {
    if (table == nullptr) return std::numeric_limits<int64_t>::max();
    return (Page(j) + 1) * block_size;
  }
  // Calls f(row, first, n) for each run of consecutive rows of K
  // (values = false) or V within [first, first + n): row is the run's first
  // row, f's first and n its index and length.
  template <class F>
  void ForEachRun(bool values, int64_t first, int64_t n, const F& f) const {
    const int64_t end = first + n;
    for (int64_t j = first; j < end;) {
      const int64_t run = std::min(end, RunEnd(j)) - j;
      f(values ? VRow(j) : KRow(j), j, run);
      j += run;
    }
  }
};

// Row j of K (values = false) or V, `cols` values, as f32 into dst: copied
// (f32), widened (f16, bf16) or dequantized with the row's scale.
template <class D>
HWY_INLINE void WidenKvRow(D d, const KvRows& src, bool values, int64_t j,
                           int64_t cols, float* HWY_RESTRICT dst) {
  const Storage type = values ? src.v_type : src.k_type;
  const char* row = values ? src.VRow(j) : src.KRow(j);
  if (type == Storage::kF32) {
    std::memcpy(dst, row, static_cast<size_t>(cols) * sizeof(float));
  } else if (IsWideStorage(type)) {
    WidenRow(d, reinterpret_cast<const uint16_t*>(row), type, cols, dst);
  } else {
    DequantRow(d, reinterpret_cast<const uint8_t*>(row), type,
               values ? src.VScale(j) : src.KScale(j), cols, dst);
  }
}

// Rows [first, first + n) of K (values = false) or V, stored in any type
// but f32 shared by K and V, as f32 into dst ([n][cols] floats).
template <class D>
HWY_INLINE void WidenKvRows(D d, const KvRows& src, bool values, int64_t first,
                            int64_t n, int64_t cols, float* HWY_RESTRICT dst) {
  const Storage type = values ? src.v_type : src.k_type;
  if (type == Storage::kF16 || type == Storage::kBF16) {
    const int64_t row = (values ? src.v_row : src.k_row) / 2;
    src.ForEachRun(values, first, n, [&](const char* p, int64_t j, int64_t run) {
      WidenRows(d, reinterpret_cast<const uint16_t*>(p), row, type, run, cols,
                dst + (j - first) * cols);
    });
    return;
  }
  for (int64_t j = first; j < first + n; ++j) {
    WidenKvRow(d, src, values, j, cols, dst + (j - first) * cols);
  }
}

// Asks for rows [first, first + n) of K and V (clamped to `end`) to be
// brought into L2 while the current tile computes. Each row is its own
// stream at a large stride (a head's K/V rarely fits L2 next to the rest),
// which the hardware prefetchers follow only partly.
inline void PrefetchKvTile(const AttentionArgs& a, const KvRows& src,
                           int64_t first, int64_t n, int64_t end) {
  const int64_t last = std::min(first + n, end);
  if (last <= first) return;
  const int64_t k_bytes = StorageRowBytes(src.k_type, a.head_dim_qk);
  const int64_t v_bytes = StorageRowBytes(src.v_type, a.head_dim_v);
  src.ForEachRun(false, first, last - first, [&](const char* k, int64_t j, int64_t run) {
    const char* v = src.VRow(j);
    for (int64_t r = 0; r < run; ++r, k += src.k_row, v += src.v_row) {
      for (int64_t byte = 0; byte < k_bytes; byte += 64) __builtin_prefetch(k + byte, 0, 2);
      for (int64_t byte = 0; byte < v_bytes; byte += 64) __builtin_prefetch(v + byte, 0, 2);
    }
  });
}

// One K/V tile as f32 rows: in place when K and V are both f32 (so the tile
// lies in one run of KvRows::RunEnd), otherwise widened or dequantized into
// ktile/vtile once per tile and block (nk x (Dk + Dv) conversions against
// 2 x nk x (Dk + Dv) x block-rows FMAs).
struct KvTile {
  const float* k;
  const float* v;
  int64_t k_row, v_row;  // f32 row strides
};

template <class D>
HWY_INLINE KvTile LoadKvTile(D d, const AttentionArgs& a, const KvRows& src,
                             int64_t kv_begin, int64_t nk,
                             float* HWY_RESTRICT ktile,
                             float* HWY_RESTRICT vtile) {
  if (src.type == Storage::kF32) {
    return {reinterpret_cast<const float*>(src.KRow(kv_begin)),
            reinterpret_cast<const float*>(src.VRow(kv_begin)), a.k_strides[2],
            a.v_strides[2]};
  }
  WidenKvRows(d, src, false, kv_begin, nk, a.head_dim_qk, ktile);
  WidenKvRows(d, src, true, kv_begin, nk, a.head_dim_v, vtile);
  return {ktile, vtile, a.head_dim_qk, a.head_dim_v};
}

// Row j of K (values = false) or V (`n` elements) as f32: in place for f32
// storage, otherwise widened or dequantized into `tmp`.
template <class D>
HWY_INLINE const float* RowF32(D d, const KvRows& src, bool values, int64_t j,
                               int64_t n, float* HWY_RESTRICT tmp) {
  if ((values ? src.v_type : src.k_type) == Storage::kF32) {
    return reinterpret_cast<const float*>(values ? src.VRow(j) : src.KRow(j));
  }
  WidenKvRow(d, src, values, j, n, tmp);
  return tmp;
}

// Starts the online softmax of `n` rows. A sink (one logit per head, no
// value) acts as a first key with score sink: m = sink, l = exp(sink - m) =
// 1; a -inf sink is no sink. Split calls add the sink once, when combining.
inline void InitRowState(const AttentionArgs& a, const Plan& plan,
                         const RowTable& rt, int64_t n, float* m, float* l) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < n; ++r) {
    const float sink = a.sinks != nullptr && plan.num_chunks == 1
                           ? a.sinks[rt.head[r]] : neg_inf;
    const bool has_sink = !(sink == neg_inf);
    m[r] = has_sink ? sink : neg_inf;
    l[r] = has_sink ? 1.0f : 0.0f;
  }
}

// Index visibility of a block's rows (SEMANTICS.md): key j is hidden from
// the row of query i when j > i + hi_shift (has_hi) or j < i + lo_shift
// (has_lo). A tile [j0, j0 + n) cuts some row's range only if it ends after
// hi_first or starts before lo_last (the block's first and last queries).
struct IndexCuts {
  bool has_hi = false, has_lo = false;
  int64_t hi_shift = 0, lo_shift = 0;
  int64_t hi_first = 0, lo_last = 0;
};

// The scratch of one tiled task (ScratchLayout's regions).
struct TileScratch {
  int cols;     // vectors of queries in the block
  int64_t mq;   // block rows
  float* qt;    // Qt [Dk][mq], scaled
  float* st;    // S^T, then P^T [key tile][mq]
  float* acc;   // O^T [Dv][mq]
  float* m;
  float* l;
  float* alpha;
  float* ktile;
  float* vtile;
};

// One task's block of query rows and the keys they see (SEMANTICS.md): key
// j is visible to query i when j < Lk_b and lo(i) <= j <= hi(i), with
// p(i) = i + offset, hi(i) = p(i) + right (right <= 0 when causal) and
// lo(i) = p(i) - left.
struct BlockTask {
  TaskIndex index;
  int64_t b, hkv;
  int64_t kv_valid;   // Lk_b
  int64_t offset;     // p(i) - i
  int64_t rows;       // valid rows of the block (FillRowTable)
  IndexCuts cuts;
  int64_t kv_start, kv_end;  // keys any row sees, within the task's chunk
};

// The block of task `task`, its row table filled (mq lanes).
inline BlockTask MakeBlockTask(const AttentionArgs& a, const Plan& plan,
                               int64_t task, int64_t mq, RowTable* rt) {
  BlockTask t;
  t.index = TaskAt(plan, task);
  t.b = t.index.group / a.kv_heads;
  t.hkv = t.index.group % a.kv_heads;
  t.kv_valid = a.kv_lengths != nullptr ? a.kv_lengths[t.b] : a.kv_len;
  t.offset = a.bottom_right ? t.kv_valid - a.q_len : 0;
  t.rows = FillRowTable(a, t.index.block, t.hkv, t.offset, mq, rt);
  const bool has_hi = a.causal || a.window_right >= 0;
  const int64_t right =
      a.causal ? (a.window_right >= 0 ? std::min<int64_t>(a.window_right, 0) : 0)
               : a.window_right;
  const bool has_lo = a.window_left >= 0;
  const int64_t left = a.window_left;
  int64_t i_min = a.q_len, i_max = 0;
  for (int64_t r = 0; r < t.rows; ++r) {
    i_min = std::min<int64_t>(i_min, rt->query[r]);
    i_max = std::max<int64_t>(i_max, rt->query[r]);
  }
  const int64_t p_first = i_min + t.offset;
  const int64_t p_last = i_max + t.offset;
  t.cuts.has_hi = has_hi;
  t.cuts.has_lo = has_lo;
  t.cuts.hi_shift = t.offset + right;
  t.cuts.lo_shift = t.offset - left;
  t.cuts.hi_first = p_first + right;
  t.cuts.lo_last = p_last - left;
  t.kv_start = has_lo ? std::max<int64_t>(0, p_first - left) : 0;
  t.kv_end = t.kv_valid;
  if (has_hi) t.kv_end = std::min(t.kv_end, std::max<int64_t>(0, p_last + right + 1));
  if (plan.num_chunks > 1) {
    t.kv_start = std::max(t.kv_start, t.index.chunk * plan.chunk_keys);
    t.kv_end = std::min(t.kv_end, (t.index.chunk + 1) * plan.chunk_keys);
  }
  if (t.kv_start > t.kv_end) t.kv_start = t.kv_end;
  return t;
}

// Whether rows [0, n) of a K/V tile (row stride `row`, `cols` floats each)
// hold only finite values.
template <class D>
HWY_INLINE bool AllFinite(D d, const float* HWY_RESTRICT x, int64_t row,
                          int64_t n, int64_t cols) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const hn::RebindToUnsigned<D> du;
  // x * 0 is +-0 for finite x and NaN for Inf/NaN: OR the bits of all.
  const auto zero = hn::Zero(d);
  auto acc0 = hn::Zero(du), acc1 = acc0;
  bool finite = true;
  for (int64_t t = 0; t < n; ++t) {
    const float* HWY_RESTRICT r = x + t * row;
    int64_t e = 0;
    for (; e + 2 * N <= cols; e += 2 * N) {
      acc0 = hn::Or(acc0, hn::BitCast(du, hn::Mul(hn::LoadU(d, r + e), zero)));
      acc1 = hn::Or(acc1, hn::BitCast(du, hn::Mul(hn::LoadU(d, r + e + N), zero)));
    }
    for (; e + N <= cols; e += N) {
      acc0 = hn::Or(acc0, hn::BitCast(du, hn::Mul(hn::LoadU(d, r + e), zero)));
    }
    for (; e < cols; ++e) finite &= std::isfinite(r[e]);
  }
  const auto magnitude = hn::And(hn::Or(acc0, acc1), hn::Set(du, 0x7FFFFFFFu));
  return finite && hn::AllTrue(du, hn::Eq(magnitude, hn::Zero(du)));
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_BLOCK_INL_H_
