// Widening f16/bf16 rows to f32 for the kernels: per-target code (include
// from a foreach_target translation unit).

#if defined(SIMDATTN_LIB_KERNELS_CONVERT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_CONVERT_INL_H_
#undef SIMDATTN_LIB_KERNELS_CONVERT_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_CONVERT_INL_H_
#endif

#include <cstdint>

#include "hwy/highway.h"
#include "lib/dtype.h"
#include "lib/kernels/types.h"

// 1 where this target converts f16 <-> f32 in hardware (F16C on AVX2 and
// AVX-512, NEON, SVE). Highway 1.0.3 emulates the conversion elsewhere and
// turns f16 Inf into 65536, so SSSE3, SSE4, SCALAR and EMU128 convert in
// software (lib/dtype.h). Redefined for every target pass of this header.
#undef SIMDATTN_HW_F16
#if HWY_TARGET == HWY_SSSE3 || HWY_TARGET == HWY_SSE4 || \
    HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
#define SIMDATTN_HW_F16 0
#else
#define SIMDATTN_HW_F16 1
#endif

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The Lanes(d) f16 values at p widened exactly, in software: F16ToF32 of
// lib/dtype.h (Inf and NaN kept, NaN payloads too) with integer vector ops,
// for SSSE3 and SSE4, which have no hardware conversion (Highway 1.0.3's own
// software path there turns f16 Inf into 65536): about 2x the speed of
// F16ToF32 per element for decode from L2 on SSE4 (1.1-1.5 -> 3.1-4.0 GB/s,
// f16 K/V, SIMDATTN_MAX_TARGET=SSE4). SCALAR keeps F16ToF32.
template <class D>
HWY_INLINE hn::VFromD<D> LoadF16Soft(D d, const uint16_t* HWY_RESTRICT p) {
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;
  const hn::Rebind<uint16_t, D> d16;
  const auto h = hn::PromoteTo(du, hn::LoadU(d16, p));
  const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
  const auto magnitude = hn::BitCast(di, hn::And(h, hn::Set(du, 0x7FFFu)));
  // Normal: the exponent rebiased from 15 to 127 (+112 << 23); Inf and NaN
  // (exponent 31) rebiased once more, to 255.
  const auto rebias = hn::Set(di, 112 << 23);
  auto bits = hn::Add(hn::ShiftLeft<13>(magnitude), rebias);
  const auto inf_nan = hn::Gt(magnitude, hn::Set(di, 0x7BFF));
  bits = hn::IfThenElse(inf_nan, hn::Add(bits, rebias), bits);
  // Zero and subnormal: mantissa x 2^-24, exact in f32.
  const auto small = hn::Mul(hn::ConvertTo(d, magnitude), hn::Set(d, 1.0f / 16777216.0f));
  const auto is_small = hn::RebindMask(d, hn::Lt(magnitude, hn::Set(di, 0x0400)));
  const auto value = hn::IfThenElse(is_small, small, hn::BitCast(d, bits));
  return hn::Or(value, hn::BitCast(d, sign));
}

// dst[0..n) = src[0..n) widened exactly. f16 uses the hardware conversion
// where the target has one (F16C on AVX2/AVX-512, NEON, SVE); SSSE3 and
// SSE4 convert in software (LoadF16Soft) and SCALAR with F16ToF32, because
// Highway 1.0.3's software path turns f16 Inf into 65536 and SEMANTICS.md
// wants Inf and NaN kept on every target. bf16 -> f32 is a shift everywhere.
template <class D>
HWY_INLINE void WidenRow(D d, const uint16_t* HWY_RESTRICT src, Storage type,
                         int64_t n, float* HWY_RESTRICT dst) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  if (type == Storage::kBF16) {
    const hn::Rebind<hwy::bfloat16_t, D> dbf;
    for (; i + N <= n; i += N) {
      hn::StoreU(hn::PromoteTo(d, hn::LoadU(dbf, reinterpret_cast<const hwy::bfloat16_t*>(src + i))),
                 d, dst + i);
    }
    for (; i < n; ++i) dst[i] = BF16ToF32(src[i]);
    return;
  }
#if SIMDATTN_HW_F16
  const hn::Rebind<hwy::float16_t, D> dh;
  for (; i + N <= n; i += N) {
    hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(src + i))),
               d, dst + i);
  }
#elif HWY_TARGET != HWY_SCALAR
  for (; i + N <= n; i += N) hn::StoreU(LoadF16Soft(d, src + i), d, dst + i);
#endif
  for (; i < n; ++i) dst[i] = F16ToF32(src[i]);
}

// Widens `rows` rows of `cols` elements (row i at src + i * src_stride) into
// a dense [rows][cols] f32 buffer.
template <class D>
HWY_INLINE void WidenRows(D d, const uint16_t* src, int64_t src_stride,
                          Storage type, int64_t rows, int64_t cols,
                          float* HWY_RESTRICT dst) {
  for (int64_t r = 0; r < rows; ++r) {
    WidenRow(d, src + r * src_stride, type, cols, dst + r * cols);
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_CONVERT_INL_H_
