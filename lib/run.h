// Running a planned call: per-thread scratch, the waves of packed K/V, the
// order in which tasks go to the threads, and the combine of split calls.

#ifndef SIMDATTN_LIB_RUN_H_
#define SIMDATTN_LIB_RUN_H_

#include "lib/kernels/kernels.h"
#include "simdattn/attention.h"

namespace simdattn {

// Runs every task of `plan` with `kernels` on the executor `exec`. kOk, or
// kInternal when scratch cannot be allocated: before any task ran when the
// calling thread's buffers fail (nothing written), otherwise with the
// message saying that O may be partly written.
Status RunPlan(const ExecutionOptions& exec, const TargetKernels& kernels,
               const AttentionArgs& args, const Plan& plan);

}  // namespace simdattn

#endif  // SIMDATTN_LIB_RUN_H_
