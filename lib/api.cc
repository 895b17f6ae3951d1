// Public entry points: validation -> Status, fast-path coverage check, one
// target choice per call, then the query-block tasks handed to the threads.

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <utility>

#include "lib/dispatch.h"
#include "lib/kernels/kernels.h"
#include "lib/packing.h"
#include "lib/parallel.h"
#include "lib/validate.h"
#include "simdattn/attention.h"

namespace simdattn {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kUnimplemented:
      return "unimplemented";
    case StatusCode::kInternal:
      return "internal";
  }
  return "unknown";
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kBool:
      return "bool";
  }
  return "unknown";
}

int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kBool:
      return 1;
  }
  return 1;
}

namespace {

template <class View, class Ptr>
View MakeView(Ptr data, DType dtype, int64_t b, int64_t h, int64_t s,
              int64_t d, bool bshd) {
  View v;
  v.data = data;
  v.dtype = dtype;
  v.shape[0] = b;
  v.shape[1] = h;
  v.shape[2] = s;
  v.shape[3] = d;
  v.strides[3] = 1;
  if (bshd) {
    v.strides[1] = d;
    v.strides[2] = h * d;
    v.strides[0] = s * h * d;
  } else {
    v.strides[2] = d;
    v.strides[1] = s * d;
    v.strides[0] = h * s * d;
  }
  return v;
}

Status Unimplemented(const std::string& what) {
  Status s;
  s.code = StatusCode::kUnimplemented;
  s.message = what + " is not implemented in the fast path yet";
  return s;
}

// Largest head dimension the kernel accepts: its per-thread scratch holds a
// transposed query block of head_dim x 2 vectors and one K/V tile.
constexpr int64_t kMaxHeadDim = 1024;

// What the fast path covers today; anything else is kUnimplemented.
Status CheckCovered(const Problem& p, const AttentionOptions& options) {
  if (options.alibi_slopes != nullptr &&
      (p.q_len > (int64_t{1} << 24) || p.kv_len > (int64_t{1} << 24))) {
    return Unimplemented("ALiBi with a sequence longer than 2^24");
  }
  constexpr int64_t kMaxIndex = int64_t{1} << 32;  // Philox counter words
  if (options.dropout_p > 0.0f &&
      (p.batch > kMaxIndex || p.q_heads > kMaxIndex || p.q_len > kMaxIndex)) {
    return Unimplemented("dropout with an index of 2^32 or more");
  }
  if (p.head_dim_qk > kMaxHeadDim || p.head_dim_v > kMaxHeadDim) {
    return Unimplemented("a head dimension above " +
                         std::to_string(kMaxHeadDim));
  }
  constexpr int64_t kMaxLen = std::numeric_limits<int32_t>::max() - 1;
  if (p.q_len > kMaxLen || p.kv_len > kMaxLen) {
    return Unimplemented("a sequence length of 2^31 - 1 or more");
  }
  return Status::Ok();
}

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
// Partial results of split calls, kept by the calling thread.
thread_local Scratch t_partials;

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

// Decode: calls with at most this many queries per head split the keys.
constexpr int64_t kDecodeMaxQueries = 16;
// Lq > 1 takes the decode path (rows along the head dimension) up to this
// many rows per group, the tiled kernel (rows along the lanes) beyond. The
// decode path's cost grows with the rows, the tiled kernel's with the
// vectors they fill, so it wins where a group fills a vector poorly. In one
// process, alternating, 1 thread, B1 Hq32 Lk16384 D128 f16 K/V, GB/s (tiled
// -> decode) on AVX-512 (16 lanes): 8 rows 3.8 -> 7.8, 16 rows 3.5 -> 3.5
// and 4.0 -> 4.4, 32 rows 2.7 -> 2.3; on AVX2 (8 lanes): 8 rows 2.4 -> 4.7,
// 16 rows 1.9 -> 2.2 and 2.6 -> 3.1.
constexpr int64_t kDecodeMaxRows = 16;
// Keys per chunk of a split call: kDecodeChunkKeys, doubled up to
// kDecodeMaxChunkKeys while the call keeps at least kDecodeMinTasks tasks
// (more keys when Lk needs over kMaxSplitChunks). It depends on the shape
// only, never on the thread count. Longer chunks restart the streams and
// write partials less often; in one process on the 2-core Zen 5, alternating
// call by call (B1 Hq32 Hkv8 D128, K/V from memory, medians of 24-40 calls),
// 2048 keys against 512 measured -2% to +11% (15 of 16 faster; Lk 4096,
// 16384 and 65536, f32, f16 and bf16 K/V, 1 and 2 threads). 64 tasks keep
// a few per thread on machines of up to 16-32 threads.
constexpr int64_t kDecodeChunkKeys = 512;
constexpr int64_t kDecodeMaxChunkKeys = 2048;
constexpr int64_t kDecodeMinTasks = 64;

// Packed K/V of the groups in flight (see RunAttentionTasks), kept by the
// calling thread.
thread_local Scratch t_packed;
// Groups per wave: as many as fit this many bytes of packed K/V, and at
// least one per thread. A group above it alone is not packed.
constexpr int64_t kPackedWaveBytes = int64_t{32} << 20;
constexpr int64_t kPackedGroupMaxBytes = int64_t{256} << 20;
// f32 K/V that one query block reads (all of the group's, or a window's
// span of them) below this size stay in a typical L2 while the group's
// blocks run, and are read in place as fast as a packed copy: not packed.
// 16-bit K/V are always packed (once per group instead of widened per
// block).
constexpr int64_t kPackMinF32BlockBytes = int64_t{1} << 20;

// Keys one query block can see: all of them, or a window's span.
int64_t BlockKeySpan(const AttentionArgsF32& a) {
  const int64_t right = a.causal ? 0 : a.window_right;
  if (a.window_left < 0 || right < 0) return a.kv_len;
  return std::min(a.kv_len, a.window_left + right + a.block_rows);
}

std::atomic<PackPolicy> g_pack_policy{PackPolicy::kAuto};

// Bound of the runs that a split call's tasks go in (RunWave).
constexpr int64_t kMaxShrinkingRuns = 256;

struct PrefillJob {
  const AttentionArgsF32* args;
  const TargetKernels* kernels;
  size_t scratch_floats;
  int64_t first_task = 0;  // of the current wave
  int64_t num_tasks = 0;   // of the current wave
  int64_t run_tasks = 1;   // consecutive tasks per call of RunPrefillTask
  int64_t long_runs = 0;   // runs of run_tasks tasks; after them, runs of 1
  // Split calls (see RunWave): when > 0, run r is tasks [run_first[r],
  // run_first[r + 1]) instead.
  int64_t shrinking_runs = 0;
  int64_t run_first[kMaxShrinkingRuns + 1];
  std::atomic<bool> out_of_memory{false};
};

// This thread's scratch for a task of `job`; null (and the job marked out
// of memory) when it cannot be had.
float* TaskScratch(PrefillJob* job) {
  float* scratch = t_scratch.Get(job->scratch_floats);
  if (scratch == nullptr) job->out_of_memory.store(true);
  return scratch;
}

// Runs the wave's tasks of run `run`, in order: [run * run_tasks,
// (run + 1) * run_tasks) for the first long_runs runs, one task each after
// (or the shrinking runs' bounds).
void RunPrefillTask(void* arg, int64_t run) {
  PrefillJob* job = static_cast<PrefillJob*>(arg);
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
    job->kernels->attention_f32(*job->args, job->first_task + task, scratch);
  }
}

// Runs the wave's `n` tasks from `first` on. A split (decode) call's tasks
// are its key chunks in order, and each tile prefetches the next one, even
// past its chunk. Handed out one by one, consecutive chunks went to
// alternate threads: every chunk started cold and ended prefetching a chunk
// another thread then read. So they go in runs of consecutive tasks (the
// runs only decide which thread computes a chunk, so results do not
// change). In one process, 2 threads, Lk 16384, alternating with single
// tasks (GB/s, two pairs each): f16 9.0 / 9.3 -> 9.3 / 10.1, bf16 9.3 /
// 10.0 -> 9.6 / 10.3, f32 10.3 / 11.8 -> 12.0 / 12.4; 1 thread the same
// within noise. The runs shrink: each takes 1 / (2 x threads) of the tasks
// left, so the first are long (fewer stream restarts) and the last single
// tasks (the threads end together). Against kRunsPerThread runs of equal
// length per thread, in one process on the 2-core Zen 5 (B1 Hq32 Hkv8 D128,
// K/V from memory, 2 threads, medians of 30 calls): Lk 4096 f32 +10%, f16
// +4%, bf16 +4%; Lk 16384 (two processes) f32 +11% and +11%, f16 0% and
// +4%, bf16 +10% and +2%; Lk 65536 f32 +3%, f16 +4%, bf16 +4%. With 1
// thread both run the tasks in order. Past kMaxShrinkingRuns runs (many
// threads), runs of equal length.
// A prefill whose groups (one (batch, KV head) each) are many and have few
// query blocks goes in runs of one group's blocks too: handed out one by
// one, a group's blocks went to both threads, so both cores pulled the
// group's K/V into their own L2. Paired 2-thread / 1-thread speed-up, f32,
// B4 H16 L256 D64 (64 groups of 4 blocks): 1.81 -> 1.96 without a mask,
// 1.85 -> 1.93 causal. Shapes with fewer groups keep single tasks (runs of
// a few blocks measured slower there: L512 D64 1.84 -> 1.69). The last
// groups are handed out block by block: with whole groups to the end, one
// thread could still be computing a group (1/64 of the call above) after
// the other had finished. Paired, 2 threads, 800 pairs each: 1.006-1.007x
// without a mask and 1.005x causal (B4 H16 L256 D64).
void RunWave(const ExecutionOptions& exec, int64_t first, int64_t n, PrefillJob* job) {
  constexpr int64_t kRunsPerThread = 16;
  const AttentionArgsF32& a = *job->args;
  job->first_task = first;
  job->num_tasks = n;
  job->run_tasks = 1;
  job->shrinking_runs = 0;
  const int64_t threads = ExecutorThreads(exec);
  if (a.num_chunks > 1) {
    int64_t runs = 0;
    int64_t next = 0;
    while (next < n && runs < kMaxShrinkingRuns) {
      job->run_first[runs++] = next;
      next += (n - next + 2 * threads - 1) / (2 * threads);
    }
    if (next >= n) {
      job->run_first[runs] = n;
      job->shrinking_runs = runs;
      RunTasks(exec, runs, &RunPrefillTask, job);
      return;
    }
  }
  if (a.num_chunks > 1) {
    job->run_tasks = std::max<int64_t>(1, n / (threads * kRunsPerThread));
  } else if (a.num_blocks > 1 && n / a.num_blocks >= threads * kRunsPerThread) {
    job->run_tasks = a.num_blocks;
  }
  job->long_runs = (n + job->run_tasks - 1) / job->run_tasks;
  int64_t num_runs = job->long_runs;
  if (job->run_tasks > 1 && a.num_chunks == 1) {
    // The last `threads` groups go block by block, so the threads end within
    // about one block of each other instead of one group.
    job->long_runs = n / job->run_tasks - threads;
    num_runs = job->long_runs + (n - job->long_runs * job->run_tasks);
  }
  RunTasks(exec, num_runs, &RunPrefillTask, job);
}

void RunPackTask(void* arg, int64_t i) {
  PrefillJob* job = static_cast<PrefillJob*>(arg);
  float* scratch = TaskScratch(job);
  if (scratch == nullptr) return;
  const AttentionArgsF32& a = *job->args;
  job->kernels->pack_kv(a, a.packed_first_group + i,
                        a.packed + i * PackedGroupFloats(a), scratch);
}

// Runs every attention task. With several query blocks per group, the
// groups go in waves: each wave's K/V are first packed (one task per group)
// into the layout the tiles read fastest, then its blocks run against the
// packed copy. Packing copies values exactly, so results do not depend on
// the waves (or the thread count).
void RunAttentionTasks(const ExecutionOptions& exec, AttentionArgsF32* args,
                       PrefillJob* job, ScratchLease* packed) {
  const int64_t groups = args->batch * args->kv_heads;
  const int64_t per_group = args->num_blocks * args->num_chunks;
  const int64_t group_bytes = PackedGroupFloats(*args) * int64_t{sizeof(float)};
  const PackPolicy policy = g_pack_policy.load(std::memory_order_relaxed);
  const bool worth_it =
      policy == PackPolicy::kAlways ||
      (policy == PackPolicy::kAuto &&
       (args->kv_type != 0 ||
        BlockKeySpan(*args) * (args->head_dim_qk + args->head_dim_v) *
                int64_t{sizeof(float)} >= kPackMinF32BlockBytes));
  int64_t wave = 0;
  if (!args->decode_path && args->num_blocks >= 2 && worth_it &&
      group_bytes > 0 && group_bytes <= kPackedGroupMaxBytes) {
    wave = std::max<int64_t>(ExecutorThreads(exec), kPackedWaveBytes / group_bytes);
    wave = std::min(wave, groups);
    args->packed = packed->Get(static_cast<size_t>(wave * PackedGroupFloats(*args)));
  }
  if (args->packed == nullptr) {  // not worth it, or no memory for it
    RunWave(exec, 0, groups * per_group, job);
    return;
  }
  for (int64_t first = 0; first < groups && !job->out_of_memory.load(); first += wave) {
    const int64_t n = std::min(wave, groups - first);
    args->packed_first_group = first;
    RunTasks(exec, n, &RunPackTask, job);
    if (job->out_of_memory.load()) break;
    RunWave(exec, first * per_group, n * per_group, job);
  }
}

void RunCombineTask(void* arg, int64_t task) {
  PrefillJob* job = static_cast<PrefillJob*>(arg);
  job->kernels->combine_f32(*job->args, task);
}

void CopyStrides3(const int64_t* strides, int64_t* out) {
  out[0] = strides[0];
  out[1] = strides[1];
  out[2] = strides[2];
}

}  // namespace

void SetPackPolicy(PackPolicy policy) {
  g_pack_policy.store(policy, std::memory_order_relaxed);
}

TensorView MakeBHSD(const void* data, DType dtype, int64_t b, int64_t h,
                    int64_t s, int64_t d) {
  return MakeView<TensorView>(data, dtype, b, h, s, d, false);
}
MutableTensorView MakeBHSD(void* data, DType dtype, int64_t b, int64_t h,
                           int64_t s, int64_t d) {
  return MakeView<MutableTensorView>(data, dtype, b, h, s, d, false);
}
TensorView MakeBSHD(const void* data, DType dtype, int64_t b, int64_t h,
                    int64_t s, int64_t d) {
  return MakeView<TensorView>(data, dtype, b, h, s, d, true);
}
MutableTensorView MakeBSHD(void* data, DType dtype, int64_t b, int64_t h,
                           int64_t s, int64_t d) {
  return MakeView<MutableTensorView>(data, dtype, b, h, s, d, true);
}

Status Attention(const TensorView& q, const TensorView& k, const TensorView& v,
                 const MutableTensorView& o, const AttentionOptions& options,
                 const MutableTensorView& lse, const ExecutionOptions& exec,
                 RunInfo* info) {
  try {
    Problem p;
    Status s = ValidateInputs(q, k, v, options, &p);
    if (!s.ok()) return s;
    s = ValidateOutputs(p, q, k, v, options, o, lse);
    if (!s.ok()) return s;
    s = CheckCovered(p, options);
    if (!s.ok()) return s;
    const TargetEntry* target = nullptr;
    s = ChooseTarget(&target);
    if (!s.ok()) return s;
    const TargetKernels& kernels = *target->kernels;

    AttentionArgsF32 args;
    args.batch = p.batch;
    args.q_heads = p.q_heads;
    args.kv_heads = p.kv_heads;
    args.group = p.group;
    args.q_len = p.q_len;
    args.kv_len = p.kv_len;
    args.head_dim_qk = p.head_dim_qk;
    args.head_dim_v = p.head_dim_v;
    auto type_code = [](DType t) {
      return t == DType::kF32 ? 0 : t == DType::kF16 ? 1 : 2;
    };
    args.q_type = type_code(q.dtype);
    args.o_type = type_code(o.dtype);
    args.q = q.data;
    CopyStrides3(q.strides, args.q_strides);
    args.kv_type = type_code(k.dtype);
    args.k = k.data;
    CopyStrides3(k.strides, args.k_strides);
    args.v = v.data;
    CopyStrides3(v.strides, args.v_strides);
    args.o = o.data;
    CopyStrides3(o.strides, args.o_strides);
    args.lse = static_cast<float*>(lse.data);
    CopyStrides3(lse.strides, args.lse_strides);
    args.scale = p.scale;
    args.causal = options.causal;
    args.bottom_right = options.alignment == Alignment::kBottomRight;
    args.kv_lengths = options.kv_lengths;
    // A window wider than both lengths cuts nothing: treat it as unbounded,
    // which also keeps the kernel's index arithmetic far from overflow.
    const int64_t span = p.q_len + p.kv_len;
    args.window_left = options.window_left > span ? -1 : options.window_left;
    args.window_right = options.window_right > span ? -1 : options.window_right;
    args.softcap = options.softcap;
    args.alibi_slopes = options.alibi_slopes;
    args.sinks = options.sinks;
    args.dropout_p = options.dropout_p;
    args.dropout_seed = options.dropout_seed;
    args.mask_kind = 0;
    args.mask = nullptr;
    for (int i = 0; i < 4; ++i) args.mask_strides[i] = p.mask_strides[i];
    if (p.has_mask) {
      args.mask = options.mask.data;
      args.mask_kind = options.mask.dtype == DType::kBool  ? 1
                       : options.mask.dtype == DType::kF32 ? 2
                                                           : 3;
    }
    // Work split. Prefill: one task per block of rows against all keys.
    // Decode (few queries per head): all query heads of a KV group share a
    // block, so each K/V byte is read once per call, and the keys are split
    // into fixed chunks (flash-decoding) so that every thread streams even
    // when B x Hkv is small. Neither depends on the thread count.
    args.block_rows = kernels.query_block_rows();
    // A group with at most half a block of rows (decode) takes half as many
    // vectors of queries, down to one: the others would only compute padding.
    const int64_t vector_rows = args.block_rows / kQueryBlockVectors;
    while (p.group * p.q_len * 2 <= args.block_rows &&
           args.block_rows / 2 >= vector_rows) {
      args.block_rows /= 2;
    }
    args.num_blocks = (p.group * p.q_len + args.block_rows - 1) / args.block_rows;
    args.num_chunks = 1;
    args.chunk_keys = p.kv_len;
    args.partials = nullptr;
    args.packed = nullptr;
    args.packed_first_group = 0;
    const double o_bytes = 4.0 * static_cast<double>(p.batch) *
                           static_cast<double>(p.q_heads) *
                           static_cast<double>(p.q_len) *
                           static_cast<double>(p.head_dim_v);
    args.stream_output =
        args.o_type == 0 && o_bytes >= static_cast<double>(kStreamOutputBytes);
    // The decode micro-path (every option runs on it): Lq = 1, or a few
    // queries per head (speculative decoding) while the group has at most
    // kDecodeMaxRows rows; all of a group's rows in one block of at most
    // two vectors of queries.
    const int64_t group_rows = p.group * p.q_len;
    args.decode_path = group_rows <= args.block_rows &&
                       args.block_rows <= 2 * vector_rows &&
                       (p.q_len == 1 || group_rows <= kDecodeMaxRows);
    if (p.q_len <= kDecodeMaxQueries && p.kv_len > kDecodeChunkKeys) {
      // (groups <= the rows of Q, so the product does not overflow.)
      const int64_t groups = p.batch * p.kv_heads * args.num_blocks;
      int64_t chunk = kDecodeChunkKeys;
      while (chunk < kDecodeMaxChunkKeys) {
        const int64_t longer = (p.kv_len + 2 * chunk - 1) / (2 * chunk);
        if (groups < kDecodeMinTasks && longer < (kDecodeMinTasks + groups - 1) / groups) break;
        chunk *= 2;
      }
      const int64_t min_chunk = (p.kv_len + kMaxSplitChunks - 1) / kMaxSplitChunks;
      args.chunk_keys = std::max(chunk, (min_chunk + 63) / 64 * 64);
      args.num_chunks = (p.kv_len + args.chunk_keys - 1) / args.chunk_keys;
    }

    ScratchLease partials(&t_partials);
    ScratchLease packed(&t_packed);
    PrefillJob job;
    job.args = &args;
    job.kernels = &kernels;
    job.scratch_floats = kernels.scratch_floats(p.head_dim_qk, p.head_dim_v);
    // The calling thread's buffers first: a failure here writes nothing.
    if (t_scratch.Get(job.scratch_floats) == nullptr ||
        (args.num_chunks > 1 &&
         (args.partials = partials.Get(static_cast<size_t>(PartialFloats(args)))) == nullptr)) {
      Status oom;
      oom.code = StatusCode::kInternal;
      oom.message = "out of memory allocating per-thread scratch";
      return oom;
    }
    const int64_t num_tasks = AttentionTaskCount(args);
    RunAttentionTasks(exec, &args, &job, &packed);
    if (!job.out_of_memory.load() && args.num_chunks > 1) {
      RunTasks(exec, CombineTaskCount(args), &RunCombineTask, &job);
    }
    if (job.out_of_memory.load()) {
      Status oom;
      oom.code = StatusCode::kInternal;
      oom.message =
          "out of memory allocating a worker thread's scratch; o is partly "
          "written";
      return oom;
    }
    if (info != nullptr) {
      info->target = target->name;
      info->num_tasks = num_tasks;
    }
    return Status::Ok();
  } catch (const std::bad_alloc&) {
    Status oom;
    oom.code = StatusCode::kInternal;
    oom.message = "out of memory";
    return oom;
  } catch (...) {
    Status err;
    err.code = StatusCode::kInternal;
    err.message = "unexpected exception";
    return err;
  }
}

}  // namespace simdattn
