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
// is 1 + r + r^2 P(r) with the classic Cephes expf coefficients, evaluated
// as one Horner chain, and 2^n is built in the exponent field. 15 operations
// on x86 (17 elsewhere) instead of the ~40 of hn::Exp, which matters
// because it runs once per score.
// x < -87 gives 0 (so does -inf: fully masked scores); NaN stays NaN.
template <class D, class V = hn::VFromD<D>>
HWY_INLINE V ExpNonPositive(D d, V x) {
  const hn::RebindToSigned<D> di;
  const V lo = hn::Set(d, -87.0f);
  // With x second, x86's max returns x when it is NaN, so NaN flows through
  // every step below into the result. Elsewhere Highway's Max returns the
  // number (Arm's maxNumber, the scalar and emulated targets), and the NaN
  // is put back at the end.
  const V xc = hn::Max(lo, x);
  // Adding 1.5 * 2^23 rounds x * log2(e) to the nearest integer n, which
  // then sits in the low mantissa bits of t; the + 127 there is the exponent
  // bias of 2^n. n is in [-126, 0], so n + 127 is a valid biased exponent.
  const V magic = hn::Set(d, 12582912.0f + 127.0f);
  const V t = hn::MulAdd(xc, hn::Set(d, 1.44269504088896341f), magic);
  const V n = hn::Sub(t, magic);
  // r = x - n * ln2 with ln2 split in two so r keeps full precision.
  V r = hn::NegMulAdd(n, hn::Set(d, 0.693359375f), xc);
  r = hn::NegMulAdd(n, hn::Set(d, -2.12194440e-4f), r);
  V p = hn::Set(d, 1.9875691500e-4f);
  p = hn::MulAdd(p, r, hn::Set(d, 1.3981999507e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 8.3334519073e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.1665795894e-2f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.6666665459e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 5.0000001201e-1f));
  const V one = hn::Set(d, 1.0f);
  p = hn::MulAdd(p, r, one);
  p = hn::MulAdd(p, r, one);
  // 2^n: t's bits are those of 1.5 * 2^23 plus n + 127, whose top 9 bits
  // the shift drops.
  const V pow2n = hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(di, t)));
  const V y = hn::IfThenZeroElse(hn::Lt(x, lo), hn::Mul(p, pow2n));
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  return y;
#else
  return hn::IfThenElse(hn::IsNaN(x), x, y);
#endif
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#endif  // SIMDATTN_LIB_KERNELS_EXP_INL_H_
