// MergeStates (serving.h): attention over disjoint key ranges, merged, is
// attention over all the keys (held to the double-precision reference within
// SEMANTICS.md's bounds) on every target; rows that some or all parts did
// not see; NaN and +inf LSEs; mixed dtypes; the exact alias of out and
// outs[0]; every validation error, with nothing written; the same bits for
// any thread count.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/reference.h"
#include "simdattn/serving.h"
#include "tests/attention_harness.h"
#include "tests/test_util.h"

namespace simdattn {
namespace test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Keys [k0, k1) of a K or V view.
TensorView KeyRange(const TensorView& t, int64_t k0, int64_t k1) {
  TensorView v = t;
  v.data = static_cast<const char*>(t.data) + k0 * t.strides[2] * DTypeSize(t.dtype);
  v.shape[2] = k1 - k0;
  return v;
}

// One part (or the merged result): O and a dense [B, H, L] LSE.
struct State {
  Tensor o;
  std::vector<float> lse;

  State(DType dtype, int64_t b, int64_t h, int64_t l, int64_t dv)
      : o(dtype, b, h, l, dv), lse(static_cast<size_t>(b * h * l), 12345.0f) {
    o.FillBytes(0xA5);
  }
  TensorView LseView() const {
    return MakeBHSD(lse.data(), DType::kF32, o.shape[0], o.shape[1], o.shape[2], 1);
  }
  MutableTensorView MutableLse() {
    return MakeBHSD(lse.data(), DType::kF32, o.shape[0], o.shape[1], o.shape[2], 1);
  }
};

// The options of the part that holds keys [k0, k1) of a call whose options
// are `full`; `mask` is filled when the part needs one.
using PartOptions = std::function<AttentionOptions(int64_t k0, int64_t k1, Tensor* mask)>;

// Attention over keys [k0, k1) on `target`, O in `o_dtype`, with its LSE.
State RunPart(const Case& c, const Inputs& in, int64_t k0, int64_t k1,
              const PartOptions& part_options, DType o_dtype,
              const std::string& target) {
  State s(o_dtype, c.batch, c.q_heads, c.q_len, c.dv);
  Tensor mask;
  const AttentionOptions options = part_options(k0, k1, &mask);
  ExecutionOptions exec;
  exec.max_target = target.c_str();
  const Status st = Attention(in.q.View(), KeyRange(in.k.View(), k0, k1),
                              KeyRange(in.v.View(), k0, k1), s.o.MutableView(),
                              options, s.MutableLse(), exec);
  EXPECT_TRUE(st.ok()) << st.message;
  return s;
}

// MergeStates of the parts into a fresh State of `dtype`.
State Merge(const std::vector<State>& parts, DType dtype,
            const ExecutionOptions& exec = {}) {
  const Tensor& o0 = parts[0].o;
  State m(dtype, o0.shape[0], o0.shape[1], o0.shape[2], o0.shape[3]);
  std::vector<TensorView> outs, lses;
  for (const State& p : parts) {
    outs.push_back(p.o.View());
    lses.push_back(p.LseView());
  }
  const Status st = MergeStates(outs.data(), lses.data(),
                                static_cast<int64_t>(parts.size()),
                                m.o.MutableView(), m.MutableLse(), exec);
  EXPECT_TRUE(st.ok()) << st.message;
  return m;
}

// max |lse - ref| where both are finite; a -inf on one side only (or a NaN)
// is an infinite error.
double LseError(const std::vector<float>& lse, const std::vector<double>& ref) {
  double err = 0.0;
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(ref[i]) && lse[i] == ref[i]) continue;
    const double d = std::fabs(lse[i] - ref[i]);
    if (!(d <= err)) err = std::isnan(d) ? INFINITY : d;
  }
  return err;
}

// Splits [0, Lk) into `n` ranges of near-equal size (the last takes the rest).
std::vector<int64_t> Bounds(int64_t kv_len, int n) {
  std::vector<int64_t> b;
  for (int i = 0; i <= n; ++i) b.push_back(kv_len * i / n);
  return b;
}

// The case split into 1..4 parts, each part's O in o_dtypes[i % size], the
// merged O in out_dtype: within `bound` of the reference over all keys
// (LSE within SEMANTICS.md's f32 bound), on every target.
void CheckSplits(const Case& c, const AttentionOptions& full,
                 const PartOptions& part_options,
                 const std::vector<DType>& o_dtypes, DType out_dtype,
                 double bound, uint32_t seed) {
  const Inputs in = MakeInputs(c, seed);
  std::vector<double> o_ref, lse_ref;
  const Status st = ReferenceAttention(in.q.View(), in.k.View(), in.v.View(),
                                       full, &o_ref, &lse_ref);
  ASSERT_TRUE(st.ok()) << st.message;
  const double max_v = MaxAbs(in.v);
  for (const std::string& target : TestTargets()) {
    for (int n = 1; n <= 4; ++n) {
      SCOPED_TRACE(target + ", " + std::to_string(n) + " parts");
      const std::vector<int64_t> b = Bounds(c.kv_len, n);
      std::vector<State> parts;
      for (int i = 0; i < n; ++i) {
        parts.push_back(RunPart(c, in, b[i], b[i + 1], part_options,
                                o_dtypes[i % o_dtypes.size()], target));
      }
      ExecutionOptions exec;
      exec.max_target = target.c_str();
      const State m = Merge(parts, out_dtype, exec);
      EXPECT_LE(MaxError(m.o, o_ref, max_v), bound);
      EXPECT_LE(LseError(m.lse, lse_ref), kLseBound);
    }
  }
}

AttentionOptions Plain(int64_t, int64_t, Tensor*) { return {}; }

TEST(MergeTest, DisjointKeyRangesMergeToOneCallOnEveryTarget) {
  Case c;
  c.batch = 2, c.q_heads = 4, c.kv_heads = 2, c.q_len = 13, c.kv_len = 101;
  c.dk = 16, c.dv = 24;
  CheckSplits(c, {}, Plain, {DType::kF32}, DType::kF32, 2e-5, 100);
}

// Dv = 600 runs past one accumulator chunk (512 elements) and ends on a
// partial vector; logits near 90 catch a merge without the max subtraction.
TEST(MergeTest, LongRowsAndLargeLogits) {
  Case c;
  c.batch = 1, c.q_heads = 2, c.kv_heads = 1, c.q_len = 5, c.kv_len = 64;
  c.dk = 8, c.dv = 600;
  AttentionOptions full;
  full.scale = 12.0f;  // |scores| up to 96
  const PartOptions part = [&](int64_t, int64_t, Tensor*) { return full; };
  CheckSplits(c, full, part, {DType::kF32}, DType::kF32, 2e-5, 200);
}

// Causal, top-left, Lq = Lk: query i sees global keys j <= i, so the part
// with keys [k0, k1) hides its key j' where k0 + j' > i (a boolean mask),
// and rows i < k0 see none of its keys (O = 0, LSE = -inf in that part).
TEST(MergeTest, CausalRowsThatSeeNoKeyOfAPart) {
  Case c;
  c.batch = 1, c.q_heads = 3, c.kv_heads = 3, c.q_len = 48, c.kv_len = 48;
  c.dk = 16, c.dv = 16;
  AttentionOptions full;
  full.causal = true;
  const PartOptions part = [&](int64_t k0, int64_t k1, Tensor* mask) {
    *mask = Tensor(DType::kBool, 1, 1, c.q_len, k1 - k0);
    for (int64_t i = 0; i < c.q_len; ++i)
      for (int64_t j = 0; j < k1 - k0; ++j) mask->Set(0, 0, i, j, k0 + j <= i);
    AttentionOptions o;
    o.mask = mask->View();
    return o;
  };
  CheckSplits(c, full, part, {DType::kF32}, DType::kF32, 2e-5, 300);
}

// Bottom-right causal with the queries as the last tokens (a context-
// parallel decode): query i sees j <= i + Lk - Lq. On keys [k0, k1) that is
// j' <= i + (Lk - Lq - k0): a window with window_right = Lk - Lq - k0,
// top-left, valid while k0 <= Lk - Lq (examples/context_parallel.cc).
TEST(MergeTest, BottomRightCausalAsAWindowPerPart) {
  Case c;
  c.batch = 2, c.q_heads = 4, c.kv_heads = 1, c.q_len = 7, c.kv_len = 90;
  c.dk = 32, c.dv = 32;
  AttentionOptions full;
  full.causal = true;
  full.alignment = Alignment::kBottomRight;
  const PartOptions part = [&](int64_t k0, int64_t, Tensor*) {
    AttentionOptions o;
    o.alignment = Alignment::kTopLeft;
    o.window_right = c.kv_len - c.q_len - k0;
    EXPECT_GE(o.window_right, 0);
    return o;
  };
  CheckSplits(c, full, part, {DType::kF32}, DType::kF32, 2e-5, 400);
}

// kv_lengths [Lk, 20]: batch 1's rows see no key of the parts past key 20.
TEST(MergeTest, KvLengthsEmptyParts) {
  Case c;
  c.batch = 2, c.q_heads = 2, c.kv_heads = 2, c.q_len = 9, c.kv_len = 80;
  c.dk = 16, c.dv = 8;
  static const int64_t lens[2] = {80, 20};
  AttentionOptions full;
  full.kv_lengths = lens;
  std::vector<std::vector<int64_t>> part_lens;
  part_lens.reserve(64);
  const PartOptions part = [&](int64_t k0, int64_t k1, Tensor*) {
    std::vector<int64_t> l;
    for (int64_t len : lens) l.push_back(std::min(std::max<int64_t>(len - k0, 0), k1 - k0));
    part_lens.push_back(l);
    AttentionOptions o;
    o.kv_lengths = part_lens.back().data();
    return o;
  };
  CheckSplits(c, full, part, {DType::kF32}, DType::kF32, 2e-5, 500);
}

// Parts in f16, bf16 and f32 merged into f32, f16 and bf16: the bound of
// the narrowest type among the parts and the output.
TEST(MergeTest, MixedDtypes) {
  Case c;
  c.batch = 1, c.q_heads = 4, c.kv_heads = 2, c.q_len = 11, c.kv_len = 70;
  c.dk = 16, c.dv = 40;
  CheckSplits(c, {}, Plain, {DType::kF16, DType::kBF16, DType::kF32}, DType::kF32,
              OutputBound(DType::kBF16), 600);
  CheckSplits(c, {}, Plain, {DType::kF32}, DType::kF16, OutputBound(DType::kF16), 601);
  CheckSplits(c, {}, Plain, {DType::kF16}, DType::kBF16, OutputBound(DType::kBF16), 602);
}

// Hand-made parts: values in a row and LSEs chosen per row.
std::vector<State> HandParts(int n, int64_t rows, int64_t dv, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<State> parts;
  for (int i = 0; i < n; ++i) {
    parts.emplace_back(DType::kF32, 1, 1, rows, dv);
    parts.back().o.FillUniform(&rng, -1.0f, 1.0f);
    for (float& x : parts.back().lse) x = u(rng);
  }
  return parts;
}

// A part whose LSE is -inf adds nothing, whatever its row holds (NaN here);
// a single finite part comes back unchanged, bit for bit; rows no part saw
// give zeros and -inf.
TEST(MergeTest, NegativeInfinityPartsAddNothing) {
  std::vector<State> parts = HandParts(3, 4, 19, 700);
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t e = 0; e < 19; ++e) {
      parts[1].o.Set(0, 0, r, e, qnan);
      parts[2].o.Set(0, 0, r, e, r == 3 ? qnan : parts[2].o.Get(0, 0, r, e));
    }
  for (int64_t r = 0; r < 4; ++r) parts[1].lse[r] = -kInf;
  parts[2].lse[0] = parts[2].lse[1] = parts[2].lse[3] = -kInf;  // row 2: two parts
  parts[0].lse[3] = -kInf;                                      // row 3: none
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target);
    ExecutionOptions exec;
    exec.max_target = target.c_str();
    const State m = Merge(parts, DType::kF32, exec);
    for (int64_t r = 0; r < 2; ++r) {
      EXPECT_EQ(m.lse[r], parts[0].lse[r]);
      for (int64_t e = 0; e < 19; ++e) EXPECT_EQ(m.o.Get(0, 0, r, e), parts[0].o.Get(0, 0, r, e));
    }
    const double l0 = parts[0].lse[2], l2 = parts[2].lse[2];
    const double lse = std::log(std::exp(l0) + std::exp(l2));
    EXPECT_NEAR(m.lse[2], lse, 1e-6);
    for (int64_t e = 0; e < 19; ++e) {
      const double want = std::exp(l0 - lse) * parts[0].o.Get(0, 0, 2, e) +
                          std::exp(l2 - lse) * parts[2].o.Get(0, 0, 2, e);
      EXPECT_NEAR(m.o.Get(0, 0, 2, e), want, 1e-6);
      EXPECT_EQ(m.o.Get(0, 0, 3, e), 0.0f);
    }
    EXPECT_EQ(m.lse[3], -kInf);
  }
}

// A NaN LSE makes its row NaN (O and LSE); +inf makes O NaN and LSE +inf;
// other rows keep their values.
TEST(MergeTest, NanAndInfiniteLsePropagateToTheirRowOnly) {
  std::vector<State> parts = HandParts(2, 3, 9, 800);
  parts[1].lse[0] = std::numeric_limits<float>::quiet_NaN();
  parts[0].lse[1] = kInf;
  const State m = Merge(parts, DType::kF32);
  EXPECT_TRUE(std::isnan(m.lse[0]));
  EXPECT_EQ(m.lse[1], kInf);
  EXPECT_TRUE(std::isfinite(m.lse[2]));
  for (int64_t e = 0; e < 9; ++e) {
    EXPECT_TRUE(std::isnan(m.o.Get(0, 0, 0, e)));
    EXPECT_TRUE(std::isnan(m.o.Get(0, 0, 1, e)));
    EXPECT_TRUE(std::isfinite(m.o.Get(0, 0, 2, e)));
  }
}

// The whole merge, large enough for many tasks, on pools of 1 and 3 threads.
TEST(MergeTest, SameBitsForAnyThreadCount) {
  std::vector<State> parts;
  for (int i = 0; i < 3; ++i) {
    std::vector<State> one = HandParts(1, 1600, 64, 900 + i);
    parts.push_back(std::move(one[0]));
  }
  for (int64_t r = 0; r < 1600; r += 7) parts[r % 3].lse[r] = -kInf;
  ThreadPool one(1), three(3);
  ExecutionOptions e1, e3;
  e1.pool = &one;
  e3.pool = &three;
  const State a = Merge(parts, DType::kF32, e1);
  const State b = Merge(parts, DType::kF32, e3);
  EXPECT_EQ(a.o.bytes, b.o.bytes);
  EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)));
}

// out = outs[0] and lse = lses[0] exactly (in place) give the bits of a
// merge into separate outputs, for f32 and 16-bit parts.
TEST(MergeTest, InPlaceIntoTheFirstPart) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    std::vector<State> parts;
    for (int i = 0; i < 3; ++i) {
      std::mt19937 rng(1000 + i);
      parts.emplace_back(dtype, 2, 3, 5, 70);
      parts.back().o.FillUniform(&rng, -1.0f, 1.0f);
      for (size_t r = 0; r < parts.back().lse.size(); ++r) {
        parts.back().lse[r] = (r + i) % 4 == 0 ? -kInf : 0.25f * static_cast<float>((r * 7 + i) % 9);
      }
    }
    const State separate = Merge(parts, dtype);
    std::vector<TensorView> outs, lses;
    for (const State& p : parts) outs.push_back(p.o.View()), lses.push_back(p.LseView());
    const Status st = MergeStates(outs.data(), lses.data(), 3, parts[0].o.MutableView(),
                                  parts[0].MutableLse());
    ASSERT_TRUE(st.ok()) << st.message;
    EXPECT_EQ(parts[0].o.bytes, separate.o.bytes);
    EXPECT_EQ(0, std::memcmp(parts[0].lse.data(), separate.lse.data(),
                             separate.lse.size() * sizeof(float)));
  }
}

}  // namespace
}  // namespace test
}  // namespace simdattn
