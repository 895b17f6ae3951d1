// Running a planned call: per-thread scratch, the waves of packed K/V, the
// order in which tasks go to the threads, and the combine of split calls.

#ifndef SIMDATTN_LIB_RUN_H_
#define SIMDATTN_LIB_RUN_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "lib/kernels/kernels.h"
#include "simdattn/attention.h"

namespace simdattn {

// The bytes of workspace (ExecutionOptions::workspace) RunPlan needs for
// this call on `exec`; widen_lengths: the kv lengths come as int32.
size_t WorkspaceBytes(const ExecutionOptions& exec,
                      const TargetKernels& kernels, const AttentionArgs& args,
                      const Plan& plan, bool widen_lengths);

// Runs every task of `plan` with `kernels` on the executor `exec`, with its
// buffers in exec.workspace or, without one, in the calling thread's cache.
// When kv_lengths_i32 is not null (args.kv_lengths is then null), the call's
// kv lengths are widened from it into those buffers. kOk; kInvalidArgument
// for a workspace smaller than WorkspaceBytes (nothing written); or
// kOutOfMemory when scratch cannot be allocated: before any task ran when
// the calling thread's buffers fail (nothing written), otherwise with the
// message saying that O may be partly written.
Status RunPlan(const ExecutionOptions& exec, const TargetKernels& kernels,
               const AttentionArgs& args, const Plan& plan,
               const int32_t* kv_lengths_i32);

// One sequence of a PagedAttention call: a batch-1 call of its own, with
// its plan (unset when it has no keys).
struct SequenceCall {
  AttentionArgs args;
  Plan plan;
};

// Runs every sequence of `calls` on `exec`, with the calling thread's
// buffers: the tasks of the sequences whose K/V are read in place (decode,
// and tiles without packing) go to the threads together, in one round and
// one round of combines; a sequence whose plan packs K/V runs as RunPlan
// runs it; a sequence without keys gets O = 0 and LSE = its sink or -inf.
// Sets *num_tasks to the attention tasks of every sequence. Errors as
// RunPlan's.
Status RunSequences(const ExecutionOptions& exec, const TargetKernels& kernels,
                    const std::vector<SequenceCall>& calls, int64_t* num_tasks);

}  // namespace simdattn

#endif  // SIMDATTN_LIB_RUN_H_
