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

// What a call's buffers took (RunInfo::scratch_bytes, bytes_allocated).
struct MemoryReport {
  // The buffers the call computed in: widened kv lengths, partial results,
  // packed K/V, one scratch slot per executor thread and, without a
  // workspace, the spare slot (run.cc, TaskScratch).
  size_t bytes = 0;
  // Of those, the bytes taken from the heap during the call (0 in steady
  // state and with a workspace).
  size_t allocated = 0;
};

// Runs every task of `plan` with `kernels` on the executor `exec`, with its
// buffers in exec.workspace or, without one, in the calling thread's cache.
// When kv_lengths_i32 is not null (args.kv_lengths is then null), the call's
// kv lengths are widened from it into those buffers. kOk; kInvalidArgument
// for a workspace smaller than WorkspaceBytes; or kOutOfMemory when a buffer
// cannot be allocated. Every allocation that can fail comes before the
// first task: on error nothing is written. (A worker thread whose own
// scratch cannot be allocated borrows the calling thread's spare.) When
// report is not null, sets report->bytes to the larger of its value and
// this call's, and adds this call's allocations to report->allocated.
Status RunPlan(const ExecutionOptions& exec, const TargetKernels& kernels,
               const AttentionArgs& args, const Plan& plan,
               const int32_t* kv_lengths_i32, MemoryReport* report = nullptr);

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
// Every buffer is sized before the first sequence runs, so that errors
// (as RunPlan's) write nothing. Sets *num_tasks to the attention tasks of
// every sequence, and *report (when not null) as RunPlan does.
Status RunSequences(const ExecutionOptions& exec, const TargetKernels& kernels,
                    const std::vector<SequenceCall>& calls, int64_t* num_tasks,
                    MemoryReport* report = nullptr);

// Tests only: the n-th allocation of a call's buffers from now on (counted
// over every thread, n >= 1) fails, as if the heap were exhausted; 0 turns
// it off. Process-wide; the allocations after the failing one succeed.
void SetAllocationFailureForTesting(int64_t n);
// Tests only: the allocations of call buffers attempted so far, process-wide.
int64_t AllocationCountForTesting();

}  // namespace simdattn

#endif  // SIMDATTN_LIB_RUN_H_
