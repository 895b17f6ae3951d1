// Which keys each row of the reference sees: causal masks in both
// alignments, sliding windows, per-batch KV lengths, and bool and additive
// masks with their broadcasting.

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "lib/dtype.h"
#include "tests/reference_util.h"

namespace simdattn {
namespace test {
namespace {

TEST(ReferenceTest, CausalTopLeft) {
  VisibilityCase c(1, 1, 3, 5);
  AttentionOptions opt;
  opt.causal = true;
  opt.alignment = Alignment::kTopLeft;
  c.Expect(c.Run(opt), [](int64_t, int64_t, int64_t i, int64_t j) { return j <= i; });
}

TEST(ReferenceTest, CausalBottomRightShortQuery) {
  // Lq = 3 < Lk = 5: p(i) = i + 2, the last query sees every key.
  VisibilityCase c(1, 1, 3, 5);
  AttentionOptions opt;
  opt.causal = true;
  opt.alignment = Alignment::kBottomRight;
  c.Expect(c.Run(opt),
           [](int64_t, int64_t, int64_t i, int64_t j) { return j <= i + 2; });
}

TEST(ReferenceTest, CausalBottomRightLongQueryEmptyRows) {
  // Lq = 5 > Lk = 3: p(i) = i - 2, rows 0 and 1 see nothing -> 0, LSE -inf.
  VisibilityCase c(1, 1, 5, 3);
  AttentionOptions opt;
  opt.causal = true;
  opt.alignment = Alignment::kBottomRight;
  const Result r = c.Run(opt);
  c.Expect(r, [](int64_t, int64_t, int64_t i, int64_t j) { return j <= i - 2; });
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) EXPECT_EQ(r.o[i * 3 + j], 0.0);
    EXPECT_EQ(r.lse[i], -kInf);
  }
  for (double x : r.o) EXPECT_FALSE(std::isnan(x));
}

TEST(ReferenceTest, CausalTopLeftLongQuery) {
  // Top-left ignores Lk: rows past Lk see every key.
  VisibilityCase c(1, 1, 5, 3);
  AttentionOptions opt;
  opt.causal = true;
  opt.alignment = Alignment::kTopLeft;
  c.Expect(c.Run(opt), [](int64_t, int64_t, int64_t i, int64_t j) { return j <= i; });
}

// The SEMANTICS example: window_left = 3, window_right = 0, p = 10 sees
// keys 7, 8, 9, 10.
TEST(ReferenceTest, SlidingWindowLeftExample) {
  VisibilityCase c(1, 1, 12, 12);
  AttentionOptions opt;
  opt.window_left = 3;
  opt.window_right = 0;
  const Result r = c.Run(opt);
  c.Expect(r, [](int64_t, int64_t, int64_t i, int64_t j) {
    return j >= i - 3 && j <= i;
  });
  for (int64_t j = 0; j < 12; ++j) {
    EXPECT_NEAR(r.o[10 * 12 + j], (j >= 7 && j <= 10) ? 0.25 : 0.0, kTol) << j;
  }
}

TEST(ReferenceTest, SlidingWindowBothSidesAndUnbounded) {
  VisibilityCase c(1, 1, 8, 8);
  AttentionOptions opt;
  opt.window_left = 1;
  opt.window_right = 2;
  c.Expect(c.Run(opt), [](int64_t, int64_t, int64_t i, int64_t j) {
    return j >= i - 1 && j <= i + 2;
  });
  opt.window_left = -1;  // unbounded to the left
  c.Expect(c.Run(opt),
           [](int64_t, int64_t, int64_t i, int64_t j) { return j <= i + 2; });
  opt.window_left = 0;
  opt.window_right = -1;  // unbounded to the right
  c.Expect(c.Run(opt), [](int64_t, int64_t, int64_t i, int64_t j) { return j >= i; });
}

TEST(ReferenceTest, SlidingWindowBottomRightWithCausal) {
  // Lq = 2, Lk = 6: p(i) = i + 4. Window of 3 tokens (left = 2), causal.
  VisibilityCase c(1, 1, 2, 6);
  AttentionOptions opt;
  opt.causal = true;
  opt.alignment = Alignment::kBottomRight;
  opt.window_left = 2;
  c.Expect(c.Run(opt), [](int64_t, int64_t, int64_t i, int64_t j) {
    return j >= i + 2 && j <= i + 4;
  });
}

TEST(ReferenceTest, KvLengths) {
  VisibilityCase c(3, 2, 2, 5);
  const int64_t lens[3] = {3, 5, 0};
  AttentionOptions opt;
  opt.kv_lengths = lens;
  c.Expect(c.Run(opt),
           [&](int64_t b, int64_t, int64_t, int64_t j) { return j < lens[b]; });
}

TEST(ReferenceTest, KvLengthsSetBottomRightAlignment) {
  // p(i) = i + Lk_b - Lq uses the batch's own length: with Lq = 2,
  // batch 0 (Lk_b = 3) has p = 1, 2; batch 1 (Lk_b = 5) has p = 3, 4.
  VisibilityCase c(2, 1, 2, 5);
  const int64_t lens[2] = {3, 5};
  AttentionOptions opt;
  opt.kv_lengths = lens;
  opt.causal = true;
  opt.alignment = Alignment::kBottomRight;
  c.Expect(c.Run(opt), [&](int64_t b, int64_t, int64_t i, int64_t j) {
    return j < lens[b] && j <= i + lens[b] - 2;
  });
}

// ---------------------------------------------------------------- Masks

TEST(ReferenceTest, BoolMaskFull) {
  VisibilityCase c(1, 2, 3, 4);
  // Pattern varies over h, i and j; row (h=1, i=2) is fully hidden.
  std::vector<uint8_t> mask(2 * 3 * 4);
  auto allowed = [](int64_t, int64_t h, int64_t i, int64_t j) {
    if (h == 1 && i == 2) return false;
    return ((h + i + j) % 3) != 0 || j == i;
  };
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 4; ++j)
        mask[(h * 3 + i) * 4 + j] = allowed(0, h, i, j) ? 7 : 0;  // any non-zero
  AttentionOptions opt;
  opt.mask.data = mask.data();
  opt.mask.dtype = DType::kBool;
  opt.mask.shape[0] = 1;
  opt.mask.shape[1] = 2;
  opt.mask.shape[2] = 3;
  opt.mask.shape[3] = 4;
  opt.mask.strides[0] = 24;
  opt.mask.strides[1] = 12;
  opt.mask.strides[2] = 4;
  opt.mask.strides[3] = 1;
  c.Expect(c.Run(opt), allowed);
}

// A key-padding mask [B, 1, 1, Lk] broadcast over heads and rows; the strides
// of the extent-1 dimensions are garbage on purpose (they must be ignored).
TEST(ReferenceTest, BoolMaskBroadcastExtentOne) {
  VisibilityCase c(2, 3, 4, 5);
  const std::vector<uint8_t> mask = {1, 1, 0, 1, 0,   // batch 0
                                     0, 1, 1, 1, 1};  // batch 1
  AttentionOptions opt;
  opt.mask.data = mask.data();
  opt.mask.dtype = DType::kBool;
  opt.mask.shape[0] = 2;
  opt.mask.shape[1] = 1;
  opt.mask.shape[2] = 1;
  opt.mask.shape[3] = 5;
  opt.mask.strides[0] = 5;
  opt.mask.strides[1] = 1000;
  opt.mask.strides[2] = -1000;
  opt.mask.strides[3] = 1;
  c.Expect(c.Run(opt), [&](int64_t b, int64_t, int64_t, int64_t j) {
    return mask[b * 5 + j] != 0;
  });
}

// Stride 0 on a full-extent dimension also broadcasts: one [Lq, Lk] pattern
// shared by every batch and head.
TEST(ReferenceTest, BoolMaskStrideZeroBroadcast) {
  VisibilityCase c(2, 2, 2, 3);
  const std::vector<uint8_t> mask = {1, 0, 1,
                                     0, 1, 1};
  AttentionOptions opt;
  opt.mask.data = mask.data();
  opt.mask.dtype = DType::kBool;
  opt.mask.shape[0] = 2;
  opt.mask.shape[1] = 2;
  opt.mask.shape[2] = 2;
  opt.mask.shape[3] = 3;
  opt.mask.strides[0] = 0;
  opt.mask.strides[1] = 0;
  opt.mask.strides[2] = 3;
  opt.mask.strides[3] = 1;
  c.Expect(c.Run(opt), [&](int64_t, int64_t, int64_t i, int64_t j) {
    return mask[i * 3 + j] != 0;
  });
}

// Additive f32 mask [1, 1, Lq, Lk] broadcast over B and H: zero keys, so the
// scores are the mask values; -inf hides and a -inf row is empty.
TEST(ReferenceTest, AdditiveMaskF32) {
  const int64_t b = 2, h = 2, lq = 3, lk = 3;
  VisibilityCase c(b, h, lq, lk);
  const float ninf = -std::numeric_limits<float>::infinity();
  const std::vector<float> mask = {0.0f, std::log(3.0f), ninf,   // 1/4, 3/4, 0
                                   -2.0f, ninf, 1.0f,           // e^-2, 0, e
                                   ninf, ninf, ninf};           // empty
  AttentionOptions opt;
  opt.mask = Dense(mask, 1, 1, lq, lk);
  const Result r = c.Run(opt);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  const double e3 = std::exp(static_cast<double>(mask[1]));
  for (int64_t bh = 0; bh < b * h; ++bh) {
    const double* o = &r.o[static_cast<size_t>(bh * lq * lk)];
    const double* lse = &r.lse[static_cast<size_t>(bh * lq)];
    EXPECT_NEAR(o[0], 1.0 / (1.0 + e3), kTol);
    EXPECT_NEAR(o[1], e3 / (1.0 + e3), kTol);
    EXPECT_EQ(o[2], 0.0);
    EXPECT_NEAR(lse[0], std::log(1.0 + e3), kTol);
    const double z = std::exp(-2.0) + std::exp(1.0);
    EXPECT_NEAR(o[3], std::exp(-2.0) / z, kTol);
    EXPECT_EQ(o[4], 0.0);
    EXPECT_NEAR(o[5], std::exp(1.0) / z, kTol);
    EXPECT_NEAR(lse[1], std::log(z), kTol);
    for (int j = 6; j < 9; ++j) EXPECT_EQ(o[j], 0.0);
    EXPECT_EQ(lse[2], -kInf);
  }
}

// Additive f16 mask broadcast over rows ([B, Hq, 1, Lk]), values exact in f16.
TEST(ReferenceTest, AdditiveMaskF16) {
  const int64_t b = 1, h = 2, lq = 2, lk = 2;
  VisibilityCase c(b, h, lq, lk);
  // head 0: [0, 1]; head 1: [-inf, 0.5].
  const std::vector<uint16_t> mask = {F32ToF16(0.0f), F32ToF16(1.0f), 0xFC00,
                                      F32ToF16(0.5f)};
  AttentionOptions opt;
  opt.mask = Dense16(mask, DType::kF16, b, h, 1, lk);
  const Result r = c.Run(opt);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  const double e = std::exp(1.0);
  for (int64_t i = 0; i < lq; ++i) {
    EXPECT_NEAR(r.o[(0 * lq + i) * lk + 0], 1.0 / (1.0 + e), kTol);
    EXPECT_NEAR(r.o[(0 * lq + i) * lk + 1], e / (1.0 + e), kTol);
    EXPECT_NEAR(r.lse[0 * lq + i], std::log(1.0 + e), kTol);
    EXPECT_EQ(r.o[(1 * lq + i) * lk + 0], 0.0);
    EXPECT_NEAR(r.o[(1 * lq + i) * lk + 1], 1.0, kTol);
    EXPECT_NEAR(r.lse[1 * lq + i], 0.5, kTol);
  }
}

}  // namespace
}  // namespace test
}  // namespace simdattn
