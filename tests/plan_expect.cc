// The task count and kernel path of every case that CheckAllTargets runs
// are those MakePlan gives for the target that ran
// (attention_harness.h, ExpectPlanOfTarget).

#include <cstdint>
#include <string>

#include "gtest/gtest.h"
#include "lib/plan.h"
#include "tests/attention_harness.h"

namespace simdattn {
namespace test {
namespace {

// What a target's name says of its kernels: f32 lanes, the fused decode
// loop (not on SVE, whose lane count is not static, nor on SCALAR), f16
// widened in registers (hardware conversion: not SSSE3, SSE4 or SCALAR).
// False for SVE targets, whose width depends on the CPU.
bool CapsOfTarget(const std::string& t, TargetCaps* caps) {
  int64_t lanes = 0;
  if (t == "AVX3_BF16" || t == "AVX3_DL" || t == "AVX3") lanes = 16;
  if (t == "AVX2") lanes = 8;
  if (t == "SSE4" || t == "SSSE3" || t == "NEON") lanes = 4;
  if (t == "SCALAR") lanes = 1;
  if (lanes == 0) return false;
  caps->lanes = lanes;
  caps->fused_decode = t != "SCALAR";
  caps->f16_in_registers = t != "SSE4" && t != "SSSE3" && t != "SCALAR";
  caps->fused_max_dk = 256;
  return true;
}

}  // namespace

// The task count reveals the vector width of the code that ran (one task
// per block of up to 4 vectors of query rows), so a target reported under
// the wrong name fails here.
void ExpectPlanOfTarget(const Case& c, const Inputs& in, Outputs* out) {
  TargetCaps caps;
  if (!CapsOfTarget(out->info.target, &caps)) return;
  Plan plan;
  const Status s = PlanCall(in.q.View(), in.k.View(), in.v.View(),
                            out->o.MutableView(), c.options, {}, caps, &plan);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(out->info.num_tasks, AttentionTaskCount(plan)) << "target " << out->info.target;
  EXPECT_STREQ(out->info.path, KernelPathName(plan.path)) << "target " << out->info.target;
}

}  // namespace test
}  // namespace simdattn
