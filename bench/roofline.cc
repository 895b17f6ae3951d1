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

// One query row's step of the dot products: its vector qv times the K
// vectors x0..x3 of 4 keys, into its 4 accumulators.
template <class V>
HWY_INLINE void FloorDots(V qv, V x0, V x1, V x2, V x3, V* acc) {
  acc[0] = hn::MulAdd(qv, x0, acc[0]), acc[1] = hn::MulAdd(qv, x1, acc[1]);
  acc[2] = hn::MulAdd(qv, x2, acc[2]), acc[3] = hn::MulAdd(qv, x3, acc[3]);
}

float Int8DecodeFloorImpl(const float* HWY_RESTRICT q, const int8_t* HWY_RESTRICT k,
                          const int8_t* HWY_RESTRICT v, int64_t keys, int64_t dim,
                          float* HWY_RESTRICT o) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<int32_t, decltype(d)> di;
  const hn::Rebind<int8_t, decltype(d)> d8;
  using V = hn::VFromD<decltype(d)>;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  constexpr int64_t kAhead = 64;  // keys, into L2 as kDense8BitAheadKeys
  const auto widen = [&](const int8_t* p) {
    return hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(d8, p)));
  };
  V acc[16];
  for (V& a : acc) a = hn::Zero(d);
  // Weights that do not depend on the scores: the P·V products need not
  // wait for the dot products.
  const V w0 = hn::Set(d, 0.25f), w1 = hn::Set(d, 0.5f), w2 = hn::Set(d, 0.75f),
          w3 = hn::Set(d, 1.0f);
  for (int64_t j = 0; j + 4 <= keys; j += 4) {
    const int8_t* kj = k + j * dim;
    const int8_t* vj = v + j * dim;
    if (j + kAhead + 4 <= keys) {
      for (int64_t b = 0; b < 4 * dim; b += 64) {
        __builtin_prefetch(kj + kAhead * dim + b, 0, 2);
        __builtin_prefetch(vj + kAhead * dim + b, 0, 2);
      }
    }
    for (int64_t e = 0; e < dim; e += N) {
      const V x0 = widen(kj + e), x1 = widen(kj + dim + e);
      const V x2 = widen(kj + 2 * dim + e), x3 = widen(kj + 3 * dim + e);
      for (int64_t r = 0; r < 4; ++r) {
        FloorDots(hn::LoadU(d, q + r * dim + e), x0, x1, x2, x3, acc + 4 * r);
      }
    }
    for (int64_t e = 0; e < dim; e += N) {
      const V x0 = widen(vj + e), x1 = widen(vj + dim + e);
      const V x2 = widen(vj + 2 * dim + e), x3 = widen(vj + 3 * dim + e);
      for (int64_t r = 0; r < 4; ++r) {
        float* orow = o + r * dim + e;
        V a = hn::LoadU(d, orow);
        a = hn::MulAdd(w0, x0, a), a = hn::MulAdd(w1, x1, a);
        a = hn::MulAdd(w2, x2, a), a = hn::MulAdd(w3, x3, a);
        hn::StoreU(a, d, orow);
      }
    }
  }
  V s = acc[0];
  for (int i = 1; i < 16; ++i) s = hn::Add(s, acc[i]);
  return hn::GetLane(hn::SumOfLanes(d, s));
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
HWY_EXPORT(Int8DecodeFloorImpl);

double FmaPeakLoop(int64_t iterations, float* sink) {
  return HWY_DYNAMIC_DISPATCH(FmaPeakLoopImpl)(iterations, sink);
}
float StreamRead(const float* data, size_t n) {
  return HWY_DYNAMIC_DISPATCH(StreamReadImpl)(data, n);
}
float Int8DecodeFloor(const float* q, const int8_t* k, const int8_t* v, int64_t keys,
                      int64_t dim, float* o) {
  return HWY_DYNAMIC_DISPATCH(Int8DecodeFloorImpl)(q, k, v, keys, dim, o);
}
const char* RooflineTarget() { return HWY_DYNAMIC_DISPATCH(TargetNameImpl)(); }

}  // namespace bench
}  // namespace simdattn
#endif  // HWY_ONCE
