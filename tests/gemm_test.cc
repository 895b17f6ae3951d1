// The projections' GEMM (lib/gemm) on every target against a double
// reference: shapes around the row tile, the panel width and the reduction
// chunk, padded strides, 16-bit inputs and outputs, segments, bias, and
// bit-identical results for any thread count.

#include <cmath>
#include <cstring>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/dtype.h"
#include "lib/gemm/gemm.h"
#include "tests/test_util.h"

namespace simdattn {
namespace test {
namespace {

// Values stored in a dtype (f32 or 16-bit bits), with their rounded f32.
struct Stored {
  DType dtype;
  std::vector<float> f32;      // rounded values
  std::vector<uint16_t> bits;  // 16-bit storage
  const void* data() const {
    return dtype == DType::kF32 ? static_cast<const void*>(f32.data())
                                : static_cast<const void*>(bits.data());
  }
};

float Round(float x, DType t) {
  if (t == DType::kBF16) return BF16ToF32(F32ToBF16(x));
  if (t == DType::kF16) return F16ToF32(F32ToF16(x));
  return x;
}

Stored Random(DType t, size_t n, std::mt19937* rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Stored s{t, std::vector<float>(n), {}};
  if (t != DType::kF32) s.bits.resize(n);
  for (size_t i = 0; i < n; ++i) {
    s.f32[i] = Round(u(*rng), t);
    if (t == DType::kBF16) s.bits[i] = F32ToBF16(s.f32[i]);
    if (t == DType::kF16) s.bits[i] = F32ToF16(s.f32[i]);
  }
  return s;
}

float ReadC(const std::vector<uint8_t>& c, DType t, int64_t i) {
  if (t == DType::kF32) return reinterpret_cast<const float*>(c.data())[i];
  const uint16_t x = reinterpret_cast<const uint16_t*>(c.data())[i];
  return t == DType::kBF16 ? BF16ToF32(x) : F16ToF32(x);
}

struct Case {
  int64_t m, n, k;
  DType a_type = DType::kF32, w_type = DType::kF32, c_type = DType::kF32;
  bool bias = true;
  int64_t pad = 0;  // extra elements per row of A, W and C
};

// Packs W, multiplies, and checks every element against the double sum:
// |c - ref| <= 2^-22 * sum|a w| * sqrt(k) (f32 chains) plus the rounding
// of a 16-bit C (half an ulp of its type).
void CheckCase(const Case& tc, const std::string& target, std::mt19937* rng) {
  SCOPED_TRACE("target " + target + " m " + std::to_string(tc.m) + " n " +
               std::to_string(tc.n) + " k " + std::to_string(tc.k) + " a " +
               DTypeName(tc.a_type) + " w " + DTypeName(tc.w_type) + " c " +
               DTypeName(tc.c_type) + " pad " + std::to_string(tc.pad));
  const int64_t lda = tc.k + tc.pad, ldw = tc.k + tc.pad, ldc = tc.n + tc.pad;
  const Stored a = Random(tc.a_type, size_t(tc.m * lda), rng);
  const Stored w = Random(tc.w_type, size_t(tc.n * ldw), rng);
  const Stored bias = Random(DType::kF32, size_t(tc.n), rng);
  WeightMatrix wm{w.data(), tc.w_type, tc.n, ldw, tc.bias ? bias.data() : nullptr};
  PackedWeights packed;
  ASSERT_TRUE(PackWeights(&wm, 1, tc.k, {}, &packed).ok());
  EXPECT_EQ(packed.target, target);
  std::vector<uint8_t> c(size_t(tc.m * ldc) * size_t(DTypeSize(tc.c_type)), 0xAB);
  const Status s = Gemm({a.data(), tc.a_type, tc.m, lda}, packed, 0, 1, c.data(),
                        tc.c_type, ldc, {});
  ASSERT_TRUE(s.ok()) << s.message;
  RecordTargetRun(packed.target);
  const double ulp16 = tc.c_type == DType::kBF16 ? 1.0 / 256 : tc.c_type == DType::kF16 ? 1.0 / 2048 : 0.0;
  int bad = 0;
  for (int64_t i = 0; i < tc.m && bad < 5; ++i) {
    for (int64_t j = 0; j < tc.n && bad < 5; ++j) {
      double ref = tc.bias ? bias.f32[size_t(j)] : 0.0, mag = std::fabs(ref);
      for (int64_t t = 0; t < tc.k; ++t) {
        const double p = double(a.f32[size_t(i * lda + t)]) * w.f32[size_t(j * ldw + t)];
        ref += p;
        mag += std::fabs(p);
      }
      const double got = ReadC(c, tc.c_type, i * ldc + j);
      const double bound = std::ldexp(mag, -22) * std::sqrt(double(tc.k) + 1) + ulp16 * std::fabs(ref);
      if (!(std::fabs(got - ref) <= bound)) {
        ADD_FAILURE() << "C[" << i << "][" << j << "] = " << got << ", want " << ref;
        ++bad;
      }
    }
    // Padding past the n columns of each row is untouched.
    for (int64_t j = tc.n; j < ldc; ++j) {
      ASSERT_EQ(c[size_t((i * ldc + j) * DTypeSize(tc.c_type))], 0xAB) << "row " << i;
    }
  }
}

TEST(GemmTest, MatchesDoubleReferenceOnEveryTarget) {
  std::mt19937 rng(41);
  for (const std::string& target : TestTargets()) {
    ScopedTarget scoped(target);
    std::vector<int64_t> ms = {1, 3, 6, 7, 8, 9, 60, 61, 65}, ns = {1, 15, 32, 33, 100};
    std::vector<int64_t> ks = {1, 7, 256, 257, 300};
    if (QuickMode()) ms = {1, 9, 65}, ns = {1, 33}, ks = {7, 257};
    for (int64_t m : ms)
      for (int64_t n : ns)
        for (int64_t k : ks) CheckCase({m, n, k}, target, &rng);
  }
}

TEST(GemmTest, StridesBiasAndSixteenBitTypes) {
  std::mt19937 rng(7);
  const DType types[] = {DType::kF32, DType::kF16, DType::kBF16};
  for (const std::string& target : TestTargets()) {
    ScopedTarget scoped(target);
    for (DType at : types) {
      for (DType wt : types) {
        for (DType ct : types) {
          Case tc{70, 41, 263, at, wt, ct, (at == wt), 3};
          CheckCase(tc, target, &rng);
        }
      }
    }
  }
}

// Segments packed side by side: a range of them writes their columns next
// to each other, each from its own rows of W and its own bias.
TEST(GemmTest, SegmentRangesWriteTheirColumnsSideBySide) {
  std::mt19937 rng(3);
  const int64_t k = 45, m = 11;
  const int64_t n[3] = {20, 37, 5};
  std::vector<Stored> ws, bs;
  std::vector<WeightMatrix> mats;
  for (int s = 0; s < 3; ++s) {
    ws.push_back(Random(DType::kF32, size_t(n[s] * k), &rng));
    bs.push_back(Random(DType::kF32, size_t(n[s]), &rng));
  }
  for (int s = 0; s < 3; ++s) {
    mats.push_back({ws[size_t(s)].data(), DType::kF32, n[s], k, s == 1 ? nullptr : bs[size_t(s)].data()});
  }
  const Stored a = Random(DType::kF32, size_t(m * k), &rng);
  for (const std::string& target : TestTargets()) {
    ScopedTarget scoped(target);
    PackedWeights packed;
    ASSERT_TRUE(PackWeights(mats.data(), 3, k, {}, &packed).ok());
    std::vector<float> c(size_t(m * (n[1] + n[2])));
    ASSERT_TRUE(Gemm({a.data(), DType::kF32, m, k}, packed, 1, 3, c.data(), DType::kF32,
                     n[1] + n[2], {}).ok());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n[1] + n[2]; ++j) {
        const int s = j < n[1] ? 1 : 2;
        const int64_t row = s == 1 ? j : j - n[1];
        double ref = s == 1 ? 0.0 : bs[2].f32[size_t(row)];
        for (int64_t t = 0; t < k; ++t) ref += double(a.f32[size_t(i * k + t)]) * ws[size_t(s)].f32[size_t(row * k + t)];
        EXPECT_NEAR(c[size_t(i * (n[1] + n[2]) + j)], ref, 1e-4) << target << " " << i << " " << j;
      }
    }
  }
}

// The same bits for 1, 2 and 3 threads, and for a row computed alone.
TEST(GemmTest, BitIdenticalForAnyThreadCountAndRowCount) {
  std::mt19937 rng(5);
  const int64_t m = 200, n = 300, k = 700;
  const Stored a = Random(DType::kF32, size_t(m * k), &rng);
  const Stored w = Random(DType::kF32, size_t(n * k), &rng);
  WeightMatrix wm{w.data(), DType::kF32, n, k, nullptr};
  PackedWeights packed;
  ASSERT_TRUE(PackWeights(&wm, 1, k, {}, &packed).ok());
  std::vector<float> first;
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    ExecutionOptions exec;
    exec.pool = &pool;
    std::vector<float> c(size_t(m * n));
    ASSERT_TRUE(Gemm({a.data(), DType::kF32, m, k}, packed, 0, 1, c.data(), DType::kF32, n, exec).ok());
    if (first.empty()) first = c;
    EXPECT_EQ(c, first) << threads << " threads";
  }
  std::vector<float> row(static_cast<size_t>(n));
  ASSERT_TRUE(Gemm({a.f32.data() + 137 * k, DType::kF32, 1, k}, packed, 0, 1, row.data(),
                   DType::kF32, n, {}).ok());
  EXPECT_EQ(0, std::memcmp(row.data(), first.data() + 137 * n, size_t(n) * 4));
}

TEST(GemmTest, BadArgumentsNameTheArgument) {
  std::vector<float> w(12, 1.0f), a(12, 1.0f), c(16);
  WeightMatrix wm{w.data(), DType::kF32, 4, 2, nullptr};
  PackedWeights packed;
  Status s = PackWeights(&wm, 1, 3, {}, &packed);
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument);
  EXPECT_NE(s.message.find("weights[0].ld"), std::string::npos) << s.message;
  wm.ld = 3;
  ASSERT_TRUE(PackWeights(&wm, 1, 3, {}, &packed).ok());
  s = Gemm({a.data(), DType::kF32, 0, 3}, packed, 0, 1, c.data(), DType::kF32, 4, {});
  EXPECT_NE(s.message.find("a.m"), std::string::npos) << s.message;
  s = Gemm({a.data(), DType::kF32, 2, 3}, packed, 0, 1, c.data(), DType::kF32, 3, {});
  EXPECT_NE(s.message.find("ldc"), std::string::npos) << s.message;
  s = Gemm({a.data(), DType::kF32, 2, 3}, packed, 0, 2, c.data(), DType::kF32, 4, {});
  EXPECT_NE(s.message.find("segments"), std::string::npos) << s.message;
  s = Gemm({a.data(), DType::kBool, 2, 3}, packed, 0, 1, c.data(), DType::kF32, 4, {});
  EXPECT_NE(s.message.find("a.dtype"), std::string::npos) << s.message;
}

}  // namespace
}  // namespace test
}  // namespace simdattn
