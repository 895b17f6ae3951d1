// Planning a call: the kernels' view of a validated call (AttentionArgs) and
// how it splits into tasks (Plan). Pure functions of the call and of the
// target's capabilities, never of the thread count.

#ifndef SIMDATTN_LIB_PLAN_H_
#define SIMDATTN_LIB_PLAN_H_

#include <cstdint>

#include "lib/kernels/kernels.h"
#include "lib/packing.h"
#include "lib/validate.h"
#include "simdattn/attention.h"

namespace simdattn {

// The kernels' arguments of a call that ValidateInputs/ValidateOutputs
// accepted as `p`.
AttentionArgs MakeArgs(const Problem& p, const TensorView& q,
                       const TensorView& k, const TensorView& v,
                       const MutableTensorView& o,
                       const AttentionOptions& options,
                       const MutableTensorView& lse);

// The task split of a call on a target with capabilities `caps`.
// other_groups: (batch, KV head) groups of other calls whose tasks run in
// the same round (the other sequences of a PagedAttention call), which
// share the threads with this call's.
Plan MakePlan(const AttentionArgs& args, const TargetCaps& caps,
              int64_t other_groups = 0);

// Validates a call as Attention() does and plans it for `caps`, without
// running it (tests and tools use it to see how a call splits).
Status PlanCall(const TensorView& q, const TensorView& k, const TensorView& v,
                const MutableTensorView& o, const AttentionOptions& options,
                const MutableTensorView& lse, const TargetCaps& caps,
                Plan* plan);

// The name RunInfo::path gives a kernel path ("tiled", "decode",
// "fused decode").
const char* KernelPathName(KernelPath path);

// Packed K/V of the groups in flight: as many groups per wave as fit this
// many bytes, and at least one per thread. A group above
// kPackedGroupMaxBytes alone is not packed.
constexpr int64_t kPackedWaveBytes = int64_t{32} << 20;
constexpr int64_t kPackedGroupMaxBytes = int64_t{256} << 20;

}  // namespace simdattn

#endif  // SIMDATTN_LIB_PLAN_H_
