// The one place that knows about threads: the persistent pool behind
// ThreadPool and the choice between it and a host's parallel-for.

#ifndef SIMDATTN_LIB_PARALLEL_H_
#define SIMDATTN_LIB_PARALLEL_H_

#include <cstdint>

#include "simdattn/attention.h"

namespace simdattn {

// Runs task(arg, i) for i in [0, num_tasks) with the executor the options
// name (host parallel-for, caller's pool, or the process-wide default pool).
void RunTasks(const ExecutionOptions& exec, int64_t num_tasks,
              void (*task)(void* arg, int64_t i), void* arg);

// How many threads the executor runs tasks on: the pool's count, or for a
// host parallel-for exec.parallel_for_threads (> 0) or the hardware's.
int ExecutorThreads(const ExecutionOptions& exec);

}  // namespace simdattn

#endif  // SIMDATTN_LIB_PARALLEL_H_
