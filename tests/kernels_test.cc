// The micro-kernels on every compiled target Highway supports on this CPU
// (HWY_EXPORT_AND_TEST_P), each against a scalar double-precision oracle:
// exp, f16/bf16 widening, the register-tile GEMM (plain, rescaled, guarded),
// the online-softmax step and softcap.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tests/kernels_test.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "hwy/aligned_allocator.h"
#include "hwy/highway.h"
#include "hwy/tests/hwy_gtest.h"
#include "lib/kernels/convert-inl.h"
#include "lib/kernels/exp-inl.h"
#include "lib/kernels/online_softmax-inl.h"
#include "lib/kernels/score_mods-inl.h"
#include "lib/kernels/tile_gemm-inl.h"

#ifndef SIMDATTN_TESTS_KERNELS_TEST_ORACLES_
#define SIMDATTN_TESTS_KERNELS_TEST_ORACLES_
namespace simdattn {
namespace oracle {

// IEEE binary16 bits as a double, from the definition.
inline double F16Value(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
  double v;
  if (exp == 31) {
    v = man == 0 ? std::numeric_limits<double>::infinity()
                 : std::numeric_limits<double>::quiet_NaN();
  } else if (exp == 0) {
    v = std::ldexp(man, -24);
  } else {
    v = std::ldexp(1024 + man, exp - 25);
  }
  return sign ? -v : v;
}

inline float Bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint32_t BitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace oracle
}  // namespace simdattn
#endif  // SIMDATTN_TESTS_KERNELS_TEST_ORACLES_

HWY_BEFORE_NAMESPACE();
namespace simdattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// exp(x) for x <= 0: relative error within 4 ulp (4.8e-7: a degree-4
// polynomial evaluated in f32) where the result is a normal f32, exactly 1
// at 0, +0.0 below 2^-126 and at -inf, NaN for NaN.
void TestExpNonPositive() {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  std::vector<float> xs = {0.0f, -0.0f, -1e-30f, -1e-7f, -0.5f, -1.0f,
                           -std::log(2.0f), -87.0f, -87.3f, -88.0f, -100.0f,
                           -1e30f, -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN()};
  for (int i = 0; i <= 20000; ++i) xs.push_back(-87.0f * static_cast<float>(i) / 20000.0f);
  auto in = hwy::AllocateAligned<float>(N);
  auto out = hwy::AllocateAligned<float>(N);
  for (float x : xs) {
    for (size_t k = 0; k < N; ++k) in[k] = x;
    hn::Store(ExpNonPositive(d, hn::Load(d, in.get())), d, out.get());
    const float y = out[0];
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(y));
      continue;
    }
    const double ref = std::exp(static_cast<double>(x));
    if (x == 0.0f) {
      EXPECT_EQ(y, 1.0f);
    } else if (ref < std::ldexp(1.0, -126)) {
      EXPECT_TRUE(y == 0.0f || (y >= std::ldexp(1.0f, -126) && y < 1.2e-38f)) << x;
      if (y == 0.0f) EXPECT_EQ(oracle::BitsOf(y), 0u) << "exp(" << x << ") is -0.0";
    } else {
      EXPECT_NEAR(y / ref, 1.0, 4.8e-7) << "exp(" << x << ")";
    }
    for (size_t k = 1; k < N; ++k) EXPECT_EQ(oracle::BitsOf(out[k]), oracle::BitsOf(y));
  }
}

// WidenRow: every f16 and bf16 bit pattern widens exactly (Inf and NaN
// kept), at lengths that leave a tail after the vectors.
void TestWidenRow() {
  const hn::ScalableTag<float> d;
  std::vector<uint16_t> src(65536 + 3);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(i);
  std::vector<float> dst(src.size());
  const int64_t n = static_cast<int64_t>(src.size());
  WidenRow(d, src.data(), Storage::kF16, n, dst.data());
  for (int64_t i = 0; i < n; ++i) {
    const double ref = oracle::F16Value(src[i]);
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(dst[i])) << "f16 bits " << src[i];
    } else {
      ASSERT_EQ(static_cast<double>(dst[i]), ref) << "f16 bits " << src[i];
      ASSERT_EQ(std::signbit(dst[i]), std::signbit(ref)) << "f16 bits " << src[i];
    }
  }
  WidenRow(d, src.data(), Storage::kBF16, n, dst.data());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(oracle::BitsOf(dst[i]), static_cast<uint32_t>(src[i]) << 16)
        << "bf16 bits " << src[i];
  }
}

// out[r][q] = (accumulate ? scale[q] * out[r][q] : 0) + sum_t b[r][t] a[t][q]
// in double.
std::vector<double> GemmOracle(int64_t rows, int64_t n, int64_t width,
                               const std::vector<float>& b, int64_t b_row,
                               const float* a, int64_t a_t, const float* scale,
                               const float* out0, int64_t out_row, bool guard) {
  std::vector<double> ref(static_cast<size_t>(rows * width));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t q = 0; q < width; ++q) {
      double sum = out0 != nullptr ? out0[r * out_row + q] : 0.0;
      if (out0 != nullptr && scale != nullptr) sum *= scale[q];
      for (int64_t t = 0; t < n; ++t) {
        const float x = a[t * a_t + q];
        if (guard && x == 0.0f && !std::signbit(x)) continue;
        sum += static_cast<double>(b[r * b_row + t]) * x;
      }
      ref[r * width + q] = sum;
    }
  }
  return ref;
}

// TileGemmRows against the oracle: every vector count of a query block,
// row counts around the register tile, a rescaled accumulation, and the
// guarded form, which must skip +0.0 weights even against Inf in b.
void TestTileGemmRows() {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  std::mt19937 rng(12345);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int cols : {1, 2, 4}) {  // one vector, or pairs (ForEachVectorPair)
    for (int64_t rows : {int64_t{1}, int64_t{kTileRows} - 1, int64_t{kTileRows},
                         int64_t{2 * kTileRows + 3}}) {
      for (int mode = 0; mode < 3; ++mode) {  // plain, rescaled, guarded
        const int64_t n = 37, width = cols * N, b_row = n + 5;
        std::vector<float> b(static_cast<size_t>(rows * b_row));
        for (float& x : b) x = dist(rng);
        auto a = hwy::AllocateAligned<float>(static_cast<size_t>(n * width));
        for (int64_t i = 0; i < n * width; ++i) a[i] = dist(rng);
        if (mode == 2) {  // hidden keys (+0.0 for every lane), Inf/NaN in b
          for (int64_t t = 0; t < n; t += 3) {
            for (int64_t q = 0; q < width; ++q) a[t * width + q] = 0.0f;
            b[t] = std::numeric_limits<float>::infinity();
            b[(rows - 1) * b_row + t] = std::numeric_limits<float>::quiet_NaN();
          }
        }
        auto scale = hwy::AllocateAligned<float>(static_cast<size_t>(width));
        for (int64_t q = 0; q < width; ++q) scale[q] = 0.25f + 0.5f * (q % 3);
        auto out = hwy::AllocateAligned<float>(static_cast<size_t>(rows * width));
        for (int64_t i = 0; i < rows * width; ++i) out[i] = dist(rng);
        const std::vector<float> out0(out.get(), out.get() + rows * width);
        const std::vector<double> ref =
            GemmOracle(rows, n, width, b, b_row, a.get(), width,
                       mode == 1 ? scale.get() : nullptr,
                       mode == 0 ? nullptr : out0.data(), width, mode == 2);
        if (mode == 0) {
          TileGemmRows<false, false>(d, cols, rows, b.data(), b_row, 1, a.get(),
                                     width, n, nullptr, out.get(), width);
        } else if (mode == 1) {
          TileGemmRows<true, false>(d, cols, rows, b.data(), b_row, 1, a.get(),
                                    width, n, scale.get(), out.get(), width);
        } else {
          TileGemmRows<true, true>(d, cols, rows, b.data(), b_row, 1, a.get(),
                                   width, n, nullptr, out.get(), width);
        }
        for (int64_t i = 0; i < rows * width; ++i) {
          ASSERT_NEAR(out[i], ref[i], 1e-5 * (n + 1))
              << "cols " << cols << " rows " << rows << " mode " << mode << " at " << i;
        }
      }
    }
  }
}

// One online-softmax step over a transposed tile against the recurrence in
// double: new max, alpha = exp(m_old - m_new), p_j = exp(s_j - m_new),
// l = alpha l + sum p, each exp within ExpNonPositive's 4 ulp of the exact
// exp of the f32 difference the kernel takes. Lanes cover a running row, a row whose max grows, a
// row that has seen nothing yet, and a row whose scores are all hidden.
void TestSoftmaxTile() {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::mt19937 rng(777);
  std::uniform_real_distribution<float> dist(-8.0f, 8.0f);
  for (int cols : {1, 2, 4}) {
    for (int64_t nk : {int64_t{1}, int64_t{5}, int64_t{64}}) {
      const int64_t width = cols * N;
      auto st = hwy::AllocateAligned<float>(static_cast<size_t>(nk * width));
      auto m = hwy::AllocateAligned<float>(static_cast<size_t>(width));
      auto l = hwy::AllocateAligned<float>(static_cast<size_t>(width));
      auto alpha = hwy::AllocateAligned<float>(static_cast<size_t>(width));
      for (int64_t q = 0; q < width; ++q) {
        const int kind = static_cast<int>(q % 4);
        m[q] = kind == 0 ? 9.0f : kind == 1 ? -20.0f : neg_inf;
        l[q] = kind <= 1 ? 3.5f : 0.0f;
        for (int64_t j = 0; j < nk; ++j) {
          st[j * width + q] = kind == 3 ? neg_inf : (j % 7 == 6 ? neg_inf : dist(rng));
        }
      }
      const std::vector<float> s0(st.get(), st.get() + nk * width);
      const std::vector<float> m0(m.get(), m.get() + width), l0(l.get(), l.get() + width);
      const bool rescale = SoftmaxTile(d, cols, st.get(), nk, m.get(), l.get(), alpha.get());
      bool any_alpha = false;
      for (int64_t q = 0; q < width; ++q) {
        double mx = m0[q];
        for (int64_t j = 0; j < nk; ++j) mx = std::max<double>(mx, s0[j * width + q]);
        ASSERT_EQ(m[q], static_cast<float>(mx)) << "lane " << q;
        if (mx == -std::numeric_limits<double>::infinity()) {
          EXPECT_EQ(l[q], 0.0f);
          for (int64_t j = 0; j < nk; ++j) EXPECT_EQ(st[j * width + q], 0.0f);
          continue;
        }
        const float m_new = static_cast<float>(mx);
        const double a = std::exp(static_cast<double>(m0[q] - m_new));
        EXPECT_NEAR(alpha[q], a, 4.8e-7 * a) << "lane " << q;
        if (alpha[q] != 1.0f) any_alpha = true;
        double sum = a * l0[q];
        for (int64_t j = 0; j < nk; ++j) {
          const double p = std::exp(static_cast<double>(s0[j * width + q] - m_new));
          EXPECT_NEAR(st[j * width + q], p, 4.8e-7 * p) << "lane " << q << " key " << j;
          sum += p;
        }
        EXPECT_NEAR(l[q], sum, 1e-6 * sum) << "lane " << q;
      }
      EXPECT_EQ(rescale, any_alpha);
    }
  }
}

// cap * tanh(s / cap) within 4e-7 * cap, both forms of the polynomial and
// the saturation; NaN stays NaN.
void TestSoftcap() {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto in = hwy::AllocateAligned<float>(N);
  auto out = hwy::AllocateAligned<float>(N);
  for (float cap : {1.0f, 30.0f, 50.0f}) {
    const auto vcap = hn::Set(d, cap), inv = hn::Set(d, 1.0f / cap);
    for (int i = -4000; i <= 4000; ++i) {
      const float s = cap * static_cast<float>(i) / 500.0f;
      for (size_t k = 0; k < N; ++k) in[k] = s;
      hn::Store(Softcap(d, hn::Load(d, in.get()), vcap, inv), d, out.get());
      const double ref = cap * std::tanh(static_cast<double>(s) / cap);
      ASSERT_NEAR(out[0], ref, 4e-7 * cap) << "cap " << cap << " s " << s;
    }
    for (size_t k = 0; k < N; ++k) in[k] = std::numeric_limits<float>::quiet_NaN();
    hn::Store(Softcap(d, hn::Load(d, in.get()), vcap, inv), d, out.get());
    EXPECT_TRUE(std::isnan(out[0]));
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace simdattn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace simdattn {
HWY_BEFORE_TEST(KernelsTest);
HWY_EXPORT_AND_TEST_P(KernelsTest, TestExpNonPositive);
HWY_EXPORT_AND_TEST_P(KernelsTest, TestWidenRow);
HWY_EXPORT_AND_TEST_P(KernelsTest, TestTileGemmRows);
HWY_EXPORT_AND_TEST_P(KernelsTest, TestSoftmaxTile);
HWY_EXPORT_AND_TEST_P(KernelsTest, TestSoftcap);
}  // namespace simdattn
#endif
