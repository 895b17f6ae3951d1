// The fast path's arithmetic on every target: a worked example, softmax
// weights to a few ulps and never subnormal, logits far from zero, rows that
// see no key, and NaN and Inf staying in the rows that see them.

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/attention_harness.h"

namespace simdattn {
namespace test {
namespace {

TEST(NumericsTest, WorkedExample) {
  // Logits 0 and ln 3 give weights 1/4 and 3/4 over values [2, 0] and [0, 4].
  Case c;
  c.q_len = 1;
  c.kv_len = 2;
  c.dk = 1;
  c.dv = 2;
  c.options.scale = 1.0f;
  Inputs in = MakeInputs(c, 1);
  in.q.Set(0, 0, 0, 0, 1.0f);
  in.k.Set(0, 0, 0, 0, 0.0f);
  in.k.Set(0, 0, 1, 0, std::log(3.0f));
  in.v.Set(0, 0, 0, 0, 2.0f);
  in.v.Set(0, 0, 0, 1, 0.0f);
  in.v.Set(0, 0, 1, 0, 0.0f);
  in.v.Set(0, 0, 1, 1, 4.0f);
  ForEachTarget(c, in, [&](const Outputs& out) {
    EXPECT_NEAR(out.o.Get(0, 0, 0, 0), 0.5f, 2e-5 * 4);
    EXPECT_NEAR(out.o.Get(0, 0, 0, 1), 3.0f, 2e-5 * 4);
    EXPECT_NEAR(out.lse[0], std::log(4.0), kLseBound);
  });
  CheckAllTargets(c, in);
}

// Weights below f32's normal range come out as +0.0, never subnormal (x86
// multiplies that make a subnormal take a slow microcode path). With V the
// identity, each output row is the row's weights; the scores put weights
// on both sides of 2^-126 (exp(-87.34)), through the decode path (Lq 1)
// and the tiled one (Lq 32).
TEST(NumericsTest, WeightsBelowTheNormalRangeAreZeroNotSubnormal) {
  const std::vector<float> logits = {0.0f,   -80.0f,  -86.7f, -87.0f, -87.2f,  -87.3f,
                                     -87.35f, -87.4f, -87.5f, -87.6f, -87.7f,  -87.8f,
                                     -88.0f, -88.5f,  -100.0f, -200.0f};
  for (int64_t lq : {1, 32}) {
    const LogitRows rows = MakeLogitRows(lq, logits, 1700);
    const Case& c = rows.c;
    const Inputs& in = rows.in;
    for (const std::string& target : TestTargets()) {
      SCOPED_TRACE(target + " Lq " + std::to_string(lq));
      const Outputs out = RunFast(c, in, target);
      ASSERT_TRUE(out.status.ok()) << out.status.message;
      for (int64_t i = 0; i < lq; ++i) {
        for (int64_t j = 0; j < 16; ++j) {
          const float w = out.o.Get(0, 0, i, j);
          EXPECT_NE(std::fpclassify(w), FP_SUBNORMAL) << "logit " << logits[j] << ": " << w;
          // Above the range: exp(logit) to f32 accuracy (the row sum is 1).
          if (logits[j] >= -87.3f) {
            EXPECT_NEAR(w, std::exp(double(logits[j])), 1e-5 * std::exp(double(logits[j])))
                << "logit " << logits[j];
          }
        }
      }
    }
    CheckAllTargets(c, in);
  }
}

// The softmax's exp is accurate to a few ulps. Key 0 scores 0, the row
// max, so row i's weights are w_j = exp(s_j) / l and w_j / w_0 is exp(s_j)
// up to one rounding of the division; the scores step down to -80 (n from
// 0 to -116 in the exp's range reduction), through the decode path (Lq 1)
// and the tiled one (Lq 32). And exp(0) is exactly 1: a single visible key
// has LSE equal to its score.
TEST(NumericsTest, WeightsAreExpOfTheScoresWithinAFewUlps) {
  constexpr int64_t kKeys = 64;
  std::vector<float> logits(kKeys);
  for (int64_t j = 0; j < kKeys; ++j) logits[j] = -1.27f * static_cast<float>(j);
  for (int64_t lq : {1, 32}) {
    const LogitRows rows = MakeLogitRows(lq, logits, 1800);
    const Case& c = rows.c;
    const Inputs& in = rows.in;
    for (const std::string& target : TestTargets()) {
      SCOPED_TRACE(target + " Lq " + std::to_string(lq));
      const Outputs out = RunFast(c, in, target);
      ASSERT_TRUE(out.status.ok()) << out.status.message;
      for (int64_t i = 0; i < lq; ++i) {
        const double w0 = out.o.Get(0, 0, i, 0);
        for (int64_t j = 1; j < kKeys; ++j) {
          const double want = std::exp(double(logits[j]));
          EXPECT_NEAR(out.o.Get(0, 0, i, j) / w0, want, 6e-7 * want) << "key " << j;
        }
      }
    }
    CheckAllTargets(c, in);

    const LogitRows single = MakeLogitRows(lq, {0.75f}, 1801);
    for (const std::string& target : TestTargets()) {
      SCOPED_TRACE(target + " single key, Lq " + std::to_string(lq));
      const Outputs out = RunFast(single.c, single.in, target);
      ASSERT_TRUE(out.status.ok()) << out.status.message;
      for (int64_t i = 0; i < lq; ++i) EXPECT_EQ(out.lse[i], 0.75f);
    }
  }
}

TEST(NumericsTest, FullyHiddenRowsGiveZerosAndMinusInfLse) {
  // Bottom-right with Lq > Lk: query i sees keys j <= i - (Lq - Lk), so the
  // first Lq - Lk rows see nothing.
  Case c;
  c.q_len = 40;
  c.kv_len = 10;
  c.dk = 8;
  c.dv = 8;
  c.options.causal = true;
  c.options.alignment = Alignment::kBottomRight;
  const Inputs in = MakeInputs(c, 800);
  ForEachTarget(c, in, [&](const Outputs& out) {
    for (int64_t i = 0; i < 30; ++i) {
      for (int64_t d = 0; d < 8; ++d) EXPECT_EQ(out.o.Get(0, 0, i, d), 0.0f);
      EXPECT_EQ(out.lse[i], -std::numeric_limits<float>::infinity());
    }
    for (int64_t i = 30; i < 40; ++i) EXPECT_TRUE(std::isfinite(out.lse[i]));
  });
  CheckAllTargets(c, in);
}

TEST(NumericsTest, LargeLogitsNeedMaxSubtraction) {
  // Small integers make every product and sum exact in f32, so the logits
  // (up to about +-100) carry no rounding error and the bound stays strict;
  // exp(100) would overflow f32 without the max subtraction.
  Case c;
  c.q_heads = 2;
  c.q_len = 37;
  c.kv_len = 80;
  c.dk = 4;
  c.dv = 16;
  c.options.scale = 1.0f;
  Inputs in = MakeInputs(c, 900);
  std::mt19937 rng(901);
  std::uniform_int_distribution<int> small(-5, 5);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 37; ++i)
      for (int64_t d = 0; d < 4; ++d) in.q.Set(0, h, i, d, float(small(rng)));
  for (int64_t j = 0; j < 80; ++j)
    for (int64_t d = 0; d < 4; ++d) in.k.Set(0, 0, j, d, float(small(rng)));
  for (int sign : {1, -1}) {
    // Put the whole row far from zero: +-100 on every logit plus the spread.
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 37; ++i) in.q.Set(0, h, i, 3, 20.0f * sign);
    for (int64_t j = 0; j < 80; ++j) in.k.Set(0, 0, j, 3, 5.0f);
    CheckAllTargets(c, in);
  }
}

TEST(NumericsTest, NanInKeyRowPropagatesOnlyToRowsThatSeeIt) {
  Case c;
  c.q_len = 20;
  c.kv_len = 20;
  c.dk = 8;
  c.dv = 8;
  c.options.causal = true;  // rows i < 12 never see key 12
  Inputs in = MakeInputs(c, 1000);
  in.k.Set(0, 0, 12, 3, std::numeric_limits<float>::quiet_NaN());
  ForEachTarget(c, in, [&](const Outputs& out) {
    for (int64_t i = 0; i < 20; ++i) {
      for (int64_t d = 0; d < 8; ++d) {
        if (i < 12) {
          EXPECT_TRUE(std::isfinite(out.o.Get(0, 0, i, d))) << i;
        } else {
          EXPECT_TRUE(std::isnan(out.o.Get(0, 0, i, d))) << i;
        }
      }
    }
  });
}

TEST(NumericsTest, InfInValueRowStaysInItsRows) {
  Case c;
  c.q_len = 8;
  c.kv_len = 8;
  c.dk = 4;
  c.dv = 4;
  c.options.causal = true;
  Inputs in = MakeInputs(c, 1100);
  in.v.Set(0, 0, 5, 2, std::numeric_limits<float>::infinity());
  ForEachTarget(c, in, [&](const Outputs& out) {
    for (int64_t i = 0; i < 8; ++i) {
      const float x = out.o.Get(0, 0, i, 2);
      if (i < 5) {
        EXPECT_TRUE(std::isfinite(x)) << i;
      } else {
        EXPECT_TRUE(std::isinf(x)) << i;
      }
      EXPECT_TRUE(std::isfinite(out.o.Get(0, 0, i, 1))) << i;
    }
  });
}

}  // namespace
}  // namespace test
}  // namespace simdattn
