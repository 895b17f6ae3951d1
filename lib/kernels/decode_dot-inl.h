// The decode paths' building blocks (decode-inl.h, decode_fused-inl.h): K/V
// elements widened to f32 as they are loaded, and the dot products of 4 keys
// with up to 4 query rows along the head dimension.
// Per-target code (include from a foreach_target translation unit).

#if defined(SIMDATTN_LIB_KERNELS_DECODE_DOT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_DECODE_DOT_INL_H_
#undef SIMDATTN_LIB_KERNELS_DECODE_DOT_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_DECODE_DOT_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "hwy/highway.h"
#include "lib/dtype.h"
#include "lib/kernels/convert-inl.h"
#include "lib/kernels/dequant-inl.h"
#include "lib/kernels/types.h"

// Whether this target has the fused decode loop (decode_fused-inl.h): every
// target whose vectors are made of 128-bit blocks (FoldBlocks), so not
// SCALAR (1 lane) nor SVE (scalable length).
#undef SIMDATTN_HAVE_DECODE_FUSED
#if HWY_TARGET != HWY_SCALAR && \
    (HWY_TARGET & (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)) == 0
#define SIMDATTN_HAVE_DECODE_FUSED 1
#else
#define SIMDATTN_HAVE_DECODE_FUSED 0
#endif

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// K/V elements as stored, widened to f32 in registers as they are loaded.
// f16 is only used this way where the target converts it in hardware
// (kKvF16InRegisters); elsewhere the caller widens f16 tiles first. The
// 8-bit formats (int8, fp8) load unscaled: their per-row or per-tensor
// scale is applied to the scores and weights (decode_fused-inl.h).
template <Storage kKv>
constexpr bool kKv8 = kKv == Storage::kI8 || kKv == Storage::kE4M3 ||
                      kKv == Storage::kE5M2;

template <Storage kKv>
using KvElem = std::conditional_t<
    kKv == Storage::kF32, float,
    std::conditional_t<kKv8<kKv> || kKv == Storage::kQ8_0, uint8_t, uint16_t>>;

// LoadKv's values are the stored ones divided by this: e4m3 loads through
// the hardware f16 conversion as value / 256 (its exponent bias 7 against
// f16's 15), and the fused loop's scales carry the 256 back. (A scale above
// 2^120 then overflows; such a scale overflows the larger codes anyway.)
template <Storage kKv>
constexpr float kKvLoadUnit =
    kKv == Storage::kE4M3 && SIMDATTN_HW_F16 != 0 ? 256.0f : 1.0f;

#if SIMDATTN_HW_F16
// The Lanes(d) e4m3 values at p divided by 256, through f16: the byte
// sign-extended to 16 bits and shifted left by 7 puts its sign at bit 15
// and its magnitude at bits 7..13, an f16 of value / 256 (subnormals
// included); one hardware conversion. kNanCodes: NaN (magnitude 0x7F, f16
// 1.875) mapped to NaN (8 ops per vector against 11 of LoadFp8AsF32);
// without, NaN codes load as +-1.875 (5 ops) and the caller must not have
// any (the fused loop checks the bytes: NanCodeMax).
template <bool kNanCodes, class D>
HWY_INLINE hn::VFromD<D> LoadE4M3ViaF16(D d, const uint8_t* HWY_RESTRICT p) {
  const hn::Rebind<int8_t, D> d8;
  const hn::Rebind<int16_t, D> d16;
  const hn::Rebind<hwy::float16_t, D> dh;
  const auto s = hn::PromoteTo(d16, hn::LoadU(d8, reinterpret_cast<const int8_t*>(p)));
  const auto h = hn::And(hn::ShiftLeft<7>(s), hn::Set(d16, static_cast<int16_t>(-16512)));
  const auto x = hn::PromoteTo(d, hn::BitCast(dh, h));  // 0xBF80 above
  if constexpr (!kNanCodes) return x;
  const auto nan = hn::Eq(hn::Abs(x), hn::Set(d, 1.875f));
  return hn::IfThenElse(nan, hn::Set(d, std::numeric_limits<float>::quiet_NaN()), x);
}

// The Lanes(d) e5m2 values at p: the upper byte of an f16.
template <class D>
HWY_INLINE hn::VFromD<D> LoadE5M2ViaF16(D d, const uint8_t* HWY_RESTRICT p) {
  const hn::Rebind<uint8_t, D> d8;
  const hn::Rebind<uint16_t, D> d16;
  const hn::Rebind<hwy::float16_t, D> dh;
  const auto h = hn::ShiftLeft<8>(hn::PromoteTo(d16, hn::LoadU(d8, p)));
  return hn::PromoteTo(d, hn::BitCast(dh, h));
}
#endif

// The f16 at p (a q8_0 block's scale) as f32 in every lane of d: the f16
// broadcast, then converted (with hardware f16: one conversion, no trip
// through a scalar register).
template <class D>
HWY_INLINE hn::VFromD<D> LoadF16Broadcast(D d, const uint8_t* HWY_RESTRICT p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
#if SIMDATTN_HW_F16
  const hn::Rebind<uint16_t, D> d16;
  const hn::Rebind<hwy::float16_t, D> dh;
  return hn::PromoteTo(d, hn::BitCast(dh, hn::Set(d16, bits)));
#else
  return hn::Set(d, F16ToF32(bits));
#endif
}

constexpr bool kKvF16InRegisters = SIMDATTN_HW_F16 != 0;

// kNanCodes false: e4m3 without NaN codes (LoadE4M3ViaF16); no other
// format reads it.
template <Storage kKv, bool kNanCodes = true, class D>
HWY_INLINE hn::VFromD<D> LoadKv(D d, const KvElem<kKv>* HWY_RESTRICT p) {
  if constexpr (kKv == Storage::kF32) {
    return hn::LoadU(d, p);
  } else if constexpr (kKv == Storage::kF16) {
#if SIMDATTN_HW_F16
    const hn::Rebind<hwy::float16_t, D> dh;
    return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
#else
    (void)p;
    return hn::Zero(d);  // not used: these targets widen f16 tiles first
#endif
  } else if constexpr (kKv == Storage::kI8) {
    return LoadI8AsF32(d, reinterpret_cast<const int8_t*>(p));
  } else if constexpr (kKv8<kKv>) {
#if SIMDATTN_HW_F16
    if constexpr (kKv == Storage::kE4M3) {
      return LoadE4M3ViaF16<kNanCodes>(d, p);
    } else {
      return LoadE5M2ViaF16(d, p);
    }
#else
    return LoadFp8AsF32<kKv>(d, p);
#endif
  } else {
    const hn::Rebind<hwy::bfloat16_t, D> dbf;
    return hn::PromoteTo(d, hn::LoadU(dbf, reinterpret_cast<const hwy::bfloat16_t*>(p)));
  }
}

// Elements [i, i + Lanes(d)) of the row at `row` (i a multiple of
// Lanes(d)): LoadKv(row + i), except q8_0, whose element i lies in block
// i / 32 and is multiplied by that block's f16 scale (Lanes(d) divides 32).
template <Storage kKv, bool kNanCodes = true, class D>
HWY_INLINE hn::VFromD<D> LoadKvAt(D d, const KvElem<kKv>* HWY_RESTRICT row, int64_t i) {
  if constexpr (kKv == Storage::kQ8_0) {
    const uint8_t* block = row + (i / kQ8Block) * kQ8BlockBytes;
    const auto q = LoadI8AsF32(d, reinterpret_cast<const int8_t*>(block + 2 + i % kQ8Block));
    return hn::Mul(q, LoadF16Broadcast(d, block));
  } else {
    return LoadKv<kKv, kNanCodes>(d, row + i);
  }
}

template <Storage kKv>
HWY_INLINE float KvToF32(KvElem<kKv> x) {
  if constexpr (kKv == Storage::kF32) {
    return x;
  } else if constexpr (kKv == Storage::kF16) {
    return F16ToF32(x);
  } else if constexpr (kKv8<kKv>) {
    return QuantValue(kKv, &x, 0);
  } else {
    return BF16ToF32(x);
  }
}

HWY_INLINE uint32_t BitCastScalar(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}

// Keeps v in a register. GCC otherwise folds a vector load that several FMAs
// use into each of them as a memory operand: the f32 decode loaded each K,
// Q and V vector 4 times and was bound by the load ports. Only where there
// are 32 vector registers (the 16 accumulators and the shared operands fit).
template <class V>
HWY_INLINE void InRegister(V& v) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && \
    (defined(__GNUC__) || defined(__clang__))
  asm("" : "+v"(v.raw));
#else
  (void)v;
#endif
}

// The dot products of 4 keys for one row end as 4 vectors of partial sums.
// Reducing each with SumOfLanes costs a full shuffle tree per key; instead
// the 4 are reduced together: interleaving within 128-bit blocks leaves each
// block holding [k0, k1, k2, k3] partial sums, and adding the blocks gives
// the 4 sums in one 128-bit vector (2 + 2 + fold steps for all 4 keys).
// Highway's InterleaveLower/Upper work per 128-bit block on every target
// with SIMDATTN_HAVE_DECODE_FUSED; SVE keeps SumOfLanes (its fold over a
// scalable length is not static, and it has a native add reduction).
constexpr bool kBlockReduce = SIMDATTN_HAVE_DECODE_FUSED != 0;

#if SIMDATTN_HAVE_DECODE_FUSED
// Adds the 128-bit blocks of v: a vector of 4 lanes.
template <class D, class V>
HWY_INLINE auto FoldBlocks(D d, V v) {
  if constexpr (hn::MaxLanes(d) > 4) {
    const hn::Half<D> dh;
    return FoldBlocks(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  } else {
    return v;
  }
}

// sum(a0), sum(a1), sum(a2), sum(a3) as a vector of 4 lanes (kBlockReduce).
template <class D, class V>
HWY_INLINE auto Sums4(D d, V a0, V a1, V a2, V a3) {
  const hn::Repartition<uint64_t, D> d64;
  // [a0 (0+2), a1 (0+2), a0 (1+3), a1 (1+3)] per block, lanes 0..3.
  const V t01 = hn::Add(hn::InterleaveLower(d, a0, a1), hn::InterleaveUpper(d, a0, a1));
  const V t23 = hn::Add(hn::InterleaveLower(d, a2, a3), hn::InterleaveUpper(d, a2, a3));
  const auto w01 = hn::BitCast(d64, t01), w23 = hn::BitCast(d64, t23);
  const V sums = hn::Add(hn::BitCast(d, hn::InterleaveLower(d64, w01, w23)),
                         hn::BitCast(d, hn::InterleaveUpper(d64, w01, w23)));
  return FoldBlocks(d, sums);
}
#endif  // SIMDATTN_HAVE_DECODE_FUSED

// a_c = y * x_c + a_c for the 4 keys (or V rows) c.
template <class V>
HWY_INLINE void MulAdd4(V y, V x0, V x1, V x2, V x3, V& a0, V& a1, V& a2, V& a3) {
  a0 = hn::MulAdd(y, x0, a0);
  a1 = hn::MulAdd(y, x1, a1);
  a2 = hn::MulAdd(y, x2, a2);
  a3 = hn::MulAdd(y, x3, a3);
}

// One row's part of a dot-product step: its Q vector at qv times the 4 keys'
// vectors x0..x3, into its accumulators a0..a3 (one per key).
template <class D, class V>
HWY_INLINE void DotRow(D d, const float* HWY_RESTRICT qv, V x0, V x1, V x2, V x3,
                       V& a0, V& a1, V& a2, V& a3) {
  auto y = hn::LoadU(d, qv);
  InRegister(y);
  MulAdd4(y, x0, x1, x2, x3, a0, a1, a2, a3);
}

// One step of DotProducts4: the vectors at head-dim offset i.
template <int kRows, Storage kKv, int kQStep, bool kNanCodes = true, class D, class V,
          class Prefetch>
HWY_INLINE void DotStep(D d, int64_t i, const float* HWY_RESTRICT q, int64_t q_row,
                        const KvElem<kKv>* k0, const KvElem<kKv>* k1,
                        const KvElem<kKv>* k2, const KvElem<kKv>* k3, int64_t j,
                        const Prefetch& pf, V& a00, V& a01, V& a02, V& a03, V& a10,
                        V& a11, V& a12, V& a13, V& a20, V& a21, V& a22, V& a23,
                        V& a30, V& a31, V& a32, V& a33) {
  constexpr int64_t kElem = static_cast<int64_t>(sizeof(KvElem<kKv>));
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  // Each line once: a step reads N * kElem bytes of a row (a power of two),
  // half a line for 16-bit K on AVX-512.
  if ((i * kElem) % 64 == 0) {
    const int64_t bytes = std::max<int64_t>(64, N * kElem);
    pf.K(j, i * kElem, bytes);
    pf.K(j + 1, i * kElem, bytes);
    pf.K(j + 2, i * kElem, bytes);
    pf.K(j + 3, i * kElem, bytes);
  }
  auto x0 = LoadKvAt<kKv, kNanCodes>(d, k0, i), x1 = LoadKvAt<kKv, kNanCodes>(d, k1, i);
  auto x2 = LoadKvAt<kKv, kNanCodes>(d, k2, i), x3 = LoadKvAt<kKv, kNanCodes>(d, k3, i);
  InRegister(x0), InRegister(x1), InRegister(x2), InRegister(x3);
  const int64_t iq = i * kQStep;
  if constexpr (kRows > 0) DotRow(d, q + iq, x0, x1, x2, x3, a00, a01, a02, a03);
  if constexpr (kRows > 1) DotRow(d, q + q_row + iq, x0, x1, x2, x3, a10, a11, a12, a13);
  if constexpr (kRows > 2) DotRow(d, q + 2 * q_row + iq, x0, x1, x2, x3, a20, a21, a22, a23);
  if constexpr (kRows > 3) DotRow(d, q + 3 * q_row + iq, x0, x1, x2, x3, a30, a31, a32, a33);
}

// The dot products of 4 keys (rows k0..k3, the tile's keys j..j + 3) with
// rows [0, kRows) of Q over the head dimension's first dk_vec elements
// (whole vectors), added to aRC (row R, key C). Row R's vector at offset i
// is at q + R * q_row + i * kQStep. pf.K(j + C, ...) prefetches ahead of the
// lines read. kUnroll: unrolled by the compiler (the fused loop's steps).
// kNanCodes: as LoadKv's.
template <int kRows, Storage kKv, int kQStep, bool kUnroll, bool kNanCodes = true, class D,
          class V, class Prefetch>
HWY_INLINE void DotProducts4(D d, const float* HWY_RESTRICT q, int64_t q_row,
                             int64_t dk_vec, const KvElem<kKv>* k0,
                             const KvElem<kKv>* k1, const KvElem<kKv>* k2,
                             const KvElem<kKv>* k3, int64_t j, const Prefetch& pf,
                             V& a00, V& a01, V& a02, V& a03, V& a10, V& a11, V& a12,
                             V& a13, V& a20, V& a21, V& a22, V& a23, V& a30, V& a31,
                             V& a32, V& a33) {
  static_assert(kRows >= 1 && kRows <= 4, "1-4 rows");
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  if constexpr (kUnroll) {
#pragma GCC unroll 16
    for (int64_t i = 0; i < dk_vec; i += N) {
      DotStep<kRows, kKv, kQStep, kNanCodes>(d, i, q, q_row, k0, k1, k2, k3, j, pf, a00, a01,
                                  a02, a03, a10, a11, a12, a13, a20, a21, a22, a23,
                                  a30, a31, a32, a33);
    }
  } else {
    for (int64_t i = 0; i < dk_vec; i += N) {
      DotStep<kRows, kKv, kQStep, kNanCodes>(d, i, q, q_row, k0, k1, k2, k3, j, pf, a00, a01,
                                  a02, a03, a10, a11, a12, a13, a20, a21, a22, a23,
                                  a30, a31, a32, a33);
    }
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_DECODE_DOT_INL_H_
