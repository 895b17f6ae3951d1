// Every SEMANTICS.md option inside the fused kernel, alone and combined, on
// every target: kv_lengths, softcap, sliding windows, ALiBi, sinks, explicit
// masks and dropout.

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

TEST(VariantTest, KvLengthsPerBatch) {
  int n = 0;
  for (bool causal : {false, true}) {
    for (Alignment al : {Alignment::kTopLeft, Alignment::kBottomRight}) {
      Case c;
      c.batch = 4;
      c.q_heads = 2;
      c.q_len = 37;
      c.kv_len = 70;
      c.dk = 24;
      c.dv = 24;
      c.options.causal = causal;
      c.options.alignment = al;
      int64_t lens[4] = {70, 1, 0, 45};  // 0: every row of batch 2 is empty
      c.options.kv_lengths = lens;
      CheckCase(c, 2000 + n++);
    }
  }
}

// Softcap's two forms of tanh meet at |s / cap| = 0.625: caps from 0.05
// (nearly every score far past it, many saturated) to 1000 (all inside),
// logits up to about +-40, prefill and decode.
TEST(VariantTest, SoftcapAcrossItsRange) {
  int n = 0;
  for (float cap : {0.05f, 0.5f, 4.0f, 30.0f, 1000.0f}) {
    for (int64_t q_len : {int64_t{1}, int64_t{45}}) {
      Case c;
      c.q_heads = 4;
      c.kv_heads = 2;
      c.q_len = q_len;
      c.kv_len = 77;
      c.dk = 32;
      c.dv = 16;
      c.options.softcap = cap;
      c.options.scale = 1.0f;
      CheckCase(c, 2050 + n++, -1.1f, 1.1f);
    }
  }
}

TEST(VariantTest, SlidingWindows) {
  struct W {
    int64_t left, right;
    bool causal;
  };
  const W windows[] = {{3, 0, false}, {3, 0, true}, {5, 2, false},
                       {0, -1, false}, {-1, 4, false}, {40, 40, false},
                       {10, 5, true}, {0, 0, false}};
  int n = 0;
  for (const W& w : windows) {
    for (Alignment al : {Alignment::kTopLeft, Alignment::kBottomRight}) {
      for (const int64_t* lens : {(const int64_t*)nullptr}) {
        Case c;
        c.q_heads = 2;
        c.q_len = 50;
        c.kv_len = 150;
        c.dk = 16;
        c.dv = 8;
        c.options.window_left = w.left;
        c.options.window_right = w.right;
        c.options.causal = w.causal;
        c.options.alignment = al;
        c.options.kv_lengths = lens;
        CheckCase(c, 2100 + n++);
      }
    }
  }
}

TEST(VariantTest, SoftcapAlibiSinks) {
  float slopes[4] = {0.5f, 0.125f, 0.03125f, 0.0f};
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float sinks[4] = {0.0f, 3.0f, -2.0f, neg_inf};
  int n = 0;
  for (int which = 0; which < 3; ++which) {
    for (bool causal : {false, true}) {
      Case c;
      c.q_heads = 4;
      c.kv_heads = 2;
      c.q_len = 33;
      c.kv_len = 90;
      c.dk = 32;
      c.dv = 16;
      c.options.causal = causal;
      c.options.alignment = Alignment::kBottomRight;
      if (which == 0) {
        c.options.softcap = 2.0f;
        c.options.scale = 1.5f;  // logits beyond the cap
      }
      if (which == 1) c.options.alibi_slopes = slopes;
      if (which == 2) c.options.sinks = sinks;
      CheckCase(c, 2200 + n++, -2.0f, 2.0f);
    }
  }
}

TEST(VariantTest, SinkOnRowsWithoutKeys) {
  // Bottom-right, Lq > Lk: the first rows see no key; with a sink they give
  // zeros and LSE = sink.
  float sinks[1] = {1.5f};
  Case c;
  c.q_len = 20;
  c.kv_len = 5;
  c.options.causal = true;
  c.options.alignment = Alignment::kBottomRight;
  c.options.sinks = sinks;
  const Inputs in = MakeInputs(c, 2300);
  ForEachTarget(c, in, [&](const Outputs& out) {
    for (int64_t i = 0; i < 15; ++i) {
      EXPECT_EQ(out.lse[i], 1.5f);
      for (int64_t e = 0; e < c.dv; ++e) EXPECT_EQ(out.o.Get(0, 0, i, e), 0.0f);
    }
  });
  CheckAllTargets(c, in);
}

TEST(VariantTest, ExplicitMasks) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::mt19937 rng(2400);
  Case c;
  c.batch = 2;
  c.q_heads = 4;
  c.kv_heads = 2;
  c.q_len = 35;
  c.kv_len = 75;
  c.dk = 16;
  c.dv = 16;
  const Inputs in = MakeInputs(c, 2401);
  // One bool [Lq, Lk] mask for every batch and head; row 3 hides everything.
  Tensor bool_mask(DType::kBool, 1, 1, 35, 75);
  for (int64_t i = 0; i < 35; ++i)
    for (int64_t j = 0; j < 75; ++j)
      bool_mask.Set(0, 0, i, j, (i == 3 || rng() % 3 == 0) ? 0.0f : 1.0f);
  // Padding as an additive [B, 1, 1, Lk] mask.
  Tensor pad_mask(DType::kF32, 2, 1, 1, 75);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t j = 0; j < 75; ++j)
      pad_mask.Set(b, 0, 0, j, j >= 60 - 20 * b ? neg_inf : 0.0f);
  // A full f16 additive mask with finite biases.
  Tensor bias(DType::kF16, 2, 4, 35, 75);
  bias.FillUniform(&rng, -3.0f, 3.0f);
  // Per-head [1, Hq, 1, 1] bias.
  Tensor head_bias(DType::kF32, 1, 4, 1, 1);
  head_bias.FillUniform(&rng, -1.0f, 1.0f);
  for (const Tensor* t : {&bool_mask, &pad_mask, &bias, &head_bias}) {
    for (bool causal : {false, true}) {
      Case m = c;
      m.options.mask = t->View();
      m.options.causal = causal;
      m.options.alignment = Alignment::kTopLeft;
      CheckAllTargets(m, in);
    }
  }
}

TEST(VariantTest, MaskTilesHiddenFromEveryRowAreSkipped) {
  // A block-sparse bool mask: query i sees keys [64 * (i / 40), +64) plus
  // key 199; keys 130..198 are hidden from every query, and the V rows there
  // hold NaN and Inf, which must not reach any output. Run with a window too,
  // so key tiles start off the 64-key grid.
  Case c;
  c.q_heads = 2;
  c.kv_heads = 1;
  c.q_len = 120;
  c.kv_len = 200;
  c.dk = 24;
  c.dv = 8;
  Inputs in = MakeInputs(c, 2450);
  for (int64_t j = 130; j < 199; ++j) {
    in.v.Set(0, 0, j, 0, j % 2 ? std::numeric_limits<float>::quiet_NaN()
                               : std::numeric_limits<float>::infinity());
  }
  for (bool f16 : {false, true}) {
    Tensor mask(f16 ? DType::kF16 : DType::kBool, 1, 1, 120, 200);
    const float hidden = f16 ? -std::numeric_limits<float>::infinity() : 0.0f;
    const float shown = f16 ? 0.5f : 1.0f;
    for (int64_t i = 0; i < 120; ++i) {
      for (int64_t j = 0; j < 200; ++j) {
        const bool see = (j >= 64 * (i / 40) && j < 64 * (i / 40) + 64 && j < 130) ||
                         j == 199;
        mask.Set(0, 0, i, j, see ? shown : hidden);
      }
    }
    for (int64_t window : {int64_t{-1}, int64_t{150}}) {
      Case m = c;
      m.options.mask = mask.View();
      m.options.window_left = window;
      m.options.window_right = window;
      m.options.alignment = Alignment::kTopLeft;
      SCOPED_TRACE(testing::Message() << "f16 " << f16 << " window " << window);
      ForEachTarget(m, in, [&](const Outputs& out) {
        for (int64_t h = 0; h < 2; ++h)
          for (int64_t i = 0; i < 120; ++i)
            for (int64_t e = 0; e < 8; ++e)
              ASSERT_TRUE(std::isfinite(out.o.Get(0, h, i, e))) << h << " " << i;
      });
      CheckAllTargets(m, in);
    }
  }
}

TEST(VariantTest, HiddenInfInValueDoesNotLeak) {
  // Key 4's value is Inf and a bool mask hides key 4 from even rows: they stay
  // finite; odd rows see it and get Inf/NaN.
  Case c;
  c.q_len = 8;
  c.kv_len = 8;
  c.dk = 4;
  c.dv = 4;
  Inputs in = MakeInputs(c, 2500);
  in.v.Set(0, 0, 4, 1, std::numeric_limits<float>::infinity());
  Tensor mask(DType::kBool, 1, 1, 8, 8);
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t j = 0; j < 8; ++j) mask.Set(0, 0, i, j, (j == 4 && i % 2 == 0) ? 0.0f : 1.0f);
  c.options.mask = mask.View();
  ForEachTarget(c, in, [&](const Outputs& out) {
    for (int64_t i = 0; i < 8; ++i) {
      EXPECT_EQ(std::isfinite(out.o.Get(0, 0, i, 1)), i % 2 == 0) << i;
      EXPECT_TRUE(std::isfinite(out.o.Get(0, 0, i, 0))) << i;
    }
  });
}

TEST(VariantTest, Combinations) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float sinks[8] = {0.5f, -1.0f, 2.0f, 0.0f, neg_inf, 1.0f, -3.0f, 0.25f};
  float slopes[8] = {0.25f, 0.125f, 0.0625f, 0.03125f, 0.5f, 0.0f, 0.01f, 1.0f};
  int64_t lens[2] = {100, 57};
  std::mt19937 rng(2600);
  Tensor bias(DType::kF32, 1, 8, 48, 100);
  bias.FillUniform(&rng, -2.0f, 2.0f);
  int n = 0;
  for (int combo = 0; combo < 4; ++combo) {
    Case c;
    c.batch = 2;
    c.q_heads = 8;
    c.kv_heads = combo == 2 ? 1 : 4;
    c.q_len = 48;
    c.kv_len = 100;
    c.dk = 40;
    c.dv = 24;
    c.layout = combo % 2 ? Layout::kBSHD : Layout::kBHSD;
    switch (combo) {
      case 0:  // causal + window + sinks
        c.options.causal = true;
        c.options.alignment = Alignment::kTopLeft;
        c.options.window_left = 16;
        c.options.sinks = sinks;
        break;
      case 1:  // mask + ALiBi + softcap
        c.options.mask = bias.View();
        c.options.alibi_slopes = slopes;
        c.options.alignment = Alignment::kTopLeft;
        c.options.softcap = 5.0f;
        break;
      case 2:  // GQA (MQA) + kv_lengths, bottom-right causal
        c.options.kv_lengths = lens;
        c.options.causal = true;
        c.options.alignment = Alignment::kBottomRight;
        break;
      case 3:  // everything
        c.options.kv_lengths = lens;
        c.options.causal = true;
        c.options.alignment = Alignment::kBottomRight;
        c.options.window_left = 30;
        c.options.sinks = sinks;
        c.options.alibi_slopes = slopes;
        c.options.softcap = 8.0f;
        c.options.mask = bias.View();
        c.options.dropout_p = 0.2f;
        c.options.dropout_seed = 4242;
        break;
    }
    CheckCase(c, 2601 + n++, -1.5f, 1.5f);
  }
}

TEST(VariantTest, DropoutMatchesReference) {
  int n = 0;
  for (float p : {0.1f, 0.5f, 0.9f}) {
    for (bool causal : {false, true}) {
      Case c;
      c.batch = 2;
      c.q_heads = 4;
      c.kv_heads = 2;
      c.q_len = 29;
      c.kv_len = 83;
      c.dk = 16;
      c.dv = 20;
      c.options.causal = causal;
      c.options.alignment = Alignment::kTopLeft;
      c.options.dropout_p = p;
      c.options.dropout_seed = 0x123456789ull + n;
      CheckCase(c, 2700 + n++);
    }
  }
}

// With V the identity (Lk = Dv) each output row is that row's kept weights:
// they must be P / (1 - p) or 0, about a fraction 1 - p of them kept, and the
// keep pattern must move with the seed.
TEST(VariantTest, DropoutKeepsWeightsScaled) {
  const int64_t L = 96;
  const float p = 0.3f;
  Case c;
  c.q_len = L;
  c.kv_len = L;
  c.dk = 8;
  c.dv = L;
  Inputs in = MakeInputs(c, 2800);
  for (int64_t j = 0; j < L; ++j)
    for (int64_t e = 0; e < L; ++e) in.v.Set(0, 0, j, e, j == e ? 1.0f : 0.0f);
  Case plain = c;
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target);
    const Outputs base = RunFast(plain, in, target);
    c.options.dropout_p = p;
    c.options.dropout_seed = 7;
    const Outputs d1 = RunFast(c, in, target);
    c.options.dropout_seed = 8;
    const Outputs d2 = RunFast(c, in, target);
    c.options.dropout_p = 0.0f;
    const Outputs d0 = RunFast(c, in, target);
    ASSERT_TRUE(base.status.ok() && d1.status.ok() && d2.status.ok() && d0.status.ok());
    EXPECT_EQ(d0.o.bytes, base.o.bytes);  // p = 0 is no dropout, bit for bit
    int64_t kept = 0, differ = 0;
    for (int64_t i = 0; i < L; ++i) {
      for (int64_t j = 0; j < L; ++j) {
        const float w = base.o.Get(0, 0, i, j);
        const float x = d1.o.Get(0, 0, i, j);
        if (x != 0.0f) {
          ++kept;
          EXPECT_NEAR(x, w / (1.0f - p), 1e-6f);
        }
        if ((x != 0.0f) != (d2.o.Get(0, 0, i, j) != 0.0f)) ++differ;
      }
    }
    // Binomial(L*L, 0.7): mean 6451, sd 45; 6 sd either way.
    const double mean = (1.0 - p) * L * L;
    const double sd = std::sqrt(L * L * p * (1.0 - p));
    EXPECT_NEAR(static_cast<double>(kept), mean, 6.0 * sd);
    EXPECT_GT(differ, L * L / 4);  // two seeds: about 42% of decisions differ
  }
}

}  // namespace
}  // namespace test
}  // namespace simdattn
