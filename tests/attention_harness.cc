// The fast-path test harness (see attention_harness.h).

#include "tests/attention_harness.h"

#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "lib/dtype.h"
#include "lib/reference.h"

namespace simdattn {
namespace test {

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

DType Narrowest(const Case& c) {
  bool f16 = false;
  for (DType t : {c.q_dtype, c.kv_dtype, c.o_dtype}) {
    if (t == DType::kBF16) return DType::kBF16;
    if (t == DType::kF16) f16 = true;
  }
  return f16 ? DType::kF16 : DType::kF32;
}

Inputs MakeInputs(const Case& c, uint32_t seed, float lo, float hi) {
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

Outputs RunFast(const Case& c, const Inputs& in, const std::string& target,
                const ExecutionOptions& exec) {
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

std::vector<Outputs> ThreePools::Run(const Case& c, const Inputs& in,
                                     const std::string& target) {
  std::vector<Outputs> out;
  for (ThreadPool& pool : pools) {
    ExecutionOptions exec;
    exec.pool = &pool;
    out.push_back(RunFast(c, in, target, exec));
    EXPECT_TRUE(out.back().status.ok()) << out.back().status.message;
  }
  return out;
}

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
    Outputs out = RunFast(c, in, target);
    ASSERT_TRUE(out.status.ok()) << out.status.message;
    EXPECT_EQ(std::string(out.info.target), target);
    ExpectPlanOfTarget(c, in, &out);
    // The bound of the narrowest storage type (SEMANTICS.md), or the case's.
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
                             : kLseBound16);
    }
  }
}

void CheckCase(const Case& c, uint32_t seed, float lo, float hi) {
  CheckAllTargets(c, MakeInputs(c, seed, lo, hi));
}

LogitRows MakeLogitRows(int64_t lq, const std::vector<float>& logits,
                        uint32_t seed) {
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

}  // namespace test
}  // namespace simdattn
