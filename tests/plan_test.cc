// The library's plan, re-derived with the literal numbers of lib/api.cc:
// query rows per block, key chunks for calls with few queries, and the task
// counts they give. ExpectBlockSizeOfTarget checks the task count of every
// case that CheckAllTargets runs; the tests here pin the counts of the cases
// built around the scheduling. They are kept in this one file so that they
// can ask the planner for its plan instead.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/dtype.h"
#include "tests/attention_harness.h"

namespace simdattn {
namespace test {

// The task count reveals the vector width of the code that ran (one task per
// block of up to 4 vectors of query rows), so a target reported under the
// wrong name fails here. SVE widths depend on the CPU and are not checked.
void ExpectBlockSizeOfTarget(const Case& c, const RunInfo& info) {
  const std::string t = info.target;
  int64_t lanes = 0;
  if (t == "AVX3_BF16" || t == "AVX3_DL" || t == "AVX3") lanes = 16;
  if (t == "AVX2") lanes = 8;
  if (t == "SSE4" || t == "SSSE3" || t == "NEON" || t == "SVE2_128") lanes = 4;
  if (t == "SVE_256") lanes = 8;
  if (t == "SCALAR") lanes = 1;
  if (lanes == 0) return;
  // Blocks of 4 vectors over the G * Lq rows of each KV group; calls with at
  // most 16 queries split more than 512 keys into chunks of 512, 1024 or
  // 2048 keys: the longest that leave at least 64 tasks (lib/api.cc).
  const int64_t group_rows = c.q_heads / c.kv_heads * c.q_len;
  // Halved, down to one vector, while a group fills at most half a block.
  int64_t rows = 4 * lanes;
  while (group_rows * 2 <= rows && rows / 2 >= lanes) rows /= 2;
  const int64_t groups = c.batch * c.kv_heads * ((group_rows + rows - 1) / rows);
  int64_t chunks = 1;
  if (c.q_len <= 16 && c.kv_len > 512) {
    int64_t chunk = 512;
    while (chunk < 2048 && groups * ((c.kv_len + 2 * chunk - 1) / (2 * chunk)) >= 64) {
      chunk *= 2;
    }
    const int64_t min_chunk = (c.kv_len + 255) / 256;
    chunk = std::max<int64_t>(chunk, (min_chunk + 63) / 64 * 64);
    chunks = (c.kv_len + chunk - 1) / chunk;
  }
  EXPECT_EQ(info.num_tasks, groups * chunks) << "target " << t;
}

namespace {

// Many (batch, KV head) groups of several query blocks each: the threads
// take whole groups at a time and the last groups block by block (RunWave in
// lib/api.cc). Every block must run exactly once, for 1, 2 and 3 threads.
TEST(PlanTest, ManyGroupsInRunsForAnyThreadCount) {
  Case c;
  c.batch = 2;
  c.q_heads = 32;
  c.kv_heads = 32;  // 64 groups: at least 16 per thread with 3 threads
  // Under qemu fewer rows (still 2 blocks of 64 rows or more of smaller
  // ones) and narrower heads keep it short.
  c.q_len = QuickMode() ? 70 : 130;
  c.kv_len = c.q_len;
  c.dk = QuickMode() ? 8 : 16;
  c.dv = c.dk;
  c.options.causal = true;
  const Inputs in = MakeInputs(c, 1250);
  CheckAllTargets(c, in);
  ThreePools pools;
  for (const std::string& target : TestTargets()) {
    SCOPED_TRACE(target);
    const std::vector<Outputs> o = pools.Run(c, in, target);
    EXPECT_GT(o[0].info.num_tasks, 64);  // several blocks per group
    EXPECT_EQ(o[0].o.bytes, o[1].o.bytes);
    EXPECT_EQ(o[0].o.bytes, o[2].o.bytes);
  }
}

// With enough KV groups the chunks grow to 1024 and 2048 keys (lib/api.cc
// keeps at least 64 tasks): 16 groups (B2 Hkv8, G 2) x 5 chunks either way,
// the last one short. Checked against the reference on every target (the
// task count there confirms the chunk length) and for bit-identical output
// with 1, 2 and 3 threads.
TEST(PlanTest, LongerDecodeChunksWithManyGroups) {
  ThreePools pools;
  int n = 0;
  for (const int64_t kv_len : {5000, 9000}) {  // chunks of 1024 / 2048 keys
    for (const DType kv : {DType::kF32, DType::kF16, DType::kBF16}) {
      // Quick mode (qemu): 5000 with f32 and bf16, 9000 with f16.
      const int idx = n++;
      if (QuickMode() && idx % 2 == 1) continue;
      Case c;
      c.kv_dtype = kv;
      c.bound = OutputBound(DType::kF32);  // exact widening, f32 math
      c.batch = 2;
      c.q_heads = 16;
      c.kv_heads = 8;
      c.q_len = 1;
      c.kv_len = kv_len;
      c.dk = 64;
      c.dv = 64;
      const Inputs in = MakeInputs(c, 4300 + idx);
      CheckAllTargets(c, in);
      for (const std::string& target : TestTargets()) {
        SCOPED_TRACE(testing::Message() << target << " Lk " << kv_len << " K/V "
                                        << DTypeName(kv));
        const std::vector<Outputs> o = pools.Run(c, in, target);
        EXPECT_EQ(o[0].info.num_tasks, 80);
        EXPECT_EQ(o[0].o.bytes, o[1].o.bytes);
        EXPECT_EQ(o[0].o.bytes, o[2].o.bytes);
        EXPECT_EQ(o[0].lse, o[1].lse);
        EXPECT_EQ(o[0].lse, o[2].lse);
      }
    }
  }
}

// 8 groups x 7 chunks of 512 keys: 56 tasks, which the threads take in
// runs that shrink from 28 (1 thread), 14 (2) or 10 (3) tasks to 1. Lq 2 runs
// the tiled kernel on each chunk, Lq 1 the decode path (its own partials).
TEST(PlanTest, SplitKeysBitIdenticalForAnyThreadCount) {
  ThreePools pools;
  // On the decode path f32 K/V take tiles of 4 runs (DecodeTiles), bf16
  // the fused groups of 4 keys (tiles of consecutive keys on SVE and
  // SCALAR); the last chunk (429 keys) also leaves keys under a tile and
  // under a group.
  for (const DType kv : {DType::kBF16, DType::kF32}) {
    for (int64_t q_len : {2, 1}) {
      Case c;
      c.kv_dtype = kv;
      c.batch = 1;
      c.q_heads = 16;
      c.kv_heads = 8;
      c.q_len = q_len;
      c.kv_len = 3501;
      c.dk = q_len == 2 ? 32 : 64;
      c.dv = c.dk;
      const Inputs in = MakeInputs(c, 4200 + q_len);
      for (const std::string& target : TestTargets()) {
        SCOPED_TRACE(testing::Message() << target << " Lq " << q_len << " K/V "
                                        << DTypeName(kv));
        const std::vector<Outputs> o = pools.Run(c, in, target);
        EXPECT_EQ(o[0].info.num_tasks, 56);  // the keys really were split
        EXPECT_EQ(o[0].o.bytes, o[1].o.bytes);
        EXPECT_EQ(o[0].o.bytes, o[2].o.bytes);
        EXPECT_EQ(o[0].lse, o[1].lse);
        EXPECT_EQ(o[0].lse, o[2].lse);
      }
    }
  }
}

}  // namespace
}  // namespace test
}  // namespace simdattn
