// Concurrent callers: 8 host threads calling Attention() at once, with
// different shapes and options, on one shared ThreadPool, on pools of their
// own, on the process-wide default pool and through a host parallel-for,
// each result bit for bit the single-threaded call's; a pool destroyed
// while a thread that used it sits idle; and SetMaxTarget changed while
// calls run (each call runs on the target it read at its start). Built to
// run under ThreadSanitizer (tools/sanitize.sh).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "simdattn/attention.h"
#include "tests/attention_harness.h"

namespace simdattn {
namespace test {
namespace {

constexpr int kCallers = 8;

// What a call wrote: O's bytes and the LSE.
struct Result {
  std::vector<uint8_t> o;
  std::vector<float> lse;
  std::string target;
  Status status;
};

// Four calls whose plans differ: a split 16-bit decode, a causal prefill
// with LSE, a bf16 window with softcap (bottom-right), dropout.
std::vector<Case> Cases() {
  std::vector<Case> cases(4);
  Case& decode = cases[0];
  decode.q_heads = 4, decode.kv_heads = 2, decode.q_len = 1, decode.kv_len = 700;
  decode.dk = 32, decode.dv = 32, decode.kv_dtype = DType::kF16;
  Case& prefill = cases[1];
  prefill.batch = 2, prefill.q_heads = 4, prefill.kv_heads = 4;
  prefill.q_len = 40, prefill.kv_len = 50, prefill.dk = 16, prefill.dv = 16;
  prefill.options.causal = true;
  prefill.options.alignment = Alignment::kTopLeft;
  Case& window = cases[2];
  window.q_heads = 2, window.kv_heads = 1, window.q_len = 70, window.kv_len = 90;
  window.dk = 24, window.dv = 16;
  window.q_dtype = window.kv_dtype = window.o_dtype = DType::kBF16;
  window.options.window_left = 20;
  window.options.softcap = 15.0f;
  window.options.alignment = Alignment::kBottomRight;
  window.lse = false;
  Case& dropout = cases[3];
  dropout.batch = 2, dropout.q_heads = 3, dropout.q_len = 33, dropout.kv_len = 33;
  dropout.options.dropout_p = 0.2f;
  dropout.options.dropout_seed = 17;
  return cases;
}

// One call of `c` with a fresh sentinel-filled output; exec as given (its
// max_target caps this call only, so that threads never touch the
// process-wide cap).
Result Call(const Case& c, const Inputs& in, const ExecutionOptions& exec) {
  Tensor o(c.o_dtype, c.batch, c.q_heads, c.q_len, c.dv, c.layout, c.pad, c.offset);
  o.FillBytes(0xA5);
  Result r;
  MutableTensorView lse;
  if (c.lse) {
    r.lse.assign(static_cast<size_t>(c.batch * c.q_heads * c.q_len), 12345.0f);
    lse = MakeBHSD(r.lse.data(), DType::kF32, c.batch, c.q_heads, c.q_len, 1);
  }
  RunInfo info;
  r.status = Attention(in.q.View(), in.k.View(), in.v.View(), o.MutableView(),
                       c.options, lse, exec, &info);
  r.o.assign(o.bytes.begin(), o.bytes.end());
  r.target = info.target;
  return r;
}

// The cases, their inputs, and each one's single-threaded result on every
// target under test.
struct Fixture {
  std::vector<Case> cases = Cases();
  std::vector<Inputs> inputs;
  std::map<std::string, std::vector<Result>> want;  // by target

  Fixture() {
    ThreadPool one(1);
    for (size_t i = 0; i < cases.size(); ++i) {
      inputs.push_back(MakeInputs(cases[i], 8100 + static_cast<uint32_t>(i)));
    }
    for (const std::string& target : TestTargets()) {
      ExecutionOptions exec;
      exec.pool = &one;
      exec.max_target = target.c_str();
      for (size_t i = 0; i < cases.size(); ++i) {
        want[target].push_back(Call(cases[i], inputs[i], exec));
        EXPECT_TRUE(want[target].back().status.ok()) << want[target].back().status.message;
        RecordTargetRun(want[target].back().target);
      }
    }
  }

  // Whether r is the single-threaded result of case i on r.target.
  bool Matches(size_t i, const Result& r) const {
    const auto it = want.find(r.target);
    if (!r.status.ok() || it == want.end()) return false;
    return r.o == it->second[i].o && r.lse == it->second[i].lse;
  }
};

int Rounds() { return QuickMode() ? 2 : 4; }

// kCallers threads at once, thread t running case t % 4 on every target
// under test, `Rounds()` times; exec_of(t) gives its executor. Returns the
// calls whose result differed.
template <typename ExecOf>
int RunCallers(const Fixture& f, const ExecOf& exec_of) {
  std::atomic<int> mismatches{0};
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kCallers; ++t) {
    threads.emplace_back([&, t] {
      const size_t i = static_cast<size_t>(t) % f.cases.size();
      ready.fetch_add(1);
      while (ready.load() < kCallers) std::this_thread::yield();  // start together
      for (int round = 0; round < Rounds(); ++round) {
        for (const std::string& target : TestTargets()) {
          ExecutionOptions exec = exec_of(t);
          exec.max_target = target.c_str();
          const Result r = Call(f.cases[i], f.inputs[i], exec);
          if (!f.Matches(i, r) || r.target != target) mismatches.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  return mismatches.load();
}

TEST(ConcurrencyTest, CallersShareOnePool) {
  const Fixture f;
  ThreadPool shared(3);
  EXPECT_EQ(RunCallers(f, [&](int) {
              ExecutionOptions exec;
              exec.pool = &shared;
              return exec;
            }), 0);
}

TEST(ConcurrencyTest, CallersWithPoolsOfTheirOwn) {
  const Fixture f;
  std::vector<std::unique_ptr<ThreadPool>> pools;
  for (int t = 0; t < kCallers; ++t) pools.push_back(std::make_unique<ThreadPool>(1 + t % 3));
  EXPECT_EQ(RunCallers(f, [&](int t) {
              ExecutionOptions exec;
              exec.pool = pools[static_cast<size_t>(t)].get();
              return exec;
            }), 0);
}

TEST(ConcurrencyTest, CallersOnTheDefaultPool) {
  const Fixture f;
  EXPECT_EQ(RunCallers(f, [](int) { return ExecutionOptions(); }), 0);
}

// A host engine's parallel-for: its own pool of 3 threads, shared by every
// caller (so a caller's tasks may wait behind another's).
void HostParallelFor(void* user, int64_t n, void (*task)(void*, int64_t), void* arg) {
  static_cast<ThreadPool*>(user)->ParallelFor(n, task, arg);
}

TEST(ConcurrencyTest, CallersThroughAHostParallelFor) {
  const Fixture f;
  ThreadPool host(3);
  EXPECT_EQ(RunCallers(f, [&](int t) {
              ExecutionOptions exec;
              exec.parallel_for = &HostParallelFor;
              exec.parallel_for_user = &host;
              exec.parallel_for_threads = t % 2 == 0 ? 3 : 0;
              return exec;
            }), 0);
}

// A pool is destroyed while a thread that called through it sits idle
// (and while its workers spin, then while they sleep); that thread then
// calls again on another pool and on the default one.
TEST(ConcurrencyTest, PoolDestroyedWhileACallerIsIdle) {
  const Fixture f;
  const std::string target = TestTargets().front();
  for (int pause_us : {0, 2000}) {
    auto pool = std::make_unique<ThreadPool>(3);
    std::mutex m;
    std::condition_variable cv;
    int stage = 0;
    int mismatches = 0;
    std::thread idle([&] {
      ExecutionOptions exec;
      exec.pool = pool.get();
      exec.max_target = target.c_str();
      mismatches += !f.Matches(0, Call(f.cases[0], f.inputs[0], exec));
      std::unique_lock<std::mutex> lock(m);
      stage = 1;
      cv.notify_all();
      cv.wait(lock, [&] { return stage == 2; });  // idle while the pool goes
      lock.unlock();
      ThreadPool other(2);
      exec.pool = &other;
      mismatches += !f.Matches(1, Call(f.cases[1], f.inputs[1], exec));
      exec.pool = nullptr;
      mismatches += !f.Matches(2, Call(f.cases[2], f.inputs[2], exec));
    });
    {
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return stage == 1; });
    }
    std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
    pool.reset();
    {
      std::lock_guard<std::mutex> lock(m);
      stage = 2;
    }
    cv.notify_all();
    idle.join();
    EXPECT_EQ(mismatches, 0) << "pause " << pause_us << " us";
  }
}

// SetMaxTarget flips between the targets under test while callers run
// without a cap of their own: each result is the single-threaded one of
// the target that call reports, never a mix.
TEST(ConcurrencyTest, SetMaxTargetWhileCallsRun) {
  const Fixture f;
  const std::vector<std::string> targets = TestTargets();
  std::atomic<bool> done{false};
  std::atomic<int> mismatches{0}, calls{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      const size_t i = static_cast<size_t>(t) % f.cases.size();
      ThreadPool pool(2);
      ExecutionOptions exec;
      exec.pool = &pool;
      for (int n = 0; n < 4 * Rounds() || !done.load(); ++n) {
        if (n > 400) break;
        const Result r = Call(f.cases[i], f.inputs[i], exec);
        if (!f.Matches(i, r)) mismatches.fetch_add(1);
        calls.fetch_add(1);
      }
    });
  }
  for (int flip = 0; flip < 50; ++flip) {
    const std::string& name = targets[static_cast<size_t>(flip) % targets.size()];
    EXPECT_TRUE(SetMaxTarget(name.c_str()).ok());
    std::this_thread::sleep_for(std::chrono::microseconds(300));
  }
  done.store(true);
  for (std::thread& th : callers) th.join();
  EXPECT_TRUE(SetMaxTarget(nullptr).ok());
  EXPECT_EQ(mismatches.load(), 0) << "of " << calls.load() << " calls";
}

}  // namespace
}  // namespace test
}  // namespace simdattn
