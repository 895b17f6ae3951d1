// Tests of the double-precision reference (lib/reference.h) against cases whose
// answers are worked out by hand or in closed form, and of Philox4x32-10
// against the published Random123 known-answer vectors.

#include "lib/reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "lib/dtype.h"
#include "lib/philox.h"

namespace simdattn {
namespace test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kTol = 1e-12;

// A dense BHSD f32 view of `data`, which must hold b*h*s*d floats.
TensorView Dense(const std::vector<float>& data, int64_t b, int64_t h,
                 int64_t s, int64_t d) {
  TensorView t;
  t.data = data.data();
  t.dtype = DType::kF32;
  t.shape[0] = b;
  t.shape[1] = h;
  t.shape[2] = s;
  t.shape[3] = d;
  t.strides[3] = 1;
  t.strides[2] = d;
  t.strides[1] = s * d;
  t.strides[0] = h * s * d;
  return t;
}

// The same for 16-bit storage (f16 or bf16 bit patterns).
TensorView Dense16(const std::vector<uint16_t>& data, DType dtype, int64_t b,
                   int64_t h, int64_t s, int64_t d) {
  TensorView t;
  t.data = data.data();
  t.dtype = dtype;
  t.shape[0] = b;
  t.shape[1] = h;
  t.shape[2] = s;
  t.shape[3] = d;
  t.strides[3] = 1;
  t.strides[2] = d;
  t.strides[1] = s * d;
  t.strides[0] = h * s * d;
  return t;
}

// Identity matrix as V [b, h, n, n]: output row i then equals the attention
// weights of row i, so a test can read the weights directly.
std::vector<float> IdentityV(int64_t b, int64_t h, int64_t n) {
  std::vector<float> v(static_cast<size_t>(b * h * n * n), 0.0f);
  for (int64_t bh = 0; bh < b * h; ++bh) {
    for (int64_t j = 0; j < n; ++j) v[static_cast<size_t>((bh * n + j) * n + j)] = 1.0f;
  }
  return v;
}

struct Result {
  Status status;
  std::vector<double> o;
  std::vector<double> lse;
};

Result RunReference(const TensorView& q, const TensorView& k, const TensorView& v,
           const AttentionOptions& options) {
  Result r;
  r.status = ReferenceAttention(q, k, v, options, &r.o, &r.lse);
  return r;
}

// A "zero keys, identity values" problem: every score is 0, so each row's
// output is 1/n on exactly the n keys it sees and 0 elsewhere. Lets a test
// state visibility as a predicate and check it cell by cell.
struct VisibilityCase {
  int64_t batch = 1, heads = 1, lq = 1, lk = 1, dk = 4;
  std::vector<float> q, k, v;
  VisibilityCase(int64_t b, int64_t h, int64_t lq_, int64_t lk_)
      : batch(b), heads(h), lq(lq_), lk(lk_) {
    q.assign(static_cast<size_t>(b * h * lq * dk), 1.0f);
    k.assign(static_cast<size_t>(b * h * lk * dk), 0.0f);
    v = IdentityV(b, h, lk);
  }
  Result Run(const AttentionOptions& options) const {
    return test::RunReference(Dense(q, batch, heads, lq, dk), Dense(k, batch, heads, lk, dk),
                     Dense(v, batch, heads, lk, lk), options);
  }
  // Checks o and lse against `sees(b, h, i, j)`.
  template <typename Pred>
  void Expect(const Result& r, Pred sees) const {
    ASSERT_TRUE(r.status.ok()) << r.status.message;
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < lq; ++i) {
          int64_t n = 0;
          for (int64_t j = 0; j < lk; ++j) n += sees(b, h, i, j) ? 1 : 0;
          const int64_t row = (b * heads + h) * lq + i;
          for (int64_t j = 0; j < lk; ++j) {
            const double want = sees(b, h, i, j) ? 1.0 / n : 0.0;
            EXPECT_NEAR(r.o[row * lk + j], want, kTol)
                << "b=" << b << " h=" << h << " i=" << i << " j=" << j;
          }
          // All scores are 0, so LSE = log(n); log(0) = -inf for empty rows.
          if (n == 0) {
            EXPECT_EQ(r.lse[row], -kInf) << "b=" << b << " h=" << h << " i=" << i;
          } else {
            EXPECT_NEAR(r.lse[row], std::log(static_cast<double>(n)), kTol)
                << "b=" << b << " h=" << h << " i=" << i;
          }
        }
      }
    }
  }
};

// ---------------------------------------------------------------- Philox

Philox4x32Counter Ctr(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  return Philox4x32Counter{{a, b, c, d}};
}

void ExpectPhilox(const Philox4x32Counter& ctr, uint32_t k0, uint32_t k1,
                  const Philox4x32Counter& want) {
  const Philox4x32Counter got = Philox4x32_10(ctr, Philox4x32Key{{k0, k1}});
  for (int w = 0; w < 4; ++w) {
    EXPECT_EQ(got.v[w], want.v[w]) << "word " << w;
  }
}

// Random123's kat_vectors for philox4x32_10.
TEST(PhiloxTest, KnownAnswerZero) {
  ExpectPhilox(Ctr(0, 0, 0, 0), 0, 0,
               Ctr(0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8));
}

TEST(PhiloxTest, KnownAnswerAllOnes) {
  ExpectPhilox(Ctr(0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff), 0xffffffff,
               0xffffffff, Ctr(0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd));
}

TEST(PhiloxTest, KnownAnswerPi) {
  ExpectPhilox(Ctr(0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), 0xa4093822,
               0x299f31d0, Ctr(0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1));
}

// DropoutKeep's contract: key (seed low, seed high), counter (j/8, i, h, b),
// 16-bit draw j % 8 of the output (word (j % 8) / 2, low half first), kept
// when draw >= floor(p * 2^16).
TEST(DropoutKeepTest, UsesDocumentedCounterKeyAndThreshold) {
  const uint64_t seed = 0x0123456789abcdefull;
  const int64_t b = 3, h = 5, i = 7;
  for (int64_t j = 0; j < 20; ++j) {
    const Philox4x32Counter out =
        Philox4x32_10(Ctr(static_cast<uint32_t>(j / 8), 7, 5, 3),
                      Philox4x32Key{{0x89abcdefu, 0x01234567u}});
    const uint32_t word = out.v[(j % 8) / 2];
    const uint32_t draw = j % 2 == 0 ? word & 0xFFFFu : word >> 16;
    // p = draw / 2^16 (exact in float) has threshold draw: kept.
    const float p_at = static_cast<float>(draw) / 65536.0f;
    EXPECT_TRUE(DropoutKeep(seed, p_at, b, h, i, j)) << j;
    // One step of 2^-16 more drops it; any p just below keeps it.
    if (draw < 65535) {
      EXPECT_FALSE(DropoutKeep(seed, static_cast<float>(draw + 1) / 65536.0f, b, h, i, j)) << j;
    }
    if (draw > 0) {
      EXPECT_TRUE(DropoutKeep(seed, std::nextafter(static_cast<float>(draw + 1) / 65536.0f, 0.0f),
                              b, h, i, j)) << j;
      EXPECT_TRUE(DropoutKeep(seed, std::nextafter(p_at, 0.0f), b, h, i, j)) << j;
    }
    EXPECT_TRUE(DropoutKeep(seed, 0.0f, b, h, i, j)) << "p = 0 keeps all";
  }
  // The largest p below 1 still keeps draws of 65535.
  EXPECT_EQ(DropoutThreshold(std::nextafter(1.0f, 0.0f)), 65535u);
}

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

// ---------------------------------------------------------------- Visibility

TEST(ReferenceTest, CausalTopLeft) {
  VisibilityCase c(1, 1, 3, 5);
  AttentionOptions opt;
  opt.causal = true;
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

// ---------------------------------------------------------------- Score terms

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

// Keep decisions along j differ between counter blocks (j / 8), words and
// their halves; along i, h and b they vary too (no accidental correlation).
TEST(DropoutKeepTest, VariesWithEveryIndex) {
  const uint64_t seed = 99;
  const float p = 0.5f;
  auto count_diff = [&](auto index_of) {
    int n = 0;
    for (int64_t t = 0; t < 256; ++t) {
      int64_t b0, h0, i0, j0, b1, h1, i1, j1;
      index_of(t, &b0, &h0, &i0, &j0, &b1, &h1, &i1, &j1);
      n += DropoutKeep(seed, p, b0, h0, i0, j0) != DropoutKeep(seed, p, b1, h1, i1, j1);
    }
    return n;
  };
  // Compare position t with position t shifted by one along each index.
  const int diff_j = count_diff([](int64_t t, int64_t* b0, int64_t* h0, int64_t* i0,
                                   int64_t* j0, int64_t* b1, int64_t* h1, int64_t* i1,
                                   int64_t* j1) {
    *b0 = *b1 = 0; *h0 = *h1 = 0; *i0 = *i1 = 0; *j0 = t; *j1 = t + 1;
  });
  const int diff_i = count_diff([](int64_t t, int64_t* b0, int64_t* h0, int64_t* i0,
                                   int64_t* j0, int64_t* b1, int64_t* h1, int64_t* i1,
                                   int64_t* j1) {
    *b0 = *b1 = 0; *h0 = *h1 = 0; *i0 = 0; *i1 = 1; *j0 = *j1 = t;
  });
  const int diff_h = count_diff([](int64_t t, int64_t* b0, int64_t* h0, int64_t* i0,
                                   int64_t* j0, int64_t* b1, int64_t* h1, int64_t* i1,
                                   int64_t* j1) {
    *b0 = *b1 = 0; *h0 = 0; *h1 = 1; *i0 = *i1 = 0; *j0 = *j1 = t;
  });
  const int diff_b = count_diff([](int64_t t, int64_t* b0, int64_t* h0, int64_t* i0,
                                   int64_t* j0, int64_t* b1, int64_t* h1, int64_t* i1,
                                   int64_t* j1) {
    *b0 = 0; *b1 = 1; *h0 = *h1 = 0; *i0 = *i1 = 0; *j0 = *j1 = t;
  });
  // Expected ~128 each for independent fair coins; 6 sd = 48.
  for (int d : {diff_j, diff_i, diff_h, diff_b}) {
    EXPECT_GT(d, 80);
    EXPECT_LT(d, 176);
  }
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
