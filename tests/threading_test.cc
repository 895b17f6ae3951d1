// Threads: the pool runs every task once, results are bit-identical for any
// thread count or host parallel-for, and calls nested on the calling thread
// or inside a task of the same pool neither deadlock nor share buffers.

#include <atomic>
#include <chrono>
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

// The pool's workers spin for a while after a call, then sleep: calls in
// quick succession (a spinning worker picks them up), calls after a pause
// longer than the spin (a sleeping worker must be woken), and calls from two
// threads at once (serialized) must each run every task exactly once and
// return only after all of them finished.
TEST(ThreadPoolTest, EveryTaskRunsOnceWhetherWorkersSpinOrSleep) {
  ThreadPool pool(3);
  ASSERT_EQ(pool.num_threads(), 3);
  struct Call {
    std::atomic<int> runs[16];
    std::atomic<int> unfinished{0};
  };
  const auto task = [](void* arg, int64_t i) {
    Call* c = static_cast<Call*>(arg);
    // Tasks take different times, so that the threads finish apart.
    if (i % 5 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50 * (i % 3)));
    c->runs[i].fetch_add(1);
    c->unfinished.fetch_sub(1);
  };
  const auto run_calls = [&](int calls, int seed, int* failures) {
    for (int n = 0; n < calls; ++n) {
      Call c;
      const int tasks = 1 + (n * 7 + seed) % 16;
      for (auto& r : c.runs) r.store(0);
      c.unfinished.store(tasks);
      pool.ParallelFor(tasks, task, &c);
      bool ok = c.unfinished.load() == 0;  // all finished before the return
      for (int i = 0; i < 16; ++i) ok &= c.runs[i].load() == (i < tasks ? 1 : 0);
      if (!ok) ++*failures;
      // Now and then a pause well past the spin, so that workers sleep.
      if (n % 10 == 9) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };
  int failures = 0;
  run_calls(200, 0, &failures);
  EXPECT_EQ(failures, 0);
  int failures_a = 0, failures_b = 0;
  std::thread other([&] { run_calls(100, 3, &failures_b); });
  run_calls(100, 1, &failures_a);
  other.join();
  EXPECT_EQ(failures_a, 0);
  EXPECT_EQ(failures_b, 0);
}

// A host engine's parallel-for: runs the tasks in reverse on its own threads.
void ReverseParallelFor(void* user, int64_t num_tasks,
                        void (*task)(void*, int64_t), void* arg) {
  int* calls = static_cast<int*>(user);
  ++*calls;
  std::thread t([&] {
    for (int64_t i = num_tasks - 1; i >= 0; i -= 2) task(arg, i);
  });
  for (int64_t i = num_tasks - 2; i >= 0; i -= 2) task(arg, i);
  t.join();
}

TEST(ThreadingTest, BitIdenticalForAnyThreadCount) {
  Case c;
  c.batch = 2;
  c.q_heads = 4;
  c.kv_heads = 2;
  c.q_len = QuickMode() ? 70 : 150;
  c.kv_len = QuickMode() ? 90 : 300;
  c.dk = 64;
  c.dv = 64;
  c.options.causal = true;
  c.options.alignment = Alignment::kTopLeft;
  const Inputs in = MakeInputs(c, 1200);
  ThreadPool pool1(1), pool2(2), pool3(3);
  for (PackPolicy pack : {PackPolicy::kAlways, PackPolicy::kNever})
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target + (pack == PackPolicy::kAlways ? " packed" : " in place"));
    ScopedPackPolicy policy(pack);
    ExecutionOptions e1, e2, e3, ehost;
    e1.pool = &pool1;
    e2.pool = &pool2;
    e3.pool = &pool3;
    int calls = 0;
    ehost.parallel_for = &ReverseParallelFor;
    ehost.parallel_for_user = &calls;
    const Outputs o1 = RunFast(c, in, target, e1);
    const Outputs o2 = RunFast(c, in, target, e2);
    const Outputs o3 = RunFast(c, in, target, e3);
    const Outputs oh = RunFast(c, in, target, ehost);
    ASSERT_TRUE(o1.status.ok() && o2.status.ok() && o3.status.ok() &&
                oh.status.ok());
    EXPECT_GE(calls, 1);  // the host's parallel-for ran the tasks
    EXPECT_GT(o1.info.num_tasks, 3);
    EXPECT_EQ(o1.o.bytes, o2.o.bytes);
    EXPECT_EQ(o1.o.bytes, o3.o.bytes);
    EXPECT_EQ(o1.o.bytes, oh.o.bytes);
    EXPECT_EQ(o1.lse, o2.lse);
    EXPECT_EQ(o1.lse, o3.lse);
    EXPECT_EQ(o1.lse, oh.lse);
  }
}

TEST(ThreadingTest, DropoutBitIdenticalForAnyThreadCount) {
  Case c;
  c.batch = 2;
  c.q_heads = 3;
  c.q_len = 70;
  c.kv_len = 130;
  c.dk = 16;
  c.dv = 16;
  c.options.dropout_p = 0.25f;
  c.options.dropout_seed = 99;
  c.options.window_left = 50;
  c.options.alignment = Alignment::kTopLeft;
  const Inputs in = MakeInputs(c, 2900);
  ThreadPool pool1(1), pool3(3);
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target);
    ExecutionOptions e1, e3;
    e1.pool = &pool1;
    e3.pool = &pool3;
    const Outputs o1 = RunFast(c, in, target, e1);
    const Outputs o3 = RunFast(c, in, target, e3);
    ASSERT_TRUE(o1.status.ok() && o3.status.ok());
    EXPECT_EQ(o1.o.bytes, o3.o.bytes);
  }
}

// A host parallel-for that, like a work-stealing runtime, runs unrelated
// work on the calling thread while a call's tasks are pending: here, once
// per round of tasks, another Attention() call of the same shape with other
// inputs, before running the round's tasks itself.
struct StealingHost {
  const Case* c;
  const Inputs* other;
  Tensor* other_o;
  int nested = 0;
  bool nested_ok = true;
};

void StealingParallelFor(void* user, int64_t num_tasks,
                         void (*task)(void*, int64_t), void* arg) {
  StealingHost* h = static_cast<StealingHost*>(user);
  if (h->nested < 4) {
    ++h->nested;
    ThreadPool inline_pool(1);
    ExecutionOptions exec;
    exec.pool = &inline_pool;
    h->nested_ok &= Attention(h->other->q.View(), h->other->k.View(),
                              h->other->v.View(), h->other_o->MutableView(),
                              h->c->options, {}, exec)
                        .ok();
  }
  for (int64_t i = 0; i < num_tasks; ++i) task(arg, i);
}

// The calling thread's buffers (packed K/V, split partials) belong to one
// call at a time: a call nested on that thread gets its own.
TEST(ThreadingTest, CallNestedOnTheCallingThreadKeepsItsOwnBuffers) {
  for (int64_t q_len : {int64_t{1}, int64_t{70}}) {  // split decode, prefill
    Case c;
    c.q_heads = 4;
    c.kv_heads = 2;
    c.q_len = q_len;
    c.kv_len = QuickMode() ? 700 : 1500;  // split into 2 or 3 chunks
    c.dk = 16;
    c.dv = 16;
    c.kv_dtype = DType::kF16;
    const Inputs in = MakeInputs(c, 1180), other = MakeInputs(c, 1181);
    std::vector<double> ref, other_ref;
    ASSERT_TRUE(ReferenceAttention(in.q.View(), in.k.View(), in.v.View(),
                                   c.options, &ref, nullptr).ok());
    ASSERT_TRUE(ReferenceAttention(other.q.View(), other.k.View(), other.v.View(),
                                   c.options, &other_ref, nullptr).ok());
    Tensor o(DType::kF32, 1, 4, q_len, 16), other_o(DType::kF32, 1, 4, q_len, 16);
    StealingHost host{&c, &other, &other_o};
    ExecutionOptions exec;
    exec.parallel_for = &StealingParallelFor;
    exec.parallel_for_user = &host;
    ScopedPackPolicy policy(PackPolicy::kAlways);
    ASSERT_TRUE(Attention(in.q.View(), in.k.View(), in.v.View(), o.MutableView(),
                          c.options, {}, exec).ok());
    EXPECT_GE(host.nested, 2);  // a nested call in each round of tasks
    EXPECT_TRUE(host.nested_ok);
    EXPECT_LE(MaxError(o, ref, MaxAbs(in.v)), OutputBound(DType::kF16));
    EXPECT_LE(MaxError(other_o, other_ref, MaxAbs(other.v)), OutputBound(DType::kF16));
  }
}

// A host that calls Attention() from inside a task of the same pool (e.g. a
// per-request task) must not deadlock; the inner call runs inline.
TEST(ThreadingTest, NestedCallOnTheSamePool) {
  Case c;
  c.q_heads = 4;
  c.q_len = 40;
  c.kv_len = 50;
  c.dk = 16;
  c.dv = 16;
  const Inputs in = MakeInputs(c, 1500);
  std::vector<double> o_ref;
  ASSERT_TRUE(ReferenceAttention(in.q.View(), in.k.View(), in.v.View(),
                                 c.options, &o_ref, nullptr).ok());
  ThreadPool pool(2);
  struct Job {
    const Case* c;
    const Inputs* in;
    ThreadPool* pool;
    Tensor o[3];
    Status status[3];
  } job{&c, &in, &pool, {}, {}};
  for (Tensor& o : job.o) o = Tensor(DType::kF32, 1, 4, 40, 16);
  pool.ParallelFor(3, [](void* arg, int64_t i) {
    Job* j = static_cast<Job*>(arg);
    ExecutionOptions exec;
    exec.pool = j->pool;
    j->status[i] = Attention(j->in->q.View(), j->in->k.View(), j->in->v.View(),
                             j->o[i].MutableView(), j->c->options, {}, exec);
  }, &job);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(job.status[i].ok()) << job.status[i].message;
    EXPECT_LE(MaxError(job.o[i], o_ref, MaxAbs(in.v)), OutputBound(DType::kF32));
  }
}

}  // namespace
}  // namespace test
}  // namespace simdattn
