// The plan a call gets (lib/plan.h): the tests here pin the plans of the
// cases built around the scheduling and the choice of path (and
// plan_expect.cc checks the plan of every case CheckAllTargets runs).

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/dtype.h"
#include "lib/plan.h"
#include "tests/attention_harness.h"

namespace simdattn {
namespace test {

namespace {

// The plan of case c for a target of `caps` (planning reads shapes only: the
// tensors keep their initial values).
Plan PlanOf(const Case& c, const TargetCaps& caps) {
  const Tensor q(c.q_dtype, c.batch, c.q_heads, c.q_len, c.dk, c.layout, c.pad, c.offset);
  const Tensor k(c.kv_dtype, c.batch, c.kv_heads, c.kv_len, c.dk, c.layout, c.pad, c.offset);
  const Tensor v(c.kv_dtype, c.batch, c.kv_heads, c.kv_len, c.dv, c.layout, c.pad, c.offset);
  Tensor o(c.o_dtype, c.batch, c.q_heads, c.q_len, c.dv, c.layout, 0, 0);
  Plan plan;
  const Status s = PlanCall(q.View(), k.View(), v.View(), o.MutableView(), c.options, {},
                            caps, &plan);
  EXPECT_TRUE(s.ok()) << s.message;
  return plan;
}

Case DecodeCase(DType kv, int64_t d) {
  Case c;
  c.q_heads = 32;
  c.kv_heads = 8;
  c.q_len = 1;
  c.kv_len = 4096;
  c.dk = c.dv = d;
  c.kv_dtype = kv;
  return c;
}

// Which kernel runs: the tiled one for prefill; for one query per head the
// decode path (while the group's rows fill at most 2 vectors), fused for
// 16-bit K/V the target widens in registers without
// options and with head dims of whole vectors; speculative decoding (a few
// queries per head) on the decode path up to 16 rows per group, up to 32
// where the AMX tiles take the decode's keys.
TEST(PlanTest, KernelPaths) {
  const TargetCaps avx512{16, true, true, 256};
  const TargetCaps sse4{4, true, false, 256};
  const TargetCaps scalar{1, false, false, 0};
  EXPECT_EQ(PlanOf(DecodeCase(DType::kBF16, 128), avx512).path, KernelPath::kDecodeFused);
  EXPECT_EQ(PlanOf(DecodeCase(DType::kF16, 128), avx512).path, KernelPath::kDecodeFused);
  EXPECT_EQ(PlanOf(DecodeCase(DType::kF16, 128), sse4).path, KernelPath::kDecode);
  EXPECT_EQ(PlanOf(DecodeCase(DType::kBF16, 128), sse4).path, KernelPath::kDecodeFused);
  // One lane: a group of 4 rows needs more than 2 vectors, so it is tiled.
  EXPECT_EQ(PlanOf(DecodeCase(DType::kBF16, 128), scalar).path, KernelPath::kTiled);
  EXPECT_EQ(PlanOf(DecodeCase(DType::kF32, 128), avx512).path, KernelPath::kDecode);
  EXPECT_EQ(PlanOf(DecodeCase(DType::kBF16, 72), avx512).path, KernelPath::kDecode);
  EXPECT_EQ(PlanOf(DecodeCase(DType::kBF16, 512), avx512).path, KernelPath::kDecode);
  Case soft = DecodeCase(DType::kBF16, 128);
  soft.options.softcap = 30.0f;
  EXPECT_EQ(PlanOf(soft, avx512).path, KernelPath::kDecode);
  Case spec = DecodeCase(DType::kBF16, 64);
  spec.q_len = 4;  // 16 rows per group
  spec.options.causal = true;
  spec.options.alignment = Alignment::kBottomRight;
  EXPECT_EQ(PlanOf(spec, avx512).path, KernelPath::kDecode);
  spec.q_len = 5;  // 20 rows
  EXPECT_EQ(PlanOf(spec, avx512).path, KernelPath::kTiled);
  // AVX3_AMX: up to 32 rows (2 vectors) on the decode path, whose keys go
  // to the tiles, when Q, K and V are bf16 and there are no options.
  TargetCaps amx = avx512;
  amx.amx = true;
  Case tiles = DecodeCase(DType::kBF16, 64);
  tiles.q_dtype = DType::kBF16;
  tiles.q_len = 8;  // 32 rows
  tiles.options.causal = true;
  tiles.options.alignment = Alignment::kBottomRight;
  EXPECT_EQ(PlanOf(tiles, amx).path, KernelPath::kDecode);
  EXPECT_EQ(PlanOf(tiles, avx512).path, KernelPath::kTiled);
  tiles.options.softcap = 30.0f;
  EXPECT_EQ(PlanOf(tiles, amx).path, KernelPath::kTiled);
  tiles.options.softcap = 0.0f;
  tiles.dk = tiles.dv = 72;
  EXPECT_EQ(PlanOf(tiles, amx).path, KernelPath::kTiled);
  Case prefill = DecodeCase(DType::kBF16, 64);
  prefill.q_len = prefill.kv_len = 300;
  const Plan p = PlanOf(prefill, avx512);
  EXPECT_EQ(p.path, KernelPath::kTiled);
  EXPECT_EQ(p.block_rows, 64);
  EXPECT_EQ(p.num_blocks, 4 * 300 / 64 + 1);
  EXPECT_EQ(p.num_chunks, 1);
  EXPECT_TRUE(p.pack_kv);  // 16-bit K/V are packed once per group
}

// Key chunks: 512 keys while that leaves 64 tasks or fewer; longer chunks
// (up to 2048) while the call still has 64; at most 256 chunks.
TEST(PlanTest, DecodeChunks) {
  const TargetCaps avx512{16, true, true, 256};
  Case c = DecodeCase(DType::kBF16, 16);  // 8 groups
  Plan p = PlanOf(c, avx512);
  EXPECT_EQ(p.chunk_keys, 512);
  EXPECT_EQ(p.num_chunks, 8);
  c.batch = 16;  // 128 groups: chunks double up to 2048
  c.kv_len = 8192;
  p = PlanOf(c, avx512);
  EXPECT_EQ(p.chunk_keys, 2048);
  EXPECT_EQ(p.num_chunks, 4);
  c.batch = 1;
  c.kv_len = 512;  // one chunk of all keys
  p = PlanOf(c, avx512);
  EXPECT_EQ(p.num_chunks, 1);
  EXPECT_EQ(AttentionTaskCount(p), 8);
}

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
      // Quick mode (qemu): 5000 keys with f32 K/V only (the chunk length is
      // the planner's, the same on every target).
      const int idx = n++;
      if (QuickMode() && idx != 0) continue;
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
