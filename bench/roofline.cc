// Roofline loops for simdattn_bench, compiled for every Highway target and
// run on the best one.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/roofline.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "bench/roofline.h"
#include "hwy/highway.h"
#include "lib/kernels/kernels.h"

#if SIMDATTN_NATIVE_BF16_COMPILER && HWY_ONCE
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace bench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// 16 accumulators: FMA latency 4 x 2 ports needs 8 in flight; 16 leaves
// slack. Multiplier and addend chosen so values stay finite and normal.
double FmaPeakLoopImpl(int64_t iterations, float* sink) {
  const hn::ScalableTag<float> d;
  const auto mul = hn::Set(d, 0.999999f);
  const auto add = hn::Set(d, 1e-7f);
  auto a0 = hn::Set(d, 1.0f), a1 = hn::Set(d, 1.1f), a2 = hn::Set(d, 1.2f);
  auto a3 = hn::Set(d, 1.3f), a4 = hn::Set(d, 1.4f), a5 = hn::Set(d, 1.5f);
  auto a6 = hn::Set(d, 1.6f), a7 = hn::Set(d, 1.7f), a8 = hn::Set(d, 1.8f);
  auto a9 = hn::Set(d, 1.9f), a10 = hn::Set(d, 2.0f), a11 = hn::Set(d, 2.1f);
  auto a12 = hn::Set(d, 2.2f), a13 = hn::Set(d, 2.3f), a14 = hn::Set(d, 2.4f);
  auto a15 = hn::Set(d, 2.5f);
  for (int64_t i = 0; i < iterations; ++i) {
    a0 = hn::MulAdd(a0, mul, add), a1 = hn::MulAdd(a1, mul, add);
    a2 = hn::MulAdd(a2, mul, add), a3 = hn::MulAdd(a3, mul, add);
    a4 = hn::MulAdd(a4, mul, add), a5 = hn::MulAdd(a5, mul, add);
    a6 = hn::MulAdd(a6, mul, add), a7 = hn::MulAdd(a7, mul, add);
    a8 = hn::MulAdd(a8, mul, add), a9 = hn::MulAdd(a9, mul, add);
    a10 = hn::MulAdd(a10, mul, add), a11 = hn::MulAdd(a11, mul, add);
    a12 = hn::MulAdd(a12, mul, add), a13 = hn::MulAdd(a13, mul, add);
    a14 = hn::MulAdd(a14, mul, add), a15 = hn::MulAdd(a15, mul, add);
  }
  auto s = hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)),
                   hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
  s = hn::Add(s, hn::Add(hn::Add(hn::Add(a8, a9), hn::Add(a10, a11)),
                         hn::Add(hn::Add(a12, a13), hn::Add(a14, a15))));
  *sink = hn::GetLane(hn::SumOfLanes(d, s));
  return 2.0 * 16.0 * static_cast<double>(hn::Lanes(d)) *
         static_cast<double>(iterations);
}

float StreamReadImpl(const float* HWY_RESTRICT data, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    s0 = hn::Add(s0, hn::LoadU(d, data + i));
    s1 = hn::Add(s1, hn::LoadU(d, data + i + N));
    s2 = hn::Add(s2, hn::LoadU(d, data + i + 2 * N));
    s3 = hn::Add(s3, hn::LoadU(d, data + i + 3 * N));
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += data[i];
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3)))) + tail;
}

const char* TargetNameImpl() { return hwy::TargetName(HWY_TARGET); }

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace bench
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace simdattn {
namespace bench {

#if SIMDATTN_NATIVE_BF16_COMPILER
// 16 independent chains of vdpbf16ps (latency 5-6 cycles x 2 ports needs
// 10-12 in flight). The operands are bf16 pairs of 1.0 and 2^-22, so the
// accumulators stay normal.
__attribute__((target("avx512f,avx512bf16"))) double DotBf16PeakLoop(
    int64_t iterations, float* sink) {
  const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3F803F80);
  const __m512bh y = (__m512bh)_mm512_set1_epi32(0x34803480);
  __m512 acc[16];
  for (int k = 0; k < 16; ++k) acc[k] = _mm512_set1_ps(1.0f + 0.125f * k);
  for (int64_t i = 0; i < iterations; ++i) {
    for (int k = 0; k < 16; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], x, y);
  }
  __m512 s = acc[0];
  for (int k = 1; k < 16; ++k) s = _mm512_add_ps(s, acc[k]);
  *sink = _mm512_reduce_add_ps(s);
  return 64.0 * 16.0 * static_cast<double>(iterations);
}
#else
double DotBf16PeakLoop(int64_t, float*) { return 0.0; }
#endif

HWY_EXPORT(FmaPeakLoopImpl);
HWY_EXPORT(StreamReadImpl);
HWY_EXPORT(TargetNameImpl);

double FmaPeakLoop(int64_t iterations, float* sink) {
  return HWY_DYNAMIC_DISPATCH(FmaPeakLoopImpl)(iterations, sink);
}
float StreamRead(const float* data, size_t n) {
  return HWY_DYNAMIC_DISPATCH(StreamReadImpl)(data, n);
}
const char* RooflineTarget() { return HWY_DYNAMIC_DISPATCH(TargetNameImpl)(); }

}  // namespace bench
}  // namespace simdattn
#endif  // HWY_ONCE
