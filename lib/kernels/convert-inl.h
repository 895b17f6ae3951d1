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

// Storage types of K/V as the kernels see them.
enum class KvType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

// dst[0..n) = src[0..n) widened exactly. f16 uses the hardware conversion
// where the target has one (F16C on AVX2/AVX-512, NEON, SVE); SSSE3, SSE4
// and SCALAR convert in software with lib/dtype.h, because Highway 1.0.3's
// software path turns f16 Inf into 65536 and SEMANTICS.md wants Inf and NaN
// kept on every target. bf16 -> f32 is a shift everywhere.
template <class D>
HWY_INLINE void WidenRow(D d, const uint16_t* HWY_RESTRICT src, KvType type,
                         int64_t n, float* HWY_RESTRICT dst) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  if (type == KvType::kBF16) {
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
#endif
  for (; i < n; ++i) dst[i] = F16ToF32(src[i]);
}

// Widens `rows` rows of `cols` elements (row i at src + i * src_stride) into
// a dense [rows][cols] f32 buffer.
template <class D>
HWY_INLINE void WidenRows(D d, const uint16_t* src, int64_t src_stride,
                          KvType type, int64_t rows, int64_t cols,
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
