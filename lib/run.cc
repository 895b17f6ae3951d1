// Running a planned call (see run.h).

#include "lib/run.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <thread>
#include <utility>

#include "lib/parallel.h"
#include "lib/plan.h"

namespace simdattn {
namespace {

// Every buffer of a call starts on this many bytes: 256-byte alignment
// covers every vector size up to SVE-2048.
constexpr size_t kAlign = 256;

size_t RoundUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// SetAllocationFailureForTesting: allocations left before the one that
// fails (0: none fails).
std::atomic<int64_t> g_fail_countdown{0};
// AllocationCountForTesting: every allocation attempt so far.
std::atomic<int64_t> g_allocations{0};

// Every heap buffer of this file comes from here: `bytes` (a multiple of
// kAlign) on a kAlign boundary, or null; adds the bytes to *allocated.
float* Allocate(size_t bytes, std::atomic<size_t>* allocated) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  int64_t n = g_fail_countdown.load(std::memory_order_relaxed);
  while (n > 0) {
    if (g_fail_countdown.compare_exchange_weak(n, n - 1)) {
      if (n == 1) return nullptr;
      break;
    }
  }
  void* p = std::aligned_alloc(kAlign, bytes);
  if (p != nullptr && allocated != nullptr) allocated->fetch_add(bytes);
  return static_cast<float*>(p);
}

// Per-thread scratch, sized on first use and kept: no allocation per call in
// steady state.
struct Scratch {
  float* data = nullptr;
  size_t floats = 0;
  ~Scratch() { Free(); }

  // At least n floats, or null (the old buffer is then gone too).
  float* Get(size_t n, std::atomic<size_t>* allocated) {
    if (n > floats) {
      std::free(data);
      data = Allocate(RoundUp(n * sizeof(float)), allocated);
      floats = data == nullptr ? 0 : n;
    }
    return data;
  }
  void Free() {
    std::free(data);
    data = nullptr;
    floats = 0;
  }
};

thread_local Scratch t_scratch;
// The calling thread's buffers: the widened kv lengths and the partial
// results of split calls (one buffer), the packed K/V, and a spare scratch
// that a thread whose own scratch cannot be allocated borrows (TaskScratch).
thread_local Scratch t_call;
thread_local Scratch t_packed;
thread_local Scratch t_spare;

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
  float* Get(size_t n, std::atomic<size_t>* allocated) { return own_.Get(n, allocated); }

 private:
  static void Swap(Scratch* a, Scratch* b) {
    std::swap(a->data, b->data);
    std::swap(a->floats, b->floats);
  }
  Scratch* slot_;
  Scratch own_;
};

// The sizes of a call's buffers in bytes, each a multiple of kAlign.
struct BufferSizes {
  size_t lengths = 0;   // kv lengths widened from int32
  size_t partials = 0;  // partial results of a split call
  size_t packed = 0;    // packed K/V of one wave of groups
  int64_t wave = 0;     // groups per wave (0: not packed)
  size_t slot = 0;      // one task's scratch
  int64_t slots = 0;    // scratch slots of a workspace: the executor's threads
  // A workspace: its base rounded up to kAlign, then the lengths, the
  // partials, the packed K/V, the slots and the slots' busy flags.
  size_t Workspace() const {
    return kAlign + lengths + partials + packed +
           static_cast<size_t>(slots) * slot + RoundUp(static_cast<size_t>(slots));
  }
};

BufferSizes SizesOf(const ExecutionOptions& exec, const TargetKernels& kernels,
                    const AttentionArgs& a, const Plan& plan,
                    bool widen_lengths) {
  BufferSizes s;
  const int64_t threads = ExecutorThreads(exec);
  if (widen_lengths) s.lengths = RoundUp(static_cast<size_t>(a.batch) * sizeof(int64_t));
  if (plan.num_chunks > 1) {
    s.partials = RoundUp(static_cast<size_t>(PartialFloats(plan, a.head_dim_v)) * sizeof(float));
  }
  if (plan.pack_kv) {
    const int64_t group_bytes = plan.packed_group_floats * int64_t{sizeof(float)};
    s.wave = std::min(plan.groups, std::max<int64_t>(threads, kPackedWaveBytes / group_bytes));
    s.packed = static_cast<size_t>(s.wave * group_bytes);
  }
  s.slot = RoundUp(kernels.scratch_floats(a.head_dim_qk, a.head_dim_v) * sizeof(float));
  s.slots = threads;
  return s;
}

// Bound of the runs that a split call's tasks go in (RunWave).
constexpr int64_t kMaxShrinkingRuns = 256;

// Where a call's tasks find their scratch. per_thread: each thread's own
// t_scratch, and where that cannot be allocated, one of the slots (the
// calling thread's spare, allocated before any task ran); otherwise only
// the slots (a workspace's, one per executor thread). A slot is taken by
// one run of tasks at a time (busy).
struct ScratchSource {
  size_t floats = 0;  // one task's scratch
  bool per_thread = true;
  float* slots = nullptr;
  size_t slot_floats = 0;
  int64_t num_slots = 0;
  std::atomic<uint8_t>* busy = nullptr;
  std::atomic<uint8_t> spare_busy{0};  // busy flag of the spare slot
  std::atomic<size_t> allocated{0};    // heap bytes the call's threads took
};

// One call in flight: what every task needs, and the current wave's tasks
// in runs (RunWave).
struct Job {
  const AttentionArgs* args;
  const Plan* plan;
  const TargetKernels* kernels;
  Wave wave;
  int64_t first_task = 0;  // of the current wave
  int64_t num_tasks = 0;   // of the current wave
  int64_t run_tasks = 1;   // consecutive tasks per call of RunAttentionRun
  int64_t long_runs = 0;   // runs of run_tasks tasks; after them, runs of 1
  // When > 0, run r is tasks [run_first[r], run_first[r + 1]) instead.
  int64_t shrinking_runs = 0;
  int64_t run_first[kMaxShrinkingRuns + 1];
  ScratchSource scratch;
};

// The scratch of one run of tasks, for its lifetime: this thread's
// t_scratch, or a free slot of `source`. A thread that finds every slot
// taken (a host parallel-for running more tasks at once than it declared,
// or several threads that could not allocate) waits for one: slots are
// held only while a run computes, never while it waits, so one is freed
// soon. Never null: a task always finds scratch, so no task fails once
// the first has written O.
class TaskScratch {
 public:
  TaskScratch(ScratchSource* source, int64_t hint) : source_(source) {
    if (source->per_thread) {
      data_ = t_scratch.Get(source->floats, &source->allocated);
      if (data_ != nullptr) return;
    }
    for (int64_t n = 0;; ++n) {
      const int64_t s = (hint + n) % source->num_slots;
      std::atomic<uint8_t>& busy = source->busy[s];
      if (busy.load(std::memory_order_relaxed) == 0 &&
          busy.exchange(1, std::memory_order_acquire) == 0) {
        slot_ = s;
        data_ = source->slots + static_cast<size_t>(s) * source->slot_floats;
        return;
      }
      if ((n + 1) % source->num_slots == 0) std::this_thread::yield();
    }
  }
  ~TaskScratch() {
    if (slot_ >= 0) source_->busy[slot_].store(0, std::memory_order_release);
  }
  TaskScratch(const TaskScratch&) = delete;
  TaskScratch& operator=(const TaskScratch&) = delete;
  float* data() const { return data_; }

 private:
  ScratchSource* source_;
  float* data_ = nullptr;
  int64_t slot_ = -1;
};

// Runs the wave's tasks of run `run`, in order.
void RunAttentionRun(void* arg, int64_t run) {
  Job* job = static_cast<Job*>(arg);
  const TaskScratch hold(&job->scratch, run);
  float* scratch = hold.data();
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
  const TaskScratch hold(&job->scratch, i);
  float* scratch = hold.data();
  const AttentionArgs& a = *job->args;
  float* dst = job->wave.packed + i * job->plan->packed_group_floats;
  job->kernels->pack_kv(a, *job->plan, job->wave.packed_first_group + i, dst, scratch);
}

// Runs every attention task. With packed K/V (job->wave.packed set), the
// groups go in waves of `wave`: each wave's K/V are first packed (one task
// per group), then its blocks run against the packed copy. Packing copies
// values exactly, so results do not depend on the waves (or the thread
// count).
void RunAttentionTasks(const ExecutionOptions& exec, int64_t wave, Job* job) {
  const Plan& plan = *job->plan;
  const int64_t groups = plan.groups;
  const int64_t per_group = plan.num_blocks * plan.num_chunks;
  if (job->wave.packed == nullptr) {  // not packed, or no memory for it
    RunWave(exec, 0, groups * per_group, job);
    return;
  }
  for (int64_t first = 0; first < groups; first += wave) {
    const int64_t n = std::min(wave, groups - first);
    job->wave.packed_first_group = first;
    RunTasks(exec, n, &RunPackTask, job);
    RunWave(exec, first * per_group, n * per_group, job);
  }
}

void RunCombineTask(void* arg, int64_t task) {
  Job* job = static_cast<Job*>(arg);
  job->kernels->combine(*job->args, *job->plan, job->wave, task);
}

Status OutOfMemory(const char* message) {
  Status s;
  s.code = StatusCode::kOutOfMemory;
  s.message = message;
  return s;
}

// Runs the job whose buffers are in place; `args` is the job's copy of the
// call's arguments, whose kv lengths are widened here from lengths_i32.
// Allocates nothing that can fail: TaskScratch always finds scratch.
void RunJob(const ExecutionOptions& exec, const int32_t* lengths_i32,
            int64_t* lengths, int64_t wave, AttentionArgs* args, Job* job) {
  if (lengths_i32 != nullptr) {
    for (int64_t b = 0; b < args->batch; ++b) lengths[b] = lengths_i32[b];
    args->kv_lengths = lengths;
  }
  RunAttentionTasks(exec, wave, job);
  if (job->plan->num_chunks > 1) {
    RunTasks(exec, CombineTaskCount(*job->plan), &RunCombineTask, job);
  }
}

// The bytes of the buffers a call computes in (MemoryReport::bytes): its
// own, one scratch slot per executor thread, and without a workspace the
// spare slot.
size_t BuffersInUse(const BufferSizes& sizes, bool spare) {
  return sizes.lengths + sizes.partials + sizes.packed +
         static_cast<size_t>(sizes.slots + (spare ? 1 : 0)) * sizes.slot;
}

// Points the job's buffers into the caller's workspace (sizes.Workspace()
// bytes, checked) and runs it.
Status RunInWorkspace(const ExecutionOptions& exec, const BufferSizes& sizes,
                      const int32_t* lengths_i32, AttentionArgs* args,
                      Job* job) {
  if (exec.workspace_bytes < sizes.Workspace()) {
    Status s;
    s.code = StatusCode::kInvalidArgument;
    s.message = "exec.workspace_bytes = " + std::to_string(exec.workspace_bytes) +
                ": this call needs " + std::to_string(sizes.Workspace()) +
                " (WorkspaceSize)";
    return s;
  }
  const uintptr_t base = reinterpret_cast<uintptr_t>(exec.workspace);
  char* p = reinterpret_cast<char*>((base + kAlign - 1) / kAlign * kAlign);
  int64_t* lengths = reinterpret_cast<int64_t*>(p);
  p += sizes.lengths;
  if (sizes.partials > 0) job->wave.partials = reinterpret_cast<float*>(p);
  p += sizes.partials;
  if (sizes.packed > 0) job->wave.packed = reinterpret_cast<float*>(p);
  p += sizes.packed;
  ScratchSource& source = job->scratch;
  source.per_thread = false;
  source.slots = reinterpret_cast<float*>(p);
  source.slot_floats = sizes.slot / sizeof(float);
  source.num_slots = sizes.slots;
  p += static_cast<size_t>(sizes.slots) * sizes.slot;
  source.busy = reinterpret_cast<std::atomic<uint8_t>*>(p);
  for (int64_t i = 0; i < sizes.slots; ++i) {
    new (&source.busy[i]) std::atomic<uint8_t>(0);
  }
  RunJob(exec, lengths_i32, lengths, sizes.wave, args, job);
  return Status::Ok();
}

// The calling thread's scratch and the spare slot that `source` lends to
// threads whose own scratch cannot be allocated: the spare is leased from
// t_spare (`spare`). Both come before any task runs.
Status PrepareScratch(ScratchLease* spare, ScratchSource* source) {
  if (t_scratch.Get(source->floats, &source->allocated) == nullptr) {
    return OutOfMemory("out of memory allocating the calling thread's scratch");
  }
  source->per_thread = true;
  source->slots = spare->Get(source->floats, &source->allocated);
  if (source->slots == nullptr) {
    return OutOfMemory("out of memory allocating the spare scratch");
  }
  source->slot_floats = source->floats;
  source->num_slots = 1;
  source->busy = &source->spare_busy;
  return Status::Ok();
}

// Takes the job's buffers from the calling thread's cache and runs it.
// Every buffer that can fail to allocate is in place before the first task
// runs: a failure writes nothing. (Packed K/V that cannot be allocated are
// read in place instead, except paged ones, which the tiles never read in
// place.)
Status RunWithThreadBuffers(const ExecutionOptions& exec,
                            const BufferSizes& sizes,
                            const int32_t* lengths_i32, AttentionArgs* args,
                            Job* job) {
  ScratchLease call(&t_call);
  ScratchLease packed(&t_packed);
  ScratchLease spare(&t_spare);
  std::atomic<size_t>* allocated = &job->scratch.allocated;
  Status s = PrepareScratch(&spare, &job->scratch);
  if (!s.ok()) return s;
  float* call_buffer = nullptr;
  if (sizes.lengths + sizes.partials > 0) {
    call_buffer = call.Get((sizes.lengths + sizes.partials) / sizeof(float), allocated);
    if (call_buffer == nullptr) {
      return OutOfMemory("out of memory allocating the partial results");
    }
  }
  int64_t* lengths = reinterpret_cast<int64_t*>(call_buffer);
  if (sizes.partials > 0) job->wave.partials = call_buffer + sizes.lengths / sizeof(float);
  if (sizes.packed > 0) {
    job->wave.packed = packed.Get(sizes.packed / sizeof(float), allocated);
    if (job->wave.packed == nullptr && args->block_table != nullptr) {
      return OutOfMemory("out of memory allocating the packed K/V");
    }
  }
  RunJob(exec, lengths_i32, lengths, sizes.wave, args, job);
  return Status::Ok();
}

// The sequences of RunSequences whose tasks run together: call c of `calls`
// (index[c]) owns tasks [first[c], first[c + 1]) of a round.
struct SequenceJob {
  const TargetKernels* kernels;
  const std::vector<SequenceCall>* calls;
  std::vector<size_t> index;
  std::vector<int64_t> first;
  std::vector<Wave> waves;
  ScratchSource scratch;

  // The call of task i, and i's index among that call's tasks.
  size_t Find(int64_t* i) const {
    const size_t c = static_cast<size_t>(
        std::upper_bound(first.begin(), first.end(), *i) - first.begin() - 1);
    *i -= first[c];
    return c;
  }
};

void RunSequenceTask(void* arg, int64_t i) {
  SequenceJob* job = static_cast<SequenceJob*>(arg);
  const TaskScratch hold(&job->scratch, i);
  const size_t c = job->Find(&i);
  const SequenceCall& call = (*job->calls)[job->index[c]];
  job->kernels->attention(call.args, call.plan, job->waves[c], i, hold.data());
}

void RunSequenceCombine(void* arg, int64_t i) {
  SequenceJob* job = static_cast<SequenceJob*>(arg);
  const size_t c = job->Find(&i);
  const SequenceCall& call = (*job->calls)[job->index[c]];
  job->kernels->combine(call.args, call.plan, job->waves[c], i);
}

// The rows of a sequence without keys: O = 0; LSE = the row's sink (a
// softmax over the sink alone) or -inf.
void WriteEmptySequence(const AttentionArgs& a) {
  const int64_t size = a.o_type == Storage::kF32 ? 4 : 2;
  for (int64_t h = 0; h < a.q_heads; ++h) {
    const float sink = a.sinks != nullptr ? a.sinks[h]
                                          : -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < a.q_len; ++i) {
      char* row = static_cast<char*>(a.o) + (h * a.o_strides[1] + i * a.o_strides[2]) * size;
      std::memset(row, 0, static_cast<size_t>(a.head_dim_v * size));
      if (a.lse != nullptr) a.lse[h * a.lse_strides[1] + i * a.lse_strides[2]] = sink;
    }
  }
}

// Runs the calls of `job` (index, first and waves set) in one round of
// attention tasks and one of combines (tasks [combine_first[c],
// combine_first[c + 1]) for call c; calls that are not split have none).
// The partial results lie in the calling thread's t_call, which
// RunSequences has sized: nothing here fails.
Status RunSequenceRounds(const ExecutionOptions& exec, size_t partials,
                         std::vector<int64_t>* combine_first, SequenceJob* job) {
  const std::vector<SequenceCall>& calls = *job->calls;
  ScratchLease buffer(&t_call);
  ScratchLease spare(&t_spare);
  float* base = partials > 0 ? buffer.Get(partials, &job->scratch.allocated) : nullptr;
  if (partials > 0 && base == nullptr) {
    return OutOfMemory("out of memory allocating the partial results");
  }
  const Status s = PrepareScratch(&spare, &job->scratch);
  if (!s.ok()) return s;
  for (size_t c = 0; c < job->index.size(); ++c) {
    const SequenceCall& call = calls[job->index[c]];
    if (call.plan.num_chunks > 1) {
      job->waves[c].partials = base;
      base += PartialFloats(call.plan, call.args.head_dim_v);
    }
  }
  RunTasks(exec, job->first.back(), &RunSequenceTask, job);
  job->first.swap(*combine_first);
  if (job->first.back() > 0) RunTasks(exec, job->first.back(), &RunSequenceCombine, job);
  return Status::Ok();
}

// The floats of the calling thread's buffers that RunSequences needs.
struct SequenceNeeds {
  size_t call = 0;     // t_call: the largest of a packed call's and the round's
  size_t packed = 0;   // t_packed: the largest packed call's wave
  size_t round = 0;    // the round's partial results
};

// Grows the calling thread's cached buffers to `needs` (and its scratch and
// spare to `floats`), before any sequence runs: the runs then find them in
// place, so a failure here is the only one and writes nothing.
Status ReserveThreadBuffers(const SequenceNeeds& needs, size_t floats,
                            std::atomic<size_t>* allocated) {
  const struct {
    Scratch* slot;
    size_t floats;
  } reserve[] = {{&t_scratch, floats}, {&t_spare, floats},
                 {&t_call, needs.call}, {&t_packed, needs.packed}};
  for (const auto& r : reserve) {
    if (r.floats > 0 && r.slot->Get(r.floats, allocated) == nullptr) {
      return OutOfMemory("out of memory allocating per-thread buffers");
    }
  }
  return Status::Ok();
}

}  // namespace

Status RunSequences(const ExecutionOptions& exec, const TargetKernels& kernels,
                    const std::vector<SequenceCall>& calls, int64_t* num_tasks,
                    MemoryReport* report) {
  SequenceJob job;
  job.kernels = &kernels;
  job.calls = &calls;
  job.first.assign(1, 0);
  std::vector<int64_t> combine_first(1, 0);
  SequenceNeeds needs;
  size_t slot = 0;
  *num_tasks = 0;
  for (size_t c = 0; c < calls.size(); ++c) {
    const SequenceCall& call = calls[c];
    if (call.args.kv_len == 0) continue;
    const Plan& plan = call.plan;
    *num_tasks += AttentionTaskCount(plan);
    const BufferSizes sizes = SizesOf(exec, kernels, call.args, plan, false);
    job.scratch.floats = sizes.slot / sizeof(float);
    slot = sizes.slot;
    if (plan.pack_kv) {
      needs.call = std::max(needs.call, (sizes.lengths + sizes.partials) / sizeof(float));
      needs.packed = std::max(needs.packed, sizes.packed / sizeof(float));
      continue;
    }
    job.index.push_back(c);
    job.first.push_back(job.first.back() + AttentionTaskCount(plan));
    const int64_t combines = plan.num_chunks > 1 ? CombineTaskCount(plan) : 0;
    combine_first.push_back(combine_first.back() + combines);
    if (plan.num_chunks > 1) {
      needs.round += static_cast<size_t>(PartialFloats(plan, call.args.head_dim_v));
    }
  }
  job.waves.resize(job.index.size());
  needs.call = std::max(needs.call, needs.round);
  Status s = ReserveThreadBuffers(needs, job.scratch.floats, &job.scratch.allocated);
  if (!s.ok()) return s;
  MemoryReport plan_report;
  for (const SequenceCall& call : calls) {
    if (call.args.kv_len == 0 || !call.plan.pack_kv) continue;
    s = RunPlan(exec, kernels, call.args, call.plan, nullptr, &plan_report);
    if (!s.ok()) return s;
  }
  if (!job.index.empty()) {
    s = RunSequenceRounds(exec, needs.round, &combine_first, &job);
    if (!s.ok()) return s;
  }
  for (const SequenceCall& call : calls) {
    if (call.args.kv_len == 0) WriteEmptySequence(call.args);
  }
  if (report != nullptr) {
    const size_t threads = static_cast<size_t>(ExecutorThreads(exec));
    report->bytes = RoundUp(needs.call * sizeof(float)) + needs.packed * sizeof(float) +
                    (threads + 1) * slot;
    report->allocated = job.scratch.allocated.load() + plan_report.allocated;
  }
  return Status::Ok();
}

size_t WorkspaceBytes(const ExecutionOptions& exec,
                      const TargetKernels& kernels, const AttentionArgs& args,
                      const Plan& plan, bool widen_lengths) {
  return SizesOf(exec, kernels, args, plan, widen_lengths).Workspace();
}

Status RunPlan(const ExecutionOptions& exec, const TargetKernels& kernels,
               const AttentionArgs& args, const Plan& plan,
               const int32_t* kv_lengths_i32, MemoryReport* report) {
  AttentionArgs a = args;
  Job job;
  job.args = &a;
  job.plan = &plan;
  job.kernels = &kernels;
  job.scratch.floats = kernels.scratch_floats(args.head_dim_qk, args.head_dim_v);
  BufferSizes sizes = SizesOf(exec, kernels, args, plan, kv_lengths_i32 != nullptr);
  const bool workspace = exec.workspace != nullptr;
  const Status s = workspace ? RunInWorkspace(exec, sizes, kv_lengths_i32, &a, &job)
                             : RunWithThreadBuffers(exec, sizes, kv_lengths_i32, &a, &job);
  if (!s.ok() || report == nullptr) return s;
  if (job.wave.packed == nullptr) sizes.packed = 0;  // read in place
  report->bytes = std::max(report->bytes, BuffersInUse(sizes, !workspace));
  report->allocated += job.scratch.allocated.load();
  return s;
}

void ReleaseThreadBuffers() {
  t_scratch.Free();
  t_call.Free();
  t_packed.Free();
  t_spare.Free();
}

void SetAllocationFailureForTesting(int64_t n) {
  g_fail_countdown.store(n < 0 ? 0 : n);
}

int64_t AllocationCountForTesting() { return g_allocations.load(); }

}  // namespace simdattn
