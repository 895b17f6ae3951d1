// The tiled (prefill) path against the reference on every target: lengths
// and head dims around the tile edges, GQA, layouts, padded, negative and
// zero strides, causal alignments, the packed K/V copy and the scale.

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/reference.h"
#include "tests/attention_harness.h"

namespace simdattn {
namespace test {
namespace {

// Lq x Lk over {1, 2, 7, 16, 17, 63, 64, 65, 129, 1000} with the head dims
// {1, 8, ..., 576} assigned in rotation; pairs whose reference cost exceeds
// the budget are left out (quick mode, under qemu, keeps the cheap half).
TEST(PrefillTest, SweepLengthsAndHeadDims) {
  const int64_t lens[] = {1, 2, 7, 16, 17, 63, 64, 65, 129, 1000};
  const int64_t dims[] = {1, 8, 40, 64, 72, 80, 96, 128, 192, 256, 576};
  const int64_t budget = QuickMode() ? 200000 : 40000000;
  int n = 0, run = 0;
  for (int64_t lq : lens) {
    for (int64_t lk : lens) {
      const int64_t d = dims[n % 11];
      ++n;
      if (lq * lk * d > budget) continue;
      Case c;
      c.q_len = lq;
      c.kv_len = lk;
      c.dk = d;
      c.dv = d;
      // Every third pair causal, alternating the alignment.
      if (n % 3 == 0) {
        c.options.causal = true;
        c.options.alignment = (n % 2) ? Alignment::kBottomRight
                                      : Alignment::kTopLeft;
      }
      CheckCase(c, 100 + n);
      ++run;
    }
  }
  EXPECT_GE(run, QuickMode() ? 30 : 80);
}

TEST(PrefillTest, EveryHeadDimAgainstTileEdges) {
  // Lengths around the 4-vector query block and the 64-key tile.
  const int64_t dims[] = {1, 8, 40, 64, 72, 80, 96, 128, 192, 256, 576};
  const int64_t lq_quick = 17, lk_quick = 65;
  int n = 0;
  for (int64_t d : dims) {
    Case c;
    c.q_len = QuickMode() ? lq_quick : 67;
    c.kv_len = QuickMode() ? lk_quick : 129;
    c.dk = d;
    c.dv = d;
    CheckCase(c, 300 + n++);
  }
}

TEST(PrefillTest, DifferentQkAndVHeadDims) {
  const int64_t pairs[][2] = {{192, 128}, {576, 512}, {8, 3}, {3, 40}, {64, 1}};
  int n = 0;
  for (const auto& p : pairs) {
    Case c;
    c.q_len = 19;
    c.kv_len = 70;
    c.dk = p[0];
    c.dv = p[1];
    CheckCase(c, 400 + n++);
  }
}

TEST(PrefillTest, GroupedQueryHeads) {
  for (int64_t kv_heads : {8, 2, 1}) {  // groups 1, 4, 8
    Case c;
    c.batch = 2;
    c.q_heads = 8;
    c.kv_heads = kv_heads;
    c.q_len = 9;
    c.kv_len = 33;
    c.dk = 16;
    c.dv = 24;
    CheckCase(c, 500 + static_cast<uint32_t>(kv_heads));
  }
}

TEST(PrefillTest, LayoutsPaddedStridesAndMisalignedBase) {
  int n = 0;
  for (Layout layout : {Layout::kBHSD, Layout::kBSHD}) {
    for (int64_t pad : {0, 3}) {
      Case c;
      c.batch = 2;
      c.q_heads = 4;
      c.kv_heads = 2;
      c.q_len = 21;
      c.kv_len = 66;
      c.dk = 40;
      c.dv = 72;
      c.layout = layout;
      c.pad = pad;
      c.offset = pad;  // base one float off vector alignment when padded
      c.options.causal = (n % 2) == 1;
      c.options.alignment = Alignment::kTopLeft;
      CheckCase(c, 600 + n++);
    }
  }
}

TEST(PrefillTest, LargeOutputAlignedAndOffTheCacheLine) {
  // An f32 O of 4 MiB (kStreamOutputBytes in lib/kernels/kernels.h) goes out
  // through streaming stores on AVX-512 wherever a row's 16 floats fill one
  // cache line (offset 0: the tensors start on a line); one float off the
  // line, the same call takes plain stores. Both must match the reference
  // with nothing written outside O. Under qemu (no AVX-512) a smaller batch
  // keeps the run short.
  for (int64_t offset : {0, 1}) {
    Case c;
    c.batch = QuickMode() ? 2 : 16;
    c.q_heads = 16;
    c.kv_heads = 16;
    c.q_len = 64;
    c.kv_len = 64;
    c.dk = 64;
    c.dv = 64;
    c.offset = offset;
    CheckCase(c, 650 + static_cast<uint32_t>(offset));
  }
}

// Views that are not plain layouts: a reversed sequence axis (negative
// stride) for Q and O, and K/V shared by every batch entry (stride 0).
TEST(PrefillTest, NegativeAndZeroStrides) {
  const int64_t B = 3, H = 2, Lq = 23, Lk = 70, D = 24;
  std::mt19937 rng(1400);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> q(B * H * Lq * D), k(H * Lk * D), v(H * Lk * D);
  for (float& x : q) x = dist(rng);
  for (float& x : k) x = dist(rng);
  for (float& x : v) x = dist(rng);
  TensorView qv = MakeBHSD(q.data(), DType::kF32, B, H, Lq, D);
  qv.data = q.data() + (Lq - 1) * D;  // row i is stored at Lq - 1 - i
  qv.strides[2] = -D;
  TensorView kv = MakeBHSD(k.data(), DType::kF32, B, H, Lk, D);
  TensorView vv = MakeBHSD(v.data(), DType::kF32, B, H, Lk, D);
  kv.strides[0] = 0;
  vv.strides[0] = 0;
  AttentionOptions options;
  options.causal = true;
  options.alignment = Alignment::kBottomRight;
  std::vector<double> o_ref, lse_ref;
  ASSERT_TRUE(ReferenceAttention(qv, kv, vv, options, &o_ref, &lse_ref).ok());
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target);
    std::vector<float> o(B * H * Lq * D, 0.0f);
    MutableTensorView ov = MakeBHSD(o.data(), DType::kF32, B, H, Lq, D);
    ov.data = o.data() + (Lq - 1) * D;
    ov.strides[2] = -D;
    ScopedTarget cap(target);
    RunInfo info;
    const Status st = Attention(qv, kv, vv, ov, options, {}, {}, &info);
    ASSERT_TRUE(st.ok()) << st.message;
    RecordTargetRun(info.target);
    double err = 0.0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < Lq; ++i)
          for (int64_t d = 0; d < D; ++d) {
            const float got = o[((b * H + h) * Lq + (Lq - 1 - i)) * D + d];
            const double want = o_ref[((b * H + h) * Lq + i) * D + d];
            const double e = std::fabs(got - want);
            if (!(e <= err)) err = std::isnan(e) ? INFINITY : e;
          }
    EXPECT_LE(err, OutputBound(DType::kF32));  // max|V| <= 1
  }
}

TEST(PrefillTest, CausalBothAlignmentsWithUnequalLengths) {
  const int64_t shapes[][2] = {{5, 70}, {70, 5}, {64, 129}, {129, 64}, {1, 1000}, {33, 33}};
  int n = 0;
  for (const auto& s : shapes) {
    for (Alignment a : {Alignment::kTopLeft, Alignment::kBottomRight}) {
      Case c;
      c.q_heads = 2;
      c.q_len = s[0];
      c.kv_len = s[1];
      c.dk = 32;
      c.dv = 32;
      c.options.causal = true;
      c.options.alignment = a;
      CheckCase(c, 700 + n++);
    }
  }
}

// Several query blocks per group: K/V go through the packed copy, whose
// tiles start and end on groups of 4 or 8 keys. Windows that start between
// them, valid lengths and head dims off those groups, every KV type.
TEST(PrefillTest, PackedTilesAtWindowAndLengthEdges) {
  struct W {
    int64_t left, right;
    bool causal;
  };
  const W windows[] = {{5, 3, false}, {13, 0, true}, {-1, -1, true}};
  int64_t lens[2] = {61, 37};
  int n = 0;
  for (const W& w : windows) {
    for (DType kv : {DType::kF32, DType::kF16, DType::kBF16}) {
      Case c;
      c.batch = 2;
      c.q_heads = 4;
      c.kv_heads = 2;
      c.q_len = QuickMode() ? 40 : 70;
      c.kv_len = 67;
      c.dk = 13;
      c.dv = 10;
      c.kv_dtype = kv;
      c.options.window_left = w.left;
      c.options.window_right = w.right;
      c.options.causal = w.causal;
      c.options.alignment = n % 2 ? Alignment::kBottomRight : Alignment::kTopLeft;
      c.options.kv_lengths = lens;
      CheckCase(c, 1150 + n++);
    }
  }
}

// The same path with Inf in V: rows whose window holds the key get Inf or
// NaN in that value dim, every other row (including those whose packed tile
// starts a few keys before their window) stays finite.
TEST(PrefillTest, PackedTilesKeepInfInItsRows) {
  for (DType kv : {DType::kF32, DType::kF16, DType::kBF16}) {
    Case c;
    c.q_heads = 2;
    c.q_len = 80;
    c.kv_len = 80;
    c.dk = 8;
    c.dv = 12;
    c.kv_dtype = kv;
    c.options.causal = true;
    c.options.window_left = 5;
    Inputs in = MakeInputs(c, 1170);
    const int64_t key = 21;
    in.v.Set(0, 0, key, 9, std::numeric_limits<float>::infinity());
    for (PackPolicy pack : {PackPolicy::kAlways, PackPolicy::kNever})
    for (const std::string& target : TestTargets()) {
      SCOPED_TRACE(target + (pack == PackPolicy::kAlways ? " packed" : " in place"));
      ScopedPackPolicy policy(pack);
      const Outputs out = RunFast(c, in, target);
      ASSERT_TRUE(out.status.ok()) << out.status.message;
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t i = 0; i < c.q_len; ++i) {
          const bool sees = i >= key && i <= key + 5;
          EXPECT_EQ(std::isfinite(out.o.Get(0, h, i, 9)), !sees) << h << " " << i;
          EXPECT_TRUE(std::isfinite(out.o.Get(0, h, i, 3))) << h << " " << i;
        }
      }
    }
  }
}

TEST(PrefillTest, DefaultScaleIsInverseSqrtHeadDim) {
  Case c;
  c.q_len = 5;
  c.kv_len = 9;
  c.dk = 48;
  c.dv = 8;
  const Inputs in = MakeInputs(c, 1300, -3.0f, 3.0f);
  CheckAllTargets(c, in);
  c.options.scale = 0.0f;  // uniform weights: O is the mean of V
  CheckAllTargets(c, in);
  c.options.scale = 0.7f;
  CheckAllTargets(c, in);
}

}  // namespace
}  // namespace test
}  // namespace simdattn
