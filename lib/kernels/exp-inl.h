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

// exp(x) for x <= 0 (callers subtract the running max first), within about
// 0.85 ulp. exp(x) = 2^n * exp(r) with n = floor(x * log2(e)) and
// 0 <= r < ln2; exp(r) is 1 + r * q(r), q of degree 5 (relative error 2e-9
// in exact arithmetic, below f32 rounding), evaluated as one Horner chain,
// and 2^n is built in the exponent field. 14 operations on x86 (16
// elsewhere) instead of the ~40 of hn::Exp, which matters because it runs
// once per score.
// exp(0) is exactly 1. Results below 2^-126 are +0.0 (so is exp(-inf):
// hidden scores), never subnormal: x86 multiplies that make a subnormal take
// a slow microcode path (rounding n to the nearest instead, results between
// 2^-127 and 2^-126 came out subnormal, and ALiBi scores, which reach them,
// ran 29% slower). NaN stays NaN.
template <class D, class V = hn::VFromD<D>>
HWY_INLINE V ExpNonPositive(D d, V x) {
  const hn::RebindToSigned<D> di;
  // x is clamped at -88 so that n >= -127. With x second, x86's max returns
  // x when it is NaN, so NaN flows through every step below into the
  // result. Elsewhere Highway's Max returns the number (Arm's maxNumber,
  // the scalar and emulated targets), and the NaN is put back at the end.
  const V xc = hn::Max(hn::Set(d, -88.0f), x);
  // Adding 1.5 * 2^23 rounds x * log2(e) - 0.5 to the nearest integer,
  // floor(x * log2(e)), which then sits in the low mantissa bits of t; the
  // + 127 there is the exponent bias of 2^n. n is in [-127, 0], so n + 127
  // is in [0, 127], and 0 makes 2^n +0.0 (instead of a compare and a select
  // to zero the small results).
  const V magic = hn::Set(d, 12582912.0f + 127.0f);
  const V t = hn::Add(hn::MulAdd(xc, hn::Set(d, 1.44269504088896341f), hn::Set(d, -0.5f)),
                      magic);
  const V n = hn::Sub(t, magic);
  // r = x - n * ln2 with ln2 split in two so r keeps full precision.
  V r = hn::NegMulAdd(n, hn::Set(d, 0.693359375f), xc);
  r = hn::NegMulAdd(n, hn::Set(d, -2.12194440e-4f), r);
  // q: a least-squares fit of (exp(r) - 1) / r on Chebyshev nodes of
  // [0, ln2], reweighted to minimize the largest relative error of exp(r).
  V p = hn::Set(d, 1.9497524481e-3f);
  p = hn::MulAdd(p, r, hn::Set(d, 7.7904760838e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.1916199028e-2f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.6660976410e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 5.0000590086e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 9.9999982119e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f));
  // 2^n: t's bits are those of 1.5 * 2^23 plus n + 127, whose top 9 bits
  // the shift drops.
  const V pow2n = hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(di, t)));
  const V y = hn::Mul(p, pow2n);
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
