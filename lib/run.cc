// Running a planned call (see run.h).

#include "lib/run.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <utility>

#include "lib/parallel.h"
#include "lib/plan.h"

namespace simdattn {
namespace {

// Per-thread scratch, sized on first use and kept: no allocation per call in
// steady state.
struct Scratch {
  float* data = nullptr;
  size_t floats = 0;
  ~Scratch() { std::free(data); }

  float* Get(size_t n) {
    if (n > floats) {
      std::free(data);
      // 256-byte alignment covers every vector size up to SVE-2048.
      const size_t bytes = (n * sizeof(float) + 255) / 256 * 256;
      data = static_cast<float*>(std::aligned_alloc(256, bytes));
      floats = data == nullptr ? 0 : n;
    }
    return data;
  }
};

thread_local Scratch t_scratch;
// Partial results of split calls and packed K/V, kept by the calling thread.
thread_local Scratch t_partials;
thread_local Scratch t_packed;

// A calling thread's buffer, taken out of its thread_local slot for the
// length of one call. A host parallel-for that runs other work on the
// calling thread while our tasks are pending (as work-stealing runtimes
// do) may start another call there: that call then finds the slot empty
// and uses a buffer of its own, instead of reusing or freeing the one our
// tasks still read. The larger buffer goes back to the slot.
class ScratchLease {
 public:
  explicit ScratchLease(Scratch* slot) : slot_(slot) { Swap(&own_, slot_); }
  ~ScratchLease() {
    if (own_.floats >= slot_->floats) Swap(&own_, slot_);
  }
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  float* Get(size_t n) { return own_.Get(n); }

 private:
  static void Swap(Scratch* a, Scratch* b) {
    std::swap(a->data, b->data);
    std::swap(a->floats, b->floats);
  }
  Scratch* slot_;
  Scratch own_;
};

// Bound of the runs that a split call's tasks go in (RunWave).
constexpr int64_t kMaxShrinkingRuns = 256;

// One call in flight: what every task needs, and the current wave's tasks
// in runs (RunWave).
struct Job {
  const AttentionArgs* args;
  const Plan* plan;
  const TargetKernels* kernels;
  Wave wave;
  size_t scratch_floats;
  int64_t first_task = 0;  // of the current wave
  int64_t num_tasks = 0;   // of the current wave
  int64_t run_tasks = 1;   // consecutive tasks per call of RunAttentionRun
  int64_t long_runs = 0;   // runs of run_tasks tasks; after them, runs of 1
  // When > 0, run r is tasks [run_first[r], run_first[r + 1]) instead.
  int64_t shrinking_runs = 0;
  int64_t run_first[kMaxShrinkingRuns + 1];
  std::atomic<bool> out_of_memory{false};
};

// This thread's scratch for a task of `job`; null (and the job marked out
// of memory) when it cannot be had.
float* TaskScratch(Job* job) {
  float* scratch = t_scratch.Get(job->scratch_floats);
  if (scratch == nullptr) job->out_of_memory.store(true);
  return scratch;
}

// Runs the wave's tasks of run `run`, in order.
void RunAttentionRun(void* arg, int64_t run) {
  Job* job = static_cast<Job*>(arg);
  float* scratch = TaskScratch(job);
  if (scratch == nullptr) return;
  int64_t begin = run * job->run_tasks;
  int64_t end = std::min(job->num_tasks, begin + job->run_tasks);
  if (job->shrinking_runs > 0) {
    begin = job->run_first[run];
    end = job->run_first[run + 1];
  } else if (run >= job->long_runs) {
    begin = job->long_runs * job->run_tasks + (run - job->long_runs);
    end = begin + 1;
  }
  for (int64_t task = begin; task < end; ++task) {
    job->kernels->attention(*job->args, *job->plan, job->wave,
                            job->first_task + task, scratch);
  }
}

// Split calls: a task's chunk is followed by the next chunk of its block,
// which the task's tiles have begun to prefetch, so consecutive tasks go to
// one thread in runs that shrink: each takes 1 / (2 x threads) of the tasks
// left, so the first are long (fewer stream restarts) and the last single
// (the threads end together). Returns false past kMaxShrinkingRuns runs.
bool ShrinkingRuns(int64_t n, int64_t threads, Job* job) {
  int64_t runs = 0;
  int64_t next = 0;
  while (next < n && runs < kMaxShrinkingRuns) {
    job->run_first[runs++] = next;
    next += (n - next + 2 * threads - 1) / (2 * threads);
  }
  if (next < n) return false;
  job->run_first[runs] = n;
  job->shrinking_runs = runs;
  return true;
}

// Runs the wave's `n` tasks from `first` on. Split calls go in shrinking
// runs (or, past their bound, kRunsPerThread equal runs per thread). A
// prefill with many groups of few blocks goes in runs of one group's blocks,
// so that one core, not both, pulls a group's K/V into its L2 (2 threads
// over 1, B4 H16 L256 D64 f32: 1.81x -> 1.96x); the last `threads` groups
// go block by block, so the threads end within about one block.
void RunWave(const ExecutionOptions& exec, int64_t first, int64_t n, Job* job) {
  constexpr int64_t kRunsPerThread = 16;
  const Plan& plan = *job->plan;
  job->first_task = first;
  job->num_tasks = n;
  job->run_tasks = 1;
  job->shrinking_runs = 0;
  const int64_t threads = ExecutorThreads(exec);
  if (plan.num_chunks > 1 && ShrinkingRuns(n, threads, job)) {
    RunTasks(exec, job->shrinking_runs, &RunAttentionRun, job);
    return;
  }
  if (plan.num_chunks > 1) {
    job->run_tasks = std::max<int64_t>(1, n / (threads * kRunsPerThread));
  } else if (plan.num_blocks > 1 && n / plan.num_blocks >= threads * kRunsPerThread) {
    job->run_tasks = plan.num_blocks;
  }
  job->long_runs = (n + job->run_tasks - 1) / job->run_tasks;
  int64_t num_runs = job->long_runs;
  if (job->run_tasks > 1 && plan.num_chunks == 1) {
    job->long_runs = n / job->run_tasks - threads;
    num_runs = job->long_runs + (n - job->long_runs * job->run_tasks);
  }
  RunTasks(exec, num_runs, &RunAttentionRun, job);
}

void RunPackTask(void* arg, int64_t i) {
  Job* job = static_cast<Job*>(arg);
  float* scratch = TaskScratch(job);
  if (scratch == nullptr) return;
  const AttentionArgs& a = *job->args;
  float* dst = job->wave.packed + i * job->plan->packed_group_floats;
  job->kernels->pack_kv(a, *job->plan, job->wave.packed_first_group + i, dst, scratch);
}

// Runs every attention task. With packed K/V, the groups go in waves: each
// wave's K/V are first packed (one task per group), then its blocks run
// against the packed copy. Packing copies values exactly, so results do not
// depend on the waves (or the thread count).
void RunAttentionTasks(const ExecutionOptions& exec, Job* job,
                       ScratchLease* packed) {
  const Plan& plan = *job->plan;
  const int64_t groups = plan.groups;
  const int64_t per_group = plan.num_blocks * plan.num_chunks;
  int64_t wave = 0;
  if (plan.pack_kv) {
    const int64_t group_bytes = plan.packed_group_floats * int64_t{sizeof(float)};
    wave = std::max<int64_t>(ExecutorThreads(exec), kPackedWaveBytes / group_bytes);
    wave = std::min(wave, groups);
    job->wave.packed = packed->Get(static_cast<size_t>(wave * plan.packed_group_floats));
  }
  if (job->wave.packed == nullptr) {  // not packed, or no memory for it
    RunWave(exec, 0, groups * per_group, job);
    return;
  }
  for (int64_t first = 0; first < groups && !job->out_of_memory.load(); first += wave) {
    const int64_t n = std::min(wave, groups - first);
    job->wave.packed_first_group = first;
    RunTasks(exec, n, &RunPackTask, job);
    if (job->out_of_memory.load()) break;
    RunWave(exec, first * per_group, n * per_group, job);
  }
}

void RunCombineTask(void* arg, int64_t task) {
  Job* job = static_cast<Job*>(arg);
  job->kernels->combine(*job->args, *job->plan, job->wave, task);
}

Status OutOfMemory(const char* message) {
  Status s;
  s.code = StatusCode::kInternal;
  s.message = message;
  return s;
}

}  // namespace

Status RunPlan(const ExecutionOptions& exec, const TargetKernels& kernels,
               const AttentionArgs& args, const Plan& plan) {
  ScratchLease partials(&t_partials);
  ScratchLease packed(&t_packed);
  Job job;
  job.args = &args;
  job.plan = &plan;
  job.kernels = &kernels;
  job.scratch_floats = kernels.scratch_floats(args.head_dim_qk, args.head_dim_v);
  // The calling thread's buffers first: a failure here writes nothing.
  if (t_scratch.Get(job.scratch_floats) == nullptr) {
    return OutOfMemory("out of memory allocating per-thread scratch");
  }
  if (plan.num_chunks > 1) {
    job.wave.partials =
        partials.Get(static_cast<size_t>(PartialFloats(plan, args.head_dim_v)));
    if (job.wave.partials == nullptr) {
      return OutOfMemory("out of memory allocating per-thread scratch");
    }
  }
  RunAttentionTasks(exec, &job, &packed);
  if (!job.out_of_memory.load() && plan.num_chunks > 1) {
    RunTasks(exec, CombineTaskCount(plan), &RunCombineTask, &job);
  }
  if (job.out_of_memory.load()) {
    return OutOfMemory(
        "out of memory allocating a worker thread's scratch; o is partly "
        "written");
  }
  return Status::Ok();
}

}  // namespace simdattn
