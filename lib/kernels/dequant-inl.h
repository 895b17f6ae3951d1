// Dequantizing K/V stored in the quantized formats (int8, q8_0, fp8 e4m3 and
// e5m2; SEMANTICS.md "Quantized KV caches") to f32: x = scale * q, computed
// in f32 from the exact value of q (one rounding). Per-target code (include
// from a foreach_target translation unit).

#if defined(SIMDATTN_LIB_KERNELS_DEQUANT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_DEQUANT_INL_H_
#undef SIMDATTN_LIB_KERNELS_DEQUANT_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_DEQUANT_INL_H_
#endif

#include <cstdint>
#include <cstring>

#include "hwy/highway.h"
#include "lib/dtype.h"
#include "lib/kernels/types.h"
#include "lib/quant.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The Lanes(d) int8 values at p as f32 (exact).
template <class D>
HWY_INLINE hn::VFromD<D> LoadI8AsF32(D d, const int8_t* HWY_RESTRICT p) {
  const hn::Rebind<int8_t, D> d8;
  const hn::RebindToSigned<D> di;
  return hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(d8, p)));
}

// The Lanes(d) fp8 values at p (kE4M3 or kE5M2) as f32, exactly, by bit
// manipulation: the 7 magnitude bits moved to the top of an f32's exponent
// and mantissa and the exponent rebiased (e4m3: 7 -> 127, e5m2: 15 -> 127);
// subnormals (exponent 0) as mantissa x 2^(1 - bias - mantissa bits), which
// needs no f32 subnormals; e4m3's NaN (magnitude 0x7F) and e5m2's Inf/NaN
// (exponent 31, rebiased once more to 255) kept.
template <Storage kFmt, class D>
HWY_INLINE hn::VFromD<D> LoadFp8AsF32(D d, const uint8_t* HWY_RESTRICT p) {
  static_assert(kFmt == Storage::kE4M3 || kFmt == Storage::kE5M2, "fp8");
  constexpr bool kE4 = kFmt == Storage::kE4M3;
  constexpr int kMan = kE4 ? 3 : 2;
  constexpr int kBias = kE4 ? 7 : 15;
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;
  const hn::Rebind<uint8_t, D> d8;
  const auto b = hn::PromoteTo(du, hn::LoadU(d8, p));
  const auto sign = hn::ShiftLeft<24>(hn::And(b, hn::Set(du, 0x80u)));
  const auto mag = hn::BitCast(di, hn::And(b, hn::Set(du, 0x7Fu)));
  const auto rebias = hn::Set(di, (127 - kBias) << 23);
  auto bits = hn::Add(hn::ShiftLeft<23 - kMan>(mag), rebias);
  if constexpr (kE4) {
    bits = hn::IfThenElse(hn::Eq(mag, hn::Set(di, 0x7F)), hn::Set(di, 0x7FC00000), bits);
  } else {
    bits = hn::IfThenElse(hn::Gt(mag, hn::Set(di, 0x7B)), hn::Add(bits, rebias), bits);
  }
  const auto small = hn::Mul(hn::ConvertTo(d, mag),
                             hn::Set(d, 1.0f / static_cast<float>(1 << (kBias - 1 + kMan))));
  const auto is_small = hn::RebindMask(d, hn::Lt(mag, hn::Set(di, 1 << kMan)));
  const auto value = hn::IfThenElse(is_small, small, hn::BitCast(d, bits));
  return hn::Or(value, hn::BitCast(d, sign));
}

// Element i of a quantized row, unscaled (q8_0: with its block's scale).
HWY_INLINE float QuantValue(Storage type, const uint8_t* row, int64_t i) {
  switch (type) {
    case Storage::kI8:
      return static_cast<float>(static_cast<int8_t>(row[i]));
    case Storage::kE4M3:
      return E4M3ToF32(row[i]);
    case Storage::kE5M2:
      return E5M2ToF32(row[i]);
    default:
      return Q8_0Value(row, i);
  }
}

// dst[i] = scale * value[i] for the n values of one row of kI8, kE4M3 or
// kE5M2 at src (scale: the row's int8 scale or the fp8 tensor's).
template <Storage kFmt, class D>
HWY_INLINE void DequantRow8(D d, const uint8_t* HWY_RESTRICT src, float scale,
                            int64_t n, float* HWY_RESTRICT dst) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto vs = hn::Set(d, scale);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    if constexpr (kFmt == Storage::kI8) {
      hn::StoreU(hn::Mul(LoadI8AsF32(d, reinterpret_cast<const int8_t*>(src + i)), vs),
                 d, dst + i);
    } else {
      hn::StoreU(hn::Mul(LoadFp8AsF32<kFmt>(d, src + i), vs), d, dst + i);
    }
  }
  for (; i < n; ++i) dst[i] = scale * QuantValue(kFmt, src, i);
}

// The n values (n % 32 == 0) of one q8_0 row at src: per block of 32, its
// f16 scale times its int8 values.
template <class D>
HWY_INLINE void DequantRowQ8_0(D d, const uint8_t* HWY_RESTRICT src, int64_t n,
                               float* HWY_RESTRICT dst) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t b = 0; b < n / kQ8Block; ++b) {
    const uint8_t* block = src + b * kQ8BlockBytes;
    uint16_t d16;
    std::memcpy(&d16, block, 2);
    const float scale = F16ToF32(d16);
    const auto vs = hn::Set(d, scale);
    const int8_t* q = reinterpret_cast<const int8_t*>(block + 2);
    float* HWY_RESTRICT out = dst + b * kQ8Block;
    int64_t i = 0;
    for (; i + N <= kQ8Block; i += N) {
      hn::StoreU(hn::Mul(LoadI8AsF32(d, q + i), vs), d, out + i);
    }
    for (; i < kQ8Block; ++i) out[i] = scale * static_cast<float>(q[i]);
  }
}

// One row of n values in a quantized format `type` (kI8, kQ8_0, kE4M3,
// kE5M2) as f32 into dst; `scale` is the row's int8 scale or the fp8
// tensor's (unused for q8_0).
template <class D>
HWY_INLINE void DequantRow(D d, const uint8_t* HWY_RESTRICT src, Storage type,
                           float scale, int64_t n, float* HWY_RESTRICT dst) {
  switch (type) {
    case Storage::kI8:
      DequantRow8<Storage::kI8>(d, src, scale, n, dst);
      break;
    case Storage::kE4M3:
      DequantRow8<Storage::kE4M3>(d, src, scale, n, dst);
      break;
    case Storage::kE5M2:
      DequantRow8<Storage::kE5M2>(d, src, scale, n, dst);
      break;
    default:
      DequantRowQ8_0(d, src, n, dst);
      break;
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_DEQUANT_INL_H_
