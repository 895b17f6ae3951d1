// The fused f32 fast path against the double-precision reference, on every
// target this CPU supports (each case loops over TestTargets()).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "lib/dtype.h"
#include "lib/packing.h"
#include "lib/reference.h"
#include "simdattn/attention.h"
#include "tests/test_util.h"

namespace simdattn {
namespace test {
namespace {

constexpr double kLseBound = 1e-4;  // SEMANTICS.md, f32 Q and K

struct Case {
  int64_t batch = 1, q_heads = 1, kv_heads = 1, q_len = 1, kv_len = 1;
  int64_t dk = 8, dv = 8;
  Layout layout = Layout::kBHSD;
  int64_t pad = 0;
  int64_t offset = 0;
  AttentionOptions options;
  bool lse = true;
  DType kv_dtype = DType::kF32;  // K and V storage
  DType q_dtype = DType::kF32;
  DType o_dtype = DType::kF32;
  // Output bound; 0 = SEMANTICS.md's bound for the narrowest storage type.
  double bound = 0.0;
};

std::string Describe(const Case& c) {
  std::string s = "B" + std::to_string(c.batch) + " Hq" +
                   std::to_string(c.q_heads) + " Hkv" +
                   std::to_string(c.kv_heads) + " Lq" +
                   std::to_string(c.q_len) + " Lk" + std::to_string(c.kv_len) +
                   " Dk" + std::to_string(c.dk) + " Dv" + std::to_string(c.dv) +
                   (c.layout == Layout::kBSHD ? " bshd" : " bhsd") + " pad" +
                   std::to_string(c.pad);
  if (c.options.causal) {
    s += c.options.alignment == Alignment::kBottomRight ? " causal-br"
                                                        : " causal-tl";
  }
  return s;
}

struct Inputs {
  Tensor q, k, v;
};

// The narrowest storage type among Q, K, V and O (sets the bound).
DType Narrowest(const Case& c) {
  bool f16 = false;
  for (DType t : {c.q_dtype, c.kv_dtype, c.o_dtype}) {
    if (t == DType::kBF16) return DType::kBF16;
    if (t == DType::kF16) f16 = true;
  }
  return f16 ? DType::kF16 : DType::kF32;
}

Inputs MakeInputs(const Case& c, uint32_t seed, float lo = -1.0f,
                  float hi = 1.0f) {
  std::mt19937 rng(seed);
  Inputs in;
  in.q = Tensor(c.q_dtype, c.batch, c.q_heads, c.q_len, c.dk, c.layout,
                c.pad, c.offset);
  in.k = Tensor(c.kv_dtype, c.batch, c.kv_heads, c.kv_len, c.dk, c.layout,
                c.pad, c.offset);
  in.v = Tensor(c.kv_dtype, c.batch, c.kv_heads, c.kv_len, c.dv, c.layout,
                c.pad, c.offset);
  in.q.FillUniform(&rng, lo, hi);
  in.k.FillUniform(&rng, lo, hi);
  in.v.FillUniform(&rng, lo, hi);
  return in;
}

struct Outputs {
  Tensor o;
  std::vector<float> lse;  // dense [B, Hq, Lq]
  RunInfo info;
  Status status;
};

// Sets the K/V packing policy for its lifetime, then restores automatic.
class ScopedPackPolicy {
 public:
  explicit ScopedPackPolicy(PackPolicy p) { SetPackPolicy(p); }
  ~ScopedPackPolicy() { SetPackPolicy(PackPolicy::kAuto); }
};

// Runs the fast path on `target` with a fresh, sentinel-filled output.
Outputs RunFast(const Case& c, const Inputs& in, const std::string& target,
                const ExecutionOptions& exec = {}) {
  Outputs out;
  out.o = Tensor(c.o_dtype, c.batch, c.q_heads, c.q_len, c.dv, c.layout,
                 c.pad, c.offset);
  out.o.FillBytes(0xA5);
  MutableTensorView lse_view;
  if (c.lse) {
    out.lse.assign(static_cast<size_t>(c.batch * c.q_heads * c.q_len), 12345.0f);
    lse_view = MakeBHSD(out.lse.data(), DType::kF32, c.batch, c.q_heads,
                        c.q_len, 1);
  }
  ScopedTarget cap(target);
  out.status = Attention(in.q.View(), in.k.View(), in.v.View(),
                         out.o.MutableView(), c.options, lse_view, exec,
                         &out.info);
  if (out.status.ok()) RecordTargetRun(out.info.target);
  return out;
}

// Pools of 1, 2 and 3 threads, for checking that results do not depend on
// the thread count.
struct ThreePools {
  ThreadPool pools[3] = {ThreadPool(1), ThreadPool(2), ThreadPool(3)};

  // The same call on each pool; every status must be ok.
  std::vector<Outputs> Run(const Case& c, const Inputs& in, const std::string& target) {
    std::vector<Outputs> out;
    for (ThreadPool& pool : pools) {
      ExecutionOptions exec;
      exec.pool = &pool;
      out.push_back(RunFast(c, in, target, exec));
      EXPECT_TRUE(out.back().status.ok()) << out.back().status.message;
    }
    return out;
  }
};

// Checks the padding of o still holds the sentinel (nothing written outside
// the logical elements).
void ExpectPaddingUntouched(const Tensor& o) {
  std::vector<bool> logical(o.bytes.size(), false);
  for (int64_t a = 0; a < o.shape[0]; ++a)
    for (int64_t b = 0; b < o.shape[1]; ++b)
      for (int64_t s = 0; s < o.shape[2]; ++s)
        for (int64_t d = 0; d < o.shape[3]; ++d)
          for (int64_t i = 0; i < DTypeSize(o.dtype); ++i)
            logical[o.Index(a, b, s, d) * DTypeSize(o.dtype) + i] = true;
  size_t bad = 0;
  for (size_t i = 0; i < o.bytes.size(); ++i) {
    if (!logical[i] && o.bytes[i] != 0xA5) ++bad;
  }
  EXPECT_EQ(bad, 0u) << "bytes outside the logical output were written";
}

// The task count reveals the vector width of the code that ran (one task per
// block of up to 4 vectors of query rows), so a target reported under the
// wrong name fails here. SVE widths depend on the CPU and are not checked.
void ExpectBlockSizeOfTarget(const Case& c, const RunInfo& info) {
  const std::string t = info.target;
  int64_t lanes = 0;
  if (t == "AVX3_BF16" || t == "AVX3_DL" || t == "AVX3") lanes = 16;
  if (t == "AVX2") lanes = 8;
  if (t == "SSE4" || t == "SSSE3" || t == "NEON" || t == "SVE2_128") lanes = 4;
  if (t == "SVE_256") lanes = 8;
  if (t == "SCALAR") lanes = 1;
  if (lanes == 0) return;
  // Blocks of 4 vectors over the G * Lq rows of each KV group; calls with at
  // most 16 queries split more than 512 keys into chunks of 512, 1024 or
  // 2048 keys: the longest that leave at least 64 tasks (lib/api.cc).
  const int64_t group_rows = c.q_heads / c.kv_heads * c.q_len;
  // Halved, down to one vector, while a group fills at most half a block.
  int64_t rows = 4 * lanes;
  while (group_rows * 2 <= rows && rows / 2 >= lanes) rows /= 2;
  const int64_t groups = c.batch * c.kv_heads * ((group_rows + rows - 1) / rows);
  int64_t chunks = 1;
  if (c.q_len <= 16 && c.kv_len > 512) {
    int64_t chunk = 512;
    while (chunk < 2048 && groups * ((c.kv_len + 2 * chunk - 1) / (2 * chunk)) >= 64) {
      chunk *= 2;
    }
    const int64_t min_chunk = (c.kv_len + 255) / 256;
    chunk = std::max<int64_t>(chunk, (min_chunk + 63) / 64 * 64);
    chunks = (c.kv_len + chunk - 1) / chunk;
  }
  EXPECT_EQ(info.num_tasks, groups * chunks) << "target " << t;
}

// Compares the fast path on every available target with the reference.
void CheckAllTargets(const Case& c, const Inputs& in) {
  SCOPED_TRACE(Describe(c));
  std::vector<double> o_ref, lse_ref;
  const Status rs = ReferenceAttention(in.q.View(), in.k.View(), in.v.View(),
                                       c.options, &o_ref, &lse_ref);
  ASSERT_TRUE(rs.ok()) << rs.message;
  const double max_v = MaxAbs(in.v);
  // Prefill calls with several query blocks per group run once against a
  // packed copy of K/V and once in place.
  for (PackPolicy pack : {PackPolicy::kAlways, PackPolicy::kNever})
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(std::string(pack == PackPolicy::kAlways ? "packed" : "in place") +
                 " target " + target);
    ScopedPackPolicy policy(pack);
    const Outputs out = RunFast(c, in, target);
    ASSERT_TRUE(out.status.ok()) << out.status.message;
    EXPECT_EQ(std::string(out.info.target), target);
    ExpectBlockSizeOfTarget(c, out.info);
    // The bound of the narrowest storage type (SEMANTICS.md); Q and O are f32.
    EXPECT_LE(MaxError(out.o, o_ref, max_v),
              c.bound > 0.0 ? c.bound : OutputBound(Narrowest(c)));
    ExpectPaddingUntouched(out.o);
    if (c.lse) {
      double lse_err = 0.0;
      for (size_t i = 0; i < lse_ref.size(); ++i) {
        if (std::isinf(lse_ref[i])) {
          EXPECT_EQ(out.lse[i], static_cast<float>(lse_ref[i])) << "row " << i;
          continue;
        }
        const double e = std::fabs(out.lse[i] - lse_ref[i]);
        if (!(e <= lse_err)) lse_err = std::isnan(e) ? INFINITY : e;
      }
      // LSE: 1e-4 when Q and K are f32, 1e-2 otherwise (SEMANTICS.md).
      EXPECT_LE(lse_err, c.kv_dtype == DType::kF32 && c.q_dtype == DType::kF32
                             ? kLseBound
                             : 1e-2);
    }
  }
}

TEST(AttentionTest, WorkedExample) {
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
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target);
    const Outputs out = RunFast(c, in, target);
    ASSERT_TRUE(out.status.ok()) << out.status.message;
    EXPECT_NEAR(out.o.Get(0, 0, 0, 0), 0.5f, 2e-5 * 4);
    EXPECT_NEAR(out.o.Get(0, 0, 0, 1), 3.0f, 2e-5 * 4);
    EXPECT_NEAR(out.lse[0], std::log(4.0), kLseBound);
  }
  CheckAllTargets(c, in);
}

// A case whose every query row has score logits[j] for key j (Q = 1, K the
// logits, scale 1) and whose V is the identity (Dv = Lk), so that each
// output row is the row's softmax weights.
struct LogitRows {
  Case c;
  Inputs in;
};
LogitRows MakeLogitRows(int64_t lq, const std::vector<float>& logits, uint32_t seed) {
  const int64_t keys = static_cast<int64_t>(logits.size());
  Case c;
  c.q_len = lq;
  c.kv_len = keys;
  c.dk = 1;
  c.dv = keys;
  c.options.scale = 1.0f;
  Inputs in = MakeInputs(c, seed);
  for (int64_t i = 0; i < lq; ++i) in.q.Set(0, 0, i, 0, 1.0f);
  for (int64_t j = 0; j < keys; ++j) {
    in.k.Set(0, 0, j, 0, logits[static_cast<size_t>(j)]);
    for (int64_t e = 0; e < keys; ++e) in.v.Set(0, 0, j, e, j == e ? 1.0f : 0.0f);
  }
  return {c, std::move(in)};
}

// Weights below f32's normal range come out as +0.0, never subnormal (x86
// multiplies that make a subnormal take a slow microcode path). With V the
// identity, each output row is the row's weights; the scores put weights
// on both sides of 2^-126 (exp(-87.34)), through the decode path (Lq 1)
// and the tiled one (Lq 32).
TEST(AttentionTest, WeightsBelowTheNormalRangeAreZeroNotSubnormal) {
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
TEST(AttentionTest, WeightsAreExpOfTheScoresWithinAFewUlps) {
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

// Lq x Lk over {1, 2, 7, 16, 17, 63, 64, 65, 129, 1000} with the head dims
// {1, 8, ..., 576} assigned in rotation; pairs whose reference cost exceeds
// the budget are left out (quick mode, under qemu, keeps the cheap half).
TEST(AttentionTest, SweepLengthsAndHeadDims) {
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
      CheckAllTargets(c, MakeInputs(c, 100 + n));
      ++run;
    }
  }
  EXPECT_GE(run, QuickMode() ? 30 : 80);
}

TEST(AttentionTest, EveryHeadDimAgainstTileEdges) {
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
    CheckAllTargets(c, MakeInputs(c, 300 + n++));
  }
}

TEST(AttentionTest, DifferentQkAndVHeadDims) {
  const int64_t pairs[][2] = {{192, 128}, {576, 512}, {8, 3}, {3, 40}, {64, 1}};
  int n = 0;
  for (const auto& p : pairs) {
    Case c;
    c.q_len = 19;
    c.kv_len = 70;
    c.dk = p[0];
    c.dv = p[1];
    CheckAllTargets(c, MakeInputs(c, 400 + n++));
  }
}

TEST(AttentionTest, GroupedQueryHeads) {
  for (int64_t kv_heads : {8, 2, 1}) {  // groups 1, 4, 8
    Case c;
    c.batch = 2;
    c.q_heads = 8;
    c.kv_heads = kv_heads;
    c.q_len = 9;
    c.kv_len = 33;
    c.dk = 16;
    c.dv = 24;
    CheckAllTargets(c, MakeInputs(c, 500 + static_cast<uint32_t>(kv_heads)));
  }
}

TEST(AttentionTest, LayoutsPaddedStridesAndMisalignedBase) {
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
      CheckAllTargets(c, MakeInputs(c, 600 + n++));
    }
  }
}

TEST(AttentionTest, LargeOutputAlignedAndOffTheCacheLine) {
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
    CheckAllTargets(c, MakeInputs(c, 650 + static_cast<uint32_t>(offset)));
  }
}

TEST(AttentionTest, CausalBothAlignmentsWithUnequalLengths) {
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
      CheckAllTargets(c, MakeInputs(c, 700 + n++));
    }
  }
}

TEST(AttentionTest, FullyHiddenRowsGiveZerosAndMinusInfLse) {
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
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target);
    const Outputs out = RunFast(c, in, target);
    ASSERT_TRUE(out.status.ok()) << out.status.message;
    for (int64_t i = 0; i < 30; ++i) {
      for (int64_t d = 0; d < 8; ++d) EXPECT_EQ(out.o.Get(0, 0, i, d), 0.0f);
      EXPECT_EQ(out.lse[i], -std::numeric_limits<float>::infinity());
    }
    for (int64_t i = 30; i < 40; ++i) EXPECT_TRUE(std::isfinite(out.lse[i]));
  }
  CheckAllTargets(c, in);
}

TEST(AttentionTest, LargeLogitsNeedMaxSubtraction) {
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

TEST(AttentionTest, NanInKeyRowPropagatesOnlyToRowsThatSeeIt) {
  Case c;
  c.q_len = 20;
  c.kv_len = 20;
  c.dk = 8;
  c.dv = 8;
  c.options.causal = true;  // rows i < 12 never see key 12
  Inputs in = MakeInputs(c, 1000);
  in.k.Set(0, 0, 12, 3, std::numeric_limits<float>::quiet_NaN());
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target);
    const Outputs out = RunFast(c, in, target);
    ASSERT_TRUE(out.status.ok()) << out.status.message;
    for (int64_t i = 0; i < 20; ++i) {
      for (int64_t d = 0; d < 8; ++d) {
        if (i < 12) {
          EXPECT_TRUE(std::isfinite(out.o.Get(0, 0, i, d))) << i;
        } else {
          EXPECT_TRUE(std::isnan(out.o.Get(0, 0, i, d))) << i;
        }
      }
    }
  }
}

TEST(AttentionTest, InfInValueRowStaysInItsRows) {
  Case c;
  c.q_len = 8;
  c.kv_len = 8;
  c.dk = 4;
  c.dv = 4;
  c.options.causal = true;
  Inputs in = MakeInputs(c, 1100);
  in.v.Set(0, 0, 5, 2, std::numeric_limits<float>::infinity());
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target);
    const Outputs out = RunFast(c, in, target);
    ASSERT_TRUE(out.status.ok()) << out.status.message;
    for (int64_t i = 0; i < 8; ++i) {
      const float x = out.o.Get(0, 0, i, 2);
      if (i < 5) {
        EXPECT_TRUE(std::isfinite(x)) << i;
      } else {
        EXPECT_TRUE(std::isinf(x)) << i;
      }
      EXPECT_TRUE(std::isfinite(out.o.Get(0, 0, i, 1))) << i;
    }
  }
}

// Several query blocks per group: K/V go through the packed copy, whose
// tiles start and end on groups of 4 or 8 keys. Windows that start between
// them, valid lengths and head dims off those groups, every KV type.
TEST(AttentionTest, PackedTilesAtWindowAndLengthEdges) {
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
      CheckAllTargets(c, MakeInputs(c, 1150 + n++));
    }
  }
}

// The same path with Inf in V: rows whose window holds the key get Inf or
// NaN in that value dim, every other row (including those whose packed tile
// starts a few keys before their window) stays finite.
TEST(AttentionTest, PackedTilesKeepInfInItsRows) {
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

// A host engine's parallel-for: runs the tasks in reverse on its own threads.
void ReverseParallelFor(void* user, int64_t num_tasks,
                        void (*task)(void*, int64_t), void* arg) {
  int* calls = static_cast<int*>(user);
  ++*calls;
  std::thread t([&] {
    for (int64_t i = num_tasks - 1; i >= 0; i -= 2) task(arg, i);
  });
  for (int64_t i = num_tasks - 2; i >= 0; i -= 2) task(arg, i);
  t.join();
}

// A host parallel-for that, like a work-stealing runtime, runs unrelated
// work on the calling thread while a call's tasks are pending: here, once
// per round of tasks, another Attention() call of the same shape with other
// inputs, before running the round's tasks itself.
struct StealingHost {
  const Case* c;
  const Inputs* other;
  Tensor* other_o;
  int nested = 0;
  bool nested_ok = true;
};

void StealingParallelFor(void* user, int64_t num_tasks,
                         void (*task)(void*, int64_t), void* arg) {
  StealingHost* h = static_cast<StealingHost*>(user);
  if (h->nested < 4) {
    ++h->nested;
    ThreadPool inline_pool(1);
    ExecutionOptions exec;
    exec.pool = &inline_pool;
    h->nested_ok &= Attention(h->other->q.View(), h->other->k.View(),
                              h->other->v.View(), h->other_o->MutableView(),
                              h->c->options, {}, exec)
                        .ok();
  }
  for (int64_t i = 0; i < num_tasks; ++i) task(arg, i);
}

// The calling thread's buffers (packed K/V, split partials) belong to one
// call at a time: a call nested on that thread gets its own.
TEST(AttentionTest, CallNestedOnTheCallingThreadKeepsItsOwnBuffers) {
  for (int64_t q_len : {int64_t{1}, int64_t{70}}) {  // split decode, prefill
    Case c;
    c.q_heads = 4;
    c.kv_heads = 2;
    c.q_len = q_len;
    c.kv_len = QuickMode() ? 700 : 1500;  // split into 2 or 3 chunks
    c.dk = 16;
    c.dv = 16;
    c.kv_dtype = DType::kF16;
    const Inputs in = MakeInputs(c, 1180), other = MakeInputs(c, 1181);
    std::vector<double> ref, other_ref;
    ASSERT_TRUE(ReferenceAttention(in.q.View(), in.k.View(), in.v.View(),
                                   c.options, &ref, nullptr).ok());
    ASSERT_TRUE(ReferenceAttention(other.q.View(), other.k.View(), other.v.View(),
                                   c.options, &other_ref, nullptr).ok());
    Tensor o(DType::kF32, 1, 4, q_len, 16), other_o(DType::kF32, 1, 4, q_len, 16);
    StealingHost host{&c, &other, &other_o};
    ExecutionOptions exec;
    exec.parallel_for = &StealingParallelFor;
    exec.parallel_for_user = &host;
    ScopedPackPolicy policy(PackPolicy::kAlways);
    ASSERT_TRUE(Attention(in.q.View(), in.k.View(), in.v.View(), o.MutableView(),
                          c.options, {}, exec).ok());
    EXPECT_GE(host.nested, 2);  // a nested call in each round of tasks
    EXPECT_TRUE(host.nested_ok);
    EXPECT_LE(MaxError(o, ref, MaxAbs(in.v)), OutputBound(DType::kF16));
    EXPECT_LE(MaxError(other_o, other_ref, MaxAbs(other.v)), OutputBound(DType::kF16));
  }
}

TEST(AttentionTest, BitIdenticalForAnyThreadCount) {
  Case c;
  c.batch = 2;
  c.q_heads = 4;
  c.kv_heads = 2;
  c.q_len = QuickMode() ? 70 : 150;
  c.kv_len = QuickMode() ? 90 : 300;
  c.dk = 64;
  c.dv = 64;
  c.options.causal = true;
  const Inputs in = MakeInputs(c, 1200);
  ThreadPool pool1(1), pool2(2), pool3(3);
  for (PackPolicy pack : {PackPolicy::kAlways, PackPolicy::kNever})
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target + (pack == PackPolicy::kAlways ? " packed" : " in place"));
    ScopedPackPolicy policy(pack);
    ExecutionOptions e1, e2, e3, ehost;
    e1.pool = &pool1;
    e2.pool = &pool2;
    e3.pool = &pool3;
    int calls = 0;
    ehost.parallel_for = &ReverseParallelFor;
    ehost.parallel_for_user = &calls;
    const Outputs o1 = RunFast(c, in, target, e1);
    const Outputs o2 = RunFast(c, in, target, e2);
    const Outputs o3 = RunFast(c, in, target, e3);
    const Outputs oh = RunFast(c, in, target, ehost);
    ASSERT_TRUE(o1.status.ok() && o2.status.ok() && o3.status.ok() &&
                oh.status.ok());
    EXPECT_GE(calls, 1);  // the host's parallel-for ran the tasks
    EXPECT_GT(o1.info.num_tasks, 3);
    EXPECT_EQ(o1.o.bytes, o2.o.bytes);
    EXPECT_EQ(o1.o.bytes, o3.o.bytes);
    EXPECT_EQ(o1.o.bytes, oh.o.bytes);
    EXPECT_EQ(o1.lse, o2.lse);
    EXPECT_EQ(o1.lse, o3.lse);
    EXPECT_EQ(o1.lse, oh.lse);
  }
}

// Many (batch, KV head) groups of several query blocks each: the threads
// take whole groups at a time and the last groups block by block (RunWave in
// lib/api.cc). Every block must run exactly once, for 1, 2 and 3 threads.
TEST(AttentionTest, ManyGroupsInRunsForAnyThreadCount) {
  Case c;
  c.batch = 2;
  c.q_heads = 32;
  c.kv_heads = 32;  // 64 groups: at least 16 per thread with 3 threads
  // Under qemu fewer rows (still 2 blocks of 64 rows or more of smaller
  // ones) and narrower heads keep it short.
  c.q_len = QuickMode() ? 70 : 130;
  c.kv_len = c.q_len;
  c.dk = QuickMode() ? 8 : 16;
  c.dv = c.dk;
  c.options.causal = true;
  const Inputs in = MakeInputs(c, 1250);
  CheckAllTargets(c, in);
  ThreePools pools;
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target);
    const std::vector<Outputs> o = pools.Run(c, in, target);
    EXPECT_GT(o[0].info.num_tasks, 64);  // several blocks per group
    EXPECT_EQ(o[0].o.bytes, o[1].o.bytes);
    EXPECT_EQ(o[0].o.bytes, o[2].o.bytes);
  }
}

// Views that are not plain layouts: a reversed sequence axis (negative
// stride) for Q and O, and K/V shared by every batch entry (stride 0).
TEST(AttentionTest, NegativeAndZeroStrides) {
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

// A host that calls Attention() from inside a task of the same pool (e.g. a
// per-request task) must not deadlock; the inner call runs inline.
TEST(AttentionTest, NestedCallOnTheSamePool) {
  Case c;
  c.q_heads = 4;
  c.q_len = 40;
  c.kv_len = 50;
  c.dk = 16;
  c.dv = 16;
  const Inputs in = MakeInputs(c, 1500);
  std::vector<double> o_ref;
  ASSERT_TRUE(ReferenceAttention(in.q.View(), in.k.View(), in.v.View(),
                                 c.options, &o_ref, nullptr).ok());
  ThreadPool pool(2);
  struct Job {
    const Case* c;
    const Inputs* in;
    ThreadPool* pool;
    Tensor o[3];
    Status status[3];
  } job{&c, &in, &pool, {}, {}};
  for (Tensor& o : job.o) o = Tensor(DType::kF32, 1, 4, 40, 16);
  pool.ParallelFor(3, [](void* arg, int64_t i) {
    Job* j = static_cast<Job*>(arg);
    ExecutionOptions exec;
    exec.pool = j->pool;
    j->status[i] = Attention(j->in->q.View(), j->in->k.View(), j->in->v.View(),
                             j->o[i].MutableView(), j->c->options, {}, exec);
  }, &job);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(job.status[i].ok()) << job.status[i].message;
    EXPECT_LE(MaxError(job.o[i], o_ref, MaxAbs(in.v)), OutputBound(DType::kF32));
  }
}

// The pool's workers spin for a while after a call, then sleep: calls in
// quick succession (a spinning worker picks them up), calls after a pause
// longer than the spin (a sleeping worker must be woken), and calls from two
// threads at once (serialized) must each run every task exactly once and
// return only after all of them finished.
TEST(ThreadPoolTest, EveryTaskRunsOnceWhetherWorkersSpinOrSleep) {
  ThreadPool pool(3);
  ASSERT_EQ(pool.num_threads(), 3);
  struct Call {
    std::atomic<int> runs[16];
    std::atomic<int> unfinished{0};
  };
  const auto task = [](void* arg, int64_t i) {
    Call* c = static_cast<Call*>(arg);
    // Tasks take different times, so that the threads finish apart.
    if (i % 5 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50 * (i % 3)));
    c->runs[i].fetch_add(1);
    c->unfinished.fetch_sub(1);
  };
  const auto run_calls = [&](int calls, int seed, int* failures) {
    for (int n = 0; n < calls; ++n) {
      Call c;
      const int tasks = 1 + (n * 7 + seed) % 16;
      for (auto& r : c.runs) r.store(0);
      c.unfinished.store(tasks);
      pool.ParallelFor(tasks, task, &c);
      bool ok = c.unfinished.load() == 0;  // all finished before the return
      for (int i = 0; i < 16; ++i) ok &= c.runs[i].load() == (i < tasks ? 1 : 0);
      if (!ok) ++*failures;
      // Now and then a pause well past the spin, so that workers sleep.
      if (n % 10 == 9) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };
  int failures = 0;
  run_calls(200, 0, &failures);
  EXPECT_EQ(failures, 0);
  int failures_a = 0, failures_b = 0;
  std::thread other([&] { run_calls(100, 3, &failures_b); });
  run_calls(100, 1, &failures_a);
  other.join();
  EXPECT_EQ(failures_a, 0);
  EXPECT_EQ(failures_b, 0);
}

TEST(AttentionTest, DefaultScaleIsInverseSqrtHeadDim) {
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


// ---------------------------------------------------------------- variants
// Every SEMANTICS.md option inside the fused kernel, alone and combined.

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
      CheckAllTargets(c, MakeInputs(c, 2000 + n++));
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
      CheckAllTargets(c, MakeInputs(c, 2050 + n++, -1.1f, 1.1f));
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
        CheckAllTargets(c, MakeInputs(c, 2100 + n++));
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
      CheckAllTargets(c, MakeInputs(c, 2200 + n++, -2.0f, 2.0f));
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
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target);
    const Outputs out = RunFast(c, in, target);
    ASSERT_TRUE(out.status.ok()) << out.status.message;
    for (int64_t i = 0; i < 15; ++i) {
      EXPECT_EQ(out.lse[i], 1.5f);
      for (int64_t e = 0; e < c.dv; ++e) EXPECT_EQ(out.o.Get(0, 0, i, e), 0.0f);
    }
  }
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
      SCOPED_TRACE(testing::Message() << "f16 " << f16 << " window " << window);
      for (const std::string& target : TestTargets()) {
        SCOPED_TRACE(target);
        const Outputs out = RunFast(m, in, target);
        ASSERT_TRUE(out.status.ok()) << out.status.message;
        for (int64_t h = 0; h < 2; ++h)
          for (int64_t i = 0; i < 120; ++i)
            for (int64_t e = 0; e < 8; ++e)
              ASSERT_TRUE(std::isfinite(out.o.Get(0, h, i, e))) << h << " " << i;
      }
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
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target);
    const Outputs out = RunFast(c, in, target);
    ASSERT_TRUE(out.status.ok()) << out.status.message;
    for (int64_t i = 0; i < 8; ++i) {
      EXPECT_EQ(std::isfinite(out.o.Get(0, 0, i, 1)), i % 2 == 0) << i;
      EXPECT_TRUE(std::isfinite(out.o.Get(0, 0, i, 0))) << i;
    }
  }
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
        c.options.window_left = 16;
        c.options.sinks = sinks;
        break;
      case 1:  // mask + ALiBi + softcap
        c.options.mask = bias.View();
        c.options.alibi_slopes = slopes;
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
    CheckAllTargets(c, MakeInputs(c, 2601 + n++, -1.5f, 1.5f));
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
      c.options.dropout_p = p;
      c.options.dropout_seed = 0x123456789ull + n;
      CheckAllTargets(c, MakeInputs(c, 2700 + n++));
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

TEST(VariantTest, DropoutBitIdenticalForAnyThreadCount) {
  Case c;
  c.batch = 2;
  c.q_heads = 3;
  c.q_len = 70;
  c.kv_len = 130;
  c.dk = 16;
  c.dv = 16;
  c.options.dropout_p = 0.25f;
  c.options.dropout_seed = 99;
  c.options.window_left = 50;
  const Inputs in = MakeInputs(c, 2900);
  ThreadPool pool1(1), pool3(3);
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target);
    ExecutionOptions e1, e3;
    e1.pool = &pool1;
    e3.pool = &pool3;
    const Outputs o1 = RunFast(c, in, target, e1);
    const Outputs o3 = RunFast(c, in, target, e3);
    ASSERT_TRUE(o1.status.ok() && o3.status.ok());
    EXPECT_EQ(o1.o.bytes, o3.o.bytes);
  }
}

// ---------------------------------------------------------------- KV types
// f32 queries against an f16 or bf16 KV cache (the usual engine set-up).

TEST(KvTypeTest, HalfPrecisionKvCache) {
  int n = 0;
  for (DType kv : {DType::kF16, DType::kBF16}) {
    for (int shape = 0; shape < 4; ++shape) {
      Case c;
      c.kv_dtype = kv;
      c.batch = 2;
      c.q_heads = 8;
      c.kv_heads = shape == 1 ? 1 : 4;
      c.q_len = shape == 3 ? 1 : 23;
      c.kv_len = shape == 3 ? 300 : 77;
      c.dk = shape == 2 ? 72 : 64;
      c.dv = shape == 2 ? 40 : 64;
      c.layout = shape % 2 ? Layout::kBSHD : Layout::kBHSD;
      c.pad = shape == 2 ? 3 : 0;
      c.options.causal = shape >= 1;
      c.options.alignment = Alignment::kBottomRight;
      // The kernel widens K/V exactly and never rounds P, so it is held to the
      // f32 bound, tighter than SEMANTICS.md's 2e-3 (f16) / 1.6e-2 (bf16).
      c.bound = OutputBound(DType::kF32);
      CheckAllTargets(c, MakeInputs(c, 3000 + n++));
    }
  }
}

TEST(KvTypeTest, HalfPrecisionKvWithVariants) {
  float sinks[4] = {0.5f, -1.0f, 1.0f, 0.0f};
  int64_t lens[2] = {90, 41};
  int n = 0;
  for (DType kv : {DType::kF16, DType::kBF16}) {
    Case c;
    c.kv_dtype = kv;
    c.batch = 2;
    c.q_heads = 4;
    c.kv_heads = 2;
    c.q_len = 30;
    c.kv_len = 90;
    c.dk = 32;
    c.dv = 32;
    c.options.kv_lengths = lens;
    c.options.window_left = 20;
    c.options.sinks = sinks;
    c.options.dropout_p = 0.1f;
    c.options.dropout_seed = 5;
    CheckAllTargets(c, MakeInputs(c, 3100 + n++));
  }
}

// f16 Inf in V reaches the rows that use it on every target (Highway's
// software f16 conversion would give 65536 on SSSE3/SSE4/SCALAR).
TEST(KvTypeTest, F16InfinityStaysInfinite) {
  Case c;
  c.kv_dtype = DType::kF16;
  c.q_len = 6;
  c.kv_len = 6;
  c.dk = 4;
  c.dv = 20;  // a full vector and a tail on every target
  c.options.causal = true;
  Inputs in = MakeInputs(c, 3200);
  in.v.Set(0, 0, 3, 17, std::numeric_limits<float>::infinity());
  in.v.Set(0, 0, 3, 2, -std::numeric_limits<float>::infinity());
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target);
    const Outputs out = RunFast(c, in, target);
    ASSERT_TRUE(out.status.ok()) << out.status.message;
    for (int64_t i = 0; i < 6; ++i) {
      EXPECT_EQ(std::isinf(out.o.Get(0, 0, i, 17)), i >= 3) << i;
      EXPECT_EQ(std::isinf(out.o.Get(0, 0, i, 2)), i >= 3) << i;
      EXPECT_TRUE(std::isfinite(out.o.Get(0, 0, i, 5))) << i;
    }
  }
}

// Every f16 bit pattern in V reaches the output as F16ToF32 gives it (NaN
// as NaN) on every target, through the tiled kernel and the decode path:
// each query sees one key, whose weight is 1. SSSE3 and SSE4 widen f16 with
// LoadF16Soft's integer vector code, SCALAR with F16ToF32, the others in
// hardware.
TEST(KvTypeTest, F16EveryBitPatternWidensExactly) {
  constexpr int64_t kRows = 1024, kCols = 64;  // 65536 patterns
  for (const bool decode : {false, true}) {
    Case c;
    c.kv_dtype = DType::kF16;
    c.dk = 4;
    c.dv = kCols;
    c.lse = false;
    // Tiled: query i sees only key i (a window of 0). Decode: one query and
    // one key per batch.
    if (decode) {
      c.batch = kRows;
    } else {
      c.q_len = kRows;
      c.kv_len = kRows;
      c.options.window_left = 0;
      c.options.window_right = 0;
    }
    Inputs in = MakeInputs(c, 3250 + (decode ? 1 : 0));
    const auto at = [decode](const Tensor& t, int64_t row, int64_t col) {
      return t.Index(decode ? row : 0, 0, decode ? 0 : row, col);
    };
    for (int64_t row = 0; row < kRows; ++row) {
      for (int64_t col = 0; col < kCols; ++col) {
        const uint16_t h = static_cast<uint16_t>(row * kCols + col);
        std::memcpy(in.v.bytes.data() + at(in.v, row, col) * 2, &h, 2);
      }
    }
    for (const std::string& target : TestTargets()) {
      SCOPED_TRACE(target + (decode ? " decode" : " tiled"));
      const Outputs out = RunFast(c, in, target);
      ASSERT_TRUE(out.status.ok()) << out.status.message;
      int64_t wrong = 0;
      for (int64_t row = 0; row < kRows; ++row) {
        for (int64_t col = 0; col < kCols; ++col) {
          const uint16_t h = static_cast<uint16_t>(row * kCols + col);
          const float want = F16ToF32(h);
          float got;
          std::memcpy(&got, out.o.bytes.data() + at(out.o, row, col) * 4, 4);
          if (std::isnan(want) ? std::isnan(got) : got == want) continue;
          if (++wrong <= 5) ADD_FAILURE() << "f16 0x" << std::hex << h << ": " << got;
        }
      }
      EXPECT_EQ(wrong, 0);
    }
  }
}

// Q, K, V and O all in f16 or bf16 (and mixed), f32 math inside.
TEST(KvTypeTest, SixteenBitQueriesAndOutputs) {
  int n = 0;
  for (DType t : {DType::kF16, DType::kBF16}) {
    for (int mix = 0; mix < 3; ++mix) {
      Case c;
      c.q_dtype = t;
      c.kv_dtype = mix == 1 ? DType::kF32 : t;
      c.o_dtype = mix == 2 ? DType::kF32 : t;
      c.batch = 2;
      c.q_heads = 4;
      c.kv_heads = 2;
      c.q_len = 40;
      c.kv_len = 70;
      c.dk = 48;
      c.dv = 24;
      c.layout = mix == 1 ? Layout::kBSHD : Layout::kBHSD;
      c.options.causal = mix != 0;
      CheckAllTargets(c, MakeInputs(c, 3300 + n++));
    }
  }
}

// bf16 Q, K and V: the AVX3_BF16 entry runs both products on vdpbf16ps,
// with P rounded to bf16 (other targets widen exactly), held to the bf16
// bound. The cases pad the pairs (odd Dk, odd key counts, tiles that start
// on an odd key), give Dv with and without a tail of the 32-dim pairing
// loop, and cover each option, GQA, split keys and a bf16 output.
TEST(KvTypeTest, Bf16QueriesKeysAndValuesWithEveryOption) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float sinks[4] = {0.5f, neg_inf, -1.0f, 2.0f};
  float slopes[4] = {0.05f, 0.01f, 0.2f, 0.0f};
  int64_t lens[2] = {90, 41};
  std::mt19937 rng(3400);
  Tensor mask(DType::kBool, 1, 1, 20, 129);
  for (int64_t i = 0; i < 20; ++i)
    for (int64_t j = 0; j < 129; ++j) mask.Set(0, 0, i, j, rng() % 4 != 0 ? 1.0f : 0.0f);
  for (int which = 0; which < 6; ++which) {
    SCOPED_TRACE(testing::Message() << "case " << which);
    Case c;
    c.q_dtype = DType::kBF16;
    c.kv_dtype = DType::kBF16;
    c.layout = which % 2 ? Layout::kBSHD : Layout::kBHSD;
    switch (which) {
      case 0:  // odd Dk and Lk, GQA, bottom-right causal
        c.q_heads = 4, c.kv_heads = 2, c.q_len = 37, c.kv_len = 77;
        c.dk = 7, c.dv = 40;
        c.options.causal = true;
        c.options.alignment = Alignment::kBottomRight;
        break;
      case 1:  // wide heads, a window starting tiles on odd keys
        c.q_len = 70, c.kv_len = 300, c.dk = 128, c.dv = 136;
        c.options.window_left = 51;
        c.options.window_right = 10;
        break;
      case 2:  // bool mask, ALiBi and softcap
        c.q_heads = 2, c.q_len = 20, c.kv_len = 129, c.dk = 33, c.dv = 32;
        c.options.mask = mask.View();
        c.options.alibi_slopes = slopes;
        c.options.softcap = 5.0f;
        break;
      case 3:  // kv_lengths (one odd), dropout and sinks with GQA
        c.batch = 2, c.q_heads = 4, c.kv_heads = 2, c.q_len = 40, c.kv_len = 90;
        c.dk = 64, c.dv = 64;
        c.options.kv_lengths = lens;
        c.options.dropout_p = 0.1f;
        c.options.dropout_seed = 9;
        c.options.sinks = sinks;
        break;
      case 4:  // few queries: keys split into chunks merged by their LSE
        c.q_heads = 8, c.kv_heads = 2, c.q_len = 3, c.kv_len = 1501;
        c.dk = 16, c.dv = 24;
        c.options.causal = true;
        c.options.alignment = Alignment::kBottomRight;
        break;
      case 5:  // bf16 output
        c.o_dtype = DType::kBF16;
        c.q_heads = 2, c.q_len = 65, c.kv_len = 65, c.dk = 48, c.dv = 24;
        c.options.causal = true;
        break;
    }
    CheckAllTargets(c, MakeInputs(c, 3400 + which));
  }
}

// Inf and NaN in the bf16 V rows of keys that a causal mask hides stay out
// of the rows that do not see them (the native path falls back to the
// guarded f32 product on such tiles) and reach the rows that do. Two query
// heads share the KV head, so the group has two 64-row blocks on AVX-512 and
// kAlways packs K/V.
TEST(KvTypeTest, Bf16HiddenInfAndNanDoNotLeak) {
  Case c;
  c.q_dtype = DType::kBF16;
  c.kv_dtype = DType::kBF16;
  c.q_heads = 2;
  c.kv_heads = 1;
  c.q_len = 40;
  c.kv_len = 40;
  c.dk = 8;
  c.dv = 20;
  c.options.causal = true;
  Inputs in = MakeInputs(c, 3500);
  in.v.Set(0, 0, 30, 3, std::numeric_limits<float>::infinity());
  in.v.Set(0, 0, 35, 5, std::numeric_limits<float>::quiet_NaN());
  for (PackPolicy pack : {PackPolicy::kAlways, PackPolicy::kNever}) {
    ScopedPackPolicy policy(pack);
    for (const std::string& target : TestTargets()) {
      SCOPED_TRACE(target);
      const Outputs out = RunFast(c, in, target);
      ASSERT_TRUE(out.status.ok()) << out.status.message;
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t i = 0; i < 40; ++i) {
          EXPECT_EQ(std::isinf(out.o.Get(0, h, i, 3)), i >= 30) << h << " " << i;
          EXPECT_EQ(std::isnan(out.o.Get(0, h, i, 5)), i >= 35) << h << " " << i;
          EXPECT_TRUE(std::isfinite(out.o.Get(0, h, i, 0))) << h << " " << i;
        }
      }
    }
  }
}

// ---------------------------------------------------------------- decode
// Few queries per head against a long KV cache: all query heads of a KV
// group in one block, keys split into chunks merged through their LSE.

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
        CheckAllTargets(c, MakeInputs(c, 4000 + n++));
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
        CheckAllTargets(c, MakeInputs(c, 4050 + n++));
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
      CheckAllTargets(c, MakeInputs(c, 4310 + which));
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
    for (const std::string& target : TestTargets()) {
      SCOPED_TRACE(target);
      const Outputs out = RunFast(c, in, target);
      ASSERT_TRUE(out.status.ok()) << out.status.message;
      for (int64_t h = 0; h < 4; ++h) {
        for (int64_t e = 0; e < dim; ++e) {
          const bool finite = std::isfinite(out.o.Get(0, h, 0, e));
          EXPECT_EQ(finite, h < 3 || e != 700 % dim) << "head " << h << " lane " << e;
        }
      }
    }
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
    CheckAllTargets(c, MakeInputs(c, 4101 + which));
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
      CheckAllTargets(c, MakeInputs(c, 4500 + n++));
    }
  }
}

// With enough KV groups the chunks grow to 1024 and 2048 keys (lib/api.cc
// keeps at least 64 tasks): 16 groups (B2 Hkv8, G 2) x 5 chunks either way,
// the last one short. Checked against the reference on every target (the
// task count there confirms the chunk length) and for bit-identical output
// with 1, 2 and 3 threads.
TEST(DecodeTest, LongerChunksWithManyGroups) {
  ThreePools pools;
  int n = 0;
  for (const int64_t kv_len : {5000, 9000}) {  // chunks of 1024 / 2048 keys
    for (const DType kv : {DType::kF32, DType::kF16, DType::kBF16}) {
      // Quick mode (qemu): 5000 with f32 and bf16, 9000 with f16.
      const int idx = n++;
      if (QuickMode() && idx % 2 == 1) continue;
      Case c;
      c.kv_dtype = kv;
      c.bound = OutputBound(DType::kF32);  // exact widening, f32 math
      c.batch = 2;
      c.q_heads = 16;
      c.kv_heads = 8;
      c.q_len = 1;
      c.kv_len = kv_len;
      c.dk = 64;
      c.dv = 64;
      const Inputs in = MakeInputs(c, 4300 + idx);
      CheckAllTargets(c, in);
      for (const std::string& target : TestTargets()) {
        SCOPED_TRACE(testing::Message() << target << " Lk " << kv_len << " K/V "
                                        << DTypeName(kv));
        const std::vector<Outputs> o = pools.Run(c, in, target);
        EXPECT_EQ(o[0].info.num_tasks, 80);
        EXPECT_EQ(o[0].o.bytes, o[1].o.bytes);
        EXPECT_EQ(o[0].o.bytes, o[2].o.bytes);
        EXPECT_EQ(o[0].lse, o[1].lse);
        EXPECT_EQ(o[0].lse, o[2].lse);
      }
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
        CheckAllTargets(c, MakeInputs(c, 4400 + idx));
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
        size_t i = 0;
        for (int64_t h = 0; h < c.q_heads; ++h) {
          for (int64_t d = 0; d < c.dv; ++d, ++i) {
            const float got = out.o.Get(0, h, 0, d);
            if (std::isnan(o_ref[i])) {
              EXPECT_TRUE(std::isnan(got)) << h << " " << d;
            } else {
              EXPECT_LE(std::fabs(got - o_ref[i]), bound) << h << " " << d;
            }
          }
        }
      }
    }
  }
}

// 8 groups x 7 chunks of 512 keys: 56 tasks, which the threads take in
// runs that shrink from 28 (1 thread), 14 (2) or 10 (3) tasks to 1. Lq 2 runs
// the tiled kernel on each chunk, Lq 1 the decode path (its own partials).
TEST(DecodeTest, BitIdenticalForAnyThreadCount) {
  ThreePools pools;
  // On the decode path f32 K/V take tiles of 4 runs (DecodeTiles), bf16
  // the fused groups of 4 keys (tiles of consecutive keys on SVE and
  // SCALAR); the last chunk (429 keys) also leaves keys under a tile and
  // under a group.
  for (const DType kv : {DType::kBF16, DType::kF32}) {
    for (int64_t q_len : {2, 1}) {
      Case c;
      c.kv_dtype = kv;
      c.batch = 1;
      c.q_heads = 16;
      c.kv_heads = 8;
      c.q_len = q_len;
      c.kv_len = 3501;
      c.dk = q_len == 2 ? 32 : 64;
      c.dv = c.dk;
      const Inputs in = MakeInputs(c, 4200 + q_len);
      for (const std::string& target : TestTargets()) {
        SCOPED_TRACE(testing::Message() << target << " Lq " << q_len << " K/V "
                                        << DTypeName(kv));
        const std::vector<Outputs> o = pools.Run(c, in, target);
        EXPECT_EQ(o[0].info.num_tasks, 56);  // the keys really were split
        EXPECT_EQ(o[0].o.bytes, o[1].o.bytes);
        EXPECT_EQ(o[0].o.bytes, o[2].o.bytes);
        EXPECT_EQ(o[0].lse, o[1].lse);
        EXPECT_EQ(o[0].lse, o[2].lse);
      }
    }
  }
}

}  // namespace
}  // namespace test
}  // namespace simdattn
