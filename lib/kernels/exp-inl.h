// Vectorized exp for the softmax: per-target code (include from a
// foreach_target translation unit). Inputs are scores minus the row max.

#if defined(SIMDATTN_LIB_KERNELS_EXP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIMDATTN_LIB_KERNELS_EXP_INL_H_
#undef SIMDATTN_LIB_KERNELS_EXP_INL_H_
#else
#define SIMDATTN_LIB_KERNELS_EXP_INL_H_
#endif

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// exp(x) for x <= 0 (callers subtract the running max first), about 1 ulp.
// exp(x) = 2^n * exp(r) with n = round(x * log2(e)) and |r| <= ln2/2; exp(r)
// is a degree-6 polynomial (the classic Cephes expf coefficients) and 2^n is
// built in the exponent field. 17 instructions instead of the ~40 of
// hn::Exp, which matters because it runs once per score.
// x < -87 gives 0 (so does -inf: fully masked scores); NaN stays NaN, which
// the max-clamp alone would not guarantee on every target.
template <class D, class V = hn::VFromD<D>>
HWY_INLINE V ExpNonPositive(D d, V x) {
  const hn::RebindToSigned<D> di;
  const V lo = hn::Set(d, -87.0f);
  const V xc = hn::Max(x, lo);
  const V n = hn::Round(hn::Mul(xc, hn::Set(d, 1.44269504088896341f)));
  // r = x - n * ln2 with ln2 split in two so r keeps full precision.
  V r = hn::NegMulAdd(n, hn::Set(d, 0.693359375f), xc);
  r = hn::NegMulAdd(n, hn::Set(d, -2.12194440e-4f), r);
  V p = hn::Set(d, 1.9875691500e-4f);
  p = hn::MulAdd(p, r, hn::Set(d, 1.3981999507e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 8.3334519073e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.1665795894e-2f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.6666665459e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 5.0000001201e-1f));
  const V r2 = hn::Mul(r, r);
  const V y = hn::Add(hn::MulAdd(p, r2, r), hn::Set(d, 1.0f));
  // 2^n: n in [-126, 0], so n + 127 is a valid biased exponent.
  const auto bits = hn::ShiftLeft<23>(
      hn::Add(hn::ConvertTo(di, n), hn::Set(di, 127)));
  const V scaled = hn::Mul(y, hn::BitCast(d, bits));
  const V flushed = hn::IfThenZeroElse(hn::Lt(x, lo), scaled);
  return hn::IfThenElse(hn::IsNaN(x), x, flushed);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_EXP_INL_H_
