// The reference's score terms and weight options by hand: softcap, ALiBi,
// attention sinks and dropout.

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "gtest/gtest.h"
#include "lib/reference.h"
#include "tests/reference_util.h"

namespace simdattn {
namespace test {
namespace {

// q = 1, k = [0, 10], scale 1, softcap 5: s = [0, 5 tanh(2)].
TEST(ReferenceTest, Softcap) {
  const std::vector<float> q = {1.0f};
  const std::vector<float> k = {0.0f, 10.0f};
  const std::vector<float> v = IdentityV(1, 1, 2);
  AttentionOptions opt;
  opt.scale = 1.0f;
  opt.softcap = 5.0f;
  const Result r = RunReference(Dense(q, 1, 1, 1, 1), Dense(k, 1, 1, 2, 1),
                       Dense(v, 1, 1, 2, 2), opt);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  const double s1 = 5.0 * std::tanh(2.0);
  EXPECT_NEAR(r.o[0], 1.0 / (1.0 + std::exp(s1)), kTol);
  EXPECT_NEAR(r.o[1], std::exp(s1) / (1.0 + std::exp(s1)), kTol);
  EXPECT_NEAR(r.lse[0], std::log(1.0 + std::exp(s1)), kTol);
  // A huge logit is capped below softcap: LSE stays below 5 + log(2).
  EXPECT_LT(r.lse[0], 5.0 + std::log(2.0));
}

// ALiBi with zero keys: s_j = -slope[h] * |p(i) - j|.
TEST(ReferenceTest, AlibiTopLeftAndBottomRight) {
  const int64_t h = 2, lq = 2, lk = 4;
  VisibilityCase c(1, h, lq, lk);
  const float slopes[2] = {0.5f, 1.0f};
  AttentionOptions opt;
  opt.alibi_slopes = slopes;
  for (Alignment align : {Alignment::kTopLeft, Alignment::kBottomRight}) {
    opt.alignment = align;
    const Result r = c.Run(opt);
    ASSERT_TRUE(r.status.ok()) << r.status.message;
    for (int64_t hh = 0; hh < h; ++hh) {
      for (int64_t i = 0; i < lq; ++i) {
        const int64_t p = align == Alignment::kTopLeft ? i : i + lk - lq;
        auto score = [&](int64_t j) {
          return -static_cast<double>(slopes[hh]) *
                 static_cast<double>(std::abs(p - j));
        };
        double z = 0;
        for (int64_t j = 0; j < lk; ++j) z += std::exp(score(j));
        const int64_t row = hh * lq + i;
        for (int64_t j = 0; j < lk; ++j) {
          EXPECT_NEAR(r.o[row * lk + j], std::exp(score(j)) / z, kTol)
              << "h=" << hh << " i=" << i << " j=" << j;
        }
        EXPECT_NEAR(r.lse[row], std::log(z), kTol);
      }
    }
  }
}

// A concrete ALiBi row by hand: slope 1, p = 1, keys 0..2 with causal:
// scores [-1, 0] -> weights 1/(1+e), e/(1+e).
TEST(ReferenceTest, AlibiWithCausalByHand) {
  VisibilityCase c(1, 1, 3, 3);
  const float slope = 1.0f;
  AttentionOptions opt;
  opt.alibi_slopes = &slope;
  opt.causal = true;
  const Result r = c.Run(opt);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  const double e = std::exp(1.0);
  EXPECT_NEAR(r.o[3 + 0], 1.0 / (1.0 + e), kTol);
  EXPECT_NEAR(r.o[3 + 1], e / (1.0 + e), kTol);
  EXPECT_EQ(r.o[3 + 2], 0.0);
}

// Sinks only enlarge the denominator: with zero keys (scores 0) over three
// keys and sink t, weights are 1 / (3 + e^t) and LSE = log(3 + e^t).
TEST(ReferenceTest, SinksDenominatorOnly) {
  const int64_t h = 2, lk = 3;
  VisibilityCase c(1, h, 1, lk);
  const float sinks[2] = {std::log(3.0f), -1.0f};
  AttentionOptions opt;
  opt.sinks = sinks;
  const Result r = c.Run(opt);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  for (int64_t hh = 0; hh < h; ++hh) {
    const double z = 3.0 + std::exp(static_cast<double>(sinks[hh]));
    for (int64_t j = 0; j < lk; ++j) EXPECT_NEAR(r.o[hh * lk + j], 1.0 / z, kTol);
    EXPECT_NEAR(r.lse[hh], std::log(z), kTol);
  }
  // Head 0: sink ~ln 3 -> weights ~1/6, row sum ~1/2.
  EXPECT_NEAR(r.o[0] + r.o[1] + r.o[2], 0.5, 1e-6);
}

// A sink larger than every score sets M; LSE is still log(sum e^s + e^sink).
TEST(ReferenceTest, SinkDominatesMax) {
  VisibilityCase c(1, 1, 1, 2);
  const float sink = 50.0f;
  AttentionOptions opt;
  opt.sinks = &sink;
  const Result r = c.Run(opt);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  const double z = 2.0 + std::exp(50.0);
  EXPECT_NEAR(r.o[0], 1.0 / z, 1e-30);
  EXPECT_NEAR(r.lse[0], std::log(z), kTol);
}

// A row with no visible key but a sink: zeros, and LSE = sink (Z = e^0 = 1
// relative to M = sink).
TEST(ReferenceTest, SinkOnEmptyRow) {
  VisibilityCase c(1, 1, 3, 2);
  const float sink = 0.75f;
  AttentionOptions opt;
  opt.sinks = &sink;
  opt.causal = true;
  opt.alignment = Alignment::kBottomRight;  // p(0) = -1: row 0 sees nothing
  const Result r = c.Run(opt);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  EXPECT_EQ(r.o[0], 0.0);
  EXPECT_EQ(r.o[1], 0.0);
  EXPECT_NEAR(r.lse[0], 0.75, kTol);
  // Row 1 (p = 0) sees key 0: weight 1 / (1 + e^0.75).
  EXPECT_NEAR(r.o[2], 1.0 / (1.0 + std::exp(0.75)), kTol);
  EXPECT_EQ(r.o[3], 0.0);
}

// ---------------------------------------------------------------- Dropout

TEST(ReferenceTest, DropoutZeroEqualsNoDropout) {
  const std::vector<float> q = {0.3f, -1.0f, 2.0f, 0.5f};
  const std::vector<float> k = {1.0f, 0.0f, -0.5f, 2.0f, 0.25f, 0.75f};
  const std::vector<float> v = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  AttentionOptions plain;
  AttentionOptions dropout;
  dropout.dropout_p = 0.0f;
  dropout.dropout_seed = 12345;
  const Result a = RunReference(Dense(q, 1, 1, 2, 2), Dense(k, 1, 1, 3, 2),
                       Dense(v, 1, 1, 3, 2), plain);
  const Result b = RunReference(Dense(q, 1, 1, 2, 2), Dense(k, 1, 1, 3, 2),
                       Dense(v, 1, 1, 3, 2), dropout);
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  EXPECT_EQ(a.o, b.o);
  EXPECT_EQ(a.lse, b.lse);
}

// V = identity and zero keys: each row's weights are 1/Lk, so after dropout
// O[i][j] is 1/(Lk (1-p)) where kept and 0 where dropped. LSE is unchanged.
TEST(ReferenceTest, DropoutScalesKeptWeights) {
  const int64_t b = 2, h = 2, lq = 64, lk = 64;
  VisibilityCase c(b, h, lq, lk);
  const float p = 0.3f;
  AttentionOptions opt;
  opt.dropout_p = p;
  opt.dropout_seed = 0xfeedbeefcafe1234ull;
  const Result r = c.Run(opt);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  const double kept_value = 1.0 / (lk * (1.0 - static_cast<double>(p)));
  int64_t kept = 0, total = 0;
  for (int64_t bb = 0; bb < b; ++bb) {
    for (int64_t hh = 0; hh < h; ++hh) {
      for (int64_t i = 0; i < lq; ++i) {
        const int64_t row = (bb * h + hh) * lq + i;
        EXPECT_NEAR(r.lse[row], std::log(static_cast<double>(lk)), kTol);
        for (int64_t j = 0; j < lk; ++j) {
          const double x = r.o[row * lk + j];
          const bool keep = DropoutKeep(opt.dropout_seed, p, bb, hh, i, j);
          EXPECT_NEAR(x, keep ? kept_value : 0.0, kTol);
          kept += x != 0.0 ? 1 : 0;
          ++total;
        }
      }
    }
  }
  // Binomial(n, 1-p): the kept fraction lies within 6 standard deviations.
  const double n = static_cast<double>(total);
  const double mean = n * (1.0 - p);
  const double sd = std::sqrt(n * p * (1.0 - p));
  EXPECT_LT(std::fabs(static_cast<double>(kept) - mean), 6.0 * sd)
      << "kept " << kept << " of " << total;
}

TEST(ReferenceTest, DropoutSeedDeterministicAndSensitive) {
  const int64_t lq = 16, lk = 32;
  VisibilityCase c(1, 2, lq, lk);
  AttentionOptions opt;
  opt.dropout_p = 0.5f;
  opt.dropout_seed = 7;
  const Result a = c.Run(opt);
  const Result a2 = c.Run(opt);
  opt.dropout_seed = 8;
  const Result b = c.Run(opt);
  opt.dropout_seed = 7ull | (1ull << 32);  // differs only in the high key word
  const Result d = c.Run(opt);
  ASSERT_TRUE(a.status.ok() && a2.status.ok() && b.status.ok() && d.status.ok());
  EXPECT_EQ(a.o, a2.o);
  int64_t diff_b = 0, diff_d = 0;
  for (size_t x = 0; x < a.o.size(); ++x) {
    diff_b += (a.o[x] == 0.0) != (b.o[x] == 0.0) ? 1 : 0;
    diff_d += (a.o[x] == 0.0) != (d.o[x] == 0.0) ? 1 : 0;
  }
  // Independent masks at p = 0.5 disagree on about half of 1024 cells.
  EXPECT_GT(diff_b, 300);
  EXPECT_GT(diff_d, 300);
}

}  // namespace
}  // namespace test
}  // namespace simdattn
