// The double-precision reference (lib/reference.h) against answers worked
// out by hand or in closed form: the softmax and its LSE, large logits, GQA
// head mapping, exact reading of 16-bit inputs, strided views, non-finite
// values and validation errors. Masks, windows and score terms are in
// reference_masks_test.cc and reference_scores_test.cc.

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "lib/dtype.h"
#include "lib/reference.h"
#include "tests/reference_util.h"

namespace simdattn {
namespace test {
namespace {

TEST(ReferenceTest, WorkedExample) {
  const std::vector<float> q = {1.0f};
  const std::vector<float> k = {0.0f, std::log(3.0f)};
  const std::vector<float> v = {2.0f, 0.0f, 0.0f, 4.0f};
  AttentionOptions opt;
  opt.scale = 1.0f;
  const Result r = RunReference(Dense(q, 1, 1, 1, 1), Dense(k, 1, 1, 2, 1),
                       Dense(v, 1, 1, 2, 2), opt);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  const double e = std::exp(static_cast<double>(k[1]));  // ~3
  const double w0 = 1.0 / (1.0 + e), w1 = e / (1.0 + e);
  ASSERT_EQ(r.o.size(), 2u);
  ASSERT_EQ(r.lse.size(), 1u);
  EXPECT_NEAR(r.o[0], 2.0 * w0, kTol);
  EXPECT_NEAR(r.o[1], 4.0 * w1, kTol);
  EXPECT_NEAR(r.o[0], 0.5, 1e-6);
  EXPECT_NEAR(r.o[1], 3.0, 1e-6);
  EXPECT_NEAR(r.lse[0], std::log(1.0 + e), kTol);
}

// Identical keys: every weight is 1/Lk, so O is the mean of V's rows, and
// LSE = s + log(Lk) with s the common score. Dk = 4 makes the default scale
// exactly 0.5.
TEST(ReferenceTest, UniformAttentionIsMeanOfV) {
  const int64_t lq = 2, lk = 5, dk = 4, dv = 3;
  const std::vector<float> q = {1, 2, 3, 4, -1, 0.5f, 0, 2};
  const std::vector<float> key_row = {0.25f, -0.5f, 1.0f, 2.0f};
  std::vector<float> k;
  for (int64_t j = 0; j < lk; ++j) k.insert(k.end(), key_row.begin(), key_row.end());
  std::vector<float> v;
  for (int64_t j = 0; j < lk; ++j) {
    v.push_back(static_cast<float>(j));
    v.push_back(static_cast<float>(j * j));
    v.push_back(-1.0f);
  }
  const Result r = RunReference(Dense(q, 1, 1, lq, dk), Dense(k, 1, 1, lk, dk),
                       Dense(v, 1, 1, lk, dv), AttentionOptions());
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  // Means of 0..4, of 0,1,4,9,16 and of -1.
  const double want[3] = {2.0, 6.0, -1.0};
  for (int64_t i = 0; i < lq; ++i) {
    for (int64_t d = 0; d < dv; ++d) EXPECT_NEAR(r.o[i * dv + d], want[d], kTol);
    double dot = 0;
    for (int64_t d = 0; d < dk; ++d) {
      dot += static_cast<double>(q[i * dk + d]) * key_row[d];
    }
    EXPECT_NEAR(r.lse[i], 0.5 * dot + std::log(5.0), kTol);
  }
}

// Explicit logits: q = 1, k = a, b, c, scale 1 gives LSE = log(e^a+e^b+e^c).
TEST(ReferenceTest, LseIsNaturalLogSumExp) {
  const std::vector<float> q = {1.0f};
  const std::vector<float> k = {0.5f, -1.25f, 2.0f};
  const std::vector<float> v = {1.0f, 1.0f, 1.0f};
  AttentionOptions opt;
  opt.scale = 1.0f;
  const Result r = RunReference(Dense(q, 1, 1, 1, 1), Dense(k, 1, 1, 3, 1),
                       Dense(v, 1, 1, 3, 1), opt);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  EXPECT_NEAR(r.lse[0], std::log(std::exp(0.5) + std::exp(-1.25) + std::exp(2.0)),
              kTol);
  EXPECT_NEAR(r.o[0], 1.0, kTol);  // weights sum to 1
}

TEST(ReferenceTest, LseMayBeNull) {
  const std::vector<float> q = {1.0f}, k = {1.0f}, v = {3.0f};
  std::vector<double> o;
  const Status s = ReferenceAttention(Dense(q, 1, 1, 1, 1), Dense(k, 1, 1, 1, 1),
                                      Dense(v, 1, 1, 1, 1), AttentionOptions(),
                                      &o, nullptr);
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(o.size(), 1u);
  EXPECT_NEAR(o[0], 3.0, kTol);
}

// scale = 0 makes every score 0: uniform weights whatever Q and K are.
TEST(ReferenceTest, ZeroScaleIsUniform) {
  const std::vector<float> q = {5.0f, -3.0f};
  const std::vector<float> k = {1.0f, 2.0f, -7.0f, 0.5f};
  const std::vector<float> v = {1.0f, 2.0f};
  AttentionOptions opt;
  opt.scale = 0.0f;
  const Result r = RunReference(Dense(q, 1, 1, 1, 2), Dense(k, 1, 1, 2, 2),
                       Dense(v, 1, 1, 2, 1), opt);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  EXPECT_NEAR(r.o[0], 1.5, kTol);
  EXPECT_NEAR(r.lse[0], std::log(2.0), kTol);
}

// Logits of +-1000 overflow exp() even in double unless the max is subtracted.
TEST(ReferenceTest, LargeLogitsDoNotOverflow) {
  const std::vector<float> q = {100.0f};
  const std::vector<float> k = {10.0f, 9.99f, -10.0f};
  const std::vector<float> v = {1.0f, 0.0f, 0.0f, 0.0f, 1.0f, 0.0f,
                                0.0f, 0.0f, 1.0f};
  AttentionOptions opt;
  opt.scale = 1.0f;
  const Result r = RunReference(Dense(q, 1, 1, 1, 1), Dense(k, 1, 1, 3, 1),
                       Dense(v, 1, 1, 3, 3), opt);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  const double s1 = 100.0 * static_cast<double>(k[1]);  // ~999
  const double d1 = std::exp(s1 - 1000.0), d2 = std::exp(-2000.0);
  const double z = 1.0 + d1 + d2;
  EXPECT_NEAR(r.o[0], 1.0 / z, kTol);
  EXPECT_NEAR(r.o[1], d1 / z, kTol);
  EXPECT_NEAR(r.o[2], 0.0, kTol);
  EXPECT_NEAR(r.lse[0], 1000.0 + std::log(z), 1e-9);
  for (double x : r.o) EXPECT_TRUE(std::isfinite(x));
}

// Logits ~ +-100 (the scale of real models' outliers).
TEST(ReferenceTest, LogitsAroundHundredAreFinite) {
  const std::vector<float> q = {10.0f, -10.0f};
  const std::vector<float> k = {10.0f, 10.0f};  // Lk = 2, Dk = 1
  const std::vector<float> v = {1.0f, 0.0f, 0.0f, 1.0f};
  AttentionOptions opt;
  opt.scale = 1.0f;
  const Result r = RunReference(Dense(q, 1, 1, 2, 1), Dense(k, 1, 1, 2, 1),
                       Dense(v, 1, 1, 2, 2), opt);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  // Both rows see two equal scores (+100 resp. -100): 1/2 each.
  for (double x : r.o) EXPECT_NEAR(x, 0.5, kTol);
  EXPECT_NEAR(r.lse[0], 100.0 + std::log(2.0), 1e-12);
  EXPECT_NEAR(r.lse[1], -100.0 + std::log(2.0), 1e-12);
}

// ---------------------------------------------------------------- Heads, dtypes

// Hq = 4, Hkv = 2: query heads 0, 1 read KV head 0 (V = 1), heads 2, 3 read
// KV head 1 (V = 2). MQA (Hkv = 1) maps every head to KV head 0.
TEST(ReferenceTest, GqaHeadMapping) {
  const int64_t hq = 4, lk = 3;
  const std::vector<float> q(hq * 2, 1.0f);
  const std::vector<float> k(2 * lk * 2, 0.0f);
  std::vector<float> v(2 * lk * 1);
  for (int64_t j = 0; j < lk; ++j) {
    v[j] = 1.0f;
    v[lk + j] = 2.0f;
  }
  const Result r = RunReference(Dense(q, 1, hq, 1, 2), Dense(k, 1, 2, lk, 2),
                       Dense(v, 1, 2, lk, 1), AttentionOptions());
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  EXPECT_NEAR(r.o[0], 1.0, kTol);
  EXPECT_NEAR(r.o[1], 1.0, kTol);
  EXPECT_NEAR(r.o[2], 2.0, kTol);
  EXPECT_NEAR(r.o[3], 2.0, kTol);

  const std::vector<float> v1 = {5.0f, 5.0f, 5.0f};
  const Result m = RunReference(Dense(q, 1, hq, 1, 2), Dense(k, 1, 1, lk, 2),
                       Dense(v1, 1, 1, lk, 1), AttentionOptions());
  ASSERT_TRUE(m.status.ok()) << m.status.message;
  for (double x : m.o) EXPECT_NEAR(x, 5.0, kTol);
}

// With Lk = 1 the single weight is exactly 1, so O equals V bit for bit and
// LSE equals the single score: f16 and bf16 values must be widened exactly.
TEST(ReferenceTest, F16InputsReadExactly) {
  // 1 + 2^-10, the largest f16, the smallest subnormal, and -0.333 rounded.
  const float values[4] = {1.0f + 1.0f / 1024, 65504.0f, 5.9604644775390625e-8f,
                           F16ToF32(F32ToF16(-0.333f))};
  std::vector<uint16_t> v(4), k(4), q(4);
  for (int d = 0; d < 4; ++d) v[d] = F32ToF16(values[d]);
  // q . k = 0.5 * (1 + 2^-10) + 0.25 * 3 = exact in double.
  const float qs[4] = {0.5f, 0.25f, 0.0f, 0.0f};
  const float ks[4] = {1.0f + 1.0f / 1024, 3.0f, 7.0f, -9.0f};
  for (int d = 0; d < 4; ++d) {
    q[d] = F32ToF16(qs[d]);
    k[d] = F32ToF16(ks[d]);
  }
  AttentionOptions opt;
  opt.scale = 1.0f;
  const Result r = RunReference(Dense16(q, DType::kF16, 1, 1, 1, 4),
                       Dense16(k, DType::kF16, 1, 1, 1, 4),
                       Dense16(v, DType::kF16, 1, 1, 1, 4), opt);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  for (int d = 0; d < 4; ++d) EXPECT_EQ(r.o[d], static_cast<double>(values[d])) << d;
  EXPECT_EQ(r.lse[0], 0.5 * (1.0 + 1.0 / 1024) + 0.75);
}

TEST(ReferenceTest, Bf16InputsReadExactly) {
  // 1 + 2^-7, a large bf16 (~3.39e38), the smallest bf16 subnormal, and
  // -5 * 2^-133.
  const float values[4] = {1.0f + 1.0f / 128, BF16ToF32(0x7F7F),
                           BF16ToF32(0x0001), BF16ToF32(0x8005)};
  std::vector<uint16_t> v(4), k(4);
  for (int d = 0; d < 4; ++d) v[d] = F32ToBF16(values[d]);
  // f32 queries with a bf16 KV cache (the common mixed case).
  const std::vector<float> q = {0.1f, 1.0f, 0.0f, 0.0f};
  const float ks[4] = {1.0f + 1.0f / 128, -2.5f, 1.0f, 1.0f};
  for (int d = 0; d < 4; ++d) k[d] = F32ToBF16(ks[d]);
  AttentionOptions opt;
  opt.scale = 1.0f;
  const Result r = RunReference(Dense(q, 1, 1, 1, 4), Dense16(k, DType::kBF16, 1, 1, 1, 4),
                       Dense16(v, DType::kBF16, 1, 1, 1, 4), opt);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  for (int d = 0; d < 4; ++d) EXPECT_EQ(r.o[d], static_cast<double>(values[d])) << d;
  // The f32 query is not rounded to bf16: 0.1f stays 0.1f.
  EXPECT_EQ(r.lse[0], static_cast<double>(0.1f) * (1.0 + 1.0 / 128) - 2.5);
}

// ---------------------------------------------------------------- Strides

// Negative and zero strides are plain views: reversing K and V's key order in
// memory (negative Lk stride) and sharing one Q row across Lq (stride 0)
// must give the same numbers as the dense layout.
TEST(ReferenceTest, NegativeAndZeroStrides) {
  const int64_t lq = 3, lk = 4, dk = 2, dv = 2;
  const std::vector<float> q_row = {0.5f, -1.0f};
  std::vector<float> q_dense;
  for (int64_t i = 0; i < lq; ++i) q_dense.insert(q_dense.end(), q_row.begin(), q_row.end());
  const std::vector<float> k = {1, 2, -1, 0.5f, 0, 3, 2, -2};
  const std::vector<float> v = {1, 0, 0, 1, 2, 2, -3, 4};
  std::vector<float> k_rev, v_rev;  // key rows stored last to first
  for (int64_t j = lk - 1; j >= 0; --j) {
    k_rev.insert(k_rev.end(), k.begin() + j * dk, k.begin() + (j + 1) * dk);
    v_rev.insert(v_rev.end(), v.begin() + j * dv, v.begin() + (j + 1) * dv);
  }
  AttentionOptions opt;
  const Result dense = RunReference(Dense(q_dense, 1, 1, lq, dk), Dense(k, 1, 1, lk, dk),
                           Dense(v, 1, 1, lk, dv), opt);
  TensorView qv = Dense(q_row, 1, 1, lq, dk);
  qv.strides[2] = 0;
  TensorView kv = Dense(k_rev, 1, 1, lk, dk);
  kv.data = k_rev.data() + (lk - 1) * dk;
  kv.strides[2] = -dk;
  TensorView vv = Dense(v_rev, 1, 1, lk, dv);
  vv.data = v_rev.data() + (lk - 1) * dv;
  vv.strides[2] = -dv;
  const Result strided = RunReference(qv, kv, vv, opt);
  ASSERT_TRUE(dense.status.ok()) << dense.status.message;
  ASSERT_TRUE(strided.status.ok()) << strided.status.message;
  EXPECT_EQ(dense.o, strided.o);
  EXPECT_EQ(dense.lse, strided.lse);
  // Causal on top: row 0 sees only key 0, so O[0] = V[0] = [1, 0].
  opt.causal = true;
  opt.alignment = Alignment::kTopLeft;
  const Result causal = RunReference(qv, kv, vv, opt);
  ASSERT_TRUE(causal.status.ok()) << causal.status.message;
  EXPECT_NEAR(causal.o[0], 1.0, kTol);
  EXPECT_NEAR(causal.o[1], 0.0, kTol);
}

// ---------------------------------------------------------------- Non-finite

// NaN in key row 1 under causal masking: row 0 does not see it and stays
// exact; rows 1 and 2 see it and become NaN. With kv_lengths hiding key 1,
// nothing is NaN.
TEST(ReferenceTest, NanInKeyPropagatesOnlyToRowsThatSeeIt) {
  VisibilityCase c(1, 1, 3, 3);
  c.k[1 * c.dk + 2] = std::numeric_limits<float>::quiet_NaN();
  AttentionOptions opt;
  opt.causal = true;
  const Result r = c.Run(opt);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  EXPECT_NEAR(r.o[0], 1.0, kTol);
  EXPECT_EQ(r.o[1], 0.0);
  EXPECT_EQ(r.o[2], 0.0);
  EXPECT_NEAR(r.lse[0], 0.0, kTol);
  for (int i = 1; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) EXPECT_TRUE(std::isnan(r.o[i * 3 + j])) << i << j;
    EXPECT_TRUE(std::isnan(r.lse[i])) << i;
  }
  const int64_t len = 1;
  AttentionOptions hidden;
  hidden.kv_lengths = &len;
  const Result h = c.Run(hidden);
  ASSERT_TRUE(h.status.ok()) << h.status.message;
  for (double x : h.o) EXPECT_FALSE(std::isnan(x));
  for (double x : h.lse) EXPECT_FALSE(std::isnan(x));
}

// A row whose only visible key is NaN outputs NaN, not the zeros of an empty
// row.
TEST(ReferenceTest, NanInOnlyVisibleKeyIsNotAnEmptyRow) {
  VisibilityCase c(1, 1, 2, 2);
  c.k[0] = std::numeric_limits<float>::quiet_NaN();
  AttentionOptions opt;
  opt.causal = true;
  const Result r = c.Run(opt);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  for (double x : r.o) EXPECT_TRUE(std::isnan(x));
  EXPECT_TRUE(std::isnan(r.lse[0]));
  EXPECT_TRUE(std::isnan(r.lse[1]));
}

// A key whose score is -inf (K holds -inf) is still visible: its weight is 0,
// but an Inf in its V row reaches the rows that see it (0 * Inf is NaN), as
// in a kernel computing P.V over the whole tile. Row 0 does not see it.
TEST(ReferenceTest, MinusInfScoreKeyStillUsesItsValue) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> q = {1.0f, 1.0f};
  const std::vector<float> k = {0.0f, -inf};
  const std::vector<float> v = {2.0f, inf};
  AttentionOptions opt;
  opt.causal = true;
  const Result r = RunReference(Dense(q, 1, 1, 2, 1), Dense(k, 1, 1, 2, 1),
                                Dense(v, 1, 1, 2, 1), opt);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  EXPECT_NEAR(r.o[0], 2.0, kTol);
  EXPECT_NEAR(r.lse[0], 0.0, kTol);
  EXPECT_FALSE(std::isfinite(r.o[1]));
  EXPECT_NEAR(r.lse[1], 0.0, kTol);  // e^0 + e^-inf = 1
}

// An additive -inf hides the key outright: even a +inf score (Inf in K)
// behind it does not turn the row into NaN (inf + -inf).
TEST(ReferenceTest, AdditiveMinusInfHidesInfScore) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> q = {1.0f};
  const std::vector<float> k = {0.0f, inf};
  const std::vector<float> v = {3.0f, 5.0f};
  const std::vector<float> mask = {0.0f, -inf};
  AttentionOptions opt;
  opt.mask = Dense(mask, 1, 1, 1, 2);
  const Result r = RunReference(Dense(q, 1, 1, 1, 1), Dense(k, 1, 1, 2, 1),
                                Dense(v, 1, 1, 2, 1), opt);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  EXPECT_NEAR(r.o[0], 3.0, kTol);
  EXPECT_NEAR(r.lse[0], 0.0, kTol);
}

// An f16 Inf in V reaches the output as Inf/NaN only in the rows that see it.
TEST(ReferenceTest, F16InfInValueIsInfNot65536) {
  std::vector<uint16_t> q(2, F32ToF16(1.0f)), k(4, F32ToF16(0.0f));
  std::vector<uint16_t> v = {F32ToF16(1.0f), 0x7C00};  // key 1 holds +Inf
  AttentionOptions opt;
  opt.causal = true;
  const Result r = RunReference(Dense16(q, DType::kF16, 1, 1, 2, 1),
                       Dense16(k, DType::kF16, 1, 1, 2, 1),
                       Dense16(v, DType::kF16, 1, 1, 2, 1), opt);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  EXPECT_EQ(r.o[0], 1.0);
  EXPECT_EQ(r.o[1], kInf);
}

// ---------------------------------------------------------------- Errors

TEST(ReferenceTest, ValidationErrorsAreReturnedAndNothingWritten) {
  const std::vector<float> q(3 * 2, 1.0f), k(2 * 2, 1.0f), v(2 * 2, 1.0f);
  std::vector<double> o = {42.0}, lse = {43.0};
  // Hq = 3 is not a multiple of Hkv = 2.
  Status s = ReferenceAttention(Dense(q, 1, 3, 1, 2), Dense(k, 1, 2, 1, 2),
                                Dense(v, 1, 2, 1, 2), AttentionOptions(), &o, &lse);
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument);
  EXPECT_FALSE(s.message.empty());
  EXPECT_EQ(o, std::vector<double>{42.0});
  EXPECT_EQ(lse, std::vector<double>{43.0});

  AttentionOptions bad_p;
  bad_p.dropout_p = 1.0f;
  s = ReferenceAttention(Dense(q, 1, 2, 1, 2), Dense(k, 1, 2, 1, 2),
                         Dense(v, 1, 2, 1, 2), bad_p, &o, &lse);
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument);

  AttentionOptions bad_scale;
  bad_scale.scale = -1.0f;
  s = ReferenceAttention(Dense(q, 1, 2, 1, 2), Dense(k, 1, 2, 1, 2),
                         Dense(v, 1, 2, 1, 2), bad_scale, &o, &lse);
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument);
  EXPECT_EQ(o, std::vector<double>{42.0});
}

}  // namespace
}  // namespace test
}  // namespace simdattn
