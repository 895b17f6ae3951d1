// Caller-supplied workspaces: WorkspaceSize() covers every buffer of a call
// (packed K/V, split partials, widened kv lengths, the workers' scratch), a
// call in a workspace gives the same bits as one with the per-thread buffers
// on every target, a short workspace is an error that writes nothing, and a
// host running more tasks at once than it declared still gets them all.
// (That such a call allocates nothing is alloc_test.cc's.)

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "lib/reference.h"
#include "tests/attention_harness.h"

namespace simdattn {
namespace test {
namespace {

// The cases whose buffers differ: a packed prefill, a split decode (partial
// results), the fused 16-bit decode, and int32 kv lengths with options.
std::vector<Case> BufferCases() {
  std::vector<Case> cases(4);
  Case& prefill = cases[0];
  prefill.batch = 2, prefill.q_heads = 4, prefill.kv_heads = 2;
  prefill.q_len = 70, prefill.kv_len = 90, prefill.dk = 32, prefill.dv = 24;
  prefill.kv_dtype = DType::kF16;
  prefill.options.causal = true;
  prefill.options.alignment = Alignment::kBottomRight;
  Case& split = cases[1];
  split.q_heads = 8, split.kv_heads = 2, split.q_len = 1;
  split.kv_len = QuickMode() ? 1100 : 3000, split.dk = 64, split.dv = 64;
  Case& fused = cases[2];
  fused = split;
  fused.kv_dtype = DType::kBF16;
  fused.lse = false;
  Case& lengths = cases[3];
  lengths = prefill;
  lengths.options.window_left = 20;
  lengths.options.softcap = 10.0f;
  return cases;
}

// A call of `c` on `target` in a fresh workspace of WorkspaceSize() bytes,
// starting one byte past an aligned address (any alignment is accepted).
Outputs RunInWorkspace(const Case& c, const Inputs& in,
                       const std::string& target, ExecutionOptions exec,
                       size_t* bytes) {
  exec.max_target = target.c_str();
  const Status s = WorkspaceSize(in.q.View(), in.k.View(), in.v.View(),
                                 c.options, exec, bytes);
  EXPECT_TRUE(s.ok()) << s.message;
  std::vector<uint8_t> workspace(*bytes + 1, 0xEE);
  exec.workspace = workspace.data() + 1;
  exec.workspace_bytes = *bytes;
  return RunFast(c, in, target, exec);
}

TEST(WorkspaceTest, SameBitsAsThreadBuffersOnEveryTarget) {
  const int32_t lens_i32[2] = {90, 61};
  ThreadPool pool(3);
  int n = 0;
  for (Case c : BufferCases()) {
    if (n == 3) c.options.kv_lengths_i32 = lens_i32;
    SCOPED_TRACE(Describe(c));
    const Inputs in = MakeInputs(c, 4100 + n++);
    std::vector<double> o_ref, lse_ref;
    ASSERT_TRUE(ReferenceAttention(in.q.View(), in.k.View(), in.v.View(),
                                   c.options, &o_ref, &lse_ref).ok());
    ScopedPackPolicy pack(PackPolicy::kAlways);
    for (const std::string& target : TestTargets()) {
      SCOPED_TRACE(target);
      ExecutionOptions exec;
      exec.pool = &pool;
      const Outputs cached = RunFast(c, in, target, exec);
      size_t bytes = 0;
      const Outputs in_ws = RunInWorkspace(c, in, target, exec, &bytes);
      ASSERT_TRUE(cached.status.ok()) << cached.status.message;
      ASSERT_TRUE(in_ws.status.ok()) << in_ws.status.message;
      EXPECT_EQ(std::string(in_ws.info.target), target);
      EXPECT_EQ(cached.o.bytes, in_ws.o.bytes);
      EXPECT_EQ(cached.lse, in_ws.lse);
      EXPECT_LE(MaxError(in_ws.o, o_ref, MaxAbs(in.v)), OutputBound(Narrowest(c)));
      ExpectPaddingUntouched(in_ws.o);
      // Three slots of scratch at least, one per pool thread.
      EXPECT_GT(bytes, 3 * 1024u);
    }
  }
}

TEST(WorkspaceTest, ShortWorkspaceIsAnErrorThatWritesNothing) {
  const Case c = BufferCases()[0];
  const Inputs in = MakeInputs(c, 4200);
  ExecutionOptions exec;
  size_t bytes = 0;
  ASSERT_TRUE(WorkspaceSize(in.q.View(), in.k.View(), in.v.View(), c.options,
                            exec, &bytes).ok());
  std::vector<uint8_t> workspace(bytes, 0xEE);
  exec.workspace = workspace.data();
  exec.workspace_bytes = bytes - 1;
  const Outputs out = RunFast(c, in, TestTargets().front(), exec);
  EXPECT_EQ(out.status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(out.status.message.find("exec.workspace_bytes = " + std::to_string(bytes - 1)),
            std::string::npos) << out.status.message;
  for (uint8_t byte : out.o.bytes) ASSERT_EQ(byte, 0xA5);
  for (float x : out.lse) ASSERT_EQ(x, 12345.0f);
  for (uint8_t byte : workspace) ASSERT_EQ(byte, 0xEE);

  // WorkspaceSize validates as Attention() does.
  Case bad = c;
  bad.options.alignment.reset();
  EXPECT_EQ(WorkspaceSize(in.q.View(), in.k.View(), in.v.View(), bad.options,
                          exec, &bytes).code,
            StatusCode::kInvalidArgument);
  exec.parallel_for_threads = -1;
  const Status neg = WorkspaceSize(in.q.View(), in.k.View(), in.v.View(),
                                   c.options, exec, &bytes);
  EXPECT_EQ(neg.code, StatusCode::kInvalidArgument);
  EXPECT_NE(neg.message.find("exec.parallel_for_threads = -1"), std::string::npos);
}

// A host parallel-for that declares one thread but runs tasks on three at
// once: the tasks share the one scratch slot of the workspace by turns.
void ThreeThreadParallelFor(void* user, int64_t num_tasks,
                            void (*task)(void*, int64_t), void* arg) {
  std::atomic<int64_t>* rounds = static_cast<std::atomic<int64_t>*>(user);
  rounds->fetch_add(1);
  std::atomic<int64_t> next{0};
  const auto drain = [&] {
    for (int64_t i = next.fetch_add(1); i < num_tasks; i = next.fetch_add(1)) task(arg, i);
  };
  std::thread a(drain), b(drain);
  drain();
  a.join();
  b.join();
}

TEST(WorkspaceTest, HostRunningMoreTasksThanDeclaredWaitsForSlots) {
  for (const Case& c : BufferCases()) {
    SCOPED_TRACE(Describe(c));
    const Inputs in = MakeInputs(c, 4300);
    const std::string target = TestTargets().front();
    ThreadPool one(1);
    ExecutionOptions single;
    single.pool = &one;
    const Outputs expect = RunFast(c, in, target, single);
    std::atomic<int64_t> rounds{0};
    ExecutionOptions host;
    host.parallel_for = &ThreeThreadParallelFor;
    host.parallel_for_user = &rounds;
    host.parallel_for_threads = 1;
    size_t bytes = 0;
    const Outputs out = RunInWorkspace(c, in, target, host, &bytes);
    ASSERT_TRUE(out.status.ok()) << out.status.message;
    EXPECT_GE(rounds.load(), 1);
    EXPECT_EQ(expect.o.bytes, out.o.bytes);
    EXPECT_EQ(expect.lse, out.lse);
  }
}

// ReleaseThreadBuffers frees the calling thread's buffers; the next call
// without a workspace allocates them again and gives the same bits.
TEST(WorkspaceTest, ReleasedBuffersComeBack) {
  const Case c = BufferCases()[1];
  const Inputs in = MakeInputs(c, 4400);
  ThreadPool one(1);
  ExecutionOptions exec;
  exec.pool = &one;
  const Outputs before = RunFast(c, in, TestTargets().front(), exec);
  ReleaseThreadBuffers();
  ReleaseThreadBuffers();
  const Outputs after = RunFast(c, in, TestTargets().front(), exec);
  ASSERT_TRUE(before.status.ok() && after.status.ok());
  EXPECT_EQ(before.o.bytes, after.o.bytes);
}

}  // namespace
}  // namespace test
}  // namespace simdattn
