// A call with a caller-supplied workspace allocates nothing: this binary
// replaces malloc and its relatives (which operator new calls too) with
// counting wrappers around glibc's, and counts, on every thread, the
// allocations made while one call runs. It is its own executable so that
// the hooks stay out of the other tests.

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/reference.h"
#include "simdattn/simdattn.h"
#include "tests/attention_harness.h"

extern "C" {
void* __libc_malloc(size_t bytes);
void* __libc_calloc(size_t n, size_t bytes);
void* __libc_realloc(void* p, size_t bytes);
void* __libc_memalign(size_t alignment, size_t bytes);
void __libc_free(void* p);
}

namespace {

std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_allocations{0};

inline void Note() {
  if (g_counting.load(std::memory_order_relaxed)) {
    g_allocations.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace

extern "C" {
void* malloc(size_t bytes) noexcept {
  Note();
  return __libc_malloc(bytes);
}
void* calloc(size_t n, size_t bytes) noexcept {
  Note();
  return __libc_calloc(n, bytes);
}
void* realloc(void* p, size_t bytes) noexcept {
  Note();
  return __libc_realloc(p, bytes);
}
void free(void* p) noexcept { __libc_free(p); }
void* memalign(size_t alignment, size_t bytes) noexcept {
  Note();
  return __libc_memalign(alignment, bytes);
}
void* aligned_alloc(size_t alignment, size_t bytes) noexcept {
  Note();
  return __libc_memalign(alignment, bytes);
}
int posix_memalign(void** out, size_t alignment, size_t bytes) noexcept {
  Note();
  void* p = __libc_memalign(alignment, bytes);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}
}  // extern "C"

namespace simdattn {
namespace test {

namespace {

// Counts the allocations of every thread from its construction to Stop().
class AllocCount {
 public:
  AllocCount() {
    g_allocations.store(0);
    g_counting.store(true);
  }
  ~AllocCount() { g_counting.store(false); }
  int64_t Stop() {
    g_counting.store(false);
    return g_allocations.load();
  }
};

// The calls whose buffers differ (as in workspace_test.cc): a packed
// prefill with every option the kernels take, a split decode, the fused
// bf16 decode, and int32 kv lengths with dropout and sinks.
std::vector<Case> Cases() {
  std::vector<Case> cases(4);
  Case& prefill = cases[0];
  prefill.batch = 2, prefill.q_heads = 4, prefill.kv_heads = 2;
  prefill.q_len = 70, prefill.kv_len = 90, prefill.dk = 32, prefill.dv = 24;
  prefill.kv_dtype = DType::kF16;
  prefill.options.causal = true;
  prefill.options.alignment = Alignment::kBottomRight;
  prefill.options.softcap = 20.0f;
  Case& split = cases[1];
  split.q_heads = 8, split.kv_heads = 2, split.q_len = 1;
  split.kv_len = QuickMode() ? 1100 : 3000, split.dk = 64, split.dv = 64;
  Case& fused = cases[2];
  fused = split;
  fused.kv_dtype = DType::kBF16;
  fused.lse = false;
  Case& lengths = cases[3];
  lengths = prefill;
  lengths.options.dropout_p = 0.1f;
  lengths.options.window_left = 30;
  return cases;
}

// A host parallel-for backed by a pool (which allocates nothing per call).
void PoolParallelFor(void* user, int64_t n, void (*task)(void*, int64_t),
                     void* arg) {
  static_cast<ThreadPool*>(user)->ParallelFor(n, task, arg);
}

TEST(AllocTest, CallWithWorkspaceAllocatesNothing) {
  const int32_t lens[2] = {90, 47};
  const float sinks[4] = {0.5f, -1.0f, 2.0f, 0.0f};
  ThreadPool pool(3), host_pool(2);
  int n = 0;
  int64_t calls = 0;
  for (Case c : Cases()) {
    if (n == 3) {
      c.options.kv_lengths_i32 = lens;
      c.options.sinks = sinks;
    }
    SCOPED_TRACE(Describe(c));
    const Inputs in = MakeInputs(c, 5100 + n++);
    std::vector<double> o_ref;
    ASSERT_TRUE(ReferenceAttention(in.q.View(), in.k.View(), in.v.View(),
                                   c.options, &o_ref, nullptr).ok());
    for (const std::string& target : TestTargets()) {
      for (int executor = 0; executor < 3; ++executor) {
        SCOPED_TRACE(target + " executor " + std::to_string(executor));
        ExecutionOptions exec;
        exec.max_target = target.c_str();
        if (executor == 1) exec.pool = &pool;
        if (executor == 2) {
          exec.parallel_for = &PoolParallelFor;
          exec.parallel_for_user = &host_pool;
          exec.parallel_for_threads = 2;
        }
        size_t bytes = 0;
        ASSERT_TRUE(WorkspaceSize(in.q.View(), in.k.View(), in.v.View(),
                                  c.options, exec, &bytes).ok());
        std::vector<uint8_t> workspace(bytes);
        exec.workspace = workspace.data();
        exec.workspace_bytes = bytes;
        // RunFast's output and its first call (target table, default pool)
        // allocate; the second call, counted, must not.
        Outputs out = RunFast(c, in, target, exec);
        ASSERT_TRUE(out.status.ok()) << out.status.message;
        MutableTensorView lse;
        if (c.lse) {
          lse = MakeBHSD(out.lse.data(), DType::kF32, c.batch, c.q_heads, c.q_len, 1);
        }
        out.o.FillBytes(0xA5);
        RunInfo info;
        AllocCount count;
        const Status s = Attention(in.q.View(), in.k.View(), in.v.View(),
                                   out.o.MutableView(), c.options, lse, exec, &info);
        EXPECT_EQ(count.Stop(), 0);
        ASSERT_TRUE(s.ok()) << s.message;
        EXPECT_EQ(std::string(info.target), target);
        EXPECT_LE(MaxError(out.o, o_ref, MaxAbs(in.v)), OutputBound(Narrowest(c)));
        ++calls;
      }
    }
  }
  std::printf("alloc test: %lld calls with a workspace, 0 allocations\n",
              static_cast<long long>(calls));
}

// The same through the C API, whose shim adds its conversions, checks and
// the per-thread error message: int32 kv lengths (widened in the
// workspace), ALiBi slopes and sinks with their lengths.
TEST(AllocTest, CApiCallWithWorkspaceAllocatesNothing) {
  Case c = Cases()[3];
  const Inputs in = MakeInputs(c, 5300);
  Tensor o(DType::kF32, c.batch, c.q_heads, c.q_len, c.dv);
  const simdattn_tensor q = ToC(in.q.View()), k = ToC(in.k.View()),
                        v = ToC(in.v.View()), out = ToC(o.MutableView());
  const int32_t lens[2] = {90, 47};
  simdattn_options options;
  simdattn_options_init(&options);
  options.causal = 1;
  options.alignment = SIMDATTN_ALIGN_BOTTOM_RIGHT;
  options.kv_lengths = lens;
  options.kv_lengths_dtype = SIMDATTN_I32;
  options.num_kv_lengths = 2;
  const float per_head[4] = {0.5f, 0.25f, -1.0f, 0.0f};
  options.alibi_slopes = per_head;
  options.num_alibi_slopes = 4;
  options.sinks = per_head;
  options.num_sinks = 4;
  simdattn_pool* pool = simdattn_pool_create(2);
  ASSERT_NE(pool, nullptr);
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target);
    simdattn_exec exec;
    simdattn_exec_init(&exec);
    exec.pool = pool;
    exec.max_target = target.c_str();
    size_t bytes = 0;
    ASSERT_EQ(simdattn_workspace_size(&q, &k, &v, &options, &exec, &bytes), SIMDATTN_OK);
    std::vector<uint8_t> workspace(bytes);
    exec.workspace = workspace.data();
    exec.workspace_bytes = bytes;
    simdattn_run_info info;
    info.struct_size = sizeof(info);
    ASSERT_EQ(simdattn_attention(&q, &k, &v, &out, &options, nullptr, &exec, &info),
              SIMDATTN_OK);
    RecordTargetRun(info.target);
    AllocCount count;
    const int status = simdattn_attention(&q, &k, &v, &out, &options, nullptr, &exec, &info);
    EXPECT_EQ(count.Stop(), 0);
    EXPECT_EQ(status, SIMDATTN_OK) << simdattn_last_error();
    EXPECT_EQ(std::string(info.target), target);
  }
  simdattn_pool_destroy(pool);
}

// The counter does see the library allocate: a call without a workspace
// after ReleaseThreadBuffers() takes its buffers from the heap again.
TEST(AllocTest, CallWithoutWorkspaceAllocatesAfterRelease) {
  const Case c = Cases()[1];
  const Inputs in = MakeInputs(c, 5200);
  const Outputs warm = RunFast(c, in, TestTargets().front());
  ASSERT_TRUE(warm.status.ok());
  Tensor o(DType::kF32, c.batch, c.q_heads, c.q_len, c.dv);
  ThreadPool one(1);
  ExecutionOptions exec;
  exec.pool = &one;
  ASSERT_TRUE(Attention(in.q.View(), in.k.View(), in.v.View(), o.MutableView(),
                        c.options, {}, exec).ok());
  {
    AllocCount steady;  // buffers cached by the previous call
    ASSERT_TRUE(Attention(in.q.View(), in.k.View(), in.v.View(), o.MutableView(),
                          c.options, {}, exec).ok());
    EXPECT_EQ(steady.Stop(), 0);
  }
  ReleaseThreadBuffers();
  AllocCount count;
  ASSERT_TRUE(Attention(in.q.View(), in.k.View(), in.v.View(), o.MutableView(),
                        c.options, {}, exec).ok());
  EXPECT_GE(count.Stop(), 2);  // scratch and partial results
}

}  // namespace
}  // namespace test
}  // namespace simdattn
