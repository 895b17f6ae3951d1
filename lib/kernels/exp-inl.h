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
// 1.4 ulp plus |n| * 1.9e-9 relative (below 4e-7 for every normal result;
// see the range reduction). exp(x) = 2^n * exp(r) with n = floor(x *
// log2(e)) and 0 <= r < ln2; exp(r) is 1 + r * q(r), q of degree 4
// (relative error 1.7e-7 evaluated in f32 with FMAs), evaluated as one
// Horner chain, and 2^n is built in the exponent field. 12 operations on
// x86 instead of the ~40 of hn::Exp, which matters because it runs once per
// score: 1.015x faster than a degree-5 q with a two-step reduction (f32
// B4 H16 L256 D64, 1 thread).
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
  // r = x - n * ln2. With a fused multiply-add one step suffices: the
  // product n * ln2_f32 is not rounded, and ln2_f32 is 1.9e-9 off ln2, so r
  // is off by |n| * 1.9e-9 (n >= -127). Without FMA (SSSE3, SSE4) the
  // product is rounded, so ln2 is split in two, the first part with few
  // enough bits that n times it is exact.
#if HWY_NATIVE_FMA
  const V r = hn::NegMulAdd(n, hn::Set(d, 0.693147180559945309f), xc);
#else
  V r = hn::NegMulAdd(n, hn::Set(d, 0.693359375f), xc);
  r = hn::NegMulAdd(n, hn::Set(d, -2.12194440e-4f), r);
#endif
  // q: a least-squares fit of (exp(r) - 1) / r on Chebyshev nodes of
  // [0, ln2], reweighted to minimize the largest relative error of exp(r);
  // then the last two coefficients moved 3 and 1 ulp so that p(ln2_f32)
  // rounds to exactly 2 (with and without FMA): x = 0 gives n = -1 (the
  // magic - 0.5 ties to even) and r = ln2_f32, so exp(0) is exactly 1.
  V p = hn::Set(d, 1.1674974114e-2f);
  p = hn::MulAdd(p, r, hn::Set(d, 3.9054416120e-2f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.6755898297e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.9987015128e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0000060797f));
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
