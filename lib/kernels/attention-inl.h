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
#include "lib/kernels/bf16_dot-inl.h"
#include "lib/kernels/convert-inl.h"
#include "lib/kernels/decode-inl.h"
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
// Keys per K/V tile. With a 64-query block (AVX-512) the score tile is
// 64 x 64 floats = 16 KiB; the products run on one pair of query vectors
// (32 queries) at a time, so their working set in L1D is half of it (8 KiB)
// plus half of the packed Qt (Dk x 32 floats, 16 KiB at Dk = 128) or of O^T,
// while the K/V tile (64 keys: 32 KiB of K and of V at D = 128) is read from
// L2 once per pair. Four query vectors per block rather than two halve the
// K/V traffic from L3, where the 2 MiB of K/V a block of L2048 D128 reads
// do not fit in a 1 MiB L2: measured in one process, alternating, 1 thread,
// B1 H8 L2048, median GFLOP/s of 20 calls on a shared Xeon VM: D128 55.8 ->
// 58.1, 56.3 -> 61.3; D128 causal 50.3 -> 57.3; D64 53.5 -> 59.4; L512 and
// L256 D64 unchanged.
constexpr int64_t kKeyTile = 64;
// Runs that a decode tile's f32 keys come from (DecodeTiles). On the Zen 5
// (B1 Hq32 Hkv8 D128, K/V from memory, one process alternating with tiles
// of consecutive keys, medians of 30 calls, three processes each): f32 1
// thread +23% to +30% (Lk 4096 and 16384), 2 threads +9% to +25%. 2 and 8
// runs gained less (+13%, +14% with 1 thread). bf16 K/V gained +2% to +16%
// with 1 thread but 0% to -5% with 2; f16 +15% to +17% with 1 thread, +1%
// to +6% with 2 at Lk 65536 but 5-12% slower at Lk 4096 (processes
// alternating). So 16-bit K/V keep tiles of consecutive keys.
constexpr int64_t kDecodeRuns = 4;
// Scratch regions start on this many floats (256 bytes: one SVE-2048 vector).
constexpr int64_t kScratchAlign = 64;
// Bounds of split (decode) calls: block rows are at most kQueryBlockVectors
// vectors of at most 64 lanes (SVE-2048); the driver keeps the chunk count
// at most kMaxChunks.
constexpr int64_t kMaxBlockRows = kQueryBlockVectors * 64;
constexpr int64_t kMaxChunks = kMaxSplitChunks;

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
  s.qt = take(head_dim_qk * mq);
  s.st = take(kKeyTile * mq);
  s.acc = take(head_dim_v * mq);
  s.m = take(mq);
  s.l = take(mq);
  s.alpha = take(mq);
  // f32 copies of one K and V tile when K/V are stored in 16 bits.
  s.ktile = take(kKeyTile * head_dim_qk);
  s.vtile = take(kKeyTile * head_dim_v);
  s.rows = take(RowTable::Floats(mq));
  s.mask = take(MaskBlock::Floats(mq, kKeyTile));
  s.total = at;
  return s;
}

inline size_t ScratchFloatsImpl(int64_t head_dim_qk, int64_t head_dim_v) {
  return static_cast<size_t>(MakeLayout(head_dim_qk, head_dim_v).total);
}

// dst[0..n) = x[0..n) * inv in O's storage type (16-bit rounded to nearest
// even; f16 in hardware where the target converts it).
template <class D>
HWY_INLINE void StoreOutputRow(D d, int o_type, const float* HWY_RESTRICT x,
                               int64_t n, float inv, void* dst) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto vinv = hn::Set(d, inv);
  int64_t e = 0;
  if (o_type == 0) {
    float* out = static_cast<float*>(dst);
    for (; e + N <= n; e += N) hn::StoreU(hn::Mul(hn::LoadU(d, x + e), vinv), d, out + e);
    for (; e < n; ++e) out[e] = x[e] * inv;
    return;
  }
  uint16_t* out = static_cast<uint16_t*>(dst);
#if SIMDATTN_HW_F16
  if (o_type == 1) {
    const hn::Rebind<hwy::float16_t, D> dh;
    for (; e + N <= n; e += N) {
      hn::StoreU(hn::DemoteTo(dh, hn::Mul(hn::LoadU(d, x + e), vinv)), dh,
                 reinterpret_cast<hwy::float16_t*>(out + e));
    }
  }
#endif
  for (; e < n; ++e) {
    const float y = x[e] * inv;
    out[e] = o_type == 1 ? F32ToF16(y) : F32ToBF16(y);
  }
}

// O = acc / l for the block's valid rows (element e of row r at
// acc[e * e_stride + r * r_stride]: rows contiguous when e_stride is 1, else
// the O^T tile of the kernel, e_stride = block rows, r_stride = 1); rows
// without a visible key (l == 0) get zeros and LSE = -inf. l is NaN (not 0)
// for rows that saw NaN, which then stays NaN.
inline void WriteRows(const AttentionArgsF32& a, int64_t b, const RowTable& rt,
                      int64_t rows, const float* m, const float* l,
                      const float* acc, int64_t e_stride, int64_t r_stride) {
  const hn::ScalableTag<float> d;
  const int64_t dv = a.head_dim_v;
  const int64_t o_size = a.o_type == 0 ? 4 : 2;
  auto out_row = [&](int64_t r) -> void* {
    return static_cast<char*>(a.o) +
           (b * a.o_strides[0] + rt.head[r] * a.o_strides[1] +
            rt.query[r] * a.o_strides[2]) * o_size;
  };
  auto inverse = [&](int64_t r) { return l[r] == 0.0f ? 0.0f : 1.0f / l[r]; };
  // Element e of row r, already divided by l.
  auto put = [&](int64_t r, int64_t e, float x) {
    void* dst = out_row(r);
    if (a.o_type == 0) {
      static_cast<float*>(dst)[e] = x;
    } else {
      static_cast<uint16_t*>(dst)[e] = a.o_type == 1 ? F32ToF16(x) : F32ToBF16(x);
    }
  };
  int64_t r = 0;
  if (e_stride == 1) {
    for (; r < rows; ++r) {
      StoreOutputRow(d, a.o_type, acc + r * r_stride, dv, inverse(r), out_row(r));
    }
  }
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // O^T tile on AVX-512: 16 rows at a time through 16x16 transposes, each
  // row's 16 values then scaled and stored straight to O (f32; a streaming
  // store where a.stream_output and the 16 floats are one cache line), or
  // through StoreOutputRow (16-bit O).
  bool streamed = false;
  if (r_stride == 1 && e_stride > 1) {
    const hn::Full512<float> d16;
    const int64_t full = dv / 16 * 16;
    for (; r + 16 <= rows; r += 16) {
      for (int64_t e = 0; e < full; e += 16) {
        hn::Vec<decltype(d16)> v[16];
        for (int t = 0; t < 16; ++t) v[t] = hn::LoadU(d16, acc + (e + t) * e_stride + r);
        Transpose16x16(v);  // v[c]: elements e .. e + 15 of row r + c
        for (int c = 0; c < 16; ++c) {
          char* dst = static_cast<char*>(out_row(r + c)) + e * o_size;
          if (a.o_type == 0) {
            const auto y = hn::Mul(v[c], hn::Set(d16, inverse(r + c)));
            float* out = reinterpret_cast<float*>(dst);
            if (a.stream_output && (reinterpret_cast<uintptr_t>(out) & 63) == 0) {
              hn::Stream(y, d16, out);
              streamed = true;
            } else {
              hn::StoreU(y, d16, out);
            }
          } else {
            HWY_ALIGN float tmp[16];
            hn::Store(v[c], d16, tmp);
            StoreOutputRow(d16, a.o_type, tmp, 16, inverse(r + c), dst);
          }
        }
      }
      for (int64_t e = full; e < dv; ++e) {
        for (int c = 0; c < 16; ++c) {
          put(r + c, e, acc[e * e_stride + r + c] * inverse(r + c));
        }
      }
    }
  }
  // Streaming stores are weakly ordered: make them visible before the task
  // reports done (other threads, then the caller, read O after that).
  if (streamed) hwy::FlushStream();
#endif
#if HWY_TARGET != HWY_SCALAR
  // O^T tile: 4 rows at a time through 4x4 transposes, 64 columns per pass.
  constexpr int64_t kChunk = 64;
  HWY_ALIGN float tmp[4][kChunk];
  const hn::CappedTag<float, 4> d4;
  for (; r + 4 <= rows && r_stride == 1; r += 4) {
    for (int64_t e0 = 0; e0 < dv; e0 += kChunk) {
      const int64_t n = std::min(kChunk, dv - e0);
      int64_t e = 0;
      for (; e + 4 <= n; e += 4) {
        const float* src = acc + (e0 + e) * e_stride + r;
        auto a0 = hn::LoadU(d4, src), a1 = hn::LoadU(d4, src + e_stride);
        auto a2 = hn::LoadU(d4, src + 2 * e_stride), a3 = hn::LoadU(d4, src + 3 * e_stride);
        Transpose4x4(d4, &a0, &a1, &a2, &a3);  // a_t: row r + t
        hn::StoreU(a0, d4, tmp[0] + e);
        hn::StoreU(a1, d4, tmp[1] + e);
        hn::StoreU(a2, d4, tmp[2] + e);
        hn::StoreU(a3, d4, tmp[3] + e);
      }
      for (; e < n; ++e) {
        for (int t = 0; t < 4; ++t) tmp[t][e] = acc[(e0 + e) * e_stride + r + t];
      }
      for (int t = 0; t < 4; ++t) {
        char* dst = static_cast<char*>(out_row(r + t)) + e0 * o_size;
        StoreOutputRow(d, a.o_type, tmp[t], n, inverse(r + t), dst);
      }
    }
  }
#endif
  for (; r < rows; ++r) {  // leftover rows: one element at a time
    const float inv = inverse(r);
    for (int64_t e = 0; e < dv; ++e) put(r, e, acc[e * e_stride + r * r_stride] * inv);
  }
  if (a.lse != nullptr) {
    for (r = 0; r < rows; ++r) {
      float* lse = a.lse + b * a.lse_strides[0] + rt.head[r] * a.lse_strides[1] +
                   rt.query[r] * a.lse_strides[2];
      *lse = l[r] == 0.0f ? -std::numeric_limits<float>::infinity()
                          : m[r] + std::log(l[r]);
    }
  }
}

// Which query each lane of a block is: block `block` of group (b, hkv).
// Returns the number of valid rows; padding lanes repeat the last valid row
// (their results are never stored).
inline int64_t FillRowTable(const AttentionArgsF32& a, int64_t block,
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

// The K/V rows of one (batch, KV head) group in their storage type.
struct KvRows {
  Storage type;
  int64_t size;  // bytes per element
  const char* k;
  const char* v;

  KvRows(const AttentionArgsF32& a, int64_t b, int64_t hkv)
      : type(static_cast<Storage>(a.kv_type)),
        size(type == Storage::kF32 ? 4 : 2),
        k(static_cast<const char*>(a.k) +
          (b * a.k_strides[0] + hkv * a.k_strides[1]) * size),
        v(static_cast<const char*>(a.v) +
          (b * a.v_strides[0] + hkv * a.v_strides[1]) * size) {}
};

// Asks for rows [first, first + n) of K and V (clamped to `end`) to be
// brought into L2 while the current tile computes. Each row is its own
// stream at a large stride (a head's K/V rarely fits L2 next to the rest),
// which the hardware prefetchers follow only partly.
inline void PrefetchKvTile(const AttentionArgsF32& a, const KvRows& src,
                           int64_t first, int64_t n, int64_t end) {
  const int64_t last = std::min(first + n, end);
  const int64_t k_bytes = a.head_dim_qk * src.size;
  const int64_t v_bytes = a.head_dim_v * src.size;
  for (int64_t j = first; j < last; ++j) {
    const char* k = src.k + j * a.k_strides[2] * src.size;
    const char* v = src.v + j * a.v_strides[2] * src.size;
    for (int64_t byte = 0; byte < k_bytes; byte += 64) __builtin_prefetch(k + byte, 0, 2);
    for (int64_t byte = 0; byte < v_bytes; byte += 64) __builtin_prefetch(v + byte, 0, 2);
  }
}

// One K/V tile as f32 rows: in place for f32 storage, otherwise widened into
// ktile/vtile once per tile and block (nk x (Dk + Dv) conversions against
// 2 x nk x (Dk + Dv) x block-rows FMAs).
struct KvTile {
  const float* k;
  const float* v;
  int64_t k_row, v_row;  // f32 row strides
};

template <class D>
HWY_INLINE KvTile LoadKvTile(D d, const AttentionArgsF32& a, const KvRows& src,
                             int64_t kv_begin, int64_t nk,
                             float* HWY_RESTRICT ktile,
                             float* HWY_RESTRICT vtile) {
  if (src.type == Storage::kF32) {
    return {reinterpret_cast<const float*>(src.k) + kv_begin * a.k_strides[2],
            reinterpret_cast<const float*>(src.v) + kv_begin * a.v_strides[2],
            a.k_strides[2], a.v_strides[2]};
  }
  WidenRows(d, reinterpret_cast<const uint16_t*>(src.k) + kv_begin * a.k_strides[2],
            a.k_strides[2], src.type, nk, a.head_dim_qk, ktile);
  WidenRows(d, reinterpret_cast<const uint16_t*>(src.v) + kv_begin * a.v_strides[2],
            a.v_strides[2], src.type, nk, a.head_dim_v, vtile);
  return {ktile, vtile, a.head_dim_qk, a.head_dim_v};
}

// Packed K/V of one (batch, KV head) group: the layout TileGemmPackedRows
// reads, built once per call and group (PackKvImpl) and shared by all of the
// group's query blocks. With T = kTileRows and n = the group's valid keys:
//   K: keys in groups of T, the group of key j at (j - j % T) * Dk holding
//      [Dk][T]; the last n % T keys at (n - n % T) * Dk as [Dk][n % T].
//   V: value dims in groups of T, group g at g * T * n holding [key][T]; the
//      last Dv % T dims at (Dv - Dv % T) * n as [key][Dv % T].
// Both products then read their broadcast operand sequentially, where
// row-major K/V costs one new cache line per key (or per key and value-dim
// group) and several streams at a large stride. Measured on AVX-512 (f32,
// B1 H8 L2048 D128, 1 thread, in one process): 59% -> 71% of the FMA peak
// without a mask, 58% -> 66% causal. A tile [j0, j0 + nk) needs j0 % T == 0
// and j0 + nk a multiple of T or n.
struct PackedKv {
  const float* k = nullptr;  // null: not packed
  const float* v = nullptr;
  int64_t keys = 0;          // n above

  // Keys [j0, j0 + nk): S^T tile = K·Qt.
  template <class D>
  void Scores(D d, int cols, int64_t j0, int64_t nk, int64_t dk,
              const float* HWY_RESTRICT qt, int64_t mq,
              float* HWY_RESTRICT st) const {
    const int64_t full = nk / kTileRows * kTileRows;
    TileGemmPackedRows<false, false>(d, cols, nk, k + j0 * dk, kTileRows * dk,
                                     k + (j0 + full) * dk, qt, mq, dk, nullptr,
                                     st, mq);
  }
  // O^T += V^T·P^T over keys [j0, j0 + nk) (see TileGemm for kGuard).
  template <bool kGuard, class D>
  void Values(D d, int cols, int64_t j0, int64_t nk, int64_t dv,
              const float* HWY_RESTRICT pt, int64_t mq,
              const float* HWY_RESTRICT scale, float* HWY_RESTRICT acc) const {
    const int64_t full = dv / kTileRows * kTileRows;
    TileGemmPackedRows<true, kGuard>(d, cols, dv, v + j0 * kTileRows,
                                     kTileRows * keys,
                                     v + full * keys + j0 * (dv - full), pt,
                                     mq, nk, scale, acc, mq);
  }
  // Whether V rows [j0, j0 + nk) are all finite.
  template <class D>
  bool ValuesFinite(D d, int64_t j0, int64_t nk, int64_t dv) const;
};

// One row of K or V (row j of `base`, `n` elements) as f32: in place for f32
// storage, otherwise widened into `tmp`.
template <class D>
HWY_INLINE const float* RowF32(D d, const KvRows& src, const char* base,
                               int64_t stride, int64_t j, int64_t n,
                               float* HWY_RESTRICT tmp) {
  if (src.type == Storage::kF32) {
    return reinterpret_cast<const float*>(base) + j * stride;
  }
  WidenRow(d, reinterpret_cast<const uint16_t*>(base) + j * stride, src.type, n, tmp);
  return tmp;
}

// Whether a call runs the native bf16 products: the AVX3_BF16 entry
// (kNative), with Q, K and V all stored in bf16, outside the decode
// micro-path (bound by memory, it widens K/V in registers instead).
template <bool kNative>
HWY_INLINE bool NativeBf16(const AttentionArgsF32& a) {
  return SIMDATTN_NATIVE_BF16 && kNative && a.q_type == 2 && a.kv_type == 2 &&
         !a.decode_path;
}

#if SIMDATTN_NATIVE_BF16
// One K row (dk bf16 values) as ceil(dk / 2) pairs; an odd dk's last pair
// gets a zero upper half.
inline void KeyRowPairs(const uint16_t* HWY_RESTRICT row, int64_t dk,
                        uint32_t* HWY_RESTRICT pairs) {
  pairs[(dk + 1) / 2 - 1] = 0;
  std::memcpy(pairs, row, static_cast<size_t>(dk) * sizeof(uint16_t));
}

// PackedKv's layout for the native products, in bf16 pairs (u32). With
// T = kTileRows, n = the group's valid keys, Dk2 = ceil(Dk / 2) and
// n2 = ceil(n / 2):
//   K: keys in groups of T, the group of key j at (j - j % T) * Dk2 holding
//      [Dk2][T] (pair p of a key: head dims 2p and 2p + 1); the last n % T
//      keys at (n - n % T) * Dk2 as [Dk2][n % T];
//   V: value dims in groups of T, group g at g * T * n2 holding [n2][T]
//      (pair p: keys 2p and 2p + 1); the last Dv % T dims at
//      (Dv - Dv % T) * n2 as [n2][Dv % T].
// Both fit in PackedGroupFloats(). scratch holds kTileRows x max(Dk, Dv)
// floats.
inline void PackKvBf16(const AttentionArgsF32& a, int64_t group,
                       uint32_t* HWY_RESTRICT dst,
                       uint32_t* HWY_RESTRICT scratch) {
  constexpr int64_t T = kTileRows;
  const int64_t b = group / a.kv_heads;
  const int64_t hkv = group % a.kv_heads;
  const int64_t n = a.kv_lengths != nullptr ? a.kv_lengths[b] : a.kv_len;
  const int64_t dk = a.head_dim_qk, dk2 = (dk + 1) / 2;
  const int64_t dv = a.head_dim_v, n2 = (n + 1) / 2;
  const KvRows src(a, b, hkv);
  const uint16_t* k = reinterpret_cast<const uint16_t*>(src.k);
  const uint16_t* v = reinterpret_cast<const uint16_t*>(src.v);
  for (int64_t j0 = 0; j0 < n; j0 += T) {
    const int64_t w = std::min(T, n - j0);
    for (int64_t r = 0; r < w; ++r) {
      KeyRowPairs(k + (j0 + r) * a.k_strides[2], dk, scratch + r * dk2);
    }
    uint32_t* HWY_RESTRICT out = dst + j0 * dk2;
    for (int64_t p = 0; p < dk2; ++p) {
      for (int64_t r = 0; r < w; ++r) out[p * w + r] = scratch[r * dk2 + p];
    }
  }
  uint32_t* HWY_RESTRICT vp = dst + PackedKFloats(a);
  const int64_t full = dv / T * T;
  const int64_t rem = dv - full;
  for (int64_t p = 0; p < n2; ++p) {  // keys 2p, 2p + 1 paired along dv
    PairValueRows(v + 2 * p * a.v_strides[2], a.v_strides[2],
                  std::min<int64_t>(2, n - 2 * p), dv, scratch);
    for (int64_t e = 0; e < full; e += T) {
      std::memcpy(vp + e * n2 + p * T, scratch + e, T * sizeof(uint32_t));
    }
    for (int64_t i = 0; i < rem; ++i) vp[full * n2 + p * rem + i] = scratch[full + i];
  }
}

// Where the native products read keys [j0, j0 + nk) in the layout above
// (j0 % kTileRows == 0; nk a multiple of kTileRows or ending at n), as the
// broadcast rows of Q·Kᵀ and, for P·V, the value dims over the key pairs
// starting at j0 / 2 (j0 is even).
inline PairRows PackedKeyPairs(const PackedKv& p, int64_t j0, int64_t nk,
                               int64_t dk2) {
  const uint32_t* k = reinterpret_cast<const uint32_t*>(p.k);
  const int64_t full = nk / kTileRows * kTileRows;
  return {k + j0 * dk2, kTileRows * dk2, 1, kTileRows,
          k + (j0 + full) * dk2, 1, nk - full};
}
inline PairRows PackedValuePairs(const PackedKv& p, int64_t j0, int64_t dv) {
  const uint32_t* v = reinterpret_cast<const uint32_t*>(p.v);
  const int64_t full = dv / kTileRows * kTileRows;
  const int64_t n2 = (p.keys + 1) / 2, p0 = j0 / 2;
  return {v + p0 * kTileRows, kTileRows * n2, 1, kTileRows,
          v + full * n2 + p0 * (dv - full), 1, dv - full};
}

// The same for a tile read in place (LoadKvTileBf16): K as [nk][Dk2],
// V pairs as [ceil(nk / 2)][Dv].
inline PairRows TileKeyPairs(const uint32_t* k2, int64_t nk, int64_t dk2) {
  const int64_t full = nk / kTileRows * kTileRows;
  return {k2, kTileRows * dk2, dk2, 1, k2 + full * dk2, dk2, 1};
}
inline PairRows TileValuePairs(const uint32_t* v2, int64_t dv) {
  const int64_t full = dv / kTileRows * kTileRows;
  return {v2, kTileRows, 1, dv, v2 + full, 1, dv};
}

// qt2[p * mq + r] = the pair of head dims 2p, 2p + 1 of row r's query, as
// stored (bf16, unscaled: the scores are scaled in f32 afterwards).
inline void PackQueriesBf16(const AttentionArgsF32& a, int64_t b,
                            const RowTable& rt, int64_t mq,
                            uint32_t* HWY_RESTRICT qt2) {
  const int64_t dk = a.head_dim_qk, dk2 = (dk + 1) / 2;
  for (int64_t r = 0; r < mq; ++r) {
    const uint16_t* q = static_cast<const uint16_t*>(a.q) + b * a.q_strides[0] +
                        rt.head[r] * a.q_strides[1] + rt.query[r] * a.q_strides[2];
    for (int64_t p = 0; p < dk2; ++p) {
      const uint32_t hi = 2 * p + 1 < dk ? q[2 * p + 1] : 0u;
      qt2[p * mq + r] = q[2 * p] | hi << 16;
    }
  }
}

// One K/V tile for the native products, read in place from storage: K rows
// as pairs into k2 ([nk][Dk2]), V key pairs into v2 ([ceil(nk / 2)][Dv]).
inline void LoadKvTileBf16(const AttentionArgsF32& a, const KvRows& src,
                           int64_t kv_begin, int64_t nk,
                           uint32_t* HWY_RESTRICT k2,
                           uint32_t* HWY_RESTRICT v2) {
  const int64_t dk = a.head_dim_qk, dk2 = (dk + 1) / 2;
  const uint16_t* k = reinterpret_cast<const uint16_t*>(src.k);
  for (int64_t j = 0; j < nk; ++j) {
    KeyRowPairs(k + (kv_begin + j) * a.k_strides[2], dk, k2 + j * dk2);
  }
  PairValueRows(reinterpret_cast<const uint16_t*>(src.v) + kv_begin * a.v_strides[2],
                a.v_strides[2], nk, a.head_dim_v, v2);
}

// Whether rows [first, first + nk) of V (bf16 storage) are all finite.
inline bool Bf16ValuesFinite(const AttentionArgsF32& a, const KvRows& src,
                             int64_t first, int64_t nk) {
  const hn::ScalableTag<uint16_t> du;
  const int64_t N = static_cast<int64_t>(hn::Lanes(du));
  const int64_t dv = a.head_dim_v;
  const auto exp = hn::Set(du, 0x7F80);  // exponent all ones: Inf or NaN
  auto top = hn::Zero(du);
  uint16_t tail = 0;
  for (int64_t j = first; j < first + nk; ++j) {
    const uint16_t* row = reinterpret_cast<const uint16_t*>(src.v) + j * a.v_strides[2];
    int64_t e = 0;
    for (; e + N <= dv; e += N) top = hn::Max(top, hn::And(hn::LoadU(du, row + e), exp));
    for (; e < dv; ++e) tail = std::max<uint16_t>(tail, row[e] & 0x7F80);
  }
  return tail != 0x7F80 && hn::AllFalse(du, hn::Eq(top, exp));
}
#endif  // SIMDATTN_NATIVE_BF16

// Builds the PackedKv layout of group `group` in dst (PackedGroupFloats()
// floats; the bf16-pair layout above for the native products); scratch
// holds kTileRows x max(Dk, Dv) floats.
template <bool kNative>
inline void PackKvImpl(const AttentionArgsF32& a, int64_t group,
                       float* HWY_RESTRICT dst, float* HWY_RESTRICT scratch) {
#if SIMDATTN_NATIVE_BF16
  if (NativeBf16<kNative>(a)) {
    PackKvBf16(a, group, reinterpret_cast<uint32_t*>(dst),
               reinterpret_cast<uint32_t*>(scratch));
    return;
  }
#endif
  const hn::ScalableTag<float> d;
  constexpr int64_t T = kTileRows;
  const int64_t b = group / a.kv_heads;
  const int64_t hkv = group % a.kv_heads;
  const int64_t n = a.kv_lengths != nullptr ? a.kv_lengths[b] : a.kv_len;
  const int64_t dk = a.head_dim_qk;
  const int64_t dv = a.head_dim_v;
  const KvRows src(a, b, hkv);
  float* HWY_RESTRICT kp = dst;
  for (int64_t j0 = 0; j0 < n; j0 += T) {
    const int64_t w = std::min(T, n - j0);
    const float* rows[T];
    for (int64_t r = 0; r < w; ++r) {
      rows[r] = RowF32(d, src, src.k, a.k_strides[2], j0 + r, dk, scratch + r * dk);
    }
    float* HWY_RESTRICT out = kp + j0 * dk;
    int64_t i = 0;
#if HWY_TARGET != HWY_SCALAR
    if (w == T) {  // T is a multiple of 4: 4x4 blocks through transposes
      const hn::CappedTag<float, 4> d4;
      for (; i + 4 <= dk; i += 4) {
        for (int64_t r = 0; r < T; r += 4) {
          auto a0 = hn::LoadU(d4, rows[r] + i), a1 = hn::LoadU(d4, rows[r + 1] + i);
          auto a2 = hn::LoadU(d4, rows[r + 2] + i), a3 = hn::LoadU(d4, rows[r + 3] + i);
          Transpose4x4(d4, &a0, &a1, &a2, &a3);  // a_t: element i + t of 4 keys
          hn::StoreU(a0, d4, out + i * T + r);
          hn::StoreU(a1, d4, out + (i + 1) * T + r);
          hn::StoreU(a2, d4, out + (i + 2) * T + r);
          hn::StoreU(a3, d4, out + (i + 3) * T + r);
        }
      }
    }
#endif
    for (; i < dk; ++i) {
      for (int64_t r = 0; r < w; ++r) out[i * w + r] = rows[r][i];
    }
  }
  float* HWY_RESTRICT vp = dst + PackedKFloats(a);
  const int64_t full = dv / T * T;
  const int64_t rem = dv - full;
  const hn::CappedTag<float, T> dg;
  const int64_t G = static_cast<int64_t>(hn::Lanes(dg));
  for (int64_t j = 0; j < n; ++j) {
    const float* row = RowF32(d, src, src.v, a.v_strides[2], j, dv, scratch);
    for (int64_t e = 0; e < full; e += T) {
      float* HWY_RESTRICT out = vp + e * n + j * T;
      for (int64_t c = 0; c < T; c += G) {
        hn::StoreU(hn::LoadU(dg, row + e + c), dg, out + c);
      }
    }
    for (int64_t i = 0; i < rem; ++i) vp[full * n + j * rem + i] = row[full + i];
  }
}

// Row r's query as stored (any type).
inline const void* QueryRowPtr(const AttentionArgsF32& a, int64_t b,
                               const RowTable& rt, int64_t r) {
  const int64_t at = b * a.q_strides[0] + rt.head[r] * a.q_strides[1] +
                     rt.query[r] * a.q_strides[2];
  return static_cast<const char*>(a.q) + at * (a.q_type == 0 ? 4 : 2);
}

// Row r's query widened exactly to f32 and scaled: dst[i] = scale * q[i].
// 16-bit rows go through WidenRow (hardware f16 where the target has it).
template <class D>
HWY_INLINE void QueryRow(D d, const AttentionArgsF32& a, int64_t b,
                         const RowTable& rt, int64_t r,
                         float* HWY_RESTRICT dst) {
  const void* src = QueryRowPtr(a, b, rt, r);
  const int64_t dk = a.head_dim_qk;
  if (a.q_type == 0) {
    std::memcpy(dst, src, static_cast<size_t>(dk) * sizeof(float));
  } else {
    WidenRow(d, static_cast<const uint16_t*>(src),
             a.q_type == 1 ? Storage::kF16 : Storage::kBF16, dk, dst);
  }
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto scale = hn::Set(d, a.scale);
  int64_t i = 0;
  for (; i + N <= dk; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, dst + i), scale), d, dst + i);
  for (; i < dk; ++i) dst[i] *= a.scale;
}

// qt[i * mq + r] = scale * q_r[i] for the block's mq lanes. f32 rows are
// read in place: on AVX-512 16 rows at a time through 16x16 transposes,
// elsewhere 4 at a time through 4x4 transposes, scaled after the transpose
// (the same single rounding of scale * q). 16-bit rows are first widened
// and scaled into `rows` (4 x Dk floats). At L256 D64 the row copies and
// 4x4 transposes took about 8% of a call (perf, AVX3_DL).
template <class D>
HWY_INLINE void PackQueries(D d, const AttentionArgsF32& a, int64_t b,
                            const RowTable& rt, int64_t mq,
                            float* HWY_RESTRICT rows, float* HWY_RESTRICT qt) {
  const int64_t dk = a.head_dim_qk;
  int64_t r = 0;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (a.q_type == 0 && mq % 16 == 0) {
    const hn::Full512<float> d16;
    const auto scale = hn::Set(d16, a.scale);
    for (; r < mq; r += 16) {
      const float* src[16];
      for (int t = 0; t < 16; ++t) {
        src[t] = static_cast<const float*>(QueryRowPtr(a, b, rt, r + t));
      }
      int64_t i = 0;
      for (; i + 16 <= dk; i += 16) {
        hn::Vec<decltype(d16)> v[16];
        for (int t = 0; t < 16; ++t) v[t] = hn::LoadU(d16, src[t] + i);
        Transpose16x16(v);  // v[c]: element i + c of the 16 rows
        for (int c = 0; c < 16; ++c) {
          hn::Store(hn::Mul(v[c], scale), d16, qt + (i + c) * mq + r);
        }
      }
      for (; i < dk; ++i) {
        for (int t = 0; t < 16; ++t) qt[i * mq + r + t] = src[t][i] * a.scale;
      }
    }
    return;
  }
#endif
#if HWY_TARGET != HWY_SCALAR
  const hn::CappedTag<float, 4> d4;
  const auto scale4 = hn::Set(d4, a.scale);
  for (; r + 4 <= mq; r += 4) {
    const float* src[4];
    if (a.q_type == 0) {
      for (int t = 0; t < 4; ++t) {
        src[t] = static_cast<const float*>(QueryRowPtr(a, b, rt, r + t));
      }
    } else {  // widened and scaled into rows
      for (int t = 0; t < 4; ++t) QueryRow(d, a, b, rt, r + t, rows + t * dk);
      for (int t = 0; t < 4; ++t) src[t] = rows + t * dk;
    }
    const bool scaled = a.q_type != 0;
    int64_t i = 0;
    for (; i + 4 <= dk; i += 4) {
      auto a0 = hn::LoadU(d4, src[0] + i), a1 = hn::LoadU(d4, src[1] + i);
      auto a2 = hn::LoadU(d4, src[2] + i), a3 = hn::LoadU(d4, src[3] + i);
      Transpose4x4(d4, &a0, &a1, &a2, &a3);  // a_t: element i + t of 4 lanes
      if (!scaled) {
        a0 = hn::Mul(a0, scale4);
        a1 = hn::Mul(a1, scale4);
        a2 = hn::Mul(a2, scale4);
        a3 = hn::Mul(a3, scale4);
      }
      float* out = qt + i * mq + r;
      hn::StoreU(a0, d4, out);
      hn::StoreU(a1, d4, out + mq);
      hn::StoreU(a2, d4, out + 2 * mq);
      hn::StoreU(a3, d4, out + 3 * mq);
    }
    for (; i < dk; ++i) {
      for (int t = 0; t < 4; ++t) {
        qt[i * mq + r + t] = scaled ? src[t][i] : src[t][i] * a.scale;
      }
    }
  }
#endif
  for (; r < mq; ++r) {
    QueryRow(d, a, b, rt, r, rows);
    for (int64_t i = 0; i < dk; ++i) qt[i * mq + r] = rows[i];
  }
}

// Starts the online softmax of `n` rows. A sink (one logit per head, no
// value) acts as a first key with score sink: m = sink, l = exp(sink - m) =
// 1; a -inf sink is no sink. Split calls add the sink once, when combining.
inline void InitRowState(const AttentionArgsF32& a, const RowTable& rt,
                         int64_t n, float* m, float* l) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < n; ++r) {
    const float sink = a.sinks != nullptr && a.num_chunks == 1
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

// Score and weight options on the decode path (decode-inl.h's Mods): the
// same rules and order as the tiled kernel (softcap, ALiBi, mask; dropout on
// the weights), applied per row with the keys along the lanes.
struct DecodeMods {
  static constexpr bool kActive = true;
  const AttentionArgsF32* a;
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

// The tiles of a decode task, with score/weight options (DecodeMods) or
// without (NoDecodeMods). A tile the mask hides from every row is skipped.
// `cuts` (null when Lq = 1) holds the index cuts of rows with different
// queries: a tile that cuts some row runs with them (and `mods`'s options).
template <class Mods>
HWY_INLINE void DecodeTiles(const AttentionArgsF32& a, const KvRows& src,
                            int64_t rows, const float* HWY_RESTRICT qrows,
                            int64_t kv_start, int64_t kv_end,
                            float* HWY_RESTRICT s, float* HWY_RESTRICT orow,
                            float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                            float* HWY_RESTRICT ktile, float* HWY_RESTRICT vtile,
                            MaskBlock* mask, Mods* mods, DecodeMods* cuts) {
  const hn::ScalableTag<float> d;
  const int64_t dk = a.head_dim_qk;
  const int64_t dv = a.head_dim_v;
  // f32 and bf16 K/V (and f16 where the target converts it in hardware) are
  // widened in registers as they are loaded; otherwise tile by tile.
  const bool in_registers = src.type != Storage::kF16 || kKvF16InRegisters;
  const int64_t ks = a.k_strides[2], vs = a.v_strides[2];
  int64_t kv_first = kv_start;
  if constexpr (!Mods::kActive) {
#if SIMDATTN_HAVE_DECODE_FUSED
    // Without options: 16-bit K/V widened in registers, one group of up to
    // 4 rows (Lq 1), head dims of whole vectors: the fused groups of 4 keys
    // (DecodeFused), then the keys left under a group as a tile.
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    if (src.type != Storage::kF32 && in_registers && cuts == nullptr && rows <= 4 &&
        dk % lanes == 0 && dv % lanes == 0 && dk <= kFusedMaxDk) {
      const int64_t n4 = (kv_end - kv_start) / 4 * 4;
      const uint16_t* k16 = reinterpret_cast<const uint16_t*>(src.k) + kv_start * ks;
      const uint16_t* v16 = reinterpret_cast<const uint16_t*>(src.v) + kv_start * vs;
      if (src.type == Storage::kF16) {
        DecodeFusedRows<1>(d, rows, qrows, dk, k16, ks, v16, vs, dv, n4, m, l, orow);
      } else {
        DecodeFusedRows<2>(d, rows, qrows, dk, k16, ks, v16, vs, dv, n4, m, l, orow);
      }
      kv_first = kv_start + n4;
    }
#endif
    // f32 K/V without options (and without per-row cuts): whole tiles take
    // their keys from kDecodeRuns runs that split those keys of the chunk
    // evenly (KeyAt), so that the tile's 4-key dot-product groups read one
    // row of each run and K and V stream as 4 sequences each. The rest of
    // the chunk (under a tile) follows as before. The split depends only on
    // the chunk, not on the thread count.
    if (src.type == Storage::kF32 && cuts == nullptr) {
      constexpr int64_t kRun = kKeyTile / kDecodeRuns;
      const int64_t run = (kv_end - kv_start) / kKeyTile * kRun;
      for (int64_t t = 0; t < run; t += kRun) {
        const int64_t first = kv_start + t;
        DecodeTile<0, kDecodeRuns>(
            d, rows, qrows, dk, reinterpret_cast<const float*>(src.k) + first * ks, ks,
            reinterpret_cast<const float*>(src.v) + first * vs, vs, dv, kKeyTile,
            a.kv_len - first, s, m, l, orow, *mods, run);
      }
      kv_first = kv_start + kDecodeRuns * run;
    }
  }
  for (int64_t kv_begin = kv_first; kv_begin < kv_end; kv_begin += kKeyTile) {
    const int64_t nk = std::min(kKeyTile, kv_end - kv_begin);
    if constexpr (Mods::kActive) {
      mods->kv_begin = kv_begin;
      if (mask != nullptr) {
        const MaskTile mt = MaskTileBias(d, a, mask, kv_begin, nk);
        if (!mt.visible) continue;
        mods->hide = mt.hidden;
        mods->bias = mt.bias;
      }
    }
    // Rows that exist past this tile may be prefetched, even past the chunk
    // (the next task streams on from there).
    const int64_t prefetch_end = a.kv_len - kv_begin;
    const auto tile = [&](const auto& tile_mods) {
      if (!in_registers) {  // widened tile by tile: prefetch the next whole
        PrefetchKvTile(a, src, kv_begin + kKeyTile, kKeyTile, kv_end);
        const KvTile t = LoadKvTile(d, a, src, kv_begin, nk, ktile, vtile);
        DecodeTile<0>(d, rows, qrows, dk, t.k, t.k_row, t.v, t.v_row, dv, nk, 0,
                      s, m, l, orow, tile_mods);
        return;
      }
      if (src.type == Storage::kF32) {
        const KvTile t = LoadKvTile(d, a, src, kv_begin, nk, ktile, vtile);
        DecodeTile<0>(d, rows, qrows, dk, t.k, t.k_row, t.v, t.v_row, dv, nk,
                      prefetch_end, s, m, l, orow, tile_mods);
        return;
      }
      const uint16_t* k16 = reinterpret_cast<const uint16_t*>(src.k) + kv_begin * ks;
      const uint16_t* v16 = reinterpret_cast<const uint16_t*>(src.v) + kv_begin * vs;
      if (src.type == Storage::kF16) {
        DecodeTile<1>(d, rows, qrows, dk, k16, ks, v16, vs, dv, nk, prefetch_end,
                      s, m, l, orow, tile_mods);
      } else {
        DecodeTile<2>(d, rows, qrows, dk, k16, ks, v16, vs, dv, nk, prefetch_end,
                      s, m, l, orow, tile_mods);
      }
    };
    if (cuts != nullptr && cuts->SetCuts(kv_begin, nk)) {
      tile(*cuts);  // cuts == mods when Mods is DecodeMods
      continue;
    }
    tile(*mods);
  }
}

// The decode micro-path for one task (args.decode_path): rows are the
// block's (head, query) rows, G x Lq of them (Lq = 1: the G heads, all
// seeing the same key range; Lq > 1: speculative decoding, whose rows `cut`
// limits each to its own range). Q rows go to `qrows` ([rows][Dk], scaled),
// outputs to `orow` ([rows][Dv]); the result is written as partials (split
// calls) or straight to O/LSE. mask_storage holds
// MaskBlock::Floats(block_rows, kKeyTile) floats.
inline void DecodeTaskF32(const AttentionArgsF32& a, int64_t task, int64_t b,
                          int64_t hkv, const RowTable& rt, int64_t rows,
                          const IndexCuts& cut, int64_t kv_start, int64_t kv_end,
                          float* HWY_RESTRICT qrows, float* HWY_RESTRICT s,
                          float* HWY_RESTRICT orow, float* HWY_RESTRICT m,
                          float* HWY_RESTRICT l, float* HWY_RESTRICT ktile,
                          float* HWY_RESTRICT vtile, float* mask_storage) {
  const hn::ScalableTag<float> d;
  const int64_t dk = a.head_dim_qk;
  const int64_t dv = a.head_dim_v;
  const int64_t mq = a.block_rows;
  const KvRows src(a, b, hkv);
  for (int64_t r = 0; r < rows; ++r) QueryRow(d, a, b, rt, r, qrows + r * dk);
  InitRowState(a, rt, rows, m, l);
  std::fill(orow, orow + rows * dv, 0.0f);
  MaskBlock mask(mask_storage, mq, kKeyTile);
  if (a.mask_kind != 0) mask.Init(a, b, rt);
  DecodeMods mods;
  mods.a = &a;
  mods.rt = &rt;
  mods.mask = a.mask_kind != 0 ? &mask : nullptr;
  mods.b = b;
  mods.index = cut;
  DecodeMods* cuts = a.q_len > 1 && (cut.has_hi || cut.has_lo) ? &mods : nullptr;
  if (a.mask_kind != 0 || a.softcap > 0.0f || a.alibi_slopes != nullptr ||
      a.dropout_p > 0.0f) {
    DecodeTiles(a, src, rows, qrows, kv_start, kv_end, s, orow, m, l, ktile,
                vtile, a.mask_kind != 0 ? &mask : nullptr, &mods, cuts);
  } else {
    NoDecodeMods none;
    DecodeTiles(a, src, rows, qrows, kv_start, kv_end, s, orow, m, l, ktile,
                vtile, nullptr, &none, cuts);
  }
  if (a.num_chunks > 1) {
    // The slot of a decode task: m and l (mq each), then O row by row
    // ([rows][dv], as CombineTaskF32Impl reads it for decode calls).
    float* out = a.partials + task * mq * (dv + 2);
    std::copy(m, m + rows, out);
    std::copy(l, l + rows, out + mq);
    std::copy(orow, orow + rows * dv, out + 2 * mq);
    return;
  }
  WriteRows(a, b, rt, rows, m, l, orow, 1, dv);
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

template <class D>
bool PackedKv::ValuesFinite(D d, int64_t j0, int64_t nk, int64_t dv) const {
  const int64_t full = dv / kTileRows * kTileRows;
  for (int64_t e = 0; e < full; e += kTileRows) {
    if (!AllFinite(d, v + e * keys + j0 * kTileRows, 0, 1, nk * kTileRows)) return false;
  }
  return AllFinite(d, v + full * keys + j0 * (dv - full), 0, 1, nk * (dv - full));
}

// Contract: args validated by the driver (f32/f16/bf16 storage, unit stride
// along the head dims, q_len/kv_len < 2^31 - 1, head dims >= 1); scratch
// 256-byte aligned with ScratchFloatsImpl() floats. Unsplit, writes the
// block's rows of O and LSE and nothing else; split, writes the task's slot
// of args.partials. kNative: the AVX3_BF16 entry (see NativeBf16).
template <bool kNative>
inline void AttentionTaskF32Impl(const AttentionArgsF32& a, int64_t task,
                                 float* HWY_RESTRICT scratch) {
  const hn::ScalableTag<float> d;
  const int64_t mq = a.block_rows;
  const int cols = static_cast<int>(mq / static_cast<int64_t>(hn::Lanes(d)));
  const ScratchLayout lay = MakeLayout(a.head_dim_qk, a.head_dim_v);
  float* HWY_RESTRICT qt = scratch + lay.qt;
  float* HWY_RESTRICT st = scratch + lay.st;
  float* HWY_RESTRICT acc = scratch + lay.acc;  // O^T: [Dv][mq]
  float* HWY_RESTRICT m = scratch + lay.m;
  float* HWY_RESTRICT l = scratch + lay.l;
  float* HWY_RESTRICT alpha = scratch + lay.alpha;
  float* HWY_RESTRICT ktile = scratch + lay.ktile;
  float* HWY_RESTRICT vtile = scratch + lay.vtile;
  RowTable rt(scratch + lay.rows, mq);

  // Consecutive tasks share a (batch, KV head) group, so its K/V stay in
  // L2/L3 from one task to the next; within a group the heaviest (last, for
  // causal) blocks come first so the dynamic scheduler ends on light ones.
  const int64_t per_group = a.num_blocks * a.num_chunks;
  const int64_t group_index = task / per_group;
  const int64_t block = a.num_blocks - 1 - (task % per_group) / a.num_chunks;
  const int64_t chunk = task % a.num_chunks;
  const int64_t b = group_index / a.kv_heads;
  const int64_t hkv = group_index % a.kv_heads;
  const int64_t dk = a.head_dim_qk;
  const int64_t dv = a.head_dim_v;

  // Index visibility (SEMANTICS.md): key j is visible to query i when
  // j < Lk_b, lo(i) <= j <= hi(i) with p(i) = i + offset, hi(i) = p(i) + right
  // (right = 0 for causal, min with window_right) and lo(i) = p(i) - left.
  const int64_t kv_valid = a.kv_lengths != nullptr ? a.kv_lengths[b] : a.kv_len;
  const int64_t offset = a.bottom_right ? kv_valid - a.q_len : 0;
  const int64_t rows = FillRowTable(a, block, hkv, offset, mq, &rt);
  const bool has_hi = a.causal || a.window_right >= 0;
  const int64_t right =
      a.causal ? (a.window_right >= 0 ? std::min<int64_t>(a.window_right, 0) : 0)
               : a.window_right;
  const bool has_lo = a.window_left >= 0;
  const int64_t left = a.window_left;
  int64_t i_min = a.q_len, i_max = 0;
  for (int64_t r = 0; r < rows; ++r) {
    i_min = std::min<int64_t>(i_min, rt.query[r]);
    i_max = std::max<int64_t>(i_max, rt.query[r]);
  }
  const int64_t p_first = i_min + offset;
  const int64_t p_last = i_max + offset;
  // Keys any row of the block sees, within this task's chunk.
  int64_t kv_start = has_lo ? std::max<int64_t>(0, p_first - left) : 0;
  int64_t kv_end = kv_valid;
  if (has_hi) kv_end = std::min(kv_end, std::max<int64_t>(0, p_last + right + 1));
  if (a.num_chunks > 1) {
    kv_start = std::max(kv_start, chunk * a.chunk_keys);
    kv_end = std::min(kv_end, (chunk + 1) * a.chunk_keys);
  }
  if (kv_start > kv_end) kv_start = kv_end;

  if (a.decode_path) {
    IndexCuts cut;
    cut.has_hi = has_hi;
    cut.has_lo = has_lo;
    cut.hi_shift = offset + right;
    cut.lo_shift = offset - left;
    cut.hi_first = p_first + right;
    cut.lo_last = p_last - left;
    DecodeTaskF32(a, task, b, hkv, rt, rows, cut, kv_start, kv_end, qt, st, acc, m,
                  l, ktile, vtile, scratch + lay.mask);
    return;
  }

  // Packed K/V: tiles start on a multiple of kTileRows and end on one (or
  // on the last valid key); the few keys this adds are hidden by the index
  // masks below.
  PackedKv packed;
  if (a.packed != nullptr) {
    packed.k = a.packed + (group_index - a.packed_first_group) * PackedGroupFloats(a);
    packed.v = packed.k + PackedKFloats(a);
    packed.keys = kv_valid;
    if (kv_start < kv_end) {
      kv_start = kv_start / kTileRows * kTileRows;
      kv_end = std::min(RoundUpTo(kv_end, kTileRows), kv_valid);
    }
  }

  // Pack the block transposed and scaled: qt[i][r] = scale * q_r[i]; padding
  // lanes repeat a valid row. ktile is free until the first tile. The native
  // products take pairs of head dims, unscaled (PackQueriesBf16).
  const bool native = NativeBf16<kNative>(a);
#if SIMDATTN_NATIVE_BF16
  // The same scratch as qt / ktile / vtile, as bf16 pairs.
  uint32_t* qt2 = reinterpret_cast<uint32_t*>(qt);
  uint32_t* k2 = reinterpret_cast<uint32_t*>(ktile);
  uint32_t* v2 = reinterpret_cast<uint32_t*>(vtile);
  const int64_t dk2 = (dk + 1) / 2;
  if (native) PackQueriesBf16(a, b, rt, mq, qt2);
#endif
  if (!native) PackQueries(d, a, b, rt, mq, ktile, qt);
  std::fill(acc, acc + dv * mq, 0.0f);
  InitRowState(a, rt, mq, m, l);
  const KvRows src(a, b, hkv);
  const bool has_mask = a.mask_kind != 0;
  MaskBlock mask(scratch + lay.mask, mq, kKeyTile);
  if (has_mask) mask.Init(a, b, rt);
  for (int64_t kv_begin = kv_start; kv_begin < kv_end; kv_begin += kKeyTile) {
    const int64_t nk = std::min(kKeyTile, kv_end - kv_begin);
    // A tile the mask hides from every row is skipped before any work.
    const MaskTile mtile = has_mask ? MaskTileRows(d, a, &mask, kv_begin, nk)
                                    : MaskTile{true, false, false};
    if (!mtile.visible) continue;
    KvTile tile{nullptr, nullptr, 0, 0};
    if (packed.k == nullptr) {
      PrefetchKvTile(a, src, kv_begin + kKeyTile, kKeyTile, kv_end);
#if SIMDATTN_NATIVE_BF16
      if (native) LoadKvTileBf16(a, src, kv_begin, nk, k2, v2);
#endif
      if (!native) tile = LoadKvTile(d, a, src, kv_begin, nk, ktile, vtile);
    }
    // S^T: rows are keys (broadcast along the head dim), reduction over Dk.
#if SIMDATTN_NATIVE_BF16
    if (native) {  // pairs of head dims, scaled on the way out
      const PairRows keys = packed.k != nullptr
                                ? PackedKeyPairs(packed, kv_begin, nk, dk2)
                                : TileKeyPairs(k2, nk, dk2);
      DotBf16Rows<false>(cols, nk, keys, qt2, mq, dk2, nullptr, a.scale, st, mq);
    } else
#endif
    if (packed.k != nullptr) {
      packed.Scores(d, cols, kv_begin, nk, dk, qt, mq, st);
    } else {
      TileGemmRows<false, false>(d, cols, nk, tile.k, tile.k_row, 1, qt, mq,
                                 dk, nullptr, st, mq);
    }
    if (a.softcap > 0.0f) SoftcapTile(d, cols, a.softcap, nk, st);
    if (a.alibi_slopes != nullptr) AlibiTile(d, cols, rt, kv_begin, nk, st);
    const bool mask_hid = mtile.bias && MaskTileApply(d, cols, mask, nk, st);
    // Index masks only where some row's window ends inside the tile.
    const bool cut_hi = has_hi && kv_begin + nk - 1 > p_first + right;
    const bool cut_lo = has_lo && kv_begin < p_last - left;
    if (cut_hi || cut_lo) {
      IndexMaskTile(d, cols, rt, kv_begin, nk, cut_hi, offset + right, cut_lo,
                    offset - left, st);
    }
    const bool rescale = SoftmaxTile(d, cols, st, nk, m, l, alpha);
    if (a.dropout_p > 0.0f) DropoutTile(d, cols, a, b, rt, kv_begin, nk, st);
    // O^T: rows are value dims (broadcast along the keys), reduction over the
    // tile's keys; the old O^T is rescaled by alpha on the way in.
    const float* scale = rescale ? alpha : nullptr;
    // Hidden keys have weight +0.0; the guarded product skips them so that
    // 0 * Inf/NaN of their V rows cannot leak. With a finite V tile the
    // plain product adds exact zeros instead (only the sign of a zero output
    // can differ), so the guard runs only where V holds Inf or NaN.
    const bool may_hide = cut_hi || cut_lo || mask_hid;
#if SIMDATTN_NATIVE_BF16
    if (native) {
      if (may_hide && !Bf16ValuesFinite(a, src, kv_begin, nk)) {
        // Guarded f32 product on the widened tile (see TileGemm's kGuard).
        WidenRows(d, reinterpret_cast<const uint16_t*>(src.v) + kv_begin * a.v_strides[2],
                  a.v_strides[2], Storage::kBF16, nk, dv, vtile);
        TileGemmRows<true, true>(d, cols, dv, vtile, 1, dv, st, mq, nk, scale,
                                 acc, mq);
        continue;
      }
      // P rounded to bf16 and paired by keys, in place of the scores.
      WeightsToBf16Pairs(st, nk, mq);
      const PairRows values = packed.k != nullptr
                                  ? PackedValuePairs(packed, kv_begin, dv)
                                  : TileValuePairs(v2, dv);
      DotBf16Rows<true>(cols, dv, values, reinterpret_cast<const uint32_t*>(st),
                        mq, (nk + 1) / 2, scale, 1.0f, acc, mq);
      continue;
    }
#endif
    if (packed.k != nullptr) {
      if (may_hide && !packed.ValuesFinite(d, kv_begin, nk, dv)) {
        packed.Values<true>(d, cols, kv_begin, nk, dv, st, mq, scale, acc);
      } else {
        packed.Values<false>(d, cols, kv_begin, nk, dv, st, mq, scale, acc);
      }
    } else if (may_hide && !AllFinite(d, tile.v, tile.v_row, nk, dv)) {
      TileGemmRows<true, true>(d, cols, dv, tile.v, 1, tile.v_row, st, mq, nk,
                               scale, acc, mq);
    } else {
      TileGemmRows<true, false>(d, cols, dv, tile.v, 1, tile.v_row, st, mq, nk,
                                scale, acc, mq);
    }
  }

  if (a.num_chunks > 1) {
    // Partial result of this chunk: m, l and the unnormalized O^T.
    float* out = a.partials + task * mq * (dv + 2);
    std::copy(m, m + mq, out);
    std::copy(l, l + mq, out + mq);
    std::copy(acc, acc + dv * mq, out + 2 * mq);
    return;
  }
  WriteRows(a, b, rt, rows, m, l, acc, mq, 1);
}

// Split calls: merges the chunks of one block. With M = max_c m_c (and the
// sink), L = sum_c l_c exp(m_c - M) (+ exp(sink - M)) and
// O = sum_c acc_c exp(m_c - M) / L, which is exactly the unsplit softmax.
// Chunks are merged in order, so the result does not depend on threads.
// A slot holds m and l (mq each) and then O: [rows][dv] from the decode
// path (a.decode_path), O^T [dv][mq] from the tiled kernel.
inline void CombineTaskF32Impl(const AttentionArgsF32& a, int64_t task) {
  const int64_t mq = a.block_rows;
  const int64_t dv = a.head_dim_v;
  const int64_t group_index = task / a.num_blocks;
  const int64_t block = task % a.num_blocks;
  const int64_t b = group_index / a.kv_heads;
  const int64_t hkv = group_index % a.kv_heads;
  const int64_t kv_valid = a.kv_lengths != nullptr ? a.kv_lengths[b] : a.kv_len;
  const int64_t offset = a.bottom_right ? kv_valid - a.q_len : 0;
  float table[RowTable::Floats(kMaxBlockRows)];
  RowTable rt(table, mq);
  const int64_t rows = FillRowTable(a, block, hkv, offset, mq, &rt);
  // Slot of (group, block, chunk 0); tasks order blocks heaviest-first.
  const int64_t first_task =
      (group_index * a.num_blocks + (a.num_blocks - 1 - block)) * a.num_chunks;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float m[kMaxBlockRows], l[kMaxBlockRows], weight[kMaxChunks];
  // Reuse the first chunk's slot as the merged O^T (this task owns it).
  float* merged = a.partials + first_task * mq * (dv + 2) + 2 * mq;
  for (int64_t r = 0; r < rows; ++r) {
    float big = neg_inf;
    bool nan = false;
    for (int64_t c = 0; c < a.num_chunks; ++c) {
      const float mc = a.partials[(first_task + c) * mq * (dv + 2) + r];
      if (std::isnan(mc)) nan = true;
      if (mc > big) big = mc;
    }
    const float sink = a.sinks != nullptr ? a.sinks[rt.head[r]] : neg_inf;
    if (sink > big) big = sink;
    if (nan) big = std::numeric_limits<float>::quiet_NaN();
    const bool empty = big == neg_inf;  // no visible key in any chunk, no sink
    float total = 0.0f;
    for (int64_t c = 0; c < a.num_chunks; ++c) {
      const float* slot = a.partials + (first_task + c) * mq * (dv + 2);
      // exp(m_c - M) is 0 for a chunk that saw nothing (l_c = 0).
      weight[c] = empty || slot[mq + r] == 0.0f ? 0.0f : std::exp(slot[r] - big);
      total += slot[mq + r] * weight[c];
    }
    if (!empty && !(sink == neg_inf)) total += std::exp(sink - big);
    m[r] = big;
    l[r] = empty ? 0.0f : total;
    if (a.decode_path) {  // rows of O, merged in place in chunk 0's row
      const hn::ScalableTag<float> d;
      const int64_t N = static_cast<int64_t>(hn::Lanes(d));
      const float* first = a.partials + first_task * mq * (dv + 2) + 2 * mq + r * dv;
      float* out = merged + r * dv;
      int64_t e = 0;
      for (; e + N <= dv; e += N) {
        auto sum = hn::Zero(d);
        for (int64_t c = 0; c < a.num_chunks; ++c) {
          const float* row = first + c * mq * (dv + 2);
          sum = hn::MulAdd(hn::Set(d, weight[c]), hn::LoadU(d, row + e), sum);
        }
        hn::StoreU(sum, d, out + e);
      }
      for (; e < dv; ++e) {
        float sum = 0.0f;
        for (int64_t c = 0; c < a.num_chunks; ++c) sum += weight[c] * first[c * mq * (dv + 2) + e];
        out[e] = sum;
      }
      continue;
    }
    for (int64_t e = 0; e < dv; ++e) {
      float sum = 0.0f;
      for (int64_t c = 0; c < a.num_chunks; ++c) {
        const float* slot = a.partials + (first_task + c) * mq * (dv + 2);
        sum += weight[c] * slot[2 * mq + e * mq + r];
      }
      merged[e * mq + r] = sum;
    }
  }
  if (a.decode_path) {
    WriteRows(a, b, rt, rows, m, l, merged, 1, dv);
  } else {
    WriteRows(a, b, rt, rows, m, l, merged, mq, 1);
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_ATTENTION_INL_H_
