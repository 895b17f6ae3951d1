// The harness of the fast-path tests: a Case (shape, layout, storage types,
// options), random inputs for it, one Attention() call on a chosen target,
// and CheckAllTargets, which runs a case on every target under test, packed
// and in place, and holds it to the double-precision reference within the
// bounds of SEMANTICS.md.

#ifndef SIMDATTN_TESTS_ATTENTION_HARNESS_H_
#define SIMDATTN_TESTS_ATTENTION_HARNESS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/packing.h"
#include "simdattn/attention.h"
#include "tests/test_util.h"

namespace simdattn {
namespace test {

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

// The shape, layout and causal alignment of a case, for failure messages.
std::string Describe(const Case& c);

// The narrowest storage type among Q, K, V and O (sets the bound).
DType Narrowest(const Case& c);

struct Inputs {
  Tensor q, k, v;
};

// Q, K and V of the case's shapes and types, uniform in [lo, hi).
Inputs MakeInputs(const Case& c, uint32_t seed, float lo = -1.0f,
                  float hi = 1.0f);

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
                const ExecutionOptions& exec = {});

// Runs the case on every target under test and calls check(out) with each
// output; a call that fails ends the loop with a failure.
template <typename Check>
void ForEachTarget(const Case& c, const Inputs& in, const Check& check) {
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target);
    const Outputs out = RunFast(c, in, target);
    ASSERT_TRUE(out.status.ok()) << out.status.message;
    check(out);
  }
}

// Pools of 1, 2 and 3 threads, for checking that results do not depend on
// the thread count.
struct ThreePools {
  ThreadPool pools[3] = {ThreadPool(1), ThreadPool(2), ThreadPool(3)};

  // The same call on each pool; every status must be ok.
  std::vector<Outputs> Run(const Case& c, const Inputs& in,
                           const std::string& target);
};

// Checks the padding of o still holds the sentinel (nothing written outside
// the logical elements).
void ExpectPaddingUntouched(const Tensor& o);

// Checks the task count and kernel path of a call against the plan MakePlan
// gives it for the target that ran (defined in plan_expect.cc).
void ExpectPlanOfTarget(const Case& c, const Inputs& in, Outputs* out);

// Compares the fast path on every target under test with the reference: O
// within the bound of the narrowest storage type (or c.bound), LSE within
// SEMANTICS.md's bound, nothing written outside O, the task count of the
// target's plan. Calls with several query blocks per group run once against
// a packed copy of K/V and once in place.
void CheckAllTargets(const Case& c, const Inputs& in);

// Random inputs for the case (uniform in [lo, hi), from `seed`), checked on
// every target as CheckAllTargets does.
void CheckCase(const Case& c, uint32_t seed, float lo = -1.0f, float hi = 1.0f);

// A case whose every query row has score logits[j] for key j (Q = 1, K the
// logits, scale 1) and whose V is the identity (Dv = Lk), so that each
// output row is the row's softmax weights.
struct LogitRows {
  Case c;
  Inputs in;
};
LogitRows MakeLogitRows(int64_t lq, const std::vector<float>& logits,
                        uint32_t seed);

}  // namespace test
}  // namespace simdattn

#endif  // SIMDATTN_TESTS_ATTENTION_HARNESS_H_
