// Memory of a call: RunInfo::scratch_bytes within attention.h's formula of
// the shapes (no Lq x Lk term), steady-state calls allocating nothing, and
// allocation failures injected at every allocation of a call (the calling
// thread's and the workers') returning kOutOfMemory with every output
// untouched, or, where a worker borrowed the spare scratch, the right result.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "lib/dispatch.h"
#include "lib/reference.h"
#include "lib/run.h"
#include "simdattn/serving.h"
#include "tests/attention_harness.h"

namespace simdattn {
namespace test {
namespace {

// Rows of a query block of the target named `name` (R in the formula).
int64_t BlockRows(const std::string& name) {
  for (const TargetEntry& e : TargetTable()) {
    if (name == e.name) return e.kernels->query_block_rows();
  }
  ADD_FAILURE() << "no target " << name;
  return 0;
}

// The shapes the formula reads: a dense call is one sequence with B, Hq,
// Hkv; a paged one passes B = 1 and the longest sequence's Lq and Lk, with
// p_rows the sum over sequences of Hq/Hkv x Lq (the split rows of P).
struct Shape {
  int64_t b, hq, hkv, lq, lk, dk, dv;
  bool lengths_i32 = false;
};

// attention.h, "Memory": one thread's scratch S.
double SlotBytes(const Shape& s, int64_t rows) {
  const double r = static_cast<double>(rows);
  return 4 * (r + 128) * static_cast<double>(s.dk + s.dv) + 1320 * r + 4096;
}

// P: the partial results of a split call (Lq <= 16).
double PartialBytes(const Shape& s, int64_t rows) {
  if (s.lq > 16) return 0;
  const double chunks = std::min<double>(256, static_cast<double>((s.lk + 511) / 512));
  return 4.0 * static_cast<double>(s.b * s.hkv) *
             static_cast<double>(s.hq / s.hkv * s.lq + rows) * chunks *
             static_cast<double>(s.dv + 2) + 256;
}

// (T + 1) S + P + W + L.
double FormulaBytes(const Shape& s, int64_t threads, int64_t rows) {
  const double t = static_cast<double>(threads);
  const double g = 4.0 * static_cast<double>(s.lk + 63) *
                   static_cast<double>(s.dk + s.dv + 62);
  const double packed = std::min(static_cast<double>(s.b * s.hkv) * g,
                                 std::max(t * g, 32.0 * (1 << 20)));
  const double lengths = s.lengths_i32 ? 8.0 * static_cast<double>(s.b) + 256 : 0;
  return (t + 1) * SlotBytes(s, rows) + PartialBytes(s, rows) + packed + lengths;
}

Case MakeCase(const Shape& s) {
  Case c;
  c.batch = s.b, c.q_heads = s.hq, c.kv_heads = s.hkv;
  c.q_len = s.lq, c.kv_len = s.lk, c.dk = s.dk, c.dv = s.dv;
  return c;
}

// Split decode, speculative decode, packed 16-bit prefill, in-place f32
// prefill and int32 kv lengths, each on every target and executor, with
// and without a workspace: within the formula, and nothing allocated with
// a workspace.
TEST(MemoryTest, ScratchBytesWithinFormula) {
  const Shape shapes[] = {{1, 8, 2, 1, 3000, 64, 64},
                          {2, 8, 2, 4, 1100, 64, 48},
                          {2, 4, 2, 200, 300, 32, 24},
                          {1, 4, 4, 150, 170, 40, 40},
                          {2, 4, 1, 70, 90, 16, 16, true}};
  const int32_t lens[2] = {90, 31};
  ThreadPool pool(3), host(2);
  for (const Shape& s : shapes) {
    Case c = MakeCase(s);
    if (s.dk == 32) c.kv_dtype = DType::kF16;
    if (s.lengths_i32) c.options.kv_lengths_i32 = lens;
    SCOPED_TRACE(Describe(c));
    const Inputs in = MakeInputs(c, 7100);
    for (const std::string& target : TestTargets()) {
      for (int executor = 0; executor < 3; ++executor) {
        SCOPED_TRACE(target + " executor " + std::to_string(executor));
        ExecutionOptions exec;
        if (executor == 1) exec.pool = &pool;
        if (executor == 2) {
          exec.parallel_for = [](void* user, int64_t n, void (*task)(void*, int64_t),
                                 void* arg) {
            static_cast<ThreadPool*>(user)->ParallelFor(n, task, arg);
          };
          exec.parallel_for_user = &host;
          exec.parallel_for_threads = 2;
        }
        const int64_t threads =
            executor == 0 ? std::max<int64_t>(1, std::thread::hardware_concurrency())
            : executor == 1 ? 3 : 2;
        Outputs out = RunFast(c, in, target, exec);
        ASSERT_TRUE(out.status.ok()) << out.status.message;
        const double bound = FormulaBytes(s, threads, BlockRows(out.info.target));
        EXPECT_GT(out.info.scratch_bytes, 0u);
        EXPECT_LE(static_cast<double>(out.info.scratch_bytes), bound);
        size_t bytes = 0;
        ASSERT_TRUE(WorkspaceSize(in.q.View(), in.k.View(), in.v.View(), c.options,
                                  exec, &bytes).ok());
        std::vector<uint8_t> workspace(bytes);
        exec.workspace = workspace.data();
        exec.workspace_bytes = bytes;
        out = RunFast(c, in, target, exec);
        ASSERT_TRUE(out.status.ok()) << out.status.message;
        EXPECT_LE(out.info.scratch_bytes, bytes);
        EXPECT_LE(static_cast<double>(out.info.scratch_bytes), bound);
        EXPECT_EQ(out.info.bytes_allocated, 0u);
      }
    }
  }
}

// The memory of a prefill does not grow with Lq (no Lq x Lk term), and at
// most in proportion with Lk (the packed K/V of a group).
TEST(MemoryTest, NoTermGrowsWithLqTimesLk) {
  ScopedPackPolicy pack(PackPolicy::kAlways);
  ThreadPool pool(2);
  ExecutionOptions exec;
  exec.pool = &pool;
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target);
    size_t bytes[3];
    const Shape shapes[3] = {{1, 2, 1, 64, 256, 32, 32},
                             {1, 2, 1, 512, 256, 32, 32},
                             {1, 2, 1, 512, 512, 32, 32}};
    for (int i = 0; i < 3; ++i) {
      const Case c = MakeCase(shapes[i]);
      const Inputs in = MakeInputs(c, 7200 + i);
      const Outputs out = RunFast(c, in, target, exec);
      ASSERT_TRUE(out.status.ok()) << out.status.message;
      bytes[i] = out.info.scratch_bytes;
    }
    EXPECT_EQ(bytes[0], bytes[1]);          // 8x the queries
    EXPECT_LE(bytes[2], 2 * bytes[1]);      // 2x the keys
    EXPECT_GT(bytes[2], bytes[1]);          // the packed K/V grew
  }
}

// A call's buffers are cached: the same call again takes nothing from the
// heap; after ReleaseThreadBuffers() the calling thread's come back. (One
// thread: a worker allocates its scratch on its first task, whichever call
// that is.)
TEST(MemoryTest, SteadyStateCallsAllocateNothing) {
  Case c = MakeCase({1, 8, 2, 1, 3000, 64, 64});
  const Inputs in = MakeInputs(c, 7300);
  ThreadPool pool(1);
  ExecutionOptions exec;
  exec.pool = &pool;
  const std::string target = TestTargets().front();
  ASSERT_TRUE(RunFast(c, in, target, exec).status.ok());
  const Outputs again = RunFast(c, in, target, exec);
  ASSERT_TRUE(again.status.ok());
  EXPECT_EQ(again.info.bytes_allocated, 0u);
  ReleaseThreadBuffers();
  const Outputs fresh = RunFast(c, in, target, exec);
  ASSERT_TRUE(fresh.status.ok());
  EXPECT_GT(fresh.info.bytes_allocated, 0u);
  EXPECT_LE(fresh.info.bytes_allocated, fresh.info.scratch_bytes);
}

// Turns the injected failure off at the end of a test, whatever happens.
struct ScopedNoFailure {
  ~ScopedNoFailure() { SetAllocationFailureForTesting(0); }
};

// One call of `run` (which returns the status and writes *o / *lse) with
// every buffer fresh (the calling thread's released, a new pool), failing
// at allocation n (0: none). Returns the status.
template <typename Run>
Status RunFresh(int64_t n, const Run& run) {
  ReleaseThreadBuffers();
  ThreadPool pool(3);  // workers with no scratch yet
  ExecutionOptions exec;
  exec.pool = &pool;
  SetAllocationFailureForTesting(n);
  const Status s = run(exec);
  SetAllocationFailureForTesting(0);
  return s;
}

// Fails each allocation of a fresh call in turn: first the calling
// thread's (scratch, spare, partials or packed K/V), which must give
// kOutOfMemory with o and lse byte for byte as before, then the workers'
// scratch, which they replace with the spare: kOk with the bits of the call
// without failure. `run` fills o and lse with a sentinel before the call.
template <typename Run>
void CheckEveryFailure(const Run& run, const std::vector<uint8_t>& sentinel_o,
                       const std::vector<uint8_t>& sentinel_lse,
                       std::vector<uint8_t>* o, std::vector<uint8_t>* lse) {
  const int64_t before = AllocationCountForTesting();
  ASSERT_TRUE(RunFresh(0, run).ok());
  const int64_t allocations = AllocationCountForTesting() - before;
  const std::vector<uint8_t> want_o = *o, want_lse = *lse;
  int64_t out_of_memory = 0, absorbed = 0;
  for (int64_t n = 1; n <= allocations; ++n) {
    const Status s = RunFresh(n, run);
    if (s.ok()) {
      EXPECT_EQ(*o, want_o) << "allocation " << n;
      EXPECT_EQ(*lse, want_lse) << "allocation " << n;
      ++absorbed;
      continue;
    }
    EXPECT_EQ(s.code, StatusCode::kOutOfMemory) << s.message;
    EXPECT_EQ(absorbed, 0) << "allocation " << n << " failed after a later one passed";
    EXPECT_EQ(*o, sentinel_o) << "allocation " << n << ": " << s.message;
    EXPECT_EQ(*lse, sentinel_lse) << "allocation " << n;
    ++out_of_memory;
  }
  EXPECT_GE(out_of_memory, 2);  // at least the calling thread's scratch and spare
  std::printf("  %lld allocations: %lld on the calling thread, %lld by workers\n",
              static_cast<long long>(allocations), static_cast<long long>(out_of_memory),
              static_cast<long long>(absorbed));
}

std::vector<uint8_t> Bytes(const Tensor& t) {
  return std::vector<uint8_t>(t.bytes.begin(), t.bytes.end());
}

// Attention(): a packed prefill, a split decode and int32 kv lengths.
TEST(MemoryTest, AllocationFailureLeavesOutputsUntouched) {
  ScopedNoFailure off;
  const int32_t lens[2] = {90, 31};
  const Shape shapes[] = {{2, 4, 2, 200, 300, 32, 24},
                          {1, 8, 2, 1, 3000, 64, 64},
                          {2, 4, 1, 70, 90, 16, 16, true}};
  for (const Shape& shape : shapes) {
    Case c = MakeCase(shape);
    c.kv_dtype = DType::kF16;
    if (shape.lengths_i32) c.options.kv_lengths_i32 = lens;
    SCOPED_TRACE(Describe(c));
    const Inputs in = MakeInputs(c, 7400);
    Tensor o(DType::kF32, c.batch, c.q_heads, c.q_len, c.dv);
    std::vector<float> lse(static_cast<size_t>(c.batch * c.q_heads * c.q_len));
    std::vector<uint8_t> o_bytes, lse_bytes;
    const auto run = [&](const ExecutionOptions& exec) {
      o.FillBytes(0xA5);
      std::fill(lse.begin(), lse.end(), 12345.0f);
      const MutableTensorView lse_view =
          MakeBHSD(lse.data(), DType::kF32, c.batch, c.q_heads, c.q_len, 1);
      const Status s = Attention(in.q.View(), in.k.View(), in.v.View(),
                                 o.MutableView(), c.options, lse_view, exec);
      o_bytes = Bytes(o);
      lse_bytes.assign(reinterpret_cast<const uint8_t*>(lse.data()),
                       reinterpret_cast<const uint8_t*>(lse.data() + lse.size()));
      return s;
    };
    o.FillBytes(0xA5);
    const std::vector<uint8_t> sentinel_o = Bytes(o);
    const std::vector<float> sentinel_lse_f(lse.size(), 12345.0f);
    const std::vector<uint8_t> sentinel_lse(
        reinterpret_cast<const uint8_t*>(sentinel_lse_f.data()),
        reinterpret_cast<const uint8_t*>(sentinel_lse_f.data() + lse.size()));
    CheckEveryFailure(run, sentinel_o, sentinel_lse, &o_bytes, &lse_bytes);
  }
}

// PagedAttention: a prefill chunk (packed K/V) next to decode sequences
// (one round of split tasks): every buffer of both is sized before either
// runs.
TEST(MemoryTest, PagedAllocationFailureLeavesOutputsUntouched) {
  ScopedNoFailure off;
  const int64_t hq = 4, hkv = 2, d = 32, block = 16, max_blocks = 80;
  const std::vector<int32_t> kv_lens = {1200, 700, 300};
  const std::vector<int32_t> cu = {0, 1, 2, 102};  // 1, 1 and 100 queries
  const int64_t total_q = cu.back();
  const int64_t num_blocks = max_blocks * 3;
  std::vector<int32_t> table(static_cast<size_t>(num_blocks));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(7));
  Tensor q(DType::kF32, 1, hq, total_q, d, Layout::kBSHD);
  Tensor k(DType::kF16, num_blocks, hkv, block, d, Layout::kBSHD);
  Tensor v(DType::kF16, num_blocks, hkv, block, d, Layout::kBSHD);
  std::mt19937 rng(7500);
  q.FillUniform(&rng, -1, 1);
  k.FillUniform(&rng, -1, 1);
  v.FillUniform(&rng, -1, 1);
  PagedKvCache cache;
  cache.k = k.View();
  cache.v = v.View();
  cache.block_table = table.data();
  cache.max_blocks_per_seq = max_blocks;
  cache.kv_lens = kv_lens.data();
  Tensor o(DType::kF32, 1, hq, total_q, d, Layout::kBSHD);
  std::vector<uint8_t> o_bytes, no_lse;
  AttentionOptions options;
  options.causal = true;
  const auto run = [&](const ExecutionOptions& exec) {
    o.FillBytes(0xA5);
    RunInfo info;
    const Status s = PagedAttention(q.View(), cache, 3, cu.data(), o.MutableView(),
                                    options, {}, exec, &info);
    o_bytes = Bytes(o);
    if (s.ok()) {
      const Shape longest = {1, hq, hkv, 100, 1200, d, d};
      const int64_t rows = BlockRows(info.target);
      EXPECT_LE(static_cast<double>(info.scratch_bytes),
                FormulaBytes(longest, 3, rows) +
                    2 * PartialBytes({1, hq, hkv, 1, 1200, d, d}, rows));
    }
    return s;
  };
  o.FillBytes(0xA5);
  CheckEveryFailure(run, Bytes(o), no_lse, &o_bytes, &no_lse);
}

}  // namespace
}  // namespace test
}  // namespace simdattn
