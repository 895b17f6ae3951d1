// Few queries per head against a long KV cache: all query heads of a KV
// group in one block, keys split into chunks merged through their LSE, and
// the fused decode path for 16-bit K/V, on every target.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/dtype.h"
#include "lib/reference.h"
#include "tests/attention_harness.h"

namespace simdattn {
namespace test {
namespace {

TEST(DecodeTest, SplitKeysAgainstReference) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float sinks[8] = {0.5f, 2.0f, -1.0f, neg_inf, 0.0f, 1.0f, 3.0f, -2.0f};
  int n = 0;
  const int64_t lk_quick[] = {700, 1500};
  const int64_t lk_full[] = {600, 1500, 2049, 5000};
  for (int64_t lk : QuickMode() ? std::vector<int64_t>(lk_quick, lk_quick + 2)
                                : std::vector<int64_t>(lk_full, lk_full + 4)) {
    for (int64_t lq : {1, 3, 16}) {
      for (int64_t kv_heads : {8, 2, 1}) {  // groups 1, 4, 8
        // Quick mode (qemu): each pair of Lq and group with one of the two
        // Lk (a checkerboard over the three loops).
        if (QuickMode() && (lq + kv_heads / 2 + (lk == lk_quick[0])) % 2 != 0) {
          continue;
        }
        Case c;
        c.kv_dtype = n % 3 == 0 ? DType::kF32 : (n % 3 == 1 ? DType::kF16 : DType::kBF16);
        c.bound = OutputBound(DType::kF32);  // exact widening, f32 math
        c.batch = 1;
        c.q_heads = 8;
        c.kv_heads = kv_heads;
        c.q_len = lq;
        c.kv_len = lk;
        c.dk = 16;
        c.dv = 24;
        c.layout = n % 2 ? Layout::kBSHD : Layout::kBHSD;
        c.options.causal = lq > 1;  // speculative decoding: bottom-right
        c.options.alignment = Alignment::kBottomRight;
        if (n % 4 == 1) c.options.sinks = sinks;
        CheckCase(c, 4000 + n++);
      }
    }
  }
}

// Head dims wide enough for the decode path's vector loops (4 vectors of
// outputs, 4 keys of scores) plus a tail on every target, key counts that
// end tiles and chunks off the 4-key grid, and groups of 4 and 8 rows.
TEST(DecodeTest, WideHeadsWithTails) {
  int n = 0;
  for (int64_t dk : {128, 72, 112}) {
    for (int64_t kv_heads : {2, 1}) {
      for (DType kv : {DType::kF32, DType::kF16, DType::kBF16}) {
        // Quick mode (qemu): each head dim and KV type with one group size.
        if (QuickMode() && (dk / 8 + kv_heads + static_cast<int>(kv)) % 2 != 0) continue;
        Case c;
        c.kv_dtype = kv;
        c.bound = OutputBound(DType::kF32);
        c.batch = 1;
        c.q_heads = 8;
        c.kv_heads = kv_heads;
        c.q_len = 1;
        c.kv_len = dk == 128 ? 1027 : 1534;
        c.dk = dk;
        c.dv = dk == 72 ? 136 : dk;
        c.layout = n % 2 ? Layout::kBSHD : Layout::kBHSD;
        CheckCase(c, 4050 + n++);
      }
    }
  }
}

// Lq = 1 takes the decode path with every option: alone, combined, with
// the keys split into chunks and tiles that start off the 4-key grid.
TEST(DecodeTest, EveryOptionOnTheDecodePath) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float sinks[8] = {0.5f, -1.0f, 2.0f, 0.0f, neg_inf, 1.0f, -3.0f, 0.25f};
  float slopes[8] = {0.01f, 0.02f, 0.04f, 0.001f, 0.1f, 0.005f, 0.03f, 0.0f};
  int64_t lens[2] = {1300, 777};
  const int64_t lk = 1300;
  std::mt19937 rng(4300);
  Tensor pad(DType::kBool, 2, 1, 1, lk);
  Tensor add(DType::kF32, 2, 8, 1, lk);
  Tensor add16(DType::kF16, 1, 1, 1, lk);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t j = 0; j < lk; ++j) {
      pad.Set(b, 0, 0, j, rng() % 5 != 0 ? 1.0f : 0.0f);
      for (int64_t h = 0; h < 8; ++h) {
        add.Set(b, h, 0, j, rng() % 7 == 0 ? neg_inf : (rng() % 1000) * 0.002f - 1.0f);
      }
    }
  }
  for (int64_t j = 0; j < lk; ++j) add16.Set(0, 0, 0, j, (rng() % 100) * 0.01f - 0.5f);
  for (int which = 0; which < 9; ++which) {
    for (int64_t kv_heads : {2, 1}) {  // groups of 4 and 8 rows
      // Quick mode (qemu): each option set with one of the two groups, in
      // both layouts.
      if (QuickMode() && kv_heads != (which % 4 < 2 ? 2 : 1)) continue;
      SCOPED_TRACE(testing::Message() << "option set " << which << " kv_heads " << kv_heads);
      Case c;
      c.kv_dtype = which % 3 == 0 ? DType::kF32 : (which % 3 == 1 ? DType::kF16 : DType::kBF16);
      c.bound = OutputBound(DType::kF32);
      c.batch = 2;
      c.q_heads = 8;
      c.kv_heads = kv_heads;
      c.q_len = 1;
      c.kv_len = lk;
      // Head dims off the vector grid, and the usual 128.
      c.dk = kv_heads == 2 ? 72 : 128;
      c.dv = kv_heads == 2 ? 136 : 128;
      c.layout = which % 2 ? Layout::kBSHD : Layout::kBHSD;
      c.options.alignment = Alignment::kBottomRight;
      switch (which) {
        case 0: c.options.softcap = 5.0f; break;
        case 1: c.options.alibi_slopes = slopes; break;
        case 2: c.options.mask = pad.View(); break;
        case 3: c.options.mask = add.View(); break;
        case 4: c.options.mask = add16.View(); break;
        case 5:
          c.options.dropout_p = 0.3f;
          c.options.dropout_seed = 99;
          c.options.kv_lengths = lens;
          break;
        case 6:
          c.options.window_left = 333;  // tiles start off the 4-key grid
          c.options.dropout_p = 0.5f;
          c.options.dropout_seed = 7;
          c.options.sinks = sinks;
          break;
        case 7:
          c.options.mask = add.View();
          c.options.alibi_slopes = slopes;
          c.options.softcap = 3.0f;
          break;
        case 8:
          c.options.causal = true;
          c.options.window_left = 500;
          c.options.sinks = sinks;
          c.options.mask = pad.View();
          c.options.kv_lengths = lens;
          break;
      }
      CheckCase(c, 4310 + which);
    }
  }
}

// Keys the mask hides take no part on the decode path either: their V rows
// hold Inf/NaN and the outputs of the heads that cannot see them stay
// finite, while the head that sees one Inf row gets a non-finite output.
TEST(DecodeTest, HiddenInfInValueDoesNotLeak) {
  for (int64_t dim : {64, 128}) {
    SCOPED_TRACE(testing::Message() << "head dim " << dim);
    Case c;
    c.kv_dtype = DType::kF16;
    c.q_heads = 4;
    c.kv_heads = 1;
    c.q_len = 1;
    c.kv_len = 1100;
    c.dk = dim;
    c.dv = dim;
    Inputs in = MakeInputs(c, 4400);
    for (int64_t j = 600; j < 900; ++j) {
      in.v.Set(0, 0, j, j % dim, j % 2 ? std::numeric_limits<float>::quiet_NaN()
                                        : std::numeric_limits<float>::infinity());
    }
    // Heads 0-2 see no key in [600, 900) (whole tiles hidden, and tiles
    // partly hidden); head 3 sees key 700 (V row: Inf in lane 700 % dim).
    Tensor mask(DType::kBool, 1, 4, 1, 1100);
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t j = 0; j < 1100; ++j)
        mask.Set(0, h, 0, j, (j >= 600 && j < 900 && !(h == 3 && j == 700)) ? 0.0f : 1.0f);
    c.options.mask = mask.View();
    ForEachTarget(c, in, [&](const Outputs& out) {
      for (int64_t h = 0; h < 4; ++h) {
        for (int64_t e = 0; e < dim; ++e) {
          const bool finite = std::isfinite(out.o.Get(0, h, 0, e));
          EXPECT_EQ(finite, h < 3 || e != 700 % dim) << "head " << h << " lane " << e;
        }
      }
    });
  }
}

TEST(DecodeTest, SplitWithEveryOption) {
  float sinks[4] = {0.5f, -1.0f, 1.5f, 0.0f};
  float slopes[4] = {0.01f, 0.02f, 0.04f, 0.001f};
  int64_t lens[2] = {1300, 617};
  std::mt19937 rng(4100);
  Tensor pad(DType::kBool, 2, 1, 1, 1300);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t j = 0; j < 1300; ++j) pad.Set(b, 0, 0, j, rng() % 5 != 0 ? 1.0f : 0.0f);
  for (int which = 0; which < 5; ++which) {
    Case c;
    c.kv_dtype = DType::kF16;
    c.batch = 2;
    c.q_heads = 4;
    c.kv_heads = 2;
    c.q_len = 4;
    c.kv_len = 1300;
    c.dk = 16;
    c.dv = 16;
    c.options.alignment = Alignment::kBottomRight;
    c.options.causal = true;
    switch (which) {
      case 0: c.options.kv_lengths = lens; break;
      case 1: c.options.window_left = 700; break;
      case 2: c.options.mask = pad.View(); c.options.sinks = sinks; break;
      case 3: c.options.alibi_slopes = slopes; c.options.softcap = 4.0f; break;
      case 4:
        c.options.dropout_p = 0.3f;
        c.options.dropout_seed = 77;
        c.options.kv_lengths = lens;
        break;
    }
    CheckCase(c, 4101 + which);
  }
}

// Lq 2..8 with at most 16 rows per group also take the decode path
// (speculative decoding): rows of one block have different queries, so the
// tiles at the ends of their key ranges hide keys per row (causal, windows,
// either alignment), alongside every score and weight option. Head dims wide
// enough for the vector loops, chunks split off the tile grid.
TEST(DecodeTest, SeveralQueriesOnTheDecodePath) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float sinks[8] = {0.5f, -1.0f, 2.0f, 0.0f, neg_inf, 1.0f, -3.0f, 0.25f};
  float slopes[8] = {0.01f, 0.02f, 0.04f, 0.001f, 0.1f, 0.005f, 0.03f, 0.0f};
  // Quick mode (qemu, where SVE-512 runs this test about 350x slower than
  // natively): fewer keys (still two chunks), and each option set on one of
  // three shapes instead of all five.
  const int64_t lk = QuickMode() ? 600 : 1300;
  int64_t lens[2] = {lk, QuickMode() ? 401 : 801};
  std::mt19937 rng(4500);
  Tensor add(DType::kF32, 2, 1, 8, lk);  // per query, shared by the heads
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 8; ++i)
      for (int64_t j = 0; j < lk; ++j)
        add.Set(b, 0, i, j, rng() % 6 == 0 ? neg_inf : (rng() % 1000) * 0.002f - 1.0f);
  struct Shape {
    int64_t q_len, kv_heads;
  };
  // 8 heads: groups of 2, 4 and 8 rows per query (4 to 16 rows).
  const std::vector<Shape> all = {{2, 2}, {8, 4}, {2, 1}, {4, 2}, {5, 2}};
  const std::vector<Shape> shapes(all.begin(), all.begin() + (QuickMode() ? 3 : 5));
  int n = 0;
  for (size_t si = 0; si < shapes.size(); ++si) {
    const Shape& shape = shapes[si];
    for (int which = 0; which < 7; ++which) {
      if (QuickMode() && static_cast<size_t>(which) % shapes.size() != si) continue;
      SCOPED_TRACE(testing::Message() << "Lq " << shape.q_len << " kv_heads "
                                      << shape.kv_heads << " option set " << which);
      Case c;
      c.kv_dtype = n % 3 == 0 ? DType::kF32 : (n % 3 == 1 ? DType::kF16 : DType::kBF16);
      c.bound = OutputBound(DType::kF32);
      c.batch = 2;
      c.q_heads = 8;
      c.kv_heads = shape.kv_heads;
      c.q_len = shape.q_len;
      c.kv_len = lk;
      c.dk = n % 2 ? 72 : 128;
      c.dv = n % 2 ? 136 : 128;
      c.layout = n % 2 ? Layout::kBSHD : Layout::kBHSD;
      c.options.alignment = Alignment::kBottomRight;
      switch (which) {
        case 0: c.options.causal = true; break;
        case 1:  // windows start and end inside tiles, per row
          c.options.causal = true;
          c.options.window_left = 333;
          c.options.sinks = sinks;
          break;
        case 2:  // no causal: a window on both sides
          c.options.window_left = 150;
          c.options.window_right = 2;
          c.options.kv_lengths = lens;
          break;
        case 3:  // top-left: row i sees keys 0..i only
          c.options.causal = true;
          c.options.alignment = Alignment::kTopLeft;
          break;
        case 4:
          c.options.causal = true;
          c.options.mask = add.View();
          c.options.alibi_slopes = slopes;
          c.options.softcap = 4.0f;
          break;
        case 5:
          c.options.causal = true;
          c.options.dropout_p = 0.25f;
          c.options.dropout_seed = 5;
          c.options.kv_lengths = lens;
          c.options.sinks = sinks;
          break;
        case 6:  // window only, top-left: rows' ranges are disjoint from Lk's end
          c.options.window_left = 40;
          c.options.window_right = 70;
          c.options.alignment = Alignment::kTopLeft;
          break;
      }
      if (c.options.mask.data != nullptr && c.q_len != 8) {
        // The mask's Lq extent must match: take its first Lq queries.
        c.options.mask.shape[2] = c.q_len;
      }
      CheckCase(c, 4500 + n++);
    }
  }
}

// The fused decode path (lib/kernels/decode-inl.h, DecodeFused: 16-bit K/V,
// Lq 1, 1-4 query heads per KV head, head dims of whole vectors on every
// target but SVE and SCALAR, which keep the tiles): every group size, key
// counts under one group of 4 and off the 4-key grid (the last keys take a
// tile), split and unsplit calls, sinks (a finite maximum from the start),
// both layouts.
TEST(DecodeTest, FusedGroupsAgainstReference) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float sinks[8] = {0.5f, 2.0f, -1.0f, neg_inf, 0.0f, 1.0f, 3.0f, -2.0f};
  int n = 0;
  for (const DType kv : {DType::kF16, DType::kBF16}) {
    for (int64_t group : {1, 2, 3, 4}) {
      for (int64_t lk : {1, 3, 6, 515, 2051}) {
        const int idx = n++;
        // Quick mode (qemu): a checkerboard over group size and key count.
        if (QuickMode() && (group + idx) % 2 != 0) continue;
        Case c;
        c.kv_dtype = kv;
        c.bound = OutputBound(DType::kF32);  // exact widening, f32 math
        c.batch = 1;
        c.q_heads = 2 * group;
        c.kv_heads = 2;
        c.q_len = 1;
        c.kv_len = lk;
        c.dk = 64;
        c.dv = idx % 2 ? 64 : 128;
        c.layout = idx % 2 ? Layout::kBSHD : Layout::kBHSD;
        if (idx % 3 == 1) c.options.sinks = sinks;
        CheckCase(c, 4400 + idx);
      }
    }
  }
}

// Scores whose maximum keeps rising (the fused path's exact softmax step,
// which rescales the outputs so far) and falling: key j's row is scaled by
// a factor that grows with j for KV head 0 and shrinks for KV head 1, and
// the scores reach tens.
TEST(DecodeTest, FusedGroupsWithRisingMaxima) {
  for (const DType kv : {DType::kF16, DType::kBF16}) {
    Case c;
    c.kv_dtype = kv;
    c.bound = OutputBound(DType::kF32);
    c.batch = 1;
    c.q_heads = 8;
    c.kv_heads = 2;
    c.q_len = 1;
    c.kv_len = 1203;
    c.dk = 64;
    c.dv = 64;
    Inputs in = MakeInputs(c, 4500 + static_cast<int>(kv));
    for (int64_t j = 0; j < c.kv_len; ++j) {
      const float up = 1.0f + 8.0f * static_cast<float>(j) / c.kv_len;
      const float down = 9.0f - 8.0f * static_cast<float>(j) / c.kv_len;
      for (int64_t i = 0; i < c.dk; ++i) {
        in.k.Set(0, 0, j, i, in.k.Get(0, 0, j, i) * up);
        in.k.Set(0, 1, j, i, in.k.Get(0, 1, j, i) * down);
      }
    }
    CheckAllTargets(c, in);
  }
}

// NaN and infinite keys on the fused path: a NaN in a key makes every row
// of its KV head NaN; +-Inf gives a row +Inf or -Inf scores by the sign of
// its query: +Inf makes the row NaN (the reference's Inf - Inf), -Inf takes
// the key's weight to 0. Every other output matches the reference.
TEST(DecodeTest, FusedGroupsWithNonFiniteKeys) {
  const float inf = std::numeric_limits<float>::infinity();
  for (const DType kv : {DType::kF16, DType::kBF16}) {
    for (int which = 0; which < 3; ++which) {
      Case c;
      c.kv_dtype = kv;
      c.batch = 1;
      c.q_heads = 8;
      c.kv_heads = 2;
      c.q_len = 1;
      c.kv_len = 1001;
      c.dk = 64;
      c.dv = 64;
      Inputs in = MakeInputs(c, 4600 + which);
      // Key 5 (the second group) and key 700 of KV head 0.
      const float x = which == 0 ? std::numeric_limits<float>::quiet_NaN()
                                 : (which == 1 ? inf : -inf);
      in.k.Set(0, 0, 5, 3, x);
      in.k.Set(0, 0, 700, 9, x);
      std::vector<double> o_ref, lse_ref;
      ASSERT_TRUE(ReferenceAttention(in.q.View(), in.k.View(), in.v.View(), c.options,
                                     &o_ref, &lse_ref)
                      .ok());
      const double bound = OutputBound(DType::kF32) * std::max(1.0, MaxAbs(in.v));
      int nan_rows = 0;
      for (int64_t h = 0; h < 4; ++h) nan_rows += std::isnan(o_ref[h * c.dv]) ? 1 : 0;
      // NaN: every row of KV head 0; +-Inf: the rows with an Inf - Inf.
      if (which == 0) EXPECT_EQ(nan_rows, 4);
      if (which == 1) EXPECT_GT(nan_rows, 0);
      for (const std::string& target : TestTargets()) {
        SCOPED_TRACE(testing::Message() << target << " " << DTypeName(kv) << " " << x);
        const Outputs out = RunFast(c, in, target);
        ASSERT_TRUE(out.status.ok()) << out.status.message;
        ExpectNanWhereReferenceIs(out.o, o_ref, bound);
      }
    }
  }
}

}  // namespace
}  // namespace test
}  // namespace simdattn
