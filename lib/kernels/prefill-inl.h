// The tiled kernel's task: one block of queries (along the lanes) against
// K/V tiles: Q·Kᵀ, score options, online softmax, P·V. Per-target code.

#if defined(SIMDATTN_LIB_KERNELS_PREFILL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_PREFILL_INL_H_
#undef SIMDATTN_LIB_KERNELS_PREFILL_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_PREFILL_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "hwy/highway.h"
#include "lib/kernels/amx-inl.h"
#include "lib/kernels/bf16_dot-inl.h"
#include "lib/kernels/block-inl.h"
#include "lib/kernels/decode_amx-inl.h"
#include "lib/kernels/decode_task-inl.h"
#include "lib/kernels/online_softmax-inl.h"
#include "lib/kernels/output-inl.h"
#include "lib/kernels/pack-inl.h"
#include "lib/kernels/pack_bf16-inl.h"
#include "lib/kernels/dropout-inl.h"
#include "lib/kernels/mask-inl.h"
#include "lib/kernels/score_mods-inl.h"
#include "lib/kernels/tile_gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Both products run with the block's queries along the lanes:
//   S^T[j][q]  = sum_i K[j][i] * Qt[i][q]      (Qt packed, K broadcast)
//   O^T[e][q] += sum_j V[j][e] * P^T[j][q]     (P^T in place, V broadcast)
// so the softmax needs only vertical max/add and rescaling O by alpha is a
// per-lane multiply. Three kinds of products share the tile loop (TileLoop):
// f32 tiles read from storage (16-bit K/V widened per tile), f32 K/V packed
// once per group (PackedKv), and the native bf16 products (vdpbf16ps).

// O^T += V^T·P^T on f32 V rows (row stride v_row), guarded where a hidden
// key's V row may hold Inf or NaN (TileGemm's kGuard): hidden keys have
// weight +0.0, and with a finite V tile the plain product adds exact zeros
// (only the sign of a zero output can differ).
template <class D>
HWY_INLINE void ValuesF32(D d, const TileScratch& s, int64_t dv,
                          const float* v, int64_t v_row, int64_t nk,
                          const float* scale, bool may_hide) {
  if (may_hide && !AllFinite(d, v, v_row, nk, dv)) {
    TileGemmRows<true, true>(d, s.cols, dv, v, 1, v_row, s.st, s.mq, nk, scale,
                             s.acc, s.mq);
  } else {
    TileGemmRows<true, false>(d, s.cols, dv, v, 1, v_row, s.st, s.mq, nk, scale,
                              s.acc, s.mq);
  }
}

// f32 products on tiles read from K/V's storage (widened when 16-bit).
struct TileProducts {
  static constexpr int64_t kKeys = kKeyTile;
  static constexpr float ScoreScale() { return 1.0f; }  // scores come scaled
  const AttentionArgs& a;
  const KvRows& src;
  const TileScratch& s;
  KvTile tile{nullptr, nullptr, 0, 0};

  void PackQueries(int64_t b, const RowTable& rt) {
    const hn::ScalableTag<float> d;
    HWY_NAMESPACE::PackQueries(d, a, b, rt, s.mq, s.ktile, s.qt);
  }
  void Load(int64_t kv_begin, int64_t nk, int64_t kv_end) {
    const hn::ScalableTag<float> d;
    PrefetchKvTile(a, src, kv_begin + kKeyTile, kKeyTile, kv_end);
    tile = LoadKvTile(d, a, src, kv_begin, nk, s.ktile, s.vtile);
  }
  void Scores(int64_t /* kv_begin */, int64_t nk) const {
    const hn::ScalableTag<float> d;
    TileGemmRows<false, false>(d, s.cols, nk, tile.k, tile.k_row, 1, s.qt, s.mq,
                               a.head_dim_qk, nullptr, s.st, s.mq);
  }
  void Values(int64_t /* kv_begin */, int64_t nk, const float* scale,
              bool may_hide) const {
    const hn::ScalableTag<float> d;
    ValuesF32(d, s, a.head_dim_v, tile.v, tile.v_row, nk, scale, may_hide);
  }
};

// f32 products on the group's packed K/V.
struct PackedProducts {
  static constexpr int64_t kKeys = kKeyTile;
  static constexpr float ScoreScale() { return 1.0f; }  // scores come scaled
  const AttentionArgs& a;
  const PackedKv& packed;
  const TileScratch& s;

  void PackQueries(int64_t b, const RowTable& rt) {
    const hn::ScalableTag<float> d;
    HWY_NAMESPACE::PackQueries(d, a, b, rt, s.mq, s.ktile, s.qt);
  }
  void Load(int64_t, int64_t, int64_t) {}
  void Scores(int64_t kv_begin, int64_t nk) const {
    const hn::ScalableTag<float> d;
    packed.Scores(d, s.cols, kv_begin, nk, a.head_dim_qk, s.qt, s.mq, s.st);
  }
  void Values(int64_t kv_begin, int64_t nk, const float* scale,
              bool may_hide) const {
    const hn::ScalableTag<float> d;
    const int64_t dv = a.head_dim_v;
    if (may_hide && !packed.ValuesFinite(d, kv_begin, nk, dv)) {
      packed.Values<true>(d, s.cols, kv_begin, nk, dv, s.st, s.mq, scale, s.acc);
    } else {
      packed.Values<false>(d, s.cols, kv_begin, nk, dv, s.st, s.mq, scale, s.acc);
    }
  }
};

#if SIMDATTN_NATIVE_BF16
// Native bf16 products (the AVX3_BF16 entry): pairs of head dims for Q·Kᵀ
// (scaled in f32 on the way out), P rounded to bf16 and paired by keys for
// P·V; K/V packed (PackKvBf16) or paired tile by tile from storage. The
// scratch regions of Qt, ktile and vtile hold the pairs.
struct NativeBf16Products {
  static constexpr int64_t kKeys = kKeyTile;
  static constexpr float ScoreScale() { return 1.0f; }  // scores come scaled
  const AttentionArgs& a;
  const KvRows& src;
  const PackedKv& packed;  // packed.k null: tiles from storage
  const TileScratch& s;

  uint32_t* qt2() const { return reinterpret_cast<uint32_t*>(s.qt); }
  uint32_t* k2() const { return reinterpret_cast<uint32_t*>(s.ktile); }
  uint32_t* v2() const { return reinterpret_cast<uint32_t*>(s.vtile); }
  int64_t dk2() const { return (a.head_dim_qk + 1) / 2; }

  void PackQueries(int64_t b, const RowTable& rt) {
    PackQueriesBf16(a, b, rt, s.mq, qt2());
  }
  void Load(int64_t kv_begin, int64_t nk, int64_t kv_end) {
    if (packed.k != nullptr) return;
    PrefetchKvTile(a, src, kv_begin + kKeyTile, kKeyTile, kv_end);
    LoadKvTileBf16(a, src, kv_begin, nk, k2(), v2());
  }
  void Scores(int64_t kv_begin, int64_t nk) const {
    const PairRows keys = packed.k != nullptr
                              ? PackedKeyPairs(packed, kv_begin, nk, dk2())
                              : TileKeyPairs(k2(), nk, dk2());
    DotBf16Rows<false>(s.cols, nk, keys, qt2(), s.mq, dk2(), nullptr, a.scale,
                       s.st, s.mq);
  }
  void Values(int64_t kv_begin, int64_t nk, const float* scale,
              bool may_hide) const {
    const int64_t dv = a.head_dim_v;
    if (may_hide && !Bf16ValuesFinite(a, src, kv_begin, nk)) {
      // Guarded f32 product on the widened tile.
      const hn::ScalableTag<float> d;
      WidenKvRows(d, src, true, kv_begin, nk, dv, s.vtile);
      TileGemmRows<true, true>(d, s.cols, dv, s.vtile, 1, dv, s.st, s.mq, nk,
                               scale, s.acc, s.mq);
      return;
    }
    WeightsToBf16Pairs(s.st, nk, s.mq);  // in place of the scores
    const PairRows values = packed.k != nullptr ? PackedValuePairs(packed, kv_begin, dv)
                                                : TileValuePairs(v2(), dv);
    DotBf16Rows<true>(s.cols, dv, values, reinterpret_cast<const uint32_t*>(s.st),
                      s.mq, (nk + 1) / 2, scale, 1.0f, s.acc, s.mq);
  }
};
#endif  // SIMDATTN_NATIVE_BF16

// Score options of one tile (SEMANTICS.md order: softcap, ALiBi, mask, then
// the index masks of causal and windows where some row's range ends inside
// the tile). Returns whether any key of the tile may be hidden from a row.
template <class D>
HWY_INLINE bool ScoreOptions(D d, const AttentionArgs& a, const BlockTask& t,
                             const RowTable& rt, const MaskBlock& mask,
                             const MaskTile& mtile, int64_t kv_begin, int64_t nk,
                             const TileScratch& s) {
  if (a.softcap > 0.0f) SoftcapTile(d, s.cols, a.softcap, nk, s.st);
  if (a.alibi_slopes != nullptr) AlibiTile(d, s.cols, rt, kv_begin, nk, s.st);
  const bool mask_hid = mtile.bias && MaskTileApply(d, s.cols, mask, nk, s.st);
  const IndexCuts& c = t.cuts;
  const bool cut_hi = c.has_hi && kv_begin + nk - 1 > c.hi_first;
  const bool cut_lo = c.has_lo && kv_begin < c.lo_last;
  if (cut_hi || cut_lo) {
    IndexMaskTile(d, s.cols, rt, kv_begin, nk, cut_hi, c.hi_shift, cut_lo,
                  c.lo_shift, s.st);
  }
  return cut_hi || cut_lo || mask_hid;
}

// The online softmax over keys [kv_start, kv_end) for one block: per tile,
// S^T = K·Qt, score options, the softmax step (which rescales O^T by alpha
// inside the next product when some row's max grew), dropout on the
// weights, O^T += V^T·P^T. A tile the mask hides from every row is skipped
// before any work.
template <class Products>
HWY_INLINE void TileLoop(const AttentionArgs& a, const BlockTask& t,
                         const RowTable& rt, MaskBlock& mask,
                         const TileScratch& s, int64_t kv_start, int64_t kv_end,
                         Products& products) {
  const hn::ScalableTag<float> d;
  const bool has_mask = a.mask_kind != MaskKind::kNone;
  constexpr int64_t kKeys = Products::kKeys;  // keys per tile
  for (int64_t kv_begin = kv_start; kv_begin < kv_end; kv_begin += kKeys) {
    const int64_t nk = std::min(kKeys, kv_end - kv_begin);
    const MaskTile mtile = has_mask ? MaskTileRows(d, a, &mask, kv_begin, nk)
                                    : MaskTile{true, false, false};
    if (!mtile.visible) continue;
    products.Load(kv_begin, nk, kv_end);
    products.Scores(kv_begin, nk);
    const bool may_hide = ScoreOptions(d, a, t, rt, mask, mtile, kv_begin, nk, s);
    const bool rescale =
        SoftmaxTile(d, s.cols, s.st, nk, s.m, s.l, s.alpha, products.ScoreScale());
    if (a.dropout_p > 0.0f) DropoutTile(d, s.cols, a, t.b, rt, kv_begin, nk, s.st);
    products.Values(kv_begin, nk, rescale ? s.alpha : nullptr, may_hide);
  }
}

// Packs the block's queries, runs the tile loop and writes the block's rows
// (or, split, its partial result).
template <class Products>
HWY_INLINE void TiledBlock(const AttentionArgs& a, const Plan& plan,
                           const Wave& wave, int64_t task, const BlockTask& t,
                           const RowTable& rt, float* scratch,
                           const ScratchLayout& lay, const TileScratch& s,
                           int64_t kv_start, int64_t kv_end, Products& products) {
  products.PackQueries(t.b, rt);  // padding lanes repeat a valid row
  std::fill(s.acc, s.acc + a.head_dim_v * s.mq, 0.0f);
  InitRowState(a, plan, rt, s.mq, s.m, s.l);
  MaskBlock mask(scratch + lay.mask, s.mq, Products::kKeys);
  if (a.mask_kind != MaskKind::kNone) mask.Init(a, t.b, rt);
  TileLoop(a, t, rt, mask, s, kv_start, kv_end, products);
  if (plan.num_chunks > 1) {
    StorePartial(a, plan, wave, task, s.mq, s.m, s.l, s.acc, a.head_dim_v * s.mq);
    return;
  }
  WriteRows(a, plan, t.b, rt, t.rows, s.m, s.l, s.acc, s.mq, 1);
}

// The bf16 products of a dispatch entry: AVX3_BF16's vdpbf16ps (kNative),
// AVX3_AMX's tiles (kAmx) or their emulator (kAmxEmulated), and f32
// products on widened values everywhere else (kWidened).
enum class Bf16Path { kWidened, kNative, kAmx, kAmxEmulated };

// Whether a call runs on the AMX tiles of entry kPath: bf16 Q, K and V (or
// f32/f16/bf16 ones with ExecutionOptions::allow_bf16_compute) on the
// tiled kernel.
template <Bf16Path kPath>
HWY_INLINE bool AmxCall(const AttentionArgs& a, const Plan& plan) {
  return (kPath == Bf16Path::kAmx || kPath == Bf16Path::kAmxEmulated) &&
         ((a.bf16_compute && IsWideStorage(a.q_type) && IsWideStorage(a.k_type) &&
           IsWideStorage(a.v_type)) ||
          (a.q_type == Storage::kBF16 && a.kv_type == Storage::kBF16)) &&
         plan.path == KernelPath::kTiled;
}

// Builds the packed K/V of group `group` for the tiles (PackedKv's layout,
// the bf16 pairs of the native products, or AmxPackedKv's).
template <Bf16Path kPath>
inline void PackKv(const AttentionArgs& a, const Plan& plan, int64_t group,
                   float* HWY_RESTRICT dst, float* HWY_RESTRICT scratch) {
#if SIMDATTN_AMX
  if (AmxCall<kPath>(a, plan)) {
    PackKvAmx(a, group, dst, scratch);
    return;
  }
#endif
#if SIMDATTN_NATIVE_BF16
  if (NativeBf16<kPath == Bf16Path::kNative>(a, plan)) {
    PackKvBf16(a, group, reinterpret_cast<uint32_t*>(dst),
               reinterpret_cast<uint32_t*>(scratch));
    return;
  }
#endif
  (void)plan;
  PackKvF32(a, group, dst, scratch);
}

// Contract: args validated by the driver (f32/f16/bf16 storage, unit stride
// along the head dims, q_len/kv_len < 2^31 - 1, head dims >= 1); scratch
// 256-byte aligned with ScratchFloatsImpl() floats. Unsplit, writes the
// block's rows of O and LSE and nothing else; split, writes the task's
// PartialSlot. kPath: the entry's bf16 products.
template <Bf16Path kPath>
inline void AttentionTaskImpl(const AttentionArgs& a, const Plan& plan,
                              const Wave& wave, int64_t task,
                              float* HWY_RESTRICT scratch) {
  const hn::ScalableTag<float> d;
  const int64_t mq = plan.block_rows;
  const ScratchLayout lay = MakeLayout(a.head_dim_qk, a.head_dim_v);
  RowTable rt(scratch + lay.rows, mq);
  const BlockTask t = MakeBlockTask(a, plan, task, mq, &rt);
  if (plan.path != KernelPath::kTiled) {
#if SIMDATTN_AMX
    if constexpr (kPath == Bf16Path::kAmx || kPath == Bf16Path::kAmxEmulated) {
      using Tiles = std::conditional_t<kPath == Bf16Path::kAmx, amx::HardwareTiles,
                                       amx::EmulatedTiles>;
      DecodeTask(a, plan, wave, task, t, rt, scratch, lay, AmxDecodeKeys<Tiles>());
      return;
    }
#endif
    DecodeTask(a, plan, wave, task, t, rt, scratch, lay);
    return;
  }
  const TileScratch s{static_cast<int>(mq / static_cast<int64_t>(hn::Lanes(d))), mq,
                      scratch + lay.qt, scratch + lay.st, scratch + lay.acc,
                      scratch + lay.m, scratch + lay.l, scratch + lay.alpha,
                      scratch + lay.ktile, scratch + lay.vtile};
  const KvRows src(a, t.b, t.hkv);
#if SIMDATTN_AMX
  if (AmxCall<kPath>(a, plan) && wave.packed != nullptr) {
    const AmxPackedKv packed(a, wave.packed + (t.index.group - wave.packed_first_group) *
                                                  plan.packed_group_floats);
    using Tiles = std::conditional_t<kPath == Bf16Path::kAmx, amx::HardwareTiles,
                                     amx::EmulatedTiles>;
    AmxProducts<Tiles> products{a, src, packed, s, t.kv_valid, FoldScoreScale(a)};
    AmxConfigure<Tiles>();  // once per task: both products use one layout
    TiledBlock(a, plan, wave, task, t, rt, scratch, lay, s, t.kv_start, t.kv_end, products);
    AmxRelease<Tiles>();
    return;
  }
#endif
  // Packed K/V: tiles start on a multiple of kTileRows and end on one (or on
  // the last valid key); the few keys this adds are hidden by the index masks.
  PackedKv packed;
  int64_t kv_start = t.kv_start, kv_end = t.kv_end;
  if (wave.packed != nullptr) {
    packed.k = wave.packed + (t.index.group - wave.packed_first_group) *
                                 plan.packed_group_floats;
    packed.v = packed.k + PackedKFloats(a);
    packed.keys = t.kv_valid;
    if (kv_start < kv_end) {
      kv_start = kv_start / kTileRows * kTileRows;
      kv_end = std::min(RoundUpTo(kv_end, kTileRows), t.kv_valid);
    }
  }
#if SIMDATTN_NATIVE_BF16
  if (NativeBf16<kPath == Bf16Path::kNative>(a, plan)) {
    NativeBf16Products products{a, src, packed, s};
    TiledBlock(a, plan, wave, task, t, rt, scratch, lay, s, kv_start, kv_end, products);
    return;
  }
#endif
  if (packed.k != nullptr) {
    PackedProducts products{a, packed, s};
    TiledBlock(a, plan, wave, task, t, rt, scratch, lay, s, kv_start, kv_end, products);
  } else {
    TileProducts products{a, src, s};
    TiledBlock(a, plan, wave, task, t, rt, scratch, lay, s, kv_start, kv_end, products);
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_PREFILL_INL_H_
