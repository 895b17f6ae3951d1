// Dropout on the weights (SEMANTICS.md): Philox4x32-10 keep draws per
// (b, h, i, j), on a transposed tile or on one row. Per-target code.

#if defined(SIMDATTN_LIB_KERNELS_DROPOUT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_DROPOUT_INL_H_
#undef SIMDATTN_LIB_KERNELS_DROPOUT_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_DROPOUT_INL_H_
#endif

#include <cstdint>
#include <cstring>

#include "hwy/highway.h"
#include "lib/kernels/kernels.h"
#include "lib/kernels/score_mods-inl.h"
#include "lib/philox.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR
// Philox4x32-10 of lib/philox.h with one counter per 64-bit lane, held in
// its even 32-bit lane (the odd lanes carry junk that MulEven ignores): each
// round's two products come whole from MulEven, so a round is 6 operations.
// (One counter per 32-bit lane needs two MulEven per product, Highway 1.0.3
// having no 32x32 -> high-32 multiply, and shuffles to interleave the
// halves: 16 operations per round for twice the counters.)
template <class D32>
HWY_INLINE void PhiloxEvenLanes(D32 d, hn::Vec<D32>* c0, hn::Vec<D32>* c1,
                                hn::Vec<D32>* c2, hn::Vec<D32>* c3,
                                Philox4x32Key key) {
  const auto m0 = hn::Set(d, philox_internal::kMultiplier0);
  const auto m1 = hn::Set(d, philox_internal::kMultiplier1);
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key.v[0] += philox_internal::kWeyl0;
      key.v[1] += philox_internal::kWeyl1;
    }
    const auto p0 = hn::MulEven(*c0, m0);  // hi:lo of c0 * M0, per 64 bits
    const auto p1 = hn::MulEven(*c2, m1);
    *c0 = hn::Xor3(hn::BitCast(d, hn::ShiftRight<32>(p1)), *c1, hn::Set(d, key.v[0]));
    *c1 = hn::BitCast(d, p1);
    *c2 = hn::Xor3(hn::BitCast(d, hn::ShiftRight<32>(p0)), *c3, hn::Set(d, key.v[1]));
    *c3 = hn::BitCast(d, p0);
  }
}
#endif

// The keep rule of dropout, shared by the tile and row forms below: a weight
// is kept when its 16-bit draw (lib/philox.h) is >= DropoutThreshold(p), then
// divided by 1 - p; a dropped one becomes -0.0; +0.0 (a hidden key) stays as
// it is.
struct DropoutRule {
  Philox4x32Key key;
  uint32_t threshold;
  float inv_keep;

  explicit DropoutRule(const AttentionArgs& a)
      : key{{static_cast<uint32_t>(a.dropout_seed),
             static_cast<uint32_t>(a.dropout_seed >> 32)}},
        threshold(DropoutThreshold(a.dropout_p)),
        inv_keep(static_cast<float>(1.0 / (1.0 - a.dropout_p))) {}

  float Apply(uint32_t draw, float p) const {
    if (p == 0.0f) return p;
    return draw >= threshold ? p * inv_keep : -0.0f;
  }
};

#if HWY_TARGET != HWY_SCALAR
// DropoutRule::Apply on a vector of weights p with their draws (u32 lanes
// holding 16-bit values, so a signed compare is exact).
template <class D, class VU>
HWY_INLINE hn::VFromD<D> DropoutLanes(D d, VU draw, hn::VFromD<D> p,
                                      const DropoutRule& rule) {
  const hn::RebindToSigned<D> di;
  // draw >= threshold, as draw > threshold - 1: one compare.
  const auto below = hn::Set(di, static_cast<int32_t>(rule.threshold) - 1);
  const auto keep = hn::RebindMask(d, hn::Gt(hn::BitCast(di, draw), below));
  const auto dropped = hn::IfThenElse(hn::Eq(p, hn::Zero(d)), p, hn::Set(d, -0.0f));
  return hn::IfThenElse(keep, hn::Mul(p, hn::Set(d, rule.inv_keep)), dropped);
}

// The 16-bit draw of key k (0..7) of a group from the four Philox words.
template <class DU>
HWY_INLINE hn::VFromD<DU> DrawOfKey(DU du, int64_t k, hn::VFromD<DU> w0,
                                    hn::VFromD<DU> w1, hn::VFromD<DU> w2,
                                    hn::VFromD<DU> w3) {
  const auto w = k < 2 ? w0 : k < 4 ? w1 : k < 6 ? w2 : w3;
  return (k & 1) ? hn::ShiftRight<16>(w) : hn::And(w, hn::Set(du, 0xFFFFu));
}
#endif

// Dropout on the weights of a tile (after the softmax recurrence consumed
// them, so l and LSE are unaffected): kept weights are divided by 1 - p,
// dropped ones become -0.0. The sign tells the P·V guard (which skips +0.0,
// the weight of a hidden key) that a dropped key is visible: like the
// reference, it still multiplies its V row, so Inf/NaN there propagates.
// keep(b, h, i, j) is DropoutKeep's (reference.h), so it depends on nothing
// but the indices. Lanes are queries: two PhiloxEvenLanes calls (the lanes'
// first and second halves) cover 8 keys of a query vector.
template <class D>
HWY_INLINE void DropoutTile(D d, int cols, const AttentionArgs& a,
                            int64_t b, const RowTable& rt, int64_t kv_begin,
                            int64_t num_keys, float* HWY_RESTRICT st) {
  b += a.dropout_batch;
  const DropoutRule rule(a);
  const Philox4x32Key key = rule.key;
  const size_t N = hn::Lanes(d);
  const size_t stride = cols * N;
  constexpr int64_t G = kDropoutKeysPerCall;
#if HWY_TARGET == HWY_SCALAR
  for (int c = 0; c < cols; ++c) {
    const int64_t i = rt.query[c];
    const int64_t h = rt.head[c];
    int64_t j = 0;
    while (j < num_keys) {
      const int64_t key_index = kv_begin + j;
      const Philox4x32Counter out =
          Philox4x32_10(DropoutCounter(b, h, i, key_index / G), key);
      for (int64_t k = key_index % G; k < G && j < num_keys; ++k, ++j) {
        float& p = st[j * stride + c];
        p = rule.Apply(DropoutDraw(out, k), p);
      }
    }
  }
  (void)N;
#else
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;
  const int64_t group_first = kv_begin / G;
  const int64_t group_last = (kv_begin + num_keys - 1) / G;
  const hn::Repartition<uint64_t, decltype(du)> d64;
  const hn::Half<decltype(du)> dh;
  for (int c = 0; c < cols; ++c) {
    const auto query = hn::BitCast(du, hn::LoadU(di, rt.query + c * N));
    const auto head = hn::BitCast(du, hn::LoadU(di, rt.head + c * N));
    // The lanes' queries and heads in the even 32-bit lanes of two vectors,
    // lanes [0, N / 2) and [N / 2, N).
    const auto query_lo = hn::BitCast(du, hn::PromoteTo(d64, hn::LowerHalf(dh, query)));
    const auto query_hi = hn::BitCast(du, hn::PromoteTo(d64, hn::UpperHalf(dh, query)));
    const auto head_lo = hn::BitCast(du, hn::PromoteTo(d64, hn::LowerHalf(dh, head)));
    const auto head_hi = hn::BitCast(du, hn::PromoteTo(d64, hn::UpperHalf(dh, head)));
    for (int64_t g = group_first; g <= group_last; ++g) {
      // (SVE vectors cannot live in arrays: four named words.)
      auto w0 = hn::Set(du, static_cast<uint32_t>(g));
      auto w1 = query_lo;
      auto w2 = head_lo;
      auto w3 = hn::Set(du, static_cast<uint32_t>(b));
      auto u0 = w0, u1 = query_hi, u2 = head_hi, u3 = w3;
      PhiloxEvenLanes(du, &w0, &w1, &w2, &w3, key);
      PhiloxEvenLanes(du, &u0, &u1, &u2, &u3, key);
      // Lane r's words, r < N / 2 from w, the others from u.
      w0 = hn::ConcatEven(du, u0, w0);
      w1 = hn::ConcatEven(du, u1, w1);
      w2 = hn::ConcatEven(du, u2, w2);
      w3 = hn::ConcatEven(du, u3, w3);
      const int64_t j_first = std::max<int64_t>(G * g, kv_begin) - kv_begin;
      const int64_t j_end = std::min<int64_t>(G * g + G, kv_begin + num_keys) - kv_begin;
      const auto apply = [&](int64_t j, hn::VFromD<decltype(du)> draw) {
        float* HWY_RESTRICT x = st + j * stride + c * N;
        hn::Store(DropoutLanes(d, draw, hn::Load(d, x), rule), d, x);
      };
      if (j_end - j_first == G) {
        // A whole group, unrolled so that each key's word and half are
        // known at compile time (1.012x faster than the loop below, f32
        // B1 H8 L2048 D128, dropout 0.1, 1 thread).
        static_assert(G == 8, "four words of two draws");
        apply(j_first + 0, DrawOfKey(du, 0, w0, w1, w2, w3));
        apply(j_first + 1, DrawOfKey(du, 1, w0, w1, w2, w3));
        apply(j_first + 2, DrawOfKey(du, 2, w0, w1, w2, w3));
        apply(j_first + 3, DrawOfKey(du, 3, w0, w1, w2, w3));
        apply(j_first + 4, DrawOfKey(du, 4, w0, w1, w2, w3));
        apply(j_first + 5, DrawOfKey(du, 5, w0, w1, w2, w3));
        apply(j_first + 6, DrawOfKey(du, 6, w0, w1, w2, w3));
        apply(j_first + 7, DrawOfKey(du, 7, w0, w1, w2, w3));
        continue;
      }
      for (int64_t j = j_first; j < j_end; ++j) {
        apply(j, DrawOfKey(du, (kv_begin + j) % G, w0, w1, w2, w3));
      }
    }
  }
#endif
}


// Dropout on one row of weights of query i of head h (DropoutTile's rule:
// kept weights / (1 - p), dropped ones -0.0, hidden +0.0 untouched). The
// 64-bit lanes are Philox counters here (PhiloxEvenLanes), one per group of
// 8 keys: each call gives 4 words per lane, which StoreInterleaved2 of
// (w0, w1) and (w2, w3) pairs lays out in key order, two 16-bit draws per
// word (low half first: both targets are little-endian). At most
// kDropoutRowKeys keys per call.
constexpr int64_t kDropoutRowKeys = 64;

template <class D>
HWY_INLINE void DropoutRow(D d, const AttentionArgs& a, int64_t b,
                           int64_t h, int64_t i, int64_t kv_begin, int64_t n,
                           float* HWY_RESTRICT x) {
  b += a.dropout_batch;
  const DropoutRule rule(a);
  const Philox4x32Key key = rule.key;
  constexpr int64_t G = kDropoutKeysPerCall;
  const int64_t group_first = kv_begin / G;
  const int64_t group_end = (kv_begin + n + G - 1) / G;
#if HWY_TARGET == HWY_SCALAR
  (void)d;
  for (int64_t g = group_first; g < group_end; ++g) {
    const Philox4x32Counter out = Philox4x32_10(DropoutCounter(b, h, i, g), key);
    for (int64_t k = 0; k < G; ++k) {
      const int64_t j = G * g + k - kv_begin;
      if (j >= 0 && j < n) x[j] = rule.Apply(DropoutDraw(out, k), x[j]);
    }
  }
#else
  const hn::RebindToUnsigned<D> du;
  const hn::Repartition<uint64_t, decltype(du)> d64;
  const hn::Rebind<uint16_t, decltype(du)> du16;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t N64 = static_cast<int64_t>(hn::Lanes(d64));
  // Words of groups group_first + [0, groups), 4 per group, rounded up to
  // whole vectors of groups.
  constexpr size_t kMaxWords = 4 * (kDropoutRowKeys / G + 1) + 4 * hn::MaxLanes(d64);
  HWY_ALIGN uint32_t words[kMaxWords];
  for (int64_t g = group_first; g < group_end; g += N64) {
    // Counter word 0 of group g + k in the low half of 64-bit lane k.
    auto w0 = hn::BitCast(du, hn::Iota(d64, static_cast<uint64_t>(static_cast<uint32_t>(g))));
    auto w1 = hn::Set(du, static_cast<uint32_t>(i));
    auto w2 = hn::Set(du, static_cast<uint32_t>(h));
    auto w3 = hn::Set(du, static_cast<uint32_t>(b));
    PhiloxEvenLanes(du, &w0, &w1, &w2, &w3, key);
    // Lane k as 64 bits: words (0, 1) and (2, 3) of group g + k.
    const auto w01 = hn::BitCast(
        d64, hn::OddEven(hn::BitCast(du, hn::ShiftLeft<32>(hn::BitCast(d64, w1))), w0));
    const auto w23 = hn::BitCast(
        d64, hn::OddEven(hn::BitCast(du, hn::ShiftLeft<32>(hn::BitCast(d64, w3))), w2));
    hn::StoreInterleaved2(w01, w23, d64,
                          reinterpret_cast<uint64_t*>(words + 4 * (g - group_first)));
  }
  // The 16-bit draws of keys G * group_first + [0, 2 * words), in key order.
  HWY_ALIGN uint16_t draws[2 * kMaxWords];
  const int64_t used_words = 4 * (group_end - group_first);
  std::memcpy(draws, words, static_cast<size_t>(used_words) * sizeof(uint32_t));
  const uint16_t* row = draws + (kv_begin - G * group_first);
  int64_t j = 0;
  for (; j + N <= n; j += N) {
    const auto draw = hn::PromoteTo(du, hn::LoadU(du16, row + j));
    hn::StoreU(DropoutLanes(d, draw, hn::LoadU(d, x + j), rule), d, x + j);
  }
  for (; j < n; ++j) x[j] = rule.Apply(row[j], x[j]);
#endif
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_DROPOUT_INL_H_
